//! The C API of cxlkv (`libcxlkv`, header `include/cxlkv.h`): a thin door
//! over core and platform. Every export runs inside a panic boundary, checks
//! every pointer and handle it is given, and returns a [`cxlkv_result`].
//!
//! - [`region`]: regions (map, format, close) and nodes (attach, detach,
//!   stats, evict, recover, check);
//! - [`kv`]: namespaces, chained keys and the batch KV cache operations;
//! - [`shm`]: the shared-memory library primitives (application locks, raw
//!   allocations, named roots, offsets and pointers, flush and invalidate);
//! - [`gpu`]: the region registered with CUDA, and DMA copies of blocks.
#![allow(non_camel_case_types)]

use core::ffi::{c_char, CStr};
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, RwLock, RwLockReadGuard};

pub mod gpu;
pub mod kv;
pub mod region;
pub mod shm;

/// The result of every call. `CXLKV_RESULT_OK` is not zero; numbers are never
/// reused. Codes 1001 to 1099 are core's errors, numbered as in Rust's
/// `cxlkv_core::Error` plus 1000.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum cxlkv_result {
    /// Success.
    Ok = 1000,
    /// An argument is out of range or malformed.
    InvalidArgument = 1001,
    /// The region was never formatted (or formatting did not finish).
    NotInitialized = 1002,
    /// Not a cxlkv region.
    BadMagic = 1003,
    /// The region's format version is not supported by this library.
    WrongVersion = 1004,
    /// The region was formatted by a build with other shared structs.
    WrongLayout = 1005,
    /// The mapping is too small.
    TooSmall = 1006,
    /// The region header is corrupt.
    CorruptHeader = 1007,
    /// Region metadata is corrupt.
    Corrupt = 1008,
    /// An access would leave the region (or its payload area).
    OutOfBounds = 1009,
    /// No free payload space (everything left is pinned).
    OutOfSpace = 1010,
    /// The index stripe of the key is full.
    TableFull = 1011,
    /// The key is stored already (or being written): nothing was written.
    Exists = 1012,
    /// The key (or name) is not stored.
    NotFound = 1013,
    /// A block no longer refers to the entry it was made for.
    StaleHandle = 1014,
    /// This node's pin journal is full: release some blocks.
    JournalFull = 1015,
    /// Every node slot is taken.
    NoFreeNode = 1016,
    /// The node slot is held by a live node.
    NodeBusy = 1017,
    /// The node id is out of range or not attached.
    BadNode = 1018,
    /// A wait ran past its deadline.
    Timeout = 1019,
    /// This node was declared dead; its locks were revoked.
    Revoked = 1020,
    /// The named-root table is full.
    RootsFull = 1021,
    /// The entry is pinned, or the region is in use.
    Busy = 1022,
    /// The payload changed while it was copied.
    Changed = 1023,
    /// A size is too large (or a buffer too small for a block).
    TooLarge = 1024,
    /// A lock awaits recovery after a node died: retry later.
    Recovering = 1025,
    /// The receiver's inbox is full: retry later.
    InboxFull = 1026,
    /// The block is a reservation, not a pin: publish or abort it.
    NotPinned = 1027,
    /// An OS call failed (see `cxlkv_last_error`).
    Io = 1100,
    /// Not supported on this machine or build.
    Unsupported = 1101,
    /// CUDA cannot be used here (no driver, no device, or not built in).
    CudaUnavailable = 1102,
    /// A CUDA driver call failed (see `cxlkv_last_error`).
    Cuda = 1103,
    /// A required pointer argument is NULL.
    NullParameter = 1200,
    /// A handle is not one this library made, or was closed.
    InvalidHandle = 1201,
    /// The library caught a panic: a bug in cxlkv; the call did nothing
    /// lasting or reported what it did.
    Panic = 1202,
    /// A string is not valid UTF-8 (paths and names must be).
    InvalidString = 1203,
    /// An error this build has no code for.
    Internal = 1204,
}

impl cxlkv_result {
    /// The result a platform error maps to.
    pub fn of(e: &cxlkv_platform::Error) -> cxlkv_result {
        use cxlkv_platform::Error as P;
        match e {
            P::Core(c) => (*c).into(),
            P::Io { .. } => cxlkv_result::Io,
            P::Unsupported(_) => cxlkv_result::Unsupported,
            P::CudaUnavailable(_) => cxlkv_result::CudaUnavailable,
            P::Cuda { .. } => cxlkv_result::Cuda,
        }
    }

    /// The result's text, as `cxlkv_result_str` gives it.
    pub fn message(self) -> &'static str {
        self.text().to_str().unwrap_or("")
    }

    fn text(self) -> &'static CStr {
        use cxlkv_result as R;
        match self {
            R::Ok => c"ok",
            R::InvalidArgument => c"invalid argument",
            R::NotInitialized => c"region not initialised",
            R::BadMagic => c"not a cxlkv region (bad magic)",
            R::WrongVersion => c"region format version not supported",
            R::WrongLayout => c"region layout fingerprint differs from this build",
            R::TooSmall => c"region too small",
            R::CorruptHeader => c"region header corrupt",
            R::Corrupt => c"region metadata corrupt",
            R::OutOfBounds => c"access outside the region",
            R::OutOfSpace => c"no free payload space",
            R::TableFull => c"table full",
            R::Exists => c"key exists",
            R::NotFound => c"not found",
            R::StaleHandle => c"stale handle",
            R::JournalFull => c"pin journal full",
            R::NoFreeNode => c"no free node slot",
            R::NodeBusy => c"node slot in use by a live node",
            R::BadNode => c"bad node id",
            R::Timeout => c"timed out",
            R::Revoked => c"lock revoked",
            R::RootsFull => c"root table full",
            R::Busy => c"busy",
            R::Changed => c"entry changed during read",
            R::TooLarge => c"size too large",
            R::Recovering => c"recovery in progress, retry",
            R::InboxFull => c"inbox full, retry",
            R::NotPinned => c"block is reserved, not pinned: publish or abort it",
            R::Io => c"operating system error",
            R::Unsupported => c"not supported here",
            R::CudaUnavailable => c"CUDA unavailable",
            R::Cuda => c"CUDA driver call failed",
            R::NullParameter => c"NULL parameter",
            R::InvalidHandle => c"invalid or closed handle",
            R::Panic => c"internal panic caught",
            R::InvalidString => c"string is not valid UTF-8",
            R::Internal => c"internal error",
        }
    }
}

impl From<cxlkv_core::Error> for cxlkv_result {
    fn from(e: cxlkv_core::Error) -> Self {
        use cxlkv_core::Error as E;
        use cxlkv_result as R;
        match e {
            E::InvalidArgument => R::InvalidArgument,
            E::NotInitialized => R::NotInitialized,
            E::BadMagic => R::BadMagic,
            E::WrongVersion => R::WrongVersion,
            E::WrongLayout => R::WrongLayout,
            E::TooSmall => R::TooSmall,
            E::CorruptHeader => R::CorruptHeader,
            E::Corrupt => R::Corrupt,
            E::OutOfBounds => R::OutOfBounds,
            E::OutOfSpace => R::OutOfSpace,
            E::TableFull => R::TableFull,
            E::Exists => R::Exists,
            E::NotFound => R::NotFound,
            E::StaleHandle => R::StaleHandle,
            E::JournalFull => R::JournalFull,
            E::NoFreeNode => R::NoFreeNode,
            E::NodeBusy => R::NodeBusy,
            E::BadNode => R::BadNode,
            E::Timeout => R::Timeout,
            E::Revoked => R::Revoked,
            E::RootsFull => R::RootsFull,
            E::Busy => R::Busy,
            E::Changed => R::Changed,
            E::TooLarge => R::TooLarge,
            E::Recovering => R::Recovering,
            E::InboxFull => R::InboxFull,
            E::NotPinned => R::NotPinned,
            _ => R::Internal,
        }
    }
}

/// What a failed call reports: its code, and its text for
/// `cxlkv_last_error`.
pub(crate) struct Fail(cxlkv_result);

impl From<cxlkv_result> for Fail {
    fn from(r: cxlkv_result) -> Self {
        set_last_error(r.text().to_string_lossy().into_owned());
        Fail(r)
    }
}

impl From<cxlkv_core::Error> for Fail {
    fn from(e: cxlkv_core::Error) -> Self {
        set_last_error(e.to_string());
        Fail(e.into())
    }
}

impl From<cxlkv_platform::Error> for Fail {
    fn from(e: cxlkv_platform::Error) -> Self {
        let r = cxlkv_result::of(&e);
        set_last_error(e.to_string());
        Fail(r)
    }
}

pub(crate) type Res<T> = Result<T, Fail>;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn set_last_error(s: String) {
    LAST_ERROR.with(|l| *l.borrow_mut() = s);
}

/// Runs an export's body: a panic becomes `CXLKV_RESULT_PANIC`.
pub(crate) fn guard(f: impl FnOnce() -> Res<()>) -> cxlkv_result {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => cxlkv_result::Ok,
        Ok(Err(Fail(r))) => r,
        Err(_) => {
            set_last_error("panic caught at the C API boundary".into());
            cxlkv_result::Panic
        }
    }
}

/// A handle's shell. Closing drops what it holds but never frees the shell,
/// so a closed handle passed again is recognised and refused instead of
/// reading freed memory. Shells are a few dozen bytes and are kept, still
/// reachable, in [`CLOSED`].
#[repr(C)] // `magic` first in every shell, whatever it holds.
pub(crate) struct Shell<T> {
    magic: u64,
    inner: RwLock<Option<T>>,
}

/// Closed shells (addresses), kept reachable for leak checkers.
static CLOSED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

impl<T> Shell<T> {
    pub(crate) fn new(magic: u64, v: T) -> Shell<T> {
        Shell { magic, inner: RwLock::new(Some(v)) }
    }

    /// The object, for one call; `InvalidHandle` for a foreign or closed
    /// shell.
    pub(crate) fn live(&self, magic: u64) -> Res<Live<'_, T>> {
        if self.magic != magic {
            return Err(cxlkv_result::InvalidHandle.into());
        }
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            return Err(cxlkv_result::InvalidHandle.into());
        }
        Ok(Live(g))
    }

    /// Takes the object, leaving the shell closed (waits for calls in
    /// flight). `None` for a foreign or closed shell.
    pub(crate) fn close(&self, magic: u64) -> Option<T> {
        if self.magic != magic {
            return None;
        }
        let v = self.inner.write().unwrap_or_else(|e| e.into_inner()).take();
        if v.is_some() {
            CLOSED.lock().unwrap_or_else(|e| e.into_inner()).push(self as *const Shell<T> as usize);
        }
        v
    }
}

/// The handle behind `p`, which shells are never freed.
///
/// # Safety
/// `p` is NULL or was returned by this library as a handle of type `H`.
pub(crate) unsafe fn handle<'a, H>(p: *const H) -> Res<&'a H> {
    if p.is_null() {
        return Err(cxlkv_result::NullParameter.into());
    }
    // SAFETY:
    // - non-NULL and, by the contract, a handle this library made; handles
    //   are never freed, so the reference is valid for any lifetime.
    Ok(unsafe { &*p })
}

/// `p[..n]` as a slice; NULL is allowed only when `n` is 0.
///
/// # Safety
/// When non-NULL, `p` is valid for reads of `n` elements for `'a`.
pub(crate) unsafe fn slice<'a, T>(p: *const T, n: usize) -> Res<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(cxlkv_result::NullParameter.into());
    }
    // SAFETY:
    // - non-NULL and, by the contract, valid for `n` reads for `'a`.
    Ok(unsafe { core::slice::from_raw_parts(p, n) })
}

/// `p[..n]` as a mutable slice; NULL is allowed only when `n` is 0.
///
/// # Safety
/// When non-NULL, `p` is valid for writes of `n` elements for `'a` and
/// aliased by nothing else.
pub(crate) unsafe fn slice_mut<'a, T>(p: *mut T, n: usize) -> Res<&'a mut [T]> {
    if n == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(cxlkv_result::NullParameter.into());
    }
    // SAFETY:
    // - non-NULL and, by the contract, valid and unaliased for `n` writes.
    Ok(unsafe { core::slice::from_raw_parts_mut(p, n) })
}

/// An output parameter, checked non-NULL before any work is done and
/// written once, at the end, on success.
pub(crate) struct Out<T>(core::ptr::NonNull<T>);

impl<T> Out<T> {
    /// # Safety
    /// `p` is NULL or valid for one write of `T` for as long as the `Out`
    /// lives.
    pub(crate) unsafe fn new(p: *mut T) -> Res<Out<T>> {
        core::ptr::NonNull::new(p).map(Out).ok_or_else(|| cxlkv_result::NullParameter.into())
    }

    /// An optional output: `None` for NULL.
    ///
    /// # Safety
    /// As [`Out::new`].
    pub(crate) unsafe fn maybe(p: *mut T) -> Option<Out<T>> {
        core::ptr::NonNull::new(p).map(Out)
    }

    pub(crate) fn write(self, v: T) {
        // SAFETY:
        // - the constructor's contract: valid for one write.
        unsafe { self.0.as_ptr().write(v) }
    }
}

/// A NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string valid for `'a`.
pub(crate) unsafe fn text<'a>(p: *const c_char) -> Res<&'a str> {
    if p.is_null() {
        return Err(cxlkv_result::NullParameter.into());
    }
    // SAFETY:
    // - non-NULL and NUL-terminated by the contract.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|_| cxlkv_result::InvalidString.into())
}

/// A live handle's object, borrowed for one call (closing waits for it).
pub(crate) struct Live<'a, T>(RwLockReadGuard<'a, Option<T>>);

impl<T> core::ops::Deref for Live<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        match self.0.as_ref() {
            Some(v) => v,
            // `Shell::live` only makes a `Live` of a shell holding a value,
            // and the read guard keeps it there.
            None => unreachable!("a live handle holds its object"),
        }
    }
}

/// The text of a result code: a static, NUL-terminated string (never NULL;
/// unknown codes give "unknown result"). Thread-safe.
#[no_mangle]
pub extern "C" fn cxlkv_result_str(result: u32) -> *const c_char {
    let r = catch_unwind(|| {
        ALL_RESULTS.iter().find(|r| **r as u32 == result).map_or(c"unknown result".as_ptr(), |r| r.text().as_ptr())
    });
    r.unwrap_or(c"unknown result".as_ptr())
}

/// Every result, in code order (for bindings that mirror them).
pub fn all_results() -> &'static [cxlkv_result] {
    &ALL_RESULTS
}

const ALL_RESULTS: [cxlkv_result; 37] = {
    use cxlkv_result as R;
    [
        R::Ok,
        R::InvalidArgument,
        R::NotInitialized,
        R::BadMagic,
        R::WrongVersion,
        R::WrongLayout,
        R::TooSmall,
        R::CorruptHeader,
        R::Corrupt,
        R::OutOfBounds,
        R::OutOfSpace,
        R::TableFull,
        R::Exists,
        R::NotFound,
        R::StaleHandle,
        R::JournalFull,
        R::NoFreeNode,
        R::NodeBusy,
        R::BadNode,
        R::Timeout,
        R::Revoked,
        R::RootsFull,
        R::Busy,
        R::Changed,
        R::TooLarge,
        R::Recovering,
        R::InboxFull,
        R::NotPinned,
        R::Io,
        R::Unsupported,
        R::CudaUnavailable,
        R::Cuda,
        R::NullParameter,
        R::InvalidHandle,
        R::Panic,
        R::InvalidString,
        R::Internal,
    ]
};

/// Copies the text of this thread's last failure (with detail, such as the
/// OS error) into `buf` of `len` bytes, NUL-terminated and truncated to fit;
/// `*written` gets the full length without the NUL. Thread-safe (the text
/// is per thread).
///
/// # Safety
/// `buf` is valid for `len` bytes of writes (or NULL with `len` 0);
/// `written` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_last_error(buf: *mut c_char, len: usize, written: *mut usize) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `written` is valid for one write by the contract.
        let written = unsafe { Out::new(written) }?;
        // SAFETY:
        // - `buf` is valid for `len` writes by the contract.
        let out = unsafe { slice_mut(buf.cast::<u8>(), len) }?;
        let msg = LAST_ERROR.with(|l| l.borrow().clone());
        if let Some(room) = out.len().checked_sub(1) {
            let n = room.min(msg.len());
            out[..n].copy_from_slice(&msg.as_bytes()[..n]);
            out[n] = 0;
        }
        written.write(msg.len());
        Ok(())
    })
}

/// The library's version, "MAJOR.MINOR.PATCH" (static; compare with
/// `CXLKV_VERSION_STRING` to detect a header/library mismatch).
#[no_mangle]
pub extern "C" fn cxlkv_version() -> *const c_char {
    VERSION.as_ptr().cast()
}

const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_result_has_its_own_text_and_number() {
        for (i, a) in ALL_RESULTS.iter().enumerate() {
            for b in &ALL_RESULTS[i + 1..] {
                assert_ne!(*a as u32, *b as u32);
                assert_ne!(a.text(), b.text(), "{a:?} {b:?}");
            }
            // SAFETY:
            // - the function returns a static NUL-terminated string.
            let s = unsafe { CStr::from_ptr(cxlkv_result_str(*a as u32)) };
            assert_eq!(s, a.text());
        }
        // SAFETY:
        // - as above.
        let s = unsafe { CStr::from_ptr(cxlkv_result_str(0)) };
        assert_eq!(s, c"unknown result");
    }

    #[test]
    fn core_codes_keep_their_numbers() {
        for code in 1..=26u32 {
            let r = ALL_RESULTS.iter().find(|r| **r as u32 == 1000 + code);
            assert!(r.is_some(), "core code {code}");
        }
        assert_eq!(cxlkv_result::from(cxlkv_core::Error::InboxFull) as u32, 1000 + cxlkv_core::Error::InboxFull.code());
        assert_eq!(cxlkv_result::from(cxlkv_core::Error::Exists) as u32, 1000 + cxlkv_core::Error::Exists.code());
    }
}
