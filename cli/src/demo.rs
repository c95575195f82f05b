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

use cxlkv_core::channel::Message;
use cxlkv_core::hash::{chain_keys, mix64, Key};
use cxlkv_core::index::{Handle, Lru};
use cxlkv_core::layout::Capacities;
use cxlkv_core::Error as CoreError;
use cxlkv_platform::size::human;
use cxlkv_platform::{FlushMode, Node, Options, Populate, KIND_RESPONSE};
use serde_json::{json, Value};

const NS: u32 = 1;
const TOKENS_PER_BLOCK: usize = 16;
const MAX_TOKENS: usize = 16_384;
const HANDOFF: u32 = 1;
const STOP: u32 = 2;

/// What the demo runs.
#[derive(Clone, Debug)]
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
    pub mode: FlushMode,
    pub seed: u64,
    /// Requests a prefill worker keeps handed off at once (their blocks pinned).
    pub inflight: usize,
}

/// A log-linear latency histogram: 16 buckets per power of two.
#[derive(Clone, Debug, Default)]
pub struct Hist(BTreeMap<u32, u64>);

impl Hist {
    fn bucket(v: u64) -> u32 {
        if v < 16 {
            return v as u32;
        }
        let e = 63 - v.leading_zeros();
        (e - 3) * 16 + ((v >> (e - 4)) & 15) as u32
    }
    fn floor(b: u32) -> u64 {
        if b < 16 {
            return b as u64;
        }
        let e = b / 16 + 3;
        (16 + (b % 16) as u64) << (e - 4)
    }
    pub fn add(&mut self, v: u64) {
        *self.0.entry(Hist::bucket(v)).or_default() += 1;
    }
    pub fn count(&self) -> u64 {
        self.0.values().sum()
    }
    pub fn merge(&mut self, o: &Hist) {
        for (b, n) in &o.0 {
            *self.0.entry(*b).or_default() += n;
        }
    }
    /// The value below which a fraction `q` of the samples lie (bucket floor).
    pub fn quantile(&self, q: f64) -> u64 {
        let want = (self.count() as f64 * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, n) in &self.0 {
            seen += n;
            if seen >= want {
                return Hist::floor(*b);
            }
        }
        0
    }
    fn to_json(&self) -> Value {
        json!(self.0.iter().map(|(b, n)| [*b as u64, *n]).collect::<Vec<_>>())
    }
    fn from_json(v: &Value) -> Hist {
        let mut h = Hist::default();
        for p in v.as_array().into_iter().flatten() {
            if let (Some(b), Some(n)) = (p.get(0).and_then(Value::as_u64), p.get(1).and_then(Value::as_u64)) {
                *h.0.entry(b as u32).or_default() += n;
            }
        }
        h
    }
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit().max(1e-12), self.unit());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// Tokens of shared segment `id` (a system prompt, a document, a turn).
fn segment(id: u64, len: usize, out: &mut Vec<u32>) {
    out.extend((0..len as u64).map(|j| (mix64(id << 24 ^ j) % 128_000) as u32));
}

/// One synthetic request: its tokens, and how many of them are its own.
fn request(rng: &mut Rng, worker: u64, n: u64, elapsed: Duration) -> (Vec<u32>, usize) {
    let mut t = Vec::with_capacity(8192);
    // A system prompt, skewed towards the first few.
    let s = rng.below(8) * rng.below(8) / 8;
    segment(1 << 40 | s, 384 + 160 * s as usize, &mut t);
    match rng.below(10) {
        0..=3 => {
            let d = rng.below(16) * rng.below(16) / 16;
            segment(2 << 40 | d, 2048 + (mix64(d) % 4096) as usize, &mut t);
        }
        4..=7 => {
            // A conversation: its earlier turns, then this turn.
            let c = rng.below(32);
            let turns = rng.below(1 + (elapsed.as_secs() / 3).min(8));
            for k in 0..turns {
                segment(3 << 40 | c << 8 | k, 300 + (mix64(c << 8 | k) % 1200) as usize, &mut t);
            }
        }
        _ => {}
    }
    // The unique part: log-normal, mean about a thousand tokens.
    let unique = (6.3 + 1.15 * rng.normal()).exp().clamp(16.0, 8192.0) as usize;
    let unique = unique.min(MAX_TOKENS.saturating_sub(t.len()));
    segment(4 << 40 | worker << 32 | n, unique, &mut t);
    (t, unique)
}

/// The payload of block `key`: word `j` is a per-key seed mixed with `j`,
/// so a byte from another block, another offset or another time differs.
fn word(seed: u64, j: usize) -> u64 {
    seed ^ (j as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29)
}

fn seed_of(key: Key) -> u64 {
    mix64(key.lo ^ mix64(key.hi))
}

fn fill(key: Key, buf: &mut [u8]) {
    let seed = seed_of(key);
    for (j, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&word(seed, j).to_le_bytes());
    }
}

fn verify(key: Key, buf: &[u8]) -> bool {
    let seed = seed_of(key);
    buf.chunks_exact(8).enumerate().all(|(j, w)| w == word(seed, j).to_le_bytes())
}

/// The payload length of `key`'s block: the configured size, or one fixed
/// per key in the configured range (a multiple of 64 bytes).
fn len_of(cfg: &Config, key: Key) -> u64 {
    if cfg.block_min >= cfg.block_bytes {
        return cfg.block_bytes;
    }
    let span = cfg.block_bytes - cfg.block_min + 1;
    ((cfg.block_min + mix64(seed_of(key) ^ 0x1e57) % span) & !63).max(cfg.block_min)
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

/// Counters of one worker, sent as JSON lines to the parent.
#[derive(Default)]
struct Counters {
    requests: u64,
    blocks: u64,
    hit_blocks: u64,
    input_tokens: Vec<u32>,
    unique_tokens: Vec<u32>,
    published: u64,
    published_bytes: u64,
    evictions: u64,
    evicted_bytes: u64,
    read: u64,
    read_bytes: u64,
    verify_failures: u64,
    missing: u64,
    errors: u64,
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

impl Counters {
    fn error(&mut self, what: String) {
        self.errors += 1;
        self.first_error.get_or_insert(what);
    }
    fn to_json(&self, done: bool) -> Value {
        let mut v = json!({
            "done": done, "requests": self.requests, "blocks": self.blocks, "hit_blocks": self.hit_blocks,
            "published": self.published, "published_bytes": self.published_bytes,
            "evictions": self.evictions, "evicted_bytes": self.evicted_bytes,
            "read": self.read, "read_bytes": self.read_bytes, "verify_failures": self.verify_failures,
            "missing": self.missing, "errors": self.errors, "first_error": self.first_error,
            "live_at_first_eviction": self.live_at_first_eviction,
        });
        if done {
            v["handoff"] = self.handoff.to_json();
            v["get"] = self.get.to_json();
            v["get_warmup"] = self.get_warmup.to_json();
            v["populated_ms"] = json!(self.populated_after.map(|d| d.as_millis() as u64));
            v["input_tokens"] = json!(self.input_tokens);
            v["unique_tokens"] = json!(self.unique_tokens);
        }
        v
    }
}

/// Runs one worker process: `cxlkv demo-worker ROLE INDEX PATH LOCAL CONFIG-JSON`.
pub fn worker(args: &[String]) -> Result<(), String> {
    let [role, index, path, local, cfg] = args else {
        return Err("demo-worker: bad arguments".into());
    };
    let index: usize = index.parse().map_err(|_| "demo-worker: bad index")?;
    let c: Value = serde_json::from_str(cfg).map_err(|e| e.to_string())?;
    let num = |k: &str| c.get(k).and_then(Value::as_u64).unwrap_or(0);
    let cfg = Config {
        prefill: num("prefill") as usize,
        decode: num("decode") as usize,
        duration: Duration::from_millis(num("duration_ms")),
        block_bytes: num("block_bytes"),
        block_min: num("block_min"),
        region: num("region"),
        mode: c.get("mode").and_then(Value::as_str).unwrap_or("coherent").parse().map_err(|_| "bad mode")?,
        seed: num("seed"),
        inflight: num("inflight") as usize,
    };
    let node = match role.as_str() {
        "decode" => index as u32,
        _ => (cfg.decode + index) as u32,
    };
    let cache = Node::open(Path::new(path), worker_opts(&cfg, Path::new(local), node)).map_err(|e| e.to_string())?;
    let r = match role.as_str() {
        "prefill" => prefill(&cache, &cfg, index),
        "decode" => decode(&cache, &cfg),
        other => Err(format!("demo-worker: unknown role {other}")),
    };
    let closed = cache.close().map_err(|e| e.to_string());
    r.and(closed)
}

/// Records, once, how full the region was when this worker's reserves
/// first had to evict (the share of payload capacity live just after).
fn note_first_eviction(cache: &Node, c: &mut Counters) {
    if c.live_at_first_eviction.is_some() {
        return;
    }
    if cache.core().stats().is_ok_and(|s| s.evictions > 0) {
        if let Ok(s) = cache.stats() {
            c.live_at_first_eviction = Some(s.live_bytes as f64 / s.payload_bytes.max(1) as f64);
        }
    }
}

fn report(c: &Counters, done: bool) {
    println!("{}", c.to_json(done));
}

struct Inflight {
    pins: Vec<Handle>,
}

fn prefill(cache: &Node, cfg: &Config, index: usize) -> Result<(), String> {
    let node = cache.core();
    let mut c = Counters::default();
    let mut rng = Rng(cfg.seed ^ mix64(index as u64 + 1));
    let start = Instant::now();
    let mut last = Instant::now();
    let mut buf = vec![0u8; cfg.block_bytes as usize];
    let mut keys = vec![Key::default(); MAX_TOKENS / TOKENS_PER_BLOCK];
    let mut inflight: HashMap<u64, Inflight> = HashMap::new();
    let mut n = 0u64;
    while start.elapsed() < cfg.duration {
        while inflight.len() >= cfg.inflight.max(1) {
            take_answers(cache, &mut inflight, &mut c, Duration::from_millis(200))?;
        }
        take_answers(cache, &mut inflight, &mut c, Duration::ZERO)?;
        n += 1;
        let (tokens, unique) = request(&mut rng, index as u64, n, start.elapsed());
        c.input_tokens.push(tokens.len() as u32);
        c.unique_tokens.push(unique as u32);
        let nk = chain_keys(Key::default(), &tokens, TOKENS_PER_BLOCK, &mut keys);
        let chain = &keys[..nk];
        let rid = (index as u64) << 48 | n;
        match prefill_one(cache, cfg, chain, &mut buf, &mut c, &mut inflight) {
            Ok(pins) => {
                let d = (n as usize % cfg.decode.max(1)) as u32;
                let m = Message { kind: HANDOFF, request_id: rid, ns: NS, stamp: now_ns(), ..Message::default() };
                match cache.send(d, &m, chain) {
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
            report(&c, false);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !inflight.is_empty() && Instant::now() < deadline {
        take_answers(cache, &mut inflight, &mut c, Duration::from_millis(200))?;
    }
    for (_, f) in inflight.drain() {
        c.error("a handoff was never answered".into());
        let _ = node.release(&f.pins);
    }
    for d in 0..cfg.decode as u32 {
        let stop = Message { kind: STOP, ..Message::default() };
        if let Err(e) = cache.send(d, &stop, &[]) {
            c.error(format!("stop to decode {d}: {e}"));
        }
    }
    report(&c, true);
    Ok(())
}

/// Takes decode workers' answers (waiting up to `wait` for the first) and
/// releases the pins of the requests they finished.
fn take_answers(
    cache: &Node,
    inflight: &mut HashMap<u64, Inflight>,
    c: &mut Counters,
    wait: Duration,
) -> Result<(), String> {
    let mut first = !wait.is_zero();
    loop {
        let got = if first {
            first = false;
            match cache.recv(wait) {
                Ok(m) => Some(m),
                Err(e) if e.core() == Some(CoreError::Timeout) => None,
                Err(e) => return Err(e.to_string()),
            }
        } else {
            cache.try_recv().map_err(|e| e.to_string())?
        };
        let Some((m, _)) = got else { return Ok(()) };
        if m.kind == HANDOFF | KIND_RESPONSE {
            if let Some(f) = inflight.remove(&m.request_id) {
                if let Err(e) = cache.core().release(&f.pins) {
                    c.error(format!("release: {e}"));
                }
            }
        }
    }
}

/// Pins every block of `chain`: the cached prefix as found, the rest
/// computed and published. Returns the pins.
fn prefill_one(
    cache: &Node,
    cfg: &Config,
    chain: &[Key],
    buf: &mut [u8],
    c: &mut Counters,
    inflight: &mut HashMap<u64, Inflight>,
) -> Result<Vec<Handle>, String> {
    let node = cache.core();
    let hit = node.lookup(NS, chain).map_err(|e| e.to_string())?;
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
                    fill(*key, buf);
                    let published = node.write(&h, 0, buf).and_then(|_| node.publish_flushed(&[h], &mut [Ok(())]));
                    if let Err(e) = published {
                        let _ = node.abort(&h);
                        let _ = node.release(&pins);
                        return Err(format!("publish: {e}"));
                    }
                    c.published += 1;
                    c.published_bytes += len;
                    note_first_eviction(cache, c);
                }
                Err(CoreError::Exists) => {}
                Err(CoreError::OutOfSpace | CoreError::TableFull) => {
                    let rep = node.evict(cfg.block_bytes * 16, &mut Lru).map_err(|e| e.to_string())?;
                    c.evictions += rep.entries;
                    c.evicted_bytes += rep.bytes;
                    if rep.entries == 0 {
                        // Everything is pinned: wait for decode to finish some.
                        take_answers(cache, inflight, c, Duration::from_millis(20))?;
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

fn decode(cache: &Node, cfg: &Config) -> Result<(), String> {
    // Attached just before; population started then.
    let attached = Instant::now();
    let node = cache.core();
    let mut c = Counters::default();
    let mut buf = vec![0u8; cfg.block_bytes as usize];
    let mut stops = 0;
    let mut last = Instant::now();
    let give_up = Instant::now() + cfg.duration + Duration::from_secs(120);
    while stops < cfg.prefill && Instant::now() < give_up {
        let (m, keys) = match cache.recv(Duration::from_millis(200)) {
            Ok(x) => x,
            Err(e) if e.core() == Some(CoreError::Timeout) => continue,
            Err(e) => return Err(e.to_string()),
        };
        if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            report(&c, false);
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
                    let ok = len as u64 == len_of(cfg, *key)
                        && node.read(&h, 0, &mut buf[..len]).is_ok()
                        && verify(*key, &buf[..len]);
                    if let Err(e) = node.release(&[h]) {
                        c.error(format!("release: {e}"));
                    }
                    let took = t.elapsed().as_nanos() as u64;
                    if c.populated_after.is_none() && !matches!(cache.populated(), Populate::Running { .. }) {
                        c.populated_after = Some(attached.elapsed());
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
                if let Err(e) = cache.reply(&m, bad, &[]) {
                    c.error(format!("answer: {e}"));
                }
            }
            other => c.error(format!("unexpected message kind {other}")),
        }
    }
    if stops < cfg.prefill {
        c.error("not every prefill worker said stop".into());
    }
    report(&c, true);
    Ok(())
}

/// The merged reports of every worker.
#[derive(Default)]
struct Totals {
    prefill: Vec<Value>,
    decode: Vec<Value>,
}

fn sum(vs: &[Value], k: &str) -> u64 {
    vs.iter().filter_map(|v| v.get(k).and_then(Value::as_u64)).sum()
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
pub fn run(cfg: &Config, progress: bool) -> Result<(Value, bool), String> {
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
    let conf = json!({
        "prefill": cfg.prefill, "decode": cfg.decode, "duration_ms": cfg.duration.as_millis() as u64,
        "block_bytes": cfg.block_bytes, "block_min": cfg.block_min, "region": cfg.region, "mode": cfg.mode.name(),
        "seed": cfg.seed, "inflight": cfg.inflight,
    })
    .to_string();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let latest: Arc<Mutex<BTreeMap<String, Value>>> = Arc::default();
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
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if let Ok(mut m) = l2.lock() {
                        m.insert(n2.clone(), v);
                    }
                }
            }
        });
        children.push((name, child, reader));
    }
    let start = Instant::now();
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
        if progress && start.elapsed().as_millis() % 1000 < 250 {
            let m = latest.lock().map(|m| m.clone()).unwrap_or_default();
            let (p, d): (Vec<Value>, Vec<Value>) = partition(&m);
            eprint!(
                "\r[{:>4.0}s] requests {:>5} handed off, {:>5} decoded; blocks {:>7} published, {:>7} read; hit {:>5.1}%; evicted {:>6}   ",
                start.elapsed().as_secs_f64(),
                sum(&p, "requests"),
                sum(&d, "requests"),
                sum(&p, "published"),
                sum(&d, "read"),
                100.0 * sum(&p, "hit_blocks") as f64 / sum(&p, "blocks").max(1) as f64,
                sum(&p, "evictions"),
            );
        }
    }
    if progress {
        eprintln!();
    }
    for (_, _, reader) in children {
        let _ = reader.join();
    }
    let m = latest.lock().map(|m| m.clone()).unwrap_or_default();
    let (p, d) = partition(&m);
    let tot = Totals { prefill: p, decode: d };
    // The region is whole after the run: check it and its stats.
    let (findings, evictions_region) = {
        let opts = Options { mode: cfg.mode, local_dir: local.clone(), ..Options::default() };
        let cache = Node::open(&path, opts).map_err(|e| e.to_string())?;
        let f = cache.check().map_err(|e| e.to_string())?;
        let ev = cache.stats().map_err(|e| e.to_string())?.evictions;
        cache.close().map_err(|e| e.to_string())?;
        (f.len(), ev)
    };
    let mut handoff = Hist::default();
    let mut get = Hist::default();
    let mut get_warmup = Hist::default();
    for v in &tot.decode {
        handoff.merge(&Hist::from_json(&v["handoff"]));
        get.merge(&Hist::from_json(&v["get"]));
        get_warmup.merge(&Hist::from_json(&v["get_warmup"]));
    }
    let populated_ms = tot.decode.iter().filter_map(|v| v["populated_ms"].as_u64()).max();
    let lens = |k: &str| -> Vec<f64> {
        tot.prefill
            .iter()
            .flat_map(|v| v[k].as_array().cloned().unwrap_or_default())
            .filter_map(|x| x.as_f64())
            .collect()
    };
    let (in_m, in_sd) = mean_sd(&lens("input_tokens"));
    let (un_m, un_sd) = mean_sd(&lens("unique_tokens"));
    let first_error = tot
        .prefill
        .iter()
        .chain(&tot.decode)
        .find_map(|v| v.get("first_error").and_then(Value::as_str).map(str::to_string));
    let requests = sum(&tot.decode, "requests");
    let verify_failures = sum(&tot.decode, "verify_failures");
    let missing = sum(&tot.decode, "missing");
    let errors = sum(&tot.prefill, "errors") + sum(&tot.decode, "errors");
    let finished = tot.prefill.iter().chain(&tot.decode).filter(|v| v["done"] == json!(true)).count();
    let ok = failed.is_empty()
        && finished == cfg.prefill + cfg.decode
        && verify_failures == 0
        && missing == 0
        && errors == 0
        && findings == 0
        && requests > 0;
    let report = json!({
        "ok": ok,
        "config": {"prefill": cfg.prefill, "decode": cfg.decode, "seconds": cfg.duration.as_secs_f64(),
                   "block_bytes": cfg.block_bytes, "block_min": cfg.block_min, "region_bytes": cfg.region, "mode": cfg.mode.name(), "seed": cfg.seed},
        "wall_seconds": start.elapsed().as_secs_f64(),
        "requests": requests,
        "requests_handed_off": sum(&tot.prefill, "requests"),
        "input_tokens": {"mean": in_m, "sd": in_sd},
        "unique_tokens": {"mean": un_m, "sd": un_sd},
        "prefix_hit_rate": sum(&tot.prefill, "hit_blocks") as f64 / sum(&tot.prefill, "blocks").max(1) as f64,
        "blocks_published": sum(&tot.prefill, "published"),
        "bytes_published": sum(&tot.prefill, "published_bytes"),
        "blocks_read": sum(&tot.decode, "read"),
        "bytes_read": sum(&tot.decode, "read_bytes"),
        "handoff_ns": {"p50": handoff.quantile(0.5), "p99": handoff.quantile(0.99), "n": handoff.count()},
        "get_ns": {"p50": get.quantile(0.5), "p99": get.quantile(0.99), "n": get.count()},
        "get_warmup_ns": {"p50": get_warmup.quantile(0.5), "p99": get_warmup.quantile(0.99), "n": get_warmup.count()},
        "populated_ms": populated_ms,
        "verify_failures": verify_failures,
        "missing_blocks": missing,
        "evictions": sum(&tot.prefill, "evictions").max(evictions_region),
        "live_at_first_eviction": tot.prefill.iter().filter_map(|w| w["live_at_first_eviction"].as_f64()).reduce(f64::min),
        "errors": errors,
        "first_error": first_error,
        "failed_workers": failed,
        "check_findings": findings,
    });
    Ok((report, ok))
}

fn partition(m: &BTreeMap<String, Value>) -> (Vec<Value>, Vec<Value>) {
    let p = m.iter().filter(|(k, _)| k.starts_with("prefill")).map(|(_, v)| v.clone()).collect();
    let d = m.iter().filter(|(k, _)| k.starts_with("decode")).map(|(_, v)| v.clone()).collect();
    (p, d)
}

/// The report for people.
pub fn print(r: &Value) {
    let c = &r["config"];
    let gib = |v: &Value| v.as_u64().unwrap_or(0) as f64 / (1u64 << 30) as f64;
    let ms = |v: &Value| v.as_u64().unwrap_or(0) as f64 / 1e6;
    let us = |v: &Value| v.as_u64().unwrap_or(0) as f64 / 1e3;
    let (lo, hi) = (c["block_min"].as_u64().unwrap_or(0), c["block_bytes"].as_u64().unwrap_or(0));
    let blocks = if lo < hi { format!("{}-{} blocks", human(lo), human(hi)) } else { format!("{} blocks", human(hi)) };
    println!("cxlkv demo: {} prefill + {} decode worker processes, {:.0} s, {blocks}, {:.1} GiB region in /dev/shm, mode {}, seed {}",
        c["prefill"], c["decode"], c["seconds"].as_f64().unwrap_or(0.0),
        gib(&c["region_bytes"]), c["mode"].as_str().unwrap_or("?"), c["seed"]);
    println!("  requests           {} decoded ({} handed off)", r["requests"], r["requests_handed_off"]);
    println!(
        "  input tokens       {:.0} ± {:.0} per request (unique part {:.0} ± {:.0})",
        r["input_tokens"]["mean"].as_f64().unwrap_or(0.0),
        r["input_tokens"]["sd"].as_f64().unwrap_or(0.0),
        r["unique_tokens"]["mean"].as_f64().unwrap_or(0.0),
        r["unique_tokens"]["sd"].as_f64().unwrap_or(0.0)
    );
    println!("  prefix hit rate    {:.1}% of blocks", 100.0 * r["prefix_hit_rate"].as_f64().unwrap_or(0.0));
    println!("  published          {} blocks, {:.2} GiB", r["blocks_published"], gib(&r["bytes_published"]));
    println!("  read and verified  {} blocks, {:.2} GiB", r["blocks_read"], gib(&r["bytes_read"]));
    println!(
        "  handoff latency    p50 {:.3} ms, p99 {:.3} ms (publish done -> decode has the request)",
        ms(&r["handoff_ns"]["p50"]),
        ms(&r["handoff_ns"]["p99"])
    );
    println!(
        "  get latency        p50 {:.1} us, p99 {:.1} us per block, steady state (acquire, copy out, verify, release)",
        us(&r["get_ns"]["p50"]),
        us(&r["get_ns"]["p99"])
    );
    if r["get_warmup_ns"]["n"].as_u64().unwrap_or(0) > 0 {
        println!(
            "  warm-up            p50 {:.1} us, p99 {:.1} us per block over {} gets while page tables were populated ({} ms after attach)",
            us(&r["get_warmup_ns"]["p50"]),
            us(&r["get_warmup_ns"]["p99"]),
            r["get_warmup_ns"]["n"],
            r["populated_ms"].as_u64().map_or("not finished".to_string(), |m| m.to_string())
        );
    }
    match r["live_at_first_eviction"].as_f64() {
        Some(s) => println!(
            "  evictions          {} (began with {:.1}% of the payload capacity live)",
            r["evictions"],
            100.0 * s
        ),
        None => println!("  evictions          {}", r["evictions"]),
    }
    println!("  verify failures    {} (missing blocks {})", r["verify_failures"], r["missing_blocks"]);
    println!(
        "  errors             {}{}",
        r["errors"],
        r["first_error"].as_str().map(|e| format!(" (first: {e})")).unwrap_or_default()
    );
    println!("  region check       {} findings", r["check_findings"]);
    println!("  result             {}", if r["ok"] == json!(true) { "PASS" } else { "FAIL" });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_fall_in_their_bucket() {
        let mut h = Hist::default();
        for v in 1..=10_000u64 {
            h.add(v * 1000);
        }
        let p50 = h.quantile(0.5);
        assert!((4_700_000..=5_000_000).contains(&p50), "{p50}");
        let p99 = h.quantile(0.99);
        assert!((9_400_000..=9_900_000).contains(&p99), "{p99}");
        let back = Hist::from_json(&h.to_json());
        assert_eq!(back.count(), 10_000);
        assert_eq!(back.quantile(0.5), p50);
        for v in [0u64, 1, 15, 16, 17, 1 << 20, u64::MAX / 2] {
            assert!(Hist::floor(Hist::bucket(v)) <= v);
        }
    }

    #[test]
    fn a_payload_verifies_only_against_its_own_key() {
        let (a, b) = (Key { lo: 1, hi: 2 }, Key { lo: 1, hi: 3 });
        let mut buf = vec![0u8; 4096];
        fill(a, &mut buf);
        assert!(verify(a, &buf));
        assert!(!verify(b, &buf));
        buf[4000] ^= 1;
        assert!(!verify(a, &buf));
    }

    #[test]
    fn requests_share_prefixes_and_look_like_serving_traffic() {
        let mut rng = Rng(7);
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
