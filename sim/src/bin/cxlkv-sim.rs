//! `cxlkv-sim`: runs the proof harness from the command line.
//!
//! - `cxlkv-sim run` runs K seeds of one configuration (hosts, operations,
//!   crashes, lazy caches, mixed sizes, a disabled coherence site or a logic
//!   mutant).
//! - `cxlkv-sim sweep` runs N fresh seeds of every configuration, each run in
//!   a child process with a step and a time limit, several at once, and
//!   counts violations and livelocks.
//! - `cxlkv-sim scenario` runs the steered scenarios (one named interleaving
//!   each), optionally under a mutant.
//! - `cxlkv-sim sites` lists every coherence call site in core and how many
//!   times a default run executed it.
//!
//! Exit status: 0 when every run passed; 1 when a run found a violation (or
//! a livelock); 2 for a usage error. Scripts count a mutant as killed on
//! status 1 only.

use std::io::Read;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use cxlkv_sim::harness::{reformat_run, run, RunConfig};
use cxlkv_sim::steer::scenarios;

/// Exit status of a run that found a violation.
const VIOLATION: u8 = 1;
/// Exit status of a usage error.
const USAGE: u8 = 2;

/// cxlkv's proof harness: simulated hosts on non-coherent memory under a
/// seeded scheduler, checked against a reference model.
#[derive(Parser)]
#[command(name = "cxlkv-sim", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs K seeds of one configuration; prints the first failure (its
    /// violations and last scheduler events) and exits 1, or `pass: ...`.
    Run(RunArgs),
    /// Runs N fresh seeds of every configuration in child processes (each
    /// with a step and a time limit) and prints
    /// `sweep: R runs, V violations, L livelocks` with the failing seeds.
    Sweep(SweepArgs),
    /// Runs the steered scenarios (all, or the one named) and prints each
    /// verdict; exits 1 when any finds a violation.
    Scenario(ScenarioArgs),
    /// Lists every coherence call site and how often one crash run with
    /// mixed sizes executed it.
    Sites(SitesArgs),
}

/// One configuration of simulated runs.
#[derive(Args, Clone, Debug)]
struct Config {
    /// Simulated hosts (one node each), 2 to 16.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(2..=16))]
    hosts: u16,
    /// Operations per host.
    #[arg(long, default_value_t = 100)]
    ops: u32,
    /// Crash a host in every run.
    #[arg(long, conflicts_with = "crash_odd")]
    crash: bool,
    /// Crash a host in runs of odd seeds.
    #[arg(long)]
    crash_odd: bool,
    /// Lazy caches (nothing written back or refilled on its own) in every run.
    #[arg(long, conflicts_with = "lazy_alt")]
    lazy: bool,
    /// Lazy caches in runs of seeds 2 and 3 (mod 4).
    #[arg(long)]
    lazy_alt: bool,
    /// Block lengths from 64 bytes to two chunks instead of a few sizes.
    #[arg(long)]
    mixed: bool,
    /// A zombie in every run: a host stops anywhere (any thread, any
    /// coherence call) past its lease, is declared dead and recovered, then
    /// runs on; no crash.
    #[arg(long, conflicts_with_all = ["crash", "crash_odd"])]
    zombie: bool,
    /// Cut one manager step in 32 off part-way (the process stepping that
    /// node's manager for it is killed; the host lives on) and go on from a
    /// fresh manager state.
    #[arg(long)]
    cut_steps: bool,
}

#[derive(Args)]
struct RunArgs {
    /// First seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seeds to run, from --seed on.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    #[command(flatten)]
    cfg: Config,
    #[command(flatten)]
    mutant: MutantArgs,
    /// Print only the verdict and violations (no scheduler events).
    #[arg(long)]
    quiet: bool,
}

/// A coherence site switched off, or a logic mutant switched on.
#[derive(Args)]
struct MutantArgs {
    /// Disable this coherence site (a coherence mutant).
    #[arg(long, value_name = "SITE")]
    disable: Option<String>,
    /// Switch logic mutant NAME of core on (only in a build made with
    /// RUSTFLAGS="--cfg cxlkv_mutants"; see tests/logic-mutants.sh).
    #[arg(long, value_name = "NAME")]
    mutant: Option<String>,
}

#[derive(Args)]
struct SweepArgs {
    /// Seeds per configuration.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// First seed (pick seeds never used before for a fresh sweep).
    #[arg(long, default_value_t = 1)]
    from: u64,
    /// Runs at once (default: the CPUs this process may use).
    #[arg(long)]
    jobs: Option<usize>,
    /// Only the configurations whose names contain this (repeatable;
    /// `--list` shows them).
    #[arg(long = "config", value_name = "NAME")]
    configs: Vec<String>,
    /// Scheduler steps without a finished operation after which a run
    /// counts as livelocked (a run may take four such windows in all).
    #[arg(long, default_value_t = 3_000_000)]
    step_limit: u64,
    /// Seconds after which a run counts as livelocked and is killed.
    #[arg(long, default_value_t = 300)]
    time_limit: u64,
    /// Lists the configurations and exits.
    #[arg(long)]
    list: bool,
}

#[derive(Args)]
struct ScenarioArgs {
    /// Only this scenario.
    name: Option<String>,
    #[command(flatten)]
    mutant: MutantArgs,
    /// Lists the scenarios and what each steers into, and exits.
    #[arg(long)]
    list: bool,
    /// Print only failures and the verdict.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct SitesArgs {
    /// Seed of the run.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Simulated hosts.
    #[arg(long, default_value_t = 3)]
    hosts: usize,
    /// Operations per host.
    #[arg(long, default_value_t = 100)]
    ops: u32,
    /// Lazy caches.
    #[arg(long)]
    lazy: bool,
}

/// Switches logic mutant `name` on (a build for the mutant check only).
#[cfg(cxlkv_mutants)]
fn switch_mutant(name: &'static str) -> Result<(), String> {
    cxlkv_core::mutant::set(Some(name));
    Ok(())
}

/// Refuses: this build carries no mutants.
#[cfg(not(cxlkv_mutants))]
fn switch_mutant(name: &'static str) -> Result<(), String> {
    Err(format!("--mutant {name}: this build has no mutants (build with RUSTFLAGS=\"--cfg cxlkv_mutants\")"))
}

/// Applies a mutant's options; returns the disabled site.
fn apply(m: &MutantArgs) -> Result<Option<&'static str>, String> {
    if let Some(name) = &m.mutant {
        switch_mutant(Box::leak(name.clone().into_boxed_str()))?;
    }
    Ok(m.disable.as_ref().map(|s| &*Box::leak(s.clone().into_boxed_str())))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Run(a) => cmd_run(a),
        Cmd::Sweep(a) => cmd_sweep(a),
        Cmd::Scenario(a) => cmd_scenario(a),
        Cmd::Sites(a) => cmd_sites(a),
    };
    match r {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("cxlkv-sim: {e}");
            ExitCode::from(USAGE)
        }
    }
}

fn cmd_run(a: RunArgs) -> Result<u8, String> {
    let disable = apply(&a.mutant)?;
    let c = &a.cfg;
    let (mut total_ops, mut steps, mut cuts) = (0u64, 0u64, 0u64);
    let t = Instant::now();
    for sd in a.seed..a.seed.saturating_add(a.seeds) {
        let crash = c.crash || c.crash_odd && sd % 2 == 1;
        let lazy = c.lazy || c.lazy_alt && sd % 4 >= 2;
        let cfg = RunConfig {
            seed: sd,
            hosts: usize::from(c.hosts),
            ops: c.ops,
            crash,
            disable,
            lazy,
            mixed: c.mixed,
            feed_at: None,
            zombie: c.zombie,
            cut_steps: c.cut_steps,
        };
        let mut r = run(&cfg);
        r.violations.extend(reformat_run(sd, disable, lazy));
        total_ops += r.ops;
        steps += r.steps;
        cuts += r.cuts;
        if !r.violations.is_empty() {
            println!("FAIL seed {sd} hosts {} ops {} crash {:?} lazy {lazy}", c.hosts, c.ops, r.crashed);
            for v in &r.violations {
                println!("  {v}");
            }
            if !a.quiet {
                println!("last events:");
                for e in &r.trace {
                    println!("  {e}");
                }
            }
            return Ok(VIOLATION);
        }
    }
    let cut = if cuts > 0 { format!(", {cuts} manager steps cut off") } else { String::new() };
    println!(
        "pass: {} runs, {total_ops} operations, {steps} scheduler steps{cut}, {:.1}s",
        a.seeds,
        t.elapsed().as_secs_f64()
    );
    Ok(0)
}

fn cmd_scenario(a: ScenarioArgs) -> Result<u8, String> {
    if a.list {
        for s in scenarios() {
            println!("{}: {}", s.name, s.what);
        }
        return Ok(0);
    }
    let disable = apply(&a.mutant)?;
    let chosen: Vec<_> = scenarios().iter().filter(|s| a.name.as_deref().is_none_or(|n| n == s.name)).collect();
    if chosen.is_empty() {
        return Err(format!("no scenario {:?} (--list shows them)", a.name.unwrap_or_default()));
    }
    let mut failed = 0;
    for s in &chosen {
        let v = s.run(disable);
        if v.is_empty() {
            if !a.quiet {
                println!("pass {}", s.name);
            }
        } else {
            failed += 1;
            println!("FAIL {}", s.name);
            for x in &v {
                println!("  {x}");
            }
        }
    }
    println!("scenarios: {} run, {failed} failed", chosen.len());
    Ok(if failed == 0 { 0 } else { VIOLATION })
}

fn cmd_sites(a: SitesArgs) -> Result<u8, String> {
    let r = run(&RunConfig {
        seed: a.seed,
        hosts: a.hosts,
        ops: a.ops,
        crash: true,
        disable: None,
        lazy: a.lazy,
        mixed: true,
        feed_at: None,
        zombie: false,
        cut_steps: false,
    });
    for (s, n) in r.executed {
        println!("{s} {n}");
    }
    Ok(0)
}

/// A configuration of the sweep: a name and the `run` options it passes.
struct SweepConfig {
    name: &'static str,
    args: &'static [&'static str],
}

/// Every configuration the harness has, each at sizes from 3 to 5 hosts and
/// 80 to 300 operations, zombies included.
const SWEEP: &[SweepConfig] = &[
    SweepConfig { name: "plain-3x80", args: &["--hosts", "3", "--ops", "80"] },
    SweepConfig { name: "lazy-3x80", args: &["--hosts", "3", "--ops", "80", "--lazy"] },
    SweepConfig { name: "lazy-4x80", args: &["--hosts", "4", "--ops", "80", "--lazy"] },
    SweepConfig { name: "crash-4x80", args: &["--hosts", "4", "--ops", "80", "--crash"] },
    SweepConfig { name: "crash-odd-lazy-4x200", args: &["--hosts", "4", "--ops", "200", "--crash-odd", "--lazy"] },
    SweepConfig { name: "crash-mixed-4x300", args: &["--hosts", "4", "--ops", "300", "--crash", "--mixed"] },
    SweepConfig { name: "lazy-alt-mixed-4x200", args: &["--hosts", "4", "--ops", "200", "--lazy-alt", "--mixed"] },
    SweepConfig { name: "crash-lazy-5x300", args: &["--hosts", "5", "--ops", "300", "--crash", "--lazy"] },
    SweepConfig {
        name: "crash-odd-lazy-alt-5x150",
        args: &["--hosts", "5", "--ops", "150", "--crash-odd", "--lazy-alt"],
    },
    // A host stopped anywhere, declared dead, recovered, and woken: it runs
    // on until it learns it is fenced, its dirty lines landing whenever the
    // scheduler chooses (README, "Zombies").
    SweepConfig { name: "zombie-lazy-3x80", args: &["--hosts", "3", "--ops", "80", "--zombie", "--lazy"] },
    SweepConfig { name: "zombie-mixed-4x200", args: &["--hosts", "4", "--ops", "200", "--zombie", "--mixed"] },
    SweepConfig { name: "zombie-lazy-alt-5x300", args: &["--hosts", "5", "--ops", "300", "--zombie", "--lazy-alt"] },
    // A manager step cut off part-way now and then, the node going on from
    // a fresh manager state (a peer process stepping it was killed; README,
    // "Locks").
    SweepConfig { name: "cut-lazy-4x200", args: &["--hosts", "4", "--ops", "200", "--lazy", "--cut-steps"] },
    SweepConfig {
        name: "cut-zombie-mixed-4x150",
        args: &["--hosts", "4", "--ops", "150", "--zombie", "--mixed", "--cut-steps"],
    },
];

/// How a run of the sweep ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pass,
    Violation,
    Livelock,
}

fn cmd_sweep(a: SweepArgs) -> Result<u8, String> {
    if a.list {
        for c in SWEEP {
            println!("{}: run {}", c.name, c.args.join(" "));
        }
        return Ok(0);
    }
    let named = |c: &&SweepConfig| a.configs.iter().any(|n| c.name.contains(n.as_str()));
    let configs: Vec<&SweepConfig> =
        if a.configs.is_empty() { SWEEP.iter().collect() } else { SWEEP.iter().filter(named).collect() };
    if configs.is_empty() {
        return Err("no configuration matches --config (--list shows them)".into());
    }
    let jobs = a.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut queue: std::collections::VecDeque<(usize, u64)> =
        (0..configs.len()).flat_map(|c| (a.from..a.from.saturating_add(a.seeds)).map(move |s| (c, s))).collect();
    let total = queue.len();
    let limit = Duration::from_secs(a.time_limit);
    let t0 = Instant::now();
    let mut running: Vec<(usize, u64, std::process::Child, Instant)> = Vec::new();
    let mut results: Vec<(usize, u64, Verdict, String)> = Vec::new();
    let (mut shown, mut reported) = (0, 0);
    while !queue.is_empty() || !running.is_empty() {
        while running.len() < jobs {
            let Some((c, s)) = queue.pop_front() else { break };
            let child = Command::new(&exe)
                .arg("run")
                .args(["--seed", &s.to_string()])
                .args(configs[c].args)
                .arg("--quiet")
                .env("CXLKV_SIM_STEP_LIMIT", a.step_limit.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start a run: {e}"))?;
            running.push((c, s, child, Instant::now()));
        }
        std::thread::sleep(Duration::from_millis(20));
        let mut k = 0;
        while k < running.len() {
            let (c, s) = (running[k].0, running[k].1);
            let done = running[k].2.try_wait().map_err(|e| format!("waiting for a run: {e}"))?;
            let late = done.is_none() && running[k].3.elapsed() > limit;
            if done.is_none() && !late {
                k += 1;
                continue;
            }
            let (_, _, mut child, _) = running.swap_remove(k);
            if late {
                let _ = child.kill();
                let _ = child.wait();
                results.push((c, s, Verdict::Livelock, format!("no verdict within {}s", a.time_limit)));
                continue;
            }
            let (v, first) = verdict_of(child, done);
            results.push((c, s, v, first));
        }
        // Each failing run as soon as it is known, with the command that
        // replays it: a sweep stopped early still says what it found.
        for r in results.iter().skip(reported) {
            if r.2 != Verdict::Pass {
                let kind = if r.2 == Verdict::Livelock { "livelock" } else { "violation" };
                eprintln!("sweep: {kind}: run --seed {} {}: {}", r.1, configs[r.0].args.join(" "), r.3);
            }
        }
        reported = results.len();
        if results.len() >= shown + 50 {
            shown = results.len();
            let bad = |v: Verdict| results.iter().filter(|r| r.2 == v).count();
            eprintln!(
                "sweep: {shown}/{total} runs, {} violations, {} livelocks so far",
                bad(Verdict::Violation),
                bad(Verdict::Livelock)
            );
        }
    }
    let (viol, live) = print_sweep(&a, &configs, &results, t0);
    Ok(if viol + live == 0 { 0 } else { VIOLATION })
}

/// The verdict of a finished run and the first line of its report.
fn verdict_of(mut child: std::process::Child, done: Option<std::process::ExitStatus>) -> (Verdict, String) {
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    let first = out.lines().nth(1).unwrap_or("").trim().to_string();
    match done.and_then(|d| d.code()) {
        Some(0) => (Verdict::Pass, first),
        Some(1) if out.contains("livelock") || out.contains("scheduler stalled") => (Verdict::Livelock, first),
        Some(1) => (Verdict::Violation, first),
        other => (Verdict::Violation, format!("the run ended without a verdict ({other:?})")),
    }
}

/// Prints each configuration's counts and first failing seeds, then the
/// totals; returns (violations, livelocks).
fn print_sweep(
    a: &SweepArgs,
    configs: &[&SweepConfig],
    results: &[(usize, u64, Verdict, String)],
    t0: Instant,
) -> (usize, usize) {
    let count = |v: Verdict| results.iter().filter(|r| r.2 == v).count();
    let (viol, live) = (count(Verdict::Violation), count(Verdict::Livelock));
    for (ci, c) in configs.iter().enumerate() {
        let mut bad: Vec<&(usize, u64, Verdict, String)> =
            results.iter().filter(|r| r.0 == ci && r.2 != Verdict::Pass).collect();
        bad.sort_by_key(|r| r.1);
        println!(
            "{}: {} runs, {} violations, {} livelocks (run {})",
            c.name,
            results.iter().filter(|r| r.0 == ci).count(),
            bad.iter().filter(|r| r.2 == Verdict::Violation).count(),
            bad.iter().filter(|r| r.2 == Verdict::Livelock).count(),
            c.args.join(" ")
        );
        for r in bad.iter().take(5) {
            let kind = if r.2 == Verdict::Livelock { "livelock" } else { "violation" };
            println!("  seed {}: {kind}: {}", r.1, r.3);
        }
    }
    println!(
        "sweep: {} runs, {viol} violations, {live} livelocks (seeds {}..{}, {:.0}s)",
        results.len(),
        a.from,
        a.from.saturating_add(a.seeds),
        t0.elapsed().as_secs_f64()
    );
    (viol, live)
}
