//! A node's registration of its region with one CUDA device, and what its
//! GPU path counted. Held by the node ([`Node`](crate::node::Node)), which
//! drops it before it unmaps; used by its [`CudaPath`](super::CudaPath).

use std::sync::Mutex;

use cxlkv_core::mem::View;

use crate::error::{Error, Result};

use super::driver::{Cuda, Registration};
use super::REGISTER_CHUNK;

/// What a node's GPU path queued.
#[derive(Default)]
pub(crate) struct CopyCounters {
    pub(crate) to_device: u64,
    pub(crate) to_region: u64,
    pub(crate) copies: u64,
    pub(crate) launches: u64,
}

/// A node's registration. Field order: unregistered before the device's
/// context is released.
pub(crate) struct GpuState {
    pub(crate) reg: Registration,
    pub(crate) cuda: Cuda,
    pub(crate) counters: Mutex<CopyCounters>,
}

impl GpuState {
    /// Registers the whole mapped region `region` (a node's) with device
    /// `device`.
    pub(crate) fn register(region: &View, device: u32) -> Result<GpuState> {
        let cuda = Cuda::open(device)?;
        let len = usize::try_from(region.len()).map_err(|_| Error::Core(cxlkv_core::Error::InvalidArgument))?;
        // SAFETY: the region's mapping is owned by the node, which drops this
        // state (unregistering) before it unmaps (`Node::shutdown`).
        let reg = unsafe { cuda.register(region.base(), len, REGISTER_CHUNK) }?;
        Ok(GpuState { reg, cuda, counters: Mutex::new(CopyCounters::default()) })
    }

    /// Unregisters the region, then releases the device (fields drop in
    /// declaration order).
    pub(crate) fn close(self) {}

    pub(crate) fn device(&self) -> u32 {
        self.cuda.ordinal()
    }
}
