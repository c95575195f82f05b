//! `cxlkv._cxlkv`: the native module of the `cxlkv` Python package, a thin
//! door over core and platform.
//!
//! - [`region`]: regions and nodes;
//! - [`blocks`]: pinned and reserved blocks as buffer-protocol payloads;
//! - errors, keys and the hash helpers live here.
//!
//! Every call that can wait (locks, polls, recovery, copies) releases the
//! GIL. Errors are raised as one exception class per family, each carrying
//! the C API's result code in `.code`.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt};

use cxlkv_platform::kv::{chain_keys as core_chain_keys, Key, Namespace};
use cxlkv_platform::{Code as R, Family};

mod blocks;
mod events;
mod message;
mod node;
mod region;
mod shm;
mod tenants;
mod tier;

create_exception!(_cxlkv, CxlkvError, PyException, "Base of every cxlkv error; `.code` is the C result code.");
create_exception!(_cxlkv, InvalidArgumentError, CxlkvError, "An argument is out of range or malformed.");
create_exception!(_cxlkv, RegionError, CxlkvError, "The region is not formatted, not cxlkv's, or corrupt.");
create_exception!(_cxlkv, CapacityError, CxlkvError, "A table, the payload space or a size limit is exhausted.");
create_exception!(_cxlkv, ExistsError, CxlkvError, "The key (or name) is stored already.");
create_exception!(_cxlkv, NotFoundError, CxlkvError, "The key (or name) is not stored.");
create_exception!(_cxlkv, StaleHandleError, CxlkvError, "A block or handle no longer refers to what it was made for.");
create_exception!(_cxlkv, BusyError, CxlkvError, "In use: a live node holds the slot, or recovery is due.");
create_exception!(_cxlkv, TimedOutError, CxlkvError, "A wait (for a lock) ran past its deadline.");
create_exception!(_cxlkv, RevokedError, CxlkvError, "This node was declared dead; its locks were revoked.");
create_exception!(_cxlkv, PlatformError, CxlkvError, "An OS call failed, or the feature is unsupported here.");
create_exception!(_cxlkv, CudaError, CxlkvError, "CUDA is unavailable, or a driver call failed.");

/// The exception of a result code, with `.code` set.
pub(crate) fn raise(py: Python<'_>, code: R, detail: &str) -> PyErr {
    let msg = if detail.is_empty() { code.message().to_string() } else { detail.to_string() };
    let err = match code.family() {
        Family::InvalidArgument => InvalidArgumentError::new_err(msg),
        Family::Region => RegionError::new_err(msg),
        Family::Capacity => CapacityError::new_err(msg),
        Family::Exists => ExistsError::new_err(msg),
        Family::NotFound => NotFoundError::new_err(msg),
        Family::StaleHandle => StaleHandleError::new_err(msg),
        Family::Busy => BusyError::new_err(msg),
        Family::TimedOut => TimedOutError::new_err(msg),
        Family::Revoked => RevokedError::new_err(msg),
        Family::Platform => PlatformError::new_err(msg),
        Family::Cuda => CudaError::new_err(msg),
        Family::Ok | Family::Internal => CxlkvError::new_err(msg),
    };
    let _ = err.value(py).setattr("code", code as u32);
    err
}

/// Converts a platform error to its exception. An operating-system error
/// with an errno is Python's own `OSError` for it (`FileNotFoundError`,
/// `PermissionError`, ... as `open()` raises), `.code` set to `IO`.
pub(crate) fn err(py: Python<'_>, e: cxlkv_platform::Error) -> PyErr {
    if let cxlkv_platform::Error::Io { what, err } = &e {
        if let Some(errno) = err.raw_os_error() {
            let text = std::io::Error::from_raw_os_error(errno).kind().to_string();
            let pe = pyo3::exceptions::PyOSError::new_err((errno, format!("{what}: {text}")));
            let _ = pe.value(py).setattr("code", R::Io as u32);
            return pe;
        }
    }
    raise(py, R::of(&e), &e.to_string())
}

/// Converts a core error to its exception.
pub(crate) fn core_err(py: Python<'_>, e: cxlkv_platform::kv::CoreError) -> PyErr {
    err(py, e.into())
}

/// Extension to turn results into `PyResult` inside a call.
pub(crate) trait OrRaise<T> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> OrRaise<T> for cxlkv_platform::Result<T> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| err(py, e))
    }
}

impl<T> OrRaise<T> for cxlkv_platform::kv::CoreResult<T> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| core_err(py, e))
    }
}

/// A key from Python: 16 bytes (little-endian low half first) or an int in
/// `0 .. 2**128`.
pub(crate) fn key_of(obj: &Bound<'_, PyAny>) -> PyResult<Key> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        let arr: [u8; 16] = b
            .as_bytes()
            .try_into()
            .map_err(|_| raise(obj.py(), R::InvalidArgument, "a key is 16 bytes or an int below 2**128"))?;
        return Ok(Key::from_bytes(arr));
    }
    if obj.is_instance_of::<PyInt>() {
        let v: u128 = obj
            .extract()
            .map_err(|_| raise(obj.py(), R::InvalidArgument, "a key is 16 bytes or an int below 2**128"))?;
        return Ok(Key::from_u128(v));
    }
    Err(raise(obj.py(), R::InvalidArgument, "a key is 16 bytes or an int below 2**128"))
}

/// Keys of a sequence.
pub(crate) fn keys_of(keys: &Bound<'_, PyAny>) -> PyResult<Vec<Key>> {
    keys.try_iter()?.map(|k| key_of(&k?)).collect()
}

/// A key as 16 bytes.
pub(crate) fn key_bytes<'py>(py: Python<'py>, k: Key) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &k.to_bytes())
}

/// A namespace id from an int (an id as is) or a `cxlkv.Namespace` (or any
/// object with a 16-byte `digest`, and a `tenant` name or None), registered
/// through `node` on first use in its tenant (`tenant`, when given, in
/// place of the object's; `node` may be None only for an int).
pub(crate) fn ns_of(
    py: Python<'_>,
    node: Option<&cxlkv_platform::Node>,
    ns: &Bound<'_, PyAny>,
    tenant: Option<&str>,
) -> PyResult<u32> {
    const WHAT: &str = "a namespace is an id below 2**32 or a cxlkv.Namespace";
    if ns.is_instance_of::<PyInt>() && tenant.is_none() {
        return ns.extract::<u32>().map_err(|_| raise(py, R::InvalidArgument, WHAT));
    }
    let d = ns.getattr("digest").map_err(|_| raise(py, R::InvalidArgument, WHAT))?;
    let d: [u8; 16] = d
        .cast::<PyBytes>()
        .ok()
        .and_then(|b| b.as_bytes().try_into().ok())
        .ok_or_else(|| raise(py, R::InvalidArgument, "a namespace's digest is 16 bytes"))?;
    let node = node.ok_or_else(|| raise(py, R::InvalidArgument, WHAT))?;
    let own = match ns.getattr("tenant") {
        Ok(t) if !t.is_none() => {
            Some(t.extract::<String>().map_err(|_| raise(py, R::InvalidArgument, "a namespace's tenant is a name"))?)
        }
        _ => None,
    };
    match tenant.or(own.as_deref()) {
        Some(name) => {
            let t = crate::tenants::find(py, node, name)?;
            py.detach(|| node.core().namespace_in(t, d)).map_err(cxlkv_platform::Error::from).or_raise(py)
        }
        None => py.detach(|| node.namespace_of_digest(d)).or_raise(py),
    }
}

/// Chained 128-bit block keys of `tokens`: key `i` covers tokens
/// `0 .. (i+1)*block_tokens`, derived from key `i-1` (or `parent`). A
/// partial last block gets no key. Equal prefixes give equal chains, in
/// every process and language.
#[pyfunction]
#[pyo3(signature = (tokens, block_tokens, parent=None))]
fn chain_keys<'py>(
    py: Python<'py>,
    tokens: Vec<u32>,
    block_tokens: usize,
    parent: Option<&Bound<'py, PyAny>>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    if block_tokens == 0 {
        return Err(raise(py, R::InvalidArgument, "block_tokens must be positive"));
    }
    let p = parent.map(key_of).transpose()?.unwrap_or_default();
    let mut out = vec![Key::default(); tokens.len() / block_tokens];
    let n = py.detach(|| core_chain_keys(p, &tokens, block_tokens, &mut out));
    Ok(out[..n].iter().map(|k| key_bytes(py, *k)).collect())
}

/// The 128-bit identity of a namespace: XXH3-128 of every field in a fixed
/// encoding (see `Namespace`), as 16 bytes. `Node.namespace` registers it
/// in a region for the id every call takes.
#[pyfunction]
#[pyo3(signature = (model, kv_layout=0, dtype=0, tp_rank=0, tp_size=0, pp_rank=0, block_tokens=0, extra=0, salt=None))]
#[allow(clippy::too_many_arguments)]
fn namespace_digest<'py>(
    py: Python<'py>,
    model: &Bound<'py, PyAny>,
    kv_layout: u32,
    dtype: u32,
    tp_rank: u32,
    tp_size: u32,
    pp_rank: u32,
    block_tokens: u32,
    extra: u64,
    salt: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let text_or_bytes = |v: &Bound<'py, PyAny>| -> PyResult<Vec<u8>> {
        if let Ok(s) = v.extract::<String>() {
            Ok(s.into_bytes())
        } else {
            v.extract().map_err(|_| raise(py, R::InvalidArgument, "model and salt are str or bytes"))
        }
    };
    let model = text_or_bytes(model)?;
    let salt = salt.map(text_or_bytes).transpose()?.unwrap_or_default();
    let ns = Namespace { model: &model, kv_layout, dtype, tp_rank, tp_size, pp_rank, block_tokens, extra, salt: &salt };
    Ok(PyBytes::new(py, &ns.digest()))
}

/// `cxlkv.Result`: an `IntEnum` of every result code, named as in C
/// without the prefix (`OK`, `EXISTS`, ...).
fn result_enum<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
    let members: Vec<(&str, u32)> = R::ALL.iter().map(|&r| (r.name(), r as u32)).collect();
    let e = py.import("enum")?.getattr("IntEnum")?.call1(("Result", members))?;
    e.setattr("__module__", "cxlkv._cxlkv")?;
    e.setattr("__doc__", "The result codes of cxlkv, as in the C API (OK is 1000).")?;
    Ok(e)
}

#[pymodule]
fn _cxlkv(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    let result = result_enum(py)?;
    m.add("Result", &result)?;
    let _ = blocks::RESULT_ENUM.set(py, result.unbind());
    m.add_function(wrap_pyfunction!(chain_keys, m)?)?;
    m.add_function(wrap_pyfunction!(namespace_digest, m)?)?;
    m.add_class::<region::Region>()?;
    m.add_class::<node::Node>()?;
    m.add_class::<message::Message>()?;
    m.add_class::<tier::Tier>()?;
    m.add_class::<events::EventPublisher>()?;
    m.add_class::<events::ChangeCursor>()?;
    m.add_class::<shm::AppLock>()?;
    m.add_class::<blocks::Pinned>()?;
    m.add_class::<blocks::Reservation>()?;
    m.add_class::<blocks::Payload>()?;
    m.add("CxlkvError", py.get_type::<CxlkvError>())?;
    m.add("InvalidArgumentError", py.get_type::<InvalidArgumentError>())?;
    m.add("RegionError", py.get_type::<RegionError>())?;
    m.add("CapacityError", py.get_type::<CapacityError>())?;
    m.add("ExistsError", py.get_type::<ExistsError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("StaleHandleError", py.get_type::<StaleHandleError>())?;
    m.add("BusyError", py.get_type::<BusyError>())?;
    m.add("TimedOutError", py.get_type::<TimedOutError>())?;
    m.add("RevokedError", py.get_type::<RevokedError>())?;
    m.add("PlatformError", py.get_type::<PlatformError>())?;
    m.add("CudaError", py.get_type::<CudaError>())?;
    Ok(())
}
