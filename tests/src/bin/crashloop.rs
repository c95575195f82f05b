//! `cxlkv-crashloop [--iterations N] [--workers W] [--seed S]`: the
//! real-process crash test (see `cxlkv_tests::crashloop`). Prints the totals
//! and exits 1 unless wrong payloads, leaked bytes and findings are all 0.

fn arg(a: &[String], name: &str, d: u64) -> u64 {
    a.iter().position(|x| x == name).and_then(|i| a.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(d)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let worker = std::env::current_exe().expect("own path").with_file_name("cxlkv-test-worker");
    let t = cxlkv_tests::crashloop::run(
        &worker,
        arg(&a, "--iterations", 1000),
        arg(&a, "--workers", 3) as usize,
        arg(&a, "--seed", 1),
    );
    println!(
        "iterations: {}, processes killed: {}, wrong payloads served: {}, bytes leaked: {}, check findings: {}",
        t.iterations, t.killed, t.wrong_payloads, t.bytes_leaked, t.findings
    );
    if t.wrong_payloads + t.bytes_leaked + t.findings > 0 {
        std::process::exit(1);
    }
}
