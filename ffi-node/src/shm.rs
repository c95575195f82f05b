//! The shared-memory library from JavaScript (as C's `cxlkv_alloc`,
//! `cxlkv_root_*`, `cxlkv_lock_*`, `cxlkv_flush` and Python's `Node.alloc`,
//! ...): raw allocations in the region's payload area, named roots that
//! find them again from any process, application locks, and copies in and
//! out that publish and read fresh.

use std::sync::{Arc, Mutex};

use napi::bindgen_prelude::Buffer;
use napi::{Env, Unknown};
use napi_derive::napi;

use cxlkv_platform::host::tid;
use cxlkv_platform::kv::{Root, MAX_ROOT_NAME};
use cxlkv_platform::{Code, Node as Attached};

use crate::args::{bytes_of, string_of, u32_of, u64_of, Opts};
use crate::error::{coded, OrThrow};
use crate::node::Node;

/// What a named root names.
#[napi(object)]
pub struct RootValue {
    /// Region offset of the object.
    pub offset: f64,
    /// Its bytes.
    pub size: f64,
    /// An application-defined type tag.
    pub tag: u32,
}

fn root_value(r: Root) -> RootValue {
    RootValue { offset: r.offset as f64, size: r.size as f64, tag: r.tag }
}

/// A root name: 1 to 32 bytes of UTF-8 without NUL.
fn root_name(env: &Env, name: &Unknown<'_>) -> napi::Result<Vec<u8>> {
    let s = string_of(env, name, "name")?;
    if s.is_empty() || s.len() > MAX_ROOT_NAME || s.contains('\0') {
        return Err(coded(env, Code::InvalidArgument, "a root name is 1 to 32 bytes without NUL"));
    }
    Ok(s.into_bytes())
}

/// An application lock held by this thread (`node.lock(n)`): release it.
/// Held until released (by the thread that took it) or the node dies.
#[napi]
pub struct AppLock {
    /// The node, until released (a released lock does not keep it attached).
    node: Mutex<Option<Arc<Attached>>>,
    lock: u32,
    seq: u64,
    thread: u32,
}

#[napi]
impl AppLock {
    /// The lock's number.
    #[napi(getter, catch_unwind)]
    pub fn number(&self) -> u32 {
        self.lock
    }

    /// True once released.
    #[napi(getter, catch_unwind)]
    pub fn released(&self) -> bool {
        self.node.lock().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// Releases the lock (publish what it guards first: `writeRange` does).
    /// Only the thread that took it may; a second release does nothing.
    /// `REVOKED` when the grant was over already.
    #[napi(catch_unwind)]
    pub fn release(&self, env: Env) -> napi::Result<()> {
        if tid() != self.thread {
            return Err(coded(&env, Code::InvalidArgument, "only the thread that took the lock releases it"));
        }
        let Some(node) = self.node.lock().unwrap_or_else(|e| e.into_inner()).take() else { return Ok(()) };
        node.unlock_app(self.lock, self.seq).or_throw(&env)
    }
}

#[napi]
impl Node {
    /// Allocates `size` bytes of region payload (64-byte aligned); returns
    /// its offset. It stays allocated until `free`, across this node's death
    /// too once a named root names it.
    #[napi(catch_unwind, ts_args_type = "size: number")]
    pub fn alloc(&self, env: Env, size: Unknown<'_>) -> napi::Result<f64> {
        let size = u64_of(&env, &size, "size")?;
        Ok(self.attached(&env)?.core().alloc(size).or_throw(&env)? as f64)
    }

    /// Frees an allocation made by `alloc` (by any node).
    #[napi(catch_unwind, ts_args_type = "offset: number")]
    pub fn free(&self, env: Env, offset: Unknown<'_>) -> napi::Result<()> {
        let off = u64_of(&env, &offset, "offset")?;
        self.attached(&env)?.core().free(off).or_throw(&env)
    }

    /// Names an allocation: `rootGet(name)` finds it from any process.
    /// `EXISTS` if the name is taken.
    #[napi(catch_unwind, ts_args_type = "name: string, value: { offset: number, size: number, tag?: number }")]
    pub fn root_put(&self, env: Env, name: Unknown<'_>, value: Unknown<'_>) -> napi::Result<()> {
        let name = root_name(&env, &name)?;
        let o = Opts::of(&env, &value, "value", &["offset", "size", "tag"])?;
        let need = |k: &'static str| -> napi::Result<u64> {
            let v = o.value(k)?.ok_or_else(|| coded(&env, Code::InvalidArgument, &format!("value.{k} is required")))?;
            u64_of(&env, &v, k)
        };
        let root = Root { offset: need("offset")?, size: need("size")?, tag: o.u32("tag")?.unwrap_or(0) };
        self.attached(&env)?.core().root_put(&name, root).or_throw(&env)
    }

    /// What root `name` names; `NOT_FOUND` if absent.
    #[napi(catch_unwind, ts_args_type = "name: string")]
    pub fn root_get(&self, env: Env, name: Unknown<'_>) -> napi::Result<RootValue> {
        let name = root_name(&env, &name)?;
        Ok(root_value(self.attached(&env)?.root(&name).or_throw(&env)?))
    }

    /// Removes root `name` (what it names stays allocated); returns it.
    #[napi(catch_unwind, ts_args_type = "name: string")]
    pub fn root_destroy(&self, env: Env, name: Unknown<'_>) -> napi::Result<RootValue> {
        let name = root_name(&env, &name)?;
        Ok(root_value(self.attached(&env)?.core().root_destroy(&name).or_throw(&env)?))
    }

    /// Removes root `name` and frees what it names, in one step; returns it.
    #[napi(catch_unwind, ts_args_type = "name: string")]
    pub fn root_free(&self, env: Env, name: Unknown<'_>) -> napi::Result<RootValue> {
        let name = root_name(&env, &name)?;
        Ok(root_value(self.attached(&env)?.core().root_free(&name).or_throw(&env)?))
    }

    /// `length` bytes of the payload area at `offset`, read fresh.
    /// `OUT_OF_BOUNDS` outside the payload area.
    #[napi(catch_unwind, ts_args_type = "offset: number, length: number")]
    pub fn read_range(&self, env: Env, offset: Unknown<'_>, length: Unknown<'_>) -> napi::Result<Buffer> {
        let (off, len) = (u64_of(&env, &offset, "offset")?, u32_of(&env, &length, "length")?);
        let mut buf = vec![0u8; len as usize];
        self.attached(&env)?.read_range(off, &mut buf).or_throw(&env)?;
        Ok(Buffer::from(buf))
    }

    /// Copies `data` into the payload area at `offset` and publishes it to
    /// every host.
    #[napi(catch_unwind, ts_args_type = "offset: number, data: Bytes")]
    pub fn write_range(&self, env: Env, offset: Unknown<'_>, data: Unknown<'_>) -> napi::Result<()> {
        let off = u64_of(&env, &offset, "offset")?;
        let b = bytes_of(&env, &data, "data")?;
        // SAFETY: the argument is held by the running call, which runs no
        // JavaScript while it is read.
        let data = unsafe { b.slice() };
        self.attached(&env)?.write_range(off, data).or_throw(&env)
    }

    /// Publishes `length` bytes at `offset` written by other means.
    #[napi(catch_unwind, ts_args_type = "offset: number, length: number")]
    pub fn flush_range(&self, env: Env, offset: Unknown<'_>, length: Unknown<'_>) -> napi::Result<()> {
        let (off, len) = (u64_of(&env, &offset, "offset")?, u64_of(&env, &length, "length")?);
        self.attached(&env)?.flush_range(off, len).or_throw(&env)
    }

    /// Drops this host's cached copies of `length` bytes at `offset`.
    #[napi(catch_unwind, ts_args_type = "offset: number, length: number")]
    pub fn invalidate_range(&self, env: Env, offset: Unknown<'_>, length: Unknown<'_>) -> napi::Result<()> {
        let (off, len) = (u64_of(&env, &offset, "offset")?, u64_of(&env, &length, "length")?);
        self.attached(&env)?.invalidate_range(off, len).or_throw(&env)
    }

    /// Allocates an application lock; returns its number.
    #[napi(catch_unwind)]
    pub fn lock_alloc(&self, env: Env) -> napi::Result<u32> {
        self.attached(&env)?.core().lock_alloc().or_throw(&env)
    }

    /// Frees application lock `number` (once no node holds or will take it).
    #[napi(catch_unwind, ts_args_type = "number: number")]
    pub fn lock_free(&self, env: Env, number: Unknown<'_>) -> napi::Result<()> {
        let n = u32_of(&env, &number, "number")?;
        self.attached(&env)?.core().lock_free(n).or_throw(&env)
    }

    /// Takes application lock `number`, waiting up to the node's lock
    /// timeout (`TIMEOUT`); returns it held. Not recursive (`BUSY` when this
    /// thread holds it). Taking it fences.
    #[napi(catch_unwind, ts_args_type = "number: number")]
    pub fn lock(&self, env: Env, number: Unknown<'_>) -> napi::Result<AppLock> {
        let n = u32_of(&env, &number, "number")?;
        let node = self.attached(&env)?;
        let held = node.core().lock_app(n).or_throw(&env)?;
        Ok(AppLock { node: Mutex::new(Some(node)), lock: n, seq: held.seq, thread: tid() })
    }
}
