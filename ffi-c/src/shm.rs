//! The shared-memory library primitives (TraCT's C API): application locks,
//! raw allocations in the region, named roots, offset/pointer conversion,
//! and explicit flush and invalidate for structures an application keeps in
//! the region itself. Offsets, not pointers, are what to store in the region:
//! every process maps it at its own address.

use core::ffi::{c_char, c_void};

use cxlkv_platform::host::tid;
use cxlkv_platform::kv::{Root, MAX_ROOT_NAME};

use crate::region::{cxlkv_node, live};
use crate::{cxlkv_result, guard, text, Out, Res};

/// A held application lock; pass it back to `cxlkv_lock_release`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_lock_ticket {
    /// The lock's number (from `cxlkv_lock_alloc`).
    pub lock: u32,
    /// The thread that holds it (the one that must release it).
    pub thread: u32,
    /// Grant sequence number: no other grant of the lock carries it.
    pub seq: u64,
}

/// Allocates an application lock, shared by every node of the region, and
/// writes its number. CXLKV_RESULT_TABLE_FULL when the region's
/// `app_locks` are all allocated; CXLKV_RESULT_ROOTS_FULL when the root table
/// (which records allocated locks) is full. Allocations outlive the node.
///
/// # Safety
/// `node` is a handle from this library or NULL; `out` is valid for one
/// write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_lock_alloc(node: *const cxlkv_node, out: *mut u32) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        out.write(c.core().lock_alloc()?);
        Ok(())
    })
}

/// Frees application lock `lock` (CXLKV_RESULT_NOT_FOUND when it is not
/// allocated). Free a lock only once no node holds or will take it.
///
/// # Safety
/// `node` is a handle from this library or NULL.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_lock_free(node: *const cxlkv_node, lock: u32) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        Ok(c.core().lock_free(lock)?)
    })
}

/// Takes application lock `lock`, waiting up to the node's lock timeout
/// (CXLKV_RESULT_TIMEOUT). Taking it fences: every flush this thread issued
/// before is in memory before the lock is granted. Like a mutex, it is held
/// by the calling thread, which must release it: not recursive (a thread
/// that holds it gets CXLKV_RESULT_BUSY at once). While holding it, any
/// cache call may be made. A lock whose holder died is granted again after
/// recovery; what it guarded may then be half-updated.
///
/// # Safety
/// `node` is a handle from this library or NULL; `out` is valid for one
/// write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_lock_acquire(
    node: *const cxlkv_node,
    lock: u32,
    out: *mut cxlkv_lock_ticket,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let h = c.core().lock_app(lock)?;
        out.write(cxlkv_lock_ticket { lock, thread: tid(), seq: h.seq });
        Ok(())
    })
}

/// Releases a lock taken by `cxlkv_lock_acquire` on this node, from the
/// thread that took it (another thread gets CXLKV_RESULT_INVALID_ARGUMENT,
/// and the lock stays held). Flush what
/// the lock guards (`cxlkv_flush`) before: the release itself publishes
/// only the lock. CXLKV_RESULT_REVOKED when the grant is over: released
/// already, or revoked meanwhile (this node was declared dead).
///
/// # Safety
/// `node` is a handle from this library or NULL; `ticket` is valid for one
/// read.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_lock_release(node: *const cxlkv_node, ticket: *const cxlkv_lock_ticket) -> cxlkv_result {
    guard(|| {
        if ticket.is_null() {
            return Err(cxlkv_result::NullParameter.into());
        }
        // SAFETY:
        // - `ticket` is non-NULL and valid for one read by the contract.
        let t = unsafe { ticket.read() };
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        if t.thread != tid() {
            return Err(cxlkv_result::InvalidArgument.into());
        }
        Ok(c.unlock_app(t.lock, t.seq)?)
    })
}

/// Allocates `size` bytes of region payload (64-byte aligned) and writes
/// its offset. The bytes stay allocated until `cxlkv_free`, also across this
/// node's death or detach once reachable from a named root. An allocation no
/// root names outlives its node only as a leak: `cxlkv_check` reports it
/// and `cxlkv_recover` reclaims it. CXLKV_RESULT_OUT_OF_SPACE when the
/// region is full, CXLKV_RESULT_TOO_LARGE beyond what fits.
///
/// # Safety
/// `node` is a handle from this library or NULL; `out` is valid for one
/// write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_alloc(node: *const cxlkv_node, size: u64, out: *mut u64) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        out.write(c.core().alloc(size)?);
        Ok(())
    })
}

/// Frees an allocation made by `cxlkv_alloc` on any node.
///
/// # Safety
/// `node` is a handle from this library or NULL.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_free(node: *const cxlkv_node, offset: u64) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        Ok(c.core().free(offset)?)
    })
}

/// A named root's value: an application object in the region.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_root {
    /// Region offset of the object (0: none).
    pub offset: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Application-defined type tag.
    pub tag: u32,
    /// 0.
    pub reserved: u32,
}

fn name_of(s: &str) -> Res<&[u8]> {
    if s.is_empty() || s.len() > MAX_ROOT_NAME {
        return Err(cxlkv_result::InvalidArgument.into());
    }
    Ok(s.as_bytes())
}

/// Publishes root `name` (1 to 32 bytes of UTF-8) with `value`, for every
/// node to find. CXLKV_RESULT_EXISTS when the name is taken (nothing
/// written), CXLKV_RESULT_ROOTS_FULL when the table is full,
/// CXLKV_RESULT_INVALID_ARGUMENT when `value` does not lie in the payload
/// area.
///
/// # Safety
/// `node` is a handle from this library or NULL; `name` is NUL-terminated;
/// `value` is valid for one read.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_root_put(
    node: *const cxlkv_node,
    name: *const c_char,
    value: *const cxlkv_root,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `name` is NUL-terminated by the contract.
        let name = name_of(unsafe { text(name) }?)?;
        if value.is_null() {
            return Err(cxlkv_result::NullParameter.into());
        }
        // SAFETY:
        // - `value` is non-NULL and valid for a read by the contract.
        let v = unsafe { value.read() };
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        Ok(c.core().root_put(name, Root { offset: v.offset, size: v.size, tag: v.tag })?)
    })
}

/// Reads root `name` (without a lock). CXLKV_RESULT_NOT_FOUND if absent.
///
/// # Safety
/// `node` is a handle from this library or NULL; `name` is NUL-terminated;
/// `out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_root_get(
    node: *const cxlkv_node,
    name: *const c_char,
    out: *mut cxlkv_root,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `name` is NUL-terminated by the contract.
        let name = name_of(unsafe { text(name) }?)?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let r = c.root(name)?;
        out.write(cxlkv_root { offset: r.offset, size: r.size, tag: r.tag, reserved: 0 });
        Ok(())
    })
}

/// Removes root `name`; its value goes to `out` (NULL allowed). The object
/// it named is not freed: from then on nothing names it, and should the
/// node that allocated it die, recovery reclaims it (a later `cxlkv_free`
/// of it fails, or frees what was allocated there since). To free it, use
/// `cxlkv_root_free`.
///
/// # Safety
/// `node` is a handle from this library or NULL; `name` is NUL-terminated;
/// `out` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_root_destroy(
    node: *const cxlkv_node,
    name: *const c_char,
    out: *mut cxlkv_root,
) -> cxlkv_result {
    // SAFETY:
    // - The arguments meet `take_root`'s contract, which is this one's.
    unsafe { take_root(node, name, out, false) }
}

/// Removes root `name` and frees the allocation it names (from
/// `cxlkv_alloc`, by any node) in one step, so no recovery comes between;
/// its value goes to `out` (NULL allowed). CXLKV_RESULT_NOT_FOUND if
/// absent; CXLKV_RESULT_INVALID_ARGUMENT, changing nothing, when the root
/// names no live allocation; CXLKV_RESULT_RECOVERING, changing nothing,
/// while the allocation's node awaits recovery (retry).
///
/// # Safety
/// `node` is a handle from this library or NULL; `name` is NUL-terminated;
/// `out` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_root_free(
    node: *const cxlkv_node,
    name: *const c_char,
    out: *mut cxlkv_root,
) -> cxlkv_result {
    // SAFETY:
    // - The arguments meet `take_root`'s contract, which is this one's.
    unsafe { take_root(node, name, out, true) }
}

/// Removes root `name`, freeing the allocation it names when `free`, and
/// writes what it named to `out` (NULL allowed).
///
/// # Safety
/// `node` is a handle from this library or NULL; `name` is NUL-terminated;
/// `out` is NULL or valid for one write.
unsafe fn take_root(node: *const cxlkv_node, name: *const c_char, out: *mut cxlkv_root, free: bool) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is NULL or valid for one write by the contract.
        let out = unsafe { Out::maybe(out) };
        // SAFETY:
        // - `name` is NUL-terminated by the contract.
        let name = name_of(unsafe { text(name) }?)?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let core = c.core();
        let r = if free { core.root_free(name)? } else { core.root_destroy(name)? };
        if let Some(o) = out {
            o.write(cxlkv_root { offset: r.offset, size: r.size, tag: r.tag, reserved: 0 });
        }
        Ok(())
    })
}

/// The address, in this process, of `len` bytes at region offset `offset`.
/// CXLKV_RESULT_OUT_OF_BOUNDS unless they lie in the payload area (where
/// allocations, roots' objects and blocks live).
///
/// # Safety
/// `node` is a handle from this library or NULL; `out` is valid for one
/// write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_offset_to_ptr(
    node: *const cxlkv_node,
    offset: u64,
    len: u64,
    out: *mut *mut c_void,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        out.write(c.payload_ptr(offset, len)?.cast());
        Ok(())
    })
}

/// The region offset of address `ptr` of this process (inverse of
/// `cxlkv_offset_to_ptr`). CXLKV_RESULT_OUT_OF_BOUNDS outside the payload
/// area.
///
/// # Safety
/// `node` is a handle from this library or NULL; `out` is valid for one
/// write. `ptr` is only compared, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_ptr_to_offset(
    node: *const cxlkv_node,
    ptr: *const c_void,
    out: *mut u64,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        out.write(c.payload_offset(ptr.cast(), 0)?);
        Ok(())
    })
}

/// Publishes `len` bytes at `ptr` (in the payload area) to every host:
/// writes their cache lines back to memory and fences, so they are in
/// memory when this returns. Required after plain stores to region memory
/// that other hosts read (non-coherent CXL); cheap where memory is coherent.
///
/// # Safety
/// `node` is a handle from this library or NULL. `ptr` is only checked
/// against the region and used for cache maintenance, never read as data.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_flush(node: *const cxlkv_node, ptr: *const c_void, len: usize) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let off = c.payload_offset(ptr.cast(), len as u64)?;
        Ok(c.flush_range(off, len as u64)?)
    })
}

/// Makes `len` bytes at `ptr` (in the payload area) fresh: drops this host's
/// cached copies so the next loads read what other hosts published. Call it
/// before reading region memory another host wrote.
///
/// # Safety
/// `node` is a handle from this library or NULL. `ptr` is only checked
/// against the region and used for cache maintenance, never read as data.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_invalidate(node: *const cxlkv_node, ptr: *const c_void, len: usize) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let off = c.payload_offset(ptr.cast(), len as u64)?;
        Ok(c.invalidate_range(off, len as u64)?)
    })
}
