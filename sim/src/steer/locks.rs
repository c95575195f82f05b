//! Scenarios of the lock protocol: releases, grants and requests seen through
//! shared caches, fenced requesters and withdrawals.

use std::sync::{mpsc, Arc, Mutex};

use cxlkv_core::check::FindingKind;
use cxlkv_core::coherence::{Coherence, Coherent, Site};
use cxlkv_core::layout::{LockSlot, NodeInfo, NODE_ALIVE};
use cxlkv_core::lock::Manager;
use cxlkv_core::node::{Node, NodeLocal};
use cxlkv_core::store::{attach, NodeEnv};
use cxlkv_core::{Error, Result};

use super::{attach_as, declare_dead, Rig, StepEnv};

/// Host 0 runs the lock manager (node 0) and node 1, which holds a lock;
/// node 2 on host 1 asks for it. The manager's step invalidates the lock
/// line and node 1's slot, and while it invalidates node 2's, node 1 stores
/// its release (IDLE) — stopped there, before its own write-back. The
/// manager then loads node 1's slot through the cache it shares with node 1,
/// sees IDLE, and grants node 2. Memory must never show both grants: a crash
/// of host 0 would leave node 1's old grant LOCKED, and its revocation would
/// give the lock to recovery while node 2 holds it (seed 51 of
/// `run --hosts 4 --ops 200 --crash-odd --lazy` found this).
pub(super) fn release_seen_early(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LOCK: u32 = 0;
    let rig = Rig::new(2, 3, disable)?;
    let (s0, s1) = (rig.store(0)?, rig.store(1)?);
    attach_as(&s0, 0, 0)?;
    attach_as(&s0, 1, 0)?;
    attach_as(&s1, 2, 1)?;
    let env = StepEnv::new(&s0, 0);
    let (l1, l2) = (NodeLocal::default(), NodeLocal::default());
    let (n1, n2) = (Node::new(&s0, 1, &env, &l1)?, Node::new(&s1, 2, &env, &l2)?);
    let held = n1.lock(LOCK)?;
    let ticket = held.seq;
    let slot1 = s0.layout.lock_slot(LOCK, 1);
    let cache0 = rig.cache(0);
    let fired = Arc::new(Mutex::new(false));
    let f2 = fired.clone();
    // The manager's batch for the lock: its line, node 1's slot, node 2's.
    let mut calls = 0;
    rig.at_calls(0, move |h, site| {
        match (h, site) {
            (0, "mgr.line") => calls = 0,
            (0, "mgr.lock") => calls += 1,
            _ => {}
        }
        if calls < 3 {
            return false;
        }
        // Node 1's unlock up to its write-back: the IDLE store alone (a
        // release carries the ticket it gives back).
        let _ = cache0.write(slot1, &LockSlot { seq: ticket, ..LockSlot::default() });
        *f2.lock().unwrap_or_else(|p| p.into_inner()) = true;
        true
    });
    let granted = n2.lock(LOCK)?;
    let mut out = Vec::new();
    if !*fired.lock().unwrap_or_else(|p| p.into_inner()) {
        out.push("release-seen-early: the manager's batch never reached node 2's slot".to_string());
        return Ok(out);
    }
    if rig.memory_findings()?.contains(&FindingKind::TwoHolders) {
        out.push(format!(
            "release-seen-early: memory shows node 1's released grant (seq {}) LOCKED beside node 2's (seq {}): a \
             crash of host 0 now hands the lock to recovery while node 2 holds it",
            held.seq, granted.seq
        ));
    }
    // Node 1's unlock completes (its write-back), node 2 releases: clean.
    s0.co.flush(&s0.view, slot1, 64, Site("steer.release"))?;
    s0.co.store_fence(Site("steer.release.fence"));
    n2.unlock(granted)?;
    let left = rig.memory_findings()?;
    if !left.is_empty() {
        out.push(format!("release-seen-early: findings after both released: {left:?}"));
    }
    Ok(out)
}

/// What [`FencedEnv`] does at each wait.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// Waits step the manager; the `n`th of them gives up (`Timeout`).
    Asking { n: u32 },
    /// Nobody steps a manager any more (every other node left); waits just
    /// count, and the environment never says the node is fenced (its
    /// heartbeat thread is gone).
    Alone,
}

/// A node environment for the fencing scenarios: waits step the manager
/// while the scenario wants them to, then nothing answers; the node is
/// freed (as recovery frees a dead node) at the first wait of `free_at`.
struct FencedEnv<'a> {
    inner: StepEnv<'a>,
    phase: spin::Mutex<Phase>,
    waits: spin::Mutex<u32>,
    free_at: Phase,
    node: u32,
    freed: spin::Mutex<bool>,
}

/// Waits a fenced node may spend before it must have learnt it is fenced.
const FENCED_WAITS: u32 = 10_000;

impl FencedEnv<'_> {
    /// Frees node `self.node`'s slot through the manager's host, as a
    /// recovery that declared it dead would.
    fn free_node(&self) -> Result<()> {
        let st = self.inner.store;
        let off = st.layout.node_info(self.node);
        let mut info: NodeInfo = st.fresh_state_first(off, Site("steer.info"))?;
        if info.state != NODE_ALIVE {
            return Ok(());
        }
        info = NodeInfo { incarnation: info.incarnation, ..NodeInfo::default() };
        st.publish_state_last(off, &info, Site("steer.free"))?;
        st.co.store_fence(Site("steer.free.fence"));
        *self.freed.lock() = true;
        Ok(())
    }
}

impl NodeEnv for FencedEnv<'_> {
    fn local_lock(&self, _lock: u32) -> Result<()> {
        Ok(())
    }
    fn local_unlock(&self, _lock: u32) {}
    fn wait(&self, _iteration: u32) -> Result<()> {
        let phase = *self.phase.lock();
        let first = {
            let mut w = self.waits.lock();
            *w += 1;
            *w == 1
        };
        if first && std::mem::discriminant(&phase) == std::mem::discriminant(&self.free_at) {
            self.free_node()?;
        }
        match phase {
            Phase::Asking { n } => {
                if *self.waits.lock() >= n {
                    *self.phase.lock() = Phase::Alone;
                    *self.waits.lock() = 0;
                    return Err(Error::Timeout);
                }
                self.inner.step()
            }
            Phase::Alone => {
                if *self.waits.lock() > FENCED_WAITS {
                    return Err(Error::Timeout);
                }
                Ok(())
            }
        }
    }
    fn withdrawal_expired(&self, _iteration: u32) -> bool {
        *self.waits.lock() > FENCED_WAITS
    }
}

/// Node 0 holds a lock; node 1 on another host asks for it with `env`
/// (whose phases say when it gives up, when it is freed and when managers
/// stop). The call must end with `Revoked` before the environment's
/// watchdog: a fenced node never waits for an answer it cannot get.
fn fenced_case(name: &str, asking: u32, free_at: Phase) -> Result<Vec<String>> {
    const LOCK: u32 = 1;
    let rig = Rig::new(2, 2, None)?;
    let (s0, s1) = (rig.store(0)?, rig.store(1)?);
    attach_as(&s0, 0, 0)?;
    attach_as(&s1, 1, 1)?;
    let env0 = StepEnv::new(&s0, 0);
    let l0 = NodeLocal::default();
    let n0 = Node::new(&s0, 0, &env0, &l0)?;
    let held = n0.lock(LOCK)?;
    let env1 = FencedEnv {
        inner: StepEnv::new(&s0, 0),
        phase: spin::Mutex::new(Phase::Asking { n: asking }),
        waits: spin::Mutex::new(0),
        free_at,
        node: 1,
        freed: spin::Mutex::new(false),
    };
    // The manager's state so far is node 0's: carry it over.
    *env1.inner.mgr.lock() = std::mem::replace(&mut *env0.mgr.lock(), Manager::new(0));
    *env1.inner.now.lock() = *env0.now.lock();
    let l1 = NodeLocal::default();
    let n1 = Node::new(&s1, 1, &env1, &l1)?;
    let r = n1.lock(LOCK);
    let mut out = Vec::new();
    if !*env1.freed.lock() {
        out.push(format!("{name}: the node was never freed (the scenario did not reach its point)"));
    } else if r != Err(Error::Revoked)
        || std::mem::discriminant(&*env1.phase.lock()) != std::mem::discriminant(&free_at)
    {
        out.push(format!(
            "{name}: a node freed while it waited got {r:?} after {} waits (phase {:?}), not Revoked at once: \
             it waited for an answer no manager gives",
            *env1.waits.lock(),
            *env1.phase.lock()
        ));
    }
    *env0.mgr.lock() = std::mem::replace(&mut *env1.inner.mgr.lock(), Manager::new(0));
    n0.unlock(held)?;
    Ok(out)
}

/// Node 1's environment in [`withdrawal_finds_a_grant`]: its first wait
/// says it asked and gives up when told; its second (the withdrawal's, its
/// CANCEL in memory) says so and goes on when told; later ones step the
/// manager.
struct WithdrawsOnCue<'a> {
    inner: &'a StepEnv<'a>,
    waits: spin::Mutex<u32>,
    asked: Mutex<mpsc::Sender<()>>,
    give_up: Mutex<mpsc::Receiver<()>>,
    cancelled: Mutex<mpsc::Sender<()>>,
    go: Mutex<mpsc::Receiver<()>>,
}

impl NodeEnv for WithdrawsOnCue<'_> {
    fn local_lock(&self, _lock: u32) -> Result<()> {
        Ok(())
    }
    fn local_unlock(&self, _lock: u32) {}
    fn wait(&self, _iteration: u32) -> Result<()> {
        let n = {
            let mut w = self.waits.lock();
            *w += 1;
            *w
        };
        match n {
            1 => {
                let _ = held(&self.asked).send(());
                let _ = held(&self.give_up).recv();
                Err(Error::Timeout)
            }
            2 => {
                let _ = held(&self.cancelled).send(());
                let _ = held(&self.go).recv();
                Ok(())
            }
            _ => self.inner.step(),
        }
    }
    fn withdrawal_expired(&self, _iteration: u32) -> bool {
        *self.waits.lock() > FENCED_WAITS
    }
}

/// `m` locked, whether or not a holder panicked.
fn held<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits for `rx`; false when thread `t` ended first.
fn heard<T>(rx: &mpsc::Receiver<()>, t: &std::thread::ScopedJoinHandle<'_, T>) -> bool {
    loop {
        match rx.recv_timeout(std::time::Duration::from_millis(5)) {
            Ok(()) => return true,
            Err(mpsc::RecvTimeoutError::Timeout) if !t.is_finished() => {}
            Err(_) => return false,
        }
    }
}

/// Node 1 (host 1) asks for a free lock. The manager's step reads the
/// request and stores the grant, and stops before writing it back; node 1
/// gives up meanwhile, and its CANCEL reaches memory first; then the grant
/// lands over it, and node 1's withdrawal finds LOCKED in its slot. It must
/// give the lock back (a release), or the lock stays with a node that no
/// longer asks for it and every later request waits for ever. Node 0 then
/// takes and releases the lock.
pub(super) fn withdrawal_finds_a_grant(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "withdrawal-finds-a-grant";
    const LOCK: u32 = 1;
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    // The manager's claim: its next step grants.
    env.step()?;
    let (asked_tx, asked_rx) = mpsc::channel();
    let (give_up_tx, give_up_rx) = mpsc::channel();
    let (cancelled_tx, cancelled_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let cue = WithdrawsOnCue {
        inner: &env,
        waits: spin::Mutex::new(0),
        asked: Mutex::new(asked_tx),
        give_up: Mutex::new(give_up_rx),
        cancelled: Mutex::new(cancelled_tx),
        go: Mutex::new(go_rx),
    };
    let mut out = Vec::new();
    std::thread::scope(|sc| -> Result<()> {
        let t = sc.spawn(|| {
            let l1 = NodeLocal::default();
            let n1 = Node::new(&s1, 1, &cue, &l1)?;
            n1.lock(LOCK).map(|_| ())
        });
        if !heard(&asked_rx, &t) {
            out.push(format!("{NAME}: node 1's request ended before its first wait"));
            return Ok(());
        }
        let (stopped_rx, go_mgr) = rig.parks_at(0, "mgr.grant");
        let m = sc.spawn(|| env.step());
        if !heard(&stopped_rx, &m) {
            out.push(format!("{NAME}: the manager's step ended without granting"));
            let _ = give_up_tx.send(());
            let _ = go_tx.send(());
            return Ok(());
        }
        let _ = give_up_tx.send(());
        if !heard(&cancelled_rx, &t) {
            out.push(format!("{NAME}: node 1's withdrawal ended before it polled twice"));
            drop(go_mgr);
            return Ok(());
        }
        // The grant lands over the CANCEL.
        drop(go_mgr);
        m.join().unwrap_or(Err(Error::Corrupt))?;
        let _ = go_tx.send(());
        match t.join().unwrap_or(Err(Error::Corrupt)) {
            Err(Error::Timeout) => {}
            r => out.push(format!("{NAME}: node 1's request ended with {r:?}, not Timeout")),
        }
        Ok(())
    })?;
    let slot: LockSlot = rig.mem.shared_region().read(s0.layout.lock_slot(LOCK, 1))?;
    if slot.state == cxlkv_core::layout::SLOT_LOCKED {
        out.push(format!("{NAME}: node 1 gave up and kept the grant it found withdrawing: {slot:?}"));
        return Ok(out);
    }
    let l0 = NodeLocal::default();
    let n0 = Node::new(&s0, 0, &env, &l0)?;
    let held = n0.lock(LOCK)?;
    n0.unlock(held)?;
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 1 gives up on a lock node 0 holds (its environment's deadline);
/// as it withdraws it is freed, and no manager runs any more: its CANCEL
/// is never answered. It must learn it is fenced from the region and
/// return `Revoked` (seed 129 of `run --hosts 3 --ops 80 --lazy` waited for
/// ever here).
pub(super) fn fenced_withdrawal(disable: Option<&'static str>) -> Result<Vec<String>> {
    let _ = disable;
    fenced_case("fenced-withdrawal", 3, Phase::Alone)
}

/// Node 1 waits for a lock node 0 holds and is freed meanwhile; no manager
/// step drops its request (only full steps read a freed node's bell). It
/// must learn it is fenced before its deadline.
pub(super) fn fenced_request(disable: Option<&'static str>) -> Result<Vec<String>> {
    let _ = disable;
    fenced_case("fenced-request", FENCED_WAITS + 2, Phase::Asking { n: 0 })
}

/// A full manager step (the first after a takeover) reads every node's info:
/// node 1 is FREE. Then, as the step reads the doorbells, node 1 attaches
/// on host 1 and asks for a free lock. The step finds the request of a node
/// that was not ALIVE at its scan and must read its info afresh: it is
/// ALIVE now, and is granted (a stale read would drop a live node's request
/// as a stranger's, and its lock call would fail with `Revoked`).
pub(super) fn waiter_attached_mid_step(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LOCK: u32 = 0;
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = (rig.store(0)?, rig.store(1)?);
    attach_as(&s0, 0, 0)?;
    let env = StepEnv::new(&s0, 0);
    // The claim; the next step is the new manager's first, a full one.
    env.step()?;
    let slot = s1.layout.lock_slot(LOCK, 1);
    let bells = s1.layout.requests(1);
    let s1v = rig.cache(1);
    let done = Arc::new(Mutex::new(None::<Result<()>>));
    let d2 = done.clone();
    let mem = rig.mem.clone();
    rig.at_calls(0, move |h, site| {
        if (h, site) != (0, "mgr.doorbell") {
            return false;
        }
        // Node 1 attaches and asks: its info ALIVE, its WAITING slot and
        // its doorbell reach memory (what `attach_node` and a lock
        // request do).
        let r = (|| {
            let st1 = attach(s1v, mem.host(1))?;
            attach_as(&st1, 1, 1)?;
            st1.publish_state_last(
                slot,
                &LockSlot { state: cxlkv_core::layout::SLOT_WAITING, ..LockSlot::default() },
                Site("steer.request"),
            )?;
            st1.view.fetch_or_u64(bells, 1 << LOCK)?;
            st1.co.flush(&st1.view, bells, 8, Site("steer.bell"))?;
            st1.co.store_fence(Site("steer.bell.fence"));
            Ok(())
        })();
        *d2.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        true
    });
    env.step()?;
    let mut out = Vec::new();
    match done.lock().unwrap_or_else(|p| p.into_inner()).take() {
        None => out.push("waiter-attached-mid-step: the step never read the doorbells".to_string()),
        Some(Err(e)) => out.push(format!("waiter-attached-mid-step: node 1 could not attach and ask: {e}")),
        Some(Ok(())) => {}
    }
    let st = attach(rig.mem.shared_region(), Coherent)?;
    let got: LockSlot = st.view.read(slot)?;
    if got.state != cxlkv_core::layout::SLOT_LOCKED {
        out.push(format!(
            "waiter-attached-mid-step: a live node's request for a free lock ended in state {} (not granted): the \
             manager took it for a stranger's",
            got.state
        ));
    }
    Ok(out)
}

/// Node 2 holds an application lock and dies; the manager revokes it
/// (`repair` set). Node 1's recovery asks for it; the manager's grant
/// rewrites the lock line (holder, count) and then stores LOCKED in node 1's
/// slot — and host 0's cache writes the slot back at once, before the line.
/// Node 1 sees LOCKED and repairs the line (`repair` cleared, as recovery
/// does). The manager's line must already be in memory by then: landing
/// after, it would bring `repair` back, and the lock would await a repair
/// that already happened (granted to nobody but recovery, for ever).
pub(super) fn grant_seen_before_its_line(disable: Option<&'static str>) -> Result<Vec<String>> {
    let rig = Rig::new(3, 3, disable)?;
    let (s0, s1, s2) = (rig.store(0)?, rig.store(1)?, rig.store(2)?);
    attach_as(&s0, 0, 0)?;
    attach_as(&s1, 1, 1)?;
    attach_as(&s2, 2, 2)?;
    let env = StepEnv::new(&s0, 0);
    let (l1, l2) = (NodeLocal::default(), NodeLocal::default());
    let (n1, n2) = (Node::new(&s1, 1, &env, &l1)?, Node::new(&s2, 2, &env, &l2)?);
    let app = n2.lock_alloc()?;
    let lock = s0.layout.locks().app(app);
    let _held = n2.lock_app(app)?;
    // Node 2 dies: declared so (its info DEAD, as the manager's liveness
    // scan writes it), and the manager's next step revokes its lock.
    declare_dead(&s0, 2)?;
    env.step()?;
    let line_off = s0.layout.lock_line(lock);
    let slot1 = s0.layout.lock_slot(lock, 1);
    let ll: cxlkv_core::layout::LockLine = attach(rig.mem.shared_region(), Coherent)?.view.read(line_off)?;
    if ll.repair == 0 {
        return Ok(vec!["grant-seen-before-its-line: the dead holder's lock was not revoked".to_string()]);
    }
    let repaired = Arc::new(Mutex::new(None::<Result<()>>));
    let r2 = repaired.clone();
    let v1 = rig.cache(1);
    let mem = rig.mem.clone();
    rig.at_calls(0, move |h, site| {
        if (h, site) != (0, "mgr.grant") {
            return false;
        }
        // Host 0's cache writes the granted slot back before the line.
        mem.evict_line(0, (slot1 / 64) as usize);
        let r = (|| {
            // Node 1's recovery sees its grant and repairs the line, as
            // `Node::recover` does for an application lock.
            let st1 = attach(v1, mem.host(1))?;
            let s: LockSlot = st1.fresh_state_first(slot1, Site("steer.poll"))?;
            if s.state != cxlkv_core::layout::SLOT_LOCKED {
                return Err(Error::Changed);
            }
            let mut ll: cxlkv_core::layout::LockLine = st1.fresh(line_off, Site("steer.line"))?;
            ll.repair = 0;
            ll.grant_seq = ll.grant_seq.max(s.seq);
            st1.publish(line_off, &ll, Site("steer.repaired"))?;
            st1.co.store_fence(Site("steer.repaired.fence"));
            Ok(())
        })();
        *r2.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        true
    });
    let held = n1.lock_recovery(lock)?;
    let mut out = Vec::new();
    match repaired.lock().unwrap_or_else(|p| p.into_inner()).take() {
        None => out.push("grant-seen-before-its-line: the grant never ran".to_string()),
        Some(Err(e)) => out.push(format!("grant-seen-before-its-line: recovery could not repair: {e}")),
        Some(Ok(())) => {}
    }
    let ll: cxlkv_core::layout::LockLine = attach(rig.mem.shared_region(), Coherent)?.view.read(line_off)?;
    if ll.repair != 0 {
        out.push(
            "grant-seen-before-its-line: the lock awaits repair again after recovery repaired it: the grant's line \
             landed after"
                .to_string(),
        );
    }
    n1.unlock(held)?;
    Ok(out)
}

/// Node 1 (host 1) takes a lock, gives it back, takes it again, gives it
/// back and detaches. Then its first grant lands in its slot: a line a
/// manager step stored and never wrote back (the step was cut off), which
/// the host's cache evicts after the node left (seed 154006 of
/// `run --hosts 4 --ops 200 --lazy --cut-steps`). The region must check
/// clean (the grant is older than the lock's last, to a free node: nobody
/// holds by it). A node that attaches to the slot again must not inherit
/// it: the manager would take it for the holder (the lock's last grant
/// went to that slot, so this one is not void) and node 0's request would
/// wait for a release that never comes.
pub(super) fn late_grant_on_a_free_slot(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "late-grant-on-a-free-slot";
    const LOCK: u32 = 0;
    let rig = Rig::new(2, 3, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let slot1 = s1.layout.lock_slot(LOCK, 1);
    let first = n1.lock(LOCK)?;
    // The grant as the manager's step stored it (node 1 read it fresh).
    let late: LockSlot = s1.view.read(slot1)?;
    n1.unlock(first)?;
    let second = n1.lock(LOCK)?;
    let last = second.seq;
    n1.unlock(second)?;
    n1.detach()?;
    let mut out = Vec::new();
    if late.state != cxlkv_core::layout::SLOT_LOCKED || late.seq >= last {
        out.push(format!("{NAME}: the first grant is not an older LOCKED slot: {late:?}"));
        return Ok(out);
    }
    // The cut-off step's line lands.
    let mem = rig.mem.shared_region();
    mem.write(slot1, &late)?;
    let found = rig.memory_findings()?;
    if !found.is_empty() {
        out.push(format!(
            "{NAME}: with every grant released, a grant older than the lock's last in a free node's slot is \
             reported: {found:?}"
        ));
    }
    // Node 1 attaches again on host 1; node 0 asks for the lock.
    attach_as(&s1, 1, 1)?;
    let l1b = NodeLocal::default();
    let n1b = Node::new(&s1, 1, &env, &l1b)?;
    match n0.lock(LOCK) {
        Ok(g) => n0.unlock(g)?,
        Err(e) => out.push(format!(
            "{NAME}: node 0's request for a lock nobody holds ended with {e:?}: the manager took the late grant \
             in the new node 1's slot for a hold"
        )),
    }
    if let Some(lock) = n1b.held_lock()? {
        out.push(format!("{NAME}: the new node 1 counts lock {lock} held, which it never asked for"));
    }
    if let Err(e) = n1b.detach() {
        out.push(format!("{NAME}: the new node 1's detach failed: {e:?}"));
        return Ok(out);
    }
    n0.detach()?;
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node `n` takes `lock` `KEEP_AFTER` + 1 times in a row, enough for its
/// last grant to be kept past the release; false (with a finding in `out`)
/// when none was.
fn keeps_after_a_streak<C: cxlkv_core::coherence::Coherence>(
    n: &Node<'_, C>,
    lock: u32,
    name: &str,
    out: &mut Vec<String>,
) -> Result<bool> {
    for _ in 0..=cxlkv_core::lock::KEEP_AFTER {
        let g = n.lock(lock)?;
        n.unlock(g)?;
    }
    if !n.keeps_grants() {
        out.push(format!(
            "{name}: {} grants in a row to node {} and none kept",
            cxlkv_core::lock::KEEP_AFTER + 1,
            n.id
        ));
    }
    Ok(n.keeps_grants())
}

/// Node 1 (host 1) takes a lock more than `KEEP_AFTER` times in a row and keeps the last
/// grant past its release (see core's `lock.rs`, "Parked grants"). It is
/// declared dead: node 0's request makes the manager revoke the kept grant,
/// node 0's recovery repairs the lock, and node 0 takes it. Node 1 wakes
/// and asks for the lock again: its slot, read fresh, shows the grant gone,
/// so it must not take the kept one back (two holders).
pub(super) fn kept_grant_of_a_zombie(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "kept-grant-of-a-zombie";
    const LOCK: u32 = 0;
    let rig = Rig::new(2, 3, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let env = StepEnv::keeping(&s0, 0);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n1) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s1, 1, &env, &l1)?);
    let mut out = Vec::new();
    if !keeps_after_a_streak(&n1, LOCK, NAME, &mut out)? {
        return Ok(out);
    }
    declare_dead(&s0, 1)?;
    // Node 0's request: the manager revokes node 1's kept grant; the lock
    // awaits repair, which node 0's recovery makes.
    let _ = n0.lock(LOCK);
    n0.recover(0)?;
    let held = match n0.lock(LOCK) {
        Ok(g) => g,
        Err(e) => {
            out.push(format!("{NAME}: node 0 could not take the lock after recovery: {e:?}"));
            return Ok(out);
        }
    };
    // The zombie wakes and asks.
    if let Ok(g) = n1.lock(LOCK) {
        out.push(format!(
            "{NAME}: node 1, declared dead, took back its kept grant (ticket {}) while node 0 holds the lock \
             (ticket {})",
            g.seq, held.seq
        ));
    }
    if rig.memory_findings()?.contains(&FindingKind::TwoHolders) {
        out.push(format!("{NAME}: memory shows two holders of the lock"));
    }
    n0.unlock(held)?;
    Ok(out)
}

/// Node 1 (host 1) keeps a grant past its release and is declared dead;
/// the manager revokes the grant, recovery repairs the lock, and node 1's
/// slot is freed. A new node attaches to that slot on host 2 and takes the
/// lock. The old node 1 wakes before it learnt it is fenced, and its
/// background thread gives back the grant it still counts as kept: host
/// 1's cache shows the slot LOCKED with that grant, memory the successor's
/// newer one. The release must read the slot fresh and leave the
/// successor's grant alone (an IDLE over it frees a held lock: two holders
/// once node 0 asks).
pub(super) fn kept_grant_released_over_a_successor(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "kept-grant-released-over-a-successor";
    const LOCK: u32 = 0;
    let rig = Rig::new(3, 3, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let s2 = rig.store(2)?;
    let env = StepEnv::keeping(&s0, 0);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n1) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s1, 1, &env, &l1)?);
    let mut out = Vec::new();
    if !keeps_after_a_streak(&n1, LOCK, NAME, &mut out)? {
        return Ok(out);
    }
    declare_dead(&s0, 1)?;
    let _ = n0.lock(LOCK);
    n0.recover(0)?;
    // Node 1's slot freed, as recovery frees a dead node's once it is quiet.
    let off = s0.layout.node_info(1);
    let info: NodeInfo = s0.fresh_state_first(off, Site("steer.info"))?;
    if info.state != cxlkv_core::layout::NODE_FREE {
        s0.publish_state_last(
            off,
            &NodeInfo { incarnation: info.incarnation, ..NodeInfo::default() },
            Site("steer.free"),
        )?;
        s0.co.store_fence(Site("steer.free.fence"));
    }
    // The successor on host 2 takes the lock.
    attach_as(&s2, 1, 2)?;
    let l1b = NodeLocal::default();
    let n1b = Node::new(&s2, 1, &env, &l1b)?;
    let held = match n1b.lock(LOCK) {
        Ok(g) => g,
        Err(e) => {
            out.push(format!("{NAME}: the successor could not take the lock: {e:?}"));
            return Ok(out);
        }
    };
    // The old node 1's background thread, woken.
    let _ = n1.release_parks(u64::MAX);
    let slot: LockSlot = rig.mem.shared_region().read(s0.layout.lock_slot(LOCK, 1))?;
    if slot.state != cxlkv_core::layout::SLOT_LOCKED || slot.seq != held.seq {
        out.push(format!(
            "{NAME}: the old node 1 gave back its kept grant over the successor's (ticket {}): memory shows {slot:?}",
            held.seq
        ));
    }
    if let Err(e) = n1b.unlock(held) {
        out.push(format!("{NAME}: the successor's release failed: {e:?}"));
    }
    Ok(out)
}
