//! The shared-memory library from Python (as C's `cxlkv_alloc`,
//! `cxlkv_root_*`, `cxlkv_lock_*`, `cxlkv_flush`): raw allocations in the
//! region's payload area, named roots that find them again from any
//! process, application locks, and copies in and out that publish and read
//! fresh. `Node`'s methods call these.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use cxlkv_platform::host::tid;
use cxlkv_platform::kv::{Root, MAX_ROOT_NAME};
use cxlkv_platform::Code as R;
use cxlkv_platform::Node as Attached;

use crate::{raise, OrRaise};

/// A root name: 1 to 32 bytes of UTF-8 without NUL.
pub(crate) fn root_name(py: Python<'_>, name: &str) -> PyResult<Vec<u8>> {
    if name.is_empty() || name.len() > MAX_ROOT_NAME || name.contains('\0') {
        return Err(raise(py, R::InvalidArgument, "a root name is 1 to 32 bytes without NUL"));
    }
    Ok(name.as_bytes().to_vec())
}

/// A root as `(offset, size, tag)`.
pub(crate) fn root_tuple(r: Root) -> (u64, u64, u32) {
    (r.offset, r.size, r.tag)
}

/// `length` bytes of the payload area at `offset`, read fresh.
pub(crate) fn read<'py>(py: Python<'py>, c: &Attached, offset: u64, length: usize) -> PyResult<Bound<'py, PyBytes>> {
    let mut buf = vec![0u8; length];
    py.detach(|| c.read_range(offset, &mut buf)).or_raise(py)?;
    Ok(PyBytes::new(py, &buf))
}

/// An application lock held by this thread (`Node.lock`): release it, or
/// use it as a context manager. Taken with the node's lock timeout; held
/// until released (by the thread that took it) or the node dies.
#[pyclass(frozen, module = "cxlkv._cxlkv")]
pub struct AppLock {
    /// The node, until released (a released lock does not keep it attached).
    node: Mutex<Option<Arc<Attached>>>,
    lock: u32,
    seq: u64,
    thread: u32,
}

impl AppLock {
    /// Takes application lock `lock` on `node` (waits up to the lock
    /// timeout).
    pub(crate) fn take(py: Python<'_>, node: Arc<Attached>, lock: u32) -> PyResult<AppLock> {
        let held = py.detach(|| node.core().lock_app(lock)).or_raise(py)?;
        Ok(AppLock { node: Mutex::new(Some(node)), lock, seq: held.seq, thread: tid() })
    }
}

#[pymethods]
impl AppLock {
    /// The lock's number.
    #[getter]
    fn number(&self) -> u32 {
        self.lock
    }

    /// True once released.
    #[getter]
    fn released(&self) -> bool {
        self.node.lock().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// Releases the lock (publish what it guards first: `write_range` does,
    /// `flush_range` after plain writes). Only the thread that took it may;
    /// a second release does nothing. `RevokedError` when the grant was
    /// over already (this node was declared dead meanwhile).
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        if tid() != self.thread {
            return Err(raise(py, R::InvalidArgument, "only the thread that took the lock releases it"));
        }
        let Some(node) = self.node.lock().unwrap_or_else(|e| e.into_inner()).take() else { return Ok(()) };
        let (lock, seq) = (self.lock, self.seq);
        py.detach(|| node.unlock_app(lock, seq)).or_raise(py)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.release(py)?;
        Ok(false)
    }
}
