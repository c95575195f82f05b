//! Copying batch operations in the shape engines already call: a block is
//! put from, or got into, a list of buffers (K and V, per layer), and every
//! block has its own result: a batch is never all-or-nothing.

use cxlkv_core::hash::Key;
use cxlkv_core::index::{Got, Handle, ReserveItem};

use cxlkv_core::Error as CoreError;

use crate::error::Result;
use crate::node::Node;

type CoreResult<T> = cxlkv_core::Result<T>;

/// The largest single-block put written under its stripe lock
/// (`put_with` of core): the stripe's other users wait while the payload is
/// copied, so only small blocks, where the lock round trip saved is a
/// large share of the put.
const ONE_HOLD_MAX: u64 = 64 << 10;

/// One block to store: its key, the tokens it covers and its bytes, the
/// concatenation of `parts`.
#[derive(Clone, Copy, Debug)]
pub struct PutItem<'a> {
    /// Key.
    pub key: Key,
    /// Tokens the block covers.
    pub tokens: u32,
    /// The payload, in order.
    pub parts: &'a [&'a [u8]],
}

/// One block to fetch into `parts`, filled in order.
#[derive(Debug)]
pub struct GetItem<'a, 'b> {
    /// Key.
    pub key: Key,
    /// Where the payload goes; together at least as long as it.
    pub parts: &'a mut [&'b mut [u8]],
}

impl Node {
    /// Stores every item: `out[i]` is `Ok`, `Exists` when the key is stored
    /// already (nothing written), or why it failed. Returns an error only
    /// when the arguments are malformed or the region itself fails.
    pub fn put(&self, ns: u32, items: &[PutItem<'_>], out: &mut [CoreResult<()>]) -> Result<()> {
        if out.len() < items.len() {
            return Err(CoreError::InvalidArgument.into());
        }
        let node = self.core();
        if let [it] = items {
            // One small block: reserved, written and published under one
            // hold of its stripe lock (one lock round trip fewer); a block
            // that finds no room goes the usual way, which evicts.
            let len = it.parts.iter().try_fold(0u64, |a, p| a.checked_add(p.len() as u64));
            let len = len.ok_or(CoreError::TooLarge)?;
            if len <= ONE_HOLD_MAX {
                let item = ReserveItem { key: it.key, len, tokens: it.tokens };
                if let Some(r) = node.put_with(ns, item, |h| write_parts(self, h, it.parts))? {
                    out[0] = r;
                    return Ok(());
                }
            }
        }
        let mut reserve = Vec::with_capacity(items.len());
        for it in items {
            let len = it.parts.iter().try_fold(0u64, |a, p| a.checked_add(p.len() as u64));
            reserve.push(ReserveItem { key: it.key, len: len.ok_or(CoreError::TooLarge)?, tokens: it.tokens });
        }
        let mut handles: Vec<CoreResult<Handle>> = vec![Err(CoreError::InvalidArgument); items.len()];
        node.reserve_batch(ns, &reserve, &mut handles)?;
        let mut written = Vec::with_capacity(items.len());
        let mut slot = Vec::with_capacity(items.len());
        for (i, (it, h)) in items.iter().zip(&handles).enumerate() {
            out[i] = match h {
                Ok(h) => match write_parts(self, h, it.parts) {
                    Ok(()) => {
                        written.push(*h);
                        slot.push(i);
                        Ok(())
                    }
                    Err(e) => {
                        let _ = node.abort(h);
                        Err(e)
                    }
                },
                Err(e) => Err(*e),
            };
        }
        let mut res = vec![Ok(()); written.len()];
        node.publish_flushed(&written, &mut res)?;
        for (k, r) in slot.into_iter().zip(res) {
            out[k] = r;
        }
        Ok(())
    }

    /// Fetches every item: `lens[i]` is the payload length of block `i` when
    /// it is stored, and `out[i]` is `Ok` (the payload fills the first
    /// `lens[i]` bytes of its parts), `NotFound`, or `TooLarge` when the parts
    /// are too short (nothing copied).
    pub fn get(
        &self,
        ns: u32,
        items: &mut [GetItem<'_, '_>],
        lens: &mut [u64],
        out: &mut [CoreResult<()>],
    ) -> Result<()> {
        let n = items.len();
        if out.len() < n || lens.len() < n {
            return Err(CoreError::InvalidArgument.into());
        }
        let node = self.core();
        for (i, it) in items.iter_mut().enumerate() {
            lens[i] = 0;
            // No lock: a copy validated after the fact. Only a block that
            // keeps changing under the copy is pinned (two stripe locks).
            out[i] = match node.get_into(ns, it.key, it.parts) {
                Ok(Got::Copied(len)) => {
                    lens[i] = len;
                    Ok(())
                }
                Ok(Got::TooSmall(len)) => {
                    lens[i] = len;
                    Err(CoreError::TooLarge)
                }
                Err(CoreError::Changed) => self.get_pinned(ns, it, &mut lens[i]),
                Err(e) => Err(e),
            };
        }
        // Not in the region: the SSD tiers may hold them (all asked at once).
        let missing: Vec<usize> = (0..n).filter(|&i| out[i] == Err(CoreError::NotFound)).collect();
        if !missing.is_empty() {
            let keys: Vec<Key> = missing.iter().map(|&i| items[i].key).collect();
            for (&i, there) in missing.iter().zip(self.promote(ns, &keys, self.promote_wait())?) {
                if there {
                    out[i] = self.get_pinned(ns, &mut items[i], &mut lens[i]);
                }
            }
        }
        Ok(())
    }

    /// One item of [`Node::get`] through a pin: acquire, copy, release.
    fn get_pinned(&self, ns: u32, it: &mut GetItem<'_, '_>, len: &mut u64) -> CoreResult<()> {
        let node = self.core();
        let mut h = [Err(CoreError::InvalidArgument)];
        node.acquire(ns, &[it.key], &mut h)?;
        let h = h[0]?;
        *len = h.len;
        let r = read_parts(self, &h, it.parts);
        node.release(&[h]).and(r)
    }
}

impl Node {
    /// [`Node::acquire`](cxlkv_core::node::Node), except that when the call
    /// as a whole fails (a lock timed out half way) the pins it took are
    /// dropped again, so an error leaves nothing pinned.
    /// Keys missing from the region are asked of the SSD tier that holds
    /// them (see [`Node::promote`]) and pinned once it put them back.
    pub fn acquire_all_or_none(&self, ns: u32, keys: &[Key], out: &mut [CoreResult<Handle>]) -> Result<usize> {
        let node = self.core();
        let r = node.acquire(ns, keys, out).map_err(crate::error::Error::from).and_then(|mut n| {
            let missing: Vec<usize> = (0..keys.len()).filter(|&i| out[i] == Err(CoreError::NotFound)).collect();
            if missing.is_empty() {
                return Ok(n);
            }
            let ks: Vec<Key> = missing.iter().map(|&i| keys[i]).collect();
            for (&i, there) in missing.iter().zip(self.promote(ns, &ks, self.promote_wait())?) {
                if there {
                    let mut one = [Err(CoreError::NotFound)];
                    node.acquire(ns, &keys[i..i + 1], &mut one)?;
                    n += one[0].is_ok() as usize;
                    out[i] = one[0];
                }
            }
            Ok(n)
        });
        match r {
            Ok(n) => Ok(n),
            Err(e) => {
                let took: Vec<Handle> = out.iter().take(keys.len()).filter_map(|r| r.as_ref().ok().copied()).collect();
                let _ = node.release(&took);
                Err(e)
            }
        }
    }
}

impl Node {
    /// Pins `keys` for zero-copy reads through pointers: as
    /// [`Node::acquire_all_or_none`], and each pinned payload is made fresh
    /// in this host's cache (a block whose payload cannot be is released
    /// again and reported in `out`). Returns how many are pinned.
    pub fn acquire_views(&self, ns: u32, keys: &[Key], out: &mut [CoreResult<Handle>]) -> Result<usize> {
        self.acquire_all_or_none(ns, keys, out)?;
        let node = self.core();
        let mut n = 0;
        for r in out.iter_mut().take(keys.len()) {
            if let Ok(h) = r {
                match node.fresh_payload(h) {
                    Ok(()) => n += 1,
                    Err(e) => {
                        let _ = node.release(&[*h]);
                        *r = Err(e);
                    }
                }
            }
        }
        Ok(n)
    }
}

impl Node {
    /// [`Node::acquire_views`] as the bindings present it: `Some` for a
    /// pinned key, `None` for one not stored. Any other failure of a key
    /// fails the call, with nothing left pinned.
    pub fn acquire_found(&self, ns: u32, keys: &[Key]) -> Result<Vec<Option<Handle>>> {
        let mut hs = vec![Err(CoreError::InvalidArgument); keys.len()];
        self.acquire_views(ns, keys, &mut hs)?;
        if let Some(&Err(e)) = hs.iter().find(|r| matches!(r, Err(e) if *e != CoreError::NotFound)) {
            let took: Vec<Handle> = hs.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
            let _ = self.core().release(&took);
            return Err(e.into());
        }
        Ok(hs.into_iter().map(CoreResult::ok).collect())
    }
}

fn write_parts(attached: &Node, h: &Handle, parts: &[&[u8]]) -> CoreResult<()> {
    let node = attached.core();
    let mut at = 0u64;
    for p in parts {
        node.write(h, at, p)?;
        at += p.len() as u64;
    }
    Ok(())
}

fn read_parts(attached: &Node, h: &Handle, parts: &mut [&mut [u8]]) -> CoreResult<()> {
    let room = parts.iter().map(|p| p.len() as u64).sum::<u64>();
    if room < h.len {
        return Err(CoreError::TooLarge);
    }
    let node = attached.core();
    let mut at = 0u64;
    for p in parts.iter_mut() {
        let n = (h.len - at).min(p.len() as u64) as usize;
        if n == 0 {
            break;
        }
        node.read(h, at, &mut p[..n])?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Options;
    use crate::region::Region;
    use cxlkv_core::layout::Capacities;

    fn attached() -> Node {
        let caps =
            Capacities { max_nodes: 2, n_stripes: 2, entries_per_stripe: 64, chunk_shift: 16, ..Capacities::default() };
        let opts = Options { mode: crate::FlushMode::Coherent, ..Options::default() };
        Node::format_new(Region::memfd(8 << 20, false).unwrap(), caps, opts).unwrap()
    }

    #[test]
    fn put_and_get_go_through_parts_with_a_result_per_block() {
        let sut = attached();
        let (k, v) = (vec![1u8; 300], vec![2u8; 200]);
        let parts: [&[u8]; 2] = [&k, &v];
        let items = [
            PutItem { key: Key::from_u128(1), tokens: 16, parts: &parts },
            PutItem { key: Key::from_u128(2), tokens: 16, parts: &parts[..1] },
        ];
        let mut out = [Ok(()), Ok(())];
        sut.put(7, &items, &mut out).unwrap();
        assert_eq!(out, [Ok(()), Ok(())]);
        sut.put(7, &items[..1], &mut out).unwrap();
        assert_eq!(out[0], Err(CoreError::Exists), "a stored key is reported, not overwritten");

        let (mut a, mut b, mut small) = (vec![0u8; 250], vec![0u8; 300], vec![0u8; 10]);
        let mut p1: [&mut [u8]; 2] = [&mut a, &mut b];
        let mut p2: [&mut [u8]; 1] = [&mut small];
        let mut p3: [&mut [u8]; 0] = [];
        let mut gets = [
            GetItem { key: Key::from_u128(1), parts: &mut p1 },
            GetItem { key: Key::from_u128(2), parts: &mut p2 },
            GetItem { key: Key::from_u128(3), parts: &mut p3 },
        ];
        let mut lens = [0u64; 3];
        let mut out = [Ok(()), Ok(()), Ok(())];
        sut.get(7, &mut gets, &mut lens, &mut out).unwrap();
        assert_eq!(out, [Ok(()), Err(CoreError::TooLarge), Err(CoreError::NotFound)]);
        assert_eq!(lens, [500, 300, 0]);
        assert!(a.iter().take(250).all(|&x| x == 1));
        assert!(
            b[..50].iter().all(|&x| x == 1) && b[50..250].iter().all(|&x| x == 2) && b[250..].iter().all(|&x| x == 0)
        );
        let st = sut.stats().unwrap();
        assert_eq!((st.node.hits, st.total.hits, st.node.misses), (2, 2, 1));
        // The pinned path a copy that keeps changing falls back to.
        let mut c = vec![0u8; 500];
        let mut len = 0;
        {
            let mut pc: [&mut [u8]; 1] = [&mut c];
            let mut it = GetItem { key: Key::from_u128(1), parts: &mut pc };
            assert_eq!(sut.get_pinned(7, &mut it, &mut len), Ok(()));
            let mut it = GetItem { key: Key::from_u128(3), parts: &mut pc };
            assert_eq!(sut.get_pinned(7, &mut it, &mut len), Err(CoreError::NotFound));
        }
        assert!(len == 500 && c[..300].iter().all(|&x| x == 1) && c[300..].iter().all(|&x| x == 2));
        assert_eq!((st.alive, st.dead, st.live_entries, st.live_bytes), (1, 0, 2, 800));
        assert!(sut.check().unwrap().is_empty());
    }
}
