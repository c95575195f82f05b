//! The SSD tier in its own process: blocks spilled by a tier process come
//! back byte-exact into another process's gets; `kill -9` of the tier in
//! the middle of spilling, then a restart on the same drive, leaves no slot
//! that yields wrong bytes, and the region checks clean. Children run under
//! a watchdog.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use cxlkv_core::index::Lru;
use cxlkv_core::layout::Capacities;
use cxlkv_platform::{GetItem, Node, Options};
use cxlkv_tests::{fill, key, len_of, shm_path, verify, NS};

const WORKER: &str = env!("CARGO_BIN_EXE_cxlkv-test-worker");
const N: u64 = 120;

struct Cleanup(Vec<PathBuf>, Vec<Child>);
impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &mut self.1 {
            let _ = c.kill();
            let _ = c.wait();
        }
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// Reads lines of `out` until one starts with `what` (watchdog: 60 s).
fn expect(out: &mut BufReader<ChildStdout>, what: &str) -> String {
    let t = Instant::now();
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the tier process ended before `{what}`");
        if line.starts_with(what) {
            return line;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no `{what}` from the tier process");
    }
}

fn spawn_tier(region: &std::path::Path, dir: &std::path::Path) -> (Child, BufReader<ChildStdout>) {
    spawn_tier_on(region, dir, None)
}

/// A tier process, as host `host` (`CXLKV_HOST_ID`) when given.
fn spawn_tier_on(
    region: &std::path::Path,
    dir: &std::path::Path,
    host: Option<u64>,
) -> (Child, BufReader<ChildStdout>) {
    let mut cmd = Command::new(WORKER);
    if let Some(h) = host {
        cmd.env("CXLKV_HOST_ID", h.to_string());
    }
    let mut c =
        cmd.args(["tier", region.to_str().unwrap(), dir.to_str().unwrap()]).stdout(Stdio::piped()).spawn().unwrap();
    let out = BufReader::new(c.stdout.take().unwrap());
    (c, out)
}

fn get(node: &Node, i: u64) -> Option<Vec<u8>> {
    let k = key(i);
    let mut buf = vec![0u8; 128 << 10];
    let (mut lens, mut out) = ([0u64], [Ok(())]);
    let mut parts = [&mut buf[..]];
    node.get(NS, &mut [GetItem { key: k, parts: &mut parts }], &mut lens, &mut out).unwrap();
    out[0].ok().map(|_| buf[..lens[0] as usize].to_vec())
}

/// A region in /dev/shm holding blocks 0..N (lease `lease`), a drive
/// directory for a tier, and what removes both (and the children).
fn region_with_blocks(tag: &str, lease: Duration) -> (Node, PathBuf, Cleanup) {
    let region = shm_path(tag);
    let base = std::env::var_os("CXLKV_TIER_TEST_DIR").map(PathBuf::from).unwrap_or_else(|| "/var/tmp".into());
    let dir = base.join(format!("cxlkv-{tag}-{}", std::process::id()));
    let clean = Cleanup(vec![region.clone(), dir.clone()], Vec::new());
    let caps =
        Capacities { max_nodes: 8, n_stripes: 8, entries_per_stripe: 128, chunk_shift: 18, ..Capacities::default() };
    let opts = Options { lock_timeout: Duration::from_secs(60), lease, ..Options::default() };
    let node = Node::create(&region, 64 << 20, caps, opts).unwrap();
    let mut buf = Vec::new();
    for i in 0..N {
        buf.resize(len_of(key(i)), 0);
        fill(key(i), &mut buf);
        let h = node.core().reserve(NS, key(i), buf.len() as u64, 16).unwrap();
        node.core().write(&h, 0, &buf).unwrap();
        node.core().publish_flushed(&[h], &mut [Ok(())]).unwrap();
    }
    (node, dir, clean)
}

#[test]
fn a_killed_tier_restarts_on_its_drive_and_never_yields_wrong_bytes() {
    let (node, dir, mut clean) = region_with_blocks("tier", Duration::from_secs(2));
    // A tier process, killed a moment after it starts copying.
    let region = clean.0[0].clone();
    let (mut t1, mut out1) = spawn_tier(&region, &dir);
    expect(&mut out1, "ready");
    std::thread::sleep(Duration::from_millis(cxlkv_platform::host::random_u64() % 20));
    t1.kill().unwrap();
    t1.wait().unwrap();
    // Its successor waits until the dead node is recovered, rebuilds from
    // the slot headers (a torn slot fails its checksums), then copies the
    // rest.
    let (t2, mut out2) = spawn_tier(&region, &dir);
    clean.1.push(t2);
    let ready = expect(&mut out2, "ready");
    let held: u64 = ready.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(held <= N);
    expect(&mut out2, "spilled");
    // Everything leaves the region; every get comes back through the tier,
    // byte-exact.
    node.core().evict(u64::MAX, &mut Lru).unwrap();
    assert_eq!(node.core().lookup(NS, &[key(0)]).unwrap(), 0);
    for i in 0..N {
        let got = get(&node, i).unwrap_or_else(|| panic!("block {i} not promoted"));
        assert!(verify(key(i), &got), "block {i}: wrong bytes");
    }
    let findings = node.check().unwrap();
    assert!(findings.is_empty(), "{findings:?}");
}

/// Two hosts, each with its own tier (one simulated: `CXLKV_HOST_ID`); the
/// other host's tier process is killed while this host's gets are asking
/// it for blocks: every get returns the block's exact bytes or a miss, the
/// dead tier's directory stops naming blocks once its node is declared
/// dead (by its silence: it is another host), and the region checks clean.
#[test]
fn a_second_hosts_tier_serves_gets_and_its_death_only_makes_misses() {
    let (node, dir, mut clean) = region_with_blocks("tier2", Duration::from_millis(500));
    let region = clean.0[0].clone();
    let (t, mut out) = spawn_tier_on(&region, &dir, Some(0x5eed_0002));
    clean.1.push(t);
    expect(&mut out, "ready");
    expect(&mut out, "spilled");
    node.core().evict(u64::MAX, &mut Lru).unwrap();
    // Half the blocks come back from the other host's tier.
    for i in 0..N / 2 {
        let got = get(&node, i).unwrap_or_else(|| panic!("block {i} not promoted"));
        assert!(verify(key(i), &got), "block {i}: wrong bytes");
    }
    // Gets of the rest race the tier's death.
    let killer = std::thread::spawn({
        let mut t = clean.1.pop().unwrap();
        move || {
            std::thread::sleep(Duration::from_millis(cxlkv_platform::host::random_u64() % 10));
            t.kill().unwrap();
            t.wait().unwrap();
        }
    });
    let mut misses = 0;
    for i in N / 2..N {
        match get(&node, i) {
            Some(got) => assert!(verify(key(i), &got), "block {i}: wrong bytes"),
            None => misses += 1,
        }
    }
    killer.join().unwrap();
    // Declared dead by its silence, recovered (automatically), its blocks
    // are misses from then on.
    let t0 = Instant::now();
    while node.store().tiers_active().unwrap() {
        assert!(t0.elapsed() < Duration::from_secs(30), "the dead tier still named");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(node.store().tier_find(NS, key(N - 1)).unwrap().is_none());
    let t0 = Instant::now();
    while !node.check().unwrap().is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", node.check().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("{misses} of {} gets missed around the tier's death", N / 2);
}
