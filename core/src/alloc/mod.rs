//! The shared allocator (TraCT §3.5): a global chunk bitmap hands chunks to
//! nodes; a chunk is cut into granules and holds blocks of any size, each a
//! run of granules. The state of record is in the region — chunk owner and
//! kind, and per chunk a used map and a start map — so a block freed by
//! another node, or left behind by a dead one, is never lost.
//!
//! Any size goes in any chunk of its kind, so freed space serves the next
//! request whatever its size (a chunk per size would strand most of the
//! region once sizes mix). KV chunks are shared by every node: a node fills
//! its own chunks first, then takes a fresh one, then places the block in
//! another node's chunk that has room. Raw chunks hold one node's
//! allocations only (recovery reclaims a dead node's unrooted raw blocks by
//! chunk). A block above a chunk takes a run of whole chunks.
//!
//! Locks: a chunk's maps change under its owner's heap lock (whoever
//! allocates or frees there takes it); the bitmap and chunk ownership under
//! the alloc lock. Order: heap before alloc, one heap at a time.

pub mod map;

use crate::coherence::{Coherence, Site};
use crate::layout::{
    ChunkRecord, Layout, CHUNK_CONT, CHUNK_FREE, CHUNK_HELD, CHUNK_KV, CHUNK_LARGE, CHUNK_RAW, RELEASE_AT,
};
use crate::lock::{Held, JournalSites};
use crate::mutant::mutant;
use crate::node::{Node, HINTS};
use crate::store::Store;
use crate::{Error, Result};

pub use map::ChunkMap;

/// Chunk heads a KV allocation looks at, past its hints, before it reports
/// the region full (the caller then evicts): bounds the search in regions of
/// hundreds of thousands of chunks. A cursor per node rotates the window.
const SCAN_LIMIT: u32 = 1024;

/// Times an operation refused because a chunk was void runs again after the
/// repair (one is enough unless the chunk keeps coming back void).
const VOID_RETRIES: u32 = 3;

/// Chunk records dropped from this host's cache together, then read (their
/// loads miss in parallel): one ordering per batch instead of one per record.
const RECORD_BATCH: usize = 64;

/// Chunks whose record and maps this node read fresh, or wrote, under one
/// grant of its own heap lock (`seq`). While it holds or keeps that grant
/// (see `lock.rs`, "Parked grants") nobody else wrote them: every writer of
/// a chunk's record and maps holds its owner's heap lock (recovery too), and
/// a grant's ticket is its alone. Its cached copies are then current and
/// are read without being dropped first. A revoked holder's late write-back
/// is not seen that way; the next fresh reader finds it (the record's stamp
/// or the maps' checksum), as it finds one landing just after a fresh read.
#[derive(Clone, Copy)]
pub(crate) struct FreshChunks {
    /// The grant: its lock and ticket (tickets are counted per lock).
    lock: u32,
    seq: u64,
    /// Chunks whose record and maps are current.
    maps: [u32; HINTS],
    /// Chunks whose record alone is.
    recs: [u32; HINTS],
}

impl Default for FreshChunks {
    fn default() -> Self {
        FreshChunks { lock: u32::MAX, seq: 0, maps: [u32::MAX; HINTS], recs: [u32::MAX; HINTS] }
    }
}

impl FreshChunks {
    /// Whether chunk `c`'s record and maps were read fresh or written under
    /// grant `held`.
    fn has(&self, held: &Held, c: u32) -> bool {
        self.under(held) && self.maps.contains(&c)
    }

    /// Whether chunk `c`'s record was.
    fn has_record(&self, held: &Held, c: u32) -> bool {
        self.under(held) && (self.recs.contains(&c) || self.maps.contains(&c))
    }

    fn under(&self, held: &Held) -> bool {
        ((self.lock, self.seq) == (held.lock, held.seq) || mutant!("alloc.fresh_under_any_grant")) && held.seq != 0
    }

    /// Chunk `c`'s record (and its maps, when `maps`) were read fresh or
    /// written under grant `held`: a new grant forgets the chunks of the
    /// one before.
    fn note(&mut self, held: &Held, c: u32, maps: bool) {
        if (self.lock, self.seq) != (held.lock, held.seq) {
            *self = FreshChunks { lock: held.lock, seq: held.seq, ..FreshChunks::default() };
        }
        let set = if maps { &mut self.maps } else { &mut self.recs };
        if !set.contains(&c) {
            set.rotate_right(1);
            if let Some(first) = set.first_mut() {
                *first = c;
            }
        }
    }

    /// Chunk `c` changes hands (released): read it fresh from now on.
    fn forget(&mut self, c: u32) {
        for x in self.maps.iter_mut().chain(self.recs.iter_mut()).filter(|x| **x == c) {
            *x = u32::MAX;
        }
    }
}

/// Reads the records of chunks `cs` fresh (each one's line dropped from this
/// host's cache, at `site`, before it is read), handing each to `f` in
/// order. Like [`Store::fresh`] of each, batched: a batch's lines are
/// dropped with one ordering after them, so a scan of many records costs
/// about one memory round trip per batch rather than one per record.
fn fresh_records<C: Coherence>(
    store: &Store<C>,
    cs: impl Iterator<Item = u32>,
    site: Site,
    mut f: impl FnMut(u32, ChunkRecord) -> Result<()>,
) -> Result<()> {
    let l = &store.layout;
    let mut ids = [0u32; RECORD_BATCH];
    let mut lines = [0u64; RECORD_BATCH];
    let mut cs = cs.peekable();
    while cs.peek().is_some() {
        let mut n = 0usize;
        // The batch's room first: a zip pulls from its first iterator first,
        // and an id pulled past the room would be lost.
        for ((id, line), c) in ids.iter_mut().zip(lines.iter_mut()).zip(cs.by_ref()) {
            (*id, *line) = (c, l.chunk(c));
            n = n.saturating_add(1);
        }
        let (ids, lines) = (ids.get(..n).unwrap_or(&[]), lines.get(..n).unwrap_or(&[]));
        store.co.invalidate_lines(&store.view, lines, site)?;
        for (&c, &line) in ids.iter().zip(lines) {
            f(c, store.view.read(line)?)?;
        }
    }
    Ok(())
}

/// What an allocation is for: payload of index entries, or raw bytes the
/// application manages (named roots point at these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// KV payload blocks (recovery reclaims those no entry references).
    Kv,
    /// Raw allocations (recovery reclaims a dead node's unless a root names them).
    Raw,
}

impl Kind {
    fn code(self) -> u32 {
        match self {
            Kind::Kv => CHUNK_KV,
            Kind::Raw => CHUNK_RAW,
        }
    }
}

/// How a request is placed: a run of granules in one chunk, or whole chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// This many granules of one chunk.
    Granules(u32),
    /// This many whole chunks (a `CHUNK_LARGE` run).
    Chunks(u32),
}

/// Where a request of `len` bytes goes. `InvalidArgument` for 0 bytes,
/// `TooLarge` beyond the payload area.
pub fn placement(layout: &Layout, len: u64) -> Result<Placement> {
    if len == 0 {
        return Err(Error::InvalidArgument);
    }
    let chunk = layout.chunk_size();
    if len > chunk {
        let chunks = len.div_ceil(chunk);
        if chunks > layout.n_chunks as u64 {
            return Err(Error::TooLarge);
        }
        return Ok(Placement::Chunks(chunks as u32));
    }
    Ok(Placement::Granules(len.div_ceil(layout.granule()) as u32))
}

/// Bytes a request of `len` bytes occupies (granules or chunks, rounded up).
pub fn block_size(layout: &Layout, len: u64) -> Result<u64> {
    Ok(match placement(layout, len)? {
        Placement::Granules(k) => (k as u64).saturating_mul(layout.granule()),
        Placement::Chunks(k) => (k as u64).saturating_mul(layout.chunk_size()),
    })
}

/// Chunk index holding payload offset `off`, checked (`Corrupt` outside the
/// payload area).
pub fn chunk_of(layout: &Layout, off: u64) -> Result<u32> {
    if !layout.payload.contains(off, 1) {
        return Err(Error::Corrupt);
    }
    // Inside the payload area (checked above): at or after its start.
    Ok((off.wrapping_sub(layout.payload.start) >> layout.caps.chunk_shift) as u32)
}

/// Loads chunk `c`'s maps from this host's view, invalidating them first
/// when `site` is given.
pub fn read_map<C: Coherence>(st: &Store<C>, c: u32, site: Option<Site>) -> Result<ChunkMap> {
    let l = &st.layout;
    let w = l.map_words();
    let off = l.chunk_map(c);
    if let Some(site) = site {
        st.co.invalidate(&st.view, off, (w as u64).saturating_mul(16), site)?;
    }
    let mut m = ChunkMap::empty(l.granules());
    // The used map's `w` words, then the start map's (the view checks each).
    let word = |i: usize| off.wrapping_add((i as u64).wrapping_mul(8));
    for (i, (u, s)) in m.used.iter_mut().zip(m.start.iter_mut()).take(w).enumerate() {
        *u = st.view.load_u64(word(i))?;
        *s = st.view.load_u64(word(w.wrapping_add(i)))?;
    }
    Ok(m)
}

/// Stores words `lo..hi` of both of chunk `c`'s maps; flushes them when
/// `site` is given (recovery writes without, and flushes the whole area).
pub fn write_map<C: Coherence>(
    st: &Store<C>,
    c: u32,
    m: &ChunkMap,
    lo: usize,
    hi: usize,
    site: Option<Site>,
) -> Result<()> {
    let l = &st.layout;
    let w = l.map_words();
    let hi = hi.min(w);
    if lo >= hi {
        return Ok(());
    }
    let off = l.chunk_map(c);
    let word = |i: usize| off.wrapping_add((i as u64).wrapping_mul(8));
    for (i, (&u, &s)) in m.used.iter().zip(&m.start).enumerate().take(hi).skip(lo) {
        st.view.store_u64(word(i), u)?;
        st.view.store_u64(word(w.wrapping_add(i)), s)?;
    }
    if let Some(site) = site {
        // `lo < hi` (checked above).
        let n = (hi.wrapping_sub(lo) as u64).wrapping_mul(8);
        st.co.flush(&st.view, word(lo), n, site)?;
        st.co.flush(&st.view, word(w.wrapping_add(lo)), n, site)?;
    }
    Ok(())
}

/// Map words covering granules `i..i+k`.
fn words_of(i: u32, k: u32) -> (usize, usize) {
    ((i / 64) as usize, (i.saturating_add(k).div_ceil(64)) as usize)
}

/// The block at `off` of chunk `c` (record `rec`, maps `m`): its first
/// granule (0 for a run) and its bytes. `None` when no block starts there.
pub fn block_of(layout: &Layout, c: u32, rec: &ChunkRecord, m: &ChunkMap, off: u64) -> Option<(u32, u64)> {
    let base = layout.chunk_payload(c);
    match rec.kind {
        CHUNK_LARGE if off == base && rec.blocks == 1 => Some((0, rec.block_size)),
        CHUNK_KV | CHUNK_RAW => {
            let rel = off.checked_sub(base)?;
            let g = layout.granule();
            let i = u32::try_from(rel.checked_div(g)?).ok().filter(|_| rel.is_multiple_of(g))?;
            m.extent(i).map(|k| (i, (k as u64).saturating_mul(g)))
        }
        _ => None,
    }
}

/// A block found by [`Node::locate`], to be freed: `(i, k)`, its `k`
/// granules from granule `i` of the chunk whose maps are `m`, or `None` for
/// a run of whole chunks (a large block).
struct Located {
    m: ChunkMap,
    block: Option<(u32, u32)>,
}

/// True when the record `rec` of a chunk cut into granules, with maps `m`,
/// both read under its owner's heap lock whose repair floor is `floor`, is
/// void: stamped below the floor, or its maps not summing to its checksum.
/// Either is a revoked holder's late write-back (its record, or a map line
/// over a newer one; see `lock.rs`, "Zombies"): what the chunk holds is
/// unknown until a recovery rebuilds it.
pub(crate) fn chunk_void(rec: &ChunkRecord, m: &ChunkMap, floor: u64) -> bool {
    (rec.ticket < floor || rec.map_sum != m.checksum()) && !mutant!("alloc.trust_void_chunk")
}

/// True if the chunk kind is one the allocator writes.
pub fn kind_valid(kind: u32) -> bool {
    matches!(kind, CHUNK_FREE | CHUNK_KV | CHUNK_RAW | CHUNK_LARGE | CHUNK_CONT | CHUNK_HELD)
}

/// What a free asks of its caller under the block's heap lock (see
/// [`Node::free_raw_unlinking`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unlink {
    /// The block is found and is freed next: whatever names it goes now.
    Found,
    /// The free was refused after `Found`: what named the block comes back.
    Undo,
    /// The block's chunk is tainted: its free is to be deferred, the block
    /// (of `len` bytes) left allocated and held by a deferred-free record
    /// the caller writes in place of what named it (see
    /// [`crate::roots::ROOT_DEFERRED_FREE`]). The caller answers true when
    /// it did so (nothing else is changed), false to have it freed now.
    Defer { len: u64 },
}

impl<C: Coherence> Node<'_, C> {
    /// Allocates `len` raw bytes of region payload for the application;
    /// returns its offset. Publish it through a named root to keep it alive
    /// across this node's death.
    pub fn alloc(&self, len: u64) -> Result<u64> {
        self.alloc_kind(len, Kind::Raw, false)
    }

    /// Frees a raw allocation (from [`Node::alloc`], by any node).
    /// `InvalidArgument`, changing nothing, for any offset that is not the
    /// start of a live raw allocation — a KV block's payload included.
    ///
    /// A block in a tainted chunk (see [`ChunkRecord::taint`]) is not freed
    /// at once: a node declared dead there may still write back a map line
    /// that would bring it back. It stays allocated, held by a deferred-free
    /// record in the root table (taken under the roots lock), until the
    /// recovery that finds the chunk untainted frees it (see
    /// [`crate::roots::ROOT_DEFERRED_FREE`]). With no root record left, it
    /// is freed at once all the same.
    pub fn free(&self, off: u64) -> Result<()> {
        if chunk_of(&self.store.layout, off).is_err() {
            return Err(Error::InvalidArgument);
        }
        self.after_void_repairs(|| {
            let mut tainted = false;
            let r = self.free_block_with(off, Kind::Raw, false, &mut |u| match u {
                Unlink::Defer { .. } => {
                    // Nothing changed yet: again, under the roots lock.
                    tainted = true;
                    Err(Error::Busy)
                }
                _ => Ok(false),
            });
            if !tainted {
                return r;
            }
            self.with_lock(self.store.layout.locks().roots(), || {
                self.free_block_with(off, Kind::Raw, true, &mut |u| match u {
                    Unlink::Defer { len } => match self.root_defer_free_locked(off, len) {
                        Ok(()) => Ok(true),
                        Err(Error::RootsFull) => Ok(false),
                        Err(e) => Err(e),
                    },
                    _ => Ok(false),
                })
            })
        })
    }

    /// Notes a chunk found void: a recovery repairs it once this node holds
    /// no lock (see [`Node::repair_void_chunks`]). Returns `Recovering`, the
    /// refusal of what needed the chunk.
    pub(crate) fn void_found(&self) -> Error {
        *self.local.void_chunk.lock() = true;
        Error::Recovering
    }

    /// Has the chunks this node found void repaired: runs a recovery, which
    /// rebuilds every chunk and stamps it with its own tickets. Called by
    /// [`Node::with_held`] once an outermost lock is released (a recovery
    /// takes every lock). True when a repair was due and ran through; one
    /// that fails is tried again after the next outermost lock.
    pub(crate) fn repair_void_chunks(&self) -> bool {
        if !core::mem::take(&mut *self.local.void_chunk.lock()) {
            return false;
        }
        self.env.recovering(true);
        let r = self.recover(0);
        self.env.recovering(false);
        let ok = r.is_ok();
        let flag = if ok { &self.local.void_repaired } else { &self.local.void_chunk };
        *flag.lock() = true;
        ok
    }

    /// Runs `op` (which takes no lock the caller holds); while it is refused
    /// (`Recovering`) because a chunk it met was void, and that chunk was
    /// repaired since, runs it again — a few times at most.
    pub(crate) fn after_void_repairs<T>(&self, mut op: impl FnMut() -> Result<T>) -> Result<T> {
        *self.local.void_repaired.lock() = false;
        let mut r = op();
        for _ in 0..VOID_RETRIES {
            if !matches!(r, Err(Error::Recovering)) || !core::mem::take(&mut *self.local.void_repaired.lock()) {
                break;
            }
            r = op();
        }
        r
    }

    /// Frees the KV block at `off` (its entry is gone); caller holds the
    /// stripe lock. A block that is not a KV block means the entry that
    /// named it was damaged: `Corrupt`.
    pub(crate) fn free_kv(&self, off: u64) -> Result<()> {
        match self.free_block(off, Kind::Kv, true) {
            Err(Error::InvalidArgument) => Err(Error::Corrupt),
            r => r,
        }
    }

    /// Places a KV block of `len` bytes for a caller holding a stripe lock
    /// and placing several blocks in a row (a batch's reserves): in this
    /// node's recent chunks, under a hold of its heap lock kept in `hold`
    /// from one block to the next (taken on first use), so a batch pays one
    /// lock round trip, not one a block. Then in any node's chunk (this
    /// node's own under the same hold; before another owner's heap lock
    /// is taken, the hold goes back), then in a fresh chunk, under the
    /// hold again. A block of whole chunks gives the hold back first and
    /// [`Node::alloc_kind`] places it: a heap lock is never waited for
    /// while this one is held. The caller gives the hold back
    /// with [`Node::release_heap`] before it frees or evicts (which take
    /// heap locks) and before its stripe lock goes.
    pub(crate) fn alloc_kv_held(&self, len: u64, hold: &mut Option<Held>) -> Result<u64> {
        let l = &self.store.layout;
        let k = match placement(l, len)? {
            Placement::Granules(k) => k,
            Placement::Chunks(_) => {
                self.release_heap(hold)?;
                return self.alloc_kind(len, Kind::Kv, true);
            }
        };
        // This node's recent chunks, then any node's, then a fresh chunk.
        let hints = *self.local.hints.lock();
        let hinted = hints.iter().copied().filter(|&c| c < l.n_chunks);
        let got = match self.under_heap(hold, |held| self.take_tightest(hinted, k, Kind::Kv, held))? {
            Some(got) => Some(got),
            None => match self.alloc_shared(k, hold)? {
                Some(got) => Some(got),
                None => self.under_heap(hold, |held| self.take_fresh(k, Kind::Kv, held))?,
            },
        };
        let (c, off) = got.ok_or(Error::OutOfSpace)?;
        self.hint(c);
        Ok(off)
    }

    /// Runs `f` under this node's heap lock as `hold` keeps it (taking it
    /// first, nested, when it does not). On an error `f` met, the hold goes
    /// back: a revoked one outranks that error.
    fn under_heap<T>(&self, hold: &mut Option<Held>, f: impl FnOnce(&Held) -> Result<T>) -> Result<T> {
        if hold.is_none() {
            *hold = Some(self.lock_with(self.store.layout.locks().heap(self.id), 0, true)?);
        }
        let r = match hold.as_ref() {
            Some(held) => f(held),
            None => Err(Error::InvalidArgument),
        };
        if let Err(e) = r {
            return Err(match self.release_heap(hold) {
                Err(Error::Revoked) => Error::Revoked,
                _ => e,
            });
        }
        r
    }

    /// Whole chunks a block of `len` bytes takes: its run of chunks, one
    /// for a block of a chunk's every granule, 0 for a smaller block (or a
    /// length no block can have).
    pub(crate) fn whole_chunks(&self, len: u64) -> u32 {
        match placement(&self.store.layout, len) {
            Ok(Placement::Chunks(c)) => c,
            Ok(Placement::Granules(k)) if k >= self.store.layout.granules() => 1,
            _ => 0,
        }
    }

    /// Free chunks as the chunk bitmap shows them now, taking no lock: a
    /// hint (an allocation or a release may land at once). A block of a
    /// whole chunk or more fits only a free one (a chunk whose last block
    /// goes is released).
    pub(crate) fn free_chunks_hint(&self) -> Result<u32> {
        let l = &self.store.layout;
        let words = l.n_chunks.div_ceil(64);
        // SYNC: hint only (writers: the alloc lock's holders): what it
        // decides, evicting before a reserve rather than after that reserve
        // found no room, the reserve itself checks under the locks.
        self.store.co.invalidate(
            &self.store.view,
            l.chunk_bitmap.start,
            u64::from(words).saturating_mul(8),
            Site("alloc.room.hint"),
        )?;
        let mut free = 0u32;
        for w in 0..words {
            let used = self.store.view.load_u64(bitmap_word(l, w.saturating_mul(64)))?;
            // Bits past the last chunk do not count.
            let valid = l.n_chunks.saturating_sub(w.saturating_mul(64)).min(64);
            let mask = if valid >= 64 { u64::MAX } else { (1u64 << valid).wrapping_sub(1) };
            free = free.saturating_add((!used & mask).count_ones());
        }
        Ok(free)
    }

    /// Gives back a heap-lock hold kept by [`Node::alloc_kv_held`], if any.
    /// `Revoked` when it was revoked meanwhile: what was placed under it
    /// cannot be trusted.
    pub(crate) fn release_heap(&self, hold: &mut Option<Held>) -> Result<()> {
        match hold.take() {
            Some(held) => self.unlock(held),
            None => Ok(()),
        }
    }

    /// Allocates `len` bytes of the given kind. KV blocks are reclaimed by
    /// recovery unless an index entry references them.
    /// `nested`: the caller holds another lock (a lock awaiting repair then
    /// fails at once with `Recovering`: see `Node::with_lock_mode`).
    ///
    /// A block goes where it fits tightest, so large holes stay whole for
    /// large blocks: among this node's recent chunks first; for KV, then
    /// among every node's chunks (a window of them); only then in a fresh
    /// chunk. Raw blocks stay in this node's own chunks.
    pub(crate) fn alloc_kind(&self, len: u64, kind: Kind, nested: bool) -> Result<u64> {
        let l = &self.store.layout;
        let heap = l.locks().heap(self.id);
        let k = match placement(l, len)? {
            Placement::Chunks(k) => return self.with_held(heap, nested, |held| self.alloc_run(k, kind, held)),
            Placement::Granules(k) => k,
        };
        if kind == Kind::Kv {
            // A KV block smaller than a chunk goes as a batch's do, under
            // one hold of the heap lock: this node's recent chunks, any
            // node's, a fresh one, with no release and retake between.
            let mut hold = None;
            let got = self.alloc_kv_held(len, &mut hold);
            // A revoked hold outranks what was placed under it.
            return match (got, self.release_heap(&mut hold)) {
                (_, Err(Error::Revoked)) => Err(Error::Revoked),
                (Ok(off), released) => released.map(|()| off),
                (Err(e), _) => Err(e),
            };
        }
        // Raw blocks go in this node's chunks only: its recent ones, then
        // all of them, then a fresh one.
        let hints = *self.local.hints.lock();
        let (c, off) = self
            .with_held(heap, nested, |held| {
                let hinted = hints.iter().copied().filter(|&c| c < l.n_chunks);
                if let Some(got) = self.take_tightest(hinted, k, kind, held)? {
                    return Ok(Some(got));
                }
                if let Some(got) = self.take_tightest(0..l.n_chunks, k, kind, held)? {
                    return Ok(Some(got));
                }
                self.take_fresh(k, kind, held)
            })?
            .ok_or(Error::OutOfSpace)?;
        self.hint(c);
        Ok(off)
    }

    /// Among chunks `cs`, takes `k` granules of `kind` in the one of this
    /// node's whose longest free run fits them tightest. Caller holds this
    /// node's heap lock (`held`).
    fn take_tightest(
        &self,
        cs: impl Iterator<Item = u32>,
        k: u32,
        kind: Kind,
        held: &Held,
    ) -> Result<Option<(u32, u64)>> {
        let mut best: Option<(u32, u32, ChunkRecord)> = None;
        let known = *self.local.fresh_chunks.lock();
        let (mut cached, mut n) = ([0u32; HINTS], 0usize);
        let fresh = cs.filter(|&c| {
            let Some(slot) = cached.get_mut(n).filter(|_| known.has_record(held, c)) else {
                return true;
            };
            (*slot, n) = (c, n.saturating_add(1));
            false
        });
        // SYNC: fresh records (writers: this heap lock's holders).
        fresh_records(self.store, fresh, Site("alloc.own.rec"), |c, rec| {
            if rec.owner == self.id.wrapping_add(1) {
                // This node's heap lock guards it (`held`).
                self.local.fresh_chunks.lock().note(held, c, false);
            }
            if self.fits(&rec, self.id, k, kind) && best.is_none_or(|(f, _, _)| rec.free_max < f) {
                best = Some((rec.free_max, c, rec));
            }
            Ok(())
        })?;
        for &c in cached.get(..n).unwrap_or(&[]) {
            // Current without a drop: read or written under this very grant
            // (see `FreshChunks`). Of two that fit alike, the one in cache.
            let rec: ChunkRecord = self.store.view.read(self.store.layout.chunk(c))?;
            if self.fits(&rec, self.id, k, kind) && best.is_none_or(|(f, _, _)| rec.free_max <= f) {
                best = Some((rec.free_max, c, rec));
            }
        }
        match best {
            Some((_, c, rec)) => Ok(self.take_in(c, rec, k, held)?.map(|off| (c, off))),
            None => Ok(None),
        }
    }

    /// Takes a fresh chunk of `kind` and `k` granules at its start. Caller
    /// holds this node's heap lock (`held`).
    fn take_fresh(&self, k: u32, kind: Kind, held: &Held) -> Result<Option<(u32, u64)>> {
        let l = &self.store.layout;
        let Some(c) = self.with_held(l.locks().alloc(), true, |alloc| self.grab_chunks(1, kind, held.seq, alloc))?
        else {
            return Ok(None);
        };
        // Written just now by this thread, under the locks it still holds.
        let rec: ChunkRecord = self.store.view.read(l.chunk(c))?;
        // Whatever this node knew of it is from before it changed hands.
        self.local.fresh_chunks.lock().forget(c);
        Ok(self.take_in(c, rec, k, held)?.map(|off| (c, off)))
    }

    /// True when chunk record `rec` is `owner`'s, of `kind`, with `k` free
    /// granules in a row — and, for raw blocks, no taint: a late map line
    /// of a tainted chunk then only brings back blocks freed since, never
    /// hides one placed since.
    fn fits(&self, rec: &ChunkRecord, owner: u32, k: u32, kind: Kind) -> bool {
        rec.owner == owner.wrapping_add(1)
            && rec.kind == kind.code()
            && rec.granules == self.store.layout.granules()
            && rec.free_max >= k
            && (kind == Kind::Kv || rec.taint == 0 || mutant!("alloc.raw_beside_tainted"))
    }

    /// Places `k` granules of KV payload in the KV chunk of any node whose
    /// longest free run fits them tightest, among this node's hints and a
    /// window of every chunk (the records are peeked at without a lock).
    /// Each try takes that chunk owner's heap lock and reads the record
    /// again; a lock that awaits repair is passed over. The caller holds a
    /// lock. A chunk of this node's own is tried under `hold` (this node's
    /// heap lock, kept, or taken and kept: see [`Node::alloc_kv_held`]);
    /// before another owner's lock is taken, `hold` goes back.
    fn alloc_shared(&self, k: u32, hold: &mut Option<Held>) -> Result<Option<(u32, u64)>> {
        let l = &self.store.layout;
        let hints = *self.local.hints.lock();
        let n = l.n_chunks;
        let start = {
            let mut cur = self.local.alloc_cursor.lock();
            // `n` chunks, at least one (the layout's); 0 would scan nothing.
            let v = cur.checked_rem(n).unwrap_or(0);
            *cur = v.wrapping_add(SCAN_LIMIT.min(n)).checked_rem(n).unwrap_or(0);
            v
        };
        let window = (0..SCAN_LIMIT.min(n)).map(|i| start.wrapping_add(i).checked_rem(n).unwrap_or(0));
        // The tightest few, tried in order: a lost race moves on to the next.
        const TRIES: usize = 4;
        let mut cand = [(u32::MAX, u32::MAX, 0u32); TRIES];
        // SYNC: hints only (writer: the owner's heap-lock holders): the
        // record is read again under the lock before anything is taken, so
        // a stale copy costs a missed or a wasted try, never a wrong block.
        let cs = hints.iter().copied().filter(|&c| c < n).chain(window);
        fresh_records(self.store, cs, Site("alloc.shared.hint"), |c, rec| {
            if rec.kind != CHUNK_KV || rec.free_max < k || rec.owner == 0 || rec.owner > l.caps.max_nodes {
                return Ok(());
            }
            if cand.iter().any(|&(_, x, _)| x == c) {
                return Ok(());
            }
            if let Some(worst) = cand.iter_mut().max_by_key(|x| x.0) {
                if rec.free_max < worst.0 {
                    // Not 0 (checked above).
                    *worst = (rec.free_max, c, rec.owner.wrapping_sub(1));
                }
            }
            Ok(())
        })?;
        cand.sort_unstable();
        for &(_, c, owner) in cand.iter().filter(|&&(f, _, _)| f != u32::MAX) {
            let take = |held: &Held| {
                let rec: ChunkRecord = self.store.fresh(l.chunk(c), Site("alloc.shared.rec"))?;
                if !self.fits(&rec, owner, k, Kind::Kv) {
                    return Ok(None);
                }
                self.take_in(c, rec, k, held)
            };
            let got = if owner == self.id {
                self.under_heap(hold, take)
            } else {
                self.release_heap(hold)?;
                self.with_held(l.locks().heap(owner), true, take)
            };
            match got {
                Ok(Some(off)) => return Ok(Some((c, off))),
                Ok(None) | Err(Error::Recovering | Error::InvalidArgument) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Remembers chunk `c` as one to try first (it had or got room).
    fn hint(&self, c: u32) {
        let mut h = self.local.hints.lock();
        if let Some(seen) = h.iter().position(|&x| x == c).and_then(|at| h.get_mut(..=at)) {
            seen.rotate_right(1);
        } else {
            h.rotate_right(1);
            if let Some(first) = h.first_mut() {
                *first = c;
            }
        }
    }

    /// Frees the block at `off` (of `kind`), taking its chunk owner's heap
    /// lock; `nested` when the caller holds another lock.
    fn free_block(&self, off: u64, kind: Kind, nested: bool) -> Result<()> {
        self.free_block_with(off, kind, nested, &mut |_| Ok(false))
    }

    /// Frees the raw allocation at `off` for a caller holding another lock
    /// (the roots lock): `unlink(Found)` runs under the owner's heap lock
    /// once the allocation is found, just before it is freed, and
    /// `unlink(Undo)` undoes it should the free then be refused
    /// (`Recovering`); in a tainted chunk, `unlink(Defer)` runs instead
    /// (see [`Unlink::Defer`]). `InvalidArgument`, with `unlink` never
    /// called, when no raw allocation starts at `off`.
    pub(crate) fn free_raw_unlinking(&self, off: u64, unlink: &mut dyn FnMut(Unlink) -> Result<bool>) -> Result<()> {
        if chunk_of(&self.store.layout, off).is_err() {
            return Err(Error::InvalidArgument);
        }
        self.free_block_with(off, Kind::Raw, true, unlink)
    }

    fn free_block_with(
        &self,
        off: u64,
        kind: Kind,
        nested: bool,
        unlink: &mut dyn FnMut(Unlink) -> Result<bool>,
    ) -> Result<()> {
        let l = &self.store.layout;
        let c = chunk_of(l, off)?;
        for _ in 0..4 {
            let owner = self.owner_hint(c)?;
            let done = self
                .with_held(l.locks().heap(owner), nested, |held| self.free_under(c, off, kind, owner, held, unlink))?;
            if done {
                if kind == Kind::Kv {
                    self.hint(c);
                }
                return Ok(());
            }
        }
        Err(Error::Busy)
    }

    /// Frees the KV blocks at `offs` (their entries are gone: removed, and
    /// stored, by the caller, which holds the stripe lock), `out[i]` saying
    /// how block `i` went as [`Node::free_kv`] would (`Recovering`: it stays
    /// allocated until the pending recovery reclaims it). Blocks of one
    /// chunk owner in a row share one hold of that owner's heap lock: one
    /// round trip for them all, not one a block. No two heap locks are ever
    /// held at once. The first grant fences, as `free_kv`'s does: the
    /// entries stored before the call are in memory before any block is
    /// freed. `Err` only when this node was fenced meanwhile (`Revoked`).
    pub(crate) fn free_kv_batch(&self, offs: &[u64], out: &mut [Result<()>]) -> Result<()> {
        let l = &self.store.layout;
        // The heap lock kept from one block to the next, and whose it is.
        let mut kept: Option<(u32, Held)> = None;
        let mut fenced = false;
        for (&off, o) in offs.iter().zip(out.iter_mut()) {
            *o = Err(Error::Busy);
            let Ok(c) = chunk_of(l, off) else {
                *o = Err(Error::Corrupt);
                continue;
            };
            for _ in 0..4 {
                let owner = match self.owner_hint(c) {
                    Ok(owner) => owner,
                    Err(e) => {
                        *o = Err(e);
                        break;
                    }
                };
                if kept.as_ref().is_some_and(|(w, _)| *w != owner) {
                    if let Some((_, held)) = kept.take() {
                        match self.unlock(held) {
                            Err(Error::Revoked) => {
                                fenced = true;
                                break;
                            }
                            r => r?,
                        }
                    }
                }
                if kept.is_none() {
                    match self.lock_with(l.locks().heap(owner), 0, true) {
                        Ok(held) => kept = Some((owner, held)),
                        Err(Error::Revoked) => fenced = true,
                        Err(e) => *o = Err(e),
                    }
                }
                let Some((_, held)) = kept.as_ref() else { break };
                match self.free_under(c, off, Kind::Kv, owner, held, &mut |_| Ok(false)) {
                    Ok(true) => {
                        *o = Ok(());
                        self.hint(c);
                        break;
                    }
                    // The chunk changed hands: its new owner's lock next.
                    Ok(false) => {}
                    Err(e) => {
                        *o = Err(e);
                        break;
                    }
                }
            }
            if *o == Err(Error::InvalidArgument) {
                *o = Err(Error::Corrupt);
            }
            if fenced {
                break;
            }
        }
        if let Some((_, held)) = kept.take() {
            // A revoked hold outranks what was freed under it.
            fenced |= self.unlock(held) == Err(Error::Revoked);
        }
        if fenced {
            return Err(Error::Revoked);
        }
        Ok(())
    }

    /// The node whose heap lock guards chunk `c`, from this host's copy of
    /// its record however stale (the record read fresh under that lock
    /// decides, and refreshes the copy when it was wrong). `InvalidArgument`
    /// when a fresh look finds no owner (or a continuation chunk).
    fn owner_hint(&self, c: u32) -> Result<u32> {
        let l = &self.store.layout;
        let mut rec: ChunkRecord = self.store.view.read(l.chunk(c))?;
        let bad = |r: &ChunkRecord| r.owner == 0 || r.owner > l.caps.max_nodes || r.kind == CHUNK_CONT;
        if bad(&rec) {
            // SYNC: before refusing, a fresh look (writer: the owner's
            // allocator, under its heap lock).
            rec = self.store.fresh(l.chunk(c), Site("alloc.free.peek"))?;
            if bad(&rec) {
                return Err(Error::InvalidArgument);
            }
        }
        // Not 0 (`bad` refuses it).
        Ok(rec.owner.wrapping_sub(1))
    }

    /// Frees the block of `kind` at `off` in chunk `c` under `owner`'s heap
    /// lock (`held`): false, freeing nothing, when the chunk is no longer
    /// `owner`'s (the caller takes the new owner's lock and tries again).
    /// `unlink` as [`Node::free_raw_unlinking`] has it.
    fn free_under(
        &self,
        c: u32,
        off: u64,
        kind: Kind,
        owner: u32,
        held: &Held,
        unlink: &mut dyn FnMut(Unlink) -> Result<bool>,
    ) -> Result<bool> {
        let l = &self.store.layout;
        let rec: ChunkRecord = self.store.fresh(l.chunk(c), Site("alloc.free.rec"))?;
        if rec.owner != owner.wrapping_add(1) && !mutant!("alloc.free_under_wrong_lock") {
            return Ok(false);
        }
        let b = self.locate(c, &rec, off, kind, held)?;
        if let (CHUNK_RAW, Some((_, k))) = (rec.kind, b.block) {
            // A node declared dead and not yet quiet may still write back a
            // map line of this chunk, read before this free: it would bring
            // the block back (placed over by nobody: raw blocks keep off
            // tainted chunks, but lost).
            let len = u64::from(k).wrapping_mul(l.granule());
            if rec.taint != 0 && !mutant!("alloc.free_in_tainted") && unlink(Unlink::Defer { len })? {
                return Ok(true);
            }
        }
        unlink(Unlink::Found)?;
        if let Err(e) = self.free_located(c, rec, b, held) {
            unlink(Unlink::Undo)?;
            return Err(e);
        }
        Ok(true)
    }

    /// Finds the block of `kind` at `off` in chunk `c` (record `rec`, read
    /// fresh; its maps are read fresh here), changing nothing; caller holds
    /// the owner's heap lock (`held`). `InvalidArgument` when no such block
    /// starts there; `Recovering` when the chunk is void (it is marked for
    /// repair: see [`Node::repair_void_chunks`]).
    fn locate(&self, c: u32, rec: &ChunkRecord, off: u64, kind: Kind, held: &Held) -> Result<Located> {
        let l = &self.store.layout;
        let base = l.chunk_payload(c);
        match rec.kind {
            CHUNK_LARGE => {
                if off != base || rec.large_kind != kind.code() || rec.blocks != 1 {
                    return Err(Error::InvalidArgument);
                }
                // A run's maps stay empty.
                if chunk_void(rec, &ChunkMap::empty(l.granules()), held.floor) {
                    return Err(self.void_found());
                }
                Ok(Located { m: ChunkMap::empty(l.granules()), block: None })
            }
            CHUNK_KV | CHUNK_RAW if rec.kind == kind.code() => {
                let g = l.granule();
                let rel = off.checked_sub(base).ok_or(Error::InvalidArgument)?;
                let i = rel.checked_div(g).filter(|_| rel.is_multiple_of(g)).ok_or(Error::InvalidArgument)? as u32;
                let m = read_map(self.store, c, Some(Site("alloc.free.map.read")))?;
                if chunk_void(rec, &m, held.floor) {
                    return Err(self.void_found());
                }
                let k = m.extent(i).ok_or(Error::InvalidArgument)?;
                Ok(Located { m, block: Some((i, k)) })
            }
            _ => Err(Error::InvalidArgument),
        }
    }

    /// Frees the block [`Node::locate`] found in chunk `c` (record `rec`);
    /// caller holds the owner's heap lock. A refusal (`Recovering`, the
    /// alloc lock awaiting repair) changes nothing.
    fn free_located(&self, c: u32, rec: ChunkRecord, b: Located, held: &Held) -> Result<()> {
        let l = &self.store.layout;
        let Located { mut m, block } = b;
        match block {
            None => self
                .with_held(l.locks().alloc(), true, |alloc| self.release_chunks(c, rec.run.max(1), rec.taint, alloc)),
            Some((i, k)) => {
                if rec.blocks <= 1 {
                    // The chunk's last block: the chunk goes back whole, under
                    // the alloc lock taken before anything changes, so a
                    // refusal (`Recovering`) leaves map and record as they were.
                    return self.with_held(l.locks().alloc(), true, |alloc| {
                        self.clear_block(c, rec, &mut m, i, k, held.seq, Some(alloc))
                    });
                }
                self.clear_block(c, rec, &mut m, i, k, held.seq, None)
            }
        }
    }

    /// Clears block `i` (`k` granules) from chunk `c`'s map, then updates
    /// its record, or releases the chunk when it was the last block (caller
    /// then holds the alloc lock too, under `alloc`). Caller holds the
    /// owner's heap lock, under `ticket`.
    #[allow(clippy::too_many_arguments)]
    fn clear_block(
        &self,
        c: u32,
        mut rec: ChunkRecord,
        m: &mut ChunkMap,
        i: u32,
        k: u32,
        ticket: u64,
        alloc: Option<&Held>,
    ) -> Result<()> {
        let l = &self.store.layout;
        m.clear(i, k);
        let (lo, hi) = words_of(i, k);
        // SYNC: map words published under the heap lock (reader: the next
        // allocator of the chunk, recovery, check).
        write_map(self.store, c, m, lo, hi, Some(Site("alloc.free.map")))?;
        rec.used = rec.used.saturating_sub(k);
        rec.blocks = rec.blocks.saturating_sub(1);
        if rec.blocks == 0 {
            return self.release_chunks(c, 1, rec.taint, alloc.ok_or(Error::Corrupt)?);
        }
        rec.free_max = m.longest_free();
        rec.ticket = ticket;
        rec.map_sum = m.checksum();
        // SYNC: record published under the heap lock.
        self.store.publish(l.chunk(c), &rec, Site("alloc.free.publish"))
    }

    fn alloc_run(&self, k: u32, kind: Kind, held: &Held) -> Result<u64> {
        let l = &self.store.layout;
        match self.with_held(l.locks().alloc(), true, |alloc| self.grab_chunks(k, kind, held.seq, alloc))? {
            Some(c) => Ok(l.chunk_payload(c)),
            None => Err(Error::OutOfSpace),
        }
    }

    /// Takes `k` free granules of chunk `c`, whose record `rec` was just read
    /// fresh and fits them. Caller holds the owner's heap lock (`held`).
    /// `None` when the chunk is void (it is marked for repair: see
    /// [`Node::repair_void_chunks`]).
    fn take_in(&self, c: u32, mut rec: ChunkRecord, k: u32, held: &Held) -> Result<Option<u64>> {
        let l = &self.store.layout;
        let current = self.local.fresh_chunks.lock().has(held, c);
        // SYNC: the maps fresh (writers: this heap lock's holders), unless
        // read or written under this very grant (see `FreshChunks`).
        let mut m = read_map(self.store, c, (!current).then_some(Site("alloc.take.map.read")))?;
        if chunk_void(&rec, &m, held.floor) {
            self.void_found();
            return Ok(None);
        }
        let Some(i) = m.find_free(k) else {
            // The record promised room the maps do not have.
            return Err(Error::Corrupt);
        };
        m.set(i, k);
        let (lo, hi) = words_of(i, k);
        // SYNC: map words published under the heap lock (reader: free,
        // recovery, check).
        write_map(self.store, c, &m, lo, hi, Some(Site("alloc.take.map")))?;
        rec.used = rec.used.saturating_add(k);
        rec.blocks = rec.blocks.saturating_add(1);
        rec.free_max = m.longest_free();
        rec.ticket = held.seq;
        rec.map_sum = m.checksum();
        // SYNC: record published under the heap lock (reader: free, recovery).
        self.store.publish(l.chunk(c), &rec, Site("alloc.take.publish"))?;
        self.local.fresh_chunks.lock().note(held, c, true);
        Ok(Some(l.chunk_payload(c).wrapping_add((i as u64).wrapping_mul(l.granule()))))
    }

    /// Finds `k` contiguous free chunks and marks them this node's: one chunk
    /// of `kind` cut into granules (`k` = 1), or a run holding one block.
    /// Caller holds alloc (`alloc`), and this node's heap lock under
    /// `ticket`.
    fn grab_chunks(&self, k: u32, kind: Kind, ticket: u64, alloc: &Held) -> Result<Option<u32>> {
        let l = &self.store.layout;
        let words = l.n_chunks.div_ceil(64);
        self.store.co.invalidate(
            &self.store.view,
            l.chunk_bitmap.start,
            (words as u64).saturating_mul(8),
            Site("alloc.bitmap.read"),
        )?;
        let mut run = 0u32;
        let mut c = 0u32;
        while c < l.n_chunks {
            let w = self.store.view.load_u64(bitmap_word(l, c))?;
            if c.is_multiple_of(64) && w == u64::MAX {
                run = 0;
                c = c.saturating_add(64);
                continue;
            }
            if w & (1 << (c % 64)) == 0 {
                let Some(taint) = self.chunk_free(c)? else {
                    // Not free whatever the bit says: a bitmap line a revoked
                    // holder wrote back late. The bit is set again.
                    set_bitmap(self.store, c, true)?;
                    run = 0;
                    c = c.saturating_add(1);
                    continue;
                };
                if taint != 0 && kind == Kind::Raw && !mutant!("alloc.raw_in_tainted") {
                    // A node that may still write back a line of it is not
                    // quiet yet: fine for KV blocks, not for raw ones.
                    run = 0;
                    c = c.saturating_add(1);
                    continue;
                }
                run = run.saturating_add(1);
                if run == k {
                    // The run of `k` ends at `c`.
                    let first = c.saturating_add(1).saturating_sub(k);
                    self.mark_chunks(first, k, kind, ticket, alloc)?;
                    return Ok(Some(first));
                }
            } else {
                run = 0;
            }
            c = c.saturating_add(1);
        }
        Ok(None)
    }

    /// Chunk `c`'s taint when its record (read fresh) is free: only then
    /// may it be taken, whatever the bitmap says. (A free record's maps are
    /// empty: whoever frees a chunk clears them first, and a free record
    /// landing late over a chunk in use is what the release journal rules
    /// out.) `None` when it is not free.
    fn chunk_free(&self, c: u32) -> Result<Option<u64>> {
        // SYNC: fresh record (writers: the alloc lock's holders, recovery).
        let rec: ChunkRecord = self.store.fresh(self.store.layout.chunk(c), Site("alloc.claim.rec"))?;
        if mutant!("alloc.claim_unverified") {
            return Ok(Some(rec.taint));
        }
        Ok((rec == ChunkRecord { taint: rec.taint, ..ChunkRecord::default() }).then_some(rec.taint))
    }

    /// Writes the records of newly taken chunks `first..first+k`: one chunk
    /// cut into granules (`k` = 1; a run always spans two chunks or more), or
    /// a run. Their maps are empty already: a free chunk's maps always are.
    /// Each keeps its taint (a run: all of them, on every chunk).
    ///
    /// Zombies: the records are journaled first, as a release is (see
    /// [`Node::release_chunks`]): a recovery that revoked the alloc lock
    /// after the check finds the journal and holds the chunks for this node
    /// until it is quiet, so its records landing late take no chunk another
    /// node took meanwhile.
    fn mark_chunks(&self, first: u32, k: u32, kind: Kind, ticket: u64, alloc: &Held) -> Result<()> {
        let l = &self.store.layout;
        self.journal_handover(first, k, alloc)?;
        let map_sum = ChunkMap::empty(l.granules()).checksum();
        let mut taint = 0u64;
        for j in 0..k {
            // Read fresh by `chunk_free` just now, under the alloc lock.
            let rec: ChunkRecord = self.store.view.read(l.chunk(first.saturating_add(j)))?;
            taint |= rec.taint;
        }
        for j in 0..k {
            let c = first.saturating_add(j);
            let owner = self.id.wrapping_add(1);
            let rec = if k == 1 {
                ChunkRecord {
                    owner,
                    kind: kind.code(),
                    run: 1,
                    free_max: l.granules(),
                    granules: l.granules(),
                    ticket,
                    map_sum,
                    taint,
                    ..ChunkRecord::default()
                }
            } else if j == 0 {
                ChunkRecord {
                    owner,
                    kind: CHUNK_LARGE,
                    run: k,
                    large_kind: kind.code(),
                    used: l.granules(),
                    blocks: 1,
                    block_size: (k as u64).saturating_mul(l.chunk_size()),
                    ticket,
                    map_sum,
                    taint,
                    ..ChunkRecord::default()
                }
            } else {
                ChunkRecord { owner, kind: CHUNK_CONT, run: first, taint, ..ChunkRecord::default() }
            };
            self.store.publish(l.chunk(c), &rec, Site("alloc.chunk.claim"))?;
            set_bitmap(self.store, c, true)?;
        }
        self.clear_handover()
    }

    /// Returns chunks `c..c+k` to the global bitmap (their maps are empty),
    /// each free record keeping `taint` (the chunk's, or the run's). Caller
    /// holds alloc (`alloc`).
    ///
    /// Zombies: a free record carries no ticket, so a revoked holder's
    /// release written back late would free a chunk that another node took
    /// since. So the release is journaled in this node's request line, in
    /// memory before this node checks that it still holds the alloc lock,
    /// and that check comes before any free record is written: a recovery
    /// that revoked the lock before the check is seen by it (and nothing is
    /// written), and one that revoked it after finds the journal and holds
    /// the chunks out of use until this node is quiet (`CHUNK_HELD`).
    pub(crate) fn release_chunks(&self, c: u32, k: u32, taint: u64, alloc: &Held) -> Result<()> {
        let l = &self.store.layout;
        if c.checked_add(k).is_none_or(|end| end > l.n_chunks) {
            return Err(Error::Corrupt);
        }
        self.journal_handover(c, k, alloc)?;
        for j in 0..k {
            let cj = c.saturating_add(j);
            self.local.fresh_chunks.lock().forget(cj);
            let free = ChunkRecord { taint, ..ChunkRecord::default() };
            self.store.publish(l.chunk(cj), &free, Site("alloc.chunk.release"))?;
            set_bitmap(self.store, cj, false)?;
        }
        self.clear_handover()
    }

    /// Journals chunks `c..c+k` changing hands (taken or given back by this
    /// node) in its request line (see [`Node::journal_then_check`]):
    /// `Revoked`, and nothing to write, when this node lost the alloc lock
    /// (`alloc`).
    fn journal_handover(&self, c: u32, k: u32, alloc: &Held) -> Result<()> {
        let word = u64::from(c).wrapping_add(1) | u64::from(k) << 32;
        let unchecked = mutant!("alloc.release_unchecked");
        self.journal_then_check(RELEASE_AT, word, alloc, &HANDOVER, unchecked)
    }

    /// Clears the journal of [`Node::journal_handover`] once the records it
    /// vouches for are in memory. Were it left, a recovery that finds this
    /// node fenced would hold the chunks if still free: out of use until
    /// the node is quiet, never taken from a user.
    fn clear_handover(&self) -> Result<()> {
        self.clear_journal(RELEASE_AT, &HANDOVER)
    }
}

/// The sites of the chunk hand-over journal.
const HANDOVER: JournalSites = JournalSites {
    write: Site("alloc.release.journal"),
    fence: Site("alloc.release.journal.fence"),
    check: Site("alloc.release.check"),
    landed: Site("alloc.release.landed"),
    clear: Site("alloc.release.clear"),
};

/// The offset of the chunk bitmap's word holding chunk `c`'s bit.
fn bitmap_word(l: &Layout, c: u32) -> u64 {
    l.chunk_bitmap.start.wrapping_add(((c / 64) as u64).wrapping_mul(8))
}

/// Sets or clears chunk `c`'s bit in the global bitmap and flushes its line.
/// Caller holds the alloc lock.
pub(crate) fn set_bitmap<C: Coherence>(store: &Store<C>, c: u32, used: bool) -> Result<()> {
    let off = bitmap_word(&store.layout, c);
    store.co.invalidate(&store.view, off, 8, Site("alloc.bitmap.rmw"))?;
    let mut w = store.view.load_u64(off)?;
    if used {
        w |= 1 << (c % 64);
    } else {
        w &= !(1 << (c % 64));
    }
    store.view.store_u64(off, w)?;
    // SYNC: bitmap word published under the alloc lock.
    store.co.flush(&store.view, off, 8, Site("alloc.bitmap.publish"))
}

/// Allocation hint count (re-exported for tests).
pub const HINT_COUNT: usize = HINTS;

#[cfg(test)]
mod tests {
    use super::FreshChunks;
    use crate::lock::Held;

    fn grant(lock: u32, seq: u64) -> Held {
        Held { lock, seq, floor: 0 }
    }

    #[test]
    fn fresh_chunks_hold_for_one_grant_of_one_lock() {
        let mut f = FreshChunks::default();
        let (mine, theirs) = (grant(3, 7), grant(4, 7));
        f.note(&mine, 10, true);
        f.note(&mine, 11, false);
        assert!(f.has(&mine, 10) && f.has_record(&mine, 10));
        assert!(!f.has(&mine, 11) && f.has_record(&mine, 11), "a record read fresh says nothing of its maps");
        // The same ticket of another lock (tickets are counted per lock):
        // nothing this node knows under it.
        assert!(!f.has(&theirs, 10) && !f.has_record(&theirs, 11));
        // A later grant of the same lock: another holder may have come between.
        assert!(!f.has(&grant(3, 8), 10));
        // Noting under another grant forgets the chunks of the one before.
        f.note(&theirs, 20, true);
        assert!(f.has(&theirs, 20) && !f.has(&mine, 10));
        // A chunk that changes hands is forgotten.
        f.forget(20);
        assert!(!f.has(&theirs, 20) && !f.has_record(&theirs, 20));
        // No grant (ticket 0) knows anything.
        let none = grant(3, 0);
        f.note(&none, 1, true);
        assert!(!f.has(&none, 1));
    }
}
