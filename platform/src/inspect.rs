//! A region read by an observer that attaches no node (no heartbeat, no
//! lock, nothing written): what `cxlkv inspect` and `cxlkv check` report.

use serde::Serialize;

use cxlkv_core::check::Finding;
use cxlkv_core::coherence::Site;
use cxlkv_core::layout::{
    state, ChunkRecord, Entry, Heartbeat, LockSlot, NodeInfo, NodeStats, StripeHeader, TenantConfig, TenantUsage,
    CHUNK_FREE, NODE_ALIVE, NODE_DEAD, NODE_FENCED, SLOT_LOCKED, SLOT_WAITING, TENANT_DROPPING, TENANT_FREE,
};
use cxlkv_core::pins::journal_census;
use cxlkv_core::store::{attach, Store};

use crate::error::Result;
use crate::flush::{Flush, FlushMode};
use crate::host::{pid_alive, Locality};
use crate::node::{check_store, stranded, Stranded};
pub use crate::region::LiveNode;
use crate::region::Region;

/// A formatted region seen by an observer (see the module documentation).
pub struct Observed {
    store: Store<Flush>,
    /// Keeps the mapping the store views.
    _region: Region,
}

impl Region {
    /// Reads the region's header and layout as an observer, with cache
    /// maintenance `mode`: fails as attaching would on an unformatted or
    /// corrupt region.
    pub fn observe(&self, mode: FlushMode) -> Result<Observed> {
        let store = attach(self.mapping().view(), Flush::new(mode, false)?)?;
        Ok(Observed { store, _region: self.clone() })
    }
}

/// What `cxlkv inspect` reports.
#[derive(Clone, Debug, Serialize)]
pub struct Inspection {
    /// Mapped size, bytes.
    pub region_size: u64,
    /// The format's creation id, in hex.
    pub creation_id: String,
    /// What the region was formatted with.
    pub capacities: CapacityReport,
    /// Space and pins.
    pub usage: UsageReport,
    /// Index entries by state.
    pub entries: EntryReport,
    /// Attached (or dead, unrecovered) nodes.
    pub nodes: Vec<NodeReport>,
    /// Lock slots held or waited for.
    pub locks: Vec<LockReport>,
    /// Tenants, the default one first.
    pub tenants: Vec<TenantReport>,
}

/// A tenant, its limits and what it holds.
#[derive(Clone, Debug, Serialize)]
pub struct TenantReport {
    /// Its name.
    pub name: String,
    /// Its slot in the tenant table.
    pub slot: u32,
    /// Being dropped.
    pub dropping: bool,
    /// Hard quota in payload bytes (0: none).
    pub quota: u64,
    /// Guaranteed share in payload bytes.
    pub share: u64,
    /// Relative weight.
    pub priority: u32,
    /// Payload bytes of its blocks being written or stored (counted from
    /// the entries).
    pub bytes: u64,
    /// Its blocks being written or stored.
    pub blocks: u64,
    /// Its blocks evicted (none counted for the default tenant).
    pub evictions: u64,
    /// Reserves refused at its hard quota.
    pub refused: u64,
    /// Lifetime of its blocks, milliseconds (0: none).
    pub ttl_ms: u64,
    /// Of its evictions, blocks removed past their lifetime.
    pub expired: u64,
}

/// Capacities and sizes of a formatted region.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CapacityReport {
    /// Node slots.
    pub max_nodes: u32,
    /// Index stripes.
    pub stripes: u32,
    /// Entries per stripe.
    pub entries_per_stripe: u32,
    /// Entries in all.
    pub entries: u64,
    /// Buckets per stripe.
    pub buckets_per_stripe: u32,
    /// Named roots.
    pub roots: u32,
    /// Pins per node.
    pub pin_slots: u32,
    /// Chunk size, bytes.
    pub chunk_size: u64,
    /// Payload chunks.
    pub chunks: u32,
    /// Global locks (core's and the application's).
    pub locks: u32,
    /// Application locks.
    pub app_locks: u32,
    /// Payload area, bytes.
    pub payload_bytes: u64,
    /// Everything before the payload area, bytes.
    pub metadata_bytes: u64,
}

/// Space in use.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct UsageReport {
    /// Chunks not free.
    pub chunks_used: u64,
    /// Their bytes.
    pub chunk_bytes_used: u64,
    /// Payload bytes of READY blocks.
    pub live_payload_bytes: u64,
    /// Pins held by every node.
    pub pins: u64,
    /// Evictions counted by the stripes.
    pub evictions: u64,
}

/// Entries by state.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct EntryReport {
    /// Free.
    pub empty: u64,
    /// Reserved, being written.
    pub writing: u64,
    /// Published.
    pub ready: u64,
    /// Being evicted.
    pub evicting: u64,
    /// Claimed by an evictor deciding.
    pub claimed: u64,
    /// Reservations of dead nodes not known quiet, kept allocated.
    pub quarantined: u64,
    /// Any other state word (only a corrupt region has them).
    pub invalid: u64,
}

/// One node slot in use.
#[derive(Clone, Debug, Serialize)]
pub struct NodeReport {
    /// Node id.
    pub id: u32,
    /// Process id (in its PID namespace).
    pub pid: u32,
    /// Its host id, in hex.
    pub host_id: String,
    /// What this process can tell of its liveness.
    pub liveness: &'static str,
    /// Heartbeat counter.
    pub heartbeat: u64,
    /// Attach count of the slot.
    pub incarnation: u64,
    /// Pins held.
    pub pins: u32,
    /// Reservations held.
    pub reservations: u32,
    /// Its counters.
    #[serde(flatten)]
    pub counters: NodeCounters,
}

/// A node's counters (core's `NodeStats`), reported by the names of its
/// counter table (`NodeStats::COUNTERS`); reads as the struct.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeCounters(pub NodeStats);

impl std::ops::Deref for NodeCounters {
    type Target = NodeStats;
    fn deref(&self) -> &NodeStats {
        &self.0
    }
}

impl From<NodeStats> for NodeCounters {
    fn from(s: NodeStats) -> NodeCounters {
        NodeCounters(s)
    }
}

impl Serialize for NodeCounters {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(NodeStats::COUNTERS.len()))?;
        for (name, v) in self.0.counters() {
            m.serialize_entry(name, &v)?;
        }
        m.end()
    }
}

/// One lock slot held or waited for.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LockReport {
    /// Lock id.
    pub lock: u32,
    /// Node of the slot.
    pub node: u32,
    /// `held` or `waiting`.
    pub state: &'static str,
    /// Grant sequence.
    pub seq: u64,
}

impl Observed {
    /// The store observed.
    pub(crate) fn store(&self) -> &Store<Flush> {
        &self.store
    }

    /// A feed of the region's block events (see [`crate::events`]).
    pub fn feed(&self) -> crate::events::Feed<'_> {
        crate::events::Feed::new(&self.store)
    }

    /// Every finding of the region's invariants (empty: clean).
    pub fn check(&self) -> Result<Vec<Finding>> {
        check_store(&self.store)
    }

    /// Findings of the SSD tier of this host on `dirs` (slot files of
    /// slots holding `slot_bytes`): see [`crate::tier::check_slots`].
    pub fn check_tier(&self, dirs: &[std::path::PathBuf], slot_bytes: u64) -> Result<Vec<String>> {
        crate::tier::check_slots(&self.store, dirs, slot_bytes)
    }

    /// Nodes whose process is gone or that were declared dead, with what
    /// they hold (a recovery reclaims it).
    pub fn stranded(&self) -> Result<Vec<Stranded>> {
        stranded(&self.store)
    }

    /// Nodes that may still be running: ALIVE slots whose process this
    /// host can probe and finds running (stopped processes included), and
    /// ALIVE slots it cannot probe (another host or PID namespace) whose
    /// heartbeat moves within `wait`. A format must not go on under them.
    pub fn live_nodes(&self, wait: std::time::Duration) -> Result<Vec<LiveNode>> {
        let store = &self.store;
        let l = &store.layout;
        let me = Locality::here();
        let mut live = Vec::new();
        let mut watched = Vec::new();
        for n in 0..l.caps.max_nodes {
            let info: NodeInfo = store.fresh_state_first(l.node_info(n), Site("platform.live"))?;
            if info.state != NODE_ALIVE {
                continue;
            }
            let node = LiveNode { id: n, pid: info.pid, host_id: format!("{:016x}", info.host_id), how: "running" };
            if me.can_probe(&info) {
                if pid_alive(info.pid) {
                    live.push(node);
                }
                continue;
            }
            let hb: Heartbeat = store.fresh(l.heartbeat(n), Site("platform.live.beat"))?;
            watched.push((node, hb.beat));
        }
        let t0 = std::time::Instant::now();
        while !watched.is_empty() {
            let mut i = 0;
            while i < watched.len() {
                let hb: Heartbeat = store.fresh(l.heartbeat(watched[i].0.id), Site("platform.live.beat"))?;
                if hb.beat != watched[i].1 {
                    let (mut node, _) = watched.swap_remove(i);
                    node.how = "heartbeat moving";
                    live.push(node);
                } else {
                    i += 1;
                }
            }
            if t0.elapsed() >= wait {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        live.sort_by_key(|n| n.id);
        Ok(live)
    }

    /// What the region holds.
    pub fn inspect(&self) -> Result<Inspection> {
        let store = &self.store;
        let l = &store.layout;
        let me = Locality::here();
        let mut nodes = Vec::new();
        let mut pinned = 0u64;
        for n in 0..l.caps.max_nodes {
            let info: NodeInfo = store.fresh_state_first(l.node_info(n), Site("platform.inspect"))?;
            if info.state == 0 {
                continue;
            }
            let hb: Heartbeat = store.view.read(l.heartbeat(n))?;
            let st: NodeStats = store.view.read(l.node_stats(n))?;
            let liveness = match info.state {
                NODE_DEAD => "dead (recovery pending)",
                NODE_FENCED => "fenced (declared dead; its reservations kept until it is quiet)",
                NODE_ALIVE if me.can_probe(&info) && !pid_alive(info.pid) => "gone (process exited)",
                NODE_ALIVE if me.can_probe(&info) => "alive",
                NODE_ALIVE if info.host_id == me.host => "alive (this host, another PID namespace)",
                NODE_ALIVE => "alive (remote host)",
                _ => "unknown",
            };
            let held = journal_census(store, n, Site("platform.inspect.journal"))?;
            pinned += held.pins as u64;
            nodes.push(NodeReport {
                id: n,
                pid: info.pid,
                host_id: format!("{:016x}", info.host_id),
                liveness,
                heartbeat: hb.beat,
                incarnation: info.incarnation,
                pins: held.pins,
                reservations: held.reservations,
                counters: st.into(),
            });
        }
        let mut by_state = [0u64; 7];
        let (mut live_bytes, mut evictions) = (0u64, 0u64);
        let mut tenants = self.tenant_reports()?;
        for s in 0..l.caps.n_stripes {
            let h: StripeHeader = store.view.read(l.stripe(s))?;
            evictions += h.evictions;
            for e in 0..l.caps.entries_per_stripe {
                let ent: Entry = store.view.read(l.entry(s, e))?;
                by_state[(ent.state as usize).min(6)] += 1;
                if ent.state == state::READY {
                    live_bytes += ent.payload_len as u64;
                }
                if matches!(ent.state, state::WRITING | state::READY | state::CLAIMED | state::QUARANTINED) {
                    let slot = self.tenant_slot_of(ent.ns)?;
                    let at = tenants.iter().position(|t| t.slot == slot).unwrap_or(0);
                    if let Some(t) = tenants.get_mut(at) {
                        t.bytes += ent.payload_len as u64;
                        t.blocks += 1;
                    }
                }
            }
        }
        let (mut chunks_used, mut chunk_bytes) = (0u64, 0u64);
        for c in 0..l.n_chunks {
            let r: ChunkRecord = store.view.read(l.chunk(c))?;
            if r.kind != CHUNK_FREE {
                chunks_used += 1;
                chunk_bytes += l.chunk_size();
            }
        }
        let locks = self.lock_reports()?;
        Ok(Inspection {
            region_size: l.region_size,
            creation_id: format!("{:016x}", store.creation_id),
            capacities: CapacityReport {
                max_nodes: l.caps.max_nodes,
                stripes: l.caps.n_stripes,
                entries_per_stripe: l.caps.entries_per_stripe,
                entries: l.caps.n_stripes as u64 * l.caps.entries_per_stripe as u64,
                buckets_per_stripe: l.buckets_per_stripe,
                roots: l.caps.n_roots,
                pin_slots: l.caps.pin_slots,
                chunk_size: l.chunk_size(),
                chunks: l.n_chunks,
                locks: l.n_locks,
                app_locks: l.caps.app_locks,
                payload_bytes: l.payload.len(),
                metadata_bytes: l.payload.start,
            },
            usage: UsageReport {
                chunks_used,
                chunk_bytes_used: chunk_bytes,
                live_payload_bytes: live_bytes,
                pins: pinned,
                evictions,
            },
            entries: EntryReport {
                empty: by_state[state::EMPTY as usize],
                writing: by_state[state::WRITING as usize],
                ready: by_state[state::READY as usize],
                evicting: by_state[state::EVICTING as usize],
                claimed: by_state[state::CLAIMED as usize],
                quarantined: by_state[state::QUARANTINED as usize],
                invalid: by_state[6],
            },
            nodes,
            locks,
            tenants,
        })
    }

    /// Every live tenant's slot as its lines show it (usage counted later
    /// from the entries).
    fn tenant_reports(&self) -> Result<Vec<TenantReport>> {
        let store = &self.store;
        let l = &store.layout;
        let mut out = Vec::new();
        for t in 0..l.caps.max_tenants {
            let c: TenantConfig = store.view.read(l.tenant_config(t))?;
            if c.state == TENANT_FREE {
                continue;
            }
            let u: TenantUsage = store.view.read(l.tenant_usage(t))?;
            let n = c.name.iter().position(|&b| b == 0).unwrap_or(c.name.len());
            out.push(TenantReport {
                name: String::from_utf8_lossy(&c.name[..n]).into_owned(),
                slot: t,
                dropping: c.state == TENANT_DROPPING,
                quota: c.quota,
                share: c.share,
                priority: c.priority,
                bytes: 0,
                blocks: 0,
                evictions: u.evictions,
                refused: u.refused,
                ttl_ms: c.ttl_ms,
                expired: u.expired,
            });
        }
        Ok(out)
    }

    /// The tenant slot an entry's namespace id belongs to (0: the default
    /// tenant's, or a tenant no longer there).
    fn tenant_slot_of(&self, ns: u32) -> Result<u32> {
        let store = &self.store;
        let l = &store.layout;
        let Some(i) = ns.checked_sub(cxlkv_core::namespaces::REGISTERED).filter(|&i| i < l.caps.n_roots) else {
            return Ok(0);
        };
        let r: cxlkv_core::layout::RootRecord = store.view.read(l.root(i))?;
        let Some((_, t)) = cxlkv_core::namespaces::binding_of(&r) else { return Ok(0) };
        if t.slot == 0 || t.slot >= l.caps.max_tenants {
            return Ok(0);
        }
        let c: TenantConfig = store.view.read(l.tenant_config(t.slot))?;
        Ok(if c.state != TENANT_FREE && c.nonce == t.nonce { t.slot } else { 0 })
    }

    /// Every lock slot that holds or waits for its lock.
    fn lock_reports(&self) -> Result<Vec<LockReport>> {
        let store = &self.store;
        let l = &store.layout;
        let mut locks = Vec::new();
        for lock in 0..l.n_locks {
            for n in 0..l.caps.max_nodes {
                let s: LockSlot = store.view.read(l.lock_slot(lock, n))?;
                if s.state == SLOT_LOCKED || s.state == SLOT_WAITING {
                    let st = if s.state == SLOT_LOCKED { "held" } else { "waiting" };
                    locks.push(LockReport { lock, node: n, state: st, seq: s.seq });
                }
            }
        }
        Ok(locks)
    }
}
