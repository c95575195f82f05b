//! The SSD tier end to end: blocks copied to O_DIRECT slot files on ext4
//! (not tmpfs: it would not enforce O_DIRECT's alignment), evicted from the
//! region, and put back byte-exact when another node gets them; a restart
//! rebuilds the tier from its slot headers; a damaged slot is a miss.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cxlkv_core::hash::Key;
use cxlkv_core::index::Lru;
use cxlkv_core::layout::Capacities;
use cxlkv_platform::{GetItem, Node, Options, Tier, TierOptions};

fn caps() -> Capacities {
    Capacities { max_nodes: 4, n_stripes: 4, entries_per_stripe: 256, chunk_shift: 18, ..Capacities::default() }
}

fn opts() -> Options {
    Options { local_dir: std::env::temp_dir(), lock_timeout: Duration::from_secs(30), ..Options::default() }
}

const LEN: usize = 40_000;

fn pattern(i: u64) -> Vec<u8> {
    (0..LEN).map(|j| (j as u64).wrapping_mul(31).wrapping_add(i * 7) as u8).collect()
}

fn key(i: u64) -> Key {
    Key { lo: i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1, hi: i }
}

/// A scratch directory on the disk (ext4 here), removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let base = std::env::var_os("CXLKV_TIER_TEST_DIR").map(PathBuf::from).unwrap_or_else(|| "/var/tmp".into());
        let p = base.join(format!("cxlkv-tier-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Stores `data` as block `k` of namespace 1 (16 tokens).
fn put_block(node: &Node, k: Key, data: &[u8]) {
    put_in(node, 1, k, data)
}

/// Stores `data` as block `k` of namespace `ns` (16 tokens).
fn put_in(node: &Node, ns: u32, k: Key, data: &[u8]) {
    let h = node.core().reserve(ns, k, data.len() as u64, 16).unwrap();
    node.core().write(&h, 0, data).unwrap();
    node.core().publish_flushed(&[h], &mut [Ok(())]).unwrap();
}

fn get(node: &Node, k: Key) -> Option<Vec<u8>> {
    get_in(node, 1, k)
}

/// Block `k` of namespace `ns`, promoted from the tier when it is there.
fn get_in(node: &Node, ns: u32, k: Key) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; LEN];
    let (mut lens, mut out) = ([0u64], [Ok(())]);
    let mut parts = [&mut buf[..]];
    node.get(ns, &mut [GetItem { key: k, parts: &mut parts }], &mut lens, &mut out).unwrap();
    out[0].ok().map(|_| buf[..lens[0] as usize].to_vec())
}

/// Registered namespace ids belong to one format of a region; the drives
/// outlive it. A tier restarted over the region formatted anew, where
/// another namespace took the id its blocks were written under, brings them
/// back under their own namespace's new id, never under the other's.
#[test]
fn a_restarted_tier_finds_its_namespaces_again_by_digest_after_a_format() {
    use cxlkv_core::hash::Namespace;
    let region = std::env::temp_dir().join(format!("cxlkv-tier-region-ns-{}", std::process::id()));
    let dirs = [Scratch::new("ns-a")];
    let topts = TierOptions {
        dirs: dirs.iter().map(|d| d.0.clone()).collect(),
        slot_bytes: 64 << 10,
        capacity: 4 << 20,
        high_water: 1.0,
        batch: 16,
    };
    let (model_a, model_b) = (
        Namespace { model: b"model-a", ..Namespace::default() },
        Namespace { model: b"model-b", ..Namespace::default() },
    );
    let n = 8u64;
    let old_id;
    {
        let b = Node::create(&region, 16 << 20, caps(), opts()).unwrap();
        old_id = b.namespace(&model_a).unwrap();
        for i in 0..n {
            put_in(&b, old_id, key(i), &pattern(i));
        }
        let tier = Tier::start(Arc::new(Node::open(&region, opts()).unwrap()), topts.clone()).unwrap();
        assert_eq!(tier.spill_all().unwrap(), n);
        tier.stop().unwrap();
    }
    std::fs::remove_file(&region).unwrap();
    let b = Node::create(&region, 16 << 20, caps(), opts()).unwrap();
    assert_eq!(b.namespace(&model_b).unwrap(), old_id, "the new format gave model B model A's old id");
    let tier = Tier::start(Arc::new(Node::open(&region, opts()).unwrap()), topts.clone()).unwrap();
    assert_eq!(tier.stats().held, n);
    let new_id = b.namespace(&model_a).unwrap();
    assert_ne!(new_id, old_id);
    for i in 0..n {
        assert_eq!(get_in(&b, old_id, key(i)), None, "block {i}: never model B's");
        assert_eq!(get_in(&b, new_id, key(i)).as_deref(), Some(&pattern(i)[..]), "block {i}: model A's, byte-exact");
    }
    let observed = cxlkv_platform::Region::open(&region).unwrap().observe(cxlkv_platform::FlushMode::Clflush).unwrap();
    let paths: Vec<PathBuf> = dirs.iter().map(|d| d.0.clone()).collect();
    assert_eq!(observed.check_tier(&paths, topts.slot_bytes).unwrap(), Vec::<String>::new());
    tier.stop().unwrap();
    drop(b);
    let _ = std::fs::remove_file(&region);
}

/// Both I/O engines, each end to end (one test: the environment is per
/// process); io_uring registers the region and the tier's buffers when the
/// process may lock them.
#[test]
fn spilled_blocks_come_back_byte_exact_with_every_io_engine() {
    use cxlkv_platform::nvme::Engine;
    let may_lock = ipc_lock_capable();
    scenario("uring", |e| matches!(e, Engine::Uring { fixed } if fixed || !may_lock));
    std::env::set_var("CXLKV_TIER_URING", "off");
    scenario("threads", |e| e == Engine::Threads);
    std::env::remove_var("CXLKV_TIER_URING");
}

/// A memlock limit too low to register anything: the tier runs
/// unregistered (or on threads, where even the ring is refused), end to
/// end. Run in a child process that first gives up CAP_IPC_LOCK (which
/// root holds and which lifts the limit), so the limit really applies.
#[test]
fn a_memlock_limit_refusing_registration_falls_back_cleanly() {
    use cxlkv_platform::nvme::Engine;
    const CHILD: &str = "CXLKV_TIER_TEST_LOW_MEMLOCK";
    if std::env::var_os(CHILD).is_none() {
        let exe = std::env::current_exe().unwrap();
        let name = "a_memlock_limit_refusing_registration_falls_back_cleanly";
        let mut child = std::process::Command::new(exe)
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if t.elapsed() > Duration::from_secs(300) {
                let _ = child.kill();
                panic!("the low-memlock child hung");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "the low-memlock child failed: {status}");
        return;
    }
    drop_ipc_lock();
    assert!(!ipc_lock_capable(), "CAP_IPC_LOCK given up");
    let low = libc::rlimit { rlim_cur: 16 << 10, rlim_max: 16 << 10 };
    // SAFETY: sets this (child) process's memlock limit from a valid struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &low) }, 0);
    scenario("unregistered", |e| e == Engine::Uring { fixed: false } || e == Engine::Threads);
}

/// Whether this thread holds CAP_IPC_LOCK (bit 14 of CapEff; capabilities
/// are per thread, and threads it starts inherit them).
fn ipc_lock_capable() -> bool {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

/// Removes CAP_IPC_LOCK from this thread's effective and permitted sets
/// (and so from the threads it starts).
fn drop_ipc_lock() {
    #[repr(C)]
    struct Head {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const V3: u32 = 0x2008_0522;
    const CAP_IPC_LOCK: u32 = 14;
    let mut head = Head { version: V3, pid: 0 };
    let mut data = [Data::default(); 2];
    // SAFETY: capget writes two `Data` (version 3) into `data`.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut head as *mut Head, data.as_mut_ptr()) };
    assert_eq!(r, 0, "capget");
    data[0].effective &= !(1 << CAP_IPC_LOCK);
    data[0].permitted &= !(1 << CAP_IPC_LOCK);
    // SAFETY: capset reads the header and two `Data` from live memory.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut head as *mut Head, data.as_ptr()) };
    assert_eq!(r, 0, "capset");
}

/// Blocks of at least 1 MiB are cut into one piece per drive: every drive
/// holds a piece of each, the drives read them straight into the region,
/// a restart finds the whole sets, and one damaged piece makes its block a
/// miss while the others come back.
#[test]
fn large_blocks_are_striped_across_the_drives() {
    let region = std::env::temp_dir().join(format!("cxlkv-tier-region-stripe-{}", std::process::id()));
    let dirs = [Scratch::new("stripe-a"), Scratch::new("stripe-b")];
    let topts = TierOptions {
        dirs: dirs.iter().map(|d| d.0.clone()).collect(),
        slot_bytes: 2 << 20,
        capacity: 24 << 20,
        high_water: 1.0,
        batch: 8,
    };
    let caps = Capacities { chunk_shift: 21, ..caps() };
    let b = Node::create(&region, 64 << 20, caps, opts()).unwrap();
    let a = Arc::new(Node::open(&region, opts()).unwrap());
    let tier = Tier::start(a.clone(), topts.clone()).unwrap();
    let len = (3usize << 20) / 2;
    let block = |i: u64| -> Vec<u8> { (0..len).map(|j| (j as u64 * 7 + i * 131 + (j as u64 >> 12)) as u8).collect() };
    let n = 6u64;
    for i in 0..n {
        put_block(&b, key(i), &block(i));
    }
    assert_eq!(tier.spill_all().unwrap(), n);
    // Each drive holds n pieces: headers at the start of each slot.
    for d in &dirs {
        let f = std::fs::File::open(d.0.join("cxlkv-tier.slots")).unwrap();
        let flen = f.metadata().unwrap().len();
        let mut pieces = std::collections::HashSet::new();
        let mut head = [0u8; 64];
        let mut at = 0;
        while at + 64 <= flen {
            f.read_exact_at(&mut head, at).unwrap();
            if head[0..8] == *b"CXLKVSL5" {
                pieces.insert((u64::from_le_bytes(head[24..32].try_into().unwrap()), head[56]));
            }
            at += 512;
        }
        assert_eq!(pieces.len() as u64, n, "{}: one piece of every block", d.0.display());
    }
    let dir_paths: Vec<PathBuf> = dirs.iter().map(|d| d.0.clone()).collect();
    let observed = cxlkv_platform::Region::open(&region).unwrap().observe(cxlkv_platform::FlushMode::Clflush).unwrap();
    assert_eq!(observed.check_tier(&dir_paths, topts.slot_bytes).unwrap(), Vec::<String>::new());
    b.core().evict(u64::MAX, &mut Lru).unwrap();
    let fetch = |i: u64| -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let (mut lens, mut out) = ([0u64], [Ok(())]);
        let mut parts = [&mut buf[..]];
        b.get(1, &mut [GetItem { key: key(i), parts: &mut parts }], &mut lens, &mut out).unwrap();
        out[0].ok().map(|_| buf)
    };
    for i in 0..n {
        assert!(fetch(i) == Some(block(i)), "striped block {i} byte-exact");
    }
    assert_eq!(tier.stats().direct_reads, n, "read straight into the region");

    // A restart finds every whole set.
    tier.stop().unwrap();
    b.core().evict(u64::MAX, &mut Lru).unwrap();
    let tier = Tier::start(a.clone(), topts.clone()).unwrap();
    assert_eq!(tier.stats().held, n);
    // Damage the second piece of block 2 (on the second drive): a miss.
    let f = std::fs::OpenOptions::new().read(true).write(true).open(dirs[1].0.join("cxlkv-tier.slots")).unwrap();
    let mut head = [0u8; 64];
    let mut at = 0;
    loop {
        f.read_exact_at(&mut head, at).unwrap();
        if head[0..8] == *b"CXLKVSL5" && head[24..32] == key(2).hi.to_le_bytes() {
            f.write_all_at(&[0xee; 64], at + 8192).unwrap();
            f.sync_all().unwrap();
            break;
        }
        at += 512;
    }
    assert_eq!(fetch(2), None, "a block with a damaged piece is a miss");
    assert!(tier.stats().errors >= 1);
    for i in [0u64, 1, 3, 4, 5] {
        assert!(fetch(i) == Some(block(i)), "block {i} unharmed");
    }
    assert!(b.check().unwrap().is_empty(), "{:?}", b.check().unwrap());
    tier.stop().unwrap();
    drop(a);
    let _ = std::fs::remove_file(&region);
}

/// A drive without room for the slot file: the tier refuses to start with
/// the OS error, and nothing stored is touched.
#[test]
fn a_drive_too_small_for_the_slot_file_is_refused_at_start() {
    let region = std::env::temp_dir().join(format!("cxlkv-tier-region-full-{}", std::process::id()));
    let dir = Scratch::new("full");
    let b = Node::create(&region, 32 << 20, caps(), opts()).unwrap();
    put_block(&b, key(1), &pattern(1));
    let a = Arc::new(Node::open(&region, opts()).unwrap());
    let topts = TierOptions { dirs: vec![dir.0.clone()], capacity: 1 << 60, ..TierOptions::default() };
    match Tier::start(a.clone(), topts) {
        Err(cxlkv_platform::Error::Io { err, .. }) => {
            assert!(matches!(err.raw_os_error(), Some(libc::ENOSPC | libc::EFBIG)), "{err}")
        }
        other => panic!("expected an I/O error, got {:?}", other.map(|_| ())),
    }
    assert!(b.store().tier_find(1, key(1)).unwrap().is_none());
    assert_eq!(get(&b, key(1)).as_deref(), Some(&pattern(1)[..]));
    drop(a);
    let _ = std::fs::remove_file(&region);
}

/// A region above the high-water mark holding more blocks than the drives
/// do, and nothing changing: the tier copies its coldest blocks once and
/// then writes nothing (it once dropped its oldest copies and wrote them
/// again forever, about 1 GB/s on an idle host).
#[test]
fn an_idle_region_larger_than_the_tier_is_copied_once_never_rewritten() {
    let region = std::env::temp_dir().join(format!("cxlkv-tier-region-idle-{}", std::process::id()));
    let dir = Scratch::new("idle");
    let caps =
        Capacities { max_nodes: 4, n_stripes: 4, entries_per_stripe: 128, chunk_shift: 18, ..Capacities::default() };
    let b = Node::create(&region, 64 << 20, caps, opts()).unwrap();
    let body = vec![0x3cu8; 250 << 10];
    let mut stored = 0u64;
    for i in 0..400u64 {
        // A full region evicts; what is stored at the end is what counts.
        let h = match b.core().reserve(1, key(i), body.len() as u64, 16) {
            Ok(h) => h,
            Err(_) => continue,
        };
        b.core().write(&h, 0, &body).unwrap();
        b.core().publish_flushed(&[h], &mut [Ok(())]).unwrap();
        stored += 1;
    }
    let live = b.stats().unwrap().live_entries;
    assert!(live > 64 && stored > live, "the region holds {live} blocks");
    let a = Arc::new(Node::open(&region, opts()).unwrap());
    // 16 MiB of 256 KiB slots: 64 blocks, fewer than the region holds.
    let topts = TierOptions {
        dirs: vec![dir.0.clone()],
        slot_bytes: 256 << 10,
        capacity: 16 << 20,
        high_water: 0.1,
        batch: 16,
    };
    let tier = Tier::start(a.clone(), topts).unwrap();
    // Settled: no spill for 40 polls in a row (watchdog: 120 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let (mut last, mut quiet) = (u64::MAX, 0);
    while quiet < 40 {
        let st = tier.stats();
        if st.spills == last {
            quiet += 1;
        } else {
            (last, quiet) = (st.spills, 0);
        }
        assert!(std::time::Instant::now() < deadline, "the tier never stopped writing: {} spills", st.spills);
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = tier.stats();
    assert!(st.spills > 0 && st.spills <= live, "{} spills for {live} blocks", st.spills);
    assert!(st.held <= 64 && st.errors == 0, "{st:?}");
    tier.stop().unwrap();
    drop(a);
    let _ = std::fs::remove_file(&region);
}

/// One drive named twice (`D` and `D/.`) would share one slot file, and an
/// empty name would put it in the working directory: both are refused at
/// start, naming what is wrong, and nothing stored is touched. A tmpfs
/// directory is accepted, warned of and counted.
#[test]
fn the_same_drive_twice_and_an_empty_directory_name_are_refused() {
    let region = std::env::temp_dir().join(format!("cxlkv-tier-region-twice-{}", std::process::id()));
    let dir = Scratch::new("twice");
    let b = Node::create(&region, 32 << 20, caps(), opts()).unwrap();
    put_block(&b, key(1), &pattern(1));
    let a = Arc::new(Node::open(&region, opts()).unwrap());
    let small =
        |dirs: Vec<PathBuf>| TierOptions { dirs, capacity: 4 << 20, slot_bytes: 64 << 10, ..TierOptions::default() };
    for (dirs, want) in [
        (vec![dir.0.clone(), dir.0.join(".")], "same directory"),
        (vec![dir.0.clone(), PathBuf::new()], "empty directory name"),
    ] {
        match Tier::start(a.clone(), small(dirs.clone())) {
            Err(e) => assert!(e.to_string().contains(want), "{dirs:?}: {e}"),
            Ok(t) => {
                t.stop().unwrap();
                panic!("{dirs:?} accepted");
            }
        }
    }
    assert!(!std::path::Path::new("cxlkv-tier.slots").exists(), "a slot file in the working directory");
    // A tmpfs directory is RAM, not a drive: accepted with a warning, and
    // counted (a drive's is not).
    let shm = PathBuf::from(format!("/dev/shm/cxlkv-tier-tmpfs-{}", std::process::id()));
    let t = Tier::start(a.clone(), small(vec![shm.clone()])).unwrap();
    assert_eq!(t.stats().memory_dirs, 1);
    t.stop().unwrap();
    let _ = std::fs::remove_dir_all(&shm);
    let t = Tier::start(a.clone(), small(vec![dir.0.clone()])).unwrap();
    assert_eq!(t.stats().memory_dirs, 0, "{} counted as memory", dir.0.display());
    t.stop().unwrap();
    assert_eq!(get(&b, key(1)).as_deref(), Some(&pattern(1)[..]));
    drop(a);
    let _ = std::fs::remove_file(&region);
}

fn scenario(tag: &str, engine_ok: impl Fn(cxlkv_platform::nvme::Engine) -> bool) {
    let region = std::env::temp_dir().join(format!("cxlkv-tier-region-{tag}-{}", std::process::id()));
    let dirs = [Scratch::new(&format!("{tag}-a")), Scratch::new(&format!("{tag}-b"))];
    let topts = TierOptions {
        dirs: dirs.iter().map(|d| d.0.clone()).collect(),
        slot_bytes: 256 << 10,
        capacity: 16 << 20,
        high_water: 1.0,
        batch: 16,
    };
    let b = Node::create(&region, 32 << 20, caps(), opts()).unwrap();
    let a = Arc::new(Node::open(&region, opts()).unwrap());
    let tier = Tier::start(a.clone(), topts.clone()).unwrap();
    let engine = tier.stats().engine.unwrap();
    assert!(engine_ok(engine), "{tag}: engine {engine:?}");
    let n = 40u64;
    for i in 0..n {
        put_block(&b, key(i), &pattern(i));
    }
    assert_eq!(tier.spill_all().unwrap(), n);
    assert_eq!(tier.spill_all().unwrap(), 0, "each block is copied once");
    let dir_paths: Vec<PathBuf> = dirs.iter().map(|d| d.0.clone()).collect();
    let observed = cxlkv_platform::Region::open(&region).unwrap().observe(cxlkv_platform::FlushMode::Clflush).unwrap();
    assert_eq!(observed.check_tier(&dir_paths, topts.slot_bytes).unwrap(), Vec::<String>::new());
    for i in 0..n {
        let t = b.store().tier_find(1, key(i)).unwrap().expect("recorded in the region");
        assert_eq!((t.owner, t.len), (a.id(), LEN as u64));
    }
    b.core().evict(u64::MAX, &mut Lru).unwrap();
    assert_eq!(b.core().lookup(1, &[key(0)]).unwrap(), 0, "evicted");
    for i in 0..n {
        assert_eq!(get(&b, key(i)).as_deref(), Some(&pattern(i)[..]), "block {i} promoted byte-exact");
    }
    assert_eq!(tier.stats().promotions, n);
    assert_eq!(get(&b, key(999)), None, "a block nowhere is a miss");

    // Chunk-sized blocks lie page-aligned in the region: the drive reads
    // them straight in.
    let big: Vec<u8> = (0..256usize << 10).map(|j| (j * 13 + 5) as u8).collect();
    let bigkey = |i: u64| key(1000 + i);
    for i in 0..4 {
        put_block(&b, bigkey(i), &big);
    }
    assert_eq!(tier.spill_all().unwrap(), 4);
    b.core().evict(u64::MAX, &mut Lru).unwrap();
    for i in 0..4 {
        let mut buf = vec![0u8; big.len()];
        let (mut lens, mut out) = ([0u64], [Ok(())]);
        let mut parts = [&mut buf[..]];
        b.get(1, &mut [GetItem { key: bigkey(i), parts: &mut parts }], &mut lens, &mut out).unwrap();
        assert_eq!(out[0], Ok(()));
        assert!(buf == big, "big block {i} byte-exact");
    }
    assert_eq!(tier.stats().direct_reads, 4, "read straight into the region");

    // Acquire promotes too.
    b.core().evict(u64::MAX, &mut Lru).unwrap();
    let mut out = [Err(cxlkv_core::Error::InvalidArgument)];
    assert_eq!(b.acquire_all_or_none(1, &[key(3)], &mut out).unwrap(), 1);
    b.core().release(&[out[0].unwrap()]).unwrap();

    // A restart (another node, the same drives) rebuilds from the headers.
    tier.stop().unwrap();
    assert!(b.store().tier_find(1, key(5)).unwrap().is_none(), "a stopped tier names nothing");
    b.core().evict(u64::MAX, &mut Lru).unwrap();
    let a2 = Arc::new(Node::open(&region, opts()).unwrap());
    let tier = Tier::start(a2.clone(), topts.clone()).unwrap();
    assert_eq!(tier.stats().held, n + 4);
    assert_eq!(get(&b, key(5)).as_deref(), Some(&pattern(5)[..]));

    // A damaged slot: its block is a miss (logged), the others are intact.
    let victim = 7u64;
    let mut hit = None;
    for d in &dirs {
        let f = std::fs::OpenOptions::new().read(true).write(true).open(d.0.join("cxlkv-tier.slots")).unwrap();
        let len = f.metadata().unwrap().len();
        // Headers lie at multiples of the I/O alignment (512 at least).
        let mut buf = vec![0u8; 64];
        let mut at = 0;
        while at + 64 <= len && hit.is_none() {
            f.read_exact_at(&mut buf, at).unwrap();
            if buf[0..8] == *b"CXLKVSL5" && buf[16..24] == key(victim).lo.to_le_bytes() {
                f.write_all_at(&[0xee; 64], at + 8192).unwrap();
                f.sync_all().unwrap();
                hit = Some(at);
            }
            at += 512;
        }
    }
    assert!(hit.is_some(), "found the victim's slot");
    // A check reads the payload, not the headers alone: the damage shows.
    let found = observed.check_tier(&dir_paths, topts.slot_bytes).unwrap();
    assert!(found.iter().any(|f| f.contains("fails its checksum")), "{found:?}");
    assert_eq!(get(&b, key(victim)), None, "a slot failing its checksum is a miss");
    assert!(tier.stats().errors >= 1);
    assert!(b.store().tier_find(1, key(victim)).unwrap().is_none(), "and is forgotten");
    assert_eq!(get(&b, key(8)).as_deref(), Some(&pattern(8)[..]));
    // The drives fail under the tier (its files cut to nothing): the reads
    // come up short, every block is a logged miss, the region is intact.
    b.core().evict(u64::MAX, &mut Lru).unwrap();
    let errors = tier.stats().errors;
    for d in &dirs {
        std::fs::OpenOptions::new().write(true).open(d.0.join("cxlkv-tier.slots")).unwrap().set_len(0).unwrap();
    }
    let found = observed.check_tier(&dir_paths, topts.slot_bytes).unwrap();
    assert!(found.iter().any(|f| f.contains("no whole set of slots holds")), "{found:?}");
    for i in [10u64, 11, 12] {
        assert_eq!(get(&b, key(i)), None, "block {i} on a failed drive is a miss");
    }
    assert!(tier.stats().errors >= errors + 3);
    put_block(&b, key(500), &pattern(500));
    assert_eq!(get(&b, key(500)).as_deref(), Some(&pattern(500)[..]), "the region works on");
    assert!(b.check().unwrap().is_empty(), "{:?}", b.check().unwrap());
    tier.stop().unwrap();
    drop(a);
    drop(a2);
    let _ = std::fs::remove_file(&region);
}

/// Waits until every thread of process `pid` is stopped (state `T` in
/// `/proc/PID/task/*/stat`), at most ten seconds.
fn wait_stopped(pid: u32) {
    let stopped = || -> bool {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
        tasks.filter_map(Result::ok).all(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // The state follows the command name, which is in parentheses.
            stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !stopped() {
        assert!(std::time::Instant::now() < deadline, "process {pid} never stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A tier in another process that stops (SIGSTOP: a frozen container, a
/// host under memory pressure) answers no promotion: a get waits for it as
/// long as the node's promotion wait says, counts the block as a timed-out
/// miss, and waits longer next time; once the tier runs again, the block
/// comes back byte-exact.
#[test]
fn a_stopped_tier_times_out_counted_and_is_waited_for_longer_next_time() {
    const CHILD: &str = "CXLKV_TIER_TEST_STOPPED_TIER";
    let long_lease = || Options { lease: Duration::from_secs(20), ..opts() };
    if let Some(spec) = std::env::var_os(CHILD) {
        // The child: runs a tier over the region, copies every block out,
        // says so, and waits to be killed.
        let spec = spec.into_string().unwrap();
        let (region, dir) = spec.split_once('\n').unwrap();
        let node = Arc::new(Node::open(std::path::Path::new(region), long_lease()).unwrap());
        let topts = TierOptions {
            dirs: vec![PathBuf::from(dir)],
            slot_bytes: 64 << 10,
            capacity: 4 << 20,
            high_water: 1.0,
            batch: 8,
        };
        let tier = Tier::start(node, topts).unwrap();
        assert_eq!(tier.spill_all().unwrap(), 2);
        println!("ready");
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let region = std::env::temp_dir().join(format!("cxlkv-tier-stopped-{}", std::process::id()));
    let dir = Scratch::new("stopped");
    let b = Node::create(&region, 32 << 20, caps(), long_lease()).unwrap();
    put_block(&b, key(1), &pattern(1));
    put_block(&b, key(2), &pattern(2));
    let exe = std::env::current_exe().unwrap();
    let name = "a_stopped_tier_times_out_counted_and_is_waited_for_longer_next_time";
    let mut child = std::process::Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, format!("{}\n{}", region.display(), dir.0.display()))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            // SAFETY: waking our own child so that the kill takes at once.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGCONT) };
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let out = child.stdout.take().unwrap();
    let child = Kill(child);
    // The test harness prints its own lines first ("test NAME ... " with no
    // line end before the child's line); EOF before "ready" is a child that
    // failed.
    let ready =
        std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok).any(|l| l.ends_with("ready"));
    assert!(ready, "the tier child failed");
    b.core().evict(u64::MAX, &mut Lru).unwrap();
    assert_eq!(b.core().lookup(1, &[key(1), key(2)]).unwrap(), 0, "evicted");
    assert_eq!(b.promote_wait(), Duration::from_secs(1), "the wait before any answer");

    // SAFETY: stopping our own child.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGSTOP) };
    // A thread running on another CPU stops only at its next entry to the
    // kernel: until every one has, the tier could still answer.
    wait_stopped(child.0.id());
    let t = std::time::Instant::now();
    assert_eq!(get(&b, key(1)), None, "a stopped tier's block is a miss");
    assert!(t.elapsed() >= Duration::from_secs(1), "waited the whole promotion wait");
    assert_eq!(b.stats().unwrap().node.tier_timeouts, 1, "counted as a timed-out promotion");
    assert_eq!(b.promote_wait(), Duration::from_secs(4), "a wait that ran out makes the next one longer");

    // A node with the wait set keeps it.
    let fixed = Node::open(&region, Options { promote_wait: Some(Duration::from_millis(50)), ..long_lease() }).unwrap();
    assert_eq!(get(&fixed, key(2)), None);
    assert_eq!(fixed.promote_wait(), Duration::from_millis(50));
    assert_eq!(fixed.stats().unwrap().node.tier_timeouts, 1);
    assert_eq!(fixed.stats().unwrap().total.tier_timeouts, 2, "the region's total counts both nodes");

    // SAFETY: waking our own child.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGCONT) };
    assert_eq!(get(&b, key(1)).as_deref(), Some(&pattern(1)[..]), "back once the tier runs");
    assert_eq!(b.stats().unwrap().node.tier_timeouts, 1, "an answered promotion is no timeout");
    fixed.close().unwrap();
    drop(child);
    b.close().unwrap();
    let _ = std::fs::remove_file(&region);
}
