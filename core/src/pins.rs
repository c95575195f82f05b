//! Pin journals: each node records the entries it pins (or is writing) in its
//! own part of the region, so recovery can drop a dead node's pins instead of
//! leaking their blocks. Only the node writes its journal; its threads
//! serialise on the node's journal mutex.
//!
//! A pin of a published block is its journal record and nothing else: pins
//! take no lock and write nothing shared but the pinner's own lines. The
//! journal's head line summarises it (a bit per global entry modulo 512), so
//! an evictor reads one line per node and the records only where a bit is
//! set. Pinner and evictor meet as in a hazard-pointer handshake, each
//! storing its claim, flushing it, and fencing before it reads the other's:
//! the pinner its record, then the entry (still READY, same generation);
//! the evictor CLAIMED in the entry, then every journal (no record of it).
//! At least one of them sees the other, and backs off.
//!
//! A reservation is journaled too, and the WRITING entry names its writer
//! (`writer`), which recovery and `check` use to find it.

use crate::coherence::{Coherence, Site};
use crate::layout::{PinRecord, PinSummary, MAX_NODES, NODE_FREE};
use crate::mutant::mutant;
use crate::node::JournalLocal;
use crate::node::Node;
use crate::{Error, Result};

impl<C: Coherence> Node<'_, C> {
    /// Adds one pin of global entry `entry` at generation `gen` (flushed, not
    /// fenced). Returns true when it is this node's first pin of it. `j` is
    /// the journal mutex's content, held by the caller.
    pub(crate) fn journal_add(&self, j: &mut JournalLocal, entry: u32, gen: u32, block: (u64, u64)) -> Result<bool> {
        self.journal_add_at(j, entry, gen, block).map(|(first, _)| first)
    }

    /// [`Node::journal_add`], also returning where the record lies (for
    /// [`Node::journal_place`]: only this node's reservation of `entry` at
    /// `gen` uses that record until it ends).
    pub(crate) fn journal_add_at(
        &self,
        j: &mut JournalLocal,
        entry: u32,
        gen: u32,
        block: (u64, u64),
    ) -> Result<(bool, u64)> {
        let l = &self.store.layout;
        let mut free = None;
        for i in 0..l.caps.pin_slots {
            let off = l.pin_record(self.id, i);
            let mut r: PinRecord = self.store.view.read(off)?;
            // A record names global entry `entry` as `entry + 1` (0: free);
            // entries number far below `u32::MAX`.
            if r.entry == entry.wrapping_add(1) && r.gen == gen as u64 {
                r.count = r.count.checked_add(1).ok_or(Error::JournalFull)?;
                // SYNC: journal record durable before the pin is used (reader: recovery).
                self.store.publish(off, &r, Site("pins.add.count"))?;
                return Ok((false, off));
            }
            if r.entry == 0 && free.is_none() {
                free = Some(off);
            }
        }
        let off = free.ok_or(Error::JournalFull)?;
        let r = PinRecord { entry: entry.wrapping_add(1), count: 1, gen: gen as u64, off: block.0, len: block.1 };
        // SYNC: the record reaches memory before the pin is used (readers:
        // evictors, recovery); the caller's fence orders it before its
        // re-validation of the entry.
        self.store.publish(off, &r, Site("pins.add.new"))?;
        self.cover(j, entry, true)?;
        Ok((true, off))
    }

    /// Counts a record of `entry` in or out of its summary bit, writing the
    /// summary line when the bit changes.
    fn cover(&self, j: &mut JournalLocal, entry: u32, add: bool) -> Result<()> {
        let b = entry.checked_rem(PinSummary::BITS).unwrap_or(0) as usize;
        let (w, m) = PinSummary::bit(entry);
        let (Some(count), Some(bits)) = (j.covered.get_mut(b), j.summary.bits.get_mut(w)) else {
            return Err(Error::InvalidArgument);
        };
        let was = *count;
        *count = if add { was.saturating_add(1) } else { was.saturating_sub(1) };
        if (was == 0) == (*count == 0) {
            return Ok(());
        }
        if add {
            *bits |= m;
        } else {
            *bits &= !m;
        }
        // SYNC: a set bit reaches memory with the record it covers, before the
        // caller's fence (reader: an evictor, which skips a node's records
        // where the bit is clear); a cleared one only spares evictors a scan.
        self.store.publish(self.store.layout.pin_summary(self.id), &j.summary, Site("pins.summary"))
    }

    /// Drops one pin; returns the count left. `NotFound` if not pinned.
    pub(crate) fn journal_sub(&self, j: &mut JournalLocal, entry: u32, gen: u32) -> Result<u32> {
        let l = &self.store.layout;
        for i in 0..l.caps.pin_slots {
            let off = l.pin_record(self.id, i);
            let mut r: PinRecord = self.store.view.read(off)?;
            if r.entry == entry.wrapping_add(1) && r.gen == gen as u64 {
                r.count = r.count.saturating_sub(1);
                if r.count == 0 {
                    r = PinRecord::default();
                }
                self.store.publish(off, &r, Site("pins.sub"))?;
                if r.count == 0 {
                    self.cover(j, entry, false)?;
                }
                return Ok(r.count);
            }
        }
        Err(Error::NotFound)
    }

    /// Names the block of this node's reservation of `entry` at `gen` in
    /// its record at `at` (from [`Node::journal_add_at`], made before the
    /// block was allocated).
    pub(crate) fn journal_place(&self, at: u64, entry: u32, gen: u32, block: (u64, u64)) -> Result<()> {
        let _j = self.local.journal.lock();
        let mut r: PinRecord = self.store.view.read(at)?;
        if r.entry != entry.wrapping_add(1) || r.gen != gen as u64 {
            return Err(Error::NotFound);
        }
        (r.off, r.len) = block;
        // SYNC: the block named before the entry is stored (reader:
        // recovery, which keeps a block a live journal names); the stripe
        // lock's release fences.
        self.store.publish(at, &r, Site("pins.place"))
    }

    /// The block this node's record of `entry` at `gen` names, if it has one.
    pub(crate) fn journal_block(&self, entry: u32, gen: u32) -> Result<Option<(u64, u64)>> {
        let l = &self.store.layout;
        for i in 0..l.caps.pin_slots {
            let r: PinRecord = self.store.view.read(l.pin_record(self.id, i))?;
            if r.entry == entry.wrapping_add(1) && r.gen == gen as u64 && r.count > 0 {
                return Ok(Some((r.off, r.len)));
            }
        }
        Ok(None)
    }

    /// Lets go of a pin or reservation of global entry `g` at `gen` whose
    /// entry a repair lost (a revoked holder's line landed over it and was
    /// dropped: see `Node::claim_journaled`). Recovery kept the block,
    /// which the record names, for every live node journaling it; the last
    /// of them to let go frees it. The caller holds the entry's stripe lock,
    /// so these let-gos run one at a time: each clears its record, fences,
    /// and frees only when no journal names the entry at `gen` any more
    /// (none can start to: the entry is at another generation now). One
    /// that let go without the lock (it read the entry before the repair)
    /// leaves the block to the next recovery, which finds no record of it.
    pub(crate) fn let_go_lost(&self, g: u32, gen: u32) -> Result<()> {
        let (left, block) = {
            let mut j = self.local.journal.lock();
            let block = self.journal_block(g, gen)?.ok_or(Error::StaleHandle)?;
            (self.journal_sub(&mut j, g, gen)?, block)
        };
        // (The record's clearing reaches the next node to let go, which
        // reads it fresh, before that node takes the stripe lock: the
        // lock's release fences.)
        if left > 0 {
            return Ok(());
        }
        if mutant!("lost.block_kept")
            || block.1 == 0
            || !mutant!("lost.ignore_other_pins") && self.pinned_anywhere(g, gen)?
        {
            return Ok(());
        }
        match self.free_kv(block.0) {
            // The allocator awaits repair: that recovery reclaims the block.
            Ok(()) | Err(Error::Recovering) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every record of this node's journal: (global entry, gen, count).
    pub(crate) fn journal_records(&self, mut f: impl FnMut(u32, u32, u32) -> Result<()>) -> Result<()> {
        let l = &self.store.layout;
        for i in 0..l.caps.pin_slots {
            let r: PinRecord = self.store.view.read(l.pin_record(self.id, i))?;
            if r.entry != 0 {
                // Not 0 (checked above).
                f(r.entry.wrapping_sub(1), r.gen as u32, r.count)?;
            }
        }
        Ok(())
    }

    /// True when some node's journal records a pin of global entry `g` at
    /// `gen`: every node's summary line is read fresh, and the records of
    /// those whose bit is set. Free slots are skipped (nothing reads a free
    /// node's journal; its next owner clears it before turning ALIVE).
    /// The caller has published its claim (CLAIMED) and fenced.
    pub(crate) fn pinned_anywhere(&self, g: u32, gen: u32) -> Result<bool> {
        let st = self.store;
        let l = &st.layout;
        let nn = l.caps.max_nodes.min(MAX_NODES);
        let mut lines = [0u64; MAX_NODES as usize];
        for (n, x) in lines.iter_mut().enumerate().take(nn as usize) {
            *x = l.pin_summary(n as u32);
        }
        // SYNC: every node's summary fresh (writer: node n's pins), dropped
        // together so their loads miss together, not one after another.
        let lines = lines.get(..nn as usize).unwrap_or(&[]);
        st.co.invalidate_lines(&st.view, lines, Site("evict.pins.summary"))?;
        for (n, &off) in (0u32..).zip(lines) {
            let sum: PinSummary = st.view.read(off)?;
            if !sum.covers(g) {
                continue;
            }
            let info: crate::layout::NodeInfo = st.fresh_state_first(l.node_info(n), Site("evict.pins.node"))?;
            // A fenced node's pins hold until it is quiet and freed: it may
            // still read the block (through a pointer, say).
            if info.state == NODE_FREE {
                continue;
            }
            // SYNC: fresh records (writer: node n's pins).
            let recs = (l.caps.pin_slots as u64).saturating_mul(core::mem::size_of::<PinRecord>() as u64);
            st.co.invalidate(&st.view, l.pin_record(n, 0), recs, Site("evict.pins.records"))?;
            for i in 0..l.caps.pin_slots {
                let r: PinRecord = st.view.read(l.pin_record(n, i))?;
                if r.entry == g.wrapping_add(1) && r.gen == gen as u64 && r.count > 0 {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }
}

/// What node `n`'s journal holds, as read through `store` (fresh, at `site`):
/// pins of published entries and reservations of entries it is writing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalCensus {
    /// Published entries pinned (records, not counts).
    pub pins: u32,
    /// Entries being written.
    pub reservations: u32,
}

/// Counts what node `n`'s journal holds (for reports: `cxlkv check`'s list of
/// stranded nodes, `inspect`).
pub fn journal_census<C: Coherence>(store: &crate::store::Store<C>, n: u32, site: Site) -> Result<JournalCensus> {
    let l = &store.layout;
    if n >= l.caps.max_nodes {
        return Err(Error::BadNode);
    }
    let eps = l.caps.entries_per_stripe;
    store.co.invalidate(&store.view, l.journal(n), l.journal_len(), site)?;
    let mut c = JournalCensus::default();
    for i in 0..l.caps.pin_slots {
        let r: PinRecord = store.view.read(l.pin_record(n, i))?;
        let g = r.entry.wrapping_sub(1);
        let (Some(s), Some(e)) = (g.checked_div(eps), g.checked_rem(eps)) else { continue };
        if r.entry == 0 || r.count == 0 || s >= l.caps.n_stripes {
            continue;
        }
        let ent = match store.ent(s, e) {
            Ok(ent) => ent,
            // Being rewritten by a lock holder (an LRU relink, say): an
            // entry a record names is READY far more often than WRITING,
            // and a census taken without locks is a snapshot anyway.
            Err(Error::Changed) => {
                c.pins = c.pins.saturating_add(1);
                continue;
            }
            Err(e) => return Err(e),
        };
        if ent.gen as u64 != r.gen {
            continue;
        }
        match ent.state {
            crate::layout::state::READY => c.pins = c.pins.saturating_add(1),
            crate::layout::state::WRITING | crate::layout::state::QUARANTINED if ent.pinners() & (1 << n) != 0 => {
                c.reservations = c.reservations.saturating_add(1)
            }
            _ => {}
        }
    }
    Ok(c)
}
