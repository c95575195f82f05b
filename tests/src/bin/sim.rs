//! `cxlkv-sim`: runs the proof harness from the command line.
//!
//! - `cxlkv-sim run [--seed N] [--seeds K] [--hosts H] [--ops N] [--crash] [--lazy] [--disable SITE]`
//!   runs K seeds from N; exit 0 when every run passes, 1 on a violation
//!   (printing the seed, the violations and the last scheduler events);
//! - `cxlkv-sim sites` lists every coherence call site in core and how many
//!   times a default run executed it.

use cxlkv_tests::sim::{reformat_run, run, RunConfig};

fn arg<T: std::str::FromStr>(a: &[String], name: &str, d: T) -> T {
    a.iter().position(|x| x == name).and_then(|i| a.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(d)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let seed: u64 = arg(&a, "--seed", 1);
    let seeds: u64 = arg(&a, "--seeds", 1);
    let hosts: usize = arg(&a, "--hosts", 3);
    let ops: u32 = arg(&a, "--ops", 100);
    let crash = a.iter().any(|x| x == "--crash");
    let lazy = a.iter().any(|x| x == "--lazy");
    let disable: Option<&'static str> = a
        .iter()
        .position(|x| x == "--disable")
        .and_then(|i| a.get(i + 1))
        .map(|s| &*Box::leak(s.clone().into_boxed_str()));
    match a.get(1).map(String::as_str) {
        Some("run") => {
            let (mut total_ops, mut steps) = (0u64, 0u64);
            let t = std::time::Instant::now();
            for sd in seed..seed + seeds {
                // Alternate crash-free and crash runs when --crash is given.
                let cfg = RunConfig { seed: sd, hosts, ops, crash: crash && sd % 2 == 1, disable, lazy };
                let mut r = run(&cfg);
                r.violations.extend(reformat_run(sd, disable, lazy));
                total_ops += r.ops;
                steps += r.steps;
                if !r.violations.is_empty() {
                    println!("FAIL seed {sd} hosts {hosts} ops {ops} crash {:?}", r.crashed);
                    for v in &r.violations {
                        println!("  {v}");
                    }
                    if !a.iter().any(|x| x == "--quiet") {
                        println!("last events:");
                        for e in &r.trace {
                            println!("  {e}");
                        }
                    }
                    std::process::exit(1);
                }
            }
            println!(
                "pass: {seeds} runs, {total_ops} operations, {steps} scheduler steps, {:.1}s",
                t.elapsed().as_secs_f64()
            );
        }
        Some("sites") => {
            let r = run(&RunConfig { seed, hosts, ops, crash: true, disable: None, lazy });
            for (s, n) in r.executed {
                println!("{s} {n}");
            }
        }
        _ => {
            eprintln!(
                "usage: cxlkv-sim run [--seed N] [--seeds K] [--hosts H] [--ops N] [--crash] [--lazy] [--disable SITE] | sites"
            );
            std::process::exit(2);
        }
    }
}
