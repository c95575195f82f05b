//! A chunk's granule maps, as a value: the used map (a bit per granule in
//! use) and the start map (a bit on the first granule of each block). Pure
//! bit arithmetic, no region access: the allocator, recovery and `check`
//! read a map from the region, work on it here, and write back the words
//! that changed.

use crate::layout::MAX_GRANULES;

/// Words of each map at the most granules a chunk can have.
pub const MAX_WORDS: usize = (MAX_GRANULES / 64) as usize;

/// The two granule maps of one chunk (`granules` of them in use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkMap {
    /// Used granules.
    pub used: [u64; MAX_WORDS],
    /// First granule of each block.
    pub start: [u64; MAX_WORDS],
    /// Granules of the chunk (a multiple of 64, at most [`MAX_GRANULES`]).
    pub granules: u32,
}

/// What a map says about itself, for `check`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSummary {
    /// Used granules.
    pub used: u32,
    /// Blocks (start bits).
    pub blocks: u32,
    /// Longest free run.
    pub free_max: u32,
    /// Every start bit is on a used granule, and no bit lies past the
    /// chunk's granules.
    pub well_formed: bool,
}

/// The longest run of zero bits in `w`.
fn longest_zero_run(w: u64) -> u32 {
    let mut x = !w;
    let mut best = 0;
    while x != 0 {
        x >>= x.trailing_zeros();
        let n = x.trailing_ones();
        best = best.max(n);
        if n == 64 {
            break;
        }
        x >>= n;
    }
    best
}

#[inline]
fn get(m: &[u64; MAX_WORDS], i: u32) -> bool {
    // Beyond the map: taken (nothing is ever placed there).
    m.get((i / 64) as usize).is_none_or(|w| w & (1 << (i % 64)) != 0)
}

/// Sets (`on`) or clears granule `i`'s bit of `m` (nothing beyond the map).
#[inline]
fn put(m: &mut [u64; MAX_WORDS], i: u32, on: bool) {
    if let Some(w) = m.get_mut((i / 64) as usize) {
        if on {
            *w |= 1 << (i % 64);
        } else {
            *w &= !(1 << (i % 64));
        }
    }
}

impl ChunkMap {
    /// Empty maps of `granules` granules.
    pub fn empty(granules: u32) -> ChunkMap {
        debug_assert!(granules.is_multiple_of(64) && granules <= MAX_GRANULES);
        ChunkMap { used: [0; MAX_WORDS], start: [0; MAX_WORDS], granules }
    }

    /// Words of each map in use.
    pub fn words(&self) -> usize {
        ((self.granules / 64) as usize).min(MAX_WORDS)
    }

    /// True when granule `i` is in use.
    pub fn is_used(&self, i: u32) -> bool {
        i < self.granules && get(&self.used, i)
    }

    /// True when a block starts at granule `i`.
    pub fn is_start(&self, i: u32) -> bool {
        i < self.granules && get(&self.start, i)
    }

    /// The lowest granule beginning `k` free granules (first fit).
    pub fn find_free(&self, k: u32) -> Option<u32> {
        if k == 0 || k > self.granules {
            return None;
        }
        let (mut i, mut run) = (0u32, 0u32);
        while i < self.granules {
            let w = self.used.get((i / 64) as usize).copied().unwrap_or(u64::MAX);
            if i % 64 == 0 && w == u64::MAX {
                run = 0;
                i = i.saturating_add(64);
                continue;
            }
            if i % 64 == 0 && w == 0 && run.saturating_add(64) < k {
                run = run.saturating_add(64);
                i = i.saturating_add(64);
                continue;
            }
            if w & (1 << (i % 64)) == 0 {
                run = run.saturating_add(1);
                if run == k {
                    return Some(i.saturating_add(1).saturating_sub(k));
                }
            } else {
                run = 0;
            }
            i = i.saturating_add(1);
        }
        None
    }

    /// Granules of the block starting at `i`: the used run from `i` up to the
    /// next start, free granule or the end. `None` when no block starts there.
    pub fn extent(&self, i: u32) -> Option<u32> {
        if !self.is_start(i) || !self.is_used(i) {
            return None;
        }
        let mut j = i.saturating_add(1);
        while j < self.granules && self.is_used(j) && !self.is_start(j) {
            j = j.saturating_add(1);
        }
        Some(j.saturating_sub(i))
    }

    /// True when granules `i..i+k` are all free (and inside the chunk).
    pub fn is_free(&self, i: u32, k: u32) -> bool {
        i.checked_add(k).is_some_and(|e| e <= self.granules && (i..e).all(|g| !get(&self.used, g)))
    }

    /// Marks `i..i+k` as one block. The caller checked they are free.
    pub fn set(&mut self, i: u32, k: u32) {
        debug_assert!(self.is_free(i, k) && k > 0);
        for g in i..i.saturating_add(k) {
            put(&mut self.used, g, true);
        }
        put(&mut self.start, i, true);
    }

    /// Frees the block of `k` granules at `i` (its extent).
    pub fn clear(&mut self, i: u32, k: u32) {
        for g in i..i.saturating_add(k).min(self.granules) {
            put(&mut self.used, g, false);
        }
        put(&mut self.start, i, false);
    }

    /// Longest run of free granules.
    pub fn longest_free(&self) -> u32 {
        let (mut best, mut run) = (0u32, 0u32);
        for &w in self.used.iter().take(self.words()) {
            if w == 0 {
                run = run.saturating_add(64);
                continue;
            }
            // Granule i is bit i: the free bits at the bottom of the word
            // extend the run from the words below; those at the top start
            // the next one.
            best = best.max(run.saturating_add(w.trailing_zeros())).max(longest_zero_run(w));
            run = w.leading_zeros();
        }
        best.max(run)
    }

    /// Checksum of both maps (the words in use), as a chunk record carries
    /// it ([`crate::layout::ChunkRecord::map_sum`]): a map line written back
    /// late over a newer one no longer sums to the record's.
    pub fn checksum(&self) -> u64 {
        let w = self.words();
        let used = crate::hash::checksum32(self.used.get(..w).unwrap_or_default());
        let start = crate::hash::checksum32(self.start.get(..w).unwrap_or_default());
        (used as u64) << 32 | start as u64
    }

    /// Counts and shape, for `check`.
    pub fn summary(&self) -> MapSummary {
        let w = self.words();
        let pairs = || self.used.iter().zip(&self.start);
        let used = pairs().take(w).fold(0u32, |n, (u, _)| n.saturating_add(u.count_ones()));
        let blocks = pairs().take(w).fold(0u32, |n, (_, s)| n.saturating_add(s.count_ones()));
        let beyond = pairs().skip(w).any(|(&u, &s)| u != 0 || s != 0);
        let subset = pairs().take(w).all(|(&u, &s)| s & !u == 0);
        // A used granule must belong to a block: the first used granule of
        // each used run carries a start bit.
        let mut orphan = false;
        let mut carry = 0u64;
        for (&u, &st) in pairs().take(w) {
            let run_starts = u & !(u << 1 | carry);
            orphan |= run_starts & !st != 0;
            carry = u >> 63;
        }
        MapSummary { used, blocks, free_max: self.longest_free(), well_formed: !beyond && subset && !orphan }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_skips_full_words_and_finds_runs_across_words() {
        let mut sut = ChunkMap::empty(256);
        sut.set(0, 64);
        sut.set(64, 60);
        assert_eq!(sut.find_free(4), Some(124));
        assert_eq!(sut.find_free(70), Some(124));
        assert_eq!(sut.find_free(133), None);
        assert_eq!(sut.find_free(132), Some(124));
        assert_eq!(sut.longest_free(), 132);
    }

    #[test]
    fn adjacent_blocks_keep_their_extents() {
        let mut sut = ChunkMap::empty(64);
        sut.set(0, 3);
        sut.set(3, 5);
        sut.set(10, 1);
        assert_eq!(sut.extent(0), Some(3));
        assert_eq!(sut.extent(3), Some(5));
        assert_eq!(sut.extent(10), Some(1));
        assert_eq!(sut.extent(1), None, "not a block start");
        assert_eq!(sut.extent(9), None, "free");
        sut.clear(3, 5);
        assert_eq!(sut.extent(0), Some(3));
        assert!(sut.is_free(3, 7));
        let s = sut.summary();
        assert_eq!((s.used, s.blocks, s.free_max, s.well_formed), (4, 2, 53, true));
    }

    #[test]
    fn longest_free_matches_a_bit_by_bit_count() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut sut = ChunkMap::empty(256);
            for w in sut.used.iter_mut().take(4) {
                x = crate::hash::mix64(x);
                // Sparse, dense, empty and full words alike.
                *w = match x % 4 {
                    0 => 0,
                    1 => u64::MAX,
                    2 => x & (x >> 7),
                    _ => x,
                };
            }
            let (mut best, mut run) = (0u32, 0u32);
            for i in 0..256 {
                if sut.is_used(i) {
                    run = 0;
                } else {
                    run = run.saturating_add(1);
                    best = best.max(run);
                }
            }
            assert_eq!(sut.longest_free(), best, "{:x?}", &sut.used[..4]);
        }
    }

    #[test]
    fn summary_flags_bits_outside_blocks() {
        let mut sut = ChunkMap::empty(64);
        sut.used[0] = 0b110;
        assert!(!sut.summary().well_formed, "used run without a start");
        let mut sut = ChunkMap::empty(64);
        sut.start[0] = 1;
        assert!(!sut.summary().well_formed, "start on a free granule");
        let mut sut = ChunkMap::empty(64);
        sut.used[1] = 1;
        sut.start[1] = 1;
        assert!(!sut.summary().well_formed, "past the chunk");
    }
}
