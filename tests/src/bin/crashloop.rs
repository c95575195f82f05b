//! `cxlkv-crashloop [--iterations N] [--workers W] [--seed S] [--seeds K]
//! [--hang-after SECONDS]`: the real-process crash test (see
//! `cxlkv_tests::crashloop`), for seeds S..S+K (one fresh region each).
//! Prints every hang (a surviving worker that did not finish in time) with
//! the worker's last operation and its threads' stacks, then the totals;
//! exits 1 unless wrong payloads, leaked bytes, findings, hangs and failed
//! workers are all 0.

fn arg(a: &[String], name: &str, d: u64) -> u64 {
    a.iter().position(|x| x == name).and_then(|i| a.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(d)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let worker = std::env::current_exe().expect("own path").with_file_name("cxlkv-test-worker");
    let (seed, seeds) = (arg(&a, "--seed", 1), arg(&a, "--seeds", 1));
    let hang_after = std::time::Duration::from_secs(arg(&a, "--hang-after", 150));
    let mut all = cxlkv_tests::crashloop::Totals::default();
    for s in seed..seed + seeds {
        let t = cxlkv_tests::crashloop::run(
            &worker,
            arg(&a, "--iterations", 1000),
            arg(&a, "--workers", 3) as usize,
            s,
            hang_after,
        );
        println!(
            "seed {s}: iterations {}, killed {}, wrong payloads {}, bytes leaked {}, findings {}, hangs {}, failed {}",
            t.iterations,
            t.killed,
            t.wrong_payloads,
            t.bytes_leaked,
            t.findings,
            t.hangs.len(),
            t.failed
        );
        all.iterations += t.iterations;
        all.killed += t.killed;
        all.wrong_payloads += t.wrong_payloads;
        all.bytes_leaked += t.bytes_leaked;
        all.findings += t.findings;
        all.failed += t.failed;
        all.hangs.extend(t.hangs);
    }
    for h in &all.hangs {
        println!("{h}");
    }
    println!(
        "iterations: {}, processes killed: {}, wrong payloads served: {}, bytes leaked: {}, check findings: {}, hangs: {}, failed workers: {}",
        all.iterations,
        all.killed,
        all.wrong_payloads,
        all.bytes_leaked,
        all.findings,
        all.hangs.len(),
        all.failed
    );
    if all.wrong_payloads + all.bytes_leaked + all.findings + all.failed > 0 || !all.hangs.is_empty() {
        std::process::exit(1);
    }
}
