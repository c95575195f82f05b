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

fn get(node: &Node, k: Key) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; LEN];
    let (mut lens, mut out) = ([0u64], [Ok(())]);
    let mut parts = [&mut buf[..]];
    node.get(1, &mut [GetItem { key: k, parts: &mut parts }], &mut lens, &mut out).unwrap();
    out[0].ok().map(|_| buf[..lens[0] as usize].to_vec())
}

/// Both I/O engines, and io_uring whose buffer registration a low memlock
/// limit refuses (one test: the environment and limits are per process).
#[test]
fn spilled_blocks_come_back_byte_exact_with_every_io_engine() {
    use cxlkv_platform::nvme::Engine;
    scenario("uring", |e| matches!(e, Engine::Uring { .. }));
    let mut old = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: reads this process's limit into `old`.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut old) }, 0);
    let low = libc::rlimit { rlim_cur: 16 << 10, rlim_max: old.rlim_max };
    // SAFETY: lowers the soft limit only (restored below).
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &low) }, 0);
    // Registration counts against the limit unless the process may lock
    // memory anyway (CAP_IPC_LOCK, as root usually has): then the tier must
    // still run, registered or not.
    let may_lock = ipc_lock_capable();
    scenario("unregistered", |e| e == Engine::Uring { fixed: false } || e == Engine::Threads || may_lock);
    // SAFETY: restores the soft limit read above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &old) }, 0);
    std::env::set_var("CXLKV_TIER_URING", "off");
    scenario("threads", |e| e == Engine::Threads);
    std::env::remove_var("CXLKV_TIER_URING");
}

/// Whether this process holds CAP_IPC_LOCK (bit 14 of CapEff).
fn ipc_lock_capable() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

/// A drive without room for the slot file: the tier refuses to start with
/// the OS error, and nothing stored is touched.
#[test]
fn a_drive_too_small_for_the_slot_file_is_refused_at_start() {
    let region = std::env::temp_dir().join(format!("cxlkv-tier-region-full-{}", std::process::id()));
    let dir = Scratch::new("full");
    let b = Node::create(&region, 32 << 20, caps(), opts()).unwrap();
    let h = b.core().reserve(1, key(1), LEN as u64, 16).unwrap();
    b.core().write(&h, 0, &pattern(1)).unwrap();
    b.core().publish_flushed(&[h], &mut [Ok(())]).unwrap();
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
        let h = b.core().reserve(1, key(i), LEN as u64, 16).unwrap();
        b.core().write(&h, 0, &pattern(i)).unwrap();
        b.core().publish_flushed(&[h], &mut [Ok(())]).unwrap();
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
        let h = b.core().reserve(1, bigkey(i), big.len() as u64, 16).unwrap();
        b.core().write(&h, 0, &big).unwrap();
        b.core().publish_flushed(&[h], &mut [Ok(())]).unwrap();
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
            if buf[0..8] == *b"CXLKVSL2" && buf[16..24] == key(victim).lo.to_le_bytes() {
                f.write_all_at(&[0xee; 64], at + 8192).unwrap();
                f.sync_all().unwrap();
                hit = Some(at);
            }
            at += 512;
        }
    }
    assert!(hit.is_some(), "found the victim's slot");
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
    assert!(found.iter().any(|f| f.contains("no slot holds")), "{found:?}");
    for i in [10u64, 11, 12] {
        assert_eq!(get(&b, key(i)), None, "block {i} on a failed drive is a miss");
    }
    assert!(tier.stats().errors >= errors + 3);
    let h = b.core().reserve(1, key(500), LEN as u64, 16).unwrap();
    b.core().write(&h, 0, &pattern(500)).unwrap();
    b.core().publish_flushed(&[h], &mut [Ok(())]).unwrap();
    assert_eq!(get(&b, key(500)).as_deref(), Some(&pattern(500)[..]), "the region works on");
    assert!(b.check().unwrap().is_empty(), "{:?}", b.check().unwrap());
    tier.stop().unwrap();
    drop(a);
    drop(a2);
    let _ = std::fs::remove_file(&region);
}
