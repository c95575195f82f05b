//! The real-process crash test: worker processes share a /dev/shm region;
//! each iteration one of them is killed with SIGKILL at a random moment, the
//! survivors finish, and a fresh process recovers and checks the region and
//! verifies every block still stored. Counts what must stay zero: wrong
//! payloads served, bytes leaked, check findings.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cxlkv_core::check::FindingKind;
use cxlkv_core::hash::mix64;
use cxlkv_core::layout::{Capacities, ChunkRecord};
use cxlkv_platform::{Cache, Options};

use crate::{key, shm_path, verify, NS};

/// Totals of a crash-test run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Iterations run.
    pub iterations: u64,
    /// Payloads that differed from what was published (workers + final scan).
    pub wrong_payloads: u64,
    /// Payload bytes allocated but referenced by nothing, after recovery.
    pub bytes_leaked: u64,
    /// Findings of `check` after recovery.
    pub findings: u64,
    /// Workers killed.
    pub killed: u64,
}

fn caps() -> Capacities {
    Capacities { max_nodes: 8, n_stripes: 8, entries_per_stripe: 128, chunk_shift: 18, ..Capacities::default() }
}

/// Runs `iterations` kill-recover-check rounds with `workers` processes of
/// the worker binary at `worker`, seeded by `seed`.
pub fn run(worker: &Path, iterations: u64, workers: usize, seed: u64) -> Totals {
    let path = shm_path("crashloop");
    let mut t = Totals::default();
    let opts = Options { lock_timeout: Duration::from_secs(60), ..Options::default() };
    drop(Cache::create(&path, 16 << 20, caps(), opts.clone()).expect("create region"));
    let mut x = seed | 1;
    for it in 0..iterations {
        let mut kids: Vec<_> = (0..workers)
            .map(|w| {
                Command::new(worker)
                    .args(["mixed", path.to_str().unwrap_or(""), &(seed ^ (it * 31 + w as u64)).to_string(), "600"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn worker")
            })
            .collect();
        x = mix64(x);
        let victim = (x % workers as u64) as usize;
        std::thread::sleep(Duration::from_millis(20 + (x >> 20) % 300));
        // SAFETY: sending SIGKILL to our own child.
        unsafe { libc::kill(kids[victim].id() as i32, libc::SIGKILL) };
        t.killed += 1;
        for (w, k) in kids.iter_mut().enumerate() {
            let start = Instant::now();
            let status = loop {
                if let Some(s) = k.try_wait().expect("wait worker") {
                    break Some(s);
                }
                if start.elapsed() > Duration::from_secs(300) {
                    let _ = k.kill();
                    let _ = k.wait();
                    break None;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            let mut out = String::new();
            let _ = k.stdout.as_mut().map(|s| s.read_to_string(&mut out));
            if w != victim {
                let bad = out
                    .split("\"verify_failures\":")
                    .nth(1)
                    .and_then(|s| s.split(',').next())
                    .and_then(|v| v.parse::<u64>().ok());
                t.wrong_payloads += bad.unwrap_or(0);
                if status.is_none_or(|s| !s.success()) && bad.is_none() {
                    // A survivor that died or hung is itself a failure.
                    eprintln!("iteration {it}: surviving worker {w} failed: {status:?} {out}");
                    t.findings += 1;
                }
            }
        }
        // A fresh process recovers, checks and verifies what is stored.
        let c = Cache::open(&path, Options { auto_recover: false, ..opts.clone() }).expect("attach");
        let _ = c.recover();
        let findings = c.check().unwrap_or_default();
        t.findings += findings.len() as u64;
        for f in &findings {
            eprintln!("iteration {it}: check finding: {f}");
        }
        let l = c.store().layout;
        for f in &findings {
            if f.kind == FindingKind::LeakedBlock || f.kind == FindingKind::LeakedRaw {
                let rec: ChunkRecord = c.store().region.read(l.chunk(f.a as u32)).unwrap_or_default();
                t.bytes_leaked += rec.block_size;
            }
        }
        let mut buf = vec![0u8; 80 << 10];
        for i in 0..600 {
            if let Ok(n) = c.node().get(NS, key(i), &mut buf) {
                if !verify(key(i), &buf[..n]) {
                    t.wrong_payloads += 1;
                }
            }
        }
        drop(c);
        t.iterations += 1;
    }
    let _ = std::fs::remove_file(&path);
    t
}
