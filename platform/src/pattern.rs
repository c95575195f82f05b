//! A self-checking payload: every byte of a block depends on its key and its
//! offset, so a byte of another block, of another offset or of a stale copy
//! fails verification. What the demo, the tests and the GPU check write and
//! verify.

use cxlkv_core::hash::{mix64, Key};

/// The pattern's seed for block `key`.
pub fn seed_of(key: Key) -> u64 {
    mix64(key.lo ^ mix64(key.hi))
}

/// Word `j` (bytes `8j..8j+8`) of the pattern of seed `seed`.
fn word(seed: u64, j: usize) -> u64 {
    seed ^ (j as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29)
}

/// Fills `buf` with block `key`'s pattern (a partial last word takes the
/// word's first bytes). Whole words at a time: memory speed, not a copy
/// call per word.
pub fn fill(key: Key, buf: &mut [u8]) {
    let seed = seed_of(key);
    let mut words = buf.chunks_exact_mut(8);
    let mut j = 0;
    for w in &mut words {
        w.copy_from_slice(&word(seed, j).to_le_bytes());
        j += 1;
    }
    let tail = words.into_remainder();
    let n = tail.len();
    tail.copy_from_slice(&word(seed, j).to_le_bytes()[..n]);
}

/// Bytes compared between two looks at whether a mismatch was found: a
/// wrong block fails within this much, a right one never stops early.
const VERIFY_STRIDE: usize = 4096;

/// Whether `buf` holds block `key`'s pattern. Compares whole words, folding
/// differences with OR so the loop has no branch per word (the compiler
/// vectorises it), and looks at the result every few kilobytes.
pub fn verify(key: Key, buf: &[u8]) -> bool {
    let seed = seed_of(key);
    let whole = buf.len() & !7;
    let (body, tail) = buf.split_at(whole);
    for (s, piece) in body.chunks(VERIFY_STRIDE).enumerate() {
        let base = s * (VERIFY_STRIDE / 8);
        let diff = piece.chunks_exact(8).enumerate().fold(0u64, |d, (k, w)| {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            d | (u64::from_le_bytes(b) ^ word(seed, base + k))
        });
        if diff != 0 {
            return false;
        }
    }
    tail == &word(seed, whole / 8).to_le_bytes()[..tail.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pattern as first defined, byte by byte: fill and verify must
    /// agree with it exactly (blocks written by older builds stay valid).
    fn reference(key: Key, len: usize) -> Vec<u8> {
        let seed = seed_of(key);
        (0..len).map(|i| word(seed, i / 8).to_le_bytes()[i % 8]).collect()
    }

    #[test]
    fn fill_writes_the_reference_pattern_at_every_length() {
        let k = Key { lo: 5, hi: 9 };
        for len in [0, 1, 7, 8, 9, 63, 4096, 4097, 8191, 20_003] {
            let mut buf = vec![0u8; len];
            fill(k, &mut buf);
            assert_eq!(buf, reference(k, len), "length {len}");
            assert!(verify(k, &buf), "length {len}");
        }
    }

    #[test]
    fn a_payload_verifies_only_against_its_own_key_and_offsets() {
        let (a, b) = (Key { lo: 1, hi: 2 }, Key { lo: 1, hi: 3 });
        let mut buf = vec![0u8; 4099];
        fill(a, &mut buf);
        assert!(verify(a, &buf));
        assert!(!verify(b, &buf));
        // Shifted by one word: another offset's bytes.
        assert!(!verify(a, &buf[8..]));
        buf[4098] ^= 1;
        assert!(!verify(a, &buf));
        buf[4098] ^= 1;
        // A wrong byte anywhere: in the first stride, past it, in the tail.
        for at in [0, 7, 4095, 4096, 4097] {
            buf[at] ^= 0x40;
            assert!(!verify(a, &buf), "byte {at}");
            buf[at] ^= 0x40;
        }
        assert!(verify(a, &buf));
    }
}
