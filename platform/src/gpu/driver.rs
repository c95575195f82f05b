//! The CUDA driver, loaded at run time through `cudarc`'s raw bindings.
//!
//! Every entry point is checked for presence before the first call (a missing
//! `libcuda` makes the bindings panic), every result is checked, and every
//! call runs with the device's primary context pushed, the context that
//! engines using the runtime API share.

use core::ffi::{c_char, c_uint, c_void, CStr};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys;

use super::{RegisteredRange, MAX_SEGMENTS_PER_LAUNCH};
use crate::error::{Error, Result};

/// The segment-copy kernel, NUL-terminated for `cuModuleLoadData`.
const COPY_PTX: &str = concat!(include_str!("copy.ptx"), "\0");
const COPY_KERNEL: &CStr = c"cxlkv_copy_segments";
/// Threads per block of the copy kernel; one slice is 16 bytes per thread.
const THREADS: u32 = 256;
const SLICE: u64 = THREADS as u64 * 16;
const MAX_SLICES: u64 = 1024;

fn error_name(r: sys::CUresult) -> &'static str {
    let mut p: *const c_char = core::ptr::null();
    // SAFETY: the library is loaded (a result exists); `p` is a valid out pointer.
    let got = unsafe { sys::cuGetErrorName(r, &mut p) };
    if got != sys::CUresult::CUDA_SUCCESS || p.is_null() {
        return "unknown CUDA error";
    }
    // SAFETY: the driver returns a static NUL-terminated string for a known code.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().unwrap_or("unknown CUDA error")
}

fn ok(r: sys::CUresult, call: &'static str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(Error::Cuda { call, code: r as u32, name: error_name(r) })
}

struct Ctx {
    ctx: sys::CUcontext,
    dev: sys::CUdevice,
    module: sys::CUmodule,
    copy: sys::CUfunction,
}

// SAFETY: CUDA driver handles may be used from any thread; every use pushes
// the context on the calling thread first.
unsafe impl Send for Ctx {}
// SAFETY: as above; the driver API is thread-safe.
unsafe impl Sync for Ctx {}

impl Ctx {
    fn enter(&self) -> Result<Entered> {
        // SAFETY: `ctx` is the retained primary context, alive while `self` is.
        ok(unsafe { sys::cuCtxPushCurrent_v2(self.ctx) }, "cuCtxPushCurrent")?;
        Ok(Entered)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        if let Ok(_e) = self.enter() {
            // SAFETY: the module was loaded by `open` and no kernel of it is
            // launched after the last handle to the context is gone.
            let _ = unsafe { sys::cuModuleUnload(self.module) };
        }
        // SAFETY: balances the retain in `open`.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// The pushed context; popped on drop.
struct Entered;

impl Drop for Entered {
    fn drop(&mut self) {
        let mut old: sys::CUcontext = core::ptr::null_mut();
        // SAFETY: balances the push in `Ctx::enter` on this thread.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut old) };
    }
}

/// One CUDA device, opened through its primary context.
#[derive(Clone)]
pub struct Cuda {
    ctx: Arc<Ctx>,
    ordinal: u32,
    name: String,
}

impl core::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cuda").field("ordinal", &self.ordinal).field("name", &self.name).finish()
    }
}

fn unavailable_code(r: sys::CUresult) -> Option<&'static str> {
    use sys::CUresult as R;
    match r {
        R::CUDA_ERROR_NO_DEVICE => Some("no CUDA device"),
        R::CUDA_ERROR_STUB_LIBRARY => Some("libcuda is a stub, not a driver"),
        R::CUDA_ERROR_NOT_INITIALIZED | R::CUDA_ERROR_DEINITIALIZED => Some("the CUDA driver cannot initialise"),
        R::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH | R::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE => {
            Some("the CUDA driver does not match the kernel module")
        }
        _ => None,
    }
}

/// True when a CUDA driver library can be loaded.
pub fn library_present() -> bool {
    // SAFETY: only tries to load the library; no entry point is called.
    unsafe { sys::is_culib_present() }
}

impl Cuda {
    /// Opens device `ordinal`: initialises the driver, retains the device's
    /// primary context and loads the copy kernel.
    ///
    /// `CudaUnavailable` when `CXLKV_CUDA=off`, when `libcuda` is missing, or
    /// when the driver finds no usable device.
    pub fn open(ordinal: u32) -> Result<Cuda> {
        if super::disabled_by(std::env::var_os("CXLKV_CUDA").as_deref()) {
            return Err(Error::CudaUnavailable("disabled by CXLKV_CUDA=off"));
        }
        if !library_present() {
            return Err(Error::CudaUnavailable("libcuda not found"));
        }
        // The bindings panic on an entry point missing from an old driver.
        std::panic::catch_unwind(|| Cuda::open_loaded(ordinal))
            .unwrap_or(Err(Error::CudaUnavailable("the CUDA driver lacks a required entry point")))
    }

    fn open_loaded(ordinal: u32) -> Result<Cuda> {
        // SAFETY: plain driver initialisation; flags must be 0.
        let r = unsafe { sys::cuInit(0) };
        if let Some(why) = unavailable_code(r) {
            return Err(Error::CudaUnavailable(why));
        }
        ok(r, "cuInit")?;
        let mut count = 0;
        // SAFETY: valid out pointer.
        ok(unsafe { sys::cuDeviceGetCount(&mut count) }, "cuDeviceGetCount")?;
        if count <= 0 {
            return Err(Error::CudaUnavailable("no CUDA device"));
        }
        let ord = i32::try_from(ordinal).map_err(|_| Error::Core(cxlkv_core::Error::InvalidArgument))?;
        if ord >= count {
            return Err(Error::Core(cxlkv_core::Error::InvalidArgument));
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: valid out pointer; `ord` is below the device count.
        ok(unsafe { sys::cuDeviceGet(&mut dev, ord) }, "cuDeviceGet")?;
        let mut name = [0 as c_char; 128];
        // SAFETY: `name` holds 128 bytes; the driver writes a NUL-terminated name.
        ok(unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev) }, "cuDeviceGetName")?;
        // SAFETY: NUL-terminated by the driver within the buffer.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
        let mut ctx: sys::CUcontext = core::ptr::null_mut();
        // SAFETY: valid out pointer and device.
        ok(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) }, "cuDevicePrimaryCtxRetain")?;
        let mut c = Ctx { ctx, dev, module: core::ptr::null_mut(), copy: core::ptr::null_mut() };
        {
            let _e = c.enter()?;
            let mut module: sys::CUmodule = core::ptr::null_mut();
            // SAFETY: `COPY_PTX` is a NUL-terminated PTX image; valid out pointer.
            ok(unsafe { sys::cuModuleLoadData(&mut module, COPY_PTX.as_ptr().cast()) }, "cuModuleLoadData")?;
            c.module = module;
            // SAFETY: `module` was just loaded; the name is NUL-terminated.
            ok(unsafe { sys::cuModuleGetFunction(&mut c.copy, module, COPY_KERNEL.as_ptr()) }, "cuModuleGetFunction")?;
        }
        Ok(Cuda { ctx: Arc::new(c), ordinal, name })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Page-locks `base..base+len` and maps it for the device, in chunks of
    /// `chunk` bytes (flags PORTABLE | DEVICEMAP). Unregistered on drop.
    ///
    /// # Safety
    /// `base..base+len` must stay mapped until the registration drops.
    pub unsafe fn register(&self, base: *mut u8, len: usize, chunk: usize) -> Result<Registration> {
        if base.is_null() || len == 0 || chunk == 0 {
            return Err(Error::Core(cxlkv_core::Error::InvalidArgument));
        }
        let t0 = Instant::now();
        let _e = self.ctx.enter()?;
        let mut reg = Registration { ctx: self.ctx.clone(), ranges: Vec::new(), secs: 0.0 };
        let mut off = 0usize;
        while off < len {
            let n = chunk.min(len - off);
            let p = base.wrapping_add(off);
            let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
            // SAFETY: `p..p+n` lies in the caller's mapping, which outlives the
            // registration (this function's contract). On failure the chunks
            // registered so far are unregistered by `reg`'s drop.
            ok(unsafe { sys::cuMemHostRegister_v2(p.cast(), n, flags as c_uint) }, "cuMemHostRegister")?;
            let mut dptr: sys::CUdeviceptr = 0;
            let pushed = RegisteredRange { region_off: off as u64, len: n as u64, host_ptr: p as u64, device_ptr: 0 };
            reg.ranges.push(pushed);
            // SAFETY: `p` was just registered with DEVICEMAP; valid out pointer.
            ok(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, p.cast(), 0) }, "cuMemHostGetDevicePointer")?;
            if let Some(last) = reg.ranges.last_mut() {
                last.device_ptr = dptr;
            }
            off += n;
        }
        reg.secs = t0.elapsed().as_secs_f64();
        Ok(reg)
    }

    /// Starts an asynchronous copy of `len` bytes from host `src` to device
    /// `dst` on `stream` (a raw `CUstream`; 0 is the legacy default stream).
    ///
    /// # Safety
    /// `src..src+len` must stay readable and `dst..dst+len` writable device
    /// memory until the copy completes.
    pub unsafe fn copy_to_device(&self, dst: u64, src: *const u8, len: usize, stream: usize) -> Result<()> {
        let _e = self.ctx.enter()?;
        // SAFETY: the caller's contract.
        ok(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, stream as sys::CUstream) }, "cuMemcpyHtoDAsync")
    }

    /// Starts an asynchronous copy of `len` bytes from device `src` to host
    /// `dst` on `stream`.
    ///
    /// # Safety
    /// `dst..dst+len` must stay writable and `src..src+len` readable device
    /// memory until the copy completes.
    pub unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, len: usize, stream: usize) -> Result<()> {
        let _e = self.ctx.enter()?;
        // SAFETY: the caller's contract.
        ok(unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, stream as sys::CUstream) }, "cuMemcpyDtoHAsync")
    }

    /// Launches the segment-copy kernel over `(src, dst, len)` device-visible
    /// addresses, `MAX_SEGMENTS_PER_LAUNCH` per launch, on `stream`.
    ///
    /// # Safety
    /// Every range must be device-accessible (device memory, or registered
    /// host memory by its device pointer) until the kernel completes, and the
    /// destinations must not overlap each other or the sources.
    pub unsafe fn launch_copy(&self, segs: &[[u64; 3]], stream: usize) -> Result<()> {
        let _e = self.ctx.enter()?;
        for batch in segs.chunks(MAX_SEGMENTS_PER_LAUNCH) {
            #[repr(C, align(8))]
            struct Params([[u64; 3]; MAX_SEGMENTS_PER_LAUNCH]);
            let mut p = Params([[0; 3]; MAX_SEGMENTS_PER_LAUNCH]);
            p.0[..batch.len()].copy_from_slice(batch);
            let mut n = batch.len() as u32;
            let longest = batch.iter().map(|s| s[2]).max().unwrap_or(0);
            let slices = longest.div_ceil(SLICE).clamp(1, MAX_SLICES) as c_uint;
            let mut args: [*mut c_void; 2] = [(&raw mut n).cast(), (&raw mut p).cast()];
            // SAFETY: `copy` is the loaded kernel; `args` points at one value per
            // kernel parameter (u32, then the 3072-byte segment array), which
            // the driver copies at launch; ranges per this function's contract.
            let r = unsafe {
                sys::cuLaunchKernel(
                    self.ctx.copy,
                    n,
                    slices,
                    1,
                    THREADS,
                    1,
                    1,
                    0,
                    stream as sys::CUstream,
                    args.as_mut_ptr(),
                    core::ptr::null_mut(),
                )
            };
            ok(r, "cuLaunchKernel")?;
        }
        Ok(())
    }

    /// Waits until everything queued on `stream` has completed.
    pub fn synchronize(&self, stream: usize) -> Result<()> {
        let _e = self.ctx.enter()?;
        // SAFETY: a raw stream handle of this context (or 0), as documented.
        ok(unsafe { sys::cuStreamSynchronize(stream as sys::CUstream) }, "cuStreamSynchronize")
    }

    /// Allocates `len` bytes of device memory.
    pub fn alloc(&self, len: usize) -> Result<DeviceBuffer> {
        let _e = self.ctx.enter()?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: valid out pointer.
        ok(unsafe { sys::cuMemAlloc_v2(&mut p, len.max(1)) }, "cuMemAlloc")?;
        Ok(DeviceBuffer { ctx: self.ctx.clone(), ptr: p, len })
    }

    /// Allocates `len` bytes of page-locked host memory (`cuMemAllocHost`).
    pub fn alloc_host(&self, len: usize) -> Result<HostBuffer> {
        let _e = self.ctx.enter()?;
        let mut p: *mut c_void = core::ptr::null_mut();
        // SAFETY: valid out pointer.
        ok(unsafe { sys::cuMemAllocHost_v2(&mut p, len.max(1)) }, "cuMemAllocHost")?;
        Ok(HostBuffer { ctx: self.ctx.clone(), ptr: p.cast(), len })
    }

    /// Creates a stream (non-blocking with respect to the legacy stream).
    pub fn stream(&self) -> Result<Stream> {
        let _e = self.ctx.enter()?;
        let mut s: sys::CUstream = core::ptr::null_mut();
        // SAFETY: valid out pointer; flag 1 = CU_STREAM_NON_BLOCKING.
        ok(unsafe { sys::cuStreamCreate(&mut s, 1) }, "cuStreamCreate")?;
        Ok(Stream { ctx: self.ctx.clone(), raw: s })
    }
}

/// Registered host ranges; unregistered on drop.
pub struct Registration {
    ctx: Arc<Ctx>,
    ranges: Vec<RegisteredRange>,
    secs: f64,
}

impl Registration {
    /// The registered chunks, in region order.
    pub fn ranges(&self) -> &[RegisteredRange] {
        &self.ranges
    }

    /// Seconds the registration took.
    pub fn seconds(&self) -> f64 {
        self.secs
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let Ok(_e) = self.ctx.enter() else { return };
        for r in &self.ranges {
            // SAFETY: registered by `Cuda::register`, whose caller keeps the
            // memory mapped until now; copies on it have completed (callers
            // synchronise before unregistering: documented on `Node`).
            let _ = unsafe { sys::cuMemHostUnregister(r.host_ptr as *mut c_void) };
        }
    }
}

/// Device memory from [`Cuda::alloc`]; freed on drop.
pub struct DeviceBuffer {
    ctx: Arc<Ctx>,
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl DeviceBuffer {
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `src` to byte `at` of the buffer, synchronously.
    pub fn upload(&self, at: usize, src: &[u8]) -> Result<()> {
        self.range(at, src.len())?;
        let _e = self.ctx.enter()?;
        // SAFETY: the range lies in this allocation (checked); `src` is a valid slice.
        ok(unsafe { sys::cuMemcpyHtoD_v2(self.ptr + at as u64, src.as_ptr().cast(), src.len()) }, "cuMemcpyHtoD")
    }

    /// Copies from byte `at` of the buffer into `dst`, synchronously.
    pub fn download(&self, at: usize, dst: &mut [u8]) -> Result<()> {
        self.range(at, dst.len())?;
        let _e = self.ctx.enter()?;
        // SAFETY: the range lies in this allocation (checked); `dst` is a valid slice.
        ok(unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), self.ptr + at as u64, dst.len()) }, "cuMemcpyDtoH")
    }

    /// Sets every byte to `v`, synchronously.
    pub fn fill(&self, v: u8) -> Result<()> {
        let _e = self.ctx.enter()?;
        // SAFETY: the whole allocation.
        ok(unsafe { sys::cuMemsetD8_v2(self.ptr, v, self.len) }, "cuMemsetD8")?;
        // SAFETY: plain context synchronisation.
        ok(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }

    fn range(&self, at: usize, len: usize) -> Result<()> {
        match at.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::Core(cxlkv_core::Error::OutOfBounds)),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let Ok(_e) = self.ctx.enter() else { return };
        // SAFETY: allocated by `Cuda::alloc`; the owner's copies are done.
        let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// Page-locked host memory from [`Cuda::alloc_host`]; freed on drop.
pub struct HostBuffer {
    ctx: Arc<Ctx>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain memory owned by this value.
unsafe impl Send for HostBuffer {}

impl HostBuffer {
    /// The host address.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        let Ok(_e) = self.ctx.enter() else { return };
        // SAFETY: allocated by `Cuda::alloc_host`; the owner's copies are done.
        let _ = unsafe { sys::cuMemFreeHost(self.ptr.cast()) };
    }
}

/// A stream from [`Cuda::stream`]; destroyed on drop.
pub struct Stream {
    ctx: Arc<Ctx>,
    raw: sys::CUstream,
}

// SAFETY: a driver handle, usable from any thread.
unsafe impl Send for Stream {}

impl Stream {
    /// The raw `CUstream`, as the copy calls take it.
    pub fn raw(&self) -> usize {
        self.raw as usize
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let Ok(_e) = self.ctx.enter() else { return };
        // SAFETY: created by `Cuda::stream`; destroying waits for nothing but
        // releases the handle once its work completes.
        let _ = unsafe { sys::cuStreamDestroy_v2(self.raw) };
    }
}
