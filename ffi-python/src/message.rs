//! Messages between nodes' inboxes, as Python sees them.

use cxlkv_platform::kv::Key;
use cxlkv_platform::kv::Message as Msg;
use cxlkv_platform::Code as R;
use cxlkv_platform::KIND_RESPONSE;
use pyo3::prelude::*;

use crate::{key_bytes, raise};

/// An inbox message (from `Node.recv`, `try_recv` or `call`).
#[pyclass(frozen, module = "cxlkv._cxlkv")]
pub struct Message {
    /// Application-defined kind; bit 31 marks a response to `call`.
    #[pyo3(get)]
    pub(crate) kind: u32,
    /// Namespace of the keys.
    #[pyo3(get)]
    pub(crate) ns: u32,
    /// Application-defined status (e.g. of a response).
    #[pyo3(get)]
    pub(crate) status: u32,
    /// Request id (set by `call`; a reply carries the request's).
    #[pyo3(get)]
    pub(crate) request_id: u64,
    /// Application-defined stamp (e.g. a send time).
    #[pyo3(get)]
    pub(crate) stamp: u64,
    /// The sender's node id.
    #[pyo3(get)]
    pub(crate) sender: u32,
    pub(crate) keys: Vec<Key>,
}

impl Message {
    pub(crate) fn of((m, keys): (Msg, Vec<Key>)) -> Message {
        Message {
            kind: m.kind,
            ns: m.ns,
            status: m.status,
            request_id: m.request_id,
            stamp: m.stamp,
            sender: m.from,
            keys,
        }
    }
}

#[pymethods]
impl Message {
    /// The keys the message carries (16 bytes each).
    #[getter]
    fn keys<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, pyo3::types::PyBytes>> {
        self.keys.iter().map(|k| key_bytes(py, *k)).collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "Message(kind={:#x}, ns={}, status={}, request_id={}, stamp={}, sender={}, keys={})",
            self.kind,
            self.ns,
            self.status,
            self.request_id,
            self.stamp,
            self.sender,
            self.keys.len()
        )
    }
}

/// A message to send: `kind` below 2**31 (the top bit marks responses).
pub(crate) fn outgoing(py: Python<'_>, kind: u32, ns: u32, status: u32, stamp: u64, n_keys: usize) -> PyResult<Msg> {
    if kind & KIND_RESPONSE != 0 {
        return Err(raise(py, R::InvalidArgument, "kind must be below 2**31 (the top bit marks responses)"));
    }
    Ok(Msg { kind, ns, status, stamp, n_keys: n_keys as u32, ..Msg::default() })
}
