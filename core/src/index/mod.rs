//! The prefix index (TraCT §4.2): namespaced 128-bit keys → published KV
//! blocks, in `n_stripes` independent fixed-size tables, each with its own
//! lock, entry pool, free list and LRU list.
//!
//! Entry life: EMPTY → WRITING (`reserve`: payload allocated, writer's pin bit
//! set) → READY (`publish`, after the payload is flushed) → CLAIMED (an
//! evictor looking for pins; back to READY if it finds one) → EVICTING →
//! EMPTY (`evict`, or `abort` straight from WRITING). Readers only ever take
//! READY entries whose key, namespace and checksum match.

pub mod evict;
pub mod expiry;
pub mod probe;
mod read;

use crate::coherence::{Coherence, Site};
use crate::hash::{checksum32, checksum32_fold, checksum32_lanes, place, Key};
use crate::layout::{state, Bucket, Entry, StripeHeader, TENANT_LIVE, TENANT_SCRUB};
use crate::lock::Held;
use crate::mutant::mutant;
use crate::node::Node;
use crate::off::Off;
use crate::store::Store;
use crate::tenants::{TenantHold, TenantId};
use crate::{Error, Result};

pub use evict::{EvictReport, Lru, Policy, Verdict};
use probe::{stripe_of, Found};
pub use read::Got;

/// "No entry" in LRU and free-list links.
pub const NIL: u32 = u32::MAX;

/// Evict-and-retry rounds of a reserve at most (each evicts twice as much as
/// the one before, so the whole cache is reached long before).
const MAX_ROUNDS: u32 = 48;

/// Waits at most of a copying get for an evictor's answer about the block
/// (each a poll of the node's wait; an evictor decides within a fence and a
/// scan of the pin journals).
pub(super) const CLAIM_WAITS: u32 = 4096;

/// Keys a lookup probes at once (memory-level parallelism; see
/// [`Store::find_stored_batch`]).
pub const PROBE_BATCH: usize = 32;

/// A reserved (writable) or acquired (pinned, readable) block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    /// Namespace id.
    pub ns: u32,
    /// Key.
    pub key: Key,
    /// Stripe.
    pub stripe: u32,
    /// Entry index in the stripe.
    pub entry: u32,
    /// Entry generation when the handle was made.
    pub gen: u32,
    /// Payload offset in the region.
    pub off: u64,
    /// Payload length.
    pub len: u64,
    /// Tokens the block covers.
    pub tokens: u32,
}

/// One block to reserve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReserveItem {
    /// Key.
    pub key: Key,
    /// Payload bytes.
    pub len: u64,
    /// Tokens the block covers.
    pub tokens: u32,
}

/// Entry checksum over its immutable fields (key, namespace, tokens, payload,
/// generation): readers reject an entry a corrupted peer scribbled on.
pub fn entry_checksum(e: &Entry) -> u32 {
    checksum32(&checksum_words(e))
}

/// The words an entry's checksum covers.
fn checksum_words(e: &Entry) -> [u64; 5] {
    [
        e.key_lo,
        e.key_hi,
        e.ns as u64 | (e.tokens as u64) << 32,
        e.payload_off,
        e.payload_len as u64 | (e.gen as u64) << 32,
    ]
}

/// One key of a batched probe ([`Store::find_stored_batch`]).
#[derive(Clone, Copy)]
struct Probe {
    tag: u64,
    stripe: u32,
    /// Its home bucket's line.
    line: u64,
    /// Entry index of its first tag match; NIL: a miss.
    cand: u32,
    /// The entry's stored checksum.
    sum: u32,
    /// The entry is READY or CLAIMED.
    live: bool,
    /// The quick path cannot tell: the full probe decides.
    slow: bool,
}

impl Probe {
    const MISS: Probe = Probe { tag: 0, stripe: 0, line: 0, cand: NIL, sum: 0, live: false, slow: false };
}

/// True when entry `e` holds a stored block: READY or CLAIMED, and intact.
fn stored(e: &Entry) -> bool {
    (e.state == state::READY || e.state == state::CLAIMED) && e.checksum == entry_checksum(e)
}

/// True when entry `e` is an intact block an evictor has CLAIMED: it looks
/// for pins under the stripe lock, and puts the entry back to READY when it
/// finds one. A reader that meets it waits for that answer: reporting the
/// block missing would be wrong whenever another node pins it.
pub(super) fn claimed(e: &Entry) -> bool {
    e.state == state::CLAIMED && e.checksum == entry_checksum(e)
}

/// Resolves a payload offset read from the region: inside the payload area,
/// line aligned, `len` bytes long.
pub(super) fn payload_of<C: Coherence>(st: &Store<C>, raw: u64, len: u64) -> Result<u64> {
    Off::<u8>::from_raw(raw).resolve_len(st.layout.payload, len, crate::mem::LINE)
}

/// Formats every stripe: all entries EMPTY on the free list, LRU empty.
/// The region is zeroed and is flushed by the caller.
pub(crate) fn format_stripes<C: Coherence>(st: &Store<C>) -> Result<()> {
    let l = &st.layout;
    let eps = l.caps.entries_per_stripe;
    for s in 0..l.caps.n_stripes {
        for e in 0..eps {
            let next = e.saturating_add(1);
            let ent = Entry { lru_prev: NIL, lru_next: if next < eps { next } else { NIL }, ..Entry::default() };
            st.view.write(l.entry(s, e), &ent)?;
        }
        let h = StripeHeader { lru_head: NIL, lru_tail: NIL, free_head: 0, ..StripeHeader::default() };
        st.view.write(l.stripe(s), &h)?;
    }
    Ok(())
}

/// Groups `n` items by stripe and calls `f(stripe, indices)` in ascending
/// stripe order (the lock order), 256 items at a time, without allocating.
pub(crate) fn by_stripe(
    n: usize,
    stripe: impl Fn(usize) -> u32,
    mut f: impl FnMut(u32, &[usize]) -> Result<()>,
) -> Result<()> {
    const CHUNK: usize = 256;
    let mut ids = [0u32; CHUNK];
    let mut group = [0usize; CHUNK];
    let mut base = 0usize;
    while base < n {
        let m = n.saturating_sub(base).min(CHUNK);
        for (i, id) in ids.iter_mut().enumerate().take(m) {
            *id = stripe(base.saturating_add(i));
        }
        let mut prev: Option<u32> = None;
        loop {
            let next = ids.iter().take(m).copied().filter(|&s| prev.is_none_or(|p| s > p)).min();
            let Some(s) = next else { break };
            let mut k = 0usize;
            for (i, &id) in ids.iter().enumerate().take(m) {
                if id == s {
                    if let Some(g) = group.get_mut(k) {
                        *g = base.saturating_add(i);
                    }
                    k = k.saturating_add(1);
                }
            }
            f(s, group.get(..k).unwrap_or_default())?;
            prev = Some(s);
        }
        base = base.saturating_add(m);
    }
    Ok(())
}

/// A batch step whose stripe lock came back revoked: what it did there is
/// void (recovery may have undone it), so items `idx` report `Revoked`, not
/// a handle or a success that would be a lie.
fn void_if_revoked<T>(r: &Result<()>, idx: &[usize], out: &mut [Result<T>]) {
    if *r == Err(Error::Revoked) {
        for &i in idx {
            if let Some(o) = out.get_mut(i) {
                *o = Err(Error::Revoked);
            }
        }
    }
}

impl<C: Coherence> Store<C> {
    /// Stripe of a namespaced key.
    pub fn stripe_of(&self, ns: u32, key: Key) -> u32 {
        stripe_of(place(ns, key), self.layout.caps.n_stripes)
    }

    /// Finds a READY, intact entry for (`ns`, `key`) without a lock.
    pub fn find_ready(&self, ns: u32, key: Key) -> Result<Option<(u32, Found)>> {
        Ok(self.find_stored(ns, key)?.filter(|(_, f)| f.e.state == state::READY))
    }

    /// Finds a stored (READY, or CLAIMED by an evictor that has not decided
    /// yet), intact entry for (`ns`, `key`) without a lock.
    pub fn find_stored(&self, ns: u32, key: Key) -> Result<Option<(u32, Found)>> {
        let tag = place(ns, key);
        let s = stripe_of(tag, self.layout.caps.n_stripes);
        match probe::find(self, s, tag, ns, key)? {
            Some(f) if stored(&f.e) && !self.void_now(s, &f.e)? => Ok(Some((s, f))),
            _ => Ok(None),
        }
    }

    /// Whether entry `ent` of stripe `s`, read without the lock, is void:
    /// stamped below the stripe lock's repair floor as memory holds it now
    /// (read after the entry: a floor only rises, so a line void when read
    /// is seen so). A reader takes a void entry for missing: it may name a
    /// block freed and taken since (see [`Entry::ticket`]).
    pub(crate) fn void_now(&self, s: u32, ent: &Entry) -> Result<bool> {
        Ok(ent.ticket < self.floor_now(s)? && !mutant!("read.trust_void_entry"))
    }

    /// Stripe `s`'s lock's repair floor as memory holds it now: lines of
    /// the stripe stamped below it are void.
    pub(crate) fn floor_now(&self, s: u32) -> Result<u64> {
        let l = &self.layout;
        // SYNC: fresh repair floor (writer: recovery, then the lock manager).
        let ll: crate::layout::LockLine = self.fresh(l.lock_line(l.locks().stripe(s)), Site("index.floor.read"))?;
        Ok(ll.floor)
    }

    /// Whether each of up to [`PROBE_BATCH`] keys is stored: its entry is
    /// intact and READY, or CLAIMED (READY under an evictor's decision: a
    /// pinned block always comes back READY, so a lookup never misses a
    /// block someone holds). Memory-level parallelism: the home bucket
    /// lines of every key are invalidated together (one ordering), then the
    /// candidate entries' lines, so the loads of each phase miss in
    /// parallel instead of one after another.
    pub fn find_stored_batch(&self, ns: u32, keys: &[Key], found: &mut [bool]) -> Result<()> {
        let n = keys.len().min(PROBE_BATCH).min(found.len());
        let l = &self.layout;
        let mut p = [Probe::MISS; PROBE_BATCH];
        let mut lines = [0u64; PROBE_BATCH];
        for ((q, k), line) in p.iter_mut().zip(keys).zip(lines.iter_mut()).take(n) {
            q.tag = place(ns, *k);
            q.stripe = stripe_of(q.tag, l.caps.n_stripes);
            let home = probe::home_of(q.tag, l.buckets_per_stripe);
            q.line = l.bucket(q.stripe, home) & !(crate::mem::LINE - 1);
            *line = q.line;
        }
        // SYNC: fresh home bucket lines of the whole batch (writer: insert
        // and delete under the stripe lock).
        self.co.invalidate_lines(&self.view, lines.get(..n).unwrap_or_default(), Site("index.lookup.buckets"))?;
        // Each key's first tag match (its entry index; NIL: a miss).
        let mut offs = [0u64; PROBE_BATCH];
        let mut m = 0usize;
        for q in p.iter_mut().take(n) {
            if let Some((_, ei)) = probe::first_of_tag(self, q.stripe, q.tag, q.line)? {
                q.cand = ei;
                if let Some(o) = offs.get_mut(m) {
                    *o = l.entry(q.stripe, ei);
                }
                m = m.saturating_add(1);
            }
        }
        // SYNC: fresh candidate entry lines of the batch (writer: publish,
        // evict and recovery under the stripe lock).
        self.co.invalidate_lines(&self.view, offs.get(..m).unwrap_or_default(), Site("index.lookup.entries"))?;
        // The candidates' entries, then their checksums side by side (one
        // long multiply chain per entry: interleaved, they overlap).
        let mut words = [[0u64; 5]; PROBE_BATCH];
        for ((q, k), w) in p.iter_mut().zip(keys).zip(words.iter_mut()).take(n) {
            if q.cand == NIL {
                continue;
            }
            match self.entry_invalidated(l.entry(q.stripe, q.cand)) {
                Ok(e) if e.state != state::EMPTY && e.key_lo == k.lo && e.key_hi == k.hi && e.ns == ns => {
                    *w = checksum_words(&e);
                    q.sum = e.checksum;
                    q.live = e.state == state::READY || e.state == state::CLAIMED;
                }
                // Another key behind the same tag, an entry emptied since its
                // bucket was read, or one caught mid-write: the full probe
                // decides.
                Ok(_) | Err(Error::Changed) => q.slow = true,
                Err(e) => return Err(e),
            }
        }
        let mut h = [0u64; PROBE_BATCH];
        checksum32_lanes(words.get(..n).unwrap_or_default(), h.get_mut(..n).unwrap_or_default());
        for (((q, k), f), x) in p.iter().zip(keys).zip(found.iter_mut()).zip(h).take(n) {
            *f = if q.slow {
                probe::find(self, q.stripe, q.tag, ns, *k)?.is_some_and(|f| stored(&f.e))
            } else {
                q.cand != NIL && q.live && checksum32_fold(x) == q.sum
            };
        }
        Ok(())
    }

    /// Stripe `s`'s header read under its lock, `Ok(None)` when void: stamped
    /// below the floor grant `held` carries (written by a revoked holder
    /// after the last repair; see `lock.rs`, "Zombies"). Stamped with the
    /// grant's ticket otherwise, so that what the holder publishes of it
    /// carries the ticket.
    pub(crate) fn hdr_held(&self, s: u32, held: &crate::lock::Held) -> Result<Option<HeldStripe>> {
        let mut h = self.hdr(s)?;
        if h.ticket < held.floor && !mutant!("stripe.trust_void_header") {
            return Ok(None);
        }
        h.ticket = held.seq;
        Ok(Some(HeldStripe { h, floor: held.floor, void: core::cell::Cell::new(false) }))
    }

    /// Entry `e` of stripe `s` read by the stripe's holder `h`: `Recovering`
    /// when void (stamped below the floor its grant carries: a revoked
    /// holder's line written back after the last repair, over what the
    /// entry held since), and `h` remembers it, so that the stripe is
    /// repaired before the lock is taken again (see [`Node::with_stripe`]).
    pub(crate) fn ent_held(&self, s: u32, e: u32, h: &HeldStripe) -> Result<Entry> {
        let ent = self.ent(s, e)?;
        h.check(&ent)?;
        Ok(ent)
    }

    pub(crate) fn hdr(&self, s: u32) -> Result<StripeHeader> {
        self.fresh(self.layout.stripe(s), Site("index.hdr.read"))
    }

    pub(crate) fn put_hdr(&self, s: u32, h: &StripeHeader) -> Result<()> {
        // SYNC: stripe header published under the stripe lock.
        self.publish(self.layout.stripe(s), h, Site("index.hdr.write"))
    }

    pub(crate) fn ent(&self, s: u32, e: u32) -> Result<Entry> {
        if e >= self.layout.caps.entries_per_stripe {
            return Err(Error::Corrupt);
        }
        self.fresh_entry(self.layout.entry(s, e), Site("index.entry.read"))
    }

    /// Publishes entry `e` of stripe `s` stamped with `ticket`: the stripe
    /// lock's grant it is written under.
    pub(crate) fn put_ent(&self, s: u32, e: u32, ent: &mut Entry, ticket: u64) -> Result<()> {
        ent.ticket = ticket;
        // SYNC: entry published under the stripe lock (reader: find, lookup).
        self.publish_entry(self.layout.entry(s, e), ent, Site("index.entry.write"))
    }

    /// Unlinks entry `e` (whose current value is `ent`) from the LRU list.
    pub(crate) fn lru_unlink(&self, s: u32, h: &mut HeldStripe, e: u32, ent: &mut Entry) -> Result<()> {
        let (p, n) = (ent.lru_prev, ent.lru_next);
        if p == NIL {
            if h.lru_head == e {
                h.lru_head = n;
            }
        } else {
            let mut pe = self.ent_held(s, p, h)?;
            pe.lru_next = n;
            self.put_ent(s, p, &mut pe, h.ticket())?;
        }
        if n == NIL {
            if h.lru_tail == e {
                h.lru_tail = p;
            }
        } else {
            let mut ne = self.ent_held(s, n, h)?;
            ne.lru_prev = p;
            self.put_ent(s, n, &mut ne, h.ticket())?;
        }
        ent.lru_prev = NIL;
        ent.lru_next = NIL;
        Ok(())
    }

    /// Links entry `e` at the LRU tail (most recent). `ent` is written by the
    /// caller afterwards.
    pub(crate) fn lru_push_tail(&self, s: u32, h: &mut HeldStripe, e: u32, ent: &mut Entry) -> Result<()> {
        ent.lru_prev = h.lru_tail;
        ent.lru_next = NIL;
        if h.lru_tail == NIL {
            h.lru_head = e;
        } else {
            let mut te = self.ent_held(s, h.lru_tail, h)?;
            te.lru_next = e;
            self.put_ent(s, h.lru_tail, &mut te, h.ticket())?;
        }
        h.lru_tail = e;
        Ok(())
    }

    /// Removes entry `e` (found at bucket `b`, value `ent`) from the stripe:
    /// EVICTING, bucket deleted (a published block's removal by node `by`
    /// logged), then EMPTY on the free list. Returns its payload (offset,
    /// length) for the caller to free. Caller holds the lock.
    pub(crate) fn remove_locked(
        &self,
        s: u32,
        h: &mut HeldStripe,
        e: u32,
        b: u32,
        ent: &mut Entry,
        by: u32,
    ) -> Result<(u64, u64)> {
        let was_ready = ent.state == state::READY;
        if was_ready {
            self.lru_unlink(s, h, e, ent)?;
            h.live = h.live.saturating_sub(1);
            h.bytes = h.bytes.saturating_sub(ent.payload_len as u64);
        }
        ent.state = state::EVICTING;
        self.put_ent(s, e, ent, h.ticket())?;
        probe::delete(self, s, b, h)?;
        if was_ready && !crate::mutant::mutant!("changes.skip_removal") {
            self.log_change(s, h, crate::layout::CHANGE_REMOVED, ent, by)?;
        }
        let payload = (ent.payload_off, ent.payload_len as u64);
        *ent = Entry { ver: ent.ver, gen: ent.gen, lru_prev: NIL, lru_next: h.free_head, ..Entry::default() };
        self.put_ent(s, e, ent, h.ticket())?;
        h.free_head = e;
        Ok(payload)
    }
}

/// True when bucket `b` was stamped before `floor`, its stripe lock's
/// repair floor, by a grant no later than `ticket` (the latest known): see
/// [`HeldStripe::check_bucket`].
pub(crate) fn bucket_void(b: &Bucket, floor: u64, ticket: u64) -> bool {
    let span = ticket.saturating_sub(floor);
    let since = u64::from(b.stamp.wrapping_sub(floor as u32));
    span <= u64::from(u32::MAX) && since > span
}

/// Repairs of a stripe found void that one operation asks for before it
/// gives up (one is enough unless the header keeps coming back void).
const VOID_REPAIRS: u32 = 3;

/// A stripe's header as its holder has it (stamped with the grant's
/// ticket), with the repair floor the grant carried. Host-local.
pub(crate) struct HeldStripe {
    /// The header; what the holder publishes of it.
    pub h: StripeHeader,
    /// Lines of the stripe stamped below this are void.
    pub floor: u64,
    /// A void entry was met under this grant.
    void: core::cell::Cell<bool>,
}

impl HeldStripe {
    /// `Recovering` (and remembered) when `ent` is void under this grant.
    pub(crate) fn check(&self, ent: &Entry) -> Result<()> {
        if ent.ticket < self.floor && !mutant!("stripe.trust_void_entry") {
            self.void.set(true);
            return Err(Error::Recovering);
        }
        Ok(())
    }

    /// `Recovering` (and remembered) when bucket `b` is void under this
    /// grant: stamped before the floor. A stamp keeps 32 bits of a ticket,
    /// so it is compared by its distance from the floor: every bucket
    /// written since the repair lies between the floor and this grant's
    /// ticket, a late line before the floor (while fewer than 2^32 grants
    /// separate them, which a woken holder does not outlast).
    pub(crate) fn check_bucket(&self, b: &Bucket) -> Result<()> {
        if bucket_void(b, self.floor, self.h.ticket) && !mutant!("stripe.trust_void_bucket") {
            self.void.set(true);
            return Err(Error::Recovering);
        }
        Ok(())
    }

    /// The grant's ticket: what every line the holder writes is stamped with.
    pub(crate) fn ticket(&self) -> u64 {
        self.h.ticket
    }
}

impl core::ops::Deref for HeldStripe {
    type Target = StripeHeader;
    fn deref(&self) -> &StripeHeader {
        &self.h
    }
}

impl core::ops::DerefMut for HeldStripe {
    fn deref_mut(&mut self) -> &mut StripeHeader {
        &mut self.h
    }
}

impl<C: Coherence> Node<'_, C> {
    /// Runs `f` holding stripe `s`'s lock, with the stripe's header read
    /// under it (see [`Store::hdr_held`]): what `f` publishes of the header
    /// carries this grant's ticket. A void header (a revoked holder's,
    /// written back after the last repair) is never used: the lock goes
    /// back, a recovery repairs the stripe and raises its floor, and the
    /// lock is taken again. So with a void entry `f` meets (see
    /// [`Store::ent_held`]), after which `f` runs again if it gave up whole.
    pub(crate) fn with_stripe<T>(&self, s: u32, mut f: impl FnMut(&mut HeldStripe) -> Result<T>) -> Result<T> {
        let st = self.store;
        let lock = st.layout.locks().stripe(s);
        let mut gave_up = None;
        for _ in 0..VOID_REPAIRS {
            let r = self.with_held(lock, false, |held| match st.hdr_held(s, held)? {
                Some(mut h) => {
                    let r = f(&mut h);
                    Ok(Some((r, h.void.get())))
                }
                None => Ok(None),
            })?;
            match r {
                Some((r, false)) => return r,
                // A void entry met under the lock: what the operation did
                // before is whole (it wrote nothing over the void line); the
                // stripe is repaired, and an operation that gave up on it
                // whole (`Recovering`) runs again. One that went on (a batch
                // whose items report their own results) is done.
                Some((r, true)) if !matches!(r, Err(Error::Recovering)) => {
                    self.repair_void()?;
                    return r;
                }
                Some((r, true)) => {
                    gave_up = Some(r);
                    self.repair_void()?;
                }
                None => self.repair_void()?,
            }
        }
        // Void after every repair: something other than a late write-back
        // breaks the stripe (or the operation keeps giving up for a reason
        // of its own: its answer).
        gave_up.unwrap_or(Err(Error::Corrupt))
    }

    /// Has a structure found void repaired (a recovery of no node).
    fn repair_void(&self) -> Result<()> {
        self.env.recovering(true);
        let r = self.recover(0);
        self.env.recovering(false);
        r.map(|_| ())
    }

    pub(super) fn me(&self) -> u64 {
        1 << self.id
    }

    /// Global entry number (journal records use it).
    pub(super) fn global(&self, s: u32, e: u32) -> u32 {
        // Below the region's entry count (validated stripe and entry).
        s.wrapping_mul(self.store.layout.caps.entries_per_stripe).wrapping_add(e)
    }

    /// Runs `read` (a read without a lock) again while it meets an entry
    /// mid-change (`Changed`): its writer, which holds the stripe lock, may
    /// be descheduled there for a time slice or more on a loaded host (one
    /// that died is repaired by recovery). Waits as a lock waiter does, so
    /// it ends (`Timeout`) after the lock timeout at most. A reader must not
    /// fail because another thread of the rack happened to be writing.
    fn settled<T>(&self, mut read: impl FnMut() -> Result<T>) -> Result<T> {
        let mut i = 0u32;
        loop {
            match read() {
                Err(Error::Changed) => {
                    self.env.wait(i)?;
                    i = i.wrapping_add(1);
                }
                r => return r,
            }
        }
    }

    /// Length of the longest prefix of `keys` whose blocks are all published
    /// (read-only; takes no lock).
    pub fn lookup(&self, ns: u32, keys: &[Key]) -> Result<usize> {
        self.not_revoked()?;
        let tenant = self.tenant_of(ns)?.is_some();
        let mut n = 0usize;
        let mut found = [false; PROBE_BATCH];
        for ks in keys.chunks(PROBE_BATCH) {
            self.settled(|| self.find_live_batch(ns, tenant, ks, &mut found))?;
            let hits = found.iter().take(ks.len()).take_while(|&&f| f).count();
            n = n.saturating_add(hits);
            if hits < ks.len() {
                break;
            }
        }
        self.count(|c| {
            c.hits = c.hits.wrapping_add(n as u64);
            c.misses = c.misses.wrapping_add(keys.len().saturating_sub(n) as u64);
        })?;
        Ok(n)
    }

    /// Presence of every key in `present`; returns the longest prefix length.
    pub fn presence(&self, ns: u32, keys: &[Key], present: &mut [bool]) -> Result<usize> {
        self.not_revoked()?;
        if present.len() < keys.len() {
            return Err(Error::InvalidArgument);
        }
        let tenant = self.tenant_of(ns)?.is_some();
        for (ks, ps) in keys.chunks(PROBE_BATCH).zip(present.chunks_mut(PROBE_BATCH)) {
            self.settled(|| self.find_live_batch(ns, tenant, ks, ps))?;
        }
        Ok(present.iter().take(keys.len()).take_while(|&&p| p).count())
    }

    /// [`Store::find_stored_batch`], blocks past their lifetime missing
    /// (`tenant`: `ns` is a tenant's namespace, whose blocks have stamps).
    fn find_live_batch(&self, ns: u32, tenant: bool, keys: &[Key], found: &mut [bool]) -> Result<()> {
        self.store.find_stored_batch(ns, keys, found)?;
        if !tenant {
            return Ok(());
        }
        let now = self.wall_ms();
        for (k, f) in keys.iter().zip(found.iter_mut()).filter(|(_, f)| **f) {
            *f = match self.store.find_stored(ns, *k)? {
                Some((s, x)) => !self.store.expired_now(s, x.entry, x.e.gen, now)?,
                None => false,
            };
        }
        Ok(())
    }

    /// Whether `key` is stored (published, not removed, and not past its
    /// lifetime: a block an evictor is deciding about still is) in
    /// namespace `ns`. Takes no lock.
    pub fn exists(&self, ns: u32, key: Key) -> Result<bool> {
        self.not_revoked()?;
        match self.store.find_stored(ns, key)? {
            Some((s, f)) => Ok(!self.expired(ns, s, f.entry, f.e.gen)?),
            None => Ok(false),
        }
    }

    /// Reserves a writable block for `key`, evicting when space runs out.
    /// `Exists` if the key is stored or being written (nothing written).
    pub fn reserve(&self, ns: u32, key: Key, len: u64, tokens: u32) -> Result<Handle> {
        let mut out = [Err(Error::InvalidArgument)];
        self.reserve_batch(ns, &[ReserveItem { key, len, tokens }], &mut out)?;
        out[0]
    }

    /// Reserves many blocks, one stripe lock per stripe; a status per item.
    ///
    /// An item that finds no room is tried again after evicting (LRU), until
    /// it fits or nothing evictable is left: `OutOfSpace` means every block
    /// that could make room is pinned or being written. `Recovering` when
    /// the only room eviction made awaits a recovery (a dead node's heap).
    pub fn reserve_batch(&self, ns: u32, items: &[ReserveItem], out: &mut [Result<Handle>]) -> Result<()> {
        if out.len() < items.len() {
            return Err(Error::InvalidArgument);
        }
        let st = self.store;
        let retry = |r: &Result<Handle>| matches!(r, Err(Error::OutOfSpace | Error::OverQuota));
        // The namespace's tenant, when not the default one: its usage is
        // counted and its quota checked under its lock (see `tenants.rs`).
        let tenant = self.tenant_of(ns)?;
        // The tenant asks for its blocks zeroed (as its lock showed it).
        let mut scrub = false;
        self.room_for_whole_chunks(ns, items);
        for attempt in 0..MAX_ROUNDS {
            let mut short: u64 = 0;
            let mut over: u64 = 0;
            by_stripe(
                items.len(),
                |i| items.get(i).map_or(0, |it| st.stripe_of(ns, it.key)),
                |s, idx| {
                    if attempt > 0 && !idx.iter().any(|&i| out.get(i).is_some_and(retry)) {
                        return Ok(());
                    }
                    let r = self.with_stripe(s, |h| {
                        // Taken before anything changes: refused, the stripe
                        // is as it was.
                        let mut th = match tenant.map(|id| self.tenant_take(id, true)) {
                            Some(Ok(hold)) => Some(hold),
                            // The tenant's lines await the repair `tenant_take`
                            // asked for: this stripe's items answer
                            // `Recovering` (the others go on).
                            Some(Err(Error::Recovering)) => {
                                for &i in idx {
                                    if let Some(o) = out.get_mut(i).filter(|o| attempt == 0 || retry(o)) {
                                        *o = Err(Error::Recovering);
                                    }
                                }
                                return Ok(());
                            }
                            Some(Err(e)) => return Err(e),
                            None => None,
                        };
                        if let (Some(id), Some(hold)) = (tenant, th.as_ref()) {
                            if hold.cfg.state != TENANT_LIVE || hold.cfg.nonce != id.nonce {
                                if let Some(hold) = th.take() {
                                    self.tenant_put(hold)?;
                                }
                                return Err(Error::NoTenant);
                            }
                            scrub |= hold.cfg.flags & TENANT_SCRUB != 0;
                        }
                        let r = self.reserve_stripe(ns, s, h, items, idx, out, attempt, &mut th, tenant);
                        let put = th.map_or(Ok(()), |hold| self.tenant_put(hold));
                        let (sh, ov) = r?;
                        put?;
                        short = short.saturating_add(sh);
                        over = over.saturating_add(ov);
                        Ok(())
                    });
                    void_if_revoked(&r, idx, out);
                    r
                },
            )?;
            if over > 0 {
                // Over its quota: the tenant's own least recent blocks go
                // (its share does not hold them), then the items try again.
                if let Some(id) = tenant {
                    // No more than it needs: its other blocks stay.
                    let want = over;
                    let rep = self.evict(want, &mut crate::tenants::OfTenant::new(self, id))?;
                    if rep.entries == 0 && short == 0 {
                        break;
                    }
                }
            }
            if short == 0 {
                if over == 0 {
                    break;
                }
                continue;
            }
            // Free at least a chunk's worth, more each round: holes must meet
            // to fit large blocks, and one round's room serves many reserves.
            let want = short.max(st.layout.chunk_size()).saturating_mul(1 << attempt.min(20));
            let rep = self.evict_for(want)?;
            if rep.entries == 0 {
                break;
            }
            if rep.bytes == rep.deferred {
                for r in out.iter_mut().take(items.len()).filter(|r| matches!(r, Err(Error::OutOfSpace))) {
                    *r = Err(Error::Recovering);
                }
                break;
            }
        }
        if scrub && !mutant!("tenant.no_scrub") {
            for h in out.iter().take(items.len()).filter_map(|r| r.as_ref().ok()) {
                self.scrub(h)?;
            }
        }
        let ok = out.iter().take(items.len()).filter(|r| r.is_ok()).count() as u64;
        let ex = out.iter().take(items.len()).filter(|r| matches!(r, Err(Error::Exists))).count() as u64;
        self.count(|c| {
            c.inserts = c.inserts.wrapping_add(ok);
            c.exists = c.exists.wrapping_add(ex);
        })
    }

    /// One stripe's share of a [`Node::reserve_batch`] round, under its lock
    /// (and the tenant's, `th`): the bytes of items left without room and
    /// of items over the tenant's quota.
    #[allow(clippy::too_many_arguments)]
    fn reserve_stripe(
        &self,
        ns: u32,
        s: u32,
        h: &mut HeldStripe,
        items: &[ReserveItem],
        idx: &[usize],
        out: &mut [Result<Handle>],
        attempt: u32,
        th: &mut Option<TenantHold>,
        tenant: Option<TenantId>,
    ) -> Result<(u64, u64)> {
        let retry = |r: &Result<Handle>| matches!(r, Err(Error::OutOfSpace | Error::OverQuota));
        self.refresh_touched_locked(s, h)?;
        let (mut short, mut over) = (0u64, 0u64);
        // This node's heap lock, kept from one block of the stripe to the
        // next.
        let mut heap = None;
        for &i in idx {
            let (Some(o), Some(item)) = (out.get_mut(i), items.get(i)) else { continue };
            if attempt > 0 && !retry(o) {
                continue;
            }
            if tenant.is_some() && th.is_none() {
                // The tenant's lock could not be taken again after an
                // eviction made room (it awaits repair): no item of this
                // hold goes in uncounted.
                *o = Err(Error::Recovering);
                continue;
            }
            if let Some(hold) = th.as_mut() {
                if !hold.fits(item.len) && !mutant!("tenant.quota_ignored") {
                    hold.refuse();
                    *o = Err(Error::OverQuota);
                    // What its own evictions must free for this item (none
                    // for a block larger than the whole quota: it never
                    // fits, and its blocks stay).
                    if item.len <= hold.cfg.quota {
                        let need = hold.usage.bytes.saturating_add(item.len).saturating_sub(hold.cfg.quota);
                        over = over.saturating_add(need.max(1));
                    }
                    continue;
                }
            }
            *o = self.reserve_locked(ns, s, h, *item, &mut heap, th, tenant);
            match (&*o, th.as_mut()) {
                (Ok(got), Some(hold)) => hold.charge(got.len),
                (Err(Error::OutOfSpace), _) => short = short.saturating_add(item.len),
                _ => {}
            }
        }
        let released = self.release_heap(&mut heap);
        self.store.put_hdr(s, h)?;
        released?;
        Ok((short, over))
    }

    /// Blocks of a whole chunk or more fit only free chunks. When the
    /// bitmap (read without a lock) shows fewer than `items` need (those
    /// not stored already), evicts that much first: a full region's every
    /// such reserve would otherwise be refused once (its stripe, heap and
    /// alloc locks taken for nothing) before the eviction that makes room.
    /// A hint: should room appear meanwhile, a block went early; should it
    /// not be enough, the reserve evicts again.
    /// Nothing here fails the reserve: a look that fails (an entry caught
    /// mid-change, say) counts the block as new, and an eviction that
    /// fails leaves the reserve to meet the same fault itself.
    fn room_for_whole_chunks(&self, ns: u32, items: &[ReserveItem]) {
        let st = self.store;
        let mut need = 0u64;
        for it in items {
            let whole = self.whole_chunks(it.len);
            if whole > 0 && !matches!(st.find_stored(ns, it.key), Ok(Some(_))) {
                need = need.saturating_add(u64::from(whole));
            }
        }
        if need > 0 && self.free_chunks_hint().is_ok_and(|free| u64::from(free) < need) {
            let _ = self.evict_for(need.saturating_mul(st.layout.chunk_size()));
        }
    }

    /// Reserves `item`, has `write` store its payload, and publishes the
    /// block, all under one hold of its stripe lock: one lock round trip
    /// fewer than [`Node::reserve`] then [`Node::publish_flushed`], for
    /// small blocks (the stripe's other users wait while `write` runs).
    /// `write` leaves the payload flushed or written by streaming stores, as
    /// [`Node::write`] does; it runs only once the block is reserved.
    ///
    /// The block's result as [`Node::reserve_batch`] and
    /// [`Node::publish_flushed`] give an item's: `Some(Ok(()))` once
    /// published, `Some(Err(Exists))` and the like, or the write's error
    /// (the reservation aborted); `None` when there was no room
    /// (`OutOfSpace`: nothing reserved; the caller reserves the usual way,
    /// which evicts), and for a namespace of a tenant other than the
    /// default one (whose reserve counts under the tenant's lock: the usual
    /// way too). `Err` as those calls fail whole (fenced, say).
    pub fn put_with(
        &self,
        ns: u32,
        item: ReserveItem,
        write: impl FnOnce(&Handle) -> Result<()>,
    ) -> Result<Option<Result<()>>> {
        let st = self.store;
        if self.tenant_of(ns)?.is_some() {
            return Ok(None);
        }
        let s = st.stripe_of(ns, item.key);
        let mut write = Some(write);
        // What the hold did: the reserve's outcome, then (when reserved)
        // the write's and the publish's.
        let mut reserved: Result<Handle> = Err(Error::InvalidArgument);
        let mut wrote: Result<()> = Ok(());
        let mut published: Result<()> = Ok(());
        let held = self.with_stripe(s, |hdr| {
            self.refresh_touched_locked(s, hdr)?;
            let mut heap = None;
            reserved = self.reserve_locked(ns, s, hdr, item, &mut heap, &mut None, None);
            if let Err(e) = self.release_heap(&mut heap) {
                st.put_hdr(s, hdr)?;
                return Err(e);
            }
            if let Ok(h) = &reserved {
                wrote = write.take().map_or(Err(Error::InvalidArgument), |f| f(h));
                if wrote.is_ok() {
                    // SYNC: the payload reaches memory before the entry
                    // turns READY (reader: lookup, acquire): `write` left it
                    // flushed or streamed, and this orders it before the
                    // entry's stores (`publish_flushed` has the stripe
                    // lock's grant to do it).
                    st.co.store_fence(Site("index.put.fence"));
                    published = self.publish_locked(s, hdr, h);
                }
            }
            st.put_hdr(s, hdr)
        });
        let counted = match reserved {
            Ok(_) => self.count(|c| c.inserts = c.inserts.wrapping_add(1)),
            Err(Error::Exists) => self.count(|c| c.exists = c.exists.wrapping_add(1)),
            Err(_) => Ok(()),
        };
        held?;
        counted?;
        let h = match reserved {
            Ok(h) => h,
            Err(Error::OutOfSpace) => return Ok(None),
            Err(e) => return Ok(Some(Err(e))),
        };
        if let Err(e) = wrote {
            // The payload's lines go with the block (`abort` flushes them).
            self.abort(&h)?;
            return Ok(Some(Err(e)));
        }
        match published {
            // A line met void: the stripe was repaired since; the usual
            // publish tries again.
            Err(Error::Recovering) => {
                let mut out = [Ok(())];
                self.publish_flushed(core::slice::from_ref(&h), &mut out)?;
                Ok(Some(out[0]))
            }
            r => Ok(Some(r)),
        }
    }

    ///
    /// `heap`: a hold of this node's heap lock kept from one reserve to the
    /// next (see [`Node::alloc_kv_held`]); the caller releases it. `th`: the
    /// hold of the namespace's tenant `tenant` (not the default one), given
    /// back and taken again around an eviction that makes room in a full
    /// stripe (whose victim's tenant lock may rank below it).
    #[allow(clippy::too_many_arguments)]
    fn reserve_locked(
        &self,
        ns: u32,
        s: u32,
        h: &mut HeldStripe,
        it: ReserveItem,
        heap: &mut Option<Held>,
        th: &mut Option<TenantHold>,
        tenant: Option<TenantId>,
    ) -> Result<Handle> {
        let st = self.store;
        let len32 = u32::try_from(it.len).map_err(|_| Error::TooLarge)?;
        let tag = place(ns, it.key);
        if let Some(f) = probe::find_held(st, s, tag, ns, it.key, h)? {
            // A block of the key past its lifetime is taken out for the new
            // one (unless pinned: a reader still holds it).
            let replaced = match th.as_mut() {
                Some(hold) if f.e.state == state::READY && self.expired_held(s, f.entry, f.e.gen, h)? => {
                    self.release_heap(heap)?;
                    self.remove_expired_locked(s, h, f.entry, hold)?
                }
                _ => false,
            };
            if !replaced && !mutant!("reserve.no_exists_check") {
                return Err(Error::Exists);
            }
        }
        if h.free_head == NIL {
            // A full stripe: make room by evicting its least recent entry
            // (whose free takes a heap lock: the kept one goes first).
            self.release_heap(heap)?;
            if let Some(hold) = th.take() {
                self.tenant_put(hold)?;
            }
            let evicted = self.evict_one_locked(s, h, &mut Lru);
            if let Some(id) = tenant {
                *th = Some(self.tenant_take(id, true)?);
            }
            if evicted?.is_none() {
                return Err(Error::TableFull);
            }
            if let Some(hold) = th.as_ref() {
                // Taken again: dropped or over its quota meanwhile.
                if hold.cfg.state != TENANT_LIVE || Some(hold.id) != tenant {
                    return Err(Error::NoTenant);
                }
                if !hold.fits(it.len) {
                    return Err(Error::OverQuota);
                }
            }
        }
        let e = h.free_head;
        let old = st.ent_held(s, e, h)?;
        if old.state != state::EMPTY {
            return Err(Error::Corrupt);
        }
        let gen = old.gen.wrapping_add(1);
        if let Some(hold) = th.as_ref() {
            // A tenant's entry: its stamp (its lifetime, if the tenant has
            // one) before the entry is stored.
            self.stamp_expiry(s, e, gen, hold.cfg.ttl_ms, h)?;
        }
        let g = self.global(s, e);
        // Journaled before the block is placed: the heap lock's grant (or,
        // the lock kept, the fence below) puts the record in memory before
        // the entry is stored.
        // Should this node be fenced before the entry lands, recovery still
        // learns of the reservation from the record and keeps the entry's
        // place (see `Node::hold_inflight_places`).
        let (_, rec) = self.journal_add_at(&mut self.local.journal.lock(), g, gen, (0, 0))?;
        let off = match self.alloc_kv_held(it.len, heap) {
            Ok(off) => off,
            Err(err) => {
                self.journal_sub(&mut self.local.journal.lock(), g, gen)?;
                return Err(err);
            }
        };
        if heap.is_some() {
            // SYNC: the record, and the chunk's map and record that place
            // the block, in memory before the entry is stored (reader:
            // recovery, see above; and whoever reads the entry's block as
            // allocated). The heap lock's release fenced them; a hold kept
            // for the batch's next block is not released yet.
            st.co.store_fence(Site("index.reserve.placed"));
        }
        // The record names the block too, before the entry does (see
        // `Node::let_go_lost`).
        if let Err(err) = self.journal_place(rec, g, gen, (off, it.len)) {
            self.release_heap(heap)?;
            self.free_kv(off)?;
            self.journal_sub(&mut self.local.journal.lock(), g, gen)?;
            return Err(err);
        }
        h.free_head = old.lru_next;
        let mut ent = Entry {
            ver: old.ver,
            state: state::WRITING,
            gen,
            key_lo: it.key.lo,
            key_hi: it.key.hi,
            ns,
            tokens: it.tokens,
            payload_off: off,
            payload_len: len32,
            checksum: 0,
            writer: self.id.wrapping_add(1) as u8,
            ticket: h.ticket(),
            lru_prev: NIL,
            lru_next: NIL,
        };
        ent.checksum = entry_checksum(&ent);
        st.put_ent(s, e, &mut ent, h.ticket())?;
        probe::insert(st, s, tag, e, h.ticket(), Some(h))?;
        h.inserts = h.inserts.wrapping_add(1);
        Ok(Handle { ns, key: it.key, stripe: s, entry: e, gen, off, len: it.len, tokens: it.tokens })
    }

    /// Zeroes a block just reserved for a tenant that asks for it (see
    /// `Limits::scrub`): its writer, and a reader of a block published
    /// partly written, meet no byte an earlier block left there. Done
    /// while the entry is WRITING and journaled as this node's, as any
    /// payload write: a stop here is recovery's to quarantine.
    fn scrub(&self, h: &Handle) -> Result<()> {
        self.check_payload(h)?;
        self.store.view.zero(h.off, h.len)?;
        // SYNC: the zeros reach memory before the block is published, in
        // whatever part its writer leaves unwritten (reader: get, read; the
        // publication's fence orders them).
        self.store.co.flush(&self.store.view, h.off, h.len, Site("tenant.scrub"))
    }

    /// Writes `data` into a reserved block at byte `at` (bulk path, flushed).
    pub fn write(&self, h: &Handle, at: u64, data: &[u8]) -> Result<()> {
        self.not_revoked()?;
        let end = at.checked_add(data.len() as u64).ok_or(Error::InvalidArgument)?;
        if end > h.len {
            return Err(Error::InvalidArgument);
        }
        self.check_payload(h)?;
        // Inside the payload checked above (`at + len <= h.len`).
        self.store.co.write_payload(&self.store.view, h.off.wrapping_add(at), data, Site("index.payload.write"))?;
        self.count(|c| c.bytes_written = c.bytes_written.wrapping_add(data.len() as u64))
    }

    fn check_payload(&self, h: &Handle) -> Result<()> {
        payload_of(self.store, h.off, h.len).map(|_| ()).map_err(|_| Error::StaleHandle)
    }

    /// Publishes a reserved block after flushing its whole payload (for
    /// payloads written by plain stores through a pointer).
    pub fn publish(&self, h: &Handle) -> Result<()> {
        self.check_payload(h)?;
        self.store.co.flush(&self.store.view, h.off, h.len, Site("index.publish.payload"))?;
        self.publish_flushed(core::slice::from_ref(h), &mut [Ok(())])
    }

    /// Publishes reserved blocks after flushing each payload (written by plain
    /// stores through pointers): `out[i]` is block `i`'s result. A block
    /// whose handle is stale is reported there and flushes nothing.
    pub fn publish_batch(&self, hs: &[Handle], out: &mut [Result<()>]) -> Result<()> {
        if out.len() < hs.len() {
            return Err(Error::InvalidArgument);
        }
        for h in hs {
            if self.check_payload(h).is_ok() {
                self.store.co.flush(&self.store.view, h.off, h.len, Site("index.publish_batch.payload"))?;
            }
        }
        self.publish_flushed(hs, out)
    }

    /// Makes a pinned block's payload fresh in this host's cache, for reads
    /// through a pointer (what [`Node::read`] does before it copies).
    pub fn fresh_payload(&self, h: &Handle) -> Result<()> {
        self.check_payload(h)?;
        // SYNC: fresh payload lines (writer: publisher's payload flush).
        self.store.co.invalidate(&self.store.view, h.off, h.len, Site("index.fresh.payload"))
    }

    /// Publishes reserved blocks whose payloads are already flushed (written
    /// with [`Node::write`], by non-temporal stores, or by a completed DMA).
    pub fn publish_flushed(&self, hs: &[Handle], out: &mut [Result<()>]) -> Result<()> {
        if out.len() < hs.len() {
            return Err(Error::InvalidArgument);
        }
        // SYNC: payload durable before any entry turns READY (reader: lookup):
        // taking the stripe lock below fences first (see `Node::lock`).
        let st = self.store;
        let retry = |o: &Result<()>| matches!(o, Err(Error::Recovering));
        for round in 0..=VOID_REPAIRS {
            // An item that met a void line gave up whole (`Recovering`), and
            // its stripe was repaired since (see `Node::with_stripe`): it is
            // published again, a few rounds at most.
            if round > 0 && (mutant!("publish.no_retry_after_repair") || !out.iter().take(hs.len()).any(retry)) {
                break;
            }
            by_stripe(
                hs.len(),
                |i| hs.get(i).map_or(0, |h| h.stripe.min(st.layout.caps.n_stripes.saturating_sub(1))),
                |s, idx| {
                    if round > 0 && !idx.iter().any(|&i| out.get(i).is_some_and(retry)) {
                        return Ok(());
                    }
                    let r = self.with_stripe(s, |hdr| {
                        for &i in idx {
                            if let (Some(o), Some(h)) = (out.get_mut(i), hs.get(i)) {
                                if round == 0 || retry(o) {
                                    *o = self.publish_locked(s, hdr, h);
                                }
                            }
                        }
                        st.put_hdr(s, hdr)
                    });
                    void_if_revoked(&r, idx, out);
                    r
                },
            )?;
        }
        Ok(())
    }

    /// Refuses a handle that cannot name an entry of stripe `s` (made up, or
    /// grouped under another stripe): such a handle is stale, and must not
    /// reach the journal, whose records are numbered by stripe and entry.
    fn handle_in(&self, s: u32, h: &Handle) -> Result<()> {
        if h.stripe != s || h.entry >= self.store.layout.caps.entries_per_stripe {
            return Err(Error::StaleHandle);
        }
        Ok(())
    }

    fn writing_entry(&self, s: u32, hdr: &HeldStripe, h: &Handle) -> Result<Entry> {
        self.handle_in(s, h)?;
        let e = self.store.ent_held(s, h.entry, hdr)?;
        if e.state != state::WRITING
            || e.gen != h.gen && !mutant!("publish.no_gen_check")
            || e.key_lo != h.key.lo
            || e.key_hi != h.key.hi
            || e.ns != h.ns
            || e.pinners() & self.me() == 0
            || e.payload_off != h.off
        {
            return Err(Error::StaleHandle);
        }
        Ok(e)
    }

    /// A reservation `h` of this node whose entry a repair lost (see
    /// [`Node::let_go_lost`]): its record is still there, naming `h`'s
    /// block, and the entry (not void: `writing_entry` said so) is at
    /// another generation, or empty. The block goes back; `StaleHandle`.
    /// Anything else keeps `StaleHandle` alone.
    fn lost_reservation(&self, s: u32, hdr: &HeldStripe, h: &Handle) -> Error {
        let st = self.store;
        let g = self.global(s, h.entry);
        let lost = self.handle_in(s, h).is_ok()
            && self.journal_block(g, h.gen).ok().flatten() == Some((h.off, h.len))
            && st.ent_held(s, h.entry, hdr).is_ok_and(|e| e.gen != h.gen || e.state == state::EMPTY);
        if !lost {
            return Error::StaleHandle;
        }
        // SYNC: payload bytes the caller stored through a pointer land
        // before the block can be handed out again, as in `abort` (a dirty
        // line written back later would overwrite the next owner's
        // payload). The range is the one this node's journal names for the
        // reservation (checked above). Completed by the fence of the lock
        // release that frees the block, or of this stripe lock's release
        // before the last let-go that does.
        if let Err(e) = st.co.flush(&st.view, h.off, h.len, Site("index.lost.payload")) {
            return e;
        }
        self.let_go_lost(g, h.gen).err().unwrap_or(Error::StaleHandle)
    }

    /// [`Self::writing_entry`], a lost reservation let go of.
    fn writing_or_lost(&self, s: u32, hdr: &HeldStripe, h: &Handle) -> Result<Entry> {
        match self.writing_entry(s, hdr, h) {
            Err(Error::StaleHandle) if !mutant!("lost.reservation_kept") => Err(self.lost_reservation(s, hdr, h)),
            r => r,
        }
    }

    fn publish_locked(&self, s: u32, hdr: &mut HeldStripe, h: &Handle) -> Result<()> {
        let st = self.store;
        let mut e = self.writing_or_lost(s, hdr, h)?;
        e.state = state::READY;
        e.set_writer(None);
        st.lru_push_tail(s, hdr, h.entry, &mut e)?;
        // SYNC: READY written last (reader: lookup/acquire).
        st.put_ent(s, h.entry, &mut e, hdr.ticket())?;
        hdr.live = hdr.live.saturating_add(1);
        hdr.bytes = hdr.bytes.saturating_add(e.payload_len as u64);
        if !mutant!("changes.skip_store") {
            st.log_change(s, hdr, crate::layout::CHANGE_STORED, &e, self.id)?;
        }
        let mut j = self.local.journal.lock();
        self.journal_sub(&mut j, self.global(s, h.entry), h.gen).map(|_| ())
    }

    /// Abandons a reserved block: its entry and payload are freed.
    pub fn abort(&self, h: &Handle) -> Result<()> {
        let st = self.store;
        let s = h.stripe;
        if s >= st.layout.caps.n_stripes {
            return Err(Error::StaleHandle);
        }
        self.with_stripe(s, |hdr| {
            // The block's tenant, taken before anything changes. One whose
            // lines are void (a revoked holder's, landed late) awaits the
            // repair `tenant_take` asked for, which counts its usage from
            // the entries: the abort goes on without it (a reservation is
            // always given back, its payload flushed).
            let mut th = match self.tenant_for_removal(h.ns) {
                Err(Error::Recovering) => None,
                r => r?,
            };
            let r = self.abort_locked(s, hdr, h, &mut th);
            let put = th.map_or(Ok(()), |hold| self.tenant_put(hold));
            r?;
            put
        })
    }

    /// [`Node::abort`] under the stripe lock (and the tenant's, `th`).
    fn abort_locked(&self, s: u32, hdr: &mut HeldStripe, h: &Handle, th: &mut Option<TenantHold>) -> Result<()> {
        let st = self.store;
        {
            let mut e = self.writing_or_lost(s, hdr, h)?;
            // SYNC: payload bytes the caller stored through a pointer land
            // before the block can be handed out again (a dirty line written
            // back later would overwrite the next owner's payload). Flushed
            // and fenced while the entry is still WRITING and journaled: a
            // sibling burying this process, should it die here, finds the
            // block and flushes it too, and a recovery while this node is
            // stopped here (declared dead, not quiet) quarantines the block.
            // Once the entry is gone nothing names the block as this
            // node's, so no write-back of it may still be in flight (a
            // node stopped before the heap lock's fence, then recovered,
            // would land it over the block's next owner: seed 113003).
            st.co.flush(&st.view, e.payload_off, e.payload_len as u64, Site("index.abort.payload"))?;
            st.co.store_fence(Site("index.abort.payload.fence"));
            let tag = place(h.ns, h.key);
            let f = probe::find_held(st, s, tag, h.ns, h.key, hdr)?.ok_or(Error::Corrupt)?;
            let (off, len) = st.remove_locked(s, hdr, h.entry, f.bucket, &mut e, self.id)?;
            if let Some(hold) = th.as_mut() {
                hold.discharge(len, false);
            }
            st.put_hdr(s, hdr)?;
            {
                let mut j = self.local.journal.lock();
                self.journal_sub(&mut j, self.global(s, h.entry), h.gen)?;
            }
            // Freed under the stripe lock, as evict does: a recovery cannot
            // come between (it would reclaim the block, no entry naming it).
            match self.free_kv(off) {
                // The allocator awaits repair after a crash: the block stays
                // allocated until that recovery reclaims it.
                Ok(()) | Err(Error::Recovering) => Ok(()),
                Err(e) => Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests;
