//! Platform errors: core's protocol errors plus the OS's.

use core::fmt;

/// Anything the platform layer can fail with.
#[derive(Debug)]
pub enum Error {
    /// A protocol error from core.
    Core(cxlkv_core::Error),
    /// An OS call failed.
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        err: std::io::Error,
    },
    /// The requested feature is not available on this machine or build.
    Unsupported(&'static str),
    /// CUDA cannot be used here: the build lacks feature `cuda`, no driver
    /// library or device was found, `CXLKV_CUDA=off` is set, or the region
    /// is not registered. Never a panic: every GPU call reports this.
    CudaUnavailable(&'static str),
    /// A CUDA driver call failed.
    Cuda {
        /// The driver entry point.
        call: &'static str,
        /// Its `CUresult` code.
        code: u32,
        /// The driver's name for the code.
        name: &'static str,
    },
}

/// Result type of the platform layer.
pub type Result<T> = core::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(what: &'static str) -> Error {
        Error::Io { what, err: std::io::Error::last_os_error() }
    }

    /// The core error, if this is one.
    pub fn core(&self) -> Option<cxlkv_core::Error> {
        match self {
            Error::Core(e) => Some(*e),
            _ => None,
        }
    }
}

impl From<cxlkv_core::Error> for Error {
    fn from(e: cxlkv_core::Error) -> Self {
        Error::Core(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Core(e) => write!(f, "{e}"),
            Error::Io { what, err } => write!(f, "{what}: {err}"),
            Error::Unsupported(w) => write!(f, "unsupported: {w}"),
            Error::CudaUnavailable(w) => write!(f, "CUDA unavailable: {w}"),
            Error::Cuda { call, code, name } => write!(f, "{call} failed: {name} ({code})"),
        }
    }
}

impl std::error::Error for Error {}
