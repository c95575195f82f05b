//! Builds without feature `cuda`: the same surface, and every call reports
//! `CudaUnavailable`. The handle types cannot exist.

use super::RegisteredRange;
use crate::error::{Error, Result};

const WHY: &str = "built without feature `cuda`";

#[derive(Clone, Copy, Debug)]
enum Never {}

/// True when a CUDA driver library can be loaded (never used in this build).
pub fn library_present() -> bool {
    false
}

/// One CUDA device (never, in this build).
#[derive(Clone, Debug)]
pub struct Cuda(Never);

impl Cuda {
    /// Always `CudaUnavailable` in this build.
    pub fn open(_ordinal: u32) -> Result<Cuda> {
        if super::disabled_by(std::env::var_os("CXLKV_CUDA").as_deref()) {
            return Err(Error::CudaUnavailable("disabled by CXLKV_CUDA=off"));
        }
        Err(Error::CudaUnavailable(WHY))
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        match self.0 {}
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        match self.0 {}
    }

    /// See the `cuda` build.
    ///
    /// # Safety
    /// None needed: no instance exists.
    pub unsafe fn register(&self, _base: *mut u8, _len: usize, _chunk: usize) -> Result<Registration> {
        match self.0 {}
    }

    /// See the `cuda` build.
    ///
    /// # Safety
    /// None needed: no instance exists.
    pub unsafe fn copy_to_device(&self, _dst: u64, _src: *const u8, _len: usize, _stream: usize) -> Result<()> {
        match self.0 {}
    }

    /// See the `cuda` build.
    ///
    /// # Safety
    /// None needed: no instance exists.
    pub unsafe fn copy_to_host(&self, _dst: *mut u8, _src: u64, _len: usize, _stream: usize) -> Result<()> {
        match self.0 {}
    }

    /// See the `cuda` build.
    ///
    /// # Safety
    /// None needed: no instance exists.
    pub unsafe fn launch_copy(&self, _segs: &[[u64; 3]], _stream: usize) -> Result<()> {
        match self.0 {}
    }

    /// See the `cuda` build.
    pub fn synchronize(&self, _stream: usize) -> Result<()> {
        match self.0 {}
    }
}

/// Registered host ranges (never, in this build).
pub struct Registration(Never);

impl Registration {
    /// The registered chunks.
    pub fn ranges(&self) -> &[RegisteredRange] {
        match self.0 {}
    }

    /// Seconds the registration took.
    pub fn seconds(&self) -> f64 {
        match self.0 {}
    }
}
