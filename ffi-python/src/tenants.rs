//! Tenants from Python (see the README's Tenants section): `Node`'s
//! `tenant_*` methods and `namespace(ns, tenant=...)` call these. A tenant
//! is named by its name.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use cxlkv_platform::tenants::{Limits, TenantId, TenantInfo, TENANT_DROPPING};
use cxlkv_platform::Code as R;
use cxlkv_platform::Node as Attached;

use crate::{raise, OrRaise};

/// The live tenant named `name` (`NoTenantError`-family result when none).
pub(crate) fn find(py: Python<'_>, c: &Attached, name: &str) -> PyResult<TenantId> {
    py.detach(|| c.tenant_find(name.as_bytes()))
        .or_raise(py)?
        .ok_or_else(|| raise(py, R::NoTenant, &format!("no tenant {name}")))
}

/// Limits from keyword values.
pub(crate) fn limits(quota: u64, share: u64, priority: u32, ttl_ms: u64, scrub: bool) -> Limits {
    Limits { quota, share, priority, ttl_ms, scrub }
}

/// A tenant as a dict: name, quota, share, priority, ttl_ms, scrub, bytes,
/// blocks, evictions, expired, refused, dropping.
pub(crate) fn info<'py>(py: Python<'py>, t: &TenantInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", String::from_utf8_lossy(t.name()))?;
    d.set_item("quota", t.limits.quota)?;
    d.set_item("share", t.limits.share)?;
    d.set_item("priority", t.limits.priority)?;
    d.set_item("ttl_ms", t.limits.ttl_ms)?;
    d.set_item("scrub", t.limits.scrub)?;
    d.set_item("bytes", t.bytes)?;
    d.set_item("blocks", t.blocks)?;
    d.set_item("evictions", t.evictions)?;
    d.set_item("expired", t.expired)?;
    d.set_item("refused", t.refused)?;
    d.set_item("dropping", t.state == TENANT_DROPPING)?;
    Ok(d)
}
