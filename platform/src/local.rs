//! The host-local lock tier (TraCT §3.3): one lock word per global lock, in a
//! small shared file in /dev/shm named after the region's creation id, so all
//! processes of a host serialise there and at most one node per host contends
//! for each global lock.
//!
//! A lock word holds the owner's thread id. A waiter that finds the owner
//! gone (killed) takes the lock over, so a SIGKILLed process never wedges its
//! host.
#![allow(clippy::disallowed_types)] // host memory, not region memory: plain atomics are right here

use core::sync::atomic::{AtomicU32, Ordering};
use std::path::PathBuf;

use crate::host::{pid_alive, tid};
use crate::map::Mapping;
use crate::Result;

/// The host-local lock words of one region.
pub struct LocalTier {
    map: Mapping,
    n: u32,
    path: PathBuf,
}

const STRIDE: usize = 64;

impl LocalTier {
    /// Opens (creating if needed) the tier for region `creation_id` with `n`
    /// locks, under `dir` (normally /dev/shm).
    pub fn open(dir: &std::path::Path, creation_id: u64, n: u32) -> Result<LocalTier> {
        let path = dir.join(format!("cxlkv-local-{creation_id:016x}"));
        let want = (n as u64 + 1) * STRIDE as u64;
        let map = match Mapping::open_file(&path) {
            Ok(m) if m.len() as u64 >= want => m,
            _ => {
                // Create or grow; O_CREAT without O_TRUNC keeps words a peer
                // may already hold, and growing only appends zeroes.
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)
                    .map_err(|err| crate::Error::Io { what: "open local tier", err })?;
                use std::os::unix::fs::PermissionsExt;
                let _ = f.set_permissions(std::fs::Permissions::from_mode(0o600));
                let len = f.metadata().map_err(|err| crate::Error::Io { what: "stat local tier", err })?.len();
                if len < want {
                    f.set_len(want.max(4096)).map_err(|err| crate::Error::Io { what: "grow local tier", err })?;
                }
                drop(f);
                Mapping::open_file(&path)?
            }
        };
        Ok(LocalTier { map, n, path })
    }

    fn word(&self, id: u32) -> &AtomicU32 {
        let i = id.min(self.n) as usize;
        let p = self.map.region().base().wrapping_add(i * STRIDE);
        // SAFETY: `p` is inside the mapping (i ≤ n; the file holds n+1 lines) and
        // 4-aligned (page-aligned base, 64-byte stride); the mapping lives as long
        // as `self`; every process accesses these words only atomically.
        unsafe { AtomicU32::from_ptr(p.cast::<u32>()) }
    }

    /// Takes lock `id` (ids ≥ n share the last word, used for attach).
    pub fn lock(&self, id: u32) {
        while self.lock_within(id, std::time::Duration::MAX).is_err() {}
    }

    /// Takes lock `id`, giving up after `timeout` (`Timeout`). `Busy` at once
    /// when the calling thread holds it already: that wait could never end.
    pub fn lock_within(&self, id: u32, timeout: std::time::Duration) -> cxlkv_core::Result<()> {
        let w = self.word(id);
        let me = tid();
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        loop {
            let cur = w.load(Ordering::Relaxed);
            if cur == 0 {
                if w.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    return Ok(());
                }
            } else if cur == me {
                return Err(cxlkv_core::Error::Busy);
            } else if spins % 64 == 63 && !pid_alive(cur) {
                // The owner died holding the lock: take it over.
                if w.compare_exchange(cur, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    return Ok(());
                }
            }
            if spins % 1024 == 1023 && start.elapsed() > timeout {
                return Err(cxlkv_core::Error::Timeout);
            }
            spins = spins.wrapping_add(1);
            if spins < 100 {
                core::hint::spin_loop();
            } else if spins < 1000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }

    /// Releases lock `id`.
    pub fn unlock(&self, id: u32) {
        let w = self.word(id);
        let me = tid();
        let _ = w.compare_exchange(me, 0, Ordering::Release, Ordering::Relaxed);
    }

    /// The id of the extra lock that serialises attaches on this host.
    pub fn attach_lock(&self) -> u32 {
        self.n
    }

    /// Path of the backing file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn lock_excludes_other_threads() {
        let dir = std::env::temp_dir();
        let id = crate::host::random_u64();
        let sut = Arc::new(LocalTier::open(&dir, id, 4).unwrap());
        let counter = Arc::new(std::sync::Mutex::new((0u32, 0u32)));
        let mut hs = Vec::new();
        for _ in 0..4 {
            let (sut, counter) = (sut.clone(), counter.clone());
            hs.push(std::thread::spawn(move || {
                for _ in 0..200 {
                    sut.lock(1);
                    {
                        let mut c = counter.lock().unwrap();
                        c.0 += 1;
                        c.1 = c.1.max(c.0);
                    }
                    counter.lock().unwrap().0 -= 1;
                    sut.unlock(1);
                }
            }));
        }
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(counter.lock().unwrap().1, 1, "never two holders");
        let _ = std::fs::remove_file(sut.path());
    }

    #[test]
    fn lock_held_by_dead_thread_is_taken_over() {
        let dir = std::env::temp_dir();
        let id = crate::host::random_u64();
        let sut = Arc::new(LocalTier::open(&dir, id, 2).unwrap());
        let s2 = sut.clone();
        std::thread::spawn(move || s2.lock(0)).join().unwrap();
        sut.lock(0); // the holder thread has exited
        sut.unlock(0);
        let _ = std::fs::remove_file(sut.path());
    }
}
