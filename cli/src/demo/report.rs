//! What a demo run reports: latency histograms that travel between
//! processes, the report's fields, and its text form.

use cxlkv_platform::size::human;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::config::MAX_WRITE_AMPLIFICATION;

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
    pub(super) fn summary(&self) -> Latency {
        Latency { p50: self.quantile(0.5), p99: self.quantile(0.99), n: self.count() }
    }
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
    /// Requests of an open-loop run started more than one interval late.
    pub requests_late: u64,
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
    /// Each tenant's part (with --tenants).
    pub tenants: Option<Vec<TenantReport>>,
}

/// One tenant of a `--tenants` run.
#[derive(Debug, Serialize)]
pub struct TenantReport {
    pub name: String,
    /// Hard quota and guaranteed share, bytes (0: none).
    pub quota: u64,
    pub share: u64,
    /// Requests a second each of its prefill workers started (`None`: as
    /// many as it could).
    pub rate: Option<f64>,
    /// Its prefill workers.
    pub workers: usize,
    /// Requests handed off.
    pub requests: u64,
    /// Requests given up at its hard quota (every block of its own
    /// pinned, nothing in flight to wait for).
    pub refused_requests: u64,
    /// Share of its requests' blocks found cached.
    pub hit_rate: f64,
    /// Payload bytes it held at the end.
    pub bytes: u64,
    /// The most the watcher saw it hold.
    pub bytes_max: u64,
    /// The least the watcher saw it hold once it held its share.
    pub bytes_min_after_share: Option<u64>,
    /// Its blocks evicted (for anyone, itself included).
    pub evictions: u64,
    /// Its reserves refused at its quota (each retried or given up).
    pub refused_reserves: u64,
    /// Times the watcher read every tenant's usage.
    pub samples: u64,
    /// Never seen over its hard quota.
    pub quota_held: bool,
    /// Never seen below its share once it had reached it.
    pub share_held: bool,
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
    /// Requests a second asked for (`--rate`); `None`: as fast as it goes.
    pub rate: Option<f64>,
    /// Tenants (`--tenants`; 0: none).
    pub tenants: usize,
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
    if let Some(rate) = c.rate {
        println!(
            "  request rate       {rate:.1}/s asked, {:.1}/s handed off ({} started more than an interval late)",
            r.requests_handed_off as f64 / c.seconds.max(1e-9),
            r.requests_late
        );
    }
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
    if let Some(ts) = &r.tenants {
        print_tenants(ts);
    }
    println!("  region check       {} findings", r.check_findings);
    println!(
        "  wall time          {:.1} s: {:.1} s of requests, the rest formatting the region, starting the workers, \
         draining the handoffs in flight and checking",
        r.wall_seconds, r.config.seconds
    );
    println!("  result             {}", if r.ok { "PASS" } else { "FAIL" });
}

/// The tenants' table of a `--tenants` run.
fn print_tenants(ts: &[TenantReport]) {
    let or_none = |v: u64| if v == 0 { "-".to_string() } else { human(v) };
    println!(
        "  tenants            {:<8} {:>9} {:>9} {:>7} {:>9} {:>6} {:>9} {:>9} {:>11} {:>9}  held",
        "", "quota", "share", "rate/s", "requests", "hit", "live", "max", "min>=share", "evicted"
    );
    for t in ts {
        println!(
            "                     {:<8} {:>9} {:>9} {:>7} {:>9} {:>5.1}% {:>9} {:>9} {:>11} {:>9}  {}",
            t.name,
            or_none(t.quota),
            or_none(t.share),
            t.rate.map_or("max".to_string(), |r| format!("{r:.0}")),
            if t.refused_requests > 0 {
                format!("{} ({} refused)", t.requests, t.refused_requests)
            } else {
                t.requests.to_string()
            },
            100.0 * t.hit_rate,
            human(t.bytes),
            human(t.bytes_max),
            t.bytes_min_after_share.map_or("-".to_string(), human),
            t.evictions,
            match (t.quota_held, t.share_held) {
                (true, true) => "quota and share".to_string(),
                (q, s) => format!("{}{}", if q { "" } else { "QUOTA PASSED " }, if s { "" } else { "SHARE BROKEN" }),
            }
        );
    }
    if let Some(s) = ts.first() {
        println!("                     (usage read {} times through the run)", s.samples);
    }
}
