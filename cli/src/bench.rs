//! `cxlkv bench`: per-block cost of the cache operations in one process, for
//! each coherence mode this CPU has. Numbers, not pass/fail.

use std::time::{Duration, Instant};

use cxlkv_core::hash::{mix64, Key};
use cxlkv_core::index::{Handle, ReserveItem};
use cxlkv_core::layout::Capacities;
use cxlkv_core::Error;
use cxlkv_platform::{Cache, FlushMode, Options};
use serde_json::{json, Value};

/// Settings of one bench run.
pub struct Config {
    /// Modes to measure.
    pub modes: Vec<FlushMode>,
    /// Blocks per operation batch measured (the key chain length).
    pub blocks: usize,
    /// Payload bytes per block for the write/read rows.
    pub block_bytes: usize,
}

fn key(i: u64) -> Key {
    Key { lo: mix64(i + 1), hi: i }
}

fn per_block(t: Duration, n: usize) -> f64 {
    t.as_secs_f64() * 1e9 / n.max(1) as f64
}

fn one_mode(mode: FlushMode, cfg: &Config) -> Result<Vec<(&'static str, f64)>, cxlkv_platform::Error> {
    let path = std::path::PathBuf::from(format!("/dev/shm/cxlkv-bench-{}-{}", std::process::id(), mode.name()));
    let n = cfg.blocks;
    let entries = (n as u32 * 2).next_power_of_two().max(1024);
    let caps =
        Capacities { max_nodes: 4, n_stripes: 16, entries_per_stripe: entries / 16 * 2, ..Capacities::default() };
    let size = (n * cfg.block_bytes * 2 + (256 << 20)) as u64;
    let opts = Options { mode, ..Options::default() };
    let cache = Cache::create(&path, size, caps, opts)?;
    let _cleanup = Cleanup(path);
    // Measure the protocol, not first-touch page faults of fresh shm pages.
    cache.prefault()?;
    let node = cache.node();
    let mut rows = Vec::new();
    let ns = 1;
    let keys: Vec<Key> = (0..n as u64).map(key).collect();
    let payload = vec![0xa5u8; cfg.block_bytes];

    // reserve + write + publish, one block per call.
    let t = Instant::now();
    for k in &keys[..n / 2] {
        let h = node.reserve(ns, *k, cfg.block_bytes as u64, 16)?;
        node.write(&h, 0, &payload)?;
        node.publish_flushed(&[h], &mut [Ok(())])?;
    }
    rows.push(("reserve+write+publish (single)", per_block(t.elapsed(), n / 2)));
    // The same, batched.
    let items: Vec<ReserveItem> =
        keys[n / 2..].iter().map(|k| ReserveItem { key: *k, len: cfg.block_bytes as u64, tokens: 16 }).collect();
    let mut out: Vec<Result<Handle, Error>> = vec![Err(Error::InvalidArgument); items.len()];
    let t = Instant::now();
    for (its, o) in items.chunks(64).zip(out.chunks_mut(64)) {
        node.reserve_batch(ns, its, o)?;
        let hs: Vec<Handle> = o.iter().filter_map(|r| r.ok()).collect();
        for h in &hs {
            node.write(h, 0, &payload)?;
        }
        node.publish_flushed(&hs, &mut vec![Ok(()); hs.len()])?;
    }
    rows.push(("reserve+write+publish (batch 64)", per_block(t.elapsed(), items.len())));

    // Lookup of the whole chain.
    let reps = 5;
    let t = Instant::now();
    for _ in 0..reps {
        let got = node.lookup(ns, &keys)?;
        assert_eq!(got, n, "every block was published");
    }
    rows.push(("lookup (chain)", per_block(t.elapsed(), n * reps)));

    // acquire + release, single and batched.
    let m = n.min(2048);
    let t = Instant::now();
    for k in &keys[..m] {
        let mut o = [Err(Error::InvalidArgument)];
        node.acquire(ns, std::slice::from_ref(k), &mut o)?;
        node.release(&[o[0]?])?;
    }
    rows.push(("acquire+release (single)", per_block(t.elapsed(), m)));
    let t = Instant::now();
    for ks in keys.chunks(64) {
        let mut o = vec![Err(Error::InvalidArgument); ks.len()];
        node.acquire(ns, ks, &mut o)?;
        let hs: Vec<Handle> = o.iter().filter_map(|r| r.ok()).collect();
        node.release(&hs)?;
    }
    rows.push(("acquire+release (batch 64)", per_block(t.elapsed(), n)));

    // Copying get (validated, no pin).
    let mut buf = vec![0u8; cfg.block_bytes];
    let t = Instant::now();
    for k in &keys[..m] {
        node.get(ns, *k, &mut buf)?;
    }
    rows.push(("get (copy, validated)", per_block(t.elapsed(), m)));

    // Uncontended global lock.
    let t = Instant::now();
    for _ in 0..m {
        let h = node.lock(0)?;
        node.unlock(h)?;
    }
    rows.push(("lock+unlock (uncontended)", per_block(t.elapsed(), m)));
    cache.close()?;
    Ok(rows)
}

struct Cleanup(std::path::PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs the benchmark and returns its report.
pub fn run(cfg: &Config) -> Result<Value, cxlkv_platform::Error> {
    let mut modes = Vec::new();
    for &mode in &cfg.modes {
        let rows = one_mode(mode, cfg)?;
        modes.push(json!({
            "mode": mode.name(),
            "rows": rows.iter().map(|(k, v)| json!({"op": k, "ns_per_block": (v * 10.0).round() / 10.0})).collect::<Vec<_>>(),
        }));
    }
    Ok(json!({"blocks": cfg.blocks, "block_bytes": cfg.block_bytes, "modes": modes}))
}

/// Prints the report as a table: one row per operation, one column per mode.
pub fn print_table(r: &Value) {
    let modes = r["modes"].as_array().cloned().unwrap_or_default();
    println!(
        "per-block cost, ns ({} blocks of {} bytes, one process, /dev/shm)",
        r["blocks"].as_u64().unwrap_or(0),
        r["block_bytes"].as_u64().unwrap_or(0)
    );
    print!("{:<34}", "operation");
    for m in &modes {
        print!("{:>12}", m["mode"].as_str().unwrap_or("?"));
    }
    println!();
    let nrows = modes.first().and_then(|m| m["rows"].as_array().map(Vec::len)).unwrap_or(0);
    for i in 0..nrows {
        print!("{:<34}", modes[0]["rows"][i]["op"].as_str().unwrap_or("?"));
        for m in &modes {
            print!("{:>12.0}", m["rows"][i]["ns_per_block"].as_f64().unwrap_or(f64::NAN));
        }
        println!();
    }
}
