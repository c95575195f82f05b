//! `cxlkv inspect`: what a region holds, read without attaching a node.

use cxlkv_core::coherence::Coherence;
use cxlkv_core::layout::{
    state, ChunkRecord, Heartbeat, LockSlot, NodeInfo, NodeStats, StripeHeader, CHUNK_FREE, NODE_ALIVE, NODE_DEAD,
    SLOT_LOCKED, SLOT_WAITING,
};
use cxlkv_core::region::Store;
use cxlkv_platform::host::{pid_alive, Locality};
use cxlkv_platform::size::human;
use serde_json::{json, Value};

/// Builds the inspection report of `store`.
pub fn report<C: Coherence>(store: &Store<C>) -> cxlkv_core::Result<Value> {
    let l = &store.layout;
    let me = Locality::here();
    let mut nodes = Vec::new();
    let mut pinned = 0u64;
    for n in 0..l.caps.max_nodes {
        let info: NodeInfo = store.fresh_state_first(l.node_info(n), cxlkv_core::coherence::Site("cli.inspect"))?;
        if info.state == 0 {
            continue;
        }
        let hb: Heartbeat = store.region.read(l.heartbeat(n))?;
        let st: NodeStats = store.region.read(l.node_stats(n))?;
        let liveness = match info.state {
            NODE_DEAD => "dead (recovery pending)",
            NODE_ALIVE if me.can_probe(&info) && !pid_alive(info.pid) => "gone (process exited)",
            NODE_ALIVE if me.can_probe(&info) => "alive",
            NODE_ALIVE if info.host_id == me.host => "alive (this host, another PID namespace)",
            NODE_ALIVE => "alive (remote host)",
            _ => "unknown",
        };
        let held = cxlkv_core::pins::journal_census(store, n, cxlkv_core::coherence::Site("cli.inspect.journal"))?;
        pinned += held.pins as u64;
        nodes.push(json!({
            "pins": held.pins, "reservations": held.reservations,
            "id": n, "pid": info.pid, "host_id": format!("{:016x}", info.host_id), "liveness": liveness,
            "heartbeat": hb.beat, "incarnation": info.incarnation,
            "hits": st.hits, "misses": st.misses, "inserts": st.inserts, "exists": st.exists,
            "evictions": st.evictions, "bytes_written": st.bytes_written, "bytes_read": st.bytes_read,
        }));
    }
    let mut by_state = [0u64; 6];
    let (mut live_bytes, mut evictions) = (0u64, 0u64);
    for s in 0..l.caps.n_stripes {
        let h: StripeHeader = store.region.read(l.stripe(s))?;
        evictions += h.evictions;
        for e in 0..l.caps.entries_per_stripe {
            let ent: cxlkv_core::layout::Entry = store.region.read(l.entry(s, e))?;
            by_state[(ent.state as usize).min(5)] += 1;
            if ent.state == state::READY {
                live_bytes += ent.payload_len as u64;
            }
        }
    }
    let (mut chunks_used, mut chunk_bytes) = (0u64, 0u64);
    for c in 0..l.n_chunks {
        let r: ChunkRecord = store.region.read(l.chunk(c))?;
        if r.kind != CHUNK_FREE {
            chunks_used += 1;
            chunk_bytes += l.chunk_size();
        }
    }
    let mut locks = Vec::new();
    for lock in 0..l.n_locks {
        for n in 0..l.caps.max_nodes {
            let s: LockSlot = store.region.read(l.lock_slot(lock, n))?;
            if s.state == SLOT_LOCKED || s.state == SLOT_WAITING {
                let st = if s.state == SLOT_LOCKED { "held" } else { "waiting" };
                locks.push(json!({"lock": lock, "node": n, "state": st, "seq": s.seq}));
            }
        }
    }
    Ok(json!({
        "region_size": l.region_size,
        "creation_id": format!("{:016x}", store.creation_id),
        "capacities": {
            "max_nodes": l.caps.max_nodes, "stripes": l.caps.n_stripes,
            "entries_per_stripe": l.caps.entries_per_stripe, "entries": l.caps.n_stripes as u64 * l.caps.entries_per_stripe as u64,
            "buckets_per_stripe": l.buckets_per_stripe, "roots": l.caps.n_roots, "pin_slots": l.caps.pin_slots,
            "chunk_size": l.chunk_size(), "chunks": l.n_chunks, "locks": l.n_locks, "app_locks": l.caps.app_locks,
            "payload_bytes": l.payload.len(), "metadata_bytes": l.payload.start,
        },
        "usage": {
            "chunks_used": chunks_used, "chunk_bytes_used": chunk_bytes, "live_payload_bytes": live_bytes,
            "pins": pinned, "evictions": evictions,
        },
        "entries": {
            "empty": by_state[state::EMPTY as usize], "writing": by_state[state::WRITING as usize],
            "ready": by_state[state::READY as usize], "evicting": by_state[state::EVICTING as usize],
            "claimed": by_state[state::CLAIMED as usize], "invalid": by_state[5],
        },
        "nodes": nodes,
        "locks": locks,
    }))
}

/// Prints the report for people.
pub fn print_human(r: &Value) {
    let c = &r["capacities"];
    let u = &r["usage"];
    let e = &r["entries"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    println!("region      {} (created {})", human(n(&r["region_size"])), r["creation_id"].as_str().unwrap_or("?"));
    println!(
        "capacity    {} nodes, {} stripes x {} entries, {} chunks of {}, {} payload",
        n(&c["max_nodes"]),
        n(&c["stripes"]),
        n(&c["entries_per_stripe"]),
        n(&c["chunks"]),
        human(n(&c["chunk_size"])),
        human(n(&c["payload_bytes"]))
    );
    println!(
        "usage       {} of {} chunks, {} live payload, {} pins held, {} evictions",
        n(&u["chunks_used"]),
        n(&c["chunks"]),
        human(n(&u["live_payload_bytes"])),
        n(&u["pins"]),
        n(&u["evictions"])
    );
    println!(
        "entries     {} ready, {} writing, {} evicting, {} empty{}",
        n(&e["ready"]),
        n(&e["writing"]),
        n(&e["evicting"]),
        n(&e["empty"]),
        if n(&e["invalid"]) > 0 { format!(", {} invalid", n(&e["invalid"])) } else { String::new() }
    );
    let nodes = r["nodes"].as_array().cloned().unwrap_or_default();
    println!("nodes       {}", nodes.len());
    for x in &nodes {
        println!(
            "  node {:>2}  pid {:>7}  {:<24} beat {:>8}  hits {} misses {} inserts {} evictions {}",
            n(&x["id"]),
            n(&x["pid"]),
            x["liveness"].as_str().unwrap_or("?"),
            n(&x["heartbeat"]),
            n(&x["hits"]),
            n(&x["misses"]),
            n(&x["inserts"]),
            n(&x["evictions"])
        );
    }
    let locks = r["locks"].as_array().cloned().unwrap_or_default();
    println!("locks       {} held or waited for", locks.len());
    for x in &locks {
        println!(
            "  lock {:>4}  node {:>2}  {}  seq {}",
            n(&x["lock"]),
            n(&x["node"]),
            x["state"].as_str().unwrap_or("?"),
            n(&x["seq"])
        );
    }
}
