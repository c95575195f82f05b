//! Messages between nodes' inboxes, as JavaScript sees them.

use cxlkv_platform::kv::{Key, Message as Msg};
use cxlkv_platform::KIND_RESPONSE;
use napi::bindgen_prelude::{BigInt, Buffer};
use napi::{Env, Unknown};
use napi_derive::napi;

use crate::args::{absent, keys_of, u32_of, Opts};
use crate::error::range_error;

/// A received message and its keys.
pub(crate) type Received = (Msg, Vec<Key>);

/// An inbox message as received.
#[napi(object)]
pub struct Message {
    /// Application-defined kind; bit 31 marks a response to `call`.
    pub kind: u32,
    /// Namespace of the keys.
    pub ns: u32,
    /// Application-defined status (e.g. of a response).
    pub status: u32,
    /// Request id (set by `call`; a reply carries the request's).
    pub request_id: BigInt,
    /// Application-defined stamp (e.g. a send time).
    pub stamp: BigInt,
    /// The sender's node id.
    pub from: u32,
    /// The keys the message carries (16-byte Buffers).
    pub keys: Vec<Buffer>,
}

/// A message to send: `kind` is required, the rest default to 0 / none.
#[napi(object)]
#[allow(dead_code)] // declares the TypeScript type; `Opts` reads the values
pub struct Outgoing {
    /// Application-defined kind, below 2**31.
    pub kind: u32,
    /// Namespace of the keys.
    pub ns: Option<u32>,
    /// Application-defined status.
    pub status: Option<u32>,
    /// Application-defined stamp.
    pub stamp: Option<BigInt>,
    /// The keys to carry (16-byte Buffers or bigints).
    #[napi(ts_type = "Keys")]
    pub keys: Option<Vec<Buffer>>,
}

pub(crate) const MESSAGE_FIELDS: &[&str] = &["kind", "ns", "status", "requestId", "stamp", "from", "keys"];

/// A message and its keys from an object (`Outgoing`, or a received
/// `Message` for `reply`).
pub(crate) fn message_of(env: &Env, v: &Unknown<'_>, what: &'static str) -> napi::Result<(Msg, Vec<Key>)> {
    if absent(v) {
        return Err(crate::error::type_error(env, &format!("{what} must be a message object")));
    }
    let o = Opts::of(env, v, what, MESSAGE_FIELDS)?;
    let kind = o.u32("kind")?.ok_or_else(|| crate::error::type_error(env, &format!("{what}.kind is required")))?;
    let keys = match o.value("keys")? {
        Some(k) => keys_of(env, &k, format_args!("{what}.keys"))?,
        None => Vec::new(),
    };
    let m = Msg {
        kind,
        request_id: o.u64("requestId")?.unwrap_or(0),
        ns: o.u32("ns")?.unwrap_or(0),
        status: o.u32("status")?.unwrap_or(0),
        stamp: o.u64("stamp")?.unwrap_or(0),
        from: o.u32("from")?.unwrap_or(0),
        n_keys: keys.len() as u32,
    };
    Ok((m, keys))
}

/// The destination, message and keys of a `send`.
pub(crate) fn outgoing(env: &Env, to: &Unknown<'_>, message: &Unknown<'_>) -> napi::Result<(u32, Msg, Vec<Key>)> {
    let to = u32_of(env, to, "to")?;
    let (m, keys) = message_of(env, message, "message")?;
    if m.kind & KIND_RESPONSE != 0 {
        return Err(range_error(env, "message.kind must be below 2**31 (the top bit marks responses)"));
    }
    Ok((to, m, keys))
}

pub(crate) fn to_js(m: Received) -> Message {
    let (m, keys) = m;
    Message {
        kind: m.kind,
        ns: m.ns,
        status: m.status,
        request_id: BigInt::from(m.request_id),
        stamp: BigInt::from(m.stamp),
        from: m.from,
        keys: keys.iter().map(|k| Buffer::from(k.to_bytes().to_vec())).collect(),
    }
}
