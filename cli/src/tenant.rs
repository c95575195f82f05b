//! `cxlkv tenant {add,set,list,drop} REGION ...`: a region's tenants (see
//! the README's Tenants section), through a node attached for the call.

use clap::{Args, Subcommand};
use cxlkv_platform::tenants::{Limits, TenantId, TenantInfo, TENANT_DROPPING};
use cxlkv_platform::{Node, Options};
use serde_json::json;

use crate::args::{size, PathArgs};
use crate::Fail;

#[derive(Args)]
pub(crate) struct TenantArgs {
    #[command(subcommand)]
    pub(crate) cmd: TenantCmd,
}

#[derive(Subcommand)]
pub(crate) enum TenantCmd {
    /// Adds a tenant.
    Add(TenantSet),
    /// Changes a live tenant's limits (every node follows at once).
    Set(TenantSet),
    /// Lists the tenants with their limits and usage.
    List(PathArgs),
    /// Drops a tenant: removes its blocks and frees its slot (exit 1 while
    /// blocks of it are pinned or being written; it takes no new block
    /// meanwhile, and a later drop finishes).
    Drop(TenantName),
}

#[derive(Args)]
pub(crate) struct TenantName {
    #[command(flatten)]
    pub(crate) at: PathArgs,
    /// The tenant's name (1 to 20 bytes).
    pub(crate) name: String,
}

#[derive(Args)]
pub(crate) struct TenantSet {
    #[command(flatten)]
    pub(crate) of: TenantName,
    /// Hard quota: payload bytes it never exceeds (0: none).
    #[arg(long, value_parser = size, default_value = "0")]
    pub(crate) quota: u64,
    /// Guaranteed share: bytes eviction for other tenants never takes it
    /// below.
    #[arg(long, value_parser = size, default_value = "0")]
    pub(crate) share: u64,
    /// Relative weight (reported).
    #[arg(long, default_value_t = 0)]
    pub(crate) priority: u32,
    /// Lifetime of its blocks in milliseconds from their reserve (0:
    /// none): past it a block is never read, and goes first. A change
    /// applies to blocks stored from then on.
    #[arg(long, default_value_t = 0)]
    pub(crate) ttl_ms: u64,
    /// Zero each block reserved for it before it is handed out: its
    /// writers and readers never meet bytes an earlier block left (costs a
    /// write of every reserved byte).
    #[arg(long)]
    pub(crate) scrub: bool,
}

fn attach(at: &PathArgs) -> Result<Node, Fail> {
    Ok(Node::open(&at.path, Options { mode: at.mode.mode, ..Options::default() })?)
}

fn find(node: &Node, name: &str) -> Result<TenantId, Fail> {
    node.tenant_find(name.as_bytes())?.ok_or_else(|| Fail::Run(format!("no tenant {name}")))
}

fn limits(a: &TenantSet) -> Limits {
    Limits { quota: a.quota, share: a.share, priority: a.priority, ttl_ms: a.ttl_ms, scrub: a.scrub }
}

fn show(t: &TenantInfo) -> serde_json::Value {
    json!({"name": String::from_utf8_lossy(t.name()), "slot": t.id.slot,
        "state": if t.state == TENANT_DROPPING { "dropping" } else { "live" },
        "quota": t.limits.quota, "share": t.limits.share, "priority": t.limits.priority,
        "ttl_ms": t.limits.ttl_ms, "scrub": t.limits.scrub, "bytes": t.bytes, "blocks": t.blocks, "evictions": t.evictions,
        "expired": t.expired, "refused": t.refused})
}

pub(crate) fn cmd_tenant(a: &TenantArgs) -> Result<(), Fail> {
    match &a.cmd {
        TenantCmd::Add(s) => {
            let node = attach(&s.of.at)?;
            let r = node.tenant_add(s.of.name.as_bytes(), limits(s));
            node.close()?;
            let id = match r {
                Err(cxlkv_platform::Error::Core(cxlkv_platform::kv::CoreError::Exists)) => {
                    return Err(Fail::Run(format!("a tenant named {} exists", s.of.name)))
                }
                r => r?,
            };
            println!("tenant {} added (slot {})", s.of.name, id.slot);
        }
        TenantCmd::Set(s) => {
            let node = attach(&s.of.at)?;
            let r = find(&node, &s.of.name).and_then(|id| Ok(node.tenant_set(id, limits(s))?));
            node.close()?;
            r?;
            println!("tenant {} set", s.of.name);
        }
        TenantCmd::List(at) => {
            let node = attach(at)?;
            let r = node.tenant_list();
            node.close()?;
            let list = r?;
            if at.json {
                println!("{}", serde_json::Value::Array(list.iter().map(show).collect()));
            } else {
                println!(
                    "{:<20} {:>14} {:>14} {:>10} {:>14} {:>8} {:>10} {:>8} {:>8}",
                    "tenant", "quota", "share", "ttl_ms", "bytes", "blocks", "evictions", "expired", "refused"
                );
                for t in &list {
                    let q = if t.limits.quota == 0 { "-".to_string() } else { t.limits.quota.to_string() };
                    println!(
                        "{:<20} {:>14} {:>14} {:>10} {:>14} {:>8} {:>10} {:>8} {:>8}{}",
                        String::from_utf8_lossy(t.name()),
                        q,
                        t.limits.share,
                        t.limits.ttl_ms,
                        t.bytes,
                        t.blocks,
                        t.evictions,
                        t.expired,
                        t.refused,
                        if t.state == TENANT_DROPPING { "  (dropping)" } else { "" }
                    );
                }
            }
        }
        TenantCmd::Drop(n) => {
            let node = attach(&n.at)?;
            let r = find(&node, &n.name).and_then(|id| Ok(node.tenant_drop(id)?));
            node.close()?;
            let rep = r?;
            println!("tenant {} dropped: {} blocks, {} bytes removed", n.name, rep.blocks, rep.bytes);
        }
    }
    Ok(())
}
