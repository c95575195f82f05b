//! Metrics of a region, read by an observer that attaches no node: per node
//! (hits, misses, bytes read and written, evictions, lock grants and the
//! time they waited, recoveries run, inbox depth, pins) and region-wide
//! (live blocks and bytes, capacity, chunks, evictions, SSD tier records),
//! as a snapshot ([`RegionMetrics`]) or in the OpenMetrics text format that
//! Prometheus scrapes ([`RegionMetrics::to_openmetrics`]), encoded by the
//! `prometheus-client` crate. What `cxlkv stats` and `cxlkv serve-metrics`
//! print and serve.
//!
//! Every count comes from the region: each node's counters line and
//! heartbeat line (its lock and recovery counters ride on the beat), the
//! stripe headers, the chunk records, the inbox rings and the tier
//! directories. Nothing is written, so any process of any host can serve
//! the rack's metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;

use cxlkv_core::coherence::Site;
use cxlkv_core::layout::{
    ChunkRecord, Heartbeat, NodeInfo, NodeStats, StripeHeader, CHUNK_FREE, NODE_ALIVE, NODE_DEAD, NODE_FENCED,
};
use cxlkv_core::pins::journal_census;

use crate::error::Result;
use crate::host::{pid_alive, Locality};
use crate::inspect::{NodeCounters, Observed};

/// The media type of [`RegionMetrics::to_openmetrics`]'s text.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One attached (or dead, unrecovered) node's metrics.
#[derive(Clone, Debug, Serialize)]
pub struct NodeMetrics {
    /// Node id.
    pub id: u32,
    /// Process id (in its PID namespace).
    pub pid: u32,
    /// Its host id, in hex.
    pub host_id: String,
    /// `alive`, `dead` (declared dead, recovery pending) or `gone` (its
    /// process exited; this host can tell).
    pub state: &'static str,
    /// Its operation counters.
    #[serde(flatten)]
    pub counters: NodeCounters,
    /// Global locks granted to it.
    pub lock_grants: u64,
    /// Seconds its lock requests waited for their grants, in all.
    pub lock_wait_seconds: f64,
    /// Recoveries it ran that freed a dead node.
    pub recoveries: u64,
    /// Dead nodes those recoveries freed.
    pub nodes_recovered: u64,
    /// Nodes its lock manager declared dead by silence while their process
    /// ran on its host (stopped or starved).
    pub running_declared_dead: u64,
    /// Messages waiting in its inbox, and the slots they take.
    pub inbox_messages: u64,
    /// Inbox slots in use.
    pub inbox_slots_used: u64,
    /// Pins it holds.
    pub pins: u32,
    /// Blocks it has reserved and not yet published.
    pub reservations: u32,
}

/// A region's metrics.
#[derive(Clone, Debug, Serialize)]
pub struct RegionMetrics {
    /// Mapped size, bytes.
    pub region_bytes: u64,
    /// Payload area, bytes.
    pub capacity_bytes: u64,
    /// Index entries (blocks the index can name).
    pub capacity_blocks: u64,
    /// Published blocks.
    pub live_blocks: u64,
    /// Their payload bytes.
    pub live_bytes: u64,
    /// Payload chunks, and those in use.
    pub chunks: u64,
    /// Chunks not free.
    pub chunks_used: u64,
    /// Evictions counted by the stripes (whichever node evicted).
    pub evictions: u64,
    /// Inbox slots per node (all senders' rings).
    pub inbox_capacity: u64,
    /// Blocks each live SSD tier records: (owner node, blocks).
    pub tier_blocks: Vec<(u32, u64)>,
    /// Nodes.
    pub nodes: Vec<NodeMetrics>,
    /// Tenants other than the default one (whose blocks are the rest).
    pub tenants: Vec<TenantMetrics>,
}

/// One tenant's limits and usage, as its lines show them.
#[derive(Clone, Debug, Serialize)]
pub struct TenantMetrics {
    /// Its name.
    pub name: String,
    /// Hard quota and guaranteed share, bytes (0: none).
    pub quota: u64,
    /// Guaranteed share, bytes.
    pub share: u64,
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
    /// Lifetime of its blocks, milliseconds (0: none).
    pub ttl_ms: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: u32,
    host: String,
    pid: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    node: u32,
    host: String,
    pid: u32,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabels {
    node: u32,
}

impl Observed {
    /// The region's metrics now (see the module documentation).
    pub fn metrics(&self) -> Result<RegionMetrics> {
        let store = self.store();
        let l = &store.layout;
        let me = Locality::here();
        let mut nodes = Vec::new();
        for n in 0..l.caps.max_nodes {
            let info: NodeInfo = store.fresh_state_first(l.node_info(n), Site("platform.metrics.info"))?;
            if info.state == 0 {
                continue;
            }
            let hb: Heartbeat = store.fresh(l.heartbeat(n), Site("platform.metrics.beat"))?;
            let st: NodeStats = store.fresh(l.node_stats(n), Site("platform.metrics.stats"))?;
            let state = match info.state {
                NODE_DEAD => "dead",
                NODE_FENCED => "fenced",
                NODE_ALIVE if me.can_probe(&info) && !pid_alive(info.pid) => "gone",
                NODE_ALIVE => "alive",
                _ => "unknown",
            };
            let held = journal_census(store, n, Site("platform.metrics.journal"))?;
            let (inbox_messages, inbox_slots_used) = store.inbox_depth(n)?;
            nodes.push(NodeMetrics {
                id: n,
                pid: info.pid,
                host_id: format!("{:016x}", info.host_id),
                state,
                counters: st.into(),
                lock_grants: hb.lock_grants,
                lock_wait_seconds: hb.lock_wait_ns as f64 / 1e9,
                recoveries: hb.recoveries,
                nodes_recovered: hb.nodes_recovered,
                running_declared_dead: hb.running_declared_dead,
                inbox_messages,
                inbox_slots_used,
                pins: held.pins,
                reservations: held.reservations,
            });
        }
        let (mut live_blocks, mut live_bytes, mut evictions) = (0u64, 0u64, 0u64);
        for s in 0..l.caps.n_stripes {
            let h: StripeHeader = store.fresh(l.stripe(s), Site("platform.metrics.stripe"))?;
            live_blocks += h.live as u64;
            live_bytes += h.bytes;
            evictions += h.evictions;
        }
        let mut chunks_used = 0u64;
        for c in 0..l.n_chunks {
            let r: ChunkRecord = store.fresh(l.chunk(c), Site("platform.metrics.chunk"))?;
            chunks_used += (r.kind != CHUNK_FREE) as u64;
        }
        let mut tier_blocks = Vec::new();
        for d in 0..l.caps.tier_slots {
            if let Some(owner) = store.tier_owner(d)? {
                let mut n = 0u64;
                store.tier_records(d, |_, _| {
                    n += 1;
                    Ok(())
                })?;
                tier_blocks.push((owner, n));
            }
        }
        let mut tenants = Vec::new();
        for t in 1..l.caps.max_tenants {
            let c: cxlkv_core::layout::TenantConfig =
                store.fresh(l.tenant_config(t), Site("platform.metrics.tenant"))?;
            if c.state == cxlkv_core::layout::TENANT_FREE {
                continue;
            }
            let u: cxlkv_core::layout::TenantUsage = store.fresh(l.tenant_usage(t), Site("platform.metrics.usage"))?;
            let n = c.name.iter().position(|&b| b == 0).unwrap_or(c.name.len());
            tenants.push(TenantMetrics {
                name: String::from_utf8_lossy(&c.name[..n]).into_owned(),
                quota: c.quota,
                share: c.share,
                bytes: u.bytes,
                blocks: u.blocks,
                evictions: u.evictions,
                refused: u.refused,
                expired: u.expired,
                ttl_ms: c.ttl_ms,
            });
        }
        Ok(RegionMetrics {
            region_bytes: l.region_size,
            capacity_bytes: l.payload.len(),
            capacity_blocks: l.caps.n_stripes as u64 * l.caps.entries_per_stripe as u64,
            live_blocks,
            live_bytes,
            chunks: l.n_chunks as u64,
            chunks_used,
            evictions,
            inbox_capacity: l.caps.inbox_slots as u64 * l.caps.max_nodes as u64,
            tier_blocks,
            nodes,
            tenants,
        })
    }
}

/// Registers a family of per-node metrics and sets each node's value.
fn per_node<M>(reg: &mut Registry, m: &RegionMetrics, name: &str, help: &str, set: impl Fn(&M, &NodeMetrics))
where
    M: prometheus_client::metrics::TypedMetric
        + prometheus_client::encoding::EncodeMetric
        + Default
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let fam = Family::<NodeLabels, M>::default();
    for n in &m.nodes {
        set(&fam.get_or_create(&NodeLabels { node: n.id, host: n.host_id.clone(), pid: n.pid }), n);
    }
    reg.register(name, help, fam);
}

/// Registers a region-wide gauge.
fn gauge(reg: &mut Registry, name: &str, help: &str, v: u64) {
    let g = Gauge::<i64>::default();
    g.set(v.min(i64::MAX as u64) as i64);
    reg.register(name, help, g);
}

impl RegionMetrics {
    /// The metrics in the OpenMetrics text format (metric names prefixed
    /// `cxlkv_`; counters end in `_total`; per-node metrics labelled
    /// `node`, `host`, `pid`).
    pub fn to_openmetrics(&self) -> String {
        let mut reg = Registry::with_prefix("cxlkv");
        let c = |get: fn(&NodeMetrics) -> u64| {
            move |m: &Counter, n: &NodeMetrics| {
                m.inc_by(get(n));
            }
        };
        // The node's counters, as core's table names them.
        for (i, f) in NodeStats::COUNTERS.iter().enumerate() {
            per_node(&mut reg, self, f.metric, f.help, move |m: &Counter, n: &NodeMetrics| {
                m.inc_by(n.counters.values().get(i).copied().unwrap_or(0));
            });
        }
        per_node(&mut reg, self, "lock_grants", "Global locks granted to the node", c(|n| n.lock_grants));
        per_node(&mut reg, self, "recoveries", "Recoveries the node ran that freed a dead node", c(|n| n.recoveries));
        per_node(&mut reg, self, "nodes_recovered", "Dead nodes the node's recoveries freed", c(|n| n.nodes_recovered));
        per_node(
            &mut reg,
            self,
            "running_declared_dead",
            "Nodes the node's lock manager declared dead by silence while their process ran on its host (stopped or \
             starved of CPU)",
            c(|n| n.running_declared_dead),
        );
        // The crate keeps an f64 counter's value in an AtomicU64: a snapshot
        // in this process's memory, nothing shared.
        #[allow(clippy::disallowed_types)]
        type Seconds = Counter<f64, std::sync::atomic::AtomicU64>;
        per_node(
            &mut reg,
            self,
            "lock_wait_seconds",
            "Seconds the node's lock requests waited for their grants",
            |m: &Seconds, n| {
                m.inc_by(n.lock_wait_seconds);
            },
        );
        let g = |get: fn(&NodeMetrics) -> u64| {
            move |m: &Gauge, n: &NodeMetrics| {
                m.set(get(n).min(i64::MAX as u64) as i64);
            }
        };
        per_node(&mut reg, self, "inbox_messages", "Messages waiting in the node's inbox", g(|n| n.inbox_messages));
        per_node(
            &mut reg,
            self,
            "inbox_slots_used",
            "Inbox slots the waiting messages take",
            g(|n| n.inbox_slots_used),
        );
        per_node(&mut reg, self, "pins", "Blocks the node holds pinned", g(|n| n.pins as u64));
        per_node(
            &mut reg,
            self,
            "reservations",
            "Blocks the node reserved and has not published",
            g(|n| n.reservations as u64),
        );
        let states = Family::<StateLabels, Gauge>::default();
        for n in &self.nodes {
            let l = StateLabels { node: n.id, host: n.host_id.clone(), pid: n.pid, state: n.state.to_string() };
            states.get_or_create(&l).set(1);
        }
        reg.register("node_state", "A node slot in use, by state (alive, dead, gone)", states);
        gauge(&mut reg, "region_bytes", "Mapped size of the region", self.region_bytes);
        gauge(&mut reg, "capacity_bytes", "Payload area of the region", self.capacity_bytes);
        gauge(&mut reg, "capacity_blocks", "Blocks the index can name", self.capacity_blocks);
        gauge(&mut reg, "live_blocks", "Published blocks", self.live_blocks);
        gauge(&mut reg, "live_bytes", "Payload bytes of published blocks", self.live_bytes);
        gauge(&mut reg, "chunks", "Payload chunks", self.chunks);
        gauge(&mut reg, "chunks_used", "Payload chunks not free", self.chunks_used);
        gauge(&mut reg, "inbox_capacity_slots", "Inbox slots per node (all senders' rings)", self.inbox_capacity);
        let ev = Counter::<u64>::default();
        ev.inc_by(self.evictions);
        reg.register("evictions", "Blocks evicted from the region, by any node", ev);
        let tiers = Family::<TierLabels, Gauge>::default();
        for &(node, n) in &self.tier_blocks {
            tiers.get_or_create(&TierLabels { node }).set(n.min(i64::MAX as u64) as i64);
        }
        reg.register("tier_blocks", "Blocks a live SSD tier records (by its node)", tiers);
        let per_tenant = |reg: &mut Registry, name: &str, help: &str, get: fn(&TenantMetrics) -> u64| {
            let fam = Family::<TenantLabels, Gauge>::default();
            for t in &self.tenants {
                fam.get_or_create(&TenantLabels { tenant: t.name.clone() }).set(get(t).min(i64::MAX as u64) as i64);
            }
            reg.register(name, help, fam);
        };
        per_tenant(&mut reg, "tenant_bytes", "Payload bytes of a tenant's blocks being written or stored", |t| t.bytes);
        per_tenant(&mut reg, "tenant_blocks", "A tenant's blocks being written or stored", |t| t.blocks);
        per_tenant(&mut reg, "tenant_quota_bytes", "A tenant's hard quota (0: none)", |t| t.quota);
        per_tenant(&mut reg, "tenant_share_bytes", "A tenant's guaranteed share", |t| t.share);
        per_tenant(&mut reg, "tenant_ttl_ms", "Lifetime of a tenant's blocks, milliseconds (0: none)", |t| t.ttl_ms);
        let per_tenant_total = |reg: &mut Registry, name: &str, help: &str, get: fn(&TenantMetrics) -> u64| {
            let fam = Family::<TenantLabels, Counter<u64>>::default();
            for t in &self.tenants {
                fam.get_or_create(&TenantLabels { tenant: t.name.clone() }).inc_by(get(t));
            }
            reg.register(name, help, fam);
        };
        per_tenant_total(&mut reg, "tenant_evictions", "A tenant's blocks evicted", |t| t.evictions);
        per_tenant_total(&mut reg, "tenant_refused", "A tenant's reserves refused at its hard quota", |t| t.refused);
        per_tenant_total(&mut reg, "tenant_expired", "A tenant's blocks removed past their lifetime", |t| t.expired);
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
        out
    }
}
