//! Zero-copy blocks: acquire and release pinned blocks, reserve blocks to
//! write in place, then publish or abort them. Every batch reports a result
//! per block.

use core::ffi::c_void;

use cxlkv_platform::kv::{Handle, ReserveItem};
use cxlkv_platform::Node;

use crate::kv::{cxlkv_key, keys_of};
use crate::region::{cxlkv_node, live};
use crate::{cxlkv_result, guard, slice, slice_mut, Fail, Out, Res};

/// A pinned (acquired) or reserved block: where its payload lies in this
/// process. `data` is NULL in an empty slot (a key that was not acquired or
/// reserved). The other fields identify the block to the library: pass the
/// struct back unchanged. Valid until released, published or aborted.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_block {
    /// The payload in the mapped region: read-only for an acquired block,
    /// writable for a reserved one.
    pub data: *mut c_void,
    /// Payload length in bytes.
    pub len: u64,
    /// The block's key.
    pub key: cxlkv_key,
    /// Its namespace id.
    pub ns: u32,
    /// Tokens it covers.
    pub tokens: u32,
    /// Library use.
    pub stripe: u32,
    /// Library use.
    pub entry: u32,
    /// Library use.
    pub gen: u32,
    /// Library use (0).
    pub reserved: u32,
    /// Payload offset in the region.
    pub offset: u64,
}

impl cxlkv_block {
    /// An empty slot (no block).
    pub const EMPTY: cxlkv_block = cxlkv_block {
        data: core::ptr::null_mut(),
        len: 0,
        key: cxlkv_key { lo: 0, hi: 0 },
        ns: 0,
        tokens: 0,
        stripe: 0,
        entry: 0,
        gen: 0,
        reserved: 0,
        offset: 0,
    };

    fn of(c: &Node, h: &Handle) -> Res<cxlkv_block> {
        let data = c.payload_ptr(h.off, h.len)?;
        Ok(cxlkv_block {
            data: data.cast(),
            len: h.len,
            key: h.key.into(),
            ns: h.ns,
            tokens: h.tokens,
            stripe: h.stripe,
            entry: h.entry,
            gen: h.gen,
            reserved: 0,
            offset: h.off,
        })
    }

    pub(crate) fn handle(&self) -> Handle {
        Handle {
            ns: self.ns,
            key: self.key.into(),
            stripe: self.stripe,
            entry: self.entry,
            gen: self.gen,
            off: self.offset,
            len: self.len,
            tokens: self.tokens,
        }
    }
}

pub(crate) fn code(r: &cxlkv_platform::kv::CoreResult<impl Sized>) -> cxlkv_result {
    match r {
        Ok(_) => cxlkv_result::Ok,
        Err(e) => (*e).into(),
    }
}

/// The outputs of a per-block batch call, checked before any work.
pub(crate) struct BatchOut<'a> {
    blocks: &'a mut [cxlkv_block],
    status: &'a mut [cxlkv_result],
}

impl BatchOut<'_> {
    /// # Safety
    /// `blocks` and `status` are valid for `n` writes each.
    unsafe fn new<'a>(blocks: *mut cxlkv_block, status: *mut cxlkv_result, n: usize) -> Res<BatchOut<'a>> {
        // SAFETY:
        // - the caller's contract.
        let blocks = unsafe { slice_mut(blocks, n) }?;
        // SAFETY:
        // - the caller's contract.
        let status = unsafe { slice_mut(status, n) }?;
        Ok(BatchOut { blocks, status })
    }

    /// Fills slot `i` from a handle result.
    fn set(&mut self, c: &Node, i: usize, r: cxlkv_platform::kv::CoreResult<Handle>) -> usize {
        let b = r.map_err(Fail::from).and_then(|h| cxlkv_block::of(c, &h));
        match b {
            Ok(b) => {
                self.blocks[i] = b;
                self.status[i] = cxlkv_result::Ok;
                1
            }
            Err(Fail(e)) => {
                self.blocks[i] = cxlkv_block::EMPTY;
                self.status[i] = e;
                0
            }
        }
    }
}

/// Pins the published blocks of `keys[0..n]` in namespace `ns` for
/// zero-copy reads: `blocks[i]` points at key `i`'s payload (read-only) and
/// `status[i]` is CXLKV_RESULT_OK, or CXLKV_RESULT_NOT_FOUND with an empty
/// block. The payload is fresh in this host's cache when this returns, and
/// stays valid and unchanged until `cxlkv_release`: a pinned block is never
/// evicted. `*n_acquired` (NULL allowed) gets how many were pinned.
///
/// # Safety
/// `node` is a handle from this library or NULL; `keys` is valid for `n`
/// reads; `blocks` and `status` for `n` writes; `n_acquired` is NULL or
/// valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_acquire(
    node: *const cxlkv_node,
    ns: u32,
    keys: *const cxlkv_key,
    n: usize,
    blocks: *mut cxlkv_block,
    status: *mut cxlkv_result,
    n_acquired: *mut usize,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `n_acquired` is NULL or valid for one write by the contract.
        let count = unsafe { Out::maybe(n_acquired) };
        // SAFETY:
        // - `blocks` and `status` are valid for `n` writes by the contract.
        let mut out = unsafe { BatchOut::new(blocks, status, n) }?;
        // SAFETY:
        // - `keys` is valid for `n` reads by the contract.
        let ks = unsafe { keys_of(keys, n) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let mut hs = vec![Err(cxlkv_platform::kv::CoreError::InvalidArgument); n];
        c.acquire_views(ns, &ks, &mut hs)?;
        let mut got = 0;
        for (i, r) in hs.into_iter().enumerate() {
            got += out.set(&c, i, r);
        }
        if let Some(o) = count {
            o.write(got);
        }
        Ok(())
    })
}

/// Handles of the non-empty blocks of a call.
///
/// # Safety
/// `blocks` is valid for `n` reads.
unsafe fn handles_of(blocks: *const cxlkv_block, n: usize) -> Res<Vec<Handle>> {
    // SAFETY:
    // - the caller's contract.
    let bs = unsafe { slice(blocks, n) }?;
    Ok(bs.iter().filter(|b| !b.data.is_null()).map(cxlkv_block::handle).collect())
}

/// Drops one pin of each non-empty block of `blocks[0..n]` (from
/// `cxlkv_acquire`); empty slots are skipped, so the array acquire filled
/// can be passed as it is. Their `data` pointers must not be used after.
/// Returns the first failure (CXLKV_RESULT_STALE_HANDLE for a block this
/// node does not hold); the other blocks are released all the same.
///
/// # Safety
/// `node` is a handle from this library or NULL; `blocks` is valid for `n`
/// reads.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_release(node: *const cxlkv_node, blocks: *const cxlkv_block, n: usize) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `blocks` is valid for `n` reads by the contract.
        let hs = unsafe { handles_of(blocks, n) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        Ok(c.core().release(&hs)?)
    })
}

/// One block to reserve.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_reserve_item {
    /// Key.
    pub key: cxlkv_key,
    /// Payload bytes.
    pub len: u64,
    /// Tokens the block covers.
    pub tokens: u32,
    /// 0.
    pub reserved: u32,
}

/// Reserves writable blocks for zero-copy writes: `blocks[i]` points at
/// `items[i].len` writable bytes in the region, and `status[i]` is
/// CXLKV_RESULT_OK, CXLKV_RESULT_EXISTS (stored or being written by
/// someone: nothing reserved), CXLKV_RESULT_OUT_OF_SPACE (everything
/// evictable is pinned) or another failure. Evicts least-recently-used
/// blocks as needed. Fill the payloads with plain stores (or DMA), then
/// `cxlkv_publish` or `cxlkv_abort` each. `*n_reserved` (NULL allowed) gets
/// how many were reserved.
///
/// # Safety
/// `node` is a handle from this library or NULL; `items` is valid for `n`
/// reads; `blocks` and `status` for `n` writes; `n_reserved` is NULL or
/// valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_reserve(
    node: *const cxlkv_node,
    ns: u32,
    items: *const cxlkv_reserve_item,
    n: usize,
    blocks: *mut cxlkv_block,
    status: *mut cxlkv_result,
    n_reserved: *mut usize,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `n_reserved` is NULL or valid for one write by the contract.
        let count = unsafe { Out::maybe(n_reserved) };
        // SAFETY:
        // - `blocks` and `status` are valid for `n` writes by the contract.
        let mut out = unsafe { BatchOut::new(blocks, status, n) }?;
        // SAFETY:
        // - `items` is valid for `n` reads by the contract.
        let its = unsafe { slice(items, n) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let req: Vec<ReserveItem> =
            its.iter().map(|i| ReserveItem { key: i.key.into(), len: i.len, tokens: i.tokens }).collect();
        let mut hs = vec![Err(cxlkv_platform::kv::CoreError::InvalidArgument); n];
        c.core().reserve_batch(ns, &req, &mut hs)?;
        let mut got = 0;
        for (i, r) in hs.into_iter().enumerate() {
            got += out.set(&c, i, r);
        }
        if let Some(o) = count {
            o.write(got);
        }
        Ok(())
    })
}

/// Runs a per-block finishing operation over `blocks[0..n]`, reporting in
/// `status[i]` (empty slots get CXLKV_RESULT_INVALID_ARGUMENT).
///
/// # Safety
/// `blocks` valid for `n` reads, `status` for `n` writes, `node` NULL or a
/// handle from this library.
pub(crate) unsafe fn finish(
    node: *const cxlkv_node,
    blocks: *const cxlkv_block,
    n: usize,
    status: *mut cxlkv_result,
    op: impl FnOnce(&Node, &[Handle], &mut [cxlkv_platform::kv::CoreResult<()>]) -> Res<()>,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `blocks` is valid for `n` reads by the contract.
        let bs = unsafe { slice(blocks, n) }?;
        // SAFETY:
        // - `status` is valid for `n` writes by the contract.
        let st = unsafe { slice_mut(status, n) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let idx: Vec<usize> = (0..n).filter(|&i| !bs[i].data.is_null()).collect();
        let hs: Vec<Handle> = idx.iter().map(|&i| bs[i].handle()).collect();
        let mut res = vec![Ok(()); hs.len()];
        op(&c, &hs, &mut res)?;
        st.fill(cxlkv_result::InvalidArgument);
        for (k, r) in idx.into_iter().zip(&res) {
            st[k] = code(r);
        }
        Ok(())
    })
}

/// Publishes reserved blocks: flushes each payload, then turns it visible
/// to every node at once (its entry turns READY after the payload reached
/// memory). `status[i]` is CXLKV_RESULT_OK or why block `i` was not
/// published (CXLKV_RESULT_STALE_HANDLE: not reserved by this node). The
/// `data` pointers must not be written after.
///
/// # Safety
/// `node` is a handle from this library or NULL; `blocks` is valid for `n`
/// reads; `status` for `n` writes.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_publish(
    node: *const cxlkv_node,
    blocks: *const cxlkv_block,
    n: usize,
    status: *mut cxlkv_result,
) -> cxlkv_result {
    // SAFETY:
    // - the pointers as the contract says; `finish` checks them.
    unsafe { finish(node, blocks, n, status, |c, hs, res| Ok(c.core().publish_batch(hs, res)?)) }
}

/// Abandons reserved blocks: their entries and payload space are freed and
/// the keys can be reserved again. `status[i]` reports each.
///
/// # Safety
/// `node` is a handle from this library or NULL; `blocks` is valid for `n`
/// reads; `status` for `n` writes.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_abort(
    node: *const cxlkv_node,
    blocks: *const cxlkv_block,
    n: usize,
    status: *mut cxlkv_result,
) -> cxlkv_result {
    // SAFETY:
    // - the pointers as the contract says; `finish` checks them.
    unsafe {
        finish(node, blocks, n, status, |c, hs, res| {
            for (h, r) in hs.iter().zip(res.iter_mut()) {
                *r = c.core().abort(h);
            }
            Ok(())
        })
    }
}
