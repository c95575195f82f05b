//! Tier directories: which blocks a host's SSD tier holds, readable by every
//! node of the rack.
//!
//! A host's tier (one node that owns the host's NVMe slot files) claims one
//! directory and is its only writer: an open-addressing table of records
//! (namespace, key, length), probed linearly from the key's home slot; a
//! removed record stays as a tombstone so probes go on past it. Any node
//! reads it without a lock (invalidate, then a sequence-word read), to learn
//! that a block missing from the region can be asked of that tier (through
//! its inbox), and eviction uses it to prefer blocks that survive on an SSD.
//!
//! A record is a hint, never data: the tier checks every block it reads
//! back against the slot's own header and checksum before it publishes it,
//! so a stale or damaged record costs a refused request, never wrong bytes.
//! A directory whose owner is not alive (or is a later node in its slot)
//! names nothing.

use crate::coherence::{Coherence, Site};
use crate::hash::{mix64, place, Key};
use crate::index::{EvictReport, Lru, Policy, Verdict};
use crate::layout::{
    Entry, NodeInfo, TierHead, TierRecord, NODE_ALIVE, NODE_DEAD, NODE_FENCED, TIER_EMPTY, TIER_GONE, TIER_LIVE,
};
use crate::mem::LINE;
use crate::mutant::mutant;
use crate::node::Node;
use crate::store::Store;
use crate::{Error, Result};

/// Records probed at most before a lookup gives up (a table kept at most
/// three quarters full, with tombstones compacted away, needs far fewer).
const MAX_PROBE: u32 = 512;

/// Where a block missing from the region may be found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiered {
    /// The directory that records it.
    pub dir: u32,
    /// The node owning that directory's tier: the one to ask.
    pub owner: u32,
    /// The block's length.
    pub len: u64,
}

fn home(ns: u32, key: Key, records: u32) -> u32 {
    // `records` is a power of two (validated capacities); other bits than
    // the stripe's.
    (mix64(place(ns, key) ^ 0x7469_6572) as u32) & records.wrapping_sub(1)
}

impl<C: Coherence> Store<C> {
    /// The owner of tier directory `d` when it is claimed by a node that is
    /// alive and still the one that claimed it.
    pub fn tier_owner(&self, d: u32) -> Result<Option<u32>> {
        self.tier_head_owner(d).map(|(_, o)| o)
    }

    /// Tier directory `d`'s head, read fresh, and its owner as
    /// [`Store::tier_owner`] finds it.
    pub(crate) fn tier_head_owner(&self, d: u32) -> Result<(TierHead, Option<u32>)> {
        self.tier_head_claim(d).map(|(head, o, _)| (head, o))
    }

    /// [`Store::tier_head_owner`], and whether the directory's claimant was
    /// declared dead and is not known quiet (DEAD or FENCED in the same
    /// incarnation): stopped, it may wake and write records back late, so
    /// its directory is not claimed again until recovery frees its slot.
    fn tier_head_claim(&self, d: u32) -> Result<(TierHead, Option<u32>, bool)> {
        let l = &self.layout;
        if d >= l.caps.tier_slots {
            return Err(Error::InvalidArgument);
        }
        // SYNC: fresh head (writer: a claim or a release, under the roots
        // lock).
        let head: TierHead = self.fresh(l.tier_head(d), Site("tier.head.read"))?;
        let Some(n) = head.owner.checked_sub(1).filter(|&n| n < l.caps.max_nodes) else {
            return Ok((head, None, false));
        };
        // SYNC: the owner's identity line, fresh enough for a hint: a tier
        // that died since is found out by the request sent to it (it gets no
        // answer), and one that attached since is another incarnation.
        let info: NodeInfo = self.fresh(l.node_info(n), Site("tier.owner.hint"))?;
        let same = info.incarnation == head.incarnation;
        let fenced = same && matches!(info.state, NODE_DEAD | NODE_FENCED);
        Ok((head, (info.state == NODE_ALIVE && same).then_some(n), fenced))
    }

    /// Whether any tier directory is claimed by a live node.
    pub fn tiers_active(&self) -> Result<bool> {
        for d in 0..self.layout.caps.tier_slots {
            if self.tier_owner(d)?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Finds `key` in the directories of live tiers.
    pub fn tier_find(&self, ns: u32, key: Key) -> Result<Option<Tiered>> {
        for d in 0..self.layout.caps.tier_slots {
            let Some(owner) = self.tier_owner(d)? else { continue };
            if let Some((_, r)) = self.tier_probe(d, ns, key, true)? {
                return Ok(Some(Tiered { dir: d, owner, len: r.len as u64 }));
            }
        }
        Ok(None)
    }

    /// Probes directory `d` for `key`: the slot and record of its live
    /// record. `fresh`: invalidate each line first (a reader; the owner
    /// reads its own lines as it wrote them).
    pub(crate) fn tier_probe(&self, d: u32, ns: u32, key: Key, fresh: bool) -> Result<Option<(u32, TierRecord)>> {
        let cap = self.layout.caps.tier_records;
        let mut i = home(ns, key, cap);
        for _ in 0..cap.min(MAX_PROBE) {
            let r = self.tier_record_read(d, i, fresh)?;
            match r.state {
                TIER_EMPTY => return Ok(None),
                TIER_LIVE if r.ns == ns && r.key_lo == key.lo && r.key_hi == key.hi => return Ok(Some((i, r))),
                TIER_LIVE | TIER_GONE => {}
                _ => return Err(Error::Corrupt),
            }
            i = i.wrapping_add(1) & cap.wrapping_sub(1);
        }
        Ok(None)
    }

    pub(crate) fn tier_record_read(&self, d: u32, i: u32, fresh: bool) -> Result<TierRecord> {
        let off = self.layout.tier_record(d, i);
        for _ in 0..64 {
            if fresh {
                // SYNC: fresh record line (writer: the directory's owner,
                // `TierDir::put` and `TierDir::remove`).
                self.co.invalidate(&self.view, off, LINE / 2, Site("tier.record.read"))?;
            }
            // A sequence-word read, as for index entries: the word, the
            // record, the word again.
            let a = self.view.load_u32(off)?;
            crate::mem::fence_acquire();
            let r: TierRecord = self.view.read(off)?;
            crate::mem::fence_acquire();
            let b = self.view.load_u32(off)?;
            if a == b && a & 1 == 0 && r.ver == a {
                return Ok(r);
            }
            core::hint::spin_loop();
        }
        Err(Error::Changed)
    }

    /// Every live record of directory `d` (for `check` and reports).
    pub fn tier_records(&self, d: u32, mut f: impl FnMut(u32, &TierRecord) -> Result<()>) -> Result<()> {
        for i in 0..self.layout.caps.tier_records {
            let r = self.tier_record_read(d, i, true)?;
            match r.state {
                TIER_LIVE => f(i, &r)?,
                TIER_EMPTY | TIER_GONE => {}
                _ => return Err(Error::Corrupt),
            }
        }
        Ok(())
    }
}

/// A claimed tier directory: its owner's handle for writing records. Only
/// the owner writes it, so it needs no lock; one `TierDir` per directory.
pub struct TierDir<'a, C: Coherence> {
    node: Node<'a, C>,
    dir: u32,
    live: u32,
    gone: u32,
}

impl<'a, C: Coherence> Node<'a, C> {
    /// Claims a tier directory for this node: one free, or whose owner is
    /// not alive any more (and, declared dead, was found quiet and freed),
    /// emptied. `Busy` when another live node of this
    /// host owns one (one tier per host), `TableFull` when every directory
    /// is taken, `InvalidArgument` when the region has none.
    pub fn tier_claim(&self, host_id: u64) -> Result<TierDir<'a, C>> {
        let st = self.store;
        let l = &st.layout;
        if l.caps.tier_slots == 0 {
            return Err(Error::InvalidArgument);
        }
        // This node's own identity line, as it wrote it at attach.
        let me: NodeInfo = st.view.read(l.node_info(self.id))?;
        let dir = self.with_lock(l.locks().roots(), || {
            let mut free = None;
            for d in 0..l.caps.tier_slots {
                match st.tier_head_claim(d)? {
                    (_, Some(n), _) if n == self.id => return Err(Error::Busy),
                    (head, Some(_), _) if head.host_id == host_id => return Err(Error::Busy),
                    (_, Some(_), _) => {}
                    // Its claimant may still write back records late.
                    (_, None, true) if !mutant!("tier.claim_from_fenced") => {}
                    (head, None, _) => {
                        free.get_or_insert((d, head));
                    }
                }
            }
            let (d, old) = free.ok_or(Error::TableFull)?;
            // Empty what a dead predecessor recorded, before the head names
            // the new owner (no reader trusts a directory whose owner is
            // dead, so none reads them meanwhile).
            let dir = TierDir { node: *self, dir: d, live: 0, gone: 0 };
            for i in 0..l.caps.tier_records {
                let r = st.tier_record_read(d, i, true)?;
                if r.state != TIER_EMPTY {
                    dir.write(i, TierRecord { state: TIER_EMPTY, ..r })?;
                }
            }
            let head = TierHead {
                owner: self.id.wrapping_add(1),
                incarnation: me.incarnation,
                host_id,
                epoch: old.epoch.wrapping_add(1),
                ..TierHead::default()
            };
            // SYNC: head published under the roots lock (reader: tier_owner).
            st.publish(l.tier_head(d), &head, Site("tier.claim.publish"))?;
            Ok(d)
        })?;
        Ok(TierDir { node: *self, dir, live: 0, gone: 0 })
    }
}

impl<'a, C: Coherence> TierDir<'a, C> {
    /// The directory's index.
    pub fn dir(&self) -> u32 {
        self.dir
    }

    /// Records the directory has room for (live ones: at most half).
    pub fn capacity(&self) -> u32 {
        self.node.store.layout.caps.tier_records
    }

    /// Live records.
    pub fn live(&self) -> u32 {
        self.live
    }

    /// Records a block as held by this tier. `TableFull` when the directory
    /// holds as many as it may (the tier removes some first), `Revoked` when
    /// this node was declared dead.
    pub fn put(&mut self, ns: u32, key: Key, len: u64) -> Result<()> {
        // A node declared dead writes no more records (`Revoked`); one
        // stopped past this check lands them in its own directory, which
        // no other tier claims until its node is found quiet.
        self.node.owns_slot()?;
        let st = self.node.store;
        let cap = st.layout.caps.tier_records;
        let len = u32::try_from(len).map_err(|_| Error::TooLarge)?;
        if let Some((i, mut r)) = st.tier_probe(self.dir, ns, key, false)? {
            r.len = len;
            return self.write(i, r);
        }
        if self.live.saturating_add(self.gone) >= (cap >> 2).saturating_mul(3) {
            if self.live >= cap >> 1 {
                return Err(Error::TableFull);
            }
            self.compact()?;
        }
        let mut i = home(ns, key, cap);
        for _ in 0..cap {
            let r = st.tier_record_read(self.dir, i, false)?;
            if r.state != TIER_LIVE {
                if r.state == TIER_GONE {
                    self.gone = self.gone.saturating_sub(1);
                }
                self.live = self.live.saturating_add(1);
                let rec = TierRecord { ver: r.ver, state: TIER_LIVE, key_lo: key.lo, key_hi: key.hi, ns, len };
                return self.write(i, rec);
            }
            i = i.wrapping_add(1) & cap.wrapping_sub(1);
        }
        Err(Error::TableFull)
    }

    /// Removes the record of a block; false when there was none. `Revoked`
    /// when this node was declared dead.
    pub fn remove(&mut self, ns: u32, key: Key) -> Result<bool> {
        self.node.owns_slot()?;
        let Some((i, r)) = self.node.store.tier_probe(self.dir, ns, key, false)? else { return Ok(false) };
        self.live = self.live.saturating_sub(1);
        self.gone = self.gone.saturating_add(1);
        self.write(i, TierRecord { state: TIER_GONE, ..r })?;
        Ok(true)
    }

    /// Rewrites the table without tombstones (a reader probing meanwhile
    /// may miss a block: a miss, never a wrong answer).
    fn compact(&mut self) -> Result<()> {
        let st = self.node.store;
        let cap = st.layout.caps.tier_records;
        // Tombstones become empty; then live records whose chain that broke
        // move up.
        for i in 0..cap {
            let r = st.tier_record_read(self.dir, i, false)?;
            if r.state == TIER_GONE {
                self.write(i, TierRecord { state: TIER_EMPTY, ..r })?;
            }
        }
        // Each live record moves to the first empty slot of its probe chain
        // if one lies before it; moving one empties a slot other chains may
        // run through, so passes repeat until none moves (each move brings
        // a record strictly nearer its home, so they end).
        loop {
            let mut moved = false;
            for i in 0..cap {
                let r = st.tier_record_read(self.dir, i, false)?;
                if r.state != TIER_LIVE {
                    continue;
                }
                let mut j = home(r.ns, Key { lo: r.key_lo, hi: r.key_hi }, cap);
                while j != i {
                    let x = st.tier_record_read(self.dir, j, false)?;
                    if x.state == TIER_EMPTY {
                        self.write(j, TierRecord { ver: x.ver, ..r })?;
                        self.write(i, TierRecord { state: TIER_EMPTY, ..r })?;
                        moved = true;
                        break;
                    }
                    j = j.wrapping_add(1) & cap.wrapping_sub(1);
                }
            }
            if !moved {
                break;
            }
        }
        self.gone = 0;
        Ok(())
    }

    fn write(&self, i: u32, mut r: TierRecord) -> Result<()> {
        let st = self.node.store;
        let off = st.layout.tier_record(self.dir, i);
        // A sequence word, as for index entries: odd while the record
        // changes, so a same-host reader never takes a torn record.
        let stable = r.ver & !1;
        st.view.store_u32(off, stable.wrapping_add(1))?;
        crate::mem::fence_seq_cst();
        r.ver = stable.wrapping_add(1);
        st.view.write(off, &r)?;
        crate::mem::fence_seq_cst();
        st.view.store_u32(off, stable.wrapping_add(2))?;
        // SYNC: the record line reaches memory (reader: `tier_find`); the
        // fence orders it before what the owner does next (a reply that
        // the block is on SSD, or the slot's reuse).
        st.co.flush(&st.view, off, LINE / 2, Site("tier.record.write"))?;
        st.co.store_fence(Site("tier.record.fence"));
        Ok(())
    }

    /// Lets go of the directory: its records are emptied, then its head.
    pub fn release(self) -> Result<()> {
        let st = self.node.store;
        let l = &st.layout;
        self.node.with_lock(l.locks().roots(), || {
            let (head, _) = st.tier_head_owner(self.dir)?;
            if head.owner != self.node.id.wrapping_add(1) {
                return Ok(());
            }
            // SYNC: head published under the roots lock (reader: tier_owner).
            st.publish(l.tier_head(self.dir), &TierHead { owner: 0, ..head }, Site("tier.release.publish"))
        })
    }
}

/// Oldest entries of a stripe [`Node::evict_for`] looks at for blocks an
/// SSD tier holds before it evicts by LRU.
const TIERED_DEPTH: u32 = 16;

impl<C: Coherence> Node<'_, C> {
    /// Evicts at least `bytes` to make room for new blocks: first blocks a
    /// live SSD tier holds (evicting them loses nothing; see `tier.rs`),
    /// among the oldest of each stripe, then by LRU what is still needed.
    pub fn evict_for(&self, bytes: u64) -> Result<EvictReport> {
        let mut rep = EvictReport::default();
        if self.store.tiers_active()? {
            rep = self.evict(bytes, &mut PreferTiered::new(self.store, TIERED_DEPTH))?;
        }
        if rep.bytes < bytes {
            let more = self.evict(bytes.saturating_sub(rep.bytes), &mut Lru)?;
            rep.entries = rep.entries.saturating_add(more.entries);
            rep.bytes = rep.bytes.saturating_add(more.bytes);
            rep.deferred = rep.deferred.saturating_add(more.deferred);
        }
        Ok(rep)
    }
}

/// An eviction policy that takes only blocks a live tier holds on SSD
/// (evicting them loses nothing), looking at the `depth` oldest candidates
/// of each stripe; the caller evicts by LRU what it still needs after.
pub struct PreferTiered<'s, C: Coherence> {
    store: &'s Store<C>,
    depth: u32,
    stripe: u32,
    seen: u32,
}

impl<'s, C: Coherence> PreferTiered<'s, C> {
    /// A policy over `store`'s tier directories.
    pub fn new(store: &'s Store<C>, depth: u32) -> Self {
        PreferTiered { store, depth, stripe: u32::MAX, seen: 0 }
    }
}

impl<C: Coherence> Policy for PreferTiered<'_, C> {
    fn consider(&mut self, stripe: u32, entry: &Entry) -> Verdict {
        if stripe != self.stripe {
            self.stripe = stripe;
            self.seen = 0;
        }
        self.seen = self.seen.saturating_add(1);
        if self.seen > self.depth {
            return Verdict::Stop;
        }
        let key = Key { lo: entry.key_lo, hi: entry.key_hi };
        match self.store.tier_find(entry.ns, key) {
            Ok(Some(t)) if t.len == entry.payload_len as u64 => Verdict::Evict,
            _ => Verdict::Skip,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::vec::Vec;

    use super::*;
    use crate::check::FindingKind;
    use crate::testutil::{findings, with_two_nodes};

    fn key(i: u64) -> Key {
        Key { lo: i.wrapping_mul(0x9e37_79b9_7f4a_7c15), hi: i ^ 0x5151 }
    }

    #[test]
    fn records_are_found_by_any_node_until_removed() {
        with_two_nodes(|f, _, a, b| {
            assert!(!f.store.tiers_active().unwrap());
            let mut dir = a.tier_claim(1).unwrap();
            assert!(f.store.tiers_active().unwrap());
            for i in 0..10 {
                dir.put(4, key(i), 1000 + i).unwrap();
            }
            let got = b.store.tier_find(4, key(3)).unwrap().unwrap();
            assert_eq!(got, Tiered { dir: dir.dir(), owner: a.id, len: 1003 });
            assert_eq!(b.store.tier_find(5, key(3)).unwrap(), None, "other namespace");
            assert_eq!(b.store.tier_find(4, key(99)).unwrap(), None);
            assert!(dir.remove(4, key(3)).unwrap());
            assert!(!dir.remove(4, key(3)).unwrap());
            assert_eq!(b.store.tier_find(4, key(3)).unwrap(), None);
            assert!(b.store.tier_find(4, key(4)).unwrap().is_some(), "a probe goes on past a tombstone");
            assert_eq!(dir.live(), 9);
            assert!(findings(f).is_empty(), "{:?}", findings(f));
            dir.release().unwrap();
            assert_eq!(b.store.tier_find(4, key(4)).unwrap(), None, "a released directory names nothing");
        });
    }

    #[test]
    fn churn_past_capacity_compacts_and_keeps_every_live_record_reachable() {
        with_two_nodes(|f, _, a, b| {
            let mut dir = a.tier_claim(1).unwrap();
            let cap = f.store.layout.caps.tier_records as u64;
            let mut live: Vec<u64> = Vec::new();
            for i in 0..cap * 8 {
                if live.len() as u64 >= cap / 2 {
                    let gone = live.remove((i as usize * 7) % live.len());
                    assert!(dir.remove(1, key(gone)).unwrap());
                }
                dir.put(1, key(i), 64).unwrap();
                live.push(i);
            }
            for &i in &live {
                assert!(b.store.tier_find(1, key(i)).unwrap().is_some(), "key {i}");
            }
            let mut more = 0u64;
            while dir.put(1, key(10_000 + more), 64).is_ok() {
                more += 1;
            }
            let full = dir.live() as u64;
            assert!((cap / 2..=cap / 4 * 3).contains(&full), "{full} live records when full");
            assert!(findings(f).is_empty(), "{:?}", findings(f));
        });
    }

    #[test]
    fn one_tier_per_host_and_a_dead_owners_directory_is_claimed_empty() {
        with_two_nodes(|f, env, a, b| {
            let mut dir = b.tier_claim(1).unwrap();
            dir.put(2, key(1), 100).unwrap();
            assert_eq!(b.tier_claim(2).err(), Some(Error::Busy), "a node owns one directory");
            assert_eq!(a.tier_claim(1).err(), Some(Error::Busy), "one tier per host");
            // Node 1 dies: its directory names nothing, and node 0 (another
            // host) claims it emptied.
            *env.killed.lock() = 1 << 1;
            env.step().unwrap();
            a.recover(0).unwrap();
            assert_eq!(f.store.tier_owner(dir.dir()).unwrap(), None);
            assert_eq!(a.store.tier_find(2, key(1)).unwrap(), None);
            let d2 = a.tier_claim(2).unwrap();
            assert_eq!(d2.dir(), dir.dir(), "the dead owner's directory is reused");
            let mut n = 0;
            f.store
                .tier_records(d2.dir(), |_, _| {
                    n += 1;
                    Ok(())
                })
                .unwrap();
            assert_eq!(n, 0);
        });
    }

    #[test]
    fn check_reports_duplicate_and_malformed_records() {
        with_two_nodes(|f, _, a, _| {
            let mut dir = a.tier_claim(1).unwrap();
            dir.put(2, key(1), 100).unwrap();
            dir.put(2, key(2), 100).unwrap();
            let l = &f.store.layout;
            let (mut i1, mut i2) = (None, None);
            f.store
                .tier_records(dir.dir(), |i, r| {
                    if r.key_hi == key(1).hi {
                        i1 = Some(i)
                    } else {
                        i2 = Some(i)
                    }
                    Ok(())
                })
                .unwrap();
            // Record 2 made a copy of record 1 (same key), then a bad state.
            let r1: TierRecord = f.store.view.read(l.tier_record(dir.dir(), i1.unwrap())).unwrap();
            let at2 = l.tier_record(dir.dir(), i2.unwrap());
            f.store.view.write(at2, &r1).unwrap();
            let kinds: Vec<_> = findings(f).iter().map(|x| x.kind).collect();
            assert!(
                kinds.contains(&FindingKind::TierDuplicate) || kinds.contains(&FindingKind::TierRecord),
                "{kinds:?}"
            );
            f.store.view.write(at2, &TierRecord { state: 9, ..r1 }).unwrap();
            let kinds: Vec<_> = findings(f).iter().map(|x| x.kind).collect();
            assert!(kinds.contains(&FindingKind::TierRecord), "{kinds:?}");
        });
    }

    #[test]
    fn eviction_for_room_takes_tiered_blocks_first() {
        with_two_nodes(|f, _, a, b| {
            let mut dir = a.tier_claim(1).unwrap();
            // Fill the region with blocks; every third is on the tier.
            let mut stored = Vec::new();
            for i in 0.. {
                match b.reserve(1, key(i), 40_000, 1) {
                    Ok(h) => {
                        b.publish(&h).unwrap();
                        stored.push(i);
                    }
                    Err(_) => break,
                }
                if stored.len() >= 60 {
                    break;
                }
            }
            let tiered: Vec<u64> = stored.iter().copied().filter(|i| i % 3 == 0).collect();
            for &i in &tiered {
                dir.put(1, key(i), 40_000).unwrap();
            }
            let rep = b.evict_for(40_000 * 4).unwrap();
            assert!(rep.entries >= 4);
            let gone: Vec<u64> = stored.iter().copied().filter(|&i| b.lookup(1, &[key(i)]).unwrap() == 0).collect();
            assert!(!gone.is_empty());
            assert!(gone.iter().all(|i| i % 3 == 0), "only tiered blocks evicted: {gone:?}");
            assert!(findings(f).is_empty(), "{:?}", findings(f));
        });
    }
}
