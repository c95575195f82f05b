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
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock, RwLock, RwLockReadGuard};

pub mod blocks;
pub mod copy;
pub mod events;
pub mod gpu;
pub mod kv;
pub mod region;
pub mod shm;
pub mod tenants;
pub mod tier;

/// The result of every call: platform's result codes (`cxlkv_platform::Code`,
/// one table for every binding), `CXLKV_RESULT_<NAME>` in C. The C enum is
/// written into the header from that table by `cargo xtask gen`.
///
/// cbindgen:ignore
pub use cxlkv_platform::Code as cxlkv_result;

/// The message of `r` as a C string (built once from the table).
pub(crate) fn result_text(r: cxlkv_result) -> &'static CStr {
    static TEXTS: OnceLock<Vec<(cxlkv_result, CString)>> = OnceLock::new();
    let texts = TEXTS.get_or_init(|| {
        cxlkv_result::ALL.iter().map(|&c| (c, CString::new(c.message()).unwrap_or_default())).collect()
    });
    texts.iter().find(|(c, _)| *c == r).map_or(c"", |(_, t)| t.as_c_str())
}

/// What a failed call reports: its code, and its text for
/// `cxlkv_last_error`.
pub(crate) struct Fail(cxlkv_result);

impl From<cxlkv_result> for Fail {
    fn from(r: cxlkv_result) -> Self {
        set_last_error(r.message().to_string());
        Fail(r)
    }
}

impl From<cxlkv_platform::kv::CoreError> for Fail {
    fn from(e: cxlkv_platform::kv::CoreError) -> Self {
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

/// The panic boundary of every export, whatever it returns: `f`'s value,
/// or `on_panic` (with the thread's last error saying so) when it panicked.
pub(crate) fn boundary<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_last_error("panic caught at the C API boundary".into());
        on_panic
    })
}

/// Runs an export's body that returns a result code: a panic becomes
/// `CXLKV_RESULT_PANIC`.
pub(crate) fn guard(f: impl FnOnce() -> Res<()>) -> cxlkv_result {
    boundary(cxlkv_result::Panic, || match f() {
        Ok(()) => cxlkv_result::Ok,
        Err(Fail(r)) => r,
    })
}

/// A handle's shell. Closing drops what it holds but never frees the shell,
/// so a closed handle passed again is recognised and refused instead of
/// reading freed memory. Shells are a few dozen bytes whatever they hold
/// (the object is boxed: a closed node's shell once kept a node's size) and
/// are kept, still reachable, in [`CLOSED`].
#[repr(C)] // `magic` first in every shell, whatever it holds.
pub(crate) struct Shell<T> {
    magic: u64,
    inner: RwLock<Option<Box<T>>>,
}

/// Closed shells (addresses), kept reachable for leak checkers.
static CLOSED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

impl<T> Shell<T> {
    pub(crate) fn new(magic: u64, v: T) -> Shell<T> {
        Shell { magic, inner: RwLock::new(Some(Box::new(v))) }
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
        v.map(|b| *b)
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
pub(crate) struct Live<'a, T>(RwLockReadGuard<'a, Option<Box<T>>>);

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
    boundary(c"unknown result".as_ptr(), || {
        cxlkv_result::from_u32(result).map_or(c"unknown result", result_text).as_ptr()
    })
}

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
    boundary(VERSION.as_ptr().cast(), || VERSION.as_ptr().cast())
}

const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_result_has_its_own_text_and_number() {
        for (i, a) in cxlkv_result::ALL.iter().enumerate() {
            for b in &cxlkv_result::ALL[i + 1..] {
                assert_ne!(*a as u32, *b as u32);
                assert_ne!(result_text(*a), result_text(*b), "{a:?} {b:?}");
            }
            // SAFETY:
            // - the function returns a static NUL-terminated string.
            let s = unsafe { CStr::from_ptr(cxlkv_result_str(*a as u32)) };
            assert_eq!(s.to_str(), Ok(a.message()));
        }
        // SAFETY:
        // - as above.
        let s = unsafe { CStr::from_ptr(cxlkv_result_str(0)) };
        assert_eq!(s, c"unknown result");
    }

    /// Closed shells are kept for good: what one keeps must not grow with
    /// what it held (a node, a region, a tier).
    #[test]
    fn a_closed_shell_keeps_a_few_dozen_bytes_whatever_it_held() {
        assert!(size_of::<crate::region::cxlkv_node>() <= 64, "{}", size_of::<crate::region::cxlkv_node>());
        assert!(size_of::<crate::region::cxlkv_region>() <= 64);
        assert!(size_of::<crate::tier::cxlkv_tier>() <= 64);
        assert!(size_of::<crate::events::cxlkv_change_cursor>() <= 64);
    }

    #[test]
    fn core_codes_keep_their_numbers() {
        for code in 1..=26u32 {
            let r = cxlkv_result::from_u32(1000 + code);
            assert!(r.is_some(), "core code {code}");
        }
        assert_eq!(
            cxlkv_result::from(cxlkv_platform::kv::CoreError::InboxFull) as u32,
            1000 + cxlkv_platform::kv::CoreError::InboxFull.code()
        );
        assert_eq!(
            cxlkv_result::from(cxlkv_platform::kv::CoreError::Exists) as u32,
            1000 + cxlkv_platform::kv::CoreError::Exists.code()
        );
    }
}
