//! Pinned and reserved blocks, handed to JavaScript as `ArrayBuffer`s over
//! the region, without a copy.
//!
//! A view is made on first use of a block and remembered by a weak
//! reference. `release()` (and `publish()`/`abort()`) detaches every view it
//! handed out before it drops the pins: afterwards a view, and every typed
//! array over it, has length 0, so no read reaches a block that may be
//! reused. Each view also holds the batch (and so the pins and the mapping)
//! until it is collected: a view never points at unmapped memory, and a
//! batch nobody released is released once its object and every view of it
//! were collected (the finalizers are only that safety net).
//!
//! Where the runtime refuses external buffers (a V8 sandbox, as in
//! Electron), a pinned block's view is a copy and a reserved block's view is
//! refused with `UNSUPPORTED`: writes to a copy would never reach the block.

use core::ffi::c_void;
use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use napi::bindgen_prelude::{AsyncTask, Buffer, ObjectFinalize};
use napi::{sys, Env, Unknown};
use napi_derive::napi;

use cxlkv_platform::kv::{CoreResult, Handle, Key};
use cxlkv_platform::{Blocks, Code, Finish, Kind, Node as Attached};

use crate::args::u32_of;
use crate::error::{coded, item, range_error, OrThrow};
use crate::js;
use crate::tasks::Job;
use crate::tasks::Pending;

/// Whether views must be copies (set by `CXLKV_NODE_NO_EXTERNAL_BUFFERS=1`,
/// which makes this addon behave as under a runtime that refuses external
/// buffers, to test that path on any Node).
fn copies_only() -> bool {
    static NO_EXTERNAL: OnceLock<bool> = OnceLock::new();
    *NO_EXTERNAL.get_or_init(|| std::env::var_os("CXLKV_NODE_NO_EXTERNAL_BUFFERS").is_some_and(|v| v == "1"))
}

/// Runs when a view is collected: drops the batch it held.
unsafe extern "C" fn view_collected(_env: sys::napi_env, _data: *mut c_void, hint: *mut c_void) {
    // SAFETY: `hint` is the `Box<Arc<Blocks>>` leaked for this view by
    // `Batch::view`; the runtime calls this once per view.
    drop(unsafe { Box::from_raw(hint.cast::<Arc<Blocks>>()) });
}

/// The blocks of one acquire or reserve call.
struct Batch {
    shared: Arc<Blocks>,
    keys: Vec<Key>,
    /// Per key: the index of its handle, `None` when not found.
    slots: Vec<Option<usize>>,
    /// Per key: the view handed out (a weak reference), if any.
    views: Vec<Option<sys::napi_ref>>,
    /// Per handle: the payload's address in this process.
    ptrs: Vec<*mut u8>,
    /// An async publish took the blocks: no view may be made any more.
    closing: bool,
}

impl Batch {
    fn new(env: &Env, node: Arc<Attached>, kind: Kind, keys: Vec<Key>, hs: Vec<Option<Handle>>) -> napi::Result<Batch> {
        let mut slots = Vec::with_capacity(hs.len());
        let mut handles = Vec::new();
        let mut ptrs = Vec::new();
        for h in hs {
            slots.push(h.map(|h| {
                handles.push(h);
                handles.len() - 1
            }));
        }
        for h in &handles {
            ptrs.push(node.payload_ptr(h.off, h.len));
        }
        let shared = Arc::new(Blocks::new(node, kind, handles));
        // A payload outside the mapping would be a bug: end the batch (by
        // dropping it) and report it.
        let ptrs = ptrs.into_iter().collect::<cxlkv_platform::Result<Vec<_>>>().or_throw(env)?;
        let views = vec![None; keys.len()];
        Ok(Batch { shared, keys, slots, views, ptrs, closing: false })
    }

    fn len(&self) -> u32 {
        self.keys.len() as u32
    }

    /// The handle index of key `i`, checking `i`.
    fn slot(&self, env: &Env, i: &Unknown<'_>) -> napi::Result<(usize, Option<usize>)> {
        let i = u32_of(env, i, "index")? as usize;
        match self.slots.get(i) {
            Some(s) => Ok((i, *s)),
            None => {
                Err(range_error(env, &format!("index {i} is out of range (the batch has {} keys)", self.keys.len())))
            }
        }
    }

    fn check_open(&self, env: &Env) -> napi::Result<()> {
        if !self.closing && self.shared.is_open() {
            Ok(())
        } else {
            Err(coded(env, Code::StaleHandle, "the blocks were released already"))
        }
    }

    /// The view of key `i` (`null` when not found): the same `ArrayBuffer`
    /// while it lives.
    fn view<'e>(&mut self, env: &'e Env, i: &Unknown<'_>) -> napi::Result<Option<Unknown<'e>>> {
        let (i, _) = self.slot(env, i)?;
        self.view_at(env, i)
    }

    /// Every key's view, in key order.
    fn all_views<'e>(&mut self, env: &'e Env) -> napi::Result<Vec<Option<Unknown<'e>>>> {
        (0..self.keys.len()).map(|i| self.view_at(env, i)).collect()
    }

    /// The view of key `i`, an index in range.
    fn view_at<'e>(&mut self, env: &'e Env, i: usize) -> napi::Result<Option<Unknown<'e>>> {
        self.check_open(env)?;
        let Some(h) = self.slots.get(i).copied().flatten() else { return Ok(None) };
        let raw = env.raw();
        if let Some(r) = self.views.get(i).copied().flatten() {
            if let Some(v) = js::referenced(raw, r)? {
                // SAFETY: a value of this call's env, just read from a
                // reference of it.
                return Ok(Some(unsafe { Unknown::from_raw_unchecked(raw, v) }));
            }
            js::unreference(raw, r);
            self.views[i] = None;
        }
        let (ptr, len) = (self.ptrs[h], self.shared.handles()[h].len as usize);
        let made = if copies_only() {
            Err(js::NoExternal)
        } else {
            let hint = Box::into_raw(Box::new(self.shared.clone()));
            // The view holds `hint` (the batch, so the pins and the mapping)
            // until it is collected; `release` detaches it first.
            // SAFETY: `ptr .. ptr+len` is the block's payload in the mapping
            // `shared` keeps mapped while the view lives, and the pin or
            // reservation keeps it the block's until the view is detached.
            let r = unsafe { js::external_arraybuffer(raw, ptr, len, Some(view_collected), hint.cast()) };
            if !matches!(r, Ok(Ok(_))) {
                // SAFETY: no view was made, so the box is still ours.
                drop(unsafe { Box::from_raw(hint) });
            }
            r?
        };
        let v = match made {
            Ok(v) => v,
            Err(js::NoExternal) if self.shared.kind() == Kind::Pinned => {
                // SAFETY: the pin keeps the payload's bytes unchanged while
                // they are copied.
                js::arraybuffer_copy(raw, unsafe { core::slice::from_raw_parts(ptr, len) })?
            }
            Err(js::NoExternal) => {
                return Err(coded(
                    env,
                    Code::Unsupported,
                    "this runtime refuses external buffers (V8 sandbox): a reserved block cannot be viewed; store with put()",
                ))
            }
        };
        self.views[i] = Some(js::reference(raw, v, 0)?);
        // SAFETY: a value of this call's env.
        Ok(Some(unsafe { Unknown::from_raw_unchecked(raw, v) }))
    }

    /// Detaches every view handed out and forgets it. A view that could not
    /// be detached stays remembered and the error is returned: the caller
    /// must keep the blocks (a later call tries again).
    fn detach_views(&mut self, env: &Env) -> napi::Result<()> {
        let raw = env.raw();
        let mut first = Ok(());
        for slot in self.views.iter_mut() {
            let Some(r) = *slot else { continue };
            let done = js::referenced(raw, r).and_then(|v| v.map_or(Ok(()), |v| js::detach(raw, v)));
            match done {
                Ok(()) => {
                    js::unreference(raw, r);
                    *slot = None;
                }
                Err(e) if first.is_ok() => first = Err(e),
                Err(_) => {}
            }
        }
        first
    }

    /// Detaches the views, then ends the blocks.
    fn finish(&mut self, env: &Env, how: Finish) -> napi::Result<Vec<CoreResult<()>>> {
        self.check_open(env)?;
        self.detach_views(env)?;
        let mut out = vec![Ok(()); self.shared.handles().len()];
        self.shared.finish(how, &mut out).or_throw(env)?;
        Ok(out)
    }

    /// Detaches the views and hands the blocks to an async publish.
    fn start_publish(&mut self, env: &Env) -> napi::Result<Arc<Blocks>> {
        self.check_open(env)?;
        self.detach_views(env)?;
        self.closing = true;
        Ok(self.shared.clone())
    }

    fn keys(&self) -> Vec<Option<Buffer>> {
        self.keys.iter().zip(&self.slots).map(|(k, s)| s.map(|_| Buffer::from(k.to_bytes().to_vec()))).collect()
    }

    fn offsets(&self) -> Vec<Option<f64>> {
        self.slots.iter().map(|s| s.map(|h| self.shared.handles()[h].off as f64)).collect()
    }

    /// Forgets the views' references when the batch object is collected
    /// (the views themselves stay valid: each holds the batch).
    fn forget(&mut self, env: &Env) {
        for r in self.views.iter_mut().filter_map(Option::take) {
            js::unreference(env.raw(), r);
        }
    }
}

/// Blocks pinned by `Node.acquire`: `view(i)` is an `ArrayBuffer` over key
/// `i`'s payload in the region (no copy), `null` when the key is not stored.
/// Pinned blocks are never evicted or changed. Do not write to a view: it is
/// the stored block every reader sees. `release()` drops the pins and
/// detaches every view (their length becomes 0).
#[napi(custom_finalize)]
pub struct Pinned {
    batch: RefCell<Batch>,
}

impl Pinned {
    pub(crate) fn new(env: &Env, node: Arc<Attached>, keys: Vec<Key>, hs: Vec<Option<Handle>>) -> napi::Result<Pinned> {
        Ok(Pinned { batch: RefCell::new(Batch::new(env, node, Kind::Pinned, keys, hs)?) })
    }
}

#[napi]
impl Pinned {
    /// How many keys were asked for.
    #[napi(getter, catch_unwind)]
    pub fn length(&self) -> u32 {
        self.batch.borrow().len()
    }

    /// How many of the keys were found and pinned.
    #[napi(getter, catch_unwind)]
    pub fn found(&self) -> u32 {
        self.batch.borrow().slots.iter().flatten().count() as u32
    }

    /// The key of each pinned block (`null` where not found).
    #[napi(getter, catch_unwind)]
    pub fn keys(&self) -> Vec<Option<Buffer>> {
        self.batch.borrow().keys()
    }

    /// The region offset of each block's payload (`null` where not found).
    #[napi(getter, catch_unwind)]
    pub fn offsets(&self) -> Vec<Option<f64>> {
        self.batch.borrow().offsets()
    }

    /// True once released.
    #[napi(getter, catch_unwind)]
    pub fn released(&self) -> bool {
        !self.batch.borrow().shared.is_open()
    }

    /// The zero-copy view of block `i` (`null` when key `i` is not stored).
    #[napi(catch_unwind, ts_args_type = "i: number", ts_return_type = "ArrayBuffer | null")]
    pub fn view<'e>(&self, env: &'e Env, i: Unknown<'_>) -> napi::Result<Option<Unknown<'e>>> {
        self.batch.borrow_mut().view(env, &i)
    }

    /// Every block's view, in key order.
    #[napi(catch_unwind, ts_return_type = "Array<ArrayBuffer | null>")]
    pub fn views<'e>(&self, env: &'e Env) -> napi::Result<Vec<Option<Unknown<'e>>>> {
        self.batch.borrow_mut().all_views(env)
    }

    /// Drops the pins after detaching every view. `STALE_HANDLE` the second
    /// time.
    #[napi(catch_unwind)]
    pub fn release(&self, env: &Env) -> napi::Result<()> {
        self.batch.borrow_mut().finish(env, Finish::Release).map(|_| ())
    }
}

impl ObjectFinalize for Pinned {
    fn finalize(self, env: Env) -> napi::Result<()> {
        self.batch.borrow_mut().forget(&env);
        Ok(())
    }
}

/// Blocks reserved by `Node.reserve`: `view(i)` is a writable `ArrayBuffer`
/// over key `i`'s payload in the region. `publish()` makes every block
/// visible to every node at once; `abort()` frees them. Both detach the
/// views.
#[napi(custom_finalize)]
pub struct Reservation {
    batch: RefCell<Batch>,
}

impl Reservation {
    pub(crate) fn new(env: &Env, node: Arc<Attached>, keys: Vec<Key>, hs: Vec<Handle>) -> napi::Result<Reservation> {
        let hs = hs.into_iter().map(Some).collect();
        Ok(Reservation { batch: RefCell::new(Batch::new(env, node, Kind::Reserved, keys, hs)?) })
    }
}

#[napi]
impl Reservation {
    /// How many blocks are reserved.
    #[napi(getter, catch_unwind)]
    pub fn length(&self) -> u32 {
        self.batch.borrow().len()
    }

    /// The key of each block.
    #[napi(getter, catch_unwind)]
    pub fn keys(&self) -> Vec<Option<Buffer>> {
        self.batch.borrow().keys()
    }

    /// The region offset of each block's payload.
    #[napi(getter, catch_unwind)]
    pub fn offsets(&self) -> Vec<Option<f64>> {
        self.batch.borrow().offsets()
    }

    /// True once published or aborted.
    #[napi(getter, catch_unwind)]
    pub fn done(&self) -> bool {
        !self.batch.borrow().shared.is_open()
    }

    /// The writable zero-copy view of block `i`. `UNSUPPORTED` where the
    /// runtime refuses external buffers.
    #[napi(catch_unwind, ts_args_type = "i: number", ts_return_type = "ArrayBuffer")]
    pub fn view<'e>(&self, env: &'e Env, i: Unknown<'_>) -> napi::Result<Option<Unknown<'e>>> {
        self.batch.borrow_mut().view(env, &i)
    }

    /// Every block's view, in key order.
    #[napi(catch_unwind, ts_return_type = "Array<ArrayBuffer>")]
    pub fn views<'e>(&self, env: &'e Env) -> napi::Result<Vec<Option<Unknown<'e>>>> {
        self.batch.borrow_mut().all_views(env)
    }

    /// Detaches the views, flushes every payload and publishes the blocks;
    /// returns a result name per block (`"OK"`, or why it failed).
    #[napi(catch_unwind)]
    pub fn publish(&self, env: &Env) -> napi::Result<Vec<String>> {
        Ok(self.batch.borrow_mut().finish(env, Finish::Publish)?.iter().map(item).collect())
    }

    /// `publish` off the event loop: the views are detached at once, the
    /// blocks published on the libuv pool.
    #[napi(catch_unwind, ts_return_type = "Promise<string[]>")]
    pub fn publish_async(&self, env: &Env) -> napi::Result<Pending<Vec<CoreResult<()>>, Vec<String>>> {
        let shared = self.batch.borrow_mut().start_publish(env)?;
        let work = move || {
            let mut out = vec![Ok(()); shared.handles().len()];
            shared.finish(Finish::Publish, &mut out)?;
            Ok(out)
        };
        Ok(AsyncTask::new(Job::new(work, |_, out| Ok(out.iter().map(item).collect()))))
    }

    /// Detaches the views and abandons the blocks: their space is freed, the
    /// keys can be reserved again.
    #[napi(catch_unwind)]
    pub fn abort(&self, env: &Env) -> napi::Result<()> {
        self.batch.borrow_mut().finish(env, Finish::Release).map(|_| ())
    }
}

impl ObjectFinalize for Reservation {
    fn finalize(self, env: Env) -> napi::Result<()> {
        self.batch.borrow_mut().forget(&env);
        Ok(())
    }
}
