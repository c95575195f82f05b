//! Eviction: the mechanism walks a stripe's LRU list from its oldest entry and
//! removes unpinned READY entries; a [`Policy`] decides which ones. LRU (evict
//! every candidate, oldest first) is the default.

use crate::coherence::{Coherence, Site};
use crate::layout::{state, Entry};
use crate::mutant::mutant;
use crate::node::Node;
use crate::{Error, Result};

use super::{probe, HeldStripe, NIL};

/// A policy's answer for one candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Evict it.
    Evict,
    /// Keep it, look at the next one.
    Skip,
    /// Stop looking in this stripe.
    Stop,
}

/// Chooses victims among unpinned READY entries, offered oldest first.
pub trait Policy {
    /// Decides about `entry` of `stripe`.
    fn consider(&mut self, stripe: u32, entry: &Entry) -> Verdict;

    /// Whether this eviction acts for the blocks' own tenant (its quota, a
    /// drop, a removal of keys or namespaces it asked for): then tenants'
    /// guaranteed shares do not hold against it. An eviction that makes
    /// room for anyone leaves every tenant its share (see `tenants.rs`).
    fn for_owner(&self) -> bool {
        false
    }
}

/// Blocks an eviction frees together, under one heap-lock hold per chunk
/// owner in a row.
const FREE_BATCH: usize = 32;

/// Stripes an eviction spreads its bytes over at first (it visits more
/// when those do not have them).
const EVICT_SPREAD: u32 = 8;

/// Bytes an eviction takes from one stripe at least, where it can (fewer
/// stripes for a smaller eviction: a chunk's worth goes from two).
const EVICT_SHARE: u64 = 1 << 20;

/// Least recently used: evicts candidates in LRU order.
#[derive(Clone, Copy, Debug, Default)]
pub struct Lru;

impl Policy for Lru {
    fn consider(&mut self, _stripe: u32, _entry: &Entry) -> Verdict {
        Verdict::Evict
    }
}

/// What an eviction freed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvictReport {
    /// Entries removed.
    pub entries: u64,
    /// Payload bytes of the entries removed.
    pub bytes: u64,
    /// Of those, bytes whose blocks stay allocated until a pending recovery
    /// (their chunk owner's heap awaits repair) reclaims them.
    pub deferred: u64,
}

/// One entry eviction removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Evicted {
    /// Its payload length.
    pub len: u64,
    /// Its block is freed only by the pending recovery.
    pub deferred: bool,
}

impl<C: Coherence> Node<'_, C> {
    /// Evicts at least `bytes` of payload if enough is unpinned, spreading the
    /// work over stripes round-robin.
    pub fn evict(&self, bytes: u64, policy: &mut dyn Policy) -> Result<EvictReport> {
        let st = self.store;
        let ns = st.layout.caps.n_stripes;
        let mut rep = EvictReport::default();
        let expiring = self.lifetimes_hint();
        let start = {
            let mut c = self.local.evict_cursor.lock();
            let v = *c;
            // One stripe on, whatever this call visits: every stripe gets
            // to be the first visited in turn.
            *c = c.wrapping_add(1);
            v
        };
        loop {
            let before = rep.entries;
            for k in 0..ns {
                if rep.bytes >= bytes {
                    break;
                }
                // `ns` is a power of two (the layout checks it); `k < ns`.
                let s = (start.wrapping_add(k)) & ns.wrapping_sub(1);
                // Over a few stripes at a time: each visit is a stripe-lock
                // round trip and a heap-lock hold, so two blocks from every
                // stripe would cost one of each a block.
                let few = (bytes / EVICT_SHARE).clamp(1, u64::from(EVICT_SPREAD)) as u32;
                let spread = ns.saturating_sub(k).clamp(1, few);
                let share = bytes.saturating_sub(rep.bytes).div_ceil(spread as u64);
                self.with_stripe(s, |h| {
                    self.refresh_touched_locked(s, h)?;
                    let mut got = 0u64;
                    let mut more = true;
                    // Expired blocks first (a pass for them alone, on from
                    // where it left off), then the policy's choice in LRU
                    // order.
                    let mut expired_only = expiring;
                    let mut cursor = h.lru_head;
                    while got < share && more {
                        // Entries removed first, then their blocks freed
                        // together (one heap-lock round trip for a run of
                        // blocks of one chunk owner).
                        let mut taken = [(0u64, 0u64); FREE_BATCH];
                        let mut n = 0usize;
                        let mut failed = Ok(());
                        while got < share && n < FREE_BATCH {
                            let from = if expired_only { Some(&mut cursor) } else { None };
                            match self.remove_one_locked(s, h, policy, from) {
                                Ok(Some((off, len))) => {
                                    if let Some(t) = taken.get_mut(n) {
                                        *t = (off, len);
                                    }
                                    n = n.saturating_add(1);
                                    got = got.saturating_add(len);
                                }
                                Ok(None) if expired_only => expired_only = false,
                                Ok(None) => {
                                    more = false;
                                    break;
                                }
                                Err(e) => {
                                    // What was removed is still freed.
                                    failed = Err(e);
                                    more = false;
                                    break;
                                }
                            }
                        }
                        let taken = taken.get(..n).unwrap_or(&[]);
                        let mut offs = [0u64; FREE_BATCH];
                        for (o, &(off, _)) in offs.iter_mut().zip(taken) {
                            *o = off;
                        }
                        let mut freed = [Ok(()); FREE_BATCH];
                        // SYNC: the header is flushed before unlock; each
                        // payload is freed only after its entry is EMPTY:
                        // `free_kv_batch` takes the heap lock, which fences
                        // first.
                        self.free_kv_batch(offs.get(..n).unwrap_or(&[]), &mut freed)?;
                        for (&(_, len), r) in taken.iter().zip(freed) {
                            match r {
                                Ok(()) => {}
                                // The block stays allocated until the pending
                                // recovery reclaims it (no entry references it).
                                Err(Error::Recovering) => rep.deferred = rep.deferred.saturating_add(len),
                                Err(e) => return Err(e),
                            }
                            rep.entries = rep.entries.saturating_add(1);
                            rep.bytes = rep.bytes.saturating_add(len);
                        }
                        failed?;
                    }
                    st.put_hdr(s, h)
                })?;
            }
            if rep.bytes >= bytes || rep.entries == before {
                break;
            }
        }
        if rep.entries > 0 {
            self.count(|c| c.evictions = c.evictions.wrapping_add(rep.entries))?;
        }
        Ok(rep)
    }

    /// The oldest published blocks of stripe `s`, oldest first, at most
    /// `out.len()`: (namespace, key, length). Read under the stripe lock, so
    /// the list is whole; the blocks may be gone by the time the caller
    /// acts (an SSD tier choosing what to copy out next pins them first).
    pub fn coldest(&self, s: u32, out: &mut [(u32, crate::hash::Key, u64)]) -> Result<usize> {
        let st = self.store;
        if s >= st.layout.caps.n_stripes {
            return Err(Error::InvalidArgument);
        }
        self.with_stripe(s, |h| {
            let (mut e, mut n) = (h.lru_head, 0usize);
            for _ in 0..st.layout.caps.entries_per_stripe {
                if e == NIL || n >= out.len() {
                    break;
                }
                let ent = st.ent_held(s, e, h)?;
                if ent.state == state::READY {
                    if let Some(o) = out.get_mut(n) {
                        *o = (ent.ns, crate::hash::Key { lo: ent.key_lo, hi: ent.key_hi }, ent.payload_len as u64);
                        n = n.saturating_add(1);
                    }
                }
                e = ent.lru_next;
            }
            Ok(n)
        })
    }

    /// Evicts one entry of stripe `s` chosen by `policy`, or returns `None`
    /// when no candidate was taken. Caller holds the lock.
    pub(crate) fn evict_one_locked(
        &self,
        s: u32,
        h: &mut HeldStripe,
        policy: &mut dyn Policy,
    ) -> Result<Option<Evicted>> {
        let Some((off, len)) = self.remove_one_locked(s, h, policy, None)? else {
            return Ok(None);
        };
        // SYNC: the header is flushed by the caller before unlock; the
        // payload is freed only after the entry is EMPTY: `free_kv` takes
        // the heap lock, which fences first.
        let deferred = match self.free_kv(off) {
            Ok(()) => false,
            // The block stays allocated until the pending recovery reclaims
            // it (no entry references it).
            Err(Error::Recovering) => true,
            Err(e) => return Err(e),
        };
        Ok(Some(Evicted { len, deferred }))
    }

    /// Whether any tenant of the region has a lifetime, as its table reads
    /// without a lock: an eviction then looks for expired blocks first.
    fn lifetimes_hint(&self) -> bool {
        let l = &self.store.layout;
        let (off, len) = (l.tenants.start, l.tenants.len());
        // SYNC: fresh tenant table (writer: `tenant_add` / `tenant_set`
        // under each tenant's lock). A hint: read stale, an eviction takes
        // expired blocks in LRU order instead of first; none is ever read
        // (readers check each block's own stamp).
        if self.store.co.invalidate(&self.store.view, off, len, Site("evict.lifetimes.hint")).is_err() {
            return false;
        }
        (1..l.caps.max_tenants).any(|t| {
            self.store.view.read::<crate::layout::TenantConfig>(l.tenant_config(t)).is_ok_and(|c| {
                matches!(c.state, crate::layout::TENANT_LIVE | crate::layout::TENANT_DROPPING) && c.ttl_ms != 0
            })
        })
    }

    /// Removes an expired block of the tenant `hold` holds: READY entry `e`
    /// of stripe `s`, unless pinned (then false). Its block is freed.
    /// Caller holds the stripe lock, and no heap lock.
    pub(crate) fn remove_expired_locked(
        &self,
        s: u32,
        h: &mut HeldStripe,
        e: u32,
        hold: &mut crate::tenants::TenantHold,
    ) -> Result<bool> {
        let mut ent = self.store.ent_held(s, e, h)?;
        let Some((off, len)) = self.remove_claimed(s, h, e, &mut ent)? else {
            return Ok(false);
        };
        hold.expire(len);
        self.count(|c| c.evictions = c.evictions.wrapping_add(1))?;
        // SYNC: the entry is EMPTY before its block is freed: `free_kv`
        // takes the heap lock, which fences first.
        match self.free_kv(off) {
            // Recovering: the block stays allocated until the pending
            // recovery reclaims it (no entry references it).
            Ok(()) | Err(Error::Recovering) => Ok(true),
            Err(err) => Err(err),
        }
    }

    /// Removes the entry of stripe `s` that `policy` chooses, leaving its
    /// block (offset, length) for the caller to free; `None` when no
    /// candidate was taken. An expired block is taken whatever an eviction
    /// for anyone's policy says and whatever its tenant's share.
    /// `expired_from`: no other, looked for from that entry of the LRU
    /// list on (left after the one taken). Caller holds the lock.
    fn remove_one_locked(
        &self,
        s: u32,
        h: &mut HeldStripe,
        policy: &mut dyn Policy,
        mut expired_from: Option<&mut u32>,
    ) -> Result<Option<(u64, u64)>> {
        let st = self.store;
        let expired_only = expired_from.is_some();
        let mut e = expired_from.as_deref().copied().unwrap_or(h.lru_head);
        for _ in 0..st.layout.caps.entries_per_stripe {
            if e == NIL {
                return Ok(None);
            }
            let mut ent = st.ent_held(s, e, h)?;
            let next = ent.lru_next;
            if ent.state == state::READY {
                let expired = self.tenant_of(ent.ns)?.is_some() && self.expired_held(s, e, ent.gen, h)?;
                if expired_only && !expired {
                    e = next;
                    continue;
                }
                let verdict = if expired && !policy.for_owner() { Verdict::Evict } else { policy.consider(s, &ent) };
                match verdict {
                    Verdict::Evict => {
                        // The block's tenant, nested: its usage goes down in
                        // the same hold, and an eviction for anyone leaves
                        // it its share. One awaiting repair is passed over
                        // (its count is recovery's to rebuild first).
                        let mut th = match self.tenant_for_removal(ent.ns) {
                            Ok(th) => th,
                            Err(Error::Recovering) => {
                                e = next;
                                continue;
                            }
                            Err(err) => return Err(err),
                        };
                        let len = ent.payload_len as u64;
                        let kept = th.as_ref().is_some_and(|hold| {
                            !expired
                                && !policy.for_owner()
                                && !hold.above_share(len)
                                && !mutant!("tenant.share_ignored")
                        });
                        if kept {
                            if let Some(hold) = th.take() {
                                self.tenant_put(hold)?;
                            }
                            e = next;
                            continue;
                        }
                        let r = self.remove_claimed(s, h, e, &mut ent);
                        if let (Ok(Some(_)), Some(hold)) = (&r, th.as_mut()) {
                            if expired {
                                hold.expire(len);
                            } else {
                                hold.discharge(len, true);
                            }
                        }
                        let put = th.map_or(Ok(()), |hold| self.tenant_put(hold));
                        match r? {
                            Some(x) => {
                                put?;
                                if let Some(c) = expired_from.as_deref_mut() {
                                    *c = next;
                                }
                                return Ok(Some(x));
                            }
                            None => {
                                put?;
                                e = next;
                                continue;
                            }
                        }
                    }
                    Verdict::Skip => {}
                    Verdict::Stop => return Ok(None),
                }
            }
            e = next;
        }
        Ok(None)
    }

    /// Claims READY entry `e` (`ent`) unless pinned and removes it: its
    /// block (offset, length) for the caller to free, `None` when pinned
    /// (then moved to the LRU list's tail). Caller holds the lock.
    fn remove_claimed(&self, s: u32, h: &mut HeldStripe, e: u32, ent: &mut Entry) -> Result<Option<(u64, u64)>> {
        let st = self.store;
        if !self.claim_unpinned(s, e, ent, h.ticket())? {
            // Pinned: in use, so the most recently used.
            if h.lru_tail != e {
                st.lru_unlink(s, h, e, ent)?;
                st.lru_push_tail(s, h, e, ent)?;
                st.put_ent(s, e, ent, h.ticket())?;
            }
            return Ok(None);
        }
        let key = crate::hash::Key { lo: ent.key_lo, hi: ent.key_hi };
        let tag = crate::hash::place(ent.ns, key);
        let mut removing = *ent;
        let removed = probe::find_held(st, s, tag, ent.ns, key, h)
            .and_then(|f| f.filter(|f| f.entry == e).ok_or(Error::Corrupt))
            .and_then(|f| st.remove_locked(s, h, e, f.bucket, &mut removing, self.id));
        let (off, len) = match removed {
            Ok(x) => x,
            Err(err) => {
                // Given up after the claim (a void line met in the stripe,
                // whose repair follows): the entry goes back READY, as
                // recovery would make it, not left CLAIMED for the next
                // holder to take for an evictor deciding (seed 119015: an
                // acquire under the lock answered `Changed`).
                st.put_ent(s, e, ent, h.ticket())?;
                return Err(err);
            }
        };
        h.evictions = h.evictions.wrapping_add(1);
        Ok(Some((off, len)))
    }

    /// The evictor's half of the pin handshake (see `pins.rs`): marks READY
    /// entry `e` CLAIMED, publishes that, fences, then looks for a pin in
    /// every journal. Pinned: the entry is READY again and the answer false.
    /// Not pinned: it stays CLAIMED (its caller removes it) and no pin can
    /// take hold of it any more. Caller holds the stripe lock.
    fn claim_unpinned(&self, s: u32, e: u32, ent: &mut Entry, ticket: u64) -> Result<bool> {
        let st = self.store;
        // A global entry number: below the region's entry count.
        let g = s.wrapping_mul(st.layout.caps.entries_per_stripe).wrapping_add(e);
        let mut claim = *ent;
        claim.state = state::CLAIMED;
        // SYNC: CLAIMED reaches memory (the entry write flushes it) before
        // any journal is read: a pinner re-validating after its own fence
        // sees it, or this scan sees the pinner's record.
        st.put_ent(s, e, &mut claim, ticket)?;
        st.co.full_fence(Site("evict.announce.fence"));
        if !self.pinned_anywhere(g, ent.gen)? || mutant!("evict.pinned") {
            ent.ver = claim.ver;
            return Ok(true);
        }
        ent.ver = claim.ver;
        st.put_ent(s, e, ent, ticket)?;
        Ok(false)
    }

    /// Remembers a lock-free read of global entry `g` at `gen`, for the LRU
    /// lists. When the node's memory of reads is full, applies it first.
    pub(crate) fn touch(&self, g: u32, gen: u32) {
        let full = {
            let mut t = self.local.touched.lock();
            let n = t.n;
            if let Some(slot) = t.at.get_mut(n) {
                *slot = (g, gen);
                t.n = n.saturating_add(1);
            }
            t.n == t.at.len()
        };
        // A full memory of reads waits for the node's next locked operation
        // on a stripe (or `refresh_touched`): reads never take a lock.
        let _ = full;
    }

    /// Applies every remembered read: each stripe with any, under its lock.
    pub fn refresh_touched(&self) -> Result<()> {
        let st = self.store;
        let eps = st.layout.caps.entries_per_stripe;
        loop {
            let s = {
                let t = self.local.touched.lock();
                match t.at.get(..t.n).and_then(<[_]>::first) {
                    Some(&(g, _)) => g.checked_div(eps).ok_or(Error::Corrupt)?,
                    None => return Ok(()),
                }
            };
            if s >= st.layout.caps.n_stripes {
                // Not a stripe: drop such touches (never recorded by reads).
                self.take_touched(s, |_| Ok(()))?;
                continue;
            }
            self.with_stripe(s, |h| {
                self.refresh_touched_locked(s, h)?;
                st.put_hdr(s, h)
            })?;
        }
    }

    /// Moves the remembered reads of stripe `s` that still name their READY
    /// entry to the tail of its LRU list. Caller holds the lock and writes
    /// `h` back.
    pub(crate) fn refresh_touched_locked(&self, s: u32, h: &mut HeldStripe) -> Result<()> {
        let st = self.store;
        let eps = st.layout.caps.entries_per_stripe;
        self.take_touched(s, |(g, gen)| {
            let e = g.checked_rem(eps).ok_or(Error::Corrupt)?;
            let mut ent = st.ent_held(s, e, h)?;
            if ent.state == state::READY && ent.gen == gen && h.lru_tail != e {
                st.lru_unlink(s, h, e, &mut ent)?;
                st.lru_push_tail(s, h, e, &mut ent)?;
                st.put_ent(s, e, &mut ent, h.ticket())?;
            }
            Ok(())
        })
    }

    /// Removes the remembered reads of stripe `s` and hands each to `f`.
    fn take_touched(&self, s: u32, mut f: impl FnMut((u32, u32)) -> Result<()>) -> Result<()> {
        let eps = self.store.layout.caps.entries_per_stripe;
        let mut mine = [(0u32, 0u32); 32];
        loop {
            let k = {
                let mut t = self.local.touched.lock();
                let (mut k, mut i) = (0, 0);
                while i < t.n && k < mine.len() {
                    let Some(&at) = t.at.get(i) else { break };
                    if at.0.checked_div(eps) == Some(s) {
                        if let Some(m) = mine.get_mut(k) {
                            *m = at;
                        }
                        k = k.saturating_add(1);
                        // Swap-remove: the last remembered read takes slot `i`.
                        let last = t.n.saturating_sub(1);
                        let moved = t.at.get(last).copied().unwrap_or_default();
                        if let Some(x) = t.at.get_mut(i) {
                            *x = moved;
                        }
                        t.n = last;
                    } else {
                        i = i.saturating_add(1);
                    }
                }
                k
            };
            if k == 0 {
                return Ok(());
            }
            for &x in mine.iter().take(k) {
                f(x)?;
            }
        }
    }
}
