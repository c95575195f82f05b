//! The cross-process half of the bench: a peer process (`cxlkv bench-peer`)
//! reads, echoes and locks while this one measures; gets over a working set
//! larger than the last-level cache, cold and warm, beside same-run memcpys.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use cxlkv_platform::host_locks::HostLocks;
use cxlkv_platform::kv::Capacities;
use cxlkv_platform::kv::Message;
use cxlkv_platform::kv::{mix64, Key};
use cxlkv_platform::{FlushMode, GetItem, Mapping, Node, Options};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::de::DeserializeOwned;

use super::report::{Contended, CopyRow, CrossProcess, Echo, GetReport, GetRow, LockPeer, LockRun, Quantiles};

pub(super) fn key(i: u64) -> Key {
    Key { lo: mix64(i + 1), hi: i }
}

pub(super) struct Cleanup(pub(super) std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub(super) fn now_ns() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

pub(super) fn quantile(v: &mut [u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
}

pub(super) const GET_SIZES: [usize; 3] = [16 << 10, 256 << 10, 2 << 20];

pub(super) const RPC: u32 = 7;

pub(super) const STOP: u32 = 8;

pub(super) const READY: u32 = 9;

pub(super) const GO: u32 = 10;

/// Bytes of the last-level cache (sysfs), or 32 MiB when unknown.
pub(super) fn llc_bytes() -> usize {
    let mut best = 0usize;
    for i in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
        let Ok(size) = std::fs::read_to_string(format!("{dir}/size")) else { break };
        let size = size.trim();
        let (num, mul) = match size.strip_suffix('K') {
            Some(n) => (n, 1 << 10),
            None => match size.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (size, 1),
            },
        };
        best = best.max(num.parse::<usize>().unwrap_or(0) * mul);
    }
    if best == 0 {
        32 << 20
    } else {
        best
    }
}

/// Working set of the cross-process gets: at least 4x the last-level cache
/// and 512 MiB (a quick run: 64 MiB, cache-resident on most machines).
pub(super) fn working_set(quick: bool) -> usize {
    if quick {
        64 << 20
    } else {
        (4 * llc_bytes()).max(512 << 20)
    }
}

/// QD1 gets of one block size by a second process, through [`Node::get`]
/// (what `cxlkv_get` and Python's `Node.get` call): one process publishes
/// blocks filling the working set, the other reads every one of them in a
/// random order twice — first with its page tables unpopulated (a cold
/// reader: each first touch faults), then again (warm) — beside same-run
/// memcpys of random blocks from a freshly mapped file and from a
/// faulted-in private pool as large.
pub(super) fn cross_get(
    mode: FlushMode,
    size: usize,
    ws: usize,
    tag: &str,
) -> Result<GetReport, cxlkv_platform::Error> {
    let path = PathBuf::from(format!("/dev/shm/cxlkv-bench-g-{tag}"));
    let local = PathBuf::from(format!("/dev/shm/cxlkv-bench-g-{tag}.local"));
    std::fs::create_dir_all(&local).map_err(|err| cxlkv_platform::Error::Io { what: "bench local dir", err })?;
    let _cleanup = (Cleanup(path.clone()), CleanupDir(local.clone()));
    let n = (ws / size).max(16);
    let entries = (n as u32 * 2).next_power_of_two().max(1024);
    let caps = Capacities { max_nodes: 4, n_stripes: 64, entries_per_stripe: entries / 64, ..Capacities::default() };
    let opts = Options { mode, local_dir: local.clone(), lock_timeout: Duration::from_secs(60), ..Options::default() };
    let region = (n * size) as u64 + (n as u64 * 256) + (64 << 20);
    let attached = Node::create(&path, region + region / 8, caps, opts)?;
    let node = attached.core();
    let payload = vec![0x3cu8; size];
    let mut batch = Vec::with_capacity(64);
    for i in 0..n as u64 {
        let h = node.reserve(1, key(i), size as u64, 16)?;
        node.write(&h, 0, &payload)?;
        batch.push(h);
        if batch.len() == 64 || i + 1 == n as u64 {
            let mut out = vec![Ok(()); batch.len()];
            node.publish_flushed(&batch, &mut out)?;
            batch.clear();
        }
    }
    let r = peer(&["get", &size.to_string(), &n.to_string()], &path, &local, mode, &attached);
    attached.close()?;
    r
}

/// The cross-process rows of one mode: a second process (this binary's
/// hidden `bench-peer` command) reads, answers or contends.
pub(super) fn cross_process(mode: FlushMode, quick: bool) -> Result<CrossProcess, cxlkv_platform::Error> {
    let tag = format!("{}-{}", std::process::id(), mode.name());
    let path = PathBuf::from(format!("/dev/shm/cxlkv-bench-x-{tag}"));
    let local = PathBuf::from(format!("/dev/shm/cxlkv-bench-x-{tag}.local"));
    std::fs::create_dir_all(&local).map_err(|err| cxlkv_platform::Error::Io { what: "bench local dir", err })?;
    let _cleanup = (Cleanup(path.clone()), CleanupDir(local.clone()));
    let ws = working_set(quick);
    let mut get = Vec::new();
    for &size in &GET_SIZES {
        get.push(cross_get(mode, size, ws, &tag)?);
    }
    let caps = Capacities { max_nodes: 4, n_stripes: 16, entries_per_stripe: 256, ..Capacities::default() };
    let opts = Options { mode, local_dir: local.clone(), lock_timeout: Duration::from_secs(60), ..Options::default() };
    let attached = Node::create(&path, 64 << 20, caps, opts)?;
    attached.prefault()?;
    let node = attached.core();

    // RPC round trips; the peer records each request's one-way latency.
    let calls = if quick { 200 } else { 5000 };
    let mut rtt = Vec::with_capacity(calls);
    let rpc = {
        let mut child = spawn_peer(&["echo"], &path, &local, mode, &attached)?;
        let to = wait_ready(&attached)?;
        for _ in 0..calls {
            let t = Instant::now();
            let m = Message { kind: RPC, stamp: now_ns(), ..Message::default() };
            attached.call(to, &m, &[], Duration::from_secs(10))?;
            rtt.push(t.elapsed().as_nanos() as u64);
        }
        attached.send(to, &Message { kind: STOP, ..Message::default() }, &[])?;
        last_json::<Echo>(&mut child)?
    };

    // Lock+unlock, two processes contending for one lock.
    let n_locks = if quick { 300 } else { 3000 };
    let contended = {
        let mut child = spawn_peer(&["lock", &n_locks.to_string()], &path, &local, mode, &attached)?;
        let to = wait_ready(&attached)?;
        attached.send(to, &Message { kind: GO, ..Message::default() }, &[])?;
        let t = Instant::now();
        for _ in 0..n_locks {
            let h = node.lock(0)?;
            node.unlock(h)?;
        }
        let mine = t.elapsed().as_nanos() as f64 / n_locks as f64;
        let theirs: LockRun = last_json(&mut child)?;
        Contended { ns_per_op: mine, peer_ns_per_op: theirs.ns_per_op }
    };
    // Lock+unlock by the peer alone, the manager in this (idle) process:
    // each grant needs this process's background thread, woken by the
    // peer's ring instead of at the end of its pause.
    let alone = {
        let mut child = spawn_peer(&["lock", &n_locks.to_string()], &path, &local, mode, &attached)?;
        let to = wait_ready(&attached)?;
        attached.send(to, &Message { kind: GO, ..Message::default() }, &[])?;
        let r: LockRun = last_json(&mut child)?;
        LockPeer { ns_per_op: r.ns_per_op, p50_ns: r.p50_ns, p99_ns: r.p99_ns }
    };
    // The same, each pair after a pause of 5 ms (locks taken now and then:
    // the manager's thread has gone to sleep, and the grant waits for it
    // to wake).
    let paused = {
        let n = if quick { 40 } else { 400 };
        let args = ["lock-paused".to_string(), n.to_string(), "5000".to_string()];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut child = spawn_peer(&args, &path, &local, mode, &attached)?;
        let to = wait_ready(&attached)?;
        attached.send(to, &Message { kind: GO, ..Message::default() }, &[])?;
        let r: LockRun = last_json(&mut child)?;
        LockPeer { ns_per_op: r.ns_per_op, p50_ns: r.p50_ns, p99_ns: r.p99_ns }
    };
    attached.close()?;
    let wake = wake_reference(&path, &local, mode, if quick { 200 } else { 2000 })?;
    Ok(CrossProcess {
        working_set_bytes: ws,
        wake_reference_ns: wake,
        lock_other_process_uncontended: alone,
        lock_other_process_after_pause: paused,
        get,
        rpc_round_trip_ns: Quantiles { p50: quantile(&mut rtt, 0.5), p99: quantile(&mut rtt, 0.99) },
        handoff_ns: rpc.handoff_ns,
        lock_contended: contended,
    })
}

/// The floor under a grant by a sleeping manager in another process: the
/// peer rings a futex bell on which a thread of this process sleeps, and
/// spins until that thread, woken, rings a second bell back. The peer pauses
/// between rounds so the thread is asleep each time.
pub(super) fn wake_reference(
    path: &Path,
    local: &Path,
    mode: FlushMode,
    n: usize,
) -> Result<Quantiles, cxlkv_platform::Error> {
    let ids = (mix64(std::process::id() as u64 ^ 0xa11), mix64(std::process::id() as u64 ^ 0xb22));
    let (a, b) = (HostLocks::open(local, ids.0, 0, 0)?, HostLocks::open(local, ids.1, 0, 0)?);
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let (a, b) = (&a, &b);
        s.spawn(move || {
            while let Err(std::sync::mpsc::TryRecvError::Empty) = stopped.try_recv() {
                let seen = a.bell_count();
                a.sleep(seen, Duration::from_secs(1));
                b.ring();
            }
        });
        let args = ["wake".to_string(), n.to_string(), ids.0.to_string(), ids.1.to_string()];
        let exe = std::env::current_exe().map_err(|err| cxlkv_platform::Error::Io { what: "current_exe", err });
        let out = exe.and_then(|exe| {
            let mut child = Command::new(exe)
                .arg("bench-peer")
                .arg(path)
                .arg(local)
                .arg(mode.name())
                .arg("0")
                .args(args)
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|err| cxlkv_platform::Error::Io { what: "spawn bench peer", err })?;
            last_json(&mut child)
        });
        drop(stop);
        a.ring();
        out
    })
}

pub(super) struct CleanupDir(pub(super) PathBuf);

impl Drop for CleanupDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) fn spawn_peer(
    args: &[&str],
    path: &Path,
    local: &Path,
    mode: FlushMode,
    attached: &Node,
) -> Result<std::process::Child, cxlkv_platform::Error> {
    let exe = std::env::current_exe().map_err(|err| cxlkv_platform::Error::Io { what: "current_exe", err })?;
    Command::new(exe)
        .arg("bench-peer")
        .arg(path)
        .arg(local)
        .arg(mode.name())
        .arg(attached.id().to_string())
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|err| cxlkv_platform::Error::Io { what: "spawn bench peer", err })
}

pub(super) fn peer<T: DeserializeOwned>(
    args: &[&str],
    path: &Path,
    local: &Path,
    mode: FlushMode,
    attached: &Node,
) -> Result<T, cxlkv_platform::Error> {
    let mut child = spawn_peer(args, path, local, mode, attached)?;
    last_json(&mut child)
}

/// The peer's last stdout line, as JSON, once it exited successfully.
pub(super) fn last_json<T: DeserializeOwned>(child: &mut std::process::Child) -> Result<T, cxlkv_platform::Error> {
    let out = child.stdout.take();
    let last = out.map(|o| BufReader::new(o).lines().map_while(Result::ok).last().unwrap_or_default());
    let st = child.wait().map_err(|err| cxlkv_platform::Error::Io { what: "wait for bench peer", err })?;
    if !st.success() {
        return Err(cxlkv_platform::Error::Unsupported("a bench peer process failed"));
    }
    serde_json::from_str(&last.unwrap_or_default())
        .map_err(|_| cxlkv_platform::Error::Unsupported("a bench peer printed no report"))
}

/// Waits for the peer's READY message; returns its node id.
pub(super) fn wait_ready(attached: &Node) -> Result<u32, cxlkv_platform::Error> {
    loop {
        let (m, _) = attached.recv(Duration::from_secs(30))?;
        if m.kind == READY {
            return Ok(m.from);
        }
    }
}

/// `cxlkv bench-peer PATH LOCAL MODE PARENT-NODE ROLE ...`: the second
/// process of the cross-process rows. Prints one JSON line.
pub fn peer_main(args: &[String]) -> Result<(), String> {
    let [path, local, mode, parent, role, rest @ ..] = args else {
        return Err("bench-peer: bad arguments".into());
    };
    let mode: FlushMode = mode.parse().map_err(|_| "bench-peer: bad mode")?;
    let parent: u32 = parent.parse().map_err(|_| "bench-peer: bad node")?;
    let opts =
        Options { mode, local_dir: PathBuf::from(local), lock_timeout: Duration::from_secs(60), ..Options::default() };
    // The get reader starts cold: its page tables fill as it reads.
    let opts = Options { populate: role != "get", ..opts };
    let num = |i: usize| rest.get(i).and_then(|v| v.parse::<usize>().ok()).unwrap_or(1);
    if role == "wake" {
        let id = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok()).ok_or("bench-peer: bad bell id");
        let out = peer_wake(Path::new(local), num(0), id(1)?, id(2)?)?;
        println!("{}", serde_json::to_string(&out).map_err(|e| e.to_string())?);
        return Ok(());
    }
    let attached = Node::open(Path::new(path), opts).map_err(|e| e.to_string())?;
    let json = |r: Result<String, serde_json::Error>| r.map_err(|e| e.to_string());
    let out = match role.as_str() {
        "get" => json(serde_json::to_string(&peer_get(&attached, num(0), num(1))?)),
        "echo" => json(serde_json::to_string(&peer_echo(&attached, parent)?)),
        "lock" => json(serde_json::to_string(&peer_lock(&attached, parent, num(0), 0)?)),
        "lock-paused" => json(serde_json::to_string(&peer_lock(&attached, parent, num(0), num(1))?)),
        other => Err(format!("bench-peer: unknown role {other}")),
    }?;
    attached.close().map_err(|e| e.to_string())?;
    println!("{out}");
    Ok(())
}

pub(super) fn peer_get(attached: &Node, size: usize, n: usize) -> Result<GetReport, String> {
    let mut rng = SmallRng::seed_from_u64(size as u64 ^ 0x5eed);
    let mut order: Vec<u64> = (0..n as u64).collect();
    let mut shuffle = |v: &mut Vec<u64>| v.shuffle(&mut rng);
    let mut dst = vec![0u8; size];
    let mut pass = |order: &[u64]| -> Result<Vec<u64>, String> {
        let mut lat = Vec::with_capacity(order.len());
        for &i in order {
            let mut parts = [&mut dst[..]];
            let mut items = [GetItem { key: key(i), parts: &mut parts }];
            let (mut lens, mut res) = ([0u64], [Ok(())]);
            let t = Instant::now();
            attached.get(1, &mut items, &mut lens, &mut res).map_err(|e| e.to_string())?;
            lat.push(t.elapsed().as_nanos() as u64);
            res[0].map_err(|e| format!("get: {e}"))?;
            if lens[0] != size as u64 {
                return Err("get: wrong length".into());
            }
        }
        if dst.iter().any(|&b| b != 0x3c) {
            return Err("get: wrong bytes".into());
        }
        Ok(lat)
    };
    shuffle(&mut order);
    let mut cold = pass(&order)?;
    shuffle(&mut order);
    let mut warm = pass(&order)?;
    // The reference: single-thread memcpy of blocks picked at random from a
    // private pool as large as the working set (faulted in first), so from
    // the same level of the memory hierarchy.
    let mut pool = vec![0u8; size * n];
    pool.iter_mut().step_by(4096).for_each(|b| *b = 1);
    shuffle(&mut order);
    let mut copy = Vec::with_capacity(n);
    for &i in &order {
        let src = &pool[i as usize * size..(i as usize + 1) * size];
        let t = Instant::now();
        dst.copy_from_slice(src);
        std::hint::black_box(&mut dst);
        copy.push(t.elapsed().as_nanos() as u64);
    }
    drop(pool);
    let memcpy_p50 = quantile(&mut copy, 0.5).max(1) as f64;
    let mut cold_copy = cold_memcpy(size, n, &order, &mut dst)?;
    let cold_p50 = quantile(&mut cold_copy, 0.5).max(1) as f64;
    let row = |lat: &mut Vec<u64>, reference: f64| {
        let p50 = quantile(lat, 0.5).max(1);
        GetRow {
            p50_ns: p50,
            p99_ns: quantile(lat, 0.99),
            gb_per_s: size as f64 / p50 as f64,
            pct_of_memcpy: 100.0 * reference / p50 as f64,
        }
    };
    Ok(GetReport {
        bytes: size,
        blocks: n,
        cold: row(&mut cold, cold_p50),
        warm: row(&mut warm, memcpy_p50),
        memcpy: CopyRow { p50_ns: memcpy_p50, gb_per_s: size as f64 / memcpy_p50 },
        memcpy_cold: CopyRow { p50_ns: cold_p50, gb_per_s: size as f64 / cold_p50 },
    })
}

/// The cold reader's reference: memcpy of blocks in `order` out of a shared
/// file as large as the working set, written with `write(2)` and then mapped
/// afresh, so its pages sit in memory but not in this process's page tables
/// (each first touch faults), exactly as the region's do for a cold reader.
pub(super) fn cold_memcpy(size: usize, n: usize, order: &[u64], dst: &mut [u8]) -> Result<Vec<u64>, String> {
    use std::io::Write;
    let path = PathBuf::from(format!("/dev/shm/cxlkv-bench-cold-{}", std::process::id()));
    let _cleanup = Cleanup(path.clone());
    let mut f = std::fs::File::create(&path).map_err(|e| format!("cold reference: {e}"))?;
    let chunk = vec![0x3cu8; 1 << 20];
    let mut left = size * n;
    while left > 0 {
        let k = left.min(chunk.len());
        f.write_all(&chunk[..k]).map_err(|e| format!("cold reference: {e}"))?;
        left -= k;
    }
    drop(f);
    let map = Mapping::open_file(&path).map_err(|e| e.to_string())?;
    let region = map.view();
    let mut lat = Vec::with_capacity(order.len());
    for &i in order {
        let t = Instant::now();
        region.copy_out(i * size as u64, dst).map_err(|e| e.to_string())?;
        std::hint::black_box(&mut *dst);
        lat.push(t.elapsed().as_nanos() as u64);
    }
    Ok(lat)
}

pub(super) fn peer_wake(local: &Path, n: usize, id_a: u64, id_b: u64) -> Result<Quantiles, String> {
    let a = HostLocks::open(local, id_a, 0, 0).map_err(|e| e.to_string())?;
    let b = HostLocks::open(local, id_b, 0, 0).map_err(|e| e.to_string())?;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        std::thread::sleep(Duration::from_micros(200));
        let seen = b.bell_count();
        let t = Instant::now();
        a.ring();
        while b.bell_count() == seen {
            if t.elapsed() > Duration::from_secs(10) {
                return Err("wake reference: no answer within 10 s".into());
            }
            std::hint::spin_loop();
        }
        lat.push(t.elapsed().as_nanos() as u64);
    }
    Ok(Quantiles { p50: quantile(&mut lat, 0.5), p99: quantile(&mut lat, 0.99) })
}

pub(super) fn peer_echo(attached: &Node, parent: u32) -> Result<Echo, String> {
    attached.send(parent, &Message { kind: READY, ..Message::default() }, &[]).map_err(|e| e.to_string())?;
    let mut one_way = Vec::new();
    loop {
        let (m, k) = attached.recv(Duration::from_secs(60)).map_err(|e| e.to_string())?;
        match m.kind {
            RPC => {
                one_way.push(now_ns().saturating_sub(m.stamp));
                attached.reply(&m, 0, &k).map_err(|e| e.to_string())?;
            }
            STOP => break,
            _ => {}
        }
    }
    Ok(Echo { handoff_ns: Quantiles { p50: quantile(&mut one_way, 0.5), p99: quantile(&mut one_way, 0.99) } })
}

/// `n` lock+unlock pairs of lock 0, back to back, or `pause_us` apart (each
/// pair then timed alone).
pub(super) fn peer_lock(attached: &Node, parent: u32, n: usize, pause_us: usize) -> Result<LockRun, String> {
    attached.send(parent, &Message { kind: READY, ..Message::default() }, &[]).map_err(|e| e.to_string())?;
    loop {
        let (m, _) = attached.recv(Duration::from_secs(60)).map_err(|e| e.to_string())?;
        if m.kind == GO {
            break;
        }
    }
    let node = attached.core();
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        if pause_us > 0 {
            std::thread::sleep(Duration::from_micros(pause_us as u64));
        }
        let t = Instant::now();
        let h = node.lock(0).map_err(|e| e.to_string())?;
        node.unlock(h).map_err(|e| e.to_string())?;
        lat.push(t.elapsed().as_nanos() as u64);
    }
    let mean = lat.iter().sum::<u64>() as f64 / n.max(1) as f64;
    Ok(LockRun { ns_per_op: mean, p50_ns: quantile(&mut lat, 0.5), p99_ns: quantile(&mut lat, 0.99) })
}
