//! Registered namespaces: a namespace's 128-bit identity
//! ([`Namespace::digest`]) stored once in the region, and the 32-bit id the
//! cache operations take.
//!
//! A namespace is registered as a named root: its record's name holds the
//! digest (behind a zero byte, so no application name can equal it, and
//! `root_get`, `root_destroy` and `root_free` never reach it), tag
//! [`NAMESPACE_TAG`]. The id is [`REGISTERED`] plus the record's index. The
//! roots lock makes one digest take one record, and a record is never
//! removed, so two namespaces that differ in any field never share an id:
//! isolation rests on the 128-bit digest, not on a 32-bit hash. Ids below
//! [`REGISTERED`] are plain numbers an application picks itself.

use crate::coherence::Coherence;
use crate::hash::Namespace;
use crate::layout::RootRecord;
use crate::node::Node;
use crate::roots::{self, Root, MAX_NAME};
use crate::store::Store;
use crate::tenants::{TenantId, DEFAULT_TENANT};
use crate::{Error, Result};

/// The first registered id: ids from here on name root records.
pub const REGISTERED: u32 = 1 << 31;

/// Type tag of the root records that hold registered namespaces.
pub const NAMESPACE_TAG: u32 = u32::from_le_bytes(*b"NSPC");

const PREFIX: [u8; 4] = *b"\0ns1";

/// Root name of the namespace with digest `d` of tenant `t`: the prefix,
/// the digest, the tenant's slot and nonce (zeros for the default tenant),
/// zeros.
fn record_name(d: [u8; 16], t: TenantId) -> [u8; MAX_NAME] {
    let mut name = [0u8; MAX_NAME];
    let (slot, nonce) = if t.slot == 0 { (0, 0) } else { (t.slot, t.nonce) };
    let tail = slot.to_le_bytes().into_iter().chain(nonce.to_le_bytes());
    for (dst, src) in name.iter_mut().zip(PREFIX.iter().copied().chain(d).chain(tail)) {
        *dst = src;
    }
    name
}

/// The digest and tenant a root record holds, when it is a registered
/// namespace's (valid, tagged [`NAMESPACE_TAG`], named by [`record_name`]).
pub fn binding_of(r: &RootRecord) -> Option<([u8; 16], TenantId)> {
    let (prefix, rest) = r.name.split_first_chunk::<4>()?;
    let (d, rest) = rest.split_first_chunk::<16>()?;
    let (slot, rest) = rest.split_first_chunk::<4>()?;
    let (nonce, zeros) = rest.split_first_chunk::<4>()?;
    let ours = roots::record_valid(r) && r.tag == NAMESPACE_TAG && *prefix == PREFIX;
    let t = TenantId { slot: u32::from_le_bytes(*slot), nonce: u32::from_le_bytes(*nonce) };
    (ours && zeros.iter().all(|&b| b == 0)).then_some((*d, t))
}

/// The digest a root record holds, when it is a registered namespace's.
pub fn digest_of(r: &RootRecord) -> Option<[u8; 16]> {
    binding_of(r).map(|(d, _)| d)
}

/// The id of the default tenant's namespace with digest `d`, read without a
/// lock; `None` when it is not registered.
pub fn find<C: Coherence>(store: &Store<C>, d: [u8; 16]) -> Result<Option<u32>> {
    find_in(store, d, DEFAULT_TENANT)
}

/// The id of tenant `t`'s namespace with digest `d`, read without a lock.
pub fn find_in<C: Coherence>(store: &Store<C>, d: [u8; 16], t: TenantId) -> Result<Option<u32>> {
    Ok(roots::find(store, record_name(d, t))?.filter(|(_, r)| r.tag == NAMESPACE_TAG).map(|(i, _)| REGISTERED | i))
}

impl<C: Coherence> Node<'_, C> {
    /// The id of namespace `ns` in this region, registering it on first
    /// use. Every node that registers equal fields gets the same id, for as
    /// long as the region is not formatted again; unequal fields never get
    /// one id. `RootsFull` when the root table has no record left.
    pub fn namespace(&self, ns: &Namespace<'_>) -> Result<u32> {
        self.namespace_of_digest(ns.digest())
    }

    /// [`Node::namespace`] of a digest computed elsewhere.
    pub fn namespace_of_digest(&self, d: [u8; 16]) -> Result<u32> {
        self.namespace_in(DEFAULT_TENANT, d)
    }

    /// The id of tenant `t`'s namespace of digest `d`, registering it on
    /// first use; `NoTenant` when `t` is not a live tenant. Its blocks count
    /// to `t` (see `tenants.rs`); the same digest in another tenant is
    /// another namespace.
    pub fn namespace_in(&self, t: TenantId, d: [u8; 16]) -> Result<u32> {
        if let Some(id) = find_in(self.store, d, t)? {
            return Ok(id);
        }
        if t.slot != 0 {
            // Registered for a tenant live now (a namespace of one dropped
            // meanwhile takes no blocks: its reserves are refused).
            self.tenant_live(t)?;
        }
        self.with_lock(self.store.layout.locks().roots(), || self.register_locked_in(d, t))
    }

    /// Registers digest `d` (or finds it registered); the caller holds the
    /// roots lock.
    #[cfg(test)]
    pub(crate) fn register_locked(&self, d: [u8; 16]) -> Result<u32> {
        self.register_locked_in(d, DEFAULT_TENANT)
    }

    fn register_locked_in(&self, d: [u8; 16], t: TenantId) -> Result<u32> {
        let name = record_name(d, t);
        // The put scans the table and refuses an equal name: another node
        // registered it since the caller's scan, and its record is the one.
        match self.root_put_locked(name, Root { offset: 0, size: 0, tag: NAMESPACE_TAG }) {
            Ok(i) => Ok(REGISTERED | i),
            Err(Error::Exists) => Ok(REGISTERED | self.root_find_locked(name)?.0),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Capacities;
    use crate::node::NodeLocal;
    use crate::testutil::{findings, node, small_caps, with_two_nodes, Fixture, InlineEnv};

    #[test]
    fn equal_fields_get_one_id_and_unequal_ones_never_share() {
        with_two_nodes(|f, _, a, b| {
            let base = Namespace { model: b"m", ..Namespace::default() };
            let other = Namespace { salt: b"tenant-2", ..base };
            let ia = a.namespace(&base).unwrap();
            assert!(ia >= REGISTERED);
            assert_eq!(b.namespace(&base).unwrap(), ia, "another node, the same fields");
            let ib = b.namespace(&other).unwrap();
            assert_ne!(ia, ib);
            assert_eq!(find(&f.store, base.digest()).unwrap(), Some(ia));
            assert_eq!(find(&f.store, Namespace::default().digest()).unwrap(), None);
            let rec: RootRecord = f.store.view.read(f.store.layout.root(ia - REGISTERED)).unwrap();
            assert_eq!(digest_of(&rec), Some(base.digest()));
            assert_eq!(digest_of(&RootRecord::default()), None);
            // Registered meanwhile by another node (after this one's scan
            // missed it): the locked put finds it, one record all the same.
            let locked = b.with_lock(f.store.layout.locks().roots(), || b.register_locked(other.digest()));
            assert_eq!(locked.unwrap(), ib);
            // No application name reaches a namespace's record.
            assert_eq!(a.root_destroy(b"ns1").unwrap_err(), Error::NotFound);
            assert_eq!(a.namespace(&other).unwrap(), ib);
            assert!(findings(f).is_empty());
        });
    }

    #[test]
    fn namespaces_differing_in_any_field_never_share_a_block() {
        let f = Fixture::new(8 << 20, Capacities { n_roots: 16, ..small_caps() });
        f.attach(0);
        f.attach(1);
        let env = InlineEnv::new(&f.store);
        let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
        let (a, b) = (node(&f, &env, &l0, 0), node(&f, &env, &l1, 1));
        {
            let base = Namespace { model: b"llama", tp_size: 2, block_tokens: 16, ..Namespace::default() };
            let all = crate::hash::each_field_changed(base);
            let variants = &all[1..];
            let key = crate::hash::Key { lo: 0x1234, hi: 0x5678 };
            let h = a.reserve(a.namespace(&base).unwrap(), key, 100, 1).unwrap();
            a.publish(&h).unwrap();
            assert_eq!(b.lookup(b.namespace(&base).unwrap(), &[key]).unwrap(), 1, "the same fields share it");
            for (i, v) in variants.iter().enumerate() {
                assert_eq!(b.lookup(b.namespace(v).unwrap(), &[key]).unwrap(), 0, "variant {i}");
            }
        }
    }

    #[test]
    fn a_full_root_table_is_a_clear_error() {
        with_two_nodes(|f, _, a, _| {
            let n = f.store.layout.caps.n_roots;
            let salts: std::vec::Vec<[u8; 4]> = (0..=n).map(|i| i.to_le_bytes()).collect();
            for s in salts.iter().take(n as usize) {
                a.namespace(&Namespace { salt: s, ..Namespace::default() }).unwrap();
            }
            let last = Namespace { salt: &salts[n as usize], ..Namespace::default() };
            assert_eq!(a.namespace(&last).unwrap_err(), Error::RootsFull);
            // Those registered keep their ids.
            let first = Namespace { salt: &salts[0], ..Namespace::default() };
            assert_eq!(a.namespace(&first).unwrap(), REGISTERED);
        });
    }
}
