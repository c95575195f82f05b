//! `cxlkv inspect`: what a region holds, read without attaching a node
//! (platform's [`Observed::inspect`](cxlkv_platform::inspect::Observed)).

use cxlkv_platform::inspect::Inspection;
use cxlkv_platform::size::human;

/// Prints the report for people.
pub fn print_human(r: &Inspection) {
    let (c, u, e) = (&r.capacities, &r.usage, &r.entries);
    println!("region      {} (created {})", human(r.region_size), r.creation_id);
    println!(
        "capacity    {} nodes, {} stripes x {} entries, {} chunks of {}, {} payload",
        c.max_nodes,
        c.stripes,
        c.entries_per_stripe,
        c.chunks,
        human(c.chunk_size),
        human(c.payload_bytes)
    );
    println!(
        "usage       {} of {} chunks, {} live payload, {} pins held, {} evictions",
        u.chunks_used,
        c.chunks,
        human(u.live_payload_bytes),
        u.pins,
        u.evictions
    );
    println!(
        "entries     {} ready, {} writing, {} evicting, {} empty{}",
        e.ready,
        e.writing,
        e.evicting,
        e.empty,
        if e.invalid > 0 { format!(", {} invalid", e.invalid) } else { String::new() }
    );
    println!("nodes       {}", r.nodes.len());
    for x in &r.nodes {
        println!(
            "  node {:>2}  pid {:>7}  {:<24} beat {:>8}  hits {} misses {} inserts {} evictions {}",
            x.id,
            x.pid,
            x.liveness,
            x.heartbeat,
            x.counters.hits,
            x.counters.misses,
            x.counters.inserts,
            x.counters.evictions
        );
    }
    println!("tenants     {}", r.tenants.len());
    for t in &r.tenants {
        let quota = if t.quota == 0 { "no quota".to_string() } else { format!("quota {}", human(t.quota)) };
        let life = if t.ttl_ms == 0 { String::new() } else { format!(", lifetime {} ms", t.ttl_ms) };
        println!(
            "  {:<20}  {}, share {}{}  holds {} in {} blocks  {} evictions ({} expired)  {} refused{}",
            t.name,
            quota,
            human(t.share),
            life,
            human(t.bytes),
            t.blocks,
            t.evictions,
            t.expired,
            t.refused,
            if t.dropping { "  (dropping)" } else { "" }
        );
    }
    println!("locks       {} held or waited for", r.locks.len());
    for x in &r.locks {
        println!("  lock {:>4}  node {:>2}  {}  seq {}", x.lock, x.node, x.state, x.seq);
    }
}
