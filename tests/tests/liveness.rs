//! Liveness as deployments see it: processes of one host in different PID
//! namespaces (containers sharing /dev/shm or a DAX device), and a process
//! stopped by a signal while it holds a lock, pins and a reservation.
//!
//! The PID-namespace tests run the worker under `unshare --pid --fork`
//! (util-linux; needs root or user namespaces). Every child runs under a
//! watchdog.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cxlkv_core::layout::Capacities;
use cxlkv_platform::host::pid_alive;
use cxlkv_platform::{Node, Options};
use cxlkv_tests::shm_path;

const WORKER: &str = env!("CARGO_BIN_EXE_cxlkv-test-worker");
/// The lease of every node here: short, so deaths are noticed in seconds.
const LEASE_MS: u64 = 400;

struct Region(std::path::PathBuf);
impl Drop for Region {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn caps() -> Capacities {
    Capacities { max_nodes: 8, n_stripes: 8, entries_per_stripe: 128, chunk_shift: 18, ..Capacities::default() }
}

fn opts() -> Options {
    Options { lease: Duration::from_millis(LEASE_MS), lock_timeout: Duration::from_secs(20), ..Options::default() }
}

/// A worker process: the child, what it printed first (`ready PID LOCK`),
/// and where its closing line will come.
struct Holder {
    child: Child,
    pid_in_ns: u32,
    lock: u32,
    rest: std::sync::mpsc::Receiver<String>,
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Holder {
    /// Starts `hold-for` through `sh -c shell` (which runs `"$W" hold-for
    /// "$P" ...`), in a new PID namespace when `unshare`, and waits for its
    /// `ready`.
    fn start(unshare: bool, shell: &str, path: &std::path::Path, ms: u64) -> Holder {
        let mut cmd = if unshare {
            let mut c = Command::new("unshare");
            c.args(["--pid", "--fork", "--kill-child", "sh", "-c", shell]);
            c
        } else {
            let mut c = Command::new("sh");
            c.args(["-c", shell]);
            c
        };
        let mut child = cmd
            .env("W", WORKER)
            .env("P", path)
            .env("MS", ms.to_string())
            .env("CXLKV_TEST_LEASE_MS", LEASE_MS.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the worker");
        let out = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(out);
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            let _ = tx.send(line);
            let mut rest = String::new();
            let _ = r.read_to_string(&mut rest);
            let _ = tx.send(rest);
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first() != Some(&"ready") || f.len() != 3 {
            let _ = child.kill();
            panic!("holder did not get ready: {line:?} {:?}", child.wait());
        }
        Holder { child, pid_in_ns: f[1].parse().unwrap(), lock: f[2].parse().unwrap(), rest: rx }
    }

    /// Its closing JSON line, waiting up to `limit`.
    fn results(&self, limit: Duration) -> String {
        self.rest.recv_timeout(limit).unwrap_or_default()
    }
}

/// `unshare --pid --fork` works here, or the test cannot show anything.
fn require_unshare() {
    let ok = Command::new("unshare").args(["--pid", "--fork", "true"]).status().is_ok_and(|s| s.success());
    assert!(ok, "these tests need unshare(1) able to make a PID namespace (root, or user namespaces)");
}

/// Waits until `f` holds, polling every 20 ms, for at most `limit`.
fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn a_live_holder_in_another_pid_namespace_is_never_declared_dead() {
    require_unshare();
    let r = Region(shm_path("pidns-live"));
    let parent = Node::create(&r.0, 16 << 20, caps(), opts()).unwrap();
    // The worker runs as a child of the namespace's first process, after a
    // few hundred others: its pid there names no process here (checked
    // below), which a probe from here would take for a dead one.
    let shell = r#"i=0; while [ $i -lt 300 ]; do /bin/true; i=$((i+1)); done; "$W" hold-for "$P" "$MS""#;
    let mut h = Holder::start(true, shell, &r.0, 4000);
    if pid_alive(h.pid_in_ns) {
        eprintln!("note: pid {} exists here too; a pid probe would not have been fooled this run", h.pid_in_ns);
    }
    // Many leases pass while the holder keeps its lock, pins and reservation.
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(3000) {
        let s = parent.stats().unwrap();
        assert_eq!(s.dead, 0, "a live node was declared dead");
        assert_eq!(s.alive.count_ones(), 2, "both nodes attached: {:b}", s.alive);
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = h.results(Duration::from_secs(30));
    let status = h.child.wait().unwrap();
    assert!(status.success(), "{status} {out}");
    assert_eq!(
        out.trim(),
        r#"{"lookup":"ok","get":"ok","pin":"ok","exists":"ok","release":"ok","abort":"ok","unlock":"ok","close":"ok"}"#
    );
    // Its lock is free, its pins are gone: everything can be taken again.
    let g = parent.core().lock_app(h.lock).unwrap();
    parent.core().unlock_app(g).unwrap();
    assert_eq!(parent.check().unwrap(), vec![]);
    parent.close().unwrap();
}

#[test]
fn a_killed_holder_in_another_pid_namespace_is_declared_dead_by_its_silence() {
    require_unshare();
    let r = Region(shm_path("pidns-dead"));
    let parent = Node::create(&r.0, 16 << 20, caps(), opts()).unwrap();
    // The worker is its namespace's first process: pid 1, which here is
    // this machine's init, alive forever. Only the heartbeat can tell.
    let mut h = Holder::start(true, r#"exec "$W" hold-for "$P" 600000"#, &r.0, 0);
    assert_eq!(h.pid_in_ns, 1);
    h.child.kill().unwrap();
    h.child.wait().unwrap();
    // The lock it held is granted here once it was declared dead and
    // recovered (the lock timeout is the watchdog).
    let g = parent.core().lock_app(h.lock).expect("the dead holder's lock is granted again");
    parent.core().unlock_app(g).unwrap();
    assert!(wait_for(Duration::from_secs(20), || parent.stats().is_ok_and(|s| s.alive.count_ones() == 1)));
    assert_eq!(parent.check().unwrap(), vec![]);
    parent.close().unwrap();
}

#[test]
fn a_stopped_holder_is_declared_dead_and_fails_with_revoked_when_it_wakes() {
    let r = Region(shm_path("sigstop"));
    let parent = Node::create(&r.0, 16 << 20, caps(), opts()).unwrap();
    let h = Holder::start(false, r#"exec "$W" hold-for "$P" "$MS""#, &r.0, 5000);
    // SAFETY: stopping our own child.
    unsafe { libc::kill(h.child.id() as i32, libc::SIGSTOP) };
    // Its process exists, but its heartbeat stopped: declared dead, its lock
    // revoked, repaired by recovery and granted here.
    let got = parent.core().lock_app(h.lock);
    // SAFETY: waking our own child.
    unsafe { libc::kill(h.child.id() as i32, libc::SIGCONT) };
    let g = got.expect("the stopped holder's lock is granted again");
    let out = h.results(Duration::from_secs(30));
    parent.core().unlock_app(g).unwrap();
    for field in ["lookup", "get", "pin", "exists", "release", "abort", "unlock", "close"] {
        assert!(out.contains(&format!(r#""{field}":"lock revoked""#)), "{field} after waking: {out}");
    }
    drop(h);
    assert!(wait_for(Duration::from_secs(20), || parent.stats().is_ok_and(|s| s.alive.count_ones() == 1)));
    // Fenced, not freed, while it was stopped (it held a reservation); its
    // close wrote back what it held and said it was quiet, and the
    // recovery that called for freed its slot.
    assert!(
        wait_for(Duration::from_secs(20), || parent.stats().is_ok_and(|s| s.dead == 0)),
        "the woken node's slot is still fenced: {:?}",
        parent.stats().map(|s| s.dead)
    );
    assert_eq!(parent.check().unwrap(), vec![]);
    // The manager (the parent, on this host) saw the process run while it
    // declared it dead: counted, published with its next heartbeat.
    let observed = || cxlkv_platform::Region::open(&r.0).unwrap().observe(cxlkv_platform::FlushMode::Coherent).unwrap();
    assert!(
        wait_for(Duration::from_secs(20), || {
            observed().metrics().is_ok_and(|m| m.nodes.iter().map(|n| n.running_declared_dead).sum::<u64>() == 1)
        }),
        "the false death is counted once: {:?}",
        observed().metrics().map(|m| m.nodes.iter().map(|n| n.running_declared_dead).collect::<Vec<_>>())
    );
    parent.close().unwrap();
}

/// The manager's process is stopped. The other process of its host steps
/// that manager from its cell in the host-local file while its process
/// runs (its lock waits did, before the stop), and stops doing so within
/// half a lease of the stop: this process's node takes the role over,
/// declares the stopped node dead and is granted the lock it held; the
/// stopped node, woken, is fenced.
#[test]
fn a_stopped_manager_process_loses_the_role_though_its_peers_could_step_it() {
    let r = Region(shm_path("sigstop-manager"));
    let region = cxlkv_platform::Region::create(&r.0, 16 << 20, true).unwrap();
    region.format(caps(), opts().mode).unwrap();
    drop(region);
    // Attached first and alone: the worker's node manages.
    let h = Holder::start(false, r#"exec "$W" hold-for "$P" "$MS""#, &r.0, 5000);
    let parent = Node::open(&r.0, opts()).unwrap();
    // The parent's locks are granted by stepping the worker's manager from
    // its cell, or by its thread.
    for _ in 0..200 {
        let g = parent.core().lock(2).unwrap();
        parent.core().unlock(g).unwrap();
    }
    // SAFETY: stopping our own child.
    unsafe { libc::kill(h.child.id() as i32, libc::SIGSTOP) };
    let got = parent.core().lock_app(h.lock);
    // SAFETY: waking our own child.
    unsafe { libc::kill(h.child.id() as i32, libc::SIGCONT) };
    let g = got.expect("the stopped manager's lock is granted here");
    // (The step that granted may report a moment after the grant.)
    assert!(wait_for(Duration::from_secs(20), || parent.manager_report().active), "the parent's node manages now");
    parent.core().unlock_app(g).unwrap();
    let out = h.results(Duration::from_secs(30));
    assert!(out.contains(r#""lookup":"lock revoked""#), "the woken manager's node is fenced: {out}");
    drop(h);
    assert!(wait_for(Duration::from_secs(20), || parent
        .stats()
        .is_ok_and(|s| s.alive.count_ones() == 1 && s.dead == 0)));
    assert_eq!(parent.check().unwrap(), vec![]);
    parent.close().unwrap();
}
