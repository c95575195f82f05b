//! `cxlkv demo`: prefill and decode worker processes share one region in
//! /dev/shm and replay a synthetic serving workload. Prefill workers look up
//! the longest cached prefix of each request, compute and publish the missing
//! blocks, and hand the request to a decode worker through its inbox; decode
//! workers acquire every block, verify every byte against its key, release
//! it, and answer, so prefill drops the pins it held for the handoff.
//!
//! Requests follow TraCT's Table 1 in shape: a system prompt, often a shared
//! document or the history of a multi-turn conversation, and a unique part;
//! a few thousand tokens with a wide spread; 16-token blocks hashed into a
//! key chain.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use cxlkv_platform::kv::Capacities;
use cxlkv_platform::kv::CoreError;
use cxlkv_platform::kv::Handle;
use cxlkv_platform::kv::Message;
use cxlkv_platform::kv::{chain_keys, mix64, Key};
use cxlkv_platform::size::human;
use cxlkv_platform::{pattern, FlushMode, Node, Options, Populate, KIND_RESPONSE};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::LogNormal;
use serde::{Deserialize, Serialize};

const NS: u32 = 1;
const TOKENS_PER_BLOCK: usize = 16;
const MAX_TOKENS: usize = 16_384;
const HANDOFF: u32 = 1;
const STOP: u32 = 2;

/// What the demo runs (sent to each worker as JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Config {
    pub prefill: usize,
    pub decode: usize,
    pub duration: Duration,
    /// Largest block (every block when `block_min` equals it).
    pub block_bytes: u64,
    /// Smallest block: blocks of a mix take a length between the two, fixed
    /// per key (models, layouts and layer-wise chunks mix sizes).
    pub block_min: u64,
    pub region: u64,
    #[serde(with = "mode_name")]
    pub mode: FlushMode,
    pub seed: u64,
    /// Requests a prefill worker keeps handed off at once (their blocks pinned).
    pub inflight: usize,
    /// An SSD tier on this directory: blocks evicted from the region are
    /// kept there and prefill workers get missing prefixes back from it.
    #[serde(default)]
    pub ssd: Option<PathBuf>,
}

/// A flush mode as its name.
mod mode_name {
    use cxlkv_platform::FlushMode;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(m: &FlushMode, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(m.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FlushMode, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(|_| serde::de::Error::custom(format!("not a flush mode: {name}")))
    }
}

/// Latencies in nanoseconds (an HDR histogram, 3 significant digits),
/// carried between processes as `[value, count]` pairs.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(into = "Vec<[u64; 2]>", from = "Vec<[u64; 2]>")]
pub struct Hist(Histogram<u64>);

impl From<Hist> for Vec<[u64; 2]> {
    fn from(h: Hist) -> Self {
        h.0.iter_recorded().map(|v| [v.value_iterated_to(), v.count_at_value()]).collect()
    }
}

impl From<Vec<[u64; 2]>> for Hist {
    fn from(pairs: Vec<[u64; 2]>) -> Self {
        let mut h = Hist::default();
        for [x, n] in pairs {
            // A value the histogram cannot hold is dropped, never a panic.
            let _ = h.0.record_n(x, n);
        }
        h
    }
}

impl Default for Hist {
    fn default() -> Hist {
        // 3 significant digits, growing as needed: never refuses a value.
        Hist(Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant digits are valid")))
    }
}

impl Hist {
    pub fn add(&mut self, v: u64) {
        // Grows to hold `v`; a value beyond any range it can grow to is
        // counted at the largest it holds.
        if self.0.record(v).is_err() {
            self.0.saturating_record(v);
        }
    }
    pub fn count(&self) -> u64 {
        self.0.len()
    }
    pub fn merge(&mut self, o: &Hist) {
        // Both auto-resize, so adding cannot fail for range.
        let _ = self.0.add(&o.0);
    }
    /// The value below which a fraction `q` of the samples lie (within the
    /// histogram's precision).
    pub fn quantile(&self, q: f64) -> u64 {
        self.0.value_at_quantile(q)
    }
    /// p50, p99 and the count.
    fn summary(&self) -> Latency {
        Latency { p50: self.quantile(0.5), p99: self.quantile(0.99), n: self.count() }
    }
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Tokens of shared segment `id` (a system prompt, a document, a turn).
fn segment(id: u64, len: usize, out: &mut Vec<u32>) {
    out.extend((0..len as u64).map(|j| (mix64(id << 24 ^ j) % 128_000) as u32));
}

/// One synthetic request: its tokens, and how many of them are its own.
fn request(rng: &mut SmallRng, worker: u64, n: u64, elapsed: Duration) -> (Vec<u32>, usize) {
    let mut t = Vec::with_capacity(8192);
    // A system prompt, skewed towards the first few.
    let s = below(rng, 8) * below(rng, 8) / 8;
    segment(1 << 40 | s, 384 + 160 * s as usize, &mut t);
    match below(rng, 10) {
        0..=3 => {
            let d = below(rng, 16) * below(rng, 16) / 16;
            segment(2 << 40 | d, 2048 + (mix64(d) % 4096) as usize, &mut t);
        }
        4..=7 => {
            // A conversation: its earlier turns, then this turn.
            let c = below(rng, 32);
            let turns = below(rng, 1 + (elapsed.as_secs() / 3).min(8));
            for k in 0..turns {
                segment(3 << 40 | c << 8 | k, 300 + (mix64(c << 8 | k) % 1200) as usize, &mut t);
            }
        }
        _ => {}
    }
    // The unique part: log-normal, mean about a thousand tokens.
    let unique = rng.sample(unique_tokens()).clamp(16.0, 8192.0) as usize;
    let unique = unique.min(MAX_TOKENS.saturating_sub(t.len()));
    segment(4 << 40 | worker << 32 | n, unique, &mut t);
    (t, unique)
}

/// A number below `n` (0 when `n` is 0).
fn below(rng: &mut SmallRng, n: u64) -> u64 {
    rng.random_range(0..n.max(1))
}

/// The length of a request's own part, in tokens: log-normal, mean about a
/// thousand.
fn unique_tokens() -> LogNormal<f64> {
    LogNormal::new(6.3, 1.15).unwrap_or_else(|_| unreachable!("a positive sigma"))
}

/// The payload length of `key`'s block: the configured size, or one fixed
/// per key in the configured range (a multiple of 64 bytes).
fn len_of(cfg: &Config, key: Key) -> u64 {
    if cfg.block_min >= cfg.block_bytes {
        return cfg.block_bytes;
    }
    let span = cfg.block_bytes - cfg.block_min + 1;
    ((cfg.block_min + mix64(pattern::seed_of(key) ^ 0x1e57) % span) & !63).max(cfg.block_min)
}

fn caps(cfg: &Config) -> Capacities {
    let mean = (cfg.block_min.min(cfg.block_bytes) + cfg.block_bytes) / 2;
    let blocks = (cfg.region / mean).max(64) as u32;
    let chunk = cfg.block_bytes.next_power_of_two().max(1 << 21);
    Capacities {
        max_nodes: (cfg.prefill + cfg.decode + 2) as u32,
        n_stripes: 16,
        entries_per_stripe: (blocks * 2).div_ceil(16).max(16),
        n_roots: 8,
        pin_slots: ((MAX_TOKENS / TOKENS_PER_BLOCK) as u32 * (cfg.inflight as u32 + 1)).next_multiple_of(4),
        chunk_shift: chunk.trailing_zeros(),
        inbox_slots: 256,
        app_locks: 0,
        ..Capacities::default()
    }
}

fn worker_opts(cfg: &Config, local: &Path, node: u32) -> Options {
    Options {
        node: Some(node),
        mode: cfg.mode,
        local_dir: local.to_path_buf(),
        lock_timeout: Duration::from_secs(30),
        ..Options::default()
    }
}

/// The most bytes the SSD tier may write per byte prefill publishes before
/// the demo fails: a block is copied out once (its slot header and padding
/// add a little); more means the tier copies blocks again that did not
/// change.
pub const MAX_WRITE_AMPLIFICATION: f64 = 1.1;

/// Counters of one worker, sent as JSON lines to the parent.
#[derive(Clone, Default, Serialize, Deserialize)]
struct WorkerCounters {
    /// The worker finished its run (its last line).
    done: bool,
    requests: u64,
    blocks: u64,
    hit_blocks: u64,
    /// Of the blocks missing from the region, those the SSD tier put back.
    ssd_blocks: u64,
    input_tokens: Vec<u32>,
    unique_tokens: Vec<u32>,
    published: u64,
    published_bytes: u64,
    evictions: u64,
    evicted_bytes: u64,
    /// Evictions this worker's node made, as the region counts them (its
    /// reserves evict too, not only its explicit evict calls).
    node_evictions: u64,
    read: u64,
    read_bytes: u64,
    verify_failures: u64,
    missing: u64,
    errors: u64,
    /// Nanoseconds spent writing (prefill) or checking (decode) the payload
    /// pattern: the demo's own work, not the store's.
    check_ns: u64,
    handoff: Hist,
    /// Gets once this process's page tables of the region were populated.
    get: Hist,
    /// Gets while they were still being populated (first touches fault).
    get_warmup: Hist,
    /// How long after attaching the population finished.
    populated_after: Option<Duration>,
    first_error: Option<String>,
    /// Share of the payload capacity live when this worker first evicted.
    live_at_first_eviction: Option<f64>,
}

impl WorkerCounters {
    fn error(&mut self, what: String) {
        self.errors += 1;
        self.first_error.get_or_insert(what);
    }
}

/// Runs one worker process: `cxlkv demo-worker ROLE INDEX PATH LOCAL CONFIG-JSON`.
pub fn worker(args: &[String]) -> Result<(), String> {
    let [role, index, path, local, cfg] = args else {
        return Err("demo-worker: bad arguments".into());
    };
    let index: usize = index.parse().map_err(|_| "demo-worker: bad index")?;
    let cfg: Config = serde_json::from_str(cfg).map_err(|e| e.to_string())?;
    let node = match role.as_str() {
        "decode" => index as u32,
        _ => (cfg.decode + index) as u32,
    };
    let attached = Node::open(Path::new(path), worker_opts(&cfg, Path::new(local), node)).map_err(|e| e.to_string())?;
    let r = match role.as_str() {
        "prefill" => prefill(&attached, &cfg, index),
        "decode" => decode(&attached, &cfg),
        other => Err(format!("demo-worker: unknown role {other}")),
    };
    let closed = attached.close().map_err(|e| e.to_string());
    r.and(closed)
}

/// Records, once, how full the region was when this worker's reserves
/// first had to evict (the share of payload capacity live just after).
fn note_first_eviction(attached: &Node, c: &mut WorkerCounters) {
    if c.live_at_first_eviction.is_some() {
        return;
    }
    if attached.core().stats().is_ok_and(|s| s.evictions > 0) {
        if let Ok(s) = attached.stats() {
            c.live_at_first_eviction = Some(s.live_bytes as f64 / s.payload_bytes.max(1) as f64);
        }
    }
}

fn report(c: &mut WorkerCounters, done: bool) {
    c.done = done;
    println!("{}", serde_json::to_string(c).unwrap_or_default());
}

struct Inflight {
    pins: Vec<Handle>,
}

/// Waits until every decode worker's node (ids 0..decode) is attached: a
/// handoff sent before would find no node there (a worker process starts
/// slowly on a busy machine). At most a minute.
fn await_decoders(attached: &Node, decode: usize) -> Result<(), String> {
    let want = if decode >= 64 { u64::MAX } else { (1u64 << decode) - 1 };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let alive = attached.stats().map_err(|e| format!("stats: {e}"))?.alive;
        if alive & want == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("decode workers not attached after 60 s (alive nodes {alive:#b})"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn prefill(attached: &Node, cfg: &Config, index: usize) -> Result<(), String> {
    await_decoders(attached, cfg.decode)?;
    let node = attached.core();
    let mut c = WorkerCounters::default();
    let mut rng = SmallRng::seed_from_u64(cfg.seed ^ mix64(index as u64 + 1));
    let start = Instant::now();
    let mut last = Instant::now();
    let mut buf = vec![0u8; cfg.block_bytes as usize];
    let mut keys = vec![Key::default(); MAX_TOKENS / TOKENS_PER_BLOCK];
    let mut inflight: HashMap<u64, Inflight> = HashMap::new();
    let mut n = 0u64;
    while start.elapsed() < cfg.duration {
        while inflight.len() >= cfg.inflight.max(1) {
            take_answers(attached, &mut inflight, &mut c, Duration::from_millis(200))?;
        }
        take_answers(attached, &mut inflight, &mut c, Duration::ZERO)?;
        n += 1;
        let (tokens, unique) = request(&mut rng, index as u64, n, start.elapsed());
        c.input_tokens.push(tokens.len() as u32);
        c.unique_tokens.push(unique as u32);
        let nk = chain_keys(Key::default(), &tokens, TOKENS_PER_BLOCK, &mut keys);
        let chain = &keys[..nk];
        let rid = (index as u64) << 48 | n;
        match prefill_one(attached, cfg, chain, &mut buf, &mut c, &mut inflight) {
            Ok(pins) => {
                let d = (n as usize % cfg.decode.max(1)) as u32;
                let m = Message { kind: HANDOFF, request_id: rid, ns: NS, stamp: now_ns(), ..Message::default() };
                match attached.send(d, &m, chain) {
                    Ok(()) => {
                        inflight.insert(rid, Inflight { pins });
                    }
                    Err(e) => {
                        c.error(format!("handoff to decode {d}: {e}"));
                        let _ = node.release(&pins);
                    }
                }
                c.requests += 1;
            }
            Err(e) => c.error(format!("prefill: {e}")),
        }
        if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            c.node_evictions = node.stats().map_or(c.node_evictions, |s| s.evictions);
            report(&mut c, false);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !inflight.is_empty() && Instant::now() < deadline {
        take_answers(attached, &mut inflight, &mut c, Duration::from_millis(200))?;
    }
    for (_, f) in inflight.drain() {
        c.error("a handoff was never answered".into());
        let _ = node.release(&f.pins);
    }
    for d in 0..cfg.decode as u32 {
        let stop = Message { kind: STOP, ..Message::default() };
        if let Err(e) = attached.send(d, &stop, &[]) {
            c.error(format!("stop to decode {d}: {e}"));
        }
    }
    report(&mut c, true);
    Ok(())
}

/// Takes decode workers' answers (waiting up to `wait` for the first) and
/// releases the pins of the requests they finished.
fn take_answers(
    attached: &Node,
    inflight: &mut HashMap<u64, Inflight>,
    c: &mut WorkerCounters,
    wait: Duration,
) -> Result<(), String> {
    let mut first = !wait.is_zero();
    loop {
        let got = if first {
            first = false;
            match attached.recv(wait) {
                Ok(m) => Some(m),
                Err(e) if e.core() == Some(CoreError::Timeout) => None,
                Err(e) => return Err(e.to_string()),
            }
        } else {
            attached.try_recv().map_err(|e| e.to_string())?
        };
        let Some((m, _)) = got else { return Ok(()) };
        if m.kind == HANDOFF | KIND_RESPONSE {
            if let Some(f) = inflight.remove(&m.request_id) {
                if let Err(e) = attached.core().release(&f.pins) {
                    c.error(format!("release: {e}"));
                }
            }
        }
    }
}

/// Pins every block of `chain`: the cached prefix as found, the rest
/// computed and published. Returns the pins.
fn prefill_one(
    attached: &Node,
    cfg: &Config,
    chain: &[Key],
    buf: &mut [u8],
    c: &mut WorkerCounters,
    inflight: &mut HashMap<u64, Inflight>,
) -> Result<Vec<Handle>, String> {
    let node = attached.core();
    let mut hit = node.lookup(NS, chain).map_err(|e| e.to_string())?;
    if cfg.ssd.is_some() && hit < chain.len() {
        // The prefix goes on where the SSD tier holds the next blocks.
        let there = attached.promote(NS, &chain[hit..], Duration::from_secs(2)).map_err(|e| e.to_string())?;
        let more = there.iter().take_while(|&&t| t).count();
        c.ssd_blocks += more as u64;
        hit += more;
    }
    let mut out = vec![Err(CoreError::NotFound); chain.len()];
    node.acquire(NS, &chain[..hit], &mut out[..hit]).map_err(|e| e.to_string())?;
    c.blocks += chain.len() as u64;
    c.hit_blocks += out[..hit].iter().filter(|r| r.is_ok()).count() as u64;
    let mut pins: Vec<Handle> = out[..hit].iter().filter_map(|r| r.ok()).collect();
    let t0 = Instant::now();
    for (i, key) in chain.iter().enumerate() {
        if out[i].is_ok() {
            continue;
        }
        loop {
            if t0.elapsed() > Duration::from_secs(30) {
                let _ = node.release(&pins);
                return Err("no room for a request's blocks for 30 s".into());
            }
            let len = len_of(cfg, *key);
            match node.reserve(NS, *key, len, TOKENS_PER_BLOCK as u32) {
                Ok(h) => {
                    let buf = &mut buf[..len as usize];
                    let tf = Instant::now();
                    pattern::fill(*key, buf);
                    c.check_ns += tf.elapsed().as_nanos() as u64;
                    let published = node.write(&h, 0, buf).and_then(|_| node.publish_flushed(&[h], &mut [Ok(())]));
                    if let Err(e) = published {
                        let _ = node.abort(&h);
                        let _ = node.release(&pins);
                        return Err(format!("publish: {e}"));
                    }
                    c.published += 1;
                    c.published_bytes += len;
                    note_first_eviction(attached, c);
                }
                Err(CoreError::Exists) => {}
                Err(CoreError::OutOfSpace | CoreError::TableFull) => {
                    // Blocks the SSD tier holds go first (nothing is lost).
                    let rep = node.evict_for(cfg.block_bytes * 16).map_err(|e| e.to_string())?;
                    c.evictions += rep.entries;
                    c.evicted_bytes += rep.bytes;
                    if rep.entries == 0 {
                        // Everything is pinned: wait for decode to finish some.
                        take_answers(attached, inflight, c, Duration::from_millis(20))?;
                    }
                    continue;
                }
                Err(e) => {
                    let _ = node.release(&pins);
                    return Err(format!("reserve: {e}"));
                }
            }
            // Pin it for the handoff (another prefill may still be writing it).
            let mut one = [Err(CoreError::NotFound)];
            node.acquire(NS, std::slice::from_ref(key), &mut one).map_err(|e| e.to_string())?;
            match one[0] {
                Ok(h) => {
                    pins.push(h);
                    break;
                }
                Err(_) => std::thread::sleep(Duration::from_micros(100)),
            }
        }
    }
    Ok(pins)
}

fn decode(attached: &Node, cfg: &Config) -> Result<(), String> {
    // Attached just before; population started then.
    let attached_at = Instant::now();
    let node = attached.core();
    let mut c = WorkerCounters::default();
    let mut buf = vec![0u8; cfg.block_bytes as usize];
    let mut stops = 0;
    let mut last = Instant::now();
    let give_up = Instant::now() + cfg.duration + Duration::from_secs(120);
    while stops < cfg.prefill && Instant::now() < give_up {
        let (m, keys) = match attached.recv(Duration::from_millis(200)) {
            Ok(x) => x,
            Err(e) if e.core() == Some(CoreError::Timeout) => continue,
            Err(e) => return Err(e.to_string()),
        };
        if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            report(&mut c, false);
        }
        match m.kind {
            STOP => stops += 1,
            HANDOFF => {
                c.handoff.add(now_ns().saturating_sub(m.stamp));
                let mut bad = 0;
                for key in &keys {
                    let t = Instant::now();
                    let mut one = [Err(CoreError::NotFound)];
                    if let Err(e) = node.acquire(m.ns, std::slice::from_ref(key), &mut one) {
                        c.error(format!("acquire: {e}"));
                        continue;
                    }
                    let Ok(h) = one[0] else {
                        c.missing += 1;
                        bad += 1;
                        continue;
                    };
                    let len = h.len as usize;
                    let read = len as u64 == len_of(cfg, *key) && node.read(&h, 0, &mut buf[..len]).is_ok();
                    let tv = Instant::now();
                    let ok = read && pattern::verify(*key, &buf[..len]);
                    c.check_ns += tv.elapsed().as_nanos() as u64;
                    if let Err(e) = node.release(&[h]) {
                        c.error(format!("release: {e}"));
                    }
                    let took = t.elapsed().as_nanos() as u64;
                    if c.populated_after.is_none() && !matches!(attached.populated(), Populate::Running { .. }) {
                        c.populated_after = Some(attached_at.elapsed());
                    }
                    if c.populated_after.is_some() {
                        c.get.add(took);
                    } else {
                        c.get_warmup.add(took);
                    }
                    c.read += 1;
                    c.read_bytes += len as u64;
                    if !ok {
                        c.verify_failures += 1;
                        bad += 1;
                    }
                }
                c.requests += 1;
                if let Err(e) = attached.reply(&m, bad, &[]) {
                    c.error(format!("answer: {e}"));
                }
            }
            other => c.error(format!("unexpected message kind {other}")),
        }
    }
    if stops < cfg.prefill {
        c.error("not every prefill worker said stop".into());
    }
    report(&mut c, true);
    Ok(())
}

/// The merged reports of every worker.
/// The sum of `f` over some workers' counters.
fn sum(cs: &[WorkerCounters], f: impl Fn(&WorkerCounters) -> u64) -> u64 {
    cs.iter().map(f).sum()
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let m = xs.iter().sum::<f64>() / xs.len() as f64;
    let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / xs.len() as f64;
    (m, var.sqrt())
}

/// Removes the region and the host-local lock directory on every way out.
struct Cleanup(PathBuf, PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

/// Runs the demo; returns the report as JSON and whether it passed.
pub fn run(cfg: &Config, progress: bool) -> Result<(Report, bool), String> {
    let began = Instant::now();
    let pid = std::process::id();
    let path = PathBuf::from(format!("/dev/shm/cxlkv-demo-{pid}"));
    let local = PathBuf::from(format!("/dev/shm/cxlkv-demo-{pid}.local"));
    std::fs::create_dir_all(&local).map_err(|e| format!("{}: {e}", local.display()))?;
    let _cleanup = Cleanup(path.clone(), local.clone());
    let caps = caps(cfg);
    {
        let opts = Options { mode: cfg.mode, local_dir: local.clone(), ..Options::default() };
        let fmt = Node::create(&path, cfg.region, caps, opts).map_err(|e| format!("format: {e}"))?;
        fmt.close().map_err(|e| e.to_string())?;
    }
    // A tier directory the demo makes (it did not exist) goes at the end.
    let made_ssd_dir = cfg.ssd.as_ref().filter(|d| !d.exists()).cloned();
    // The SSD tier runs in this process, on its own node (the last slot).
    let tier = match &cfg.ssd {
        Some(dir) => {
            let opts = Options {
                mode: cfg.mode,
                local_dir: local.clone(),
                node: Some(caps.max_nodes - 1),
                ..Options::default()
            };
            let owner = Arc::new(Node::open(&path, opts).map_err(|e| format!("tier node: {e}"))?);
            let topts = cxlkv_platform::TierOptions {
                dirs: vec![dir.clone()],
                slot_bytes: cfg.block_bytes,
                capacity: (cfg.region * 2).min(8 << 30),
                high_water: 0.6,
                batch: 32,
            };
            Some(cxlkv_platform::Tier::start(owner, topts).map_err(|e| format!("tier: {e}"))?)
        }
        None => None,
    };
    let conf = serde_json::to_string(cfg).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let latest: Arc<Mutex<BTreeMap<String, WorkerCounters>>> = Arc::default();
    let mut children: Vec<(String, Child, std::thread::JoinHandle<()>)> = Vec::new();
    let roles = (0..cfg.decode).map(|i| ("decode", i)).chain((0..cfg.prefill).map(|i| ("prefill", i)));
    for (role, i) in roles {
        let mut child = Command::new(&exe)
            .args(["demo-worker", role, &i.to_string()])
            .arg(&path)
            .arg(&local)
            .arg(&conf)
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn {role} {i}: {e}"))?;
        let name = format!("{role} {i}");
        let out = child.stdout.take().ok_or("no worker stdout")?;
        let (l2, n2) = (latest.clone(), name.clone());
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<WorkerCounters>(&line) {
                    if let Ok(mut m) = l2.lock() {
                        m.insert(n2.clone(), v);
                    }
                }
            }
        });
        children.push((name, child, reader));
    }
    let start = Instant::now();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut failed = Vec::new();
    let mut running = children.len();
    while running > 0 {
        std::thread::sleep(Duration::from_millis(250));
        running = 0;
        for (name, child, _) in children.iter_mut() {
            match child.try_wait() {
                Ok(None) => running += 1,
                Ok(Some(st)) if !st.success() && !failed.contains(name) => failed.push(name.clone()),
                _ => {}
            }
        }
        // A terminal gets one line rewritten every second; a log, a line
        // every five seconds.
        let every = if tty { 1000 } else { 5000 };
        if progress && start.elapsed().as_millis() % every < 250 {
            let m = latest.lock().map(|m| m.clone()).unwrap_or_default();
            let (p, d) = partition(&m);
            eprint!(
                "{}[{:>4.0}s] requests {:>5} handed off, {:>5} decoded; blocks {:>7} published, {:>7} read; hit {:>5.1}%; evicted {:>6}   {}",
                if tty { "\r" } else { "" },
                start.elapsed().as_secs_f64(),
                sum(&p, |c| c.requests),
                sum(&d, |c| c.requests),
                sum(&p, |c| c.published),
                sum(&d, |c| c.read),
                100.0 * sum(&p, |c| c.hit_blocks) as f64 / sum(&p, |c| c.blocks).max(1) as f64,
                sum(&p, |c| c.evictions).max(sum(&p, |c| c.node_evictions)),
                if tty { "" } else { "\n" },
            );
        }
    }
    if progress && tty {
        eprintln!();
    }
    for (_, _, reader) in children {
        let _ = reader.join();
    }
    let m = latest.lock().map(|m| m.clone()).unwrap_or_default();
    let (pre, dec) = partition(&m);
    let ssd = match tier {
        Some(t) => {
            let st = t.stats();
            t.stop().map_err(|e| format!("tier: {e}"))?;
            let missing = sum(&pre, |c| c.blocks) - sum(&pre, |c| c.hit_blocks - c.ssd_blocks);
            let _ = cfg.ssd.as_ref().map(|d| std::fs::remove_file(d.join("cxlkv-tier.slots")));
            // Only if empty: anything else in it is not the demo's.
            let _ = made_ssd_dir.as_ref().map(std::fs::remove_dir);
            Some(SsdReport {
                spills: st.spills,
                promotions: st.promotions,
                bytes_written: st.bytes_written,
                bytes_read: st.bytes_read,
                errors: st.errors,
                hit_rate: sum(&pre, |c| c.ssd_blocks) as f64 / missing.max(1) as f64,
                write_amplification: st.bytes_written as f64 / sum(&pre, |c| c.published_bytes).max(1) as f64,
            })
        }
        None => None,
    };
    // The region is whole after the run: check it and its stats.
    let (findings, evictions_region) = {
        let opts = Options { mode: cfg.mode, local_dir: local.clone(), ..Options::default() };
        let attached = Node::open(&path, opts).map_err(|e| e.to_string())?;
        let f = attached.check().map_err(|e| e.to_string())?;
        let ev = attached.stats().map_err(|e| e.to_string())?.evictions;
        attached.close().map_err(|e| e.to_string())?;
        (f.len(), ev)
    };
    let (mut handoff, mut get, mut get_warmup) = (Hist::default(), Hist::default(), Hist::default());
    for c in &dec {
        handoff.merge(&c.handoff);
        get.merge(&c.get);
        get_warmup.merge(&c.get_warmup);
    }
    let populated_ms = dec.iter().filter_map(|c| c.populated_after.map(|d| d.as_millis() as u64)).max();
    let lens = |f: fn(&WorkerCounters) -> &Vec<u32>| -> Vec<f64> {
        pre.iter().flat_map(|c| f(c).iter().map(|&x| x as f64)).collect()
    };
    let (in_m, in_sd) = mean_sd(&lens(|c| &c.input_tokens));
    let (un_m, un_sd) = mean_sd(&lens(|c| &c.unique_tokens));
    let first_error = pre.iter().chain(&dec).find_map(|c| c.first_error.clone());
    let requests = sum(&dec, |c| c.requests);
    let verify_failures = sum(&dec, |c| c.verify_failures);
    let check_ns = (sum(&pre, |c| c.check_ns), sum(&dec, |c| c.check_ns));
    let missing = sum(&dec, |c| c.missing);
    let errors = sum(&pre, |c| c.errors) + sum(&dec, |c| c.errors);
    let finished = pre.iter().chain(&dec).filter(|c| c.done).count();
    let ok = failed.is_empty()
        && finished == cfg.prefill + cfg.decode
        && verify_failures == 0
        && missing == 0
        && errors == 0
        && findings == 0
        && requests > 0
        && ssd.as_ref().is_none_or(|t| t.errors == 0 && t.write_amplification <= MAX_WRITE_AMPLIFICATION);
    let report = Report {
        ok,
        config: ReportConfig {
            prefill: cfg.prefill,
            decode: cfg.decode,
            seconds: cfg.duration.as_secs_f64(),
            block_bytes: cfg.block_bytes,
            block_min: cfg.block_min,
            region_bytes: cfg.region,
            mode: cfg.mode.name().to_string(),
            seed: cfg.seed,
        },
        wall_seconds: began.elapsed().as_secs_f64(),
        requests,
        requests_handed_off: sum(&pre, |c| c.requests),
        input_tokens: MeanSd { mean: in_m, sd: in_sd },
        unique_tokens: MeanSd { mean: un_m, sd: un_sd },
        prefix_hit_rate: sum(&pre, |c| c.hit_blocks) as f64 / sum(&pre, |c| c.blocks).max(1) as f64,
        blocks_published: sum(&pre, |c| c.published),
        bytes_published: sum(&pre, |c| c.published_bytes),
        blocks_read: sum(&dec, |c| c.read),
        bytes_read: sum(&dec, |c| c.read_bytes),
        handoff_ns: handoff.summary(),
        get_ns: get.summary(),
        get_warmup_ns: get_warmup.summary(),
        populated_ms,
        verify_failures,
        fill_ms: check_ns.0 as f64 / 1e6,
        verify_ms: check_ns.1 as f64 / 1e6,
        missing_blocks: missing,
        evictions: sum(&pre, |c| c.evictions).max(evictions_region),
        live_at_first_eviction: pre.iter().filter_map(|c| c.live_at_first_eviction).reduce(f64::min),
        errors,
        first_error,
        failed_workers: failed,
        check_findings: findings,
        ssd,
    };
    Ok((report, ok))
}

/// What the SSD tier did in a demo run.
#[derive(Debug, Serialize)]
pub struct SsdReport {
    /// Blocks copied to SSD.
    pub spills: u64,
    /// Blocks put back into the region.
    pub promotions: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// I/O or checksum errors.
    pub errors: u64,
    /// Of the blocks prefill found missing from the region, the share the
    /// SSD tier put back.
    pub hit_rate: f64,
    /// Bytes the tier wrote to its drives per byte prefill published to
    /// the region (slot headers and padding included): 1.0 when every
    /// block is copied out once, more when blocks are copied again.
    pub write_amplification: f64,
}

/// What `cxlkv demo` reports (printed, or as JSON with --json).
#[derive(Debug, Serialize)]
pub struct Report {
    /// Every check passed.
    pub ok: bool,
    pub config: ReportConfig,
    /// The whole run, seconds: formatting the region, starting the
    /// workers, the requests (`--duration`), draining the handoffs in
    /// flight and checking the region.
    pub wall_seconds: f64,
    /// Requests decoded.
    pub requests: u64,
    pub requests_handed_off: u64,
    /// Tokens per request.
    pub input_tokens: MeanSd,
    /// Tokens of a request's own part.
    pub unique_tokens: MeanSd,
    /// Share of prefill's blocks found cached.
    pub prefix_hit_rate: f64,
    pub blocks_published: u64,
    pub bytes_published: u64,
    pub blocks_read: u64,
    pub bytes_read: u64,
    /// Publish done to decode holding the request.
    pub handoff_ns: Latency,
    /// Gets once page tables were populated.
    pub get_ns: Latency,
    /// Gets while they were being populated.
    pub get_warmup_ns: Latency,
    /// When the last decode worker's page tables were populated.
    pub populated_ms: Option<u64>,
    pub verify_failures: u64,
    /// Time prefill workers spent writing the payload pattern, ms.
    pub fill_ms: f64,
    /// Time decode workers spent checking it (within the get latency), ms.
    pub verify_ms: f64,
    pub missing_blocks: u64,
    pub evictions: u64,
    /// Share of payload capacity live when evictions began.
    pub live_at_first_eviction: Option<f64>,
    pub errors: u64,
    pub first_error: Option<String>,
    pub failed_workers: Vec<String>,
    pub check_findings: usize,
    /// The SSD tier's part (with --ssd).
    pub ssd: Option<SsdReport>,
}

/// The demo's configuration, as reported.
#[derive(Debug, Serialize)]
pub struct ReportConfig {
    pub prefill: usize,
    pub decode: usize,
    pub seconds: f64,
    pub block_bytes: u64,
    pub block_min: u64,
    pub region_bytes: u64,
    pub mode: String,
    pub seed: u64,
}

/// Mean and standard deviation.
#[derive(Debug, Serialize)]
pub struct MeanSd {
    pub mean: f64,
    pub sd: f64,
}

/// Latency quantiles in nanoseconds, and how many samples.
#[derive(Debug, Serialize)]
pub struct Latency {
    pub p50: u64,
    pub p99: u64,
    pub n: u64,
}

fn partition(m: &BTreeMap<String, WorkerCounters>) -> (Vec<WorkerCounters>, Vec<WorkerCounters>) {
    let p = m.iter().filter(|(k, _)| k.starts_with("prefill")).map(|(_, v)| v.clone()).collect();
    let d = m.iter().filter(|(k, _)| k.starts_with("decode")).map(|(_, v)| v.clone()).collect();
    (p, d)
}

/// The report for people.
pub fn print(r: &Report) {
    let c = &r.config;
    let gib = |v: u64| v as f64 / (1u64 << 30) as f64;
    let blocks = if c.block_min < c.block_bytes {
        format!("{}-{} blocks", human(c.block_min), human(c.block_bytes))
    } else {
        format!("{} blocks", human(c.block_bytes))
    };
    println!(
        "cxlkv demo: {} prefill + {} decode worker processes, {:.0} s, {blocks}, {:.1} GiB region in /dev/shm, mode {}, seed {}",
        c.prefill,
        c.decode,
        c.seconds,
        gib(c.region_bytes),
        c.mode,
        c.seed
    );
    println!("  requests           {} decoded ({} handed off)", r.requests, r.requests_handed_off);
    println!(
        "  input tokens       {:.0} ± {:.0} per request (unique part {:.0} ± {:.0})",
        r.input_tokens.mean, r.input_tokens.sd, r.unique_tokens.mean, r.unique_tokens.sd
    );
    println!("  prefix hit rate    {:.1}% of blocks", 100.0 * r.prefix_hit_rate);
    println!("  published          {} blocks, {:.2} GiB", r.blocks_published, gib(r.bytes_published));
    println!("  read and verified  {} blocks, {:.2} GiB", r.blocks_read, gib(r.bytes_read));
    println!(
        "  handoff latency    p50 {:.3} ms, p99 {:.3} ms (publish done -> decode has the request)",
        r.handoff_ns.p50 as f64 / 1e6,
        r.handoff_ns.p99 as f64 / 1e6
    );
    if r.get_ns.n > 0 {
        println!(
            "  get latency        p50 {:.1} us, p99 {:.1} us per block, steady state (acquire, copy out, verify, release)",
            r.get_ns.p50 as f64 / 1e3,
            r.get_ns.p99 as f64 / 1e3
        );
    } else {
        println!("  get latency        no steady-state gets (the run ended before page tables were populated)");
    }
    if r.get_warmup_ns.n > 0 {
        println!(
            "  warm-up            p50 {:.1} us, p99 {:.1} us per block over {} gets while page tables were populated ({})",
            r.get_warmup_ns.p50 as f64 / 1e3,
            r.get_warmup_ns.p99 as f64 / 1e3,
            r.get_warmup_ns.n,
            r.populated_ms.map_or("not finished when the run ended".to_string(), |m| format!("done {m} ms after attach"))
        );
    }
    match r.live_at_first_eviction {
        Some(s) => {
            println!("  evictions          {} (began with {:.1}% of the payload capacity live)", r.evictions, 100.0 * s)
        }
        None => println!("  evictions          {}", r.evictions),
    }
    println!("  verify failures    {} (missing blocks {})", r.verify_failures, r.missing_blocks);
    let worker_ms = c.seconds * 1e3;
    println!(
        "  checker's share    fill {:.0} ms ({:.1}% of prefill time), verify {:.0} ms ({:.1}% of decode time)",
        r.fill_ms,
        100.0 * r.fill_ms / (worker_ms * c.prefill.max(1) as f64),
        r.verify_ms,
        100.0 * r.verify_ms / (worker_ms * c.decode.max(1) as f64)
    );
    println!(
        "  errors             {}{}",
        r.errors,
        r.first_error.as_ref().map(|e| format!(" (first: {e})")).unwrap_or_default()
    );
    if let Some(t) = &r.ssd {
        println!(
            "  SSD tier           {} spills ({}, {:.3} bytes written per byte published{}), {} promotions ({}), SSD hit rate {:.1}% of region misses, {} errors",
            t.spills,
            human(t.bytes_written),
            t.write_amplification,
            if t.write_amplification > MAX_WRITE_AMPLIFICATION { format!(": over {MAX_WRITE_AMPLIFICATION}") } else { String::new() },
            t.promotions,
            human(t.bytes_read),
            100.0 * t.hit_rate,
            t.errors
        );
    }
    println!("  region check       {} findings", r.check_findings);
    println!(
        "  wall time          {:.1} s: {:.1} s of requests, the rest formatting the region, starting the workers, \
         draining the handoffs in flight and checking",
        r.wall_seconds, r.config.seconds
    );
    println!("  result             {}", if r.ok { "PASS" } else { "FAIL" });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_survive_the_trip_between_processes() {
        let mut h = Hist::default();
        for v in 1..=10_000u64 {
            h.add(v * 1000);
        }
        let p50 = h.quantile(0.5);
        assert!((4_990_000..=5_010_000).contains(&p50), "{p50}");
        let p99 = h.quantile(0.99);
        assert!((9_880_000..=9_920_000).contains(&p99), "{p99}");
        let back: Hist = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
        assert_eq!(back.count(), 10_000);
        assert_eq!(back.quantile(0.5), p50);
        let mut m = Hist::default();
        m.merge(&back);
        m.merge(&back);
        assert_eq!((m.count(), m.quantile(0.99)), (20_000, p99));
    }

    #[test]
    fn requests_share_prefixes_and_look_like_serving_traffic() {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut lens = Vec::new();
        let mut firsts = std::collections::HashSet::new();
        for n in 0..2000 {
            let (t, unique) = request(&mut rng, 0, n, Duration::from_secs(30));
            assert!(t.len() <= MAX_TOKENS && unique <= t.len());
            lens.push(t.len() as f64);
            let mut k = [Key::default(); 1];
            chain_keys(Key::default(), &t, TOKENS_PER_BLOCK, &mut k);
            firsts.insert(k[0]);
        }
        assert!(firsts.len() <= 8, "every request starts with one of 8 system prompts");
        let (m, sd) = mean_sd(&lens);
        assert!((2500.0..7000.0).contains(&m) && sd > 1000.0, "mean {m} sd {sd}");
    }
}
