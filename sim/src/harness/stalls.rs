//! Stalls and barriers: a host held still at a chosen moment (past its
//! lease, as a stopped process or a starved thread is), parked, or made to
//! wait for the others at a phase of the run.

use cxlkv_core::store::attach;

use crate::harness::params::LEASE;
use crate::harness::sched::{Parked, Sched};
use crate::harness::world::World;

pub(crate) fn stall_now(w: &World, h: usize, op: u32, ops: u32, idle: bool) -> bool {
    {
        let mut m = w.model.lock().unwrap();
        if m.zombie || m.stall != Some(h) || m.stalled || op < ops / 3 || !idle || m.stall_misses >= 3 {
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
    if !m.stalled {
        m.stall_misses += 1;
    }
    m.stalled
}

/// Stalls the host of op actor `a` inside an unlock (called as it is about
/// to read its slot back): the critical section is done and fenced, and the
/// host holds no other lock, nothing pinned or being written; its manager
/// actor is between steps and not the active manager, and no recovery is
/// pending. The node is declared dead and its lock revoked meanwhile: the
/// unlock must report Revoked when the host wakes. True when it stalled.
pub(crate) fn stall_in_release(w: &World, a: usize) -> bool {
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

/// A zombie's stop ([`RunConfig::zombie`]): at a random coherence call of
/// any actor of the stalling host, once its op actor is a third of the way
/// through, the host stops for three leases (declared dead and recovered
/// meanwhile) and then runs on from there. True when it stopped.
pub(crate) fn stall_zombie(w: &World, a: usize, site: &str) -> bool {
    let h = a / 3;
    {
        let m = w.model.lock().unwrap();
        if !m.zombie || m.stall != Some(h) || m.stalled || m.op_at.get(h).is_none_or(|&o| o < m.ops_per_host / 3) {
            return false;
        }
        if !w.mem.random().is_multiple_of(400) {
            return false;
        }
    }
    // A process of the host attaching again whose slot is FREE in memory
    // still (ALIVE not landed) holds nothing and is watched by no manager:
    // nobody would declare it dead, and when it wakes it attaches as any
    // process does (seed 126118 of zombie-lazy-3x80 waited forever for its
    // fencing). (Actors run one at a time: nothing changes the model
    // between.)
    if !slot_taken(w, h) {
        return false;
    }
    {
        let mut m = w.model.lock().unwrap();
        m.stalled = true;
        // Recovery will reclaim the stalled node's raw blocks.
        m.raw.retain(|b| b.2 != h);
    }
    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
        eprintln!("step {}: host {h} stops (a zombie) in actor {a} at {site}", w.now());
    }
    park_host(w, h);
    true
}

/// True when host `h`'s node slot is not FREE in memory.
fn slot_taken(w: &World, h: usize) -> bool {
    let Ok(st) = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return false };
    let info: Result<cxlkv_core::layout::NodeInfo, _> = st.view.read(st.layout.node_info(h as u32));
    info.is_ok_and(|i| i.state != cxlkv_core::layout::NODE_FREE)
}

/// Deschedules all three actors of host `h` for three leases, and longer
/// while its node is still ALIVE in memory (see [`hold_parked`]); on some
/// seeds the heartbeat (manager actor) wakes a while after the others, as a
/// process's threads do after SIGCONT in any order.
pub(crate) fn park_host(w: &World, h: usize) {
    let late = if w.model.lock().unwrap().worker_first { 2000 } else { 0 };
    let mut s = w.sched.lock().unwrap();
    let p = Parked { host: h, until: s.steps + 3 * LEASE.lease, limit: s.steps + 20 * LEASE.lease, late };
    s.parked = Some(p);
    sleep_host(&mut s, p);
}

fn sleep_host(s: &mut Sched, p: Parked) {
    if s.sleep_until.len() != s.runnable.len() {
        s.sleep_until = vec![0; s.runnable.len()];
    }
    for a in 3 * p.host..3 * p.host + 3 {
        s.sleep_until[a] = p.until + if a == 3 * p.host + 1 { p.late } else { 0 };
    }
}

/// Called by the scheduler at every pass: when the parked host is due to
/// wake while its node is still ALIVE in memory, keeps it parked a quarter
/// lease longer (up to twenty leases in all) and answers true. Three leases
/// are not always enough for a declaration: each change of manager starts
/// the silence count again (seed 129103 of zombie-mixed-4x200: the stopped
/// host was the manager, a successor claimed the role and detached, the next
/// one had watched a lease when the host woke, undeclared, and the run
/// waited forever for the fencing a stop past the lease must end in). A
/// host that wakes undeclared is only slow, which the other stalls cover;
/// a stop here is one that ends in a declaration.
pub(crate) fn hold_parked(w: &World, s: &mut Sched) -> bool {
    let Some(p) = s.parked else { return false };
    if s.steps < p.until {
        return false;
    }
    if s.steps >= p.limit || !node_alive(w, p.host) {
        s.parked = None;
        return false;
    }
    let p = Parked { until: s.steps + LEASE.lease / 4, ..p };
    s.parked = Some(p);
    sleep_host(s, p);
    true
}

/// True when host `h`'s node slot is ALIVE in memory.
fn node_alive(w: &World, h: usize) -> bool {
    let Ok(st) = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return false };
    let info: Result<cxlkv_core::layout::NodeInfo, _> = st.view.read(st.layout.node_info(h as u32));
    info.is_ok_and(|i| i.state == cxlkv_core::layout::NODE_ALIVE)
}

/// The manager actor's side of [`stall_now`]: parks the host if asked and
/// it is safe. True when it parked.
pub(crate) fn stall_here(w: &World, h: usize, active: bool) -> bool {
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

/// Waits until every op actor of a live host reached `phase` of the end
/// barrier (and a crashed host was recovered, and no recovery runs).
pub(crate) fn barrier(w: &World, me: usize, phase: usize) {
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

/// Waits until the stalled host, if one stalled, issues no more operations
/// (see `Model::quiet`).
pub(crate) fn await_stalled_quiet(w: &World, me: usize) {
    loop {
        {
            let m = w.model.lock().unwrap();
            match m.stall {
                Some(z) if m.stalled && m.quiet & (1 << z) == 0 && z != me / 3 => {}
                _ => return,
            }
        }
        w.yield_now(me, "barrier");
    }
}
