//! `cxlkv`: run the demo, format, inspect, check and recover regions,
//! measure the data path and check the GPU path. The command line is
//! declared with clap (help generated from it); exit status 0 success, 1 a
//! failure (or findings: `check`; a failed check: `gpu-check`), 2 a usage
//! error or a region that cannot be opened (`check`), or CUDA unavailable
//! (`gpu-check`).

mod args;
mod bench;
mod demo;
mod gpucheck;
mod inspect;
mod metrics;
mod tenant;
mod tierbench;
mod top;

use std::process::ExitCode;

use args::{
    size, BenchArgs, CheckArgs, Cli, Cmd, DemoArgs, EventsArgs, FormatArgs, HashArg, PathArgs, RecoverArgs, ServeArgs,
    StatsArgs, TierArgs, TopArgs,
};
use clap::Parser;
use cxlkv_platform::inspect::Observed;
use cxlkv_platform::kv::Capacities;
use cxlkv_platform::{FlushMode, Node, Options, Region};
use serde_json::json;

/// True when a panic is std's report of a write to a closed stdout or
/// stderr (`failed printing to stdout: Broken pipe`).
fn is_broken_pipe(info: &std::panic::PanicHookInfo<'_>) -> bool {
    let p = info.payload();
    let msg = p.downcast_ref::<String>().map(String::as_str).or_else(|| p.downcast_ref::<&str>().copied());
    msg.is_some_and(|m| m.starts_with("failed printing to std") && m.contains("Broken pipe"))
}

fn main() -> ExitCode {
    // A reader that went away (`cxlkv check R | head -1`) ends the command
    // quietly, as it ends any Unix tool: nothing on stderr, status 0.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if is_broken_pipe(info) {
            std::process::exit(0);
        }
        default_hook(info);
    }));
    // Never let a panic escape as an abort with a backtrace: report and exit 2.
    match std::panic::catch_unwind(run) {
        Ok(code) => code,
        Err(_) => {
            eprintln!("cxlkv: internal error");
            ExitCode::from(2)
        }
    }
}

fn run() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Format(a) => cmd_format(&a),
        Cmd::Inspect(a) => cmd_inspect(&a),
        Cmd::Check(a) => return cmd_check(&a),
        Cmd::Recover(a) => cmd_recover(&a),
        Cmd::Stats(a) => cmd_stats(&a),
        Cmd::Top(a) => cmd_top(&a),
        Cmd::ServeMetrics(a) => cmd_serve_metrics(&a),
        Cmd::Events(a) => cmd_events(&a),
        Cmd::Tier(a) => cmd_tier(&a),
        Cmd::Tenant(a) => tenant::cmd_tenant(&a),
        Cmd::Bench(a) => cmd_bench(a),
        Cmd::Demo(a) => return cmd_demo(&a),
        Cmd::GpuCheck(a) => return gpucheck::main(a.device, a.mode.mode, a.quick),
        Cmd::BenchPeer(h) => return helper_exit("bench-peer", bench::peer_main(&h.args)),
        Cmd::DemoWorker(h) => return helper_exit("demo-worker", demo::worker(&h.args)),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail::Usage(m)) => {
            eprintln!("cxlkv: {m}");
            ExitCode::from(2)
        }
        Err(Fail::Run(m)) => {
            eprintln!("cxlkv: {m}");
            ExitCode::from(1)
        }
    }
}

/// Exit status of a helper process: 0, or 1 with its error on stderr.
fn helper_exit(name: &str, r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cxlkv {name}: {e}");
            ExitCode::from(1)
        }
    }
}

pub(crate) enum Fail {
    /// Arguments that parse but make no sense together: exit 2.
    Usage(String),
    /// The command failed: exit 1.
    Run(String),
}

impl From<cxlkv_platform::Error> for Fail {
    fn from(e: cxlkv_platform::Error) -> Self {
        Fail::Run(e.to_string())
    }
}

impl From<cxlkv_platform::kv::CoreError> for Fail {
    fn from(e: cxlkv_platform::kv::CoreError) -> Self {
        Fail::Run(e.to_string())
    }
}

fn cmd_format(a: &FormatArgs) -> Result<(), Fail> {
    let path = a.path.to_string_lossy();
    if a.size == 0 {
        return Err(Fail::Usage("--size must not be 0".into()));
    }
    let d = Capacities::default();
    let chunk = a.chunk;
    if !chunk.is_power_of_two() {
        return Err(Fail::Usage("--chunk must be a power of two".into()));
    }
    let caps = Capacities {
        max_nodes: a.nodes,
        n_stripes: a.stripes,
        entries_per_stripe: 0,
        n_roots: a.roots,
        pin_slots: a.pins,
        chunk_shift: chunk.trailing_zeros(),
        inbox_slots: a.inbox,
        app_locks: a.app_locks,
        tier_slots: a.tier_slots,
        tier_records: a.tier_records,
        change_records: a.change_records,
        max_tenants: a.max_tenants,
    };
    let total = a.entries.unwrap_or(caps.n_stripes.saturating_mul(d.entries_per_stripe));
    let caps = Capacities { entries_per_stripe: total.div_ceil(caps.n_stripes.max(1)), ..caps };
    caps.validate().map_err(|_| Fail::Usage("capacities out of range".into()))?;
    let dax = path.starts_with("/dev/dax");
    if !dax {
        // Refuse impossible sizes before touching an existing file.
        if let Err(e) = Region::plan(caps, a.size) {
            return Err(Fail::Run(match (e.core(), Region::min_size(caps)) {
                (Some(cxlkv_platform::kv::CoreError::TooSmall), Some(min)) => format!(
                    "--size {} is too small for these capacities: they need at least {} ({min} bytes)",
                    cxlkv_platform::size::human(a.size),
                    cxlkv_platform::size::human(min)
                ),
                _ => e.to_string(),
            }));
        }
    }
    if a.path.exists() {
        if !dax && Region::refuse_foreign(&a.path).is_err() {
            return Err(Fail::Run(format!(
                "{path} belongs to another user: cxlkv format never reuses a file it does not own"
            )));
        }
        // Never under a running node: a format erases what it uses.
        let live = Region::live_nodes_at(&a.path, cxlkv_platform::region::LIVE_WAIT)?;
        if !live.is_empty() {
            let names: Vec<String> = live.iter().map(ToString::to_string).collect();
            return Err(Fail::Run(format!(
                "{path} has nodes that may still run: {} (detach them or end their processes first)",
                names.join(", ")
            )));
        }
        if !a.force && !dax {
            return Err(Fail::Run(format!("{path} exists (use --force to overwrite)")));
        }
    }
    let file_mode =
        if a.group { cxlkv_platform::region::REGION_GROUP_MODE } else { cxlkv_platform::region::REGION_FILE_MODE };
    let l = Region::create_with_mode(&a.path, a.size, true, file_mode)?.format(caps, a.mode.mode)?;
    if a.json {
        println!(
            "{}",
            json!({"path": path, "size": l.region_size, "chunks": l.n_chunks, "chunk_size": l.chunk_size(),
            "entries": l.caps.n_stripes as u64 * l.caps.entries_per_stripe as u64, "payload_bytes": l.payload.len()})
        );
    } else {
        println!(
            "formatted {path}: {} region, {} entries in {} stripes, {} payload in {} chunks of {}",
            cxlkv_platform::size::human(l.region_size),
            l.caps.n_stripes as u64 * l.caps.entries_per_stripe as u64,
            l.caps.n_stripes,
            cxlkv_platform::size::human(l.payload.len()),
            l.n_chunks,
            cxlkv_platform::size::human(l.chunk_size())
        );
    }
    Ok(())
}

fn observe(a: &PathArgs) -> Result<Observed, Fail> {
    Ok(Region::open(&a.path)?.observe(a.mode.mode)?)
}

fn cmd_inspect(a: &PathArgs) -> Result<(), Fail> {
    let r = observe(a)?.inspect()?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
    } else {
        inspect::print_human(&r);
    }
    Ok(())
}

fn cmd_check(c: &CheckArgs) -> ExitCode {
    let a = &c.at;
    let observed = match observe(a) {
        Ok(x) => x,
        Err(Fail::Run(m) | Fail::Usage(m)) => {
            if a.json {
                println!("{}", json!({"ok": false, "error": m}));
            }
            eprintln!("cxlkv check: cannot open: {m}");
            return ExitCode::from(2);
        }
    };
    let tier = match c.tier.iter().find(|d| !d.join("cxlkv-tier.slots").is_file()) {
        // Name the directory: an OS error alone does not say which.
        Some(d) => Err(cxlkv_platform::Error::Io {
            what: "open a tier directory's slot file",
            err: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{}: no cxlkv-tier.slots there (not a tier directory)", d.display()),
            ),
        }),
        None if c.tier.is_empty() => Ok(Vec::new()),
        None => observed.check_tier(&c.tier, c.slot_size),
    };
    match observed.check().and_then(|f| Ok((f, observed.stranded()?, tier?))) {
        Ok((f, gone, tier)) => {
            let clean = f.is_empty() && gone.is_empty() && tier.is_empty();
            if a.json {
                let list: Vec<_> = f.iter().map(|x| json!({"kind": x.kind.as_str(), "a": x.a, "b": x.b})).collect();
                let gone: Vec<_> = gone
                    .iter()
                    .map(|g| {
                        json!({"node": g.node, "pid": g.pid, "declared_dead": g.declared_dead, "locks": g.locks,
                            "pins": g.pins, "reservations": g.reservations})
                    })
                    .collect();
                println!("{}", json!({"ok": clean, "findings": list, "stranded": gone, "tier": tier}));
            } else if clean {
                println!("clean");
            } else {
                for x in &f {
                    println!("{x}");
                }
                for g in &gone {
                    println!("{g}");
                }
                for t in &tier {
                    println!("tier: {t}");
                }
                println!(
                    "{} findings, {} node(s) awaiting recovery, {} tier findings",
                    f.len() + tier.len(),
                    gone.len(),
                    tier.len()
                );
            }
            if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("cxlkv check: {e}");
            ExitCode::from(2)
        }
    }
}

fn cmd_recover(a: &RecoverArgs) -> Result<(), Fail> {
    let opts = Options { mode: a.at.mode.mode, auto_recover: false, node: a.node, ..Options::default() };
    let node = Node::open(&a.at.path, opts)?;
    for &n in &a.quiet {
        if !node.declare_quiet(n)? {
            eprintln!("cxlkv recover: node {n} is not dead, or is quiet already");
        }
    }
    let r = node.recover()?;
    node.close()?;
    if a.at.json {
        println!(
            "{}",
            json!({"nodes_freed": r.nodes_freed.count_ones(), "pins_dropped": r.pins_dropped,
                "writes_aborted": r.writes_aborted, "entries_dropped": r.entries_dropped,
                "blocks_reclaimed": r.blocks_reclaimed, "chunks_reclaimed": r.chunks_reclaimed,
                "locks_repaired": r.locks_repaired, "writes_quarantined": r.writes_quarantined,
                "nodes_fenced": r.nodes_fenced.count_ones()})
        );
    } else {
        println!(
            "recovered: {} dead nodes freed, {} pins dropped, {} writes aborted, {} entries dropped, {} blocks and {} chunks reclaimed, {} locks repaired",
            r.nodes_freed.count_ones(),
            r.pins_dropped,
            r.writes_aborted,
            r.entries_dropped,
            r.blocks_reclaimed,
            r.chunks_reclaimed,
            r.locks_repaired
        );
        if r.nodes_fenced != 0 {
            println!(
                "fenced: {} dead nodes not known quiet keep {} reservations allocated until they are (--quiet N                  when a node's host is down for good)",
                r.nodes_fenced.count_ones(),
                r.writes_quarantined
            );
        }
    }
    Ok(())
}

/// SIGINT and SIGTERM, written to a self-pipe by signal-hook's handler
/// (whichever thread the signal lands on) and waited for with
/// [`Signals::wait`].
struct Signals(std::os::unix::net::UnixStream);

impl Signals {
    fn install() -> Result<Signals, Fail> {
        let io = |e: std::io::Error| Fail::Run(format!("signal handlers: {e}"));
        let (rx, tx) = std::os::unix::net::UnixStream::pair().map_err(io)?;
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::low_level::pipe::register(sig, tx.try_clone().map_err(io)?).map_err(io)?;
        }
        Ok(Signals(rx))
    }

    /// Waits up to `d` for one of the signals; true when one came.
    fn wait(&self, d: std::time::Duration) -> bool {
        use std::io::Read;
        // A zero timeout means "block" to the socket: wait a microsecond.
        if self.0.set_read_timeout(Some(d.max(std::time::Duration::from_micros(1)))).is_err() {
            return false;
        }
        let mut byte = [0u8; 1];
        matches!((&self.0).read(&mut byte), Ok(n) if n > 0)
    }
}

fn cmd_stats(a: &StatsArgs) -> Result<(), Fail> {
    let m = observe(&a.at)?.metrics()?;
    if a.prometheus {
        print!("{}", m.to_openmetrics());
    } else if a.at.json {
        println!("{}", serde_json::to_string_pretty(&m).unwrap_or_default());
    } else {
        metrics::print_human(&m);
    }
    Ok(())
}

fn cmd_top(a: &TopArgs) -> Result<(), Fail> {
    if !(0.05..=3600.0).contains(&a.interval) {
        return Err(Fail::Usage("--interval must be between 0.05 and 3600 seconds".into()));
    }
    let signals = Signals::install()?;
    let observed = observe(&a.at)?;
    let interval = std::time::Duration::from_secs_f64(a.interval);
    top::run(&observed, interval, a.once, &|d| signals.wait(d)).map_err(Fail::Run)
}

fn cmd_serve_metrics(a: &ServeArgs) -> Result<(), Fail> {
    let signals = Signals::install()?;
    let observed = observe(&a.at)?;
    metrics::serve(&observed, a.listen, a.seconds, &|d| signals.wait(d)).map_err(Fail::Run)
}

fn cmd_events(a: &EventsArgs) -> Result<(), Fail> {
    use cxlkv_platform::events::Event;
    use std::io::Write;
    let signals = Signals::install()?;
    if let Some(ep) = &a.zmq {
        return publish_events(a, ep, &signals);
    }
    let observed = observe(&a.at)?;
    let mut feed = observed.feed();
    let start = std::time::Instant::now();
    let mut events = Vec::new();
    let key = |k: cxlkv_platform::kv::Key| format!("{:016x}{:016x}", k.hi, k.lo);
    loop {
        events.clear();
        feed.poll(&mut events)?;
        let mut out = std::io::stdout().lock();
        for e in &events {
            let line = match *e {
                Event::Cleared => json!({"event": "cleared"}),
                Event::Stored { ns, key: k, len, tokens, node } => {
                    json!({"event": "stored", "ns": ns, "key": key(k), "len": len, "tokens": tokens, "node": node})
                }
                Event::Removed { ns, key: k, node } => {
                    json!({"event": "removed", "ns": ns, "key": key(k), "node": node})
                }
            };
            // A closed pipe ends the command.
            if writeln!(out, "{line}").is_err() {
                return Ok(());
            }
        }
        if out.flush().is_err() {
            return Ok(());
        }
        drop(out);
        if a.seconds.is_some_and(|s| start.elapsed().as_secs() >= s)
            || signals.wait(std::time::Duration::from_millis(a.interval_ms.max(1)))
        {
            let st = feed.stats();
            eprintln!(
                "cxlkv events: {} changes read, {} gaps repaired, {} blocks stored",
                st.changes, st.gaps, st.stored
            );
            return Ok(());
        }
    }
}

fn publish_events(a: &EventsArgs, ep: &str, signals: &Signals) -> Result<(), Fail> {
    use cxlkv_platform::publish::{HashForm, Publisher, PublisherOptions};
    let opts = PublisherOptions {
        endpoint: ep.to_string(),
        replay: a.replay.clone(),
        topic: a.topic.clone(),
        medium: a.medium.clone(),
        hash: match a.hash {
            HashArg::Int => HashForm::Int,
            HashArg::Int64 => HashForm::Int64,
            HashArg::Bytes => HashForm::Bytes,
        },
        namespaces: a.namespaces.clone(),
        dp_rank: a.dp_rank,
        buffer: a.buffer,
        interval: std::time::Duration::from_millis(a.interval_ms.max(1)),
        ..PublisherOptions::default()
    };
    let p = if a.observe {
        Publisher::start(&Region::open(&a.at.path)?, a.at.mode.mode, opts)?
    } else {
        let node = std::sync::Arc::new(Node::open(&a.at.path, Options { mode: a.at.mode.mode, ..Options::default() })?);
        Publisher::attached(node, opts)?
    };
    println!("{}", json!({"endpoint": p.endpoint(), "replay": p.replay_endpoint()}));
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let start = std::time::Instant::now();
    while a.seconds.is_none_or(|s| start.elapsed().as_secs() < s) {
        if signals.wait(std::time::Duration::from_millis(100)) {
            break;
        }
    }
    let st = p.stop();
    eprintln!(
        "cxlkv events: {} batches, {} events, {} gaps repaired, {} replays ({} snapshots), {} messages dropped{}",
        st.batches,
        st.events,
        st.feed_gaps,
        st.replays,
        st.snapshots,
        st.dropped,
        st.last_error.map(|e| format!("; last error: {e}")).unwrap_or_default()
    );
    Ok(())
}

fn cmd_tier(a: &TierArgs) -> Result<(), Fail> {
    let signals = Signals::install()?;
    let opts = Options { mode: a.at.mode.mode, ..Options::default() };
    let node = std::sync::Arc::new(Node::open(&a.at.path, opts)?);
    let topts = cxlkv_platform::TierOptions {
        dirs: a.dirs.clone(),
        slot_bytes: a.slot_size,
        capacity: a.capacity,
        high_water: a.high_water,
        batch: a.batch,
    };
    let tier = cxlkv_platform::Tier::start(node.clone(), topts)?;
    let start = std::time::Instant::now();
    eprintln!("cxlkv tier: node {} serving {} drive(s), {} blocks held", node.id(), a.dirs.len(), tier.stats().held);
    loop {
        if a.seconds.is_some_and(|s| start.elapsed().as_secs() >= s) {
            break;
        }
        if signals.wait(std::time::Duration::from_millis(200)) {
            break;
        }
    }
    let st = tier.stats();
    tier.stop()?;
    let json = json!({"spills": st.spills, "promotions": st.promotions, "misses": st.misses, "errors": st.errors,
        "held": st.held, "bytes_written": st.bytes_written, "bytes_read": st.bytes_read,
        "io_priority": st.io_priority, "cpu_priority": st.cpu_priority});
    if a.at.json {
        println!("{json}");
    } else {
        println!(
            "tier: {} spills, {} promotions, {} misses, {} errors, {} blocks held (I/O priority {}, CPU priority {})",
            st.spills,
            st.promotions,
            st.misses,
            st.errors,
            st.held,
            if st.io_priority { "raised" } else { "default" },
            if st.cpu_priority { "raised" } else { "default" }
        );
    }
    Ok(())
}

fn cmd_demo(a: &DemoArgs) -> ExitCode {
    let cfg = match demo_config(a) {
        Ok(c) => c,
        Err(m) => {
            eprintln!("cxlkv demo: {m}");
            return ExitCode::from(2);
        }
    };
    let json_out = a.json;
    match demo::run(&cfg, !json_out && !a.quiet) {
        Ok((report, ok)) => {
            if json_out {
                println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
            } else {
                demo::print(&report);
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("cxlkv demo: {e}");
            ExitCode::from(1)
        }
    }
}

/// The demo's configuration, or why the arguments make none.
fn demo_config(a: &DemoArgs) -> Result<demo::Config, String> {
    let secs: f64 =
        a.duration.trim_end_matches('s').parse().map_err(|_| format!("--duration: not seconds: {}", a.duration))?;
    if !(0.1..=86_400.0).contains(&secs) {
        return Err("--duration must be between 0.1 and 86400 seconds".into());
    }
    // One size, or a range MIN-MAX (each block's length drawn from it).
    let one = |s: &str| size(s).map_err(|e| format!("--block-size: {e}"));
    let (block_min, block_bytes) = match a.block_size.split_once('-') {
        Some((lo, hi)) => (one(lo)?, one(hi)?),
        None => (one(&a.block_size)?, one(&a.block_size)?),
    };
    let cfg = demo::Config {
        // A prefill worker for every tenant at least.
        prefill: a.prefill.max(a.tenants),
        decode: a.decode,
        duration: std::time::Duration::from_secs_f64(secs),
        block_bytes,
        block_min,
        region: a.region,
        mode: a.mode,
        seed: a.seed,
        inflight: a.inflight,
        rate: a.rate,
        ssd: a.ssd.clone(),
        tenants: a.tenants,
    };
    if cfg.tenants != 0 && !(2..=demo::MAX_DEMO_TENANTS).contains(&cfg.tenants) {
        return Err(format!("--tenants takes 2 to {}", demo::MAX_DEMO_TENANTS));
    }
    if cfg.tenants != 0 && cfg.rate.is_some() {
        return Err("--tenants sets each tenant's request rate: leave --rate out".into());
    }
    if cfg.rate.is_some_and(|r| !(0.1..=100_000.0).contains(&r)) {
        return Err("--rate takes 0.1 to 100000 requests a second".into());
    }
    if !(1..=16).contains(&cfg.prefill) || !(1..=16).contains(&cfg.decode) {
        return Err("--prefill and --decode take 1 to 16 workers".into());
    }
    let fits = |b: u64| (4096..=256 << 20).contains(&b) && b.is_multiple_of(64);
    if !fits(cfg.block_bytes) || !fits(cfg.block_min) || cfg.block_min > cfg.block_bytes {
        return Err("--block-size must be 4K to 256M, a multiple of 64 (or a range MIN-MAX of such)".into());
    }
    if !(1..=64).contains(&cfg.inflight) {
        return Err("--inflight takes 1 to 64".into());
    }
    // The longest request (16384 tokens) twice over, pinned at once.
    let need = cfg.block_bytes * 2048;
    if cfg.region < need {
        return Err(format!(
            "--region must be at least {} for {} blocks (the longest request, 16384 tokens, twice over)",
            cxlkv_platform::size::human(need),
            cxlkv_platform::size::human(cfg.block_bytes)
        ));
    }
    Ok(cfg)
}

fn cmd_bench(a: BenchArgs) -> Result<(), Fail> {
    if let Some(dir) = &a.tier {
        let block = if a.block_bytes == 16 << 10 { 2 << 20 } else { a.block_bytes.clamp(4096, 64 << 20) as usize };
        let r = tierbench::run(dir, block, a.tier_blocks.clamp(8, 4096)).map_err(Fail::Run)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
        } else {
            tierbench::print(&r);
        }
        return Ok(());
    }
    let modes =
        if a.modes.is_empty() { FlushMode::ALL.into_iter().filter(|m| m.available()).collect() } else { a.modes };
    let cfg = bench::Config {
        modes,
        blocks: a.blocks.max(64),
        block_bytes: a.block_bytes.clamp(64, 64 << 20) as usize,
        quick: a.quick,
    };
    let r = bench::run(&cfg)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
    } else {
        bench::print_table(&r);
    }
    Ok(())
}

#[cfg(test)]
mod capacity_flags {
    use clap::CommandFactory;

    use super::*;

    /// Each capacity of core's table and the `cxlkv format` flag that sets
    /// it (friendlier names: a Unix tool's).
    const FLAGS: &[(&str, &str)] = &[
        ("max_nodes", "nodes"),
        ("n_stripes", "stripes"),
        ("entries_per_stripe", "entries"),
        ("n_roots", "roots"),
        ("pin_slots", "pins"),
        ("chunk_shift", "chunk"),
        ("inbox_slots", "inbox"),
        ("app_locks", "app-locks"),
        ("tier_slots", "tier-slots"),
        ("tier_records", "tier-records"),
        ("change_records", "change-records"),
        ("max_tenants", "max-tenants"),
    ];

    /// Adding a capacity to core's table fails here until `cxlkv format`
    /// has a flag for it.
    #[test]
    fn format_has_a_flag_for_every_capacity() {
        let names: Vec<&str> = FLAGS.iter().map(|f| f.0).collect();
        let table: Vec<&str> = Capacities::FIELDS.iter().map(|f| f.name).collect();
        assert_eq!(names, table);
        let cmd = Cli::command();
        let format = cmd.find_subcommand("format").expect("a format command");
        let longs: Vec<&str> = format.get_arguments().filter_map(|a| a.get_long()).collect();
        for (name, flag) in FLAGS {
            assert!(longs.contains(flag), "capacity {name}: no --{flag} in {longs:?}");
        }
    }

    /// Each option of the tier's table and the `cxlkv tier` flag that sets
    /// it, with the flag's default the table's.
    const TIER_FLAGS: &[(&str, &str)] =
        &[("slot_bytes", "slot-size"), ("capacity", "capacity"), ("high_water", "high-water"), ("batch", "batch")];

    /// Adding an option to the tier's table fails here until `cxlkv tier`
    /// has a flag for it (its struct literal there fails to build too).
    #[test]
    fn tier_has_a_flag_for_every_option() {
        let names: Vec<&str> = TIER_FLAGS.iter().map(|f| f.0).collect();
        let table: Vec<&str> = cxlkv_platform::TierOptions::FIELDS.iter().map(|f| f.name).collect();
        assert_eq!(names, table);
        let cmd = Cli::command();
        let tier = cmd.find_subcommand("tier").expect("a tier command");
        for (f, (_, flag)) in cxlkv_platform::TierOptions::FIELDS.iter().zip(TIER_FLAGS) {
            let arg = tier.get_arguments().find(|a| a.get_long() == Some(flag)).unwrap_or_else(|| panic!("--{flag}"));
            let default = arg.get_default_values().first().and_then(|v| v.to_str()).expect("a default");
            let value = if f.integer { crate::args::size(default).unwrap() as f64 } else { default.parse().unwrap() };
            assert_eq!(value, f.default, "--{flag}");
        }
    }
}
