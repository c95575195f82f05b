//! Bucket probing for one stripe: a fixed-size open-addressing table with
//! linear probing. Deletion shifts later members of the cluster back (no
//! tombstones), so every remaining key stays reachable from its home bucket.

use crate::coherence::{Coherence, Site};
use crate::hash::Key;
use crate::layout::{state, Bucket, Entry};
use crate::mem::LINE;
use crate::store::Store;
use crate::{Error, Result};

/// Stripe of a placement hash.
#[inline]
pub fn stripe_of(tag: u64, n_stripes: u32) -> u32 {
    // `n_stripes` is a power of two (the layout checks it): its mask.
    (tag as u32) & n_stripes.wrapping_sub(1)
}

/// Home bucket of a placement hash.
#[inline]
pub fn home_of(tag: u64, buckets: u32) -> u32 {
    // `buckets` is a power of two (the layout checks it): its mask.
    ((tag >> 32) as u32) & buckets.wrapping_sub(1)
}

/// A found key: bucket, entry index (in stripe) and the entry as read.
#[derive(Clone, Copy, Debug)]
pub struct Found {
    /// Bucket index in the stripe.
    pub bucket: u32,
    /// Entry index in the stripe.
    pub entry: u32,
    /// The entry, read fresh.
    pub e: Entry,
}

/// Reads bucket `b` of stripe `s`, invalidating its line when it is the first
/// bucket read from that line (`line` tracks the last line refreshed).
#[inline]
fn bucket<C: Coherence>(st: &Store<C>, s: u32, b: u32, line: &mut u64) -> Result<Bucket> {
    let off = st.layout.bucket(s, b);
    let l = off & !(LINE - 1);
    if *line != l {
        // SYNC: fresh bucket line (writer: insert/delete under the stripe lock).
        st.co.invalidate(&st.view, l, LINE, Site("index.bucket.read"))?;
        *line = l;
    }
    st.view.read(off)
}

/// Finds the entry holding (`ns`, `key`) in stripe `s` in any state but
/// EMPTY. Without the stripe lock a concurrent delete may hide a key (a miss),
/// never show a wrong one: the entry is checked against the key.
pub fn find<C: Coherence>(st: &Store<C>, s: u32, tag: u64, ns: u32, key: Key) -> Result<Option<Found>> {
    find_in(st, s, tag, ns, key, None)
}

/// [`find`] by the stripe's holder `h`: every bucket and entry the probe
/// reads is checked (`Recovering` when void: see
/// [`super::HeldStripe::check`]), so that a void line neither hides the key
/// nor stands for it.
pub(crate) fn find_held<C: Coherence>(
    st: &Store<C>,
    s: u32,
    tag: u64,
    ns: u32,
    key: Key,
    h: &super::HeldStripe,
) -> Result<Option<Found>> {
    find_in(st, s, tag, ns, key, Some(h))
}

fn find_in<C: Coherence>(
    st: &Store<C>,
    s: u32,
    tag: u64,
    ns: u32,
    key: Key,
    held: Option<&super::HeldStripe>,
) -> Result<Option<Found>> {
    let bps = st.layout.buckets_per_stripe;
    let eps = st.layout.caps.entries_per_stripe;
    let home = home_of(tag, bps);
    let mut line = u64::MAX;
    for i in 0..bps {
        let b = home.wrapping_add(i) & bps.wrapping_sub(1);
        let bk = bucket(st, s, b, &mut line)?;
        if let Some(h) = held {
            h.check_bucket(&bk)?;
        }
        if bk.entry == 0 {
            return Ok(None);
        }
        if bk.tag != tag {
            continue;
        }
        // Not 0 (checked above).
        let ei = bk.entry.wrapping_sub(1);
        if ei >= eps {
            return Err(Error::Corrupt);
        }
        let e = st.fresh_entry(st.layout.entry(s, ei), Site("index.find.entry"))?;
        if let Some(h) = held {
            h.check(&e)?;
        }
        if !matches!(e.state, state::EMPTY | state::QUARANTINED)
            && e.key_lo == key.lo
            && e.key_hi == key.hi
            && e.ns == ns
        {
            return Ok(Some(Found { bucket: b, entry: ei, e }));
        }
    }
    Ok(None)
}

/// The first bucket of (`tag`)'s probe sequence in stripe `s` that names
/// `tag` (its bucket and entry index), or `None` when an empty bucket comes
/// first (a miss). `home_line` is the home bucket's line, invalidated by the
/// caller; later lines are invalidated here. The entry is the caller's to
/// read and check: a different key behind the same tag needs [`find`].
#[inline]
pub fn first_of_tag<C: Coherence>(st: &Store<C>, s: u32, tag: u64, home_line: u64) -> Result<Option<(u32, u32)>> {
    let bps = st.layout.buckets_per_stripe;
    let home = home_of(tag, bps);
    let mut line = home_line;
    for i in 0..bps {
        let b = home.wrapping_add(i) & bps.wrapping_sub(1);
        let bk = bucket(st, s, b, &mut line)?;
        if bk.entry == 0 {
            return Ok(None);
        }
        if bk.tag == tag {
            if bk.entry > st.layout.caps.entries_per_stripe {
                return Err(Error::Corrupt);
            }
            // Not 0 (checked above).
            return Ok(Some((b, bk.entry.wrapping_sub(1))));
        }
    }
    Ok(None)
}

/// Inserts (`tag` → entry `ei`) into the first empty bucket from its home,
/// stamped with `ticket`. Caller holds the stripe lock under `ticket` and
/// has checked the key is absent; every bucket read is checked by `held`
/// (recovery, which wrote them all itself, passes `None`).
pub(crate) fn insert<C: Coherence>(
    st: &Store<C>,
    s: u32,
    tag: u64,
    ei: u32,
    ticket: u64,
    held: Option<&super::HeldStripe>,
) -> Result<u32> {
    let bps = st.layout.buckets_per_stripe;
    let home = home_of(tag, bps);
    let mut line = u64::MAX;
    for i in 0..bps {
        let b = home.wrapping_add(i) & bps.wrapping_sub(1);
        let bk = bucket(st, s, b, &mut line)?;
        if let Some(h) = held {
            h.check_bucket(&bk)?;
        }
        if bk.entry == 0 {
            // `ei` is an entry index (below `entries_per_stripe`).
            let nb = Bucket { tag, entry: ei.wrapping_add(1), stamp: ticket as u32 };
            // SYNC: bucket published under the stripe lock (reader: find).
            st.publish(st.layout.bucket(s, b), &nb, Site("index.bucket.insert"))?;
            return Ok(b);
        }
    }
    Err(Error::TableFull)
}

/// Empties bucket `hole` and shifts the rest of its cluster back so no key
/// becomes unreachable; every bucket written is stamped with the holder's
/// ticket, and every one read checked. Caller holds the stripe lock (`h`).
pub(crate) fn delete<C: Coherence>(st: &Store<C>, s: u32, mut hole: u32, h: &super::HeldStripe) -> Result<()> {
    let bps = st.layout.buckets_per_stripe;
    let mask = bps.wrapping_sub(1);
    let stamp = h.ticket() as u32;
    let mut j = hole;
    let mut line = u64::MAX;
    // (A void bucket met half way leaves the cluster half shifted: the
    // repair it asks for rebuilds every bucket from the entries.)
    for _ in 0..bps {
        j = j.wrapping_add(1) & mask;
        let bk = bucket(st, s, j, &mut line)?;
        h.check_bucket(&bk)?;
        if bk.entry == 0 {
            break;
        }
        let k = home_of(bk.tag, bps);
        // Bucket j may move to `hole` unless its home lies cyclically in (hole, j].
        let stays = if hole <= j { hole < k && k <= j } else { hole < k || k <= j };
        if stays {
            continue;
        }
        st.publish(st.layout.bucket(s, hole), &Bucket { stamp, ..bk }, Site("index.bucket.shift"))?;
        hole = j;
    }
    st.publish(st.layout.bucket(s, hole), &Bucket { stamp, ..Bucket::default() }, Site("index.bucket.clear"))
}
