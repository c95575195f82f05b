//! An attached node: the mapping, the core store, the host-local lock layer,
//! and one background thread that beats the node's heartbeat and runs the
//! lock manager step (active only in the node that holds the manager lease).

mod inbox;
mod stepping;
mod threads;

use std::cell::Cell;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cxlkv_core::channel::Message;
use cxlkv_core::check::{check, scratch_words, Finding};
use cxlkv_core::coherence::Site;
use cxlkv_core::hash::Key;
use cxlkv_core::layout::{Capacities, NodeInfo, NodeStats, StripeHeader, NODE_ALIVE, NODE_DEAD, NODE_FENCED};
use cxlkv_core::lock::{Manager, StepReport};
use cxlkv_core::node::{attach_node, bury, Identity, Node as CoreNode, NodeLocal};
use cxlkv_core::recover::RecoverReport;
use cxlkv_core::store::{attach, NodeEnv, Store};
use threads::{background, beat};

use crate::error::{Error, Result};
use crate::flush::{Flush, FlushMode, PayloadStores};
use crate::gpu::state::GpuState;
use crate::host::{pid_alive, random_u64, Locality};
use crate::host_locks::{HostLocks, Owner};
use crate::map::{Mapping, Populate};
use crate::region::{Attachment, Region};
use crate::sync::{Counter, Flag};
use crate::tier::wire::RoundTrips;

/// How a node attaches and behaves.
#[derive(Clone, Debug)]
pub struct Options {
    /// Node id to claim; `None` takes the first free one.
    pub node: Option<u32>,
    /// Cache maintenance.
    pub mode: FlushMode,
    /// How payloads are written (streaming stores by default wherever the
    /// mode flushes).
    pub payload: PayloadStores,
    /// A heartbeat or manager lease silent this long means dead.
    pub lease: Duration,
    /// Wait after claiming the manager role before granting.
    pub settle: Duration,
    /// How long a node declared dead by its silence keeps its slot, its
    /// reservations, raw blocks and pins (fenced) while nothing says it is
    /// quiet: its own close, a process of its host that finds it gone, or
    /// an operator (`cxlkv recover --quiet`). After that it is taken as
    /// quiet and freed; a stopped process that wakes later may corrupt
    /// blocks reused meanwhile. `None`: never (a node that never comes back
    /// and that nobody vouches for keeps its slot). Five minutes by default:
    /// far beyond a GC pause or a VM migration, short enough that killed
    /// containers whose PID namespace no other node shares give their slots
    /// back. Every node of a region should use the same.
    pub quarantine: Option<Duration>,
    /// Give up waiting for a lock after this long.
    pub lock_timeout: Duration,
    /// Recover automatically when this node's manager declares a node dead.
    pub auto_recover: bool,
    /// Directory of the host-local lock layer file.
    pub local_dir: PathBuf,
    /// Populate this process's page tables of the region in the background
    /// after attaching ([`Mapping::populate_background`]), so reads and
    /// writes stop taking first-touch page faults.
    pub populate: bool,
    /// How long a get waits for an SSD tier to put missing blocks back.
    /// `None` follows the tier: four times the slowest of this node's last
    /// answered promotions, at least one second and at most ten (a busy
    /// drive or host answers late, and a wait shorter than its answers
    /// turns every promotion into a miss; a wait that ran out counts as a
    /// round trip that long, so a tier that fell behind is waited for
    /// longer next time).
    pub promote_wait: Option<Duration>,
}

impl Options {
    /// `InvalidArgument` for options no node can run with: a zero lease
    /// (every node would be dead at once) or a zero lock timeout (every
    /// lock would time out at once).
    pub fn validate(&self) -> Result<()> {
        if self.lease.is_zero() || self.lock_timeout.is_zero() {
            return Err(Error::Core(cxlkv_core::Error::InvalidArgument));
        }
        Ok(())
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            node: None,
            mode: FlushMode::default_for_arch(),
            payload: PayloadStores::Auto,
            lease: Duration::from_secs(2),
            settle: Duration::from_millis(50),
            quarantine: Some(Duration::from_secs(300)),
            lock_timeout: Duration::from_secs(60),
            auto_recover: true,
            local_dir: PathBuf::from("/dev/shm"),
            populate: true,
            promote_wait: None,
        }
    }
}

struct Inner {
    store: Store<Flush>,
    local: NodeLocal,
    host_locks: HostLocks,
    id: u32,
    nonce: u64,
    here: Locality,
    opts: Options,
    stop: Flag,
    fenced: Flag,
    recovering: Flag,
    /// The heartbeat thread got a raised CPU priority.
    raised_priority: Flag,
    /// The automatic recovery running or last run: joined before the node
    /// detaches (it holds locks in this node's name).
    recovery: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// When the last automatic recovery ended (ms since attach).
    recovered_at: Mutex<Option<u64>>,
    is_manager: Flag,
    /// This node's manager lives in its cell of the host-local file (any
    /// process of the host may step it); else in `mgr`.
    in_cell: Flag,
    /// The holder of this node's cell's step lock found there, and since
    /// when (see `stepping`).
    cell_busy: Mutex<Option<(u64, Instant)>>,
    /// Steps of this node's manager cut off part-way by a process that
    /// died, taken over.
    cuts: Counter,
    mgr: Mutex<Manager>,
    last: Mutex<StepReport>,
    /// Round trips of this node's answered promotions (the adaptive wait).
    promotions: Mutex<RoundTrips>,
    /// Steps of this node's lock manager made by another node of this
    /// process while it waited for a grant.
    peer_steps: Counter,
    /// Pids the manager's probe found running, and when (see
    /// [`Inner::pid_alive_lately`]).
    alive_pids: Mutex<Vec<(u32, Instant)>>,
    // Declared last: dropped after everything that points into it (other
    // nodes of this process may share the mapping).
    map: Arc<Mapping>,
}

/// How long a pid the manager's probe found running counts as running.
const PROBE_EVERY: Duration = Duration::from_millis(10);

/// Every node attached in this process: a node waiting for a grant steps
/// its region's lock manager itself when that manager is one of them.
static ATTACHED: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

/// How long a lock waiter spins before it yields: while the manager's
/// thread was awake, and when its ring woke it.
const SPIN_FOR: Duration = Duration::from_micros(5);
const SPIN_AFTER_WAKE: Duration = Duration::from_micros(2);

thread_local! {
    /// This thread's last new wait woke a sleeping manager's thread.
    static WOKE_MANAGER: Cell<bool> = const { Cell::new(false) };
    static WAIT_START: Cell<Option<Instant>> = const { Cell::new(None) };
    static WITHDRAW_START: Cell<Option<Instant>> = const { Cell::new(None) };
}

impl NodeEnv for Inner {
    fn local_lock(&self, lock: u32) -> cxlkv_core::Result<()> {
        self.host_locks
            .lock_within(lock, self.owner(), self.opts.lock_timeout, &|node, nonce| self.node_gone(node, nonce))
    }
    fn local_unlock(&self, lock: u32) {
        self.host_locks.unlock(lock, self.owner());
    }
    fn try_local_lock(&self, lock: u32) -> bool {
        self.host_locks.try_lock(lock, self.owner())
    }
    fn now_ns(&self) -> u64 {
        crate::sync::monotonic_ns()
    }
    fn wall_ms(&self) -> u64 {
        // Before 1970 (a clock never set) there is no wall clock: 0.
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
    }
    fn revoked(&self) -> bool {
        self.fenced.get()
    }
    fn keeps_grants(&self) -> bool {
        // The background thread gives them back (see `threads::background`);
        // a closing node's is stopping.
        !self.stop.get()
    }
    fn wait(&self, iteration: u32) -> cxlkv_core::Result<()> {
        if self.fenced.get() {
            return Err(cxlkv_core::Error::Revoked);
        }
        let now = Instant::now();
        let start = WAIT_START.with(|s| {
            if iteration == 0 || s.get().is_none() {
                s.set(Some(now));
            }
            s.get().unwrap_or(now)
        });
        if now.duration_since(start) > self.opts.lock_timeout {
            WAIT_START.with(|s| s.set(None));
            return Err(cxlkv_core::Error::Timeout);
        }
        // In the process that holds the manager lease, step it right here:
        // a same-process grant then costs no thread hand-off. A closing node
        // has no background thread left: it steps its manager itself, or
        // nobody would (claiming the role if it is vacant).
        if (self.is_manager.get() || self.stop.get()) && self.step_own().is_some() {
            return Ok(());
        }
        // A manager attached in this process is stepped right here too, as
        // its thread would (never waited for: that thread is stepping it
        // then); one of another process of this host, from its cell (see
        // `crate::mgr_cell`): the grant costs no thread hand-off. That one
        // only as the wait begins and every 64th poll after: a wait for a
        // lock someone holds gains nothing from a step at every poll, and
        // waiters of several processes stepping at every one kept a loaded
        // host's CPUs from the heartbeats (a worker was declared dead).
        let peer_turn = iteration.is_multiple_of(64);
        let stepped = self.manager_here().is_some_and(|m| {
            let stepped = m.step_own().is_some();
            if stepped {
                m.peer_steps.add(1);
            }
            stepped
        }) || peer_turn
            && self.host_locks.active_manager().is_some_and(|a| a != self.id && self.step_peer(a));
        if iteration == 0 && !stepped {
            // A new wait: whichever node of this host (any process of this
            // PID namespace) manages the locks steps now instead of when
            // its pause ends. A manager on another host polls.
            let woke = self.host_locks.ring();
            WOKE_MANAGER.with(|w| w.set(woke));
        } else if iteration % 32 == 31 {
            // Again now and then: a node of this host that keeps the lock's
            // grant past its release gives it back once the manager's step
            // recalled it, which the first ring may have come before.
            self.host_locks.ring();
        }
        // Spin first, for as long as a manager of this host takes to answer
        // a ring (measured in time, not polls: a coherent poll is a plain
        // load, a flush-mode poll a flush and a load); then yield; then
        // sleep between polls. A manager's thread this ring woke from its
        // sleep is often put on this CPU: it runs when this thread yields,
        // so the spin is short then.
        let spin = if WOKE_MANAGER.with(Cell::get) { SPIN_AFTER_WAKE } else { SPIN_FOR };
        if now.duration_since(start) < spin {
            core::hint::spin_loop();
        } else if iteration < 512 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }
    fn withdrawal_expired(&self, iteration: u32) -> bool {
        let now = Instant::now();
        let start = WITHDRAW_START.with(|s| {
            if iteration == 0 || s.get().is_none() {
                s.set(Some(now));
            }
            s.get().unwrap_or(now)
        });
        // Four lock timeouts: a manager (or its successor, after a lease)
        // answers long before.
        now.duration_since(start) > self.opts.lock_timeout.saturating_mul(4).max(4 * self.opts.lease)
    }
}

impl Inner {
    /// This node as an owner of host-local locks.
    fn owner(&self) -> Owner {
        Owner { node: Some(self.id), nonce: self.nonce }
    }

    /// True when node `node` is no longer the attachment whose nonce ends in
    /// `nonce` (declared dead, freed, or attached anew): a host-local lock it
    /// holds is stranded.
    fn node_gone(&self, node: u32, nonce: u16) -> bool {
        let st = &self.store;
        if node >= st.layout.caps.max_nodes {
            return false;
        }
        st.fresh_state_first::<NodeInfo>(st.layout.node_info(node), Site("platform.local.owner"))
            .is_ok_and(|i| i.state != NODE_ALIVE || i.nonce as u16 != nonce)
    }

    /// Another node of this process, attached to this region (same
    /// creation), that held the manager lease at its last step, running.
    fn manager_here(&self) -> Option<Arc<Inner>> {
        let all = ATTACHED.try_lock().ok()?;
        all.iter().filter_map(Weak::upgrade).find(|m| {
            !core::ptr::eq(&**m, self)
                && m.store.creation_id == self.store.creation_id
                && m.is_manager.get()
                && !m.stop.get()
                && !m.fenced.get()
        })
    }

    /// Buries the nodes of this host whose process is gone: what they left
    /// dirty in this host's cache lands before they are declared dead, or,
    /// for one declared dead by its silence before its process went, before
    /// it is said quiet (recovery then frees the reservations it kept
    /// quarantined). Returns how many.
    fn bury_siblings(&self) -> cxlkv_core::Result<u32> {
        let st = &self.store;
        let mut n_buried = 0;
        for n in (0..st.layout.caps.max_nodes).filter(|&n| n != self.id) {
            let info: NodeInfo = st.fresh_state_first(st.layout.node_info(n), Site("platform.sibling.info"))?;
            let listed = matches!(info.state, NODE_ALIVE | NODE_DEAD | NODE_FENCED);
            if listed && self.here.can_probe(&info) && !pid_alive(info.pid) && bury(st, n)? {
                n_buried += 1;
            }
        }
        Ok(n_buried)
    }

    fn core(&self) -> CoreNode<'_, Flush> {
        CoreNode::attached(&self.store, self.id, self, &self.local)
    }

    /// True when another node of this host and PID namespace is attached
    /// with its process alive (it may use the host-local lock file).
    fn local_peers(&self) -> bool {
        let st = &self.store;
        (0..st.layout.caps.max_nodes).filter(|&n| n != self.id).any(|n| {
            st.fresh_state_first::<NodeInfo>(st.layout.node_info(n), Site("platform.peers.info"))
                .is_ok_and(|i| i.state == NODE_ALIVE && self.here.can_probe(&i) && pid_alive(i.pid))
        })
    }
}

/// An attached node of a region. Dropping it stops its thread and detaches.
pub struct Node {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
    /// The heartbeat's thread.
    beating: Option<JoinHandle<()>>,
    /// The registration of the region with CUDA, once made.
    pub(crate) gpu: OnceLock<GpuState>,
    pub(crate) gpu_init: Mutex<()>,
    /// The owner's side of the inbox; its lock makes the node's threads take
    /// turns at it.
    inbox: Mutex<InboxLocal>,
    next_call: Mutex<u64>,
    /// Ids of the namespaces this node registered or looked up, by digest
    /// (an id never changes while the region is not formatted again, and a
    /// node does not outlive its region's format).
    pub(crate) namespaces: Mutex<std::collections::HashMap<[u8; 16], u32>>,
    /// The [`Region`] this node was attached through counts it until it
    /// closes (dropped after the thread stopped).
    attachment: Option<Attachment>,
}

/// A snapshot of a node's and its region's counters ([`Node::stats`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// This node's counters.
    pub node: NodeStats,
    /// The counters of every attached or dead node, summed (detached
    /// nodes' counts leave with them).
    pub total: NodeStats,
    /// Attached nodes (bit per node id).
    pub alive: u64,
    /// Nodes declared dead whose recovery is pending.
    pub dead: u64,
    /// Published blocks.
    pub live_entries: u64,
    /// Their payload bytes.
    pub live_bytes: u64,
    /// Payload capacity of the region.
    pub payload_bytes: u64,
    /// Blocks evicted since the region was formatted, by any node (counted
    /// by the index stripes).
    pub evictions: u64,
}

/// Messages taken from the inbox while a `call` waited for its response, and
/// the key buffer every receive reuses (a whole ring's worth of keys).
#[derive(Default)]
struct InboxLocal {
    stash: VecDeque<(Message, Vec<Key>)>,
    keys: Vec<Key>,
    /// Request ids of this node's internal calls still waiting for their
    /// answer (which a receive must leave in the stash for them).
    awaited: std::collections::HashSet<u64>,
}

/// Bit of [`Message::kind`] that marks a response to [`Node::call`];
/// application kinds stay below it.
pub const KIND_RESPONSE: u32 = 1 << 31;

impl Node {
    /// Creates (or overwrites) a region file of `size` bytes at `path`
    /// (owner-only), formats it with `caps` and attaches to it.
    pub fn create(path: &Path, size: u64, caps: Capacities, opts: Options) -> Result<Node> {
        Node::format_new(Region::create(path, size, true)?, caps, opts)
    }

    /// Formats `region` with `caps` in `opts`' mode and attaches to it.
    pub fn format_new(region: Region, caps: Capacities, opts: Options) -> Result<Node> {
        region.format(caps, opts.mode)?;
        region.attach(opts)
    }

    /// Opens the region at `path` (file, /dev/shm or /dev/dax) and attaches.
    pub fn open(path: &Path, opts: Options) -> Result<Node> {
        Node::attach(Mapping::open(path)?, opts)
    }

    /// Attaches a node to a mapped, formatted region and starts its thread.
    /// Several nodes of one process may share a mapping.
    pub fn attach(map: impl Into<Arc<Mapping>>, opts: Options) -> Result<Node> {
        opts.validate()?;
        let map = map.into();
        let co = Flush::new(opts.mode, opts.payload.streaming(opts.mode))?;
        let store = attach(map.view(), co)?;
        if opts.populate {
            map.populate_background()?;
        }
        let host_locks =
            HostLocks::open(&opts.local_dir, store.creation_id, store.layout.n_locks, store.layout.caps.max_nodes)?;
        let nonce = random_u64();
        let here = Locality::here();
        let who = Identity {
            pid: std::process::id(),
            host_id: here.host,
            pid_ns: here.pid_ns,
            nonce,
            now: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        };
        // The heartbeat's thread, running before the node is ALIVE.
        let (give, attached) = std::sync::mpsc::channel();
        let beating = std::thread::Builder::new()
            .name("cxlkv-beat".into())
            .spawn(move || beat(attached))
            .map_err(|err| Error::Io { what: "spawn heartbeat thread", err })?;
        // Attaches of one host are serialised on the host locks' extra lock.
        host_locks.lock(host_locks.attach_lock(), Owner::NONE);
        let id = attach_node(&store, opts.node, who);
        host_locks.unlock(host_locks.attach_lock(), Owner::NONE);
        let id = id?;
        let inner = Arc::new(Inner {
            store,
            local: NodeLocal::default(),
            host_locks,
            id,
            nonce,
            here,
            mgr: Mutex::new(Manager::new(id)),
            opts,
            stop: Flag::new(false),
            fenced: Flag::new(false),
            recovering: Flag::new(false),
            raised_priority: Flag::new(false),
            recovery: Mutex::new(None),
            recovered_at: Mutex::new(None),
            is_manager: Flag::new(false),
            in_cell: Flag::new(false),
            cell_busy: Mutex::new(None),
            cuts: Counter::default(),
            last: Mutex::new(StepReport::default()),
            promotions: Mutex::default(),
            peer_steps: Counter::default(),
            alive_pids: Mutex::default(),
            map,
        });
        inner.init_cell();
        if let Ok(mut all) = ATTACHED.lock() {
            all.retain(|w| w.strong_count() > 0);
            all.push(Arc::downgrade(&inner));
        }
        let i2 = inner.clone();
        let thread = std::thread::Builder::new()
            .name(format!("cxlkv-node{id}"))
            .spawn(move || background(i2))
            .map_err(|err| Error::Io { what: "spawn node thread", err })?;
        // Its first beat follows at once (the thread waits for this).
        let _ = give.send(inner.clone());
        Ok(Node {
            inner,
            thread: Some(thread),
            beating: Some(beating),
            gpu: OnceLock::new(),
            gpu_init: Mutex::new(()),
            inbox: Mutex::new(InboxLocal::default()),
            next_call: Mutex::new(random_u64() >> 16),
            namespaces: Mutex::default(),
            attachment: None,
        })
    }

    pub(crate) fn hold(&mut self, a: Attachment) {
        self.attachment = Some(a);
    }

    /// The node handle: every cache operation.
    pub fn core(&self) -> CoreNode<'_, Flush> {
        self.inner.core()
    }

    /// This node's counters, every node's summed, liveness and occupancy.
    /// Reads other nodes' lines fresh, without taking a lock: a snapshot.
    pub fn stats(&self) -> Result<Stats> {
        let st = self.store();
        let l = &st.layout;
        let mut s = Stats { node: self.core().stats()?, payload_bytes: l.payload.len(), ..Stats::default() };
        for n in 0..l.caps.max_nodes {
            let info: NodeInfo = st.fresh_state_first(l.node_info(n), Site("platform.stats.info"))?;
            match info.state {
                NODE_ALIVE => s.alive |= 1 << n,
                NODE_DEAD | NODE_FENCED => s.dead |= 1 << n,
                _ => continue,
            }
            let c: NodeStats = st.fresh(l.node_stats(n), Site("platform.stats.node"))?;
            let t = &mut s.total;
            t.hits += c.hits;
            t.misses += c.misses;
            t.inserts += c.inserts;
            t.exists += c.exists;
            t.evictions += c.evictions;
            t.bytes_written += c.bytes_written;
            t.bytes_read += c.bytes_read;
            t.tier_timeouts += c.tier_timeouts;
        }
        for stripe in 0..l.caps.n_stripes {
            let h: StripeHeader = st.fresh(l.stripe(stripe), Site("platform.stats.stripe"))?;
            s.live_entries += h.live as u64;
            s.live_bytes += h.bytes;
            s.evictions += h.evictions;
        }
        Ok(s)
    }

    /// True when this node's heartbeat and lock-manager thread runs at a
    /// raised CPU priority (nice -5: needs `CAP_SYS_NICE` or a permissive
    /// `RLIMIT_NICE`); otherwise only the lease protects it from being
    /// declared dead on an overloaded host.
    pub fn heartbeat_priority_raised(&self) -> bool {
        self.inner.raised_priority.get()
    }

    /// How many times another node, waiting for a grant, stepped this
    /// node's lock manager itself instead of waking its thread: one of this
    /// process, or (from the manager's cell in the host-local file) of
    /// another process of this host.
    pub fn manager_steps_by_peers(&self) -> u64 {
        let other_processes = self.inner.host_locks.cell(self.inner.id).map_or(0, |c| c.peer_steps());
        self.inner.peer_steps.get() + other_processes
    }

    /// The options this node was opened with.
    pub fn options(&self) -> &Options {
        &self.inner.opts
    }

    /// The round trips of this node's answered promotions.
    pub(crate) fn promotions(&self) -> std::sync::MutexGuard<'_, RoundTrips> {
        self.inner.promotions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How far this process's page tables of the region are populated.
    pub fn populated(&self) -> Populate {
        self.inner.map.populated()
    }

    /// Faults the whole region in now (see [`Mapping::prefault`]).
    pub fn prefault(&self) -> Result<()> {
        self.inner.map.prefault()
    }

    /// The mapping this node is attached to.
    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.inner.map
    }

    /// The attached store (layout, region view, coherence).
    pub fn store(&self) -> &Store<Flush> {
        &self.inner.store
    }

    /// The region this node is attached to (another handle on its
    /// mapping).
    pub fn region(&self) -> Region {
        Region::from_mapping(self.inner.map.clone())
    }

    /// This node's id.
    pub fn id(&self) -> u32 {
        self.inner.id
    }

    /// The last manager step report of this node.
    pub fn manager_report(&self) -> StepReport {
        self.inner.last.lock().map(|r| *r).unwrap_or_default()
    }

    /// True once this node was fenced (declared dead by the manager).
    pub fn fenced(&self) -> bool {
        self.inner.fenced.get()
    }

    /// Runs recovery now, for nodes the manager declared dead (recovery finds
    /// those itself) and nodes of this host whose process is gone (buried
    /// first).
    pub fn recover(&self) -> Result<RecoverReport> {
        self.inner.bury_siblings()?;
        Ok(self.core().recover(0)?)
    }

    /// An operator's word that node `n`, declared dead, will never store
    /// again (its host is powered off, or was rebooted since): the next
    /// recovery frees the reservations and raw blocks kept quarantined for
    /// it. Never say it of a host that may only be stopped: should it
    /// resume, its late stores land in blocks others reuse. True when said
    /// now; false when `n` is not dead or is quiet already.
    pub fn declare_quiet(&self, n: u32) -> Result<bool> {
        Ok(cxlkv_core::node::declare_quiet(self.store(), n)?)
    }

    /// Checks the region's invariants.
    pub fn check(&self) -> Result<Vec<Finding>> {
        check_store(&self.inner.store)
    }

    /// Stops the thread and detaches (drops every pin this node holds).
    ///
    /// A node that holds an application lock cannot detach (the lock would
    /// be stranded): check [`Node::held_app_lock`] first. Closed anyway,
    /// it fails with `Busy` and stays attached without a heartbeat, until
    /// its lease passes and it is declared dead and recovered (its locks
    /// revoked and repaired), as a crashed one is.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    /// The first application lock this node holds, if any.
    pub fn held_app_lock(&self) -> Result<Option<u32>> {
        Ok(self.core().held_app_lock()?)
    }

    fn shutdown(&mut self) -> Result<()> {
        // Unregistered while the region is still mapped.
        if let Some(st) = self.gpu.take() {
            st.close();
        }
        let Some(t) = self.thread.take() else { return Ok(()) };
        self.inner.stop.set(true);
        // Wakes our background thread: parked (not the manager), or asleep
        // on the host's bell (the manager; other nodes' managers step once).
        t.thread().unpark();
        self.inner.host_locks.ring();
        let _ = t.join();
        if let Some(b) = self.beating.take() {
            b.thread().unpark();
            let _ = b.join();
        }
        // An automatic recovery holds locks in this node's name: it ends
        // before the node's slot is freed (its lock waits step this node's
        // manager inline now that `stop` is set).
        let recovery = self.inner.recovery.lock().ok().and_then(|mut r| r.take());
        if let Some(r) = recovery {
            let _ = r.join();
        }
        if self.inner.fenced.get() {
            // Declared dead while it was stopped: what it may have left in
            // this host's cache lands now, and it says it is quiet, so that
            // recovery frees the blocks it kept for this node (see
            // `CoreNode::quiesce`).
            let _ = self.core().quiesce(self.inner.nonce);
            return Err(Error::Core(cxlkv_core::Error::Revoked));
        }
        // Detaching takes locks, which needs a manager: with `stop` set, its
        // waits step this node's manager inline (see `wait`).
        let r = self.core().detach();
        if r == Err(cxlkv_core::Error::Revoked) {
            // Fenced before its heartbeat noticed: as above.
            let _ = self.core().quiesce(self.inner.nonce);
        }
        self.inner.resign_manager();
        if r.is_ok() && !self.inner.local_peers() {
            self.inner.host_locks.remove();
        }
        Ok(r?)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// A node whose process is gone (or that was declared dead) and what it
/// still holds: a recovery reclaims all of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stranded {
    /// Node id.
    pub node: u32,
    /// Its process id (in its own PID namespace).
    pub pid: u32,
    /// Declared dead already (else: attached, its process gone from this host).
    pub declared_dead: bool,
    /// Locks it holds.
    pub locks: u32,
    /// Published blocks it pins.
    pub pins: u32,
    /// Blocks it reserved and never published.
    pub reservations: u32,
}

impl core::fmt::Display for Stranded {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let what = if self.declared_dead { "was declared dead" } else { "is attached but its process is gone" };
        write!(
            f,
            "node {} (pid {}) {what}: it holds {} lock(s), {} pin(s), {} reservation(s); `cxlkv recover` reclaims them",
            self.node, self.pid, self.locks, self.pins, self.reservations
        )
    }
}

/// The nodes whose process is gone from this host (same PID namespace) or
/// that were declared dead, with what they hold: what `check` alone calls
/// clean until the manager notices, and a recovery reclaims.
pub fn stranded<C: cxlkv_core::coherence::Coherence>(store: &Store<C>) -> Result<Vec<Stranded>> {
    use cxlkv_core::layout::{LockSlot, SLOT_LOCKED};
    use cxlkv_core::pins::journal_census;
    let l = &store.layout;
    let here = Locality::here();
    let mut out = Vec::new();
    for n in 0..l.caps.max_nodes {
        let info: NodeInfo = store.fresh_state_first(l.node_info(n), Site("platform.stranded.info"))?;
        let gone = info.state == NODE_ALIVE && here.can_probe(&info) && !pid_alive(info.pid);
        if !gone && info.state != NODE_DEAD {
            continue;
        }
        let mut s = Stranded {
            node: n,
            pid: info.pid,
            declared_dead: info.state == NODE_DEAD,
            locks: 0,
            pins: 0,
            reservations: 0,
        };
        for lock in 0..l.n_locks {
            let slot: LockSlot = store.fresh(l.lock_slot(lock, n), Site("platform.stranded.slot"))?;
            s.locks += (slot.state == SLOT_LOCKED) as u32;
        }
        let c = journal_census(store, n, Site("platform.stranded.journal"))?;
        s.pins = c.pins;
        s.reservations = c.reservations;
        out.push(s);
    }
    Ok(out)
}

/// Runs `check` over a store and collects the findings.
pub fn check_store<C: cxlkv_core::coherence::Coherence>(store: &Store<C>) -> Result<Vec<Finding>> {
    let mut v = Vec::new();
    let mut scratch = vec![0u64; scratch_words(store)];
    check(store, &mut scratch, &mut |f| v.push(f))?;
    Ok(v)
}

impl Region {
    /// Attaches a node to the formatted region and starts its background
    /// thread (heartbeat, lock manager).
    pub fn attach(&self, opts: Options) -> Result<Node> {
        let mut node = Node::attach(self.mapping().clone(), opts)?;
        node.hold(self.attachment());
        Ok(node)
    }
}

#[cfg(test)]
mod region_tests {
    use super::*;
    use crate::region::Region;
    use std::time::Duration;

    fn opts() -> Options {
        Options { mode: FlushMode::Coherent, ..Options::default() }
    }

    #[test]
    fn format_is_refused_while_a_node_is_attached() {
        let r = Region::memfd(8 << 20, false).unwrap();
        let caps = Capacities { max_nodes: 2, n_stripes: 2, entries_per_stripe: 64, ..Capacities::default() };
        r.format(caps, FlushMode::Coherent).unwrap();
        let node = r.clone().attach(opts()).unwrap();
        assert!(r.in_use());
        assert!(matches!(r.format(caps, FlushMode::Coherent), Err(Error::Core(cxlkv_core::Error::Busy))));
        node.close().unwrap();
        assert!(!r.in_use());
        r.format(caps, FlushMode::Coherent).unwrap();
    }

    #[test]
    fn a_zero_lease_or_lock_timeout_is_refused_before_attaching() {
        let r = Region::memfd(8 << 20, false).unwrap();
        let caps = Capacities { max_nodes: 2, n_stripes: 2, entries_per_stripe: 64, ..Capacities::default() };
        r.format(caps, FlushMode::Coherent).unwrap();
        for o in [Options { lease: Duration::ZERO, ..opts() }, Options { lock_timeout: Duration::ZERO, ..opts() }] {
            assert!(matches!(r.attach(o), Err(Error::Core(cxlkv_core::Error::InvalidArgument))));
        }
        assert!(!r.in_use());
        r.attach(opts()).unwrap().close().unwrap();
    }

    #[test]
    fn plan_refuses_a_region_too_small() {
        assert!(Region::plan(Capacities::default(), 4096).is_err());
        assert!(Region::plan(Capacities::default(), 1 << 30).is_ok());
    }
}
