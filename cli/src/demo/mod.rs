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
//!
//! With `--tenants N` the prefill workers serve N tenants with different
//! request rates, quotas and shares (see `config::tenant_plan`), and a
//! watcher samples every tenant's usage through the run: the run passes
//! only if no tenant was ever seen over its hard quota, nor below its
//! guaranteed share once it had reached it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cxlkv_platform::kv::Capacities;
use cxlkv_platform::{Node, Options};

mod config;
mod report;
mod worker;

use config::{caps, tenant_plan};
pub use config::{Config, MAX_DEMO_TENANTS, MAX_WRITE_AMPLIFICATION};
pub use report::{print, Report};
use report::{Hist, MeanSd, ReportConfig, SsdReport, TenantReport};
pub use worker::worker;
use worker::WorkerCounters;

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

/// The worker processes of a run, each with the thread reading its
/// counters.
type Workers = Vec<(String, Child, std::thread::JoinHandle<()>)>;

/// The latest counters of each worker, by name.
type Latest = Arc<Mutex<BTreeMap<String, WorkerCounters>>>;

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
        let added = add_tenants(&fmt, cfg);
        fmt.close().map_err(|e| e.to_string())?;
        added?;
    }
    // A tier directory the demo makes (it did not exist) goes at the end.
    let made_ssd_dir = cfg.ssd.as_ref().filter(|d| !d.exists()).cloned();
    let tier = start_tier(cfg, &path, &local, caps)?;
    let latest: Latest = Arc::default();
    // The watcher samples until the sender goes.
    let (stop, stopped) = channel::<()>();
    let watcher = (cfg.tenants > 0).then(|| watch_tenants(cfg, &path, &local, caps, stopped));
    let children = spawn_workers(cfg, &path, &local, &latest)?;
    let failed = watch(children, &latest, progress);
    drop(stop);
    let watched = match watcher {
        Some(w) => Some(w.join().map_err(|_| "the tenant watcher panicked".to_string())??),
        None => None,
    };
    let m = latest.lock().map(|m| m.clone()).unwrap_or_default();
    let (pre, dec) = partition(&m);
    let ssd = match tier {
        Some(t) => {
            let r = ssd_report(t, &pre);
            let _ = cfg.ssd.as_ref().map(|d| std::fs::remove_file(d.join("cxlkv-tier.slots")));
            // Only if empty: anything else in it is not the demo's.
            let _ = made_ssd_dir.as_ref().map(std::fs::remove_dir);
            Some(r?)
        }
        None => None,
    };
    // The region is whole after the run: check it and its stats.
    let (findings, evictions_region, listed) = {
        let opts = Options { mode: cfg.mode, local_dir: local.clone(), ..Options::default() };
        let attached = Node::open(&path, opts).map_err(|e| e.to_string())?;
        let f = attached.check().map_err(|e| e.to_string())?;
        let ev = attached.stats().map_err(|e| e.to_string())?.evictions;
        let listed = attached.tenant_list().map_err(|e| e.to_string())?;
        attached.close().map_err(|e| e.to_string())?;
        (f.len(), ev, listed)
    };
    let tenants = watched.map(|w| tenant_reports(cfg, &pre, &listed, &w));
    let ended = Ended { began, failed, findings, evictions_region, ssd, tenants };
    Ok(summarize(cfg, &pre, &dec, ended))
}

/// Adds the tenants of a `--tenants` run (none otherwise), their limits
/// set from the region's payload capacity.
fn add_tenants(node: &Node, cfg: &Config) -> Result<(), String> {
    if cfg.tenants == 0 {
        return Ok(());
    }
    let payload = node.stats().map_err(|e| e.to_string())?.payload_bytes;
    for k in 0..cfg.tenants {
        let (name, limits, _) = tenant_plan(k, payload);
        node.tenant_add(name.as_bytes(), limits).map_err(|e| format!("tenant {name}: {e}"))?;
    }
    Ok(())
}

/// What the watcher saw of one tenant.
#[derive(Clone, Debug, Default)]
struct Watched {
    samples: u64,
    max_bytes: u64,
    /// It held its share at some sample.
    reached_share: bool,
    /// The least it held once it had reached its share.
    min_after_share: Option<u64>,
    /// Samples over its hard quota.
    over_quota: u64,
    /// Samples below its share once it had reached it.
    below_share: u64,
}

impl Watched {
    /// One sample: the tenant holds `bytes` under a hard `quota` and a
    /// guaranteed `share` (0: none).
    fn see(&mut self, bytes: u64, quota: u64, share: u64) {
        self.samples += 1;
        self.max_bytes = self.max_bytes.max(bytes);
        self.over_quota += u64::from(quota != 0 && bytes > quota);
        if self.reached_share {
            self.min_after_share = Some(self.min_after_share.map_or(bytes, |m| m.min(bytes)));
            self.below_share += u64::from(bytes < share);
        }
        self.reached_share |= share != 0 && bytes >= share;
    }
}

/// Samples every tenant's usage (its own node, the slot below the SSD
/// tier's) every 20 ms until `stop`'s sender goes: by tenant name, what
/// it saw.
fn watch_tenants(
    cfg: &Config,
    path: &Path,
    local: &Path,
    caps: Capacities,
    stop: Receiver<()>,
) -> std::thread::JoinHandle<Result<BTreeMap<String, Watched>, String>> {
    let opts = Options {
        mode: cfg.mode,
        local_dir: local.to_path_buf(),
        node: Some(caps.max_nodes - 2),
        ..Options::default()
    };
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let node = Node::open(&path, opts).map_err(|e| format!("tenant watcher: {e}"))?;
        let mut seen: BTreeMap<String, Watched> = BTreeMap::new();
        let mut r = Ok(());
        while stop.recv_timeout(Duration::from_millis(20)) == Err(RecvTimeoutError::Timeout) {
            let list = match node.tenant_list() {
                Ok(l) => l,
                Err(e) => {
                    r = Err(format!("tenant watcher: {e}"));
                    break;
                }
            };
            for t in list.iter().filter(|t| t.id.slot != 0) {
                let w = seen.entry(String::from_utf8_lossy(t.name()).into_owned()).or_default();
                w.see(t.bytes, t.limits.quota, t.limits.share);
            }
        }
        node.close().map_err(|e| e.to_string())?;
        r.map(|()| seen)
    })
}

/// Each tenant's part of a `--tenants` run: its workers' requests and
/// hits (`pre`), its usage at the end (`listed`) and what the watcher saw.
fn tenant_reports(
    cfg: &Config,
    pre: &[WorkerCounters],
    listed: &[cxlkv_platform::tenants::TenantInfo],
    watched: &BTreeMap<String, Watched>,
) -> Vec<TenantReport> {
    (0..cfg.tenants)
        .map(|k| {
            let (name, _, rate) = tenant_plan(k, 0);
            let mine: Vec<WorkerCounters> = pre.iter().filter(|c| c.tenant == Some(k)).cloned().collect();
            let end = listed.iter().find(|t| t.name() == name.as_bytes());
            let w = watched.get(&name).cloned().unwrap_or_default();
            TenantReport {
                quota: end.map_or(0, |t| t.limits.quota),
                share: end.map_or(0, |t| t.limits.share),
                rate,
                workers: mine.len(),
                requests: sum(&mine, |c| c.requests),
                refused_requests: sum(&mine, |c| c.refused),
                hit_rate: sum(&mine, |c| c.hit_blocks) as f64 / sum(&mine, |c| c.blocks).max(1) as f64,
                bytes: end.map_or(0, |t| t.bytes),
                bytes_max: w.max_bytes,
                bytes_min_after_share: w.min_after_share,
                evictions: end.map_or(0, |t| t.evictions),
                refused_reserves: end.map_or(0, |t| t.refused),
                samples: w.samples,
                quota_held: w.over_quota == 0 && end.is_some_and(|t| t.limits.quota == 0 || t.bytes <= t.limits.quota),
                share_held: w.below_share == 0,
                name,
            }
        })
        .collect()
}

/// The SSD tier of a run, in this process, on its own node (the last slot).
fn start_tier(
    cfg: &Config,
    path: &Path,
    local: &Path,
    caps: Capacities,
) -> Result<Option<cxlkv_platform::Tier>, String> {
    let Some(dir) = &cfg.ssd else { return Ok(None) };
    let opts = Options {
        mode: cfg.mode,
        local_dir: local.to_path_buf(),
        node: Some(caps.max_nodes - 1),
        ..Options::default()
    };
    let owner = Arc::new(Node::open(path, opts).map_err(|e| format!("tier node: {e}"))?);
    let topts = cxlkv_platform::TierOptions {
        dirs: vec![dir.clone()],
        slot_bytes: cfg.block_bytes,
        capacity: (cfg.region * 2).min(8 << 30),
        high_water: 0.6,
        batch: 32,
    };
    Ok(Some(cxlkv_platform::Tier::start(owner, topts).map_err(|e| format!("tier: {e}"))?))
}

/// Starts the decode, then the prefill worker processes, each with a
/// thread keeping its latest counters in `latest`.
fn spawn_workers(cfg: &Config, path: &Path, local: &Path, latest: &Latest) -> Result<Workers, String> {
    let conf = serde_json::to_string(cfg).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children: Workers = Vec::new();
    let roles = (0..cfg.decode).map(|i| ("decode", i)).chain((0..cfg.prefill).map(|i| ("prefill", i)));
    for (role, i) in roles {
        let mut child = Command::new(&exe)
            .args(["demo-worker", role, &i.to_string()])
            .arg(path)
            .arg(local)
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
    Ok(children)
}

/// Waits for every worker to end, showing progress on stderr: a terminal
/// gets one line rewritten every second; a log, a line every five seconds.
/// Returns the workers that failed.
fn watch(mut children: Workers, latest: &Latest, progress: bool) -> Vec<String> {
    let start = Instant::now();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut failed = Vec::new();
    let mut running = children.len();
    let every = Duration::from_secs(if tty { 1 } else { 5 });
    let mut next_line = every;
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
        // Due by the clock, not by a window of it: a loaded machine's
        // sleeps overshoot, and a window could be missed every time.
        if progress && start.elapsed() >= next_line {
            next_line += every;
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
    failed
}

/// Stops the SSD tier and reports what it did (`pre`: the prefill workers'
/// counters).
fn ssd_report(t: cxlkv_platform::Tier, pre: &[WorkerCounters]) -> Result<SsdReport, String> {
    let st = t.stats();
    t.stop().map_err(|e| format!("tier: {e}"))?;
    let missing = sum(pre, |c| c.blocks) - sum(pre, |c| c.hit_blocks - c.ssd_blocks);
    Ok(SsdReport {
        spills: st.spills,
        promotions: st.promotions,
        bytes_written: st.bytes_written,
        bytes_read: st.bytes_read,
        errors: st.errors,
        hit_rate: sum(pre, |c| c.ssd_blocks) as f64 / missing.max(1) as f64,
        write_amplification: st.bytes_written as f64 / sum(pre, |c| c.published_bytes).max(1) as f64,
    })
}

/// How a run ended, besides its workers' counters.
struct Ended {
    began: Instant,
    failed: Vec<String>,
    findings: usize,
    evictions_region: u64,
    ssd: Option<SsdReport>,
    tenants: Option<Vec<TenantReport>>,
}

/// The report of a run from its workers' counters (`pre`: prefill, `dec`:
/// decode), and whether it passed.
fn summarize(cfg: &Config, pre: &[WorkerCounters], dec: &[WorkerCounters], end: Ended) -> (Report, bool) {
    let Ended { began, failed, findings, evictions_region, ssd, tenants } = end;
    let (mut handoff, mut get, mut get_warmup) = (Hist::default(), Hist::default(), Hist::default());
    for c in dec {
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
    let first_error = pre.iter().chain(dec).find_map(|c| c.first_error.clone());
    let requests = sum(dec, |c| c.requests);
    let verify_failures = sum(dec, |c| c.verify_failures);
    let check_ns = (sum(pre, |c| c.check_ns), sum(dec, |c| c.check_ns));
    let missing = sum(dec, |c| c.missing);
    let errors = sum(pre, |c| c.errors) + sum(dec, |c| c.errors);
    let finished = pre.iter().chain(dec).filter(|c| c.done).count();
    let ok = failed.is_empty()
        && finished == cfg.prefill + cfg.decode
        && verify_failures == 0
        && missing == 0
        && errors == 0
        && findings == 0
        && requests > 0
        && ssd.as_ref().is_none_or(|t| t.errors == 0 && t.write_amplification <= MAX_WRITE_AMPLIFICATION)
        && tenants.as_ref().is_none_or(|ts| ts.iter().all(|t| t.quota_held && t.share_held && t.samples > 0));
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
            rate: cfg.rate,
            tenants: cfg.tenants,
        },
        wall_seconds: began.elapsed().as_secs_f64(),
        requests,
        requests_handed_off: sum(pre, |c| c.requests),
        requests_late: sum(pre, |c| c.late),
        input_tokens: MeanSd { mean: in_m, sd: in_sd },
        unique_tokens: MeanSd { mean: un_m, sd: un_sd },
        prefix_hit_rate: sum(pre, |c| c.hit_blocks) as f64 / sum(pre, |c| c.blocks).max(1) as f64,
        blocks_published: sum(pre, |c| c.published),
        bytes_published: sum(pre, |c| c.published_bytes),
        blocks_read: sum(dec, |c| c.read),
        bytes_read: sum(dec, |c| c.read_bytes),
        handoff_ns: handoff.summary(),
        get_ns: get.summary(),
        get_warmup_ns: get_warmup.summary(),
        populated_ms,
        verify_failures,
        fill_ms: check_ns.0 as f64 / 1e6,
        verify_ms: check_ns.1 as f64 / 1e6,
        missing_blocks: missing,
        evictions: sum(pre, |c| c.evictions).max(evictions_region),
        live_at_first_eviction: pre.iter().filter_map(|c| c.live_at_first_eviction).reduce(f64::min),
        errors,
        first_error,
        failed_workers: failed,
        check_findings: findings,
        ssd,
        tenants,
    };
    (report, ok)
}

fn partition(m: &BTreeMap<String, WorkerCounters>) -> (Vec<WorkerCounters>, Vec<WorkerCounters>) {
    let p = m.iter().filter(|(k, _)| k.starts_with("prefill")).map(|(_, v)| v.clone()).collect();
    let d = m.iter().filter(|(k, _)| k.starts_with("decode")).map(|(_, v)| v.clone()).collect();
    (p, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::config::{MAX_TOKENS, TOKENS_PER_BLOCK};
    use crate::demo::worker::request;
    use cxlkv_platform::kv::{chain_keys, Key};
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn the_tenant_watcher_flags_a_passed_quota_and_a_broken_share() {
        let mut w = Watched::default();
        for b in [10, 50, 100, 80] {
            w.see(b, 100, 0);
        }
        assert_eq!((w.over_quota, w.max_bytes, w.below_share), (0, 100, 0));
        w.see(101, 100, 0);
        assert_eq!(w.over_quota, 1);
        let mut s = Watched::default();
        for b in [10, 40, 60, 55, 50] {
            s.see(b, 0, 50);
        }
        assert_eq!((s.below_share, s.min_after_share), (0, Some(50)), "below its share only before reaching it");
        s.see(49, 0, 50);
        assert_eq!((s.below_share, s.min_after_share), (1, Some(49)));
    }

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
