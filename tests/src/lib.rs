//! Shared helpers of the multi-process tests: the payload every key must
//! carry, and region/worker plumbing.

pub mod capi;
pub mod crashloop;
pub mod fuzz;

use cxlkv_core::hash::{mix64, Key};

/// Namespace the tests use.
pub const NS: u32 = 0x7e57;

/// Key number `i` of the test key space.
pub fn key(i: u64) -> Key {
    Key { lo: mix64(i ^ 0x5eed), hi: i }
}

/// Payload length of key `k`: 1 KiB .. 65 KiB, fixed per key.
pub fn len_of(k: Key) -> usize {
    1024 + (mix64(k.lo) % (64 << 10)) as usize
}

/// Fills `buf` with the bytes key `k` must carry.
pub fn fill(k: Key, buf: &mut [u8]) {
    for (i, c) in buf.chunks_mut(8).enumerate() {
        let w = mix64(k.lo ^ mix64(k.hi.wrapping_add(i as u64))).to_le_bytes();
        c.copy_from_slice(&w[..c.len()]);
    }
}

/// True when `buf` carries exactly key `k`'s bytes.
pub fn verify(k: Key, buf: &[u8]) -> bool {
    if buf.len() != len_of(k) {
        return false;
    }
    let mut want = vec![0u8; buf.len()];
    fill(k, &mut want);
    want == buf
}

/// A unique path in /dev/shm for one test.
pub fn shm_path(tag: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(format!(
        "/dev/shm/cxlkv-test-{tag}-{}-{:x}",
        std::process::id(),
        cxlkv_platform::host::random_u64()
    ))
}
