//! Nodes: attach, detach, heartbeat, and the node-private state a process
//! keeps beside the region.

use crate::coherence::{Coherence, Site};
use crate::layout::{
    state, ChunkRecord, Entry, Heartbeat, LockSlot, NodeInfo, NodeStats, PinRecord, PinSummary, RequestLine, CHUNK_KV,
    NODE_ALIVE, NODE_DEAD, NODE_FENCED, NODE_FREE, SLOT_IDLE, SLOT_LOCKED,
};
use crate::mutant::mutant;
use crate::store::{NodeEnv, Store};
use crate::{Error, Result};

/// Allocation hints kept per node: chunks it last carved blocks from.
pub const HINTS: usize = 8;

/// Process-local state of one attached node (lives in the process, not in the
/// region). Serialises the node's own threads on its journal and hints.
pub struct NodeLocal {
    pub(crate) journal: spin::Mutex<JournalLocal>,
    pub(crate) hints: spin::Mutex<[u32; HINTS]>,
    /// Chunks whose record and maps this node read fresh or wrote under
    /// the grant of its heap lock it holds or keeps now (see
    /// [`crate::alloc::FreshChunks`]).
    pub(crate) fresh_chunks: spin::Mutex<crate::alloc::FreshChunks>,
    pub(crate) evict_cursor: spin::Mutex<u32>,
    pub(crate) alloc_cursor: spin::Mutex<u32>,
    pub(crate) stats: spin::Mutex<()>,
    pub(crate) touched: spin::Mutex<Touched>,
    /// Counters published with the heartbeat (see [`Heartbeat`]).
    pub(crate) beat_counters: BeatCounters,
    /// Per lock: the largest ticket of it this node was granted, and the
    /// largest repair floor it learnt. The node's slot shows both in every
    /// state (see `lock.rs`), so a manager that takes over from a lock line
    /// written back late still counts on from the ticket and keeps the floor.
    pub(crate) tickets: Tickets,
    /// Grants this node keeps LOCKED after their release, for its next
    /// request of the lock (see `lock.rs`, "Parked grants").
    pub(crate) parked: spin::Mutex<Parked>,
    /// A chunk record or map this node found void (see
    /// [`crate::layout::ChunkRecord`]) under a lock taken while it held
    /// another: it has the chunks repaired once it holds no lock.
    pub(crate) void_chunk: spin::Mutex<bool>,
    /// Such a repair ran through since an operation last asked.
    pub(crate) void_repaired: spin::Mutex<bool>,
    /// Held while this node's threads send: each ring of an inbox has one
    /// writer, its sender node (see `channel.rs`); where it writes next in
    /// each of its rings.
    pub(crate) sending: spin::Mutex<crate::channel::Cursors>,
    /// Held while this node's threads receive (the inbox's heads have one
    /// writer, its owner); the sender ring the next receive looks at first,
    /// and the heads this process knows.
    pub(crate) receiving: spin::Mutex<crate::channel::Heads>,
    /// The tenants of namespace ids this node met (see
    /// [`crate::tenants::BoundCache`]).
    pub(crate) bound: spin::Mutex<crate::tenants::BoundCache>,
}

/// The largest ticket of each lock a node was granted and the largest
/// repair floor of it the node learnt (see [`NodeLocal::tickets`]), and the
/// ticket a thread of the process holds it by (0: none).
pub(crate) struct Tickets(spin::Mutex<[(u64, u64, u64); crate::layout::MAX_LOCKS as usize]>);

impl Tickets {
    /// The largest ticket of `lock` seen (0 for none).
    pub(crate) fn get(&self, lock: u32) -> u64 {
        self.0.lock().get(lock as usize).map_or(0, |t| t.0)
    }
    /// The largest repair floor of `lock` learnt (0 for none).
    pub(crate) fn floor(&self, lock: u32) -> u64 {
        self.0.lock().get(lock as usize).map_or(0, |t| t.1)
    }
    /// Records a ticket of `lock`.
    pub(crate) fn saw(&self, lock: u32, seq: u64) {
        if let Some(t) = self.0.lock().get_mut(lock as usize) {
            t.0 = t.0.max(seq);
        }
    }
    /// A thread of this process took `lock` by ticket `seq`.
    pub(crate) fn hold(&self, lock: u32, seq: u64) {
        if let Some(t) = self.0.lock().get_mut(lock as usize) {
            t.0 = t.0.max(seq);
            t.2 = seq;
        }
    }
    /// The hold by ticket `seq` ended (released, or found revoked).
    pub(crate) fn let_go(&self, lock: u32, seq: u64) {
        if let Some(t) = self.0.lock().get_mut(lock as usize).filter(|t| t.2 == seq) {
            t.2 = 0;
        }
    }
    /// A thread of this process holds `lock`.
    pub(crate) fn holds(&self, lock: u32) -> bool {
        self.0.lock().get(lock as usize).is_some_and(|t| t.2 != 0)
    }
    /// Records a repair floor of `lock` (a grant's, or one a recovery of
    /// this node raised).
    pub(crate) fn saw_floor(&self, lock: u32, floor: u64) {
        if let Some(t) = self.0.lock().get_mut(lock as usize) {
            t.1 = t.1.max(floor);
        }
    }
}

/// Per lock, the grant this node keeps past its release: its ticket,
/// floor, when it was kept (the environment's clock) and whether the
/// background thread is giving it back now (ticket 0: none); and how many
/// are kept. Touched under its mutex only between region accesses: the
/// thread that takes an entry out owns the grant (see `lock.rs`).
pub(crate) struct Parked {
    pub(crate) at: [Kept; crate::layout::MAX_LOCKS as usize],
    pub(crate) n: u32,
}

/// One entry of [`Parked`].
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Kept {
    pub(crate) seq: u64,
    pub(crate) floor: u64,
    pub(crate) when: u64,
    pub(crate) releasing: bool,
}

impl Parked {
    /// The grant of `lock` kept, if any.
    pub(crate) fn get(&self, lock: u32) -> Option<Kept> {
        self.at.get(lock as usize).copied().filter(|p| p.seq != 0)
    }
    /// Keeps grant `seq` (floor `floor`) of `lock`, from time `when`.
    pub(crate) fn put(&mut self, lock: u32, seq: u64, floor: u64, when: u64) {
        if let Some(p) = self.at.get_mut(lock as usize) {
            if p.seq == 0 {
                self.n = self.n.saturating_add(1);
            }
            *p = Kept { seq, floor, when, releasing: false };
        }
    }
    /// Marks the grant of `lock` being given back, if it is still `seq`
    /// and nobody took it: true when marked.
    pub(crate) fn mark_releasing(&mut self, lock: u32, seq: u64) -> bool {
        match self.at.get_mut(lock as usize) {
            Some(p) if p.seq == seq && seq != 0 && !p.releasing => {
                p.releasing = true;
                true
            }
            _ => false,
        }
    }
    /// Forgets the grant of `lock` kept, if any.
    pub(crate) fn take(&mut self, lock: u32) {
        if let Some(p) = self.at.get_mut(lock as usize).filter(|p| p.seq != 0) {
            *p = Kept::default();
            self.n = self.n.saturating_sub(1);
        }
    }
}

/// Counters a node keeps in host-local memory and publishes with each
/// heartbeat.
#[derive(Default)]
pub(crate) struct BeatCounters(spin::Mutex<BeatCounts>);

/// The values of [`BeatCounters`].
#[derive(Clone, Copy, Default)]
pub(crate) struct BeatCounts {
    pub(crate) lock_grants: u64,
    pub(crate) lock_wait_ns: u64,
    pub(crate) recoveries: u64,
    pub(crate) nodes_recovered: u64,
    pub(crate) running_declared_dead: u64,
}

impl BeatCounters {
    pub(crate) fn add(&self, f: impl FnOnce(&mut BeatCounts)) {
        f(&mut self.0.lock());
    }
    pub(crate) fn get(&self) -> BeatCounts {
        *self.0.lock()
    }
}

/// Reads this node made without a lock, not yet applied to the LRU lists:
/// (global entry, generation) pairs, applied in batches under the stripe
/// locks the node takes (see `index::evict`).
pub(crate) struct Touched {
    pub(crate) at: [(u32, u32); TOUCHED],
    pub(crate) n: usize,
}

/// Lock-free reads a node remembers before it applies them.
pub const TOUCHED: usize = 256;

impl Default for NodeLocal {
    fn default() -> Self {
        NodeLocal {
            journal: spin::Mutex::new(JournalLocal::default()),
            hints: spin::Mutex::new([u32::MAX; HINTS]),
            fresh_chunks: spin::Mutex::new(crate::alloc::FreshChunks::default()),
            evict_cursor: spin::Mutex::new(0),
            alloc_cursor: spin::Mutex::new(0),
            stats: spin::Mutex::new(()),
            touched: spin::Mutex::new(Touched { at: [(0, 0); TOUCHED], n: 0 }),
            beat_counters: BeatCounters::default(),
            tickets: Tickets(spin::Mutex::new([(0, 0, 0); crate::layout::MAX_LOCKS as usize])),
            parked: spin::Mutex::new(Parked { at: [Kept::default(); crate::layout::MAX_LOCKS as usize], n: 0 }),
            void_chunk: spin::Mutex::new(false),
            void_repaired: spin::Mutex::new(false),
            sending: spin::Mutex::new(crate::channel::Cursors::default()),
            receiving: spin::Mutex::new(crate::channel::Heads::default()),
            bound: spin::Mutex::new([(0, 0, 0); crate::tenants::BOUND_CACHE]),
        }
    }
}

/// What the node knows of its own pin journal without reading it back: how
/// many records each summary bit covers, and the summary line as last written.
pub(crate) struct JournalLocal {
    pub(crate) covered: [u32; PinSummary::BITS as usize],
    pub(crate) summary: PinSummary,
}

impl Default for JournalLocal {
    fn default() -> Self {
        JournalLocal { covered: [0; PinSummary::BITS as usize], summary: PinSummary::default() }
    }
}

/// One participant's handle on a store: its id, environment and local state.
/// Cheap to copy; every operation of the cache is a method of `Node`.
pub struct Node<'a, C: Coherence> {
    /// The attached region.
    pub store: &'a Store<C>,
    /// This node's id (index into the node table).
    pub id: u32,
    /// Waiting and host-local locking.
    pub env: &'a dyn NodeEnv,
    pub(crate) local: &'a NodeLocal,
}

impl<C: Coherence> Node<'_, C> {
    /// `Revoked` once this node learnt it was declared dead (see
    /// [`NodeEnv::revoked`]): the first check of an operation that takes no
    /// lock (one that does learns it in its wait).
    pub(crate) fn not_revoked(&self) -> Result<()> {
        if self.env.revoked() {
            return Err(Error::Revoked);
        }
        Ok(())
    }
}

impl<C: Coherence> Clone for Node<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<C: Coherence> Copy for Node<'_, C> {}

/// Who is attaching: recorded in the node's info line.
#[derive(Clone, Copy, Debug, Default)]
pub struct Identity {
    /// Process id.
    pub pid: u32,
    /// Host identity (e.g. a hash of the boot id).
    pub host_id: u64,
    /// PID namespace identity (0 when unknown).
    pub pid_ns: u64,
    /// Random per-attach value; a node that finds another nonce in its line
    /// has lost its slot.
    pub nonce: u64,
    /// Wall-clock seconds, for reports.
    pub now: u64,
}

/// Claims node slot `want` (or the first free one) for `who`. The caller
/// serialises attaches on one host; across hosts, nodes should be given
/// disjoint ids (a late clash is caught by the nonce check in [`heartbeat`]).
pub fn attach_node<C: Coherence>(store: &Store<C>, want: Option<u32>, who: Identity) -> Result<u32> {
    let l = &store.layout;
    // The slot's info as read fresh: it must be FREE, and it carries the
    // incarnation to advance.
    let (id, old) = match want {
        Some(n) if n >= l.caps.max_nodes => return Err(Error::BadNode),
        Some(n) => {
            let info: NodeInfo = store.fresh(l.node_info(n), Site("node.attach.probe"))?;
            if info.state != NODE_FREE {
                return Err(Error::NodeBusy);
            }
            (n, info)
        }
        None => {
            let mut found = None;
            for n in 0..l.caps.max_nodes {
                let info: NodeInfo = store.fresh(l.node_info(n), Site("node.attach.scan"))?;
                if info.state == NODE_FREE {
                    found = Some((n, info));
                    break;
                }
            }
            found.ok_or(Error::NoFreeNode)?
        }
    };
    // A free slot's journal is empty (recovery or detach cleared it); clear it
    // again so nothing a crashed predecessor left can be mistaken for ours.
    store.view.write(l.pin_summary(id), &PinSummary::default())?;
    for i in 0..l.caps.pin_slots {
        store.view.write(l.pin_record(id, i), &PinRecord::default())?;
    }
    store.co.flush(&store.view, l.journal(id), l.journal_len(), Site("node.attach.journal"))?;
    store.publish(l.node_stats(id), &NodeStats::default(), Site("node.attach.stats"))?;
    store.publish(l.requests(id), &RequestLine::default(), Site("node.attach.requests"))?;
    // SYNC: this node's lock slots fresh (writers: the manager that revoked
    // a dead predecessor's grants, recovery). A predecessor on this host
    // leaves its slots in the host's cache, a grant among them, and the
    // checks of what this node holds read the cached copies.
    let mut lines = [0u64; 64];
    let mut lock = 0u32;
    while lock < l.n_locks {
        let n = l.n_locks.wrapping_sub(lock).min(64);
        for (k, x) in lines.iter_mut().enumerate().take(n as usize) {
            *x = l.lock_slot(lock.wrapping_add(k as u32), id);
        }
        store.co.invalidate_lines(&store.view, lines.get(..n as usize).unwrap_or(&[]), Site("node.attach.slots"))?;
        lock = lock.wrapping_add(n);
    }
    // A free slot holds nothing and asks for nothing: recovery revoked or
    // released its predecessor's grants and dropped its requests. A slot
    // found otherwise is a late line: a grant by a manager step that was
    // cut off (or stopped) with the line dirty in its host's cache, written
    // back after the predecessor released and left (seed 154006 of
    // cut-lazy-4x200). Left as it is, the manager would take this node for
    // the holder of a lock nobody holds (the last grant went to this slot,
    // so the grant is not void), and every other node's request would wait
    // until this one asked for that lock itself. Each reset keeps the
    // slot's ticket and floor, as the manager's do.
    for lock in 0..l.n_locks {
        let off = l.lock_slot(lock, id);
        let s: LockSlot = store.view.read(off)?;
        if s.state != SLOT_IDLE {
            // SYNC: the slot idle before ALIVE (reader: the manager's scan,
            // which takes an ALIVE node's LOCKED slot for a hold).
            store.publish_state_last(off, &crate::lock::reset_slot(&s), Site("node.attach.slot_reset"))?;
        }
    }
    let hb = Heartbeat { beat: 1, nonce: who.nonce, ..Heartbeat::default() };
    store.publish(l.heartbeat(id), &hb, Site("node.attach.heartbeat"))?;
    // SYNC: no fence here: ALIVE may be seen before the lines above land.
    // Nothing trusts them early: recovery validates every record of a live
    // journal against the entries, the manager only watches the heartbeat
    // move, and the stats and request lines are hints. The fence after ALIVE
    // completes them all before attach returns.
    let info = NodeInfo {
        state: NODE_ALIVE,
        pid: who.pid,
        host_id: who.host_id,
        nonce: who.nonce,
        attached_at: who.now,
        incarnation: old.incarnation.wrapping_add(1),
        pid_ns: who.pid_ns,
        reserved: [0; 2],
    };
    // SYNC: ALIVE written last publishes the cleared journal and heartbeat
    // (reader: the manager's liveness scan).
    store.publish_state_last(l.node_info(id), &info, Site("node.attach.info"))?;
    store.co.store_fence(Site("node.attach.info.fence"));
    Ok(id)
}

/// Buries node `n`, whose process died on this host while the host lives:
/// writes back what that process left dirty in this host's cache, says the
/// node is quiet, then declares it DEAD (the manager revokes its locks,
/// recovery frees it). Only a process on the dead one's host can do this;
/// call it when a sibling's process is found gone, before anyone recovers
/// the node. A node declared dead by its silence before its process went
/// (DEAD or FENCED, not yet quiet) gets the same write-backs and is said
/// quiet, so that recovery frees what it kept quarantined for it.
///
/// What is written back: see [`write_back_leftovers`]. Returns false,
/// doing nothing, when `n` is neither ALIVE nor dead and unquiet.
pub fn bury<C: Coherence>(store: &Store<C>, n: u32) -> Result<bool> {
    let l = &store.layout;
    if n >= l.caps.max_nodes {
        return Err(Error::BadNode);
    }
    // SYNC: a hint only: a stale copy that says ALIVE costs write-backs for
    // nothing, since the look after them (read fresh) decides.
    let info: NodeInfo = store.fresh_state_first(l.node_info(n), Site("bury.info.hint"))?;
    if info.state == NODE_DEAD || info.state == NODE_FENCED {
        if quiet_incarnation(store, n)? == Some(info.incarnation) {
            return Ok(false);
        }
        write_back_leftovers(store, n)?;
        mark_quiet(store, n, info.incarnation)?;
        return Ok(true);
    }
    if info.state != NODE_ALIVE {
        return Ok(false);
    }
    if mutant!("bury.dead_first") {
        // DEAD stored first: the metadata flush below carries it along.
        store.write_state_last(l.node_info(n), &NodeInfo { state: NODE_DEAD, ..info })?;
    }
    write_back_leftovers(store, n)?;
    // The write-backs took a while: the manager may have declared the node
    // dead by its silence meanwhile (and recovery fenced it: it is quiet
    // now all the same), or recovery freed it. Read it again.
    let again: NodeInfo = store.fresh_state_first(l.node_info(n), Site("bury.info.again"))?;
    if again.incarnation != info.incarnation {
        return Ok(false);
    }
    if again.state == NODE_DEAD || again.state == NODE_FENCED {
        mark_quiet(store, n, again.incarnation)?;
        return Ok(true);
    }
    if again.state != NODE_ALIVE {
        return Ok(false);
    }
    let info = again;
    // Quiet before DEAD: the recovery DEAD calls for frees its reservations.
    mark_quiet(store, n, info.incarnation)?;
    let mut dead = info;
    dead.state = NODE_DEAD;
    // SYNC: DEAD only after the write-backs above completed (reader: the
    // manager's liveness scan, then recovery).
    store.publish_state_last(l.node_info(n), &dead, Site("bury.dead"))?;
    store.co.store_fence(Site("bury.dead.fence"));
    Ok(true)
}

/// Writes back, from this host's cache, every line node `n`'s process may
/// have left dirty there: the whole metadata area; the payload of every
/// block it was writing (its journal records each reservation; an abort
/// flushes before its entry stops being one); and every chunk it owns that
/// is not a shared KV chunk (raw allocations and runs, written through
/// pointers). Nothing else of the region was that process's to store.
/// Completed by a store fence.
fn write_back_leftovers<C: Coherence>(store: &Store<C>, n: u32) -> Result<()> {
    let l = &store.layout;
    // SYNC: the process's metadata lines reach memory before it is said
    // quiet or declared dead; left in this host's cache they could land
    // whenever it liked, over what recovery rebuilt (reader: every other
    // host).
    store.co.flush(&store.view, 0, l.payload.start, Site("bury.flush_meta"))?;
    // This host's view of the journal and entries is the process's own.
    let eps = l.caps.entries_per_stripe;
    for i in 0..l.caps.pin_slots {
        let r: PinRecord = store.view.read(l.pin_record(n, i))?;
        let g = r.entry.wrapping_sub(1);
        let (Some(s), Some(e)) = (g.checked_div(eps), g.checked_rem(eps)) else { continue };
        if r.entry == 0 || s >= l.caps.n_stripes {
            continue;
        }
        let ent: Entry = store.view.read(l.entry(s, e))?;
        let mine = matches!(ent.state, state::WRITING | state::QUARANTINED);
        let writing = mine && ent.gen as u64 == r.gen && ent.pinners() & (1 << n) != 0;
        if writing && l.payload.contains(ent.payload_off, ent.payload_len as u64) {
            // SYNC: payload the process stored into a block it was writing
            // and had not flushed: recovery aborts the block once the node
            // is quiet, and it may soon be another's.
            store.co.flush(&store.view, ent.payload_off, ent.payload_len as u64, Site("bury.flush_writing"))?;
        }
    }
    for c in 0..l.n_chunks {
        // This host's view of the record is the process's own (it may
        // have taken the chunk without the change landing yet).
        let rec: ChunkRecord = store.view.read(l.chunk(c))?;
        if rec.owner.checked_sub(1) == Some(n) && rec.kind != CHUNK_KV {
            // SYNC: payload the process stored into its own raw blocks and
            // had not flushed: the block may soon be another's.
            store.co.flush(&store.view, l.chunk_payload(c), l.chunk_size(), Site("bury.flush_payload"))?;
        }
    }
    store.co.store_fence(Site("bury.fence"));
    Ok(())
}

/// The incarnation node `n`'s heartbeat line says is quiet, if any (read
/// fresh: its writers are the node, its host's burying process, an
/// operator).
pub(crate) fn quiet_incarnation<C: Coherence>(store: &Store<C>, n: u32) -> Result<Option<u64>> {
    let hb: Heartbeat = store.fresh(store.layout.heartbeat(n), Site("node.quiet.read"))?;
    Ok((hb.quiet != 0 && !mutant!("quiet.ignore_ack")).then_some(hb.quiet))
}

/// Says node `n` at `incarnation` is quiet, in its heartbeat line (see
/// [`Heartbeat::quiet`]). The node itself writes that line no more: it is
/// gone, or fenced and done.
fn mark_quiet<C: Coherence>(store: &Store<C>, n: u32, incarnation: u64) -> Result<()> {
    let l = &store.layout;
    // SYNC: the beat and counters kept beside are hints (a stale beat only
    // looks like one more beat to the manager, which no longer watches it).
    let mut hb: Heartbeat = store.fresh(l.heartbeat(n), Site("node.quiet.before.hint"))?;
    hb.quiet = incarnation;
    // SYNC: published after the write-backs it vouches for completed (their
    // fence came first); reader: recovery's census, the manager's scan.
    store.publish(l.heartbeat(n), &hb, Site("node.quiet"))?;
    store.co.store_fence(Site("node.quiet.fence"));
    Ok(())
}

/// An operator's word that node `n`, declared dead, will never store
/// again: its host is powered off, or was rebooted since. Recovery then
/// frees the reservations and raw blocks it kept quarantined for the node.
/// Said of a host that is only stopped, it lets a late write-back of that
/// host corrupt blocks reused meanwhile. True when said now; false when the
/// node is not dead, or already quiet.
pub fn declare_quiet<C: Coherence>(store: &Store<C>, n: u32) -> Result<bool> {
    let l = &store.layout;
    if n >= l.caps.max_nodes {
        return Err(Error::BadNode);
    }
    let info: NodeInfo = store.fresh_state_first(l.node_info(n), Site("node.declare_quiet.info"))?;
    if info.state != NODE_DEAD && info.state != NODE_FENCED {
        return Ok(false);
    }
    if quiet_incarnation(store, n)? == Some(info.incarnation) {
        return Ok(false);
    }
    mark_quiet(store, n, info.incarnation)?;
    Ok(true)
}

impl<'a, C: Coherence> Node<'a, C> {
    /// A handle for attached node `id`.
    pub fn new(store: &'a Store<C>, id: u32, env: &'a dyn NodeEnv, local: &'a NodeLocal) -> Result<Self> {
        if id >= store.layout.caps.max_nodes {
            return Err(Error::BadNode);
        }
        Ok(Node { store, id, env, local })
    }

    /// A handle for node `id` as returned by [`attach_node`]. An id that is
    /// out of range makes every operation fail with a bounds error.
    pub fn attached(store: &'a Store<C>, id: u32, env: &'a dyn NodeEnv, local: &'a NodeLocal) -> Self {
        debug_assert!(id < store.layout.caps.max_nodes);
        Node { store, id, env, local }
    }

    /// Advances the heartbeat. Fails with `Revoked` when the node's slot no
    /// longer belongs to it (declared dead, freed, or claimed by another).
    pub fn heartbeat(&self, nonce: u64) -> Result<u64> {
        let l = &self.store.layout;
        let info: NodeInfo = self.store.fresh_state_first(l.node_info(self.id), Site("node.beat.info"))?;
        if (info.state != NODE_ALIVE || info.nonce != nonce) && !mutant!("heartbeat.ignore_fencing") {
            return Err(Error::Revoked);
        }
        // Only this node writes its heartbeat line, so the cached copy is ours.
        let mut hb: Heartbeat = self.store.view.read(l.heartbeat(self.id))?;
        hb.beat = hb.beat.wrapping_add(1);
        hb.nonce = nonce;
        let c = self.local.beat_counters.get();
        hb.lock_grants = c.lock_grants;
        hb.lock_wait_ns = c.lock_wait_ns;
        hb.recoveries = c.recoveries;
        hb.nodes_recovered = c.nodes_recovered;
        hb.running_declared_dead = c.running_declared_dead;
        // SYNC: heartbeat visible to the manager's liveness scan.
        self.store.publish(l.heartbeat(self.id), &hb, Site("node.beat"))?;
        self.store.co.store_fence(Site("node.beat.fence"));
        Ok(hb.beat)
    }

    /// `Revoked` unless this node still owns its slot: ALIVE, with the nonce
    /// it attached with (read fresh). Operations that take no lock check it
    /// before they write the node's own lines, which a node declared dead
    /// no longer owns (recovery frees the slot; another process may take it).
    pub(crate) fn owns_slot(&self) -> Result<()> {
        let off = self.store.layout.node_info(self.id);
        // This host's copy: what this node last wrote or read there.
        let mine: NodeInfo = self.store.view.read(off)?;
        // SYNC: fresh info line (writers: the manager declaring this node
        // dead, recovery freeing its slot).
        let now: NodeInfo = self.store.fresh_state_first(off, Site("node.own.info"))?;
        if mine.state != NODE_ALIVE || now.state != NODE_ALIVE || now.nonce != mine.nonce {
            return Err(Error::Revoked);
        }
        Ok(())
    }

    /// Detaches: drops every pin this node holds, then frees its slot.
    /// Refuses with `Busy`, changing nothing, while the node holds any lock
    /// (an application lock, or a stripe or allocator lock another thread
    /// of its process holds, a recovery's say): freeing the slot would
    /// strand the lock with a node that no longer exists, which no manager
    /// revokes (it revokes dead nodes' locks; a free slot is nobody's).
    pub fn detach(&self) -> Result<()> {
        // A node declared dead whose heartbeat has not noticed yet is
        // fenced: it writes nothing, and its slot is recovery's, which
        // keeps what it holds until it is quiet (its FREE over FENCED let
        // the slot be taken while recovery still waited for it: zombie
        // sweep seed 121116).
        if !mutant!("detach.while_fenced") {
            self.owns_slot()?;
        }
        // Kept grants go back first: a free slot holds nothing.
        self.release_parks(u64::MAX)?;
        if self.held_lock()?.is_some() && !mutant!("detach.while_holding_a_lock") {
            return Err(Error::Busy);
        }
        self.release_all()?;
        let l = &self.store.layout;
        // Our own line: the cached copy carries our incarnation, which the
        // free slot keeps (the next attach advances it).
        let mine: NodeInfo = self.store.view.read(l.node_info(self.id))?;
        let info = NodeInfo { incarnation: mine.incarnation, ..NodeInfo::default() };
        // SYNC: no fence before FREE: the next attach of this slot clears the
        // journal itself before turning it ALIVE.
        self.store.publish_state_last(l.node_info(self.id), &info, Site("node.detach.info"))?;
        self.store.co.store_fence(Site("node.detach.info.fence"));
        Ok(())
    }

    /// Ends a node that learnt it was fenced (declared dead: every call
    /// fails with `Revoked`), once its process has stopped using it: writes
    /// back every line of the region this process may have dirtied, then
    /// says the node is quiet (see [`Heartbeat::quiet`]), so that the next
    /// recovery frees the reservations and raw blocks it kept quarantined.
    /// `nonce` is the one the node attached with. True when said now; false
    /// when the slot is no longer this node's to speak for (freed, or
    /// another's); `InvalidArgument` when the node is not fenced (detach
    /// it instead).
    pub fn quiesce(&self, nonce: u64) -> Result<bool> {
        let l = &self.store.layout;
        // SYNC: fresh info line (writers: the manager declaring this node
        // dead, recovery fencing or freeing it).
        let now: NodeInfo = self.store.fresh_state_first(l.node_info(self.id), Site("node.quiesce.info"))?;
        if now.nonce != nonce {
            return Ok(false);
        }
        match now.state {
            NODE_ALIVE => Err(Error::InvalidArgument),
            NODE_DEAD | NODE_FENCED => {
                if quiet_incarnation(self.store, self.id)? == Some(now.incarnation) {
                    return Ok(false);
                }
                write_back_leftovers(self.store, self.id)?;
                mark_quiet(self.store, self.id, now.incarnation)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The first global lock (of any kind) this node holds, if any. A
    /// grant below its lock's repair floor is not held: it landed late (a
    /// stopped manager's, woken), and nobody holds by it. Nor is a grant no
    /// thread of this process took that a manager replaced since made (a
    /// stopped manager's, landed late: its grantee rejects it; seed 114076
    /// of the zombie sweep found one refusing a detach with `Busy`).
    pub fn held_lock(&self) -> Result<Option<u32>> {
        let l = &self.store.layout;
        for lock in 0..l.n_locks {
            // This node's own slot, as in `held_app_lock`.
            let s: LockSlot = self.store.view.read(l.lock_slot(lock, self.id))?;
            if s.state != SLOT_LOCKED {
                continue;
            }
            // SYNC: the floor as recovery raised it (writers: recovery, the
            // manager); a stale one only keeps a void grant counted, and
            // the detach refused.
            let ll: crate::layout::LockLine = self.store.fresh(l.lock_line(lock), Site("node.held.floor"))?;
            if s.seq < ll.floor && !mutant!("detach.void_grant_held") {
                continue;
            }
            // A grant of the current manager not taken yet (a thread of
            // this process polls for it) is held: the detach waits for it.
            if self.local.tickets.holds(lock) || mutant!("detach.stale_grant_held") || self.grant_is_current(&s)? {
                return Ok(Some(lock));
            }
        }
        Ok(None)
    }

    /// The first application lock this node holds, if any.
    pub fn held_app_lock(&self) -> Result<Option<u32>> {
        let l = &self.store.layout;
        for i in 0..l.caps.app_locks {
            // This node's own slot: its cache saw every grant it holds (its
            // poll read the slot fresh) and wrote every release. Only a
            // revocation changes it unseen, and a revoked node is fenced
            // (its detach fails before it gets here).
            let s: LockSlot = self.store.view.read(l.lock_slot(l.locks().app(i), self.id))?;
            if s.state == SLOT_LOCKED {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// Adds to this node's counters (node-private line).
    pub(crate) fn count(&self, f: impl FnOnce(&mut NodeStats)) -> Result<()> {
        let off = self.store.layout.node_stats(self.id);
        let _g = self.local.stats.lock();
        let mut s: NodeStats = self.store.view.read(off)?;
        f(&mut s);
        // SYNC: counters in memory when the operation returns (reader: inspect).
        self.store.publish(off, &s, Site("node.stats"))?;
        self.store.co.store_fence(Site("node.stats.fence"));
        Ok(())
    }

    /// Counts `n` nodes this node's lock manager declared dead by silence
    /// while their process ran (see [`StepReport::running_dead`]),
    /// published with the next heartbeat.
    ///
    /// [`StepReport::running_dead`]: crate::lock::StepReport::running_dead
    pub fn count_running_declared_dead(&self, n: u64) {
        self.local.beat_counters.add(|c| c.running_declared_dead = c.running_declared_dead.wrapping_add(n));
    }

    /// Counts `n` blocks this node asked an SSD tier to put back that did
    /// not come back within its wait.
    pub fn count_tier_timeouts(&self, n: u64) -> Result<()> {
        self.count(|c| c.tier_timeouts = c.tier_timeouts.wrapping_add(n))
    }

    /// This node's counters.
    pub fn stats(&self) -> Result<NodeStats> {
        self.store.view.read(self.store.layout.node_stats(self.id))
    }
}
