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
/// word's first bytes).
pub fn fill(key: Key, buf: &mut [u8]) {
    let seed = seed_of(key);
    for (j, w) in buf.chunks_mut(8).enumerate() {
        let bytes = word(seed, j).to_le_bytes();
        w.copy_from_slice(&bytes[..w.len()]);
    }
}

/// Whether `buf` holds block `key`'s pattern.
pub fn verify(key: Key, buf: &[u8]) -> bool {
    let seed = seed_of(key);
    buf.chunks(8).enumerate().all(|(j, w)| w == &word(seed, j).to_le_bytes()[..w.len()])
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
