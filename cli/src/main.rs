//! `cxlkv`: format, inspect, check and recover cxlkv regions.

mod args;
mod bench;
mod demo;
mod gpucheck;
mod inspect;

use std::path::Path;
use std::process::ExitCode;

use args::{Args, Usage};
use cxlkv_core::layout::Capacities;
use cxlkv_platform::inspect::Observed;
use cxlkv_platform::{FlushMode, Node, Options, Region};
use serde_json::json;

const USAGE: &str = "\
cxlkv — a shared-memory KV-cache block store

usage:
  cxlkv demo [--prefill N] [--decode N] [--duration SECONDS] [--block-size SIZE|MIN-MAX]
             [--region SIZE] [--mode MODE] [--seed N] [--inflight N] [--json]
  cxlkv format PATH --size SIZE [--nodes N] [--stripes N] [--entries N]
               [--chunk SIZE] [--roots N] [--pins N] [--inbox N] [--app-locks N]
               [--force] [--json]
  cxlkv inspect PATH [--json]
  cxlkv check PATH [--json]        exit 0 clean, 1 findings, 2 cannot open
  cxlkv recover PATH [--json]
  cxlkv bench [--modes coherent,clflush,...] [--blocks N] [--block-bytes SIZE] [--quick] [--json]
  cxlkv gpu-check [--device N] [--mode MODE] [--quick]
                                   exit 0 checks passed, 1 a check failed, 2 CUDA unavailable

--mode coherent|clflush|clflushopt|clwb|auto: cache maintenance (format, inspect, check,
recover, gpu-check: default auto, the architecture's safe choice; demo: default coherent,
its processes share one host)
sizes take units: 64M, 2G, 512K";

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // Never let a panic escape as an abort with a backtrace: report and exit 2.
    match std::panic::catch_unwind(|| run(&argv)) {
        Ok(code) => code,
        Err(_) => {
            eprintln!("cxlkv: internal error");
            ExitCode::from(2)
        }
    }
}

fn run(argv: &[String]) -> ExitCode {
    let Some((cmd, rest)) = argv.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    if rest.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let r = match cmd.as_str() {
        "format" => cmd_format(rest),
        "inspect" => cmd_inspect(rest),
        "check" => return cmd_check(rest),
        "recover" => cmd_recover(rest),
        "bench" => cmd_bench(rest),
        "demo" => return cmd_demo(rest),
        "gpu-check" => return gpucheck::main(rest),
        // Processes the demo and the bench start; not for people.
        "bench-peer" => return helper_exit("bench-peer", bench::peer_main(rest)),
        "demo-worker" => return helper_exit("demo-worker", demo::worker(rest)),
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(Fail::Usage(Usage(format!("unknown command {other}")))),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail::Usage(Usage(m))) => {
            eprintln!("cxlkv: {m}\n\n{USAGE}");
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

enum Fail {
    Usage(Usage),
    Run(String),
}

impl From<Usage> for Fail {
    fn from(u: Usage) -> Self {
        Fail::Usage(u)
    }
}

impl From<cxlkv_platform::Error> for Fail {
    fn from(e: cxlkv_platform::Error) -> Self {
        Fail::Run(e.to_string())
    }
}

impl From<cxlkv_core::Error> for Fail {
    fn from(e: cxlkv_core::Error) -> Self {
        Fail::Run(e.to_string())
    }
}

fn mode(a: &Args) -> Result<FlushMode, Fail> {
    let m: FlushMode = a.get("mode").unwrap_or("auto").parse().map_err(|_| Usage("bad --mode".into()))?;
    if !m.available() {
        return Err(Fail::Run(format!("flush mode {} not available on this CPU", m.name())));
    }
    Ok(m)
}

const COMMON: [&str; 1] = ["mode"];

fn cmd_format(raw: &[String]) -> Result<(), Fail> {
    let valued =
        [COMMON.as_slice(), &["size", "nodes", "stripes", "entries", "chunk", "roots", "pins", "inbox", "app-locks"]]
            .concat();
    let a = Args::parse(raw, &valued, &["force", "json"])?;
    let path = a.path()?;
    let size = a.size("size", 0)?;
    if size == 0 {
        return Err(Usage("--size is required".into()).into());
    }
    let d = Capacities::default();
    let chunk = a.size("chunk", 1 << d.chunk_shift)?;
    if !chunk.is_power_of_two() {
        return Err(Usage("--chunk must be a power of two".into()).into());
    }
    let caps = Capacities {
        max_nodes: a.num("nodes", d.max_nodes)?,
        n_stripes: a.num("stripes", d.n_stripes)?,
        entries_per_stripe: 0,
        n_roots: a.num("roots", d.n_roots)?,
        pin_slots: a.num("pins", d.pin_slots)?,
        chunk_shift: chunk.trailing_zeros(),
        inbox_slots: a.num("inbox", d.inbox_slots)?,
        app_locks: a.num("app-locks", d.app_locks)?,
    };
    let total: u32 = a.num("entries", caps.n_stripes.saturating_mul(d.entries_per_stripe))?;
    let caps = Capacities { entries_per_stripe: total.div_ceil(caps.n_stripes.max(1)), ..caps };
    caps.validate().map_err(|_| Usage("capacities out of range".into()))?;
    let dax = path.starts_with("/dev/dax");
    if !dax {
        // Refuse impossible sizes before touching an existing file.
        Region::plan(caps, size)?;
    }
    let p = Path::new(path);
    if p.exists() && !a.flag("force") && !dax {
        return Err(Fail::Run(format!("{path} exists (use --force to overwrite)")));
    }
    let l = Region::create(p, size, true)?.format(caps, mode(&a)?)?;
    if a.flag("json") {
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

fn observe(a: &Args) -> Result<Observed, Fail> {
    Ok(Region::open(Path::new(a.path()?))?.observe(mode(a)?)?)
}

fn cmd_inspect(raw: &[String]) -> Result<(), Fail> {
    let a = Args::parse(raw, &COMMON, &["json"])?;
    let r = observe(&a)?.inspect()?;
    if a.flag("json") {
        println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
    } else {
        inspect::print_human(&r);
    }
    Ok(())
}

fn cmd_check(raw: &[String]) -> ExitCode {
    let a = match Args::parse(raw, &COMMON, &["json"]) {
        Ok(a) => a,
        Err(Usage(m)) => {
            eprintln!("cxlkv: {m}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let observed = match observe(&a) {
        Ok(x) => x,
        Err(Fail::Run(m) | Fail::Usage(Usage(m))) => {
            if a.flag("json") {
                println!("{}", json!({"ok": false, "error": m}));
            }
            eprintln!("cxlkv check: cannot open: {m}");
            return ExitCode::from(2);
        }
    };
    match observed.check().and_then(|f| Ok((f, observed.stranded()?))) {
        Ok((f, gone)) => {
            let clean = f.is_empty() && gone.is_empty();
            if a.flag("json") {
                let list: Vec<_> = f.iter().map(|x| json!({"kind": x.kind.as_str(), "a": x.a, "b": x.b})).collect();
                let gone: Vec<_> = gone
                    .iter()
                    .map(|g| {
                        json!({"node": g.node, "pid": g.pid, "declared_dead": g.declared_dead, "locks": g.locks,
                            "pins": g.pins, "reservations": g.reservations})
                    })
                    .collect();
                println!("{}", json!({"ok": clean, "findings": list, "stranded": gone}));
            } else if clean {
                println!("clean");
            } else {
                for x in &f {
                    println!("{x}");
                }
                for g in &gone {
                    println!("{g}");
                }
                println!("{} findings, {} node(s) awaiting recovery", f.len(), gone.len());
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

fn cmd_recover(raw: &[String]) -> Result<(), Fail> {
    let a = Args::parse(raw, &[COMMON.as_slice(), &["node"]].concat(), &["json"])?;
    let opts = Options {
        mode: mode(&a)?,
        auto_recover: false,
        node: a.get("node").map(|v| v.parse()).transpose().map_err(|_| Usage("bad --node".into()))?,
        ..Options::default()
    };
    let cache = Node::open(Path::new(a.path()?), opts)?;
    let r = cache.recover()?;
    cache.close()?;
    if a.flag("json") {
        println!(
            "{}",
            json!({"nodes_freed": r.nodes_freed.count_ones(), "pins_dropped": r.pins_dropped,
                "writes_aborted": r.writes_aborted, "entries_dropped": r.entries_dropped,
                "blocks_reclaimed": r.blocks_reclaimed, "chunks_reclaimed": r.chunks_reclaimed,
                "locks_repaired": r.locks_repaired})
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
    }
    Ok(())
}

fn cmd_demo(raw: &[String]) -> ExitCode {
    let parsed = (|| -> Result<(demo::Config, bool), Fail> {
        let valued = ["prefill", "decode", "duration", "block-size", "region", "mode", "seed", "inflight"];
        let a = Args::parse(raw, &valued, &["json"])?;
        if !a.pos.is_empty() {
            return Err(Usage("demo takes no PATH".into()).into());
        }
        let secs: f64 = a
            .get("duration")
            .map(|v| v.trim_end_matches('s').parse().map_err(|_| Usage(format!("--duration: not seconds: {v}"))))
            .transpose()?
            .unwrap_or(30.0);
        if !(0.1..=86_400.0).contains(&secs) {
            return Err(Usage("--duration must be between 0.1 and 86400 seconds".into()).into());
        }
        // One size, or a range MIN-MAX (each block's length drawn from it).
        let sizes = match a.get("block-size") {
            None => (2 << 20, 2 << 20),
            Some(v) => {
                let one = |s: &str| {
                    cxlkv_platform::size::parse_size(s).map_err(|_| Usage(format!("--block-size: not a size: {s}")))
                };
                match v.split_once('-') {
                    Some((lo, hi)) => (one(lo)?, one(hi)?),
                    None => (one(v)?, one(v)?),
                }
            }
        };
        let cfg = demo::Config {
            prefill: a.num("prefill", 2usize)?,
            decode: a.num("decode", 2usize)?,
            duration: std::time::Duration::from_secs_f64(secs),
            block_bytes: sizes.1,
            block_min: sizes.0,
            region: a.size("region", 4 << 30)?,
            mode: match a.get("mode") {
                Some(_) => mode(&a)?,
                None => FlushMode::Coherent,
            },
            seed: a.num("seed", 1u64)?,
            inflight: a.num("inflight", 2usize)?,
        };
        if !(1..=16).contains(&cfg.prefill) || !(1..=16).contains(&cfg.decode) {
            return Err(Usage("--prefill and --decode take 1 to 16 workers".into()).into());
        }
        let fits = |b: u64| (4096..=256 << 20).contains(&b) && b.is_multiple_of(64);
        if !fits(cfg.block_bytes) || !fits(cfg.block_min) || cfg.block_min > cfg.block_bytes {
            return Err(
                Usage("--block-size must be 4K to 256M, a multiple of 64 (or a range MIN-MAX of such)".into()).into()
            );
        }
        if !(1..=64).contains(&cfg.inflight) {
            return Err(Usage("--inflight takes 1 to 64".into()).into());
        }
        // The longest request (16384 tokens) twice over, pinned at once.
        let need = cfg.block_bytes * 2048;
        if cfg.region < need {
            return Err(
                Usage(format!("--region must be at least {need} bytes for {} byte blocks", cfg.block_bytes)).into()
            );
        }
        Ok((cfg, a.flag("json")))
    })();
    let (cfg, json_out) = match parsed {
        Ok(x) => x,
        Err(Fail::Usage(Usage(m))) => {
            eprintln!("cxlkv: {m}\n\n{USAGE}");
            return ExitCode::from(2);
        }
        Err(Fail::Run(m)) => {
            eprintln!("cxlkv demo: {m}");
            return ExitCode::from(1);
        }
    };
    match demo::run(&cfg, !json_out) {
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

fn cmd_bench(raw: &[String]) -> Result<(), Fail> {
    let a = Args::parse(raw, &["modes", "blocks", "block-bytes"], &["json", "quick"])?;
    let modes = match a.get("modes") {
        Some(list) => list
            .split(',')
            .map(|m| m.parse::<FlushMode>().map_err(|_| Fail::Usage(Usage(format!("bad mode {m}")))))
            .collect::<Result<Vec<_>, _>>()?,
        None => FlushMode::ALL.into_iter().filter(|m| m.available()).collect(),
    };
    if let Some(m) = modes.iter().find(|m| !m.available()) {
        return Err(Fail::Run(format!("flush mode {} not available on this CPU", m.name())));
    }
    let cfg = bench::Config {
        modes,
        blocks: a.num("blocks", 8192usize)?.max(64),
        block_bytes: a.size("block-bytes", 16 << 10)?.clamp(64, 64 << 20) as usize,
        quick: a.flag("quick"),
    };
    let r = bench::run(&cfg)?;
    if a.flag("json") {
        println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
    } else {
        bench::print_table(&r);
    }
    Ok(())
}
