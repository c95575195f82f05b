//! The proof harness: runs simulated hosts over [`SimMemory`] under a seeded
//! deterministic scheduler, injects crashes, and checks every result against
//! a reference model and the region's invariants.
//!
//! Each simulated host has two actors (OS threads that only ever run one at a
//! time, handing a baton at every coherence call): an *op actor* doing random
//! cache operations, and a *manager actor* beating the heartbeat and stepping
//! the lock manager. The same seed replays the same interleaving exactly.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex};

use crate::memory::{SimCoherence, SimConfig, SimMemory};
use cxlkv_core::channel::Message;
use cxlkv_core::coherence::{Coherence, Site};
use cxlkv_core::format::format;
use cxlkv_core::hash::{mix64, Key};
use cxlkv_core::index::{Handle, Lru, ReserveItem};
use cxlkv_core::layout::{Capacities, Entry, Layout, NodeInfo};
use cxlkv_core::lock::{LeaseConfig, Manager};
use cxlkv_core::node::{attach_node, Identity, Node, NodeLocal};
use cxlkv_core::store::{attach, read_header, NodeEnv, Store};
use cxlkv_core::Error;

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
    /// Sites that ran, with counts.
    pub executed: Vec<(&'static str, u64)>,
}

/// Capacities of simulated regions: small, so tables fill and chunks recycle.
pub fn sim_caps(hosts: usize) -> Capacities {
    Capacities {
        max_nodes: hosts as u32,
        n_stripes: 2,
        entries_per_stripe: 24,
        n_roots: 8,
        pin_slots: 16,
        chunk_shift: 13,
        inbox_slots: 4,
        app_locks: 2,
    }
}

/// Cache behaviour: the default, or `CXLKV_SIM_CHAOS=early,samples,writeback,refill`
/// (per mille, samples per call) to explore others.
fn chaos() -> SimConfig {
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

/// Bytes of a simulated region.
pub const SIM_BYTES: usize = 192 << 10;
const NS: u32 = 3;
const KEYS: u64 = 40;

struct Crashed;

/// Unwinds the threads of a killed process; each starts again as a thread of
/// its host's next process.
struct Killed;

/// A run taking more scheduler steps than this is livelocked.
const STEP_LIMIT: u64 = 3_000_000;

#[derive(Default)]
struct Sched {
    turn: usize,
    runnable: Vec<bool>,
    finished: Vec<bool>,
    host_crashed: Vec<bool>,
    rng: u64,
    steps: u64,
    crash_at: Option<(usize, u64)>,
    crashed: Option<usize>,
    /// Kill the process of a host (SIGKILL; the host lives on) at a step.
    kill_at: Option<(usize, u64)>,
    /// Each host's process generation, and the generation each actor runs in.
    gen: Vec<u32>,
    actor_gen: Vec<u32>,
    trace: VecDeque<String>,
    stop: bool,
    watch_dirty: Vec<bool>,
    /// An actor parked (descheduled, as a preempted thread is) until this step.
    sleep_until: Vec<u64>,
    /// Host-local lock tier: (host, lock) → holding actor.
    local: std::collections::HashMap<(usize, u32), usize>,
}

/// Park actors now and then (`CXLKV_SIM_PARK=1`): long windows in which a
/// host's half-done work is visible, which kill far more coherence mutants.
/// Off by default while some parked runs still exceed the step limit.
fn park() -> bool {
    std::env::var("CXLKV_SIM_PARK").is_ok_and(|v| v == "1")
}

/// Scheduler events kept for a failure report (`CXLKV_SIM_TRACE`, default 64).
fn trace_len() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::env::var("CXLKV_SIM_TRACE").ok().and_then(|v| v.parse().ok()).unwrap_or(64))
}

/// Entry line whose state and generation in memory are traced
/// (`CXLKV_SIM_ENTRY_LINE`).
fn entry_line() -> Option<u64> {
    static N: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::env::var("CXLKV_SIM_ENTRY_LINE").ok().and_then(|v| v.parse().ok()))
}

fn watch_line() -> Option<usize> {
    std::env::var("CXLKV_SIM_WATCH_LINE").ok().and_then(|v| v.parse().ok())
}

struct World {
    mem: SimMemory,
    sched: Mutex<Sched>,
    /// One condition variable per actor: handing the baton wakes only the
    /// actor that gets it.
    cvs: Vec<Condvar>,
    model: Mutex<Model>,
    hosts: usize,
}

impl Model {
    /// A crash or a stall left a node that recovery has yet to free.
    fn awaits_recovery(&self) -> bool {
        (self.crash_needs_recovery || (self.stall.is_some() && self.stalled) || self.killed) && !self.recovered
    }
}

#[derive(Default)]
struct Model {
    published: HashSet<Key>,
    /// Pins held now, by key: ids, each pin's own. A key with one pin held
    /// all through a lookup was READY all through it (a pin holds its
    /// block until released or until recovery drops a dead node's pins).
    pinned: HashMap<Key, HashSet<u64>>,
    pin_ids: u64,
    /// Recoveries begun (they may drop pins).
    recoveries: u64,
    violations: Vec<String>,
    counter: u64,
    inserts: Vec<u64>,
    /// Reserves that succeeded, all hosts, never reset.
    total_inserts: u64,
    ops: u64,
    need_recovery: bool,
    recovered: bool,
    counter_root: u64,
    /// The application lock that guards the counter.
    counter_lock: Option<u32>,
    /// A key an evictor is deciding on, and the host of that evictor: the
    /// next operation of another host acquires it.
    hot: Option<(u64, usize)>,
    /// The end's search for rooted blocks no root names was made.
    adopted: bool,
    /// Each host's last counter ticket (grant sequence), released already:
    /// presented again while holding a newer grant, it must change nothing.
    old_tickets: BTreeMap<usize, u64>,
    /// Application locks allocated by the churn operation (beside the
    /// counter's), by number.
    churned: HashSet<u32>,
    /// The killed process's successor parks inside its bury, after the
    /// write-backs, until the node was declared dead by its silence and
    /// recovered: its second look must see that, and bury nothing.
    bury_race: bool,
    /// The crash waits for a moment when its host holds the counter's
    /// application lock: its repair by recovery runs.
    crash_in_app_lock: bool,
    /// Now and then a reader is descheduled between finding a block and
    /// copying it (others evict it and reuse its space meanwhile).
    slow_readers: bool,
    /// Each host's op actor has stored a raw block's bytes it has not yet
    /// flushed.
    raw_filling: Vec<bool>,
    /// The kill waits for a moment when its process fills a raw block.
    kill_in_fill: bool,
    /// The crash comes, if it can, between a raw free's map and its record.
    crash_in_free: bool,
    /// A stalled host's worker wakes before its heartbeat.
    worker_first: bool,
    /// The highest grant sequence memory has shown for each lock: it never
    /// goes back (a ticket is unique by it).
    grants_seen: BTreeMap<u32, u64>,
    log: Vec<(u64, u64, String)>,
    /// Named root `r<g>` for each g.
    roots: Vec<RootModel>,
    /// Hosts whose op actor reached each barrier phase (bit masks): 0 and 1
    /// mid-run (arrived, checked), 2 and 3 at the end, 4 and 5 around the
    /// channel fill at the end.
    barrier: [u64; 6],
    /// Live raw allocations: (offset, length, host).
    raw: Vec<(u64, u64, usize)>,
    /// Each host's op actor holds an attached node.
    attached: Vec<bool>,
    /// The host that stalls (all its threads descheduled for longer than a
    /// lease) once, mid-run: it is declared dead and recovered meanwhile.
    stall: Option<usize>,
    /// The stalled host's op actor asks for the stall.
    stall_req: bool,
    /// The stall began.
    stalled: bool,
    /// The stalled host's heartbeat found its node no longer ALIVE.
    fenced: bool,
    /// The stall falls inside an unlock (of the only lock the host holds,
    /// after its critical section) instead of between operations.
    stall_in_release: bool,
    /// The stalling host's op actor is in an operation that may stall in
    /// its unlock (nothing pinned or being written when it began).
    release_armed: bool,
    /// The stall began inside an unlock; the operation must then fail
    /// with Revoked.
    stalled_in_release: bool,
    /// The manager actor of each host is between two steps and not the
    /// active manager (a host can stall then).
    mgr_idle: Vec<bool>,
    /// A maintenance recovery ran.
    maintained: bool,
    /// A host's process was killed (its node needs recovery until then).
    killed: bool,
    /// The killed process restarts after two leases, not at once.
    kill_late: bool,
    /// Each host's op actor is writing a block by plain stores.
    raw_writing: Vec<bool>,
    /// Where each host's op actor is: the operation it began last (the
    /// number of operations once it finished them).
    op_at: Vec<u32>,
    ops_per_host: u32,
    /// Resignations under way and begun so far.
    resigns: (u32, u64),
    /// Counter increments whose lock came back Revoked after the critical
    /// section ran: they may have landed.
    counter_maybe: u64,
    /// Operations of the stalled host that failed with Revoked after it woke.
    revoked_ops: u64,
    /// Recoveries under way: they hold every lock while memory is rebuilt.
    recovering: u32,
    /// The crashed host's node was attached when it crashed.
    crash_needs_recovery: bool,
    /// Hosts whose recovery actor is recovering (bit mask).
    recovering_on: u64,
    /// Only one host recovers: a live one that is not the lock manager's
    /// (otherwise every live host tries, and any of them suffices).
    single_recovery: bool,
    /// Channel messages by request id.
    msgs: BTreeMap<u64, ChanMsg>,
    /// Last message id given out.
    next_msg: u64,
    /// Node 0 finished streaming to node 1 at the end.
    stream_done: bool,
    /// Attaches of each node id so far (the harness's count of incarnations).
    node_epoch: BTreeMap<u32, u64>,
}

/// A message a node sent (or tried to: a send that failed half way may or
/// may not have landed).
struct ChanMsg {
    from: u32,
    to: u32,
    keys: usize,
    /// The send returned Ok.
    acked: bool,
    received: bool,
    /// The receiver's incarnation (harness count) when no attach of the
    /// receiver's slot happened during the send: the message is for it.
    epoch: Option<u64>,
}

thread_local! {
    static ACTOR: Cell<usize> = const { Cell::new(usize::MAX) };
    /// The actor is inside `Node::acquire`.
    static IN_ACQUIRE: Cell<bool> = const { Cell::new(false) };
    /// This run's [`RunConfig::mixed`] (set in every thread of the run).
    static MIXED: Cell<bool> = const { Cell::new(false) };
    /// Waits (lock polls) after which `NodeEnv::wait` reports a timeout.
    static WAIT_LIMIT: Cell<u32> = const { Cell::new(200_000) };
}

/// The cache tag of an actor's stores: its index, and its process
/// generation (a killed process's stores keep theirs).
fn tag_of(s: &Sched, actor: usize) -> u32 {
    actor as u32 + 1000 * s.actor_gen.get(actor).copied().unwrap_or(0)
}

fn rnd(x: &mut u64) -> u64 {
    *x = mix64(x.wrapping_add(0x9e37_79b9_7f4a_7c15));
    *x
}

impl World {
    fn violation(&self, s: String) {
        let mut m = self.model.lock().unwrap();
        if m.violations.len() < 20 {
            m.violations.push(s);
        }
    }

    /// Hands the baton on; returns when this actor runs again. Unwinds the
    /// thread with `Crashed` if its host was crashed meanwhile.
    fn yield_now(&self, actor: usize, what: &'static str) {
        self.yield_maybe(actor, what, true)
    }

    /// A scheduling point: hands the baton on (always when `force`, else
    /// with probability 1/3, so runs interleave at random points without
    /// paying a thread switch at every one).
    fn yield_maybe(&self, actor: usize, what: impl std::fmt::Display, force: bool) {
        let mut s = self.sched.lock().unwrap();
        s.steps += 1;
        if s.steps == STEP_LIMIT {
            let m = format!(
                "run did not finish within {STEP_LIMIT} scheduler steps (livelock); host-local locks held {:?}, finished {:?}",
                s.local, s.finished
            );
            drop(s);
            self.violation(m);
            s = self.sched.lock().unwrap();
        }
        if s.steps > STEP_LIMIT {
            // Stop everyone: unwind this actor like a crash.
            for r in s.runnable.iter_mut() {
                *r = false;
            }
            s.stop = true;
            for cv in &self.cvs {
                cv.notify_all();
            }
            drop(s);
            std::panic::resume_unwind(Box::new(Crashed));
        }
        if let Some(line) = watch_line() {
            let d = self.mem.is_dirty(actor / 3, line);
            let was = s.watch_dirty.get(actor / 3).copied().unwrap_or(false);
            if d != was {
                let step = s.steps;
                eprintln!("watch: step {step} actor {actor} line {line} dirty {was} -> {d} at {what}");
                if s.watch_dirty.len() < self.hosts {
                    s.watch_dirty.resize(self.hosts, false);
                }
                s.watch_dirty[actor / 3] = d;
            }
        }
        let steps = s.steps;
        let due = |x: Option<(usize, u64)>| x.is_some_and(|(h, at)| actor / 3 == h && steps >= at);
        let pending = due(s.crash_at) || due(s.kill_at);
        if !force && !rnd(&mut s.rng).is_multiple_of(3) && !pending {
            return;
        }
        let step = s.steps;
        if s.trace.len() >= trace_len() {
            s.trace.pop_front();
        }
        s.trace.push_back(format!("{step}: actor {actor} {what}"));
        if let Some((h, at)) = s.kill_at {
            // The op actor's process is killed, preferably while it holds a
            // lock; never while its recovery thread rebuilds (the model
            // counts a recovery as running until it returns).
            let holding = s.local.keys().any(|&(lh, _)| lh == h);
            let m = self.model.lock().unwrap();
            // (Nor at the end, when the others may be checking.)
            let ok =
                m.attached[h] && m.recovering_on & (1 << h) == 0 && !m.need_recovery && m.op_at[h] < m.ops_per_host;
            drop(m);
            // Best while it has payload stored by plain stores and not yet
            // flushed (a block it is writing): its successor must flush it.
            let (dirty_payload, filling, in_fill) = {
                let m = self.model.lock().unwrap();
                (m.raw_writing[h], m.raw_filling[h], m.kill_in_fill)
            };
            // Or, on some seeds, while it fills a raw block (stored, not
            // yet flushed): its successor must write that back.
            let due = if in_fill {
                filling || step >= at + 200_000
            } else {
                holding && (dirty_payload || step >= at + 30_000) || step >= at + 50_000
            };
            if actor == 3 * h && step >= at && due && ok && !s.finished[actor] {
                s.kill_at = None;
                s.gen[h] += 1;
                s.local.retain(|&(lh, _), _| lh != h);
                s.trace.push_back(format!("{step}: host {h}'s process is killed"));
                if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
                    eprintln!("step {step}: host {h}'s process is killed at {what}");
                }
                if self.model.lock().unwrap().kill_late {
                    // No sibling on the host: what the process left in the
                    // cache lands on its own, within the lease.
                    self.mem.orphan(h);
                }
                {
                    let mut m = self.model.lock().unwrap();
                    m.attached[h] = false;
                    m.killed = true;
                    m.raw.retain(|b| b.2 != h);
                    m.counter_maybe += 1;
                    for r in m.roots.iter_mut() {
                        r.state = None;
                    }
                }
                self.pass(&mut s);
                drop(s);
                std::panic::resume_unwind(Box::new(Killed));
            }
        }
        if let Some((h, at)) = s.crash_at {
            // Prefer a moment when the host holds a lock (its host-local
            // tier): revocation, repair and recovery of half-done critical
            // sections are then exercised in most crash runs. Best, one
            // that holds a global lock another host waits for:
            // revocation, repair and the waiter's stepping aside all run.
            let holding = s.local.keys().any(|&(lh, _)| lh == h);
            let (app, in_free) = {
                let m = self.model.lock().unwrap();
                (m.crash_in_app_lock, m.crash_in_free)
            };
            let due = step >= at
                && (step >= at + 50_000
                    // Between a free's map and its record (often another
                    // host's chunk, whose owner lives on).
                    || in_free && actor / 3 == h && what.to_string() == "alloc.free.publish"
                    || app && actor / 3 == h && self.holds_app_lock(h)
                    || !app && holding && (step >= at + 30_000 || actor / 3 == h && self.contended_holder(h)));
            if actor / 3 == h && due && s.crashed.is_none() && !s.finished[3 * h] {
                s.crashed = Some(h);
                s.crash_at = None;
                s.host_crashed[h] = true;
                for a in 3 * h..3 * h + 3 {
                    s.runnable[a] = false;
                }
                s.trace.push_back(format!("{step}: host {h} crashes"));
                if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
                    eprintln!("step {step}: host {h} crashes");
                }
                // A node that was attached must be recovered; one that was
                // detached (mid-restart) leaves nothing to recover.
                {
                    let mut m = self.model.lock().unwrap();
                    m.crash_needs_recovery = m.attached[h];
                }
                self.mem.crash(h);
                self.pass(&mut s);
                drop(s);
                std::panic::resume_unwind(Box::new(Crashed));
            }
        }
        self.pass(&mut s);
        while s.turn != actor && !s.stop {
            s = self.cvs[actor].wait(s).unwrap();
        }
        self.mem.set_tag(tag_of(&s, actor));
        if s.host_crashed[actor / 3] || s.steps > STEP_LIMIT {
            drop(s);
            std::panic::resume_unwind(Box::new(Crashed));
        }
        if s.actor_gen[actor] != s.gen[actor / 3] {
            drop(s);
            std::panic::resume_unwind(Box::new(Killed));
        }
    }

    /// Lines host `h`'s killed processes stored that are not in memory yet.
    /// Asks another host's op actor to acquire the key of the entry that
    /// host `h`'s evictor has CLAIMED (as `h` sees it): the pin handshake's
    /// two halves at once.
    fn offer_claimed(&self, h: usize) {
        let region = self.mem.view(h);
        let Ok(l) = read_header(&region).and_then(|hd| Layout::from_header(&hd, region.len())) else { return };
        for st in 0..l.caps.n_stripes {
            for e in 0..l.caps.entries_per_stripe {
                let ent: Result<Entry, _> = region.read(l.entry(st, e));
                if let Ok(ent) = ent {
                    if ent.state == cxlkv_core::layout::state::CLAIMED {
                        self.model.lock().unwrap().hot = Some((ent.key_hi, h));
                        return;
                    }
                }
            }
        }
    }

    fn orphaned_lines(&self, h: usize) -> Vec<(usize, &'static str)> {
        let tags: Vec<u32> = {
            let s = self.sched.lock().unwrap();
            (0..s.gen[h]).flat_map(|g| (3 * h..3 * h + 3).map(move |a| a as u32 + 1000 * g)).collect()
        };
        tags.into_iter().flat_map(|t| self.mem.dirty_tagged(h, t)).collect()
    }

    /// While host `h` buries its killed process's node: memory must not
    /// show the node DEAD before everything that process stored landed
    /// (recovery may begin as soon as it does).
    fn bury_in_order(&self, h: usize) {
        let Ok(st) = attach(self.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return };
        let dead = st
            .view
            .read::<NodeInfo>(st.layout.node_info(h as u32))
            .is_ok_and(|i| i.state == cxlkv_core::layout::NODE_DEAD);
        if dead {
            if let Some(&(i, site)) = self.orphaned_lines(h).first() {
                self.violation(format!(
                    "step {}: host {h}'s killed process is DEAD in memory before its line {i} (stored after {site}) landed",
                    self.now()
                ));
            }
        }
    }

    /// The bury race: parks actor `a` (its host's restarted op actor) until
    /// recovery freed the node its bury looks at (or a long while passed).
    fn park_until_recovered(&self, a: usize) {
        let t = self.now();
        while !self.model.lock().unwrap().recovered && self.now() < t + 4 * LEASE.lease {
            self.yield_now(a, "bury-race");
        }
    }

    /// Host `h`'s node holds the counter's application lock (in memory).
    fn holds_app_lock(&self, h: usize) -> bool {
        use cxlkv_core::layout::{LockSlot, SLOT_LOCKED};
        let Some(i) = self.model.lock().unwrap().counter_lock else { return false };
        let Ok(st) = attach(self.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return false };
        let l = &st.layout;
        st.view.read::<LockSlot>(l.lock_slot(l.locks().app(i), h as u32)).is_ok_and(|s| s.state == SLOT_LOCKED)
    }

    /// Checks that no lock's grant sequence went back in memory.
    fn grants_monotonic(&self, who: usize) {
        use cxlkv_core::layout::LockLine;
        let Ok(st) = attach(self.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return };
        let l = &st.layout;
        let mut m = self.model.lock().unwrap();
        for lock in 0..l.n_locks {
            let Ok(ll) = st.view.read::<LockLine>(l.lock_line(lock)) else { continue };
            let now = ll.grant_seq;
            let seen = m.grants_seen.entry(lock).or_insert(now);
            if now < *seen {
                let msg = format!(
                    "lock {lock}: grant sequence went back from {seen} to {now} in memory (seen after actor {who})"
                );
                drop(m);
                return self.violation(msg);
            }
            *seen = now;
        }
    }

    /// Host `h` holds a global lock (in memory) that another node waits for.
    fn contended_holder(&self, h: usize) -> bool {
        use cxlkv_core::layout::{LockSlot, SLOT_LOCKED, SLOT_WAITING};
        let Ok(st) = attach(self.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return false };
        let l = &st.layout;
        let slot = |lock: u32, n: u32| st.view.read::<LockSlot>(l.lock_slot(lock, n)).map_or(0, |x| x.state);
        (0..l.n_locks).any(|lock| {
            slot(lock, h as u32) == SLOT_LOCKED
                && (0..l.caps.max_nodes).any(|n| n != h as u32 && slot(lock, n) == SLOT_WAITING)
        })
    }

    /// Picks the next runnable actor at random and wakes it. Now and then the
    /// actor handing over is parked for a while, as a preempted thread is:
    /// what it left in flight stays half-done for others to run into.
    fn pass(&self, s: &mut Sched) {
        let n = s.runnable.len();
        if s.sleep_until.len() != n {
            s.sleep_until = vec![0; n];
        }
        let cur = s.turn;
        if park() && cur < n && s.runnable[cur] && rnd(&mut s.rng).is_multiple_of(64) {
            s.sleep_until[cur] = s.steps + 500 + rnd(&mut s.rng) % 8000;
        }
        let awake = |s: &Sched, a: usize| s.runnable[a] && s.sleep_until[a] <= s.steps;
        if s.runnable.iter().any(|&r| r) && !(0..n).any(|a| awake(s, a)) {
            // Everyone is parked: time jumps to the first wake-up.
            let t = (0..n).filter(|&a| s.runnable[a]).map(|a| s.sleep_until[a]).min().unwrap_or(s.steps);
            s.steps = s.steps.max(t);
        }
        let live = (0..n).filter(|&a| awake(s, a)).count();
        if live == 0 {
            s.stop = true;
            for cv in &self.cvs {
                cv.notify_all();
            }
        } else {
            let mut k = (rnd(&mut s.rng) as usize) % live;
            for a in 0..n {
                if awake(s, a) {
                    if k == 0 {
                        s.turn = a;
                        break;
                    }
                    k -= 1;
                }
            }
            self.cvs[s.turn].notify_all();
        }
    }

    fn wait_turn(&self, actor: usize) {
        let mut s = self.sched.lock().unwrap();
        while s.turn != actor && !s.stop {
            s = self.cvs[actor].wait(s).unwrap();
        }
        self.mem.set_tag(tag_of(&s, actor));
    }

    /// An operation of `actor` returned: everything it stored must be in
    /// memory by now (flushed and fenced), except the payload range `keep`
    /// that the caller is still writing. A returned operation is visible to
    /// every other host and survives its own host's crash; a line left
    /// dirty would reach memory whenever the cache liked, whole, over other
    /// hosts' newer data.
    fn published_all(&self, actor: usize, what: &str, keep: Option<(u64, u64)>) {
        let h = actor / 3;
        let inside = |i: usize| keep.is_some_and(|(a, n)| (i as u64 + 1) * 64 > a && (i as u64) * 64 < a + n);
        let tag = tag_of(&self.sched.lock().unwrap(), actor);
        let left: Vec<_> = self.mem.dirty_tagged(h, tag).into_iter().filter(|&(i, _)| !inside(i)).collect();
        if let Some(&(i, site)) = left.first() {
            self.violation(format!(
                "step {}: host {h} actor {actor}: {what} returned with {} line(s) not written back, first line {i} (offset {}), stored after site {site}",
                self.now(),
                left.len(),
                i * 64
            ));
        }
    }

    fn finish(&self, actor: usize) {
        let mut s = self.sched.lock().unwrap();
        s.runnable[actor] = false;
        s.finished[actor] = true;
        self.pass(&mut s);
    }

    /// Every op actor finished or crashed, any crash was recovered, and no
    /// recovery is under way.
    fn settled(&self) -> bool {
        let s = self.sched.lock().unwrap();
        let ops_done = (0..self.hosts).all(|h| s.finished[3 * h] || s.host_crashed[h]);
        drop(s);
        // A recovery under way needs the managers to finish.
        let m = self.model.lock().unwrap();
        ops_done && !m.awaits_recovery() && m.recovering == 0
    }

    fn crashed(&self) -> Option<usize> {
        self.sched.lock().unwrap().crashed
    }

    fn now(&self) -> u64 {
        self.sched.lock().unwrap().steps
    }
}

struct Env<'w> {
    w: &'w World,
}

impl NodeEnv for Env<'_> {
    /// The host-local tier: actors of one host take turns on each lock.
    fn local_lock(&self, lock: u32) -> cxlkv_core::Result<()> {
        let me = ACTOR.with(|a| a.get());
        let h = me / 3;
        loop {
            {
                let mut s = self.w.sched.lock().unwrap();
                let slot = s.local.entry((h, lock)).or_insert(usize::MAX);
                if *slot == usize::MAX || *slot == me {
                    *slot = me;
                    return Ok(());
                }
            }
            self.w.yield_now(me, "local-lock");
        }
    }
    fn local_unlock(&self, lock: u32) {
        let me = ACTOR.with(|a| a.get());
        let mut s = self.w.sched.lock().unwrap();
        if s.local.get(&(me / 3, lock)) == Some(&me) {
            s.local.remove(&(me / 3, lock));
        }
    }
    fn wait(&self, iteration: u32) -> cxlkv_core::Result<()> {
        if iteration > WAIT_LIMIT.with(|l| l.get()) {
            return Err(Error::Timeout);
        }
        {
            // As the platform's: a process whose heartbeat found it fenced
            // stops waiting.
            let h = ACTOR.with(|a| a.get()) / 3;
            let m = self.w.model.lock().unwrap();
            if m.fenced && m.stall == Some(h) {
                return Err(Error::Revoked);
            }
        }
        if iteration == 50_000 && std::env::var("CXLKV_SIM_DEBUG").is_ok() {
            let a = ACTOR.with(|a| a.get());
            eprintln!(
                "step {}: actor {a} waited 50000 times; locks in memory:{}",
                self.w.now(),
                locks_in_memory(self.w)
            );
        }
        self.w.yield_now(ACTOR.with(|a| a.get()), "wait");
        Ok(())
    }
}

fn payload(k: Key, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for (i, c) in v.chunks_mut(8).enumerate() {
        let w = mix64(k.lo ^ (i as u64).wrapping_mul(0x100_0000_01b3)).to_le_bytes();
        c.copy_from_slice(&w[..c.len()]);
    }
    v
}

fn key(i: u64) -> Key {
    Key { lo: mix64(i + 77), hi: i }
}

fn len_of(k: Key) -> u64 {
    if MIXED.with(|m| m.get()) {
        64 + mix64(k.hi) % (2 << sim_caps(2).chunk_shift)
    } else {
        64 + mix64(k.hi) % 3000
    }
}

const LEASE: LeaseConfig = LeaseConfig { lease: 40_000, settle: 300 };

/// Runs one simulation.
pub fn run(cfg: &RunConfig) -> RunResult {
    MIXED.with(|m| m.set(cfg.mixed));
    let hosts = cfg.hosts.max(2);
    let w = Arc::new(World {
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
    });
    let w2 = w.clone();
    w.mem.set_yield_hook(Box::new(move |_h, site| {
        let a = ACTOR.with(|a| a.get());
        if a != usize::MAX {
            if let Some(line) = entry_line() {
                // A published entry's life in memory (`CXLKV_SIM_ENTRY_LINE`).
                static LAST: std::sync::Mutex<(u16, u32)> = std::sync::Mutex::new((u16::MAX, 0));
                let e: Result<cxlkv_core::layout::Entry, _> = w2.mem.shared_region().read(line * 64);
                let mut last = LAST.lock().unwrap();
                if let Ok(e) = e.map(|e| (e.state, e.gen)).map_err(|_| ()) {
                    if e != *last {
                        *last = e;
                        eprintln!(
                            "step {}: actor {a} at {site}: entry line {line} state {} gen {}",
                            w2.now(),
                            e.0,
                            e.1
                        );
                    }
                }
            }
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
            let stall = site == "lock.release.check" && stall_in_release(&w2, a);
            w2.yield_maybe(a, site, stall);
        }
    }));
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
    if !cfg.crash && cfg.seed % 3 != 1 && cfg.ops >= 8 {
        let mut m = w.model.lock().unwrap();
        m.stall = Some(mix64(cfg.seed) as usize % hosts);
        m.stall_in_release = (cfg.seed / 2) % 2 == 1;
    }
    if !cfg.crash && cfg.seed % 3 == 1 && cfg.ops >= 8 {
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
    let mut threads = Vec::new();
    for actor in 0..3 * hosts {
        let w = w.clone();
        let ops = cfg.ops;
        let seed = cfg.seed;
        let mixed = cfg.mixed;
        threads.push(std::thread::spawn(move || {
            ACTOR.with(|a| a.set(actor));
            MIXED.with(|m| m.set(mixed));
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
            return RunResult { violations: vec![msg], trace, ..RunResult::default() };
        }
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
        executed: w.mem.executed().into_iter().collect(),
    }
}

fn final_checks(w: &World) {
    // Every live host checks the region through its own cache; host 0 (or 1)
    // then reads the results.
    let crashed = w.crashed();
    for h in (0..w.hosts).filter(|&h| Some(h) != crashed) {
        match attach(w.mem.view(h), w.mem.host(h)) {
            Ok(s) => check_from(w, &s, h, "after the run"),
            Err(e) => w.violation(format!("final attach on host {h}: {e}")),
        }
    }
    let h = if crashed == Some(0) { 1 } else { 0 };
    let store = match attach(w.mem.view(h), w.mem.host(h)) {
        Ok(s) => s,
        Err(e) => return w.violation(format!("final attach: {e}")),
    };
    let m = w.model.lock().unwrap();
    let (want, maybe, root) = (m.counter, m.counter_maybe, m.counter_root);
    let inserts = m.inserts.clone();
    drop(m);
    if root != 0 {
        let got = store.fresh::<[u64; 8]>(root, Site("harness.counter")).map(|l| l[0]);
        if !got.is_ok_and(|g| g >= want && g <= want + maybe) {
            w.violation(format!("lock counter: {got:?} after {want} increments (a lost update)"));
        }
    }
    let stripes: Result<u64, _> = (0..store.layout.caps.n_stripes)
        .map(|s| {
            store
                .fresh::<cxlkv_core::layout::StripeHeader>(store.layout.stripe(s), Site("harness.stripe"))
                .map(|x| x.inserts)
        })
        .sum();
    let total = w.model.lock().unwrap().total_inserts;
    // A crashed host may have counted reserves (one batch of three) that the
    // model never saw return.
    let (stalled_any, killed) = {
        let m = w.model.lock().unwrap();
        (m.stalled, m.killed)
    };
    let slack = 3 * (crashed.is_some() as u64 + stalled_any as u64 + killed as u64);
    if !stripes.as_ref().is_ok_and(|&n| n >= total && n <= total + slack) {
        w.violation(format!("stripe insert counters {stripes:?}, harness counted {total}"));
    }
    for n in 0..w.hosts as u32 {
        let info = store.fresh_state_first::<NodeInfo>(store.layout.node_info(n), Site("harness.final.info"));
        if info.map(|i| i.state) != Ok(cxlkv_core::layout::NODE_FREE) {
            let line = (store.layout.node_info(n) / 64) as usize;
            w.violation(format!(
                "node {n} not free after the run: {info:?} (line {line} last written by {:?})",
                w.mem.provenance(line)
            ));
        }
    }
    let (stalled, was, fenced) = {
        let m = w.model.lock().unwrap();
        (m.stall, m.stalled, m.fenced)
    };
    if was && !fenced {
        w.violation(format!("host {stalled:?} stalled past its lease, but its heartbeat never noticed it was fenced"));
    }
    for (n, want) in inserts.iter().enumerate() {
        if Some(n) == crashed || Some(n) == stalled {
            continue;
        }
        let got =
            store.fresh::<cxlkv_core::layout::NodeStats>(store.layout.node_stats(n as u32), Site("harness.stats"));
        if got.map(|s| s.inserts) != Ok(*want) {
            w.violation(format!("node {n} stats: inserts {:?}, harness counted {want}", got.map(|s| s.inserts)));
        }
    }
}

fn manager_actor(w: &World, h: usize) {
    let store = match attach_retry(w, h) {
        Some(s) => s,
        None => return,
    };
    // Wait until the op actor attached the node.
    let id = h as u32;
    let mut mgr = Manager::new(id);
    let nonce = identity(w, h).nonce;
    let env = Env { w };
    let local = NodeLocal::default();
    let node = Node::attached(&store, id, &env, &local);
    let mut active = false;
    let mut was_attached = false;
    let crashed_probe = |n: u32, _i: &NodeInfo| {
        if w.sched.lock().unwrap().host_crashed.get(n as usize).copied().unwrap_or(false) {
            Some(false)
        } else {
            None
        }
    };
    loop {
        if w.settled() {
            // Every node detached: hand the manager role on.
            resign_checked(w, h, &mut mgr, &store);
            return;
        }
        let attached = w.model.lock().unwrap().attached[h];
        if was_attached && !attached {
            // The process detached: it resigns the manager role, as the
            // platform's close does.
            resign_checked(w, h, &mut mgr, &store);
        }
        was_attached = attached;
        if attached {
            // Only a heartbeat begun after the stall tells whether it noticed.
            let stalled = {
                let m = w.model.lock().unwrap();
                m.stall == Some(h) && m.stalled
            };
            // What memory says of the slot before the beat: once it is not
            // ours any more, a heartbeat (which reads the slot fresh) must
            // say so.
            let before: Result<NodeInfo, _> = w.mem.shared_region().read(store.layout.node_info(id));
            let beat = node.heartbeat(nonce);
            if let (Ok(b), Ok(_)) = (&before, &beat) {
                if b.state != cxlkv_core::layout::NODE_ALIVE || b.nonce != nonce {
                    w.violation(format!("host {h}: heartbeat passed although its slot was no longer its own: {b:?}"));
                }
            }
            if stalled && std::env::var("CXLKV_SIM_DEBUG").is_ok() {
                let mem: Result<NodeInfo, _> = w.mem.shared_region().read(store.layout.node_info(id));
                eprintln!("step {}: host {h} beats after the stall: {beat:?}; memory {mem:?}", w.now());
            }
            {
                let mut m = w.model.lock().unwrap();
                let stalled_now = m.stall == Some(h) && m.stalled;
                if stalled_now && beat == Err(Error::Revoked) {
                    // Fenced: this process stops, as the platform's does.
                    m.fenced = true;
                    return;
                }
            }
            if beat.is_err() && !w.model.lock().unwrap().attached[h] {
                // Our own op actor detached meanwhile: not a fencing.
                w.yield_now(3 * h + 1, "mgr");
                continue;
            }
            if let Err(e) = beat {
                let seen: Result<NodeInfo, _> = store.view.read(store.layout.node_info(id));
                let mem: Result<NodeInfo, _> = w.mem.shared_region().read(store.layout.node_info(id));
                return w.violation(format!(
                    "host {h} fenced at step {}: heartbeat {e}; its info {seen:?}, memory {mem:?}",
                    w.now()
                ));
            }
            match mgr.step(&store, w.now(), LEASE, &crashed_probe) {
                Ok(r) => {
                    active = r.active;
                    if r.newly_dead != 0 {
                        let now = w.now();
                        let (stalled, killed) = {
                            let m = w.model.lock().unwrap();
                            // (A killed process's node is silent once it died.)
                            let killed = (0..w.hosts).filter(|&x| m.killed && !m.attached[x]);
                            (m.stall.map_or(0, |s| 1u64 << s), killed.fold(0u64, |k, x| k | 1 << x))
                        };
                        let crashed = w.crashed().map_or(0, |c| 1u64 << c) | stalled | killed;
                        if r.newly_dead & !crashed != 0 {
                            w.violation(format!("step {now}: manager {h} declared live nodes {:b} dead", r.newly_dead));
                        }
                    }
                    if r.dead != 0 {
                        w.model.lock().unwrap().need_recovery = true;
                    }
                }
                Err(e) => return w.violation(format!("manager {h} step: {e}")),
            }
            w.published_all(3 * h + 1, "heartbeat and manager step", None);
            w.grants_monotonic(3 * h + 1);
        }
        stall_here(w, h, active);
        w.model.lock().unwrap().mgr_idle[h] = !active;
        w.yield_now(3 * h + 1, "mgr");
        w.model.lock().unwrap().mgr_idle[h] = false;
    }
}

/// Host `h` resigns the manager role. By now another node may have taken
/// the role over (a detached manager's node is not ALIVE): the resignation
/// must leave that claim alone (checked when no other node resigned
/// meanwhile).
fn resign_checked(w: &World, h: usize, mgr: &mut Manager, store: &Store<SimCoherence<'_>>) {
    let line = || {
        attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent)
            .ok()
            .and_then(|st| st.view.read::<cxlkv_core::layout::ManagerLine>(st.layout.manager.start).ok())
            .map_or(0, |ml| ml.manager)
    };
    let (before, begun, first) = {
        let mut m = w.model.lock().unwrap();
        m.resigns.0 += 1;
        m.resigns.1 += 1;
        (line(), m.resigns.1, m.resigns.0 == 1)
    };
    if let Err(e) = mgr.resign(store) {
        w.violation(format!("manager {h} resign: {e}"));
    }
    let (after, alone) = {
        let mut m = w.model.lock().unwrap();
        m.resigns.0 -= 1;
        (line(), first && m.resigns.0 == 0 && m.resigns.1 == begun)
    };
    if alone && before != 0 && before != h as u32 + 1 && after == 0 {
        w.violation(format!("step {}: host {h} resigned node {}'s manager role", w.now(), before - 1));
    }
    w.published_all(3 * h + 1, "resign", None);
}

/// Recovers crashed peers once the manager has declared them dead (on the
/// first live host). A separate actor, like platform's recovery thread: the
/// op actor may be waiting on a lock that only recovery can repair.
fn recovery_actor(w: &World, h: usize) {
    let Some(store) = attach_retry(w, h) else { return };
    let env = Env { w };
    let local = NodeLocal::default();
    let node = Node::attached(&store, h as u32, &env, &local);
    loop {
        let (need, recovered) = {
            let m = w.model.lock().unwrap();
            (m.need_recovery, m.recovered)
        };
        if w.settled() {
            return;
        }
        // Recovery runs in an attached process (as the platform's does).
        if need && !recovered && w.model.lock().unwrap().attached[h] && recovers_here(w, h) {
            {
                let mut m = w.model.lock().unwrap();
                m.recovering += 1;
                m.recoveries += 1;
                // Recovery may drop pins (a dead node's): from now on only
                // pins taken later count as held.
                m.pinned.clear();
                m.recovering_on |= 1 << h;
            }
            // A dead host's write-backs in flight complete (or are lost)
            // within the lease that had to pass before it was declared dead:
            // none lands over what recovery rebuilds.
            w.mem.drain_zombies();
            let r = node.recover(0);
            if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
                eprintln!("step {}: host {h} recovered: {r:?}", w.now());
            }
            {
                let mut m = w.model.lock().unwrap();
                m.recovering -= 1;
                m.recovering_on &= !(1 << h);
            }
            match r {
                Ok(_) => {
                    w.published_all(3 * h + 2, "recover", None);
                    // One death per run: once its recovery returned, no lock
                    // awaits repair (an application lock left so would be
                    // refused to everyone until the next recovery).
                    if let Some(lock) = locks_awaiting_repair(w) {
                        w.violation(format!("host {h} recovered, but lock {lock} still awaits repair"));
                    }
                    let mut m = w.model.lock().unwrap();
                    m.need_recovery = false;
                    m.recovered = true;
                }
                Err(e) => {
                    return w.violation(format!("host {h} recover: {e:?}; locks in memory: {}", locks_in_memory(w)))
                }
            }
        }
        w.yield_now(3 * h + 2, "recovery");
    }
}

/// The first lock whose line in memory says it awaits repair.
fn locks_awaiting_repair(w: &World) -> Option<u32> {
    use cxlkv_core::layout::LockLine;
    let st = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent).ok()?;
    let l = &st.layout;
    (0..l.n_locks).find(|&k| st.view.read::<LockLine>(l.lock_line(k)).is_ok_and(|ll| ll.repair != 0))
}

/// Every lock's line and slots as memory holds them (for reports).
fn locks_in_memory(w: &World) -> String {
    use cxlkv_core::layout::{LockLine, LockSlot};
    let Ok(st) = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return String::new() };
    let l = &st.layout;
    let mut out = String::new();
    if let Ok(ml) = st.view.read::<cxlkv_core::layout::ManagerLine>(l.manager.start) {
        out += &format!(" [manager {} lease {} dead {:b}]", ml.manager, ml.lease, ml.dead_mask);
    }
    for n in 0..l.caps.max_nodes {
        if let Ok(r) = st.view.read::<cxlkv_core::layout::RequestLine>(l.requests(n)) {
            if r.want[0] != 0 {
                out += &format!(" [node {n} wants {:b}]", r.want[0]);
            }
        }
    }
    for lock in 0..l.n_locks {
        let ll = st.view.read::<LockLine>(l.lock_line(lock));
        let slots: Vec<u32> = (0..l.caps.max_nodes)
            .map(|n| st.view.read::<LockSlot>(l.lock_slot(lock, n)).map_or(9, |x| x.state))
            .collect();
        if let Ok(ll) = ll {
            if ll.repair != 0 || slots.iter().any(|&x| x != 0) {
                out += &format!(" [lock {lock}: holder {} repair {} slots {slots:?}]", ll.holder, ll.repair);
            }
        }
    }
    out
}

/// Whether host `h` may run recovery now (see `Model::single_recovery`).
fn recovers_here(w: &World, h: usize) -> bool {
    if !w.model.lock().unwrap().single_recovery {
        return true;
    }
    let gone = {
        let s = w.sched.lock().unwrap();
        let m = w.model.lock().unwrap();
        // (A host whose process was killed has none attached to recover
        // with until recovery freed the node.)
        (0..w.hosts)
            .map(|x| s.host_crashed[x] || (m.stall == Some(x) && m.stalled) || (m.killed && !m.attached[x]))
            .collect::<Vec<_>>()
    };
    let manager = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent)
        .ok()
        .and_then(|st| st.view.read::<cxlkv_core::layout::ManagerLine>(st.layout.manager.start).ok())
        .map_or(0, |ml| ml.manager as usize);
    let live = (0..w.hosts).filter(|&x| !gone[x]);
    let pick = live.clone().find(|&x| x + 1 != manager).or_else(|| live.clone().next());
    pick == Some(h)
}

fn attach_retry(w: &World, h: usize) -> Option<Store<SimCoherence<'_>>> {
    for _ in 0..10_000 {
        match attach(w.mem.view(h), w.mem.host(h)) {
            Ok(s) => return Some(s),
            Err(Error::NotInitialized) => w.yield_now(ACTOR.with(|a| a.get()), "attach-retry"),
            Err(e) => {
                w.violation(format!("host {h} attach: {e}"));
                return None;
            }
        }
    }
    w.violation(format!("host {h} never saw a formatted region"));
    None
}

fn log(w: &World, off: u64, what: String) {
    let step = w.now();
    w.model.lock().unwrap().log.push((off, step, what));
}

struct Pin {
    h: Handle,
    until: u32,
    /// Its id in the model's `pinned`.
    id: u64,
}

/// Each key's pin ids held now, with the count of recoveries begun (`None`
/// while one runs).
fn pins_of(w: &World, keys: &[Key]) -> Vec<Option<(u64, HashSet<u64>)>> {
    let m = w.model.lock().unwrap();
    keys.iter()
        .map(|k| (m.recovering == 0).then(|| (m.recoveries, m.pinned.get(k).cloned().unwrap_or_default())))
        .collect()
}

/// Takes a pin out of the model's `pinned` (before it is released).
fn unpin_model(w: &World, p: &Pin) {
    let mut m = w.model.lock().unwrap();
    if let Some(ids) = m.pinned.get_mut(&p.h.key) {
        ids.remove(&p.id);
    }
}

/// Whether a killed process's successor takes the first free slot (else it
/// names its own). Kill runs are the seeds 4 (mod 6); their lazy ones are
/// every other one, so each choice meets both cache kinds.
fn kill_scans(seed: u64) -> bool {
    (seed / 6) % 4 >= 2
}

/// Whether a killed process restarts two leases late (else at once).
fn kill_late(seed: u64) -> bool {
    (seed / 6) % 8 >= 4
}

/// Who host `h`'s current process is (pid and nonce change with each
/// process the host runs).
fn identity(w: &World, h: usize) -> Identity {
    let g = w.sched.lock().unwrap().gen[h] as u64;
    Identity {
        pid: 100 + h as u32 + 16 * g as u32,
        host_id: h as u64 + 1,
        nonce: 1000 + h as u64 + 100 * g,
        now: 0,
        pid_ns: 0,
    }
}

/// The first thing host `h`'s next process does after its predecessor was
/// killed (a supervisor restarts it at once): it finds the predecessor's
/// node alive with a dead pid, and buries it. Everything the killed process
/// left in the host's cache must then be in memory. Then it waits for
/// recovery to free the slot, and attaches it.
fn bury_predecessor<C: Coherence>(w: &World, store: &Store<C>, h: usize, scan: bool) -> Option<u32> {
    let me = 3 * h;
    if w.model.lock().unwrap().kill_late {
        // Restarted late: the node was declared dead by its silence and
        // (most likely) recovered meanwhile; there is nothing to bury.
        let t = w.now();
        while w.now() < t + 2 * LEASE.lease {
            w.yield_now(me, "restart");
        }
    }
    match cxlkv_core::node::bury(store, h as u32) {
        Ok(true) if w.model.lock().unwrap().recovered => {
            w.violation(format!("host {h} bury declared its node DEAD after recovery had freed it"));
        }
        Ok(_) => {}
        Err(e) => {
            w.violation(format!("host {h} bury: {e}"));
            return None;
        }
    }
    let old = w.orphaned_lines(h);
    if let Some(&(i, site)) = old.first() {
        w.violation(format!(
            "step {}: host {h} buried its dead process, but {} line(s) it stored are not in memory; first line {i}, stored after {site}",
            w.now(),
            old.len()
        ));
    }
    w.published_all(me, "bury", None);
    // Some seeds take the first free slot instead of naming theirs: it is
    // this host's own, slot 0, once recovered.
    loop {
        match attach_node(store, (!scan).then_some(h as u32), identity(w, h)) {
            Ok(id) if id == h as u32 => return Some(id),
            Ok(id) => {
                w.violation(format!("host {h} attached node {id}, another host's slot"));
                return None;
            }
            Err(Error::NodeBusy | Error::NoFreeNode) => w.yield_now(me, "reattach"),
            Err(e) => {
                w.violation(format!("host {h} attach after its process was killed: {e}"));
                return None;
            }
        }
    }
}

fn op_actor(w: &World, h: usize, ops: u32, seed: u64, restarted: bool) {
    if h == 0 && !restarted {
        if let Err(e) = format(w.mem.view(0), w.mem.host(0), sim_caps(w.hosts), seed) {
            return w.violation(format!("format: {e}"));
        }
        w.published_all(0, "format", None);
    }
    let Some(store) = attach_retry(w, h) else { return };
    let who = identity(w, h);
    let attached = if restarted {
        bury_predecessor(w, &store, h, kill_scans(seed)).ok_or(Error::Revoked)
    } else {
        attach_node(&store, Some(h as u32), who)
    };
    let id = match attached {
        Ok(id) => id,
        Err(e) => return w.violation(format!("attach node {h}: {e}")),
    };
    chan_attached(w, id);
    if restarted {
        w.model.lock().unwrap().inserts[h] = 0;
    }
    let me = 3 * h;
    w.model.lock().unwrap().attached[h] = true;
    w.published_all(me, "attach_node", None);
    let env = Env { w };
    let local = NodeLocal::default();
    let node = Node::attached(&store, id, &env, &local);
    let mut x = seed ^ mix64(h as u64 + 1) ^ mix64(who.pid as u64);
    let mut pins: Vec<Pin> = Vec::new();
    // The block being written: its handle, the op that finishes it, and
    // whether its payload goes in by plain stores (flushed by `publish`).
    let mut writing: Option<(Handle, u32, bool)> = None;
    let check_err = |what: &str, e: Error, ok: &[Error]| {
        if !ok.contains(&e) && !revoked_ok(w, h, e) {
            w.violation(format!("host {h} {what}: unexpected {e:?}"));
        }
    };
    if h == 0 && !restarted {
        // The lock-counter word, published as a named root.
        // (Recovering: a crashed host holds the allocator; retry once it is
        // repaired.)
        let mut a = node.alloc(64);
        while a == Err(Error::Recovering) {
            w.yield_now(me, "alloc-retry");
            a = node.alloc(64);
        }
        match a {
            Ok(off) => {
                let r = cxlkv_core::roots::Root { offset: off, size: 64, tag: 1 };
                if let Err(e) = node.root_put(b"counter", r) {
                    w.violation(format!("root_put: {e}"));
                }
                w.model.lock().unwrap().counter_root = off;
            }
            Err(e) => w.violation(format!("alloc counter: {e}")),
        }
        let mut l = node.lock_alloc();
        while l == Err(Error::Recovering) {
            w.yield_now(me, "lock-alloc-retry");
            l = node.lock_alloc();
        }
        match l {
            Ok(i) => w.model.lock().unwrap().counter_lock = Some(i),
            Err(e) => w.violation(format!("lock_alloc: {e}")),
        }
        w.published_all(me, "root_put", None);
    }
    let first = w.model.lock().unwrap().op_at[h];
    for op in first..ops {
        {
            let mut m = w.model.lock().unwrap();
            m.op_at[h] = op;
            m.raw_writing[h] = writing.is_some_and(|(_, _, raw)| raw);
        }
        let fenced = {
            let m = w.model.lock().unwrap();
            m.stall == Some(h) && (m.fenced || m.revoked_ops > 0)
        };
        if h == 0 && op == ops / 2 && ops >= 8 && !fenced {
            // A restart: the process detaches cleanly, stays away for longer
            // than a lease (managers must not take its silence for death; if
            // it was the manager, another takes over), then attaches again.
            // (Not for a process that learnt it was declared dead: it stops.)
            if let Some((hd, _, raw)) = writing.take() {
                finish_write(w, &node, h, hd, raw, rnd(&mut x));
            }
            for p in pins.drain(..) {
                unpin_model(w, &p);
                verify_pinned(w, &node, h, &p.h);
                if let Err(e) = node.release(&[p.h]) {
                    check_err("release", e, &[]);
                }
            }
            let mine: Vec<u64> = w.model.lock().unwrap().raw.iter().filter(|b| b.2 == h).map(|b| b.0).collect();
            for off in mine {
                raw_free(w, &node, h, off);
            }
            // The process closes: its recovery thread finishes first.
            while w.model.lock().unwrap().recovering_on & (1 << h) != 0 {
                w.yield_now(me, "close");
            }
            w.model.lock().unwrap().attached[h] = false;
            if let Err(e) = node.detach() {
                check_err("detach", e, &[]);
            }
            w.published_all(me, "detach", None);
            let t = w.now();
            while w.now() < t + LEASE.lease + 5_000 {
                w.yield_now(me, "restart");
            }
            if let Err(e) = attach_node(&store, Some(h as u32), identity(w, h)) {
                return w.violation(format!("host {h} re-attach: {e}"));
            }
            chan_attached(w, h as u32);
            {
                let mut m = w.model.lock().unwrap();
                m.inserts[h] = 0;
                m.attached[h] = true;
            }
            w.published_all(me, "attach_node again", None);
        }
        // Woken from a stall, the node was declared dead and recovered
        // meanwhile: operations taking a lock fail with Revoked until its
        // heartbeat notices and the process stops (as the platform's does).
        if stall_now(w, h, op, ops, pins.is_empty() && writing.is_none()) {
            woken_pins_nothing(w, &node, h);
        }
        {
            let mut m = w.model.lock().unwrap();
            if m.stall == Some(h) && (m.fenced || m.revoked_ops > 0) {
                m.raw.retain(|b| b.2 != h);
                if m.fenced {
                    return;
                }
            }
        }
        // (A restarted process skips a barrier its predecessor passed.)
        if op == ops / 4 && w.model.lock().unwrap().barrier[1] & (1 << h) == 0 {
            // Quiescent mid-run: every host checks through its own cache, so
            // the end checks meet copies that went stale since.
            if let Some((hd, _, raw)) = writing.take() {
                finish_write(w, &node, h, hd, raw, rnd(&mut x));
            }
            barrier(w, me, 0);
            check_from(w, &store, h, "at the mid-run barrier");
            barrier(w, me, 1);
        }
        // Verify and drop pins whose time has come.
        let mut k = 0;
        while k < pins.len() {
            if pins[k].until <= op {
                let p = pins.swap_remove(k);
                unpin_model(w, &p);
                verify_pinned(w, &node, h, &p.h);
                if let Err(e) = node.release(&[p.h]) {
                    check_err("release", e, &[]);
                }
            } else {
                k += 1;
            }
        }
        if let Some((hd, due, raw)) = writing {
            if due <= op {
                writing = None;
                finish_write(w, &node, h, hd, raw, rnd(&mut x));
            }
        }
        let r = rnd(&mut x);
        let mut i = r % KEYS;
        let hot = {
            let mut m = w.model.lock().unwrap();
            match m.hot {
                Some((k, by)) if by != h => m.hot.take().map(|_| k),
                _ => None,
            }
        };
        let r = match hot {
            // An acquire of the key an evictor elsewhere is deciding on.
            Some(k) => {
                i = k;
                (r & 0xf_ffff) | 5 << 20
            }
            None => r,
        };
        match (r >> 20) % 18 {
            0..=4 if writing.is_none() => {
                let k = key(i);
                match node.reserve(NS, k, len_of(k), 16) {
                    Ok(hd) => {
                        counted_insert(w, h);
                        log(w, hd.off, format!("host {h} reserve key {} len {}", k.hi, hd.len));
                        // Write half now, the rest (and publish) a few ops later,
                        // so readers run while the block is WRITING.
                        let p = payload(k, hd.len as usize);
                        let half = p.len() / 2;
                        let raw = (r >> 44) % 2 == 0;
                        write_payload(w, &node, h, &hd, 0, &p[..half], raw);
                        writing = Some((hd, op + 1 + (r >> 40) as u32 % 3, raw));
                    }
                    Err(e) => check_err(
                        "reserve",
                        e,
                        &[Error::Exists, Error::OutOfSpace, Error::TableFull, Error::Recovering],
                    ),
                }
            }
            5..=7 => {
                let keys: Vec<Key> = (i..i + 3).map(key).collect();
                let mut out = vec![Err(Error::InvalidArgument); keys.len()];
                IN_ACQUIRE.with(|c| c.set(true));
                let got = node.acquire(NS, &keys, &mut out);
                IN_ACQUIRE.with(|c| c.set(false));
                match got {
                    Ok(_) => {
                        for (k, r) in keys.iter().zip(out) {
                            match r {
                                Ok(hd) => {
                                    if !w.model.lock().unwrap().published.contains(k) {
                                        w.violation(format!("host {h} acquired key {} never published", k.hi));
                                    }
                                    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
                                        let line = node.store.layout.entry(hd.stripe, hd.entry) / 64;
                                        eprintln!(
                                            "step {}: host {h} pinned key {} entry {}/{} gen {} line {line}",
                                            w.now(),
                                            k.hi,
                                            hd.stripe,
                                            hd.entry,
                                            hd.gen
                                        );
                                    }
                                    verify_pinned(w, &node, h, &hd);
                                    let id = {
                                        let mut m = w.model.lock().unwrap();
                                        m.pin_ids += 1;
                                        let id = m.pin_ids;
                                        m.pinned.entry(*k).or_default().insert(id);
                                        id
                                    };
                                    pins.push(Pin { h: hd, until: op + 1 + (rnd(&mut x) % 4) as u32, id });
                                }
                                Err(Error::NotFound) => {}
                                Err(e) => check_err("acquire item", e, &[Error::JournalFull]),
                            }
                        }
                    }
                    Err(e) => check_err("acquire", e, &[]),
                }
            }
            8..=10 => {
                let k = key(i);
                let mut buf = vec![0u8; (2 << sim_caps(2).chunk_shift) + 64];
                match node.get(NS, k, &mut buf) {
                    Ok(n) => {
                        if !w.model.lock().unwrap().published.contains(&k) {
                            w.violation(format!("host {h} got key {} never published", k.hi));
                        } else if buf[..n] != payload(k, n)[..] || n as u64 != len_of(k) {
                            w.violation(format!("host {h} get key {}: wrong payload", k.hi));
                        }
                    }
                    Err(e) => check_err("get", e, &[Error::NotFound, Error::Changed]),
                }
            }
            11 => {
                let keys: Vec<Key> = (i..i + 4).map(key).collect();
                let pinned_before = pins_of(w, &keys);
                let mut present = vec![false; keys.len()];
                let got = if r % 2 == 0 {
                    node.lookup(NS, &keys).map(|n| present[..n].fill(true))
                } else {
                    node.presence(NS, &keys, &mut present).map(|_| ())
                };
                match got {
                    Ok(()) => {
                        let m = w.model.lock().unwrap();
                        if let Some(k) = keys.iter().zip(&present).find(|(k, p)| **p && !m.published.contains(k)) {
                            let k = k.0.hi;
                            drop(m);
                            w.violation(format!("host {h} lookup hit key {k} never published"));
                        } else {
                            drop(m);
                            // A key pinned by the same pin from before to after
                            // the call was READY all along: a miss is a stale
                            // read. Lookup reports a prefix: only the pinned
                            // keys before its first unpinned one count.
                            let pinned_after = pins_of(w, &keys);
                            let held = |j: usize| match (&pinned_before[j], &pinned_after[j]) {
                                (Some((r0, a)), Some((r1, b))) => r0 == r1 && !a.is_disjoint(b),
                                _ => false,
                            };
                            let upto =
                                if r % 2 == 0 { (0..keys.len()).take_while(|&j| held(j)).count() } else { keys.len() };
                            if let Some(j) = (0..upto).find(|&j| held(j) && !present[j]) {
                                w.violation(format!("host {h} lookup missed key {} pinned all along", keys[j].hi));
                            }
                        }
                    }
                    Err(e) => check_err("lookup", e, &[]),
                }
            }
            12 => match node.evict(2048 + r % 8192, &mut Lru) {
                Ok(_) => {}
                Err(e) => check_err("evict", e, &[]),
            },
            13 if (r >> 50) % 4 == 0 && writing.is_none() => stale_handle_misuse(w, &node, h, key(i)),
            13 => {
                let items: Vec<ReserveItem> =
                    (i..i + 3).map(|j| ReserveItem { key: key(j), len: len_of(key(j)), tokens: 16 }).collect();
                let mut out = vec![Err(Error::InvalidArgument); items.len()];
                if let Err(e) = node.reserve_batch(NS, &items, &mut out) {
                    check_err("reserve_batch", e, &[]);
                    // Items a failed call did not reach keep their placeholder.
                    out.iter_mut().for_each(|r| {
                        if *r == Err(Error::InvalidArgument) {
                            *r = Err(e);
                        }
                    });
                }
                let mut done = Vec::new();
                for (it, r) in items.iter().zip(out) {
                    match r {
                        Ok(hd) => {
                            counted_insert(w, h);
                            log(w, hd.off, format!("host {h} batch-reserve key {} len {}", hd.key.hi, hd.len));
                            if let Err(e) = node.write(&hd, 0, &payload(it.key, hd.len as usize)) {
                                check_err("write", e, &[]);
                            }
                            done.push(hd);
                        }
                        Err(e) => check_err(
                            "reserve batch item",
                            e,
                            &[
                                Error::Exists,
                                Error::OutOfSpace,
                                Error::TableFull,
                                Error::JournalFull,
                                Error::Recovering,
                            ],
                        ),
                    }
                }
                let mut st = vec![Ok(()); done.len()];
                {
                    let mut m = w.model.lock().unwrap();
                    for hd in &done {
                        m.published.insert(hd.key);
                    }
                }
                if let Err(e) = node.publish_flushed(&done, &mut st) {
                    check_err("publish batch", e, &[]);
                }
                for s in st {
                    if let Err(e) = s {
                        check_err("publish batch item", e, &[]);
                    }
                }
            }
            14 if (r >> 50) % 4 == 0 => app_lock_churn(w, &node, h),
            14 => lock_counter(w, &node, h, r),
            16 | 17 => channel_op(w, &node, h, r),
            _ if (r >> 56) % 2 == 0 => roots_op(w, &node, h, r),
            _ => raw_op(w, &node, h, r),
        }
        {
            let mut m = w.model.lock().unwrap();
            m.ops += 1;
            m.release_armed = false;
            if m.stall == Some(h) && m.stalled_in_release && m.revoked_ops == 0 {
                m.revoked_ops = 1;
                drop(m);
                w.violation(format!(
                    "host {h}: an unlock interrupted by a stall past the lease (its lock revoked) did not fail with Revoked"
                ));
            }
        }
        w.published_all(me, "an operation", writing.map(|(hd, _, _)| (hd.off, hd.len)));
        always_invariants(w, h, op);
    }
    w.model.lock().unwrap().op_at[h] = ops;
    if let Some((hd, _, raw)) = writing {
        finish_write(w, &node, h, hd, raw, rnd(&mut x));
    }
    let mine: Vec<u64> = w.model.lock().unwrap().raw.iter().filter(|b| b.2 == h).map(|b| b.0).collect();
    for off in mine {
        raw_free(w, &node, h, off);
    }
    maintenance_recovery(w, &node, h);
    // Quiescent, with pins still held: every host checks the region through
    // its own cache (stale copies of others' lines included).
    barrier(w, me, 2);
    check_from(w, &store, h, "at the end barrier");
    barrier(w, me, 3);
    adopt_unrooted(w, &node, h);
    channel_end(w, &node, h, me);
    for p in pins.drain(..) {
        unpin_model(w, &p);
        verify_pinned(w, &node, h, &p.h);
        if let Err(e) = node.release(&[p.h]) {
            check_err("release", e, &[]);
        }
    }
    // The process closes: its recovery thread finishes first.
    while w.model.lock().unwrap().recovering_on & (1 << h) != 0 {
        w.yield_now(me, "close");
    }
    w.model.lock().unwrap().attached[h] = false;
    if let Err(e) = node.detach() {
        check_err("detach", e, &[]);
    }
    w.published_all(me, "detach", None);
}

/// Host `h` woke from a stall: if it was declared dead meanwhile (as memory
/// shows), operations that take no lock must refuse too. A pin taken now
/// would be dropped by recovery under the reader; a release would write a
/// journal that may be another node's.
fn woken_pins_nothing<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize) {
    let info: Result<NodeInfo, _> = w.mem.shared_region().read(node.store.layout.node_info(h as u32));
    if info.is_ok_and(|i| i.state == cxlkv_core::layout::NODE_ALIVE) {
        return;
    }
    let keys: Vec<Key> = (0..KEYS).map(key).collect();
    let mut out = vec![Err(Error::InvalidArgument); keys.len()];
    let r = node.acquire(NS, &keys, &mut out);
    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
        eprintln!("step {}: host {h} woke declared dead; acquire: {r:?}", w.now());
    }
    match r {
        Err(Error::Revoked) | Ok(0) => {}
        r => w.violation(format!("host {h} woke declared dead, and acquire gave {r:?}")),
    }
}

/// Stalls host `h` once, at an operation boundary with nothing pinned or
/// being written: the op actor asks, and its manager actor (the heartbeat
/// thread) parks all three of the host's actors between two steps, when it
/// is not the active manager and no recovery is pending (a manager or a
/// recovery stalled half way is outside what the protocol can fence).
/// Returns true after the stall.
/// A Revoked error is the right answer for the stalled host once it woke
/// (its node was freed meanwhile); counted.
fn revoked_ok(w: &World, h: usize, e: Error) -> bool {
    let mut m = w.model.lock().unwrap();
    let ok = e == Error::Revoked && m.stall == Some(h) && m.stalled;
    m.revoked_ops += ok as u64;
    ok
}

fn stall_now(w: &World, h: usize, op: u32, ops: u32, idle: bool) -> bool {
    {
        let mut m = w.model.lock().unwrap();
        if m.stall != Some(h) || m.stalled || op < ops / 3 || !idle {
            return false;
        }
        if m.stall_in_release {
            m.release_armed = true;
            return false;
        }
        m.stall_req = true;
    }
    let t = w.now();
    while w.now() < t + 20_000 {
        if w.model.lock().unwrap().stalled {
            return true;
        }
        w.yield_now(3 * h, "stall-wait");
    }
    let mut m = w.model.lock().unwrap();
    m.stall_req = false;
    m.stalled
}

/// Stalls the host of op actor `a` inside an unlock (called as it is about
/// to read its slot back): the critical section is done and fenced, and the
/// host holds no other lock, nothing pinned or being written; its manager
/// actor is between steps and not the active manager, and no recovery is
/// pending. The node is declared dead and its lock revoked meanwhile: the
/// unlock must report Revoked when the host wakes. True when it stalled.
fn stall_in_release(w: &World, a: usize) -> bool {
    use cxlkv_core::layout::{LockSlot, SLOT_LOCKED};
    let h = a / 3;
    {
        let m = w.model.lock().unwrap();
        if !a.is_multiple_of(3)
            || m.stall != Some(h)
            || !m.release_armed
            || m.stalled
            || m.need_recovery
            || !m.mgr_idle[h]
        {
            return false;
        }
        if m.recovering_on & (1 << h) != 0 {
            return false;
        }
    }
    let Ok(st) = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return false };
    let l = &st.layout;
    let held = (0..l.n_locks)
        .filter(|&k| st.view.read::<LockSlot>(l.lock_slot(k, h as u32)).is_ok_and(|x| x.state == SLOT_LOCKED))
        .count();
    let local = w.sched.lock().unwrap().local.keys().filter(|&&(lh, _)| lh == h).count();
    if held != 1 || local != 1 {
        return false;
    }
    {
        let mut m = w.model.lock().unwrap();
        m.stalled = true;
        m.stalled_in_release = true;
        m.raw.retain(|b| b.2 != h);
    }
    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
        eprintln!("step {}: host {h} stalls inside an unlock", w.now());
    }
    park_host(w, h);
    true
}

/// Deschedules all three actors of host `h` for three leases; on some seeds
/// the heartbeat (manager actor) wakes a while after the others, as a
/// process's threads do after SIGCONT in any order.
fn park_host(w: &World, h: usize) {
    let late = if w.model.lock().unwrap().worker_first { 2000 } else { 0 };
    let mut s = w.sched.lock().unwrap();
    let until = s.steps + 3 * LEASE.lease;
    if s.sleep_until.len() != s.runnable.len() {
        s.sleep_until = vec![0; s.runnable.len()];
    }
    for a in 3 * h..3 * h + 3 {
        s.sleep_until[a] = until + if a == 3 * h + 1 { late } else { 0 };
    }
}

/// The manager actor's side of [`stall_now`]: parks the host if asked and
/// it is safe. True when it parked.
fn stall_here(w: &World, h: usize, active: bool) -> bool {
    {
        let mut m = w.model.lock().unwrap();
        if m.stall != Some(h) || !m.stall_req || m.stalled || active || m.need_recovery {
            return false;
        }
        m.stall_req = false;
        m.stalled = true;
    }
    // Recovery will reclaim the stalled node's raw blocks.
    w.model.lock().unwrap().raw.retain(|b| b.2 != h);
    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
        eprintln!("step {}: host {h} stalls", w.now());
    }
    park_host(w, h);
    true
}

/// Invariants that hold in memory at every moment, whatever is in flight
/// (but a recovery, which rebuilds under every lock):
/// no two live entries share a payload block, every live entry's block is
/// allocated, no lock has two holders.
fn always_invariants(w: &World, h: usize, op: u32) {
    if w.model.lock().unwrap().recovering > 0 {
        // Mid-rebuild under every lock: memory is consistent again when the
        // recovery returns.
        return;
    }
    let Ok(store) = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return };
    let mut scratch = vec![0u64; cxlkv_core::check::scratch_words(&store)];
    let mut bad = Vec::new();
    let _ = cxlkv_core::check::check(&store, &mut scratch, &mut |f| {
        use cxlkv_core::check::FindingKind as K;
        if matches!(f.kind, K::SharedBlock | K::EntryPayload | K::TwoHolders) {
            bad.push(f);
        }
    });
    for f in bad.iter().take(3) {
        let mut more = String::new();
        if f.kind == cxlkv_core::check::FindingKind::EntryPayload {
            // The entry and the chunk record its payload falls in.
            if let Ok(e) = store.view.read::<cxlkv_core::layout::Entry>(store.layout.entry(f.a as u32, f.b as u32)) {
                let l = &store.layout;
                let c = e.payload_off.saturating_sub(l.payload.start) / l.chunk_size();
                let rec: Result<cxlkv_core::layout::ChunkRecord, _> = store.view.read(l.chunk(c as u32));
                let line = (l.chunk(c as u32) / 64) as usize;
                more = format!(
                    "; entry {e:?}; chunk {c} record {rec:?} (line {line} last written by {:?})",
                    w.mem.provenance(line)
                );
            }
        }
        w.violation(format!("step {} (host {h} after op {op}): in memory: {f}{more}", w.now()));
    }
}

/// Writes payload bytes into a reserved block: through `Node::write` (which
/// flushes), or by plain stores through the mapping as a user holding a
/// pointer would (published later by `publish`, which flushes).
fn write_payload<C: Coherence>(
    w: &World,
    node: &Node<'_, C>,
    h: usize,
    hd: &Handle,
    at: usize,
    data: &[u8],
    raw: bool,
) {
    let r = if raw { node.store.view.copy_in(hd.off + at as u64, data) } else { node.write(hd, at as u64, data) };
    if let Err(e) = r {
        w.violation(format!("host {h} write (raw {raw}): {e:?}"));
    }
}

/// After its operations, the first host to finish runs a recovery with no
/// node dead, while the others may still work: it rebuilds everything under
/// every lock, and nothing any live node holds or stored may change.
fn maintenance_recovery<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize) {
    {
        let mut m = w.model.lock().unwrap();
        if m.maintained {
            return;
        }
        m.maintained = true;
        m.recovering += 1;
        m.recoveries += 1;
        // Recovery may drop pins (a dead node's): from now on only
        // pins taken later count as held.
        m.pinned.clear();
        m.recovering_on |= 1 << h;
    }
    let r = node.recover(0);
    {
        let mut m = w.model.lock().unwrap();
        m.recovering -= 1;
        m.recovering_on &= !(1 << h);
    }
    match r {
        Ok(_) => w.published_all(3 * h, "maintenance recovery", None),
        Err(e) if revoked_ok(w, h, e) => {}
        Err(e) => w.violation(format!("host {h} maintenance recovery: {e:?}")),
    }
}

/// Waits until every op actor of a live host reached `phase` of the end
/// barrier (and a crashed host was recovered, and no recovery runs).
fn barrier(w: &World, me: usize, phase: usize) {
    w.model.lock().unwrap().barrier[phase] |= 1 << (me / 3);
    loop {
        let mut gone = {
            let s = w.sched.lock().unwrap();
            (0..w.hosts).filter(|&h| s.host_crashed[h]).fold(0u64, |g, h| g | 1 << h)
        };
        let m = w.model.lock().unwrap();
        if m.fenced {
            gone |= m.stall.map_or(0, |h| 1 << h);
        }
        let all = (1u64 << w.hosts) - 1;
        if (m.barrier[phase] | gone) == all && !m.awaits_recovery() && m.recovering == 0 {
            return;
        }
        drop(m);
        w.yield_now(me, "barrier");
    }
}

/// Runs `check` on host `h`'s view; every finding is a violation.
fn check_from<C: Coherence>(w: &World, store: &Store<C>, h: usize, when: &str) {
    let mut findings = Vec::new();
    let mut scratch = vec![0u64; cxlkv_core::check::scratch_words(store)];
    if let Err(e) = cxlkv_core::check::check(store, &mut scratch, &mut |f| findings.push(f)) {
        w.violation(format!("host {h} check {when} failed: {e}"));
    }
    for f in findings.iter().take(5) {
        w.violation(format!("host {h} check {when}: {f}"));
    }
}

fn raw_pattern(off: u64, len: u64) -> Vec<u8> {
    payload(Key { lo: off, hi: off ^ 0x7a }, len as usize)
}

/// Raw allocations, large ones spanning several chunks included: a block
/// never overlaps another live one, and keeps the bytes its owner wrote
/// until freed.
fn raw_op<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, r: u64) {
    let mine: Vec<u64> = w.model.lock().unwrap().raw.iter().filter(|b| b.2 == h).map(|b| b.0).collect();
    if mine.len() >= 2 || (r >> 30).is_multiple_of(3) {
        if let Some(&off) = mine.first() {
            return raw_free(w, node, h, off);
        }
    }
    let len = 64 + (r >> 8) % 12_000;
    let off = match node.alloc(len) {
        Ok(off) => off,
        Err(Error::OutOfSpace | Error::Recovering) => return,
        Err(e) if revoked_ok(w, h, e) => return,
        Err(e) => return w.violation(format!("host {h} alloc {len}: {e:?}")),
    };
    if !track_raw(w, h, off, len) {
        return;
    }
    log(w, off, format!("host {h} alloc raw {off}+{len}"));
    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
        eprintln!("step {}: host {h} alloc raw {off}+{len}", w.now());
    }
    fill_raw(w, node, h, off, len);
}

/// Stores a raw block's pattern, flushed and fenced.
fn fill_raw<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, off: u64, len: u64) {
    let st = node.store;
    w.model.lock().unwrap().raw_filling[h] = true;
    let r =
        st.view.copy_in(off, &raw_pattern(off, len)).and_then(|_| st.co.flush(&st.view, off, len, Site("harness.raw")));
    w.model.lock().unwrap().raw_filling[h] = false;
    st.co.store_fence(Site("harness.raw.fence"));
    if let Err(e) = r {
        w.violation(format!("host {h} raw write: {e:?}"));
    }
}

/// Enters a new raw block of host `h` in the model: it must not overlap any
/// live block. False (a violation) when it does.
fn track_raw(w: &World, h: usize, off: u64, len: u64) -> bool {
    let crashed = w.crashed();
    let mut m = w.model.lock().unwrap();
    let stalled = m.stall.filter(|_| m.stalled);
    if let Some(b) =
        m.raw.iter().find(|b| Some(b.2) != crashed && Some(b.2) != stalled && b.0 < off + len && off < b.0 + b.1)
    {
        let b = *b;
        let hist: String = m
            .log
            .iter()
            .filter(|x| x.0 == b.0 || x.0 == off)
            .map(|x| format!("\n      step {}: {}", x.1, x.2))
            .collect();
        drop(m);
        w.violation(format!(
            "step {}: host {h} alloc {off}+{len} overlaps host {}'s block {}+{}{hist}",
            w.now(),
            b.2,
            b.0,
            b.1
        ));
        return false;
    }
    m.raw.push((off, len, h));
    true
}

fn raw_free<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, off: u64) {
    let len = {
        let mut m = w.model.lock().unwrap();
        let Some(i) = m.raw.iter().position(|b| b.0 == off && b.2 == h) else { return };
        m.raw.swap_remove(i).1
    };
    let st = node.store;
    let mut buf = vec![0u8; len as usize];
    let r =
        st.co.invalidate(&st.view, off, len, Site("harness.raw.read")).and_then(|_| st.view.copy_out(off, &mut buf));
    if r.is_err() || buf != raw_pattern(off, len) {
        w.violation(format!("host {h} raw block {off}+{len} changed while allocated ({r:?})"));
    }
    log(w, off, format!("host {h} free raw {off}+{len}"));
    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
        eprintln!("step {}: host {h} free raw {off}+{len}", w.now());
    }
    // Recovering: the allocator lock awaits repair; nothing was freed, so
    // retry once it is repaired (a raw block is not recovery's to reclaim
    // while its owner lives).
    let mut r = node.free(off);
    while r == Err(Error::Recovering) {
        w.yield_now(3 * h, "free-retry");
        r = node.free(off);
    }
    match r {
        Ok(()) => {}
        Err(e) if revoked_ok(w, h, e) => {}
        Err(e) => w.violation(format!("host {h} free {off}: {e:?}")),
    }
}

/// What the model knows of one named root.
#[derive(Clone, Copy, Debug, Default)]
struct RootModel {
    /// `Some(Some(size))` present, `Some(None)` absent, `None` unknown (after
    /// racing puts and destroys, until an operation alone on it settles it).
    state: Option<Option<u64>>,
    /// Puts and destroys under way.
    inflight: u32,
    /// Puts and destroys begun so far.
    begun: u64,
}

/// Named roots `r0`..: any host puts, destroys or reads any of them. An
/// operation that ran alone on its name (no other put or destroy of it began
/// or was under way meanwhile) must agree with what the model knows: put
/// fails with Exists exactly when present, destroy with NotFound exactly when
/// absent, and a read returns exactly the state.
fn roots_op<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, r: u64) {
    let g = (r >> 50) as usize % w.hosts;
    let name = format!("r{g}");
    let begin = |write: bool| {
        let mut m = w.model.lock().unwrap();
        let x = m.roots[g];
        if write {
            m.roots[g].inflight += 1;
            m.roots[g].begun += 1;
        }
        x
    };
    if !(r >> 40).is_multiple_of(2) {
        let before = begin(false);
        let got = cxlkv_core::roots::get(node.store, name.as_bytes());
        // The block it names, read while no put or destroy of it runs.
        let mut bytes = Vec::new();
        if let Ok(root) = got {
            let st = node.store;
            bytes = vec![0u8; root.size as usize];
            let r = st
                .co
                .invalidate(&st.view, root.offset, root.size, Site("harness.root.read"))
                .and_then(|_| st.view.copy_out(root.offset, &mut bytes));
            if r.is_err() {
                bytes.clear();
            }
        }
        let after = w.model.lock().unwrap().roots[g];
        let alone = before.inflight == 0 && after.inflight == 0 && before.begun == after.begun;
        if let (Ok(root), true) = (got, alone) {
            if bytes != raw_pattern(root.offset, root.size) {
                w.violation(format!(
                    "host {h} root {name} names block {}+{} whose bytes changed",
                    root.offset, root.size
                ));
            }
        }
        let got = match got {
            Ok(root) => Some(root.size),
            Err(Error::NotFound) => None,
            Err(e) => return w.violation(format!("host {h} get root {name}: {e:?}")),
        };
        if let (Some(want), true) = (before.state, alone) {
            if got != want {
                w.violation(format!("host {h} read root {name} as {got:?}; it is {want:?}"));
            }
        }
        return;
    }
    let put = (r >> 20).is_multiple_of(2);
    let size = 64 + r % 1000;
    let before = begin(true);
    // A put names a raw block of its own, which the root then keeps alive
    // (its allocator may die: recovery must not reclaim it); a destroy
    // frees the block its root named.
    let block = if put { rooted_alloc(w, node, h, size) } else { None };
    if put && block.is_none() {
        w.model.lock().unwrap().roots[g].inflight -= 1;
        return;
    }
    let res = if let Some(off) = block {
        node.root_put(name.as_bytes(), cxlkv_core::roots::Root { offset: off, size, tag: h as u32 })
    } else {
        node.root_destroy(name.as_bytes()).map(|root| {
            if root.offset != 0 {
                unroot(w, node, h, root.offset);
            }
        })
    };
    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
        eprintln!(
            "step {}: host {h} root {} {name} block {block:?}: {res:?}",
            w.now(),
            if put { "put" } else { "destroy" }
        );
    }
    if let Some(off) = block {
        match res {
            Ok(()) => {
                let mut m = w.model.lock().unwrap();
                if let Some(b) = m.raw.iter_mut().find(|b| b.0 == off && b.2 == h) {
                    b.2 = ROOTED;
                }
            }
            Err(Error::Exists) => raw_free(w, node, h, off),
            // Revoked: the root may or may not name it; the block stays.
            Err(_) => {}
        }
    }
    let mut m = w.model.lock().unwrap();
    m.roots[g].inflight -= 1;
    let alone = before.inflight == 0 && m.roots[g].inflight == 0 && m.roots[g].begun == before.begun + 1;
    let next = match (put, res) {
        (true, Ok(())) => Some(Some(size)),
        (false, Ok(())) | (false, Err(Error::NotFound)) => Some(None),
        (true, Err(Error::Exists)) => None,
        (_, Err(e)) => {
            // Revoked after the change was made: the state is unknown.
            m.roots[g].state = None;
            drop(m);
            if !revoked_ok(w, h, e) {
                w.violation(format!("host {h} {} root {name}: {e:?}", if put { "put" } else { "destroy" }));
            }
            return;
        }
    };
    if !alone {
        m.roots[g].state = None;
        return;
    }
    if let Some(was) = before.state {
        let agrees = match (put, res) {
            (true, Ok(())) | (false, Err(Error::NotFound)) => was.is_none(),
            _ => was.is_some(),
        };
        if !agrees {
            drop(m);
            return w.violation(format!(
                "host {h} {} root {name} gave {res:?}; it was {was:?}",
                if put { "put" } else { "destroy" }
            ));
        }
    }
    // An Exists leaves the size unknown unless the model knew it.
    m.roots[g].state = next.or(before.state);
}

/// Owner of a raw block in `Model::raw` that a named root keeps.
const ROOTED: usize = usize::MAX;

/// Allocates and fills a raw block for a root to name (tracked as host
/// `h`'s until the root names it). None when there is no room now.
fn rooted_alloc<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, size: u64) -> Option<u64> {
    let off = match node.alloc(size) {
        Ok(off) => off,
        Err(Error::OutOfSpace | Error::Recovering) => return None,
        Err(e) if revoked_ok(w, h, e) => return None,
        Err(e) => {
            w.violation(format!("host {h} alloc {size} for a root: {e:?}"));
            return None;
        }
    };
    if !track_raw(w, h, off, size) {
        return None;
    }
    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
        eprintln!("step {}: host {h} alloc rooted {off}+{size}", w.now());
    }
    fill_raw(w, node, h, off, size);
    Some(off)
}

/// Once, when every operation is done: blocks the model still takes for
/// rooted that no root names any more are freed by host `h`. A destroy whose
/// unlock was interrupted by a stall past the lease returns Revoked after it
/// took the root away, so its caller never learnt the block; a live process
/// cleaning up frees it, as an application would.
fn adopt_unrooted<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize) {
    {
        let mut m = w.model.lock().unwrap();
        if m.adopted {
            return;
        }
        m.adopted = true;
    }
    let named: Vec<u64> = (0..w.hosts)
        .filter_map(|g| cxlkv_core::roots::get(node.store, format!("r{g}").as_bytes()).ok())
        .map(|r| r.offset)
        .collect();
    let lost: Vec<u64> = {
        let mut m = w.model.lock().unwrap();
        let counter = m.counter_root;
        m.raw
            .iter_mut()
            .filter(|b| b.2 == ROOTED && b.0 != counter && !named.contains(&b.0))
            .map(|b| {
                b.2 = h;
                b.0
            })
            .collect()
    };
    for off in lost {
        raw_free(w, node, h, off);
    }
}

/// The block a destroyed root named becomes host `h`'s, which frees it
/// (checking it kept its bytes).
fn unroot<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, off: u64) {
    let known = {
        let mut m = w.model.lock().unwrap();
        m.raw.iter_mut().find(|b| b.0 == off && b.2 == ROOTED).map(|b| b.2 = h).is_some()
    };
    if known {
        raw_free(w, node, h, off);
    } else {
        // Named by a put the model lost track of (its host died): free it.
        let mut r = node.free(off);
        while r == Err(Error::Recovering) {
            w.yield_now(3 * h, "free-retry");
            r = node.free(off);
        }
        if let Err(e) = r {
            if !revoked_ok(w, h, e) {
                w.violation(format!("host {h} free of an unrooted block {off}: {e:?}"));
            }
        }
    }
}

fn counted_insert(w: &World, h: usize) {
    let mut m = w.model.lock().unwrap();
    m.inserts[h] += 1;
    m.total_inserts += 1;
}

fn finish_write<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, hd: Handle, raw: bool, r: u64) {
    let p = payload(hd.key, hd.len as usize);
    let half = p.len() / 2;
    write_payload(w, node, h, &hd, half, &p[half..], raw);
    log(w, hd.off, format!("host {h} finish-write key {} (abort: {})", hd.key.hi, r.is_multiple_of(7)));
    if r.is_multiple_of(7) {
        if let Err(e) = node.abort(&hd) {
            w.violation(format!("host {h} abort: {e:?}"));
        }
        return;
    }
    w.model.lock().unwrap().published.insert(hd.key);
    let r = if raw && r % 4 == 1 {
        // The batch form, as the C and Python doors publish.
        let mut out = [Ok(())];
        node.publish_batch(&[hd], &mut out).and(out[0])
    } else if raw || r.is_multiple_of(2) {
        node.publish(&hd)
    } else {
        node.publish_flushed(&[hd], &mut [Ok(())])
    };
    if let Err(e) = r {
        w.violation(format!("host {h} publish: {e:?}"));
    }
}

fn verify_pinned<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, hd: &Handle) {
    let mut buf = vec![0u8; hd.len as usize];
    // Half the pins are read through a pointer, as the C and Python doors'
    // zero-copy views are: made fresh once, then plain loads.
    let by_pointer = hd.gen.is_multiple_of(2);
    let read = if by_pointer {
        node.fresh_payload(hd).and_then(|_| node.store.view.copy_out(hd.off, &mut buf))
    } else {
        node.read(hd, 0, &mut buf)
    };
    match read {
        Ok(()) => {
            if hd.len != len_of(hd.key) || buf != payload(hd.key, buf.len()) {
                let want = payload(hd.key, buf.len());
                let at = buf.iter().zip(&want).position(|(a, b)| a != b);
                let mut mem = vec![0u8; buf.len()];
                let _ = w.mem.shared_region().copy_out(hd.off, &mut mem);
                let mem_ok = mem == want;
                let mut who = String::new();
                if let Some(at) = at {
                    let a = at & !63;
                    let end = (a + 64).min(mem.len());
                    for j in 0..KEYS {
                        let pj = payload(key(j), 4096);
                        for o in (0..4096 - 64).step_by(64) {
                            if pj[o..o + (end - a)] == mem[a..end] {
                                who += &format!(" key {j}@{o}");
                            }
                        }
                    }
                    if mem[a..end].iter().all(|&b| b == 0) {
                        who += " zeros";
                    }
                    let (wh, how) = w.mem.provenance(((hd.off as usize) + a) / 64);
                    who += &format!("; last written back by host {wh} ({how})");
                }
                let mut hist = String::new();
                let logged = w.model.lock().unwrap().log.clone();
                for (o, st, what) in &logged {
                    if (*o & !4095) == (hd.off & !4095) {
                        hist += &format!("\n      step {st} off {o}: {what}");
                    }
                }
                who += &hist;
                let e: Result<cxlkv_core::layout::Entry, _> =
                    w.mem.shared_region().read(node.store.layout.entry(hd.stripe, hd.entry));
                let counter_at = w.model.lock().unwrap().counter_root;
                w.violation(format!(
                    "host {h} pinned key {} (off {} len {}; counter at {}): payload differs at byte {at:?}; memory holds the right bytes: {mem_ok} (line there matches:{who}); entry in memory {e:?}; step {}",
                    hd.key.hi, hd.off, hd.len, counter_at, w.now()
                ));
            }
        }
        Err(e) => w.violation(format!("host {h} read pinned: {e:?}")),
    }
}

/// Increments the lock-protected counter. Half the time the caller gives up
/// after a few waits: a request that times out withdraws, and a grant racing
/// the withdrawal must be given back, never stranded.
fn lock_counter<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, r: u64) {
    let (off, lock) = {
        let m = w.model.lock().unwrap();
        (m.counter_root, m.counter_lock)
    };
    let (true, Some(lock)) = (off != 0, lock) else { return };
    let st = node.store;
    let patient = (r >> 36).is_multiple_of(2);
    WAIT_LIMIT.with(|l| l.set(if patient { 200_000 } else { 2 + (r >> 37) as u32 % 40 }));
    // The application lock's API, with `with_lock`'s rule: a revoked lock
    // outranks what ran under it.
    let r = node.lock_app(lock).and_then(|held| {
        let stale = w.model.lock().unwrap().old_tickets.insert(h, held.seq);
        if let Some(seq) = stale.filter(|&s| s != held.seq) {
            // An old ticket of this lock, presented while holding a newer
            // grant: refused, and the grant stays held.
            match node.unlock_app(cxlkv_core::lock::Held { lock: held.lock, seq }) {
                Err(Error::Revoked) => {}
                r => w.violation(format!("host {h}: releasing a stale ticket of lock {} gave {r:?}", held.lock)),
            }
        }
        let body = (|| {
            st.co.invalidate(&st.view, off, 8, Site("harness.counter.read"))?;
            let v = st.view.load_u64(off)?;
            st.view.store_u64(off, v + 1)?;
            st.co.flush(&st.view, off, 8, Site("harness.counter.write"))
        })();
        match node.unlock_app(held) {
            Err(Error::Revoked) => Err(Error::Revoked),
            u => body.and(u),
        }
    });
    WAIT_LIMIT.with(|l| l.set(200_000));
    match r {
        Ok(()) => w.model.lock().unwrap().counter += 1,
        Err(Error::Timeout) if !patient => {}
        // The increment ran; the unlock found the lock revoked.
        Err(e) if revoked_ok(w, h, e) => w.model.lock().unwrap().counter_maybe += 1,
        Err(e) => w.violation(format!("host {h} counter lock: {e:?}")),
    }
}

/// A caller's mistake: reserves `k`, aborts it, reserves it again, and
/// publishes the first (stale) handle. Refused; the new reservation is then
/// written and published as usual.
fn stale_handle_misuse<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, k: Key) {
    let ok = [Error::Exists, Error::OutOfSpace, Error::TableFull, Error::Recovering];
    let old = match node.reserve(NS, k, len_of(k), 16) {
        Ok(hd) => hd,
        Err(e) if ok.contains(&e) || revoked_ok(w, h, e) => return,
        Err(e) => return w.violation(format!("host {h} reserve (misuse): {e:?}")),
    };
    counted_insert(w, h);
    if let Err(e) = node.abort(&old) {
        if !revoked_ok(w, h, e) {
            w.violation(format!("host {h} abort (misuse): {e:?}"));
        }
        return;
    }
    let new = match node.reserve(NS, k, len_of(k), 16) {
        Ok(hd) => hd,
        Err(e) if ok.contains(&e) || revoked_ok(w, h, e) => return,
        Err(e) => return w.violation(format!("host {h} reserve again (misuse): {e:?}")),
    };
    counted_insert(w, h);
    let mut out = [Ok(())];
    match node.publish_flushed(&[old], &mut out).and(out[0]) {
        Err(Error::StaleHandle) => {}
        Err(e) if revoked_ok(w, h, e) => return,
        r => return w.violation(format!("host {h}: publishing a stale handle of key {} gave {r:?}", k.hi)),
    }
    write_payload(w, node, h, &new, 0, &payload(k, new.len as usize), false);
    w.model.lock().unwrap().published.insert(k);
    if let Err(e) = node.publish_flushed(&[new], &mut [Ok(())]) {
        if !revoked_ok(w, h, e) {
            w.violation(format!("host {h} publish (misuse): {e:?}"));
        }
    }
}

/// Allocates an application lock and frees it again: never one allocated
/// already (TableFull when every one is), freed exactly once.
fn app_lock_churn<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize) {
    match node.lock_alloc() {
        Ok(i) => {
            {
                let mut m = w.model.lock().unwrap();
                if m.counter_lock == Some(i) || !m.churned.insert(i) {
                    drop(m);
                    return w.violation(format!("host {h} lock_alloc handed out lock {i}, allocated already"));
                }
            }
            w.yield_now(3 * h, "churn");
            w.model.lock().unwrap().churned.remove(&i);
            match node.lock_free(i) {
                Ok(()) => {}
                Err(e) if revoked_ok(w, h, e) || e == Error::Recovering => {}
                Err(e) => w.violation(format!("host {h} lock_free {i}: {e:?}")),
            }
        }
        Err(Error::TableFull | Error::RootsFull | Error::Recovering) => {}
        Err(e) if revoked_ok(w, h, e) => {}
        Err(e) => w.violation(format!("host {h} lock_alloc: {e:?}")),
    }
}

/// Re-formats a region, crashing the formatting host at a random coherence
/// call of the format; its dirty lines are lost, land, or land later. Another
/// host must then find the region either not initialised (or rejected), or
/// consistent: never an old header over half-written new metadata.
pub fn reformat_run(seed: u64, disable: Option<&'static str>, lazy: bool) -> Vec<String> {
    // Eight crash points per seed (a format is quick).
    (0..8).flat_map(|j| reformat_once(seed * 8 + j, disable, lazy)).collect()
}

fn reformat_once(seed: u64, disable: Option<&'static str>, lazy: bool) -> Vec<String> {
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

/// Channel messages: the keys of message `id`.
fn msg_keys(id: u64, n: usize) -> Vec<Key> {
    (0..n as u64).map(|j| Key { lo: mix64(id << 8 | j), hi: id << 8 | j }).collect()
}

/// Channel messages: the fields of message `id` with `n` keys, as sent.
fn msg_of(id: u64, n: usize) -> Message {
    Message {
        kind: 1 + (id % 3) as u32,
        request_id: id,
        ns: (id % 7) as u32,
        status: n as u32,
        stamp: id.wrapping_mul(31),
        ..Message::default()
    }
}

fn chan_attached(w: &World, id: u32) {
    *w.model.lock().unwrap().node_epoch.entry(id).or_default() += 1;
}

fn chan_err(w: &World, h: usize, what: &str, e: Error, ok: &[Error]) {
    if !ok.contains(&e) && !revoked_ok(w, h, e) {
        w.violation(format!("host {h} {what}: unexpected {e:?}"));
    }
}

/// Sends message `n` keys long to node `to`, recorded in the model. Returns
/// whether the send returned Ok, and the error otherwise.
fn chan_send<C: Coherence>(w: &World, node: &Node<'_, C>, to: u32, n: usize) -> Result<(), Error> {
    let (id, epoch0) = {
        let mut m = w.model.lock().unwrap();
        m.next_msg += 1;
        let id = m.next_msg;
        let epoch0 = m.node_epoch.get(&to).copied().unwrap_or(0);
        m.msgs.insert(id, ChanMsg { from: node.id, to, keys: n, acked: false, received: false, epoch: None });
        (id, epoch0)
    };
    let r = node.send(to, &msg_of(id, n), &msg_keys(id, n));
    let mut m = w.model.lock().unwrap();
    let epoch1 = m.node_epoch.get(&to).copied().unwrap_or(0);
    match r {
        Ok(()) => {
            if let Some(c) = m.msgs.get_mut(&id) {
                c.acked = true;
                c.epoch = (epoch0 == epoch1).then_some(epoch1);
            }
        }
        // Refused before anything was written.
        Err(Error::BadNode | Error::InboxFull | Error::TooLarge) => {
            m.msgs.remove(&id);
        }
        // May or may not have landed.
        Err(_) => {}
    }
    r
}

/// Takes every message waiting in this node's inbox and checks each against
/// the model: sent to this node, once, whole, and none of the same sender's
/// acknowledged earlier ones skipped.
fn chan_drain<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize) {
    let mut buf = vec![Key::default(); 64];
    loop {
        match node.try_recv(&mut buf) {
            Ok(None) => return,
            Ok(Some(msg)) => chan_verify(w, node.id, h, &msg, &buf[..(msg.n_keys as usize).min(buf.len())]),
            Err(e) => return chan_err(w, h, "try_recv", e, &[]),
        }
    }
}

fn chan_verify(w: &World, me: u32, h: usize, msg: &Message, keys: &[Key]) {
    let id = msg.request_id;
    let mut m = w.model.lock().unwrap();
    let epoch = m.node_epoch.get(&me).copied().unwrap_or(0);
    let bad = match m.msgs.get(&id) {
        None => Some(format!("host {h} received message {id}, never sent")),
        Some(c) if c.to != me => Some(format!("host {h} node {me} received message {id} sent to node {}", c.to)),
        Some(c) if c.received => Some(format!("host {h} received message {id} twice")),
        Some(c) if c.epoch.is_some_and(|e| e != epoch) => Some(format!(
            "host {h} node {me} (incarnation {epoch}) received message {id}, sent to its incarnation {:?}",
            c.epoch
        )),
        Some(c)
            if *msg != Message { from: c.from, n_keys: c.keys as u32, ..msg_of(id, c.keys) }
                || keys != &msg_keys(id, c.keys)[..] =>
        {
            Some(format!("host {h} received message {id} altered: {msg:?}"))
        }
        Some(c) => {
            let from = c.from;
            m.msgs
                .range(..id)
                .find(|(_, o)| o.from == from && o.to == me && o.acked && !o.received && o.epoch == Some(epoch))
                .map(|(oid, _)| format!("host {h} received message {id} from node {from} but not its earlier {oid}"))
        }
    };
    if let Some(c) = m.msgs.get_mut(&id) {
        c.received = true;
    }
    drop(m);
    if let Some(v) = bad {
        w.violation(v);
    }
}

/// A channel operation: drain this node's inbox, then (mostly) send a
/// message of 0 to 39 keys to a random node (itself included).
fn channel_op<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, r: u64) {
    chan_drain(w, node, h);
    if (r >> 8).is_multiple_of(4) {
        return;
    }
    let to = ((r >> 12) % w.hosts as u64) as u32;
    let n = ((r >> 16) % 40) as usize;
    if let Err(e) = chan_send(w, node, to, n) {
        chan_err(w, h, "send", e, &[Error::BadNode, Error::InboxFull, Error::Recovering]);
    }
}

/// Every acknowledged message for this incarnation of the node was received.
fn chan_complete(w: &World, me: u32, h: usize, when: &str) {
    let m = w.model.lock().unwrap();
    let epoch = m.node_epoch.get(&me).copied().unwrap_or(0);
    let lost: Vec<u64> = m
        .msgs
        .iter()
        .filter(|(_, c)| c.to == me && c.acked && !c.received && c.epoch == Some(epoch))
        .map(|(id, _)| *id)
        .collect();
    drop(m);
    if !lost.is_empty() {
        w.violation(format!("host {h} node {me} {when}: acknowledged messages never delivered: {lost:?}"));
    }
}

/// At the end, quiescent: every node drains its inbox (nothing acknowledged
/// may be missing), then fills its neighbour's emptied ring (exactly as many
/// one-slot messages as it has slots must fit: a stale head refuses sooner),
/// then drains again.
fn channel_end<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, me: usize) {
    chan_drain(w, node, h);
    chan_complete(w, node.id, h, "at the end");
    barrier(w, me, 4);
    let to = (node.id + 1) % w.hosts as u32;
    let cap = node.store.layout.caps.inbox_slots as usize;
    let mut sent = 0;
    let mut refused = None;
    for i in 0..=cap {
        match chan_send(w, node, to, i % 12 + 1) {
            Ok(()) => sent += 1,
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    match refused {
        Some(Error::InboxFull) if sent == cap => {}
        // Its host crashed or stalled: no node there.
        Some(Error::BadNode) if sent == 0 => {}
        Some(Error::InboxFull) => {
            w.violation(format!("host {h}: node {to}'s empty inbox of {cap} slots took {sent} one-slot messages"))
        }
        Some(e) => chan_err(w, h, "send at the end", e, &[Error::Recovering]),
        None => w.violation(format!("host {h}: node {to}'s inbox of {cap} slots took {sent} one-slot messages")),
    }
    barrier(w, me, 5);
    chan_drain(w, node, h);
    chan_complete(w, node.id, h, "after the fill");
    channel_stream(w, node, h, me);
}

/// Node 0 streams multi-slot messages to node 1, which polls all along:
/// a first header that lands before the rest of its message is caught.
fn channel_stream<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, me: usize) {
    const MSGS: usize = 6;
    if node.id == 0 {
        'msgs: for i in 0..MSGS {
            loop {
                match chan_send(w, node, 1, 25 + 4 * i) {
                    Ok(()) => break,
                    Err(Error::InboxFull) => w.yield_now(me, "stream-full"),
                    Err(Error::BadNode) => break 'msgs,
                    Err(e) => {
                        chan_err(w, h, "stream send", e, &[Error::Recovering]);
                        break 'msgs;
                    }
                }
            }
        }
        w.model.lock().unwrap().stream_done = true;
    } else if node.id == 1 {
        // (Bounded: node 0's host may have crashed.)
        for _ in 0..20_000 {
            chan_drain(w, node, h);
            if w.model.lock().unwrap().stream_done {
                chan_drain(w, node, h);
                chan_complete(w, node.id, h, "after the stream");
                return;
            }
            w.yield_now(me, "stream-poll");
        }
    }
}
