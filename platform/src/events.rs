//! The rack's block events, as a router wants them: which blocks the region
//! stores now, and each store and removal as it happens, whichever node made
//! it. Read from the region's change log (see core's `changes.rs`) by any
//! process, attached or not, without a lock.
//!
//! A [`Feed`] keeps what it reported (each stripe's stored keys), so it can
//! turn a gap in the log (it fell more than a ring behind, or a recovery
//! rebuilt the stripe) into exact events: it rescans the stripe and reports
//! the difference — stores it had not reported, removals of keys no longer
//! stored. Its first poll reports [`Event::Cleared`] and then every stored
//! block, so a subscriber starts from the region's state, not from nothing.

use std::collections::HashMap;

pub use cxlkv_core::changes::Change;
use cxlkv_core::changes::Tail;
use cxlkv_core::hash::Key;
use cxlkv_core::store::Store;
use cxlkv_core::Error as CoreError;

use crate::error::Result;
use crate::flush::Flush;

/// One event of the feed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Forget every block reported before (the feed starts over).
    Cleared,
    /// A block is stored.
    Stored {
        /// Namespace.
        ns: u32,
        /// Key.
        key: Key,
        /// Payload bytes.
        len: u64,
        /// Tokens it covers.
        tokens: u32,
        /// The node that stored it (`None`: found by a scan).
        node: Option<u32>,
    },
    /// A block is no longer stored (evicted or removed).
    Removed {
        /// Namespace.
        ns: u32,
        /// Key.
        key: Key,
        /// The node that removed it (`None`: found by a scan).
        node: Option<u32>,
    },
}

/// What a feed has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeedStats {
    /// Changes read from the log.
    pub changes: u64,
    /// Gaps met (each repaired by a rescan of its stripe).
    pub gaps: u64,
    /// Blocks the feed knows stored now.
    pub stored: u64,
}

/// A reader of the region's change log (see the module documentation).
pub struct Feed<'a> {
    store: &'a Store<Flush>,
    cursors: Vec<u64>,
    /// Per stripe: a rescan is owed.
    rescan: Vec<bool>,
    /// Per stripe: what the feed reported stored, with (length, tokens).
    live: Vec<HashMap<(u32, Key), (u64, u32)>>,
    started: bool,
    stats: FeedStats,
}

/// Changes read from one stripe per call at most (a busy stripe does not
/// starve the others).
const BATCH: usize = 256;

impl<'a> Feed<'a> {
    /// A feed of `store`'s changes; its first poll reports the state.
    pub fn new(store: &'a Store<Flush>) -> Feed<'a> {
        let n = store.layout.caps.n_stripes as usize;
        Feed {
            store,
            cursors: vec![0; n],
            rescan: vec![true; n],
            live: vec![HashMap::new(); n],
            started: false,
            stats: FeedStats::default(),
        }
    }

    /// What the feed has done so far.
    pub fn stats(&self) -> FeedStats {
        FeedStats { stored: self.live.iter().map(|m| m.len() as u64).sum(), ..self.stats }
    }

    /// Calls `f` with every block the feed has reported stored and not
    /// removed since: the state as of its last poll.
    pub fn for_each_stored(&self, mut f: impl FnMut(u32, Key, u64, u32)) {
        for m in &self.live {
            for (&(ns, key), &(len, tokens)) in m {
                f(ns, key, len, tokens);
            }
        }
    }

    /// Appends the events since the last poll to `out` (in each stripe's
    /// order; a key's events keep their order).
    pub fn poll(&mut self, out: &mut Vec<Event>) -> Result<()> {
        if !self.started {
            self.started = true;
            out.push(Event::Cleared);
        }
        let mut buf = vec![Change::default(); BATCH];
        for s in 0..self.cursors.len() {
            if self.rescan[s] {
                self.resync(s, out)?;
                if self.rescan[s] {
                    continue;
                }
            }
            match self.store.read_changes(s as u32, self.cursors[s], &mut buf)? {
                Tail::Read { n } => {
                    for c in &buf[..n] {
                        self.cursors[s] = c.seq;
                        self.stats.changes += 1;
                        let id = (c.ns, c.key);
                        // A change the last rescan saw already is not
                        // reported twice.
                        if c.stored {
                            if self.live[s].insert(id, (c.len, c.tokens)).is_none() {
                                out.push(Event::Stored {
                                    ns: c.ns,
                                    key: c.key,
                                    len: c.len,
                                    tokens: c.tokens,
                                    node: Some(c.node),
                                });
                            }
                        } else if self.live[s].remove(&id).is_some() {
                            out.push(Event::Removed { ns: c.ns, key: c.key, node: Some(c.node) });
                        }
                    }
                }
                Tail::Gap { .. } => {
                    self.stats.gaps += 1;
                    self.resync(s, out)?;
                }
            }
        }
        Ok(())
    }

    /// Rescans stripe `s` and reports the difference from what the feed
    /// knew; goes on from the change count read before the scan. An entry
    /// that kept changing under the scan leaves the rescan owed.
    fn resync(&mut self, s: usize, out: &mut Vec<Event>) -> Result<()> {
        let (start, _) = self.store.changes_head(s as u32)?;
        let mut now: HashMap<(u32, Key), (u64, u32)> = HashMap::new();
        match self.store.scan_stored(s as u32, |ns, key, len, tokens| {
            now.insert((ns, key), (len, tokens));
        }) {
            Ok(()) => {}
            Err(CoreError::Changed) => {
                self.rescan[s] = true;
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        let old = std::mem::take(&mut self.live[s]);
        for (&(ns, key), _) in old.iter().filter(|(id, _)| !now.contains_key(id)) {
            out.push(Event::Removed { ns, key, node: None });
        }
        for (&(ns, key), &(len, tokens)) in now.iter().filter(|(id, _)| !old.contains_key(id)) {
            out.push(Event::Stored { ns, key, len, tokens, node: None });
        }
        self.live[s] = now;
        self.cursors[s] = start;
        self.rescan[s] = false;
        Ok(())
    }
}

/// A reader of the region's change log that keeps nothing per block: each
/// poll reports the changes made since the last one to the namespaces it
/// is asked about, and the stripes where changes were lost to a gap (the
/// reader fell a whole ring behind, or a recovery rebuilt the stripe). A
/// caller that needs exact removals across a gap checks the blocks it knows
/// of (in those stripes, or all of them) against the region itself.
#[derive(Clone, Debug)]
pub struct ChangeCursor {
    cursors: Vec<u64>,
}

impl ChangeCursor {
    /// A cursor at the head of every stripe's log: it reports the changes
    /// made from now on.
    pub fn at_head(store: &Store<Flush>) -> Result<ChangeCursor> {
        let cursors =
            (0..store.layout.caps.n_stripes).map(|s| Ok(store.changes_head(s)?.0)).collect::<Result<Vec<u64>>>()?;
        Ok(ChangeCursor { cursors })
    }

    /// Appends the changes since the last poll of namespaces `ns` (all of
    /// them when empty) to `out`, in each stripe's order, and the stripes
    /// that had a gap to `gaps` (their cursors move past it).
    pub fn poll(&mut self, store: &Store<Flush>, ns: &[u32], out: &mut Vec<Change>, gaps: &mut Vec<u32>) -> Result<()> {
        let mut buf = vec![Change::default(); BATCH];
        for (s, cursor) in self.cursors.iter_mut().enumerate() {
            loop {
                match store.read_changes(s as u32, *cursor, &mut buf)? {
                    Tail::Read { n } => {
                        let read = buf.get(..n).unwrap_or_default();
                        if let Some(last) = read.last() {
                            *cursor = last.seq;
                        }
                        out.extend(read.iter().filter(|c| ns.is_empty() || ns.contains(&c.ns)));
                        if n < BATCH {
                            break;
                        }
                    }
                    Tail::Gap { resume } => {
                        gaps.push(s as u32);
                        *cursor = resume;
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}
