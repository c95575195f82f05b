//! `cxlkv top`: a live view of a region, read without attaching a node —
//! the region's occupancy, then one line per node with its state and what
//! it did during the last interval (operations, hit rate, bytes in and
//! out, evictions, lock grants and their wait, inbox depth, pins).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use cxlkv_platform::inspect::Observed;
use cxlkv_platform::metrics::{NodeMetrics, RegionMetrics};
use cxlkv_platform::size::human;

/// One frame: the region now, and each node's rates over the `dt` seconds
/// since `before` (a node missing from `before` is counted from zero).
pub fn frame(before: &RegionMetrics, now: &RegionMetrics, dt: f64) -> String {
    let dt = dt.max(1e-3);
    let mut out = String::new();
    let pct = |a: u64, b: u64| if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 };
    let _ = writeln!(
        out,
        "region  {} live blocks ({:.1}% of entries), {} of {} payload ({:.1}%), {} of {} chunks, {} evictions ({:.0}/s)",
        now.live_blocks,
        pct(now.live_blocks, now.capacity_blocks),
        human(now.live_bytes),
        human(now.capacity_bytes),
        pct(now.live_bytes, now.capacity_bytes),
        now.chunks_used,
        now.chunks,
        now.evictions,
        now.evictions.saturating_sub(before.evictions) as f64 / dt
    );
    if !now.tier_blocks.is_empty() {
        let tiers: Vec<String> = now.tier_blocks.iter().map(|(n, b)| format!("node {n}: {b} blocks")).collect();
        let _ = writeln!(out, "tiers   {}", tiers.join(", "));
    }
    let _ = writeln!(
        out,
        "{:>4} {:>8} {:<6} {:>9} {:>6} {:>10} {:>10} {:>8} {:>8} {:>9} {:>6} {:>5}",
        "node",
        "pid",
        "state",
        "ops/s",
        "hit%",
        "read/s",
        "written/s",
        "evict/s",
        "locks/s",
        "lock wait",
        "inbox",
        "pins"
    );
    for n in &now.nodes {
        // The same node in the previous snapshot (a new attachment of the
        // slot, or none: counted from zero).
        let b = before.nodes.iter().find(|b| b.id == n.id && b.pid == n.pid);
        let d = |f: fn(&NodeMetrics) -> u64| f(n).saturating_sub(b.map_or(0, f));
        let hits = d(|m| m.counters.hits);
        let misses = d(|m| m.counters.misses);
        let ops = hits + misses + d(|m| m.counters.inserts) + d(|m| m.counters.exists);
        let grants = d(|m| m.lock_grants);
        let wait = (n.lock_wait_seconds - b.map_or(0.0, |b| b.lock_wait_seconds)).max(0.0);
        let per_grant = if grants == 0 { "-".to_string() } else { format!("{:.1}us", wait * 1e6 / grants as f64) };
        let hit = if hits + misses == 0 { "-".to_string() } else { format!("{:.1}", pct(hits, hits + misses)) };
        let _ = writeln!(
            out,
            "{:>4} {:>8} {:<6} {:>9.0} {:>6} {:>10} {:>10} {:>8.0} {:>8.0} {:>9} {:>6} {:>5}",
            n.id,
            n.pid,
            n.state,
            ops as f64 / dt,
            hit,
            human((d(|m| m.counters.bytes_read) as f64 / dt) as u64),
            human((d(|m| m.counters.bytes_written) as f64 / dt) as u64),
            d(|m| m.counters.evictions) as f64 / dt,
            grants as f64 / dt,
            per_grant,
            n.inbox_messages,
            n.pins
        );
    }
    if now.nodes.is_empty() {
        let _ = writeln!(out, "(no node attached)");
    }
    out
}

/// Prints a frame every `interval` (clearing the terminal first when stdout
/// is one) until `stop` says so, or once (`once`: two snapshots `interval`
/// apart, for scripts).
pub fn run(observed: &Observed, interval: Duration, once: bool, stop: &dyn Fn(Duration) -> bool) -> Result<(), String> {
    use std::io::{IsTerminal, Write};
    let tty = std::io::stdout().is_terminal() && !once;
    let mut before = observed.metrics().map_err(|e| e.to_string())?;
    let mut at = Instant::now();
    loop {
        if stop(interval) {
            return Ok(());
        }
        let now = observed.metrics().map_err(|e| e.to_string())?;
        let t = Instant::now();
        let text = frame(&before, &now, t.duration_since(at).as_secs_f64());
        let mut out = std::io::stdout().lock();
        if tty {
            let _ = write!(out, "\x1b[H\x1b[2J");
        }
        let _ = write!(out, "{text}");
        if !tty && !once {
            let _ = writeln!(out);
        }
        let _ = out.flush();
        if once {
            return Ok(());
        }
        (before, at) = (now, t);
    }
}
