//! Pinned and reserved blocks, exposed through the buffer protocol without a
//! copy, and the buffers `put` and `get` copy from and into.
//!
//! A block's memoryview is made from a [`Payload`], which counts the buffers
//! it exports. Releasing a `Pinned` (or publishing or aborting a
//! `Reservation`) first releases the memoryviews it handed out, then refuses
//! with `BufferError` while any other export lives (a slice, a numpy array):
//! the pin is dropped only once no view can read the block, and every
//! released view raises on use.

use core::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyMemoryView, PyTuple};

use cxlkv_platform::kv::Handle;
use cxlkv_platform::Code as R;
use cxlkv_platform::{Blocks, Finish, Kind, Node as Attached};

use crate::{key_bytes, raise, OrRaise};

/// `cxlkv.Result`, the enum of result codes (made when the module loads).
pub(crate) static RESULT_ENUM: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// A per-item result as a `cxlkv.Result` member.
pub(crate) fn result<'py>(py: Python<'py>, r: &cxlkv_platform::kv::CoreResult<()>) -> PyResult<Bound<'py, PyAny>> {
    let code = match r {
        Ok(()) => R::Ok,
        Err(e) => R::from(*e),
    };
    match RESULT_ENUM.get(py) {
        Some(e) => e.bind(py).call1((code as u32,)),
        None => Ok(pyo3::types::PyInt::new(py, code as u32).into_any()),
    }
}

struct ExportState {
    exports: usize,
    closed: bool,
}

/// The bytes of one block, exported through the buffer protocol (read-only
/// for a pinned block, writable for a reserved one) while its pin or
/// reservation is held.
#[pyclass(frozen, module = "cxlkv._cxlkv")]
pub struct Payload {
    /// Keeps the blocks held (and the region mapped) while this lives.
    _shared: Arc<Blocks>,
    ptr: usize,
    len: usize,
    readonly: bool,
    state: Mutex<ExportState>,
}

#[pymethods]
impl Payload {
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let me = slf.get();
        let mut st = me.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.closed {
            return Err(PyBufferError::new_err("the block was released"));
        }
        if view.is_null() {
            return Err(PyBufferError::new_err("NULL view"));
        }
        // The payload stays mapped and held until this export is released:
        // closing the batch waits for exports to reach zero, and `_shared`
        // keeps the blocks. FillInfo takes a new reference for `view.obj`.
        // SAFETY: `view` is non-NULL and the interpreter's to fill;
        // `ptr..ptr+len` is the block's payload in the live mapping.
        let r = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                me.ptr as *mut c_void,
                me.len as ffi::Py_ssize_t,
                c_int::from(me.readonly),
                flags,
            )
        };
        if r != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        st.exports += 1;
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.exports = st.exports.saturating_sub(1);
    }

    /// Payload length in bytes.
    fn __len__(&self) -> usize {
        self.len
    }
}

/// One block of a batch: its payload exporter and the memoryview handed out.
struct Item {
    payload: Py<Payload>,
    view: Py<PyMemoryView>,
}

/// The blocks of one acquire or reserve call.
struct Batch {
    shared: Arc<Blocks>,
    keys: Vec<cxlkv_platform::kv::Key>,
    items: Vec<Option<Item>>,
}

impl Batch {
    fn new(py: Python<'_>, attached: Arc<Attached>, kind: Kind, hs: Vec<Option<Handle>>) -> PyResult<Batch> {
        let keys = hs.iter().map(|h| h.map(|h| h.key).unwrap_or_default()).collect();
        let handles: Vec<Handle> = hs.iter().flatten().copied().collect();
        let node = attached.clone();
        let shared = Arc::new(Blocks::new(attached, kind, handles));
        let mut items = Vec::with_capacity(hs.len());
        for h in &hs {
            let Some(h) = h else {
                items.push(None);
                continue;
            };
            let ptr = node.payload_ptr(h.off, h.len).or_raise(py)? as usize;
            let payload = Py::new(
                py,
                Payload {
                    _shared: shared.clone(),
                    ptr,
                    len: h.len as usize,
                    readonly: kind == Kind::Pinned,
                    state: Mutex::new(ExportState { exports: 0, closed: false }),
                },
            )?;
            let view = PyMemoryView::from(payload.bind(py).as_any())?.unbind();
            items.push(Some(Item { payload, view }));
        }
        Ok(Batch { shared, keys, items })
    }

    /// Releases the views handed out, then closes every payload; refuses
    /// while another export of one lives.
    fn close_views(&self, py: Python<'_>) -> PyResult<()> {
        for it in self.items.iter().flatten() {
            it.view.bind(py).call_method0("release")?;
        }
        for it in self.items.iter().flatten() {
            let st = it.payload.get().state.lock().unwrap_or_else(|e| e.into_inner());
            if st.exports > 0 {
                return Err(PyBufferError::new_err(
                    "a view of a block is still alive (a slice, array or memoryview of it): delete it first",
                ));
            }
        }
        for it in self.items.iter().flatten() {
            it.payload.get().state.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        }
        Ok(())
    }

    fn open(&self) -> bool {
        self.shared.is_open()
    }

    fn finish(&self, py: Python<'_>, how: Finish) -> PyResult<Vec<cxlkv_platform::kv::CoreResult<()>>> {
        if !self.open() {
            return Err(raise(py, R::StaleHandle, "the blocks were released already"));
        }
        self.close_views(py)?;
        let mut out = vec![Ok(()); self.shared.handles().len()];
        let shared = &self.shared;
        py.detach(|| shared.finish(how, &mut out)).or_raise(py)?;
        Ok(out)
    }

    /// The handle of block `i` (an error for a key not found).
    fn handle(&self, py: Python<'_>, i: isize) -> PyResult<Handle> {
        if self.get(py, i)?.is_none() {
            return Err(raise(py, R::NotFound, "no block at this index"));
        }
        let j = if i < 0 { i + self.items.len() as isize } else { i } as usize;
        let k = self.items[..j].iter().flatten().count();
        self.shared.handles().get(k).copied().ok_or_else(|| raise(py, R::NotFound, "no block at this index"))
    }

    /// Queues a DMA of block `i` to or from device address `device_ptr`.
    fn dma(&self, py: Python<'_>, i: isize, device_ptr: u64, stream: usize, to_device: bool) -> PyResult<()> {
        let h = self.handle(py, i)?;
        let c = self.shared.node().ok_or_else(|| raise(py, R::StaleHandle, "the blocks were released"))?;
        py.detach(|| {
            let path = c.cuda()?;
            if to_device {
                path.block_to_device(&h, device_ptr, stream)
            } else {
                path.block_from_device(&h, device_ptr, stream)
            }
        })
        .or_raise(py)
    }

    fn offsets(&self) -> Vec<Option<u64>> {
        let mut hs = self.shared.handles().iter();
        self.items.iter().map(|it| it.as_ref().and_then(|_| hs.next().map(|h| h.off))).collect()
    }

    fn get(&self, py: Python<'_>, i: isize) -> PyResult<Option<Py<PyMemoryView>>> {
        let n = self.items.len() as isize;
        let j = if i < 0 { i + n } else { i };
        if !(0..n).contains(&j) {
            return Err(pyo3::exceptions::PyIndexError::new_err("block index out of range"));
        }
        if !self.open() {
            return Err(raise(py, R::StaleHandle, "the blocks were released"));
        }
        Ok(self.items[j as usize].as_ref().map(|it| it.view.clone_ref(py)))
    }

    fn keys<'py>(&self, py: Python<'py>) -> Vec<Option<Bound<'py, PyBytes>>> {
        self.keys.iter().zip(&self.items).map(|(k, it)| it.as_ref().map(|_| key_bytes(py, *k))).collect()
    }
}

/// Blocks pinned by `Node.acquire`: item `i` is a read-only memoryview of
/// key `i`'s payload, or None when the key is not stored. Pinned blocks are
/// never evicted or changed. `release()` (or leaving a `with` block) drops
/// the pins; the views then raise on use.
#[pyclass(frozen, module = "cxlkv._cxlkv")]
pub struct Pinned(Batch);

impl Pinned {
    pub(crate) fn new(py: Python<'_>, attached: Arc<Attached>, hs: Vec<Option<Handle>>) -> PyResult<Pinned> {
        Ok(Pinned(Batch::new(py, attached, Kind::Pinned, hs)?))
    }
}

#[pymethods]
impl Pinned {
    fn __len__(&self) -> usize {
        self.0.items.len()
    }

    fn __getitem__(&self, py: Python<'_>, i: isize) -> PyResult<Option<Py<PyMemoryView>>> {
        self.0.get(py, i)
    }

    /// How many of the keys were found and pinned.
    #[getter]
    fn found(&self) -> usize {
        self.0.items.iter().flatten().count()
    }

    /// The key of each pinned block (None where not found).
    #[getter]
    fn keys<'py>(&self, py: Python<'py>) -> Vec<Option<Bound<'py, PyBytes>>> {
        self.0.keys(py)
    }

    /// True once released.
    #[getter]
    fn released(&self) -> bool {
        !self.0.open()
    }

    /// Drops the pins. `BufferError` (nothing released) while a slice, array
    /// or other view of a block lives.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        self.0.finish(py, Finish::Release).map(|_| ())
    }

    /// The region offset of each block's payload (None where not found),
    /// for `Node.cuda_gather` segments.
    #[getter]
    fn offsets(&self) -> Vec<Option<u64>> {
        self.0.offsets()
    }

    /// Queues a DMA of block `i` to device address `device_ptr` (e.g.
    /// `tensor.data_ptr()`) on CUDA stream `stream` (e.g.
    /// `torch.cuda.current_stream().cuda_stream`; 0: the default stream).
    /// Keep the pins until the stream completed. Needs `Node.cuda_register`.
    #[pyo3(signature = (i, device_ptr, stream=0))]
    fn to_device(&self, py: Python<'_>, i: isize, device_ptr: u64, stream: usize) -> PyResult<()> {
        self.0.dma(py, i, device_ptr, stream, true)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        if self.0.open() {
            self.release(py)?;
        }
        Ok(false)
    }
}

/// Blocks reserved by `Node.reserve`: item `i` is a writable memoryview of
/// key `i`'s payload. `publish()` makes them visible to every node at once;
/// `abort()` frees them. A `with` block publishes on a normal exit and
/// aborts on an exception. The views raise on use afterwards.
#[pyclass(frozen, module = "cxlkv._cxlkv")]
pub struct Reservation(Batch);

impl Reservation {
    pub(crate) fn new(py: Python<'_>, attached: Arc<Attached>, hs: Vec<Option<Handle>>) -> PyResult<Reservation> {
        Ok(Reservation(Batch::new(py, attached, Kind::Reserved, hs)?))
    }
}

#[pymethods]
impl Reservation {
    fn __len__(&self) -> usize {
        self.0.items.len()
    }

    fn __getitem__(&self, py: Python<'_>, i: isize) -> PyResult<Option<Py<PyMemoryView>>> {
        self.0.get(py, i)
    }

    /// The key of each reserved block.
    #[getter]
    fn keys<'py>(&self, py: Python<'py>) -> Vec<Option<Bound<'py, PyBytes>>> {
        self.0.keys(py)
    }

    /// True once published or aborted.
    #[getter]
    fn done(&self) -> bool {
        !self.0.open()
    }

    /// Flushes every payload and publishes the blocks; returns a `Result`
    /// per block. `BufferError` (nothing published) while a view lives.
    fn publish<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let out = self.0.finish(py, Finish::Publish)?;
        out.iter().map(|r| result(py, r)).collect()
    }

    /// Abandons the blocks: their space is freed, the keys can be reserved
    /// again.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        self.0.finish(py, Finish::Release).map(|_| ())
    }

    /// The region offset of each block's payload, for `Node.cuda_scatter`.
    #[getter]
    fn offsets(&self) -> Vec<Option<u64>> {
        self.0.offsets()
    }

    /// Queues a DMA filling block `i` from device address `device_ptr` on
    /// CUDA stream `stream`; then `publish_after(stream)`.
    #[pyo3(signature = (i, device_ptr, stream=0))]
    #[allow(clippy::wrong_self_convention)] // the Python name of a copy, as in C
    fn from_device(&self, py: Python<'_>, i: isize, device_ptr: u64, stream: usize) -> PyResult<()> {
        self.0.dma(py, i, device_ptr, stream, false)
    }

    /// Waits for CUDA stream `stream`, then publishes the blocks (their
    /// bytes came by DMA); returns a `Result` per block.
    #[pyo3(signature = (stream=0))]
    fn publish_after<'py>(&self, py: Python<'py>, stream: usize) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let out = self.0.finish(py, Finish::PublishAfter(stream))?;
        out.iter().map(|r| result(py, r)).collect()
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*exc))]
    fn __exit__(&self, py: Python<'_>, exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        if self.0.open() {
            let failed = exc.len() > 0 && !exc.get_item(0)?.is_none();
            if failed {
                self.abort(py)?;
            } else {
                let res = self.0.finish(py, Finish::Publish)?;
                if let Some(e) = res.iter().find_map(|r| r.err()) {
                    return Err(crate::core_err(py, e));
                }
            }
        }
        Ok(false)
    }
}

/// A Python buffer held for one call (released when dropped).
struct RawBuf(Box<ffi::Py_buffer>);

impl RawBuf {
    fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<RawBuf> {
        // SAFETY:
        // - an all-zero Py_buffer is a valid value to hand to GetBuffer,
        //   which fills it.
        let mut v: Box<ffi::Py_buffer> = Box::new(unsafe { core::mem::zeroed() });
        let flags = if writable { ffi::PyBUF_WRITABLE } else { ffi::PyBUF_SIMPLE };
        // SIMPLE and WRITABLE ask for one contiguous byte range.
        // SAFETY: `obj` is a live object (we hold the GIL and a reference);
        // `v` is a writable Py_buffer.
        if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *v, flags) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(RawBuf(v))
    }

    fn range(&self) -> (usize, usize) {
        (self.0.buf as usize, self.0.len.max(0) as usize)
    }
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        Python::attach(|_| {
            // SAFETY:
            // - the view was filled by a successful GetBuffer and is released
            //   once, with the GIL held.
            unsafe { ffi::PyBuffer_Release(&mut *self.0) }
        });
    }
}

/// The buffers of one `put` or `get` item: one buffer or a sequence of them.
pub(crate) struct Buffers(Vec<RawBuf>);

impl Buffers {
    pub(crate) fn of(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Buffers> {
        // SAFETY:
        // - `obj` is a live object and we hold the GIL.
        if unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } != 0 {
            return Ok(Buffers(vec![RawBuf::get(obj, writable)?]));
        }
        let parts: PyResult<Vec<RawBuf>> = obj.try_iter()?.map(|p| RawBuf::get(&p?, writable)).collect();
        Ok(Buffers(parts?))
    }

    /// Read views of the buffers.
    pub(crate) fn slices(&self) -> Vec<&[u8]> {
        self.0
            .iter()
            .map(|b| {
                let (p, n) = b.range();
                if n == 0 {
                    return &[][..];
                }
                // The caller does not mutate it during the call (documented).
                // SAFETY: the exporter guarantees `n` readable bytes at `p`
                // while the buffer is held, which `self` does.
                unsafe { core::slice::from_raw_parts(p as *const u8, n) }
            })
            .collect()
    }

    /// Write views of the buffers (obtained WRITABLE; checked disjoint).
    pub(crate) fn slices_mut(&mut self) -> Vec<&mut [u8]> {
        self.0
            .iter()
            .map(|b| {
                let (p, n) = b.range();
                if n == 0 {
                    return &mut [][..];
                }
                // `disjoint` proved no two buffers of the call overlap.
                // SAFETY: a WRITABLE buffer, held: `n` writable bytes at `p`,
                // aliased by no other slice of the call.
                unsafe { core::slice::from_raw_parts_mut(p as *mut u8, n) }
            })
            .collect()
    }

    /// Refuses a `get` whose buffers overlap (two items writing the same
    /// bytes).
    pub(crate) fn disjoint(py: Python<'_>, all: &[Buffers]) -> PyResult<()> {
        let mut r: Vec<(usize, usize)> = all.iter().flat_map(|b| b.0.iter().map(RawBuf::range)).collect();
        r.retain(|x| x.1 > 0);
        r.sort_unstable();
        if r.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
            return Err(raise(py, R::InvalidArgument, "the buffers of a get overlap"));
        }
        Ok(())
    }
}
