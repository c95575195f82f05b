//! The GPU path: the region registered with the CUDA driver, and KV payloads
//! moved by DMA between region blocks and device memory on the caller's
//! stream (TraCT §4.4, Beluga §6.1).
//!
//! Built with feature `cuda`, `libcuda` is loaded at run time; without the
//! feature, without a driver, or with `CXLKV_CUDA=off`, every call returns
//! [`Error::CudaUnavailable`](crate::error::Error::CudaUnavailable).
//!
//! Visibility rules (DESIGN.md, coherence rule 4 and "Tiers"):
//! - a block written by DMA is published only after the copy completed:
//!   [`CudaPath::publish_after`] waits for the stream, then publishes;
//! - before a DMA reads region bytes, this host's copies of those lines are
//!   invalidated, so nothing stale or dirty stands between memory and the
//!   device;
//! - a DMA into the region needs no cache maintenance before it: device
//!   writes are snooped by this host's caches (PCIe DMA is coherent with the
//!   host's own CPUs), and no other host holds dirty lines of a reserved
//!   block (every writer flushes before it publishes or frees).
//!
//! Ownership: an acquired block must stay pinned, and a reserved one
//! unpublished, until every copy touching it has completed; the region must
//! stay registered (the `Node` open) until then too.

#[cfg(feature = "cuda")]
mod driver;
#[cfg(not(feature = "cuda"))]
#[path = "off.rs"]
mod driver;

pub use driver::{library_present, Cuda, Registration};
pub(crate) mod state;
#[cfg(feature = "cuda")]
pub use driver::{DeviceBuffer, HostBuffer, Stream};

use cxlkv_core::coherence::{Coherence, Site};
use cxlkv_core::index::Handle;

use crate::error::{Error, Result};
use crate::node::Node;
use state::GpuState;

/// True when the value of `CXLKV_CUDA` turns the GPU path off.
pub(crate) fn disabled_by(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| v.eq_ignore_ascii_case("off") || v == "0")
}

/// Segments one kernel launch carries (its parameter block is 3 KiB).
pub const MAX_SEGMENTS_PER_LAUNCH: usize = 128;

/// Registration chunk: the driver pins and maps the region this much at a time.
pub const REGISTER_CHUNK: usize = 1 << 30;

/// One piece to move: `len` bytes at region offset `region_off` (inside the
/// payload area) and at device address `device_ptr`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Segment {
    /// Region offset.
    pub region_off: u64,
    /// Device address (from the engine's allocator, or `DeviceBuffer::ptr`).
    pub device_ptr: u64,
    /// Bytes.
    pub len: u64,
}

/// One registered chunk of the region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegisteredRange {
    /// Region offset of the chunk.
    pub region_off: u64,
    /// Bytes.
    pub len: u64,
    /// Host address.
    pub host_ptr: u64,
    /// The device's address for the same bytes.
    pub device_ptr: u64,
}

/// What the GPU path of one attached node did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CudaStats {
    /// Device ordinal.
    pub device: u32,
    /// Device name.
    pub name: String,
    /// The registered chunks.
    pub ranges: Vec<RegisteredRange>,
    /// Bytes registered.
    pub registered_bytes: u64,
    /// Seconds the registration took.
    pub register_seconds: f64,
    /// Bytes queued from the region to devices.
    pub bytes_to_device: u64,
    /// Bytes queued from devices into the region.
    pub bytes_to_region: u64,
    /// Asynchronous copies queued.
    pub copies: u64,
    /// Kernel launches queued.
    pub launches: u64,
}

impl Node {
    /// Registers the whole region with CUDA device `device` (page-locked and
    /// mapped for the device, in 1 GiB chunks) and returns its GPU path.
    /// Registering again for the same device returns the same path; for
    /// another device, `InvalidArgument`. Unregistered when the node closes:
    /// every copy must have completed by then.
    ///
    /// `CudaUnavailable` without feature `cuda`, driver or device.
    pub fn register_cuda(&self, device: u32) -> Result<CudaPath<'_>> {
        let _g = self.gpu_init.lock().unwrap_or_else(|e| e.into_inner());
        if self.gpu.get().is_none() {
            let st = GpuState::register(&self.store().view, device)?;
            let _ = self.gpu.set(st);
        }
        match self.gpu.get() {
            Some(st) if st.device() == device => Ok(CudaPath::new(self, st)),
            Some(_) => Err(Error::Core(cxlkv_core::Error::InvalidArgument)),
            None => Err(Error::CudaUnavailable("registration failed")),
        }
    }

    /// The GPU path, once [`Node::register_cuda`] succeeded.
    pub fn cuda(&self) -> Result<CudaPath<'_>> {
        match self.gpu.get() {
            Some(st) => Ok(CudaPath::new(self, st)),
            None => Err(Error::CudaUnavailable("the region is not registered with CUDA")),
        }
    }
}

/// The GPU path of an attached, registered node: see [`Node::register_cuda`].
///
/// Streams are raw `CUstream` handles of the device's primary context (what
/// `torch.cuda.current_stream().cuda_stream` or `cudaStreamCreate` give),
/// 0 for the legacy default stream. Every copy is asynchronous; thread-safe.
pub struct CudaPath<'a> {
    attached: &'a Node,
    st: &'a GpuState,
}

/// Which way a DMA moves bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    ToDevice,
    ToRegion,
}

impl<'a> CudaPath<'a> {
    pub(crate) fn new(attached: &'a Node, st: &'a GpuState) -> Self {
        CudaPath { attached, st }
    }

    /// The device this path copies to and from.
    pub fn cuda(&self) -> &Cuda {
        &self.st.cuda
    }

    /// Every segment inside the payload area with a plausible device range;
    /// nothing is queued when one is not.
    fn check(&self, segs: &[Segment]) -> Result<()> {
        let pay = self.attached.store().layout.payload;
        for s in segs {
            let end = s.region_off.checked_add(s.len).ok_or(Error::Core(cxlkv_core::Error::InvalidArgument))?;
            if s.region_off < pay.start || end > pay.end {
                return Err(Error::Core(cxlkv_core::Error::OutOfBounds));
            }
            if s.len > 0 && (s.device_ptr == 0 || s.device_ptr.checked_add(s.len).is_none()) {
                return Err(Error::Core(cxlkv_core::Error::InvalidArgument));
            }
        }
        Ok(())
    }

    /// Before a DMA reads region bytes: invalidates this host's copies of
    /// their lines. A DMA read may be served from this host's cache, and on
    /// memory another host wrote, a line cached here may be stale.
    fn clean(&self, segs: &[Segment], dir: Dir) -> Result<()> {
        if dir == Dir::ToRegion {
            return Ok(());
        }
        let st = self.attached.store();
        for s in segs.iter().filter(|s| s.len > 0) {
            // SYNC: fresh payload lines for the device (writer: the
            // publisher's payload flush, or its completed DMA).
            st.co.invalidate(&st.view, s.region_off, s.len, Site("gpu.read.invalidate"))?;
        }
        Ok(())
    }

    /// Splits `off..off+len` at registration chunk boundaries: calls
    /// `f(host address, device address of the region bytes, bytes before
    /// this piece, piece length)`.
    fn pieces(&self, off: u64, len: u64, mut f: impl FnMut(u64, u64, u64, u64) -> Result<()>) -> Result<()> {
        let ranges = self.st.reg.ranges();
        let chunk = ranges.first().map_or(1, |r| r.len.max(1));
        let mut done = 0;
        while done < len {
            let at = off + done;
            let r = ranges.get((at / chunk) as usize).ok_or(Error::Core(cxlkv_core::Error::OutOfBounds))?;
            let within = at - r.region_off;
            let n = (r.len - within).min(len - done);
            f(r.host_ptr + within, r.device_ptr + within, done, n)?;
            done += n;
        }
        Ok(())
    }

    fn count(&self, dir: Dir, segs: &[Segment], copies: u64, launches: u64) {
        let bytes: u64 = segs.iter().map(|s| s.len).sum();
        if let Ok(mut c) = self.st.counters.lock() {
            match dir {
                Dir::ToDevice => c.to_device += bytes,
                Dir::ToRegion => c.to_region += bytes,
            }
            c.copies += copies;
            c.launches += launches;
        }
    }

    fn dma(&self, segs: &[Segment], stream: usize, dir: Dir) -> Result<()> {
        self.check(segs)?;
        self.clean(segs, dir)?;
        let mut copies = 0;
        for s in segs {
            self.pieces(s.region_off, s.len, |host, _dev, done, n| {
                copies += 1;
                let dev = s.device_ptr + done;
                match dir {
                    // Registered region memory stays mapped while the node is
                    // open, and copies complete before close (this type's
                    // contract with the caller); the device range is the caller's.
                    // SAFETY: `host..host+n` is registered, mapped region memory.
                    Dir::ToDevice => unsafe { self.st.cuda.copy_to_device(dev, host as *const u8, n as usize, stream) },
                    // SAFETY: as above; the bytes lie in the payload area
                    // (checked), so no metadata is overwritten.
                    Dir::ToRegion => unsafe { self.st.cuda.copy_to_host(host as *mut u8, dev, n as usize, stream) },
                }
            })?;
        }
        self.count(dir, segs, copies, 0);
        Ok(())
    }

    fn kernel(&self, segs: &[Segment], stream: usize, dir: Dir) -> Result<()> {
        self.check(segs)?;
        self.clean(segs, dir)?;
        let mut triples = Vec::with_capacity(segs.len());
        for s in segs.iter().filter(|s| s.len > 0) {
            self.pieces(s.region_off, s.len, |_host, region_dev, done, n| {
                let dev = s.device_ptr + done;
                triples.push(match dir {
                    Dir::ToDevice => [region_dev, dev, n],
                    Dir::ToRegion => [dev, region_dev, n],
                });
                Ok(())
            })?;
        }
        // SAFETY: region addresses are the device's view of registered memory
        // (kept while the node is open), destinations in the payload area
        // (checked) or the caller's device memory.
        unsafe { self.st.cuda.launch_copy(&triples, stream) }?;
        self.count(dir, segs, 0, triples.len().div_ceil(MAX_SEGMENTS_PER_LAUNCH) as u64);
        Ok(())
    }

    /// Queues one DMA copy per segment from the region to device memory.
    /// The blocks must be pinned (acquired) until the stream has completed.
    pub fn to_device(&self, segs: &[Segment], stream: usize) -> Result<()> {
        self.dma(segs, stream, Dir::ToDevice)
    }

    /// Queues one DMA copy per segment from device memory into the region
    /// (into reserved blocks); publish them with [`CudaPath::publish_after`].
    pub fn from_device(&self, segs: &[Segment], stream: usize) -> Result<()> {
        self.dma(segs, stream, Dir::ToRegion)
    }

    /// Gathers many region pieces into device memory with one kernel launch
    /// per 128 segments (a paged KV layout: 64–128 pieces per block and layer).
    /// Fastest when addresses and lengths are 16-byte aligned.
    pub fn gather(&self, segs: &[Segment], stream: usize) -> Result<()> {
        self.kernel(segs, stream, Dir::ToDevice)
    }

    /// Scatters device pieces into the region with one kernel launch per 128
    /// segments. Destinations must not overlap.
    pub fn scatter(&self, segs: &[Segment], stream: usize) -> Result<()> {
        self.kernel(segs, stream, Dir::ToRegion)
    }

    /// Copies a whole pinned block to device address `dst`.
    pub fn block_to_device(&self, h: &Handle, dst: u64, stream: usize) -> Result<()> {
        self.to_device(&[Segment { region_off: h.off, device_ptr: dst, len: h.len }], stream)
    }

    /// Fills a whole reserved block from device address `src`.
    pub fn block_from_device(&self, h: &Handle, src: u64, stream: usize) -> Result<()> {
        self.from_device(&[Segment { region_off: h.off, device_ptr: src, len: h.len }], stream)
    }

    /// Waits until everything queued on `stream` has completed.
    pub fn synchronize(&self, stream: usize) -> Result<()> {
        self.st.cuda.synchronize(stream)
    }

    /// Waits for `stream`, then publishes the reserved blocks `hs` that DMA
    /// filled (a block turns READY only after its bytes are in memory).
    /// `out[i]` is the result for `hs[i]`.
    pub fn publish_after(&self, stream: usize, hs: &[Handle], out: &mut [cxlkv_core::Result<()>]) -> Result<()> {
        self.synchronize(stream)?;
        // SYNC: the completed stream put the payload in memory; publishing
        // fences before the entry turns READY (see `publish_flushed`).
        Ok(self.attached.core().publish_flushed(hs, out)?)
    }

    /// What this node's GPU path registered and moved.
    pub fn stats(&self) -> CudaStats {
        let c = self.st.counters.lock().map(|c| (c.to_device, c.to_region, c.copies, c.launches)).unwrap_or_default();
        let ranges = self.st.reg.ranges().to_vec();
        CudaStats {
            device: self.st.cuda.ordinal(),
            name: self.st.cuda.name().to_string(),
            registered_bytes: ranges.iter().map(|r| r.len).sum(),
            ranges,
            register_seconds: self.st.reg.seconds(),
            bytes_to_device: c.0,
            bytes_to_region: c.1,
            copies: c.2,
            launches: c.3,
        }
    }
}

#[cfg(test)]
mod tests;
