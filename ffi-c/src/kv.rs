//! The KV cache, batch-first: namespaces, chained keys, lookup with a
//! presence bitmap, zero-copy acquire/release and reserve/publish/abort, and
//! copying put/get through lists of buffers. Every batch reports a result
//! per block; none is all-or-nothing.

use core::ffi::{c_char, CStr};

use cxlkv_platform::kv::{chain_keys, Key, Namespace};

use crate::region::{cxlkv_evict_report, cxlkv_node, live};
use crate::{cxlkv_result, guard, slice, slice_mut, Out, Res};

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
    // SAFETY: the same contract; slot 0 is the default tenant.
    unsafe { cxlkv_namespace_register_in(node, crate::tenants::cxlkv_tenant { slot: 0, nonce: 0 }, ns, out) }
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
pub(crate) unsafe fn keys_of(keys: *const cxlkv_key, n: usize) -> Res<Vec<Key>> {
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

/// The id of namespace `ns` of tenant `tenant` (slot 0, the default
/// tenant: as `cxlkv_namespace_register`), registered on first use: the same
/// fields in another tenant are another namespace, so tenants never share a
/// block. Its blocks count to the tenant's usage and quota.
/// CXLKV_RESULT_NO_TENANT when `tenant` is not live.
///
/// # Safety
/// As `cxlkv_namespace_register`.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_namespace_register_in(
    node: *const cxlkv_node,
    tenant: crate::tenants::cxlkv_tenant,
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
        out.write(c.namespace_in(tenant.into(), &fields)?);
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
