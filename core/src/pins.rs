//! Pin journals: each node records the entries it pins (or is writing) in its
//! own part of the region, so recovery can drop a dead node's pins instead of
//! leaking their blocks. Only the node writes its journal; its threads
//! serialise on the node's journal mutex.
//!
//! The entry itself carries a bit per pinning node (not a bare count), which
//! makes recovery exact: clearing a dead node's bit can never drop another
//! node's pin, whether or not the dead node finished updating its journal.

use crate::coherence::{Coherence, Site};
use crate::layout::PinRecord;
use crate::node::Node;
use crate::{Error, Result};

impl<C: Coherence> Node<'_, C> {
    /// Adds one pin of global entry `entry` at generation `gen`. Returns true
    /// when it is this node's first pin of it. Caller holds the journal mutex.
    pub(crate) fn journal_add(&self, entry: u32, gen: u32) -> Result<bool> {
        let l = &self.store.layout;
        let mut free = None;
        for i in 0..l.caps.pin_slots {
            let off = l.pin_record(self.id, i);
            let mut r: PinRecord = self.store.region.read(off)?;
            if r.entry == entry + 1 && r.gen == gen as u64 {
                r.count = r.count.checked_add(1).ok_or(Error::JournalFull)?;
                // SYNC: journal record durable before the pin is used (reader: recovery).
                self.store.publish(off, &r, Site("pins.add.count"))?;
                return Ok(false);
            }
            if r.entry == 0 && free.is_none() {
                free = Some(off);
            }
        }
        let off = free.ok_or(Error::JournalFull)?;
        let r = PinRecord { entry: entry + 1, count: 1, gen: gen as u64 };
        self.store.publish(off, &r, Site("pins.add.new"))?;
        Ok(true)
    }

    /// Drops one pin; returns the count left. `NotFound` if not pinned.
    pub(crate) fn journal_sub(&self, entry: u32, gen: u32) -> Result<u32> {
        let l = &self.store.layout;
        for i in 0..l.caps.pin_slots {
            let off = l.pin_record(self.id, i);
            let mut r: PinRecord = self.store.region.read(off)?;
            if r.entry == entry + 1 && r.gen == gen as u64 {
                r.count = r.count.saturating_sub(1);
                if r.count == 0 {
                    r = PinRecord::default();
                }
                self.store.publish(off, &r, Site("pins.sub"))?;
                return Ok(r.count);
            }
        }
        Err(Error::NotFound)
    }

    /// Every record of this node's journal: (global entry, gen, count).
    pub(crate) fn journal_records(&self, mut f: impl FnMut(u32, u32, u32) -> Result<()>) -> Result<()> {
        let l = &self.store.layout;
        for i in 0..l.caps.pin_slots {
            let r: PinRecord = self.store.region.read(l.pin_record(self.id, i))?;
            if r.entry != 0 {
                f(r.entry - 1, r.gen as u32, r.count)?;
            }
        }
        Ok(())
    }
}
