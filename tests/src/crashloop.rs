//! The real-process crash test: worker processes share a /dev/shm region;
//! each iteration one of them is killed with SIGKILL at a random moment, the
//! survivors finish, and a fresh process recovers and checks the region and
//! verifies every block still stored. Counts what must stay zero: wrong
//! payloads served, bytes leaked, check findings.

use std::io::{BufRead, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cxlkv_core::alloc::{block_of, read_map};
use cxlkv_core::check::FindingKind;
use cxlkv_core::coherence::Coherence;
use cxlkv_core::hash::mix64;
use cxlkv_core::layout::{Capacities, ChunkRecord};
use cxlkv_core::store::Store;
use cxlkv_platform::{Node, Options};

use crate::{key, shm_path, verify, NS};

/// Totals of a crash-test run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
    /// Surviving workers that did not finish in time, each described.
    pub hangs: Vec<Hang>,
    /// Surviving workers that failed otherwise (exit status, no counts).
    pub failed: u64,
}

/// A surviving worker that did not finish within the loop's limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hang {
    /// The loop's seed.
    pub seed: u64,
    /// The iteration.
    pub iteration: u64,
    /// The worker's index and pid.
    pub worker: usize,
    /// Its pid.
    pub pid: u32,
    /// The last operation it reported starting.
    pub last_op: String,
    /// Its threads' stacks (from gdb, when installed).
    pub stacks: String,
    /// The region's nodes, manager and locks at the time (what waits on what).
    pub region: String,
}

impl std::fmt::Display for Hang {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "hang: seed {} iteration {} worker {} (pid {}): last operation: {}",
            self.seed, self.iteration, self.worker, self.pid, self.last_op
        )
    }
}

fn caps() -> Capacities {
    Capacities { max_nodes: 8, n_stripes: 8, entries_per_stripe: 128, chunk_shift: 18, ..Capacities::default() }
}

/// The threads' stacks of process `pid`, from gdb if it is installed.
fn stacks_of(pid: u32) -> String {
    let out = Command::new("gdb")
        .args(["-batch", "-nx", "-p", &pid.to_string(), "-ex", "thread apply all bt 30"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with('#') || l.starts_with("Thread"))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(_) => String::from("(gdb not available)"),
    }
}

/// Runs `iterations` kill-recover-check rounds with `workers` processes of
/// the worker binary at `worker`, seeded by `seed`. A surviving worker that
/// has not finished after `hang_after` is a hang: reported with its last
/// operation (and stacks), then killed.
pub fn run(worker: &Path, iterations: u64, workers: usize, seed: u64, hang_after: Duration) -> Totals {
    let path = shm_path("crashloop");
    let mut t = Totals::default();
    let opts = Options { lock_timeout: Duration::from_secs(60), ..Options::default() };
    drop(Node::create(&path, 16 << 20, caps(), opts.clone()).expect("create region"));
    let mut x = seed | 1;
    for it in 0..iterations {
        let mut kids: Vec<_> = (0..workers)
            .map(|w| {
                let mut k = Command::new(worker)
                    .args(["mixed", path.to_str().unwrap_or(""), &(seed ^ (it * 31 + w as u64)).to_string(), "600"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn worker");
                // The worker reports each operation it starts on stderr: keep
                // the last line (draining the pipe so it never blocks).
                let last = std::sync::Arc::new(std::sync::Mutex::new(String::from("(nothing yet)")));
                let err = k.stderr.take();
                let l2 = last.clone();
                std::thread::spawn(move || {
                    let Some(e) = err else { return };
                    for line in std::io::BufReader::new(e).lines().map_while(|l| l.ok()) {
                        if let Ok(mut g) = l2.lock() {
                            *g = line;
                        }
                    }
                });
                (k, last)
            })
            .collect();
        x = mix64(x);
        let victim = (x % workers as u64) as usize;
        std::thread::sleep(Duration::from_millis(20 + (x >> 20) % 300));
        // SAFETY: sending SIGKILL to our own child.
        unsafe { libc::kill(kids[victim].0.id() as i32, libc::SIGKILL) };
        t.killed += 1;
        let start = Instant::now();
        for (w, (k, last)) in kids.iter_mut().enumerate() {
            let status = loop {
                if let Some(s) = k.try_wait().expect("wait worker") {
                    break Some(s);
                }
                if start.elapsed() > hang_after {
                    let h = Hang {
                        seed,
                        iteration: it,
                        worker: w,
                        pid: k.id(),
                        last_op: last.lock().map(|g| g.clone()).unwrap_or_default(),
                        stacks: stacks_of(k.id()),
                        region: region_state(&path),
                    };
                    eprintln!("{h}\n{}\n{}", h.region, h.stacks);
                    t.hangs.push(h);
                    let _ = k.kill();
                    let _ = k.wait();
                    break None;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            let mut out = String::new();
            let _ = k.stdout.as_mut().map(|s| s.read_to_string(&mut out));
            if w != victim && status.is_some() {
                let bad = out
                    .split("\"verify_failures\":")
                    .nth(1)
                    .and_then(|s| s.split(',').next())
                    .and_then(|v| v.parse::<u64>().ok());
                t.wrong_payloads += bad.unwrap_or(0);
                if status.is_none_or(|s| !s.success()) && bad.is_none() {
                    eprintln!(
                        "seed {seed} iteration {it}: surviving worker {w} failed: {status:?} {out} (last: {})",
                        last.lock().map(|g| g.clone()).unwrap_or_default()
                    );
                    t.failed += 1;
                }
            }
        }
        // A fresh process recovers, checks and verifies what is stored.
        let c = Node::open(&path, Options { auto_recover: false, ..opts.clone() }).expect("attach");
        let _ = c.recover();
        let findings = c.check().unwrap_or_default();
        t.findings += findings.len() as u64;
        for f in &findings {
            eprintln!("seed {seed} iteration {it}: check finding: {f}");
        }
        for f in &findings {
            if f.kind == FindingKind::LeakedBlock || f.kind == FindingKind::LeakedRaw {
                t.bytes_leaked += leaked_bytes(c.store(), f.a as u32, f.b as u32);
            }
        }
        let mut buf = vec![0u8; 80 << 10];
        for i in 0..600 {
            if let Ok(n) = c.core().get(NS, key(i), &mut buf) {
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

/// The region's nodes, manager line and every lock that is held, waited for
/// or awaiting repair, read from memory (this machine is coherent).
fn region_state(path: &Path) -> String {
    use cxlkv_core::layout::{LockLine, LockSlot, ManagerLine, NodeInfo, RequestLine};
    let Ok(map) = cxlkv_platform::Mapping::open(path) else { return "(region unreadable)".into() };
    let Ok(st) = cxlkv_core::store::attach(map.view(), cxlkv_core::coherence::Coherent) else {
        return "(region does not attach)".into();
    };
    let l = &st.layout;
    let mut out = String::new();
    if let Ok(ml) = st.view.read::<ManagerLine>(l.manager.start) {
        out += &format!("manager: node {} lease {} dead {:b}\n", ml.manager as i64 - 1, ml.lease, ml.dead_mask);
    }
    for n in 0..l.caps.max_nodes {
        let Ok(i) = st.view.read::<NodeInfo>(l.node_info(n)) else { continue };
        let bells = st.view.read::<RequestLine>(l.requests(n)).map(|r| r.want).unwrap_or_default();
        if i.state != 0 || bells != [0; 4] {
            out += &format!("node {n}: state {} pid {} bells {:x?}\n", i.state, i.pid, bells);
        }
    }
    for lock in 0..l.n_locks {
        let Ok(ll) = st.view.read::<LockLine>(l.lock_line(lock)) else { continue };
        let slots: Vec<String> = (0..l.caps.max_nodes)
            .filter_map(|n| {
                let s = st.view.read::<LockSlot>(l.lock_slot(lock, n)).ok()?;
                (s.state != 0).then(|| format!("node {n}: state {} flags {} seq {}", s.state, s.flags, s.seq))
            })
            .collect();
        if !slots.is_empty() || ll.repair != 0 {
            out += &format!(
                "lock {lock}: holder {} repair {} seq {} | {}\n",
                ll.holder as i64 - 1,
                ll.repair,
                ll.grant_seq,
                slots.join(", ")
            );
        }
    }
    out
}

/// Bytes of the block at granule `i` of chunk `c` (0 when none starts there).
fn leaked_bytes<C: Coherence>(st: &Store<C>, c: u32, i: u32) -> u64 {
    let l = &st.layout;
    let (Ok(rec), Ok(m)) = (st.view.read::<ChunkRecord>(l.chunk(c)), read_map(st, c, None)) else { return 0 };
    let off = l.chunk_payload(c) + i as u64 * l.granule();
    block_of(l, c, &rec, &m, off).map_or(0, |(_, b)| b)
}
