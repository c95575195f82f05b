//! Tenants: many models and teams in one region, each with a hard quota, a
//! guaranteed share, a lifetime for its blocks and a priority. Lifetimes
//! are kept per block, by a stamp its reserve writes (see
//! `index/expiry.rs`): a block is read as missing from its stamp's time
//! on, a reserve of its key replaces it, and evictions take it first. A
//! tenant that asks (`Limits::scrub`) has every block reserved for it
//! zeroed before the reserve returns.
//!
//! A tenant is a slot of the tenant table: a config line (name, limits,
//! nonce, state) and a usage line (bytes and blocks it holds, evictions,
//! refusals), both written only under the slot's lock. Slot 0 is the
//! `default` tenant: no limits, its usage not kept (every namespace that
//! names no tenant is its, so keeping it would put every reserve in the
//! rack behind one lock); `tenant_list` counts it by a scan.
//!
//! Every namespace belongs to one tenant (see `namespaces.rs`: the record
//! of a registered namespace carries its tenant's slot and nonce; plain
//! ids are the default tenant's). The usage line is exact: every change to
//! the set of a tenant's blocks (a reserve, an abort, a removal) happens
//! under the block's stripe lock and, nested in it, the tenant's lock,
//! which the usage line is written under in the same hold. So a reserve
//! checks the quota against the truth, and an eviction for another tenant
//! checks the share against the truth; neither reads another node's
//! counters. Lock order: stripe, roots, tenant, heap (see `LockIds`).
//!
//! Crashes and zombies: a holder that dies between the usage line and the
//! entry leaves its lock awaiting repair, and the recovery that follows
//! (holding every core lock, tenants' included) counts every tenant's
//! blocks from the entries it just rebuilt and writes the usage lines
//! stamped with its ticket. A usage or config line stamped below the
//! lock's repair floor is a revoked holder's line written back late: never
//! used; the node has a recovery rebuild it and the operation answers
//! `Recovering`.
//!
//! Dropping a tenant: its state goes DROPPING under its lock (its reserves
//! are refused from then on: they check the state under the same lock they
//! insert under), its blocks are evicted, and once it holds none the slot
//! is FREE (its nonce changes with the next tenant of the slot, so a
//! namespace bound to the dropped one never counts to the next).

use crate::coherence::{Coherence, Site};
use crate::index::{Policy, Verdict};
use crate::layout::{
    state, Entry, RootRecord, TenantConfig, TenantUsage, TENANT_DROPPING, TENANT_FREE, TENANT_LIVE, TENANT_NAME,
    TENANT_SCRUB,
};
use crate::lock::Held;
use crate::namespaces::{self, REGISTERED};
use crate::node::Node;
use crate::store::Store;
use crate::{Error, Result};

/// A tenant: its slot and the nonce the slot had when it was taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TenantId {
    /// Slot in the tenant table (0: the default tenant).
    pub slot: u32,
    /// The slot's nonce for this tenant (the default tenant's is 1).
    pub nonce: u32,
}

/// The default tenant: every namespace that names no other.
pub const DEFAULT_TENANT: TenantId = TenantId { slot: 0, nonce: 1 };

/// Name of the default tenant.
pub const DEFAULT_NAME: &[u8] = b"default";

/// A tenant's limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Hard quota in payload bytes; 0 = none.
    pub quota: u64,
    /// Guaranteed share in payload bytes (at most the quota, when one is set).
    pub share: u64,
    /// Lifetime of its blocks in milliseconds, from their reserve; 0 =
    /// none. A change applies to blocks reserved from then on.
    pub ttl_ms: u64,
    /// Relative weight (reported).
    pub priority: u32,
    /// Zero each of its blocks' payload when the block is removed (evicted,
    /// expired, aborted, dropped), before its space is freed: no later
    /// reserve, of any tenant, is handed bytes it wrote. Costs a write of
    /// every removed byte (and its flush in a non-coherent mode).
    pub scrub: bool,
}

/// A tenant as [`Node::tenant_list`] reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantInfo {
    /// Who.
    pub id: TenantId,
    /// Its name, NUL-padded.
    pub name: [u8; TENANT_NAME],
    /// Its limits.
    pub limits: Limits,
    /// `TENANT_LIVE` or `TENANT_DROPPING`.
    pub state: u16,
    /// Payload bytes of its blocks being written or stored.
    pub bytes: u64,
    /// Its blocks being written or stored.
    pub blocks: u64,
    /// Its blocks evicted.
    pub evictions: u64,
    /// Reserves refused at its hard quota.
    pub refused: u64,
    /// Of its evictions, blocks removed past their lifetime.
    pub expired: u64,
}

impl TenantInfo {
    /// Its name, without padding.
    pub fn name(&self) -> &[u8] {
        let n = self.name.iter().position(|&b| b == 0).unwrap_or(TENANT_NAME);
        self.name.get(..n).unwrap_or(&[])
    }
}

/// Name field of `name`: 1 to [`TENANT_NAME`] bytes, no NUL.
pub fn name_field(name: &[u8]) -> Result<[u8; TENANT_NAME]> {
    if name.is_empty() || name.len() > TENANT_NAME || name.contains(&0) {
        return Err(Error::InvalidArgument);
    }
    let mut f = [0u8; TENANT_NAME];
    for (d, s) in f.iter_mut().zip(name) {
        *d = *s;
    }
    Ok(f)
}

/// The config line's flags for `l`.
fn flags_of(l: &Limits) -> u16 {
    if l.scrub {
        TENANT_SCRUB
    } else {
        0
    }
}

fn check_limits(l: &Limits) -> Result<()> {
    if l.ttl_ms > crate::index::expiry::MAX_TTL_MS {
        return Err(Error::InvalidArgument);
    }
    if l.quota != 0 && l.share > l.quota {
        return Err(Error::InvalidArgument);
    }
    Ok(())
}

/// Writes the default tenant's slot (format; the rest of the table is
/// zero, every slot FREE). Flushed by format's flush of the metadata.
pub(crate) fn format_tenants<C: Coherence>(st: &Store<C>) -> Result<()> {
    let mut cfg = TenantConfig {
        name: name_field(DEFAULT_NAME)?,
        nonce: DEFAULT_TENANT.nonce,
        state: TENANT_LIVE,
        ..TenantConfig::default()
    };
    cfg.ticket = 0;
    st.view.write(st.layout.tenant_config(0), &cfg)?;
    st.view.write(st.layout.tenant_usage(0), &TenantUsage { nonce: DEFAULT_TENANT.nonce, ..TenantUsage::default() })
}

/// The tenant a namespace record binds, as an entry's namespace id names
/// it: `None` for the default tenant (a plain id, or a record of it).
pub(crate) fn bound<C: Coherence>(st: &Store<C>, ns: u32) -> Result<Option<TenantId>> {
    if ns < REGISTERED {
        return Ok(None);
    }
    let i = ns.wrapping_sub(REGISTERED);
    if i >= st.layout.caps.n_roots {
        return Ok(None);
    }
    // SYNC: the namespace's record as written (it is published before its
    // id is handed out, and never changes after).
    let r: RootRecord = st.fresh(st.layout.root(i), Site("tenant.ns.read"))?;
    Ok(namespaces::binding_of(&r).map(|(_, t)| t).filter(|t| t.slot != 0 && t.slot < st.layout.caps.max_tenants))
}

/// Namespace ids a node remembers the tenant of (a registered namespace's
/// record never changes once written).
pub(crate) const BOUND_CACHE: usize = 64;

/// Remembered (namespace id, tenant slot, nonce); id 0 = empty.
pub(crate) type BoundCache = [(u32, u32, u32); BOUND_CACHE];

/// A hold of a tenant's lock with its two lines read under it.
pub(crate) struct TenantHold {
    pub(crate) id: TenantId,
    held: Held,
    pub(crate) cfg: TenantConfig,
    pub(crate) usage: TenantUsage,
    dirty: bool,
}

impl TenantHold {
    /// Whether the tenant takes `len` more bytes under its hard quota.
    pub(crate) fn fits(&self, len: u64) -> bool {
        self.cfg.quota == 0 || self.usage.bytes.saturating_add(len) <= self.cfg.quota
    }

    /// Counts a block it now holds.
    pub(crate) fn charge(&mut self, len: u64) {
        self.usage.bytes = self.usage.bytes.saturating_add(len);
        self.usage.blocks = self.usage.blocks.saturating_add(1);
        self.dirty = true;
    }

    /// Counts a block it no longer holds (`evicted`: by an eviction).
    pub(crate) fn discharge(&mut self, len: u64, evicted: bool) {
        self.usage.bytes = self.usage.bytes.saturating_sub(len);
        self.usage.blocks = self.usage.blocks.saturating_sub(1);
        self.usage.evictions = self.usage.evictions.wrapping_add(u64::from(evicted));
        self.dirty = true;
    }

    /// Counts a block of its removed past its lifetime.
    pub(crate) fn expire(&mut self, len: u64) {
        self.discharge(len, true);
        self.usage.expired = self.usage.expired.wrapping_add(1);
    }

    /// Counts a reserve refused at the quota.
    pub(crate) fn refuse(&mut self) {
        self.usage.refused = self.usage.refused.wrapping_add(1);
        self.dirty = true;
    }

    /// Whether an eviction for another tenant may take `len` bytes: the
    /// tenant keeps its share.
    pub(crate) fn above_share(&self, len: u64) -> bool {
        self.usage.bytes.saturating_sub(len) >= self.cfg.share && self.usage.bytes >= len
    }
}

/// Evicts the blocks of one tenant, as an eviction policy: for the tenant
/// itself (its quota, a drop), so its share does not hold them.
pub struct OfTenant<'a, 'b, C: Coherence> {
    node: &'a Node<'b, C>,
    id: TenantId,
}

impl<'a, 'b, C: Coherence> OfTenant<'a, 'b, C> {
    /// The blocks of tenant `id`.
    pub fn new(node: &'a Node<'b, C>, id: TenantId) -> Self {
        OfTenant { node, id }
    }
}

impl<C: Coherence> Policy for OfTenant<'_, '_, C> {
    fn consider(&mut self, _stripe: u32, entry: &Entry) -> Verdict {
        match self.node.tenant_of(entry.ns) {
            Ok(Some(t)) if t == self.id => Verdict::Evict,
            _ => Verdict::Skip,
        }
    }

    fn for_owner(&self) -> bool {
        true
    }
}

/// What [`Node::tenant_drop`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropReport {
    /// Blocks removed.
    pub blocks: u64,
    /// Payload bytes of the blocks removed.
    pub bytes: u64,
}

impl<C: Coherence> Node<'_, C> {
    /// Tenant slot `t`'s config line read fresh, without its lock.
    fn tenant_config_fresh(&self, t: u32) -> Result<TenantConfig> {
        Ok(self.tenant_lines(t, Site("tenant.read"))?.0)
    }

    /// Tenant slot `t`'s two lines, read fresh (`site` names the caller's
    /// reason: under the lock or not).
    fn tenant_lines(&self, t: u32, site: Site) -> Result<(TenantConfig, TenantUsage)> {
        let st = self.store;
        let l = &st.layout;
        st.co.invalidate(&st.view, l.tenant_config(t), 2 * crate::mem::LINE, site)?;
        Ok((st.view.read(l.tenant_config(t))?, st.view.read(l.tenant_usage(t))?))
    }

    /// Writes tenant slot `t`'s two lines and flushes them (the caller's
    /// release, or recovery's, fences them).
    pub(crate) fn tenant_write(&self, t: u32, cfg: &TenantConfig, usage: &TenantUsage) -> Result<()> {
        let st = self.store;
        let l = &st.layout;
        st.view.write(l.tenant_config(t), cfg)?;
        st.view.write(l.tenant_usage(t), usage)?;
        st.co.flush(&st.view, l.tenant_config(t), 2 * crate::mem::LINE, Site("tenant.write"))
    }

    /// The live tenant named `name` (the default tenant's name finds slot 0).
    /// Read without a lock.
    pub fn tenant_find(&self, name: &[u8]) -> Result<Option<TenantId>> {
        let want = name_field(name)?;
        for t in 0..self.store.layout.caps.max_tenants {
            let c = self.tenant_config_fresh(t)?;
            if c.state == TENANT_LIVE && c.name == want {
                return Ok(Some(TenantId { slot: t, nonce: c.nonce }));
            }
        }
        Ok(None)
    }

    /// `Ok` when `id` is a live tenant now (read without a lock).
    pub fn tenant_live(&self, id: TenantId) -> Result<()> {
        if id.slot >= self.store.layout.caps.max_tenants {
            return Err(Error::NoTenant);
        }
        let c = self.tenant_config_fresh(id.slot)?;
        if c.state == TENANT_LIVE && c.nonce == id.nonce {
            Ok(())
        } else {
            Err(Error::NoTenant)
        }
    }

    /// Adds tenant `name` with `limits`. `Exists` when a tenant of that name
    /// lives (or is being dropped), `TenantsFull` when every slot is taken,
    /// `InvalidArgument` for a bad name, a share above the quota, or a
    /// lifetime (not supported yet).
    pub fn tenant_add(&self, name: &[u8], limits: Limits) -> Result<TenantId> {
        let want = name_field(name)?;
        check_limits(&limits)?;
        let l = &self.store.layout;
        // The roots lock makes one name take one slot.
        self.with_lock(l.locks().roots(), || {
            let mut free = None;
            for t in 0..l.caps.max_tenants {
                let c = self.tenant_config_fresh(t)?;
                if c.state != TENANT_FREE && c.name == want {
                    return Err(Error::Exists);
                }
                if c.state == TENANT_FREE && t != 0 && free.is_none() {
                    free = Some(t);
                }
            }
            let t = free.ok_or(Error::TenantsFull)?;
            self.with_tenant(t, true, |h| {
                if h.cfg.state != TENANT_FREE {
                    return Err(Error::Corrupt);
                }
                let nonce = h.cfg.nonce.wrapping_add(1).max(2);
                h.cfg = TenantConfig {
                    name: want,
                    priority: limits.priority,
                    quota: limits.quota,
                    share: limits.share,
                    ttl_ms: limits.ttl_ms,
                    nonce,
                    state: TENANT_LIVE,
                    flags: flags_of(&limits),
                    ticket: 0,
                };
                h.usage = TenantUsage { nonce, ..TenantUsage::default() };
                h.id = TenantId { slot: t, nonce };
                h.dirty = true;
                Ok(h.id)
            })
        })
    }

    /// Changes a live tenant's limits (effective for every node's next
    /// reserve and eviction). `NoTenant` when it is not live; the default
    /// tenant takes no limits (`InvalidArgument`).
    pub fn tenant_set(&self, id: TenantId, limits: Limits) -> Result<()> {
        check_limits(&limits)?;
        if id.slot == 0 {
            return Err(Error::InvalidArgument);
        }
        if id.slot >= self.store.layout.caps.max_tenants {
            return Err(Error::NoTenant);
        }
        self.with_tenant(id.slot, false, |h| {
            if h.cfg.state != TENANT_LIVE || h.cfg.nonce != id.nonce {
                return Err(Error::NoTenant);
            }
            h.cfg.quota = limits.quota;
            h.cfg.share = limits.share;
            h.cfg.ttl_ms = limits.ttl_ms;
            h.cfg.priority = limits.priority;
            h.cfg.flags = flags_of(&limits);
            h.dirty = true;
            Ok(())
        })
    }

    /// Every tenant (default first), read without a lock: at most
    /// `out.len()`, how many there are. The default tenant's usage is
    /// counted by a scan of the index (its blocks being written included);
    /// the others' is their usage line.
    pub fn tenant_list(&self, out: &mut [TenantInfo]) -> Result<usize> {
        let st = self.store;
        let mut n = 0usize;
        for t in 0..st.layout.caps.max_tenants {
            let (c, u) = self.tenant_lines(t, Site("tenant.list.report"))?;
            if c.state == TENANT_FREE {
                continue;
            }
            let mut info = TenantInfo {
                id: TenantId { slot: t, nonce: c.nonce },
                name: c.name,
                limits: Limits {
                    quota: c.quota,
                    share: c.share,
                    ttl_ms: c.ttl_ms,
                    priority: c.priority,
                    scrub: c.flags & TENANT_SCRUB != 0,
                },
                state: c.state,
                bytes: u.bytes,
                blocks: u.blocks,
                evictions: u.evictions,
                refused: u.refused,
                expired: u.expired,
            };
            if t == 0 {
                let (bytes, blocks) = self.default_usage()?;
                info.bytes = bytes;
                info.blocks = blocks;
            }
            if let Some(o) = out.get_mut(n) {
                *o = info;
            }
            n = n.saturating_add(1);
        }
        Ok(n)
    }

    /// The default tenant's blocks being written or stored, by a scan of
    /// every entry (without locks: a count for a report).
    fn default_usage(&self) -> Result<(u64, u64)> {
        let st = self.store;
        let (mut bytes, mut blocks) = (0u64, 0u64);
        for s in 0..st.layout.caps.n_stripes {
            for e in 0..st.layout.caps.entries_per_stripe {
                // An entry caught mid-change (its writer holds the stripe)
                // is left out of the count.
                let ent = match st.fresh_entry(st.layout.entry(s, e), Site("tenant.default.scan.report")) {
                    Err(Error::Changed) => continue,
                    r => r?,
                };
                if matches!(ent.state, state::WRITING | state::READY | state::CLAIMED)
                    && self.tenant_of(ent.ns)?.is_none()
                {
                    bytes = bytes.saturating_add(ent.payload_len as u64);
                    blocks = blocks.saturating_add(1);
                }
            }
        }
        Ok((bytes, blocks))
    }

    /// Drops tenant `id`: it takes no new blocks from now on, every block of
    /// it is evicted, and once it holds none its slot is free. `Busy` when
    /// blocks of it stay (pinned, or being written): it is being dropped
    /// (it takes no new block), and a later call finishes. `NoTenant` when
    /// it is neither live nor being dropped; the default tenant cannot be
    /// dropped (`InvalidArgument`).
    pub fn tenant_drop(&self, id: TenantId) -> Result<DropReport> {
        let l = &self.store.layout;
        if id.slot == 0 {
            return Err(Error::InvalidArgument);
        }
        if id.slot >= l.caps.max_tenants {
            return Err(Error::NoTenant);
        }
        self.with_tenant(id.slot, false, |h| {
            if h.cfg.state == TENANT_FREE || h.cfg.nonce != id.nonce {
                return Err(Error::NoTenant);
            }
            if h.cfg.state != TENANT_DROPPING {
                h.cfg.state = TENANT_DROPPING;
                h.dirty = true;
            }
            Ok(())
        })?;
        let rep = self.evict(u64::MAX, &mut OfTenant::new(self, id))?;
        self.with_lock(l.locks().roots(), || {
            self.with_tenant(id.slot, true, |h| {
                if h.cfg.state != TENANT_DROPPING || h.cfg.nonce != id.nonce {
                    return Err(Error::NoTenant);
                }
                if h.usage.blocks != 0 {
                    return Err(Error::Busy);
                }
                h.cfg.state = TENANT_FREE;
                h.dirty = true;
                Ok(())
            })
        })?;
        Ok(DropReport { blocks: rep.entries, bytes: rep.bytes })
    }

    /// The tenant an entry's namespace id belongs to: `None` for the
    /// default tenant. Remembered per node (a namespace's record never
    /// changes once written; the default tenant's ids are not remembered,
    /// they cost no read).
    pub(crate) fn tenant_of(&self, ns: u32) -> Result<Option<TenantId>> {
        if ns < REGISTERED {
            return Ok(None);
        }
        let slot = (ns as usize) % BOUND_CACHE;
        if let Some(&(id, t, nonce)) = self.local.bound.lock().get(slot) {
            if id == ns {
                return Ok((t != 0).then_some(TenantId { slot: t, nonce }));
            }
        }
        let b = bound(self.store, ns)?;
        if let Some(c) = self.local.bound.lock().get_mut(slot) {
            *c = (ns, b.map_or(0, |t| t.slot), b.map_or(0, |t| t.nonce));
        }
        Ok(b)
    }

    /// Runs `f` holding tenant slot `t`'s lock with its lines read under it
    /// (`nested`: under the roots lock); writes what `f` changed (`dirty`)
    /// before the release.
    fn with_tenant<T>(&self, t: u32, nested: bool, f: impl FnOnce(&mut TenantHold) -> Result<T>) -> Result<T> {
        let id = TenantId { slot: t, nonce: 0 };
        let mut h = self.tenant_take(id, nested)?;
        let r = f(&mut h);
        let put = self.tenant_put(h);
        let v = r?;
        put?;
        Ok(v)
    }

    /// Takes tenant `id.slot`'s lock (`nested`: under a stripe lock) and
    /// reads its lines. `Recovering` when a line is void (a revoked
    /// holder's, written back after the last repair): a recovery rebuilds
    /// both once this node holds no lock.
    pub(crate) fn tenant_take(&self, id: TenantId, nested: bool) -> Result<TenantHold> {
        let st = self.store;
        let l = &st.layout;
        let held = self.lock_with(l.locks().tenant(id.slot), 0, nested)?;
        // SYNC: both lines as their last holder published them (its release
        // fenced them; this grant came after).
        let (cfg, usage) = match self.tenant_lines(id.slot, Site("tenant.held")) {
            Ok(x) => x,
            Err(e) => {
                self.unlock(held)?;
                return Err(e);
            }
        };
        let void =
            (cfg.ticket < held.floor || usage.ticket < held.floor) && !crate::mutant::mutant!("tenant.trust_void");
        if void {
            *self.local.void_chunk.lock() = true;
            self.unlock(held)?;
            if !nested {
                self.repair_void_chunks();
            }
            return Err(Error::Recovering);
        }
        Ok(TenantHold { id, held, cfg, usage, dirty: false })
    }

    /// Writes a hold's lines when it changed them, stamped with its grant,
    /// and releases the lock (whose release fences them).
    pub(crate) fn tenant_put(&self, mut h: TenantHold) -> Result<()> {
        let st = self.store;
        let l = &st.layout;
        let t = h.held.lock.wrapping_sub(l.locks().tenant(0));
        let w = if h.dirty {
            h.usage.ticket = h.held.seq;
            h.cfg.ticket = h.held.seq;
            self.tenant_write(t, &h.cfg, &h.usage)
        } else {
            Ok(())
        };
        let u = self.unlock(h.held);
        w?;
        u
    }

    /// The hold a removal of an entry of namespace `ns` takes (nested under
    /// its stripe lock): `None` for the default tenant, and for a namespace
    /// whose tenant is gone (its slot freed or taken again: nothing counts
    /// its blocks any more).
    pub(crate) fn tenant_for_removal(&self, ns: u32) -> Result<Option<TenantHold>> {
        let Some(id) = self.tenant_of(ns)? else { return Ok(None) };
        let h = self.tenant_take(id, true)?;
        if h.cfg.state == TENANT_FREE || h.cfg.nonce != id.nonce {
            self.tenant_put(h)?;
            return Ok(None);
        }
        Ok(Some(h))
    }

    /// Recovery's count of every tenant's blocks (every entry rebuilt;
    /// recovery holds every tenant's lock): writes each usage line, and
    /// restamps each config line, with its ticket of that lock.
    pub(crate) fn rebuild_tenants(&self, ticket_of: impl Fn(u32) -> Result<u64>) -> Result<()> {
        let st = self.store;
        let l = &st.layout;
        let nt = l.caps.max_tenants;
        let mut acc = [(0u64, 0u64); crate::layout::MAX_TENANTS as usize];
        let mut cfgs = [TenantConfig::default(); crate::layout::MAX_TENANTS as usize];
        for (t, c) in (0..nt).zip(cfgs.iter_mut()) {
            *c = self.tenant_config_fresh(t)?;
        }
        for s in 0..l.caps.n_stripes {
            for e in 0..l.caps.entries_per_stripe {
                // Rebuilt by this recovery: this host's view is current.
                let ent: Entry = st.view.read(l.entry(s, e))?;
                if ent.state == state::EMPTY {
                    continue;
                }
                let Some(id) = bound(st, ent.ns)? else { continue };
                let live = cfgs.get(id.slot as usize).is_some_and(|c| c.state != TENANT_FREE && c.nonce == id.nonce);
                if let (true, Some(a)) = (live, acc.get_mut(id.slot as usize)) {
                    a.0 = a.0.saturating_add(ent.payload_len as u64);
                    a.1 = a.1.saturating_add(1);
                }
            }
        }
        for t in 1..nt {
            let (Some(c), Some(&(bytes, blocks))) = (cfgs.get(t as usize), acc.get(t as usize)) else { continue };
            let ticket = ticket_of(l.locks().tenant(t))?;
            // Read with the config above: the counters carried over.
            let old: TenantUsage = st.view.read(l.tenant_usage(t))?;
            let u = TenantUsage { bytes, blocks, nonce: c.nonce, ticket, ..old };
            let cfg = TenantConfig { ticket, ..*c };
            if u != old || cfg != *c {
                self.tenant_write(t, &cfg, &u)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::FindingKind;
    use crate::hash::{Key, Namespace};
    use crate::index::Lru;
    use crate::testutil::{findings, small_caps, with_one_node, with_two_nodes};
    use std::format;

    fn key(i: u64) -> Key {
        Key { lo: i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1, hi: i }
    }

    fn model(name: &[u8]) -> [u8; 16] {
        Namespace { model: name, ..Namespace::default() }.digest()
    }

    fn put<C: Coherence>(n: &Node<'_, C>, ns: u32, i: u64, len: u64) -> Result<()> {
        let h = n.reserve(ns, key(i), len, 16)?;
        n.publish(&h)
    }

    fn usage<C: Coherence>(n: &Node<'_, C>, id: TenantId) -> (u64, u64) {
        let mut out = [TenantInfo::default(); 8];
        let k = n.tenant_list(&mut out).unwrap();
        let t = out[..k].iter().find(|t| t.id == id).unwrap();
        (t.bytes, t.blocks)
    }

    #[test]
    fn tenants_are_added_found_listed_changed_and_dropped() {
        with_two_nodes(|f, _, a, b| {
            assert_eq!(a.tenant_find(b"default").unwrap(), Some(DEFAULT_TENANT));
            let lim = Limits { quota: 1 << 20, share: 1 << 16, ttl_ms: 0, priority: 3, scrub: true };
            let t = a.tenant_add(b"team-a", lim).unwrap();
            assert_ne!(t.slot, 0);
            assert_eq!(b.tenant_find(b"team-a").unwrap(), Some(t), "another node finds it");
            assert_eq!(b.tenant_add(b"team-a", Limits::default()).unwrap_err(), Error::Exists);
            for bad in [&b""[..], b"a\0b", &[b'x'; TENANT_NAME + 1]] {
                assert_eq!(a.tenant_add(bad, Limits::default()).unwrap_err(), Error::InvalidArgument);
            }
            let ttl = Limits { ttl_ms: crate::index::expiry::MAX_TTL_MS + 1, ..Limits::default() };
            assert_eq!(a.tenant_add(b"ttl", ttl).unwrap_err(), Error::InvalidArgument, "a lifetime past 2^40 ms");
            let share_above = Limits { quota: 10, share: 11, ..Limits::default() };
            assert_eq!(a.tenant_add(b"x", share_above).unwrap_err(), Error::InvalidArgument);
            assert_eq!(a.tenant_set(DEFAULT_TENANT, lim).unwrap_err(), Error::InvalidArgument);
            assert_eq!(a.tenant_drop(DEFAULT_TENANT).unwrap_err(), Error::InvalidArgument);
            let lim2 = Limits { quota: 2 << 20, ..lim };
            b.tenant_set(t, lim2).unwrap();
            let mut out = [TenantInfo::default(); 8];
            let n = a.tenant_list(&mut out).unwrap();
            assert_eq!(n, 2);
            assert_eq!(out[0].name(), b"default");
            assert_eq!((out[1].name(), out[1].limits), (&b"team-a"[..], lim2));
            // The slot fills up, then frees.
            let mut more = std::vec::Vec::new();
            loop {
                match a.tenant_add(format!("t{}", more.len()).as_bytes(), Limits::default()) {
                    Ok(id) => more.push(id),
                    Err(e) => {
                        assert_eq!(e, Error::TenantsFull);
                        break;
                    }
                }
            }
            assert_eq!(more.len() as u32, f.store.layout.caps.max_tenants - 2);
            a.tenant_drop(t).unwrap();
            assert_eq!(a.tenant_find(b"team-a").unwrap(), None);
            assert_eq!(a.tenant_drop(t).unwrap_err(), Error::NoTenant);
            assert_eq!(a.tenant_set(t, lim).unwrap_err(), Error::NoTenant);
            let again = a.tenant_add(b"team-a", Limits::default()).unwrap();
            assert_eq!(again.slot, t.slot, "the freed slot");
            assert_ne!(again.nonce, t.nonce, "with another nonce");
            assert!(findings(f).is_empty(), "{:?}", findings(f));
        });
    }

    #[test]
    fn one_model_in_two_tenants_is_two_namespaces() {
        with_two_nodes(|f, _, a, b| {
            let ta = a.tenant_add(b"a", Limits::default()).unwrap();
            let tb = a.tenant_add(b"b", Limits::default()).unwrap();
            let na = a.namespace_in(ta, model(b"llama")).unwrap();
            let nb = b.namespace_in(tb, model(b"llama")).unwrap();
            let nd = b.namespace_of_digest(model(b"llama")).unwrap();
            assert!(na != nb && nb != nd && na != nd);
            assert_eq!(a.namespace_in(ta, model(b"llama")).unwrap(), na, "found again");
            put(&a, na, 1, 1000).unwrap();
            assert_eq!(b.lookup(na, &[key(1)]).unwrap(), 1);
            assert_eq!(b.lookup(nb, &[key(1)]).unwrap(), 0, "no block shared across tenants");
            assert_eq!(b.lookup(nd, &[key(1)]).unwrap(), 0);
            assert_eq!(a.tenant_of(na).unwrap(), Some(ta));
            assert_eq!(b.tenant_of(na).unwrap(), Some(ta), "another node reads the binding");
            assert_eq!(a.tenant_of(nd).unwrap(), None);
            assert_eq!(usage(&b, ta), (1000, 1));
            assert_eq!(usage(&b, tb), (0, 0));
            assert_eq!(usage(&b, DEFAULT_TENANT), (0, 0));
            put(&b, 7, 2, 500).unwrap();
            assert_eq!(usage(&a, DEFAULT_TENANT), (500, 1), "a plain id is the default tenant's");
            assert!(findings(f).is_empty(), "{:?}", findings(f));
        });
    }

    #[test]
    fn a_tenant_at_its_quota_evicts_its_own_blocks_and_never_passes_it() {
        with_two_nodes(|f, _, a, b| {
            let quota = 10_000;
            let busy = a.tenant_add(b"busy", Limits { quota, ..Limits::default() }).unwrap();
            let quiet = a.tenant_add(b"quiet", Limits::default()).unwrap();
            let nb = a.namespace_in(busy, model(b"m")).unwrap();
            let nq = a.namespace_in(quiet, model(b"m")).unwrap();
            put(&b, nq, 100, 3000).unwrap();
            for i in 0..40 {
                put(if i % 2 == 0 { &a } else { &b }, nb, i, 1500).unwrap();
                let (bytes, _) = usage(&a, busy);
                assert!(bytes <= quota, "{bytes} after block {i}");
            }
            // Old blocks went (least recent first within each stripe), the
            // last one stayed.
            let left: std::vec::Vec<u64> = (0..40).filter(|&i| a.lookup(nb, &[key(i)]).unwrap() == 1).collect();
            assert_eq!(left.len(), 6, "{left:?}");
            assert!(left.contains(&39) && !left.contains(&0), "{left:?}");
            assert_eq!(a.lookup(nq, &[key(100)]).unwrap(), 1, "another tenant's block untouched");
            // A block larger than the quota never fits.
            assert_eq!(a.reserve(nb, key(1000), quota + 1, 16).unwrap_err(), Error::OverQuota);
            // Every block of its own pinned: refused, others served.
            let mut held = std::vec::Vec::new();
            for &i in &left {
                let mut pin = [Err(Error::InvalidArgument)];
                assert_eq!(a.acquire(nb, &[key(i)], &mut pin).unwrap(), 1);
                held.push(pin[0].unwrap());
            }
            let (bytes, _) = usage(&a, busy);
            let want = quota - bytes + 1;
            assert_eq!(b.reserve(nb, key(2000), want, 16).unwrap_err(), Error::OverQuota);
            put(&b, nq, 101, 5000).unwrap();
            a.release(&held).unwrap();
            put(&b, nb, 2000, want.min(quota)).unwrap();
            let mut out = [TenantInfo::default(); 8];
            let k = a.tenant_list(&mut out).unwrap();
            let info = out[..k].iter().find(|t| t.id == busy).unwrap();
            assert!(info.evictions > 0 && info.refused > 0, "{info:?}");
            // Lowered live: the next reserve evicts down to it.
            a.tenant_set(busy, Limits { quota: 4000, ..Limits::default() }).unwrap();
            put(&a, nb, 3000, 1000).unwrap();
            assert!(usage(&a, busy).0 <= 4000);
            assert!(findings(f).is_empty(), "{:?}", findings(f));
        });
    }

    #[test]
    fn an_eviction_for_another_tenant_leaves_every_tenant_its_share() {
        // A small region: the busy tenant's blocks fill it and evict.
        let caps = crate::layout::Capacities { entries_per_stripe: 64, ..small_caps() };
        with_one_node(1 << 20, caps, |f, _, _, a| {
            let share = 60_000;
            let quiet = a.tenant_add(b"quiet", Limits { share, ..Limits::default() }).unwrap();
            let loose = a.tenant_add(b"loose", Limits::default()).unwrap();
            let nq = a.namespace_in(quiet, model(b"q")).unwrap();
            let nl = a.namespace_in(loose, model(b"l")).unwrap();
            for i in 0..12 {
                put(&a, nq, i, 8000).unwrap();
            }
            for i in 0..6 {
                put(&a, nl, i, 8000).unwrap();
            }
            // The default tenant writes far more than the region holds.
            for i in 0..400u64 {
                put(&a, 5, i, 8000).unwrap();
                assert!(usage(&a, quiet).0 >= share, "below its share after block {i}");
            }
            assert_eq!(usage(&a, loose), (0, 0), "a tenant without a share gives way");
            let (bytes, blocks) = usage(&a, quiet);
            assert!(bytes >= share && bytes < share + 8000, "{bytes}");
            assert_eq!(bytes, blocks * 8000);
            // Its own removals are not held by its share.
            a.evict(u64::MAX, &mut OfTenant::new(&a, quiet)).unwrap();
            assert_eq!(usage(&a, quiet), (0, 0));
            // Nor is a plain LRU eviction the other way round: the share
            // holds it too.
            assert!(findings(f).is_empty(), "{:?}", findings(f));
            let _ = a.evict(u64::MAX, &mut Lru).unwrap();
        });
    }

    #[test]
    fn a_dropped_tenant_frees_its_blocks_and_takes_no_more() {
        with_two_nodes(|f, _, a, b| {
            let t = a.tenant_add(b"gone", Limits::default()).unwrap();
            let keep = a.tenant_add(b"kept", Limits::default()).unwrap();
            let nt = a.namespace_in(t, model(b"m")).unwrap();
            let nk = a.namespace_in(keep, model(b"m")).unwrap();
            for i in 0..10 {
                put(&a, nt, i, 2000).unwrap();
                put(&b, nk, i, 1000).unwrap();
            }
            // A pin holds one block: the drop says so, and takes no block
            // meanwhile.
            let mut pin = [Err(Error::InvalidArgument)];
            assert_eq!(b.acquire(nt, &[key(3)], &mut pin).unwrap(), 1);
            let w = a.reserve(nt, key(50), 100, 16).unwrap();
            assert_eq!(a.tenant_drop(t).unwrap_err(), Error::Busy);
            assert_eq!(b.reserve(nt, key(51), 100, 16).unwrap_err(), Error::NoTenant, "being dropped");
            assert_eq!(a.lookup(nt, &[key(1)]).unwrap(), 0, "its unpinned blocks are gone");
            assert_eq!(usage(&a, t), (2100, 2));
            b.release(&[pin[0].unwrap()]).unwrap();
            a.publish(&w).unwrap();
            let rep = b.tenant_drop(t).unwrap();
            assert_eq!(rep, DropReport { blocks: 2, bytes: 2100 });
            assert_eq!(a.tenant_find(b"gone").unwrap(), None);
            assert_eq!(a.reserve(nt, key(52), 100, 16).unwrap_err(), Error::NoTenant);
            assert_eq!(a.namespace_in(t, model(b"other")).unwrap_err(), Error::NoTenant);
            assert_eq!(usage(&a, keep), (10_000, 10), "the other tenant kept everything");
            assert!(findings(f).is_empty(), "{:?}", findings(f));
        });
    }

    #[test]
    fn blocks_past_their_lifetime_are_never_read_are_replaced_and_go_first() {
        let caps = crate::layout::Capacities { entries_per_stripe: 64, ..small_caps() };
        with_one_node(1 << 20, caps, |f, env, _, a| {
            let short = a.tenant_add(b"short", Limits { ttl_ms: 1000, ..Limits::default() }).unwrap();
            let long = a.tenant_add(b"long", Limits::default()).unwrap();
            let ns = a.namespace_in(short, model(b"m")).unwrap();
            let nl = a.namespace_in(long, model(b"m")).unwrap();
            let keys: std::vec::Vec<Key> = (0..10).map(key).collect();
            for i in 0..10 {
                put(&a, ns, i, 4000).unwrap();
                put(&a, nl, i, 4000).unwrap();
            }
            *env.wall.lock() += 999;
            assert_eq!(a.lookup(ns, &keys).unwrap(), 10, "alive until its last millisecond");
            *env.wall.lock() += 1;
            // Past it: missing to every reader, the other tenant's kept.
            assert_eq!(a.lookup(ns, &keys).unwrap(), 0);
            let mut present = [true; 10];
            assert_eq!(a.presence(ns, &keys, &mut present).unwrap(), 0);
            assert!(present.iter().all(|p| !p));
            let mut pins = [Err(Error::InvalidArgument); 10];
            assert_eq!(a.acquire(ns, &keys, &mut pins).unwrap(), 0);
            assert!(pins.iter().all(|p| *p == Err(Error::NotFound)), "{pins:?}");
            let mut buf = [0u8; 4000];
            assert_eq!(a.get(ns, key(1), &mut buf).unwrap_err(), Error::NotFound);
            assert!(!a.exists(ns, key(1)).unwrap());
            assert_eq!(a.lookup(nl, &keys).unwrap(), 10);
            // Counted until removed; a reserve of the key replaces it.
            assert_eq!(usage(&a, short), (40_000, 10));
            put(&a, ns, 3, 2000).unwrap();
            assert_eq!(a.lookup(ns, &[key(3)]).unwrap(), 1, "the new block has a new lifetime");
            assert_eq!(usage(&a, short), (38_000, 10));
            // An eviction takes the expired blocks before anything else.
            let rep = a.evict(8000, &mut Lru).unwrap();
            assert!(rep.bytes >= 8000, "{rep:?}");
            assert_eq!(a.lookup(nl, &keys).unwrap(), 10, "nothing live went");
            assert_eq!(a.lookup(ns, &[key(3)]).unwrap(), 1);
            let mut out = [TenantInfo::default(); 8];
            let k = a.tenant_list(&mut out).unwrap();
            let info = out[..k].iter().find(|t| t.id == short).unwrap();
            assert!(info.expired >= 3 && info.expired == info.evictions, "{info:?}");
            assert!(findings(f).is_empty(), "{:?}", findings(f));
            // Recovery keeps the stamps of the blocks it keeps.
            a.recover(0).unwrap();
            assert_eq!(a.lookup(ns, &[key(3)]).unwrap(), 1);
            assert!(findings(f).is_empty(), "{:?}", findings(f));
            *env.wall.lock() += 1000;
            assert_eq!(a.lookup(ns, &[key(3)]).unwrap(), 0);
            // A lifetime set live applies to blocks reserved from then on.
            a.tenant_set(long, Limits { ttl_ms: 10, ..Limits::default() }).unwrap();
            put(&a, nl, 20, 1000).unwrap();
            *env.wall.lock() += 10;
            assert_eq!(a.lookup(nl, &[key(20)]).unwrap(), 0);
            assert_eq!(a.lookup(nl, &keys).unwrap(), 10, "stamped without a lifetime");
            // A stamp lost (a block stored without one) is what the check
            // finds.
            let (s, e) = {
                let (s, fnd) = f.store.find_stored(nl, key(0)).unwrap().unwrap();
                (s, fnd.entry)
            };
            let l = &f.store.layout;
            let mut x: crate::layout::ExpiryLine = f.store.view.read(l.expiry_line(s, e)).unwrap();
            x.at[(e % crate::layout::EXPIRY_SLOTS) as usize] ^= 1;
            f.store.view.write(l.expiry_line(s, e), &x).unwrap();
            let found = findings(f);
            assert!(found.iter().any(|x| x.kind == FindingKind::Expiry && x.b == e as u64), "{found:?}");
        });
    }

    #[test]
    fn a_scrubbing_tenants_blocks_are_handed_out_zeroed() {
        with_one_node(1 << 20, small_caps(), |f, _, _, a| {
            let t = a.tenant_add(b"clean", Limits { scrub: true, ..Limits::default() }).unwrap();
            let ns = a.namespace_in(t, model(b"m")).unwrap();
            // A block of the default tenant, written whole, then evicted:
            // its bytes stay in the freed space.
            let old = |k: u64| {
                let h = a.reserve(5, key(k), 4096, 16).unwrap();
                a.write(&h, 0, &[0xab; 4096]).unwrap();
                a.publish_flushed(&[h], &mut [Ok(())]).unwrap();
                a.evict(u64::MAX, &mut Lru).unwrap();
                h.off
            };
            let at = old(1);
            let h = a.reserve(ns, key(2), 4096, 16).unwrap();
            assert_eq!(h.off, at, "the freed space is handed out again");
            let mut buf = [0xffu8; 4096];
            a.read(&h, 0, &mut buf).unwrap();
            assert!(buf.iter().all(|&b| b == 0), "a scrubbing tenant's reserve is zeroed");
            // Written in part and published: the rest reads zero.
            a.write(&h, 0, &[7u8; 1000]).unwrap();
            a.publish_flushed(&[h], &mut [Ok(())]).unwrap();
            assert_eq!(a.get(ns, key(2), &mut buf).unwrap(), 4096);
            assert!(buf[..1000].iter().all(|&b| b == 7) && buf[1000..].iter().all(|&b| b == 0));
            // What it is for: a tenant that does not scrub is handed the
            // earlier bytes.
            a.evict(u64::MAX, &mut OfTenant::new(&a, t)).unwrap();
            let at = old(3);
            let plain = a.tenant_add(b"plain", Limits::default()).unwrap();
            let np = a.namespace_in(plain, model(b"m")).unwrap();
            let h = a.reserve(np, key(4), 4096, 16).unwrap();
            assert_eq!(h.off, at);
            a.read(&h, 0, &mut buf).unwrap();
            assert!(buf.iter().all(|&b| b == 0xab));
            a.abort(&h).unwrap();
            assert!(findings(f).is_empty(), "{:?}", findings(f));
        });
    }

    #[test]
    fn recovery_rebuilds_a_tenant_usage_the_check_finds_wrong() {
        with_two_nodes(|f, _, a, _| {
            let t = a.tenant_add(b"t", Limits::default()).unwrap();
            let ns = a.namespace_in(t, model(b"m")).unwrap();
            for i in 0..5 {
                put(&a, ns, i, 700).unwrap();
            }
            let l = &f.store.layout;
            let mut u: TenantUsage = f.store.view.read(l.tenant_usage(t.slot)).unwrap();
            u.bytes += 1;
            f.store.view.write(l.tenant_usage(t.slot), &u).unwrap();
            let found = findings(f);
            assert!(found.iter().any(|x| x.kind == FindingKind::TenantUsage && x.a == t.slot as u64), "{found:?}");
            a.recover(0).unwrap();
            assert!(findings(f).is_empty(), "{:?}", findings(f));
            assert_eq!(usage(&a, t), (3500, 5));
        });
    }
}
