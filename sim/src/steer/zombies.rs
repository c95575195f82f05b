//! Zombie scenarios: a node stopped past its lease, declared dead and
//! recovered, that wakes and runs on (or whose cache writes back late) —
//! what it writes must be void to every reader, never current state.

use cxlkv_core::changes::{Change, Tail};
use cxlkv_core::hash::Key;
use cxlkv_core::index::ReserveItem;
use cxlkv_core::layout::{LockLine, LockSlot, StripeHeader, SLOT_LOCKED};
use cxlkv_core::node::{Node, NodeLocal};
use cxlkv_core::roots::Root;
use cxlkv_core::store::Store;
use cxlkv_core::{Error, Result};

use super::{attach_as, declare_dead, Rig, StepEnv};
use crate::memory::SimCoherence;

pub(super) const NS: u32 = 1;

/// The `n` first keys of namespace [`NS`] that fall in stripe `s`.
fn keys_in(st: &Store<SimCoherence<'_>>, s: u32, skip: u64, n: usize) -> Vec<Key> {
    (skip..)
        .map(|i| Key { lo: i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1, hi: i })
        .filter(|k| st.stripe_of(NS, *k) == s)
        .take(n)
        .collect()
}

/// Steps `env`'s manager (whose grants a node parked by
/// [`Rig::parks_at`] waits for) until that node stops: true, or false when
/// its thread ended first (`finished`).
pub(super) fn parked(
    stopped: &std::sync::mpsc::Receiver<()>,
    finished: impl Fn() -> bool,
    env: &StepEnv<'_>,
) -> Result<bool> {
    while stopped.try_recv().is_err() {
        if finished() {
            return Ok(false);
        }
        env.step()?;
    }
    Ok(true)
}

/// Stores `len` bytes of `byte` at raw block `off` through `st` and makes
/// them land (flush, fence), as a user of a raw allocation would.
fn fill_raw(st: &Store<SimCoherence<'_>>, off: u64, len: usize, byte: u8) -> Result<()> {
    use cxlkv_core::coherence::{Coherence, Site};
    st.view.copy_in(off, &vec![byte; len])?;
    st.co.flush(&st.view, off, len as u64, Site("steer.raw"))?;
    st.co.store_fence(Site("steer.raw"));
    Ok(())
}

/// The stopped node 1, woken, says it is quiet; the recovery after frees
/// it, and the region must check clean.
fn quiet_and_clean(
    rig: &Rig,
    env: &StepEnv<'_>,
    n0: &Node<'_, SimCoherence<'_>>,
    n1: &Node<'_, SimCoherence<'_>>,
    name: &str,
    out: &mut Vec<String>,
) -> Result<()> {
    let _ = n1.quiesce(2);
    env.step()?;
    n0.recover(0)?;
    rig.expect_clean(name, out)
}

/// Reserves, writes and publishes a small block of `key`.
pub(super) fn put<C: cxlkv_core::coherence::Coherence>(n: &Node<'_, C>, key: Key) -> Result<()> {
    let h = n.reserve(NS, key, 256, 1)?;
    n.write(&h, 0, &[key.hi as u8; 256])?;
    n.publish_flushed(core::slice::from_ref(&h), &mut [Ok(())])
}

/// Reserves, writes (`byte` throughout) and publishes a 256-byte block of
/// `key`; returns its handle.
fn put_byte(n: &Node<'_, SimCoherence<'_>>, key: Key, byte: u8) -> Result<cxlkv_core::index::Handle> {
    let h = n.reserve(NS, key, 256, 1)?;
    n.write(&h, 0, &[byte; 256])?;
    n.publish_flushed(core::slice::from_ref(&h), &mut [Ok(())])?;
    Ok(h)
}

/// [`put_byte`] by a holder that may meet a void entry: a call that met
/// one (`Recovering`, the stripe repaired since) is made again.
fn put_after_repair(n: &Node<'_, SimCoherence<'_>>, key: Key, byte: u8) -> Result<()> {
    let mut r = Err(Error::Recovering);
    for _ in 0..3 {
        r = put_byte(n, key, byte).map(|_| ());
        if r != Err(Error::Recovering) {
            break;
        }
    }
    r
}

/// Node 1 (host 1) evicts the stripe's coldest block and stops inside the
/// stripe lock, its removal record written and not yet flushed. It is
/// declared dead and recovered; node 0 (host 0) publishes as many blocks as
/// the change log holds, so a newer record takes the stopped one's place;
/// then node 1's record is written back over it, and a reader on host 3
/// (whose cache still holds the lock line from before the repair) reads the
/// log across it. Node 1 wakes, writes its header over the stripe's and
/// fails with Revoked. Node 2 (host 2, which read the log before the new
/// records) publishes next in that stripe. The reader must meet a gap, not
/// corruption; node 2 must find the header void and have the stripe
/// repaired (its change count going on, never back) before using it; every
/// block but the evicted one stays stored and the region checks clean.
pub(super) fn zombie_stripe_holder_lands_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    let rig = Rig::new(4, 3, disable)?;
    let (s0, s1, s2, s3) = (rig.store(0)?, rig.store(1)?, rig.store(2)?, rig.store(3)?);
    attach_as(&s0, 0, 0)?;
    attach_as(&s1, 1, 1)?;
    attach_as(&s2, 2, 2)?;
    let env = StepEnv::new(&s0, 0);
    let (l0, l2) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n2) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s2, 2, &env, &l2)?);
    let ring = s0.layout.caps.change_records as usize;
    let s = 0u32;
    let keys = keys_in(&s0, s, 0, 2 * ring + 1);
    let (before, after) = keys.split_at(ring);
    let rk = after[ring];
    let mut out = Vec::new();
    for &k in before {
        put(&n0, k)?;
    }
    // Node 0 pins all but the coldest: evictions take that one, then the
    // blocks node 0 publishes below.
    let mut pins = vec![Err(Error::NotFound); ring - 1];
    n0.acquire(NS, &before[1..], &mut pins)?;
    // Host 2 reads the whole log (its cache keeps every record); host 3
    // checks the region (its cache keeps every lock line).
    let count = s2.changes_head(s)?.0;
    let mut buf = vec![Change::default(); ring];
    s2.read_changes(s, count.saturating_sub(ring as u64), &mut buf)?;
    let mut scratch = vec![0u64; cxlkv_core::check::scratch_words(&s3)];
    cxlkv_core::check::check(&s3, &mut scratch, &mut |_| {})?;

    // Node 1's removal record will be the stripe's next change.
    let rec = (s0.layout.change(s, s0.changes_head(s)?.0 + 1) / 64) as usize;
    // Node 1 stops at its record's flush, until told to go on.
    let (stopped_rx, go_tx) = rig.parks_at(1, "changes.record.write");
    // The stripe's change count before the woken node's header lands.
    let mut head = 0u64;
    let zombie = std::thread::scope(|sc| -> Result<Result<()>> {
        let t = sc.spawn(|| {
            // Its waits step node 0's manager too (as the main thread does).
            let l1 = NodeLocal::default();
            let n1 = Node::new(&s1, 1, &env, &l1)?;
            n1.evict(1, &mut cxlkv_core::index::Lru).map(|_| ())
        });
        // Grants come from node 0's manager until node 1 stops.
        if !parked(&stopped_rx, || t.is_finished(), &env)? {
            let r = t.join().unwrap_or(Err(Error::Corrupt));
            out.push(format!("zombie-stripe-holder-lands-late: node 1's eviction ended ({r:?}) without stopping"));
            return Ok(r);
        }
        declare_dead(&s0, 1)?;
        env.step()?;
        n0.recover(0)?;
        // Two logs' worth of changes: each block published, then evicted.
        for &k in &after[..ring] {
            put(&n0, k)?;
            n0.evict(1, &mut cxlkv_core::index::Lru)?;
        }
        // Node 1's record is written back, over a newer one.
        rig.mem.evict_line(1, rec);
        head = s3.changes_head(s)?.0;
        let mut one = vec![Change::default(); ring];
        match s3.read_changes(s, head - ring as u64, &mut one) {
            Ok(Tail::Gap { .. }) => {}
            r => out.push(format!(
                "zombie-stripe-holder-lands-late: a reader meeting a revoked holder's record got {r:?}, not a gap"
            )),
        }
        let _ = go_tx.send(());
        Ok(t.join().unwrap_or(Err(Error::Corrupt)))
    })?;
    if zombie != Err(Error::Revoked) {
        out.push(format!("zombie-stripe-holder-lands-late: the woken node's publish gave {zombie:?}, not Revoked"));
    }
    let hdr: StripeHeader = s0.fresh(s0.layout.stripe(s), cxlkv_core::coherence::Site("steer.hdr"))?;
    let floor: LockLine =
        s0.fresh(s0.layout.lock_line(s0.layout.locks().stripe(s)), cxlkv_core::coherence::Site("steer.ll"))?;
    if hdr.ticket >= floor.floor {
        out.push("zombie-stripe-holder-lands-late: the woken node's header is not void".to_string());
    }
    // The next holder, on host 2.
    if let Err(e) = put(&n2, rk) {
        out.push(format!("zombie-stripe-holder-lands-late: the next holder's publish failed: {e}"));
    }
    let now = s2.changes_head(s)?.0;
    if now <= head {
        out.push(format!("zombie-stripe-holder-lands-late: the change count went from {head} to {now}, not on"));
    }
    // The pinned blocks and the next holder's are stored (the others were
    // evicted, one of them by the woken node's late write).
    let all: Vec<Key> = before[1..].iter().copied().chain([rk]).collect();
    match n2.lookup(NS, &all) {
        Ok(n) if n == all.len() => {}
        r => out.push(format!("zombie-stripe-holder-lands-late: {r:?} of {} blocks found after the repair", all.len())),
    }
    rig.expect_clean("zombie-stripe-holder-lands-late", &mut out)?;
    Ok(out)
}

/// Node 0's manager (host 0) has granted lock 2 a few times when node 1
/// (host 1), holding it, is declared dead: the lock awaits repair. A lock
/// line of a replaced manager, from before the revocation, is written back
/// late (count back, no repair pending): node 0's plain request must still
/// wait for the repair. Node 2 (host 2) recovers; the late line lands again;
/// a manager that takes the role over afresh must count on from the largest
/// ticket any slot shows, not from the line. Last, a grant of the replaced
/// manager lands in node 1's slot (node 1 is free now): node 0 must still be
/// granted the lock, and the stale grant dropped.
pub(super) fn replaced_manager_line_lands_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LOCK: u32 = 2;
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let l = &s0.layout;
    let line = (l.lock_line(LOCK) / 64) as usize;
    // What a replaced manager would write back: the line as it read it.
    let land_late = |v: &LockLine| -> Result<()> {
        rig.cache(1).write(l.lock_line(LOCK), v)?;
        rig.mem.evict_line(1, line);
        Ok(())
    };
    let mut out = Vec::new();
    for _ in 0..3 {
        let g = n0.lock(LOCK)?;
        n0.unlock(g)?;
    }
    let late: LockLine = s0.fresh(l.lock_line(LOCK), cxlkv_core::coherence::Site("steer.ll"))?;
    let dead = n1.lock(LOCK)?;
    declare_dead(&s0, 1)?;
    env.step()?;
    land_late(&late)?;
    match n0.lock(LOCK) {
        Err(Error::Timeout) => {}
        Ok(g) => {
            out.push(format!(
                "replaced-manager-line-lands-late: a plain request was granted (ticket {}) before the repair of a \
                 revoked holder's lock",
                g.seq
            ));
            n0.unlock(g)?;
        }
        Err(e) => out.push(format!("replaced-manager-line-lands-late: the request before the repair gave {e}")),
    }
    n2.recover(0)?;
    let g = n0.lock(LOCK)?;
    if g.seq <= dead.seq || g.floor <= dead.seq {
        out.push(format!(
            "replaced-manager-line-lands-late: after the repair, ticket {} floor {} (the revoked one was {})",
            g.seq, g.floor, dead.seq
        ));
    }
    let last = g.seq;
    n0.unlock(g)?;
    // A manager afresh, on host 0, meets the late line again.
    land_late(&late)?;
    let env2 = StepEnv::new(&s0, 0);
    let n0b = Node::new(&s0, 0, &env2, &l0)?;
    let g = n0b.lock(LOCK)?;
    if g.seq <= last {
        out.push(format!(
            "replaced-manager-line-lands-late: a new manager handed out ticket {} again (or less: {} was out)",
            g.seq, last
        ));
    }
    // (A ticket at or above the floor: one below it is void to everyone,
    // see `void-grant-lands-in-a-live-slot`.)
    let stale = LockSlot { state: SLOT_LOCKED, seq: last, ..LockSlot::default() };
    n0b.unlock(g)?;
    // A replaced manager's grant to node 1 lands, its line naming node 1
    // the holder; node 1 is free.
    land_late(&LockLine { holder: 2, grant_seq: dead.seq, ..late })?;
    rig.cache(1).write(l.lock_slot(LOCK, 1), &stale)?;
    rig.mem.evict_line(1, (l.lock_slot(LOCK, 1) / 64) as usize);
    match n0b.lock(LOCK) {
        Ok(g) => n0b.unlock(g)?,
        Err(e) => out.push(format!(
            "replaced-manager-line-lands-late: a stale grant in a free node's slot kept the lock from node 0 ({e})"
        )),
    }
    let left: LockSlot = rig.mem.shared_region().read(l.lock_slot(LOCK, 1))?;
    if left.state == SLOT_LOCKED {
        out.push(format!("replaced-manager-line-lands-late: the stale grant stays in memory: {left:?}"));
    }
    rig.expect_clean("replaced-manager-line-lands-late", &mut out)?;
    Ok(out)
}

/// Node 1 (host 1) is declared dead and recovered (by node 0, host 0) while
/// it is stopped; it wakes and pins a block. Its own cache still shows its
/// slot ALIVE, but recovery fenced the slot (and frees it, its journal
/// then maybe another node's, once it is quiet): the pins must fail with
/// Revoked.
pub(super) fn woken_node_pins_after_its_recovery(disable: Option<&'static str>) -> Result<Vec<String>> {
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let k = Key { lo: 7, hi: 7 };
    put(&n0, k)?;
    declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    let mut got = [Err(Error::NotFound)];
    let mut out = Vec::new();
    match n1.acquire(NS, &[k], &mut got) {
        Err(Error::Revoked) if got[0] == Err(Error::Revoked) => {}
        r => out.push(format!(
            "woken-node-pins-after-its-recovery: a node recovery freed pinned a block: {r:?}, {got:?}, not Revoked"
        )),
    }
    Ok(out)
}

/// Node 1 (host 1) holds nothing; it is declared dead and recovered (by
/// node 0, host 0) before its heartbeat notices, and closes: its cache
/// still shows its slot ALIVE. The detach must answer `Revoked` and write
/// nothing: a FREE landing over FENCED frees a slot recovery keeps for the
/// node until it is quiet (zombie sweep seed 121116: a successor took it).
/// The close then ends as a fenced node's does: it says it is quiet, and
/// the next recovery frees the slot.
pub(super) fn fenced_node_detaches(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "fenced-node-detaches";
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let mut out = Vec::new();
    put(&n0, Key { lo: 7, hi: 7 })?;
    declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    let info = s0.layout.node_info(1);
    match n1.detach() {
        Err(Error::Revoked) => {}
        r => out.push(format!("{NAME}: a fenced node's detach gave {r:?}, not Revoked")),
    }
    // Whatever host 1 still holds dirty lands now.
    rig.mem.drain(1);
    let now: cxlkv_core::layout::NodeInfo = rig.mem.shared_region().read(info)?;
    if now.state != cxlkv_core::layout::NODE_FENCED {
        out.push(format!("{NAME}: the fenced slot reads {now:?} after the detach"));
    }
    if n1.quiesce(2) != Ok(true) {
        out.push(format!("{NAME}: the fenced node could not say it is quiet"));
    }
    env.step()?;
    n0.recover(0)?;
    let now: cxlkv_core::layout::NodeInfo = rig.mem.shared_region().read(info)?;
    if now.state != cxlkv_core::layout::NODE_FREE {
        out.push(format!("{NAME}: the quiet node's slot reads {now:?} after the next recovery"));
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 1 (host 1) reserves a block and stores its payload with plain
/// stores, left dirty in its cache, then stops: it is declared dead by its
/// silence and recovered (by node 0, host 0). Node 0 publishes blocks of
/// the same size; then host 1's cache writes node 1's payload back. Every
/// block node 0 published must keep its bytes: the stopped node's block
/// stays allocated (quarantined) while it is not known quiet. It wakes,
/// writes back what it holds and says it is quiet; the recovery the manager
/// then calls for must free its block and slot, and the region check clean.
pub(super) fn zombie_payload_lands_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LEN: usize = 4096;
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let w = n1.reserve(NS, Key { lo: 0x5107, hi: 1 }, LEN as u64, 16)?;
    // Plain stores through a zero-copy view: dirty in host 1's cache.
    s1.view.copy_in(w.off, &[0x77; LEN])?;
    declare_dead(&s0, 1)?;
    env.step()?;
    let rep = n0.recover(0)?;
    let mut out = Vec::new();
    let found = rig.memory_findings()?;
    if rep.nodes_fenced != 1 << 1 || !found.is_empty() {
        out.push(format!("zombie-payload-lands-late: after the recovery: {rep:?}, findings {found:?}"));
    }
    let mut keys = Vec::new();
    for i in 0..6u64 {
        let k = Key { lo: 0x5200 + i, hi: 2 + i };
        let h = n0.reserve(NS, k, LEN as u64, 16)?;
        n0.write(&h, 0, &[i as u8 + 1; LEN])?;
        n0.publish_flushed(core::slice::from_ref(&h), &mut [Ok(())])?;
        keys.push((k, i as u8 + 1));
    }
    for line in (w.off as usize / 64)..(w.off as usize + LEN).div_ceil(64) {
        rig.mem.evict_line(1, line);
    }
    for (k, b) in keys {
        let mut got = vec![0u8; LEN];
        match n0.get(NS, k, &mut got) {
            Ok(_) if got == [b; LEN] => {}
            r => out.push(format!(
                "zombie-payload-lands-late: a block published after the stopped node's recovery lost its bytes to \
                 that node's late write-back ({r:?}; recovery {rep:?})"
            )),
        }
    }
    // It wakes (fenced), writes back what it holds and says it is quiet.
    let said = n1.quiesce(2);
    env.step()?;
    let rep = n0.recover(0)?;
    if said != Ok(true) || rep.nodes_freed != 1 << 1 || rep.writes_aborted != 1 {
        out.push(format!(
            "zombie-payload-lands-late: the node said it was quiet ({said:?}), but recovery did not free it and its \
             block ({rep:?})"
        ));
    }
    rig.expect_clean("zombie-payload-lands-late", &mut out)?;
    Ok(out)
}

/// Host 2 looks at node 1's slot (its cache keeps the line, ALIVE). Node 1
/// (host 1) reserves a block and stops; it is declared dead and recovered
/// (by node 0, host 0): fenced, its block kept. An operator on host 2 says
/// host 1 is down for good: that must take, and the next recovery free
/// node 1 and its block.
pub(super) fn operator_says_a_dead_host_is_down(disable: Option<&'static str>) -> Result<Vec<String>> {
    let rig = Rig::new(3, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let s2 = rig.store(2)?;
    let env = StepEnv::new(&s0, 0);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n1) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s1, 1, &env, &l1)?);
    let _: cxlkv_core::layout::NodeInfo = s2.view.read(s2.layout.node_info(1))?;
    let _w = n1.reserve(NS, Key { lo: 0x5307, hi: 1 }, 4096, 16)?;
    declare_dead(&s0, 1)?;
    env.step()?;
    let first = n0.recover(0)?;
    let said = cxlkv_core::node::declare_quiet(&s2, 1);
    env.step()?;
    let rep = n0.recover(0)?;
    let mut out = Vec::new();
    if first.nodes_fenced != 1 << 1 || said != Ok(true) || rep.nodes_freed != 1 << 1 || rep.writes_aborted != 1 {
        out.push(format!(
            "operator-says-a-dead-host-is-down: fenced by {first:?}; the operator's word {said:?}; then {rep:?}"
        ));
    }
    rig.expect_clean("operator-says-a-dead-host-is-down", &mut out)?;
    Ok(out)
}

/// Node 1 (host 1) takes lock 2 and gives it back; its grant is kept as a
/// stopped manager's cache would keep it. Node 2 (host 2) takes the lock
/// and is declared dead holding it; host 1's cache keeps the lock line as
/// it was then; node 0 (host 0) recovers, and the lock's repair floor
/// passes node 1's old ticket. The old grant then lands in node 1's slot
/// (node 1 is alive and not waiting). Nobody holds by it: node 0 must be
/// granted the lock, node 1 must detach (not `Busy`), and the region check
/// clean.
pub(super) fn void_grant_lands_in_a_live_slot(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LOCK: u32 = 2;
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let l = &s0.layout;
    let slot1 = l.lock_slot(LOCK, 1);
    let g1 = n1.lock(LOCK)?;
    let old: LockSlot = rig.mem.shared_region().read(slot1)?;
    n1.unlock(g1)?;
    let mut out = Vec::new();
    if old.state != SLOT_LOCKED {
        out.push(format!("void-grant-lands-in-a-live-slot: node 1's grant was not in memory: {old:?}"));
        return Ok(out);
    }
    let _held = n2.lock(LOCK)?;
    let _: LockLine = s1.view.read(l.lock_line(LOCK))?;
    declare_dead(&s0, 2)?;
    env.step()?;
    n0.recover(0)?;
    rig.cache(1).write(slot1, &old)?;
    rig.mem.evict_line(1, (slot1 / 64) as usize);
    // A manager afresh scans every slot (a step reads only those whose
    // bell rings).
    let env = StepEnv::new(&s0, 0);
    let n0 = Node::new(&s0, 0, &env, &l0)?;
    match n0.lock(LOCK) {
        Ok(g) => n0.unlock(g)?,
        Err(e) => out.push(format!(
            "void-grant-lands-in-a-live-slot: a grant from before the repair, landed late in a live node's slot, \
             kept the lock from node 0 ({e})"
        )),
    }
    if let Err(e) = n1.detach() {
        out.push(format!("void-grant-lands-in-a-live-slot: node 1 holds nothing, but its detach says {e}"));
    }
    rig.expect_clean("void-grant-lands-in-a-live-slot", &mut out)?;
    Ok(out)
}

/// As `void-grant-lands-in-a-live-slot`, but node 1 holds the lock again
/// (a grant past the floor) when its old grant lands in its slot. Its grant
/// stands: node 1's release must succeed (not `Revoked`, which would leave
/// a live node's host-local hold behind), node 0 must be granted the lock
/// next, node 1 must detach, and the region check clean.
pub(super) fn old_grant_lands_over_a_held_one(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LOCK: u32 = 2;
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let slot1 = s0.layout.lock_slot(LOCK, 1);
    let g1 = n1.lock(LOCK)?;
    let old: LockSlot = rig.mem.shared_region().read(slot1)?;
    n1.unlock(g1)?;
    let mut out = Vec::new();
    let _held = n2.lock(LOCK)?;
    declare_dead(&s0, 2)?;
    env.step()?;
    n0.recover(0)?;
    let g1 = n1.lock(LOCK)?;
    if old.state != SLOT_LOCKED || g1.seq <= old.seq {
        out.push(format!("old-grant-lands-over-a-held-one: the old grant {old:?} is not older than {g1:?}"));
        return Ok(out);
    }
    // The old grant, as a replaced manager's cache on host 2 kept it.
    rig.cache(2).write(slot1, &old)?;
    rig.mem.evict_line(2, (slot1 / 64) as usize);
    // Node 1 still holds the lock: node 0 must not be granted it (its wait
    // ends at the rig's step limit).
    match n0.lock(LOCK) {
        Err(Error::Timeout) => {}
        Ok(g) => {
            out.push(
                "old-grant-lands-over-a-held-one: node 0 was granted the lock node 1 holds (two holders)".to_string(),
            );
            n0.unlock(g)?;
        }
        Err(e) => out.push(format!("old-grant-lands-over-a-held-one: node 0's wait ended with {e}")),
    }
    if let Err(e) = n1.unlock(g1) {
        out.push(format!(
            "old-grant-lands-over-a-held-one: a live node's release failed ({e}) because an older grant landed in \
             its slot"
        ));
    }
    match n0.lock(LOCK) {
        Ok(g) => n0.unlock(g)?,
        Err(e) => out.push(format!("old-grant-lands-over-a-held-one: node 0 was not granted the lock next ({e})")),
    }
    if let Err(e) = n1.detach() {
        out.push(format!("old-grant-lands-over-a-held-one: node 1 holds nothing, but its detach says {e}"));
    }
    rig.expect_clean("old-grant-lands-over-a-held-one", &mut out)?;
    Ok(out)
}

/// As `zombie-payload-lands-late`, but the stopped node, woken, flushes its
/// payload and then its word that it is quiet, and the word's write-back
/// completes first (flushes not yet fenced complete in any order). Before
/// the fence that completes the rest, node 0 recovers (freeing the node's
/// block, quiet as it says) and publishes blocks of the same size: none may
/// lose its bytes, so the payload must have landed before the word was
/// written at all.
pub(super) fn quiet_word_lands_before_the_payload(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LEN: usize = 4096;
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let w = n1.reserve(NS, Key { lo: 0x5407, hi: 1 }, LEN as u64, 16)?;
    s1.view.copy_in(w.off, &[0x77; LEN])?;
    declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    let hb = (s0.layout.heartbeat(1) / 64) as usize;
    let mut out = Vec::new();
    let mut published = Vec::new();
    // Node 1 stops at the fence after its word, until told to go on.
    let (stopped_rx, go_tx) = rig.parks_at(1, "node.quiet.fence");
    let said = std::thread::scope(|sc| -> Result<Result<bool>> {
        let t = sc.spawn(|| n1.quiesce(2));
        if stopped_rx.recv().is_err() {
            return Ok(t.join().unwrap_or(Err(Error::Corrupt)));
        }
        rig.mem.land_queued(1, hb);
        env.step()?;
        n0.recover(0)?;
        for i in 0..6u64 {
            let k = Key { lo: 0x5500 + i, hi: 2 + i };
            let b = i as u8 + 1;
            let h = n0.reserve(NS, k, LEN as u64, 16)?;
            n0.write(&h, 0, &[b; LEN])?;
            n0.publish_flushed(core::slice::from_ref(&h), &mut [Ok(())])?;
            published.push((k, b));
        }
        let _ = go_tx.send(());
        Ok(t.join().unwrap_or(Err(Error::Corrupt)))
    })?;
    rig.mem.drain(1);
    if said != Ok(true) || published.is_empty() {
        out.push(format!("quiet-word-lands-before-the-payload: the node said {said:?}; published {published:?}"));
    }
    for (k, b) in published {
        let mut buf = vec![0u8; LEN];
        match n0.get(NS, k, &mut buf) {
            Ok(_) if buf == [b; LEN] => {}
            r => out.push(format!(
                "quiet-word-lands-before-the-payload: a block published once the node was said quiet lost its bytes \
                 to the node's payload ({r:?})"
            )),
        }
    }
    Ok(out)
}

/// Node 1's process dies on host 1. A process of host 1 buries it and
/// stops after its write-backs, before it looks at the slot again; another
/// burial (through host 2) completes meanwhile, recovery frees the node
/// (quiet: buried), and a successor attaches the slot through host 2. The
/// first burial then goes on: it must see the successor (host 1's cache
/// still shows the dead node ALIVE) and leave it alone, not declare it
/// dead.
pub(super) fn late_burial_meets_a_successor(disable: Option<&'static str>) -> Result<Vec<String>> {
    let rig = Rig::new(3, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let s2 = rig.store(2)?;
    let env = StepEnv::new(&s0, 0);
    let l0 = NodeLocal::default();
    let n0 = Node::new(&s0, 0, &env, &l0)?;
    let mut out = Vec::new();
    let (stopped_rx, go_tx) = rig.parks_at(1, "bury.info.again");
    let first = std::thread::scope(|sc| -> Result<Result<bool>> {
        let t = sc.spawn(|| cxlkv_core::node::bury(&s1, 1));
        if stopped_rx.recv().is_err() {
            return Ok(t.join().unwrap_or(Err(Error::Corrupt)));
        }
        let second = cxlkv_core::node::bury(&s2, 1);
        env.step()?;
        let rep = n0.recover(0)?;
        let who = cxlkv_core::node::Identity { pid: 900, host_id: 3, pid_ns: 0, nonce: 99, now: 0 };
        let id = cxlkv_core::node::attach_node(&s2, Some(1), who);
        if second != Ok(true) || rep.nodes_freed != 1 << 1 || id != Ok(1) {
            out.push(format!(
                "late-burial-meets-a-successor: second burial {second:?}, recovery {rep:?}, successor {id:?}"
            ));
        }
        let _ = go_tx.send(());
        Ok(t.join().unwrap_or(Err(Error::Corrupt)))
    })?;
    if first != Ok(false) {
        out.push(format!("late-burial-meets-a-successor: the late burial said {first:?} of the successor's slot"));
    }
    let l2 = NodeLocal::default();
    let succ = Node::new(&s2, 1, &env, &l2)?;
    if let Err(e) = succ.heartbeat(99) {
        out.push(format!("late-burial-meets-a-successor: the successor was fenced by a late burial ({e})"));
    }
    Ok(out)
}

/// Node 1 (host 1) asks for a lock node 0 holds and stops while it waits.
/// It is declared dead, node 0 gives the lock back and recovers: node 1 is
/// fenced, its request still in its slot. When node 1 wakes, it must learn
/// it was fenced (`Revoked`), never find the lock granted: a fenced node
/// granted a lock would run its critical section beside the next holder.
pub(super) fn fenced_waiter_is_not_granted(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LOCK: u32 = 2;
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let held = n0.lock(LOCK)?;
    let mut out = Vec::new();
    let (stopped_rx, go_tx) = rig.parks_at(1, "lock.poll");
    let woken = std::thread::scope(|sc| -> Result<Result<cxlkv_core::lock::Held>> {
        let t = sc.spawn(|| n1.lock(LOCK));
        if stopped_rx.recv().is_err() {
            return Ok(t.join().unwrap_or(Err(Error::Corrupt)));
        }
        declare_dead(&s0, 1)?;
        env.step()?;
        n0.unlock(held)?;
        let rep = n0.recover(0)?;
        for _ in 0..4 {
            env.step()?;
        }
        if rep.nodes_fenced != 1 << 1 {
            out.push(format!("fenced-waiter-is-not-granted: node 1 not fenced: {rep:?}"));
        }
        let _ = go_tx.send(());
        Ok(t.join().unwrap_or(Err(Error::Corrupt)))
    })?;
    match woken {
        Err(Error::Revoked) => {}
        r => out.push(format!("fenced-waiter-is-not-granted: the woken, fenced waiter got {r:?}, not Revoked")),
    }
    Ok(out)
}

/// Node 1 holds node 0's heap lock (as a placement in node 0's chunk does)
/// and stops there; it is declared dead and recovered (fenced: not known
/// quiet). Node 0 publishes two more blocks in its chunk. Then a map line
/// node 1 dirtied before it stopped, from before those blocks, is written
/// back over the chunk's map. Node 2 then places a block where that map
/// shows room: it must find the chunk void and have it repaired rather
/// than take the granules of a live block; every block keeps its bytes and
/// the region checks clean.
pub(super) fn zombie_map_lands_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "zombie-map-lands-late";
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let l = &s0.layout;
    let keys: Vec<Key> = (0..4u64).map(|i| Key { lo: 0x3a90 + i, hi: 7 + i }).collect();
    let mut out = Vec::new();
    let first = n0.reserve(NS, keys[0], 256, 1)?;
    let c = cxlkv_core::alloc::chunk_of(l, first.off)?;
    n0.write(&first, 0, &[keys[0].hi as u8; 256])?;
    n0.publish_flushed(core::slice::from_ref(&first), &mut [Ok(())])?;
    let map = l.chunk_map(c);
    let old: [u8; 64] = rig.mem.shared_region().read(map)?;
    let _held = n1.lock(l.locks().heap(0))?;
    declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    for &k in &keys[1..3] {
        put(&n0, k)?;
    }
    // Node 1's copy of the map line, from before those two blocks, lands.
    rig.cache(1).write(map, &old)?;
    rig.mem.evict_line(1, (map / 64) as usize);
    if let Err(e) = put(&n2, keys[3]) {
        out.push(format!("{NAME}: node 2's publish after the late map failed: {e}"));
    }
    for &k in &keys {
        let mut buf = [0u8; 256];
        match n2.get(NS, k, &mut buf) {
            Ok(256) if buf == [k.hi as u8; 256] => {}
            r => out.push(format!("{NAME}: block {k:?} reads {r:?} with bytes {:?}", &buf[..4])),
        }
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 2 allocates a raw block (in a raw chunk of its own) and reserves a
/// KV block (in a KV chunk of its own); node 1 holds node 2's heap lock (as
/// a placement or a free in those chunks does) and stops there, both
/// chunks' map lines in its cache. It is declared dead and recovered
/// (fenced: not known quiet). Node 2 aborts its reservation, so the KV
/// chunk empties and goes back, and allocates raw blocks; node 1's map
/// lines land; node 1 wakes and says it is quiet, and a recovery runs. The
/// raw blocks allocated meanwhile must have gone to neither chunk (a late
/// map line over raw blocks placed since cannot be undone: the recovery
/// takes a live owner's raw maps as they are, and later allocations would
/// be placed over those blocks): every raw block keeps its bytes and its
/// room, and frees, and the region checks clean.
pub(super) fn zombie_map_lands_over_raw_blocks(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "zombie-map-lands-over-raw-blocks";
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let l = &s0.layout;
    let mut out = Vec::new();
    const RAW: usize = 4096;
    let first = n2.alloc(RAW as u64)?;
    fill_raw(&s2, first, RAW, 0x6f)?;
    let mut raw = vec![(first, 0x6f)];
    let h = n2.reserve(NS, Key { lo: 0x5e11, hi: 9 }, 256, 1)?;
    let maps = [cxlkv_core::alloc::chunk_of(l, h.off)?, cxlkv_core::alloc::chunk_of(l, first)?].map(|c| l.chunk_map(c));
    let old: Vec<[u8; 64]> = maps.iter().map(|&m| rig.mem.shared_region().read(m)).collect::<Result<_>>()?;
    let _held = n1.lock(l.locks().heap(2))?;
    declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    n2.abort(&h)?;
    for i in 0..3u8 {
        let off = n2.alloc(RAW as u64)?;
        fill_raw(&s2, off, RAW, 0x70 + i)?;
        raw.push((off, 0x70 + i));
    }
    // Node 1's copies of both map lines, from before the abort and the
    // allocations, land.
    for (&m, o) in maps.iter().zip(&old) {
        rig.cache(1).write(m, o)?;
        rig.mem.evict_line(1, (m / 64) as usize);
    }
    // Node 1 says it is quiet; the recovery after it takes a live owner's
    // raw maps as they are, and clears the taints; then more raw blocks,
    // placed where those maps show room.
    let _ = n1.quiesce(2);
    env.step()?;
    n0.recover(0)?;
    for i in 3..7u8 {
        match n2.alloc(RAW as u64) {
            Ok(off) => {
                fill_raw(&s2, off, RAW, 0x70 + i)?;
                raw.push((off, 0x70 + i));
            }
            Err(e) => out.push(format!("{NAME}: a raw allocation after the late map failed: {e}")),
        }
    }
    for (i, &(a, x)) in raw.iter().enumerate() {
        if raw[..i].iter().any(|&(b, _)| a < b + RAW as u64 && b < a + RAW as u64) {
            out.push(format!("{NAME}: raw block {a} overlaps another"));
        }
        let mut buf = vec![0u8; RAW];
        rig.mem.shared_region().copy_out(a, &mut buf)?;
        if buf.iter().any(|&b| b != x) {
            out.push(format!("{NAME}: raw block {a} lost its bytes"));
        }
    }
    for &(a, _) in &raw {
        if let Err(e) = n2.free(a) {
            out.push(format!("{NAME}: the free of raw block {a} failed: {e}"));
        }
    }
    quiet_and_clean(&rig, &env, &n0, &n1, NAME, &mut out)?;
    Ok(out)
}

/// Node 2 allocates raw blocks A, B and C in a raw chunk of its own and
/// names B and C by roots; node 1 holds node 2's heap lock (as another
/// node's free of one of them does) and stops there, the chunk's map line
/// in its cache. It is declared dead and recovered (fenced: the chunk
/// tainted). Node 2 frees A, and B through its root; a recovery runs (node
/// 1 is not quiet yet); node 1's map line, from before both frees, lands;
/// node 1 says it is quiet, and the recovery after runs. A and B must not
/// come back with the late line: after that recovery both are free in the
/// map, B's root is gone, a second free of A is refused, C keeps its bytes,
/// and once node 2 frees C the region checks clean.
pub(super) fn zombie_map_brings_back_freed_raw_blocks(disable: Option<&'static str>) -> Result<Vec<String>> {
    use cxlkv_core::alloc::{chunk_of, read_map};
    use cxlkv_core::coherence::Site;
    const NAME: &str = "zombie-map-brings-back-freed-raw-blocks";
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let l = &s0.layout;
    let mut out = Vec::new();
    const RAW: usize = 1024;
    let blocks = [n2.alloc(RAW as u64)?, n2.alloc(RAW as u64)?, n2.alloc(RAW as u64)?];
    for (i, &b) in blocks.iter().enumerate() {
        fill_raw(&s2, b, RAW, 0x40 + i as u8)?;
    }
    let c = chunk_of(l, blocks[0])?;
    if blocks.iter().any(|&b| chunk_of(l, b) != Ok(c)) {
        out.push(format!("{NAME}: three small raw blocks of one node are not in one chunk"));
        return Ok(out);
    }
    n2.root_put(b"freed-late", Root { offset: blocks[1], size: RAW as u64, tag: 7 })?;
    n2.root_put(b"kept", Root { offset: blocks[2], size: RAW as u64, tag: 7 })?;
    let map = l.chunk_map(c);
    let old: [u8; 64] = rig.mem.shared_region().read(map)?;
    let _held = n1.lock(l.locks().heap(2))?;
    declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    if let Err(e) = n2.free(blocks[0]) {
        out.push(format!("{NAME}: the free of raw block A in the tainted chunk failed: {e}"));
    }
    if let Err(e) = n2.root_free(b"freed-late") {
        out.push(format!("{NAME}: the root free of raw block B in the tainted chunk failed: {e}"));
    }
    match n2.free(blocks[0]) {
        Err(Error::InvalidArgument) => {}
        r => out.push(format!("{NAME}: a second free of raw block A answered {r:?}")),
    }
    // Node 1 is not quiet yet: the recovery must keep both blocks held.
    n0.recover(0)?;
    // Node 1's copy of the map line, from before both frees, lands.
    rig.cache(1).write(map, &old)?;
    rig.mem.evict_line(1, (map / 64) as usize);
    let _ = n1.quiesce(2);
    env.step()?;
    n0.recover(0)?;
    let m = read_map(&s2, c, Some(Site("steer.map")))?;
    let base = l.chunk_payload(c);
    for (b, what) in blocks[..2].iter().zip(["A", "B"]) {
        if m.extent(((b - base) / l.granule()) as u32).is_some() {
            out.push(format!("{NAME}: raw block {what}, freed while its chunk was tainted, is allocated still"));
        }
    }
    if !matches!(cxlkv_core::roots::get(&s2, b"freed-late"), Err(Error::NotFound)) {
        out.push(format!("{NAME}: the root of raw block B is there after its free"));
    }
    let mut buf = vec![0u8; RAW];
    rig.mem.shared_region().copy_out(blocks[2], &mut buf)?;
    if buf.iter().any(|&b| b != 0x42) {
        out.push(format!("{NAME}: raw block C lost its bytes"));
    }
    if let Err(e) = n2.root_free(b"kept") {
        out.push(format!("{NAME}: the root free of raw block C failed: {e}"));
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 1 holds a stripe lock (as a publish or an eviction there does) and
/// stops, the stripe's bucket lines in its cache, all empty. It is declared
/// dead and recovered (fenced: not known quiet). Node 0 publishes B in that
/// stripe; then node 1's bucket lines are written back over the stripe's,
/// hiding B. Node 2 publishing B again must find the buckets void and have
/// the stripe repaired, then find B there (`Exists`, never a second entry
/// for one key); node 2 evicting must evict B (never `Corrupt`: a READY
/// entry no bucket names); the region checks clean.
pub(super) fn zombie_buckets_land_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "zombie-buckets-land-late";
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let l = &s0.layout;
    let s = 0u32;
    let b = keys_in(&s0, s, 0, 1)[0];
    let mut out = Vec::new();
    let mut lines: Vec<u64> = (0..l.buckets_per_stripe).map(|i| l.bucket(s, i) & !63).collect();
    lines.dedup();
    let old: Vec<[u8; 64]> = lines.iter().map(|&x| rig.mem.shared_region().read(x)).collect::<Result<_>>()?;
    let _held = n1.lock(l.locks().stripe(s))?;
    declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    put_byte(&n0, b, 0xb0)?;
    // Node 1's copies of the bucket lines, from before B, land.
    for (&x, o) in lines.iter().zip(&old) {
        rig.cache(1).write(x, o)?;
        rig.mem.evict_line(1, (x / 64) as usize);
    }
    match put_after_repair(&n2, b, 0xb2) {
        Err(Error::Exists) => {}
        r => out.push(format!("{NAME}: publishing B again under the late buckets gave {r:?}, not Exists")),
    }
    match n2.evict(1, &mut cxlkv_core::index::Lru) {
        Ok(r) if r.entries == 1 => {}
        r => out.push(format!("{NAME}: node 2's eviction under the late buckets gave {r:?}")),
    }
    let mut buf = [0u8; 256];
    match n2.get(NS, b, &mut buf) {
        Err(Error::NotFound) => {}
        r => out.push(format!("{NAME}: B reads {r:?} after its eviction")),
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 1 puts root A and stops at `site` on the way (its slot journaled,
/// or the record stored, or its journal's clear stored); `evict` then
/// writes the journal line back from its cache (a clear landing first).
/// It is declared dead and recovered (fenced: not known quiet); node 2 puts
/// root B; node 1 wakes and goes on. B must keep its value: node 1's
/// record lands only on the slot its journal named (never taken meanwhile),
/// or is never written (its grant found revoked); the region checks clean.
fn root_put_by_a_zombie(
    name: &str,
    site: &'static str,
    evict: bool,
    disable: Option<&'static str>,
) -> Result<Vec<String>> {
    let rig = Rig::new(3, 3, disable)?;
    let (s0, s1, s2) = rig.three_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    let (l0, l2) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n2) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s2, 2, &env, &l2)?);
    let l = &s0.layout;
    let mut out = Vec::new();
    let b = Root { offset: 0, size: 0xb, tag: 0xb0b };
    let (stopped_rx, go_tx) = rig.parks_at(1, site);
    std::thread::scope(|sc| -> Result<()> {
        let t = sc.spawn(|| {
            let l1 = NodeLocal::default();
            let n1 = Node::new(&s1, 1, &env, &l1)?;
            n1.root_put(b"a", Root { offset: 0, size: 0xa, tag: 0xa0a })
        });
        if !parked(&stopped_rx, || t.is_finished(), &env)? {
            let r = t.join().unwrap_or(Err(Error::Corrupt));
            out.push(format!("{name}: node 1's root put ended ({r:?}) without stopping"));
            return Ok(());
        }
        if evict {
            let line = (l.requests(1) + cxlkv_core::layout::ROOT_AT) / 64;
            rig.mem.evict_line(1, line as usize);
        }
        declare_dead(&s0, 1)?;
        env.step()?;
        n0.recover(0)?;
        if let Err(e) = n2.root_put(b"b", b) {
            out.push(format!("{name}: node 2's root put failed: {e}"));
        }
        let _ = go_tx.send(());
        let _ = t.join();
        Ok(())
    })?;
    rig.mem.drain(1);
    match cxlkv_core::roots::get(&s2, b"b") {
        Ok(r) if r == b => {}
        r => out.push(format!("{name}: root B reads {r:?} after node 1 went on")),
    }
    rig.expect_clean(name, &mut out)?;
    Ok(out)
}

/// Node 2 allocates a raw block, alone in a chunk of its own; node 1 frees
/// it (any node may), which gives the chunk back, and stops at the alloc
/// lock's release: the map's clear and the journal's clear written back,
/// the free record not yet (were it not fenced in before the clear). It is
/// declared dead and recovered (fenced: not known quiet), which finds the
/// chunk empty; node 0 publishes blocks, which take it; node 1 wakes and
/// goes on, and node 0 publishes more. Every block must keep its bytes (a
/// free record landing over the chunk in use would give it out twice), and
/// the region checks clean.
pub(super) fn zombie_chunk_release_clear_lands_first(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "zombie-chunk-release-clear-lands-first";
    let rig = Rig::new(3, 3, disable)?;
    let (s0, s1, s2) = rig.three_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    let (l0, l2) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n2) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s2, 2, &env, &l2)?);
    let l = &s0.layout;
    let mut out = Vec::new();
    let raw = n2.alloc(256)?;
    let c = cxlkv_core::alloc::chunk_of(l, raw)?;
    // The free's flushes queue; the alloc lock's release fence is the
    // first, and the map's and the journal's lines land before it.
    let (stopped_rx, go_tx) = rig.parks_at(1, "lock.release.fence");
    let keys: Vec<Key> = (0..48u64).map(|i| Key { lo: 0x7700 + i, hi: i }).collect();
    std::thread::scope(|sc| -> Result<()> {
        let t = sc.spawn(|| {
            let l1 = NodeLocal::default();
            let n1 = Node::new(&s1, 1, &env, &l1)?;
            n1.free(raw)
        });
        if !parked(&stopped_rx, || t.is_finished(), &env)? {
            let r = t.join().unwrap_or(Err(Error::Corrupt));
            out.push(format!("{NAME}: node 1's free ended ({r:?}) without stopping"));
            return Ok(());
        }
        for line in [l.chunk_map(c) / 64, (l.requests(1) + cxlkv_core::layout::RELEASE_AT) / 64] {
            rig.mem.land_queued(1, line as usize);
            rig.mem.evict_line(1, line as usize);
        }
        declare_dead(&s0, 1)?;
        env.step()?;
        n0.recover(0)?;
        for (i, &k) in keys[..24].iter().enumerate() {
            put_byte(&n0, k, i as u8)?;
        }
        let _ = go_tx.send(());
        let _ = t.join();
        Ok(())
    })?;
    rig.mem.drain(1);
    for (i, &k) in keys.iter().enumerate().skip(24) {
        if let Err(e) = put_byte(&n0, k, i as u8) {
            out.push(format!("{NAME}: a publish after node 1 went on failed: {e}"));
        }
    }
    for (i, &k) in keys.iter().enumerate() {
        let mut buf = [0u8; 256];
        match n0.get(NS, k, &mut buf) {
            Ok(256) if buf == [i as u8; 256] => {}
            r => out.push(format!("{NAME}: block {i} reads {r:?} with bytes {:?}", &buf[..4])),
        }
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// [`root_put_by_a_zombie`], stopped with its record stored, its journal
/// in memory and its grant checked.
pub(super) fn zombie_root_lands_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    root_put_by_a_zombie("zombie-root-lands-late", "roots.put", false, disable)
}

/// [`root_put_by_a_zombie`], stopped before its journal's write-back: its
/// grant is revoked before it checks.
pub(super) fn zombie_root_put_checks_its_grant(disable: Option<&'static str>) -> Result<Vec<String>> {
    root_put_by_a_zombie("zombie-root-put-checks-its-grant", "roots.journal", false, disable)
}

/// [`root_put_by_a_zombie`], stopped with its journal's clear stored and
/// written back before anything else.
pub(super) fn zombie_root_clear_lands_first(disable: Option<&'static str>) -> Result<Vec<String>> {
    root_put_by_a_zombie("zombie-root-clear-lands-first", "lock.release.fence", true, disable)
}

/// Node 1 reserves a block in a stripe and stops with the entry stored,
/// its line not landed (the reservation journaled, the block placed). It
/// is declared dead and recovered (fenced: not known quiet), which finds
/// the block unreferenced and reclaims it; node 0 publishes a block of the
/// same size in that stripe, which takes the same granules. Then node 1's
/// entry line lands, and node 0 recovers again, node 1 still fenced. Node
/// 0's block must stay stored with its bytes through both: its entry not
/// written over (the stopped node's place was held) and its block not
/// given to the late entry (which claims after every other). Node 1
/// wakes, fails with Revoked and says it is quiet; the recovery after
/// frees its place and the region checks clean.
pub(super) fn reservation_entry_lands_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    entry_lands_late("reservation-entry-lands-late", false, disable)
}

/// [`reservation_entry_lands_late`], node 1 reserving two blocks of the
/// stripe in one batch and stopping at the second one's entry: that
/// block's journal record went out under the heap lock kept from the first
/// block, with no grant to fence it.
pub(super) fn batched_reservation_entry_lands_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    entry_lands_late("batched-reservation-entry-lands-late", true, disable)
}

fn entry_lands_late(name: &'static str, batch: bool, disable: Option<&'static str>) -> Result<Vec<String>> {
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    let l0 = NodeLocal::default();
    let n0 = Node::new(&s0, 0, &env, &l0)?;
    let l = &s0.layout;
    let s = 0u32;
    let keys = keys_in(&s0, s, 0, 8);
    // Node 0's blocks after the first recovery: enough to take every place
    // of the stripe that recovery left free.
    let later: Vec<Key> = if batch { [2, 4, 5, 6, 7].map(|i| keys[i]).to_vec() } else { vec![keys[2]] };
    let mut out = Vec::new();
    let stored = |what: &str, out: &mut Vec<String>| {
        for &k in core::iter::once(&keys[0]).chain(&later) {
            let mut buf = [0u8; 256];
            match n0.get(NS, k, &mut buf) {
                Ok(256) if buf == [k.hi as u8; 256] => {}
                r => out.push(format!("{name}: {what}, block {k:?} reads {r:?} with bytes {:?}", &buf[..4])),
            }
        }
    };
    let l1 = NodeLocal::default();
    if batch {
        // A block elsewhere first, before node 0 has a chunk: node 1 then
        // owns one with room, which its batch's blocks share under one hold
        // of its heap lock.
        let other = keys_in(&s0, s.wrapping_add(1), 0, 1);
        put(&Node::new(&s1, 1, &env, &l1)?, other.first().copied().ok_or(Error::Corrupt)?)?;
    }
    put(&n0, keys[0])?;
    // Node 1 stops at its (last) entry's flush (the entry stored), until
    // told to go on.
    let (stopped_rx, go_tx) = rig.parks_at_nth(1, "index.entry.write", if batch { 2 } else { 1 });
    let zombie = std::thread::scope(|sc| -> Result<Result<()>> {
        let t = sc.spawn(|| {
            let n1 = Node::new(&s1, 1, &env, &l1)?;
            if !batch {
                return n1.reserve(NS, keys[1], 256, 1).map(|_| ());
            }
            let items = [keys[1], keys[3]].map(|key| ReserveItem { key, len: 256, tokens: 1 });
            let mut got = [Err(Error::InvalidArgument), Err(Error::InvalidArgument)];
            n1.reserve_batch(NS, &items, &mut got)?;
            got.into_iter().try_for_each(|r| r.map(|_| ()))
        });
        if !parked(&stopped_rx, || t.is_finished(), &env)? {
            let r = t.join().unwrap_or(Err(Error::Corrupt));
            out.push(format!("{name}: node 1's reservation ended ({r:?}) without stopping"));
            return Ok(r);
        }
        let lines: Vec<usize> = (0..l.caps.entries_per_stripe)
            .map(|e| (l.entry(s, e) / 64) as usize)
            .filter(|&line| rig.mem.is_dirty(1, line))
            .collect();
        if lines.is_empty() {
            out.push(format!("{name}: node 1 stopped with no entry of stripe {s} stored"));
            let _ = go_tx.send(());
            return Ok(t.join().unwrap_or(Err(Error::Corrupt)));
        }
        declare_dead(&s0, 1)?;
        env.step()?;
        n0.recover(0)?;
        for &k in &later {
            put(&n0, k)?;
        }
        for &line in &lines {
            rig.mem.evict_line(1, line);
        }
        n0.recover(0)?;
        stored("after the late entry and a recovery", &mut out);
        let _ = go_tx.send(());
        Ok(t.join().unwrap_or(Err(Error::Corrupt)))
    })?;
    if zombie != Err(Error::Revoked) {
        out.push(format!("{name}: the woken node's reservation gave {zombie:?}, not Revoked"));
    }
    let l1 = NodeLocal::default();
    let n1 = Node::new(&s1, 1, &env, &l1)?;
    match n1.quiesce(2) {
        Ok(true) => {}
        r => out.push(format!("{name}: the woken node's quiesce gave {r:?}")),
    }
    env.step()?;
    n0.recover(0)?;
    stored("after the recovery that frees the woken node", &mut out);
    rig.expect_clean(name, &mut out)?;
    Ok(out)
}

/// Where a chunk release stops in [`zombie_release`].
#[derive(Clone, Copy, PartialEq)]
enum ReleaseStop {
    /// At the flush of the free record: the journal is in memory and the
    /// node's alloc grant checked; the record is stored, not landed.
    AfterCheck,
    /// At the flush of the journal: nothing checked yet.
    BeforeJournal,
}

/// Node 1 (host 1) frees node 0's only raw block, which releases node 0's
/// chunk, and stops there (`stop`). It is declared dead and recovered by node 0 (host
/// 0): fenced, not known quiet. Node 2 (host 2) publishes blocks. Then
/// whatever node 1 stored lands and it wakes: its free must fail with
/// `Revoked`, and no block of node 2's may lose its bytes, before or after
/// node 2 publishes more. Stopped after its check, the release was
/// journaled: recovery must hold the chunk out of use until node 1 is
/// quiet. Stopped before, the woken node must find its grant revoked
/// before it writes the chunk free. Node 1 says it is quiet; the recovery
/// after frees the chunk and the region checks clean.
fn zombie_release(name: &'static str, stop: ReleaseStop, disable: Option<&'static str>) -> Result<Vec<String>> {
    let rig = Rig::new(3, 3, disable)?;
    let (s0, s1, s2) = rig.three_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    let (l0, l2) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n2) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s2, 2, &env, &l2)?);
    let l = &s0.layout;
    let keys: Vec<Key> = (0..8u64).map(|i| Key { lo: 0x7e10 + i, hi: 9 + i }).collect();
    let mut out = Vec::new();
    let mut published = Vec::new();
    let site = match stop {
        ReleaseStop::AfterCheck => "alloc.chunk.release",
        ReleaseStop::BeforeJournal => "alloc.release.journal",
    };
    let l1 = NodeLocal::default();
    let n1 = Node::new(&s1, 1, &env, &l1)?;
    // Node 0's chunk: a fenced node's own chunks are held whatever it
    // journaled; another's are not.
    let off = n0.alloc(4096)?;
    let c = cxlkv_core::alloc::chunk_of(l, off)?;
    let (stopped_rx, go_tx) = rig.parks_at(1, site);
    let zombie = std::thread::scope(|sc| -> Result<Result<()>> {
        let t = sc.spawn(|| n1.free(off));
        if !parked(&stopped_rx, || t.is_finished(), &env)? {
            let r = t.join().unwrap_or(Err(Error::Corrupt));
            out.push(format!("{name}: node 1's free ended ({r:?}) without stopping"));
            return Ok(r);
        }
        // The map node 1 cleared lands (its journal only if fenced).
        let map = (l.chunk_map(c) / 64) as usize;
        for line in map..=map + (2 * l.map_words()).div_ceil(8) {
            rig.mem.land_queued(1, line);
        }
        declare_dead(&s0, 1)?;
        env.step()?;
        n0.recover(0)?;
        for &k in &keys[..4] {
            put(&n2, k)?;
            published.push(k);
        }
        // Whatever node 1 stored lands, and it wakes.
        for line in [l.chunk(c) / 64, (l.chunk_bitmap.start / 64)] {
            rig.mem.evict_line(1, line as usize);
        }
        let _ = go_tx.send(());
        Ok(t.join().unwrap_or(Err(Error::Corrupt)))
    })?;
    rig.mem.drain(1);
    if zombie != Err(Error::Revoked) {
        out.push(format!("{name}: the woken node's free gave {zombie:?}, not Revoked"));
    }
    for &k in &keys[4..] {
        match put(&n2, k) {
            Ok(()) => published.push(k),
            Err(e) => out.push(format!("{name}: node 2's publish after the woken node's release failed: {e}")),
        }
    }
    let stored = |what: &str, out: &mut Vec<String>| {
        for &k in &published {
            let mut buf = [0u8; 256];
            match n2.get(NS, k, &mut buf) {
                Ok(256) if buf == [k.hi as u8; 256] => {}
                r => out.push(format!("{name}: {what}, block {k:?} reads {r:?} with bytes {:?}", &buf[..4])),
            }
        }
    };
    stored("once the woken node's release landed", &mut out);
    match n1.quiesce(2) {
        Ok(true) => {}
        r => out.push(format!("{name}: the woken node's quiesce gave {r:?}")),
    }
    env.step()?;
    n0.recover(0)?;
    stored("after the recovery that frees the woken node", &mut out);
    rig.expect_clean(name, &mut out)?;
    Ok(out)
}

pub(super) fn zombie_release_lands_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    zombie_release("zombie-release-lands-late", ReleaseStop::AfterCheck, disable)
}

pub(super) fn zombie_wakes_to_release(disable: Option<&'static str>) -> Result<Vec<String>> {
    zombie_release("zombie-wakes-to-release", ReleaseStop::BeforeJournal, disable)
}

/// Node 1 (host 1) frees its only raw block and stops in the chunk's
/// release with the bitmap word stored, not landed; it is declared dead and
/// recovered by node 0 (host 0, whose cache keeps every chunk record as
/// recovery read them). Node 2 (host 2) takes a fresh raw chunk; then node
/// 1's bitmap line lands (that chunk's bit clear), and node 0 takes a fresh
/// raw chunk: it must not take node 2's (its record, read fresh, is not
/// free), and node 2's bytes must stay.
pub(super) fn zombie_bitmap_lands_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "zombie-bitmap-lands-late";
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let l = &s0.layout;
    let mut out = Vec::new();
    let off = n1.alloc(4096)?;
    let (stopped_rx, go_tx) = rig.parks_at(1, "alloc.bitmap.publish");
    let mine = std::thread::scope(|sc| -> Result<Option<(u64, u64)>> {
        let t = sc.spawn(|| n1.free(off));
        if !parked(&stopped_rx, || t.is_finished(), &env)? {
            let r = t.join().unwrap_or(Err(Error::Corrupt));
            out.push(format!("{NAME}: node 1's free ended ({r:?}) without stopping"));
            return Ok(None);
        }
        declare_dead(&s0, 1)?;
        env.step()?;
        n0.recover(0)?;
        let theirs = n2.alloc(4096)?;
        fill_raw(&s2, theirs, 4096, 0x5a)?;
        rig.mem.evict_line(1, (l.chunk_bitmap.start / 64) as usize);
        let ours = n0.alloc(4096)?;
        fill_raw(&s0, ours, 4096, 0xa5)?;
        let _ = go_tx.send(());
        let _ = t.join();
        Ok(Some((theirs, ours)))
    })?;
    rig.mem.drain(1);
    if let Some((theirs, ours)) = mine {
        if cxlkv_core::alloc::chunk_of(l, theirs)? == cxlkv_core::alloc::chunk_of(l, ours)? {
            out.push(format!("{NAME}: node 0 took node 2's chunk, its bitmap bit cleared by a late line"));
        }
        let mut buf = vec![0u8; 4096];
        rig.mem.shared_region().copy_out(theirs, &mut buf)?;
        if buf != [0x5a; 4096] {
            out.push(format!("{NAME}: node 2's raw block lost its bytes ({:?})", &buf[..4]));
        }
        n2.free(theirs)?;
        n0.free(ours)?;
    }
    quiet_and_clean(&rig, &env, &n0, &n1, NAME, &mut out)?;
    Ok(out)
}

/// Node 1 (host 1) allocates raw bytes; it takes a fresh chunk and stops
/// as it places its block there (its map line stored, not written back,
/// after it found the chunk's maps empty and its record whole). It is
/// declared dead and recovered by node 0 (host 0): fenced, not known quiet.
/// Node 2 (host 2) allocates raw bytes and fills them, and publishes KV
/// blocks (which a chunk a fenced node may write still could take: their
/// maps are rebuilt from entries); then node 1 wakes and places its block.
/// Node 2's blocks must keep their places and bytes: the fenced node's
/// empty chunk was held out of use, not given to node 2.
pub(super) fn zombie_wakes_to_take_a_chunk(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "zombie-wakes-to-take-a-chunk";
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let mut out = Vec::new();
    let len = (s0.layout.chunk_size() * 3 / 2) as usize;
    let kv: Vec<Key> = (0..4u64).map(|i| Key { lo: 0x3c00 + i, hi: i }).collect();
    let (stopped_rx, go_tx) = rig.parks_at(1, "alloc.take.map");
    let theirs = std::thread::scope(|sc| -> Result<Option<u64>> {
        let t = sc.spawn(|| n1.alloc(4096));
        if !parked(&stopped_rx, || t.is_finished(), &env)? {
            let r = t.join().unwrap_or(Err(Error::Corrupt));
            out.push(format!("{NAME}: node 1's allocation ended ({r:?}) without stopping"));
            return Ok(None);
        }
        rig.mem.drain(1);
        declare_dead(&s0, 1)?;
        env.step()?;
        n0.recover(0)?;
        // A run of whole chunks (its maps stay empty, as a fresh chunk's).
        let theirs = n2.alloc(len as u64)?;
        fill_raw(&s2, theirs, len, 0x3c)?;
        for (i, &k) in kv.iter().enumerate() {
            put_byte(&n2, k, 0x50 + i as u8)?;
        }
        let _ = go_tx.send(());
        let _ = t.join();
        Ok(Some(theirs))
    })?;
    rig.mem.drain(1);
    if let Some(theirs) = theirs {
        let c = cxlkv_core::alloc::chunk_of(&s0.layout, theirs)?;
        let rec: cxlkv_core::layout::ChunkRecord = rig.mem.shared_region().read(s0.layout.chunk(c))?;
        if rec.kind != cxlkv_core::layout::CHUNK_LARGE || rec.owner != 3 {
            out.push(format!("{NAME}: node 2's run of chunks is not its own any more: {rec:?}"));
        }
        let mut buf = vec![0u8; len];
        rig.mem.shared_region().copy_out(theirs, &mut buf)?;
        if buf.iter().any(|&b| b != 0x3c) {
            out.push(format!("{NAME}: node 2's raw block lost its bytes ({:?})", &buf[..4]));
        }
        if let Err(e) = n2.free(theirs) {
            out.push(format!("{NAME}: node 2's free of its raw block failed: {e}"));
        }
    }
    quiet_and_clean(&rig, &env, &n0, &n1, NAME, &mut out)?;
    for (i, &k) in kv.iter().enumerate() {
        let mut buf = [0u8; 256];
        match n2.get(NS, k, &mut buf) {
            Ok(256) if buf == [0x50 + i as u8; 256] => {}
            r => out.push(format!("{NAME}: node 2's block {i} reads {r:?} with bytes {:?}", &buf[..4])),
        }
    }
    Ok(out)
}

/// Node 0 (host 0) publishes block A; node 1 (host 1) starts evicting it
/// and stops inside the stripe lock, its entry line (A, CLAIMED) in its
/// cache. It is declared dead and recovered (A stays: the line never
/// landed). Node 0 evicts A and publishes B, which takes A's entry and,
/// the allocator being first-fit, A's old block. Then node 1's line is
/// written back over B's entry. The line is void (stamped with the revoked
/// grant): the next holder that meets it (node 2, host 2, publishing B
/// again) must have the stripe repaired, and the repair must drop the line
/// (A's block holds B's bytes now), never bring A back; the region checks
/// clean and B can be stored again.
pub(super) fn zombie_entry_lands_over_a_reused_one(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "zombie-entry-lands-over-a-reused-one";
    let rig = Rig::new(3, 3, disable)?;
    let (s0, s1, s2) = rig.three_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    let (l0, l2) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n2) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s2, 2, &env, &l2)?);
    let keys = keys_in(&s0, 0, 0, 2);
    let (a, b) = (keys[0], keys[1]);
    let mut out = Vec::new();
    let ha = put_byte(&n0, a, 0xaa)?;
    let line = (s0.layout.entry(ha.stripe, ha.entry) / 64) as usize;
    // Node 1 stops at its first entry write's flush: A marked CLAIMED.
    let (stopped_rx, go_tx) = rig.parks_at(1, "index.entry.write");
    std::thread::scope(|sc| -> Result<()> {
        let t = sc.spawn(|| {
            let l1 = NodeLocal::default();
            let n1 = Node::new(&s1, 1, &env, &l1)?;
            n1.evict(1, &mut cxlkv_core::index::Lru).map(|_| ())
        });
        if !parked(&stopped_rx, || t.is_finished(), &env)? {
            let r = t.join().unwrap_or(Err(Error::Corrupt));
            out.push(format!("{NAME}: node 1's eviction ended ({r:?}) without stopping"));
            return Ok(());
        }
        declare_dead(&s0, 1)?;
        env.step()?;
        n0.recover(0)?;
        if n0.lookup(NS, &[a])? != 1 {
            out.push(format!("{NAME}: A is gone after the first repair (its eviction never landed)"));
        }
        n0.evict(1, &mut cxlkv_core::index::Lru)?;
        let hb = put_byte(&n0, b, 0xbb)?;
        if (hb.stripe, hb.entry, hb.off) != (ha.stripe, ha.entry, ha.off) {
            out.push(format!("{NAME}: B did not take A's entry and block ({hb:?} vs {ha:?}): the scenario misses"));
        }
        // Node 1's line lands over B's entry.
        rig.mem.evict_line(1, line);
        // The next holder publishes B again (B's entry is lost): a void
        // line met is repaired, and the call retried.
        if let Err(e) = put_after_repair(&n2, b, 0xb2) {
            out.push(format!("{NAME}: the next holder's publish of B gave {e:?}"));
        }
        let mut buf = [0u8; 256];
        match n2.get(NS, a, &mut buf) {
            Err(Error::NotFound) => {}
            r => out.push(format!("{NAME}: A, evicted, reads {r:?} (first byte {:#x})", buf[0])),
        }
        rig.expect_clean(NAME, &mut out)?;
        // Node 1 wakes (every later park passes) and finds itself revoked.
        drop(go_tx);
        let _ = t.join();
        Ok(())
    })?;
    Ok(out)
}

/// Node 0 (host 0) publishes block A and pins it; host 2 reads A (its cache
/// keeps the stripe lock's line, the floor, from then). Node 1 (host 1)
/// starts evicting A, finds the pin and stops writing A back READY, that
/// line in its cache. It is declared dead and recovered. Node 0 drops its
/// pin and evicts A; block Y (another stripe) takes A's old block, and A is
/// published again, in A's entry but another block. Then node 1's line
/// lands: A, READY, naming Y's block now. A reader without the lock (host
/// 2) must take the void line for missing, never read Y's bytes as A's;
/// the next holder publishing A has the stripe repaired; then A reads as
/// its last publish and the region checks clean.
pub(super) fn zombie_entry_lands_under_a_live_key(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "zombie-entry-lands-under-a-live-key";
    let rig = Rig::new(3, 3, disable)?;
    let (s0, s1, s2) = rig.three_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    let (l0, l2) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n2) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s2, 2, &env, &l2)?);
    let a = keys_in(&s0, 0, 0, 1)[0];
    let y = keys_in(&s0, 1, 0, 1)[0];
    let mut out = Vec::new();
    let ha = put_byte(&n0, a, 0xaa)?;
    let mut pin = [Err(Error::NotFound)];
    n0.acquire(NS, &[a], &mut pin)?;
    let mut buf = [0u8; 256];
    if n2.get(NS, a, &mut buf) != Ok(256) {
        out.push(format!("{NAME}: A could not be read at first"));
    }
    let line = (s0.layout.entry(ha.stripe, ha.entry) / 64) as usize;
    // Node 1 stops at its first entry write's flush (A CLAIMED), goes on,
    // and stops at its second (A READY again: pinned).
    let (stopped_rx, go_tx) = rig.parks_at(1, "index.entry.write");
    std::thread::scope(|sc| -> Result<()> {
        let t = sc.spawn(|| {
            let l1 = NodeLocal::default();
            let n1 = Node::new(&s1, 1, &env, &l1)?;
            n1.evict(1, &mut cxlkv_core::index::Lru).map(|_| ())
        });
        if !parked(&stopped_rx, || t.is_finished(), &env)? {
            let r = t.join().unwrap_or(Err(Error::Corrupt));
            out.push(format!("{NAME}: node 1's eviction ended ({r:?}) without stopping"));
            return Ok(());
        }
        let (again_rx, go_tx) = {
            let again = rig.parks_at(1, "index.entry.write");
            let _ = go_tx.send(());
            again
        };
        if !parked(&again_rx, || t.is_finished(), &env)? {
            let r = t.join().unwrap_or(Err(Error::Corrupt));
            out.push(format!("{NAME}: node 1's eviction ended ({r:?}) without stopping twice"));
            return Ok(());
        }
        declare_dead(&s0, 1)?;
        env.step()?;
        n0.recover(0)?;
        n0.release(&[pin[0]?])?;
        n0.evict(1, &mut cxlkv_core::index::Lru)?;
        let hy = put_byte(&n0, y, 0x77)?;
        let ha2 = put_byte(&n0, a, 0xa2)?;
        if hy.off != ha.off || (ha2.stripe, ha2.entry) != (ha.stripe, ha.entry) || ha2.off == ha.off {
            out.push(format!("{NAME}: Y {hy:?} / A again {ha2:?} vs A {ha:?}: the scenario misses"));
        }
        // Node 1's line lands over A's new entry.
        rig.mem.evict_line(1, line);
        match n2.get(NS, a, &mut buf) {
            Err(Error::NotFound) => {}
            r => out.push(format!("{NAME}: reading A over the void line gave {r:?} (first byte {:#x})", buf[0])),
        }
        let mut p2 = [Err(Error::NotFound)];
        if n2.acquire(NS, &[a], &mut p2)? != 0 {
            n2.release(&[p2[0]?])?;
            out.push(format!("{NAME}: A was pinned through the void line"));
        }
        if let Err(e) = put_after_repair(&n2, a, 0xa3) {
            out.push(format!("{NAME}: the next holder's publish of A gave {e:?}"));
        }
        match n2.get(NS, a, &mut buf) {
            Ok(256) if buf == [0xa3; 256] => {}
            r => out.push(format!("{NAME}: A reads {r:?} (first byte {:#x}) after the repair", buf[0])),
        }
        rig.expect_clean(NAME, &mut out)?;
        drop(go_tx);
        let _ = t.join();
        Ok(())
    })?;
    Ok(out)
}

/// Node 1 (host 1) publishes A, the stripe's coldest block, and node 2
/// (host 2) reserves and writes B there. Node 1 is declared dead and
/// recovered (the stripe's floor raised, A restamped); then node 1's copy
/// of A's entry line, from before the repair, is written back over it, so
/// A's line is void. Node 2 publishes B: linking B behind A meets the void
/// line. The publish must come back Ok (the stripe repaired, B published
/// again), not with a `Recovering` that leaves B unpublished (the sweep's
/// seed 112020 met it so); B reads back whole and the region checks clean.
pub(super) fn publish_meets_a_void_entry(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "publish-meets-a-void-entry";
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let l = &s0.layout;
    let s = 0u32;
    let ks = keys_in(&s0, s, 0, 2);
    let (a, b) = (ks[0], ks[1]);
    let ha = put_byte(&n1, a, 0xa1)?;
    let a_line = l.entry(s, ha.entry);
    let old: [u8; 64] = rig.mem.shared_region().read(a_line)?;
    let hb = n2.reserve(NS, b, 256, 1)?;
    n2.write(&hb, 0, &[0xb2; 256])?;
    declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    rig.cache(1).write(a_line, &old)?;
    rig.mem.evict_line(1, (a_line / 64) as usize);
    let mut out = Vec::new();
    let mut st = [Ok(())];
    match n2.publish_flushed(core::slice::from_ref(&hb), &mut st) {
        Ok(()) if st[0] == Ok(()) => {}
        r => out.push(format!("{NAME}: publishing B behind A's void line gave {r:?}, item {:?}", st[0])),
    }
    let mut buf = [0u8; 256];
    match n2.get(NS, b, &mut buf) {
        Ok(256) if buf.iter().all(|&x| x == 0xb2) => {}
        r => out.push(format!("{NAME}: B reads {r:?} after its publish")),
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 1 (host 1) publishes A and node 0 evicts it. Node 1 is declared
/// dead and recovered; node 2 (host 2) reserves B in A's entry (a newer
/// generation) and writes half of it. Then node 1's copy of A's entry line,
/// from before, is written back over B's. Node 2's recovery drops the void
/// line: B's entry is lost, but node 2 still writes into B's block, which
/// its journal names, so the block must stay allocated through host 0's
/// recovery too (its cache kept node 2's journal from before B) — C,
/// reserved next, must not get it — and node 2 reserves D in that stripe,
/// which must not reuse B's generation. Node 2 writes the rest of B: C must read back
/// whole. Node 2 stores into B through its pointer too (plain stores), then
/// aborts B: `StaleHandle`, and the block goes back with no line of it
/// dirty in node 2's cache (written back later, such a line would land over
/// the block's next owner: zombie sweep seed 125027). D publishes and the
/// region checks clean (no block leaked, none shared).
pub(super) fn zombie_entry_lands_over_a_reservation(disable: Option<&'static str>) -> Result<Vec<String>> {
    entry_over_a_reservation("zombie-entry-lands-over-a-reservation", true, disable)
}

/// As [`zombie_entry_lands_over_a_reservation`], but host 0's recovery is
/// the one that drops the void line: it must read B's block from node 2's
/// journal in memory (node 2 named it there, flushed, before the entry),
/// and node 2 lets B go by a publish (`StaleHandle`) rather than an abort.
pub(super) fn zombie_entry_over_a_reservation_repaired_elsewhere(disable: Option<&'static str>) -> Result<Vec<String>> {
    entry_over_a_reservation("zombie-entry-over-a-reservation-repaired-elsewhere", false, disable)
}

fn entry_over_a_reservation(name: &str, writer_repairs: bool, disable: Option<&'static str>) -> Result<Vec<String>> {
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let l = &s0.layout;
    let s = 0u32;
    let ks = keys_in(&s0, s, 0, 3);
    let (a, b, d) = (ks[0], ks[1], ks[2]);
    let c = keys_in(&s0, 1, 0, 1)[0];
    let mut out = Vec::new();
    let ha = put_byte(&n1, a, 0xa1)?;
    let a_line = l.entry(s, ha.entry);
    let old: [u8; 64] = rig.mem.shared_region().read(a_line)?;
    n0.evict(1, &mut cxlkv_core::index::Lru)?;
    // Host 0's recovery reads (and keeps) node 2's journal before B.
    declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    let hb = n2.reserve(NS, b, 256, 1)?;
    if hb.entry != ha.entry {
        out.push(format!("{name}: B took entry {} and not A's {}: the scenario misses", hb.entry, ha.entry));
        return Ok(out);
    }
    n2.write(&hb, 0, &[0xb2; 128])?;
    rig.cache(1).write(a_line, &old)?;
    rig.mem.evict_line(1, (a_line / 64) as usize);
    // Node 2 has the void line dropped; host 0's next recovery must still
    // see the record that keeps B's block.
    if writer_repairs {
        n2.recover(0)?;
    }
    n0.recover(0)?;
    let hc = put_byte(&n0, c, 0xcc)?;
    if hc.off == hb.off {
        out.push(format!("{name}: C got B's block ({}) while node 2 still writes into it", hb.off));
    }
    let hd = n2.reserve(NS, d, 256, 1)?;
    if hd.entry == hb.entry && hd.gen == hb.gen {
        out.push(format!("{name}: D took B's entry at B's generation {}", hb.gen));
    }
    n2.write(&hd, 0, &[0xdd; 256])?;
    n2.write(&hb, 128, &[0xb2; 128])?;
    let mut buf = [0u8; 256];
    match n0.get(NS, c, &mut buf) {
        Ok(256) if buf == [0xcc; 256] => {}
        r => out.push(format!("{name}: C reads {r:?} (first byte {:#x}) after B's writes", buf[0])),
    }
    // Node 2 stores into B through its pointer too (plain stores, left in
    // its cache), then lets B go: by a publish, or by an abort.
    s2.view.copy_in(hb.off, &[0xb3; 64])?;
    let mut st = [Ok(())];
    if writer_repairs {
        match n2.abort(&hb) {
            Err(Error::StaleHandle) => {}
            r => out.push(format!("{name}: aborting B, its entry lost, gave {r:?}")),
        }
    } else {
        match n2.publish_flushed(core::slice::from_ref(&hb), &mut st) {
            Ok(()) if st[0] == Err(Error::StaleHandle) => {}
            r => out.push(format!("{name}: publishing B, its entry lost, gave {r:?}, item {:?}", st[0])),
        }
    }
    // Its block goes back: no line of it may stay dirty in node 2's cache,
    // to land later over the block's next owner.
    if (hb.off / 64..(hb.off + hb.len).div_ceil(64)).any(|i| rig.mem.is_dirty(2, i as usize)) {
        out.push(format!("{name}: B's block went back with payload lines dirty in its writer's cache"));
    }
    match n2.get(NS, b, &mut buf) {
        Err(Error::NotFound) => {}
        r => out.push(format!("{name}: B, lost, reads {r:?}")),
    }
    let g = s * l.caps.entries_per_stripe + hb.entry;
    for i in 0..l.caps.pin_slots {
        let r: cxlkv_core::layout::PinRecord = rig.mem.shared_region().read(l.pin_record(2, i))?;
        if r.entry == g + 1 && r.gen == hb.gen as u64 && r.count > 0 {
            out.push(format!("{name}: node 2's journal still records B after its publish: {r:?}"));
        }
    }
    n2.publish_flushed(core::slice::from_ref(&hd), &mut [Ok(())])?;
    match n0.get(NS, d, &mut buf) {
        Ok(256) if buf == [0xdd; 256] => {}
        r => out.push(format!("{name}: D reads {r:?} (first byte {:#x})", buf[0])),
    }
    rig.expect_clean(name, &mut out)?;
    Ok(out)
}

/// Node 1 (host 1) publishes A and node 0 evicts it; node 0 publishes B
/// in A's entry (a newer generation), and nodes 2 and 0 pin B. Node 1 is
/// declared dead and recovered; its copy of A's entry line, from before,
/// lands over B's, and the next recovery drops the void line: B is lost,
/// but both pins still read its block, which must stay allocated (C, put
/// next, must not get it). Node 2 lets go first: node 0 still pins the
/// block, so it stays (E, put next, must not get it, and node 0 reads B's
/// bytes through its pin). Node 0 lets go last and frees it: the region
/// checks clean (no block leaked) and no journal records B.
pub(super) fn zombie_entry_lands_over_a_pin(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "zombie-entry-lands-over-a-pin";
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let l = &s0.layout;
    let s = 0u32;
    let ks = keys_in(&s0, s, 0, 2);
    let (a, b) = (ks[0], ks[1]);
    let cs = keys_in(&s0, 1, 0, 2);
    let (c, e) = (cs[0], cs[1]);
    let mut out = Vec::new();
    let ha = put_byte(&n1, a, 0xa1)?;
    let a_line = l.entry(s, ha.entry);
    let old: [u8; 64] = rig.mem.shared_region().read(a_line)?;
    n0.evict(1, &mut cxlkv_core::index::Lru)?;
    let hb = put_byte(&n0, b, 0xbb)?;
    if hb.entry != ha.entry {
        out.push(format!("{NAME}: B took entry {} and not A's {}: the scenario misses", hb.entry, ha.entry));
        return Ok(out);
    }
    let (mut p2, mut p0) = ([Err(Error::NotFound)], [Err(Error::NotFound)]);
    n2.acquire(NS, &[b], &mut p2)?;
    n0.acquire(NS, &[b], &mut p0)?;
    let (p2, p0) = (p2[0]?, p0[0]?);
    declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    rig.cache(1).write(a_line, &old)?;
    rig.mem.evict_line(1, (a_line / 64) as usize);
    n0.recover(0)?;
    let hc = put_byte(&n0, c, 0xcc)?;
    if hc.off == hb.off {
        out.push(format!("{NAME}: C got B's block ({}) while two nodes pin it", hb.off));
    }
    if let Err(err) = n2.release(&[p2]) {
        out.push(format!("{NAME}: node 2 letting go of B gave {err:?}"));
    }
    let he = put_byte(&n0, e, 0xee)?;
    if he.off == hb.off {
        out.push(format!("{NAME}: E got B's block ({}) while node 0 pins it", hb.off));
    }
    let mut buf = [0u8; 256];
    match n0.read(&p0, 0, &mut buf) {
        Ok(()) if buf == [0xbb; 256] => {}
        r => out.push(format!("{NAME}: node 0's pin of B reads {r:?} (first byte {:#x})", buf[0])),
    }
    if let Err(err) = n0.release(&[p0]) {
        out.push(format!("{NAME}: node 0 letting go of B gave {err:?}"));
    }
    let g = s * l.caps.entries_per_stripe + hb.entry;
    for n in [0, 2] {
        for i in 0..l.caps.pin_slots {
            let r: cxlkv_core::layout::PinRecord = rig.mem.shared_region().read(l.pin_record(n, i))?;
            if r.entry == g + 1 && r.count > 0 {
                out.push(format!("{NAME}: node {n}'s journal still records B: {r:?}"));
            }
        }
    }
    for (k, byte) in [(c, 0xcc), (e, 0xee)] {
        match n2.get(NS, k, &mut buf) {
            Ok(256) if buf == [byte; 256] => {}
            r => out.push(format!("{NAME}: {:#x} reads {r:?} (first byte {:#x})", byte, buf[0])),
        }
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 1 (host 1) runs a host's SSD tier: it claims a tier directory. It
/// stops, is declared dead and recovered (fenced: not known quiet). Node 2
/// (host 2) starts a tier: it must claim another directory, not node 1's,
/// whose stopped owner may still write records there. Node 1 wakes and
/// records block B: no directory of a live tier may then claim B.
pub(super) fn zombie_tier_keeps_its_directory(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "zombie-tier-keeps-its-directory";
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let mut out = Vec::new();
    let mut d1 = n1.tier_claim(2)?;
    declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    let d2 = n2.tier_claim(3)?;
    if d2.dir() == d1.dir() {
        out.push(format!("{NAME}: node 2 claimed directory {} of node 1, which may still write there", d2.dir()));
    }
    let b = Key { lo: 0xb, hi: 0xb0 };
    let _ = d1.put(NS, b, 100);
    match s0.tier_find(NS, b) {
        Ok(None) => {}
        r => out.push(format!("{NAME}: after the woken tier recorded B, a lookup finds {r:?}")),
    }
    Ok(out)
}

/// Node 1 (host 1) reserves a block (in node 0's chunk), stores into it
/// through the pointer and aborts the reservation; it stops when it asks for the heap lock to
/// free the block (its entry already gone). It is declared dead and
/// recovered: nothing names its block, which is reclaimed. Node 2 (host 2)
/// publishes blocks until one takes that place; node 1 wakes. Node 2's
/// block must read back whole: the aborted payload's write-back landed
/// before the entry went (seed 113003 found it landing after).
pub(super) fn zombie_abort_lands_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "zombie-abort-lands-late";
    let rig = Rig::new(3, 3, disable)?;
    let (s0, s1, s2) = rig.three_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    let (l0, l2) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n2) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s2, 2, &env, &l2)?);
    let mut out = Vec::new();
    let (stopped_tx, stopped_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let park = std::sync::Mutex::new((stopped_tx, go_rx, false));
    rig.at_calls(1, move |h, site| {
        let mut p = park.lock().unwrap_or_else(|p| p.into_inner());
        if (h, site) == (1, "index.abort.payload") {
            p.2 = true;
        }
        if !(p.2 && (h, site) == (1, "lock.doorbell.fence")) {
            return false;
        }
        let _ = p.0.send(());
        let _ = p.1.recv();
        true
    });
    let a = Key { lo: 0xa, hi: 0xa0 };
    // Node 0's block makes the KV chunk node 1's reservation shares.
    put_byte(&n0, Key { lo: 0xc, hi: 0xc0 }, 0xc0)?;
    let zombie_off = std::sync::Mutex::new(u64::MAX);
    std::thread::scope(|sc| -> Result<()> {
        let t = sc.spawn(|| -> Result<u64> {
            let l1 = NodeLocal::default();
            let n1 = Node::new(&s1, 1, &env, &l1)?;
            let h = n1.reserve(NS, a, 256, 1)?;
            *zombie_off.lock().unwrap_or_else(|p| p.into_inner()) = h.off;
            // Stores through the reservation's pointer: dirty lines in
            // host 1's cache.
            s1.view.write(h.off, &[0xa1u8; 256])?;
            n1.abort(&h)?;
            Ok(h.off)
        });
        if !parked(&stopped_rx, || t.is_finished(), &env)? {
            let r = t.join().unwrap_or(Err(Error::Corrupt));
            out.push(format!("{NAME}: node 1's abort ended ({r:?}) without stopping"));
            return Ok(());
        }
        // What node 1 flushed lands, its entry's removal first among it; a
        // payload line still in flight (none, unless the abort's fence is
        // gone) stays so.
        let zo = *zombie_off.lock().unwrap_or_else(|p| p.into_inner());
        let payload = (zo / 64) as usize..((zo + 256) / 64) as usize;
        rig.mem.drain_but(1, |i| payload.contains(&i));
        declare_dead(&s0, 1)?;
        env.step()?;
        n0.recover(0)?;
        // Node 2's blocks: one of them takes the place node 1's had.
        let mut keys = Vec::new();
        for i in 0..8u64 {
            let k = Key { lo: 0xb00 + i, hi: 0xb2 };
            keys.push(k);
            if put_byte(&n2, k, 0xb2)?.off == zo {
                break;
            }
            if i == 7 {
                out.push(format!("{NAME}: no block of node 2 took the place of node 1's ({zo})"));
            }
        }
        let _ = go_tx.send(());
        let _ = t.join();
        let mut buf = [0u8; 256];
        for k in &keys {
            match n2.get(NS, *k, &mut buf) {
                Ok(256) if buf.iter().all(|&x| x == 0xb2) => {}
                r => out.push(format!("{NAME}: node 2's block {:#x} reads {r:?}, first bytes {:?}", k.lo, &buf[..4])),
            }
        }
        Ok(())
    })?;
    Ok(out)
}
