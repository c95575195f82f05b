//! Route records: what a KV-aware router needs of a block beyond its key —
//! the token ids it covers, its parent block, the block size — kept in the
//! region beside the block by the engine that knows them.
//!
//! A record lives in the reserved namespace [`ROUTE_NS`] under
//! [`route_key`]`(ns, key)` and names the block it describes, so a record
//! found under a colliding key is ignored. It is an ordinary block: the
//! allocator and eviction treat it as one (records are small; a record
//! whose block is gone is eventually evicted). An engine stores the records
//! of its blocks first, then the blocks: the event publisher reads a
//! block's record when it sees the block stored, and a block without one is
//! published with its hash alone.
//!
//! Layout (little-endian): magic `CXRT`, namespace u32, key [16], flags u32
//! (1: parent, 2: LoRA id), block size u32, parent key [16], LoRA id i64,
//! token count u32, reserved u32, then the token ids, u32 each.

use cxlkv_core::hash::{mix64, Key};

use crate::copy::PutItem;
use crate::error::Result;
use crate::node::Node;

/// The namespace route records live in (reserved: no engine namespace).
pub const ROUTE_NS: u32 = u32::MAX;

/// Tokens a record holds at most.
pub const MAX_ROUTE_TOKENS: usize = 1 << 16;

const MAGIC: [u8; 4] = *b"CXRT";
const HEAD: usize = 64;
const HAS_PARENT: u32 = 1;
const HAS_LORA: u32 = 2;

/// What a router needs of a block beyond its key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Route {
    /// The key of the block before it in its sequence, if any.
    pub parent: Option<Key>,
    /// Tokens per block (vLLM's `block_size`).
    pub block_size: u32,
    /// The token ids the block covers.
    pub tokens: Vec<u32>,
    /// The LoRA adapter's id, if any.
    pub lora_id: Option<i64>,
}

/// The key of the route record of block `key` of namespace `ns`.
pub fn route_key(ns: u32, key: Key) -> Key {
    let n = mix64(u64::from(ns) ^ 0x5a17_c0de_0000_0000);
    Key { lo: mix64(key.lo ^ n), hi: mix64(key.hi.wrapping_add(n)) }
}

impl Route {
    /// The record of block `key` of namespace `ns`.
    pub fn encode(&self, ns: u32, key: Key) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEAD + self.tokens.len() * 4);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&ns.to_le_bytes());
        b.extend_from_slice(&key.to_bytes());
        let flags =
            if self.parent.is_some() { HAS_PARENT } else { 0 } | if self.lora_id.is_some() { HAS_LORA } else { 0 };
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&self.block_size.to_le_bytes());
        b.extend_from_slice(&self.parent.unwrap_or_default().to_bytes());
        b.extend_from_slice(&self.lora_id.unwrap_or(0).to_le_bytes());
        b.extend_from_slice(&(self.tokens.len() as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        for t in &self.tokens {
            b.extend_from_slice(&t.to_le_bytes());
        }
        b
    }

    /// The route in record `b`, if it is a well-formed record of block
    /// `key` of namespace `ns` (anything else: `None`; nothing read from
    /// the region is trusted).
    pub fn decode(b: &[u8], ns: u32, key: Key) -> Option<Route> {
        let head = b.get(..HEAD)?;
        let u32_at = |i: usize| head.get(i..i + 4).and_then(|s| s.try_into().ok()).map(u32::from_le_bytes);
        let key_at = |i: usize| head.get(i..i + 16).and_then(|s| s.try_into().ok()).map(Key::from_bytes);
        if head[..4] != MAGIC || u32_at(4)? != ns || key_at(8)? != key {
            return None;
        }
        let flags = u32_at(24)?;
        if flags & !(HAS_PARENT | HAS_LORA) != 0 {
            return None;
        }
        let lora = i64::from_le_bytes(head.get(48..56)?.try_into().ok()?);
        let n = u32_at(56)? as usize;
        if n > MAX_ROUTE_TOKENS || b.len() != HEAD + n * 4 {
            return None;
        }
        let tokens = b[HEAD..].chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        Some(Route {
            parent: (flags & HAS_PARENT != 0).then(|| key_at(32)).flatten(),
            block_size: u32_at(28)?,
            tokens,
            lora_id: (flags & HAS_LORA != 0).then_some(lora),
        })
    }
}

impl Node {
    /// Stores the route records of blocks `routes` (keys of namespace
    /// `ns`); `out[i]` is `Ok`, `Exists` (a record is stored already), or
    /// why it failed. Store them before the blocks themselves.
    pub fn put_routes(&self, ns: u32, routes: &[(Key, Route)], out: &mut [cxlkv_core::Result<()>]) -> Result<()> {
        if routes.iter().any(|(_, r)| r.tokens.len() > MAX_ROUTE_TOKENS) || ns == ROUTE_NS {
            return Err(cxlkv_core::Error::InvalidArgument.into());
        }
        let bytes: Vec<Vec<u8>> = routes.iter().map(|(k, r)| r.encode(ns, *k)).collect();
        let parts: Vec<[&[u8]; 1]> = bytes.iter().map(|b| [b.as_slice()]).collect();
        let items: Vec<PutItem<'_>> = routes
            .iter()
            .zip(&parts)
            .map(|((k, r), p)| PutItem { key: route_key(ns, *k), tokens: r.tokens.len() as u32, parts: p })
            .collect();
        self.put(ROUTE_NS, &items, out)
    }

    /// The route record of block `key` of namespace `ns`, if one is stored
    /// and well formed. Read without a lock or an SSD tier's help.
    pub fn route(&self, ns: u32, key: Key) -> Result<Option<Route>> {
        let rk = route_key(ns, key);
        let mut buf = vec![0u8; HEAD + 64 * 4];
        for _ in 0..2 {
            match self.core().get_into(ROUTE_NS, rk, &mut [&mut buf[..]]) {
                Ok(cxlkv_core::index::Got::Copied(len)) => {
                    return Ok(Route::decode(buf.get(..len as usize).unwrap_or(&[]), ns, key));
                }
                Ok(cxlkv_core::index::Got::TooSmall(len)) if len as usize <= HEAD + MAX_ROUTE_TOKENS * 4 => {
                    buf.resize(len as usize, 0);
                }
                Ok(cxlkv_core::index::Got::TooSmall(_)) => return Ok(None),
                Err(cxlkv_core::Error::NotFound | cxlkv_core::Error::Changed) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_names_its_block() {
        let key = Key::from_u128(42);
        let r = Route { parent: Some(Key::from_u128(7)), block_size: 16, tokens: (0..16).collect(), lora_id: Some(-3) };
        let b = r.encode(5, key);
        assert_eq!(Route::decode(&b, 5, key), Some(r.clone()));
        // Another block's, or another namespace's: not this block's record.
        assert_eq!(Route::decode(&b, 6, key), None);
        assert_eq!(Route::decode(&b, 5, Key::from_u128(43)), None);
        // Truncated, padded, or with a token count past its length.
        assert_eq!(Route::decode(&b[..b.len() - 1], 5, key), None);
        let mut long = b.clone();
        long.push(0);
        assert_eq!(Route::decode(&long, 5, key), None);
        let mut bad = b.clone();
        bad[56] = 0xff;
        assert_eq!(Route::decode(&bad, 5, key), None);
        let bare = Route { block_size: 4, ..Route::default() };
        assert_eq!(Route::decode(&bare.encode(1, key), 1, key), Some(bare));
    }

    #[test]
    fn route_keys_differ_by_namespace_and_key() {
        let k = Key::from_u128(1);
        assert_ne!(route_key(1, k), route_key(2, k));
        assert_ne!(route_key(1, k), route_key(1, Key::from_u128(2)));
        assert_ne!(route_key(1, k), k);
    }
}
