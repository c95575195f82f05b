//! Copying put and get through lists of buffers (scatter/gather), a
//! result per block.

use core::ffi::c_void;

use cxlkv_platform::{GetItem, PutItem};

use crate::blocks::code;
use crate::kv::cxlkv_key;
use crate::region::{cxlkv_node, live};
use crate::{cxlkv_result, guard, slice, slice_mut, Res};

/// A buffer: `len` bytes at `base`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_iovec {
    /// Start (read by put, written by get).
    pub base: *mut c_void,
    /// Length in bytes.
    pub len: usize,
}

/// One block to put: its payload is the concatenation of `parts` (for
/// example K then V, or one part per layer).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_put_item {
    /// Key.
    pub key: cxlkv_key,
    /// Tokens the block covers.
    pub tokens: u32,
    /// 0.
    pub reserved: u32,
    /// The parts, in order.
    pub parts: *const cxlkv_iovec,
    /// How many.
    pub n_parts: usize,
}

/// One block to get into `parts`, filled in order.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_get_item {
    /// Key.
    pub key: cxlkv_key,
    /// The buffers, in order; together at least as long as the payload.
    pub parts: *const cxlkv_iovec,
    /// How many.
    pub n_parts: usize,
}

/// The list of parts `parts[..n]`.
///
/// # Safety
/// `parts` valid for `n` reads.
unsafe fn iovecs<'a>(parts: *const cxlkv_iovec, n: usize) -> Res<&'a [cxlkv_iovec]> {
    // SAFETY:
    // - `parts` is valid for `n` reads (caller's contract).
    unsafe { slice(parts, n) }
}

/// Byte slices to read of a list of parts (a put's sources).
///
/// # Safety
/// `parts` valid for `n` reads; each part's `base` valid for `len` bytes of
/// reads while the slices live.
unsafe fn parts_to_read<'a>(parts: *const cxlkv_iovec, n: usize) -> Res<Vec<&'a [u8]>> {
    // SAFETY:
    // - `parts` is valid for `n` reads (caller's contract).
    let ps = unsafe { iovecs(parts, n) }?;
    ps.iter()
        .map(|p| {
            // SAFETY:
            // - each part is valid for `len` bytes of reads (caller's
            //   contract); the slice is shared, so it may alias another.
            unsafe { slice(p.base.cast_const().cast::<u8>(), p.len) }
        })
        .collect()
}

/// Byte slices to fill of a list of parts (a get's destinations).
///
/// # Safety
/// `parts` valid for `n` reads; each part's `base` valid for `len` bytes of
/// reads and writes while the slices live, no two overlapping.
unsafe fn parts_to_fill<'a>(parts: *const cxlkv_iovec, n: usize) -> Res<Vec<&'a mut [u8]>> {
    // SAFETY:
    // - `parts` is valid for `n` reads (caller's contract).
    let ps = unsafe { iovecs(parts, n) }?;
    ps.iter()
        .map(|p| {
            // SAFETY:
            // - each part is valid for `len` bytes of writes and overlaps no
            //   other (caller's contract).
            unsafe { slice_mut(p.base.cast::<u8>(), p.len) }
        })
        .collect()
}

/// Copies blocks into the region: item `i`'s payload is its parts
/// concatenated. `status[i]` is CXLKV_RESULT_OK (published),
/// CXLKV_RESULT_EXISTS (the key is stored already: nothing written), or why
/// it failed; the other items are stored all the same.
///
/// # Safety
/// `node` is a handle from this library or NULL; `items` is valid for `n`
/// reads, each part for `len` bytes of reads; `status` for `n` writes.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_put(
    node: *const cxlkv_node,
    ns: u32,
    items: *const cxlkv_put_item,
    n: usize,
    status: *mut cxlkv_result,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `status` is valid for `n` writes by the contract.
        let st = unsafe { slice_mut(status, n) }?;
        // SAFETY:
        // - `items` is valid for `n` reads by the contract.
        let its = unsafe { slice(items, n) }?;
        let mut parts = Vec::with_capacity(n);
        for it in its {
            // SAFETY:
            // - `it.parts` is valid for `n_parts` reads, and each part for
            //   `len` bytes of reads (contract).
            parts.push(unsafe { parts_to_read(it.parts, it.n_parts) }?);
        }
        let put: Vec<PutItem<'_>> = its
            .iter()
            .zip(&parts)
            .map(|(it, ps)| PutItem { key: it.key.into(), tokens: it.tokens, parts: ps })
            .collect();
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let mut res = vec![Ok(()); n];
        c.put(ns, &put, &mut res)?;
        for (s, r) in st.iter_mut().zip(&res) {
            *s = code(r);
        }
        Ok(())
    })
}

/// Copies blocks out of the region into each item's parts, in order:
/// `lens[i]` gets block `i`'s payload length when it is stored, `status[i]`
/// is CXLKV_RESULT_OK (the first `lens[i]` bytes of the parts are filled),
/// CXLKV_RESULT_NOT_FOUND, or CXLKV_RESULT_TOO_LARGE when the parts are
/// shorter than the payload (nothing copied; `lens[i]` says what is
/// needed).
///
/// # Safety
/// `node` is a handle from this library or NULL; `items` is valid for `n`
/// reads, each part for `len` bytes of writes, no two overlapping; `lens`
/// and `status` for `n` writes.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_get(
    node: *const cxlkv_node,
    ns: u32,
    items: *const cxlkv_get_item,
    n: usize,
    lens: *mut u64,
    status: *mut cxlkv_result,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `status` is valid for `n` writes by the contract.
        let st = unsafe { slice_mut(status, n) }?;
        // SAFETY:
        // - `lens` is valid for `n` writes by the contract.
        let ls = unsafe { slice_mut(lens, n) }?;
        // SAFETY:
        // - `items` is valid for `n` reads by the contract.
        let its = unsafe { slice(items, n) }?;
        let mut parts = Vec::with_capacity(n);
        for it in its {
            // SAFETY:
            // - each part is valid for `len` bytes of writes, none
            //   overlapping (contract).
            parts.push(unsafe { parts_to_fill(it.parts, it.n_parts) }?);
        }
        let mut get: Vec<GetItem<'_, '_>> =
            its.iter().zip(parts.iter_mut()).map(|(it, ps)| GetItem { key: it.key.into(), parts: ps }).collect();
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let mut res = vec![Ok(()); n];
        c.get(ns, &mut get, ls, &mut res)?;
        for (s, r) in st.iter_mut().zip(&res) {
            *s = code(r);
        }
        Ok(())
    })
}
