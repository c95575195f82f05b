//! A node's lock manager state in the host-local file (its cell), so that
//! any process of the node's host can step that manager: a lock waiter in
//! another process grants itself the lock while the manager's own thread
//! is not running, instead of waking that thread and waiting until it is
//! scheduled.
//!
//! A cell is two header lines, then the manager's state ([`Manager`],
//! plain data). The header's first word is the step lock, naming the stepping
//! thread: only its holder reads or writes the state. It is never taken
//! from a thread that exists: a stepper stopped part-way keeps it, and when
//! it wakes it finishes its step as a stopped manager's thread would (the
//! simulator's zombies), nobody else having written the state meanwhile.
//! The cell's own node takes it over from a thread that no longer exists (a
//! killed process): that step was cut off part-way, so the node writes back
//! what the step may have left in the host's cache and goes on from a fresh
//! state ([`Manager::after_cut`], the simulator's `--cut-steps`).
//!
//! The other header words: the owner (the nonce of the node incarnation
//! whose manager the cell holds; 0 none), when the owner's own threads last
//! stepped it (CLOCK_MONOTONIC milliseconds), the last step's verdict (1
//! active), the owner's lease, settle and quarantine (milliseconds), the
//! steps other processes made, and the owner's process id. Other processes
//! step a cell only while its owner is ALIVE in the region with that nonce,
//! its process exists, and its own threads stepped the cell within half a
//! lease: a node whose process stopped or died loses the role by its
//! silence, as before, instead of being kept managing by its peers.

use core::marker::PhantomData;

use cxlkv_core::lock::{LeaseConfig, Manager};
use zerocopy::FromBytes;

use crate::host::{pid_alive, tid};
use crate::sync::{HostLockWord, HostWord};

/// Bytes of a cell's header (two lines).
const HEADER: usize = 128;

/// Bytes of one cell: its header and the manager's state, in whole lines.
pub(crate) const CELL_BYTES: usize = (HEADER + size_of::<Manager>()).next_multiple_of(64);

const W_LOCK: usize = 0;
const W_OWNER: usize = 1;
const W_OWN_STEP: usize = 2;
const W_ACTIVE: usize = 3;
const W_LEASE: usize = 4;
const W_SETTLE: usize = 5;
const W_QUARANTINE: usize = 6;
const W_PEER_STEPS: usize = 7;
const W_PID: usize = 8;

/// The step lock's word for the calling thread (never 0).
pub(crate) fn lock_word_of_this_thread() -> u64 {
    tid() as u64 | 1 << 32
}

/// One node's cell in the host-local file.
#[derive(Clone, Copy)]
pub(crate) struct ManagerCell<'a> {
    base: *mut u8,
    _file: PhantomData<&'a ()>,
}

impl<'a> ManagerCell<'a> {
    /// # Safety
    /// `base` is 64-aligned and [`CELL_BYTES`] from it lie inside a shared
    /// mapping that outlives `'a`; every process touches the header's words
    /// only atomically and the state only while it holds the step lock.
    pub(crate) unsafe fn at(base: *mut u8) -> ManagerCell<'a> {
        ManagerCell { base, _file: PhantomData }
    }

    fn word(&self, i: usize) -> HostWord<'a> {
        // SAFETY: header word i (< 16) of a cell (see `at`): 8-aligned,
        // inside the mapping, accessed only atomically.
        unsafe { HostWord::at(self.base.wrapping_add(i * 8).cast::<u64>()) }
    }

    fn lock_word(&self) -> HostLockWord<'a> {
        // SAFETY: as in `word`, for word 0.
        unsafe { HostLockWord::at(self.base.wrapping_add(W_LOCK * 8).cast::<u64>()) }
    }

    /// The nonce of the node incarnation whose manager the cell holds (0:
    /// none).
    pub(crate) fn owner(&self) -> u64 {
        self.word(W_OWNER).get()
    }

    /// When the owner's threads last stepped the cell or tried to
    /// (monotonic ms).
    pub(crate) fn own_step_ms(&self) -> u64 {
        self.word(W_OWN_STEP).get()
    }

    /// The owner's lease, settle and quarantine.
    pub(crate) fn cfg(&self) -> LeaseConfig {
        LeaseConfig {
            lease: self.word(W_LEASE).get(),
            settle: self.word(W_SETTLE).get(),
            quarantine: self.word(W_QUARANTINE).get(),
        }
    }

    /// The owner's process id (in this file's PID namespace).
    pub(crate) fn owner_pid(&self) -> u32 {
        self.word(W_PID).get() as u32
    }

    /// Steps other processes made of this cell.
    pub(crate) fn peer_steps(&self) -> u64 {
        self.word(W_PEER_STEPS).get()
    }

    /// The step lock if it is free (a peer's step: never a takeover).
    pub(crate) fn try_lock(&self) -> Option<CellGuard<'a>> {
        let mine = lock_word_of_this_thread();
        self.lock_word().take(0, mine).then_some(CellGuard { cell: *self, mine })
    }

    /// The step lock's word now: its holder's (0: free).
    pub(crate) fn holder(&self) -> u64 {
        self.lock_word().peek()
    }

    /// The step lock taken over from holder `cur`, when that thread no
    /// longer exists (its step was cut off part-way: a killed process);
    /// `None` while it exists, or when the lock changed hands meanwhile.
    /// For the cell's own node only: a stepper that exists, stopped or
    /// not, keeps the lock.
    pub(crate) fn take_over(&self, cur: u64) -> Option<CellGuard<'a>> {
        let mine = lock_word_of_this_thread();
        if cur == 0 || cur == mine || pid_alive(cur as u32) {
            return None;
        }
        self.lock_word().take(cur, mine).then_some(CellGuard { cell: *self, mine })
    }

    /// Incarnation `nonce` learnt it was declared dead: no other process
    /// steps its manager from now on (one that read the owner before
    /// finishes its step, as the owner's own thread would). A cell a later
    /// incarnation of the node made its own (the slot freed and taken
    /// while this one was stopped) is left alone.
    pub(crate) fn disown(&self, nonce: u64) {
        if self.word(W_OWNER).replace(nonce, 0) {
            self.word(W_ACTIVE).set(0);
        }
    }

    /// Takes the step lock as lock word `word` names (a test's stand-in for
    /// a stepper of another process).
    #[cfg(test)]
    pub(crate) fn take_as(&self, word: u64) -> bool {
        self.lock_word().take(0, word)
    }

    /// Records that the owner's threads run (they step or try to).
    pub(crate) fn owner_ran(&self, now: u64) {
        if self.word(W_OWN_STEP).get() != now {
            self.word(W_OWN_STEP).set(now);
        }
    }
}

/// The step lock of a cell, held: the cell's state is the holder's.
pub(crate) struct CellGuard<'a> {
    cell: ManagerCell<'a>,
    mine: u64,
}

impl CellGuard<'_> {
    /// The manager's state.
    pub(crate) fn state(&mut self) -> &mut Manager {
        fn plain_data<T: FromBytes>(p: *mut u8) -> *mut T {
            p.cast::<T>()
        }
        let p = plain_data::<Manager>(self.cell.base.wrapping_add(HEADER));
        // In bounds: the state's bytes follow the header inside the cell's
        // CELL_BYTES, all in the mapping (see `ManagerCell::at`). Aligned:
        // the cell is 64-aligned, the state at 128, `Manager` 8-aligned.
        // Valid: `Manager` is `FromBytes` (checked above), any bytes are a
        // state, and it trusts none of them as an index. Exclusive: only the
        // step lock's holder touches the state, and this guard holds it for
        // the borrow (it is never taken from a thread that exists).
        // SAFETY: in bounds, aligned, valid and exclusive, as shown above.
        unsafe { &mut *p }
    }

    /// Makes the cell the manager's of incarnation `nonce` of a node of
    /// process `pid`, with `state` (a fresh manager state) and `cfg`,
    /// stepped at `now`.
    pub(crate) fn init(&mut self, state: Manager, nonce: u64, pid: u32, cfg: LeaseConfig, now: u64) {
        let c = self.cell;
        c.word(W_OWNER).set(0);
        *self.state() = state;
        c.word(W_LEASE).set(cfg.lease);
        c.word(W_SETTLE).set(cfg.settle);
        c.word(W_QUARANTINE).set(cfg.quarantine);
        c.word(W_ACTIVE).set(0);
        c.word(W_OWN_STEP).set(now);
        c.word(W_PID).set(pid as u64);
        // Last: a peer that reads this owner reads the words above.
        c.word(W_OWNER).set(nonce);
    }

    /// The owner is done with the cell (it detached).
    pub(crate) fn vacate(&mut self) {
        self.cell.word(W_ACTIVE).set(0);
        self.cell.word(W_OWNER).set(0);
    }

    /// Records a step's verdict; `own` when the owner's process made it
    /// (others count as peers' steps).
    pub(crate) fn stepped(&mut self, active: bool, own: bool) {
        let c = self.cell;
        // Written when it changes (the line stays clean in other CPUs'
        // caches between steps).
        if c.word(W_ACTIVE).get() != u64::from(active) {
            c.word(W_ACTIVE).set(u64::from(active));
        }
        if !own {
            c.word(W_PEER_STEPS).add(1);
        }
    }
}

impl Drop for CellGuard<'_> {
    fn drop(&mut self) {
        self.cell.lock_word().give_back(self.mine);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell_in(buf: &mut [u64]) -> ManagerCell<'_> {
        assert!(buf.len() * 8 >= CELL_BYTES && (buf.as_ptr() as usize).is_multiple_of(8));
        // SAFETY: the buffer outlives the cell, holds CELL_BYTES and is
        // 8-aligned (all the header and state need); one thread uses it.
        unsafe { ManagerCell::at(buf.as_mut_ptr().cast::<u8>()) }
    }

    #[test]
    fn a_cell_holds_a_manager_and_its_owner() {
        let mut buf = vec![0u64; CELL_BYTES / 8];
        let cell = cell_in(&mut buf);
        assert_eq!(cell.owner(), 0);
        let cfg = LeaseConfig { lease: 2000, settle: 50, quarantine: 0 };
        let mut g = cell.try_lock().expect("a free cell locks");
        g.init(Manager::new(5), 77, 4242, cfg, 123);
        assert_eq!(g.state().node(), 5);
        // Held by a thread that exists: nobody takes it, not even over.
        assert!(cell.try_lock().is_none());
        assert!(cell.take_over(cell.holder()).is_none());
        g.stepped(true, false);
        drop(g);
        assert_eq!((cell.owner(), cell.own_step_ms(), cell.peer_steps()), (77, 123, 1));
        assert_eq!((cell.cfg().lease, cell.owner_pid()), (2000, 4242));
        cell.owner_ran(300);
        assert_eq!(cell.own_step_ms(), 300);
        // Another incarnation's disowning leaves the cell alone.
        cell.disown(78);
        assert_eq!(cell.owner(), 77);
        cell.disown(77);
        assert_eq!(cell.owner(), 0);
        let mut g = cell.try_lock().expect("free again");
        g.vacate();
        drop(g);
        assert_eq!(cell.owner(), 0);
    }

    #[test]
    fn a_step_lock_of_a_thread_that_exists_is_never_taken_over_and_a_gone_one_is() {
        let mut buf = vec![0u64; CELL_BYTES / 8];
        let cell = cell_in(&mut buf);
        // This process's main thread exists: its lock word stays.
        let live = std::process::id() as u64 | 1 << 32;
        cell.lock_word().take(0, live);
        assert!(cell.take_over(live).is_none());
        assert!(cell.try_lock().is_none());
        cell.lock_word().give_back(live);
        // A thread that ended: its step was cut off, the owner takes over.
        let gone = std::thread::spawn(tid).join().unwrap() as u64 | 1 << 32;
        cell.lock_word().take(0, gone);
        assert!(cell.try_lock().is_none(), "try_lock never takes a lock over");
        let g = cell.take_over(gone).expect("a gone thread's lock is taken over");
        assert_eq!(cell.holder(), lock_word_of_this_thread());
        drop(g);
        assert_eq!(cell.holder(), 0);
    }
}
