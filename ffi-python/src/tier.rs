//! The SSD tier of a host, started from Python (`Node.start_tier`).

use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use cxlkv_platform::Code as R;
use cxlkv_platform::Tier as Running;

use crate::{raise, OrRaise};

/// A running SSD tier: copies cold blocks to slot files on its drives and
/// puts them back when a node asks. Stop it (or leave its `with` block)
/// before detaching its node.
#[pyclass(frozen, module = "cxlkv._cxlkv")]
pub struct Tier {
    tier: Mutex<Option<Running>>,
}

impl Tier {
    pub(crate) fn new(t: Running) -> Tier {
        Tier { tier: Mutex::new(Some(t)) }
    }

    fn with<T>(&self, py: Python<'_>, f: impl FnOnce(&Running) -> PyResult<T>) -> PyResult<T> {
        let g = self.tier.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            Some(t) => f(t),
            None => Err(raise(py, R::InvalidHandle, "the tier is stopped")),
        }
    }
}

/// The options of `Node.start_tier`: the table's (`TierOptions::FIELDS`)
/// by name; None keeps a default.
pub(crate) fn options(
    py: Python<'_>,
    dirs: Vec<PathBuf>,
    given: Option<&Bound<'_, PyDict>>,
) -> PyResult<cxlkv_platform::TierOptions> {
    let mut opts = cxlkv_platform::TierOptions { dirs, ..Default::default() };
    for (k, v) in given.into_iter().flatten() {
        let name: String = k.extract()?;
        if cxlkv_platform::TierOptions::FIELDS.iter().all(|f| f.name != name) {
            return Err(raise(py, R::InvalidArgument, &format!("no tier option is called {name}")));
        }
        if v.is_none() {
            continue; // the default
        }
        let value: f64 =
            v.extract().map_err(|_| raise(py, R::InvalidArgument, &format!("tier option {name} is a number")))?;
        opts.set(&name, value)
            .map_err(|_| raise(py, R::InvalidArgument, &format!("tier option {name} cannot be {value}")))?;
    }
    Ok(opts)
}

#[pymethods]
impl Tier {
    /// Counters: spills, promotions, misses, errors, held, bytes_written,
    /// bytes_read, direct_reads, registered_bytes, memory_dirs; the I/O
    /// engine's name; io_priority and cpu_priority (whether the tier thread
    /// got its raised I/O and CPU priority).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.with(py, |t| Ok(t.stats()))?;
        let d = PyDict::new(py);
        for (k, v) in s.counters() {
            d.set_item(k, v)?;
        }
        d.set_item("engine", s.engine.map(|e| format!("{e:?}")))?;
        d.set_item("io_priority", s.io_priority)?;
        d.set_item("cpu_priority", s.cpu_priority)?;
        Ok(d)
    }

    /// Copies every block of the region the tier does not hold yet (up to
    /// its capacity); returns how many.
    fn spill_all(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |t| py.detach(|| t.spill_all()).or_raise(py))
    }

    /// Stops the tier (its directory is let go: its blocks stop being
    /// offered to the rack). Stopping twice does nothing.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let t = self.tier.lock().unwrap_or_else(|e| e.into_inner()).take();
        match t {
            Some(t) => py.detach(|| t.stop()).or_raise(py),
            None => Ok(()),
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.stop(py)?;
        Ok(false)
    }
}
