//! Tenants through a node (see `cxlkv_core::tenants`): add, find, change,
//! list and drop them, and register namespaces in them. Admin calls: each
//! takes the roots lock or the tenant's, none is on the data path.

use cxlkv_core::hash::Namespace;
pub use cxlkv_core::layout::{TENANT_DROPPING, TENANT_LIVE};
pub use cxlkv_core::tenants::{DropReport, Limits, TenantId, TenantInfo, DEFAULT_TENANT};

use crate::error::Result;
use crate::node::Node;

impl Node {
    /// Adds tenant `name` (1 to 20 bytes) with `limits`; `Exists` when one
    /// of that name lives, `TenantsFull` when every slot (the
    /// `max_tenants` capacity) is taken.
    pub fn tenant_add(&self, name: &[u8], limits: Limits) -> Result<TenantId> {
        Ok(self.core().tenant_add(name, limits)?)
    }

    /// The live tenant named `name` (`default` is the default tenant).
    pub fn tenant_find(&self, name: &[u8]) -> Result<Option<TenantId>> {
        Ok(self.core().tenant_find(name)?)
    }

    /// Changes a live tenant's limits; every node's next reserve and
    /// eviction follows them.
    pub fn tenant_set(&self, id: TenantId, limits: Limits) -> Result<()> {
        Ok(self.core().tenant_set(id, limits)?)
    }

    /// Every tenant with its limits and usage, the default tenant first.
    pub fn tenant_list(&self) -> Result<Vec<TenantInfo>> {
        let mut out = vec![TenantInfo::default(); self.store().layout.caps.max_tenants as usize];
        let n = self.core().tenant_list(&mut out)?;
        out.truncate(n);
        Ok(out)
    }

    /// Drops a tenant: its blocks are removed and its slot freed. `Busy`
    /// while blocks of it are pinned or being written (it takes no new one
    /// meanwhile; call again once they are released).
    pub fn tenant_drop(&self, id: TenantId) -> Result<DropReport> {
        Ok(self.core().tenant_drop(id)?)
    }

    /// The id of namespace `ns` of tenant `tenant`, registered on first
    /// use: the same fields in another tenant are another namespace, so
    /// tenants never share a block. `NoTenant` when `tenant` is not live.
    pub fn namespace_in(&self, tenant: TenantId, ns: &Namespace<'_>) -> Result<u32> {
        if tenant.slot == 0 {
            return self.namespace(ns);
        }
        Ok(self.core().namespace_in(tenant, ns.digest())?)
    }
}
