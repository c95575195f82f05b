//! The KV cache, batch-first: namespaces, chained keys, lookup with a
//! presence bitmap, zero-copy acquire/release and reserve/publish/abort, and
//! copying put/get through lists of buffers. Every batch reports a result
//! per block; none is all-or-nothing.

use core::ffi::{c_char, c_void, CStr};

use cxlkv_platform::kv::{chain_keys, Key, Namespace};
use cxlkv_platform::kv::{Handle, ReserveItem};
use cxlkv_platform::{GetItem, Node, PutItem};

use crate::region::{cxlkv_evict_report, cxlkv_node, live};
use crate::{cxlkv_result, guard, slice, slice_mut, Fail, Out, Res};

/// A 128-bit block key (a chained hash of the block's tokens and every token
/// before it; see `cxlkv_chain_keys`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct cxlkv_key {
    /// Low 64 bits.
    pub lo: u64,
    /// High 64 bits.
    pub hi: u64,
}

impl From<cxlkv_key> for Key {
    fn from(k: cxlkv_key) -> Key {
        Key { lo: k.lo, hi: k.hi }
    }
}

impl From<Key> for cxlkv_key {
    fn from(k: Key) -> cxlkv_key {
        cxlkv_key { lo: k.lo, hi: k.hi }
    }
}

/// What tells KV caches apart, as fields. Fill what the engine has, leave
/// the rest 0 (NULL); `cxlkv_namespace_register` registers it in a node's region and
/// gives the id every KV call takes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_namespace {
    /// Model name or path, NUL-terminated (NULL: empty).
    pub model: *const c_char,
    /// Engine-defined KV layout code.
    pub kv_layout: u32,
    /// Element type code.
    pub dtype: u32,
    /// Tensor-parallel rank.
    pub tp_rank: u32,
    /// Tensor-parallel size.
    pub tp_size: u32,
    /// Pipeline-parallel rank.
    pub pp_rank: u32,
    /// Tokens per block.
    pub block_tokens: u32,
    /// Anything else that must separate caches, as a number.
    pub extra: u64,
    /// Anything else that must separate caches, as `salt_len` bytes of any
    /// value (an engine's description of its blocks, a salt, a LoRA name);
    /// NULL when `salt_len` is 0.
    pub salt: *const u8,
    /// Bytes at `salt`.
    pub salt_len: usize,
}

/// The model and salt bytes of `n`.
///
/// # Safety
/// `n.model` is NULL or NUL-terminated; `n.salt` is valid for `n.salt_len`
/// bytes when that is not 0; both outlive the returned slices.
unsafe fn bytes_of_fields<'a>(n: &cxlkv_namespace) -> Res<(&'a [u8], &'a [u8])> {
    let model = if n.model.is_null() {
        &[][..]
    } else {
        // SAFETY:
        // - a non-NULL `model` is NUL-terminated by the contract.
        unsafe { CStr::from_ptr(n.model) }.to_bytes()
    };
    let salt = if n.salt_len == 0 {
        &[][..]
    } else if n.salt.is_null() {
        return Err(cxlkv_result::NullParameter.into());
    } else {
        // SAFETY:
        // - a non-NULL `salt` is valid for `salt_len` bytes by the contract,
        //   and nothing writes them while they are read.
        unsafe { core::slice::from_raw_parts(n.salt, n.salt_len) }
    };
    Ok((model, salt))
}

/// The fields of `n` with its bytes.
fn namespace_of<'a>(n: &cxlkv_namespace, model: &'a [u8], salt: &'a [u8]) -> Namespace<'a> {
    Namespace {
        model,
        kv_layout: n.kv_layout,
        dtype: n.dtype,
        tp_rank: n.tp_rank,
        tp_size: n.tp_size,
        pp_rank: n.pp_rank,
        block_tokens: n.block_tokens,
        extra: n.extra,
        salt,
    }
}

/// The 128-bit identity of namespace `*ns`, as 16 bytes written to `out`:
/// XXH3-128 of every field in a fixed encoding (the same bytes as Python's
/// `namespace_digest` and Node's `namespaceDigest`). Needs no region;
/// `cxlkv_namespace_register` stores it in one. Thread-safe.
///
/// # Safety
/// `ns` is valid for one read (its `model` NULL or NUL-terminated, its
/// `salt` valid for `salt_len` bytes); `out` is valid for 16 bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_namespace_digest(ns: *const cxlkv_namespace, out: *mut u8) -> cxlkv_result {
    guard(|| {
        if ns.is_null() || out.is_null() {
            return Err(cxlkv_result::NullParameter.into());
        }
        // SAFETY:
        // - `ns` is valid for one read, its pointers as `bytes_of_fields`
        //   needs, by the contract.
        let n = unsafe { ns.read() };
        // SAFETY: as above.
        let (model, salt) = unsafe { bytes_of_fields(&n) }?;
        let d = namespace_of(&n, model, salt).digest();
        // SAFETY:
        // - `out` is non-NULL and valid for 16 bytes of writes by the
        //   contract; `d` is a local array, so they do not overlap.
        unsafe { core::ptr::copy_nonoverlapping(d.as_ptr(), out, d.len()) };
        Ok(())
    })
}

/// The id of namespace `*ns` in `node`'s region, registered there on first
/// use: every node that passes equal fields gets the same id (for as long as
/// the region is not formatted again), and fields that differ in anything
/// never share one (the region keeps each namespace's 128-bit digest; ids
/// from 2^31 up are registered, ids below are numbers an application picks
/// itself). Each namespace takes one record of the region's root table:
/// `CXLKV_RESULT_ROOTS_FULL` when none is left. The node remembers the ids
/// it registered or looked up, so a repeated call costs no region access.
///
/// # Safety
/// `node` is a handle from this library or NULL; `ns` is valid for one read
/// (its `model` NULL or NUL-terminated, its `salt` valid for `salt_len`
/// bytes); `out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_namespace_register(
    node: *const cxlkv_node,
    ns: *const cxlkv_namespace,
    out: *mut u32,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        if ns.is_null() {
            return Err(cxlkv_result::NullParameter.into());
        }
        // SAFETY:
        // - `ns` is valid for one read, its pointers as `bytes_of_fields` needs, by
        //   the contract.
        let n = unsafe { ns.read() };
        // SAFETY: as above.
        let (model, salt) = unsafe { bytes_of_fields(&n) }?;
        let fields = namespace_of(&n, model, salt);
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        out.write(c.namespace(&fields)?);
        Ok(())
    })
}

/// Chained keys of a token sequence: key `i` covers tokens
/// `0 .. (i+1)*block_tokens` and is derived from key `i-1` (or `*parent`,
/// or zero when `parent` is NULL). A partial last block gets no key. Writes
/// `min(n_tokens / block_tokens, cap)` keys and their number to `*n_keys`.
/// Equal prefixes give equal chains in every process and language.
///
/// # Safety
/// `parent` is NULL or valid for one read; `tokens` is valid for `n_tokens`
/// reads; `keys` for `cap` writes; `n_keys` for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_chain_keys(
    parent: *const cxlkv_key,
    tokens: *const u32,
    n_tokens: usize,
    block_tokens: usize,
    keys: *mut cxlkv_key,
    cap: usize,
    n_keys: *mut usize,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `n_keys` is valid for one write by the contract.
        let n_out = unsafe { Out::new(n_keys) }?;
        // SAFETY:
        // - `tokens` is valid for `n_tokens` reads by the contract.
        let toks = unsafe { slice(tokens, n_tokens) }?;
        // SAFETY:
        // - `keys` is valid for `cap` writes by the contract.
        let out = unsafe { slice_mut(keys, cap) }?;
        if block_tokens == 0 {
            return Err(cxlkv_result::InvalidArgument.into());
        }
        let p = if parent.is_null() {
            Key::default()
        } else {
            // SAFETY:
            // - a non-NULL `parent` is valid for a read by the contract.
            Key::from(unsafe { parent.read() })
        };
        let mut tmp = vec![Key::default(); (n_tokens / block_tokens).min(cap)];
        let n = chain_keys(p, toks, block_tokens, &mut tmp);
        for (o, k) in out.iter_mut().zip(&tmp[..n]) {
            *o = (*k).into();
        }
        n_out.write(n);
        Ok(())
    })
}

/// Keys of a call, converted.
///
/// # Safety
/// `keys` is valid for `n` reads (or NULL with `n` 0).
unsafe fn keys_of(keys: *const cxlkv_key, n: usize) -> Res<Vec<Key>> {
    // SAFETY:
    // - the caller's contract.
    Ok(unsafe { slice(keys, n) }?.iter().map(|k| Key::from(*k)).collect())
}

/// Longest cached prefix of the key chain `keys[0..n]` in namespace `ns`,
/// to `*prefix`; when `present` is not NULL, bit `i` of `present`
/// (`present[i / 8] >> (i % 8) & 1`) tells whether key `i` is stored
/// (`(n + 7) / 8` bytes). Takes no lock.
///
/// # Safety
/// `node` is a handle from this library or NULL; `keys` is valid for `n`
/// reads; `present` is NULL or valid for `(n + 7) / 8` writes; `prefix` for
/// one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_lookup(
    node: *const cxlkv_node,
    ns: u32,
    keys: *const cxlkv_key,
    n: usize,
    present: *mut u8,
    prefix: *mut usize,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `prefix` is valid for one write by the contract.
        let prefix = unsafe { Out::new(prefix) }?;
        // SAFETY:
        // - `keys` is valid for `n` reads by the contract.
        let ks = unsafe { keys_of(keys, n) }?;
        let bits = if present.is_null() {
            None
        } else {
            // SAFETY:
            // - a non-NULL `present` is valid for `(n + 7) / 8` writes.
            Some(unsafe { slice_mut(present, n.div_ceil(8)) }?)
        };
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let p = match bits {
            None => c.core().lookup(ns, &ks)?,
            Some(bits) => {
                let mut here = vec![false; n];
                let p = c.core().presence(ns, &ks, &mut here)?;
                bits.fill(0);
                for (i, _) in here.iter().enumerate().filter(|(_, &h)| h) {
                    bits[i / 8] |= 1 << (i % 8);
                }
                p
            }
        };
        prefix.write(p);
        Ok(())
    })
}

/// Whether `key` is stored (published) in namespace `ns`. Takes no lock.
///
/// # Safety
/// `node` is a handle from this library or NULL; `key` valid for one read;
/// `out` for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_exists(
    node: *const cxlkv_node,
    ns: u32,
    key: *const cxlkv_key,
    out: *mut bool,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `key` is valid for one read by the contract.
        let k = unsafe { keys_of(key, 1) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        out.write(c.exists(ns, k[0])?);
        Ok(())
    })
}

/// Removes the stored blocks of `keys[0..n]` in namespace `ns`:
/// `removed[i]` is true when key `i` was removed, false when it was not
/// stored or is pinned (a pinned block stays until released). It walks
/// every stripe (an eviction that picks these keys): for the occasional
/// delete, not the data path.
///
/// # Safety
/// `node` is a handle from this library or NULL; `keys` is valid for `n`
/// reads and `removed` for `n` writes.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_remove(
    node: *const cxlkv_node,
    ns: u32,
    keys: *const cxlkv_key,
    n: usize,
    removed: *mut bool,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `keys` is valid for `n` reads by the contract.
        let ks = unsafe { keys_of(keys, n) }?;
        // SAFETY:
        // - `removed` is valid for `n` writes by the contract.
        let out = unsafe { slice_mut(removed, n) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let gone = c.remove(ns, &ks)?;
        for (o, g) in out.iter_mut().zip(gone) {
            *o = g;
        }
        Ok(())
    })
}

/// Removes every stored block of the namespaces `namespaces[0..n]` that
/// nothing pins (other namespaces' blocks stay): an engine's clear. It
/// walks every stripe. `out` (NULL allowed) gets the blocks and bytes
/// freed.
///
/// # Safety
/// `node` is a handle from this library or NULL; `namespaces` is valid for
/// `n` reads; `out` is NULL or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_clear_namespaces(
    node: *const cxlkv_node,
    namespaces: *const u32,
    n: usize,
    out: *mut cxlkv_evict_report,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is NULL or valid for one write by the contract.
        let out = unsafe { Out::maybe(out) };
        // SAFETY:
        // - `namespaces` is valid for `n` reads by the contract.
        let ns = unsafe { slice(namespaces, n) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let (blocks, bytes) = c.clear_namespaces(ns)?;
        if let Some(o) = out {
            o.write(cxlkv_evict_report { blocks, bytes });
        }
        Ok(())
    })
}

/// A pinned (acquired) or reserved block: where its payload lies in this
/// process. `data` is NULL in an empty slot (a key that was not acquired or
/// reserved). The other fields identify the block to the library: pass the
/// struct back unchanged. Valid until released, published or aborted.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_block {
    /// The payload in the mapped region: read-only for an acquired block,
    /// writable for a reserved one.
    pub data: *mut c_void,
    /// Payload length in bytes.
    pub len: u64,
    /// The block's key.
    pub key: cxlkv_key,
    /// Its namespace id.
    pub ns: u32,
    /// Tokens it covers.
    pub tokens: u32,
    /// Library use.
    pub stripe: u32,
    /// Library use.
    pub entry: u32,
    /// Library use.
    pub gen: u32,
    /// Library use (0).
    pub reserved: u32,
    /// Payload offset in the region.
    pub offset: u64,
}

impl cxlkv_block {
    /// An empty slot (no block).
    pub const EMPTY: cxlkv_block = cxlkv_block {
        data: core::ptr::null_mut(),
        len: 0,
        key: cxlkv_key { lo: 0, hi: 0 },
        ns: 0,
        tokens: 0,
        stripe: 0,
        entry: 0,
        gen: 0,
        reserved: 0,
        offset: 0,
    };

    fn of(c: &Node, h: &Handle) -> Res<cxlkv_block> {
        let data = c.payload_ptr(h.off, h.len)?;
        Ok(cxlkv_block {
            data: data.cast(),
            len: h.len,
            key: h.key.into(),
            ns: h.ns,
            tokens: h.tokens,
            stripe: h.stripe,
            entry: h.entry,
            gen: h.gen,
            reserved: 0,
            offset: h.off,
        })
    }

    pub(crate) fn handle(&self) -> Handle {
        Handle {
            ns: self.ns,
            key: self.key.into(),
            stripe: self.stripe,
            entry: self.entry,
            gen: self.gen,
            off: self.offset,
            len: self.len,
            tokens: self.tokens,
        }
    }
}

fn code(r: &cxlkv_platform::kv::CoreResult<impl Sized>) -> cxlkv_result {
    match r {
        Ok(_) => cxlkv_result::Ok,
        Err(e) => (*e).into(),
    }
}

/// The outputs of a per-block batch call, checked before any work.
struct BatchOut<'a> {
    blocks: &'a mut [cxlkv_block],
    status: &'a mut [cxlkv_result],
}

impl BatchOut<'_> {
    /// # Safety
    /// `blocks` and `status` are valid for `n` writes each.
    unsafe fn new<'a>(blocks: *mut cxlkv_block, status: *mut cxlkv_result, n: usize) -> Res<BatchOut<'a>> {
        // SAFETY:
        // - the caller's contract.
        let blocks = unsafe { slice_mut(blocks, n) }?;
        // SAFETY:
        // - the caller's contract.
        let status = unsafe { slice_mut(status, n) }?;
        Ok(BatchOut { blocks, status })
    }

    /// Fills slot `i` from a handle result.
    fn set(&mut self, c: &Node, i: usize, r: cxlkv_platform::kv::CoreResult<Handle>) -> usize {
        let b = r.map_err(Fail::from).and_then(|h| cxlkv_block::of(c, &h));
        match b {
            Ok(b) => {
                self.blocks[i] = b;
                self.status[i] = cxlkv_result::Ok;
                1
            }
            Err(Fail(e)) => {
                self.blocks[i] = cxlkv_block::EMPTY;
                self.status[i] = e;
                0
            }
        }
    }
}

/// Pins the published blocks of `keys[0..n]` in namespace `ns` for
/// zero-copy reads: `blocks[i]` points at key `i`'s payload (read-only) and
/// `status[i]` is CXLKV_RESULT_OK, or CXLKV_RESULT_NOT_FOUND with an empty
/// block. The payload is fresh in this host's cache when this returns, and
/// stays valid and unchanged until `cxlkv_release`: a pinned block is never
/// evicted. `*n_acquired` (NULL allowed) gets how many were pinned.
///
/// # Safety
/// `node` is a handle from this library or NULL; `keys` is valid for `n`
/// reads; `blocks` and `status` for `n` writes; `n_acquired` is NULL or
/// valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_acquire(
    node: *const cxlkv_node,
    ns: u32,
    keys: *const cxlkv_key,
    n: usize,
    blocks: *mut cxlkv_block,
    status: *mut cxlkv_result,
    n_acquired: *mut usize,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `n_acquired` is NULL or valid for one write by the contract.
        let count = unsafe { Out::maybe(n_acquired) };
        // SAFETY:
        // - `blocks` and `status` are valid for `n` writes by the contract.
        let mut out = unsafe { BatchOut::new(blocks, status, n) }?;
        // SAFETY:
        // - `keys` is valid for `n` reads by the contract.
        let ks = unsafe { keys_of(keys, n) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let mut hs = vec![Err(cxlkv_platform::kv::CoreError::InvalidArgument); n];
        c.acquire_views(ns, &ks, &mut hs)?;
        let mut got = 0;
        for (i, r) in hs.into_iter().enumerate() {
            got += out.set(&c, i, r);
        }
        if let Some(o) = count {
            o.write(got);
        }
        Ok(())
    })
}

/// Handles of the non-empty blocks of a call.
///
/// # Safety
/// `blocks` is valid for `n` reads.
unsafe fn handles_of(blocks: *const cxlkv_block, n: usize) -> Res<Vec<Handle>> {
    // SAFETY:
    // - the caller's contract.
    let bs = unsafe { slice(blocks, n) }?;
    Ok(bs.iter().filter(|b| !b.data.is_null()).map(cxlkv_block::handle).collect())
}

/// Drops one pin of each non-empty block of `blocks[0..n]` (from
/// `cxlkv_acquire`); empty slots are skipped, so the array acquire filled
/// can be passed as it is. Their `data` pointers must not be used after.
/// Returns the first failure (CXLKV_RESULT_STALE_HANDLE for a block this
/// node does not hold); the other blocks are released all the same.
///
/// # Safety
/// `node` is a handle from this library or NULL; `blocks` is valid for `n`
/// reads.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_release(node: *const cxlkv_node, blocks: *const cxlkv_block, n: usize) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `blocks` is valid for `n` reads by the contract.
        let hs = unsafe { handles_of(blocks, n) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        Ok(c.core().release(&hs)?)
    })
}

/// One block to reserve.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_reserve_item {
    /// Key.
    pub key: cxlkv_key,
    /// Payload bytes.
    pub len: u64,
    /// Tokens the block covers.
    pub tokens: u32,
    /// 0.
    pub reserved: u32,
}

/// Reserves writable blocks for zero-copy writes: `blocks[i]` points at
/// `items[i].len` writable bytes in the region, and `status[i]` is
/// CXLKV_RESULT_OK, CXLKV_RESULT_EXISTS (stored or being written by
/// someone: nothing reserved), CXLKV_RESULT_OUT_OF_SPACE (everything
/// evictable is pinned) or another failure. Evicts least-recently-used
/// blocks as needed. Fill the payloads with plain stores (or DMA), then
/// `cxlkv_publish` or `cxlkv_abort` each. `*n_reserved` (NULL allowed) gets
/// how many were reserved.
///
/// # Safety
/// `node` is a handle from this library or NULL; `items` is valid for `n`
/// reads; `blocks` and `status` for `n` writes; `n_reserved` is NULL or
/// valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_reserve(
    node: *const cxlkv_node,
    ns: u32,
    items: *const cxlkv_reserve_item,
    n: usize,
    blocks: *mut cxlkv_block,
    status: *mut cxlkv_result,
    n_reserved: *mut usize,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `n_reserved` is NULL or valid for one write by the contract.
        let count = unsafe { Out::maybe(n_reserved) };
        // SAFETY:
        // - `blocks` and `status` are valid for `n` writes by the contract.
        let mut out = unsafe { BatchOut::new(blocks, status, n) }?;
        // SAFETY:
        // - `items` is valid for `n` reads by the contract.
        let its = unsafe { slice(items, n) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let req: Vec<ReserveItem> =
            its.iter().map(|i| ReserveItem { key: i.key.into(), len: i.len, tokens: i.tokens }).collect();
        let mut hs = vec![Err(cxlkv_platform::kv::CoreError::InvalidArgument); n];
        c.core().reserve_batch(ns, &req, &mut hs)?;
        let mut got = 0;
        for (i, r) in hs.into_iter().enumerate() {
            got += out.set(&c, i, r);
        }
        if let Some(o) = count {
            o.write(got);
        }
        Ok(())
    })
}

/// Runs a per-block finishing operation over `blocks[0..n]`, reporting in
/// `status[i]` (empty slots get CXLKV_RESULT_INVALID_ARGUMENT).
///
/// # Safety
/// `blocks` valid for `n` reads, `status` for `n` writes, `node` NULL or a
/// handle from this library.
pub(crate) unsafe fn finish(
    node: *const cxlkv_node,
    blocks: *const cxlkv_block,
    n: usize,
    status: *mut cxlkv_result,
    op: impl FnOnce(&Node, &[Handle], &mut [cxlkv_platform::kv::CoreResult<()>]) -> Res<()>,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `blocks` is valid for `n` reads by the contract.
        let bs = unsafe { slice(blocks, n) }?;
        // SAFETY:
        // - `status` is valid for `n` writes by the contract.
        let st = unsafe { slice_mut(status, n) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let idx: Vec<usize> = (0..n).filter(|&i| !bs[i].data.is_null()).collect();
        let hs: Vec<Handle> = idx.iter().map(|&i| bs[i].handle()).collect();
        let mut res = vec![Ok(()); hs.len()];
        op(&c, &hs, &mut res)?;
        st.fill(cxlkv_result::InvalidArgument);
        for (k, r) in idx.into_iter().zip(&res) {
            st[k] = code(r);
        }
        Ok(())
    })
}

/// Publishes reserved blocks: flushes each payload, then turns it visible
/// to every node at once (its entry turns READY after the payload reached
/// memory). `status[i]` is CXLKV_RESULT_OK or why block `i` was not
/// published (CXLKV_RESULT_STALE_HANDLE: not reserved by this node). The
/// `data` pointers must not be written after.
///
/// # Safety
/// `node` is a handle from this library or NULL; `blocks` is valid for `n`
/// reads; `status` for `n` writes.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_publish(
    node: *const cxlkv_node,
    blocks: *const cxlkv_block,
    n: usize,
    status: *mut cxlkv_result,
) -> cxlkv_result {
    // SAFETY:
    // - the pointers as the contract says; `finish` checks them.
    unsafe { finish(node, blocks, n, status, |c, hs, res| Ok(c.core().publish_batch(hs, res)?)) }
}

/// Abandons reserved blocks: their entries and payload space are freed and
/// the keys can be reserved again. `status[i]` reports each.
///
/// # Safety
/// `node` is a handle from this library or NULL; `blocks` is valid for `n`
/// reads; `status` for `n` writes.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_abort(
    node: *const cxlkv_node,
    blocks: *const cxlkv_block,
    n: usize,
    status: *mut cxlkv_result,
) -> cxlkv_result {
    // SAFETY:
    // - the pointers as the contract says; `finish` checks them.
    unsafe {
        finish(node, blocks, n, status, |c, hs, res| {
            for (h, r) in hs.iter().zip(res.iter_mut()) {
                *r = c.core().abort(h);
            }
            Ok(())
        })
    }
}

/// A buffer: `len` bytes at `base`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_iovec {
    /// Start (read by put, written by get).
    pub base: *mut c_void,
    /// Length in bytes.
    pub len: usize,
}

/// One block to put: its payload is the concatenation of `parts` (for
/// example K then V, or one part per layer).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_put_item {
    /// Key.
    pub key: cxlkv_key,
    /// Tokens the block covers.
    pub tokens: u32,
    /// 0.
    pub reserved: u32,
    /// The parts, in order.
    pub parts: *const cxlkv_iovec,
    /// How many.
    pub n_parts: usize,
}

/// One block to get into `parts`, filled in order.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_get_item {
    /// Key.
    pub key: cxlkv_key,
    /// The buffers, in order; together at least as long as the payload.
    pub parts: *const cxlkv_iovec,
    /// How many.
    pub n_parts: usize,
}

/// The list of parts `parts[..n]`.
///
/// # Safety
/// `parts` valid for `n` reads.
unsafe fn iovecs<'a>(parts: *const cxlkv_iovec, n: usize) -> Res<&'a [cxlkv_iovec]> {
    // SAFETY:
    // - `parts` is valid for `n` reads (caller's contract).
    unsafe { slice(parts, n) }
}

/// Byte slices to read of a list of parts (a put's sources).
///
/// # Safety
/// `parts` valid for `n` reads; each part's `base` valid for `len` bytes of
/// reads while the slices live.
unsafe fn parts_to_read<'a>(parts: *const cxlkv_iovec, n: usize) -> Res<Vec<&'a [u8]>> {
    // SAFETY:
    // - `parts` is valid for `n` reads (caller's contract).
    let ps = unsafe { iovecs(parts, n) }?;
    ps.iter()
        .map(|p| {
            // SAFETY:
            // - each part is valid for `len` bytes of reads (caller's
            //   contract); the slice is shared, so it may alias another.
            unsafe { slice(p.base.cast_const().cast::<u8>(), p.len) }
        })
        .collect()
}

/// Byte slices to fill of a list of parts (a get's destinations).
///
/// # Safety
/// `parts` valid for `n` reads; each part's `base` valid for `len` bytes of
/// reads and writes while the slices live, no two overlapping.
unsafe fn parts_to_fill<'a>(parts: *const cxlkv_iovec, n: usize) -> Res<Vec<&'a mut [u8]>> {
    // SAFETY:
    // - `parts` is valid for `n` reads (caller's contract).
    let ps = unsafe { iovecs(parts, n) }?;
    ps.iter()
        .map(|p| {
            // SAFETY:
            // - each part is valid for `len` bytes of writes and overlaps no
            //   other (caller's contract).
            unsafe { slice_mut(p.base.cast::<u8>(), p.len) }
        })
        .collect()
}

/// Copies blocks into the region: item `i`'s payload is its parts
/// concatenated. `status[i]` is CXLKV_RESULT_OK (published),
/// CXLKV_RESULT_EXISTS (the key is stored already: nothing written), or why
/// it failed; the other items are stored all the same.
///
/// # Safety
/// `node` is a handle from this library or NULL; `items` is valid for `n`
/// reads, each part for `len` bytes of reads; `status` for `n` writes.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_put(
    node: *const cxlkv_node,
    ns: u32,
    items: *const cxlkv_put_item,
    n: usize,
    status: *mut cxlkv_result,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `status` is valid for `n` writes by the contract.
        let st = unsafe { slice_mut(status, n) }?;
        // SAFETY:
        // - `items` is valid for `n` reads by the contract.
        let its = unsafe { slice(items, n) }?;
        let mut parts = Vec::with_capacity(n);
        for it in its {
            // SAFETY:
            // - `it.parts` is valid for `n_parts` reads, and each part for
            //   `len` bytes of reads (contract).
            parts.push(unsafe { parts_to_read(it.parts, it.n_parts) }?);
        }
        let put: Vec<PutItem<'_>> = its
            .iter()
            .zip(&parts)
            .map(|(it, ps)| PutItem { key: it.key.into(), tokens: it.tokens, parts: ps })
            .collect();
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let mut res = vec![Ok(()); n];
        c.put(ns, &put, &mut res)?;
        for (s, r) in st.iter_mut().zip(&res) {
            *s = code(r);
        }
        Ok(())
    })
}

/// Copies blocks out of the region into each item's parts, in order:
/// `lens[i]` gets block `i`'s payload length when it is stored, `status[i]`
/// is CXLKV_RESULT_OK (the first `lens[i]` bytes of the parts are filled),
/// CXLKV_RESULT_NOT_FOUND, or CXLKV_RESULT_TOO_LARGE when the parts are
/// shorter than the payload (nothing copied; `lens[i]` says what is
/// needed).
///
/// # Safety
/// `node` is a handle from this library or NULL; `items` is valid for `n`
/// reads, each part for `len` bytes of writes, no two overlapping; `lens`
/// and `status` for `n` writes.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_get(
    node: *const cxlkv_node,
    ns: u32,
    items: *const cxlkv_get_item,
    n: usize,
    lens: *mut u64,
    status: *mut cxlkv_result,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `status` is valid for `n` writes by the contract.
        let st = unsafe { slice_mut(status, n) }?;
        // SAFETY:
        // - `lens` is valid for `n` writes by the contract.
        let ls = unsafe { slice_mut(lens, n) }?;
        // SAFETY:
        // - `items` is valid for `n` reads by the contract.
        let its = unsafe { slice(items, n) }?;
        let mut parts = Vec::with_capacity(n);
        for it in its {
            // SAFETY:
            // - each part is valid for `len` bytes of writes, none
            //   overlapping (contract).
            parts.push(unsafe { parts_to_fill(it.parts, it.n_parts) }?);
        }
        let mut get: Vec<GetItem<'_, '_>> =
            its.iter().zip(parts.iter_mut()).map(|(it, ps)| GetItem { key: it.key.into(), parts: ps }).collect();
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let mut res = vec![Ok(()); n];
        c.get(ns, &mut get, ls, &mut res)?;
        for (s, r) in st.iter_mut().zip(&res) {
            *s = code(r);
        }
        Ok(())
    })
}
