//! A demo worker process: prefill (look up the cached prefix, publish what
//! is missing, hand the request off with its blocks pinned) or decode
//! (acquire, verify every byte, release, answer), and the synthetic
//! requests they replay.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use cxlkv_platform::kv::CoreError;
use cxlkv_platform::kv::Handle;
use cxlkv_platform::kv::Message;
use cxlkv_platform::kv::{chain_keys, mix64, Key, Namespace};
use cxlkv_platform::{pattern, Node, Populate, KIND_RESPONSE};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::LogNormal;
use serde::{Deserialize, Serialize};

use super::config::{len_of, tenant_plan, worker_opts, Config, HANDOFF, MAX_TOKENS, NS, STOP, TOKENS_PER_BLOCK};
use super::report::Hist;

pub(super) fn now_ns() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Tokens of shared segment `id` (a system prompt, a document, a turn).
pub(super) fn segment(id: u64, len: usize, out: &mut Vec<u32>) {
    out.extend((0..len as u64).map(|j| (mix64(id << 24 ^ j) % 128_000) as u32));
}

/// One synthetic request: its tokens, and how many of them are its own.
pub(super) fn request(rng: &mut SmallRng, worker: u64, n: u64, elapsed: Duration) -> (Vec<u32>, usize) {
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
pub(super) fn below(rng: &mut SmallRng, n: u64) -> u64 {
    rng.random_range(0..n.max(1))
}

/// The length of a request's own part, in tokens: log-normal, mean about a
/// thousand.
pub(super) fn unique_tokens() -> LogNormal<f64> {
    LogNormal::new(6.3, 1.15).unwrap_or_else(|_| unreachable!("a positive sigma"))
}

/// Counters of one worker, sent as JSON lines to the parent.
#[derive(Clone, Default, Serialize, Deserialize)]
pub(super) struct WorkerCounters {
    /// The worker finished its run (its last line).
    pub(super) done: bool,
    pub(super) requests: u64,
    /// Requests of an open-loop run (`--rate`) started more than one
    /// interval after their turn: the machine did not keep up.
    #[serde(default)]
    pub(super) late: u64,
    pub(super) blocks: u64,
    pub(super) hit_blocks: u64,
    /// Of the blocks missing from the region, those the SSD tier put back.
    pub(super) ssd_blocks: u64,
    pub(super) input_tokens: Vec<u32>,
    pub(super) unique_tokens: Vec<u32>,
    pub(super) published: u64,
    pub(super) published_bytes: u64,
    pub(super) evictions: u64,
    pub(super) evicted_bytes: u64,
    /// Evictions this worker's node made, as the region counts them (its
    /// reserves evict too, not only its explicit evict calls).
    pub(super) node_evictions: u64,
    pub(super) read: u64,
    pub(super) read_bytes: u64,
    pub(super) verify_failures: u64,
    pub(super) missing: u64,
    pub(super) errors: u64,
    /// Nanoseconds spent writing (prefill) or checking (decode) the payload
    /// pattern: the demo's own work, not the store's.
    pub(super) check_ns: u64,
    pub(super) handoff: Hist,
    /// Gets once this process's page tables of the region were populated.
    pub(super) get: Hist,
    /// Gets while they were still being populated (first touches fault).
    pub(super) get_warmup: Hist,
    /// How long after attaching the population finished.
    pub(super) populated_after: Option<Duration>,
    pub(super) first_error: Option<String>,
    /// Share of the payload capacity live when this worker first evicted.
    pub(super) live_at_first_eviction: Option<f64>,
    /// The tenant this prefill worker serves (`--tenants`).
    #[serde(default)]
    pub(super) tenant: Option<usize>,
    /// Requests refused at the tenant's hard quota (every block of its own
    /// pinned, none in flight to wait for): not handed off.
    #[serde(default)]
    pub(super) refused: u64,
}

impl WorkerCounters {
    pub(super) fn error(&mut self, what: String) {
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
pub(super) fn note_first_eviction(attached: &Node, c: &mut WorkerCounters) {
    if c.live_at_first_eviction.is_some() {
        return;
    }
    if attached.core().stats().is_ok_and(|s| s.evictions > 0) {
        if let Ok(s) = attached.stats() {
            c.live_at_first_eviction = Some(s.live_bytes as f64 / s.payload_bytes.max(1) as f64);
        }
    }
}

pub(super) fn report(c: &mut WorkerCounters, done: bool) {
    c.done = done;
    println!("{}", serde_json::to_string(c).unwrap_or_default());
}

pub(super) struct Inflight {
    pub(super) pins: Vec<Handle>,
}

/// Waits until every decode worker's node (ids 0..decode) is attached: a
/// handoff sent before would find no node there (a worker process starts
/// slowly on a busy machine). At most a minute.
pub(super) fn await_decoders(attached: &Node, decode: usize) -> Result<(), String> {
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

/// The namespace prefill worker `index` stores in, and the requests a
/// second it starts (`None`: as many as it can; see `--rate` and
/// [`tenant_plan`]).
fn namespace_and_rate(attached: &Node, cfg: &Config, index: usize) -> Result<(u32, Option<f64>), String> {
    if cfg.tenants == 0 {
        return Ok((NS, cfg.rate.map(|r| r / cfg.prefill.max(1) as f64)));
    }
    let (name, _, rate) = tenant_plan(index % cfg.tenants, 0);
    let t = attached
        .tenant_find(name.as_bytes())
        .map_err(|e| format!("tenant {name}: {e}"))?
        .ok_or_else(|| format!("no tenant {name}"))?;
    let ns = attached
        .namespace_in(t, &Namespace { model: b"cxlkv-demo", ..Namespace::default() })
        .map_err(|e| format!("namespace of tenant {name}: {e}"))?;
    Ok((ns, rate))
}

pub(super) fn prefill(attached: &Node, cfg: &Config, index: usize) -> Result<(), String> {
    await_decoders(attached, cfg.decode)?;
    let node = attached.core();
    let (ns, rate) = namespace_and_rate(attached, cfg, index)?;
    let mut c = WorkerCounters { tenant: (cfg.tenants > 0).then(|| index % cfg.tenants), ..Default::default() };
    let mut rng = SmallRng::seed_from_u64(cfg.seed ^ mix64(index as u64 + 1));
    let start = Instant::now();
    let mut last = Instant::now();
    let mut buf = vec![0u8; cfg.block_bytes as usize];
    let mut keys = vec![Key::default(); MAX_TOKENS / TOKENS_PER_BLOCK];
    let mut inflight: HashMap<u64, Inflight> = HashMap::new();
    let mut n = 0u64;
    // An open loop (`--rate`, or a tenant's rate): this worker's k-th
    // request is due at `start + (k * prefill + index) / rate`, the
    // workers taking turns (`rate` is this worker's part).
    let every = rate.map(|r| Duration::from_secs_f64(1.0 / r));
    let offset = match cfg.rate {
        Some(r) if cfg.tenants == 0 => Duration::from_secs_f64(index as f64 / r),
        _ => Duration::ZERO,
    };
    while start.elapsed() < cfg.duration {
        let due =
            every.map(|every| (every, start + offset + every.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX))));
        if let Some((_, due)) = due {
            if due.duration_since(start) >= cfg.duration {
                break;
            }
            // Answers are taken while waiting for the turn (their pins go).
            while let Some(left) = due.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
                take_answers(attached, &mut inflight, &mut c, left)?;
            }
        }
        while inflight.len() >= cfg.inflight.max(1) {
            take_answers(attached, &mut inflight, &mut c, Duration::from_millis(200))?;
        }
        if due.is_some_and(|(every, due)| Instant::now().duration_since(due) > every) {
            c.late += 1;
        }
        take_answers(attached, &mut inflight, &mut c, Duration::ZERO)?;
        n += 1;
        let (tokens, unique) = request(&mut rng, index as u64, n, start.elapsed());
        c.input_tokens.push(tokens.len() as u32);
        c.unique_tokens.push(unique as u32);
        let nk = chain_keys(Key::default(), &tokens, TOKENS_PER_BLOCK, &mut keys);
        let chain = &keys[..nk];
        let rid = (index as u64) << 48 | n;
        match prefill_one(attached, cfg, ns, chain, &mut buf, &mut c, &mut inflight) {
            Ok(None) => c.refused += 1,
            Ok(Some(pins)) => {
                let d = (n as usize % cfg.decode.max(1)) as u32;
                let m = Message { kind: HANDOFF, request_id: rid, ns, stamp: now_ns(), ..Message::default() };
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
pub(super) fn take_answers(
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

/// Pins every block of `chain` in namespace `ns`: the cached prefix as
/// found, the rest computed and published. Returns the pins; `None` when
/// the tenant's hard quota refused a block while every block of its own
/// was pinned and none of this worker's requests was in flight to wait
/// for (the request is dropped, its pins released).
pub(super) fn prefill_one(
    attached: &Node,
    cfg: &Config,
    ns: u32,
    chain: &[Key],
    buf: &mut [u8],
    c: &mut WorkerCounters,
    inflight: &mut HashMap<u64, Inflight>,
) -> Result<Option<Vec<Handle>>, String> {
    let node = attached.core();
    let mut hit = node.lookup(ns, chain).map_err(|e| e.to_string())?;
    if cfg.ssd.is_some() && hit < chain.len() {
        // The prefix goes on where the SSD tier holds the next blocks.
        let there = attached.promote(ns, &chain[hit..], Duration::from_secs(2)).map_err(|e| e.to_string())?;
        let more = there.iter().take_while(|&&t| t).count();
        c.ssd_blocks += more as u64;
        hit += more;
    }
    let mut out = vec![Err(CoreError::NotFound); chain.len()];
    node.acquire(ns, &chain[..hit], &mut out[..hit]).map_err(|e| e.to_string())?;
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
            match node.reserve(ns, *key, len, TOKENS_PER_BLOCK as u32) {
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
                Err(CoreError::OverQuota) => {
                    // Every block of the tenant's own is pinned: wait for
                    // decode to finish some, or give the request up.
                    if inflight.is_empty() {
                        let _ = node.release(&pins);
                        return Ok(None);
                    }
                    take_answers(attached, inflight, c, Duration::from_millis(20))?;
                    continue;
                }
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
            node.acquire(ns, std::slice::from_ref(key), &mut one).map_err(|e| e.to_string())?;
            match one[0] {
                Ok(h) => {
                    pins.push(h);
                    break;
                }
                Err(_) => std::thread::sleep(Duration::from_micros(100)),
            }
        }
    }
    Ok(Some(pins))
}

pub(super) fn decode(attached: &Node, cfg: &Config) -> Result<(), String> {
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
