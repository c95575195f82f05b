//! `cxlkv bench`: what each piece of the data path costs, for each coherence
//! mode this CPU has, each measured beside a same-run reference (a plain
//! store, the coherent mode, a single-thread memcpy) so results read as
//! ratios. Numbers, not pass/fail.
//!
//! - flush cost per line of each primitive against a plain store;
//! - QD1 copying puts through `Node::put` of 16 KiB, 256 KiB and 2 MiB
//!   blocks over the working set, with the mode's default payload stores
//!   and with plain stores + flush, beside a same-run memcpy;
//! - per-block cost of the cache operations in one process (a 8192-block,
//!   128K-token key chain by default), through the calls the C API makes
//!   (`Node::get`, `Node::acquire_views`, ...);
//! - between two processes: QD1 `Node::get` of blocks of 16 KiB, 256 KiB
//!   and 2 MiB in random order over a working set of 4x the last-level
//!   cache (at least 512 MiB), by a reader whose page tables start empty
//!   (cold) and again (warm), against same-run memcpys of data as cold (a
//!   freshly mapped file) and as warm (a faulted-in pool); handoff latency
//!   and RPC round trip through the inboxes; lock+unlock from a process
//!   other than the manager's beside the cost of waking a sleeping thread
//!   of another process, and with two processes contending.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use cxlkv_platform::coherence::{Coherence, Site};
use cxlkv_platform::kv::Capacities;
use cxlkv_platform::kv::CoreError as Error;
use cxlkv_platform::kv::Key;
use cxlkv_platform::kv::{Handle, ReserveItem};
use cxlkv_platform::{Flush, FlushMode, GetItem, Mapping, Node, Options, PayloadStores, PutItem};

mod peers;
mod report;
mod table;

pub use peers::peer_main;
use peers::{cross_process, key, quantile, working_set, Cleanup, GET_SIZES};
pub use report::*;
pub use table::print_table;

/// Settings of one bench run.
pub struct Config {
    /// Modes to measure.
    pub modes: Vec<FlushMode>,
    /// Blocks per operation batch measured (the key chain length).
    pub blocks: usize,
    /// Payload bytes per block for the write/read rows.
    pub block_bytes: usize,
    /// Fewer repetitions (a smoke run).
    pub quick: bool,
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
    let attached = Node::create(&path, size, caps, opts)?;
    let _cleanup = Cleanup(path);
    // Measure the protocol, not first-touch page faults of fresh shm pages.
    attached.prefault()?;
    let node = attached.core();
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
    let reps = 50;
    let t = Instant::now();
    for _ in 0..reps {
        let got = node.lookup(ns, &keys)?;
        assert_eq!(got, n, "every block was published");
    }
    rows.push(("lookup (key chain, per block)", per_block(t.elapsed(), n * reps)));

    // acquire + release, single and batched, as `cxlkv_acquire` does it
    // (all or none, each payload made fresh for the caller's views).
    let m = n.min(2048);
    let t = Instant::now();
    for k in &keys[..m] {
        let mut o = [Err(Error::InvalidArgument)];
        attached.acquire_views(ns, std::slice::from_ref(k), &mut o)?;
        node.release(&[o[0]?])?;
    }
    rows.push(("acquire+release (single)", per_block(t.elapsed(), m)));
    let t = Instant::now();
    for ks in keys.chunks(64) {
        let mut o = vec![Err(Error::InvalidArgument); ks.len()];
        attached.acquire_views(ns, ks, &mut o)?;
        let hs: Vec<Handle> = o.iter().filter_map(|r| r.ok()).collect();
        node.release(&hs)?;
    }
    rows.push(("acquire+release (batch 64)", per_block(t.elapsed(), n)));

    // Copying get (validated, no pin), as `cxlkv_get` does it.
    let mut buf = vec![0u8; cfg.block_bytes];
    let t = Instant::now();
    for k in &keys[..m] {
        let mut parts = [&mut buf[..]];
        let mut items = [GetItem { key: *k, parts: &mut parts }];
        let (mut lens, mut res) = ([0u64], [Ok(())]);
        attached.get(ns, &mut items, &mut lens, &mut res)?;
        res[0]?;
    }
    rows.push(("get (copy, validated)", per_block(t.elapsed(), m)));

    // Uncontended global lock.
    rows.push(("lock+unlock (uncontended)", lock_loop(&attached, m)?));

    // Every block of the namespace removed, as an engine's clear does (an
    // eviction that picks them: entries removed, blocks freed in runs).
    let t = Instant::now();
    let (cleared, _) = attached.clear_namespaces(&[ns])?;
    rows.push(("clear_namespaces (per block)", per_block(t.elapsed(), cleared as usize)));
    attached.close()?;

    // The same in a region formatted for 64 nodes and 256 locks: a grant's
    // cost should not grow with either.
    let wide = std::path::PathBuf::from(format!("/dev/shm/cxlkv-bench-w-{}-{}", std::process::id(), mode.name()));
    // 256 locks, the most a region has: one tenant slot (the default
    // tenant's) leaves room for 61 application locks.
    let caps = Capacities { max_nodes: 64, n_stripes: 64, app_locks: 61, max_tenants: 1, ..Capacities::default() };
    let attached = Node::create(&wide, 256 << 20, caps, Options { mode, ..Options::default() })?;
    let _cleanup_wide = Cleanup(wide);
    // The first grant waits for the new region's manager to settle.
    lock_loop(&attached, 1)?;
    rows.push(("lock+unlock (uncontended, 64 nodes, 256 locks)", lock_loop(&attached, m)?));
    attached.close()?;
    Ok(rows)
}

/// Takes and releases lock 0 `m` times; ns per lock+unlock.
fn lock_loop(attached: &Node, m: usize) -> Result<f64, cxlkv_platform::Error> {
    let node = attached.core();
    let t = Instant::now();
    for _ in 0..m {
        let h = node.lock(0)?;
        node.unlock(h)?;
    }
    Ok(per_block(t.elapsed(), m))
}

/// Runs the benchmark and returns its report.
pub fn run(cfg: &Config) -> Result<Report, cxlkv_platform::Error> {
    let flush = flush_costs(cfg.quick)?;
    let checker = checker_rows(cfg.quick);
    let mut modes = Vec::new();
    for &mode in &cfg.modes {
        let rows = one_mode(mode, cfg)?;
        let put = GET_SIZES.iter().map(|&size| puts(mode, size, working_set(cfg.quick))).collect::<Result<_, _>>()?;
        let cross_process = cross_process(mode, cfg.quick)?;
        let rows = rows.into_iter().map(|(op, v)| OpRow { op, ns_per_block: (v * 10.0).round() / 10.0 }).collect();
        modes.push(ModeReport { mode: mode.name(), rows, put, cross_process });
    }
    let unix_time = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    Ok(Report { unix_time, blocks: cfg.blocks, block_bytes: cfg.block_bytes, flush, checker, modes })
}

/// The demo's payload checker (`pattern::fill`, `pattern::verify`) against a
/// same-run memcpy, 2 MiB blocks over 64 MiB (a verify as slow as a copy
/// per word once made the demo measure its checker instead of the store).
fn checker_rows(quick: bool) -> Vec<CheckerRow> {
    const BLOCK: usize = 2 << 20;
    let blocks = 32;
    let passes = if quick { 2 } else { 6 };
    let src = vec![0x5au8; BLOCK * blocks];
    let mut dst = vec![0u8; BLOCK * blocks];
    dst.fill(1);
    let bytes = (BLOCK * blocks * passes) as f64;
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..passes {
            f();
        }
        bytes / t.elapsed().as_secs_f64().max(1e-9) / 1e9
    };
    let memcpy = time(&mut || {
        for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
            d.copy_from_slice(std::hint::black_box(s));
        }
    });
    let fill = time(&mut || {
        for (i, d) in dst.chunks_mut(BLOCK).enumerate() {
            cxlkv_platform::pattern::fill(key(i as u64), d);
        }
    });
    let mut good = 0;
    let verify = time(&mut || {
        for (i, d) in dst.chunks(BLOCK).enumerate() {
            good += cxlkv_platform::pattern::verify(key(i as u64), std::hint::black_box(d)) as usize;
        }
    });
    if good != blocks * passes {
        eprintln!("bench: the checker rejected {} of its own blocks", blocks * passes - good);
    }
    let row = |what, gb: f64| CheckerRow { what, gb_per_s: gb, x_memcpy: gb / memcpy.max(1e-9) };
    vec![row("memcpy (reference)", memcpy), row("pattern fill", fill), row("pattern verify", verify)]
}

/// Cost per 64-byte line of writing a payload and making it reach memory,
/// by each primitive this CPU has, against plain stores alone: 4 KiB at a
/// time over 8 MiB, each 4 KiB followed by its fence.
fn flush_costs(quick: bool) -> Result<Vec<FlushRow>, cxlkv_platform::Error> {
    const CHUNK: usize = 4096;
    let len = 8usize << 20;
    let map = Mapping::memfd(len as u64, false)?;
    map.prefault()?;
    let region = map.view();
    let src = vec![0x5au8; CHUNK];
    let passes = if quick { 2 } else { 8 };
    let lines = (len / 64 * passes) as f64;
    let time_with = |co: Option<Flush>| -> Result<f64, cxlkv_platform::Error> {
        let t = Instant::now();
        for _ in 0..passes {
            for off in (0..len).step_by(CHUNK) {
                match co {
                    None => region.copy_in(off as u64, &src)?,
                    Some(co) => {
                        co.write_payload(&region, off as u64, &src, Site("bench"))?;
                        co.store_fence(Site("bench"));
                    }
                }
            }
        }
        Ok(t.elapsed().as_secs_f64() * 1e9 / lines)
    };
    let plain = time_with(None)?;
    let mut rows = vec![FlushRow { primitive: "plain store (reference)", ns_per_line: plain, x_plain: 1.0 }];
    let prims: [(&str, FlushMode, bool); 4] = [
        ("clflush", FlushMode::Clflush, false),
        ("clflushopt + sfence", FlushMode::Clflushopt, false),
        ("clwb + sfence", FlushMode::Clwb, false),
        ("non-temporal store + sfence", FlushMode::Clflush, true),
    ];
    for (name, mode, nt) in prims {
        let Ok(co) = Flush::new(mode, nt) else { continue };
        let ns = time_with(Some(co))?;
        rows.push(FlushRow { primitive: name, ns_per_line: ns, x_plain: ns / plain.max(1e-9) });
    }
    Ok(rows)
}

/// QD1 copying puts of `size`-byte blocks through [`Node::put`], fresh keys
/// filling `ws` bytes of a faulted-in region, once with the mode's default
/// payload stores and once with plain stores + flush, beside a same-run
/// memcpy of as many blocks into a faulted-in /dev/shm mapping as large.
fn puts(mode: FlushMode, size: usize, ws: usize) -> Result<PutReport, cxlkv_platform::Error> {
    let n = (ws / size).max(16);
    let entries = (n as u32 * 2).next_power_of_two().max(1024);
    let caps = Capacities { max_nodes: 4, n_stripes: 64, entries_per_stripe: entries / 64, ..Capacities::default() };
    let room = (n * size) as u64 + (n as u64 * 256) + (64 << 20);
    let payload = vec![0x6bu8; size];
    // `region` bytes; the latencies of the puts from the `from`th on, and
    // the blocks evicted meanwhile.
    let pass =
        |payload_stores: PayloadStores, region: u64, from: usize| -> Result<(Vec<u64>, u64), cxlkv_platform::Error> {
            let path = PathBuf::from(format!("/dev/shm/cxlkv-bench-p-{}-{}", std::process::id(), mode.name()));
            let _cleanup = Cleanup(path.clone());
            let opts = Options { mode, payload: payload_stores, populate: false, ..Options::default() };
            let attached = Node::create(&path, region, caps, opts)?;
            // Measure the store, not first-touch page faults of fresh shm pages.
            attached.prefault()?;
            let parts = [&payload[..]];
            let mut lat = Vec::with_capacity(n);
            let mut evicted = 0u64;
            for i in 0..n {
                if i == from {
                    evicted = attached.stats()?.node.evictions;
                }
                let items = [PutItem { key: key(i as u64), tokens: 16, parts: &parts }];
                let mut out = [Ok(())];
                let t = Instant::now();
                attached.put(1, &items, &mut out)?;
                if i >= from {
                    lat.push(t.elapsed().as_nanos() as u64);
                }
                out[0]?;
            }
            evicted = attached.stats()?.node.evictions.saturating_sub(evicted);
            attached.close()?;
            Ok((lat, evicted))
        };
    let row = |mut lat: Vec<u64>, copy_gbps: f64| {
        let total: u64 = lat.iter().sum();
        let gb_per_s = (size * lat.len()) as f64 / total.max(1) as f64;
        PutRow {
            p50_ns: quantile(&mut lat, 0.5),
            p99_ns: quantile(&mut lat, 0.99),
            gb_per_s,
            pct_of_memcpy: 100.0 * gb_per_s / copy_gbps.max(1e-9),
        }
    };
    let (default_stores, _) = pass(PayloadStores::Auto, room + room / 8, 0)?;
    let (plain_stores, _) = pass(PayloadStores::Plain, room + room / 8, 0)?;
    // A region a quarter as large: it is full before half the puts are in,
    // and the second half evict (the least recently used blocks) to make
    // room, as a running cache does.
    let (full_region, full_evictions) = pass(PayloadStores::Auto, room / 4, n / 2)?;
    // The reference: memcpy into memory of the same kind (a faulted-in
    // /dev/shm mapping as large, 4 KiB pages like the region's).
    let path = PathBuf::from(format!("/dev/shm/cxlkv-bench-pm-{}-{}", std::process::id(), mode.name()));
    let _cleanup = Cleanup(path.clone());
    let pool = Mapping::create_file(&path, (n * size) as u64, 0o600, true)?;
    pool.prefault()?;
    let view = pool.view();
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        view.copy_in((i * size) as u64, std::hint::black_box(&payload))?;
        lat.push(t.elapsed().as_nanos() as u64);
    }
    let total: u64 = lat.iter().sum();
    let copy_gbps = (size * n) as f64 / total.max(1) as f64;
    let memcpy = CopyRow { p50_ns: quantile(&mut lat, 0.5) as f64, gb_per_s: copy_gbps };
    Ok(PutReport {
        bytes: size,
        blocks: n,
        default_stores: row(default_stores, copy_gbps),
        plain_stores: row(plain_stores, copy_gbps),
        full_region: row(full_region, copy_gbps),
        full_evictions_per_put: full_evictions as f64 / (n - n / 2).max(1) as f64,
        memcpy,
    })
}
