//! An attached region (`Store`) and one participant's handle on it (`Node`).
//!
//! `Store` binds a region view, its validated layout and a coherence
//! implementation, and offers the two primitive moves every protocol step is
//! made of: read fresh (invalidate, load) and publish (store, flush).

use core::mem::size_of;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::coherence::{Coherence, Site};
use crate::layout::{Entry, Header, Layout};
use crate::mem::{View, LINE};
use crate::{Error, Result};

/// An attached region: view, layout, coherence.
pub struct Store<C: Coherence> {
    /// The region view.
    pub view: View,
    /// The validated layout.
    pub layout: Layout,
    /// Cache maintenance for this participant.
    pub co: C,
    /// Creation id from the header.
    pub creation_id: u64,
}

/// What a node needs from its environment while it waits: the host-local lock
/// tier and a way to pass time.
pub trait NodeEnv: Sync {
    /// Takes the host-local lock `lock` (serialises this host's nodes on it).
    /// Fails, taking nothing, when the wait runs past the node's deadline or
    /// can never end (the calling thread holds the lock already).
    fn local_lock(&self, lock: u32) -> Result<()>;
    /// Releases the host-local lock `lock`.
    fn local_unlock(&self, lock: u32);
    /// Takes the host-local lock `lock` if it is free right now (true),
    /// without waiting. Never, by default: an environment without it gives
    /// no stray grant back (see `Node::give_back_strays`).
    fn try_local_lock(&self, _lock: u32) -> bool {
        false
    }
    /// Called on every iteration of a poll loop. Returns an error to abandon
    /// the wait (the node is shutting down or was fenced).
    fn wait(&self, iteration: u32) -> Result<()>;
    /// True when a withdrawn lock request has waited `iteration` polls for
    /// the manager's answer for so long that no manager will give one (none
    /// is running, or the region is damaged): the withdrawal then gives up.
    /// A manager answers within a lease when one runs, so the bound is a
    /// watchdog, far beyond that. Never, by default.
    fn withdrawal_expired(&self, _iteration: u32) -> bool {
        false
    }
    /// True once this node learnt it was declared dead (fenced): every
    /// operation then fails with `Revoked` at once, those that take no lock
    /// too (a lookup, a pin, a copy, a payload write, a message), so that
    /// its process attaches again instead of going on as a zombie that
    /// reads, pins and sends. Never, by default.
    fn revoked(&self) -> bool {
        false
    }
    /// A monotonic clock in nanoseconds, for the lock-wait counters; 0 where
    /// the environment has none (the counters then count grants only).
    fn now_ns(&self) -> u64 {
        0
    }
    /// The wall clock in milliseconds since the Unix epoch, which tenants'
    /// lifetimes are counted by (hosts' clocks agreeing within the margin
    /// the deployment allows); 0 where the environment has none (a block
    /// of a tenant with a lifetime is then refused: `InvalidArgument`).
    fn wall_ms(&self) -> u64 {
        0
    }
    /// A recovery that an operation of this node runs itself starts (`true`)
    /// or ends (`false`): one that repairs a structure found void (see
    /// `Node::with_stripe`). Nothing by default.
    fn recovering(&self, _on: bool) {}
    /// True when something of this node's process gives back the grants it
    /// keeps past their release once recalled, while its threads do other
    /// things (a background thread calling `Node::release_parks`): only
    /// then does a release keep a grant (see `lock.rs`, "Parked grants").
    /// Never, by default.
    fn keeps_grants(&self) -> bool {
        false
    }
}

impl<C: Coherence> Store<C> {
    /// Reads lines fresh: invalidates `T`'s lines at `off`, then loads them.
    #[inline]
    pub fn fresh<T: FromBytes + IntoBytes + KnownLayout + Immutable>(&self, off: u64, site: Site) -> Result<T> {
        self.co.invalidate(&self.view, off, size_of::<T>() as u64, site)?;
        self.view.read(off)
    }

    /// Stores `v` at `off` and flushes its lines (visible after a store fence).
    #[inline]
    pub fn publish<T: IntoBytes + Immutable>(&self, off: u64, v: &T, site: Site) -> Result<()> {
        self.view.write(off, v)?;
        self.co.flush(&self.view, off, size_of::<T>() as u64, site)
    }

    /// Stores `v` with its first word (the state word) stored last, after a
    /// fence, then flushes. A same-host reader that loads the state word first
    /// and then the rest never pairs a new state with old fields.
    pub fn publish_state_last<T: IntoBytes + Immutable>(&self, off: u64, v: &T, site: Site) -> Result<()> {
        self.write_state_last(off, v)?;
        self.co.flush(&self.view, off, size_of::<T>() as u64, site)
    }

    /// [`Store::publish_state_last`] without the flush, for a line that this
    /// host invalidates next (which writes it back).
    pub fn write_state_last<T: IntoBytes + Immutable>(&self, off: u64, v: &T) -> Result<()> {
        let bytes = v.as_bytes();
        self.view.check(off, bytes.len() as u64, 8)?;
        // The view's check above bounds `off + len`: word offsets below it
        // cannot overflow.
        for (i, c) in bytes.chunks_exact(8).enumerate().skip(1) {
            let w: [u8; 8] = c.try_into().map_err(|_| Error::InvalidArgument)?;
            self.view.store_u64(off.wrapping_add((i as u64).wrapping_mul(8)), u64::from_ne_bytes(w))?;
        }
        crate::mem::fence_seq_cst();
        self.view.store_u64(off, u64::from_ne_bytes(first_word(bytes)))
    }

    /// Reads a struct whose first word is its state word: that word first,
    /// then (after a fence) the rest, pairing with [`Store::publish_state_last`].
    pub fn fresh_state_first<T: FromBytes + IntoBytes + KnownLayout + Immutable>(
        &self,
        off: u64,
        site: Site,
    ) -> Result<T> {
        self.co.invalidate(&self.view, off, size_of::<T>() as u64, site)?;
        self.state_first_invalidated(off)
    }

    /// [`Store::fresh_state_first`] of lines the caller invalidated already
    /// (a batch, [`Coherence::invalidate_lines`]).
    pub fn state_first_invalidated<T: FromBytes + IntoBytes + KnownLayout + Immutable>(&self, off: u64) -> Result<T> {
        let w0 = self.view.load_u64(off)?;
        // Pairs with the writer's fence before its state word: the rest is
        // loaded after the state word (free on x86, whose loads keep order).
        crate::mem::fence_acquire();
        let mut v: T = self.view.read(off)?;
        v.as_mut_bytes().iter_mut().zip(w0.to_ne_bytes()).for_each(|(d, s)| *d = s);
        Ok(v)
    }

    /// Writes an entry line with its sequence word odd while it changes, then
    /// even, so a same-host reader without the lock never takes a torn entry
    /// for a whole one; then flushes the line. Caller holds the stripe lock.
    pub fn publish_entry(&self, off: u64, e: &mut Entry, site: Site) -> Result<()> {
        let stable = e.ver & !1;
        e.ver = stable.wrapping_add(1);
        let words: &[u8] = e.as_bytes();
        let w0 = u64::from_ne_bytes(first_word(words));
        self.view.store_u64(off, w0)?;
        crate::mem::fence_seq_cst();
        for (i, c) in words.chunks_exact(8).enumerate().skip(1) {
            let w: [u8; 8] = c.try_into().map_err(|_| Error::InvalidArgument)?;
            // Within the line whose first word was stored above.
            self.view.store_u64(off.wrapping_add((i as u64).wrapping_mul(8)), u64::from_ne_bytes(w))?;
        }
        crate::mem::fence_seq_cst();
        e.ver = stable.wrapping_add(2);
        self.view.store_u64(off, u64::from_ne_bytes(first_word(e.as_bytes())))?;
        self.co.flush(&self.view, off, LINE, site)
    }

    /// Reads an entry line fresh and consistent (retries while a same-host
    /// writer is mid-change). Fails with `Changed` if it never settles.
    pub fn fresh_entry(&self, off: u64, site: Site) -> Result<Entry> {
        self.entry_validated(off, Some(site), 64)
    }

    /// One validated read of an entry whose line the caller invalidated
    /// already (a batch, [`Coherence::invalidate_lines`]); `Changed` when it
    /// was torn (the caller reads it again with [`Store::fresh_entry`]).
    pub fn entry_invalidated(&self, off: u64) -> Result<Entry> {
        self.entry_validated(off, None, 1)
    }

    fn entry_validated(&self, off: u64, site: Option<Site>, tries: u32) -> Result<Entry> {
        for _ in 0..tries {
            if let Some(site) = site {
                self.co.invalidate(&self.view, off, LINE, site)?;
            }
            // A seqlock read: the first word, the entry, the first word
            // again; acquire fences keep the three loads in order (loads
            // only, so no store-load fence is needed).
            let a = self.view.load_u64(off)?;
            crate::mem::fence_acquire();
            let e: Entry = self.view.read(off)?;
            crate::mem::fence_acquire();
            let b = self.view.load_u64(off)?;
            if a == b && e.ver & 1 == 0 && u64::from_ne_bytes(first_word(e.as_bytes())) == a {
                return Ok(e);
            }
            core::hint::spin_loop();
        }
        Err(Error::Changed)
    }
}

fn first_word(b: &[u8]) -> [u8; 8] {
    let mut w = [0u8; 8];
    w.iter_mut().zip(b).for_each(|(d, s)| *d = *s);
    w
}

/// Attaches to a formatted region: reads the header fresh and validates all of
/// it against `region`'s length.
pub fn attach<C: Coherence>(region: View, co: C) -> Result<Store<C>> {
    if region.len() < size_of::<Header>() as u64 {
        return Err(Error::TooSmall);
    }
    co.invalidate(&region, 0, size_of::<Header>() as u64, Site("attach.header"))?;
    let h: Header = region.read(0)?;
    let layout = Layout::from_header(&h, region.len())?;
    Ok(Store { view: region, layout, co, creation_id: h.creation_id })
}

/// Reads and validates only the header (for tools that inspect bytes).
pub fn read_header(region: &View) -> Result<Header> {
    if region.len() < size_of::<Header>() as u64 {
        return Err(Error::TooSmall);
    }
    region.read(0)
}
