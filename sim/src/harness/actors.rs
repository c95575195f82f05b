//! The actors of each simulated host: the manager (heartbeat, lock
//! manager, recovery) and the op actor (random cache operations, each
//! checked against the model).

use std::cell::Cell;
use std::collections::HashMap;

use cxlkv_core::coherence::{Coherence, Site};
use cxlkv_core::format::format;
use cxlkv_core::hash::{mix64, Key};
use cxlkv_core::index::Lru;
use cxlkv_core::layout::NodeInfo;
use cxlkv_core::lock::Manager;
use cxlkv_core::node::{attach_node, Identity, Node};
use cxlkv_core::store::{attach, Store};
use cxlkv_core::Error;

use crate::harness::blocks::{
    acquire_op, check, finish_write, get_op, lookup_op, put_with_op, release_pins, reserve_batch_op, reserve_op,
    stale_handle_misuse, verify_pinned, Writing,
};
use crate::harness::checks::{always_invariants, check_from};
use crate::harness::feed::feed_tail;
use crate::harness::model::{key, ns, Pin, NS_ID, TENANTS, WAIT_LIMIT};
use crate::harness::ops::{
    adopt_unrooted, chan_attached, chan_attaching, channel_end, channel_op, raw_free, raw_op, revoked_ok, roots_op,
};
use crate::harness::params::sim_caps;
use crate::harness::params::{KEYS, LEASE};
use crate::harness::sched::{rnd, StepCut};
use crate::harness::stalls::{await_stalled_quiet, barrier, stall_here, stall_now};
use crate::harness::tier::{tier_op, tier_release, TierState};
use crate::harness::world::unpin_model;
use crate::harness::world::{
    attach_retry, identity, kill_scans, locks_awaiting_repair, locks_in_memory, recovers_here, Env, World,
};
use crate::memory::SimCoherence;

pub(crate) fn manager_actor(w: &World, h: usize) {
    let store = match attach_retry(w, h) {
        Some(s) => s,
        None => return,
    };
    // Wait until the op actor attached the node.
    let id = h as u32;
    let mut mgr = Manager::new(id);
    let nonce = identity(w, h).nonce;
    let env = Env { w };
    let local = w.local(h);
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
            let beat = beat_checked(w, h, &node, nonce);
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
            match node.give_back_strays() {
                Ok(_) | Err(Error::Revoked) => {}
                Err(e) => return w.violation(format!("host {h} giving stray grants back: {e}")),
            }
            // Kept grants another node asks for go back (recalled only:
            // the simulated clock does not expire them).
            match node.release_parks(0) {
                Ok(_) | Err(Error::Revoked) => {}
                Err(e) => return w.violation(format!("host {h} giving kept grants back: {e}")),
            }
            match cut_step(w, h, &store, &mut mgr, |m| m.step(&store, w.now(), LEASE, &crashed_probe)) {
                None => {}
                Some(Ok(r)) => {
                    active = r.active;
                    if r.newly_dead != 0 {
                        only_silent_declared_dead(w, h, r.newly_dead);
                    }
                    if r.dead != 0 {
                        w.model.lock().unwrap().need_recovery = true;
                    }
                }
                Some(Err(e)) => return w.violation(format!("manager {h} step: {e}")),
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

/// Runs manager step `f` of host `h`. In runs that cut steps
/// ([`crate::harness::scenarios::RunConfig::cut_steps`]), one step in 32 is
/// cut off at one of its first 32 scheduling points, as when the process
/// stepping the node's manager for it (any process of the host may) is
/// killed part-way: what the step stored stays in the host's cache, and the
/// node goes on with a fresh manager state, as the platform's does when it
/// takes the step lock over from a dead process (`None` then).
fn cut_step<T>(
    w: &World,
    h: usize,
    store: &Store<SimCoherence<'_>>,
    mgr: &mut Manager,
    f: impl FnOnce(&mut Manager) -> T,
) -> Option<T> {
    let actor = 3 * h + 1;
    if w.model.lock().unwrap().cut_steps {
        let mut s = w.sched.lock().unwrap();
        if rnd(&mut s.rng).is_multiple_of(32) {
            let n = 1 + (rnd(&mut s.rng) % 32) as u32;
            if s.cut_in.len() <= actor {
                s.cut_in.resize(actor + 1, 0);
            }
            s.cut_in[actor] = n;
        }
    }
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(mgr)));
    if let Some(n) = w.sched.lock().unwrap().cut_in.get_mut(actor) {
        *n = 0;
    }
    match r {
        Ok(r) => Some(r),
        Err(p) if p.is::<StepCut>() => {
            match Manager::after_cut(store, h as u32) {
                Ok(m) => *mgr = m,
                Err(e) => w.violation(format!("host {h} writing back a cut manager step: {e}")),
            }
            None
        }
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// Node `h` beats. What memory says of its slot before the beat: once it
/// is not its own any more, a heartbeat (which reads the slot fresh) must
/// say so.
fn beat_checked<C: Coherence>(w: &World, h: usize, node: &Node<'_, C>, nonce: u64) -> Result<u64, Error> {
    let before: Result<NodeInfo, _> = w.mem.shared_region().read(node.store.layout.node_info(h as u32));
    let beat = node.heartbeat(nonce);
    if let (Ok(b), Ok(_)) = (&before, &beat) {
        if b.state != cxlkv_core::layout::NODE_ALIVE || b.nonce != nonce {
            w.violation(format!("host {h}: heartbeat passed although its slot was no longer its own: {b:?}"));
        }
    }
    beat
}

/// The manager of host `h` declared `newly_dead` dead: only nodes that were
/// silent may be (a crashed host's, a stalled one's, a killed process's).
fn only_silent_declared_dead(w: &World, h: usize, newly_dead: u64) {
    let now = w.now();
    let (stalled, killed) = {
        let m = w.model.lock().unwrap();
        // (A killed process's node is silent once it died.)
        let killed = (0..w.hosts).filter(|&x| m.killed && !m.attached[x]);
        (m.stall.map_or(0, |s| 1u64 << s), killed.fold(0u64, |k, x| k | 1 << x))
    };
    let crashed = w.crashed().map_or(0, |c| 1u64 << c) | stalled | killed;
    if newly_dead & !crashed != 0 {
        w.violation(format!("step {now}: manager {h} declared live nodes {newly_dead:b} dead"));
    }
}

/// Host `h` resigns the manager role. By now another node may have taken
/// the role over (a detached manager's node is not ALIVE): the resignation
/// must leave that claim alone (checked when no other node resigned
/// meanwhile).
pub(crate) fn resign_checked(w: &World, h: usize, mgr: &mut Manager, store: &Store<SimCoherence<'_>>) {
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
pub(crate) fn recovery_actor(w: &World, h: usize) {
    let Some(store) = attach_retry(w, h) else { return };
    let env = Env { w };
    let local = w.local(h);
    let node = Node::attached(&store, h as u32, &env, &local);
    loop {
        let (need, recovered) = {
            let m = w.model.lock().unwrap();
            // (A host that stalled and was declared dead recovers nothing:
            // its calls fail with `Revoked`.)
            let fenced_here = m.stall == Some(h) && m.stalled;
            (m.need_recovery && !fenced_here, m.recovered)
        };
        if w.settled() {
            return;
        }
        // Recovery runs in an attached process (as the platform's does).
        if need && !recovered && w.model.lock().unwrap().attached[h] && recovers_here(w, h) {
            let asks = {
                let mut m = w.model.lock().unwrap();
                m.recovering += 1;
                m.recoveries += 1;
                // Recovery may drop pins (a dead node's): from now on only
                // pins taken later count as held.
                m.pinned.clear();
                m.recovering_on |= 1 << h;
                m.recovering_per[h] += 1;
                m.recovery_asks
            };
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
                m.recovering_per[h] = m.recovering_per[h].saturating_sub(1);
                // (Another thread of the process may recover still: a void
                // structure's repair beside the recovery thread's.)
                if m.recovering_per[h] == 0 {
                    m.recovering_on &= !(1 << h);
                }
            }
            if r.is_ok_and(|r| r.void_stripes > 0) {
                w.model.lock().unwrap().void_repairs += 1;
            }
            lost_stamps(w, h, &r);
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
                    // A burial or quiesce that asked for a recovery while
                    // this one ran is answered by the next.
                    if m.recovery_asks == asks {
                        m.need_recovery = false;
                        m.recovered = true;
                    }
                }
                Err(e) => {
                    return w.violation(format!("host {h} recover: {e:?}; locks in memory: {}", locks_in_memory(w)))
                }
            }
        }
        w.yield_now(3 * h + 2, "recovery");
    }
}

/// The first thing host `h`'s next process does after its predecessor was
/// killed (a supervisor restarts it at once): it finds the predecessor's
/// node alive with a dead pid, and buries it. Everything the killed process
/// left in the host's cache must then be in memory. Then it waits for
/// recovery to free the slot, and attaches it.
pub(crate) fn bury_predecessor<C: Coherence>(w: &World, store: &Store<C>, h: usize, scan: bool) -> Option<u32> {
    let me = 3 * h;
    if w.model.lock().unwrap().kill_late {
        // Restarted late: the node was declared dead by its silence and
        // (most likely) recovered meanwhile; there is nothing to bury.
        let t = w.now();
        while w.now() < t + 2 * LEASE.lease {
            w.yield_now(me, "restart");
        }
    }
    let was: Result<NodeInfo, _> = w.mem.shared_region().read(store.layout.node_info(h as u32));
    let buried = cxlkv_core::node::bury(store, h as u32);
    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
        let hb: Result<cxlkv_core::layout::Heartbeat, _> = w.mem.shared_region().read(store.layout.heartbeat(h as u32));
        eprintln!("step {}: host {h} buries its predecessor ({was:?}): {buried:?}; heartbeat {hb:?}", w.now());
    }
    match buried {
        Ok(true) if was.is_ok_and(|i| i.state == cxlkv_core::layout::NODE_FREE) => {
            w.violation(format!("host {h} bury declared its node DEAD after recovery had freed it"));
        }
        Ok(true) => {
            // Said quiet (declared DEAD too, unless its silence did that):
            // the recovery that frees it is due, a first or a second one.
            let mut m = w.model.lock().unwrap();
            m.need_recovery = true;
            m.recovered = false;
            m.recovery_asks += 1;
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

thread_local! {
    /// Which operation of every four is followed by a read of the change
    /// log (`CXLKV_SIM_FEED_AT`, 0 to 3; default 1): a knob that moves the
    /// readers' memory traffic, and so the interleavings, for replaying a
    /// run found with another setting.
    pub(crate) static FEED_AT: Cell<u32> =
        Cell::new(std::env::var("CXLKV_SIM_FEED_AT").ok().and_then(|v| v.parse().ok()).unwrap_or(1));
}

pub(crate) fn op_actor(w: &World, h: usize, ops: u32, seed: u64, restarted: bool) {
    let Some((store, id, who)) = start_process(w, h, seed, restarted) else { return };
    let me = 3 * h;
    let env = Env { w };
    let local = w.local(h);
    let node = Node::attached(&store, id, &env, &local);
    let mut x = seed ^ mix64(h as u64 + 1) ^ mix64(who.pid as u64);
    let mut pins: Vec<Pin> = Vec::new();
    // The block being written: its handle, the op that finishes it, and
    // whether its payload goes in by plain stores (flushed by `publish`).
    let mut writing: Option<Writing> = None;
    let mut tier = TierState { dir: None, ssd: HashMap::new() };
    let check_err = |what: &str, e: Error, ok: &[Error]| check(w, h, what, e, ok);
    if h == 0 && !restarted {
        make_counter(w, &node, me);
    }
    if TENANTS.with(|t| t.get()) {
        join_tenant(w, &node, h, me);
    }
    let first = w.model.lock().unwrap().op_at[h];
    for op in first..ops {
        let fenced = op_begins(w, h, op, writing);
        if h == 0 && op == ops / 2 && ops >= 8 && !fenced {
            if let Some((hd, _, raw)) = writing.take() {
                finish_write(w, &node, h, hd, raw, rnd(&mut x));
            }
            release_pins(w, &node, h, &mut pins, &check_err);
            match restart_process(w, &store, &node, h, &check_err) {
                Err(e) => return w.violation(format!("host {h} re-attach: {e}")),
                Ok(true) => {}
                Ok(false) => {
                    if node.id == 0 {
                        // As below: no end-of-run stream comes from it.
                        w.model.lock().unwrap().stream_done = true;
                    }
                    return;
                }
            }
        }
        // Woken from a stall, the node was declared dead and recovered
        // meanwhile: operations taking a lock fail with Revoked until its
        // heartbeat notices and the process stops (as the platform's does).
        if stall_now(w, h, op, ops, pins.is_empty() && writing.is_none()) {
            woken_pins_nothing(w, &node, h);
        }
        if stops_fenced(w, h) {
            quiesce_fenced(w, &node, h, who.nonce);
            if node.id == 0 {
                // Node 1 polls for node 0's stream at the end: none comes
                // (seed 115021 polled until the step limit).
                w.model.lock().unwrap().stream_done = true;
            }
            return;
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
        expire_pins(w, &node, h, op, &mut pins);
        if let Some((hd, due, raw)) = writing {
            if due <= op {
                writing = None;
                finish_write(w, &node, h, hd, raw, rnd(&mut x));
            }
        }
        let (r, i) = draw(w, h, &mut x);
        if std::env::var("CXLKV_SIM_OPS").is_ok() {
            eprintln!("step {}: host {h} op {op} kind {} key {i}", w.now(), (r >> 20) % 18);
        }
        match (r >> 20) % 18 {
            0..=4 if writing.is_none() => writing = reserve_op(w, &node, h, op, r, key(i)),
            5..=7 => acquire_op(w, &node, h, op, i, &mut x, &mut pins),
            8..=10 => get_op(w, &node, h, key(i)),
            11 => lookup_op(w, &node, h, r, i),
            12 => match node.evict(2048 + r % 8192, &mut Lru) {
                Ok(_) => {}
                Err(e) => check_err("evict", e, &[]),
            },
            13 if (r >> 50) % 4 == 0 && writing.is_none() => stale_handle_misuse(w, &node, h, key(i)),
            13 if (r >> 50) % 4 == 1 => put_with_op(w, &node, h, i),
            13 => reserve_batch_op(w, &node, h, i),
            14 if (r >> 50) % 4 == 0 => app_lock_churn(w, &node, h),
            14 => lock_counter(w, &node, h, r),
            15 if (r >> 52) % 4 != 0 => tier_op(w, &node, h, r, &mut tier),
            16 | 17 => channel_op(w, &node, h, r),
            _ if (r >> 56) % 2 == 0 => roots_op(w, &node, h, r),
            _ => raw_op(w, &node, h, r),
        }
        op_done(w, &node, h, op, writing);
    }
    let stalled_here = {
        let m = w.model.lock().unwrap();
        m.stall == Some(h) && m.stalled
    };
    if stalled_here {
        // Declared dead while it stalled, though its heartbeat may not
        // have noticed yet: it ends as a fenced process does.
        quiesce_fenced(w, &node, h, who.nonce);
    }
    {
        let mut m = w.model.lock().unwrap();
        m.op_at[h] = ops;
        m.quiet |= 1 << h;
    }
    if let Some((hd, _, raw)) = writing {
        finish_write(w, &node, h, hd, raw, rnd(&mut x));
    }
    free_own_raw(w, &node, h);
    maintenance_recovery(w, &node, h);
    barrier(w, me, 2);
    // A host that stopped and woke writes on until its heartbeat finds it
    // fenced: once it is quiet, every stripe has a holder once more, and
    // one whose header its late write made void has it repaired (see
    // `Node::with_stripe`).
    await_stalled_quiet(w, me);
    for s in 0..store.layout.caps.n_stripes {
        if let Err(e) = node.coldest(s, &mut []) {
            check_err("coldest", e, &[]);
        }
    }
    // Quiescent, with pins still held: every host checks the region through
    // its own cache (stale copies of others' lines included).
    barrier(w, me, 6);
    check_from(w, &store, h, "at the end barrier");
    barrier(w, me, 3);
    adopt_unrooted(w, &node, h);
    channel_end(w, &node, h, me);
    tier_release(w, h, &mut tier);
    release_pins(w, &node, h, &mut pins, &check_err);
    let _ = close_process(w, me, h, &node, &check_err);
}

/// The process of host `h` starts: host 0 formats the region first (not
/// when restarted); it attaches its node (a restarted one buries its
/// killed predecessor and takes its slot). `None` after a violation.
fn start_process(w: &World, h: usize, seed: u64, restarted: bool) -> Option<(Store<SimCoherence<'_>>, u32, Identity)> {
    if h == 0 && !restarted {
        if let Err(e) = format(w.mem.view(0), w.mem.host(0), sim_caps(w.hosts), seed) {
            w.violation(format!("format: {e}"));
            return None;
        }
        w.published_all(0, "format", None);
    }
    let store = attach_retry(w, h)?;
    let who = identity(w, h);
    chan_attaching(w, h as u32);
    let attached = if restarted {
        bury_predecessor(w, &store, h, kill_scans(seed)).ok_or(Error::Revoked)
    } else {
        attach_node(&store, Some(h as u32), who)
    };
    let id = match attached {
        Ok(id) => id,
        Err(e) => {
            w.violation(format!("attach node {h}: {e}"));
            return None;
        }
    };
    chan_attached(w, id);
    if restarted {
        w.model.lock().unwrap().inserts[h] = 0;
    }
    w.model.lock().unwrap().attached[h] = true;
    w.published_all(3 * h, "attach_node", None);
    Some((store, id, who))
}

/// Operation `op` of host `h` begins (the model learns it, and whether a
/// block is being written by plain stores). True when the host learnt it
/// was declared dead (it restarts no more).
fn op_begins(w: &World, h: usize, op: u32, writing: Option<Writing>) -> bool {
    let mut m = w.model.lock().unwrap();
    m.op_at[h] = op;
    m.raw_writing[h] = writing.is_some_and(|(_, _, raw)| raw);
    m.stall == Some(h) && (m.fenced || m.revoked_ops > 0)
}

/// Host `h` learnt it was declared dead: recovery freed its raw blocks. True
/// when it is fenced: the process stops.
fn stops_fenced(w: &World, h: usize) -> bool {
    let mut m = w.model.lock().unwrap();
    if m.stall == Some(h) && (m.fenced || m.revoked_ops > 0) {
        m.raw.retain(|b| b.2 != h);
        return m.fenced;
    }
    false
}

/// The fenced process of host `h` ends as the platform's close does: it
/// writes back what it may have dirtied and says it is quiet (see
/// `Node::quiesce`); the recovery due then frees the reservations and raw
/// blocks kept for it (the end barriers wait for that recovery).
fn quiesce_fenced<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, nonce: u64) {
    let r = node.quiesce(nonce);
    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
        eprintln!("step {}: fenced host {h} quiesces: {r:?}", w.now());
    }
    match r {
        Ok(_) => w.published_all(3 * h, "quiesce", None),
        // Not declared dead after all (a stall shorter than its lease).
        Err(Error::InvalidArgument) if !w.model.lock().unwrap().fenced => {}
        Err(e) => w.violation(format!("fenced host {h} quiesce: {e:?}")),
    }
    let mut m = w.model.lock().unwrap();
    m.quiet |= 1 << h;
    if r == Ok(true) {
        m.need_recovery = true;
        m.recovered = false;
        m.recovery_asks += 1;
    }
}

/// Verifies and releases the pins whose time has come at operation `op`.
fn expire_pins<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, op: u32, pins: &mut Vec<Pin>) {
    let mut k = 0;
    while k < pins.len() {
        if pins[k].until <= op {
            let p = pins.swap_remove(k);
            unpin_model(w, &p);
            verify_pinned(w, node, h, &p.h);
            if let Err(e) = node.release(&[p.h]) {
                check(w, h, "release", e, &[]);
            }
        } else {
            k += 1;
        }
    }
}

/// The next operation of host `h`: its random word and key index. An
/// acquire of the key an evictor elsewhere is deciding on comes first.
fn draw(w: &World, h: usize, x: &mut u64) -> (u64, u64) {
    let r = rnd(x);
    let hot = {
        let mut m = w.model.lock().unwrap();
        match m.hot {
            Some((k, by)) if by != h => m.hot.take().map(|_| k),
            _ => None,
        }
    };
    match hot {
        Some(k) => ((r & 0xf_ffff) | 5 << 20, k),
        None => (r, r % KEYS),
    }
}

/// After operation `op` of host `h`: counted; an unlock a stall past the
/// lease interrupted must have failed with Revoked; everything published
/// is in memory; the invariants hold; now and then the host follows the
/// change log.
fn op_done<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, op: u32, writing: Option<Writing>) {
    {
        let mut m = w.model.lock().unwrap();
        m.ops += 1;
        m.release_armed = false;
        drop(m);
        w.progressed();
        let mut m = w.model.lock().unwrap();
        if m.stall == Some(h) && m.stalled_in_release && m.revoked_ops == 0 {
            m.revoked_ops = 1;
            drop(m);
            w.violation(format!(
                "host {h}: an unlock interrupted by a stall past the lease (its lock revoked) did not fail with Revoked"
            ));
        }
    }
    // A zombie's operations (it stopped past its lease and woke) need not
    // write back what they stored: the node is fenced, and what its cache
    // writes back whenever is what readers must tell from current state.
    let zombie = {
        let m = w.model.lock().unwrap();
        m.zombie && m.stall == Some(h) && m.stalled
    };
    if !zombie {
        w.published_all(3 * h, "an operation", writing.map(|(hd, _, _)| (hd.off, hd.len)));
    }
    always_invariants(w, h, op);
    quotas_held(w, node);
    if op % 4 == FEED_AT.with(|c| c.get()) {
        feed_tail(w, node.store, h);
    }
}

/// Frees every raw block the model says host `h` allocated.
fn free_own_raw<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize) {
    let mine: Vec<u64> = w.model.lock().unwrap().raw.iter().filter(|b| b.2 == h).map(|b| b.0).collect();
    for off in mine {
        raw_free(w, node, h, off);
    }
}

/// The lock counter, published as a named root, and the application lock
/// that guards it (host 0, once). Recovering: a crashed host holds the
/// allocator; each is retried once it is repaired.
///
/// The counter is application data under an application lock on memory
/// that a revoked holder's cache may write back to late, so it follows the
/// pattern the README gives for such data: one line per node, `[value,
/// ticket]`, written only by that node; the counter is the value of the
/// line with the largest ticket. A late line lands only in its own node's
/// line, under a ticket smaller than every grant after the revocation.
/// In a run with a tenant, every host adds tenant `sim` (or finds it added)
/// and registers its namespace there: the same id on every host, used for
/// every key from then on. A host declared dead meanwhile keeps the plain
/// namespace (its operations fail with `Revoked` until it stops).
fn join_tenant<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, me: usize) {
    use cxlkv_core::tenants::Limits;
    let limits = Limits {
        quota: crate::harness::params::TENANT_QUOTA,
        share: crate::harness::params::TENANT_SHARE,
        ttl_ms: crate::harness::model::TTL.with(|t| t.get()),
        // The runs without a lifetime zero every block they reserve.
        scrub: crate::harness::model::TTL.with(|t| t.get()) == 0,
        ..Limits::default()
    };
    let t = loop {
        let r = match node.tenant_add(b"sim", limits) {
            Err(Error::Exists) => node.tenant_find(b"sim").and_then(|t| t.ok_or(Error::NoTenant)),
            r => r,
        };
        match r {
            Ok(t) => break t,
            Err(Error::Recovering) => w.yield_now(me, "tenant-retry"),
            Err(e) => return check(w, h, "tenant_add", e, &[]),
        }
    };
    let digest = cxlkv_core::hash::Namespace { model: b"sim", ..Default::default() }.digest();
    loop {
        match node.namespace_in(t, digest) {
            Ok(id) => return NS_ID.with(|c| c.set(id)),
            Err(Error::Recovering) => w.yield_now(me, "namespace-retry"),
            Err(e) => return check(w, h, "namespace_in", e, &[]),
        }
    }
}

/// No tenant holds more than its hard quota: read from memory itself (no
/// host's cache), where every usage line a holder or a recovery published
/// lands, and where a late write-back lands too (every one was within the
/// quota when written).
pub(crate) fn quotas_held<C: Coherence>(w: &World, node: &Node<'_, C>) {
    use cxlkv_core::layout::{TenantConfig, TenantUsage, TENANT_FREE};
    let l = &node.store.layout;
    let mem = w.mem.shared_region();
    for t in 1..l.caps.max_tenants {
        let (Ok(c), Ok(u)) = (mem.read::<TenantConfig>(l.tenant_config(t)), mem.read::<TenantUsage>(l.tenant_usage(t)))
        else {
            return w.violation(format!("tenant {t}: lines unreadable"));
        };
        if c.state != TENANT_FREE && c.quota != 0 && u.bytes > c.quota {
            return w.violation(format!("tenant {t} holds {} bytes over its hard quota {}", u.bytes, c.quota));
        }
    }
}

fn make_counter<C: Coherence>(w: &World, node: &Node<'_, C>, me: usize) {
    let len = 64 * node.store.layout.caps.max_nodes as u64;
    let mut a = node.alloc(len);
    while a == Err(Error::Recovering) {
        w.yield_now(me, "alloc-retry");
        a = node.alloc(len);
    }
    match a {
        Ok(off) => {
            let st = node.store;
            for n in 0..st.layout.caps.max_nodes as u64 {
                if let Err(e) = st.view.write(off + 64 * n, &[0u64; 8]) {
                    w.violation(format!("counter line {n}: {e}"));
                }
            }
            if let Err(e) = st.co.flush(&st.view, off, len, Site("harness.counter.init")) {
                w.violation(format!("counter flush: {e}"));
            }
            let r = cxlkv_core::roots::Root { offset: off, size: len, tag: 1 };
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

/// A restart: the process detaches cleanly, stays away for longer
/// than a lease (managers must not take its silence for death; if
/// it was the manager, another takes over), then attaches again.
/// (Not for a process that learnt it was declared dead: it stops.)
/// Its raw blocks are freed first (its pins and writes the caller ended).
/// False when the detach found it declared dead all the same (before its
/// heartbeat noticed): it then ended as a fenced process does.
fn restart_process<C: Coherence>(
    w: &World,
    store: &Store<C>,
    node: &Node<'_, C>,
    h: usize,
    check_err: &dyn Fn(&str, Error, &[Error]),
) -> Result<bool, Error> {
    let me = 3 * h;
    free_own_raw(w, node, h);
    if close_process(w, me, h, node, check_err) {
        // Declared dead before its heartbeat noticed: the process ends.
        return Ok(false);
    }
    let t = w.now();
    while w.now() < t + LEASE.lease + 5_000 {
        w.yield_now(me, "restart");
    }
    chan_attaching(w, h as u32);
    attach_node(store, Some(h as u32), identity(w, h))?;
    chan_attached(w, h as u32);
    {
        let mut m = w.model.lock().unwrap();
        m.inserts[h] = 0;
        m.attached[h] = true;
    }
    w.published_all(me, "attach_node again", None);
    Ok(true)
}

/// Host `h` woke from a stall: if it was declared dead meanwhile (as memory
/// shows), operations that take no lock must refuse too. A pin taken now
/// would be dropped by recovery under the reader; a release would write a
/// journal that may be another node's.
pub(crate) fn woken_pins_nothing<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize) {
    let info: Result<NodeInfo, _> = w.mem.shared_region().read(node.store.layout.node_info(h as u32));
    if info.is_ok_and(|i| i.state == cxlkv_core::layout::NODE_ALIVE) {
        return;
    }
    let keys: Vec<Key> = (0..KEYS).map(key).collect();
    let mut out = vec![Err(Error::InvalidArgument); keys.len()];
    let r = node.acquire(ns(), &keys, &mut out);
    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
        eprintln!("step {}: host {h} woke declared dead; acquire: {r:?}", w.now());
    }
    match r {
        Err(Error::Revoked) | Ok(0) => {}
        r => w.violation(format!("host {h} woke declared dead, and acquire gave {r:?}")),
    }
}

/// After its operations, the first host to finish runs a recovery with no
/// node dead, while the others may still work: it rebuilds everything under
/// every lock, and nothing any live node holds or stored may change.
pub(crate) fn maintenance_recovery<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize) {
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
        m.recovering_per[h] += 1;
    }
    let r = node.recover(0);
    {
        let mut m = w.model.lock().unwrap();
        m.recovering -= 1;
        m.recovering_per[h] = m.recovering_per[h].saturating_sub(1);
        // (Another thread of the process may recover still: a void
        // structure's repair beside the recovery thread's.)
        if m.recovering_per[h] == 0 {
            m.recovering_on &= !(1 << h);
        }
    }
    if r.is_ok_and(|r| r.void_stripes > 0) {
        w.model.lock().unwrap().void_repairs += 1;
    }
    lost_stamps(w, h, &r);
    match r {
        Ok(_) => w.published_all(3 * h, "maintenance recovery", None),
        Err(e) if revoked_ok(w, h, e) => {}
        Err(e) => w.violation(format!("host {h} maintenance recovery: {e:?}")),
    }
}

/// A recovery found a stored block of the tenant without its expiry stamp
/// in a line that was not void: every stamp is published before its entry,
/// so it was read stale.
fn lost_stamps(w: &World, h: usize, r: &Result<cxlkv_core::recover::RecoverReport, Error>) {
    if let Ok(rep) = r {
        if rep.lost_stamps > 0 {
            w.violation(format!("host {h} recovery: {} stored blocks without their expiry stamp", rep.lost_stamps));
        }
    }
}

/// Increments the lock-protected counter. Half the time the caller gives up
/// after a few waits: a request that times out withdraws, and a grant racing
/// the withdrawal must be given back, never stranded.
pub(crate) fn lock_counter<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, r: u64) {
    let (off, lock) = {
        let m = w.model.lock().unwrap();
        (m.counter_root, m.counter_lock)
    };
    let (true, Some(lock)) = (off != 0, lock) else { return };
    let st = node.store;
    let patient = (r >> 36).is_multiple_of(2);
    WAIT_LIMIT.with(|l| l.set(if patient { 200_000 } else { 2 + (r >> 37) as u32 % 40 }));
    // The limit goes back even when this process is killed inside the
    // lock (its actor unwinds and restarts on this thread): a restarted
    // process must not inherit an impatient caller's limit.
    struct Patient;
    impl Drop for Patient {
        fn drop(&mut self) {
            WAIT_LIMIT.with(|l| l.set(200_000));
        }
    }
    let _patient = Patient;
    // The application lock's API, with `with_lock`'s rule: a revoked lock
    // outranks what ran under it.
    let r = node.lock_app(lock).and_then(|held| {
        let stale = w.model.lock().unwrap().old_tickets.insert(h, held.seq);
        if let Some(seq) = stale.filter(|&s| s != held.seq) {
            // An old ticket of this lock, presented while holding a newer
            // grant: refused, and the grant stays held.
            match node.unlock_app(cxlkv_core::lock::Held { lock: held.lock, seq, floor: 0 }) {
                Err(Error::Revoked) => {}
                r => w.violation(format!("host {h}: releasing a stale ticket of lock {} gave {r:?}", held.lock)),
            }
        }
        let body = (|| {
            let n = st.layout.caps.max_nodes as u64;
            st.co.invalidate(&st.view, off, 64 * n, Site("harness.counter.read"))?;
            let v = counter_value(st, off)?;
            let mine = off + 64 * node.id as u64;
            st.view.write(mine, &[v + 1, held.seq, 0, 0, 0, 0, 0, 0])?;
            st.co.flush(&st.view, mine, 64, Site("harness.counter.write"))
        })();
        match node.unlock_app(held) {
            Err(Error::Revoked) => Err(Error::Revoked),
            u => body.and(u),
        }
    });
    drop(_patient);
    match r {
        Ok(()) => w.model.lock().unwrap().counter += 1,
        Err(Error::Timeout) if !patient => {}
        // The increment ran; the unlock found the lock revoked.
        Err(e) if revoked_ok(w, h, e) => w.model.lock().unwrap().counter_maybe += 1,
        Err(e) => w.violation(format!("host {h} counter lock: {e:?}")),
    }
}

/// The counter's value as `st` holds it: that of the node line with the
/// largest ticket (see [`make_counter`]).
pub(crate) fn counter_value<C: Coherence>(st: &cxlkv_core::store::Store<C>, off: u64) -> cxlkv_core::Result<u64> {
    // (ticket, value) of the line with the largest ticket.
    let mut best = (0u64, 0u64);
    for n in 0..st.layout.caps.max_nodes as u64 {
        let l: [u64; 8] = st.view.read(off + 64 * n)?;
        if l[1] > best.0 {
            best = (l[1], l[0]);
        }
    }
    Ok(best.1)
}

/// Allocates an application lock and frees it again: never one allocated
/// already (TableFull when every one is), freed exactly once.
pub(crate) fn app_lock_churn<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize) {
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

/// The process of host `h` closes: its recovery thread finishes first, then
/// the node detaches and everything it published must be in memory. True
/// when the node turned out fenced (it then ended as a fenced one does).
fn close_process<C: Coherence>(
    w: &World,
    me: usize,
    h: usize,
    node: &Node<'_, C>,
    check_err: &dyn Fn(&str, Error, &[Error]),
) -> bool {
    while w.model.lock().unwrap().recovering_on & (1 << h) != 0 {
        w.yield_now(me, "close");
    }
    w.model.lock().unwrap().attached[h] = false;
    if std::env::var_os("CXLKV_SIM_DEBUG").is_some() {
        eprintln!("step {}: host {h} detaches", w.now());
    }
    if let Err(e) = node.detach() {
        if std::env::var_os("CXLKV_SIM_DEBUG").is_some() {
            eprintln!("step {}: host {h} detach: {e:?}; locks in memory:{}", w.now(), locks_in_memory(w));
        }
        check_err("detach", e, &[]);
        if e == Error::Revoked && w.model.lock().unwrap().stall == Some(h) {
            // Fenced after its last operation: it ends as a fenced one does.
            // The process learnt it from its detach, as the platform's close
            // does, before its heartbeat could (a detached node beats no
            // more): fenced all the same, so the other hosts' barriers no
            // longer wait for it (seed 140017 of zombie-lazy-3x80, a
            // restart's detach, waited for it until the step limit).
            w.model.lock().unwrap().fenced = true;
            quiesce_fenced(w, node, h, identity(w, h).nonce);
            return true;
        }
    }
    w.published_all(me, "detach", None);
    false
}
