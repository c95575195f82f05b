//! Tenants from Node (see the README's Tenants section): a tenant is named
//! by its name. `namespaceIn` registers a namespace in one.

use cxlkv_platform::tenants::{Limits, TenantId, TenantInfo, TENANT_DROPPING};
use cxlkv_platform::Code;
use napi::{Env, Unknown};
use napi_derive::napi;

use crate::args::{string_of, Opts};
use crate::error::{coded, OrThrow};
use crate::node::{Evicted, Node};

/// A tenant, its limits and its usage.
#[napi(object)]
pub struct Tenant {
    /// Its name.
    pub name: String,
    /// Hard quota in payload bytes (0: none).
    pub quota: f64,
    /// Guaranteed share in payload bytes.
    pub share: f64,
    /// Relative weight.
    pub priority: u32,
    /// Lifetime of its blocks in milliseconds (0: none).
    pub ttl_ms: f64,
    /// Its blocks are zeroed when reserved.
    pub scrub: bool,
    /// Payload bytes of its blocks being written or stored.
    pub bytes: f64,
    /// Its blocks being written or stored.
    pub blocks: f64,
    /// Its blocks evicted.
    pub evictions: f64,
    /// Of its evictions, blocks removed past their lifetime.
    pub expired: f64,
    /// Reserves refused at its hard quota.
    pub refused: f64,
    /// Being dropped.
    pub dropping: bool,
}

fn tenant_of(t: &TenantInfo) -> Tenant {
    Tenant {
        name: String::from_utf8_lossy(t.name()).into_owned(),
        quota: t.limits.quota as f64,
        share: t.limits.share as f64,
        priority: t.limits.priority,
        ttl_ms: t.limits.ttl_ms as f64,
        scrub: t.limits.scrub,
        bytes: t.bytes as f64,
        blocks: t.blocks as f64,
        evictions: t.evictions as f64,
        expired: t.expired as f64,
        refused: t.refused as f64,
        dropping: t.state == TENANT_DROPPING,
    }
}

/// `{ quota?, share?, priority?, ttlMs?, scrub? }` (absent: none).
fn limits_of(env: &Env, v: &Unknown<'_>) -> napi::Result<Limits> {
    let o = Opts::of(env, v, "limits", &["quota", "share", "priority", "ttlMs", "scrub"])?;
    Ok(Limits {
        quota: o.u64("quota")?.unwrap_or(0),
        share: o.u64("share")?.unwrap_or(0),
        priority: o.u32("priority")?.unwrap_or(0),
        ttl_ms: o.u64("ttlMs")?.unwrap_or(0),
        scrub: o.bool("scrub")?.unwrap_or(false),
    })
}

impl Node {
    fn tenant_named(&self, env: &Env, name: &str) -> napi::Result<TenantId> {
        let c = self.attached(env)?;
        c.tenant_find(name.as_bytes())
            .or_throw(env)?
            .ok_or_else(|| coded(env, Code::NoTenant, &format!("no tenant {name}")))
    }
}

#[napi]
impl Node {
    /// Adds tenant `name` (1 to 20 bytes) with a hard `quota` and a
    /// guaranteed `share` in payload bytes, a `priority` and a lifetime
    /// for its blocks, `ttlMs` (each left out: none). `EXISTS` when a
    /// tenant of that name lives, `TENANTS_FULL` when every slot (the
    /// `maxTenants` capacity) is taken.
    #[napi(
        catch_unwind,
        ts_args_type = "name: string, limits?: { quota?: number, share?: number, priority?: number, ttlMs?: number, scrub?: boolean }"
    )]
    pub fn tenant_add(&self, env: Env, name: Unknown<'_>, limits: Unknown<'_>) -> napi::Result<()> {
        let (name, l) = (string_of(&env, &name, "name")?, limits_of(&env, &limits)?);
        let c = self.attached(&env)?;
        c.tenant_add(name.as_bytes(), l).or_throw(&env).map(|_| ())
    }

    /// Changes a live tenant's limits (every node follows at once; a new
    /// lifetime applies to blocks stored from then on).
    #[napi(
        catch_unwind,
        ts_args_type = "name: string, limits?: { quota?: number, share?: number, priority?: number, ttlMs?: number, scrub?: boolean }"
    )]
    pub fn tenant_set(&self, env: Env, name: Unknown<'_>, limits: Unknown<'_>) -> napi::Result<()> {
        let (name, l) = (string_of(&env, &name, "name")?, limits_of(&env, &limits)?);
        let t = self.tenant_named(&env, &name)?;
        self.attached(&env)?.tenant_set(t, l).or_throw(&env)
    }

    /// Every tenant, the default one first, with its limits and usage.
    #[napi(catch_unwind)]
    pub fn tenants(&self, env: Env) -> napi::Result<Vec<Tenant>> {
        let list = self.attached(&env)?.tenant_list().or_throw(&env)?;
        Ok(list.iter().map(tenant_of).collect())
    }

    /// Drops tenant `name`: its blocks are removed and its slot freed.
    /// `BUSY` while blocks of it are pinned or being written (it takes no
    /// new block meanwhile: call again once they are released).
    #[napi(catch_unwind, ts_args_type = "name: string")]
    pub fn tenant_drop(&self, env: Env, name: Unknown<'_>) -> napi::Result<Evicted> {
        let name = string_of(&env, &name, "name")?;
        let t = self.tenant_named(&env, &name)?;
        let r = self.attached(&env)?.tenant_drop(t).or_throw(&env)?;
        Ok(Evicted { blocks: r.blocks as f64, bytes: r.bytes as f64 })
    }

    /// The id of namespace `fields` of tenant `tenant`, registered on first
    /// use: the same fields in another tenant are another namespace (tenants
    /// never share a block), and its blocks count to the tenant's usage and
    /// quota. `NO_TENANT` when there is no such tenant.
    #[napi(catch_unwind, ts_args_type = "fields: NamespaceFields, tenant: string")]
    pub fn namespace_in(&self, env: Env, fields: Unknown<'_>, tenant: Unknown<'_>) -> napi::Result<u32> {
        let d = crate::Fields::of(&env, &fields)?.digest();
        let name = string_of(&env, &tenant, "tenant")?;
        let t = self.tenant_named(&env, &name)?;
        self.attached(&env)?.core().namespace_in(t, d).map_err(cxlkv_platform::Error::from).or_throw(&env)
    }
}
