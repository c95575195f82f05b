//! The change log: what the index stored and removed, for routers and
//! caches that follow the region (a KV-aware router scores endpoints by the
//! blocks the rack holds, and a block stored by one node may be evicted by
//! any other, so only the region can say what it holds).
//!
//! Each stripe has a ring of [`ChangeRecord`]s. Every change of a stripe's
//! index that a reader can see — a block published (stored), a published
//! block evicted or removed — is recorded under the stripe lock that
//! already orders the change (no lock of its own): the record is published
//! and fenced, then the stripe header, which counts it (`changes`), is
//! published by the caller before the lock is released. Numbers of one
//! stripe are dense and increasing.
//!
//! A reader takes no lock. It reads the header fresh, then each record it
//! has not seen, fresh. A record is trusted when it carries the sequence
//! number asked for and its check word holds. The ring keeps the last
//! `change_records` changes: a reader that fell further behind, or whose
//! record was overwritten while it read, learns it as a gap. It then
//! rescans the index (changes after the header it read are also in the
//! log, so it misses nothing; some it sees twice) and goes on from there.
//!
//! Recovery rebuilds stripes from their entries; what it dropped is not
//! recorded one by one. It raises each rebuilt stripe's `changes_floor` to
//! a new number instead: every reader of the stripe meets a gap and
//! rescans.

use crate::coherence::{Coherence, Site};
use crate::hash::{mix64, Key};
use crate::layout::{ChangeRecord, Entry, StripeHeader, CHANGE_REMOVED, CHANGE_STORED};
use crate::mutant::mutant;
use crate::store::Store;
use crate::{Error, Result};

/// A change read from the log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Its sequence number in its stripe.
    pub seq: u64,
    /// `true`: the block was published; `false`: removed.
    pub stored: bool,
    /// The block's namespace.
    pub ns: u32,
    /// The block's key.
    pub key: Key,
    /// Payload bytes.
    pub len: u64,
    /// Tokens the block covers.
    pub tokens: u32,
    /// The node that made the change.
    pub node: u32,
}

/// What one read of a stripe's log found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tail {
    /// `n` changes were read (the caller's cursor is now the last one's
    /// number; `n` is 0 when none is new).
    Read {
        /// Changes read.
        n: usize,
    },
    /// Changes after the cursor are no longer in the log: rescan the
    /// stripe's index, then read on from `resume`.
    Gap {
        /// The stripe's change count, read before the caller's rescan.
        resume: u64,
    },
}

/// The check word of a record: over every field but itself.
pub fn record_check(r: &ChangeRecord) -> u64 {
    let words = [
        r.seq,
        r.kind as u64 | (r.ns as u64) << 32,
        r.key_lo,
        r.key_hi,
        r.len,
        r.tokens as u64 | (r.node as u64) << 32,
        r.ticket,
    ];
    words.iter().fold(0x6368_616e_6765_7321, |h, &w| mix64(h ^ mix64(w)))
}

/// The record `r` as a change, when it is one: its number is `seq` and its
/// check word holds.
fn decode(r: &ChangeRecord, seq: u64) -> Option<Change> {
    if r.seq != seq || r.check != record_check(r) || !matches!(r.kind, CHANGE_STORED | CHANGE_REMOVED) {
        return None;
    }
    Some(Change {
        seq,
        stored: r.kind == CHANGE_STORED,
        ns: r.ns,
        key: Key { lo: r.key_lo, hi: r.key_hi },
        len: r.len,
        tokens: r.tokens,
        node: r.node,
    })
}

impl<C: Coherence> Store<C> {
    /// Records that entry `ent` of stripe `s` was stored (`CHANGE_STORED`)
    /// or removed (`CHANGE_REMOVED`) by node `node`, and counts it in `h`,
    /// which the caller publishes before it releases the stripe lock.
    /// Caller holds the lock.
    pub(crate) fn log_change(&self, s: u32, h: &mut StripeHeader, kind: u32, ent: &Entry, node: u32) -> Result<()> {
        let seq = h.changes.wrapping_add(1);
        let mut r = ChangeRecord {
            seq,
            kind,
            ns: ent.ns,
            key_lo: ent.key_lo,
            key_hi: ent.key_hi,
            len: ent.payload_len as u64,
            tokens: ent.tokens,
            node,
            ticket: h.ticket,
            check: 0,
        };
        r.check = record_check(&r);
        // SYNC: the record reaches memory before the stripe header that
        // counts it (reader: `read_changes`, which trusts records the
        // header counts).
        self.publish(self.layout.change(s, seq), &r, Site("changes.record.write"))?;
        self.co.store_fence(Site("changes.record.fence"));
        h.changes = seq;
        // The count is published now, not only when the caller's critical
        // section ends: a section that fails half way (its node revoked,
        // say) leaves no record beyond the count, which a later change
        // would number again while readers took the first for real.
        self.put_hdr(s, h)
    }

    /// The largest change number stripe `s`'s log holds a sound record of
    /// (each record read fresh; 0 for none). Recovery's count when the
    /// header is void.
    pub(crate) fn changes_logged(&self, s: u32) -> Result<u64> {
        let n = self.layout.caps.change_records as u64;
        let mut most = 0u64;
        for i in 0..n {
            let r: ChangeRecord = self.fresh(self.layout.change(s, i), Site("changes.logged"))?;
            if r.seq & n.wrapping_sub(1) == i && decode(&r, r.seq).is_some() {
                most = most.max(r.seq);
            }
        }
        Ok(most)
    }

    /// Whether record `r` of stripe `s`'s log is a revoked holder's: well
    /// formed, stamped below the stripe lock's repair floor.
    fn record_void(&self, s: u32, r: &ChangeRecord) -> Result<bool> {
        if decode(r, r.seq).is_none() || mutant!("changes.void_record_corrupt") {
            return Ok(false);
        }
        let l = &self.layout;
        // SYNC: fresh floor (writers: the manager, recovery).
        let ll: crate::layout::LockLine = self.fresh(l.lock_line(l.locks().stripe(s)), Site("changes.record.floor"))?;
        Ok(r.ticket < ll.floor)
    }

    /// Reads stripe `s`'s changes after number `cursor` into `out`, oldest
    /// first, without a lock (see the module documentation). `Corrupt` when
    /// a record the header counts is unreadable though no writer can have
    /// overwritten it.
    pub fn read_changes(&self, s: u32, cursor: u64, out: &mut [Change]) -> Result<Tail> {
        let l = &self.layout;
        if s >= l.caps.n_stripes {
            return Err(Error::InvalidArgument);
        }
        let ring = l.caps.change_records as u64;
        // SYNC: fresh header (writer: the stripe's lock holder, after the
        // records it counts).
        let h: StripeHeader = self.fresh(l.stripe(s), Site("changes.head.read"))?;
        if cursor > h.changes || cursor < h.changes_floor || h.changes.wrapping_sub(cursor) > ring {
            // Behind the ring (or the floor), or ahead of the stripe (a
            // region formatted again): only a rescan can tell.
            return Ok(Tail::Gap { resume: h.changes });
        }
        let mut n = 0usize;
        for (seq, o) in (cursor.wrapping_add(1)..=h.changes).zip(out.iter_mut()) {
            // SYNC: fresh record (writer: as above, before the header).
            let r: ChangeRecord = self.fresh(l.change(s, seq), Site("changes.record.read"))?;
            if let Some(c) = decode(&r, seq) {
                *o = c;
                n = n.saturating_add(1);
                continue;
            }
            // Not the change asked for. A newer change took its place (a
            // writer takes record `seq`'s place once the header counts `seq
            // + ring - 1`), or recovery skipped over it: a gap. Otherwise
            // the record was never written as the header says.
            // SYNC: a hint: fresh header again (writer: as above). A record
            // is one line, published before the count that covers it, and
            // recovery never takes one back, so a counted record that does
            // not decode was overwritten by a newer one (`newer`, a gap
            // without this read) or never written (corruption): only the
            // choice between gap and `Corrupt` for a corrupt region can
            // hang on this read, never what a reader is told of a sound one.
            let again: StripeHeader = self.fresh(l.stripe(s), Site("changes.head.reread.hint"))?;
            let newer = decode(&r, r.seq).is_some() && r.seq > seq;
            if newer || self.record_void(s, &r)? {
                // Overwritten by a newer change, or by a revoked holder's
                // late write (see `lock.rs`, "Zombies").
                return Ok(Tail::Gap { resume: again.changes });
            }
            if again.changes_floor != h.changes_floor || again.changes.saturating_add(1) >= seq.saturating_add(ring) {
                return Ok(Tail::Gap { resume: again.changes });
            }
            return Err(Error::Corrupt);
        }
        Ok(Tail::Read { n })
    }

    /// Calls `f(ns, key, len, tokens)` for each block of stripe `s` that is
    /// stored now (published, or claimed by an evictor that may yet give it
    /// back), reading entries without a lock: a reader's rescan after a gap
    /// (read [`Store::changes_head`] first, then scan, then read the log on
    /// from that count). `Changed` when an entry kept changing under the
    /// reads; the caller scans again later.
    pub fn scan_stored(&self, s: u32, mut f: impl FnMut(u32, Key, u64, u32)) -> Result<()> {
        let l = &self.layout;
        if s >= l.caps.n_stripes {
            return Err(Error::InvalidArgument);
        }
        for e in 0..l.caps.entries_per_stripe {
            // A validated, fresh read (see `Store::fresh_entry`).
            let ent = self.fresh_entry(l.entry(s, e), Site("changes.scan.entry"))?;
            if matches!(ent.state, crate::layout::state::READY | crate::layout::state::CLAIMED) {
                f(ent.ns, Key { lo: ent.key_lo, hi: ent.key_hi }, ent.payload_len as u64, ent.tokens);
            }
        }
        Ok(())
    }

    /// Stripe `s`'s change count and floor, read fresh: where a reader
    /// starts (from the count, after a scan of the index).
    pub fn changes_head(&self, s: u32) -> Result<(u64, u64)> {
        if s >= self.layout.caps.n_stripes {
            return Err(Error::InvalidArgument);
        }
        // SYNC: a hint: a count older than memory's only makes the reader
        // read changes again that its scan saw (they are in the log), or
        // meet a gap; fresh all the same.
        let h: StripeHeader = self.fresh(self.layout.stripe(s), Site("changes.head.start.hint"))?;
        Ok((h.changes, h.changes_floor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::with_two_nodes;

    fn key(i: u64) -> Key {
        Key { lo: i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1, hi: i }
    }

    /// Every change of every stripe after `cursors`, advancing them.
    fn drain(st: &Store<crate::coherence::Coherent>, cursors: &mut [u64]) -> (std::vec::Vec<Change>, bool) {
        let mut all = std::vec::Vec::new();
        let mut gap = false;
        for (s, c) in cursors.iter_mut().enumerate() {
            let mut buf = [Change::default(); 8];
            loop {
                match st.read_changes(s as u32, *c, &mut buf).unwrap() {
                    Tail::Read { n: 0 } => break,
                    Tail::Read { n } => {
                        assert!(buf[..n].windows(2).all(|w| w[1].seq == w[0].seq + 1), "dense, in order");
                        assert_eq!(buf[0].seq, *c + 1);
                        *c = buf[n - 1].seq;
                        all.extend_from_slice(&buf[..n]);
                    }
                    Tail::Gap { resume } => {
                        gap = true;
                        *c = resume;
                    }
                }
            }
        }
        (all, gap)
    }

    #[test]
    fn publishes_and_evictions_are_logged_once_each_in_order() {
        with_two_nodes(|f, _, a, b| {
            let st = &*f.store;
            let mut cursors = std::vec![0u64; st.layout.caps.n_stripes as usize];
            for i in 0..6 {
                let h = a.reserve(1, key(i), 1000 + i, 7).unwrap();
                a.publish(&h).unwrap();
            }
            let aborted = a.reserve(1, key(50), 100, 1).unwrap();
            a.abort(&aborted).unwrap();
            let (got, gap) = drain(st, &mut cursors);
            assert!(!gap);
            assert_eq!(got.len(), 6, "an aborted reservation is no change: {got:?}");
            for i in 0..6 {
                let c = got.iter().find(|c| c.key == key(i)).expect("logged");
                assert_eq!((c.stored, c.ns, c.len, c.tokens, c.node), (true, 1, 1000 + i, 7, a.id));
            }
            // Another node evicts them all.
            b.evict(u64::MAX, &mut crate::index::Lru).unwrap();
            let (got, gap) = drain(st, &mut cursors);
            assert!(!gap);
            assert_eq!(got.len(), 6);
            assert!(got.iter().all(|c| !c.stored && c.node == b.id));
            assert_eq!(drain(st, &mut cursors).0.len(), 0, "nothing twice");
        });
    }

    #[test]
    fn a_reader_left_behind_by_the_ring_or_by_recovery_meets_a_gap() {
        with_two_nodes(|f, env, a, b| {
            let st = &*f.store;
            let ring = st.layout.caps.change_records as u64;
            let stripes = st.layout.caps.n_stripes as usize;
            let mut cursors = std::vec![0u64; stripes];
            // More changes in one stripe than its ring holds.
            let s0 = st.stripe_of(1, key(0));
            let mut i = 0u64;
            let mut made = 0u64;
            while made < ring + 3 {
                if st.stripe_of(1, key(i)) == s0 {
                    let h = a.reserve(1, key(i), 64, 1).unwrap();
                    a.publish(&h).unwrap();
                    made += 1;
                }
                i += 1;
            }
            let mut buf = [Change::default(); 4];
            assert_eq!(st.read_changes(s0, 0, &mut buf).unwrap(), Tail::Gap { resume: ring + 3 });
            assert_eq!(st.read_changes(s0, 3, &mut buf).unwrap(), Tail::Read { n: 4 }, "the last ring's worth");
            assert_eq!(buf[0].seq, 4);
            // A recovery raises every floor: a reader that was caught up
            // meets a gap too.
            drain(st, &mut cursors);
            let _w = b.reserve(1, key(9999), 64, 1).unwrap();
            *env.killed.lock() = 1 << 1;
            env.step().unwrap();
            a.recover(0).unwrap();
            let (_, gap) = drain(st, &mut cursors);
            assert!(gap, "recovery's rebuild is known by a rescan");
            assert!(crate::testutil::findings(f).is_empty(), "{:?}", crate::testutil::findings(f));
        });
    }

    #[test]
    fn a_record_the_header_counts_but_memory_lacks_is_corrupt() {
        with_two_nodes(|f, _, a, _| {
            let st = &*f.store;
            let h = a.reserve(1, key(1), 64, 1).unwrap();
            a.publish(&h).unwrap();
            let s = st.stripe_of(1, key(1));
            st.view.write(st.layout.change(s, 1), &ChangeRecord::default()).unwrap();
            let mut buf = [Change::default(); 4];
            assert_eq!(st.read_changes(s, 0, &mut buf), Err(Error::Corrupt));
            assert_eq!(st.read_changes(99, 0, &mut buf), Err(Error::InvalidArgument));
        });
    }
}
