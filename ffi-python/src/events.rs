//! The region's block events published to KV-aware routers from a thread of
//! this process (`Node.publish_events`).

use std::sync::{Mutex, Weak};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use cxlkv_platform::publish::{Publisher, PublisherOptions, PublisherStats};
use cxlkv_platform::Code as R;

use crate::{raise, OrRaise};

/// A running event publisher: vLLM `KVEventBatch`es of the whole region's
/// stores and removals on a ZMQ PUB socket (and vLLM's replay socket). Stop
/// it (or leave its `with` block) to close the sockets.
#[pyclass(frozen, module = "cxlkv._cxlkv")]
pub struct EventPublisher {
    publisher: Mutex<Option<Publisher>>,
    endpoint: String,
    replay: Option<String>,
    last: Mutex<PublisherStats>,
}

impl EventPublisher {
    pub(crate) fn new(p: Publisher) -> EventPublisher {
        EventPublisher {
            endpoint: p.endpoint().to_string(),
            replay: p.replay_endpoint().map(str::to_string),
            publisher: Mutex::new(Some(p)),
            last: Mutex::new(PublisherStats::default()),
        }
    }
}

/// The options of `Node.publish_events`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn options(
    py: Python<'_>,
    endpoint: String,
    replay: Option<String>,
    topic: String,
    medium: String,
    hash: &str,
    namespaces: Vec<u32>,
    dp_rank: Option<i64>,
    buffer: usize,
) -> PyResult<PublisherOptions> {
    let hash = match hash {
        "int" => cxlkv_platform::publish::HashForm::Int,
        "int64" => cxlkv_platform::publish::HashForm::Int64,
        "bytes" => cxlkv_platform::publish::HashForm::Bytes,
        _ => return Err(raise(py, R::InvalidArgument, "hash is 'int' (vLLM), 'int64' (SGLang) or 'bytes'")),
    };
    if buffer == 0 {
        return Err(raise(py, R::InvalidArgument, "buffer keeps at least one batch"));
    }
    Ok(PublisherOptions { endpoint, replay, topic, medium, hash, namespaces, dp_rank, buffer, ..Default::default() })
}

#[pymethods]
impl EventPublisher {
    /// The PUB endpoint bound (with the port taken when 0 was asked).
    #[getter]
    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The replay endpoint bound, or None.
    #[getter]
    fn replay_endpoint(&self) -> Option<&str> {
        self.replay.as_deref()
    }

    /// Counters: batches, events, feed_changes, feed_gaps, replays, snapshots,
    /// subscribers, dropped, and last_error (None when the last poll was
    /// clean).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = match self.publisher.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(p) => p.stats(),
            None => self.last.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        };
        let d = PyDict::new(py);
        for (k, v) in [
            ("batches", s.batches),
            ("events", s.events),
            ("feed_changes", s.feed_changes),
            ("feed_gaps", s.feed_gaps),
            ("replays", s.replays),
            ("snapshots", s.snapshots),
            ("subscribers", s.subscribers),
            ("dropped", s.dropped),
        ] {
            d.set_item(k, v)?;
        }
        d.set_item("last_error", s.last_error)?;
        Ok(d)
    }

    /// Stops publishing and closes the sockets. Stopping twice does nothing.
    fn stop(&self, py: Python<'_>) {
        let p = self.publisher.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = p {
            let s = py.detach(|| p.stop());
            *self.last.lock().unwrap_or_else(|e| e.into_inner()) = s;
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.stop(py);
        false
    }
}

/// A cursor over the region's change log (`Node.change_cursor`): each
/// `poll` returns the stores and removals made since the last one, by any
/// node, and keeps nothing per block. It does not keep its node attached:
/// once the node detached, a poll raises `StaleHandleError`.
#[pyclass(frozen, module = "cxlkv._cxlkv")]
pub struct ChangeCursor {
    node: Weak<cxlkv_platform::Node>,
    cursor: Mutex<cxlkv_platform::events::ChangeCursor>,
}

impl ChangeCursor {
    pub(crate) fn new(node: Weak<cxlkv_platform::Node>, cursor: cxlkv_platform::events::ChangeCursor) -> ChangeCursor {
        ChangeCursor { node, cursor: Mutex::new(cursor) }
    }
}

/// A change as `ChangeCursor.poll` returns it: `(stored, ns, key, len,
/// tokens, node)`, `stored` False for a removal, `node` the one that made
/// the change.
type ChangeTuple<'py> = (bool, u32, Bound<'py, pyo3::types::PyBytes>, u64, u32, u32);

#[pymethods]
impl ChangeCursor {
    /// The changes since the last poll of the namespaces `namespaces` (all
    /// when None), as `(stored, ns, key, len, tokens, node)` tuples in each
    /// stripe's order, and the stripes where changes were lost to a gap (the
    /// cursor fell a whole ring behind, or a recovery rebuilt the stripe):
    /// check what you know of those against the region.
    #[pyo3(signature = (namespaces=None))]
    fn poll<'py>(
        &self,
        py: Python<'py>,
        namespaces: Option<Vec<Bound<'py, PyAny>>>,
    ) -> PyResult<(Vec<ChangeTuple<'py>>, Vec<u32>)> {
        let c = self.node.upgrade().ok_or_else(|| raise(py, R::InvalidHandle, "the node is detached"))?;
        let ns = namespaces
            .unwrap_or_default()
            .iter()
            .map(|n| crate::ns_of(py, Some(&c), n, None))
            .collect::<PyResult<Vec<u32>>>()?;
        let (mut out, mut gaps) = (Vec::new(), Vec::new());
        // Locked with the interpreter released: a second poller waits
        // here, not while holding it.
        let cursor = &self.cursor;
        py.detach(|| {
            let mut cursor = cursor.lock().unwrap_or_else(|e| e.into_inner());
            cursor.poll(c.store(), &ns, &mut out, &mut gaps)
        })
        .or_raise(py)?;
        let changes =
            out.iter().map(|x| (x.stored, x.ns, crate::key_bytes(py, x.key), x.len, x.tokens, x.node)).collect();
        Ok((changes, gaps))
    }
}
