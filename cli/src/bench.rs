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

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use cxlkv_platform::coherence::{Coherence, Site};
use cxlkv_platform::host_locks::HostLocks;
use cxlkv_platform::kv::Capacities;
use cxlkv_platform::kv::CoreError as Error;
use cxlkv_platform::kv::Message;
use cxlkv_platform::kv::{mix64, Key};
use cxlkv_platform::kv::{Handle, ReserveItem};
use cxlkv_platform::{Flush, FlushMode, GetItem, Mapping, Node, Options, PayloadStores, PutItem};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

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
    attached.close()?;

    // The same in a region formatted for 64 nodes and 256 locks: a grant's
    // cost should not grow with either.
    let wide = std::path::PathBuf::from(format!("/dev/shm/cxlkv-bench-w-{}-{}", std::process::id(), mode.name()));
    let caps = Capacities { max_nodes: 64, n_stripes: 64, app_locks: 62, ..Capacities::default() };
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

struct Cleanup(std::path::PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// What `cxlkv bench` reports (printed as tables, or as JSON with --json).
#[derive(Debug, Serialize)]
pub struct Report {
    pub unix_time: u64,
    /// Blocks and their size in the one-process rows.
    pub blocks: usize,
    pub block_bytes: usize,
    /// Cost per line of each flush primitive.
    pub flush: Vec<FlushRow>,
    /// The demo's payload checker against memcpy.
    pub checker: Vec<CheckerRow>,
    /// Every measure, per coherence mode.
    pub modes: Vec<ModeReport>,
}

/// One flush primitive's cost per 64-byte line.
#[derive(Debug, Serialize)]
pub struct FlushRow {
    pub primitive: &'static str,
    pub ns_per_line: f64,
    /// Against plain stores.
    pub x_plain: f64,
}

/// Bandwidth of one pass over payload bytes (the demo's pattern fill or
/// verify, or the memcpy reference).
#[derive(Debug, Serialize)]
pub struct CheckerRow {
    pub what: &'static str,
    pub gb_per_s: f64,
    /// Against the same run's memcpy.
    pub x_memcpy: f64,
}

/// The measures of one coherence mode.
#[derive(Debug, Serialize)]
pub struct ModeReport {
    pub mode: &'static str,
    /// Per-block costs in one process.
    pub rows: Vec<OpRow>,
    /// Copying puts of each block size, as users make them.
    pub put: Vec<PutReport>,
    pub cross_process: CrossProcess,
}

/// One operation's cost per block.
#[derive(Debug, Serialize)]
pub struct OpRow {
    pub op: &'static str,
    pub ns_per_block: f64,
}

/// The measures between two processes.
#[derive(Debug, Serialize)]
pub struct CrossProcess {
    pub working_set_bytes: usize,
    /// Waking a sleeping thread of another process (the floor under a grant
    /// by a sleeping manager there).
    pub wake_reference_ns: Quantiles,
    pub lock_other_process_uncontended: LockPeer,
    /// Gets of each block size.
    pub get: Vec<GetReport>,
    pub rpc_round_trip_ns: Quantiles,
    pub handoff_ns: Quantiles,
    pub lock_contended: Contended,
}

/// Median and 99th percentile, nanoseconds.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Quantiles {
    pub p50: u64,
    pub p99: u64,
}

/// Lock+unlock by a process other than the manager's.
#[derive(Debug, Serialize, Deserialize)]
pub struct LockPeer {
    pub ns_per_op: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
}

/// Two processes contending for one lock.
#[derive(Debug, Serialize)]
pub struct Contended {
    pub ns_per_op: f64,
    pub peer_ns_per_op: f64,
}

/// Gets of one block size by a second process.
#[derive(Debug, Serialize, Deserialize)]
pub struct GetReport {
    pub bytes: usize,
    pub blocks: usize,
    /// The reader's first pass (page tables empty).
    pub cold: GetRow,
    /// Its second pass.
    pub warm: GetRow,
    /// Same-run memcpy from a faulted-in pool.
    pub memcpy: CopyRow,
    /// Same-run memcpy from a freshly mapped file.
    pub memcpy_cold: CopyRow,
}

/// QD1 puts of one block size through `Node::put` (what `cxlkv_put` and
/// Python's `Node.put` call), fresh keys over the working set.
#[derive(Debug, Serialize)]
pub struct PutReport {
    pub bytes: usize,
    pub blocks: usize,
    /// Payloads by the default stores of the mode (streaming where it flushes).
    pub default_stores: PutRow,
    /// Payloads by plain stores, then the mode's flush of every line.
    pub plain_stores: PutRow,
    /// Same-run memcpy of as many blocks into a faulted-in /dev/shm mapping
    /// as large.
    pub memcpy: CopyRow,
}

/// One pass of puts.
#[derive(Debug, Serialize)]
pub struct PutRow {
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub gb_per_s: f64,
    /// Against the same run's memcpy.
    pub pct_of_memcpy: f64,
}

/// One pass of gets.
#[derive(Debug, Serialize, Deserialize)]
pub struct GetRow {
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub gb_per_s: f64,
    /// Against the memcpy of data as cold or as warm.
    pub pct_of_memcpy: f64,
}

/// A memcpy reference.
#[derive(Debug, Serialize, Deserialize)]
pub struct CopyRow {
    pub p50_ns: f64,
    pub gb_per_s: f64,
}

/// What the echo peer measured.
#[derive(Debug, Serialize, Deserialize)]
struct Echo {
    handoff_ns: Quantiles,
}

/// What the lock peer measured.
#[derive(Debug, Serialize, Deserialize)]
struct LockRun {
    ns_per_op: f64,
    p50_ns: u64,
    p99_ns: u64,
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
    let region = (n * size) as u64 + (n as u64 * 256) + (64 << 20);
    let payload = vec![0x6bu8; size];
    let pass = |payload_stores: PayloadStores| -> Result<Vec<u64>, cxlkv_platform::Error> {
        let path = PathBuf::from(format!("/dev/shm/cxlkv-bench-p-{}-{}", std::process::id(), mode.name()));
        let _cleanup = Cleanup(path.clone());
        let opts = Options { mode, payload: payload_stores, populate: false, ..Options::default() };
        let attached = Node::create(&path, region + region / 8, caps, opts)?;
        // Measure the store, not first-touch page faults of fresh shm pages.
        attached.prefault()?;
        let parts = [&payload[..]];
        let mut lat = Vec::with_capacity(n);
        for i in 0..n as u64 {
            let items = [PutItem { key: key(i), tokens: 16, parts: &parts }];
            let mut out = [Ok(())];
            let t = Instant::now();
            attached.put(1, &items, &mut out)?;
            lat.push(t.elapsed().as_nanos() as u64);
            out[0]?;
        }
        attached.close()?;
        Ok(lat)
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
    let default_stores = pass(PayloadStores::Auto)?;
    let plain_stores = pass(PayloadStores::Plain)?;
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
        memcpy,
    })
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

fn quantile(v: &mut [u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
}

const GET_SIZES: [usize; 3] = [16 << 10, 256 << 10, 2 << 20];
const RPC: u32 = 7;
const STOP: u32 = 8;
const READY: u32 = 9;
const GO: u32 = 10;

/// Bytes of the last-level cache (sysfs), or 32 MiB when unknown.
fn llc_bytes() -> usize {
    let mut best = 0usize;
    for i in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
        let Ok(size) = std::fs::read_to_string(format!("{dir}/size")) else { break };
        let size = size.trim();
        let (num, mul) = match size.strip_suffix('K') {
            Some(n) => (n, 1 << 10),
            None => match size.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (size, 1),
            },
        };
        best = best.max(num.parse::<usize>().unwrap_or(0) * mul);
    }
    if best == 0 {
        32 << 20
    } else {
        best
    }
}

/// Working set of the cross-process gets: at least 4x the last-level cache
/// and 512 MiB (a quick run: 64 MiB, cache-resident on most machines).
fn working_set(quick: bool) -> usize {
    if quick {
        64 << 20
    } else {
        (4 * llc_bytes()).max(512 << 20)
    }
}

/// QD1 gets of one block size by a second process, through [`Node::get`]
/// (what `cxlkv_get` and Python's `Node.get` call): one process publishes
/// blocks filling the working set, the other reads every one of them in a
/// random order twice — first with its page tables unpopulated (a cold
/// reader: each first touch faults), then again (warm) — beside same-run
/// memcpys of random blocks from a freshly mapped file and from a
/// faulted-in private pool as large.
fn cross_get(mode: FlushMode, size: usize, ws: usize, tag: &str) -> Result<GetReport, cxlkv_platform::Error> {
    let path = PathBuf::from(format!("/dev/shm/cxlkv-bench-g-{tag}"));
    let local = PathBuf::from(format!("/dev/shm/cxlkv-bench-g-{tag}.local"));
    std::fs::create_dir_all(&local).map_err(|err| cxlkv_platform::Error::Io { what: "bench local dir", err })?;
    let _cleanup = (Cleanup(path.clone()), CleanupDir(local.clone()));
    let n = (ws / size).max(16);
    let entries = (n as u32 * 2).next_power_of_two().max(1024);
    let caps = Capacities { max_nodes: 4, n_stripes: 64, entries_per_stripe: entries / 64, ..Capacities::default() };
    let opts = Options { mode, local_dir: local.clone(), lock_timeout: Duration::from_secs(60), ..Options::default() };
    let region = (n * size) as u64 + (n as u64 * 256) + (64 << 20);
    let attached = Node::create(&path, region + region / 8, caps, opts)?;
    let node = attached.core();
    let payload = vec![0x3cu8; size];
    let mut batch = Vec::with_capacity(64);
    for i in 0..n as u64 {
        let h = node.reserve(1, key(i), size as u64, 16)?;
        node.write(&h, 0, &payload)?;
        batch.push(h);
        if batch.len() == 64 || i + 1 == n as u64 {
            let mut out = vec![Ok(()); batch.len()];
            node.publish_flushed(&batch, &mut out)?;
            batch.clear();
        }
    }
    let r = peer(&["get", &size.to_string(), &n.to_string()], &path, &local, mode, &attached);
    attached.close()?;
    r
}

/// The cross-process rows of one mode: a second process (this binary's
/// hidden `bench-peer` command) reads, answers or contends.
fn cross_process(mode: FlushMode, quick: bool) -> Result<CrossProcess, cxlkv_platform::Error> {
    let tag = format!("{}-{}", std::process::id(), mode.name());
    let path = PathBuf::from(format!("/dev/shm/cxlkv-bench-x-{tag}"));
    let local = PathBuf::from(format!("/dev/shm/cxlkv-bench-x-{tag}.local"));
    std::fs::create_dir_all(&local).map_err(|err| cxlkv_platform::Error::Io { what: "bench local dir", err })?;
    let _cleanup = (Cleanup(path.clone()), CleanupDir(local.clone()));
    let ws = working_set(quick);
    let mut get = Vec::new();
    for &size in &GET_SIZES {
        get.push(cross_get(mode, size, ws, &tag)?);
    }
    let caps = Capacities { max_nodes: 4, n_stripes: 16, entries_per_stripe: 256, ..Capacities::default() };
    let opts = Options { mode, local_dir: local.clone(), lock_timeout: Duration::from_secs(60), ..Options::default() };
    let attached = Node::create(&path, 64 << 20, caps, opts)?;
    attached.prefault()?;
    let node = attached.core();

    // RPC round trips; the peer records each request's one-way latency.
    let calls = if quick { 200 } else { 5000 };
    let mut rtt = Vec::with_capacity(calls);
    let rpc = {
        let mut child = spawn_peer(&["echo"], &path, &local, mode, &attached)?;
        let to = wait_ready(&attached)?;
        for _ in 0..calls {
            let t = Instant::now();
            let m = Message { kind: RPC, stamp: now_ns(), ..Message::default() };
            attached.call(to, &m, &[], Duration::from_secs(10))?;
            rtt.push(t.elapsed().as_nanos() as u64);
        }
        attached.send(to, &Message { kind: STOP, ..Message::default() }, &[])?;
        last_json::<Echo>(&mut child)?
    };

    // Lock+unlock, two processes contending for one lock.
    let n_locks = if quick { 300 } else { 3000 };
    let contended = {
        let mut child = spawn_peer(&["lock", &n_locks.to_string()], &path, &local, mode, &attached)?;
        let to = wait_ready(&attached)?;
        attached.send(to, &Message { kind: GO, ..Message::default() }, &[])?;
        let t = Instant::now();
        for _ in 0..n_locks {
            let h = node.lock(0)?;
            node.unlock(h)?;
        }
        let mine = t.elapsed().as_nanos() as f64 / n_locks as f64;
        let theirs: LockRun = last_json(&mut child)?;
        Contended { ns_per_op: mine, peer_ns_per_op: theirs.ns_per_op }
    };
    // Lock+unlock by the peer alone, the manager in this (idle) process:
    // each grant needs this process's background thread, woken by the
    // peer's ring instead of at the end of its pause.
    let alone = {
        let mut child = spawn_peer(&["lock", &n_locks.to_string()], &path, &local, mode, &attached)?;
        let to = wait_ready(&attached)?;
        attached.send(to, &Message { kind: GO, ..Message::default() }, &[])?;
        let r: LockRun = last_json(&mut child)?;
        LockPeer { ns_per_op: r.ns_per_op, p50_ns: r.p50_ns, p99_ns: r.p99_ns }
    };
    attached.close()?;
    let wake = wake_reference(&path, &local, mode, if quick { 200 } else { 2000 })?;
    Ok(CrossProcess {
        working_set_bytes: ws,
        wake_reference_ns: wake,
        lock_other_process_uncontended: alone,
        get,
        rpc_round_trip_ns: Quantiles { p50: quantile(&mut rtt, 0.5), p99: quantile(&mut rtt, 0.99) },
        handoff_ns: rpc.handoff_ns,
        lock_contended: contended,
    })
}

/// The floor under a grant by a sleeping manager in another process: the
/// peer rings a futex bell on which a thread of this process sleeps, and
/// spins until that thread, woken, rings a second bell back. The peer pauses
/// between rounds so the thread is asleep each time.
fn wake_reference(path: &Path, local: &Path, mode: FlushMode, n: usize) -> Result<Quantiles, cxlkv_platform::Error> {
    let ids = (mix64(std::process::id() as u64 ^ 0xa11), mix64(std::process::id() as u64 ^ 0xb22));
    let (a, b) = (HostLocks::open(local, ids.0, 0)?, HostLocks::open(local, ids.1, 0)?);
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let (a, b) = (&a, &b);
        s.spawn(move || {
            while let Err(std::sync::mpsc::TryRecvError::Empty) = stopped.try_recv() {
                let seen = a.bell_count();
                a.sleep(seen, Duration::from_secs(1));
                b.ring();
            }
        });
        let args = ["wake".to_string(), n.to_string(), ids.0.to_string(), ids.1.to_string()];
        let exe = std::env::current_exe().map_err(|err| cxlkv_platform::Error::Io { what: "current_exe", err });
        let out = exe.and_then(|exe| {
            let mut child = Command::new(exe)
                .arg("bench-peer")
                .arg(path)
                .arg(local)
                .arg(mode.name())
                .arg("0")
                .args(args)
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|err| cxlkv_platform::Error::Io { what: "spawn bench peer", err })?;
            last_json(&mut child)
        });
        drop(stop);
        a.ring();
        out
    })
}

struct CleanupDir(PathBuf);
impl Drop for CleanupDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn spawn_peer(
    args: &[&str],
    path: &Path,
    local: &Path,
    mode: FlushMode,
    attached: &Node,
) -> Result<std::process::Child, cxlkv_platform::Error> {
    let exe = std::env::current_exe().map_err(|err| cxlkv_platform::Error::Io { what: "current_exe", err })?;
    Command::new(exe)
        .arg("bench-peer")
        .arg(path)
        .arg(local)
        .arg(mode.name())
        .arg(attached.id().to_string())
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|err| cxlkv_platform::Error::Io { what: "spawn bench peer", err })
}

fn peer<T: DeserializeOwned>(
    args: &[&str],
    path: &Path,
    local: &Path,
    mode: FlushMode,
    attached: &Node,
) -> Result<T, cxlkv_platform::Error> {
    let mut child = spawn_peer(args, path, local, mode, attached)?;
    last_json(&mut child)
}

/// The peer's last stdout line, as JSON, once it exited successfully.
fn last_json<T: DeserializeOwned>(child: &mut std::process::Child) -> Result<T, cxlkv_platform::Error> {
    let out = child.stdout.take();
    let last = out.map(|o| BufReader::new(o).lines().map_while(Result::ok).last().unwrap_or_default());
    let st = child.wait().map_err(|err| cxlkv_platform::Error::Io { what: "wait for bench peer", err })?;
    if !st.success() {
        return Err(cxlkv_platform::Error::Unsupported("a bench peer process failed"));
    }
    serde_json::from_str(&last.unwrap_or_default())
        .map_err(|_| cxlkv_platform::Error::Unsupported("a bench peer printed no report"))
}

/// Waits for the peer's READY message; returns its node id.
fn wait_ready(attached: &Node) -> Result<u32, cxlkv_platform::Error> {
    loop {
        let (m, _) = attached.recv(Duration::from_secs(30))?;
        if m.kind == READY {
            return Ok(m.from);
        }
    }
}

/// `cxlkv bench-peer PATH LOCAL MODE PARENT-NODE ROLE ...`: the second
/// process of the cross-process rows. Prints one JSON line.
pub fn peer_main(args: &[String]) -> Result<(), String> {
    let [path, local, mode, parent, role, rest @ ..] = args else {
        return Err("bench-peer: bad arguments".into());
    };
    let mode: FlushMode = mode.parse().map_err(|_| "bench-peer: bad mode")?;
    let parent: u32 = parent.parse().map_err(|_| "bench-peer: bad node")?;
    let opts =
        Options { mode, local_dir: PathBuf::from(local), lock_timeout: Duration::from_secs(60), ..Options::default() };
    // The get reader starts cold: its page tables fill as it reads.
    let opts = Options { populate: role != "get", ..opts };
    let num = |i: usize| rest.get(i).and_then(|v| v.parse::<usize>().ok()).unwrap_or(1);
    if role == "wake" {
        let id = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok()).ok_or("bench-peer: bad bell id");
        let out = peer_wake(Path::new(local), num(0), id(1)?, id(2)?)?;
        println!("{}", serde_json::to_string(&out).map_err(|e| e.to_string())?);
        return Ok(());
    }
    let attached = Node::open(Path::new(path), opts).map_err(|e| e.to_string())?;
    let json = |r: Result<String, serde_json::Error>| r.map_err(|e| e.to_string());
    let out = match role.as_str() {
        "get" => json(serde_json::to_string(&peer_get(&attached, num(0), num(1))?)),
        "echo" => json(serde_json::to_string(&peer_echo(&attached, parent)?)),
        "lock" => json(serde_json::to_string(&peer_lock(&attached, parent, num(0))?)),
        other => Err(format!("bench-peer: unknown role {other}")),
    }?;
    attached.close().map_err(|e| e.to_string())?;
    println!("{out}");
    Ok(())
}

fn peer_get(attached: &Node, size: usize, n: usize) -> Result<GetReport, String> {
    let mut rng = SmallRng::seed_from_u64(size as u64 ^ 0x5eed);
    let mut order: Vec<u64> = (0..n as u64).collect();
    let mut shuffle = |v: &mut Vec<u64>| v.shuffle(&mut rng);
    let mut dst = vec![0u8; size];
    let mut pass = |order: &[u64]| -> Result<Vec<u64>, String> {
        let mut lat = Vec::with_capacity(order.len());
        for &i in order {
            let mut parts = [&mut dst[..]];
            let mut items = [GetItem { key: key(i), parts: &mut parts }];
            let (mut lens, mut res) = ([0u64], [Ok(())]);
            let t = Instant::now();
            attached.get(1, &mut items, &mut lens, &mut res).map_err(|e| e.to_string())?;
            lat.push(t.elapsed().as_nanos() as u64);
            res[0].map_err(|e| format!("get: {e}"))?;
            if lens[0] != size as u64 {
                return Err("get: wrong length".into());
            }
        }
        if dst.iter().any(|&b| b != 0x3c) {
            return Err("get: wrong bytes".into());
        }
        Ok(lat)
    };
    shuffle(&mut order);
    let mut cold = pass(&order)?;
    shuffle(&mut order);
    let mut warm = pass(&order)?;
    // The reference: single-thread memcpy of blocks picked at random from a
    // private pool as large as the working set (faulted in first), so from
    // the same level of the memory hierarchy.
    let mut pool = vec![0u8; size * n];
    pool.iter_mut().step_by(4096).for_each(|b| *b = 1);
    shuffle(&mut order);
    let mut copy = Vec::with_capacity(n);
    for &i in &order {
        let src = &pool[i as usize * size..(i as usize + 1) * size];
        let t = Instant::now();
        dst.copy_from_slice(src);
        std::hint::black_box(&mut dst);
        copy.push(t.elapsed().as_nanos() as u64);
    }
    drop(pool);
    let memcpy_p50 = quantile(&mut copy, 0.5).max(1) as f64;
    let mut cold_copy = cold_memcpy(size, n, &order, &mut dst)?;
    let cold_p50 = quantile(&mut cold_copy, 0.5).max(1) as f64;
    let row = |lat: &mut Vec<u64>, reference: f64| {
        let p50 = quantile(lat, 0.5).max(1);
        GetRow {
            p50_ns: p50,
            p99_ns: quantile(lat, 0.99),
            gb_per_s: size as f64 / p50 as f64,
            pct_of_memcpy: 100.0 * reference / p50 as f64,
        }
    };
    Ok(GetReport {
        bytes: size,
        blocks: n,
        cold: row(&mut cold, cold_p50),
        warm: row(&mut warm, memcpy_p50),
        memcpy: CopyRow { p50_ns: memcpy_p50, gb_per_s: size as f64 / memcpy_p50 },
        memcpy_cold: CopyRow { p50_ns: cold_p50, gb_per_s: size as f64 / cold_p50 },
    })
}

/// The cold reader's reference: memcpy of blocks in `order` out of a shared
/// file as large as the working set, written with `write(2)` and then mapped
/// afresh, so its pages sit in memory but not in this process's page tables
/// (each first touch faults), exactly as the region's do for a cold reader.
fn cold_memcpy(size: usize, n: usize, order: &[u64], dst: &mut [u8]) -> Result<Vec<u64>, String> {
    use std::io::Write;
    let path = PathBuf::from(format!("/dev/shm/cxlkv-bench-cold-{}", std::process::id()));
    let _cleanup = Cleanup(path.clone());
    let mut f = std::fs::File::create(&path).map_err(|e| format!("cold reference: {e}"))?;
    let chunk = vec![0x3cu8; 1 << 20];
    let mut left = size * n;
    while left > 0 {
        let k = left.min(chunk.len());
        f.write_all(&chunk[..k]).map_err(|e| format!("cold reference: {e}"))?;
        left -= k;
    }
    drop(f);
    let map = Mapping::open_file(&path).map_err(|e| e.to_string())?;
    let region = map.view();
    let mut lat = Vec::with_capacity(order.len());
    for &i in order {
        let t = Instant::now();
        region.copy_out(i * size as u64, dst).map_err(|e| e.to_string())?;
        std::hint::black_box(&mut *dst);
        lat.push(t.elapsed().as_nanos() as u64);
    }
    Ok(lat)
}

fn peer_wake(local: &Path, n: usize, id_a: u64, id_b: u64) -> Result<Quantiles, String> {
    let a = HostLocks::open(local, id_a, 0).map_err(|e| e.to_string())?;
    let b = HostLocks::open(local, id_b, 0).map_err(|e| e.to_string())?;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        std::thread::sleep(Duration::from_micros(200));
        let seen = b.bell_count();
        let t = Instant::now();
        a.ring();
        while b.bell_count() == seen {
            if t.elapsed() > Duration::from_secs(10) {
                return Err("wake reference: no answer within 10 s".into());
            }
            std::hint::spin_loop();
        }
        lat.push(t.elapsed().as_nanos() as u64);
    }
    Ok(Quantiles { p50: quantile(&mut lat, 0.5), p99: quantile(&mut lat, 0.99) })
}

fn peer_echo(attached: &Node, parent: u32) -> Result<Echo, String> {
    attached.send(parent, &Message { kind: READY, ..Message::default() }, &[]).map_err(|e| e.to_string())?;
    let mut one_way = Vec::new();
    loop {
        let (m, k) = attached.recv(Duration::from_secs(60)).map_err(|e| e.to_string())?;
        match m.kind {
            RPC => {
                one_way.push(now_ns().saturating_sub(m.stamp));
                attached.reply(&m, 0, &k).map_err(|e| e.to_string())?;
            }
            STOP => break,
            _ => {}
        }
    }
    Ok(Echo { handoff_ns: Quantiles { p50: quantile(&mut one_way, 0.5), p99: quantile(&mut one_way, 0.99) } })
}

fn peer_lock(attached: &Node, parent: u32, n: usize) -> Result<LockRun, String> {
    attached.send(parent, &Message { kind: READY, ..Message::default() }, &[]).map_err(|e| e.to_string())?;
    loop {
        let (m, _) = attached.recv(Duration::from_secs(60)).map_err(|e| e.to_string())?;
        if m.kind == GO {
            break;
        }
    }
    let node = attached.core();
    let mut lat = Vec::with_capacity(n);
    let t = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let h = node.lock(0).map_err(|e| e.to_string())?;
        node.unlock(h).map_err(|e| e.to_string())?;
        lat.push(t.elapsed().as_nanos() as u64);
    }
    let mean = t.elapsed().as_nanos() as f64 / n as f64;
    Ok(LockRun { ns_per_op: mean, p50_ns: quantile(&mut lat, 0.5), p99_ns: quantile(&mut lat, 0.99) })
}

/// Prints the report as tables.
pub fn print_table(r: &Report) {
    println!("flush cost per 64-byte line (4 KiB payload writes, each fenced; 8 MiB), against plain stores");
    println!("{:<32}{:>12}{:>12}", "primitive", "ns/line", "x plain");
    for row in &r.flush {
        println!("{:<32}{:>12.2}{:>12.1}", row.primitive, row.ns_per_line, row.x_plain);
    }
    println!();
    println!("payload checker of the demo and tests, 2 MiB blocks over 64 MiB, against memcpy");
    println!("{:<32}{:>12}{:>12}", "pass", "GB/s", "x memcpy");
    for row in &r.checker {
        println!("{:<32}{:>12.2}{:>12.2}", row.what, row.gb_per_s, row.x_memcpy);
    }
    println!();
    let modes = &r.modes;
    println!("per-block cost in one process, ns ({} blocks of {} bytes, /dev/shm)", r.blocks, r.block_bytes);
    let header = |first: &str| {
        print!("{first:<40}");
        for m in modes {
            print!("{:>12}", m.mode);
        }
        println!();
    };
    header("operation");
    let nrows = modes.first().map_or(0, |m| m.rows.len());
    for i in 0..nrows {
        print!("{:<40}", modes[0].rows[i].op);
        for m in modes {
            print!("{:>12.0}", m.rows.get(i).map_or(f64::NAN, |x| x.ns_per_block));
        }
        println!();
    }
    println!();
    let ws = modes.first().map_or(0, |m| m.cross_process.working_set_bytes);
    println!("put through Node::put (as cxlkv_put and Python's Node.put; QD1, fresh keys over {} MiB)", ws >> 20);
    header("measure");
    for (i, size) in GET_SIZES.iter().enumerate() {
        let kib = size >> 10;
        let put_row = |name: String, f: &dyn Fn(&PutReport) -> f64, prec: usize| {
            print!("{name:<40}");
            for m in modes {
                print!("{:>12.prec$}", m.put.get(i).map_or(f64::NAN, f));
            }
            println!();
        };
        for (how, pick) in [
            ("", (|p: &PutReport| &p.default_stores) as fn(&PutReport) -> &PutRow),
            (" plain+flush", |p| &p.plain_stores),
        ] {
            put_row(format!("put {kib} KiB{how} p50, us"), &|p| pick(p).p50_ns as f64 / 1e3, 1);
            put_row(format!("put {kib} KiB{how}, GB/s"), &|p| pick(p).gb_per_s, 2);
            put_row(format!("put {kib} KiB{how}, % of memcpy"), &|p| pick(p).pct_of_memcpy, 0);
        }
        put_row(format!("memcpy {kib} KiB, GB/s (same run)"), &|p| p.memcpy.gb_per_s, 2);
    }
    println!();
    println!(
        "between two processes (QD1; gets through Node::get, as cxlkv_get; random keys over {} MiB, LLC {} MiB)",
        ws >> 20,
        llc_bytes() >> 20
    );
    header("measure");
    let row = |name: String, f: &dyn Fn(&CrossProcess) -> f64, prec: usize| {
        print!("{name:<40}");
        for m in modes {
            print!("{:>12.prec$}", f(&m.cross_process));
        }
        println!();
    };
    for (i, size) in GET_SIZES.iter().enumerate() {
        let kib = size >> 10;
        for (w, pass) in [("cold", (|g: &GetReport| &g.cold) as fn(&GetReport) -> &GetRow), ("warm", |g| &g.warm)] {
            let at = move |x: &CrossProcess, f: fn(&GetRow) -> f64| x.get.get(i).map_or(f64::NAN, |g| f(pass(g)));
            row(format!("get {kib} KiB {w} reader p50, us"), &|x| at(x, |r| r.p50_ns as f64) / 1e3, 1);
            row(format!("get {kib} KiB {w} reader p99, us"), &|x| at(x, |r| r.p99_ns as f64) / 1e3, 1);
            row(format!("get {kib} KiB {w} at p50, % of {w} memcpy"), &|x| at(x, |r| r.pct_of_memcpy), 0);
        }
        row(
            format!("memcpy {kib} KiB p50, us (same run)"),
            &|x| x.get.get(i).map_or(f64::NAN, |g| g.memcpy.p50_ns) / 1e3,
            1,
        );
        row(
            format!("memcpy {kib} KiB cold p50, us (same run)"),
            &|x| x.get.get(i).map_or(f64::NAN, |g| g.memcpy_cold.p50_ns) / 1e3,
            1,
        );
    }
    let us = |v: u64| v as f64 / 1e3;
    row("handoff (one way) p50, us".into(), &|x| us(x.handoff_ns.p50), 1);
    row("handoff (one way) p99, us".into(), &|x| us(x.handoff_ns.p99), 1);
    row("RPC round trip p50, us".into(), &|x| us(x.rpc_round_trip_ns.p50), 1);
    row("RPC round trip p99, us".into(), &|x| us(x.rpc_round_trip_ns.p99), 1);
    row(
        "lock+unlock, other process than the manager, mean ns".into(),
        &|x| x.lock_other_process_uncontended.ns_per_op,
        0,
    );
    row(
        "lock+unlock, other process than the manager, p50 ns".into(),
        &|x| x.lock_other_process_uncontended.p50_ns as f64,
        0,
    );
    row(
        "lock+unlock, other process than the manager, p99 ns".into(),
        &|x| x.lock_other_process_uncontended.p99_ns as f64,
        0,
    );
    row("wake a sleeping thread of another process p50, us".into(), &|x| us(x.wake_reference_ns.p50), 1);
    row("lock+unlock, 2 processes contending, ns".into(), &|x| x.lock_contended.ns_per_op, 0);
}
