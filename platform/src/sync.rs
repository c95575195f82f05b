//! The one module of platform that uses atomics: process-local flags, and
//! the words of the host-local lock file (host memory shared by the
//! processes of one host, which is coherent: plain atomics are right there,
//! unlike region memory, which only core's `mem` touches). Every ordering
//! is chosen here, named by the operation that needs it.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)] // this module is the door the lints point to

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// A process-local flag between a node's threads.
#[derive(Debug, Default)]
pub(crate) struct Flag(AtomicBool);

impl Flag {
    /// A flag set to `v`.
    pub(crate) const fn new(v: bool) -> Flag {
        Flag(AtomicBool::new(v))
    }

    /// The flag as a hint (no memory it guards is read after it).
    pub(crate) fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Sets the flag as a hint.
    pub(crate) fn set(&self, v: bool) {
        self.0.store(v, Ordering::Relaxed)
    }

    /// Sets the flag and returns what it was, ordered with what the caller
    /// did before and does after (claiming a job).
    pub(crate) fn claim(&self) -> bool {
        self.0.swap(true, Ordering::AcqRel)
    }

    /// Clears the flag after the job it guards is done (what the job wrote
    /// is visible to the next claimant).
    pub(crate) fn release(&self) {
        self.0.store(false, Ordering::Release)
    }
}

/// A process-local count (a statistic, or a source of ids): no memory it
/// guards.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`; returns the count before.
    pub(crate) fn add(&self, n: u64) -> u64 {
        self.0.fetch_add(n, Ordering::Relaxed)
    }

    /// The count now.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A 64-bit lock word of the host-local lock file.
pub(crate) struct HostLockWord<'a>(&'a AtomicU64);

impl<'a> HostLockWord<'a> {
    /// # Safety
    /// `p` is 8-aligned, inside a shared mapping that outlives `'a`, and
    /// every process accesses the word only atomically.
    pub(crate) unsafe fn at(p: *mut u64) -> HostLockWord<'a> {
        // SAFETY: the caller's contract is `AtomicU64::from_ptr`'s.
        HostLockWord(unsafe { AtomicU64::from_ptr(p) })
    }

    /// The word now (a hint: an exchange below decides).
    pub(crate) fn peek(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Replaces `cur` by `new` if the word still holds `cur`, acquiring what
    /// the previous holder released (taking the lock).
    pub(crate) fn take(&self, cur: u64, new: u64) -> bool {
        self.0.compare_exchange(cur, new, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Replaces `mine` by 0 if the word still holds `mine`, releasing what
    /// was written under the lock (giving it back).
    pub(crate) fn give_back(&self, mine: u64) {
        let _ = self.0.compare_exchange(mine, 0, Ordering::Release, Ordering::Relaxed);
    }
}

/// A 64-bit word of the host-local file that is not a lock (a manager
/// cell's owner, clock or verdict; the host's active manager), read and
/// written by any process of the host.
pub(crate) struct HostWord<'a>(&'a AtomicU64);

impl<'a> HostWord<'a> {
    /// # Safety
    /// `p` is 8-aligned, inside a shared mapping that outlives `'a`, and
    /// every process accesses the word only atomically.
    pub(crate) unsafe fn at(p: *mut u64) -> HostWord<'a> {
        // SAFETY: the caller's contract is `AtomicU64::from_ptr`'s.
        HostWord(unsafe { AtomicU64::from_ptr(p) })
    }

    /// The word, with what its writer wrote before it (a cell's owner: the
    /// state it initialised).
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Sets the word after what the caller wrote before it.
    pub(crate) fn set(&self, v: u64) {
        self.0.store(v, Ordering::Release)
    }

    /// Sets the word to `new` if it still holds `cur`.
    pub(crate) fn replace(&self, cur: u64, new: u64) -> bool {
        self.0.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }

    /// Adds `n` (a count; no memory it guards).
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
}

/// The background bell of the host-local lock file: a ring count (the
/// futex word) and the number of sleepers.
pub(crate) struct HostBell<'a> {
    count: &'a AtomicU32,
    sleepers: &'a AtomicU32,
}

impl<'a> HostBell<'a> {
    /// # Safety
    /// `p` and `p + 4` are 4-aligned words inside a shared mapping that
    /// outlives `'a`, and every process accesses them only atomically.
    pub(crate) unsafe fn at(p: *mut u8) -> HostBell<'a> {
        // SAFETY: the caller's contract is `AtomicU32::from_ptr`'s for `p`.
        let count = unsafe { AtomicU32::from_ptr(p.cast::<u32>()) };
        // SAFETY: as above, for the next word.
        let sleepers = unsafe { AtomicU32::from_ptr(p.wrapping_add(4).cast::<u32>()) };
        HostBell { count, sleepers }
    }

    /// The ring count now.
    pub(crate) fn count(&self) -> u32 {
        self.count.load(Ordering::Acquire)
    }

    /// The futex word (the ring count's address).
    pub(crate) fn futex(&self) -> *mut u32 {
        self.count.as_ptr()
    }

    /// Counts the caller among the sleepers (before it sleeps), or out.
    pub(crate) fn sleeping(&self, on: bool) {
        if on {
            self.sleepers.fetch_add(1, Ordering::SeqCst);
        } else {
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Rings: bumps the count; true when someone sleeps (and needs a wake).
    /// Sequentially consistent with [`HostBell::sleeping`], so a sleeper
    /// counted before this ring is seen, or sees the new count.
    pub(crate) fn ring(&self) -> bool {
        self.count.fetch_add(1, Ordering::SeqCst);
        self.sleepers.load(Ordering::SeqCst) > 0
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC` (the lock-wait counters' clock).
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `clock_gettime` writes one `timespec` into `ts`, which lives here.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}
