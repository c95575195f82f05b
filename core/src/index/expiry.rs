//! Lifetimes of tenants' blocks: an expiry stamp per entry (see
//! [`ExpiryLine`]), written under the stripe lock by the reserve of every
//! entry of a tenant's namespace, before the entry itself, from the
//! tenant's lifetime as its lock holds it then and the node's wall clock.
//!
//! Readers of a tenant's namespace (lookup, presence, acquire, get) read
//! the stamp of the entry they found, without a lock, and take an expired
//! block for a missing one; a reserve meeting one removes it and stores the
//! new block; an eviction takes expired blocks first and whatever their
//! tenant's share. The default tenant's entries have no stamp and nothing
//! reads one: lookups of namespaces that name no tenant cost what they did.
//!
//! Hosts compare their own wall clocks with a stamp another host wrote:
//! lifetimes assume clocks agreeing within the margin a deployment allows
//! (NTP/PTP); a host behind by `d` serves a block up to `d` past its end.
//!
//! Which stamps count: a stamp of another generation than the entry's, or
//! in a void line (a revoked holder's, landed after the repair), says
//! nothing about the entry, and the reader answers "expired" (a miss: a
//! cache may always miss) unless the entry, read again, is still that
//! generation in a line that is not void — then no stamp was ever written
//! for it, which the protocol rules out (the stamp is published before the
//! entry) and `check` reports. Recovery stamps every line with its ticket,
//! keeping the stamps of the generations it kept and marking the others
//! expired, so no late line can give a block a longer life.

use crate::coherence::{Coherence, Site};
use crate::layout::{state, ExpiryLine, EXPIRY_SLOTS};
use crate::mutant::mutant;
use crate::node::Node;
use crate::store::Store;
use crate::{Error, Result};

use super::HeldStripe;

/// The longest lifetime a tenant may have (about 34 years): stamps keep 48
/// bits of milliseconds.
pub const MAX_TTL_MS: u64 = 1 << 40;

/// Stamp of generation `gen` expiring at `expiry_ms` (0: never).
pub(crate) fn stamp(expiry_ms: u64, gen: u32) -> u64 {
    (expiry_ms << 16) | u64::from(gen & 0xffff)
}

/// The expiry of stamp `w` when it is generation `gen`'s; `None` otherwise.
pub(crate) fn stamp_for(w: u64, gen: u32) -> Option<u64> {
    (w & 0xffff == u64::from(gen & 0xffff)).then_some(w >> 16)
}

/// Whether a block of expiry `exp` (0: none) is expired at `now_ms`.
pub(crate) fn past(exp: u64, now_ms: u64) -> bool {
    exp != 0 && now_ms >= exp && !mutant!("tenant.ttl_ignored")
}

/// Word of entry `e` in its expiry line.
fn word(e: u32) -> usize {
    (e % EXPIRY_SLOTS) as usize
}

impl HeldStripe {
    /// `Recovering` (and remembered) when expiry line `x` is void under this
    /// grant.
    pub(crate) fn check_expiry(&self, x: &ExpiryLine) -> Result<()> {
        if x.ticket < self.floor {
            self.void.set(true);
            return Err(Error::Recovering);
        }
        Ok(())
    }
}

impl<C: Coherence> Store<C> {
    /// Entry `e` of stripe `s`'s expiry line, read under the stripe lock
    /// `h` (`Recovering` when void).
    pub(crate) fn expiry_held(&self, s: u32, e: u32, h: &HeldStripe) -> Result<ExpiryLine> {
        // SYNC: fresh expiry line (writer: reserve and recovery, under the
        // stripe lock whose grant this holder has).
        let x: ExpiryLine = self.fresh(self.layout.expiry_line(s, e), Site("expiry.held"))?;
        h.check_expiry(&x)?;
        Ok(x)
    }

    /// Whether the block of entry `e` of stripe `s`, generation `gen` (a
    /// namespace of a tenant's), is expired at `now_ms`, read without the
    /// lock: see the module's notes for which stamps count.
    pub(crate) fn expired_now(&self, s: u32, e: u32, gen: u32, now_ms: u64) -> Result<bool> {
        // SYNC: fresh expiry line (writer: reserve, before the entry it
        // stamps is stored; recovery).
        let x: ExpiryLine = self.fresh(self.layout.expiry_line(s, e), Site("expiry.read"))?;
        let floor = self.floor_now(s)?;
        if x.ticket < floor && !mutant!("read.trust_void_expiry") {
            return Ok(true);
        }
        if let Some(exp) = x.at.get(word(e)).and_then(|&w| stamp_for(w, gen)) {
            return Ok(past(exp, now_ms));
        }
        // Another generation's stamp: the entry changed since it was read
        // (a miss), or was stored without a stamp (see the module's notes).
        match self.ent(s, e) {
            Ok(ent) if ent.gen == gen && matches!(ent.state, state::READY | state::CLAIMED) => Ok(false),
            Ok(_) | Err(Error::Changed) => Ok(true),
            Err(err) => Err(err),
        }
    }
}

impl<C: Coherence> Node<'_, C> {
    /// The wall clock for lifetimes, in milliseconds.
    pub(crate) fn wall_ms(&self) -> u64 {
        self.env.wall_ms()
    }

    /// Stamps entry `e` of stripe `s`, generation `gen`, with a lifetime of
    /// `ttl_ms` (0: none) from now. Under the stripe lock `h`, before the
    /// entry is stored.
    pub(crate) fn stamp_expiry(&self, s: u32, e: u32, gen: u32, ttl_ms: u64, h: &HeldStripe) -> Result<()> {
        let st = self.store;
        let exp = if ttl_ms == 0 {
            0
        } else {
            let now = self.wall_ms();
            if now == 0 {
                // No clock to count a lifetime by.
                return Err(Error::InvalidArgument);
            }
            now.saturating_add(ttl_ms)
        };
        let mut x = st.expiry_held(s, e, h)?;
        if let Some(w) = x.at.get_mut(word(e)) {
            *w = stamp(exp, gen);
        }
        x.ticket = h.ticket();
        // SYNC: the stamp reaches memory before the entry it stamps is
        // stored (reader: lookup, acquire, get, check; the entry's own
        // publication follows this flush).
        st.publish(st.layout.expiry_line(s, e), &x, Site("expiry.write"))
    }

    /// Whether READY entry `e` of stripe `s`, generation `gen`, is expired:
    /// under the stripe lock `h` (`Recovering` when its line is void).
    pub(crate) fn expired_held(&self, s: u32, e: u32, gen: u32, h: &HeldStripe) -> Result<bool> {
        let x = self.store.expiry_held(s, e, h)?;
        // Under the lock a line of another generation is one recovery
        // would have marked expired, or a stamp never written: either way
        // nothing says the block still lives.
        Ok(match x.at.get(word(e)).and_then(|&w| stamp_for(w, gen)) {
            Some(exp) => past(exp, self.wall_ms()),
            None => true,
        })
    }

    /// Whether the stored block of entry `e` of stripe `s`, generation
    /// `gen`, in namespace `ns`, is expired (only a tenant's namespace has
    /// lifetimes: false at once for the default tenant's).
    pub(crate) fn expired(&self, ns: u32, s: u32, e: u32, gen: u32) -> Result<bool> {
        if self.tenant_of(ns)?.is_none() {
            return Ok(false);
        }
        self.store.expired_now(s, e, gen, self.wall_ms())
    }
}
