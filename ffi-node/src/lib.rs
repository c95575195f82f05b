//! `cxlkv` for Node.js: the npm package's native addon, a thin door over
//! platform (it has no logic of its own and no other cxlkv dependency).
//!
//! - [`node`]: regions and attached nodes, every cache call;
//! - [`blocks`]: pinned and reserved blocks as zero-copy `ArrayBuffer`s,
//!   detached when released;
//! - [`tasks`]: the async forms, on the libuv thread pool;
//! - [`tier`]: the host's SSD tier (`Node.startTier`);
//! - [`args`]: JavaScript values to keys, buffers, numbers and options;
//! - [`error`]: thrown errors carrying the C result codes;
//! - [`js`]: the raw Node-API calls, each behind a safe function.
//!
//! Every export catches panics (napi-rs `catch_unwind`; the async work
//! catches its own) and throws them as `PANIC` errors.

use std::collections::HashMap;

use napi::bindgen_prelude::Buffer;
use napi::{Env, JsValue, Unknown, ValueType};
use napi_derive::napi;

use cxlkv_platform::kv::{chain_keys as platform_chain_keys, Key, Namespace};
use cxlkv_platform::Code;

mod args;
mod blocks;
mod error;
mod events;
mod js;
mod message;
mod node;
mod region;
mod shm;
mod tasks;
mod tenants;
mod tier;

use args::{absent, elements, key_of, u32_of, u64_of, At, Opts};
use error::range_error;

/// The package's version.
#[napi(catch_unwind)]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// Every result code by name (`OK`: 1000, `EXISTS`: ...), as in C (where
/// each is `CXLKV_RESULT_<NAME>`); an error's `code` is one of the names,
/// its `result` the number.
#[napi(catch_unwind)]
pub fn codes() -> HashMap<String, u32> {
    Code::ALL.iter().map(|c| (c.name().to_string(), *c as u32)).collect()
}

/// Core's table of region capacities: each one's default by its
/// `Region.format` option name (camelCase of the C and Python name).
#[napi(catch_unwind)]
pub fn capacity_defaults() -> HashMap<String, u32> {
    cxlkv_platform::kv::Capacities::FIELDS.iter().map(|f| (args::camel(f.name), f.default)).collect()
}

/// Platform's table of a tier's options: each one's default by its
/// `Node.startTier` option name (camelCase of the C and Python name).
#[napi(catch_unwind)]
pub fn tier_option_defaults() -> HashMap<String, f64> {
    cxlkv_platform::TierOptions::FIELDS.iter().map(|f| (args::camel(f.name), f.default)).collect()
}

/// Chained 128-bit block keys of `tokens`: key `i` covers tokens
/// `0 .. (i+1)*blockTokens`, derived from key `i-1` (or `parent`). A partial
/// last block gets no key. Equal prefixes give equal chains in every
/// process and language (C, Python, Node).
#[napi(catch_unwind, ts_args_type = "tokens: Uint32Array | number[], blockTokens: number, parent?: Key")]
pub fn chain_keys(
    env: Env,
    tokens: Unknown<'_>,
    block_tokens: Unknown<'_>,
    parent: Unknown<'_>,
) -> napi::Result<Vec<Buffer>> {
    let toks = match js::u32_elements(env.raw(), tokens.raw())? {
        Some(t) => t,
        None => elements(&env, &tokens, "tokens")?
            .iter()
            .enumerate()
            .map(|(i, t)| u32_of(&env, t, At("tokens", i)))
            .collect::<napi::Result<_>>()?,
    };
    let bt = u32_of(&env, &block_tokens, "blockTokens")? as usize;
    if bt == 0 {
        return Err(range_error(&env, "blockTokens must be positive"));
    }
    let p = if absent(&parent) { Key::default() } else { key_of(&env, &parent, "parent")? };
    let mut out = vec![Key::default(); toks.len() / bt];
    let n = platform_chain_keys(p, &toks, bt, &mut out);
    Ok(out.iter().take(n).map(|k| Buffer::from(k.to_bytes().to_vec())).collect())
}

/// What makes two blocks interchangeable: `namespaceDigest`'s and
/// `Node.namespace`'s fields.
#[napi(object)]
#[allow(dead_code)] // declares the TypeScript type; `Opts` reads the values
pub struct NamespaceFields {
    /// The model's name (or bytes).
    #[napi(ts_type = "string | Uint8Array")]
    pub model: String,
    /// KV layout id.
    pub kv_layout: Option<u32>,
    /// Data type id.
    pub dtype: Option<u32>,
    /// Tensor-parallel rank.
    pub tp_rank: Option<u32>,
    /// Tensor-parallel size.
    pub tp_size: Option<u32>,
    /// Pipeline-parallel rank.
    pub pp_rank: Option<u32>,
    /// Tokens per block.
    pub block_tokens: Option<u32>,
    /// Anything else, as a number.
    #[napi(ts_type = "number | bigint")]
    pub extra: Option<f64>,
    /// Anything else, as text or bytes of any length (an engine's
    /// description of its blocks, a salt, a LoRA name).
    #[napi(ts_type = "string | Uint8Array")]
    pub salt: Option<String>,
}

/// Namespace fields read from JavaScript, owned.
pub(crate) struct Fields {
    model: Vec<u8>,
    numbers: [u32; 6],
    extra: u64,
    salt: Vec<u8>,
}

impl Fields {
    /// The fields of `fields` (a `NamespaceFields` object).
    pub(crate) fn of(env: &Env, fields: &Unknown<'_>) -> napi::Result<Fields> {
        const FIELDS: &[&str] =
            &["model", "kvLayout", "dtype", "tpRank", "tpSize", "ppRank", "blockTokens", "extra", "salt"];
        if absent(fields) {
            return Err(error::type_error(env, "fields must be an object with at least `model`"));
        }
        let o = Opts::of(env, fields, "fields", FIELDS)?;
        let text_or_bytes = |m: &Unknown<'_>, what: &'static str| -> napi::Result<Vec<u8>> {
            if m.get_type()? == ValueType::String {
                return Ok(args::string_of(env, m, what)?.into_bytes());
            }
            let b = args::bytes_of(env, m, what)?;
            // SAFETY: the argument is held by the running call, which runs no
            // JavaScript while it is read.
            Ok(unsafe { b.slice() }.to_vec())
        };
        let model = match o.value("model")? {
            Some(m) => text_or_bytes(&m, "fields.model")?,
            None => return Err(error::type_error(env, "fields.model is required")),
        };
        let salt = o.value("salt")?.map(|m| text_or_bytes(&m, "fields.salt")).transpose()?.unwrap_or_default();
        let extra = match o.value("extra")? {
            Some(v) => u64_of(env, &v, "fields.extra")?,
            None => 0,
        };
        let mut numbers = [0u32; 6];
        for (n, name) in numbers.iter_mut().zip(["kvLayout", "dtype", "tpRank", "tpSize", "ppRank", "blockTokens"]) {
            *n = o.u32(name)?.unwrap_or(0);
        }
        Ok(Fields { model, numbers, extra, salt })
    }

    /// The namespace's 128-bit digest.
    pub(crate) fn digest(&self) -> [u8; 16] {
        let [kv_layout, dtype, tp_rank, tp_size, pp_rank, block_tokens] = self.numbers;
        Namespace {
            model: &self.model,
            kv_layout,
            dtype,
            tp_rank,
            tp_size,
            pp_rank,
            block_tokens,
            extra: self.extra,
            salt: &self.salt,
        }
        .digest()
    }
}

/// The 128-bit identity of a namespace (16 bytes): the same digest as C's
/// and Python's for the same fields. `node.namespace(fields)` registers it
/// in a region for the id every call takes.
#[napi(catch_unwind, ts_args_type = "fields: NamespaceFields")]
pub fn namespace_digest(env: Env, fields: Unknown<'_>) -> napi::Result<Buffer> {
    Ok(Buffer::from(Fields::of(&env, &fields)?.digest().to_vec()))
}
