//! The shared allocator (TraCT §3.5): a global chunk bitmap hands fixed-size
//! chunks to nodes; each node carves blocks of one size out of its chunks.
//! The state of record is in the region — chunk owner, kind, block size and a
//! block bitmap per chunk — so a block freed by another node, or left behind
//! by a dead one, is never lost.
//!
//! Locks: a node's chunks are guarded by its heap lock (anyone freeing a block
//! in them takes it); the bitmap and chunk ownership by the alloc lock. Order:
//! heap before alloc.

use crate::coherence::{Coherence, Site};
use crate::layout::{
    ChunkRecord, Layout, CHUNK_CONT, CHUNK_FREE, CHUNK_KV, CHUNK_LARGE, CHUNK_RAW, MAX_BLOCKS_PER_CHUNK,
};
use crate::mem::LINE;
use crate::node::{Node, HINTS};
use crate::region::Store;
use crate::{Error, Result};

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

/// Block size used for a request of `len` bytes: 64-byte granules, at least
/// 1/256 of a chunk (the block map has 256 bits). Above a chunk: whole chunks.
pub fn block_size(layout: &Layout, len: u64) -> Result<u64> {
    if len == 0 {
        return Err(Error::InvalidArgument);
    }
    let chunk = layout.chunk_size();
    let bs = len.checked_add(LINE - 1).ok_or(Error::TooLarge)? & !(LINE - 1);
    if bs > chunk {
        let chunks = bs.div_ceil(chunk);
        if chunks > layout.n_chunks as u64 {
            return Err(Error::TooLarge);
        }
        return Ok(chunks * chunk);
    }
    Ok(bs.max(chunk / MAX_BLOCKS_PER_CHUNK))
}

/// Chunk index holding payload offset `off`, checked.
pub fn chunk_of(layout: &Layout, off: u64) -> Result<u32> {
    if !layout.payload.contains(off, 1) {
        return Err(Error::Corrupt);
    }
    Ok(((off - layout.payload.start) >> layout.caps.chunk_shift) as u32)
}

fn bit(map: &[u64; 4], i: u32) -> bool {
    map[(i / 64) as usize] & (1 << (i % 64)) != 0
}

impl<C: Coherence> Node<'_, C> {
    /// Allocates `len` raw bytes of region payload for the application;
    /// returns its offset. Publish it through a named root to keep it alive
    /// across this node's death.
    pub fn alloc(&self, len: u64) -> Result<u64> {
        self.alloc_kind(len, Kind::Raw, false)
    }

    /// Allocates `len` bytes of the given kind. KV blocks are reclaimed by
    /// recovery unless an index entry references them.
    /// `nested`: the caller holds another lock (see `Node::with_lock_nested`).
    pub(crate) fn alloc_kind(&self, len: u64, kind: Kind, nested: bool) -> Result<u64> {
        let l = &self.store.layout;
        let bs = block_size(l, len)?;
        let heap = l.locks().heap(self.id);
        if bs > l.chunk_size() {
            return self.with_lock_mode(heap, nested, || self.alloc_run(bs, kind));
        }
        self.with_lock_mode(heap, nested, || self.alloc_block(bs, kind))
    }

    /// Frees an allocation made by any node (caller holds no lock).
    pub fn free(&self, off: u64) -> Result<()> {
        self.free_at(off, false)
    }

    /// Frees `off`; `nested` when the caller holds another lock.
    pub(crate) fn free_at(&self, off: u64, nested: bool) -> Result<()> {
        let l = &self.store.layout;
        let c = chunk_of(l, off)?;
        for _ in 0..4 {
            // A hint from this host's copy, however stale: the owner's heap
            // lock to take. The record read fresh under that lock decides
            // (and refreshes the hint when it was wrong).
            let mut rec: ChunkRecord = self.store.region.read(l.chunk(c))?;
            let bad = |r: &ChunkRecord| r.owner == 0 || r.owner > l.caps.max_nodes || r.kind == CHUNK_CONT;
            if bad(&rec) {
                // SYNC: before refusing, a fresh look (writer: the owner's
                // allocator, under its heap lock).
                rec = self.store.fresh(l.chunk(c), Site("alloc.free.peek"))?;
                if bad(&rec) {
                    return Err(Error::InvalidArgument);
                }
            }
            let owner = rec.owner - 1;
            let done = self.with_lock_mode(l.locks().heap(owner), nested, || {
                let rec: ChunkRecord = self.store.fresh(l.chunk(c), Site("alloc.free.rec"))?;
                if rec.owner != owner + 1 {
                    return Ok(false);
                }
                self.free_locked(c, rec, off)?;
                Ok(true)
            })?;
            if done {
                return Ok(());
            }
        }
        Err(Error::Busy)
    }

    /// Frees `off` in chunk `c` (record `rec`, read fresh); caller holds the
    /// owner's heap lock.
    pub(crate) fn free_locked(&self, c: u32, mut rec: ChunkRecord, off: u64) -> Result<()> {
        let l = &self.store.layout;
        let base = l.chunk_payload(c);
        match rec.kind {
            CHUNK_LARGE => {
                if off != base {
                    return Err(Error::InvalidArgument);
                }
                self.with_lock_nested(l.locks().alloc(), || self.release_chunks(c, rec.run.max(1)))
            }
            CHUNK_KV | CHUNK_RAW => {
                let bs = rec.block_size;
                if bs == 0 || (off - base) % bs != 0 {
                    return Err(Error::InvalidArgument);
                }
                let i = ((off - base) / bs) as u32;
                if i >= rec.nblocks || !bit(&rec.bitmap, i) {
                    return Err(Error::InvalidArgument);
                }
                rec.bitmap[(i / 64) as usize] &= !(1 << (i % 64));
                rec.used = rec.used.saturating_sub(1);
                if rec.used == 0 {
                    return self.with_lock_nested(l.locks().alloc(), || self.release_chunks(c, 1));
                }
                // SYNC: block map published under the heap lock.
                self.store.publish(l.chunk(c), &rec, Site("alloc.free.publish"))
            }
            _ => Err(Error::InvalidArgument),
        }
    }

    fn alloc_block(&self, bs: u64, kind: Kind) -> Result<u64> {
        let l = &self.store.layout;
        let mut hints = self.local.hints.lock();
        for h in hints.iter() {
            if *h < l.n_chunks {
                if let Some(off) = self.take_block(*h, bs, kind)? {
                    return Ok(off);
                }
            }
        }
        let fresh = self.with_lock_nested(l.locks().alloc(), || self.grab_chunks(1, bs, kind))?;
        if let Some(c) = fresh {
            hints.rotate_right(1);
            hints[0] = c;
            if let Some(off) = self.take_block(c, bs, kind)? {
                return Ok(off);
            }
        }
        // Slow path: a chunk of ours with room that fell out of the hints.
        for c in 0..l.n_chunks {
            if let Some(off) = self.take_block(c, bs, kind)? {
                hints.rotate_right(1);
                hints[0] = c;
                return Ok(off);
            }
        }
        Err(Error::OutOfSpace)
    }

    fn alloc_run(&self, bs: u64, kind: Kind) -> Result<u64> {
        let l = &self.store.layout;
        let k = (bs / l.chunk_size()) as u32;
        match self.with_lock_nested(l.locks().alloc(), || self.grab_chunks(k, bs, kind))? {
            Some(c) => Ok(l.chunk_payload(c)),
            None => Err(Error::OutOfSpace),
        }
    }

    /// Takes a free block of size `bs` from chunk `c` if it is ours and fits.
    fn take_block(&self, c: u32, bs: u64, kind: Kind) -> Result<Option<u64>> {
        let l = &self.store.layout;
        let mut rec: ChunkRecord = self.store.fresh(l.chunk(c), Site("alloc.take.rec"))?;
        if rec.owner != self.id + 1 || rec.kind != kind.code() || rec.block_size != bs || rec.used >= rec.nblocks {
            return Ok(None);
        }
        let Some(i) = (0..rec.nblocks).find(|&i| !bit(&rec.bitmap, i)) else {
            return Err(Error::Corrupt);
        };
        rec.bitmap[(i / 64) as usize] |= 1 << (i % 64);
        rec.used += 1;
        // SYNC: block map published under the heap lock (reader: free, recovery).
        self.store.publish(l.chunk(c), &rec, Site("alloc.take.publish"))?;
        Ok(Some(l.chunk_payload(c) + i as u64 * bs))
    }

    /// Finds `k` contiguous free chunks, marks them ours. Caller holds alloc.
    fn grab_chunks(&self, k: u32, bs: u64, kind: Kind) -> Result<Option<u32>> {
        let l = &self.store.layout;
        let words = l.n_chunks.div_ceil(64);
        self.store.co.invalidate(
            &self.store.region,
            l.chunk_bitmap.start,
            words as u64 * 8,
            Site("alloc.bitmap.read"),
        )?;
        let mut run = 0u32;
        let mut c = 0u32;
        while c < l.n_chunks {
            let w = self.store.region.load_u64(l.chunk_bitmap.start + (c / 64) as u64 * 8)?;
            if c % 64 == 0 && w == u64::MAX {
                run = 0;
                c += 64;
                continue;
            }
            if w & (1 << (c % 64)) == 0 {
                run += 1;
                if run == k {
                    let first = c + 1 - k;
                    self.mark_chunks(first, k, bs, kind)?;
                    return Ok(Some(first));
                }
            } else {
                run = 0;
            }
            c += 1;
        }
        Ok(None)
    }

    fn mark_chunks(&self, first: u32, k: u32, bs: u64, kind: Kind) -> Result<()> {
        let l = &self.store.layout;
        let chunk = l.chunk_size();
        for j in 0..k {
            let c = first + j;
            let rec = if k == 1 {
                ChunkRecord {
                    owner: self.id + 1,
                    kind: kind.code(),
                    block_size: bs,
                    nblocks: (chunk / bs) as u32,
                    used: 0,
                    run: 1,
                    large_kind: 0,
                    bitmap: [0; 4],
                }
            } else if j == 0 {
                ChunkRecord {
                    owner: self.id + 1,
                    kind: CHUNK_LARGE,
                    block_size: bs,
                    nblocks: 1,
                    used: 1,
                    run: k,
                    large_kind: kind.code(),
                    bitmap: [1, 0, 0, 0],
                }
            } else {
                ChunkRecord { owner: self.id + 1, kind: CHUNK_CONT, run: first, ..ChunkRecord::default() }
            };
            self.store.publish(l.chunk(c), &rec, Site("alloc.chunk.claim"))?;
            set_bitmap(self.store, c, true)?;
        }
        Ok(())
    }

    /// Returns chunks `c..c+k` to the global bitmap. Caller holds alloc.
    pub(crate) fn release_chunks(&self, c: u32, k: u32) -> Result<()> {
        let l = &self.store.layout;
        for j in 0..k {
            if c + j >= l.n_chunks {
                return Err(Error::Corrupt);
            }
            self.store.publish(l.chunk(c + j), &ChunkRecord::default(), Site("alloc.chunk.release"))?;
            set_bitmap(self.store, c + j, false)?;
        }
        Ok(())
    }
}

/// Sets or clears chunk `c`'s bit in the global bitmap and flushes its line.
/// Caller holds the alloc lock.
pub(crate) fn set_bitmap<C: Coherence>(store: &Store<C>, c: u32, used: bool) -> Result<()> {
    let off = store.layout.chunk_bitmap.start + (c / 64) as u64 * 8;
    store.co.invalidate(&store.region, off, 8, Site("alloc.bitmap.rmw"))?;
    let mut w = store.region.load_u64(off)?;
    if used {
        w |= 1 << (c % 64);
    } else {
        w &= !(1 << (c % 64));
    }
    store.region.store_u64(off, w)?;
    // SYNC: bitmap word published under the alloc lock.
    store.co.flush(&store.region, off, 8, Site("alloc.bitmap.publish"))
}

/// The block `off` occupies, if `rec` (chunk `c`'s record) allocated it:
/// (block index, block size).
pub fn block_of(layout: &Layout, c: u32, rec: &ChunkRecord, off: u64) -> Option<(u32, u64)> {
    let base = layout.chunk_payload(c);
    match rec.kind {
        CHUNK_LARGE if off == base => Some((0, rec.block_size)),
        CHUNK_KV | CHUNK_RAW if rec.block_size != 0 && off >= base && (off - base) % rec.block_size == 0 => {
            let i = ((off - base) / rec.block_size) as u32;
            (i < rec.nblocks && i < MAX_BLOCKS_PER_CHUNK as u32).then_some((i, rec.block_size))
        }
        _ => None,
    }
}

/// True if the chunk kind is one the allocator writes.
pub fn kind_valid(kind: u32) -> bool {
    matches!(kind, CHUNK_FREE | CHUNK_KV | CHUNK_RAW | CHUNK_LARGE | CHUNK_CONT)
}

/// Allocation hint count (re-exported for tests).
pub const HINT_COUNT: usize = HINTS;
