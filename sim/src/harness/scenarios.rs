//! What a run is (its configuration and result) and the runs themselves:
//! hosts over simulated memory until their operations are done, and the
//! reformat-under-attach scenario.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex};

use cxlkv_core::format::format;
use cxlkv_core::hash::mix64;
use cxlkv_core::layout::Capacities;
use cxlkv_core::store::attach;

use crate::harness::actors::{manager_actor, op_actor, recovery_actor, FEED_AT};
use crate::harness::checks::final_checks;
use crate::harness::debug::watch;
use crate::harness::model::{Model, RootModel, ACTOR, IN_ACQUIRE, MIXED};
use crate::harness::params::{sim_caps, SIM_BYTES};
use crate::harness::sched::{rnd, Crashed, Killed, Sched};
use crate::harness::stalls::{stall_in_release, stall_zombie};
use crate::harness::world::{kill_late, kill_scans, World};
use crate::memory::{SimConfig, SimMemory};

/// What one run does.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Seed of everything random.
    pub seed: u64,
    /// Simulated hosts (one node each).
    pub hosts: usize,
    /// Operations per host.
    pub ops: u32,
    /// Crash one host at a random moment, then recover.
    pub crash: bool,
    /// Disable this coherence site (a mutant).
    pub disable: Option<&'static str>,
    /// Caches that never write back or refill on their own
    /// ([`SimConfig::lazy`]) instead of busy random ones.
    pub lazy: bool,
    /// Block lengths from 64 bytes to two chunks (runs of whole chunks
    /// among them) instead of up to three kilobytes.
    pub mixed: bool,
    /// Which operation of every four the change log is read after (0 to
    /// 3); `None`: `CXLKV_SIM_FEED_AT`, else 1. Moves the interleavings.
    pub feed_at: Option<u32>,
    /// A zombie: one host stops at a random coherence call of any of its
    /// threads (inside a lock, an unlock, a publish, a pin, a free, a
    /// recovery or a manager step) for three leases, is declared dead and
    /// recovered meanwhile, then runs on from where it stopped; its dirty
    /// lines land whenever its cache writes them back. No crash or kill.
    pub zombie: bool,
    /// Now and then a manager step is cut off part-way (the process
    /// stepping that node's manager for it is killed: the host and its
    /// cache live on) and the node goes on from a fresh manager state.
    pub cut_steps: bool,
}

/// What a run found.
#[derive(Debug, Default)]
pub struct RunResult {
    /// Invariant violations (empty = pass).
    pub violations: Vec<String>,
    /// Operations completed.
    pub ops: u64,
    /// Scheduler steps (yields).
    pub steps: u64,
    /// The last scheduler events, for replay.
    pub trace: Vec<String>,
    /// Whether a host crashed.
    pub crashed: Option<usize>,
    /// Manager steps cut off part-way ([`RunConfig::cut_steps`]).
    pub cuts: u64,
    /// Sites that ran, with counts.
    pub executed: Vec<(&'static str, u64)>,
}

/// Cache behaviour: the default, or `CXLKV_SIM_CHAOS=early,samples,writeback,refill`
/// (per mille, samples per call) to explore others.
pub(crate) fn chaos() -> SimConfig {
    let v: Vec<u32> = std::env::var("CXLKV_SIM_CHAOS")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_default();
    match v.as_slice() {
        [a, b, c, d] => {
            SimConfig { writeback_early: *a, samples: *b, spontaneous_writeback: *c, spontaneous_refill: *d }
        }
        _ => SimConfig::default(),
    }
}

/// Runs one simulation.
pub fn run(cfg: &RunConfig) -> RunResult {
    MIXED.with(|m| m.set(cfg.mixed));
    let w = new_world(cfg);
    install_hook(&w);
    arm_faults(&w, cfg);
    let threads = spawn_actors(&w, cfg);
    if let Some(stalled) = await_actors(&w, &threads) {
        return stalled;
    }
    for t in threads {
        let _ = t.join();
    }
    // Quiescent: every live node detached. Land what a crashed host left in
    // flight, then check the region through a fresh host's eyes.
    w.mem.drain_zombies();
    ACTOR.with(|a| a.set(usize::MAX));
    final_checks(&w);
    let s = w.sched.lock().unwrap();
    let m = w.model.lock().unwrap();
    RunResult {
        violations: m.violations.clone(),
        ops: m.ops,
        steps: s.steps,
        trace: s.trace.iter().cloned().collect(),
        crashed: s.crashed,
        cuts: s.cuts,
        executed: w.mem.executed().into_iter().collect(),
    }
}

/// The world of a run: its memory, scheduler and model, for at least two
/// hosts of three actors each.
fn new_world(cfg: &RunConfig) -> Arc<World> {
    let hosts = cfg.hosts.max(2);
    Arc::new(World {
        mem: SimMemory::new(SIM_BYTES, hosts, cfg.seed, if cfg.lazy { SimConfig::lazy() } else { chaos() }),
        sched: Mutex::new(Sched {
            runnable: vec![true; 3 * hosts],
            finished: vec![false; 3 * hosts],
            host_crashed: vec![false; hosts],
            gen: vec![0; hosts],
            actor_gen: vec![0; 3 * hosts],
            rng: cfg.seed ^ 0x5151,
            ..Sched::default()
        }),
        cvs: (0..3 * hosts).map(|_| Condvar::new()).collect(),
        model: Mutex::new(Model {
            inserts: vec![0; hosts],
            roots: vec![RootModel { state: Some(None), ..RootModel::default() }; hosts],
            attached: vec![false; hosts],
            mgr_idle: vec![false; hosts],
            op_at: vec![0; hosts],
            raw_writing: vec![false; hosts],
            raw_filling: vec![false; hosts],
            ops_per_host: cfg.ops,
            ..Model::default()
        }),
        hosts,
        locals: Mutex::new(Vec::new()),
    })
}

/// The hook every coherence call of an actor passes through: the watch
/// line, burials in order, slow readers and pinners, stalls, then the
/// scheduler's yield.
fn install_hook(w: &Arc<World>) {
    let w2 = w.clone();
    w.mem.set_yield_hook(Box::new(move |_h, site| {
        let a = ACTOR.with(|a| a.get());
        if a != usize::MAX {
            watch(&w2, a, site);
            if site.starts_with("bury.") {
                w2.bury_in_order(a / 3);
            }
            if site == "bury.info.again" && a.is_multiple_of(3) && w2.model.lock().unwrap().bury_race {
                w2.park_until_recovered(a);
            }
            if site == "index.get.payload" && w2.model.lock().unwrap().slow_readers && w2.mem.random().is_multiple_of(6)
            {
                // A slow reader: descheduled between finding a block and
                // copying it, while others evict it and reuse its space.
                for _ in 0..2000 {
                    w2.yield_now(a, "slow-get");
                }
            }
            // A pinner descheduled between validating its pin and reading the
            // block, or an evictor in the middle of its scan of the journals:
            // the two halves of the pin handshake, stretched.
            // (A pinner parked after validating, before its counters' fence:
            // its record must already be in memory.)
            let (slow, yields) = match site {
                "index.fresh.payload" | "index.payload.read" => (6, 1000),
                "node.stats" if IN_ACQUIRE.with(|c| c.get()) => (12, 400),
                "evict.pins.summary" => (24, 400),
                _ => (0, 0),
            };
            if slow > 0 && w2.model.lock().unwrap().slow_readers && w2.mem.random().is_multiple_of(slow) {
                if site == "evict.pins.summary" {
                    // Another host pins what this evictor is looking at.
                    w2.offer_claimed(a / 3);
                }
                for _ in 0..yields {
                    w2.yield_now(a, "slow-pin");
                }
            }
            let stall = (site == "lock.release.check" && stall_in_release(&w2, a)) || stall_zombie(&w2, a, site);
            w2.yield_maybe(a, site, stall);
        }
    }));
}

/// The run's faults, chosen by its seed and configuration: the cut sites
/// switched off, a stall (or a zombie), a killed process, a crashed host.
fn arm_faults(w: &World, cfg: &RunConfig) {
    let hosts = w.hosts;
    // Host 0's op actor formats the region while the others wait to attach.
    w.mem.disable(cfg.disable);
    {
        let mut m = w.model.lock().unwrap();
        m.single_recovery = (cfg.seed / 4) % 2 == 1;
        // Kill seeds are 6k+4 (crash-free, seed % 3 == 1); lazy ones have k
        // odd. The race takes k = 2 (mod 8), so k = 1 is a plain restart
        // on lazy caches.
        m.bury_race = (cfg.seed / 6) % 8 == 2;
        m.crash_in_app_lock = (cfg.seed / 2) % 4 == 2;
        m.crash_in_free = (cfg.seed / 2) % 4 == 1;
        m.worker_first = (cfg.seed / 4).is_multiple_of(2);
        m.slow_readers = cfg.seed % 5 < 2;
        m.kill_in_fill = (cfg.seed / 6).is_multiple_of(2);
    }
    w.model.lock().unwrap().cut_steps = cfg.cut_steps;
    if cfg.zombie && cfg.ops >= 8 {
        let mut m = w.model.lock().unwrap();
        m.stall = Some(mix64(cfg.seed) as usize % hosts);
        m.zombie = true;
    } else if !cfg.crash && cfg.seed % 3 != 1 && cfg.ops >= 8 {
        let mut m = w.model.lock().unwrap();
        m.stall = Some(mix64(cfg.seed) as usize % hosts);
        m.stall_in_release = (cfg.seed / 2) % 2 == 1;
    }
    if !cfg.crash && !cfg.zombie && cfg.seed % 3 == 1 && cfg.ops >= 8 {
        let mut s = w.sched.lock().unwrap();
        let h = (rnd(&mut s.rng) as usize) % hosts;
        // Seeds whose restarted process takes the first free slot kill host
        // 0: its own slot comes first, so no other host's (free while that
        // host restarts) can be taken.
        let h = if kill_scans(cfg.seed) { 0 } else { h };
        let at = 2000 + rnd(&mut s.rng) % (cfg.ops as u64 * 250 * hosts as u64).max(1);
        s.kill_at = Some((h, at));
        w.model.lock().unwrap().kill_late = kill_late(cfg.seed);
    }
    if cfg.crash {
        let mut s = w.sched.lock().unwrap();
        let h = (rnd(&mut s.rng) as usize) % hosts;
        // Anywhere in the run (a run takes some 300 steps per op per host).
        let at = 2000 + rnd(&mut s.rng) % (cfg.ops as u64 * 300 * hosts as u64).max(1);
        s.crash_at = Some((h, at));
    }
}

/// Starts every actor's thread: each waits for its turn, runs its part
/// (a killed process's threads start again as the next process's), and
/// reports a panic as a violation.
fn spawn_actors(w: &Arc<World>, cfg: &RunConfig) -> Vec<std::thread::JoinHandle<()>> {
    let hosts = w.hosts;
    let mut threads = Vec::new();
    for actor in 0..3 * hosts {
        let w = w.clone();
        let ops = cfg.ops;
        let seed = cfg.seed;
        let mixed = cfg.mixed;
        let feed_at = cfg.feed_at;
        threads.push(std::thread::spawn(move || {
            ACTOR.with(|a| a.set(actor));
            MIXED.with(|m| m.set(mixed));
            crate::harness::model::TENANTS.with(|t| t.set(crate::harness::params::tenants_of(seed)));
            crate::harness::model::TTL.with(|t| t.set(crate::harness::params::ttl_of(seed)));
            if let Some(f) = feed_at {
                FEED_AT.with(|c| c.set(f));
            }
            w.wait_turn(actor);
            let mut restarted = false;
            let r = loop {
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| match actor % 3 {
                    0 => op_actor(&w, actor / 3, ops, seed, restarted),
                    1 => manager_actor(&w, actor / 3),
                    _ => recovery_actor(&w, actor / 3),
                }));
                match r {
                    Err(p) if p.is::<Killed>() => {
                        // A thread of the host's next process.
                        {
                            let mut s = w.sched.lock().unwrap();
                            s.actor_gen[actor] = s.gen[actor / 3];
                        }
                        // (The killing actor handed the baton on first.)
                        w.wait_turn(actor);
                        restarted = true;
                    }
                    r => break r,
                }
            };
            match r {
                Ok(()) => {}
                Err(p) if p.is::<Crashed>() => {}
                Err(p) => {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    w.violation(format!("actor {actor} panicked: {msg}"));
                }
            }
            if w.sched.lock().unwrap().host_crashed[actor / 3] {
                return;
            }
            w.finish(actor);
        }));
    }
    threads
}

/// Waits for every actor's thread to end. A run whose scheduler makes no
/// step for 20 s has deadlocked: its result then, its threads left behind.
fn await_actors(w: &World, threads: &[std::thread::JoinHandle<()>]) -> Option<RunResult> {
    // The baton starts with actor 0 (Sched::turn defaults to 0). Watchdog:
    // a run whose scheduler makes no step for 20 s has deadlocked.
    let mut last = (0u64, std::time::Instant::now());
    while threads.iter().any(|t| !t.is_finished()) {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let s = w.sched.lock().unwrap();
        if s.steps != last.0 {
            last = (s.steps, std::time::Instant::now());
        } else if last.1.elapsed() > std::time::Duration::from_secs(20) {
            let msg = format!(
                "scheduler stalled at step {}: turn {}, runnable {:?}, finished {:?}, alive threads {:?}",
                s.steps,
                s.turn,
                s.runnable,
                s.finished,
                threads.iter().map(|t| !t.is_finished()).collect::<Vec<_>>()
            );
            let trace: Vec<String> = s.trace.iter().cloned().collect();
            drop(s);
            // Leave the stuck threads behind; report.
            return Some(RunResult { violations: vec![msg], trace, ..RunResult::default() });
        }
    }
    None
}

/// Re-formats a region, crashing the formatting host at a random coherence
/// call of the format; its dirty lines are lost, land, or land later. Another
/// host must then find the region either not initialised (or rejected), or
/// consistent: never an old header over half-written new metadata.
pub fn reformat_run(seed: u64, disable: Option<&'static str>, lazy: bool) -> Vec<String> {
    // Eight crash points per seed (a format is quick).
    (0..8).flat_map(|j| reformat_once(seed * 8 + j, disable, lazy)).collect()
}

pub(crate) fn reformat_once(seed: u64, disable: Option<&'static str>, lazy: bool) -> Vec<String> {
    let cfg = if lazy { SimConfig::lazy() } else { chaos() };
    let mem = SimMemory::new(SIM_BYTES, 2, seed, cfg);
    let old = Capacities { n_stripes: 4, entries_per_stripe: 16, ..sim_caps(2) };
    if let Err(e) = format(mem.view(0), mem.host(0), old, 1) {
        return vec![format!("first format: {e}")];
    }
    mem.drain(0);
    mem.disable(disable);
    let crash_at = mix64(seed) % 24;
    let calls = Mutex::new(0u64);
    mem.set_yield_hook(Box::new(move |h, _| {
        let mut n = calls.lock().unwrap();
        *n += 1;
        if h == 0 && *n == crash_at + 1 {
            drop(n);
            std::panic::resume_unwind(Box::new(Crashed));
        }
    }));
    let crashed = std::panic::catch_unwind(AssertUnwindSafe(|| format(mem.view(0), mem.host(0), sim_caps(2), 2)));
    mem.crash(0);
    if mix64(seed ^ 1).is_multiple_of(2) {
        mem.drain_zombies();
    }
    let mut out = Vec::new();
    // Not initialised, or a header that does not validate: refused, fine.
    if let Ok(store) = attach(mem.view(1), mem.host(1)) {
        let mut scratch = vec![0u64; cxlkv_core::check::scratch_words(&store)];
        let mut findings = Vec::new();
        let r = cxlkv_core::check::check(&store, &mut scratch, &mut |f| findings.push(f));
        if r.is_err() || !findings.is_empty() {
            out.push(format!(
                "format crashed at call {crash_at} (finished: {}): host 1 attached region {} and check says {r:?} {:?}",
                crashed.is_ok(),
                store.creation_id,
                findings.iter().take(3).map(|f| f.to_string()).collect::<Vec<_>>()
            ));
        }
    }
    out
}
