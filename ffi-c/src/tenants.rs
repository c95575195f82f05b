//! Tenants (see the README's Tenants section): add, find, change, list and
//! drop them; `cxlkv_namespace_register_in` (in `kv.rs`) registers a
//! namespace in one.

use core::ffi::c_char;

use cxlkv_platform::tenants::{Limits, TenantId, TenantInfo, TENANT_DROPPING};

use crate::region::{cxlkv_node, live};
use crate::{cxlkv_result, guard, slice_mut, text, Out};

/// A tenant: its slot and the nonce its slot had when it was added (a
/// tenant dropped and another added in its slot is another id).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_tenant {
    /// Slot in the region's tenant table (0: the default tenant, whatever
    /// the nonce).
    pub slot: u32,
    /// The slot's nonce for this tenant.
    pub nonce: u32,
}

/// A tenant's limits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_tenant_limits {
    /// Hard quota in payload bytes; 0 = none.
    pub quota: u64,
    /// Guaranteed share in payload bytes: eviction for other tenants never
    /// takes it below (at most the quota, when one is set).
    pub share: u64,
    /// Lifetime of its blocks in milliseconds from their reserve; 0 =
    /// none. Past it a block is never read (a miss), a put of its key
    /// replaces it, and evictions take it first. Hosts' clocks are assumed
    /// to agree within the deployment's margin.
    pub ttl_ms: u64,
    /// Relative weight (reported).
    pub priority: u32,
    /// 1: zero each block reserved for it before it is handed out, so its
    /// writers and readers never meet bytes an earlier block left (costs a
    /// write of every reserved byte); 0: not. Others are refused.
    pub scrub: u32,
}

/// A tenant as `cxlkv_tenant_list` reports it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_tenant_info {
    /// Who.
    pub id: cxlkv_tenant,
    /// Its name, NUL-terminated.
    pub name: [c_char; 24],
    /// Its limits.
    pub limits: cxlkv_tenant_limits,
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
    /// 1 while it is being dropped, else 0.
    pub dropping: u32,
    /// Zero.
    pub reserved: u32,
}

impl From<cxlkv_tenant> for TenantId {
    fn from(t: cxlkv_tenant) -> Self {
        TenantId { slot: t.slot, nonce: t.nonce }
    }
}

impl From<TenantId> for cxlkv_tenant {
    fn from(t: TenantId) -> Self {
        cxlkv_tenant { slot: t.slot, nonce: t.nonce }
    }
}

fn limits_of(l: &cxlkv_tenant_limits) -> Option<Limits> {
    let scrub = match l.scrub {
        0 => false,
        1 => true,
        _ => return None,
    };
    Some(Limits { quota: l.quota, share: l.share, ttl_ms: l.ttl_ms, priority: l.priority, scrub })
}

fn info_of(t: &TenantInfo) -> cxlkv_tenant_info {
    let mut name = [0 as c_char; 24];
    for (d, s) in name.iter_mut().zip(t.name()) {
        *d = *s as c_char;
    }
    cxlkv_tenant_info {
        id: t.id.into(),
        name,
        limits: cxlkv_tenant_limits {
            quota: t.limits.quota,
            share: t.limits.share,
            ttl_ms: t.limits.ttl_ms,
            priority: t.limits.priority,
            scrub: u32::from(t.limits.scrub),
        },
        bytes: t.bytes,
        blocks: t.blocks,
        evictions: t.evictions,
        refused: t.refused,
        expired: t.expired,
        dropping: u32::from(t.state == TENANT_DROPPING),
        reserved: 0,
    }
}

/// Reads `limits` (NULL: none).
///
/// # Safety
/// `limits` is NULL or valid for one read.
unsafe fn read_limits(limits: *const cxlkv_tenant_limits) -> Result<Limits, crate::Fail> {
    if limits.is_null() {
        return Ok(Limits::default());
    }
    // SAFETY: non-NULL, valid for one read by the contract.
    limits_of(unsafe { &limits.read() }).ok_or_else(|| cxlkv_result::InvalidArgument.into())
}

/// Adds tenant `name` (1 to 20 bytes) with `limits` (NULL: none); its id
/// goes to `out`. CXLKV_RESULT_EXISTS when a tenant of that name lives,
/// CXLKV_RESULT_TENANTS_FULL when every slot is taken (the `max_tenants`
/// capacity), CXLKV_RESULT_INVALID_ARGUMENT for a bad name, a share above
/// the quota, or a lifetime.
///
/// # Safety
/// `node` is a handle from this library or NULL; `name` is NUL-terminated;
/// `limits` is NULL or valid for one read; `out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_tenant_add(
    node: *const cxlkv_node,
    name: *const c_char,
    limits: *const cxlkv_tenant_limits,
    out: *mut cxlkv_tenant,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `name` is NUL-terminated by the contract.
        let name = unsafe { text(name) }?;
        // SAFETY:
        // - `limits` is NULL or valid for one read by the contract.
        let l = unsafe { read_limits(limits) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        out.write(c.tenant_add(name.as_bytes(), l)?.into());
        Ok(())
    })
}

/// The live tenant named `name` goes to `out` (`default` is the default
/// tenant); CXLKV_RESULT_NO_TENANT when there is none.
///
/// # Safety
/// `node` is a handle from this library or NULL; `name` is NUL-terminated;
/// `out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_tenant_find(
    node: *const cxlkv_node,
    name: *const c_char,
    out: *mut cxlkv_tenant,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `name` is NUL-terminated by the contract.
        let name = unsafe { text(name) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let t = c.tenant_find(name.as_bytes())?.ok_or(cxlkv_platform::kv::CoreError::NoTenant)?;
        out.write(t.into());
        Ok(())
    })
}

/// Changes a live tenant's limits (NULL: none); every node's next reserve
/// and eviction follows them. CXLKV_RESULT_NO_TENANT when it is not live;
/// the default tenant takes no limits.
///
/// # Safety
/// `node` is a handle from this library or NULL; `limits` is NULL or valid
/// for one read.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_tenant_set(
    node: *const cxlkv_node,
    tenant: cxlkv_tenant,
    limits: *const cxlkv_tenant_limits,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `limits` is NULL or valid for one read by the contract.
        let l = unsafe { read_limits(limits) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        Ok(c.tenant_set(tenant.into(), l)?)
    })
}

/// Lists the tenants (the default one first) into `out[0..cap]`; how many
/// there are goes to `n` (more than `cap` when `out` was too short).
///
/// # Safety
/// `node` is a handle from this library or NULL; `out` is valid for `cap`
/// writes (NULL when `cap` is 0); `n` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_tenant_list(
    node: *const cxlkv_node,
    out: *mut cxlkv_tenant_info,
    cap: usize,
    n: *mut usize,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `n` is valid for one write by the contract.
        let n = unsafe { Out::new(n) }?;
        // SAFETY:
        // - `out` is valid for `cap` writes by the contract.
        let out = unsafe { slice_mut(out, cap) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let list = c.tenant_list()?;
        for (o, t) in out.iter_mut().zip(&list) {
            *o = info_of(t);
        }
        n.write(list.len());
        Ok(())
    })
}

/// Drops a tenant: its blocks are removed and its slot freed; `out` (NULL
/// allowed) gets the blocks and bytes removed. CXLKV_RESULT_BUSY while
/// blocks of it are pinned or being written (it takes no new block
/// meanwhile: call again once they are released); CXLKV_RESULT_NO_TENANT
/// when it is not there.
///
/// # Safety
/// `node` is a handle from this library or NULL; `out` is NULL or valid for
/// one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_tenant_drop(
    node: *const cxlkv_node,
    tenant: cxlkv_tenant,
    out: *mut crate::region::cxlkv_evict_report,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is NULL or valid for one write by the contract.
        let out = unsafe { Out::maybe(out) };
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let r = c.tenant_drop(tenant.into())?;
        if let Some(o) = out {
            o.write(crate::region::cxlkv_evict_report { blocks: r.blocks, bytes: r.bytes });
        }
        Ok(())
    })
}
