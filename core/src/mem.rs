//! The one door to shared memory: a bounds-checked view of a mapped region.
//!
//! Metadata words are read and written with relaxed atomic loads and stores of
//! aligned 64-bit (or 32-bit) words, so that processes on one host racing on
//! the same line never form a data race, and a torn multi-word value is caught
//! by the protocol (sequence words, checksums) rather than being undefined
//! behaviour. Ordering across hosts is the job of [`crate::coherence`]; this
//! module orders nothing beyond what it states.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)] // this module is the door the lints point to

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::{Error, Result};

/// Size of one cache line, the unit of write-back on every supported machine.
pub const LINE: u64 = 64;

/// A view of a mapped region: base address and length. Copyable; it does not
/// own the mapping (platform does, and keeps it alive while views exist).
#[derive(Clone, Copy, Debug)]
pub struct View {
    base: NonNull<u8>,
    len: u64,
    /// Who watches this view's stores (a simulated host's cache: stores mark
    /// its lines dirty, as a real cache does on any store).
    #[cfg(feature = "watch")]
    watch: Option<Watch>,
}

/// A watcher of a view's stores: `hook(ctx, arg, off, len)` runs after each.
#[cfg(feature = "watch")]
#[derive(Clone, Copy, Debug)]
pub struct Watch {
    /// Called with `ctx`, `arg` and the stored range.
    pub hook: unsafe fn(ctx: *const (), arg: usize, off: u64, len: u64),
    /// The watcher's state, as `hook` expects it.
    pub ctx: *const (),
    /// A word for the watcher (which of its views this is).
    pub arg: usize,
}

// SAFETY: a View is an address range in shared memory; every access through
// it is an atomic word access or an explicit raw copy whose races the protocol
// validates, so sharing the view across threads adds no unsynchronised access.
unsafe impl Send for View {}
// SAFETY: as above; `&View` only permits the same atomic/raw accesses.
unsafe impl Sync for View {}

impl View {
    /// Makes a view of `len` bytes at `base`.
    ///
    /// # Safety
    /// - `base..base+len` is mapped readable and writable for as long as this
    ///   view or any copy of it is used;
    /// - the memory is only ever accessed through `View` views or by other
    ///   processes / devices (never as a Rust reference that assumes exclusivity).
    pub unsafe fn new(base: *mut u8, len: usize) -> Result<Self> {
        let base = NonNull::new(base).ok_or(Error::InvalidArgument)?;
        if !(base.as_ptr() as usize).is_multiple_of(LINE as usize) {
            return Err(Error::InvalidArgument);
        }
        Ok(View {
            base,
            len: len as u64,
            #[cfg(feature = "watch")]
            watch: None,
        })
    }

    /// This view with every store reported to `watch`.
    ///
    /// # Safety
    /// - calling `watch.hook` with `watch.ctx` and any range of the view is
    ///   sound for as long as the returned view or any copy of it is used.
    #[cfg(feature = "watch")]
    pub unsafe fn watched(mut self, watch: Watch) -> View {
        self.watch = Some(watch);
        self
    }

    /// Reports a store to `off..off+len` (to a watcher; nothing otherwise).
    #[inline(always)]
    fn stored(&self, _off: u64, _len: u64) {
        #[cfg(feature = "watch")]
        if let Some(w) = self.watch {
            // SAFETY: `watched`'s contract: the hook may be called with its
            // context for any range of this view while the view is used.
            unsafe { (w.hook)(w.ctx, w.arg, _off, _len) };
        }
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when the view is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Base address (for platform code that flushes or registers the range).
    #[inline]
    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Checks that `off..off+size` lies inside the region and `off` is a
    /// multiple of `align` (a power of two).
    #[inline]
    pub fn check(&self, off: u64, size: u64, align: u64) -> Result<()> {
        let end = off.checked_add(size).ok_or(Error::OutOfBounds)?;
        // `align` is a power of two: `align - 1` is its mask (0 would wrap to
        // all ones and refuse every offset but 0).
        if end > self.len || off & align.wrapping_sub(1) != 0 {
            return Err(Error::OutOfBounds);
        }
        Ok(())
    }

    /// Pointer to `off` after checking `off..off+size` and alignment.
    #[inline]
    pub fn ptr(&self, off: u64, size: u64, align: u64) -> Result<*mut u8> {
        self.check(off, size, align)?;
        // `off < len <= isize::MAX` because the mapping exists; wrapping_add
        // keeps this free of unsafe and the result is in bounds by the check.
        Ok(self.base.as_ptr().wrapping_add(off as usize))
    }

    #[inline]
    fn word64(&self, off: u64) -> Result<&AtomicU64> {
        let p = self.ptr(off, 8, 8)?;
        // SAFETY: `p` is in bounds and 8-aligned (checked by `ptr`); the mapping
        // outlives `self` (View::new's contract); region words are only ever
        // accessed atomically, so this `&AtomicU64` aliases nothing non-atomic.
        Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }

    #[inline]
    fn word32(&self, off: u64) -> Result<&AtomicU32> {
        let p = self.ptr(off, 4, 4)?;
        // SAFETY: as in `word64`, for a 4-byte aligned, in-bounds word.
        Ok(unsafe { AtomicU32::from_ptr(p.cast::<u32>()) })
    }

    /// Loads the 64-bit word at `off` (relaxed).
    #[inline]
    pub fn load_u64(&self, off: u64) -> Result<u64> {
        Ok(self.word64(off)?.load(Ordering::Relaxed))
    }

    /// Stores the 64-bit word at `off` (relaxed).
    #[inline]
    pub fn store_u64(&self, off: u64, v: u64) -> Result<()> {
        self.word64(off)?.store(v, Ordering::Relaxed);
        self.stored(off, 8);
        Ok(())
    }

    /// Atomically ORs `v` into the 64-bit word at `off` (host-local
    /// atomicity only: other hosts see the result after a flush).
    #[inline]
    pub fn fetch_or_u64(&self, off: u64, v: u64) -> Result<u64> {
        let r = self.word64(off)?.fetch_or(v, Ordering::AcqRel);
        self.stored(off, 8);
        Ok(r)
    }

    /// Atomically ANDs `v` into the 64-bit word at `off` (host-local).
    #[inline]
    pub fn fetch_and_u64(&self, off: u64, v: u64) -> Result<u64> {
        let r = self.word64(off)?.fetch_and(v, Ordering::AcqRel);
        self.stored(off, 8);
        Ok(r)
    }

    /// Loads the 32-bit word at `off` (relaxed).
    #[inline]
    pub fn load_u32(&self, off: u64) -> Result<u32> {
        Ok(self.word32(off)?.load(Ordering::Relaxed))
    }

    /// Stores the 32-bit word at `off` (relaxed).
    #[inline]
    pub fn store_u32(&self, off: u64, v: u32) -> Result<()> {
        self.word32(off)?.store(v, Ordering::Relaxed);
        self.stored(off, 4);
        Ok(())
    }

    /// Reads a shared struct word by word. `T` must be a multiple of 8 bytes;
    /// the result may be torn if a peer writes concurrently — callers validate
    /// with the struct's sequence word or checksum.
    pub fn read<T: FromBytes + IntoBytes + KnownLayout + Immutable>(&self, off: u64) -> Result<T> {
        const { assert!(core::mem::size_of::<T>().is_multiple_of(8)) };
        let size = core::mem::size_of::<T>() as u64;
        // One check for the whole struct; the words are inside it.
        let p = self.ptr(off, size, 8)?;
        let mut v = T::new_zeroed();
        for (i, chunk) in v.as_mut_bytes().chunks_exact_mut(8).enumerate() {
            let wp = p.wrapping_add(i.wrapping_mul(8)).cast::<u64>();
            // SAFETY: `wp` is an 8-aligned word of `off..off+size`, checked by
            // `ptr` (size is a multiple of 8); the mapping outlives `self`;
            // region words are only ever accessed atomically.
            let w = unsafe { AtomicU64::from_ptr(wp) }.load(Ordering::Relaxed);
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
        Ok(v)
    }

    /// Writes a shared struct word by word (relaxed stores, in address order).
    pub fn write<T: IntoBytes + Immutable>(&self, off: u64, v: &T) -> Result<()> {
        const { assert!(core::mem::size_of::<T>().is_multiple_of(8)) };
        let size = core::mem::size_of::<T>() as u64;
        self.check(off, size, 8)?;
        for (i, chunk) in v.as_bytes().chunks_exact(8).enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            // Inside `off..off+size`, checked above.
            self.store_u64(off.wrapping_add((i as u64).wrapping_mul(8)), u64::from_ne_bytes(w))?;
        }
        Ok(())
    }

    /// Copies `dst.len()` payload bytes out of the region.
    ///
    /// Payload bytes are not synchronised word by word: a concurrent writer can
    /// tear the copy, which the caller detects by re-validating the entry after
    /// the copy (coherence rule 4).
    pub fn copy_out(&self, off: u64, dst: &mut [u8]) -> Result<()> {
        let p = self.ptr(off, dst.len() as u64, 1)?;
        // SAFETY: `p..p+dst.len()` is inside the mapping (checked by `ptr`); `dst`
        // is a distinct local buffer (no overlap); racing writers only change the
        // bytes copied, which the caller validates; no reference covers the source.
        unsafe { core::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `src` into the region at `off` (plain stores; flushing is the
    /// caller's business, see `Coherence::write_payload`).
    pub fn copy_in(&self, off: u64, src: &[u8]) -> Result<()> {
        let p = self.ptr(off, src.len() as u64, 1)?;
        // SAFETY: `p..p+src.len()` is inside the mapping (checked by `ptr`); `src`
        // is caller memory, not this payload range (no overlap); the range is owned
        // by its writer (entry WRITING or a raw allocation), so no store races.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
        self.stored(off, src.len() as u64);
        Ok(())
    }

    /// Fills `len` bytes at `off` with zero.
    pub fn zero(&self, off: u64, len: u64) -> Result<()> {
        let p = self.ptr(off, len, 1)?;
        // SAFETY: `p..p+len` is inside the mapping (checked by `ptr`) and is
        // being formatted or owned by the caller, so no reader relies on it.
        unsafe { core::ptr::write_bytes(p, 0, len as usize) };
        self.stored(off, len);
        Ok(())
    }
}

/// Full compiler + CPU fence for ordering word accesses within one host.
#[inline]
pub fn fence_seq_cst() {
    core::sync::atomic::fence(Ordering::SeqCst);
}

/// Acquire fence: loads before it complete before loads and stores after it
/// (free on x86, `dmb ishld` on aarch64). What a coherent "invalidate" must
/// still provide.
#[inline]
pub fn fence_acquire() {
    core::sync::atomic::fence(Ordering::Acquire);
}
