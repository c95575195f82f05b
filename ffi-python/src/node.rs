//! Nodes: the handle of every cache call (blocks, messages, the shared-memory
//! library, the tier, events and the GPU path).

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use cxlkv_platform::gpu::{CudaPath, Segment};
use cxlkv_platform::kv::Key;
use cxlkv_platform::kv::Message as Msg;
use cxlkv_platform::kv::{Lru, ReserveItem};
use cxlkv_platform::Code as R;
use cxlkv_platform::{FlushMode, GetItem, Node as Attached, PutItem, ReserveRefused};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyInt, PyTuple};

use crate::blocks::{self, Buffers, Pinned, Reservation};
use crate::message::{outgoing, Message};
use crate::{key_of, keys_of, raise, OrRaise};

pub(crate) fn mode_of(py: Python<'_>, s: &str) -> PyResult<FlushMode> {
    FlushMode::from_str(s).or_raise(py)
}

/// An attached node: every cache operation. A context manager that detaches.
#[pyclass(frozen, module = "cxlkv._cxlkv")]
pub struct Node {
    pub(crate) attached: RwLock<Option<Arc<Attached>>>,
}

impl Node {
    fn segments(
        &self,
        py: Python<'_>,
        segments: Vec<(u64, u64, u64)>,
        stream: usize,
        op: impl FnOnce(&CudaPath<'_>, &[Segment], usize) -> cxlkv_platform::Result<()> + Send,
    ) -> PyResult<()> {
        let c = self.attached(py)?;
        let segs: Vec<Segment> =
            segments.into_iter().map(|(r, d, l)| Segment { region_off: r, device_ptr: d, len: l }).collect();
        py.detach(|| op(&c.cuda()?, &segs, stream)).or_raise(py)
    }

    pub(crate) fn attached(&self, py: Python<'_>) -> PyResult<Arc<Attached>> {
        let g = self.attached.read().unwrap_or_else(|e| e.into_inner());
        g.clone().ok_or_else(|| raise(py, R::InvalidHandle, "the node is detached"))
    }

    /// A namespace id from an int (an id as is) or a `cxlkv.Namespace` (or
    /// any object with a 16-byte `digest`): registered in this node's
    /// region on first use.
    pub(crate) fn ns(&self, py: Python<'_>, ns: &Bound<'_, PyAny>) -> PyResult<u32> {
        if ns.is_instance_of::<PyInt>() {
            return crate::ns_of(py, None, ns, None);
        }
        let c = self.attached(py)?;
        crate::ns_of(py, Some(&c), ns, None)
    }
}

/// The keys and held buffers of `(key, buffer or [buffers])` items.
fn items_of(items: &Bound<'_, PyAny>, writable: bool) -> PyResult<(Vec<Key>, Vec<Buffers>)> {
    let mut keys = Vec::new();
    let mut bufs = Vec::new();
    for it in items.try_iter()? {
        let (k, p): (Bound<'_, PyAny>, Bound<'_, PyAny>) = it?.extract()?;
        keys.push(key_of(&k)?);
        bufs.push(Buffers::of(&p, writable)?);
    }
    Ok((keys, bufs))
}

fn report<'py>(py: Python<'py>, fields: &[(&str, u64)]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in fields {
        d.set_item(k, v)?;
    }
    Ok(d)
}

#[pymethods]
impl Node {
    // -- the shared-memory library (see `shm.rs`) --------------------------

    /// Allocates `size` bytes of region payload (64-byte aligned); returns
    /// its offset. It stays allocated until `free`, across this node's death
    /// too once a named root names it (`root_put`). `CapacityError` when
    /// the region has no room.
    fn alloc(&self, py: Python<'_>, size: u64) -> PyResult<u64> {
        let c = self.attached(py)?;
        py.detach(|| c.core().alloc(size)).or_raise(py)
    }

    /// Frees an allocation made by `alloc` (by any node).
    fn free(&self, py: Python<'_>, offset: u64) -> PyResult<()> {
        let c = self.attached(py)?;
        py.detach(|| c.core().free(offset)).or_raise(py)
    }

    /// Names an allocation: `root_get(name)` finds it from any process.
    /// `ExistsError` if the name is taken.
    #[pyo3(signature = (name, offset, size, tag=0))]
    fn root_put(&self, py: Python<'_>, name: &str, offset: u64, size: u64, tag: u32) -> PyResult<()> {
        let (name, c) = (crate::shm::root_name(py, name)?, self.attached(py)?);
        py.detach(|| c.core().root_put(&name, cxlkv_platform::kv::Root { offset, size, tag })).or_raise(py)
    }

    /// `(offset, size, tag)` of root `name`; `NotFoundError` if absent.
    fn root_get(&self, py: Python<'_>, name: &str) -> PyResult<(u64, u64, u32)> {
        let (name, c) = (crate::shm::root_name(py, name)?, self.attached(py)?);
        Ok(crate::shm::root_tuple(py.detach(|| c.root(&name)).or_raise(py)?))
    }

    /// Removes root `name` (what it names stays allocated); returns what it
    /// named.
    fn root_destroy(&self, py: Python<'_>, name: &str) -> PyResult<(u64, u64, u32)> {
        let (name, c) = (crate::shm::root_name(py, name)?, self.attached(py)?);
        Ok(crate::shm::root_tuple(py.detach(|| c.core().root_destroy(&name)).or_raise(py)?))
    }

    /// Removes root `name` and frees the allocation it names, in one step;
    /// returns what it named.
    fn root_free(&self, py: Python<'_>, name: &str) -> PyResult<(u64, u64, u32)> {
        let (name, c) = (crate::shm::root_name(py, name)?, self.attached(py)?);
        Ok(crate::shm::root_tuple(py.detach(|| c.core().root_free(&name)).or_raise(py)?))
    }

    /// `length` bytes of the payload area at `offset`, read fresh (this
    /// host's cached copies dropped first). `RegionError` (OUT_OF_BOUNDS)
    /// outside the payload area.
    fn read_range<'py>(&self, py: Python<'py>, offset: u64, length: usize) -> PyResult<Bound<'py, PyBytes>> {
        let c = self.attached(py)?;
        crate::shm::read(py, &c, offset, length)
    }

    /// Copies `data` into the payload area at `offset` and publishes it to
    /// every host (written back and fenced before this returns).
    fn write_range(&self, py: Python<'_>, offset: u64, data: &[u8]) -> PyResult<()> {
        let c = self.attached(py)?;
        py.detach(|| c.write_range(offset, data)).or_raise(py)
    }

    /// Publishes `length` bytes at `offset` written by other means (a
    /// memoryview, a GPU copy) to every host.
    fn flush_range(&self, py: Python<'_>, offset: u64, length: u64) -> PyResult<()> {
        let c = self.attached(py)?;
        py.detach(|| c.flush_range(offset, length)).or_raise(py)
    }

    /// Drops this host's cached copies of `length` bytes at `offset`, so the
    /// next reads see what other hosts published.
    fn invalidate_range(&self, py: Python<'_>, offset: u64, length: u64) -> PyResult<()> {
        let c = self.attached(py)?;
        py.detach(|| c.invalidate_range(offset, length)).or_raise(py)
    }

    /// Allocates an application lock (an inter-node lock for structures of
    /// the application's own); returns its number. `CapacityError` when all
    /// are allocated.
    fn lock_alloc(&self, py: Python<'_>) -> PyResult<u32> {
        let c = self.attached(py)?;
        py.detach(|| c.core().lock_alloc()).or_raise(py)
    }

    /// Frees application lock `number` (once no node holds or will take it).
    fn lock_free(&self, py: Python<'_>, number: u32) -> PyResult<()> {
        let c = self.attached(py)?;
        py.detach(|| c.core().lock_free(number)).or_raise(py)
    }

    /// Takes application lock `number`, waiting up to the node's lock
    /// timeout (`TimedOutError`); returns it held (an `AppLock`: release it,
    /// or use it in a `with` block). Held by this thread; not recursive
    /// (`BusyError` when this thread holds it). Taking it fences: what this
    /// thread flushed before is in memory first.
    fn lock(&self, py: Python<'_>, number: u32) -> PyResult<crate::shm::AppLock> {
        crate::shm::AppLock::take(py, self.attached(py)?, number)
    }

    /// Starts this host's SSD tier on this node (which it then keeps to
    /// itself: its inbox serves the rack's requests): slot files of
    /// `capacity` bytes in each of `dirs` (one per drive, on a real disk
    /// file system), holding blocks up to `slot_bytes`; cold blocks are
    /// copied out, `batch` at a time, once the region is `high_water` full.
    /// Options (keywords named as `TierOptions::FIELDS` lists them) left out
    /// keep their defaults; an unknown one, or a value it cannot take, is an
    /// `InvalidArgumentError`.
    #[pyo3(signature = (dirs, **options))]
    fn start_tier(
        &self,
        py: Python<'_>,
        dirs: Vec<PathBuf>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<crate::tier::Tier> {
        let c = self.attached(py)?;
        let opts = crate::tier::options(py, dirs, options)?;
        let t = py.detach(|| cxlkv_platform::Tier::start(c, opts)).or_raise(py)?;
        Ok(crate::tier::Tier::new(t))
    }

    /// Publishes the whole region's block events to KV-aware routers from
    /// a thread of this process: vLLM `KVEventBatch`es on a ZMQ PUB socket
    /// bound at `endpoint` (`tcp://HOST:PORT`, port 0 takes a free one), and
    /// vLLM's replay socket at `replay` if given. `hash` is 'int' (vLLM's
    /// integer block hash: the key's last 8 bytes, big-endian) or 'bytes'
    /// (the key's 16 bytes); `namespaces` limits the events to those
    /// namespaces' blocks. One publisher per region is enough for a rack.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (endpoint="tcp://127.0.0.1:5557".to_string(), *, replay=None, topic=String::new(), medium="CXL".to_string(), hash="int".to_string(), namespaces=None, dp_rank=None, buffer=10_000))]
    fn publish_events(
        &self,
        py: Python<'_>,
        endpoint: String,
        replay: Option<String>,
        topic: String,
        medium: String,
        hash: String,
        namespaces: Option<Vec<Bound<'_, PyAny>>>,
        dp_rank: Option<i64>,
        buffer: usize,
    ) -> PyResult<crate::events::EventPublisher> {
        let c = self.attached(py)?;
        let ns = namespaces.unwrap_or_default().iter().map(|n| self.ns(py, n)).collect::<PyResult<Vec<u32>>>()?;
        let opts = crate::events::options(py, endpoint, replay, topic, medium, &hash, ns, dp_rank, buffer)?;
        let p = py.detach(|| cxlkv_platform::publish::Publisher::attached(c, opts)).or_raise(py)?;
        Ok(crate::events::EventPublisher::new(p))
    }

    /// A cursor over the region's change log from now on: its `poll`
    /// returns the stores and removals any node makes afterwards (see
    /// `ChangeCursor`).
    fn change_cursor(&self, py: Python<'_>) -> PyResult<crate::events::ChangeCursor> {
        let c = self.attached(py)?;
        let cursor = py.detach(|| cxlkv_platform::events::ChangeCursor::at_head(c.store())).or_raise(py)?;
        Ok(crate::events::ChangeCursor::new(Arc::downgrade(&c), cursor))
    }

    /// This node's id (its slot in the node table).
    #[getter]
    fn id(&self, py: Python<'_>) -> PyResult<u32> {
        Ok(self.attached(py)?.id())
    }

    /// The id of namespace `ns` (a `cxlkv.Namespace`) in this region,
    /// registered on first use: every node passing equal fields gets the
    /// same id, fields that differ in anything never share one (the region
    /// keeps each namespace's 128-bit digest). Each namespace takes one
    /// record of the root table (`CapacityError` when none is left). Every
    /// call taking a namespace accepts the `Namespace` itself and does this;
    /// an int is an id as is (below 2**31: a number the application picks).
    ///
    /// With `tenant` (a tenant's name; or the `Namespace`'s own `tenant`),
    /// the namespace of that tenant: the same fields in another tenant are
    /// another namespace (tenants never share a block), and its blocks count
    /// to the tenant's usage and quota.
    #[pyo3(signature = (ns, tenant=None))]
    fn namespace(&self, py: Python<'_>, ns: &Bound<'_, PyAny>, tenant: Option<&str>) -> PyResult<u32> {
        if tenant.is_none() {
            return self.ns(py, ns);
        }
        let c = self.attached(py)?;
        crate::ns_of(py, Some(&c), ns, tenant)
    }

    // -- tenants (see `tenants.rs`) ------------------------------------------

    /// Adds tenant `name` (1 to 20 bytes) with a hard `quota` and a
    /// guaranteed `share` in payload bytes (0: none), a `priority`, a
    /// lifetime `ttl_ms` for its blocks (0: none) and `scrub` (its blocks
    /// zeroed when reserved). `ExistsError` when a tenant of that name
    /// lives, `CapacityError` when every slot (the `max_tenants` capacity)
    /// is taken.
    #[pyo3(signature = (name, quota=0, share=0, priority=0, ttl_ms=0, scrub=false))]
    #[allow(clippy::too_many_arguments)]
    fn tenant_add(
        &self,
        py: Python<'_>,
        name: &str,
        quota: u64,
        share: u64,
        priority: u32,
        ttl_ms: u64,
        scrub: bool,
    ) -> PyResult<()> {
        let c = self.attached(py)?;
        let l = crate::tenants::limits(quota, share, priority, ttl_ms, scrub);
        py.detach(|| c.tenant_add(name.as_bytes(), l)).or_raise(py).map(|_| ())
    }

    /// Changes a live tenant's limits (every node follows at once; a new
    /// lifetime applies to blocks stored from then on).
    #[pyo3(signature = (name, quota=0, share=0, priority=0, ttl_ms=0, scrub=false))]
    #[allow(clippy::too_many_arguments)]
    fn tenant_set(
        &self,
        py: Python<'_>,
        name: &str,
        quota: u64,
        share: u64,
        priority: u32,
        ttl_ms: u64,
        scrub: bool,
    ) -> PyResult<()> {
        let c = self.attached(py)?;
        let t = crate::tenants::find(py, &c, name)?;
        let l = crate::tenants::limits(quota, share, priority, ttl_ms, scrub);
        py.detach(|| c.tenant_set(t, l)).or_raise(py)
    }

    /// Every tenant (the default one first) as a dict: name, quota, share,
    /// priority, ttl_ms, bytes, blocks, evictions, expired, refused,
    /// dropping.
    fn tenants<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let c = self.attached(py)?;
        let list = py.detach(|| c.tenant_list()).or_raise(py)?;
        list.iter().map(|t| crate::tenants::info(py, t)).collect()
    }

    /// Drops tenant `name`: its blocks are removed and its slot freed;
    /// returns `(blocks, bytes)` removed. `BusyError` while blocks of it are
    /// pinned or being written (it takes no new block meanwhile: call again
    /// once they are released).
    fn tenant_drop(&self, py: Python<'_>, name: &str) -> PyResult<(u64, u64)> {
        let c = self.attached(py)?;
        let t = crate::tenants::find(py, &c, name)?;
        let r = py.detach(|| c.tenant_drop(t)).or_raise(py)?;
        Ok((r.blocks, r.bytes))
    }

    /// True once detached.
    #[getter]
    fn closed(&self) -> bool {
        self.attached.read().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// Length of the longest prefix of `keys` whose blocks are stored.
    fn lookup(&self, py: Python<'_>, ns: &Bound<'_, PyAny>, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        let (ns, keys, c) = (self.ns(py, ns)?, keys_of(keys)?, self.attached(py)?);
        py.detach(|| c.core().lookup(ns, &keys)).or_raise(py)
    }

    /// The longest cached prefix and whether each key is stored.
    fn presence(&self, py: Python<'_>, ns: &Bound<'_, PyAny>, keys: &Bound<'_, PyAny>) -> PyResult<(usize, Vec<bool>)> {
        let (ns, keys, c) = (self.ns(py, ns)?, keys_of(keys)?, self.attached(py)?);
        let mut here = vec![false; keys.len()];
        let p = py.detach(|| c.core().presence(ns, &keys, &mut here)).or_raise(py)?;
        Ok((p, here))
    }

    /// Whether `key` is stored.
    fn exists(&self, py: Python<'_>, ns: &Bound<'_, PyAny>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let (ns, key, c) = (self.ns(py, ns)?, key_of(key)?, self.attached(py)?);
        py.detach(|| c.exists(ns, key)).or_raise(py)
    }

    /// Pins the stored blocks of `keys` for zero-copy reads: a `Pinned`
    /// whose item `i` is a read-only memoryview of key `i`'s payload, or
    /// None when it is not stored (any other failure of a key raises, and
    /// nothing stays pinned). Release it (or leave its `with` block)
    /// when done; the views then raise on use.
    fn acquire(&self, py: Python<'_>, ns: &Bound<'_, PyAny>, keys: &Bound<'_, PyAny>) -> PyResult<Pinned> {
        let (ns, keys, c) = (self.ns(py, ns)?, keys_of(keys)?, self.attached(py)?);
        let hs = py.detach(|| c.acquire_found(ns, &keys)).or_raise(py)?;
        Pinned::new(py, c, hs)
    }

    /// Reserves writable blocks: `sizes` is one size for every key or one per
    /// key. Raises `ExistsError` (or the first other failure) naming the key
    /// when any cannot be reserved, reserving none. A `Reservation`: fill its
    /// writable memoryviews, then `publish()` (or leave its `with` block
    /// without an exception); an exception aborts.
    #[pyo3(signature = (ns, keys, sizes, tokens=0))]
    fn reserve(
        &self,
        py: Python<'_>,
        ns: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        tokens: u32,
    ) -> PyResult<Reservation> {
        let (ns, keys, c) = (self.ns(py, ns)?, keys_of(keys)?, self.attached(py)?);
        let sizes: Vec<u64> = match sizes.extract::<u64>() {
            Ok(one) => vec![one; keys.len()],
            Err(_) => sizes.extract()?,
        };
        if sizes.len() != keys.len() {
            return Err(raise(py, R::InvalidArgument, "one size, or one size per key"));
        }
        let items: Vec<ReserveItem> =
            keys.iter().zip(&sizes).map(|(k, l)| ReserveItem { key: *k, len: *l, tokens }).collect();
        match py.detach(|| c.reserve_all(ns, &items)) {
            Ok(hs) => Reservation::new(py, c, hs.into_iter().map(Some).collect()),
            Err(ReserveRefused { index: Some(i), error }) => {
                let k = u128::from_le_bytes(keys[i].to_bytes());
                Err(raise(py, R::of(&error), &format!("key {i} ({k:#034x}): {error}")))
            }
            Err(ReserveRefused { index: None, error }) => Err(crate::err(py, error)),
        }
    }

    /// Stores blocks by copying: `items` are `(key, payload)` where payload is
    /// a buffer or a sequence of buffers (K and V, per layer) stored one after
    /// the other. Returns a `Result` per item: `OK`, `EXISTS` (stored
    /// already; nothing written), or why it failed.
    #[pyo3(signature = (ns, items, tokens=0))]
    fn put<'py>(
        &self,
        py: Python<'py>,
        ns: &Bound<'py, PyAny>,
        items: &Bound<'py, PyAny>,
        tokens: u32,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let ns = self.ns(py, ns)?;
        let (keys, bufs) = items_of(items, false)?;
        let c = self.attached(py)?;
        let parts: Vec<Vec<&[u8]>> = bufs.iter().map(Buffers::slices).collect();
        let put: Vec<PutItem<'_>> =
            keys.iter().zip(&parts).map(|(k, p)| PutItem { key: *k, tokens, parts: p }).collect();
        let mut out = vec![Ok(()); put.len()];
        py.detach(|| c.put(ns, &put, &mut out)).or_raise(py)?;
        out.iter().map(|r| blocks::result(py, r)).collect()
    }

    /// Stores route records: what a KV-aware router needs of blocks beyond
    /// their keys, read by the event publisher (`publish_events`) when it
    /// sees the blocks stored. `items` are `(key, token_ids, parent_key or
    /// None)` of namespace `ns`'s blocks, `block_size` tokens per block.
    /// Store the records before the blocks. Returns a `Result` per item:
    /// `OK`, `EXISTS` (a record is stored already), or why it failed.
    #[pyo3(signature = (ns, items, block_size, *, lora_id=None))]
    fn put_routes<'py>(
        &self,
        py: Python<'py>,
        ns: &Bound<'py, PyAny>,
        items: &Bound<'py, PyAny>,
        block_size: u32,
        lora_id: Option<i64>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let ns = self.ns(py, ns)?;
        let mut routes = Vec::new();
        for it in items.try_iter()? {
            let (k, tokens, parent): (Bound<'py, PyAny>, Vec<u32>, Option<Bound<'py, PyAny>>) = it?.extract()?;
            let parent = parent.map(|p| key_of(&p)).transpose()?;
            routes.push((key_of(&k)?, cxlkv_platform::route::Route { parent, block_size, tokens, lora_id }));
        }
        let c = self.attached(py)?;
        let mut out = vec![Ok(()); routes.len()];
        py.detach(|| c.put_routes(ns, &routes, &mut out)).or_raise(py)?;
        out.iter().map(|r| blocks::result(py, r)).collect()
    }

    /// The route record of block `key` of namespace `ns` as `(token_ids,
    /// parent_key or None, block_size, lora_id or None)`, or None when none
    /// is stored.
    #[allow(clippy::type_complexity)]
    fn route<'py>(
        &self,
        py: Python<'py>,
        ns: &Bound<'py, PyAny>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<(Vec<u32>, Option<Bound<'py, pyo3::types::PyBytes>>, u32, Option<i64>)>> {
        let (ns, key, c) = (self.ns(py, ns)?, key_of(key)?, self.attached(py)?);
        let r = py.detach(|| c.route(ns, key)).or_raise(py)?;
        Ok(r.map(|r| {
            (r.tokens, r.parent.map(|p| pyo3::types::PyBytes::new(py, &p.to_bytes())), r.block_size, r.lora_id)
        }))
    }

    /// Copies stored blocks into existing writable buffers: `items` are
    /// `(key, buffer)` or `(key, [buffers])`, filled in order. Returns
    /// `(Result, length)` per item: `OK` (the first `length` bytes are
    /// filled), `NOT_FOUND`, or `TOO_LARGE` when the buffers are shorter than
    /// the payload (`length` says what is needed; nothing copied).
    fn get<'py>(
        &self,
        py: Python<'py>,
        ns: &Bound<'py, PyAny>,
        items: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<(Bound<'py, PyAny>, u64)>> {
        let ns = self.ns(py, ns)?;
        let (keys, mut bufs) = items_of(items, true)?;
        Buffers::disjoint(py, &bufs)?;
        let c = self.attached(py)?;
        let mut parts: Vec<Vec<&mut [u8]>> = bufs.iter_mut().map(Buffers::slices_mut).collect();
        let mut get: Vec<GetItem<'_, '_>> =
            keys.iter().zip(parts.iter_mut()).map(|(k, p)| GetItem { key: *k, parts: p }).collect();
        let mut lens = vec![0u64; get.len()];
        let mut out = vec![Ok(()); get.len()];
        py.detach(|| c.get(ns, &mut get, &mut lens, &mut out)).or_raise(py)?;
        out.iter().zip(lens).map(|(r, l)| Ok((blocks::result(py, r)?, l))).collect()
    }

    /// Removes the stored blocks of `keys`; per key, whether it was removed
    /// (False: not stored, or pinned: a pinned block stays until released).
    /// It walks every stripe (an eviction that picks these keys): for the
    /// occasional delete, not the data path.
    fn remove(&self, py: Python<'_>, ns: &Bound<'_, PyAny>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
        let (ns, keys, c) = (self.ns(py, ns)?, keys_of(keys)?, self.attached(py)?);
        py.detach(|| c.remove(ns, &keys)).or_raise(py)
    }

    /// Removes every stored block of `namespaces` that nothing pins (other
    /// namespaces' blocks stay); returns `(blocks, bytes)` freed. It walks
    /// every stripe: an engine's clear, not the data path.
    fn clear_namespaces(&self, py: Python<'_>, namespaces: &Bound<'_, PyAny>) -> PyResult<(u64, u64)> {
        let ns = namespaces.try_iter()?.map(|n| self.ns(py, &n?)).collect::<PyResult<Vec<u32>>>()?;
        let c = self.attached(py)?;
        py.detach(|| c.clear_namespaces(&ns)).or_raise(py)
    }

    /// Evicts least-recently-used unpinned blocks until `nbytes` of payload
    /// are freed or none is left; returns `(blocks, bytes)` freed.
    fn evict(&self, py: Python<'_>, nbytes: u64) -> PyResult<(u64, u64)> {
        let c = self.attached(py)?;
        let r = py.detach(|| c.core().evict(nbytes, &mut Lru)).or_raise(py)?;
        Ok((r.entries, r.bytes))
    }

    /// Counters of this node (`node_*`) and of every node (`total_*`),
    /// liveness masks and occupancy, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.attached(py)?;
        let s = py.detach(|| c.stats()).or_raise(py)?;
        let d = report(
            py,
            &[
                ("alive_mask", s.alive),
                ("dead_mask", s.dead),
                ("live_blocks", s.live_entries),
                ("live_bytes", s.live_bytes),
                ("capacity_bytes", s.payload_bytes),
            ],
        )?;
        // The counters of core's table (`NodeStats::COUNTERS`), by name.
        for (prefix, n) in [("node", s.node), ("total", s.total)] {
            for (k, v) in n.counters() {
                d.set_item(format!("{prefix}_{k}"), v)?;
            }
        }
        Ok(d)
    }

    /// Recovers the region after nodes died (normally automatic); returns
    /// what it did as a dict.
    fn recover<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.attached(py)?;
        let r = py.detach(|| c.recover()).or_raise(py)?;
        report(
            py,
            &[
                ("nodes_freed", r.nodes_freed),
                ("pins_dropped", r.pins_dropped),
                ("writes_aborted", r.writes_aborted),
                ("entries_dropped", r.entries_dropped),
                ("blocks_reclaimed", r.blocks_reclaimed),
                ("chunks_reclaimed", r.chunks_reclaimed),
                ("locks_repaired", r.locks_repaired as u64),
                ("writes_quarantined", r.writes_quarantined),
                ("nodes_fenced", r.nodes_fenced),
            ],
        )
    }

    /// An operator's word that node `n`, declared dead, will never store
    /// again (its host is powered off, or was rebooted since): the next
    /// recovery frees the reservations and raw blocks kept quarantined for
    /// it. Never say it of a host that may only be stopped. True when said
    /// now; False when `n` is not dead or is quiet already.
    fn declare_quiet(&self, py: Python<'_>, n: u32) -> PyResult<bool> {
        let c = self.attached(py)?;
        py.detach(|| c.declare_quiet(n)).or_raise(py)
    }

    /// Every invariant of the region, checked: a list of findings (empty
    /// when clean).
    fn check(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let c = self.attached(py)?;
        let f = py.detach(|| c.check()).or_raise(py)?;
        Ok(f.iter().map(|x| x.to_string()).collect())
    }

    /// Sends a message of `kind` with `keys` to node `to`'s inbox, waiting
    /// (up to the lock timeout) while it is full. `InvalidArgumentError`
    /// (`BAD_NODE`) when `to` is not attached.
    #[pyo3(signature = (to, kind, keys=None, *, ns=None, status=0, stamp=0))]
    #[allow(clippy::too_many_arguments)]
    fn send(
        &self,
        py: Python<'_>,
        to: u32,
        kind: u32,
        keys: Option<&Bound<'_, PyAny>>,
        ns: Option<&Bound<'_, PyAny>>,
        status: u32,
        stamp: u64,
    ) -> PyResult<()> {
        let keys = keys.map(keys_of).transpose()?.unwrap_or_default();
        let ns = ns.map(|n| self.ns(py, n)).transpose()?.unwrap_or(0);
        let m = outgoing(py, kind, ns, status, stamp, keys.len())?;
        let c = self.attached(py)?;
        py.detach(|| c.send(to, &m, &keys)).or_raise(py)
    }

    /// The next message of this node's inbox, or None when none is there.
    fn try_recv(&self, py: Python<'_>) -> PyResult<Option<Message>> {
        let c = self.attached(py)?;
        Ok(py.detach(|| c.try_recv()).or_raise(py)?.map(Message::of))
    }

    /// Waits up to `timeout_ms` for the next message; `TimedOutError` when
    /// none came.
    fn recv(&self, py: Python<'_>, timeout_ms: u64) -> PyResult<Message> {
        let c = self.attached(py)?;
        let t = Duration::from_millis(timeout_ms);
        Ok(Message::of(py.detach(|| c.recv(t)).or_raise(py)?))
    }

    /// A request/response round trip: sends a message of `kind` to node `to`
    /// and waits up to `timeout_ms` for the answer its owner gives with
    /// `reply`. Messages arriving meanwhile stay queued for `recv`.
    #[pyo3(signature = (to, kind, keys=None, *, ns=None, status=0, stamp=0, timeout_ms=1000))]
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        py: Python<'_>,
        to: u32,
        kind: u32,
        keys: Option<&Bound<'_, PyAny>>,
        ns: Option<&Bound<'_, PyAny>>,
        status: u32,
        stamp: u64,
        timeout_ms: u64,
    ) -> PyResult<Message> {
        let keys = keys.map(keys_of).transpose()?.unwrap_or_default();
        let ns = ns.map(|n| self.ns(py, n)).transpose()?.unwrap_or(0);
        let m = outgoing(py, kind, ns, status, stamp, keys.len())?;
        let c = self.attached(py)?;
        let t = Duration::from_millis(timeout_ms);
        Ok(Message::of(py.detach(|| c.call(to, &m, &keys, t)).or_raise(py)?))
    }

    /// Answers `request` (a message `recv` returned) with `status` and
    /// `keys`.
    #[pyo3(signature = (request, status, keys=None))]
    fn reply(&self, py: Python<'_>, request: &Message, status: u32, keys: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let keys = keys.map(keys_of).transpose()?.unwrap_or_default();
        let req = Msg {
            kind: request.kind,
            request_id: request.request_id,
            ns: request.ns,
            status: request.status,
            stamp: request.stamp,
            from: request.sender,
            n_keys: 0,
        };
        let c = self.attached(py)?;
        py.detach(|| c.reply(&req, status, &keys)).or_raise(py)
    }

    /// Registers the region with the CUDA driver for `device` (its primary
    /// context, the one the CUDA runtime and torch use). `CudaError` without
    /// a driver or device. Registering again for the same device does
    /// nothing.
    #[pyo3(signature = (device=0))]
    fn cuda_register(&self, py: Python<'_>, device: u32) -> PyResult<()> {
        let c = self.attached(py)?;
        py.detach(|| c.register_cuda(device).map(|_| ())).or_raise(py)
    }

    /// What the GPU path registered and moved, as a dict.
    fn cuda_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.attached(py)?;
        let s = c.cuda().or_raise(py)?.stats();
        let d = report(
            py,
            &[
                ("device", s.device as u64),
                ("registered_bytes", s.registered_bytes),
                ("bytes_to_device", s.bytes_to_device),
                ("bytes_to_region", s.bytes_to_region),
                ("copies", s.copies),
                ("launches", s.launches),
            ],
        )?;
        d.set_item("name", s.name)?;
        Ok(d)
    }

    /// Gathers region pieces into device memory, one kernel launch per 128
    /// `(region_offset, device_ptr, length)` segments, on `stream`.
    #[pyo3(signature = (segments, stream=0))]
    fn cuda_gather(&self, py: Python<'_>, segments: Vec<(u64, u64, u64)>, stream: usize) -> PyResult<()> {
        self.segments(py, segments, stream, |p, s, st| p.gather(s, st))
    }

    /// Scatters device pieces into reserved blocks, one kernel launch per 128
    /// `(region_offset, device_ptr, length)` segments, on `stream`.
    #[pyo3(signature = (segments, stream=0))]
    fn cuda_scatter(&self, py: Python<'_>, segments: Vec<(u64, u64, u64)>, stream: usize) -> PyResult<()> {
        self.segments(py, segments, stream, |p, s, st| p.scatter(s, st))
    }

    /// Waits until everything queued on CUDA stream `stream` completed.
    #[pyo3(signature = (stream=0))]
    fn cuda_synchronize(&self, py: Python<'_>, stream: usize) -> PyResult<()> {
        let c = self.attached(py)?;
        py.detach(|| c.cuda()?.synchronize(stream)).or_raise(py)
    }

    /// Detaches: drops this node's pins and reservations and frees its slot.
    /// `BusyError` while a `Pinned` or `Reservation` of it is unreleased.
    /// Detaching twice does nothing.
    fn detach(&self, py: Python<'_>) -> PyResult<()> {
        let mut g = self.attached.write().unwrap_or_else(|e| e.into_inner());
        let Some(arc) = g.take() else { return Ok(()) };
        match Arc::try_unwrap(arc) {
            Ok(attached) => {
                drop(g);
                py.detach(|| attached.close()).or_raise(py)
            }
            Err(arc) => {
                *g = Some(arc);
                Err(raise(py, R::Busy, "release the node's pinned and reserved blocks first"))
            }
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.detach(py)?;
        Ok(false)
    }
}
