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

/// Fills `buf` with the bytes key `k` must carry (platform's payload
/// pattern, as the demo writes it).
pub use cxlkv_platform::pattern::fill;

/// Whether `buf` is block `k`'s whole payload: its length and pattern.
pub fn verify(k: Key, buf: &[u8]) -> bool {
    buf.len() == len_of(k) && cxlkv_platform::pattern::verify(k, buf)
}

/// A unique path in /dev/shm for one test.
pub fn shm_path(tag: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(format!(
        "/dev/shm/cxlkv-test-{tag}-{}-{:x}",
        std::process::id(),
        cxlkv_platform::host::random_u64()
    ))
}
