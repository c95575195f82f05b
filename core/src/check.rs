//! `check`: verifies every invariant of a region and reports each violation
//! as a [`Finding`]. It only reads, never trusts what it reads, and never
//! panics, whatever the bytes. Run it on a quiescent region for exact
//! results; on a live one, in-flight changes can show up as findings.

use crate::alloc::{block_of, chunk_of, kind_valid, read_map};
use crate::coherence::{Coherence, Site};
use crate::hash::{place, Key};
use crate::index::{entry_checksum, probe, NIL};
use crate::layout::{
    state, Bucket, ChunkRecord, LockSlot, NodeInfo, PinRecord, PinSummary, RootRecord, StripeHeader, CHUNK_FREE,
    CHUNK_KV, CHUNK_LARGE, CHUNK_RAW, NODE_ALIVE, NODE_DEAD, NODE_FREE, SLOT_CANCEL, SLOT_IDLE, SLOT_LOCKED,
    SLOT_WAITING,
};
use crate::roots::record_valid;
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
            FindingKind::Journal => "journal record inconsistent",
            FindingKind::Unjournaled => "reservation without journal record",
            FindingKind::ChunkRecord => "chunk record malformed",
            FindingKind::ChunkBitmap => "chunk bitmap disagrees with record",
            FindingKind::LeakedBlock => "allocated KV block not referenced",
            FindingKind::LeakedRaw => "raw block of a gone node not rooted",
            FindingKind::Root => "named root corrupt",
            FindingKind::PinSummary => "journal record outside its summary",
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
    store.layout.n_chunks as usize * store.layout.map_words()
}

/// Checks `store`. `scratch` (zeroed, [`scratch_words`] long) lets it find
/// shared and leaked blocks; a shorter one skips those checks. Returns the
/// number of findings; `report` gets each.
pub fn check<C: Coherence>(store: &Store<C>, scratch: &mut [u64], report: &mut dyn FnMut(Finding)) -> Result<u64> {
    let mut n = 0u64;
    let mut rep = |kind, a: u64, b: u64| {
        n += 1;
        report(Finding { kind, a, b });
    };
    let st = store;
    let l = &st.layout;
    let mw = l.map_words();
    let track = scratch.len() >= l.n_chunks as usize * mw;
    let bitmap_len = l.chunk_bitmap.len();
    st.co.invalidate(&st.view, l.chunk_bitmap.start, bitmap_len, Site("check.bitmap"))?;
    if track {
        scratch.iter_mut().for_each(|w| *w = 0);
    }

    let (mut alive, mut dead) = (0u64, 0u64);
    for node in 0..l.caps.max_nodes {
        let info: NodeInfo = st.fresh(l.node_info(node), Site("check.node"))?;
        match info.state {
            NODE_ALIVE => alive |= 1 << node,
            NODE_FREE => {}
            NODE_DEAD => {
                dead |= 1 << node;
                rep(FindingKind::NodeDead, node as u64, 0)
            }
            _ => rep(FindingKind::NodeState, node as u64, info.state as u64),
        }
    }
    // SYNC: fresh journals of live nodes, read by the entry and journal
    // passes below (writers: the nodes themselves).
    for node in (0..l.caps.max_nodes).filter(|n| alive & (1 << n) != 0) {
        st.co.invalidate(&st.view, l.journal(node), l.journal_len(), Site("check.journal"))?;
    }

    for lock in 0..l.n_locks {
        // SYNC: fresh lock line and slots (writers: the manager, holders,
        // requesters, recovery).
        let span = (1 + l.caps.max_nodes as u64) * 64;
        st.co.invalidate(&st.view, l.lock_line(lock), span, Site("check.lock"))?;
        let ll: crate::layout::LockLine = st.view.read(l.lock_line(lock))?;
        if ll.repair != 0 {
            rep(FindingKind::NeedsRepair, lock as u64, 0);
        }
        let mut holders = 0u64;
        for node in 0..l.caps.max_nodes {
            let s: LockSlot = st.view.read(l.lock_slot(lock, node))?;
            match s.state {
                SLOT_LOCKED => {
                    holders += 1;
                    if alive & (1 << node) == 0 {
                        rep(FindingKind::HeldByDead, lock as u64, node as u64);
                    }
                }
                SLOT_IDLE | SLOT_WAITING | SLOT_CANCEL => {}
                _ => rep(FindingKind::SlotState, lock as u64, node as u64),
            }
        }
        if holders > 1 {
            rep(FindingKind::TwoHolders, lock as u64, holders);
        }
    }

    // Chunks: records, maps and bitmap.
    let g = l.granules();
    for c in 0..l.n_chunks {
        let rec: ChunkRecord = st.fresh(l.chunk(c), Site("check.chunk"))?;
        let m = read_map(st, c, Some(Site("check.chunk.map")))?;
        let sum = m.summary();
        let word = st.view.load_u64(l.chunk_bitmap.start + (c / 64) as u64 * 8)?;
        let bit = word & (1 << (c % 64)) != 0;
        if bit != (rec.kind != CHUNK_FREE) {
            rep(FindingKind::ChunkBitmap, c as u64, 0);
        }
        let empty = sum.used == 0 && sum.blocks == 0 && sum.well_formed;
        let bad = !kind_valid(rec.kind)
            || rec.owner > l.caps.max_nodes
            || match rec.kind {
                CHUNK_FREE => rec != ChunkRecord::default() || !empty,
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
                        || c as u64 + rec.run as u64 > l.n_chunks as u64
                        || !matches!(rec.large_kind, CHUNK_KV | CHUNK_RAW)
                        || rec.block_size != rec.run as u64 * l.chunk_size()
                        || rec.used != g
                        || rec.blocks != 1
                        || !empty
                }
                _ => rec.owner == 0 || rec.run >= c || !empty,
            };
        if bad {
            rep(FindingKind::ChunkRecord, c as u64, rec.kind as u64);
        }
    }

    // Stripes.
    let eps = l.caps.entries_per_stripe;
    let bps = l.buckets_per_stripe;
    for s in 0..l.caps.n_stripes {
        let h: StripeHeader = st.fresh(l.stripe(s), Site("check.stripe"))?;
        let (mut ready, mut live, mut empty, mut bytes) = (0u32, 0u32, 0u32, 0u64);
        for e in 0..eps {
            let ent = match st.ent(s, e) {
                Ok(x) => x,
                Err(_) => {
                    rep(FindingKind::EntryState, s as u64, e as u64);
                    continue;
                }
            };
            match ent.state {
                state::EMPTY => {
                    empty += 1;
                    continue;
                }
                state::WRITING | state::READY => {}
                _ => {
                    rep(FindingKind::EntryState, s as u64, e as u64);
                    continue;
                }
            }
            live += 1;
            if ent.checksum != entry_checksum(&ent) {
                rep(FindingKind::EntryChecksum, s as u64, e as u64);
            }
            if ent.state == state::READY {
                ready += 1;
                bytes += ent.payload_len as u64;
                if ent.pinners != 0 {
                    rep(FindingKind::Writer, s as u64, e as u64);
                }
            } else if ent.pinners.count_ones() != 1 || ent.pinners & alive == 0 {
                rep(FindingKind::Writer, s as u64, e as u64);
            }
            let key = Key { lo: ent.key_lo, hi: ent.key_hi };
            match probe::find(st, s, place(ent.ns, key), ent.ns, key) {
                Ok(Some(f)) if f.entry == e => {}
                _ => rep(FindingKind::Unreachable, s as u64, e as u64),
            }
            // Payload block: exactly the block its length needs.
            let placed = chunk_of(l, ent.payload_off).ok().and_then(|c| {
                let rec: ChunkRecord = st.view.read(l.chunk(c)).ok()?;
                let m = read_map(st, c, None).ok()?;
                let ok_kind = rec.kind == CHUNK_KV || (rec.kind == CHUNK_LARGE && rec.large_kind == CHUNK_KV);
                let (i, bytes) = block_of(l, c, &rec, &m, ent.payload_off)?;
                let need = crate::alloc::block_size(l, ent.payload_len as u64).ok()?;
                (ok_kind && bytes == need).then_some((c, i))
            });
            match placed {
                None => rep(FindingKind::EntryPayload, s as u64, e as u64),
                Some((c, i)) if track => {
                    let w = &mut scratch[c as usize * mw + (i / 64) as usize];
                    if *w & (1 << (i % 64)) != 0 {
                        rep(FindingKind::SharedBlock, s as u64, e as u64);
                    }
                    *w |= 1 << (i % 64);
                }
                _ => {}
            }
            // Journal of the writer.
            for node in 0..l.caps.max_nodes {
                if ent.state == state::WRITING && ent.pinners & (1 << node) != 0 && alive & (1 << node) != 0 {
                    let g = s as u64 * eps as u64 + e as u64;
                    let mut found = false;
                    for i in 0..l.caps.pin_slots {
                        let r: PinRecord = st.view.read(l.pin_record(node, i))?;
                        if r.entry as u64 == g + 1 && r.gen == ent.gen as u64 && r.count > 0 {
                            found = true;
                            break;
                        }
                    }
                    if !found {
                        rep(FindingKind::Unjournaled, node as u64, g);
                    }
                }
            }
        }
        // Buckets.
        let mut used = 0u32;
        for b in 0..bps {
            let bk: Bucket = st.fresh(l.bucket(s, b), Site("check.bucket"))?;
            if bk.entry == 0 {
                continue;
            }
            used += 1;
            let ok = bk.entry <= eps
                && st.ent(s, bk.entry - 1).is_ok_and(|e| {
                    e.state != state::EMPTY && place(e.ns, Key { lo: e.key_lo, hi: e.key_hi }) == bk.tag
                })
                && probe::stripe_of(bk.tag, l.caps.n_stripes) == s;
            if !ok {
                rep(FindingKind::BadBucket, s as u64, b as u64);
            }
        }
        if used != live {
            rep(FindingKind::BucketCount, s as u64, used as u64);
        }
        // LRU list: a consistent doubly linked list of exactly the READY ones.
        let (mut prev, mut cur, mut k, mut ok) = (NIL, h.lru_head, 0u32, true);
        while cur != NIL {
            if k >= ready || cur >= eps {
                ok = false;
                break;
            }
            match st.ent(s, cur) {
                Ok(e) if e.state == state::READY && e.lru_prev == prev => {
                    prev = cur;
                    cur = e.lru_next;
                    k += 1;
                }
                _ => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok || k != ready || prev != h.lru_tail {
            rep(FindingKind::LruList, s as u64, 0);
        }
        let (mut cur, mut k, mut ok) = (h.free_head, 0u32, true);
        while cur != NIL {
            if k >= empty || cur >= eps {
                ok = false;
                break;
            }
            match st.ent(s, cur) {
                Ok(e) if e.state == state::EMPTY => {
                    cur = e.lru_next;
                    k += 1;
                }
                _ => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok || k != empty {
            rep(FindingKind::FreeList, s as u64, 0);
        }
        if h.live != ready || h.bytes != bytes {
            rep(FindingKind::StripeCounters, s as u64, 0);
        }
    }

    // Journals: each record of a live node names an entry published at its
    // generation (a pin) or reserved by the node, and its summary covers it;
    // a dead node's pins await recovery.
    for node in 0..l.caps.max_nodes {
        if alive & (1 << node) == 0 {
            if dead & (1 << node) != 0 {
                // SYNC: fresh journal of a dead node (its host flushed it
                // when it buried it, or recovery's bury did).
                st.co.invalidate(&st.view, l.journal(node), l.journal_len(), Site("check.dead_pins.report"))?;
                for i in 0..l.caps.pin_slots {
                    let r: PinRecord = st.view.read(l.pin_record(node, i))?;
                    let g = r.entry.wrapping_sub(1);
                    let (s, e) = (g / eps, g % eps);
                    if r.entry != 0
                        && r.count > 0
                        && s < l.caps.n_stripes
                        && st.ent(s, e).is_ok_and(|x| x.state == state::READY && x.gen as u64 == r.gen)
                    {
                        rep(FindingKind::PinnedByDead, node as u64, g as u64);
                    }
                }
            }
            continue;
        }
        let sum: PinSummary = st.view.read(l.pin_summary(node))?;
        for i in 0..l.caps.pin_slots {
            let r: PinRecord = st.view.read(l.pin_record(node, i))?;
            if r.entry == 0 {
                continue;
            }
            let g = r.entry - 1;
            let (s, e) = (g / eps, g % eps);
            let ok = s < l.caps.n_stripes
                && r.count > 0
                && st.ent(s, e).is_ok_and(|x| {
                    x.gen as u64 == r.gen
                        && (x.state == state::READY || x.state == state::WRITING && x.pinners & (1 << node) != 0)
                });
            if !ok {
                rep(FindingKind::Journal, node as u64, g as u64);
            }
            if !sum.covers(g) {
                rep(FindingKind::PinSummary, node as u64, g as u64);
            }
        }
    }

    // Roots keep raw blocks; then leaks.
    for i in 0..l.caps.n_roots {
        let r: RootRecord = st.fresh(l.root(i), Site("check.root"))?;
        if r.state != 0 && !record_valid(&r) {
            rep(FindingKind::Root, i as u64, 0);
        }
        if track && record_valid(&r) {
            if let Ok(c) = chunk_of(l, r.offset) {
                let rec: ChunkRecord = st.view.read(l.chunk(c))?;
                let m = read_map(st, c, None)?;
                if let Some((bi, _)) = block_of(l, c, &rec, &m, r.offset) {
                    scratch[c as usize * mw + (bi / 64) as usize] |= 1 << (bi % 64);
                }
            }
        }
    }
    if track {
        for c in 0..l.n_chunks {
            let rec: ChunkRecord = st.view.read(l.chunk(c))?;
            let owner_alive = rec.owner != 0 && rec.owner <= l.caps.max_nodes && alive & (1 << (rec.owner - 1)) != 0;
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
            let referenced = |i: u32| scratch[c as usize * mw + (i / 64) as usize] & (1 << (i % 64)) != 0;
            if rec.kind == CHUNK_LARGE {
                if rec.blocks == 1 && !referenced(0) {
                    rep(kind, c as u64, 0);
                }
                continue;
            }
            let m = read_map(st, c, None)?;
            for i in (0..g).filter(|&i| m.is_start(i) && !referenced(i)) {
                rep(kind, c as u64, i as u64);
            }
        }
    }
    Ok(n)
}
