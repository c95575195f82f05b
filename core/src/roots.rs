//! Named roots (TraCT §4.1): a small table from name to (offset, type tag,
//! size), so applications can publish their own structures in the region.
//! Changes take the roots lock; `get` reads without it and validates each
//! record's checksum.

use crate::coherence::{Coherence, Site};
use crate::hash::checksum32;
use crate::layout::RootRecord;
use crate::node::Node;
use crate::store::Store;
use crate::{Error, Result};

/// Longest root name in bytes.
pub const MAX_NAME: usize = 32;

/// A named root's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Root {
    /// View offset of the object.
    pub offset: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Application-defined type tag.
    pub tag: u32,
}

fn name_bytes(name: &[u8]) -> Result<[u8; MAX_NAME]> {
    if name.is_empty() || name.len() > MAX_NAME || name.contains(&0) {
        return Err(Error::InvalidArgument);
    }
    let mut b = [0u8; MAX_NAME];
    b.iter_mut().zip(name).for_each(|(d, s)| *d = *s);
    Ok(b)
}

fn record_sum(r: &RootRecord) -> u64 {
    let mut w = [0u64; 7];
    for (x, c) in w.iter_mut().zip(r.name.chunks_exact(8)) {
        let mut a = [0u8; 8];
        a.copy_from_slice(c);
        *x = u64::from_le_bytes(a);
    }
    let [.., off, size, tag] = &mut w;
    (*off, *size, *tag) = (r.offset, r.size, (r.tag as u64) << 32 | r.state as u64);
    checksum32(&w) as u64 | 1 << 63
}

/// True when a root record is in use and intact.
pub fn record_valid(r: &RootRecord) -> bool {
    r.state == 1 && r.checksum == record_sum(r)
}

/// Reads root `name` without a lock. `NotFound` if absent.
pub fn get<C: Coherence>(store: &Store<C>, name: &[u8]) -> Result<Root> {
    let (_, r) = find(store, name_bytes(name)?)?.ok_or(Error::NotFound)?;
    Ok(Root { offset: r.offset, size: r.size, tag: r.tag })
}

/// The index and record of the root named `want` (a whole name field),
/// read without a lock.
pub(crate) fn find<C: Coherence>(store: &Store<C>, want: [u8; MAX_NAME]) -> Result<Option<(u32, RootRecord)>> {
    let l = &store.layout;
    for i in 0..l.caps.n_roots {
        let r: RootRecord = store.fresh(l.root(i), Site("roots.get"))?;
        if r.name == want && record_valid(&r) {
            return Ok(Some((i, r)));
        }
    }
    Ok(None)
}

impl<C: Coherence> Node<'_, C> {
    /// Publishes root `name`. `Exists` if the name is taken (nothing written).
    pub fn root_put(&self, name: &[u8], root: Root) -> Result<()> {
        let want = name_bytes(name)?;
        if root.offset != 0 && !self.store.layout.payload.contains(root.offset, root.size) {
            return Err(Error::InvalidArgument);
        }
        self.with_lock(self.store.layout.locks().roots(), || self.root_put_locked(want, root).map(|_| ()))
    }

    /// Publishes root `want`; the caller holds the roots lock. Returns the
    /// record's index.
    pub(crate) fn root_put_locked(&self, want: [u8; MAX_NAME], root: Root) -> Result<u32> {
        let l = &self.store.layout;
        let mut free = None;
        let mut exists = false;
        for i in 0..l.caps.n_roots {
            let r: RootRecord = self.store.fresh(l.root(i), Site("roots.put.scan"))?;
            if record_valid(&r) {
                exists |= r.name == want;
            } else if free.is_none() {
                free = Some(i);
            }
        }
        if exists {
            return Err(Error::Exists);
        }
        let i = free.ok_or(Error::RootsFull)?;
        let mut r =
            RootRecord { name: want, offset: root.offset, size: root.size, tag: root.tag, state: 1, checksum: 0 };
        r.checksum = record_sum(&r);
        // SYNC: record published under the roots lock (reader: get).
        self.store.publish(l.root(i), &r, Site("roots.put"))?;
        Ok(i)
    }

    /// Removes root `name` (the object it names is not freed).
    ///
    /// The allocation it named is then named by nothing: should the node
    /// that allocated it die, recovery reclaims it, and a later
    /// [`Node::free`] of it fails or frees whatever was allocated there
    /// since. To free what the root named, use [`Node::root_free`].
    pub fn root_destroy(&self, name: &[u8]) -> Result<Root> {
        let want = name_bytes(name)?;
        self.with_lock(self.store.layout.locks().roots(), || {
            let (i, r) = self.root_find_locked(want)?;
            self.root_clear_locked(i)?;
            Ok(r)
        })
    }

    /// Removes root `name` and frees the raw allocation it names (from
    /// [`Node::alloc`], by any node), in one step: under the roots lock and
    /// the allocation's heap lock, so no recovery comes between (see
    /// [`Node::root_destroy`]). Returns what the root named.
    /// `InvalidArgument`, changing nothing, when the root names no live raw
    /// allocation; `Recovering`, changing nothing, while that allocation's
    /// heap awaits repair after its node's death (retry once recovered).
    pub fn root_free(&self, name: &[u8]) -> Result<Root> {
        let want = name_bytes(name)?;
        self.after_void_repairs(|| self.root_free_once(want))
    }

    fn root_free_once(&self, want: [u8; MAX_NAME]) -> Result<Root> {
        self.with_lock(self.store.layout.locks().roots(), || {
            let (i, r) = self.root_find_locked(want)?;
            // The record goes once the allocation is found, under its heap
            // lock; it comes back if the free is refused after all.
            self.free_raw_unlinking(r.offset, &mut |gone| {
                if gone {
                    self.root_clear_locked(i)
                } else {
                    self.root_put_locked(want, r).map(|_| ())
                }
            })?;
            Ok(r)
        })
    }

    /// The slot and value of root `want`; the caller holds the roots lock.
    pub(crate) fn root_find_locked(&self, want: [u8; MAX_NAME]) -> Result<(u32, Root)> {
        let l = &self.store.layout;
        for i in 0..l.caps.n_roots {
            let r: RootRecord = self.store.fresh(l.root(i), Site("roots.destroy.scan"))?;
            if record_valid(&r) && r.name == want {
                return Ok((i, Root { offset: r.offset, size: r.size, tag: r.tag }));
            }
        }
        Err(Error::NotFound)
    }

    /// Clears root slot `i`; the caller holds the roots lock.
    fn root_clear_locked(&self, i: u32) -> Result<()> {
        let l = &self.store.layout;
        // SYNC: cleared record published under the roots lock (reader: get).
        self.store.publish(l.root(i), &RootRecord::default(), Site("roots.destroy"))
    }
}
