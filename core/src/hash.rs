//! Keys, namespaces and the small hash functions the index and checksums use.

use xxhash_rust::xxh3::Xxh3;

/// A 128-bit block key (the engine's chained block hash), as two words.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// Low 64 bits.
    pub lo: u64,
    /// High 64 bits.
    pub hi: u64,
}

impl Key {
    /// Key from 16 little-endian bytes.
    pub fn from_bytes(b: [u8; 16]) -> Key {
        let v = u128::from_le_bytes(b);
        Key { lo: v as u64, hi: (v >> 64) as u64 }
    }
    /// The 16 little-endian bytes.
    pub fn to_bytes(self) -> [u8; 16] {
        (((self.hi as u128) << 64) | self.lo as u128).to_le_bytes()
    }
    /// Key from a u128.
    pub fn from_u128(v: u128) -> Key {
        Key { lo: v as u64, hi: (v >> 64) as u64 }
    }
    /// The key as u128.
    pub fn as_u128(self) -> u128 {
        ((self.hi as u128) << 64) | self.lo as u128
    }
}

/// A full 64-bit finaliser (moremur-style): good avalanche for table placement.
#[inline]
pub const fn mix64(mut x: u64) -> u64 {
    x ^= x >> 27;
    x = x.wrapping_mul(0x3c79_ac49_2ba7_b653);
    x ^= x >> 33;
    x = x.wrapping_mul(0x1c69_b3f7_4ac4_ae35);
    x ^= x >> 27;
    x
}

/// Placement hash of a namespaced key: picks stripe and home bucket and is
/// stored as the bucket tag.
#[inline]
pub fn place(ns: u32, key: Key) -> u64 {
    mix64(key.lo ^ mix64(key.hi ^ mix64(ns as u64 ^ 0x5bd1_e995)))
}

const CHECKSUM_SEED: u64 = 0x243f_6a88_85a3_08d3;

/// 32-bit checksum over a sequence of words.
pub fn checksum32(words: &[u64]) -> u32 {
    let mut h = CHECKSUM_SEED;
    for &w in words {
        h = mix64(h ^ w);
    }
    checksum32_fold(h)
}

/// [`checksum32`] of several word sequences at once, before the final fold
/// ([`checksum32_fold`]): lane by lane, so their multiply chains overlap.
pub fn checksum32_lanes<const W: usize>(words: &[[u64; W]], h: &mut [u64]) {
    for x in h.iter_mut() {
        *x = CHECKSUM_SEED;
    }
    for j in 0..W {
        for (x, w) in h.iter_mut().zip(words) {
            if let Some(v) = w.get(j) {
                *x = mix64(*x ^ v);
            }
        }
    }
}

/// The last step of [`checksum32`].
#[inline]
pub fn checksum32_fold(h: u64) -> u32 {
    (h ^ (h >> 32)) as u32
}

/// What tells KV caches apart: blocks of one namespace are interchangeable,
/// blocks of two never are. Engines fill the fields they have; the rest stay
/// zero (or empty). [`Namespace::digest`] is its 128-bit identity; a node
/// registers it in the region ([`crate::node::Node::namespace`]) for the
/// 32-bit id every cache operation takes, so two namespaces that differ in
/// any field never get one id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Namespace<'a> {
    /// Model name or path (any bytes).
    pub model: &'a [u8],
    /// Engine-defined KV layout (e.g. layer-first or block-first, paged).
    pub kv_layout: u32,
    /// Element type code of the KV tensors.
    pub dtype: u32,
    /// Tensor-parallel rank and size.
    pub tp_rank: u32,
    /// Tensor-parallel size.
    pub tp_size: u32,
    /// Pipeline-parallel rank.
    pub pp_rank: u32,
    /// Tokens per block.
    pub block_tokens: u32,
    /// Anything else that must separate caches, as a number.
    pub extra: u64,
    /// Anything else that must separate caches, as bytes of any length (an
    /// engine's description of its blocks, a salt, a LoRA name).
    pub salt: &'a [u8],
}

impl Namespace<'_> {
    /// The namespace's 128-bit identity: XXH3-128 (seed 0) of every field in
    /// a fixed encoding, lengths included, so no two field lists encode alike:
    /// `"cxlkv-ns1"`, the model's length (u64) and bytes, `kv_layout`,
    /// `dtype`, `tp_rank`, `tp_size`, `pp_rank`, `block_tokens` (u32 each),
    /// `extra` (u64), the salt's length (u64) and bytes, integers
    /// little-endian.
    pub fn digest(&self) -> [u8; 16] {
        let mut h = Xxh3::new();
        h.update(b"cxlkv-ns1");
        h.update(&(self.model.len() as u64).to_le_bytes());
        h.update(self.model);
        for v in [self.kv_layout, self.dtype, self.tp_rank, self.tp_size, self.pp_rank, self.block_tokens] {
            h.update(&v.to_le_bytes());
        }
        h.update(&self.extra.to_le_bytes());
        h.update(&(self.salt.len() as u64).to_le_bytes());
        h.update(self.salt);
        h.digest128().to_le_bytes()
    }
}

/// `base`, then a namespace for each of its fields changed alone (for tests
/// that two namespaces differing in any field never meet).
#[cfg(test)]
pub(crate) fn each_field_changed(base: Namespace<'_>) -> [Namespace<'_>; 10] {
    [
        base,
        Namespace { model: b"another-model", ..base },
        Namespace { kv_layout: base.kv_layout ^ 1, ..base },
        Namespace { dtype: base.dtype ^ 1, ..base },
        Namespace { tp_rank: base.tp_rank ^ 1, ..base },
        Namespace { tp_size: base.tp_size ^ 4, ..base },
        Namespace { pp_rank: base.pp_rank ^ 1, ..base },
        Namespace { block_tokens: base.block_tokens ^ 32, ..base },
        Namespace { extra: base.extra ^ 1, ..base },
        Namespace { salt: b"user-17144", ..base },
    ]
}

/// Chained block keys of a token sequence, the way serving engines hash
/// prefixes: key `i` covers tokens `0..(i+1)*block` and is made from key
/// `i-1` (or `parent` for the first) and block `i`'s tokens, so equal
/// prefixes give equal key chains. A partial last block gets no key.
/// Writes `min(tokens.len() / block, out.len())` keys and returns how many.
///
/// The hash is specified so that any language computes the same keys: key
/// `i` is XXH3-128 (seed 0, default secret) of the 16 bytes of key `i-1`
/// ([`Key::to_bytes`], little-endian) followed by block `i`'s tokens as
/// little-endian `u32`s; the 128-bit digest is the key ([`Key::from_u128`]).
/// In Python: `xxhash.xxh3_128_intdigest(prev + b"".join(t.to_bytes(4,
/// "little") for t in block)).to_bytes(16, "little")`.
pub fn chain_keys(parent: Key, tokens: &[u32], block: usize, out: &mut [Key]) -> usize {
    if block == 0 {
        return 0;
    }
    let mut prev = parent;
    let mut n = 0usize;
    let mut bytes = [0u8; 256];
    for (chunk, slot) in tokens.chunks_exact(block).zip(out.iter_mut()) {
        let mut h = Xxh3::new();
        h.update(&prev.to_bytes());
        for part in chunk.chunks(bytes.len() / 4) {
            for (b, t) in bytes.chunks_exact_mut(4).zip(part) {
                b.copy_from_slice(&t.to_le_bytes());
            }
            h.update(bytes.get(..part.len().saturating_mul(4)).unwrap_or_default());
        }
        prev = Key::from_u128(h.digest128());
        *slot = prev;
        n = n.saturating_add(1);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_compute_the_same_checksums_as_one_at_a_time() {
        let words: [[u64; 5]; 7] = core::array::from_fn(|i| core::array::from_fn(|j| mix64((i * 5 + j) as u64)));
        let mut h = [0u64; 7];
        checksum32_lanes(&words, &mut h);
        for (w, x) in words.iter().zip(h) {
            assert_eq!(checksum32_fold(x), checksum32(w));
        }
    }

    #[test]
    fn namespace_digest_depends_on_every_field() {
        let base = Namespace { model: b"llama-3-8b", tp_size: 2, block_tokens: 16, ..Namespace::default() };
        let mut all = std::vec::Vec::from(each_field_changed(base));
        all.extend([
            Namespace { model: b"llama-3-8b\0", ..base },
            Namespace { salt: b"\0", ..base },
            // Bytes moved from the model to the salt: the lengths tell apart.
            Namespace { model: b"llama-3-8", salt: b"b", ..base },
        ]);
        let ids: std::vec::Vec<[u8; 16]> = all.iter().map(|n| n.digest()).collect();
        for i in 0..ids.len() {
            assert!(ids[i + 1..].iter().all(|&x| x != ids[i]), "field {i}");
        }
        assert_eq!(
            base.digest(),
            Namespace { model: b"llama-3-8b", tp_size: 2, block_tokens: 16, ..Default::default() }.digest()
        );
    }

    /// Computed independently with Python's `xxhash` package.
    #[test]
    fn namespace_digest_matches_its_specified_encoding() {
        let ns = Namespace {
            model: b"m",
            kv_layout: 1,
            dtype: 2,
            tp_rank: 3,
            tp_size: 4,
            pp_rank: 5,
            block_tokens: 6,
            extra: 7,
            salt: b"s",
        };
        let hex = ns.digest().iter().map(|b| std::format!("{b:02x}")).collect::<std::string::String>();
        assert_eq!(hex, "3943895f2f6c5b42c40fa54ba142c483");
    }

    #[test]
    fn chains_share_exactly_their_common_full_blocks() {
        let a: std::vec::Vec<u32> = (0..100).collect();
        let mut b = a.clone();
        b[40] = 7;
        let (mut ka, mut kb) = ([Key::default(); 8], [Key::default(); 8]);
        assert_eq!(chain_keys(Key::default(), &a, 16, &mut ka), 6);
        assert_eq!(chain_keys(Key::default(), &b, 16, &mut kb), 6);
        assert_eq!(ka[..2], kb[..2], "blocks 0 and 1 are equal");
        assert!(ka[2..6].iter().zip(&kb[2..6]).all(|(x, y)| x != y), "block 2 differs, and so every later key");
        let mut short = [Key::default(); 3];
        assert_eq!(chain_keys(Key::default(), &a, 16, &mut short), 3);
        assert_eq!(short, ka[..3]);
        assert_ne!(chain_keys(Key { lo: 1, hi: 0 }, &a, 16, &mut short), 0);
        assert_ne!(short[0], ka[0], "the parent key seeds the chain");
        assert_eq!(chain_keys(Key::default(), &a, 0, &mut short), 0);
    }

    /// Computed independently with Python's `xxhash` package (the
    /// README's vectors).
    #[test]
    fn chain_keys_match_the_specified_xxh3_chain() {
        let hex = |k: Key| k.to_bytes().iter().map(|b| std::format!("{b:02x}")).collect::<std::string::String>();
        let toks: std::vec::Vec<u32> = (0..300).collect();
        let mut out = [Key::default(); 2];
        assert_eq!(chain_keys(Key::default(), &toks[..32], 16, &mut out), 2);
        assert_eq!(hex(out[0]), "b2c8db5b75a1490bd605369c8010d316");
        assert_eq!(hex(out[1]), "925c7b59bf6fc9f0b3185d44c62782e1");
        assert_eq!(chain_keys(Key::default(), &toks, 256, &mut out), 1);
        assert_eq!(hex(out[0]), "529f6031c479c59cbc85bb3d2d49d01a");
    }

    #[test]
    fn key_bytes_round_trip() {
        let k = Key { lo: 0x0102_0304_0506_0708, hi: 0x1112_1314_1516_1718 };
        assert_eq!(Key::from_bytes(k.to_bytes()), k);
        assert_eq!(Key::from_u128(k.as_u128()), k);
    }

    #[test]
    fn place_depends_on_namespace_and_both_halves() {
        let k = Key { lo: 1, hi: 2 };
        assert_ne!(place(0, k), place(1, k));
        assert_ne!(place(0, k), place(0, Key { lo: 1, hi: 3 }));
        assert_ne!(place(0, k), place(0, Key { lo: 2, hi: 2 }));
    }
}
