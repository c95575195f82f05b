//! The read side of the index: pins (acquire and release, journaled and
//! validated without a lock) and copying reads.

use crate::coherence::{Coherence, Site};
use crate::hash::{place, Key};
use crate::layout::{state, Entry};
use crate::mutant::mutant;
use crate::node::Node;
use crate::{Error, Result};

use super::probe::{self, stripe_of};
use super::{claimed, entry_checksum, payload_of, Handle, CLAIM_WAITS};

impl<C: Coherence> Node<'_, C> {
    /// Pins the published blocks of `keys`: `out[i]` is the handle, or
    /// `NotFound`. Returns how many were pinned. Takes no lock: each pin is
    /// journaled, then (one fence for the batch) its entry read again; a key
    /// whose entry changed meanwhile is tried again, and pinned under its
    /// stripe lock if it keeps changing.
    pub fn acquire(&self, ns: u32, keys: &[Key], out: &mut [Result<Handle>]) -> Result<usize> {
        self.not_revoked()?;
        if out.len() < keys.len() {
            return Err(Error::InvalidArgument);
        }
        let tenant = self.tenant_of(ns)?.is_some();
        let mut pinned = 0usize;
        for (k, o) in keys.chunks(64).zip(out.chunks_mut(64)) {
            self.pin_some(ns, k, o)?;
            if tenant {
                // Pinned, a block keeps its generation: its stamp is read
                // for it. One past its lifetime is let go, missing.
                let now = self.wall_ms();
                for r in o.iter_mut() {
                    if let Ok(h) = *r {
                        if self.store.expired_now(h.stripe, h.entry, h.gen, now)? {
                            self.release(core::slice::from_ref(&h))?;
                            *r = Err(Error::NotFound);
                        }
                    }
                }
            }
            pinned = pinned.saturating_add(o.iter().filter(|r| r.is_ok()).count());
        }
        if pinned > 0 {
            if let Err(e) = self.owns_slot() {
                // Declared dead meanwhile: recovery drops this node's pins,
                // so none of these may be used (their records are left to
                // it: the slot may not be this node's to write any more).
                for o in out.iter_mut().take(keys.len()) {
                    if o.is_ok() {
                        *o = Err(e);
                    }
                }
                return Err(e);
            }
        }
        let missed = keys.len().saturating_sub(pinned) as u64;
        // (Its fence also completes the clearing of records that did not hold.)
        self.count(|c| {
            c.hits = c.hits.wrapping_add(pinned as u64);
            c.misses = c.misses.wrapping_add(missed);
        })?;
        Ok(pinned)
    }

    /// Pins up to 64 keys for [`Node::acquire`].
    fn pin_some(&self, ns: u32, keys: &[Key], out: &mut [Result<Handle>]) -> Result<()> {
        let st = self.store;
        // Keys still to pin: all at first, then those whose entry changed.
        // At most 64 keys (`acquire` passes chunks of 64).
        let mut todo: u64 = if keys.len() >= 64 { u64::MAX } else { (1u64 << keys.len()).wrapping_sub(1) };
        for round in 0..5 {
            let mut announced = 0u64;
            // A later round follows one that dropped records (of the keys
            // in `todo`).
            let dropped = round > 0;
            let mut torn = 0u64;
            for (i, k) in keys.iter().enumerate().filter(|&(i, _)| todo & (1 << i) != 0) {
                let Some(o) = out.get_mut(i) else { continue };
                *o = self.announce(ns, *k);
                announced |= (o.is_ok() as u64) << i;
                // An entry that kept changing while it was read (a writer
                // holding its stripe lock was descheduled mid-update) is
                // asked again, at the latest under the lock below.
                torn |= ((*o == Err(Error::Changed)) as u64) << i;
            }
            todo = torn;
            if announced == 0 && !dropped && torn == 0 {
                return Ok(());
            }
            // SYNC: the records announced above reach memory before any of
            // their entries is read again (pairs with the evictor's fence
            // after CLAIMED). So do the records the round before dropped,
            // before acquire returns: one left in the cache would reach
            // memory whenever the cache liked, maybe after recovery gave
            // this node's journal to another node.
            st.co.full_fence(Site("pins.announce.fence"));
            for i in (0..keys.len()).filter(|&i| announced & (1 << i) != 0) {
                if let Some(Ok(h)) = out.get(i) {
                    if self.still_ready(h)? {
                        self.touch(self.global(h.stripe, h.entry), h.gen);
                    } else {
                        self.unannounce(h)?;
                        todo |= 1 << i;
                    }
                }
            }
            if todo == 0 {
                return Ok(());
            }
            if torn != 0 {
                // Let the writer run (it may share this CPU). A failed wait
                // (a deadline, fencing) is met again by the lock below.
                let _ = self.env.wait(round);
            }
        }
        // Kept changing: pin under the stripe lock, where no evictor runs.
        for (i, k) in keys.iter().enumerate().filter(|&(i, _)| todo & (1 << i) != 0) {
            let s = st.stripe_of(ns, *k);
            let Some(o) = out.get_mut(i) else { continue };
            *o = Err(Error::NotFound);
            let r = self.with_stripe(s, |_| {
                *o = self.acquire_locked(ns, s, *k);
                Ok(())
            });
            if r == Err(Error::Revoked) {
                *o = Err(Error::Revoked);
            }
            r?;
        }
        Ok(())
    }

    /// Journals a pin of the READY entry of `key` as found without a lock
    /// (not yet fenced nor validated).
    fn announce(&self, ns: u32, key: Key) -> Result<Handle> {
        let st = self.store;
        let tag = place(ns, key);
        let s = stripe_of(tag, st.layout.caps.n_stripes);
        let f = match probe::find(st, s, tag, ns, key)? {
            // A void line (a revoked holder's, landed late) is missing.
            Some(f) if (pinnable(&f.e) || claimed(&f.e)) && st.void_now(s, &f.e)? => return Err(Error::NotFound),
            Some(f) if pinnable(&f.e) && f.e.checksum == entry_checksum(&f.e) => f,
            // An evictor holding the stripe lock is looking for pins of it
            // (it puts it back if it finds one, another node's maybe): not
            // missing, not yet pinnable either. Asked again once it decided.
            Some(f) if claimed(&f.e) => return Err(Error::Changed),
            _ => return Err(Error::NotFound),
        };
        let e = f.e;
        payload_of(st, e.payload_off, e.payload_len as u64)?;
        {
            let mut j = self.local.journal.lock();
            self.journal_add(&mut j, self.global(s, f.entry), e.gen, (e.payload_off, e.payload_len as u64))?;
        }
        Ok(Handle {
            ns,
            key,
            stripe: s,
            entry: f.entry,
            gen: e.gen,
            off: e.payload_off,
            len: e.payload_len as u64,
            tokens: e.tokens,
        })
    }

    /// The entry of an announced pin, read again: still the READY entry it
    /// was (same generation, key and block)?
    fn still_ready(&self, h: &Handle) -> Result<bool> {
        let after = if mutant!("acquire.no_revalidate") {
            return Ok(true);
        } else {
            match self.store.ent(h.stripe, h.entry) {
                Ok(e) => e,
                Err(Error::Changed) => return Ok(false),
                Err(e) => return Err(e),
            }
        };
        Ok(pinnable(&after)
            && after.gen == h.gen
            && after.ns == h.ns
            && after.key_lo == h.key.lo
            && after.key_hi == h.key.hi
            && after.payload_off == h.off)
    }

    /// Drops an announced pin that did not hold.
    fn unannounce(&self, h: &Handle) -> Result<()> {
        let mut j = self.local.journal.lock();
        self.journal_sub(&mut j, self.global(h.stripe, h.entry), h.gen).map(|_| ())
    }

    /// Pins `key` of stripe `s` under its lock: evictors wait for the lock,
    /// and see the record once the unlock publishes it.
    fn acquire_locked(&self, ns: u32, s: u32, key: Key) -> Result<Handle> {
        let h = self.announce(ns, key)?;
        debug_assert_eq!(h.stripe, s);
        Ok(h)
    }

    /// Drops one pin per handle (from [`Node::acquire`]); takes no lock.
    /// Every handle is tried; the first error is returned.
    pub fn release(&self, hs: &[Handle]) -> Result<()> {
        // A node declared dead has no pins left (recovery dropped them), and
        // its journal may be another node's now.
        self.owns_slot()?;
        let mut first_err = Ok(());
        for h in hs {
            if let Err(e) = self.release_one(h) {
                if first_err.is_ok() {
                    first_err = Err(e);
                }
            }
        }
        // SYNC: the cleared records reach memory before release returns
        // (reader: evictors, which keep a block while its record shows).
        self.store.co.store_fence(Site("pins.release.fence"));
        first_err
    }

    /// Entry `e` of stripe `s` read without the lock, waiting while a
    /// writer that holds the lock is mid-change (it may be descheduled
    /// there for a whole time slice; one that died is repaired by
    /// recovery). For reads that must not fail because another thread of
    /// the rack happened to be writing, e.g. dropping a pin.
    fn settled_ent(&self, s: u32, e: u32) -> Result<Entry> {
        let mut i = 0u32;
        loop {
            match self.store.ent(s, e) {
                Err(Error::Changed) => {
                    self.env.wait(i)?;
                    i = i.wrapping_add(1);
                }
                r => return r,
            }
        }
    }

    fn release_one(&self, h: &Handle) -> Result<()> {
        let st = self.store;
        if h.stripe >= st.layout.caps.n_stripes {
            return Err(Error::StaleHandle);
        }
        self.handle_in(h.stripe, h)?;
        let e = self.settled_ent(h.stripe, h.entry)?;
        if e.state == state::WRITING && e.gen == h.gen && e.pinners() & self.me() != 0 {
            // The journal records a reservation like a pin; dropping it here
            // would leave a WRITING entry without its writer.
            return Err(Error::NotPinned);
        }
        // The caller's loads of the payload complete before the record's
        // clearing is stored (a CPU ordering; no cache maintenance).
        crate::mem::fence_seq_cst();
        let g = self.global(h.stripe, h.entry);
        // An entry a repair lost (not at the pin's generation, not void):
        // the block recovery kept for the pin is let go of under the lock.
        let held = matches!(e.state, state::READY | state::CLAIMED | state::WRITING) && e.gen == h.gen;
        if !held && !self.store.void_now(h.stripe, &e)? && self.journal_block(g, h.gen)?.is_some() {
            return self.with_stripe(h.stripe, |hdr| {
                let e = self.store.ent_held(h.stripe, h.entry, hdr)?;
                if e.gen == h.gen && e.state != state::EMPTY {
                    let mut j = self.local.journal.lock();
                    return self.journal_sub(&mut j, g, h.gen).map(|_| ()).map_err(|_| Error::StaleHandle);
                }
                self.let_go_lost(g, h.gen)
            });
        }
        let mut j = self.local.journal.lock();
        self.journal_sub(&mut j, g, h.gen).map_err(|_| Error::StaleHandle)?;
        Ok(())
    }

    /// Drops every pin and abandons every reservation this node holds
    /// (detach, or a process cleaning up).
    pub fn release_all(&self) -> Result<()> {
        let eps = self.store.layout.caps.entries_per_stripe;
        let mut recs = [(0u32, 0u32, 0u32); 32];
        loop {
            let mut n = 0usize;
            self.journal_records(|g, gen, count| {
                if let Some(r) = recs.get_mut(n) {
                    *r = (g, gen, count);
                    n = n.saturating_add(1);
                }
                Ok(())
            })?;
            if n == 0 {
                return Ok(());
            }
            for &(g, gen, count) in recs.iter().take(n) {
                // No stripe (an impossible zero-entry layout): dropped below.
                let (s, e) = (g.checked_div(eps).unwrap_or(u32::MAX), g.checked_rem(eps).unwrap_or(0));
                if s >= self.store.layout.caps.n_stripes {
                    let mut j = self.local.journal.lock();
                    while self.journal_sub(&mut j, g, gen).is_ok_and(|left| left > 0) {}
                    continue;
                }
                let ent = self.settled_ent(s, e)?;
                let h = Handle {
                    ns: ent.ns,
                    key: Key { lo: ent.key_lo, hi: ent.key_hi },
                    stripe: s,
                    entry: e,
                    gen,
                    off: ent.payload_off,
                    len: ent.payload_len as u64,
                    tokens: ent.tokens,
                };
                if ent.state == state::WRITING && ent.gen == gen {
                    self.abort(&h)?;
                } else {
                    for _ in 0..count {
                        self.release(core::slice::from_ref(&h))?;
                    }
                }
            }
        }
    }

    /// Copies `buf.len()` bytes of a pinned or reserved block from byte `at`.
    pub fn read(&self, h: &Handle, at: u64, buf: &mut [u8]) -> Result<()> {
        self.not_revoked()?;
        let end = at.checked_add(buf.len() as u64).ok_or(Error::InvalidArgument)?;
        if end > h.len {
            return Err(Error::InvalidArgument);
        }
        self.check_payload(h)?;
        // SYNC: fresh payload lines (writer: publisher's payload flush).
        // Inside the payload checked above (`at + len <= h.len`).
        let off = h.off.wrapping_add(at);
        self.store.co.invalidate(&self.store.view, off, buf.len() as u64, Site("index.payload.read"))?;
        self.store.view.copy_out(off, buf)?;
        self.count(|c| c.bytes_read = c.bytes_read.wrapping_add(buf.len() as u64))
    }

    /// Copies the published block of `key` into `buf` without pinning it,
    /// validating the entry after the copy. Returns the payload length;
    /// `TooLarge` when `buf` is shorter, `NotFound` when absent.
    pub fn get(&self, ns: u32, key: Key, buf: &mut [u8]) -> Result<usize> {
        match self.get_into(ns, key, &mut [buf])? {
            Got::Copied(len) => Ok(len as usize),
            Got::TooSmall(_) => Err(Error::TooLarge),
        }
    }

    /// Copies the published block of `key` into `parts`, filled in order,
    /// without pinning it or taking a lock: an optimistic copy validated
    /// after the fact (the entry read again must be the same READY one), so
    /// a copy that raced an eviction is discarded and made again.
    /// `Changed` when it kept changing (the caller may pin it instead);
    /// `NotFound` when absent.
    pub fn get_into(&self, ns: u32, key: Key, parts: &mut [&mut [u8]]) -> Result<Got> {
        self.not_revoked()?;
        let tenant = self.tenant_of(ns)?.is_some();
        let room: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let (mut tries, mut waits) = (0u32, 0u32);
        while tries < 8 {
            let Some((s, f)) = self.store.find_stored(ns, key)? else {
                self.count(|c| c.misses = c.misses.wrapping_add(1))?;
                return Err(Error::NotFound);
            };
            if claimed(&f.e) {
                // An evictor decides about it (see `claimed`): wait for
                // its answer. A failed wait (a deadline, fencing) ends the
                // call as a read that kept changing.
                if waits >= CLAIM_WAITS || self.env.wait(waits).is_err() {
                    break;
                }
                waits = waits.saturating_add(1);
                continue;
            }
            // Past its lifetime: missing. (Read before the copy: should the
            // entry change meanwhile, the check after the copy sees it.)
            if tenant && self.store.expired_now(s, f.entry, f.e.gen, self.wall_ms())? {
                self.count(|c| c.misses = c.misses.wrapping_add(1))?;
                return Err(Error::NotFound);
            }
            tries = tries.saturating_add(1);
            let len = f.e.payload_len as u64;
            if room < len {
                // Found (a hit), not copied.
                self.count(|c| c.hits = c.hits.wrapping_add(1))?;
                return Ok(Got::TooSmall(len));
            }
            let off = payload_of(self.store, f.e.payload_off, len)?;
            self.store.co.invalidate(&self.store.view, off, len, Site("index.get.payload"))?;
            let mut at = 0u64;
            for p in parts.iter_mut() {
                let n = len.saturating_sub(at).min(p.len() as u64);
                let Some(dst) = p.get_mut(..n as usize).filter(|d| !d.is_empty()) else { break };
                // `at < len` and the payload was resolved whole above.
                self.store.view.copy_out(off.wrapping_add(at), dst)?;
                at = at.saturating_add(n);
            }
            // SYNC: re-validate after the copy (coherence rule 4); the entry's
            // invalidate orders the copy's loads before the re-read.
            let after = if mutant!("get.no_revalidate") { f.e } else { self.store.ent(s, f.entry)? };
            if after.state == state::READY && after.gen == f.e.gen && after.key_lo == key.lo && after.key_hi == key.hi {
                self.touch(self.global(s, f.entry), f.e.gen);
                self.count(|c| {
                    c.hits = c.hits.wrapping_add(1);
                    c.bytes_read = c.bytes_read.wrapping_add(len);
                })?;
                return Ok(Got::Copied(len));
            }
        }
        Err(Error::Changed)
    }
}

/// An entry a reader may pin: a published one.
fn pinnable(e: &Entry) -> bool {
    e.state == state::READY || mutant!("acquire.writing") && e.state == state::WRITING
}

/// What [`Node::get_into`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Got {
    /// The block's bytes were copied: its length.
    Copied(u64),
    /// The parts are shorter than the block: its length (nothing copied).
    TooSmall(u64),
}
