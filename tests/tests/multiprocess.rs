//! Several OS processes on one /dev/shm region: concurrent publish, lookup,
//! pin, read and evict with every payload verified; SIGKILL of a process
//! holding a lock, pins, a reservation and a raw allocation, then recovery.
//! Every child runs under a watchdog that kills it if it hangs.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cxlkv_core::layout::Capacities;
use cxlkv_core::Error;
use cxlkv_platform::{Mapping, Node, Options};
use cxlkv_tests::{key, shm_path, verify, NS};

const WORKER: &str = env!("CARGO_BIN_EXE_cxlkv-test-worker");

fn caps() -> Capacities {
    Capacities { max_nodes: 8, n_stripes: 8, entries_per_stripe: 128, chunk_shift: 18, ..Capacities::default() }
}

fn opts() -> Options {
    Options { lock_timeout: Duration::from_secs(60), ..Options::default() }
}

struct Region(std::path::PathBuf);
impl Drop for Region {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Waits for `child` with a watchdog; kills it and fails after `limit`.
fn wait_with_watchdog(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("worker {} hung past {limit:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn_mixed(path: &Path, seed: u64, ops: u64) -> Child {
    Command::new(WORKER)
        .args(["mixed", path.to_str().unwrap(), &seed.to_string(), &ops.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn concurrent_workers_verify_every_payload_byte() {
    let r = Region(shm_path("mixed"));
    // 12 MiB of payload for a ~20 MiB working set: eviction must happen.
    let parent = Node::create(&r.0, 16 << 20, caps(), opts()).unwrap();
    let mut kids: Vec<Child> = (0..4).map(|i| spawn_mixed(&r.0, 11 + i, 1500)).collect();
    let mut evictions = 0u64;
    for k in &mut kids {
        let s = wait_with_watchdog(k, Duration::from_secs(300));
        let mut out = String::new();
        std::io::Read::read_to_string(k.stdout.as_mut().unwrap(), &mut out).unwrap();
        assert!(s.success(), "worker failed: {s} {out}");
        assert!(out.contains("\"verify_failures\":0"), "{out}");
        let ev = out.split("\"evictions\":").nth(1).and_then(|t| t.split(',').next()).unwrap_or("0");
        evictions += ev.parse::<u64>().unwrap_or(0);
    }
    assert!(evictions > 0, "the workload should have evicted");
    // Everything the workers left behind is intact and consistent.
    let mut buf = vec![0u8; 80 << 10];
    let mut present = 0;
    for i in 0..600 {
        match parent.core().get(NS, key(i), &mut buf) {
            Ok(n) => {
                assert!(verify(key(i), &buf[..n]), "key {i}");
                present += 1;
            }
            Err(Error::NotFound) => {}
            Err(e) => panic!("get {i}: {e}"),
        }
    }
    assert!(present > 0);
    assert_eq!(parent.check().unwrap(), vec![]);
    parent.close().unwrap();
}

fn spawn_holder(path: &Path) -> Child {
    let mut c = Command::new(WORKER).args(["hold", path.to_str().unwrap()]).stdout(Stdio::piped()).spawn().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let out = c.stdout.take().unwrap();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
    if line.trim() != "ready" {
        let _ = c.kill();
        panic!("holder did not get ready: {line:?} {:?}", c.wait());
    }
    c
}

fn kill9(c: &mut Child) {
    // SAFETY: sending SIGKILL to our own child process.
    unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
    let _ = c.wait();
}

fn survivor_continues_after_recovery(parent: &Node) {
    // Stripe 0's lock was held by the dead process; keys of every stripe
    // must be writable again, and its pinned keys evictable.
    let mut buf = Vec::new();
    for i in 3000..3064 {
        let k = key(i);
        let h = parent.core().reserve(NS, k, cxlkv_tests::len_of(k) as u64, 16).unwrap();
        buf.resize(h.len as usize, 0);
        cxlkv_tests::fill(k, &mut buf);
        parent.core().write(&h, 0, &buf).unwrap();
        parent.core().publish_flushed(&[h], &mut [Ok(())]).unwrap();
    }
    let keys: Vec<_> = (3000..3064).map(key).collect();
    assert_eq!(parent.core().lookup(NS, &keys).unwrap(), 64);
    assert_eq!(parent.core().lookup(NS, &[key(2000)]).unwrap(), 0, "dead node's reservation never appears");
    let rep = parent.core().evict(u64::MAX, &mut cxlkv_core::index::Lru).unwrap();
    assert!(rep.entries >= 74, "dead node's pins no longer block eviction: {rep:?}");
}

#[test]
fn sigkill_while_holding_lock_and_pins_then_recover_lets_others_continue() {
    let r = Region(shm_path("kill"));
    // Recovery is what is under test: run it explicitly, not from the thread.
    let parent = Node::create(&r.0, 32 << 20, caps(), Options { auto_recover: false, ..opts() }).unwrap();
    let mut holder = spawn_holder(&r.0);
    let mut busy = spawn_mixed(&r.0, 99, 400);
    kill9(&mut holder);
    // Before recovery, what `cxlkv check` reports beside its findings: the
    // gone process's node and everything it still holds.
    let gone = cxlkv_platform::node::stranded(parent.store()).unwrap();
    let g = gone.iter().find(|g| g.pins >= 10).unwrap_or_else(|| panic!("the holder is not reported: {gone:?}"));
    // (Its lock may have been revoked already once it was declared dead.)
    assert!(g.reservations == 1 && (g.locks >= 1 || g.declared_dead), "{g:?}");
    let rep = parent.recover().unwrap();
    assert_eq!(rep.nodes_freed.count_ones(), 1, "{rep:?}");
    assert!(rep.pins_dropped >= 10 && rep.writes_aborted == 1, "{rep:?}");
    let s = wait_with_watchdog(&mut busy, Duration::from_secs(300));
    assert!(s.success());
    survivor_continues_after_recovery(&parent);
    assert_eq!(parent.check().unwrap(), vec![]);
    parent.close().unwrap();
}

#[test]
fn killed_lock_manager_is_replaced_and_its_locks_recovered() {
    let r = Region(shm_path("mgr"));
    {
        let m = Mapping::create_file(&r.0, 32 << 20, 0o600, true).unwrap();
        cxlkv_core::format::format(m.view(), cxlkv_core::coherence::Coherent, caps(), 77).unwrap();
    }
    // The holder attaches first and so holds the manager lease.
    let mut holder = spawn_holder(&r.0);
    let parent = Node::open(&r.0, Options { auto_recover: false, ..opts() }).unwrap();
    kill9(&mut holder);
    let rep = parent.recover().unwrap();
    assert_eq!(rep.nodes_freed.count_ones(), 1, "{rep:?}");
    assert!(parent.manager_report().active, "the survivor took the manager role");
    survivor_continues_after_recovery(&parent);
    assert_eq!(parent.check().unwrap(), vec![]);
    parent.close().unwrap();
}

#[test]
fn truncated_and_corrupted_regions_give_typed_errors() {
    let r = Region(shm_path("corrupt"));
    drop(Node::create(&r.0, 16 << 20, caps(), opts()).unwrap());
    let good = std::fs::read(&r.0).unwrap();
    let attach = |bytes: &[u8]| {
        std::fs::write(&r.0, bytes).unwrap();
        let m = Mapping::open_file(&r.0);
        match m {
            Err(e) => e.core(),
            Ok(m) => cxlkv_core::store::attach(m.view(), cxlkv_core::coherence::Coherent).err(),
        }
    };
    assert_eq!(attach(&good[..8 << 20]), Some(Error::TooSmall));
    assert_eq!(attach(&good[..100]), Some(Error::TooSmall));
    let mut b = good.clone();
    b[0] ^= 0xff;
    assert_eq!(attach(&b), Some(Error::BadMagic));
    let mut b = good.clone();
    b[..8].fill(0);
    assert_eq!(attach(&b), Some(Error::NotInitialized));
    let mut b = good.clone();
    b[8] ^= 1;
    assert_eq!(attach(&b), Some(Error::WrongVersion));
    let mut b = good.clone();
    b[16] ^= 1;
    assert_eq!(attach(&b), Some(Error::WrongLayout));
    let mut b = good.clone();
    b[100] ^= 1;
    assert_eq!(attach(&b), Some(Error::CorruptHeader));
    assert_eq!(attach(&good), None);
}

#[test]
fn crash_loop_short_version_serves_no_wrong_payload_and_leaks_nothing() {
    let t = cxlkv_tests::crashloop::run(Path::new(WORKER), 5, 3, 5, Duration::from_secs(150));
    assert_eq!(
        (t.iterations, t.wrong_payloads, t.bytes_leaked, t.findings, t.hangs.len(), t.failed),
        (5, 0, 0, 0, 0, 0),
        "{t:?}"
    );
}

/// The worker binary for the hostile-peer test: `CXLKV_TEST_WORKER` names
/// another build of it (`test.sh` passes one built with AddressSanitizer).
fn hostile_worker() -> String {
    std::env::var("CXLKV_TEST_WORKER").unwrap_or_else(|_| WORKER.to_string())
}

#[test]
fn a_hostile_peer_scribbling_metadata_never_crashes_the_others() {
    let r = Region(shm_path("hostile"));
    Node::create(&r.0, 8 << 20, caps(), opts()).unwrap().close().unwrap();
    let w = hostile_worker();
    let path = r.0.to_str().unwrap();
    let spawn = |mode: &str, seed: u64, ms: u64| {
        Command::new(&w).args([mode, path, &seed.to_string(), &ms.to_string()]).stdout(Stdio::piped()).spawn().unwrap()
    };
    // Two honest workers get a head start, then the hostile peer scribbles
    // over the metadata while they keep working.
    let mut kids = vec![spawn("tolerant", 1, 4000), spawn("tolerant", 2, 4000)];
    std::thread::sleep(Duration::from_millis(300));
    kids.push(spawn("hostile", 3, 2500));
    let mut outs = Vec::new();
    for k in &mut kids {
        let s = wait_with_watchdog(k, Duration::from_secs(120));
        let mut out = String::new();
        std::io::Read::read_to_string(k.stdout.as_mut().unwrap(), &mut out).unwrap();
        // A crash, a sanitizer report (abort) or a panic fails here; errors
        // returned by operations are allowed.
        assert!(s.success(), "worker {} failed: {s} {out}", k.id());
        outs.push(out);
    }
    assert!(outs[2].contains("words_written"), "{}", outs[2]);
    for o in &outs[..2] {
        assert!(o.contains("\"ok\":") && !o.contains("\"ok\":0,"), "an honest worker did no work: {o}");
    }
    eprintln!("hostile peer: {}", outs.join(" "));
}

/// A lock waiter in another process steps the manager of this host from
/// its cell in the host-local file (the manager's thread, in this process,
/// is idle or asleep): grants need no hand-off to that thread. The manager
/// counts steps other processes made of it.
#[test]
fn a_waiter_in_another_process_steps_the_host_manager_from_its_cell() {
    let r = Region(shm_path("cell-step"));
    let parent = Node::create(&r.0, 32 << 20, caps(), opts()).unwrap();
    // The parent's node manages (the first one attached, alone for a step).
    let t = Instant::now();
    while !parent.manager_report().active {
        assert!(t.elapsed() < Duration::from_secs(30), "the parent's node never became the manager");
        std::thread::sleep(Duration::from_millis(5));
    }
    let before = parent.manager_steps_by_peers();
    let mut c = Command::new(WORKER).args(["locks", r.0.to_str().unwrap(), "3000"]).spawn().unwrap();
    let status = wait_with_watchdog(&mut c, Duration::from_secs(120));
    assert!(status.success(), "the locking worker failed: {status}");
    let by_others = parent.manager_steps_by_peers() - before;
    assert!(by_others > 0, "3,000 locks of another process and none stepped the manager from its cell");
    // Still the manager (its own steps say so), and the region clean.
    let t = Instant::now();
    while !parent.manager_report().active {
        assert!(t.elapsed() < Duration::from_secs(30), "the parent's node lost the manager role");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(parent.check().unwrap().is_empty());
}

fn spawn_tenant(path: &Path, name: &str, seed: u64, millis: u64, pause_us: u64) -> Child {
    Command::new(WORKER)
        .args(["tenant", path.to_str().unwrap(), name, &seed.to_string(), &millis.to_string(), &pause_us.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Tenants across processes: two processes of tenant `busy` (a hard quota
/// of a third of the region) and one of the default tenant write far more
/// than the region holds, while a process of tenant `quiet` (a guaranteed
/// share of a quarter) writes slowly. The parent reads every tenant's
/// usage through the run: `busy` never over its quota, `quiet` never below
/// its share once it reached it. Then the parent drops `busy` while the
/// others go on: its processes end (`NoTenant`), its space is free, the
/// others keep every byte right, and the region checks clean.
#[test]
fn a_busy_tenant_never_pushes_a_quiet_one_below_its_share_and_a_drop_frees_its_space() {
    use cxlkv_platform::tenants::Limits;
    let r = Region(shm_path("tenants"));
    let parent = Node::create(&r.0, 24 << 20, caps(), opts()).unwrap();
    let payload = parent.stats().unwrap().payload_bytes;
    let (quota, share) = (payload / 3, payload / 4);
    parent.tenant_add(b"busy", Limits { quota, ..Limits::default() }).unwrap();
    let quiet = parent.tenant_add(b"quiet", Limits { share, ..Limits::default() }).unwrap();
    // Each runs until the stop file appears (a minute at most).
    let stop = Region(r.0.with_extension("stop"));
    let mut kids = vec![
        ("busy", spawn_tenant(&r.0, "busy", 1, 60_000, 0)),
        ("busy", spawn_tenant(&r.0, "busy", 2, 60_000, 0)),
        ("default", spawn_tenant(&r.0, "default", 3, 60_000, 0)),
        ("quiet", spawn_tenant(&r.0, "quiet", 4, 60_000, 500)),
    ];
    let usage = |name: &[u8]| parent.tenant_list().unwrap().into_iter().find(|t| t.name() == name);
    let (mut reached, mut samples, mut busy_max) = (false, 0u64, 0u64);
    let t0 = Instant::now();
    // A second and a half of sampling after quiet reached its share (a
    // loaded machine may take long to get there).
    let mut until = Duration::from_secs(50);
    while t0.elapsed() < until {
        let (b, q) = (usage(b"busy").unwrap(), usage(b"quiet").unwrap());
        assert!(b.bytes <= quota, "busy holds {} over its quota {quota}", b.bytes);
        assert!(!reached || q.bytes >= share, "quiet holds {} below its share {share}", q.bytes);
        if !reached && q.bytes >= share {
            reached = true;
            until = t0.elapsed() + Duration::from_millis(1_500);
        }
        busy_max = busy_max.max(b.bytes);
        samples += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(reached, "quiet reached its share ({samples} samples)");
    assert!(busy_max > quota / 2, "busy wrote up to its quota: {busy_max} of {quota}");
    // The drop, while busy's processes write: refused (`Busy`) while one
    // of its blocks is pinned or being written, until it is not.
    let busy = parent.tenant_find(b"busy").unwrap().unwrap();
    let t1 = Instant::now();
    let dropped = loop {
        match parent.tenant_drop(busy) {
            Ok(rep) => break rep,
            Err(cxlkv_platform::Error::Core(Error::Busy)) if t1.elapsed() < Duration::from_secs(60) => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("drop: {e}"),
        }
    };
    assert!(dropped.blocks > 0 && dropped.bytes > 0, "{dropped:?}");
    assert!(usage(b"busy").is_none(), "busy's slot is free");
    // The others go on a while, then stop.
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&stop.0, b"").unwrap();
    for (name, k) in &mut kids {
        let s = wait_with_watchdog(k, Duration::from_secs(120));
        let mut out = String::new();
        std::io::Read::read_to_string(k.stdout.as_mut().unwrap(), &mut out).unwrap();
        assert!(s.success(), "{name} worker failed: {s} {out}");
        assert!(out.contains("\"bad\":0") && out.contains("\"errors\":0"), "{name}: {out}");
        if *name == "busy" {
            assert!(out.contains("\"dropped\":true"), "a busy worker ends at the drop: {out}");
        }
    }
    let q = usage(b"quiet").unwrap();
    assert!(q.id == quiet && q.bytes >= share, "quiet kept its share: {} of {share}", q.bytes);
    assert_eq!(parent.check().unwrap(), vec![]);
    parent.close().unwrap();
}
