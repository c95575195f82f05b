//! `check`: verifies every invariant of a region and reports each violation
//! as a [`Finding`]. It only reads, never trusts what it reads, and never
//! panics, whatever the bytes. Run it on a quiescent region for exact
//! results; on a live one, in-flight changes can show up as findings.

use crate::alloc::{block_of, chunk_of, kind_valid, read_map};
use crate::coherence::{Coherence, Site};
use crate::hash::{place, Key};
use crate::index::{entry_checksum, probe, NIL};
use crate::layout::{
    state, Bucket, ChunkRecord, Entry, ExpiryLine, LockSlot, NodeInfo, PinRecord, PinSummary, RootRecord, StripeHeader,
    TenantConfig, TenantUsage, CHUNK_FREE, CHUNK_HELD, CHUNK_KV, CHUNK_LARGE, CHUNK_RAW, EXPIRY_SLOTS, NODE_ALIVE,
    NODE_DEAD, NODE_FENCED, NODE_FREE, SLOT_CANCEL, SLOT_IDLE, SLOT_LOCKED, SLOT_WAITING, TENANT_DROPPING, TENANT_FREE,
    TENANT_LIVE,
};
use crate::roots::{record_deferred, record_valid};
use crate::store::Store;
use crate::Result;

/// Kinds of findings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FindingKind {
    /// A node info line has an unknown state (a = node).
    NodeState,
    /// A node was declared dead and awaits recovery (a = node).
    NodeDead,
    /// A lock slot has an unknown state (a = lock, b = node).
    SlotState,
    /// A lock has more than one holder (a = lock, b = holders).
    TwoHolders,
    /// A lock is held by a node that is not alive (a = lock, b = node).
    HeldByDead,
    /// A lock awaits repair after a revocation (a = lock).
    NeedsRepair,
    /// An entry has an unknown state (a = stripe, b = entry).
    EntryState,
    /// An entry fails its checksum (a = stripe, b = entry).
    EntryChecksum,
    /// An entry's payload lies outside the payload area or in no allocated
    /// block (a = stripe, b = entry).
    EntryPayload,
    /// Two entries share a payload block (a = stripe, b = entry).
    SharedBlock,
    /// A live entry cannot be found through the buckets (a = stripe, b = entry).
    Unreachable,
    /// A bucket names a bad or empty entry, or has a wrong tag (a = stripe, b = bucket).
    BadBucket,
    /// Bucket count differs from live entries (a = stripe, b = buckets).
    BucketCount,
    /// A node declared dead still pins a published entry; recovery drops
    /// the pin (a = node, b = global entry).
    PinnedByDead,
    /// A WRITING entry does not name exactly one live writer, or a READY one
    /// names any (a = stripe, b = entry).
    Writer,
    /// LRU list broken or not covering exactly the READY entries (a = stripe).
    LruList,
    /// Free list broken or not covering exactly the EMPTY entries (a = stripe).
    FreeList,
    /// Stripe header counters differ from its entries (a = stripe).
    StripeCounters,
    /// A stripe header is void: stamped below its lock's repair floor, so
    /// written back late by a revoked holder; the stripe's next holder has it
    /// repaired before using it (a = stripe, b = the header's ticket).
    VoidStripe,
    /// A chunk is void: its record stamped below its heap lock's repair
    /// floor, or its maps not summing to the record's checksum, so a revoked
    /// holder's late write-back; its next holder has it repaired before
    /// using it (a = chunk, b = the record's ticket).
    VoidChunk,
    /// An entry is void: stamped below its stripe lock's repair floor, so a
    /// revoked holder's line written back late over what the entry held;
    /// the stripe's next holder that meets it has the stripe repaired (a =
    /// stripe, b = entry). What the lost entry held is then unreferenced:
    /// no leak is reported while any entry is void.
    VoidEntry,
    /// A bucket is void: stamped before its stripe lock's repair floor, a
    /// revoked holder's late line; the stripe's next holder has it
    /// repaired (a = stripe, b = bucket).
    VoidBucket,
    /// A journal record names a bad entry, or one neither published at its
    /// generation nor reserved by its node (a = node, b = entry).
    Journal,
    /// A node writes an entry without a journal record (a = node, b = global entry).
    Unjournaled,
    /// A chunk record is malformed (a = chunk).
    ChunkRecord,
    /// Chunk bitmap disagrees with the chunk record (a = chunk).
    ChunkBitmap,
    /// An allocated KV block no entry references (a = chunk, b = block).
    LeakedBlock,
    /// A raw block of a gone node that no root names (a = chunk, b = block).
    LeakedRaw,
    /// A named root is corrupt (a = record).
    Root,
    /// A journal record is not covered by its summary line, so evictors
    /// would not see the pin (a = node, b = global entry).
    PinSummary,
    /// A tier directory's head names no node slot (a = directory).
    TierHead,
    /// A tier record has an unknown state, or its probe does not reach it
    /// (a = directory, b = record).
    TierRecord,
    /// Two live records of one tier directory claim one key (a = directory,
    /// b = record).
    TierDuplicate,
    /// A stripe's change log: its floor is above its count, or a record it
    /// counts is unreadable (a = stripe, b = change number).
    ChangeLog,
    /// A tenant's usage line differs from the blocks its namespaces hold
    /// (a = slot, b = the bytes those blocks hold).
    TenantUsage,
    /// A tenant line is void: a revoked holder's, written back after the
    /// last repair, awaiting repair (a = slot, b = its ticket).
    VoidTenant,
    /// A tenant slot is malformed: an unknown state, a nameless tenant, or
    /// slot 0 not the live default tenant (a = slot, b = state).
    TenantSlot,
    /// A stored block of a tenant's namespace has no expiry stamp of its
    /// generation (a = stripe, b = entry).
    Expiry,
    /// An expiry line is void: a revoked holder's, written back after the
    /// last repair; its entries read as expired until the stripe's repair
    /// (a = stripe, b = entry).
    VoidExpiry,
}

impl FindingKind {
    /// Short description.
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::NodeState => "node info has an unknown state",
            FindingKind::NodeDead => "node declared dead, recovery pending",
            FindingKind::SlotState => "lock slot has an unknown state",
            FindingKind::TwoHolders => "lock has more than one holder",
            FindingKind::HeldByDead => "lock held by a node that is not alive",
            FindingKind::NeedsRepair => "lock awaits repair",
            FindingKind::EntryState => "entry has an unknown state",
            FindingKind::EntryChecksum => "entry fails its checksum",
            FindingKind::EntryPayload => "entry payload not in an allocated block",
            FindingKind::SharedBlock => "two entries share a payload block",
            FindingKind::Unreachable => "live entry not reachable through buckets",
            FindingKind::BadBucket => "bucket is malformed",
            FindingKind::BucketCount => "bucket count differs from live entries",
            FindingKind::PinnedByDead => "entry pinned by a dead node, recovery pending",
            FindingKind::Writer => "entry names a wrong writer",
            FindingKind::LruList => "LRU list broken",
            FindingKind::FreeList => "free list broken",
            FindingKind::StripeCounters => "stripe counters wrong",
            FindingKind::VoidStripe => "stripe header void (a revoked holder's, awaiting repair)",
            FindingKind::VoidChunk => "chunk record or maps void (a revoked holder's, awaiting repair)",
            FindingKind::VoidEntry => "entry void (a revoked holder's late line, awaiting repair)",
            FindingKind::VoidBucket => "bucket void (a revoked holder's late line, awaiting repair)",
            FindingKind::Journal => "journal record inconsistent",
            FindingKind::Unjournaled => "reservation without journal record",
            FindingKind::ChunkRecord => "chunk record malformed",
            FindingKind::ChunkBitmap => "chunk bitmap disagrees with record",
            FindingKind::LeakedBlock => "allocated KV block not referenced",
            FindingKind::LeakedRaw => "raw block of a gone node not rooted",
            FindingKind::Root => "named root corrupt",
            FindingKind::PinSummary => "journal record outside its summary",
            FindingKind::TierHead => "tier directory head malformed",
            FindingKind::TierRecord => "tier record malformed or unreachable",
            FindingKind::TierDuplicate => "two tier records claim one key",
            FindingKind::ChangeLog => "change log record missing or floor above count",
            FindingKind::TenantUsage => "tenant usage differs from its blocks",
            FindingKind::VoidTenant => "tenant line void (a revoked holder's, awaiting repair)",
            FindingKind::TenantSlot => "tenant slot malformed",
            FindingKind::Expiry => "stored block of a tenant without its expiry stamp",
            FindingKind::VoidExpiry => "expiry line void (a revoked holder's late line, awaiting repair)",
        }
    }
}

/// One violated invariant, with where it was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finding {
    /// What is wrong.
    pub kind: FindingKind,
    /// First location (see the kind).
    pub a: u64,
    /// Second location (see the kind).
    pub b: u64,
}

impl core::fmt::Display for Finding {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} ({}, {})", self.kind.as_str(), self.a, self.b)
    }
}

/// Words of scratch `check` needs to track payload blocks (a bit per
/// granule of every chunk).
pub fn scratch_words<C: Coherence>(store: &Store<C>) -> usize {
    (store.layout.n_chunks as usize).saturating_mul(store.layout.map_words())
}

/// Checks `store`. `scratch` (zeroed, [`scratch_words`] long) lets it find
/// shared and leaked blocks; a shorter one skips those checks. Returns the
/// number of findings; `report` gets each.
///
/// Eight passes, in this order (each reads what it checks fresh): nodes,
/// locks, chunks, stripes (entries, buckets, lists, counters), journals,
/// roots, tier directories, leaks.
pub fn check<C: Coherence>(store: &Store<C>, scratch: &mut [u64], report: &mut dyn FnMut(Finding)) -> Result<u64> {
    let l = &store.layout;
    let track = scratch.len() >= (l.n_chunks as usize).saturating_mul(l.map_words());
    store.co.invalidate(&store.view, l.chunk_bitmap.start, l.chunk_bitmap.len(), Site("check.bitmap"))?;
    if track {
        scratch.iter_mut().for_each(|w| *w = 0);
    }
    let floors = [0; crate::layout::MAX_LOCKS as usize];
    let grants = [0; crate::layout::MAX_LOCKS as usize];
    let mut c = Checker {
        st: store,
        scratch,
        track,
        alive: 0,
        dead: 0,
        fenced: 0,
        n: 0,
        report,
        floors,
        grants,
        void_entries: 0,
    };
    c.nodes()?;
    c.locks()?;
    c.chunks()?;
    for s in 0..l.caps.n_stripes {
        c.stripe(s)?;
    }
    c.journals()?;
    c.roots()?;
    c.tenants()?;
    c.tiers()?;
    if track && c.void_entries == 0 {
        c.leaks()?;
    }
    Ok(c.n)
}

/// The state of one run of [`check`] across its passes.
struct Checker<'a, C: Coherence> {
    st: &'a Store<C>,
    /// One bit per allocator granule: blocks referenced so far.
    scratch: &'a mut [u64],
    /// `scratch` is long enough to find shared and leaked blocks.
    track: bool,
    /// Nodes attached, and declared dead, at the node pass.
    alive: u64,
    dead: u64,
    /// Fenced: recovered, its reservations and raw blocks quarantined.
    fenced: u64,
    /// Findings so far.
    n: u64,
    report: &'a mut dyn FnMut(Finding),
    /// Each lock's repair floor, as the lock pass read it.
    floors: [u64; crate::layout::MAX_LOCKS as usize],
    /// Each lock's grant count, as its line showed it.
    grants: [u64; crate::layout::MAX_LOCKS as usize],
    /// Void entries met (see [`FindingKind::VoidEntry`]).
    void_entries: u64,
}

/// Whether granule `i` of chunk `c` is marked in `scratch` (`mw` words a
/// chunk).
fn marked(scratch: &[u64], mw: usize, c: u32, i: u32) -> bool {
    scratch.get(bit_word(mw, c, i)).is_some_and(|w| w & (1 << (i % 64)) != 0)
}

/// The word of `scratch` (`mw` words a chunk) holding granule `i` of chunk
/// `c` (past the end when the layout's counts say so, never a panic).
fn bit_word(mw: usize, c: u32, i: u32) -> usize {
    (c as usize).saturating_mul(mw).saturating_add((i / 64) as usize)
}

/// Marks granule `i` of chunk `c` in `scratch`; true when it was marked.
fn mark(scratch: &mut [u64], mw: usize, c: u32, i: u32) -> bool {
    let Some(w) = scratch.get_mut(bit_word(mw, c, i)) else { return false };
    let was = *w & (1 << (i % 64)) != 0;
    *w |= 1 << (i % 64);
    was
}

/// What the entry pass of one stripe counted.
#[derive(Default)]
struct EntryCounts {
    /// Void entries (their stripe awaits repair).
    void: u32,
    ready: u32,
    live: u32,
    empty: u32,
    bytes: u64,
}

impl<C: Coherence> Checker<'_, C> {
    fn rep(&mut self, kind: FindingKind, a: u64, b: u64) {
        self.n = self.n.saturating_add(1);
        (self.report)(Finding { kind, a, b });
    }

    fn alive(&self, node: u32) -> bool {
        self.alive & (1 << node) != 0
    }

    /// Tier directories of live owners: heads name a node slot, records
    /// have known states and are reached by their probe, one per key.
    fn tiers(&mut self) -> Result<()> {
        use crate::layout::{TierHead, TIER_EMPTY, TIER_GONE, TIER_LIVE};
        let (st, l) = (self.st, &self.st.layout);
        for d in 0..l.caps.tier_slots {
            let (head, owner): (TierHead, _) = st.tier_head_owner(d)?;
            if head.owner > l.caps.max_nodes {
                self.rep(FindingKind::TierHead, d as u64, head.owner as u64);
                continue;
            }
            if owner.is_none() {
                continue;
            }
            for i in 0..l.caps.tier_records {
                let r = match st.tier_record_read(d, i, true) {
                    Ok(r) => r,
                    Err(crate::Error::Changed) => continue,
                    Err(e) => return Err(e),
                };
                match r.state {
                    TIER_EMPTY | TIER_GONE => {}
                    TIER_LIVE => match st.tier_probe(d, r.ns, Key { lo: r.key_lo, hi: r.key_hi }, true) {
                        Ok(Some((j, _))) if j == i => {}
                        Ok(Some(_)) => self.rep(FindingKind::TierDuplicate, d as u64, i as u64),
                        Ok(None) | Err(_) => self.rep(FindingKind::TierRecord, d as u64, i as u64),
                    },
                    _ => self.rep(FindingKind::TierRecord, d as u64, i as u64),
                }
            }
        }
        Ok(())
    }

    /// Node slots: attached, free, dead awaiting recovery, or fenced.
    fn nodes(&mut self) -> Result<()> {
        let (st, l) = (self.st, &self.st.layout);
        for node in 0..l.caps.max_nodes {
            let info: NodeInfo = st.fresh(l.node_info(node), Site("check.node"))?;
            match info.state {
                NODE_ALIVE => self.alive |= 1 << node,
                NODE_FREE => {}
                NODE_DEAD => {
                    self.dead |= 1 << node;
                    self.rep(FindingKind::NodeDead, node as u64, 0)
                }
                NODE_FENCED => self.fenced |= 1 << node,
                _ => self.rep(FindingKind::NodeState, node as u64, info.state as u64),
            }
        }
        // SYNC: fresh journals of live nodes, read by the entry and journal
        // passes below (writers: the nodes themselves).
        for node in (0..l.caps.max_nodes).filter(|&n| self.alive(n)) {
            st.co.invalidate(&st.view, l.journal(node), l.journal_len(), Site("check.journal"))?;
        }
        Ok(())
    }

    /// Locks: at most one holder, alive; none awaiting repair.
    fn locks(&mut self) -> Result<()> {
        let (st, l) = (self.st, &self.st.layout);
        for lock in 0..l.n_locks {
            // SYNC: fresh lock line and slots (writers: the manager, holders,
            // requesters, recovery).
            let span = (l.caps.max_nodes as u64).saturating_add(1).saturating_mul(64);
            st.co.invalidate(&st.view, l.lock_line(lock), span, Site("check.lock"))?;
            let ll: crate::layout::LockLine = st.view.read(l.lock_line(lock))?;
            if let Some(f) = self.floors.get_mut(lock as usize) {
                *f = ll.floor;
            }
            if let Some(g) = self.grants.get_mut(lock as usize) {
                *g = ll.grant_seq;
            }
            if ll.repair != 0 {
                self.rep(FindingKind::NeedsRepair, lock as u64, 0);
            }
            // The repair floor: the line's, or one a slot carries (a grant
            // or a recovery's release) when the line is behind.
            let mut floor = ll.floor;
            for node in 0..l.caps.max_nodes {
                let s: LockSlot = st.view.read(l.lock_slot(lock, node))?;
                floor = floor.max(s.reserved.get(crate::lock::GRANT_FLOOR).copied().unwrap_or(0));
            }
            let mut holders = 0u64;
            for node in 0..l.caps.max_nodes {
                let s: LockSlot = st.view.read(l.lock_slot(lock, node))?;
                match s.state {
                    // A grant below the floor landed late (made before the
                    // repair): nobody holds by it (see the manager).
                    SLOT_LOCKED if s.seq < floor => {}
                    // A free node's grant older than the lock's last: that
                    // one was made after it, so this one was released or
                    // revoked before; it landed late (a stopped or cut-off
                    // manager's dirty line, written back after the node
                    // released and detached). Nobody holds by it, a node
                    // attaching to the slot resets it, and so does the
                    // manager's stranger rule. (Seed 154006 of
                    // cut-lazy-4x200: every node had detached, so no manager
                    // ran to reset it.)
                    SLOT_LOCKED if !self.alive(node) && self.dead & (1 << node) == 0 && s.seq < ll.grant_seq => {}
                    SLOT_LOCKED => {
                        // A free node's LOCKED slot is a grant that landed
                        // after its recovery (a replaced manager's, woken
                        // late): no process holds it; the manager drops it.
                        if self.alive(node) || self.dead & (1 << node) != 0 {
                            holders = holders.saturating_add(1);
                        }
                        if !self.alive(node) {
                            self.rep(FindingKind::HeldByDead, lock as u64, node as u64);
                        }
                    }
                    SLOT_IDLE | SLOT_WAITING | SLOT_CANCEL => {}
                    _ => self.rep(FindingKind::SlotState, lock as u64, node as u64),
                }
            }
            if holders > 1 {
                self.rep(FindingKind::TwoHolders, lock as u64, holders);
            }
        }
        Ok(())
    }

    /// Chunks: records, maps and bitmap agree.
    fn chunks(&mut self) -> Result<()> {
        let (st, l) = (self.st, &self.st.layout);
        let g = l.granules();
        for c in 0..l.n_chunks {
            let rec: ChunkRecord = st.fresh(l.chunk(c), Site("check.chunk"))?;
            let m = read_map(st, c, Some(Site("check.chunk.map")))?;
            let sum = m.summary();
            let word = st.view.load_u64(l.chunk_bitmap.start.saturating_add(((c / 64) as u64).saturating_mul(8)))?;
            let bit = word & (1 << (c % 64)) != 0;
            if bit != (rec.kind != CHUNK_FREE) {
                self.rep(FindingKind::ChunkBitmap, c as u64, 0);
            }
            if self.void_chunk(&rec, &m) {
                // Its counts and maps are a revoked holder's: what the
                // repair will rebuild, not what the chunk holds.
                self.rep(FindingKind::VoidChunk, c as u64, rec.ticket);
                continue;
            }
            let empty = sum.used == 0 && sum.blocks == 0 && sum.well_formed;
            let bad = !kind_valid(rec.kind)
                || rec.owner > l.caps.max_nodes
                || match rec.kind {
                    // A tainted free chunk may hold a late map line (void: its next
                    // taker finds it so and has it repaired).
                    CHUNK_FREE => {
                        rec != ChunkRecord { taint: rec.taint, ..ChunkRecord::default() } || !empty && rec.taint == 0
                    }
                    CHUNK_KV | CHUNK_RAW => {
                        rec.owner == 0
                            || rec.run != 1
                            || rec.large_kind != 0
                            || rec.granules != g
                            || rec.block_size != 0
                            || !sum.well_formed
                            || rec.used != sum.used
                            || rec.blocks != sum.blocks
                            || rec.blocks == 0
                            || rec.free_max != sum.free_max
                    }
                    CHUNK_LARGE => {
                        rec.owner == 0
                            || rec.run < 2
                            || (c as u64).saturating_add(rec.run as u64) > l.n_chunks as u64
                            || !matches!(rec.large_kind, CHUNK_KV | CHUNK_RAW)
                            || rec.block_size != (rec.run as u64).saturating_mul(l.chunk_size())
                            || rec.used != g
                            || rec.blocks != 1
                            || !empty
                    }
                    CHUNK_HELD => {
                        rec != ChunkRecord {
                            owner: rec.owner,
                            kind: CHUNK_HELD,
                            taint: rec.taint,
                            ..ChunkRecord::default()
                        } || rec.owner == 0
                            || !empty
                    }
                    _ => rec.owner == 0 || rec.run >= c || !empty,
                };
            if bad {
                self.rep(FindingKind::ChunkRecord, c as u64, rec.kind as u64);
            }
        }
        Ok(())
    }

    /// One stripe: its entries, buckets, lists and counters.
    fn stripe(&mut self, s: u32) -> Result<()> {
        let l = &self.st.layout;
        let h: StripeHeader = self.st.fresh(l.stripe(s), Site("check.stripe"))?;
        let floor = self.floors.get(l.locks().stripe(s) as usize).copied().unwrap_or(0);
        let counts = self.entries(s)?;
        if counts.void != 0 {
            // Lists, buckets and counts count what the void lines hid.
            return Ok(());
        }
        self.buckets(s, counts.live)?;
        if h.ticket < floor {
            // Its lists and counts are a revoked holder's: what the repair
            // will rebuild, not what the stripe holds.
            self.rep(FindingKind::VoidStripe, s as u64, h.ticket);
            return Ok(());
        }
        self.lists(s, &h, &counts);
        if h.live != counts.ready || h.bytes != counts.bytes {
            self.rep(FindingKind::StripeCounters, s as u64, 0);
        }
        self.change_log(s, &h)
    }

    /// Stripe `s`'s change log (header `h`): the floor at most the count,
    /// and every record the header counts readable, but the oldest (a
    /// writer holding the lock now may be writing its place over).
    fn change_log(&mut self, s: u32, h: &StripeHeader) -> Result<()> {
        if h.changes_floor > h.changes {
            self.rep(FindingKind::ChangeLog, s as u64, h.changes_floor);
            return Ok(());
        }
        let ring = self.st.layout.caps.change_records as u64;
        let first = h.changes_floor.max(h.changes.saturating_sub(ring).saturating_add(1)).saturating_add(1);
        let mut buf = [crate::changes::Change::default(); 1];
        for seq in first..=h.changes {
            match self.st.read_changes(s, seq.wrapping_sub(1), &mut buf) {
                Ok(crate::changes::Tail::Read { n: 1 }) if buf[0].seq == seq => {}
                // The log moved on meanwhile (a live region).
                Ok(crate::changes::Tail::Gap { .. }) => return Ok(()),
                _ => self.rep(FindingKind::ChangeLog, s as u64, seq),
            }
        }
        Ok(())
    }

    /// Entries of stripe `s`: well-formed, reachable, each with exactly the
    /// block its length needs, a writer that journaled its reservation.
    fn entries(&mut self, s: u32) -> Result<EntryCounts> {
        let (st, l) = (self.st, &self.st.layout);
        let eps = l.caps.entries_per_stripe;
        let floor = self.floors.get(l.locks().stripe(s) as usize).copied().unwrap_or(0);
        let mut k = EntryCounts::default();
        for e in 0..eps {
            let Ok(ent) = st.ent(s, e) else {
                self.rep(FindingKind::EntryState, s as u64, e as u64);
                continue;
            };
            // A fenced writer's own reservation landed late is not void:
            // recovery keeps its place (see below).
            let fenced_writer = matches!(ent.state, state::WRITING | state::QUARANTINED)
                && ent.pinners().count_ones() == 1
                && ent.pinners() & (self.dead | self.fenced) != 0;
            if ent.ticket < floor && !fenced_writer {
                k.void = k.void.saturating_add(1);
                self.void_entries = self.void_entries.saturating_add(1);
                self.rep(FindingKind::VoidEntry, s as u64, e as u64);
                continue;
            }
            match ent.state {
                state::EMPTY => {
                    k.empty = k.empty.saturating_add(1);
                    continue;
                }
                state::WRITING | state::READY => {}
                state::QUARANTINED => {
                    // Its block stays allocated for its writer, which is
                    // dead and not known quiet (or dead since the last
                    // recovery, which fenced it, and quiet now).
                    let writer = ent.pinners().count_ones() == 1 && ent.pinners() & (self.dead | self.fenced) != 0;
                    if ent.checksum != entry_checksum(&ent) || !writer {
                        self.rep(FindingKind::Writer, s as u64, e as u64);
                    }
                    // One with no block only holds its place (its writer's
                    // entry may still land there: see recovery, step 2b).
                    if ent.payload_len != 0 {
                        self.entry_payload(s, e, &ent);
                    }
                    continue;
                }
                _ => {
                    self.rep(FindingKind::EntryState, s as u64, e as u64);
                    continue;
                }
            }
            k.live = k.live.saturating_add(1);
            if ent.checksum != entry_checksum(&ent) {
                self.rep(FindingKind::EntryChecksum, s as u64, e as u64);
            }
            if ent.state == state::READY {
                k.ready = k.ready.saturating_add(1);
                k.bytes = k.bytes.saturating_add(ent.payload_len as u64);
                if ent.pinners() != 0 {
                    self.rep(FindingKind::Writer, s as u64, e as u64);
                }
            } else if ent.pinners().count_ones() != 1 || ent.pinners() & self.alive == 0 {
                self.rep(FindingKind::Writer, s as u64, e as u64);
            }
            let key = Key { lo: ent.key_lo, hi: ent.key_hi };
            match probe::find(st, s, place(ent.ns, key), ent.ns, key) {
                Ok(Some(f)) if f.entry == e => {}
                _ => self.rep(FindingKind::Unreachable, s as u64, e as u64),
            }
            // A fenced writer's entry was written back late, after the
            // recovery that fenced it (which made every one it saw
            // QUARANTINED): its block may be free or another's by now, and
            // the next recovery gives it to that other (step 3b).
            let late =
                ent.state == state::WRITING && ent.pinners().count_ones() == 1 && ent.pinners() & self.fenced != 0;
            if !late {
                self.entry_payload(s, e, &ent);
            }
            if ent.state == state::WRITING {
                self.writer_journaled(s, e, &ent)?;
            }
        }
        Ok(k)
    }

    /// True when a chunk of record `rec` and maps `m` is void (see
    /// `alloc::chunk_void`), by the floors this check read.
    fn void_chunk(&self, rec: &ChunkRecord, m: &crate::alloc::ChunkMap) -> bool {
        let l = &self.st.layout;
        let owned =
            matches!(rec.kind, CHUNK_KV | CHUNK_RAW | CHUNK_LARGE) && (1..=l.caps.max_nodes).contains(&rec.owner);
        // An owner (checked above): not 0.
        let floor = || self.floors.get(l.locks().heap(rec.owner.wrapping_sub(1)) as usize).copied().unwrap_or(0);
        owned && (rec.ticket < floor() || rec.map_sum != m.checksum())
    }

    /// The payload block of entry `e` of stripe `s`: exactly the block its
    /// length needs, and no other entry's. Nothing is known of a void
    /// chunk's blocks (reported as such).
    fn entry_payload(&mut self, s: u32, e: u32, ent: &Entry) {
        let (st, l) = (self.st, &self.st.layout);
        let void = chunk_of(l, ent.payload_off).ok().is_some_and(|c| {
            let rec: Result<ChunkRecord> = st.view.read(l.chunk(c));
            matches!((rec, read_map(st, c, None)), (Ok(rec), Ok(m)) if self.void_chunk(&rec, &m))
        });
        if void {
            return;
        }
        let placed = chunk_of(l, ent.payload_off).ok().and_then(|c| {
            let rec: ChunkRecord = st.view.read(l.chunk(c)).ok()?;
            let m = read_map(st, c, None).ok()?;
            let ok_kind = rec.kind == CHUNK_KV || (rec.kind == CHUNK_LARGE && rec.large_kind == CHUNK_KV);
            let (i, bytes) = block_of(l, c, &rec, &m, ent.payload_off)?;
            let need = crate::alloc::block_size(l, ent.payload_len as u64).ok()?;
            (ok_kind && bytes == need).then_some((c, i))
        });
        match placed {
            None => self.rep(FindingKind::EntryPayload, s as u64, e as u64),
            // Marked as this entry's; marked already: another's too.
            Some((c, i)) => {
                if self.track && mark(self.scratch, l.map_words(), c, i) {
                    self.rep(FindingKind::SharedBlock, s as u64, e as u64);
                }
            }
        }
    }

    /// A WRITING entry's live writer has a journal record of it.
    fn writer_journaled(&mut self, s: u32, e: u32, ent: &Entry) -> Result<()> {
        let (st, l) = (self.st, &self.st.layout);
        for node in 0..l.caps.max_nodes {
            if ent.pinners() & (1 << node) == 0 || !self.alive(node) {
                continue;
            }
            // u32 * u32 + u32 fits in u64.
            let g = (s as u64).saturating_mul(l.caps.entries_per_stripe as u64).saturating_add(e as u64);
            let mut found = false;
            for i in 0..l.caps.pin_slots {
                let r: PinRecord = st.view.read(l.pin_record(node, i))?;
                if r.entry as u64 == g.saturating_add(1) && r.gen == ent.gen as u64 && r.count > 0 {
                    found = true;
                    break;
                }
            }
            if !found {
                self.rep(FindingKind::Unjournaled, node as u64, g);
            }
        }
        Ok(())
    }

    /// Buckets of stripe `s`: each names a live entry of its key and lies
    /// in the key's stripe; as many as live entries.
    fn buckets(&mut self, s: u32, live: u32) -> Result<()> {
        let (st, l) = (self.st, &self.st.layout);
        let eps = l.caps.entries_per_stripe;
        let lock = l.locks().stripe(s) as usize;
        let floor = self.floors.get(lock).copied().unwrap_or(0);
        let grants = self.grants.get(lock).copied().unwrap_or(0);
        for b in 0..l.buckets_per_stripe {
            let bk: Bucket = st.fresh(l.bucket(s, b), Site("check.bucket"))?;
            if crate::index::bucket_void(&bk, floor, grants) {
                // The buckets are a revoked holder's in part: what the
                // repair will rebuild, not what the stripe holds.
                self.rep(FindingKind::VoidBucket, s as u64, b as u64);
                return Ok(());
            }
        }
        let mut used = 0u32;
        for b in 0..l.buckets_per_stripe {
            let bk: Bucket = st.view.read(l.bucket(s, b))?;
            if bk.entry == 0 {
                continue;
            }
            used = used.saturating_add(1);
            let ok = bk.entry <= eps
                && st.ent(s, bk.entry.wrapping_sub(1)).is_ok_and(|e| {
                    e.state != state::EMPTY && place(e.ns, Key { lo: e.key_lo, hi: e.key_hi }) == bk.tag
                })
                && probe::stripe_of(bk.tag, l.caps.n_stripes) == s;
            if !ok {
                self.rep(FindingKind::BadBucket, s as u64, b as u64);
            }
        }
        if used != live {
            self.rep(FindingKind::BucketCount, s as u64, used as u64);
        }
        Ok(())
    }

    /// Lists of stripe `s`: the LRU list is a consistent doubly linked list
    /// of exactly the READY entries; the free list holds exactly the EMPTY.
    fn lists(&mut self, s: u32, h: &StripeHeader, k: &EntryCounts) {
        let st = self.st;
        let eps = st.layout.caps.entries_per_stripe;
        let (mut prev, mut cur, mut n, mut ok) = (NIL, h.lru_head, 0u32, true);
        while cur != NIL {
            if n >= k.ready || cur >= eps {
                ok = false;
                break;
            }
            match st.ent(s, cur) {
                Ok(e) if e.state == state::READY && e.lru_prev == prev => {
                    prev = cur;
                    cur = e.lru_next;
                    n = n.saturating_add(1);
                }
                _ => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok || n != k.ready || prev != h.lru_tail {
            self.rep(FindingKind::LruList, s as u64, 0);
        }
        let (mut cur, mut n, mut ok) = (h.free_head, 0u32, true);
        while cur != NIL {
            if n >= k.empty || cur >= eps {
                ok = false;
                break;
            }
            match st.ent(s, cur) {
                Ok(e) if e.state == state::EMPTY => {
                    cur = e.lru_next;
                    n = n.saturating_add(1);
                }
                _ => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok || n != k.empty {
            self.rep(FindingKind::FreeList, s as u64, 0);
        }
    }

    /// Journals: each record of a live node names an entry published at
    /// its generation (a pin) or reserved by the node, and its summary
    /// covers it; a dead node's pins await recovery.
    fn journals(&mut self) -> Result<()> {
        let (st, l) = (self.st, &self.st.layout);
        let eps = l.caps.entries_per_stripe;
        for node in 0..l.caps.max_nodes {
            if !self.alive(node) {
                if self.dead & (1 << node) != 0 {
                    self.dead_pins(node)?;
                }
                continue;
            }
            let sum: PinSummary = st.view.read(l.pin_summary(node))?;
            for i in 0..l.caps.pin_slots {
                let r: PinRecord = st.view.read(l.pin_record(node, i))?;
                if r.entry == 0 {
                    continue;
                }
                let g = r.entry.wrapping_sub(1);
                let (Some(s), Some(e)) = (g.checked_div(eps), g.checked_rem(eps)) else {
                    self.rep(FindingKind::Journal, node as u64, g as u64);
                    continue;
                };
                let ok = s < l.caps.n_stripes
                    && r.count > 0
                    && st.ent(s, e).is_ok_and(|x| {
                        x.gen as u64 == r.gen
                            && (x.state == state::READY || x.state == state::WRITING && x.pinners() & (1 << node) != 0)
                    });
                // An entry a repair lost while this node pinned or wrote
                // it: recovery kept the block the record names, which the
                // node frees when it lets go (see `Node::let_go_lost`).
                if !(ok || r.count > 0 && self.block_kept(r.off)?) {
                    self.rep(FindingKind::Journal, node as u64, g as u64);
                }
                if !sum.covers(g) {
                    self.rep(FindingKind::PinSummary, node as u64, g as u64);
                }
            }
        }
        Ok(())
    }

    /// Whether a KV block starts at `off` (then marked referenced).
    fn block_kept(&mut self, off: u64) -> Result<bool> {
        let (st, l) = (self.st, &self.st.layout);
        let Ok(c) = chunk_of(l, off) else { return Ok(false) };
        let rec: ChunkRecord = st.view.read(l.chunk(c))?;
        let kv = rec.kind == CHUNK_KV || rec.kind == CHUNK_LARGE && rec.large_kind == CHUNK_KV;
        let m = read_map(st, c, None)?;
        match block_of(l, c, &rec, &m, off) {
            Some((bi, _)) if kv => {
                if self.track {
                    mark(self.scratch, l.map_words(), c, bi);
                }
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The published blocks a dead node still pins (recovery drops them).
    fn dead_pins(&mut self, node: u32) -> Result<()> {
        let (st, l) = (self.st, &self.st.layout);
        let eps = l.caps.entries_per_stripe;
        // SYNC: fresh journal of a dead node (its host flushed it when it
        // buried it, or recovery's bury did).
        st.co.invalidate(&st.view, l.journal(node), l.journal_len(), Site("check.dead_pins.report"))?;
        for i in 0..l.caps.pin_slots {
            let r: PinRecord = st.view.read(l.pin_record(node, i))?;
            let g = r.entry.wrapping_sub(1);
            let (Some(s), Some(e)) = (g.checked_div(eps), g.checked_rem(eps)) else { continue };
            if r.entry != 0
                && r.count > 0
                && s < l.caps.n_stripes
                && st.ent(s, e).is_ok_and(|x| x.state == state::READY && x.gen as u64 == r.gen)
            {
                self.rep(FindingKind::PinnedByDead, node as u64, g as u64);
            }
        }
        Ok(())
    }

    /// Roots: well-formed; the raw blocks they name count as referenced.
    /// Every tenant slot: well formed, not void, and (a tenant other than
    /// the default one) its usage line equal to what the entries of its
    /// namespaces hold. Runs after the stripe and root passes: this host's
    /// view of entries and root records is current.
    fn tenants(&mut self) -> Result<()> {
        let (st, l) = (self.st, &self.st.layout);
        let nt = l.caps.max_tenants;
        st.co.invalidate(&st.view, l.tenants.start, l.tenants.len(), Site("check.tenants"))?;
        st.co.invalidate(&st.view, l.expiry.start, l.expiry.len(), Site("check.expiry"))?;
        let mut acc = [(0u64, 0u64); crate::layout::MAX_TENANTS as usize];
        for s in 0..l.caps.n_stripes {
            let floor = self.floors.get(l.locks().stripe(s) as usize).copied().unwrap_or(0);
            for e in 0..l.caps.entries_per_stripe {
                let ent: Entry = st.view.read(l.entry(s, e))?;
                if ent.state == state::EMPTY || ent.ns < crate::namespaces::REGISTERED {
                    continue;
                }
                let i = ent.ns.wrapping_sub(crate::namespaces::REGISTERED);
                if i >= l.caps.n_roots {
                    continue;
                }
                let r: RootRecord = st.view.read(l.root(i))?;
                let Some((_, t)) = crate::namespaces::binding_of(&r) else { continue };
                let cfg: TenantConfig = st.view.read(l.tenant_config(t.slot.min(nt.saturating_sub(1))))?;
                if t.slot == 0 || t.slot >= nt || cfg.nonce != t.nonce || cfg.state == TENANT_FREE {
                    continue;
                }
                if let Some(a) = acc.get_mut(t.slot as usize) {
                    a.0 = a.0.saturating_add(ent.payload_len as u64);
                    a.1 = a.1.saturating_add(1);
                }
                // A stored block of a tenant's has its generation's stamp
                // (a void entry is reported above).
                if ent.state == state::READY && ent.ticket >= floor {
                    let x: ExpiryLine = st.view.read(l.expiry_line(s, e))?;
                    let w = x.at.get((e % EXPIRY_SLOTS) as usize).copied().unwrap_or(0);
                    if x.ticket < floor {
                        self.rep(FindingKind::VoidExpiry, s as u64, e as u64);
                    } else if crate::index::expiry::stamp_for(w, ent.gen).is_none() {
                        self.rep(FindingKind::Expiry, s as u64, e as u64);
                    }
                }
            }
        }
        for t in 0..nt {
            let cfg: TenantConfig = st.view.read(l.tenant_config(t))?;
            let u: TenantUsage = st.view.read(l.tenant_usage(t))?;
            let named = cfg.name.first().is_some_and(|&b| b != 0);
            let ok = match cfg.state {
                TENANT_FREE => t != 0,
                TENANT_LIVE | TENANT_DROPPING => named && (t != 0 || cfg.state == TENANT_LIVE),
                _ => false,
            };
            if !ok {
                self.rep(FindingKind::TenantSlot, t as u64, cfg.state as u64);
                continue;
            }
            if t == 0 || cfg.state == TENANT_FREE {
                continue;
            }
            let floor = self.floors.get(l.locks().tenant(t) as usize).copied().unwrap_or(0);
            if cfg.ticket < floor || u.ticket < floor {
                self.rep(FindingKind::VoidTenant, t as u64, cfg.ticket.min(u.ticket));
                continue;
            }
            let (bytes, blocks) = acc.get(t as usize).copied().unwrap_or_default();
            if u.bytes != bytes || u.blocks != blocks || u.nonce != cfg.nonce {
                self.rep(FindingKind::TenantUsage, t as u64, bytes);
            }
        }
        Ok(())
    }

    fn roots(&mut self) -> Result<()> {
        let (st, l) = (self.st, &self.st.layout);
        for i in 0..l.caps.n_roots {
            let r: RootRecord = st.fresh(l.root(i), Site("check.root"))?;
            // A deferred free holds its block as a root does.
            let holds = record_valid(&r) || record_deferred(&r);
            if r.state != 0 && !holds {
                self.rep(FindingKind::Root, i as u64, 0);
            }
            if self.track && holds {
                if let Ok(c) = chunk_of(l, r.offset) {
                    let rec: ChunkRecord = st.view.read(l.chunk(c))?;
                    let m = read_map(st, c, None)?;
                    if let Some((bi, _)) = block_of(l, c, &rec, &m, r.offset) {
                        mark(self.scratch, l.map_words(), c, bi);
                    }
                }
            }
        }
        Ok(())
    }

    /// Leaks: allocated KV blocks no entry references, and raw blocks of a
    /// node no longer attached that no root references.
    fn leaks(&mut self) -> Result<()> {
        let (st, l) = (self.st, &self.st.layout);
        let (g, mw) = (l.granules(), l.map_words());
        for c in 0..l.n_chunks {
            let rec: ChunkRecord = st.view.read(l.chunk(c))?;
            // A fenced owner's raw blocks are quarantined, not leaked.
            let owner_alive = rec.owner != 0
                && rec.owner <= l.caps.max_nodes
                && (self.alive(rec.owner.wrapping_sub(1)) || self.fenced & (1 << rec.owner.wrapping_sub(1)) != 0);
            let (kv, raw) = match rec.kind {
                CHUNK_KV => (true, false),
                CHUNK_RAW => (false, true),
                CHUNK_LARGE => (rec.large_kind == CHUNK_KV, rec.large_kind == CHUNK_RAW),
                _ => (false, false),
            };
            if !(kv || raw && !owner_alive) {
                continue;
            }
            let kind = if kv { FindingKind::LeakedBlock } else { FindingKind::LeakedRaw };
            if self.void_chunk(&rec, &read_map(st, c, None)?) {
                continue;
            }
            if rec.kind == CHUNK_LARGE {
                if rec.blocks == 1 && !marked(self.scratch, mw, c, 0) {
                    self.rep(kind, c as u64, 0);
                }
                continue;
            }
            let m = read_map(st, c, None)?;
            for i in (0..g).filter(|&i| m.is_start(i)) {
                if !marked(self.scratch, mw, c, i) {
                    self.rep(kind, c as u64, i as u64);
                }
            }
        }
        Ok(())
    }
}
