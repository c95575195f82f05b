//! `cxlkv-sim`: runs the proof harness from the command line.
//!
//! - `cxlkv-sim run [--seed N] [--seeds K] [--hosts H] [--ops N]
//!   [--crash | --crash-odd] [--lazy | --lazy-alt] [--mixed] [--disable SITE]
//!   [--quiet]` runs K seeds from N. `--crash` crashes a host in every run,
//!   `--crash-odd` in runs of odd seeds; `--lazy` runs lazy caches,
//!   `--lazy-alt` in runs of seeds 2 and 3 (mod 4); `--mixed` draws block
//!   lengths from 64 bytes to two chunks instead of a few sizes.
//!   In a build made with `RUSTFLAGS="--cfg cxlkv_mutants"`, `--mutant NAME`
//!   switches logic mutant NAME of core on (see `tests/logic-mutants.sh`).
//! - `cxlkv-sim sites` lists every coherence call site in core and how many
//!   times a default run executed it.
//!
//! Exit status: 0 when every run passed; 1 when a run found a violation
//! (printing the seed, the violations and the last scheduler events); 2 for
//! a usage error. Scripts count a mutant as killed on status 1 only.

use cxlkv_sim::harness::{reformat_run, run, RunConfig};

/// Exit status of a run that found a violation.
const VIOLATION: i32 = 1;
/// Exit status of a usage error.
const USAGE: i32 = 2;

const USAGE_TEXT: &str = "usage: cxlkv-sim run [--seed N] [--seeds K] [--hosts H] [--ops N] [--crash | --crash-odd] \
     [--lazy | --lazy-alt] [--mixed] [--disable SITE] [--mutant NAME] [--quiet] | sites";

/// The value after `name`, parsed; `d` when absent; a usage error when
/// present but malformed.
fn arg<T: std::str::FromStr>(a: &[String], name: &str, d: T) -> T {
    match a.iter().position(|x| x == name) {
        None => d,
        Some(i) => match a.get(i + 1).and_then(|v| v.parse().ok()) {
            Some(v) => v,
            None => usage(&format!("{name} needs a value")),
        },
    }
}

fn usage(why: &str) -> ! {
    eprintln!("cxlkv-sim: {why}\n{USAGE_TEXT}");
    std::process::exit(USAGE);
}

/// Switches logic mutant `name` on (a build for the mutant check only).
#[cfg(cxlkv_mutants)]
fn switch_mutant(name: &'static str) {
    cxlkv_core::mutant::set(Some(name));
}

/// Refuses: this build carries no mutants.
#[cfg(not(cxlkv_mutants))]
fn switch_mutant(name: &'static str) {
    usage(&format!("--mutant {name}: this build has no mutants (build with RUSTFLAGS=\"--cfg cxlkv_mutants\")"))
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let known = [
        "--seed",
        "--seeds",
        "--hosts",
        "--ops",
        "--crash",
        "--crash-odd",
        "--lazy",
        "--lazy-alt",
        "--mixed",
        "--disable",
        "--mutant",
        "--quiet",
    ];
    let mut i = 2;
    while i < a.len() {
        match a[i].as_str() {
            "--seed" | "--seeds" | "--hosts" | "--ops" | "--disable" | "--mutant" => i += 2,
            x if known.contains(&x) => i += 1,
            x => usage(&format!("unknown option {x}")),
        }
    }
    let seed: u64 = arg(&a, "--seed", 1);
    let seeds: u64 = arg(&a, "--seeds", 1);
    let hosts: usize = arg(&a, "--hosts", 3);
    let ops: u32 = arg(&a, "--ops", 100);
    let has = |f: &str| a.iter().any(|x| x == f);
    let disable: Option<&'static str> = a
        .iter()
        .position(|x| x == "--disable")
        .and_then(|i| a.get(i + 1))
        .map(|s| &*Box::leak(s.clone().into_boxed_str()));
    if !(2..=16).contains(&hosts) {
        usage("--hosts must be 2 to 16");
    }
    if let Some(i) = a.iter().position(|x| x == "--mutant") {
        let Some(name) = a.get(i + 1) else { usage("--mutant needs a value") };
        switch_mutant(Box::leak(name.clone().into_boxed_str()));
    }
    match a.get(1).map(String::as_str) {
        Some("run") => {
            let (mut total_ops, mut steps) = (0u64, 0u64);
            let t = std::time::Instant::now();
            for sd in seed..seed + seeds {
                let crash = has("--crash") || has("--crash-odd") && sd % 2 == 1;
                let lazy = has("--lazy") || has("--lazy-alt") && sd % 4 >= 2;
                let cfg =
                    RunConfig { seed: sd, hosts, ops, crash, disable, lazy, mixed: has("--mixed"), feed_at: None };
                let mut r = run(&cfg);
                r.violations.extend(reformat_run(sd, disable, lazy));
                total_ops += r.ops;
                steps += r.steps;
                if !r.violations.is_empty() {
                    println!("FAIL seed {sd} hosts {hosts} ops {ops} crash {:?} lazy {lazy}", r.crashed);
                    for v in &r.violations {
                        println!("  {v}");
                    }
                    if !has("--quiet") {
                        println!("last events:");
                        for e in &r.trace {
                            println!("  {e}");
                        }
                    }
                    std::process::exit(VIOLATION);
                }
            }
            println!(
                "pass: {seeds} runs, {total_ops} operations, {steps} scheduler steps, {:.1}s",
                t.elapsed().as_secs_f64()
            );
        }
        Some("sites") => {
            let r = run(&RunConfig {
                seed,
                hosts,
                ops,
                crash: true,
                disable: None,
                lazy: has("--lazy"),
                mixed: true,
                feed_at: None,
            });
            for (s, n) in r.executed {
                println!("{s} {n}");
            }
        }
        _ => usage("no command"),
    }
}
