//! Named roots (TraCT §4.1): a small table from name to (offset, type tag,
//! size), so applications can publish their own structures in the region.
//! Changes take the roots lock; `get` reads without it and validates each
//! record's checksum.

use crate::alloc::Unlink;
use crate::coherence::{Coherence, Site};
use crate::hash::checksum32;
use crate::layout::{RootRecord, MAX_NODES, ROOT_AT};
use crate::lock::{Held, JournalSites};
use crate::mutant::mutant;
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

/// [`RootRecord::state`] of a named root in use.
pub const ROOT_LIVE: u32 = 1;

/// [`RootRecord::state`] of a deferred free: a raw block freed while its
/// chunk is tainted (a node declared dead and not yet quiet may still
/// write back a map line of it, bringing back any block freed meanwhile).
/// The block's map bits stay set, and the record — nameless, never
/// returned by a lookup — holds it: the recovery that finds the chunk
/// untainted clears the record, then the bits (see `Node::free`).
pub const ROOT_DEFERRED_FREE: u32 = 2;

/// True when a root record is in use and intact.
pub fn record_valid(r: &RootRecord) -> bool {
    r.state == ROOT_LIVE && r.checksum == record_sum(r)
}

/// True when a root record is an intact deferred free
/// ([`ROOT_DEFERRED_FREE`]).
pub fn record_deferred(r: &RootRecord) -> bool {
    r.state == ROOT_DEFERRED_FREE && r.checksum == record_sum(r)
}

/// A deferred free of the raw block of `len` bytes at `off`, sealed.
fn deferred_record(off: u64, len: u64) -> RootRecord {
    let mut r = RootRecord { offset: off, size: len, state: ROOT_DEFERRED_FREE, ..RootRecord::default() };
    r.checksum = record_sum(&r);
    r
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
        let mut r = RootRecord {
            name: want,
            offset: root.offset,
            size: root.size,
            tag: root.tag,
            state: ROOT_LIVE,
            checksum: 0,
        };
        r.checksum = record_sum(&r);
        self.root_add_locked(&r, true)
    }

    /// Records a deferred free of the raw block of `len` bytes at `off`
    /// (see [`ROOT_DEFERRED_FREE`]); the caller holds the roots lock and
    /// the block's heap lock. `RootsFull` when no record is left.
    pub(crate) fn root_defer_free_locked(&self, off: u64, len: u64) -> Result<()> {
        self.root_add_locked(&deferred_record(off, len), false).map(|_| ())
    }

    /// Turns root slot `i` (a named root, found under the roots lock the
    /// caller holds) into a deferred free of the raw block of `len` bytes
    /// at `off`, in one write: the name goes and the block stays held.
    pub(crate) fn root_defer_in_place_locked(&self, i: u32, off: u64, len: u64) -> Result<()> {
        self.root_store(i, &deferred_record(off, len))
    }

    /// Writes `r` to a free root slot; the caller holds the roots lock.
    /// With `named`, `Exists` when a root of that name is there.
    fn root_add_locked(&self, r: &RootRecord, named: bool) -> Result<u32> {
        let l = &self.store.layout;
        let taken = self.roots_in_flight()?;
        let mut free = None;
        let mut exists = false;
        for i in 0..l.caps.n_roots {
            let x: RootRecord = self.store.fresh(l.root(i), Site("roots.put.scan"))?;
            if record_valid(&x) {
                exists |= named && x.name == r.name;
            } else if !named && record_deferred(&x) && x.offset == r.offset {
                // Its free is deferred already: a second free.
                return Err(Error::InvalidArgument);
            } else if free.is_none() && !record_deferred(&x) && !taken.contains(&i.wrapping_add(1)) {
                free = Some(i);
            }
        }
        if exists {
            return Err(Error::Exists);
        }
        let i = free.ok_or(Error::RootsFull)?;
        self.root_store(i, r)?;
        Ok(i)
    }

    /// Writes record `r` in root slot `i`; the caller holds the roots lock.
    fn root_store(&self, i: u32, r: &RootRecord) -> Result<()> {
        // SYNC: record published under the roots lock (readers: get,
        // recovery, check).
        self.root_write(i, r, Site("roots.put"))
    }

    /// The root slots (+ 1; 0 none) other nodes journal as being written
    /// (see [`Node::root_write`]): a woken node's write may land there
    /// still, so a put takes none of them. A live node's journal names a
    /// slot only while it holds the roots lock; a dead node's stays until
    /// its slot is attached again.
    fn roots_in_flight(&self) -> Result<[u32; MAX_NODES as usize]> {
        let l = &self.store.layout;
        let mut out = [0u32; MAX_NODES as usize];
        for n in 0..l.caps.max_nodes.min(MAX_NODES) {
            if n == self.id || mutant!("roots.put_ignores_journals") {
                continue;
            }
            let at = l.requests(n).wrapping_add(ROOT_AT);
            // SYNC: no invalidate: fresh enough from this host's copy. A
            // node journals, fences, then finds its roots grant standing:
            // so the revocation that ended its hold came after, and the
            // grant to this node after that, whose poll invalidated every
            // node's request line (see `Node::grant_is_current`).
            if let Some(x) = out.get_mut(n as usize) {
                *x = u32::try_from(self.store.view.load_u64(at)?).unwrap_or(u32::MAX);
            }
        }
        Ok(out)
    }

    /// Writes root slot `i`; the caller holds the roots lock. Root records
    /// carry no ticket, so a write that a node declared dead makes late
    /// (stopped, woken) could land over a root put since: the slot is
    /// journaled first and the grant checked (see
    /// [`Node::journal_then_check`]), and puts keep off journaled slots.
    fn root_write(&self, i: u32, r: &RootRecord, site: Site) -> Result<()> {
        let lock = self.store.layout.locks().roots();
        let held = Held { lock, seq: self.local.tickets.get(lock), floor: 0 };
        let unchecked = mutant!("roots.write_unchecked");
        self.journal_then_check(ROOT_AT, u64::from(i).wrapping_add(1), &held, &ROOT_JOURNAL, unchecked)?;
        self.store.publish(self.store.layout.root(i), r, site)?;
        self.clear_journal(ROOT_AT, &ROOT_JOURNAL)
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
            self.free_raw_unlinking(r.offset, &mut |u| match u {
                Unlink::Found => self.root_clear_locked(i).map(|_| false),
                Unlink::Undo => self.root_put_locked(want, r).map(|_| false),
                Unlink::Defer { len } => self.root_defer_in_place_locked(i, r.offset, len).map(|_| true),
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
    pub(crate) fn root_clear_locked(&self, i: u32) -> Result<()> {
        // SYNC: cleared record published under the roots lock (reader: get).
        self.root_write(i, &RootRecord::default(), Site("roots.destroy"))
    }
}

/// The sites of the root journal.
const ROOT_JOURNAL: JournalSites = JournalSites {
    write: Site("roots.journal"),
    fence: Site("roots.journal.fence"),
    check: Site("roots.check"),
    landed: Site("roots.landed"),
    clear: Site("roots.journal.clear"),
};
