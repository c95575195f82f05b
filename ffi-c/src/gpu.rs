//! The GPU path: the region registered with the CUDA driver, and KV payloads
//! moved between blocks and the engine's device memory on the engine's own
//! stream. `libcuda` is loaded at run time: without a driver or a device (or
//! with `CXLKV_CUDA=off`) every call returns CXLKV_RESULT_CUDA_UNAVAILABLE.

use core::ffi::c_void;

use cxlkv_platform::gpu::Segment;

use crate::blocks::{cxlkv_block, finish};
use crate::region::{cxlkv_node, live};
use crate::{cxlkv_result, guard, slice};

/// One piece to move: `len` bytes at region offset `region_offset` (inside
/// a block: `block.offset` plus a position) and at device address
/// `device_ptr` (a `CUdeviceptr` from the engine's allocator).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_cuda_segment {
    /// Region offset.
    pub region_offset: u64,
    /// Device address.
    pub device_ptr: u64,
    /// Bytes.
    pub len: u64,
}

/// Registers the whole region with the CUDA driver for `device` (through
/// its primary context, the one the CUDA runtime uses), so copies run at
/// pinned-memory speed. Registering again for the same device does nothing;
/// another device is CXLKV_RESULT_INVALID_ARGUMENT. Unregistered when the
/// node detaches.
///
/// # Safety
/// `node` is a handle from this library or NULL.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_cuda_register(node: *const cxlkv_node, device: u32) -> cxlkv_result {
    guard(|| {
        // SAFETY: `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        c.register_cuda(device)?;
        Ok(())
    })
}

/// The direction and mechanism of a segment copy.
#[derive(Clone, Copy)]
enum Dir {
    ToDevice,
    FromDevice,
    Gather,
    Scatter,
}

/// Queues the copies of `segs[0..n]` on `stream`.
///
/// # Safety
/// `node` is NULL or a handle from this library; `segs` valid for `n` reads.
unsafe fn copy(
    node: *const cxlkv_node,
    segs: *const cxlkv_cuda_segment,
    n: usize,
    stream: *mut c_void,
    how: Dir,
) -> cxlkv_result {
    guard(|| {
        // SAFETY: `segs` is valid for `n` reads by the contract.
        let ss = unsafe { slice(segs, n) }?;
        // SAFETY: `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let segs: Vec<Segment> =
            ss.iter().map(|s| Segment { region_off: s.region_offset, device_ptr: s.device_ptr, len: s.len }).collect();
        let path = c.cuda()?;
        let stream = stream as usize;
        match how {
            Dir::ToDevice => path.to_device(&segs, stream)?,
            Dir::FromDevice => path.from_device(&segs, stream)?,
            Dir::Gather => path.gather(&segs, stream)?,
            Dir::Scatter => path.scatter(&segs, stream)?,
        }
        Ok(())
    })
}

/// Queues one DMA copy per segment, region to device, on `stream` (a
/// `CUstream`; NULL: the default stream). Region bytes are made fresh
/// first. The blocks read must stay acquired until the stream completed.
/// Every segment is checked before anything is queued: outside the payload
/// area is CXLKV_RESULT_OUT_OF_BOUNDS.
///
/// # Safety
/// `node` is NULL or a handle from this library; `segs` valid for `n`
/// reads; the device addresses valid for `len` bytes on the stream's device.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_cuda_to_device(
    node: *const cxlkv_node,
    segs: *const cxlkv_cuda_segment,
    n: usize,
    stream: *mut c_void,
) -> cxlkv_result {
    // SAFETY: the caller's contract, passed on.
    unsafe { copy(node, segs, n, stream, Dir::ToDevice) }
}

/// Queues one DMA copy per segment, device to region (into reserved
/// blocks); publish them with `cxlkv_cuda_publish_after`.
///
/// # Safety
/// As `cxlkv_cuda_to_device`.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_cuda_from_device(
    node: *const cxlkv_node,
    segs: *const cxlkv_cuda_segment,
    n: usize,
    stream: *mut c_void,
) -> cxlkv_result {
    // SAFETY: the caller's contract, passed on.
    unsafe { copy(node, segs, n, stream, Dir::FromDevice) }
}

/// Gathers many region pieces into device memory with one kernel launch per
/// 128 segments (a paged KV layout). Fastest with 16-byte aligned addresses
/// and lengths.
///
/// # Safety
/// As `cxlkv_cuda_to_device`.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_cuda_gather(
    node: *const cxlkv_node,
    segs: *const cxlkv_cuda_segment,
    n: usize,
    stream: *mut c_void,
) -> cxlkv_result {
    // SAFETY: the caller's contract, passed on.
    unsafe { copy(node, segs, n, stream, Dir::Gather) }
}

/// Scatters device pieces into the region (reserved blocks) with one kernel
/// launch per 128 segments. Destinations must not overlap.
///
/// # Safety
/// As `cxlkv_cuda_to_device`.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_cuda_scatter(
    node: *const cxlkv_node,
    segs: *const cxlkv_cuda_segment,
    n: usize,
    stream: *mut c_void,
) -> cxlkv_result {
    // SAFETY: the caller's contract, passed on.
    unsafe { copy(node, segs, n, stream, Dir::Scatter) }
}

/// Waits until everything queued on `stream` has completed.
///
/// # Safety
/// `node` is NULL or a handle from this library; `stream` a `CUstream` of
/// the registered device, or NULL.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_cuda_synchronize(node: *const cxlkv_node, stream: *mut c_void) -> cxlkv_result {
    guard(|| {
        // SAFETY: `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        c.cuda()?.synchronize(stream as usize)?;
        Ok(())
    })
}

/// Waits for `stream`, then publishes the reserved blocks `blocks[0..n]`
/// that copies on it filled: a block turns visible only after its bytes
/// are in memory. `status[i]` reports block `i` (empty slots:
/// CXLKV_RESULT_INVALID_ARGUMENT).
///
/// # Safety
/// `node` is NULL or a handle from this library; `blocks` valid for `n`
/// reads; `status` for `n` writes.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_cuda_publish_after(
    node: *const cxlkv_node,
    stream: *mut c_void,
    blocks: *const cxlkv_block,
    n: usize,
    status: *mut cxlkv_result,
) -> cxlkv_result {
    // SAFETY: the pointers as the contract says; `finish` checks them.
    unsafe { finish(node, blocks, n, status, |c, hs, res| Ok(c.cuda()?.publish_after(stream as usize, hs, res)?)) }
}
