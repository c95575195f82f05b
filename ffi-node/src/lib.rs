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
mod js;
mod node;
mod tasks;
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

/// What makes two blocks interchangeable: `namespaceId`'s fields.
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
    /// Anything else (a salt, a LoRA id).
    #[napi(ts_type = "number | bigint")]
    pub extra: Option<f64>,
}

/// The 32-bit id of a namespace: a hash of every field; the same id as C's
/// `cxlkv_namespace_id` and Python's `namespace_id` for the same fields.
#[napi(catch_unwind, ts_args_type = "fields: NamespaceFields")]
pub fn namespace_id(env: Env, fields: Unknown<'_>) -> napi::Result<u32> {
    const FIELDS: &[&str] = &["model", "kvLayout", "dtype", "tpRank", "tpSize", "ppRank", "blockTokens", "extra"];
    if absent(&fields) {
        return Err(error::type_error(&env, "fields must be an object with at least `model`"));
    }
    let o = Opts::of(&env, &fields, "fields", FIELDS)?;
    let model = match o.value("model")? {
        Some(m) if m.get_type()? == ValueType::String => args::string_of(&env, &m, "fields.model")?.into_bytes(),
        Some(m) => {
            let b = args::bytes_of(&env, &m, "fields.model")?;
            // SAFETY: the argument is held by the running call, which runs no
            // JavaScript while it is read.
            unsafe { b.slice() }.to_vec()
        }
        None => return Err(error::type_error(&env, "fields.model is required")),
    };
    let extra = match o.value("extra")? {
        Some(v) => u64_of(&env, &v, "fields.extra")?,
        None => 0,
    };
    let f = |name| -> napi::Result<u32> { Ok(o.u32(name)?.unwrap_or(0)) };
    Ok(Namespace {
        model: &model,
        kv_layout: f("kvLayout")?,
        dtype: f("dtype")?,
        tp_rank: f("tpRank")?,
        tp_size: f("tpSize")?,
        pp_rank: f("ppRank")?,
        block_tokens: f("blockTokens")?,
        extra,
    }
    .id())
}
