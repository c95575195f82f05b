//! The host-local lock layer (TraCT §3.3): one lock word per global lock, in a
//! small shared file in /dev/shm named after the region's creation id (and
//! the PID namespace), so the processes of a host serialise there and at most
//! one node per host contends for each global lock.
//!
//! A lock word names its owner: thread id, node and a few bits of the
//! node's nonce. A waiter takes the lock over when the owner is gone: its
//! thread no longer exists (a SIGKILLed process), or its node is no longer
//! the one attached (declared dead by its silence — a stopped process — and
//! recovered). So neither a killed nor a stopped process wedges its host.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::Result;
use crate::host::{pid_alive, tid};
use crate::map::Mapping;
use crate::mgr_cell::{ManagerCell, CELL_BYTES};
use crate::sync::{HostBell, HostLockWord, HostWord};

/// Who holds (or asks for) a host-local lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Node id, or `None` before the node exists (attach).
    pub node: Option<u32>,
    /// The node's nonce (its low 16 bits are kept in the word).
    pub nonce: u64,
}

impl Owner {
    /// An owner that is no node yet (serialising attaches).
    pub const NONE: Owner = Owner { node: None, nonce: 0 };

    fn word(&self, tid: u32) -> u64 {
        let node = self.node.map_or(0, |n| n as u64 + 1) & 0xffff;
        tid as u64 | node << 32 | (self.nonce & 0xffff) << 48
    }
}

/// Splits a lock word: (thread id, node, nonce bits).
fn unpack(w: u64) -> (u32, Option<u32>, u16) {
    let node = ((w >> 32) & 0xffff) as u32;
    (w as u32, node.checked_sub(1), (w >> 48) as u16)
}

/// The host-local lock words of one region.
pub struct HostLocks {
    map: Mapping,
    n: u32,
    /// Manager cells (one per node slot of the region; see `mgr_cell`).
    cells: u32,
    path: PathBuf,
}

const STRIDE: usize = 64;

impl HostLocks {
    /// Opens (creating if needed) the tier for region `creation_id` with `n`
    /// locks and `cells` manager cells (the region's node slots), under
    /// `dir` (normally /dev/shm). One file per PID namespace:
    /// a lock word names its owner by thread id, which only its namespace
    /// can probe (processes of other containers contend on the global level,
    /// which stays exact: each node has its own slot).
    pub fn open(dir: &std::path::Path, creation_id: u64, n: u32, cells: u32) -> Result<HostLocks> {
        let ns = crate::host::pid_ns() as u32;
        let path = dir.join(format!("cxlkv-local-{creation_id:016x}-{ns:08x}"));
        sweep_stale(dir, ns, &path);
        // n lock lines, the attach lock's, the background bell's, the
        // active manager's, then the cells.
        let want = Self::cells_at(n) as u64 + cells as u64 * CELL_BYTES as u64;
        // A sweep of another process (see `sweep_stale`) may remove the
        // file between its creation and our shared lock: once locked, the
        // file must still be the one at `path`, else start again.
        let mut tries = 0;
        let map = loop {
            tries += 1;
            if tries > 64 {
                return Err(crate::error::Error::Io {
                    what: "open host locks",
                    err: std::io::Error::other("the host-local lock file kept being removed under us"),
                });
            }
            // Create or grow; O_CREAT without O_TRUNC keeps words a peer
            // may already hold, and growing only appends zeroes.
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|err| crate::error::Error::Io { what: "open host locks", err })?;
            use std::os::fd::AsRawFd;
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            // Held while this process has the file (see `sweep_stale`),
            // first on this descriptor, then on the mapping's; where the
            // file system has no `flock`, no sweep takes it either.
            // SAFETY: `flock` on a descriptor this function owns; no memory.
            let _ = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH) };
            let mine = f.metadata().map_err(|err| crate::error::Error::Io { what: "stat host locks", err })?;
            if std::fs::metadata(&path).ok().map(|m| (m.dev(), m.ino())) != Some((mine.dev(), mine.ino())) {
                continue; // removed by a sweep before our lock
            }
            let _ = f.set_permissions(std::fs::Permissions::from_mode(0o600));
            if mine.len() < want {
                f.set_len(want.max(4096)).map_err(|err| crate::error::Error::Io { what: "grow host locks", err })?;
            }
            // Locked: no sweep removes it now, so the path maps this file.
            let map = Mapping::open_file(&path)?;
            // SAFETY: `flock` on the mapping's open descriptor; no memory.
            let _ = unsafe { libc::flock(map.fd(), libc::LOCK_SH) };
            drop(f);
            break map;
        };
        Ok(HostLocks { map, n, cells, path })
    }

    /// Where the manager cells begin, for `n` locks.
    fn cells_at(n: u32) -> usize {
        (n as usize + 3) * STRIDE
    }

    /// Node `node`'s manager cell; `None` beyond the cells this file has.
    pub(crate) fn cell(&self, node: u32) -> Option<ManagerCell<'_>> {
        if node >= self.cells {
            return None;
        }
        let at = Self::cells_at(self.n) + node as usize * CELL_BYTES;
        let p = self.map.view().base().wrapping_add(at);
        // The cell's CELL_BYTES lie inside the mapping (the file was sized
        // for `cells` cells at open), 64-aligned (page-aligned base, 64-byte
        // multiples); every process touches a cell's header only atomically
        // and its state only under its step lock.
        // SAFETY: in the mapping and aligned (above), which outlives `self`'s borrow.
        Some(unsafe { ManagerCell::at(p) })
    }

    /// The word naming this host's active lock manager (node id + 1; 0
    /// none known), in the line after the bell's.
    fn active_word(&self) -> HostWord<'_> {
        let p = self.map.view().base().wrapping_add((self.n as usize + 2) * STRIDE);
        // SAFETY: an 8-aligned word inside the mapping (n+3 lines at least);
        // it lives as long as `self`; every process accesses it atomically.
        unsafe { HostWord::at(p.cast::<u64>()) }
    }

    /// The node of this host (and PID namespace) whose manager step last
    /// found it the active lock manager, if one did.
    pub fn active_manager(&self) -> Option<u32> {
        self.active_word().get().checked_sub(1).map(|n| n as u32)
    }

    /// Records the verdict of a step of node `node`'s manager: active, it is
    /// this host's active manager; not, it no longer is (if it was).
    pub fn note_manager(&self, node: u32, active: bool) {
        let w = self.active_word();
        let me = node as u64 + 1;
        if active {
            if w.get() != me {
                w.set(me);
            }
        } else {
            w.replace(me, 0);
        }
    }

    fn word(&self, id: u32) -> HostLockWord<'_> {
        let i = id.min(self.n) as usize;
        let p = self.map.view().base().wrapping_add(i * STRIDE);
        // SAFETY: `p` is inside the mapping (i ≤ n; the file holds n+1 lines) and
        // 8-aligned (page-aligned base, 64-byte stride); the mapping lives as long
        // as `self`; every process accesses these words only atomically.
        unsafe { HostLockWord::at(p.cast::<u64>()) }
    }

    /// The background bell: (ring count, sleepers), in the line after the
    /// attach lock's.
    fn bell(&self) -> HostBell<'_> {
        let p = self.map.view().base().wrapping_add((self.n as usize + 1) * STRIDE);
        // SAFETY: `p` and `p + 4` are 4-aligned words inside the mapping (n+2
        // lines, sized at open); it lives as long as `self`; every process
        // accesses these words only atomically.
        unsafe { HostBell::at(p) }
    }

    /// The bell's ring count now: pass it to [`HostLocks::sleep`].
    pub fn bell_count(&self) -> u32 {
        self.bell().count()
    }

    /// Sleeps up to `timeout` unless the bell rang since `seen` was read
    /// (a futex wait on the shared file: any process of this host and PID
    /// namespace wakes it with [`HostLocks::ring`]).
    pub fn sleep(&self, seen: u32, timeout: Duration) {
        let bell = self.bell();
        bell.sleeping(true);
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(60) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `count` is a live, aligned u32 in a shared mapping; FUTEX_WAIT
        // only reads it, compares with `seen` and sleeps; `ts` outlives the call.
        unsafe { libc::syscall(libc::SYS_futex, bell.futex(), libc::FUTEX_WAIT, seen, &ts as *const libc::timespec) };
        bell.sleeping(false);
    }

    /// Rings the bell: every background thread of this host sleeping in
    /// [`HostLocks::sleep`] wakes (a system call only when one sleeps).
    /// True when a sleeper was there to wake.
    pub fn ring(&self) -> bool {
        let bell = self.bell();
        let sleeping = bell.ring();
        if sleeping {
            // SAFETY: `count` is a live, aligned u32 in a shared mapping;
            // FUTEX_WAKE touches no memory.
            unsafe { libc::syscall(libc::SYS_futex, bell.futex(), libc::FUTEX_WAKE, i32::MAX) };
        }
        sleeping
    }

    /// Takes lock `id` for `who` (ids ≥ n share the last word, used for
    /// attach), however long it takes.
    pub fn lock(&self, id: u32, who: Owner) {
        while self.lock_within(id, who, std::time::Duration::MAX, &|_, _| false).is_err() {}
    }

    /// Takes lock `id` for `who`, giving up after `timeout` (`Timeout`).
    /// `Busy` at once when the calling thread holds it already: that wait
    /// could never end. `gone(node, nonce bits)` tells whether the owner's
    /// node is no longer attached (declared dead, recovered): its lock is
    /// taken over, as a dead thread's is.
    pub fn lock_within(
        &self,
        id: u32,
        who: Owner,
        timeout: std::time::Duration,
        gone: &dyn Fn(u32, u16) -> bool,
    ) -> cxlkv_core::Result<()> {
        let w = self.word(id);
        let me = who.word(tid());
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        loop {
            let cur = w.peek();
            let (owner_tid, owner_node, owner_nonce) = unpack(cur);
            if cur == 0 {
                if w.take(0, me) {
                    return Ok(());
                }
            } else if owner_tid == me as u32 {
                return Err(cxlkv_core::Error::Busy);
            } else if spins % 64 == 63 && (!pid_alive(owner_tid) || owner_node.is_some_and(|n| gone(n, owner_nonce))) {
                // The owner died, or its node did (it stopped and was declared
                // dead): take the lock over.
                if w.take(cur, me) {
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

    /// Takes lock `id` for `who` if it is free now (true), without waiting.
    pub fn try_lock(&self, id: u32, who: Owner) -> bool {
        let w = self.word(id);
        w.peek() == 0 && w.take(0, who.word(tid()))
    }

    /// Releases lock `id` if `who`, on this thread, holds it.
    pub fn unlock(&self, id: u32, who: Owner) {
        let w = self.word(id);
        let me = who.word(tid());
        w.give_back(me);
    }

    /// The id of the extra lock that serialises attaches on this host.
    pub fn attach_lock(&self) -> u32 {
        self.n
    }

    /// Path of the backing file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Removes the backing file (the mapping stays valid for whoever holds
    /// it). For the last node of this host and namespace to leave: a node
    /// attaching meanwhile makes a new file, which costs only the host-local
    /// batching between it and a process that still maps the old one.
    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes the host-local lock files of this PID namespace under `dir` that
/// no process has open any more (left by processes killed before they could
/// detach; the last to detach removes its file itself), except `keep`.
/// Every process that opens a tier file holds a shared `flock` on it for as
/// long as it has it (released by the kernel when the process dies), so a
/// file whose exclusive lock can be taken at once is nobody's. A file
/// removed while a process is just opening it costs only the host-local
/// batching between that process and the others (see
/// [`HostLocks::remove`]).
fn sweep_stale(dir: &std::path::Path, ns: u32, keep: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let suffix = format!("-{ns:08x}");
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for p in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
        let ours = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("cxlkv-local-") && n.ends_with(&suffix));
        if !ours || p == keep {
            continue;
        }
        let Ok(f) = std::fs::File::open(&p) else { continue };
        // SAFETY: `flock` on a descriptor this function owns; no memory.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            let _ = std::fs::remove_file(&p);
        }
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
        let sut = Arc::new(HostLocks::open(&dir, id, 4, 0).unwrap());
        let counter = Arc::new(std::sync::Mutex::new((0u32, 0u32)));
        let mut hs = Vec::new();
        for _ in 0..4 {
            let (sut, counter) = (sut.clone(), counter.clone());
            hs.push(std::thread::spawn(move || {
                for _ in 0..200 {
                    sut.lock(1, Owner::NONE);
                    {
                        let mut c = counter.lock().unwrap();
                        c.0 += 1;
                        c.1 = c.1.max(c.0);
                    }
                    counter.lock().unwrap().0 -= 1;
                    sut.unlock(1, Owner::NONE);
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
        let sut = Arc::new(HostLocks::open(&dir, id, 2, 0).unwrap());
        let s2 = sut.clone();
        std::thread::spawn(move || s2.lock(0, Owner::NONE)).join().unwrap();
        sut.lock(0, Owner::NONE); // the holder thread has exited
        sut.unlock(0, Owner::NONE);
        let _ = std::fs::remove_file(sut.path());
    }

    #[test]
    fn lock_of_a_node_that_is_gone_is_taken_over_though_its_thread_lives() {
        let dir = std::env::temp_dir();
        let id = crate::host::random_u64();
        let sut = Arc::new(HostLocks::open(&dir, id, 2, 0).unwrap());
        let s2 = sut.clone();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (held_tx, held) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            s2.lock(1, Owner { node: Some(3), nonce: 0xabcd_1234 });
            let _ = held_tx.send(());
            let _ = rx.recv();
        });
        held.recv().unwrap();
        let me = Owner { node: Some(4), nonce: 9 };
        let short = std::time::Duration::from_millis(200);
        let alive = |_: u32, _: u16| false;
        assert_eq!(sut.lock_within(1, me, short, &alive), Err(cxlkv_core::Error::Timeout));
        let gone = |n: u32, nonce: u16| n == 3 && nonce == 0x1234;
        assert_eq!(sut.lock_within(1, me, short, &gone), Ok(()));
        assert_eq!(sut.lock_within(1, me, short, &gone), Err(cxlkv_core::Error::Busy), "held by this thread");
        sut.unlock(1, me);
        tx.send(()).unwrap();
        holder.join().unwrap();
        let _ = std::fs::remove_file(sut.path());
    }

    #[test]
    fn a_ring_from_another_mapping_of_the_file_wakes_a_sleeper() {
        let dir = std::env::temp_dir();
        let id = crate::host::random_u64();
        let a = Arc::new(HostLocks::open(&dir, id, 3, 0).unwrap());
        let b = HostLocks::open(&dir, id, 3, 0).unwrap(); // as another process would map it
        let seen = a.bell_count();
        b.ring();
        let t = std::time::Instant::now();
        a.sleep(seen, Duration::from_secs(30)); // rang since `seen`: returns at once
        assert!(a.bell_count() != seen);
        let a2 = a.clone();
        let sleeper = std::thread::spawn(move || {
            let seen = a2.bell_count();
            a2.sleep(seen, Duration::from_secs(30));
        });
        // Ring until the sleeper is woken (it may not sleep yet at the first ring).
        while !sleeper.is_finished() {
            assert!(t.elapsed() < Duration::from_secs(20), "the sleeper was never woken");
            b.ring();
            std::thread::sleep(Duration::from_millis(1));
        }
        sleeper.join().unwrap();
        let _ = std::fs::remove_file(a.path());
    }

    #[test]
    fn files_nobody_has_open_are_swept_and_open_ones_stay() {
        let dir = std::env::temp_dir().join(format!("cxlkv-local-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ns = crate::host::pid_ns() as u32;
        // Left by a killed process: nobody has it open.
        let stale = dir.join(format!("cxlkv-local-{:016x}-{ns:08x}", 0x5eedu64));
        std::fs::write(&stale, [0u8; 4096]).unwrap();
        // Another PID namespace's file: not ours to judge.
        let other_ns = dir.join(format!("cxlkv-local-{:016x}-{:08x}", 0x5eedu64, ns ^ 1));
        std::fs::write(&other_ns, [0u8; 4096]).unwrap();
        // In use by this process (another region's tier).
        let live = HostLocks::open(&dir, 0x1111, 2, 0).unwrap();
        let mine = HostLocks::open(&dir, 0x2222, 2, 0).unwrap();
        assert!(!stale.exists(), "a file nothing maps was left behind");
        assert!(other_ns.exists() && live.path().exists() && mine.path().exists());
        drop((live, mine));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_open_racing_a_sweep_always_ends_holding_the_file_at_its_path() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("cxlkv-local-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ns = crate::host::pid_ns() as u32;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let sweeper = {
            let dir = dir.clone();
            std::thread::spawn(move || {
                while stopped.try_recv().is_err() {
                    sweep_stale(&dir, ns, std::path::Path::new("/nonexistent"));
                }
            })
        };
        let mut held = Vec::new();
        for i in 0..300u64 {
            let t = HostLocks::open(&dir, 0x7000 + i, 2, 0).unwrap();
            let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
            // SAFETY: `fstat` fills `st` from the mapping's open descriptor.
            assert_eq!(unsafe { libc::fstat(t.map.fd(), st.as_mut_ptr()) }, 0);
            // SAFETY: filled by the successful `fstat`.
            let st = unsafe { st.assume_init() };
            let m = std::fs::metadata(t.path()).unwrap();
            assert_eq!((m.dev(), m.ino()), (st.st_dev, st.st_ino), "open {i} holds a file no longer at its path");
            held.push(t);
        }
        let _ = stop.send(());
        sweeper.join().unwrap();
        // Every file held stays: a sweep never takes one in use.
        assert!(held.iter().all(|t| t.path().exists()));
        drop(held);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
