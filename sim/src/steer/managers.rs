//! Scenarios of liveness and the lock manager's role: incarnations, detaches
//! during recovery, claims and lines that land late, a zombie manager.

use std::sync::{Arc, Mutex};

use cxlkv_core::check::FindingKind;
use cxlkv_core::coherence::Coherent;
use cxlkv_core::layout::{LockLine, NodeInfo};
use cxlkv_core::lock::{LeaseConfig, Manager};
use cxlkv_core::node::{attach_node, Identity, Node, NodeLocal};
use cxlkv_core::store::attach;
use cxlkv_core::{Error, Result};

use super::{attach_as, declare_dead, Rig, StepEnv};

/// Host 0 runs the manager; node 1 on host 1 beats, is seen, detaches and
/// attaches again (a restarted process), all between two liveness scans,
/// the second more than a lease after the last beat it saw. Attach writes
/// the heartbeat line before ALIVE with no fence between, so the scan may
/// read the new ALIVE while memory still holds the predecessor's last beat
/// (steered here by putting that line back in memory until the scan has
/// run). The successor is live: it must not be declared dead (seed 40027 of
/// `run --hosts 4 --ops 80 --lazy` found this: a killed process's
/// successor, declared dead 1,200 steps after it attached).
pub(super) fn new_incarnation_old_beat(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LEASE: u64 = 10;
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let cfg = LeaseConfig { lease: LEASE, settle: 0, quarantine: 0 };
    let probe = |_: u32, _: &NodeInfo| None;
    let mut mgr = Manager::new(0);
    let env = StepEnv::new(&s1, 1);
    let local = NodeLocal::default();
    let n1 = Node::attached(&s1, 1, &env, &local);
    // Claim the role, then a scan that sees node 1 beat.
    mgr.step(&s0, 1, cfg, &probe)?;
    n1.heartbeat(2)?;
    n1.heartbeat(2)?;
    let r = mgr.step(&s0, 2, cfg, &probe)?;
    let mut out = Vec::new();
    if !r.active {
        out.push("new-incarnation-old-beat: node 0 did not become the manager".to_string());
        return Ok(out);
    }
    let hb_off = s1.layout.heartbeat(1);
    let memory = rig.mem.shared_region();
    let last: cxlkv_core::layout::Heartbeat = memory.read(hb_off)?;
    n1.detach()?;
    attach_as(&s1, 1, 1)?;
    let fresh: cxlkv_core::layout::Heartbeat = memory.read(hb_off)?;
    memory.write(hb_off, &last)?;
    let r = mgr.step(&s0, 2 + LEASE + 1, cfg, &probe)?;
    memory.write(hb_off, &fresh)?;
    if r.newly_dead & 1 << 1 != 0 {
        out.push(format!(
            "new-incarnation-old-beat: the manager declared node 1 dead at its first scan of a new incarnation \
             (the predecessor's beat {} still in memory)",
            last.beat
        ));
    }
    Ok(out)
}

/// Node 1's process runs a recovery (which holds stripe lock 0 in node 1's
/// name) while another of its threads detaches the node. The detach must
/// refuse: a free slot holding a lock is one no manager ever revokes (the
/// crash loop once hung on exactly that: a FREE slot holding locks 0-3 for
/// recovery). Once the recovery unlocked, the detach goes through.
pub(super) fn detach_while_recovery_holds(disable: Option<&'static str>) -> Result<Vec<String>> {
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    let local = NodeLocal::default();
    let n1 = Node::new(&s1, 1, &env, &local)?;
    let held = n1.lock_recovery(0)?;
    let mut out = Vec::new();
    match n1.detach() {
        Err(Error::Busy) => {}
        r => {
            out.push(format!("detach-while-recovery-holds: detach with a lock held returned {r:?}"));
            if rig.memory_findings()?.contains(&FindingKind::HeldByDead) {
                out.push(
                    "detach-while-recovery-holds: memory shows a free node holding stripe lock 0: no manager will \
                     revoke it"
                        .to_string(),
                );
            }
            return Ok(out);
        }
    }
    n1.unlock(held)?;
    n1.detach()?;
    let left = rig.memory_findings()?;
    if !left.is_empty() {
        out.push(format!("detach-while-recovery-holds: findings after the detach: {left:?}"));
    }
    Ok(out)
}

/// The manager line as memory holds it.
fn manager_line(rig: &Rig) -> Result<cxlkv_core::layout::ManagerLine> {
    let st = attach(rig.mem.shared_region(), Coherent)?;
    rig.mem.shared_region().read(st.layout.manager.start)
}

/// Writes the manager line straight into memory (a write-back landing).
fn land_manager_line(rig: &Rig, ml: &cxlkv_core::layout::ManagerLine) -> Result<()> {
    let st = attach(rig.mem.shared_region(), Coherent)?;
    rig.mem.shared_region().write(st.layout.manager.start, ml)
}

/// Node 0 (host 0) manages; it stops for a lease, so node 1 (host 1) finds
/// the lease stale, claims the role, settles and grants. Then node 0's
/// renewal, written before it stopped, lands over node 1's line in memory
/// (the late write-back behind seeds 61048, 63013 and 63024 of the sweep):
/// the line names node 0 again. Node 0 must not step as manager: node 1's
/// claim, in node 1's own line, is newer than its own. And node 0's
/// withdrawn claim must reach memory.
pub(super) fn late_line_over_a_newer_claim(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LEASE: u64 = 20;
    const SETTLE: u64 = 3;
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let cfg = LeaseConfig { lease: LEASE, settle: SETTLE, quarantine: 0 };
    let probe = |_: u32, _: &NodeInfo| None;
    let (mut m0, mut m1) = (Manager::new(0), Manager::new(1));
    let mut out = Vec::new();
    m0.step(&s0, 1, cfg, &probe)?;
    m1.step(&s1, 1, cfg, &probe)?;
    if !m0.step(&s0, 1 + SETTLE, cfg, &probe)?.active {
        out.push("late-line-over-a-newer-claim: node 0 did not become the manager".to_string());
        return Ok(out);
    }
    let old = manager_line(&rig)?;
    // Node 0 stops; node 1 sees the lease stand still for a whole lease.
    m1.step(&s1, 2 + SETTLE, cfg, &probe)?;
    let t = 3 + SETTLE + LEASE;
    m1.step(&s1, t, cfg, &probe)?;
    if !m1.step(&s1, t + SETTLE, cfg, &probe)?.active {
        out.push("late-line-over-a-newer-claim: node 1 did not take the role over".to_string());
        return Ok(out);
    }
    land_manager_line(&rig, &old)?;
    if m0.step(&s0, t + SETTLE + 1, cfg, &probe)?.active {
        out.push(
            "late-line-over-a-newer-claim: node 0 stepped as manager beside node 1 (its old line landed over node 1's \
             newer claim)"
                .to_string(),
        );
    }
    let claim: u64 = rig.mem.shared_region().load_u64(s0.layout.requests(0) + 32)?;
    if claim != 0 {
        out.push(format!("late-line-over-a-newer-claim: node 0's withdrawn claim {claim:#x} is still in memory"));
    }
    Ok(out)
}

/// Two managers that hold no claim (each withdrew its own) and a manager
/// line that names node 0, then node 1 (a late write-back flipping it).
/// Each must claim and settle before granting; then only the larger claim
/// steps as manager.
pub(super) fn named_without_a_claim(disable: Option<&'static str>) -> Result<Vec<String>> {
    const SETTLE: u64 = 3;
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let cfg = LeaseConfig { lease: 1000, settle: SETTLE, quarantine: 0 };
    let probe = |_: u32, _: &NodeInfo| None;
    let (mut m0, mut m1) = (Manager::new(0), Manager::new(1));
    let mut out = Vec::new();
    // Node 0 claims the role, then the line is made to name each in turn.
    m0.step(&s0, 1, cfg, &probe)?;
    let mut ml = manager_line(&rig)?;
    m0.resign(&s0)?;
    let mut active = [false; 2];
    for t in 2..2 + 3 * SETTLE {
        for (n, m, s) in [(0u32, &mut m0, &s0), (1u32, &mut m1, &s1)] {
            ml.manager = n + 1;
            land_manager_line(&rig, &ml)?;
            if m.step(s, t, cfg, &probe)?.active {
                active[n as usize] = true;
            }
        }
    }
    if active == [true, true] {
        out.push("named-without-a-claim: nodes 0 and 1 both stepped as manager".to_string());
    }
    if active == [false, false] {
        out.push("named-without-a-claim: neither node became the manager".to_string());
    }
    Ok(out)
}

/// Node 0 (host 0) manages and grants lock 0 to node 2 (host 0); it stops
/// after it wrote the lock line, before the grant itself. Meanwhile node 1
/// (host 1) asks for the lock, finds the manager's lease stale, claims the
/// role, settles and is granted the lock by its own manager. Node 0 wakes
/// and writes its grant to node 2: node 2 must not take it while node 1
/// holds the lock (the grant carries node 0's claim, older than node 1's).
pub(super) fn zombie_manager_grants_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LOCK: u32 = 0;
    // Node 1's manager finds a lease stale after 20 steps of its own; node
    // 0's declares nobody dead within the scenario (no heartbeat moves).
    let cfg = LeaseConfig { lease: 20, settle: 3, quarantine: 0 };
    let cfg0 = LeaseConfig { lease: 1 << 40, settle: 3, quarantine: 0 };
    let rig = Rig::new(2, 3, disable)?;
    let s0 = rig.store(0)?;
    attach_as(&s0, 0, 0)?;
    attach_as(&rig.store(1)?, 1, 1)?;
    attach_as(&s0, 2, 0)?;
    // Node 1's lock, taken while node 0 is stopped: its ticket, or the error.
    let got: Arc<Mutex<Option<Result<u64>>>> = Arc::new(Mutex::new(None));
    let g2 = got.clone();
    let mem = rig.mem.clone();
    rig.at_calls(0, move |h, site| {
        if (h, site) != (0, "mgr.grant.line") {
            return false;
        }
        let r = (|| {
            let s1 = attach(mem.view(1), mem.host(1))?;
            let env1 = StepEnv::with_lease(&s1, 1, cfg);
            let l1 = NodeLocal::default();
            let n1 = Node::new(&s1, 1, &env1, &l1)?;
            // Held on: node 1 never releases it in this scenario.
            let held = n1.lock(LOCK)?;
            Ok(held.seq)
        })();
        *g2.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        true
    });
    let env0 = StepEnv::with_lease(&s0, 0, cfg0);
    let l2 = NodeLocal::default();
    let n2 = Node::new(&s0, 2, &env0, &l2)?;
    let r2 = n2.lock(LOCK);
    let mut out = Vec::new();
    let n1 = match got.lock().unwrap_or_else(|p| p.into_inner()).take() {
        None => {
            out.push("zombie-manager-grants-late: node 0 never granted the lock to node 2".to_string());
            return Ok(out);
        }
        Some(Err(e)) => {
            out.push(format!("zombie-manager-grants-late: node 1 was not granted the lock while node 0 stopped: {e}"));
            return Ok(out);
        }
        Some(Ok(seq)) => seq,
    };
    match r2 {
        Ok(held) => out.push(format!(
            "zombie-manager-grants-late: node 2 took the stopped manager's grant (seq {}) while node 1 holds the \
             lock (seq {n1}): two holders",
            held.seq
        )),
        Err(Error::Timeout) => {}
        Err(e) => out.push(format!("zombie-manager-grants-late: node 2's request ended with {e}, not a timeout")),
    }
    Ok(out)
}

/// Node 0 (host 0) is granted lock 0 and an application lock by its own
/// manager: host 0's cache holds the LOCKED slots. Its process dies holding
/// them; node 1's manager
/// (host 1) takes the role over, revokes the grant in memory and node 1's
/// recovery frees node 0. A successor process on host 0 attaches as node 0:
/// it holds nothing, and its detach must say so (not `Busy` from the old
/// grant its host's cache still shows).
pub(super) fn successor_reads_a_revoked_grant(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LOCK: u32 = 0;
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let env0 = StepEnv::new(&s0, 0);
    let env1 = StepEnv::new(&s1, 1);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let n0 = Node::new(&s0, 0, &env0, &l0)?;
    let app = n0.lock_alloc()?;
    let held = n0.lock(LOCK)?;
    let held_app = n0.lock_app(app)?;
    // The process dies holding the locks (node 0's handle is not used again).
    drop((held, held_app));
    // Declared dead by its silence, and known gone (as the successor's
    // host says once it finds the process gone): recovery frees it.
    declare_dead(&s1, 0)?;
    cxlkv_core::node::declare_quiet(&s1, 0)?;
    let n1 = Node::new(&s1, 1, &env1, &l1)?;
    let rep = n1.recover(0)?;
    let mut out = Vec::new();
    if rep.nodes_freed != 1 {
        out.push(format!("successor-reads-a-revoked-grant: recovery freed nodes {:b}, not node 0", rep.nodes_freed));
        return Ok(out);
    }
    let who = Identity { pid: 300, host_id: 1, pid_ns: 0, nonce: 77, now: 0 };
    attach_node(&s0, Some(0), who)?;
    let l0b = NodeLocal::default();
    let n0b = Node::new(&s0, 0, &env1, &l0b)?;
    match n0b.held_lock()? {
        None => {}
        Some(lock) => out.push(format!(
            "successor-reads-a-revoked-grant: the new node 0 counts lock {lock} as held (its predecessor's revoked \
             grant, still in its host's cache)"
        )),
    }
    // An application lock the predecessor held, revoked and repaired the
    // same way: the new node holds none.
    if let Some(i) = n0b.held_app_lock()? {
        out.push(format!(
            "successor-reads-a-revoked-grant: the new node 0 counts application lock {i} as held (its \
             predecessor's revoked grant, still in its host's cache)"
        ));
    }
    if let Err(e) = n0b.detach() {
        out.push(format!("successor-reads-a-revoked-grant: the new node 0 cannot detach: {e}"));
    }
    Ok(out)
}

/// Host 1's cache holds node 2's slot as FREE (it looked before anyone
/// attached there). Node 2 attaches on host 0; then a process on host 1
/// attaches asking for the first free slot: it must take slot 3, never
/// node 2's, which its cache still shows free.
pub(super) fn attach_scans_a_stale_slot(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "attach-scans-a-stale-slot";
    let rig = Rig::new(2, 4, disable)?;
    let (s0, s1) = (rig.store(0)?, rig.store(1)?);
    attach_as(&s0, 0, 0)?;
    attach_as(&s1, 1, 1)?;
    let _: NodeInfo = s1.view.read(s1.layout.node_info(2))?;
    attach_as(&s0, 2, 0)?;
    let who = Identity { pid: 400, host_id: 2, pid_ns: 0, nonce: 99, now: 0 };
    let mut out = Vec::new();
    match attach_node(&s1, None, who) {
        Ok(3) => {}
        r => out.push(format!("{NAME}: the first free slot is 3, but the attach gave {r:?}")),
    }
    Ok(out)
}

/// Node 0 (host 0) manages and recovers node 2 (declared dead): the
/// recovery raises every core lock's floor to its ticket, and node 0's
/// release shows it. Node 0 asks for lock 0 again, under node 1's manager
/// (host 1), which will take the role over from node 0's stalled one: the
/// request overwrites the release. Then a replaced manager's late line from
/// before the recovery lands over the lock line, so memory's floor is back
/// where it was. Node 1's manager starts with no copy of the line: the grant
/// it makes node 0 must still carry the raised floor (a revoked holder's
/// late write stamped below it must stay void; seeds 96042, 111050 and
/// 111073 of the zombie sweep lost it so).
pub(super) fn floor_outlives_a_late_line(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "floor-outlives-a-late-line";
    const LOCK: u32 = 0;
    let cfg = LeaseConfig { lease: 20, settle: 3, quarantine: 0 };
    let rig = Rig::new(2, 3, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    attach_as(&s0, 2, 0)?;
    let env0 = StepEnv::new(&s0, 0);
    let l0 = NodeLocal::default();
    let n0 = Node::new(&s0, 0, &env0, &l0)?;
    let held = n0.lock(LOCK)?;
    n0.unlock(held)?;
    let mem = attach(rig.mem.shared_region(), Coherent)?;
    let off = mem.layout.lock_line(LOCK);
    let before: LockLine = rig.mem.shared_region().read(off)?;
    declare_dead(&s0, 2)?;
    n0.recover(1 << 2)?;
    let raised: LockLine = rig.mem.shared_region().read(off)?;
    let mut out = Vec::new();
    if raised.floor <= before.floor {
        out.push(format!("{NAME}: the recovery raised no floor ({} before, {} after)", before.floor, raised.floor));
        return Ok(out);
    }
    // The late line lands before node 1's manager reads anything.
    rig.mem.shared_region().write(off, &LockLine { floor: before.floor, ..raised })?;
    let env1 = StepEnv::with_lease(&s1, 1, cfg);
    let n0b = Node::new(&s0, 0, &env1, &l0)?;
    match n0b.lock(LOCK) {
        Ok(h) if h.floor < raised.floor => out.push(format!(
            "{NAME}: the new manager granted ticket {} with floor {}, below the floor {} the recovery raised",
            h.seq, h.floor, raised.floor
        )),
        Ok(h) => n0b.unlock(h)?,
        Err(e) => out.push(format!("{NAME}: node 0 was not granted the lock: {e}")),
    }
    Ok(out)
}

/// Node 1 (host 1) takes and releases lock 0 under node 0's manager, then
/// again under its own, which took the role over (a newer claim). Then the
/// first grant's slot line, a replaced manager's write landing late, comes
/// back over node 1's slot, and node 1's host reads it. Node 1 holds
/// nothing: its detach must go through, not fail with `Busy` (seed 114076
/// of the zombie sweep).
pub(super) fn late_grant_does_not_hold_a_detach(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "late-grant-does-not-hold-a-detach";
    const LOCK: u32 = 0;
    let cfg = LeaseConfig { lease: 20, settle: 3, quarantine: 0 };
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let env0 = StepEnv::new(&s0, 0);
    let l1 = NodeLocal::default();
    let n1 = Node::new(&s1, 1, &env0, &l1)?;
    let slot = s1.layout.lock_slot(LOCK, 1);
    let held = n1.lock(LOCK)?;
    // Node 1's slot as node 0's grant left it (LOCKED, node 0's claim).
    let late: cxlkv_core::layout::LockSlot = rig.mem.shared_region().read(slot)?;
    n1.unlock(held)?;
    let mut out = Vec::new();
    if late.state != cxlkv_core::layout::SLOT_LOCKED {
        out.push(format!("{NAME}: node 0's grant is not in memory: {late:?}"));
        return Ok(out);
    }
    let env1 = StepEnv::with_lease(&s1, 1, cfg);
    let n1b = Node::new(&s1, 1, &env1, &l1)?;
    n1b.unlock(n1b.lock(LOCK)?)?;
    rig.mem.shared_region().write(slot, &late)?;
    let _: cxlkv_core::layout::LockSlot = s1.fresh(slot, cxlkv_core::coherence::Site("steer.slot"))?;
    match n1b.detach() {
        Ok(()) => {}
        Err(e) => out.push(format!("{NAME}: node 1 holds nothing, but its detach failed with {e}")),
    }
    Ok(out)
}

/// Node 1 (host 1) takes and releases lock 0 under node 2's manager
/// (host 2); node 0 then runs a recovery, which raises the lock's floor
/// past that grant. The grant's slot line comes back over node 1's slot
/// late (a write-back of the manager's host), and node 1's host reads it:
/// a grant of the current manager, below the floor (which host 1's cache
/// still shows as it was before). Node 1 holds nothing: its detach must go
/// through, not fail with `Busy`.
pub(super) fn late_grant_below_the_floor(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "late-grant-below-the-floor";
    const LOCK: u32 = 0;
    let rig = Rig::new(3, 3, disable)?;
    let (s0, s1, s2) = rig.three_hosts_one_node_each()?;
    let env = StepEnv::new(&s2, 2);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n1) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s1, 1, &env, &l1)?);
    let slot = s1.layout.lock_slot(LOCK, 1);
    let held = n1.lock(LOCK)?;
    let late: cxlkv_core::layout::LockSlot = rig.mem.shared_region().read(slot)?;
    n1.unlock(held)?;
    // Host 1 keeps the lock line as it is before the recovery (a check
    // there read it).
    let _: LockLine = s1.view.read(s1.layout.lock_line(LOCK))?;
    n0.recover(0)?;
    let mut out = Vec::new();
    let ll: LockLine = rig.mem.shared_region().read(s1.layout.lock_line(LOCK))?;
    if late.state != cxlkv_core::layout::SLOT_LOCKED || ll.floor <= late.seq {
        out.push(format!("{NAME}: the grant {late:?} is not below the floor {}", ll.floor));
        return Ok(out);
    }
    rig.mem.shared_region().write(slot, &late)?;
    let _: cxlkv_core::layout::LockSlot = s1.fresh(slot, cxlkv_core::coherence::Site("steer.slot"))?;
    match n1.detach() {
        Ok(()) => {}
        Err(e) => out.push(format!("{NAME}: node 1 holds nothing, but its detach failed with {e}")),
    }
    Ok(out)
}

/// Node 1 (host 1) takes lock 0 and gives it back (its host keeps its slot
/// IDLE), then takes lock 1 and holds it. A replaced manager's grant of
/// lock 0 to node 1 lands in memory (its slot LOCKED at the next ticket,
/// under an older claim, and the lock line naming node 1): the manager
/// (node 0, host 0) takes node 1 for the holder. Node 1's background pass
/// must give that grant back — and only that one: lock 1, which a thread of
/// node 1 holds, stays held — so that node 2 (host 2) is granted lock 0,
/// and not lock 1 until node 1 releases it (seed 116066: two recoveries
/// each waited for a lock the other had, one held by such a grant).
pub(super) fn stray_grant_is_given_back(disable: Option<&'static str>) -> Result<Vec<String>> {
    use cxlkv_core::layout::{LockSlot, SLOT_LOCKED};
    use cxlkv_core::lock::{GRANT_CLAIM, GRANT_FLOOR};
    const NAME: &str = "stray-grant-is-given-back";
    const LOCK: u32 = 0;
    const HELD: u32 = 1;
    let rig = Rig::new(3, 3, disable)?;
    let (s0, s1, s2) = rig.three_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    let (l1, l2) = (NodeLocal::default(), NodeLocal::default());
    let (n1, n2) = (Node::new(&s1, 1, &env, &l1)?, Node::new(&s2, 2, &env, &l2)?);
    let l = &s0.layout;
    let mut out = Vec::new();
    let first = n1.lock(LOCK)?;
    n1.unlock(first)?;
    let held = n1.lock(HELD)?;
    let mem = rig.mem.shared_region();
    let line: LockLine = mem.read(l.lock_line(LOCK))?;
    let mut stray = LockSlot { state: SLOT_LOCKED, seq: line.grant_seq + 1, ..LockSlot::default() };
    stray.reserved[GRANT_CLAIM] = 1;
    stray.reserved[GRANT_FLOOR] = line.floor;
    mem.write(l.lock_slot(LOCK, 1), &stray)?;
    mem.write(l.lock_line(LOCK), &LockLine { grant_seq: stray.seq, holder: 2, last: 1, ..line })?;
    match n1.give_back_strays() {
        Ok(1) => {}
        r => out.push(format!("{NAME}: node 1's pass gave back {r:?} grants, not the stray one alone")),
    }
    match n2.lock(LOCK) {
        Ok(h) => n2.unlock(h)?,
        Err(e) => out.push(format!("{NAME}: node 2 was not granted lock {LOCK} after the stray grant went back: {e}")),
    }
    match n2.lock(HELD) {
        Err(Error::Timeout) => {}
        Ok(h) => {
            out.push(format!("{NAME}: node 2 was granted lock {HELD}, which node 1 holds: two holders"));
            n2.unlock(h)?;
        }
        Err(e) => out.push(format!("{NAME}: node 2's request of lock {HELD} ended with {e}, not a timeout")),
    }
    n1.unlock(held)?;
    match n2.lock(HELD) {
        Ok(h) => n2.unlock(h)?,
        Err(e) => out.push(format!("{NAME}: node 2 was not granted lock {HELD} after node 1 released it: {e}")),
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Host 0 reads application lock 0's line (its cache keeps it, no repair
/// pending). Node 1 (host 1) takes the lock, is declared dead, and the
/// manager (node 2, host 2) revokes the grant: the line in memory awaits
/// repair. Node 0's recovery must read that line fresh and repair the
/// lock, so that node 0 is granted it afterwards (a recovery that took its
/// own cached line for the truth left the lock awaiting a repair nobody
/// makes).
pub(super) fn app_lock_repair_read_fresh(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "app-lock-repair-read-fresh";
    let rig = Rig::new(3, 3, disable)?;
    let (s0, s1, s2) = rig.three_hosts_one_node_each()?;
    let env = StepEnv::new(&s2, 2);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n1) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s1, 1, &env, &l1)?);
    let l = &s0.layout;
    let app = l.locks().app(0);
    let mut out = Vec::new();
    let _: LockLine = s0.fresh(l.lock_line(app), cxlkv_core::coherence::Site("steer.line"))?;
    let _held = n1.lock(app)?;
    declare_dead(&s2, 1)?;
    env.step()?;
    let ll: LockLine = rig.mem.shared_region().read(l.lock_line(app))?;
    if ll.repair == 0 {
        out.push(format!("{NAME}: the manager did not revoke node 1's grant ({ll:?}): the scenario misses"));
        return Ok(out);
    }
    match n0.recover(0) {
        Ok(rep) if rep.locks_repaired >= 1 => {}
        r => out.push(format!("{NAME}: node 0's recovery repaired no application lock: {r:?}")),
    }
    match n0.lock(app) {
        Ok(h) => n0.unlock(h)?,
        Err(e) => out.push(format!("{NAME}: node 0 was not granted the lock after the recovery: {e}")),
    }
    Ok(out)
}

/// Node 0 (host 0) manages; node 1 (host 1) asks for lock 0. The manager's
/// step is cut off at its grant: the grant is stored in host 0's cache, not
/// written back (the process stepping node 0's manager for it, a peer of
/// its host, was killed there). Node 0 goes on from a fresh manager state
/// ([`Manager::after_cut`]): what the cut step stored must be in memory
/// before the fresh state acts, and node 1 must then hold the lock, alone.
pub(super) fn manager_step_cut(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "manager-step-cut";
    const LOCK: u32 = 0;
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let cfg = LeaseConfig { lease: u64::MAX / 4, settle: 2, quarantine: 0 };
    let env = CutEnv { rig: &rig, env: StepEnv::with_lease(&s0, 0, cfg), cut: spin::Mutex::new(None) };
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n1) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s1, 1, &env, &l1)?);
    let mut out = Vec::new();
    // The role claimed and settled before the request.
    for _ in 0..4 {
        env.env.step()?;
    }
    let held = n1.lock(LOCK)?;
    let cut = *env.cut.lock();
    match cut {
        None => {
            out.push(format!("{NAME}: the manager's step was not cut at its grant: the scenario misses"));
            return Ok(out);
        }
        Some(slot) if slot != cxlkv_core::layout::SLOT_LOCKED => out.push(format!(
            "{NAME}: once the fresh manager state was made, memory held node 1's slot in state {slot}, not \
             LOCKED: the cut step's grant was left in host 0's cache, to land whenever it liked"
        )),
        Some(_) => {}
    }
    let ll: LockLine = rig.mem.shared_region().read(s0.layout.lock_line(LOCK))?;
    if ll.holder != 2 {
        out.push(format!("{NAME}: node 1 holds lock {LOCK}, but memory's line names holder {} ({ll:?})", ll.holder));
    }
    // Alone: node 0 is not granted the lock while node 1 holds it.
    match n0.lock(LOCK) {
        Err(Error::Timeout) => {}
        Ok(h) => {
            out.push(format!("{NAME}: node 0 was granted lock {LOCK}, which node 1 holds: two holders"));
            n0.unlock(h)?;
        }
        Err(e) => out.push(format!("{NAME}: node 0's request ended with {e}, not a timeout")),
    }
    n1.unlock(held)?;
    match n0.lock(LOCK) {
        Ok(h) => n0.unlock(h)?,
        Err(e) => out.push(format!("{NAME}: node 0 was not granted lock {LOCK} after node 1 released it: {e}")),
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 0's manager, stepped inline by every wait (a [`StepEnv`]), whose
/// first step to grant is cut off at the grant (see [`manager_step_cut`]);
/// `cut` is then the state memory held for node 1's slot of lock 0 once
/// the fresh state was made.
struct CutEnv<'a> {
    rig: &'a Rig,
    env: StepEnv<'a>,
    cut: spin::Mutex<Option<u32>>,
}

impl cxlkv_core::store::NodeEnv for CutEnv<'_> {
    fn local_lock(&self, lock: u32) -> Result<()> {
        self.env.local_lock(lock)
    }
    fn try_local_lock(&self, lock: u32) -> bool {
        self.env.try_local_lock(lock)
    }
    fn local_unlock(&self, lock: u32) {
        self.env.local_unlock(lock)
    }
    fn wait(&self, iteration: u32) -> Result<()> {
        if iteration > 10_000 {
            return Err(Error::Timeout);
        }
        if self.cut.lock().is_some() {
            return self.env.step();
        }
        let mut r = Ok(());
        if self.rig.dies_at(0, "mgr.grant", || r = self.env.step()) {
            let store = self.env.store;
            *self.env.mgr.lock() = Manager::after_cut(store, 0)?;
            let slot: cxlkv_core::layout::LockSlot = self.rig.mem.shared_region().read(store.layout.lock_slot(0, 1))?;
            *self.cut.lock() = Some(slot.state);
            return Ok(());
        }
        r
    }
    fn withdrawal_expired(&self, iteration: u32) -> bool {
        self.env.withdrawal_expired(iteration)
    }
}
