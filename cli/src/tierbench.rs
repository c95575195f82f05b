//! `cxlkv bench --tier DIR`: the SSD tier's write (spill) and read
//! (promote) bandwidth, through the calls users make (a tier process's
//! spill, another node's batch get of evicted blocks), beside a same-run
//! raw `O_DIRECT` write and read shaped as the tier's slot I/O (a fresh
//! preallocated file on the same drive; same offsets, sizes, queue depth
//! and I/O engine).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cxlkv_platform::kv::Capacities;
use cxlkv_platform::kv::Key;
use cxlkv_platform::kv::Lru;
use cxlkv_platform::nvme::{Io, Op, QUEUE_DEPTH};
use cxlkv_platform::{GetItem, Node, Options, PutItem, Tier, TierOptions};
use serde::Serialize;

/// What one run measured (MB/s = 10^6 bytes per second).
#[derive(Serialize)]
pub struct TierReport {
    pub engine: String,
    /// Bytes the tier registered with io_uring (the region and its buffers when allowed).
    pub registered_bytes: u64,
    pub block_bytes: usize,
    pub blocks: usize,
    pub queue_depth: u32,
    pub raw_write_mbs: f64,
    pub raw_read_mbs: f64,
    pub tier_write_mbs: f64,
    pub tier_read_mbs: f64,
    /// Every round: [raw write, raw read, tier write, tier read] MB/s.
    pub rounds: Vec<[f64; 4]>,
}

fn mbs(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64().max(1e-9) / 1e6
}

fn key(i: u64) -> Key {
    Key { lo: cxlkv_platform::kv::mix64(i ^ 0x7469_6572), hi: i }
}

struct Buf(*mut u8, std::alloc::Layout);
impl Buf {
    fn new(len: usize) -> Buf {
        let l = std::alloc::Layout::from_size_align(len, 4096).expect("layout");
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(l) };
        assert!(!p.is_null(), "out of memory");
        Buf(p, l)
    }
}
impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.0, self.1) }
    }
}

/// Raw O_DIRECT writes then reads shaped as the tier's slot I/O (`blocks`
/// slots of `stride` bytes, at slot offsets) on a fresh file preallocated
/// as a slot file is, on the same drive, a stream kept `qd` deep; (engine,
/// write MB/s, read MB/s) counting payload bytes as the tier's figures do.
fn raw(dir: &Path, stride: usize, block: usize, blocks: usize, qd: usize) -> Result<(String, f64, f64), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("cxlkv-raw.bench");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    {
        use std::os::fd::AsRawFd;
        // SAFETY: `fallocate` on the open descriptor; touches no memory.
        if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, (stride * blocks) as libc::off_t) } != 0 {
            return Err(format!("{}: {}", path.display(), std::io::Error::last_os_error()));
        }
    }
    let bufs: Vec<Buf> = (0..qd).map(|_| Buf::new(stride)).collect();
    for b in &bufs {
        // SAFETY: `b` owns `stride` bytes.
        unsafe { std::ptr::write_bytes(b.0, 0x5a, stride) };
    }
    let regs: Vec<(*mut u8, usize)> = bufs.iter().map(|b| (b.0, stride)).collect();
    let mut io = Io::new(&regs);
    // A stream of operations kept `qd` deep: each completion frees its
    // buffer for the next slot.
    let mut pass = |write: bool| -> Result<Duration, String> {
        let t = Instant::now();
        let mut b = io.batch();
        let mut free: Vec<usize> = (0..qd).collect();
        let mut slot_of: Vec<usize> = Vec::with_capacity(blocks);
        let mut next = 0usize;
        loop {
            while next < blocks {
                let Some(j) = free.pop() else { break };
                let op = Op { file: &f, offset: (next * stride) as u64, buf: bufs[j].0, len: stride, write };
                let k = b.push(op);
                slot_of.resize(k + 1, 0);
                slot_of[k] = j;
                next += 1;
            }
            let Some((k, r)) = b.wait_one() else { break };
            r.map_err(|e| format!("raw I/O: {e}"))?;
            free.push(slot_of[k]);
        }
        drop(b);
        if write {
            f.sync_data().map_err(|e| e.to_string())?;
        }
        Ok(t.elapsed())
    };
    let (w, r) = (pass(true), pass(false));
    let _ = std::fs::remove_file(&path);
    let (w, r) = (w?, r?);
    let total = block * blocks;
    Ok((format!("{:?}", io.engine()), mbs(total, w), mbs(total, r)))
}

/// Rounds of the raw and the tier runs, interleaved (the medians are
/// reported: a virtual or shared drive's speed drifts).
const ROUNDS: usize = 3;

pub fn run(dir: &Path, block: usize, blocks: usize) -> Result<TierReport, String> {
    let qd = (QUEUE_DEPTH as usize).min(32);
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let mut rows: Vec<[f64; 4]> = Vec::new();
    let (mut engine, mut registered_bytes) = (String::new(), 0);
    // The slot stride, from the tier's geometry (a first short tier run).
    let stride = tier(dir, block, 1, 1)?.3 as usize;
    for round in 0..ROUNDS {
        // Which goes first alternates (a drive may still be busy with the
        // run before).
        let (mut t, mut r) = (None, None);
        for which in [round % 2, 1 - round % 2] {
            if which == 0 {
                r = Some(raw(dir, stride, block, blocks, qd)?);
            } else {
                t = Some(tier(dir, block, blocks, qd)?);
            }
        }
        let ((tier_w, tier_r, reg, _), (e, raw_w, raw_r)) = (t.expect("ran"), r.expect("ran"));
        (engine, registered_bytes) = (e, reg);
        rows.push([raw_w, raw_r, tier_w, tier_r]);
    }
    let median = |c: usize| {
        let mut v: Vec<f64> = rows.iter().map(|r| r[c]).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(TierReport {
        engine,
        registered_bytes,
        block_bytes: block,
        blocks,
        queue_depth: qd as u32,
        raw_write_mbs: median(0),
        raw_read_mbs: median(1),
        tier_write_mbs: median(2),
        tier_read_mbs: median(3),
        rounds: rows,
    })
}

/// One tier run: spill every block of a region, evict them, get them back
/// through another node; (write MB/s, read MB/s, bytes registered, slot
/// stride).
fn tier(dir: &Path, block: usize, blocks: usize, qd: usize) -> Result<(f64, f64, u64, u64), String> {
    // The region: the blocks and room to put them back.
    let region = std::path::PathBuf::from(format!("/dev/shm/cxlkv-tierbench-{}", std::process::id()));
    let e = |x: cxlkv_platform::Error| x.to_string();
    let size = (block * blocks) as u64 * 5 / 4 + (64 << 20);
    let chunk = (block as u64).next_power_of_two().max(1 << 21);
    let caps = Capacities {
        max_nodes: 4,
        n_stripes: 16,
        entries_per_stripe: (blocks as u32 * 2).div_ceil(16).max(16),
        chunk_shift: chunk.trailing_zeros(),
        tier_records: (blocks as u32 * 4).next_power_of_two(),
        ..Capacities::default()
    };
    let res = (|| {
        // Both mappings faulted in before anything is timed (a background
        // populate would compete with the tier for the cores; a DAX region
        // has no pages to fault in).
        let no_bg = Options { populate: false, ..Options::default() };
        let user = Node::create(&region, size, caps, no_bg.clone()).map_err(e)?;
        user.prefault().map_err(e)?;
        let data = vec![0xa5u8; block];
        for i in 0..blocks as u64 {
            let parts: [&[u8]; 1] = [&data];
            let mut out = [Ok(())];
            user.put(1, &[PutItem { key: key(i), tokens: 16, parts: &parts }], &mut out).map_err(e)?;
            out[0].map_err(|x| format!("put: {x}"))?;
        }
        let owner = Arc::new(Node::open(&region, no_bg).map_err(e)?);
        owner.prefault().map_err(e)?;
        let topts = TierOptions {
            dirs: vec![dir.to_path_buf()],
            slot_bytes: block as u64,
            capacity: (block as u64 + 4096) * blocks as u64 + (8 << 20),
            high_water: 1.0,
            batch: qd,
        };
        let tier = Tier::start(owner.clone(), topts).map_err(e)?;
        let t = Instant::now();
        let n = tier.spill_all().map_err(e)?;
        let tier_w = mbs(block * n as usize, t.elapsed());
        user.core().evict(u64::MAX, &mut Lru).map_err(|x| x.to_string())?;
        // The user's buffers, touched before timing (their first-use page
        // faults are not the tier's).
        let mut bufs: Vec<Vec<u8>> = (0..qd).map(|_| vec![1u8; block]).collect();
        let t = Instant::now();
        let mut got = 0usize;
        for start in (0..blocks).step_by(qd) {
            let end = (start + qd).min(blocks);
            let mut parts: Vec<[&mut [u8]; 1]> = bufs.iter_mut().take(end - start).map(|b| [&mut b[..]]).collect();
            let mut items: Vec<GetItem<'_, '_>> =
                parts.iter_mut().enumerate().map(|(j, p)| GetItem { key: key((start + j) as u64), parts: p }).collect();
            let (mut lens, mut out) = (vec![0u64; items.len()], vec![Ok(()); items.len()]);
            user.get(1, &mut items, &mut lens, &mut out).map_err(e)?;
            got += out.iter().filter(|r| r.is_ok()).count();
        }
        let tier_r = mbs(block * got, t.elapsed());
        if got != blocks || bufs[0].iter().any(|&b| b != 0xa5) {
            return Err(format!("{got} of {blocks} blocks came back"));
        }
        let (registered, stride) = (tier.stats().registered_bytes, tier.slot_stride());
        tier.stop().map_err(e)?;
        Ok((tier_w, tier_r, registered, stride))
    })();
    let _ = std::fs::remove_file(&region);
    let _ = std::fs::remove_file(dir.join("cxlkv-tier.slots"));
    res
}

pub fn print(r: &TierReport) {
    println!(
        "SSD tier, {} blocks of {} KiB, QD {}, engine {}, {} MiB registered",
        r.blocks,
        r.block_bytes >> 10,
        r.queue_depth,
        r.engine,
        r.registered_bytes >> 20
    );
    println!("  {:<40} {:>10} {:>10}", "", "write MB/s", "read MB/s");
    println!("  {:<40} {:>10.0} {:>10.0}", "raw O_DIRECT (slot-shaped, same drive)", r.raw_write_mbs, r.raw_read_mbs);
    println!("  {:<40} {:>10.0} {:>10.0}", "tier (spill / get of evicted)", r.tier_write_mbs, r.tier_read_mbs);
    println!(
        "  {:<40} {:>9.0}% {:>9.0}%",
        "tier / raw",
        100.0 * r.tier_write_mbs / r.raw_write_mbs.max(1e-9),
        100.0 * r.tier_read_mbs / r.raw_read_mbs.max(1e-9)
    );
    println!("  medians of {} rounds (raw w/r, tier w/r):", r.rounds.len());
    for x in &r.rounds {
        println!("    {:>6.0} {:>6.0}   {:>6.0} {:>6.0}", x[0], x[1], x[2], x[3]);
    }
}
