//! Steered scenarios: short, deterministic runs that put the protocol into
//! one named interleaving on purpose — a process stopped between two
//! instructions, a sibling's store seen through the shared cache before it
//! lands, a host declared dead that wakes up — instead of hoping a seed
//! reaches it. Each scenario drives core's real code over [`SimMemory`]
//! with lazy caches (nothing moves unless the protocol moves it) and a yield
//! hook that acts at a named coherence call; it reports violations of the
//! invariants it checks, so a disabled site (`--disable`) or a logic mutant
//! it covers makes it fail. `cxlkv-sim scenario` runs them; the mutant
//! checks run them before any seed.

use std::sync::{Arc, Mutex};

use cxlkv_core::check::{check, scratch_words, FindingKind};
use cxlkv_core::coherence::{Coherence, Coherent, Site};
use cxlkv_core::format::format;
use cxlkv_core::layout::{LockSlot, NodeInfo, NODE_ALIVE};
use cxlkv_core::lock::{LeaseConfig, Manager};
use cxlkv_core::mem::View;
use cxlkv_core::node::{attach_node, Identity, Node, NodeLocal};
use cxlkv_core::store::{attach, NodeEnv, Store};
use cxlkv_core::{Error, Result};

use crate::harness::{sim_caps, SIM_BYTES};
use crate::memory::{SimCoherence, SimConfig, SimMemory};

/// One named scenario.
pub struct Scenario {
    /// Its name (`cxlkv-sim scenario NAME`).
    pub name: &'static str,
    /// The interleaving it steers into, in a line.
    pub what: &'static str,
    run: fn(Option<&'static str>) -> Result<Vec<String>>,
}

impl Scenario {
    /// Runs the scenario with coherence site `disable` switched off (a
    /// mutant; logic mutants are switched globally). Returns the violations
    /// found; an error of the run itself is one.
    ///
    /// A scenario that gives no verdict within [`SCENARIO_DEADLINE`] is a
    /// violation too (a wait that never ends); its thread is left behind.
    pub fn run(&self, disable: Option<&'static str>) -> Vec<String> {
        let (tx, rx) = std::sync::mpsc::channel();
        let (f, name) = (self.run, self.name);
        let spawned = std::thread::Builder::new().name(format!("scenario {name}")).spawn(move || {
            let _ = tx.send(f(disable));
        });
        if let Err(e) = spawned {
            return vec![format!("{name}: could not start: {e}")];
        }
        match rx.recv_timeout(SCENARIO_DEADLINE) {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => vec![format!("{name}: the run failed: {e}")],
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                vec![format!("{name}: no verdict within {}s: a wait that never ends", SCENARIO_DEADLINE.as_secs())]
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => vec![format!("{name}: the run panicked")],
        }
    }
}

/// How long a scenario may run (each takes milliseconds).
pub const SCENARIO_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// Every steered scenario.
pub fn scenarios() -> &'static [Scenario] {
    &[
        Scenario {
            name: "release-seen-early",
            what: "a holder's IDLE sits in its host's cache, unwritten, when that host's manager reads it and grants \
                   the lock to another host",
            run: release_seen_early,
        },
        Scenario {
            name: "fenced-withdrawal",
            what: "a node gives up waiting for a lock, is declared dead and freed while it withdraws, and no live \
                   node runs a manager to answer its withdrawal",
            run: fenced_withdrawal,
        },
        Scenario {
            name: "fenced-request",
            what: "a node waiting for a lock is declared dead and freed; no manager step drops its request",
            run: fenced_request,
        },
        Scenario {
            name: "waiter-attached-mid-step",
            what: "a node attaches and asks for a lock after a full manager step read it FREE, before that step \
                   reads its request",
            run: waiter_attached_mid_step,
        },
        Scenario {
            name: "grant-seen-before-its-line",
            what: "a grant to recovery lands before the lock line it rewrote, recovery repairs the line meanwhile, \
                   and the manager's line lands after",
            run: grant_seen_before_its_line,
        },
        Scenario {
            name: "free-cut-after-its-map",
            what: "a process freeing another live node's raw block dies after the chunk's map reached memory, \
                   before its record did; recovery must take the map's word",
            run: free_cut_after_its_map,
        },
        Scenario {
            name: "eviction-cut-before-its-record",
            what: "an evictor dies after removing a block from the index and before logging the removal; a \
                   reader of the change log must learn of it after recovery",
            run: eviction_cut_before_its_record,
        },
        Scenario {
            name: "new-incarnation-old-beat",
            what: "a node detaches and its successor attaches between two liveness scans of a manager, whose next \
                   scan reads the new ALIVE beside the predecessor's last heartbeat, not yet overwritten",
            run: new_incarnation_old_beat,
        },
        Scenario {
            name: "detach-while-recovery-holds",
            what: "a process detaches its node while another of its threads (an automatic recovery) holds a \
                   stripe lock in the node's name",
            run: detach_while_recovery_holds,
        },
        Scenario {
            name: "root-put-elsewhere",
            what: "a host that read a root missing frees it after another host put it",
            run: root_put_elsewhere,
        },
        Scenario {
            name: "late-line-over-a-newer-claim",
            what: "a stalled manager's renewal lands over a newer claimant's line: only the newer claim grants",
            run: late_line_over_a_newer_claim,
        },
        Scenario {
            name: "zombie-manager-grants-late",
            what: "a manager stops in the middle of a grant, a newer claimant takes the role over and grants the \
                   lock elsewhere, and the stopped manager wakes and writes its grant",
            run: zombie_manager_grants_late,
        },
        Scenario {
            name: "successor-reads-a-revoked-grant",
            what: "a process dies holding a lock; a manager on another host revokes it and recovery frees the \
                   node; a successor on the same host attaches as that node, its host's cache still holding the \
                   old grant",
            run: successor_reads_a_revoked_grant,
        },
        Scenario {
            name: "named-without-a-claim",
            what: "the manager line names two nodes in turn, neither holding a claim: each claims and settles first",
            run: named_without_a_claim,
        },
    ]
}

/// What an action at a coherence call gets: the call's host and site.
type Action = Box<dyn FnMut(usize, &'static str) -> bool + Send>;

/// A simulated memory with `hosts` hosts and lazy caches, its region formatted
/// by host 0 with room for `nodes` nodes, and a hook that runs the current
/// action (if any) at every coherence call until the action returns true.
struct Rig {
    mem: Arc<SimMemory>,
    action: Arc<Mutex<Option<Action>>>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        // An action may hold the memory (whose hook holds the action).
        *self.action.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

impl Rig {
    fn new(hosts: usize, nodes: usize, disable: Option<&'static str>) -> Result<Rig> {
        let mem = Arc::new(SimMemory::new(SIM_BYTES, hosts, 1, SimConfig::lazy()));
        format(mem.view(0), mem.host(0), sim_caps(nodes), 1)?;
        mem.drain(0);
        mem.disable(disable);
        let action: Arc<Mutex<Option<Action>>> = Arc::new(Mutex::new(None));
        let a = action.clone();
        mem.set_yield_hook(Box::new(move |h, site| {
            // Taken out while it runs: what it calls makes coherence calls
            // of its own, which pass by it.
            let taken = a.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(mut f) = taken {
                if !f(h, site) {
                    let mut slot = a.lock().unwrap_or_else(|p| p.into_inner());
                    if slot.is_none() {
                        *slot = Some(f);
                    }
                }
            }
        }));
        Ok(Rig { mem, action })
    }

    fn store(&self, h: usize) -> Result<Store<SimCoherence<'_>>> {
        attach(self.mem.view(h), self.mem.host(h))
    }

    /// Host 0's and host 1's stores, with node 0 attached on host 0 and
    /// node 1 on host 1.
    fn two_hosts_one_node_each(&self) -> Result<(Store<SimCoherence<'_>>, Store<SimCoherence<'_>>)> {
        let (s0, s1) = (self.store(0)?, self.store(1)?);
        attach_as(&s0, 0, 0)?;
        attach_as(&s1, 1, 1)?;
        Ok((s0, s1))
    }

    /// Host `h`'s cache as a view (stores there are that host's stores).
    fn cache(&self, h: usize) -> View {
        self.mem.view(h)
    }

    /// Runs `f` at coherence calls from now on, until it returns true.
    fn at_calls(&self, f: impl FnMut(usize, &'static str) -> bool + Send + 'static) {
        *self.action.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(f));
    }

    /// Findings of `check` on memory itself (what a host reads after
    /// invalidating everything; what a crash of every host would leave).
    fn memory_findings(&self) -> Result<Vec<FindingKind>> {
        let st = attach(self.mem.shared_region(), Coherent)?;
        let mut scratch = vec![0u64; scratch_words(&st)];
        let mut out = Vec::new();
        check(&st, &mut scratch, &mut |f| out.push(f.kind))?;
        Ok(out)
    }
}

/// Attaches node `id` through `store` (a host's view), as a process of host
/// `host` would.
fn attach_as<C: Coherence>(store: &Store<C>, id: u32, host: u64) -> Result<u32> {
    attach_node(store, Some(id), Identity { pid: 100 + id, host_id: host + 1, pid_ns: 0, nonce: 1 + id as u64, now: 0 })
}

/// Declares node `n` dead through `store` (its info DEAD, as the manager's
/// liveness scan writes it); the manager's next step revokes its locks.
fn declare_dead(store: &Store<SimCoherence<'_>>, n: u32) -> Result<()> {
    let off = store.layout.node_info(n);
    let mut info: NodeInfo = store.fresh_state_first(off, Site("steer.info"))?;
    info.state = cxlkv_core::layout::NODE_DEAD;
    store.publish_state_last(off, &info, Site("steer.dead"))?;
    store.co.store_fence(Site("steer.dead.fence"));
    Ok(())
}

/// A node environment whose waits step one lock manager inline (running on
/// its own host's view), so one thread plays every process; nobody is ever
/// declared dead unless a scenario says so.
struct StepEnv<'a> {
    store: &'a Store<SimCoherence<'a>>,
    mgr: spin::Mutex<Manager>,
    now: spin::Mutex<u64>,
    cfg: LeaseConfig,
}

impl<'a> StepEnv<'a> {
    fn new(store: &'a Store<SimCoherence<'a>>, me: u32) -> StepEnv<'a> {
        StepEnv::with_lease(store, me, LeaseConfig { lease: u64::MAX / 4, settle: 0 })
    }

    /// Steps node `me`'s manager with this lease and settle, one tick a
    /// step (a manager whose lease stands still for `lease` steps takes
    /// the role over).
    fn with_lease(store: &'a Store<SimCoherence<'a>>, me: u32, cfg: LeaseConfig) -> StepEnv<'a> {
        StepEnv { store, mgr: spin::Mutex::new(Manager::new(me)), now: spin::Mutex::new(0), cfg }
    }

    fn step(&self) -> Result<()> {
        let now = {
            let mut t = self.now.lock();
            *t += 1;
            *t
        };
        let probe = |_: u32, _: &NodeInfo| None;
        self.mgr.lock().step(self.store, now, self.cfg, &probe).map(|_| ())
    }
}

impl NodeEnv for StepEnv<'_> {
    fn local_lock(&self, _lock: u32) -> Result<()> {
        Ok(())
    }
    fn local_unlock(&self, _lock: u32) {}
    fn wait(&self, iteration: u32) -> Result<()> {
        if iteration > 10_000 {
            return Err(Error::Timeout);
        }
        self.step()
    }
    fn withdrawal_expired(&self, iteration: u32) -> bool {
        iteration > 10_000
    }
}

/// Host 0 runs the lock manager (node 0) and node 1, which holds a lock;
/// node 2 on host 1 asks for it. The manager's step invalidates the lock
/// line and node 1's slot, and while it invalidates node 2's, node 1 stores
/// its release (IDLE) — stopped there, before its own write-back. The
/// manager then loads node 1's slot through the cache it shares with node 1,
/// sees IDLE, and grants node 2. Memory must never show both grants: a crash
/// of host 0 would leave node 1's old grant LOCKED, and its revocation would
/// give the lock to recovery while node 2 holds it (seed 51 of
/// `run --hosts 4 --ops 200 --crash-odd --lazy` found this).
fn release_seen_early(disable: Option<&'static str>) -> Result<Vec<String>> {
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
    let slot1 = s0.layout.lock_slot(LOCK, 1);
    let cache0 = rig.cache(0);
    let fired = Arc::new(Mutex::new(false));
    let f2 = fired.clone();
    // The manager's batch for the lock: its line, node 1's slot, node 2's.
    let mut calls = 0;
    rig.at_calls(move |h, site| {
        match (h, site) {
            (0, "mgr.line") => calls = 0,
            (0, "mgr.lock") => calls += 1,
            _ => {}
        }
        if calls < 3 {
            return false;
        }
        // Node 1's unlock up to its write-back: the IDLE store alone.
        let _ = cache0.write(slot1, &LockSlot::default());
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

/// Node 1 gives up on a lock node 0 holds (its environment's deadline);
/// as it withdraws it is freed, and no manager runs any more: its CANCEL
/// is never answered. It must learn it is fenced from the region and
/// return `Revoked` (seed 129 of `run --hosts 3 --ops 80 --lazy` waited for
/// ever here).
fn fenced_withdrawal(disable: Option<&'static str>) -> Result<Vec<String>> {
    let _ = disable;
    fenced_case("fenced-withdrawal", 3, Phase::Alone)
}

/// Node 1 waits for a lock node 0 holds and is freed meanwhile; no manager
/// step drops its request (only full steps read a freed node's bell). It
/// must learn it is fenced before its deadline.
fn fenced_request(disable: Option<&'static str>) -> Result<Vec<String>> {
    let _ = disable;
    fenced_case("fenced-request", FENCED_WAITS + 2, Phase::Asking { n: 0 })
}

/// A full manager step (the first after a takeover) reads every node's info:
/// node 1 is FREE. Then, as the step reads the doorbells, node 1 attaches
/// on host 1 and asks for a free lock. The step finds the request of a node
/// that was not ALIVE at its scan and must read its info afresh: it is
/// ALIVE now, and is granted (a stale read would drop a live node's request
/// as a stranger's, and its lock call would fail with `Revoked`).
fn waiter_attached_mid_step(disable: Option<&'static str>) -> Result<Vec<String>> {
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
    rig.at_calls(move |h, site| {
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
fn grant_seen_before_its_line(disable: Option<&'static str>) -> Result<Vec<String>> {
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
    rig.at_calls(move |h, site| {
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

/// Host 0 runs the manager; node 1 on host 1 beats, is seen, detaches and
/// attaches again (a restarted process), all between two liveness scans,
/// the second more than a lease after the last beat it saw. Attach writes
/// the heartbeat line before ALIVE with no fence between, so the scan may
/// read the new ALIVE while memory still holds the predecessor's last beat
/// (steered here by putting that line back in memory until the scan has
/// run). The successor is live: it must not be declared dead (seed 40027 of
/// `run --hosts 4 --ops 80 --lazy` found this: a killed process's
/// successor, declared dead 1,200 steps after it attached).
fn new_incarnation_old_beat(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LEASE: u64 = 10;
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let cfg = LeaseConfig { lease: LEASE, settle: 0 };
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
fn detach_while_recovery_holds(disable: Option<&'static str>) -> Result<Vec<String>> {
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

/// Host 1 looks for root `r` and finds none (its cache keeps the empty
/// record); host 0 puts `r` naming a block; host 1 then frees `r` with
/// `root_free`, which must find it (the scan reads each record afresh).
fn root_put_elsewhere(disable: Option<&'static str>) -> Result<Vec<String>> {
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n1) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s1, 1, &env, &l1)?);
    let mut out = Vec::new();
    if cxlkv_core::roots::get(&s1, b"r") != Err(Error::NotFound) {
        out.push("root-put-elsewhere: a root named before any put".to_string());
    }
    let off = n0.alloc(256)?;
    n0.root_put(b"r", cxlkv_core::roots::Root { offset: off, size: 256, tag: 0 })?;
    match n1.root_free(b"r") {
        Ok(root) if root.offset == off => {}
        other => out.push(format!("root-put-elsewhere: host 1's root_free of a root host 0 put gave {other:?}")),
    }
    if cxlkv_core::roots::get(&s0, b"r") != Err(Error::NotFound) {
        out.push("root-put-elsewhere: the root is still there after root_free".to_string());
    }
    Ok(out)
}

/// Unwinds a process stopped for good inside a call (a crash).
struct Died;

/// Node 0 allocates two raw blocks; node 1, on another host, frees one of
/// them (under node 0's heap lock) and dies inside the free: the chunk's
/// map words reached memory, its record's new counts did not (they stay in
/// host 1's cache, which nothing writes back). Node 1 is declared dead, its
/// locks revoked; node 0 recovers. Node 0 lives, so its raw chunk is not
/// re-derived: but the map is the state of record, and the record must be
/// made to agree with it (`check` clean), not trusted.
fn free_cut_after_its_map(disable: Option<&'static str>) -> Result<Vec<String>> {
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n1) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s1, 1, &env, &l1)?);
    let a = n0.alloc(1000)?;
    let _b = n0.alloc(1000)?;
    let mem = rig.mem.clone();
    rig.at_calls(move |h, site| {
        if (h, site) != (1, "alloc.free.publish") {
            return false;
        }
        // The map's write-back (queued at its flush) lands; the record,
        // stored just now, stays in host 1's cache; node 1 dies here.
        mem.drain(1);
        std::panic::resume_unwind(Box::new(Died));
    });
    let cut = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| n1.free(a)));
    let mut out = Vec::new();
    match cut {
        Err(p) if p.is::<Died>() => {}
        other => {
            out.push(format!("free-cut-after-its-map: node 1's free was not cut where intended: {:?}", other.ok()));
            return Ok(out);
        }
    }
    // Node 1 is declared dead; the manager revokes what it held.
    declare_dead(&s0, 1)?;
    env.step()?;
    let rep = n0.recover(0)?;
    if rep.nodes_freed != 1 << 1 {
        out.push(format!("free-cut-after-its-map: recovery freed nodes {:b}, not node 1", rep.nodes_freed));
    }
    let left = rig.memory_findings()?;
    if !left.is_empty() {
        out.push(format!(
            "free-cut-after-its-map: after recovery the region has findings {left:?}: the chunk record was trusted \
             over its map"
        ));
    }
    Ok(out)
}

/// Node 1 (host 1) publishes a block; a router-like reader on host 0 reads
/// the change log and holds it as stored. Node 1 then evicts it and dies
/// after the index dropped it (entry EVICTING and bucket deleted, written
/// back) and before its removal record reached memory. Recovery empties
/// the entry without logging it; the reader, reading on, must meet a gap
/// (and rescan), never go on believing the block is stored.
fn eviction_cut_before_its_record(disable: Option<&'static str>) -> Result<Vec<String>> {
    use cxlkv_core::changes::{Change, Tail};
    use cxlkv_core::hash::Key;
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n1) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s1, 1, &env, &l1)?);
    let key = Key { lo: 0x1234_5678_9abc_def1, hi: 7 };
    let h = n1.reserve(1, key, 256, 16)?;
    n1.publish(&h)?;
    // The reader: every stripe's log from the start, into a replica.
    let stripes = s0.layout.caps.n_stripes;
    let mut cursor = vec![0u64; stripes as usize];
    let mut replica: Vec<Vec<Key>> = vec![Vec::new(); stripes as usize];
    let mut buf = [Change::default(); 16];
    let mut out = Vec::new();
    let mut read_all = |cursor: &mut Vec<u64>, replica: &mut Vec<Vec<Key>>, out: &mut Vec<String>| -> Result<()> {
        for st in 0..stripes {
            match s0.read_changes(st, cursor[st as usize], &mut buf)? {
                Tail::Read { n } => {
                    for c in &buf[..n] {
                        cursor[st as usize] = c.seq;
                        let r = &mut replica[st as usize];
                        if c.stored {
                            r.push(c.key);
                        } else {
                            r.retain(|k| *k != c.key);
                        }
                    }
                }
                Tail::Gap { resume } => {
                    // Rescan the stripe, then read on from `resume`.
                    let mut now = Vec::new();
                    s0.scan_stored(st, |_, k, _, _| now.push(k))?;
                    replica[st as usize] = now;
                    cursor[st as usize] = resume;
                    out.push(String::new());
                }
            }
        }
        Ok(())
    };
    read_all(&mut cursor, &mut replica, &mut out)?;
    out.clear();
    if !replica.iter().any(|r| r.contains(&key)) {
        return Ok(vec!["eviction-cut-before-its-record: the reader never saw the block stored".to_string()]);
    }
    let mem = rig.mem.clone();
    rig.at_calls(move |h, site| {
        if (h, site) != (1, "changes.record.write") {
            return false;
        }
        // What the eviction wrote back so far lands; the removal record
        // does not; node 1 dies here.
        mem.drain(1);
        std::panic::resume_unwind(Box::new(Died));
    });
    let cut =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| n1.evict(u64::MAX, &mut cxlkv_core::index::Lru)));
    if !matches!(cut, Err(ref p) if p.is::<Died>()) {
        return Ok(vec!["eviction-cut-before-its-record: the eviction was not cut where intended".to_string()]);
    }
    declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    read_all(&mut cursor, &mut replica, &mut out)?;
    let mut stored = Vec::new();
    for st in 0..stripes {
        s0.scan_stored(st, |_, k, _, _| stored.push(k))?;
    }
    let mut v = Vec::new();
    if replica.iter().any(|r| r.contains(&key)) && !stored.contains(&key) {
        v.push(format!(
            "eviction-cut-before-its-record: after recovery the reader still holds the block as stored (gaps met: \
             {}), though the index dropped it",
            out.len()
        ));
    }
    Ok(v)
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
fn late_line_over_a_newer_claim(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LEASE: u64 = 20;
    const SETTLE: u64 = 3;
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let cfg = LeaseConfig { lease: LEASE, settle: SETTLE };
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
fn named_without_a_claim(disable: Option<&'static str>) -> Result<Vec<String>> {
    const SETTLE: u64 = 3;
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let cfg = LeaseConfig { lease: 1000, settle: SETTLE };
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
fn zombie_manager_grants_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LOCK: u32 = 0;
    // Node 1's manager finds a lease stale after 20 steps of its own; node
    // 0's declares nobody dead within the scenario (no heartbeat moves).
    let cfg = LeaseConfig { lease: 20, settle: 3 };
    let cfg0 = LeaseConfig { lease: 1 << 40, settle: 3 };
    let rig = Rig::new(2, 3, disable)?;
    let s0 = rig.store(0)?;
    attach_as(&s0, 0, 0)?;
    attach_as(&rig.store(1)?, 1, 1)?;
    attach_as(&s0, 2, 0)?;
    // Node 1's lock, taken while node 0 is stopped: its ticket, or the error.
    let got: Arc<Mutex<Option<Result<u64>>>> = Arc::new(Mutex::new(None));
    let g2 = got.clone();
    let mem = rig.mem.clone();
    rig.at_calls(move |h, site| {
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

/// Node 0 (host 0) is granted lock 0 by its own manager: host 0's cache
/// holds the LOCKED slot. Its process dies holding it; node 1's manager
/// (host 1) takes the role over, revokes the grant in memory and node 1's
/// recovery frees node 0. A successor process on host 0 attaches as node 0:
/// it holds nothing, and its detach must say so (not `Busy` from the old
/// grant its host's cache still shows).
fn successor_reads_a_revoked_grant(disable: Option<&'static str>) -> Result<Vec<String>> {
    const LOCK: u32 = 0;
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let env0 = StepEnv::new(&s0, 0);
    let env1 = StepEnv::new(&s1, 1);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let n0 = Node::new(&s0, 0, &env0, &l0)?;
    let held = n0.lock(LOCK)?;
    // The process dies holding the lock (node 0's handle is not used again).
    drop(held);
    declare_dead(&s1, 0)?;
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
    if let Err(e) = n0b.detach() {
        out.push(format!("successor-reads-a-revoked-grant: the new node 0 cannot detach: {e}"));
    }
    Ok(out)
}
