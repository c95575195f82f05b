//! Operations every binding offers in the same words: presence of one key,
//! all-or-none reservations, application locks by index, named roots, and
//! the user's own ranges of the payload area (address translation, flush and
//! invalidate).

use cxlkv_core::coherence::{Coherence, Site};
use cxlkv_core::hash::{Key, Namespace};
use cxlkv_core::index::{Handle, Policy, ReserveItem, Verdict};
use cxlkv_core::layout::Entry;
use cxlkv_core::lock::Held;
use cxlkv_core::namespaces;
use cxlkv_core::roots::{self, Root};
use cxlkv_core::Error as CoreError;

use crate::error::{Error, Result};
use crate::node::Node;

/// Why [`Node::reserve_all`] reserved nothing.
#[derive(Debug)]
pub struct ReserveRefused {
    /// The first item that could not be reserved (`None`: the call as a
    /// whole failed, e.g. a lock timed out).
    pub index: Option<usize>,
    /// Why.
    pub error: Error,
}

/// Picks the entries of given keys of one namespace, as an eviction policy.
struct Pick {
    ns: u32,
    keys: std::collections::HashSet<Key>,
    picked: std::collections::HashSet<Key>,
}

impl Policy for Pick {
    fn consider(&mut self, _stripe: u32, entry: &Entry) -> Verdict {
        let key = Key { lo: entry.key_lo, hi: entry.key_hi };
        if entry.ns != self.ns || !self.keys.contains(&key) {
            return Verdict::Skip;
        }
        self.picked.insert(key);
        Verdict::Evict
    }

    fn for_owner(&self) -> bool {
        true
    }
}

/// Picks every entry of the given namespaces, as an eviction policy.
struct Namespaces(std::collections::HashSet<u32>);

impl Policy for Namespaces {
    fn consider(&mut self, _stripe: u32, entry: &Entry) -> Verdict {
        if self.0.contains(&entry.ns) {
            Verdict::Evict
        } else {
            Verdict::Skip
        }
    }

    fn for_owner(&self) -> bool {
        true
    }
}

impl Node {
    /// Removes every stored block of the namespaces `ns` that nothing pins
    /// (a pinned block stays until released; one being written is not
    /// stored yet) and returns the blocks and payload bytes freed; blocks of
    /// other namespaces stay. Like [`Node::remove`] it walks every stripe:
    /// an engine's "clear", not a data-path call; removals count as
    /// evictions.
    pub fn clear_namespaces(&self, ns: &[u32]) -> Result<(u64, u64)> {
        if ns.is_empty() {
            return Ok((0, 0));
        }
        let r = self.core().evict(u64::MAX, &mut Namespaces(ns.iter().copied().collect()))?;
        Ok((r.entries, r.bytes))
    }

    /// Removes the stored blocks of `keys` in namespace `ns` and says, per
    /// key, whether it was removed (`false`: not stored, or pinned now: a
    /// pinned block stays until released). It is an eviction that picks
    /// these keys: it walks every stripe's LRU list, so it costs in
    /// proportion to the live blocks (a delete an engine rarely issues, not
    /// a data-path call); removals count as evictions.
    pub fn remove(&self, ns: u32, keys: &[Key]) -> Result<Vec<bool>> {
        let mut pick = Pick { ns, keys: keys.iter().copied().collect(), picked: Default::default() };
        if !keys.is_empty() {
            self.core().evict(u64::MAX, &mut pick)?;
        }
        // A key picked but found pinned was kept: removed is picked and gone.
        keys.iter().map(|k| Ok(pick.picked.contains(k) && !self.exists(ns, *k)?)).collect()
    }

    /// Whether `key` is stored (published, and not removed: a block an
    /// evictor is deciding about still is) in namespace `ns`. Takes no lock.
    pub fn exists(&self, ns: u32, key: Key) -> Result<bool> {
        if self.fenced() {
            return Err(Error::Core(cxlkv_core::Error::Revoked));
        }
        Ok(self.core().exists(ns, key)?)
    }

    /// Reserves every item or none: when any item cannot be reserved, the
    /// reservations already made are aborted and the first failing item is
    /// named (its key stays as it was; nothing is stored or lost).
    pub fn reserve_all(&self, ns: u32, items: &[ReserveItem]) -> core::result::Result<Vec<Handle>, ReserveRefused> {
        let node = self.core();
        let mut hs = vec![Err(CoreError::InvalidArgument); items.len()];
        if let Err(e) = node.reserve_batch(ns, items, &mut hs) {
            let took: Vec<Handle> = hs.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
            let _ = took.iter().try_for_each(|h| node.abort(h));
            return Err(ReserveRefused { index: None, error: e.into() });
        }
        match hs.iter().position(|r| r.is_err()) {
            None => Ok(hs.into_iter().filter_map(|r| r.ok()).collect()),
            Some(i) => {
                let error = hs[i].err().unwrap_or(CoreError::InvalidArgument).into();
                for h in hs.iter().filter_map(|r| r.as_ref().ok()) {
                    if let Err(e) = node.abort(h) {
                        return Err(ReserveRefused { index: Some(i), error: e.into() });
                    }
                }
                Err(ReserveRefused { index: Some(i), error })
            }
        }
    }

    /// Releases application lock `i` taken with grant sequence `seq` (from
    /// [`Node::lock_app`](cxlkv_core::node::Node)'s ticket).
    pub fn unlock_app(&self, i: u32, seq: u64) -> Result<()> {
        let l = &self.store().layout;
        if i >= l.caps.app_locks {
            return Err(CoreError::InvalidArgument.into());
        }
        Ok(self.core().unlock_app(Held { lock: l.locks().app(i), seq, floor: 0 })?)
    }

    /// The id of namespace `ns` in this region: registered on first use
    /// (one root record per namespace, see [`cxlkv_core::namespaces`]) and
    /// remembered by this node. Equal fields get one id on every node;
    /// fields that differ in anything never share one. `RootsFull` when the
    /// root table has no record left (size it with the `roots` capacity).
    pub fn namespace(&self, ns: &Namespace<'_>) -> Result<u32> {
        self.namespace_of_digest(ns.digest())
    }

    /// [`Node::namespace`] of a digest ([`Namespace::digest`]).
    pub fn namespace_of_digest(&self, d: [u8; 16]) -> Result<u32> {
        let known = self.namespaces.lock().unwrap_or_else(|e| e.into_inner()).get(&d).copied();
        if let Some(id) = known {
            return Ok(id);
        }
        let id = self.core().namespace_of_digest(d)?;
        self.namespaces.lock().unwrap_or_else(|e| e.into_inner()).insert(d, id);
        Ok(id)
    }

    /// The digest of registered namespace `id` (remembered once read);
    /// `None` for an id below 2^31 (an application's own number) or one no
    /// namespace is registered under.
    pub fn namespace_digest(&self, id: u32) -> Result<Option<[u8; 16]>> {
        let Some(i) = id.checked_sub(namespaces::REGISTERED) else { return Ok(None) };
        let known = self.namespaces.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|e| *e.1 == id).map(|e| *e.0);
        if known.is_some() {
            return Ok(known);
        }
        let st = self.store();
        if i >= st.layout.caps.n_roots {
            return Ok(None);
        }
        // SYNC: a namespace's record is written once, under the roots lock,
        // and never changed: a fresh read of it is its value for good.
        let r: cxlkv_core::layout::RootRecord = st.fresh(st.layout.root(i), Site("namespace.digest"))?;
        let bound = namespaces::binding_of(&r);
        // Remembered as the default tenant's id of the digest only when it
        // is (a tenant's namespace of the same digest is another id).
        if let Some((d, _)) = bound.filter(|(_, t)| t.slot == 0) {
            self.namespaces.lock().unwrap_or_else(|e| e.into_inner()).insert(d, id);
        }
        Ok(bound.map(|(d, _)| d))
    }

    /// The named root `name`, read without a lock.
    pub fn root(&self, name: &[u8]) -> Result<Root> {
        Ok(roots::get(self.store(), name)?)
    }

    /// The payload-area offset of `len` bytes at address `p` of this
    /// process; `OutOfBounds` when any of them lies outside the payload area
    /// (where allocations, roots' objects and blocks live). `p` is only
    /// compared, never read.
    pub fn payload_offset(&self, p: *const u8, len: u64) -> Result<u64> {
        let st = self.store();
        let off = (p as usize).checked_sub(st.view.base() as usize).ok_or(CoreError::OutOfBounds)? as u64;
        if !st.layout.payload.contains(off, len) {
            return Err(CoreError::OutOfBounds.into());
        }
        Ok(off)
    }

    /// The address in this process of `len` bytes at region offset `off`;
    /// `OutOfBounds` unless they lie in the payload area.
    pub fn payload_ptr(&self, off: u64, len: u64) -> Result<*mut u8> {
        let st = self.store();
        if !st.layout.payload.contains(off, len) {
            return Err(CoreError::OutOfBounds.into());
        }
        Ok(st.view.ptr(off, len, 1)?)
    }

    /// Publishes `len` bytes of the payload area at offset `off`, written
    /// with plain stores, to every host: their lines are written back and
    /// fenced, so they are in memory when this returns.
    pub fn flush_range(&self, off: u64, len: u64) -> Result<()> {
        let st = self.store();
        if !st.layout.payload.contains(off, len) {
            return Err(CoreError::OutOfBounds.into());
        }
        // SYNC: the caller's stores to [off, off+len) reach memory (reader:
        // another host after its `invalidate_range`).
        st.co.flush(&st.view, off, len, Site("platform.user.flush"))?;
        st.co.store_fence(Site("platform.user.flush.fence"));
        Ok(())
    }

    /// Copies `buf.len()` bytes of the payload area at offset `off` into
    /// `buf`, fresh from memory (this host's cached copies dropped first):
    /// what other hosts published with [`Node::write_range`] or
    /// [`Node::flush_range`]. `OutOfBounds` outside the payload area.
    pub fn read_range(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len() as u64;
        self.invalidate_range(off, len)?;
        Ok(self.store().view.copy_out(off, buf)?)
    }

    /// Copies `data` into the payload area at offset `off` and publishes it
    /// to every host (written back and fenced before this returns).
    /// `OutOfBounds` outside the payload area.
    pub fn write_range(&self, off: u64, data: &[u8]) -> Result<()> {
        let len = data.len() as u64;
        if !self.store().layout.payload.contains(off, len) {
            return Err(CoreError::OutOfBounds.into());
        }
        self.store().view.copy_in(off, data)?;
        self.flush_range(off, len)
    }

    /// Makes `len` bytes of the payload area at offset `off` fresh: drops
    /// this host's cached copies, so the next loads read what other hosts
    /// published.
    pub fn invalidate_range(&self, off: u64, len: u64) -> Result<()> {
        let st = self.store();
        if !st.layout.payload.contains(off, len) {
            return Err(CoreError::OutOfBounds.into());
        }
        // SYNC: fresh lines of [off, off+len) (writer: `flush_range` on the
        // publishing host).
        Ok(st.co.invalidate(&st.view, off, len, Site("platform.user.invalidate"))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flush::FlushMode;
    use crate::node::Options;
    use crate::region::Region;
    use cxlkv_core::layout::Capacities;

    fn node() -> Node {
        let caps = Capacities { max_nodes: 2, n_stripes: 2, entries_per_stripe: 8, ..Capacities::default() };
        let opts = Options { mode: FlushMode::Coherent, populate: false, ..Options::default() };
        Node::format_new(Region::memfd(8 << 20, false).unwrap(), caps, opts).unwrap()
    }

    fn item(k: u128) -> ReserveItem {
        ReserveItem { key: Key::from_u128(k), len: 64, tokens: 1 }
    }

    #[test]
    fn reserve_all_reserves_nothing_when_one_item_fails() {
        let c = node();
        let hs = c.reserve_all(1, &[item(1)]).unwrap();
        c.core().publish(&hs[0]).unwrap();
        // Key 1 exists: the batch fails at index 1 and key 2 is left free.
        let e = c.reserve_all(1, &[item(2), item(1), item(3)]).unwrap_err();
        assert_eq!(e.index, Some(1));
        assert_eq!(e.error.core(), Some(CoreError::Exists));
        assert!(c.exists(1, Key::from_u128(1)).unwrap());
        assert!(!c.exists(1, Key::from_u128(2)).unwrap());
        let again = c.reserve_all(1, &[item(2), item(3)]).unwrap();
        assert_eq!(again.len(), 2);
    }

    #[test]
    fn user_ranges_must_lie_in_the_payload_area() {
        let c = node();
        let p = c.payload_ptr(c.store().layout.payload.start, 4096).unwrap();
        assert_eq!(c.payload_offset(p, 4096).unwrap(), c.store().layout.payload.start);
        c.flush_range(c.store().layout.payload.start, 4096).unwrap();
        c.invalidate_range(c.store().layout.payload.start, 4096).unwrap();
        assert!(matches!(c.payload_ptr(0, 64), Err(Error::Core(CoreError::OutOfBounds))));
        assert!(matches!(c.flush_range(0, 64), Err(Error::Core(CoreError::OutOfBounds))));
        let end = c.store().layout.payload.end;
        assert!(matches!(c.invalidate_range(end - 32, 64), Err(Error::Core(CoreError::OutOfBounds))));
        assert!(matches!(c.payload_offset(core::ptr::null(), 0), Err(Error::Core(CoreError::OutOfBounds))));
    }
}
