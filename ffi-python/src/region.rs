//! Regions: map, format, attach and close.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use cxlkv_platform::kv::Capacities;
use cxlkv_platform::Code as R;
use cxlkv_platform::{Options, Region as Mapped};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::node::{mode_of, Node};
use crate::{raise, OrRaise};

/// A mapped region: a file, /dev/shm, hugetlbfs, a device-DAX device, or an
/// anonymous memfd shared with children. Closing it leaves nodes attached
/// through it working; it is a context manager.
#[pyclass(frozen, module = "cxlkv._cxlkv")]
pub struct Region {
    map: Mutex<Option<Mapped>>,
}

impl Region {
    fn new(m: Mapped) -> Region {
        Region { map: Mutex::new(Some(m)) }
    }

    fn mapping(&self, py: Python<'_>) -> PyResult<Mapped> {
        let g = self.map.lock().unwrap_or_else(|e| e.into_inner());
        g.clone().ok_or_else(|| raise(py, R::InvalidHandle, "the region is closed"))
    }
}

#[pymethods]
impl Region {
    /// Creates a region file of `size` bytes at `path`, not yet formatted,
    /// with permission bits `mode` exactly (0o600 by default, its owner
    /// alone; 0o660 lets its group map it too; the owner must read and
    /// write). An existing file is refused unless `overwrite`, and one
    /// another user owns always is. A device-DAX path (/dev/daxX.Y) is
    /// opened instead. Every process that maps a region can read all of it.
    #[staticmethod]
    #[pyo3(signature = (path, size, overwrite=false, mode=0o600))]
    fn create(py: Python<'_>, path: PathBuf, size: u64, overwrite: bool, mode: u32) -> PyResult<Region> {
        let m = py.detach(|| Mapped::create_with_mode(&path, size, overwrite, mode)).or_raise(py)?;
        Ok(Region::new(m))
    }

    /// Maps the existing region at `path` (file, /dev/shm, hugetlbfs or
    /// /dev/daxX.Y).
    #[staticmethod]
    fn open(py: Python<'_>, path: PathBuf) -> PyResult<Region> {
        let m = py.detach(|| Mapped::open(&path)).or_raise(py)?;
        Ok(Region::new(m))
    }

    /// An anonymous shared region of `size` bytes (on 2 MiB huge pages when
    /// `hugetlb`), shared with processes forked afterwards.
    #[staticmethod]
    #[pyo3(signature = (size, hugetlb=false))]
    fn memfd(py: Python<'_>, size: u64, hugetlb: bool) -> PyResult<Region> {
        let m = py.detach(|| Mapped::memfd(size, hugetlb)).or_raise(py)?;
        Ok(Region::new(m))
    }

    /// Formats the region, erasing it. Capacities (keywords named as
    /// `Capacities::FIELDS` lists them: `max_nodes`, `n_stripes`, ...) left
    /// out keep their defaults; an unknown one is an `InvalidArgumentError`.
    /// `BusyError` while a node of this process is attached.
    #[pyo3(signature = (*, flush_mode="auto", **capacities))]
    fn format(&self, py: Python<'_>, flush_mode: &str, capacities: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
        let map = self.mapping(py)?;
        let mut caps = Capacities::default();
        for (k, v) in capacities.into_iter().flatten() {
            let name: String = k.extract()?;
            if Capacities::FIELDS.iter().all(|f| f.name != name) {
                return Err(raise(py, R::InvalidArgument, &format!("no capacity is called {name}")));
            }
            if v.is_none() {
                continue; // the default
            }
            let value: u32 = v
                .extract()
                .map_err(|_| raise(py, R::InvalidArgument, &format!("capacity {name} is an int below 2**32")))?;
            caps.set(&name, value);
        }
        if map.in_use() {
            return Err(raise(py, R::Busy, "a node of this process is attached to the region"));
        }
        let mode = mode_of(py, flush_mode)?;
        py.detach(|| map.format(caps, mode)).or_raise(py)?;
        Ok(())
    }

    /// The mapped size in bytes.
    #[getter]
    fn size(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.mapping(py)?.len())
    }

    /// True once closed.
    #[getter]
    fn closed(&self) -> bool {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// Attaches a node (starting its heartbeat and lock-manager thread).
    /// `node_id` None takes the first free slot.
    #[pyo3(signature = (*, node_id=None, flush_mode="auto", lease_ms=2000, lock_timeout_ms=60000,
        settle_ms=50, auto_recover=true, local_dir=None))]
    #[allow(clippy::too_many_arguments)]
    fn attach(
        &self,
        py: Python<'_>,
        node_id: Option<u32>,
        flush_mode: &str,
        lease_ms: u64,
        lock_timeout_ms: u64,
        settle_ms: u64,
        auto_recover: bool,
        local_dir: Option<PathBuf>,
    ) -> PyResult<Node> {
        let map = self.mapping(py)?;
        let mut o = Options {
            node: node_id,
            mode: mode_of(py, flush_mode)?,
            lease: Duration::from_millis(lease_ms),
            lock_timeout: Duration::from_millis(lock_timeout_ms),
            settle: Duration::from_millis(settle_ms),
            auto_recover,
            ..Options::default()
        };
        if let Some(d) = local_dir {
            o.local_dir = d;
        }
        let attached = py.detach(|| map.attach(o)).or_raise(py)?;
        Ok(Node { attached: RwLock::new(Some(Arc::new(attached))) })
    }

    /// Closes this handle (nodes attached through it keep the mapping).
    fn close(&self) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close();
        false
    }
}
