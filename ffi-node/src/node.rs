//! Attached nodes: every cache call.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cxlkv_platform::kv::{CoreResult, EvictReport, Handle, Key, Lru, NodeStats, RecoverReport, ReserveItem};
use cxlkv_platform::{Code, GetItem, Node as Attached, PutItem, ReserveRefused};
use napi::bindgen_prelude::{AsyncTask, BigInt, Object};
use napi::{Env, Unknown, ValueType};
use napi_derive::napi;

use crate::args::{
    self, absent, disjoint, elements, key_of, keys_of, ns_of, parts_of, u32_of, u64_of, At, Bytes, Opts,
};
use crate::blocks::{Pinned, Reservation};
use crate::error::{coded, item, range_error, Failure, OrThrow};
use crate::message::{message_of, outgoing, to_js, Message, Received};
use crate::tasks::{waiting, Held, Job, Pending};

/// Per item of a `put`: its result.
type Stored = Vec<CoreResult<()>>;
/// Per item of a `get`: its result and the payload's length.
type Fetched = Vec<(CoreResult<()>, u64)>;

/// Whether each key is stored, and the longest stored prefix.
#[napi(object)]
pub struct Presence {
    /// Length of the longest prefix of the keys whose blocks are stored.
    pub prefix: u32,
    /// Per key: stored or not.
    pub present: Vec<bool>,
}

/// The outcome of one item of a `get`.
#[napi(object)]
pub struct GetResult {
    /// `"OK"` (the first `length` bytes were filled), `"NOT_FOUND"`, or
    /// `"TOO_LARGE"` (the buffers are shorter than the payload: `length`
    /// says what is needed; nothing was copied).
    pub result: String,
    /// The payload's length in bytes.
    pub length: f64,
}

/// What `evict` freed.
#[napi(object)]
pub struct Evicted {
    /// Blocks evicted.
    pub blocks: f64,
    /// Their payload bytes.
    pub bytes: f64,
}

/// One node's counters (or every node's, summed).
#[napi(object)]
pub struct NodeCounters {
    /// Keys found by gets and acquires.
    pub hits: f64,
    /// Keys not found.
    pub misses: f64,
    /// Blocks published.
    pub inserts: f64,
    /// Stores refused because the key was stored already.
    pub exists: f64,
    /// Blocks this node evicted.
    pub evictions: f64,
    /// Payload bytes written.
    pub bytes_written: f64,
    /// Payload bytes read.
    pub bytes_read: f64,
    /// Blocks asked of an SSD tier that did not come back within the wait.
    pub tier_timeouts: f64,
}

fn evicted(r: EvictReport) -> Evicted {
    Evicted { blocks: r.entries as f64, bytes: r.bytes as f64 }
}

/// `NodeCounters` from core's counter table: a counter added there does not
/// compile here until it is added to the typed object too.
fn counters(n: NodeStats) -> NodeCounters {
    let [hits, misses, inserts, exists, evictions, bytes_written, bytes_read, tier_timeouts] =
        n.values().map(|v| v as f64);
    NodeCounters { hits, misses, inserts, exists, evictions, bytes_written, bytes_read, tier_timeouts }
}

/// A snapshot of a node's and its region's counters.
#[napi(object)]
pub struct Stats {
    /// This node's counters.
    pub node: NodeCounters,
    /// Every attached or dead node's counters, summed.
    pub total: NodeCounters,
    /// Attached nodes, a bit per node id.
    pub alive_mask: BigInt,
    /// Nodes declared dead whose recovery is pending.
    pub dead_mask: BigInt,
    /// Published blocks.
    pub live_blocks: f64,
    /// Their payload bytes.
    pub live_bytes: f64,
    /// Payload capacity of the region.
    pub capacity_bytes: f64,
    /// Blocks evicted since the region was formatted, by any node.
    pub evictions: f64,
}

/// What a recovery did.
#[napi(object)]
pub struct Recovered {
    /// Dead nodes whose slots were freed.
    pub nodes_freed: f64,
    /// Pins of dead nodes dropped.
    pub pins_dropped: f64,
    /// Unpublished writes of dead nodes aborted.
    pub writes_aborted: f64,
    /// Index entries dropped.
    pub entries_dropped: f64,
    /// Blocks whose space was reclaimed.
    pub blocks_reclaimed: f64,
    /// Allocator chunks reclaimed.
    pub chunks_reclaimed: f64,
    /// Locks repaired.
    pub locks_repaired: f64,
    /// Unpublished writes of dead nodes not known quiet, kept allocated
    /// until they are.
    pub writes_quarantined: f64,
    /// Dead nodes not known quiet, fenced rather than freed.
    pub nodes_fenced: f64,
}

fn timeout_of(env: &Env, v: &Unknown<'_>) -> napi::Result<Duration> {
    Ok(Duration::from_millis(u64_of(env, v, "timeoutMs")?))
}

/// The buffers of a `put` or `get`: per item, its ranges; and the values,
/// held for an async call.
struct Items {
    keys: Vec<Key>,
    ranges: Vec<Vec<Bytes>>,
}

// SAFETY: the ranges point into JavaScript buffers that the call holds (a
// sync call by running, an async one by strong references until it
// settled); only the one thread running the copy touches them.
unsafe impl Send for Items {}

fn items_of(env: &Env, keys: &Unknown<'_>, data: &Unknown<'_>, held: Option<&mut Held>) -> napi::Result<Items> {
    let keys = keys_of(env, keys, "keys")?;
    let data = elements(env, data, "buffers")?;
    if data.len() != keys.len() {
        return Err(range_error(env, &format!("{} keys but {} buffers", keys.len(), data.len())));
    }
    let mut ranges = Vec::with_capacity(data.len());
    let mut held = held;
    for (i, d) in data.iter().enumerate() {
        ranges.push(parts_of(env, d, At("buffers", i), held.as_deref_mut())?);
    }
    Ok(Items { keys, ranges })
}

impl Items {
    /// Copies the items' bytes into the region.
    fn put(self, c: &Attached, ns: u32, tokens: u32) -> Result<Stored, Failure> {
        // SAFETY: the buffers are held (see `Items`) and JavaScript does not
        // write them during the call.
        let parts: Vec<Vec<&[u8]>> =
            self.ranges.iter().map(|r| r.iter().map(|b| unsafe { b.slice() }).collect()).collect();
        let put: Vec<PutItem<'_>> =
            self.keys.iter().zip(&parts).map(|(k, p)| PutItem { key: *k, tokens, parts: p }).collect();
        let mut out = vec![Ok(()); put.len()];
        c.put(ns, &put, &mut out)?;
        Ok(out)
    }

    /// Copies stored blocks into the items' buffers (checked disjoint).
    fn get(self, c: &Attached, ns: u32) -> Result<Fetched, Failure> {
        // SAFETY: the buffers are held (see `Items`), checked disjoint by the
        // caller, and JavaScript does not touch them during the call.
        let mut parts: Vec<Vec<&mut [u8]>> =
            self.ranges.iter().map(|r| r.iter().map(|b| unsafe { b.slice_mut() }).collect()).collect();
        let mut get: Vec<GetItem<'_, '_>> =
            self.keys.iter().zip(parts.iter_mut()).map(|(k, p)| GetItem { key: *k, parts: p }).collect();
        let mut lens = vec![0u64; get.len()];
        let mut out = vec![Ok(()); get.len()];
        c.get(ns, &mut get, &mut lens, &mut out)?;
        Ok(out.into_iter().zip(lens).collect())
    }

    fn check_disjoint(&self, env: &Env) -> napi::Result<()> {
        let all: Vec<Bytes> = self.ranges.iter().flatten().copied().collect();
        disjoint(env, &all)
    }
}

fn put_results(_: &Env, out: Stored) -> napi::Result<Vec<String>> {
    Ok(out.iter().map(item).collect())
}

fn get_results(_: &Env, out: Fetched) -> napi::Result<Vec<GetResult>> {
    Ok(out.iter().map(|(r, l)| GetResult { result: item(r), length: *l as f64 }).collect())
}

fn recovered(_: &Env, r: RecoverReport) -> napi::Result<Recovered> {
    Ok(Recovered {
        nodes_freed: r.nodes_freed as f64,
        pins_dropped: r.pins_dropped as f64,
        writes_aborted: r.writes_aborted as f64,
        entries_dropped: r.entries_dropped as f64,
        blocks_reclaimed: r.blocks_reclaimed as f64,
        chunks_reclaimed: r.chunks_reclaimed as f64,
        locks_repaired: f64::from(r.locks_repaired),
        writes_quarantined: r.writes_quarantined as f64,
        nodes_fenced: r.nodes_fenced as f64,
    })
}

fn findings(_: &Env, f: Vec<String>) -> napi::Result<Vec<String>> {
    Ok(f)
}

fn received(_: &Env, m: Received) -> napi::Result<Message> {
    Ok(to_js(m))
}

/// Blocks an async acquire or reserve made: the node, the keys, a handle
/// per key.
type Batch<H> = (Arc<Attached>, Vec<Key>, Vec<H>);

/// Pins the stored blocks of `keys`.
fn acquired(c: &Attached, ns: u32, keys: &[Key]) -> Result<Vec<Option<Handle>>, Failure> {
    Ok(c.acquire_found(ns, keys)?)
}

/// The namespace, keys and items of a `reserve`.
fn reserve_items(
    env: &Env,
    ns: &Unknown<'_>,
    keys: &Unknown<'_>,
    sizes: &Unknown<'_>,
    tokens: &Unknown<'_>,
) -> napi::Result<(u32, Vec<Key>, Vec<ReserveItem>)> {
    let (ns, keys) = (ns_of(env, ns)?, keys_of(env, keys, "keys")?);
    let tokens = if absent(tokens) { 0 } else { u32_of(env, tokens, "tokens")? };
    let sizes: Vec<u64> = if crate::js::is_array(env.raw(), napi::JsValue::raw(sizes))? {
        let s = elements(env, sizes, "sizes")?;
        s.iter().enumerate().map(|(i, x)| u64_of(env, x, At("sizes", i))).collect::<napi::Result<_>>()?
    } else {
        vec![u64_of(env, sizes, "sizes")?; keys.len()]
    };
    if sizes.len() != keys.len() {
        return Err(range_error(env, &format!("{} keys but {} sizes", keys.len(), sizes.len())));
    }
    let items = keys.iter().zip(&sizes).map(|(k, l)| ReserveItem { key: *k, len: *l, tokens }).collect();
    Ok((ns, keys, items))
}

/// Reserves every item or none; a refusal names the key.
fn reserved(c: &Attached, ns: u32, keys: &[Key], items: &[ReserveItem]) -> Result<Vec<Handle>, Failure> {
    c.reserve_all(ns, items).map_err(|r| match r {
        ReserveRefused { index: Some(i), error } => {
            let k = keys.get(i).map(|k| u128::from_le_bytes(k.to_bytes())).unwrap_or_default();
            Failure::Coded(Code::of(&error), format!("key {i} ({k:#034x}): {error}"))
        }
        ReserveRefused { index: None, error } => Failure::Platform(error),
    })
}

/// An attached node: every cache operation.
#[napi]
pub struct Node {
    node: Mutex<Option<Arc<Attached>>>,
}

impl Node {
    pub(crate) fn new(n: Attached) -> Node {
        Node { node: Mutex::new(Some(Arc::new(n))) }
    }

    pub(crate) fn attached(&self, env: &Env) -> napi::Result<Arc<Attached>> {
        let n = self.node.lock().unwrap_or_else(|e| e.into_inner()).clone();
        n.ok_or_else(|| coded(env, Code::InvalidHandle, "the node is detached"))
    }
}

#[napi]
impl Node {
    /// This node's id (its slot in the node table).
    #[napi(getter, catch_unwind)]
    pub fn id(&self, env: Env) -> napi::Result<u32> {
        Ok(self.attached(&env)?.id())
    }

    /// True once detached.
    #[napi(getter, catch_unwind)]
    pub fn closed(&self) -> bool {
        self.node.lock().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// The id of namespace `fields` in this region, registered on first
    /// use: every node passing equal fields gets the same id, fields that
    /// differ in anything never share one (the region keeps each
    /// namespace's 128-bit digest). Each namespace takes one record of the
    /// root table (`ROOTS_FULL` when none is left). A number is an id as is
    /// (below 2**31: one the application picks).
    #[napi(catch_unwind, ts_args_type = "fields: NamespaceFields | number")]
    pub fn namespace(&self, env: Env, fields: Unknown<'_>) -> napi::Result<u32> {
        if fields.get_type()? == ValueType::Number {
            return ns_of(&env, &fields);
        }
        let d = crate::Fields::of(&env, &fields)?.digest();
        self.attached(&env)?.namespace_of_digest(d).or_throw(&env)
    }

    /// Length of the longest prefix of `keys` whose blocks are stored.
    #[napi(catch_unwind, ts_args_type = "ns: number, keys: Keys")]
    pub fn lookup(&self, env: Env, ns: Unknown<'_>, keys: Unknown<'_>) -> napi::Result<u32> {
        let (ns, keys, c) = (ns_of(&env, &ns)?, keys_of(&env, &keys, "keys")?, self.attached(&env)?);
        Ok(c.core().lookup(ns, &keys).or_throw(&env)? as u32)
    }

    /// The longest stored prefix of `keys` and whether each key is stored.
    #[napi(catch_unwind, ts_args_type = "ns: number, keys: Keys")]
    pub fn presence(&self, env: Env, ns: Unknown<'_>, keys: Unknown<'_>) -> napi::Result<Presence> {
        let (ns, keys, c) = (ns_of(&env, &ns)?, keys_of(&env, &keys, "keys")?, self.attached(&env)?);
        let mut present = vec![false; keys.len()];
        let prefix = c.core().presence(ns, &keys, &mut present).or_throw(&env)?;
        Ok(Presence { prefix: prefix as u32, present })
    }

    /// Whether `key` is stored.
    #[napi(catch_unwind, ts_args_type = "ns: number, key: Key")]
    pub fn exists(&self, env: Env, ns: Unknown<'_>, key: Unknown<'_>) -> napi::Result<bool> {
        let (ns, key, c) = (ns_of(&env, &ns)?, key_of(&env, &key, "key")?, self.attached(&env)?);
        c.exists(ns, key).or_throw(&env)
    }

    /// Pins the stored blocks of `keys` for zero-copy reads: a `Pinned`
    /// whose `view(i)` is key `i`'s payload, or `null` when it is not
    /// stored (any other failure of a key throws, and nothing stays
    /// pinned). Release it when done.
    #[napi(catch_unwind, ts_args_type = "ns: number, keys: Keys")]
    pub fn acquire(&self, env: Env, ns: Unknown<'_>, keys: Unknown<'_>) -> napi::Result<Pinned> {
        let (ns, keys, c) = (ns_of(&env, &ns)?, keys_of(&env, &keys, "keys")?, self.attached(&env)?);
        let hs = acquired(&c, ns, &keys).map_err(|f| f.throw(&env))?;
        Pinned::new(&env, c, keys, hs)
    }

    /// `acquire` off the event loop.
    #[napi(catch_unwind, ts_args_type = "ns: number, keys: Keys", ts_return_type = "Promise<Pinned>")]
    pub fn acquire_async(
        &self,
        env: Env,
        ns: Unknown<'_>,
        keys: Unknown<'_>,
    ) -> napi::Result<Pending<Batch<Option<Handle>>, Pinned>> {
        let (ns, keys, c) = (ns_of(&env, &ns)?, keys_of(&env, &keys, "keys")?, self.attached(&env)?);
        let work = move || {
            let hs = acquired(&c, ns, &keys)?;
            Ok((c, keys, hs))
        };
        Ok(AsyncTask::new(Job::new(work, |env, (c, keys, hs)| Pinned::new(env, c, keys, hs))))
    }

    /// Reserves writable blocks: `sizes` is one size for every key or one
    /// per key. When any key cannot be reserved none is, and the error names
    /// the key (`EXISTS` when it is stored already). Fill the views, then
    /// `publish()` (or `abort()`).
    #[napi(catch_unwind, ts_args_type = "ns: number, keys: Keys, sizes: number | number[], tokens?: number")]
    pub fn reserve(
        &self,
        env: Env,
        ns: Unknown<'_>,
        keys: Unknown<'_>,
        sizes: Unknown<'_>,
        tokens: Unknown<'_>,
    ) -> napi::Result<Reservation> {
        let (ns, keys, items) = reserve_items(&env, &ns, &keys, &sizes, &tokens)?;
        let c = self.attached(&env)?;
        let hs = reserved(&c, ns, &keys, &items).map_err(|f| f.throw(&env))?;
        Reservation::new(&env, c, keys, hs)
    }

    /// `reserve` off the event loop.
    #[napi(
        catch_unwind,
        ts_args_type = "ns: number, keys: Keys, sizes: number | number[], tokens?: number",
        ts_return_type = "Promise<Reservation>"
    )]
    pub fn reserve_async(
        &self,
        env: Env,
        ns: Unknown<'_>,
        keys: Unknown<'_>,
        sizes: Unknown<'_>,
        tokens: Unknown<'_>,
    ) -> napi::Result<Pending<Batch<Handle>, Reservation>> {
        let (ns, keys, items) = reserve_items(&env, &ns, &keys, &sizes, &tokens)?;
        let c = self.attached(&env)?;
        let work = move || {
            let hs = reserved(&c, ns, &keys, &items)?;
            Ok((c, keys, hs))
        };
        Ok(AsyncTask::new(Job::new(work, |env, (c, keys, hs)| Reservation::new(env, c, keys, hs))))
    }

    /// Stores blocks by copying: `buffers[i]` (a buffer, or an array of
    /// buffers stored one after the other) becomes key `i`'s payload.
    /// Returns a result name per key: `"OK"`, `"EXISTS"` (stored already;
    /// nothing written), or why it failed.
    #[napi(catch_unwind, ts_args_type = "ns: number, keys: Keys, buffers: Array<Bytes | Bytes[]>, tokens?: number")]
    pub fn put(
        &self,
        env: Env,
        ns: Unknown<'_>,
        keys: Unknown<'_>,
        buffers: Unknown<'_>,
        tokens: Unknown<'_>,
    ) -> napi::Result<Vec<String>> {
        let ns = ns_of(&env, &ns)?;
        let tokens = if absent(&tokens) { 0 } else { u32_of(&env, &tokens, "tokens")? };
        let items = items_of(&env, &keys, &buffers, None)?;
        let c = self.attached(&env)?;
        let out = items.put(&c, ns, tokens).map_err(|f| f.throw(&env))?;
        put_results(&env, out)
    }

    /// `put` off the event loop. Leave the buffers alone until it settled.
    #[napi(
        catch_unwind,
        ts_args_type = "ns: number, keys: Keys, buffers: Array<Bytes | Bytes[]>, tokens?: number",
        ts_return_type = "Promise<string[]>"
    )]
    pub fn put_async(
        &self,
        env: Env,
        ns: Unknown<'_>,
        keys: Unknown<'_>,
        buffers: Unknown<'_>,
        tokens: Unknown<'_>,
    ) -> napi::Result<Pending<Stored, Vec<String>>> {
        let ns = ns_of(&env, &ns)?;
        let tokens = if absent(&tokens) { 0 } else { u32_of(&env, &tokens, "tokens")? };
        let mut held = Held::default();
        let items = items_of(&env, &keys, &buffers, Some(&mut held))?;
        let c = self.attached(&env)?;
        let node = c.clone();
        Ok(AsyncTask::new(Job::new(move || items.put(&c, ns, tokens), put_results).holding(held).on(node)))
    }

    /// Copies stored blocks into existing buffers: `buffers[i]` (a buffer, or
    /// an array filled in order) receives key `i`'s payload. Returns a
    /// `GetResult` per key.
    #[napi(catch_unwind, ts_args_type = "ns: number, keys: Keys, buffers: Array<Bytes | Bytes[]>")]
    pub fn get(
        &self,
        env: Env,
        ns: Unknown<'_>,
        keys: Unknown<'_>,
        buffers: Unknown<'_>,
    ) -> napi::Result<Vec<GetResult>> {
        let ns = ns_of(&env, &ns)?;
        let items = items_of(&env, &keys, &buffers, None)?;
        items.check_disjoint(&env)?;
        let c = self.attached(&env)?;
        let out = items.get(&c, ns).map_err(|f| f.throw(&env))?;
        get_results(&env, out)
    }

    /// `get` off the event loop. Leave the buffers alone until it settled.
    #[napi(
        catch_unwind,
        ts_args_type = "ns: number, keys: Keys, buffers: Array<Bytes | Bytes[]>",
        ts_return_type = "Promise<GetResult[]>"
    )]
    pub fn get_async(
        &self,
        env: Env,
        ns: Unknown<'_>,
        keys: Unknown<'_>,
        buffers: Unknown<'_>,
    ) -> napi::Result<Pending<Fetched, Vec<GetResult>>> {
        let ns = ns_of(&env, &ns)?;
        let mut held = Held::default();
        let items = items_of(&env, &keys, &buffers, Some(&mut held))?;
        items.check_disjoint(&env)?;
        let c = self.attached(&env)?;
        let node = c.clone();
        Ok(AsyncTask::new(Job::new(move || items.get(&c, ns), get_results).holding(held).on(node)))
    }

    /// Removes the stored blocks of `keys`; per key, whether it was removed
    /// (false: not stored, or pinned: a pinned block stays until released).
    /// It walks every stripe (an eviction that picks these keys): for the
    /// occasional delete, not the data path.
    #[napi(catch_unwind, ts_args_type = "ns: number, keys: Keys")]
    pub fn remove(&self, env: Env, ns: Unknown<'_>, keys: Unknown<'_>) -> napi::Result<Vec<bool>> {
        let (ns, keys, c) = (ns_of(&env, &ns)?, keys_of(&env, &keys, "keys")?, self.attached(&env)?);
        c.remove(ns, &keys).or_throw(&env)
    }

    /// Starts this host's SSD tier on this node (which it then keeps to
    /// itself: its inbox serves the rack's requests): slot files of
    /// `capacity` bytes in each of `dirs` (one per drive, on a real disk
    /// file system), holding blocks up to `slotBytes`; cold blocks are
    /// copied out, `batch` at a time, once the region is `highWater` full.
    #[napi(catch_unwind, ts_args_type = "dirs: string[], options?: TierOptions")]
    pub fn start_tier(&self, env: Env, dirs: Unknown<'_>, options: Unknown<'_>) -> napi::Result<crate::tier::Tier> {
        let dirs = elements(&env, &dirs, "dirs")?
            .iter()
            .enumerate()
            .map(|(i, d)| args::string_of(&env, d, At("dirs", i)))
            .collect::<napi::Result<Vec<String>>>()?;
        let names = crate::tier::option_names();
        let known: Vec<&str> = names.iter().map(String::as_str).collect();
        let o = Opts::of(&env, &options, "options", &known)?;
        let opts = crate::tier::options(&env, dirs, &o)?;
        let c = self.attached(&env)?;
        let t = cxlkv_platform::Tier::start(c, opts).or_throw(&env)?;
        Ok(crate::tier::Tier::new(t))
    }

    /// A cursor over the region's change log from now on: its `poll`
    /// returns the stores and removals any node makes afterwards.
    #[napi(catch_unwind)]
    pub fn change_cursor(&self, env: Env) -> napi::Result<crate::events::ChangeCursor> {
        let c = self.attached(&env)?;
        let cursor = cxlkv_platform::events::ChangeCursor::at_head(c.store()).or_throw(&env)?;
        Ok(crate::events::ChangeCursor::new(Arc::downgrade(&c), cursor))
    }

    /// Removes every stored block of `namespaces` that nothing pins (other
    /// namespaces' blocks stay): an engine's clear. It walks every stripe.
    #[napi(catch_unwind, ts_args_type = "namespaces: number[]")]
    pub fn clear_namespaces(&self, env: Env, namespaces: Unknown<'_>) -> napi::Result<Evicted> {
        let ns = elements(&env, &namespaces, "namespaces")?
            .iter()
            .enumerate()
            .map(|(i, n)| u32_of(&env, n, At("namespaces", i)))
            .collect::<napi::Result<Vec<u32>>>()?;
        let c = self.attached(&env)?;
        let (blocks, bytes) = c.clear_namespaces(&ns).or_throw(&env)?;
        Ok(Evicted { blocks: blocks as f64, bytes: bytes as f64 })
    }

    /// Evicts least-recently-used unpinned blocks until `nbytes` of payload
    /// are freed or none is left.
    #[napi(catch_unwind, ts_args_type = "nbytes: number")]
    pub fn evict(&self, env: Env, nbytes: Unknown<'_>) -> napi::Result<Evicted> {
        let n = u64_of(&env, &nbytes, "nbytes")?;
        let c = self.attached(&env)?;
        Ok(evicted(c.core().evict(n, &mut Lru).or_throw(&env)?))
    }

    /// `evict` off the event loop.
    #[napi(catch_unwind, ts_args_type = "nbytes: number", ts_return_type = "Promise<Evicted>")]
    pub fn evict_async(&self, env: Env, nbytes: Unknown<'_>) -> napi::Result<Pending<EvictReport, Evicted>> {
        let n = u64_of(&env, &nbytes, "nbytes")?;
        let c = self.attached(&env)?;
        let node = c.clone();
        Ok(AsyncTask::new(Job::new(move || Ok(c.core().evict(n, &mut Lru)?), |_, r| Ok(evicted(r))).on(node)))
    }

    /// Counters of this node and of every node, liveness and occupancy.
    #[napi(catch_unwind)]
    pub fn stats(&self, env: Env) -> napi::Result<Stats> {
        let s = self.attached(&env)?.stats().or_throw(&env)?;
        Ok(Stats {
            node: counters(s.node),
            total: counters(s.total),
            alive_mask: BigInt::from(s.alive),
            dead_mask: BigInt::from(s.dead),
            live_blocks: s.live_entries as f64,
            live_bytes: s.live_bytes as f64,
            capacity_bytes: s.payload_bytes as f64,
            evictions: s.evictions as f64,
        })
    }

    /// Recovers the region after nodes died (normally automatic).
    #[napi(catch_unwind)]
    pub fn recover(&self, env: Env) -> napi::Result<Recovered> {
        let r = self.attached(&env)?.recover().or_throw(&env)?;
        recovered(&env, r)
    }

    /// `recover` off the event loop.
    #[napi(catch_unwind, ts_return_type = "Promise<Recovered>")]
    pub fn recover_async(&self, env: Env) -> napi::Result<Pending<RecoverReport, Recovered>> {
        let c = self.attached(&env)?;
        let node = c.clone();
        Ok(AsyncTask::new(Job::new(move || Ok(c.recover()?), recovered).on(node)))
    }

    /// An operator's word that node `n`, declared dead, will never store
    /// again (its host is powered off, or was rebooted since): the next
    /// recovery frees the reservations and raw blocks kept quarantined for
    /// it. Never say it of a host that may only be stopped. True when said
    /// now; false when `n` is not dead or is quiet already.
    #[napi(catch_unwind)]
    pub fn declare_quiet(&self, env: Env, n: u32) -> napi::Result<bool> {
        self.attached(&env)?.declare_quiet(n).or_throw(&env)
    }

    /// Every invariant of the region, checked: the findings (empty when
    /// clean). Exact on a quiescent region; on a live one, changes in
    /// flight can show up as findings.
    #[napi(catch_unwind)]
    pub fn check(&self, env: Env) -> napi::Result<Vec<String>> {
        let f = self.attached(&env)?.check().or_throw(&env)?;
        Ok(f.iter().map(ToString::to_string).collect())
    }

    /// `check` off the event loop.
    #[napi(catch_unwind, ts_return_type = "Promise<string[]>")]
    pub fn check_async(&self, env: Env) -> napi::Result<Pending<Vec<String>, Vec<String>>> {
        let c = self.attached(&env)?;
        let node = c.clone();
        Ok(AsyncTask::new(
            Job::new(move || Ok(c.check()?.iter().map(ToString::to_string).collect()), findings).on(node),
        ))
    }

    /// Sends `message` to node `to`'s inbox, waiting (up to the lock
    /// timeout) while it is full. `BAD_NODE` when `to` is not attached.
    #[napi(catch_unwind, ts_args_type = "to: number, message: Outgoing")]
    pub fn send(&self, env: Env, to: Unknown<'_>, message: Unknown<'_>) -> napi::Result<()> {
        let (to, m, keys) = outgoing(&env, &to, &message)?;
        self.attached(&env)?.send(to, &m, &keys).or_throw(&env)
    }

    /// `send` off the event loop (waiting while the inbox is full).
    #[napi(catch_unwind, ts_args_type = "to: number, message: Outgoing", ts_return_type = "Promise<void>")]
    pub fn send_async(&self, env: Env, to: Unknown<'_>, message: Unknown<'_>) -> napi::Result<Pending<(), ()>> {
        let (to, m, keys) = outgoing(&env, &to, &message)?;
        let c = self.attached(&env)?;
        let node = c.clone();
        Ok(AsyncTask::new(Job::new(move || Ok(c.send(to, &m, &keys)?), |_, ()| Ok(())).on(node)))
    }

    /// The next message of this node's inbox, or `null` when none is there.
    #[napi(catch_unwind)]
    pub fn try_recv(&self, env: Env) -> napi::Result<Option<Message>> {
        Ok(self.attached(&env)?.try_recv().or_throw(&env)?.map(to_js))
    }

    /// Waits up to `timeoutMs` for the next message; `TIMEOUT` when none
    /// came. Blocks the event loop: prefer `recvAsync`.
    #[napi(catch_unwind, ts_args_type = "timeoutMs: number")]
    pub fn recv(&self, env: Env, timeout_ms: Unknown<'_>) -> napi::Result<Message> {
        let t = timeout_of(&env, &timeout_ms)?;
        Ok(to_js(self.attached(&env)?.recv(t).or_throw(&env)?))
    }

    /// `recv` off the event loop: a thread of its own waits (never one of
    /// libuv's pool, and a process exit does not wait for it).
    #[napi(catch_unwind, ts_args_type = "timeoutMs: number", ts_return_type = "Promise<Message>")]
    pub fn recv_async<'env>(&self, env: &'env Env, timeout_ms: Unknown<'_>) -> napi::Result<Object<'env>> {
        let t = timeout_of(env, &timeout_ms)?;
        let c = self.attached(env)?;
        let node = c.clone();
        waiting(env, node, move || Ok(c.recv(t)?), received)
    }

    /// A request/response round trip: sends `message` to node `to` and waits
    /// up to `timeoutMs` for the answer its owner gives with `reply`.
    /// Messages arriving meanwhile stay queued for `recv`.
    #[napi(catch_unwind, ts_args_type = "to: number, message: Outgoing, timeoutMs: number")]
    pub fn call(
        &self,
        env: Env,
        to: Unknown<'_>,
        message: Unknown<'_>,
        timeout_ms: Unknown<'_>,
    ) -> napi::Result<Message> {
        let to = u32_of(&env, &to, "to")?;
        let (m, keys) = message_of(&env, &message, "message")?;
        let t = timeout_of(&env, &timeout_ms)?;
        Ok(to_js(self.attached(&env)?.call(to, &m, &keys, t).or_throw(&env)?))
    }

    /// `call` off the event loop (a thread of its own waits for the answer,
    /// as for `recvAsync`).
    #[napi(
        catch_unwind,
        ts_args_type = "to: number, message: Outgoing, timeoutMs: number",
        ts_return_type = "Promise<Message>"
    )]
    pub fn call_async<'env>(
        &self,
        env: &'env Env,
        to: Unknown<'_>,
        message: Unknown<'_>,
        timeout_ms: Unknown<'_>,
    ) -> napi::Result<Object<'env>> {
        let to = u32_of(env, &to, "to")?;
        let (m, keys) = message_of(env, &message, "message")?;
        let t = timeout_of(env, &timeout_ms)?;
        let c = self.attached(env)?;
        let node = c.clone();
        waiting(env, node, move || Ok(c.call(to, &m, &keys, t)?), received)
    }

    /// Answers `request` (a message `recv` returned) with `status` and
    /// `keys`.
    #[napi(catch_unwind, ts_args_type = "request: Message, status: number, keys?: Keys")]
    pub fn reply(&self, env: Env, request: Unknown<'_>, status: Unknown<'_>, keys: Unknown<'_>) -> napi::Result<()> {
        let (req, _) = message_of(&env, &request, "request")?;
        let status = u32_of(&env, &status, "status")?;
        let keys = if absent(&keys) { Vec::new() } else { keys_of(&env, &keys, "keys")? };
        self.attached(&env)?.reply(&req, status, &keys).or_throw(&env)
    }

    /// Detaches: drops this node's pins and reservations and frees its slot.
    /// `BUSY` while a `Pinned` or `Reservation` of it is unreleased (or an
    /// async call is running). Detaching twice does nothing.
    #[napi(catch_unwind)]
    pub fn detach(&self, env: Env) -> napi::Result<()> {
        let mut slot = self.node.lock().unwrap_or_else(|e| e.into_inner());
        let Some(arc) = slot.take() else { return Ok(()) };
        match Arc::try_unwrap(arc) {
            Ok(node) => {
                drop(slot);
                node.close().or_throw(&env)
            }
            Err(arc) => {
                *slot = Some(arc);
                Err(coded(
                    &env,
                    Code::Busy,
                    "release the node's pinned and reserved blocks (and await its async calls) first",
                ))
            }
        }
    }
}
