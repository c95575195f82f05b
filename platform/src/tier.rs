//! The SSD tier of a host: blocks copied out of the region into
//! preallocated `O_DIRECT` slot files on the host's NVMe drives before
//! eviction needs their space, recorded in the region's tier directory (see
//! core's `tier.rs`) so any node of the rack learns they exist, and put
//! back into the region when a node asks through the tier node's inbox.
//!
//! A slot holds one block: a header (key, namespace, tokens, length, a
//! write sequence number, the payload's checksum, the header's own
//! checksum) in the first I/O-aligned unit, then the payload. A slot is
//! trusted only when both checksums hold, so a write cut short by a crash
//! leaves a slot that fails them, never one that verifies with wrong bytes;
//! a restart rebuilds the tier's index from the headers (the newest write
//! of a key wins).
//!
//! I/O goes through [`crate::nvme`]: batches of `O_DIRECT` reads and
//! writes in flight at once on io_uring (its buffers registered when the
//! memlock limit allows), or on a `pread`/`pwrite` thread pool where
//! io_uring is refused or `CXLKV_TIER_URING=off`. Each block passes
//! through an aligned buffer of the tier: copied out of the region with
//! the region's validated read (which makes this host's cached lines of it
//! fresh first) under a pin, and into a reserved block with the region's
//! flushed write, so no device ever reads or writes region lines this
//! host's caches hold.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cxlkv_core::channel::Message;
use cxlkv_core::coherence::{Coherence, Site};
use cxlkv_core::hash::{mix64, Key};
use cxlkv_core::index::ReserveItem;
use cxlkv_core::layout::NodeInfo;
use cxlkv_core::Error as CoreError;

use crate::node::Node;
use crate::sync::Flag;
use crate::{Error, Result};

/// [`Message::kind`] of a request to a tier: put block `keys[0]` of
/// namespace `ns` back into the region. The answer's status is 0 when the
/// block is in the region (put back, or there already), else a core error
/// code (`NotFound`: the tier does not hold it or its slot failed its
/// checks).
pub const KIND_TIER_PROMOTE: u32 = 0x7469_0001;

const MAGIC: u64 = u64::from_le_bytes(*b"CXLKVSL2");
/// Bytes of a slot header's fields (the rest of its unit is zero).
const HEADER_BYTES: usize = 72;

/// How a tier runs.
#[derive(Clone, Debug)]
pub struct TierOptions {
    /// One directory per drive; a slot file is made in each.
    pub dirs: Vec<PathBuf>,
    /// Largest block a slot holds (blocks larger stay in the region only).
    pub slot_bytes: u64,
    /// Bytes of slot file per directory.
    pub capacity: u64,
    /// Copy cold blocks out once the region's payload is this full (0 to 1):
    /// ahead of eviction, which starts when it is full.
    pub high_water: f64,
    /// Blocks copied out per round at most.
    pub batch: usize,
}

impl Default for TierOptions {
    fn default() -> Self {
        TierOptions { dirs: Vec::new(), slot_bytes: 2 << 20, capacity: 1 << 30, high_water: 0.7, batch: 64 }
    }
}

/// A tier's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Blocks copied to SSD.
    pub spills: u64,
    /// Blocks put back into the region on request.
    pub promotions: u64,
    /// Requests for blocks the tier does not hold, or whose slot failed.
    pub misses: u64,
    /// I/O or checksum errors (each also logged).
    pub errors: u64,
    /// Blocks held now.
    pub held: u64,
    /// Bytes written to and read from the drives.
    pub bytes_written: u64,
    /// Bytes read from the drives.
    pub bytes_read: u64,
    /// Blocks the drive read straight into the region (no copy).
    pub direct_reads: u64,
    /// The I/O engine in use.
    pub engine: Option<crate::nvme::Engine>,
}

/// The counters, shared by the tier thread and its handle.
#[derive(Default)]
struct Counters(Mutex<TierStats>);

impl Counters {
    fn add(&self, f: impl FnOnce(&mut TierStats)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

enum Command {
    /// Copy every block of the region the tier does not hold yet, then
    /// answer.
    SpillAll(Arc<Answer<Result<u64>>>),
}

/// One answer from the tier thread, waited for on a condition variable
/// (a channel's blocking receive would make std give a thread not started
/// by Rust, such as a C program's, a handle it never frees).
struct Answer<T> {
    value: Mutex<Option<T>>,
    ready: Condvar,
}

impl<T> Answer<T> {
    fn new() -> Arc<Answer<T>> {
        Arc::new(Answer { value: Mutex::new(None), ready: Condvar::new() })
    }

    fn give(&self, v: T) {
        *self.value.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
        self.ready.notify_all();
    }

    /// The answer, or `None` when the thread ended without one.
    fn wait(&self, thread: &Option<JoinHandle<Result<()>>>) -> Option<T> {
        let mut g = self.value.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(v) = g.take() {
                return Some(v);
            }
            if thread.as_ref().is_none_or(|t| t.is_finished()) {
                return None;
            }
            g = self.ready.wait_timeout(g, Duration::from_millis(50)).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// A running tier: its thread owns a node's tier directory. Dropping it
/// stops the thread and lets the directory go.
pub struct Tier {
    stop: Arc<Flag>,
    counters: Arc<Counters>,
    cmd: mpsc::Sender<Command>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl Tier {
    /// Starts the tier of `node` (which it keeps to itself: its inbox
    /// serves requests) on `opts.dirs`: opens or makes the slot files,
    /// claims a tier directory, and records the blocks the files hold.
    pub fn start(node: Arc<Node>, opts: TierOptions) -> Result<Tier> {
        if opts.dirs.is_empty() || opts.slot_bytes == 0 || opts.capacity == 0 || !(0.0..=1.0).contains(&opts.high_water)
        {
            return Err(CoreError::InvalidArgument.into());
        }
        let devs =
            opts.dirs.iter().map(|d| Dev::open(d, opts.slot_bytes, opts.capacity)).collect::<Result<Vec<_>>>()?;
        let stop = Arc::new(Flag::new(false));
        let counters = Arc::new(Counters::default());
        let (cmd, rx) = mpsc::channel();
        let ready = Answer::new();
        let ready_tx = ready.clone();
        let (s, c) = (stop.clone(), counters.clone());
        let thread = std::thread::Builder::new()
            .name("cxlkv-tier".into())
            .spawn(move || run(node, opts, devs, s, c, rx, ready_tx))
            .map_err(|err| Error::Io { what: "spawn the tier thread", err })?;
        let mut tier = Tier { stop, counters, cmd, thread: Some(thread) };
        match ready.wait(&tier.thread) {
            Some(Ok(())) => Ok(tier),
            Some(Err(e)) => {
                let _ = tier.stop_thread();
                Err(e)
            }
            None => Err(tier.stop_thread().err().unwrap_or(Error::Unsupported("the tier thread ended"))),
        }
    }

    /// Copies every block of the region the tier does not hold yet (up to
    /// its capacity), whatever the high-water mark; returns how many.
    pub fn spill_all(&self) -> Result<u64> {
        let answer = Answer::new();
        self.cmd.send(Command::SpillAll(answer.clone())).map_err(|_| Error::Unsupported("the tier thread ended"))?;
        answer.wait(&self.thread).ok_or(Error::Unsupported("the tier thread ended"))?
    }

    /// The tier's counters.
    pub fn stats(&self) -> TierStats {
        *self.counters.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops the tier and lets its directory go.
    pub fn stop(mut self) -> Result<()> {
        self.stop_thread()
    }

    fn stop_thread(&mut self) -> Result<()> {
        self.stop.set(true);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(Error::Unsupported("the tier thread panicked")),
            None => Ok(()),
        }
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        let _ = self.stop_thread();
    }
}

/// One drive's slot file.
struct Dev {
    file: File,
    path: PathBuf,
    /// I/O alignment (offsets, lengths and buffer addresses).
    align: u64,
    /// Bytes from one slot to the next: a header unit, then the payload.
    stride: u64,
    slots: u32,
}

impl Dev {
    fn open(dir: &Path, slot_bytes: u64, capacity: u64) -> Result<Dev> {
        let io = |what: &'static str| move |err| Error::Io { what, err };
        std::fs::create_dir_all(dir).map_err(io("create the tier directory"))?;
        let path = dir.join("cxlkv-tier.slots");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .map_err(io("open the slot file with O_DIRECT"))?;
        let align = dio_align(&file).max(512);
        let stride = align + slot_bytes.div_ceil(align) * align;
        let slots = (capacity / stride).min(u32::MAX as u64) as u32;
        if slots == 0 {
            return Err(CoreError::InvalidArgument.into());
        }
        let len = stride * slots as u64;
        if file.metadata().map_err(io("stat the slot file"))?.len() < len {
            use std::os::fd::AsRawFd;
            // SAFETY: `fallocate` on the open descriptor with in-range
            // arguments; it touches no memory of this process.
            let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
            if r != 0 {
                return Err(io("preallocate the slot file")(std::io::Error::last_os_error()));
            }
        }
        Ok(Dev { file, path, align, stride, slots })
    }

    fn at(&self, slot: u32) -> u64 {
        self.stride * slot as u64
    }
}

/// The I/O alignment of `file`: `statx`'s `STATX_DIOALIGN` when the kernel
/// reports it, else the file system's block size.
fn dio_align(file: &File) -> u64 {
    use std::os::fd::AsRawFd;
    // SAFETY: `statx` is plain old data; all zeroes is a valid value.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `statx` on the open descriptor with an empty path and
    // AT_EMPTY_PATH writes at most one `statx` into `sx`, which lives here.
    let r = unsafe { libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut sx) };
    if r == 0 && sx.stx_mask & libc::STATX_DIOALIGN != 0 && sx.stx_dio_offset_align > 0 {
        return (sx.stx_dio_offset_align as u64).max(sx.stx_dio_mem_align as u64).next_power_of_two();
    }
    file.metadata().map(|m| std::os::unix::fs::MetadataExt::blksize(&m)).unwrap_or(4096).max(512)
}

/// A heap buffer aligned for `O_DIRECT`.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is owned memory, used by one thread at a time.
unsafe impl Send for Aligned {}

impl Aligned {
    fn new(len: usize, align: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len.max(align), align).expect("tier buffer layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Aligned { ptr, layout }
    }

    fn view(&self) -> &[u8] {
        // SAFETY: `ptr` is a live allocation of `layout.size()` bytes owned
        // by `self`; shared here while no mutable borrow exists.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `layout.size()` bytes owned
        // by `self`, borrowed mutably once here.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// A slot's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    ns: u32,
    tokens: u32,
    key: Key,
    len: u64,
    seq: u64,
    sum: u64,
}

impl Header {
    fn write(&self, out: &mut [u8]) {
        let mut w = [0u8; HEADER_BYTES];
        let fields: [u64; 8] = [
            MAGIC,
            self.ns as u64 | (self.tokens as u64) << 32,
            self.key.lo,
            self.key.hi,
            self.len,
            self.seq,
            self.sum,
            0,
        ];
        for (c, f) in w.chunks_exact_mut(8).zip(fields) {
            c.copy_from_slice(&f.to_le_bytes());
        }
        let hsum = payload_sum(&w[..64]);
        w[64..72].copy_from_slice(&hsum.to_le_bytes());
        out.fill(0);
        out[..HEADER_BYTES].copy_from_slice(&w);
    }

    fn read(b: &[u8]) -> Option<Header> {
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        if b.len() < HEADER_BYTES || w(0) != MAGIC || w(8) != payload_sum(&b[..64]) {
            return None;
        }
        Some(Header {
            ns: w(1) as u32,
            tokens: (w(1) >> 32) as u32,
            key: Key { lo: w(2), hi: w(3) },
            len: w(4),
            seq: w(5),
            sum: w(6),
        })
    }
}

/// Checksum of a payload: four independent lanes of 64-bit words, each
/// folded through multiply-xorshift steps (so the lanes' multiplies
/// overlap), then mixed with the tail and the length.
fn payload_sum(b: &[u8]) -> u64 {
    const K: [u64; 4] = [0x9e37_79b9_7f4a_7c15, 0xc2b2_ae3d_27d4_eb4f, 0x1656_67b1_9e37_79f9, 0x85eb_ca77_c2b2_ae63];
    let mut h = [0x6378_6c6b_7673_6c31u64, 0x7469_6572_2073_756d, 0x736c_6f74_2073_756d, b.len() as u64];
    let mut blocks = b.chunks_exact(32);
    for c in blocks.by_ref() {
        for (j, w) in c.chunks_exact(8).enumerate() {
            let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            let x = (h[j] ^ v).wrapping_mul(K[j]);
            h[j] = x ^ (x >> 29);
        }
    }
    let mut tail = [0u8; 32];
    tail[..blocks.remainder().len()].copy_from_slice(blocks.remainder());
    let mut acc = b.len() as u64;
    for (j, w) in tail.chunks_exact(8).enumerate() {
        acc = mix64(acc ^ mix64(h[j] ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))));
    }
    acc
}

/// Where the tier holds a block.
#[derive(Clone, Copy, Debug)]
struct Loc {
    dev: usize,
    slot: u32,
    hdr: Header,
}

/// The tier thread's state.
struct State {
    devs: Vec<Dev>,
    index: HashMap<(u32, Key), Loc>,
    /// Free slots per drive.
    free: Vec<Vec<u32>>,
    /// Blocks in the order they were written (oldest first), to drop when
    /// the drives are full.
    order: std::collections::VecDeque<(u32, Key, u64)>,
    seq: u64,
    next_dev: usize,
    /// One buffer per operation of a batch.
    bufs: Vec<Aligned>,
    io: crate::nvme::Io,
    counters: Arc<Counters>,
    slot_bytes: u64,
}

fn run(
    node: Arc<Node>,
    opts: TierOptions,
    devs: Vec<Dev>,
    stop: Arc<Flag>,
    counters: Arc<Counters>,
    cmd: mpsc::Receiver<Command>,
    ready: Arc<Answer<Result<()>>>,
) -> Result<()> {
    let core = node.core();
    let st = node.store();
    let host = st.view.read::<NodeInfo>(st.layout.node_info(node.id())).map_err(Error::from)?.host_id;
    let mut dir = match core.tier_claim(host) {
        Ok(d) => d,
        Err(e) => {
            ready.give(Err(e.into()));
            return Ok(());
        }
    };
    let align = devs.iter().map(|d| d.align).max().unwrap_or(4096) as usize;
    let stride = devs.iter().map(|d| d.stride).max().unwrap_or(0) as usize;
    let mut s = State {
        free: devs.iter().map(|d| (0..d.slots).rev().collect()).collect(),
        devs,
        index: HashMap::new(),
        order: Default::default(),
        seq: 0,
        next_dev: 0,
        bufs: (0..opts.batch.clamp(1, crate::nvme::QUEUE_DEPTH as usize))
            .map(|_| Aligned::new(stride, align))
            .collect(),
        io: crate::nvme::Io::new(&[]),
        counters: counters.clone(),
        slot_bytes: opts.slot_bytes,
    };
    let regions: Vec<(*mut u8, usize)> = s.bufs.iter().map(|b| (b.ptr, b.layout.size())).collect();
    s.io = crate::nvme::Io::new(&regions);
    counters.add(|c| c.engine = Some(s.io.engine()));
    s.rebuild(&mut dir);
    ready.give(Ok(()));
    let mut last_spill = Instant::now() - Duration::from_secs(1);
    while !stop.get() {
        let mut busy = false;
        while let Some((m, keys)) = node.try_recv()? {
            busy = true;
            if m.kind == KIND_TIER_PROMOTE {
                let asks: Vec<(u32, Key)> = keys.iter().map(|k| (m.ns, *k)).collect();
                let mut there = Vec::with_capacity(keys.len());
                for batch in asks.chunks(s.bufs.len()) {
                    let ok = s.promote_batch(&node, &mut dir, batch);
                    there.extend(batch.iter().zip(ok).filter(|(_, ok)| *ok).map(|((_, k), _)| *k));
                }
                let _ = node.reply(&m, 0, &there);
            } else if m.kind & crate::node::KIND_RESPONSE == 0 {
                let _ = node.reply(&m, CoreError::InvalidArgument as u32, &[]);
            }
        }
        if let Ok(Command::SpillAll(done)) = cmd.try_recv() {
            done.give(s.spill(&node, &mut dir, usize::MAX));
            busy = true;
        }
        if last_spill.elapsed() >= Duration::from_millis(5) {
            last_spill = Instant::now();
            let full = node.stats().map(|x| x.live_bytes as f64 / x.payload_bytes.max(1) as f64).unwrap_or(0.0);
            if full >= opts.high_water && s.spill(&node, &mut dir, opts.batch).unwrap_or(0) > 0 {
                busy = true;
            }
        }
        if !busy {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    dir.release().map_err(Error::from)
}

impl State {
    fn log(&self, what: std::fmt::Arguments<'_>) {
        self.counters.add(|c| c.errors += 1);
        eprintln!("cxlkv tier: {what}");
    }

    /// Reads every slot header and records the blocks the slots hold.
    fn rebuild(&mut self, dir: &mut cxlkv_core::tier::TierDir<'_, crate::Flush>) {
        let mut taken: Vec<Vec<bool>> = self.devs.iter().map(|d| vec![false; d.slots as usize]).collect();
        for d in 0..self.devs.len() {
            for slot in 0..self.devs[d].slots {
                let (at, unit) = (self.devs[d].at(slot), self.devs[d].align as usize);
                let buf = self.bufs[0].bytes();
                let r = self.devs[d].file.read_exact_at(&mut buf[..unit], at);
                let Some(hdr) = r.ok().and_then(|_| Header::read(&buf[..unit])) else { continue };
                if hdr.len > self.slot_bytes {
                    continue;
                }
                self.seq = self.seq.max(hdr.seq);
                let loc = Loc { dev: d, slot, hdr };
                match self.index.get(&(hdr.ns, hdr.key)) {
                    Some(old) if old.hdr.seq >= hdr.seq => continue,
                    Some(old) => taken[old.dev][old.slot as usize] = false,
                    None => {}
                }
                taken[d][slot as usize] = true;
                self.index.insert((hdr.ns, hdr.key), loc);
            }
        }
        let mut held: Vec<Loc> = self.index.values().copied().collect();
        held.sort_by_key(|l| l.hdr.seq);
        for l in held {
            if dir.put(l.hdr.ns, l.hdr.key, l.hdr.len).is_err() {
                // The directory is full: the slot is reused.
                taken[l.dev][l.slot as usize] = false;
                self.index.remove(&(l.hdr.ns, l.hdr.key));
                continue;
            }
            self.order.push_back((l.hdr.ns, l.hdr.key, l.hdr.seq));
        }
        for (d, t) in taken.iter().enumerate() {
            self.free[d] = (0..self.devs[d].slots).rev().filter(|&i| !t[i as usize]).collect();
        }
        let held = self.index.len() as u64;
        self.counters.add(|c| c.held = held);
    }

    /// Copies up to `max` of the region's oldest blocks the tier does not
    /// hold to the drives, a batch at a time; returns how many.
    fn spill(&mut self, node: &Node, dir: &mut cxlkv_core::tier::TierDir<'_, crate::Flush>, max: usize) -> Result<u64> {
        let core = node.core();
        let stripes = node.store().layout.caps.n_stripes;
        let mut todo = Vec::new();
        let mut cold = Vec::new();
        'stripes: for s in 0..stripes {
            let mut skip = 0usize;
            loop {
                cold.resize(skip + 64, (0u32, Key::default(), 0u64));
                let got = core.coldest(s, &mut cold)?;
                for &(ns, k, len) in cold[..got].iter().skip(skip) {
                    if todo.len() >= max {
                        break 'stripes;
                    }
                    if len <= self.slot_bytes && !self.index.contains_key(&(ns, k)) {
                        todo.push((ns, k));
                    }
                }
                if got < cold.len() || max != usize::MAX {
                    break;
                }
                skip = got;
            }
        }
        let mut n = 0;
        for batch in todo.chunks(self.bufs.len()) {
            n += self.spill_batch(node, dir, batch);
        }
        Ok(n)
    }

    /// Copies one batch of blocks out: each pinned while its bytes are
    /// copied into its buffer, then every slot write in flight at once, one
    /// sync per drive, and only then the records.
    fn spill_batch(
        &mut self,
        node: &Node,
        dir: &mut cxlkv_core::tier::TierDir<'_, crate::Flush>,
        batch: &[(u32, Key)],
    ) -> u64 {
        let core = node.core();
        // (buffer, header, drive, slot, bytes of I/O)
        let mut staged: Vec<(usize, Header, usize, u32, usize)> = Vec::new();
        for &(ns, key) in batch {
            let mut h = [Err(CoreError::InvalidArgument)];
            if core.acquire(ns, &[key], &mut h).is_err() {
                continue;
            }
            let Ok(hd) = h[0] else { continue };
            let Some((d, slot)) = self.take_slot(dir) else {
                let _ = core.release(&[hd]);
                break;
            };
            let i = staged.len();
            let (align, len) = (self.devs[d].align as usize, hd.len as usize);
            let io_len = align + len.div_ceil(align) * align;
            let buf = self.bufs[i].bytes();
            buf[align..io_len].fill(0);
            // The copy reads the payload fresh (it invalidates this host's
            // lines first), under the pin.
            let read = core.read(&hd, 0, &mut buf[align..align + len]);
            let _ = core.release(&[hd]);
            if let Err(e) = read {
                self.free[d].push(slot);
                self.log(format_args!("copy of a block out of the region failed: {e}"));
                continue;
            }
            self.seq += 1;
            let hdr = Header {
                ns,
                tokens: hd.tokens,
                key,
                len: hd.len,
                seq: self.seq,
                sum: payload_sum(&buf[align..align + len]),
            };
            hdr.write(&mut buf[..align]);
            staged.push((i, hdr, d, slot, io_len));
        }
        let ops: Vec<crate::nvme::Op<'_>> = staged
            .iter()
            .map(|&(i, _, d, slot, len)| crate::nvme::Op {
                file: &self.devs[d].file,
                offset: self.devs[d].at(slot),
                buf: self.bufs[i].ptr,
                len,
                write: true,
            })
            .collect();
        let mut out: Vec<std::io::Result<usize>> = (0..ops.len()).map(|_| Ok(0)).collect();
        self.io.run(&ops, &mut out);
        drop(ops);
        // The slots are durable on the drives before the rack learns of
        // them (O_DIRECT bypasses the page cache; fdatasync flushes the
        // drive's own cache).
        let mut synced: Vec<Option<bool>> = vec![None; self.devs.len()];
        let mut n = 0;
        for (&(_, hdr, d, slot, io_len), r) in staged.iter().zip(out) {
            let ok = match r {
                Ok(_) => *synced[d].get_or_insert_with(|| self.devs[d].file.sync_data().is_ok()),
                Err(e) => {
                    self.log(format_args!("write of slot {slot} of {} failed: {e}", self.devs[d].path.display()));
                    false
                }
            };
            if !ok || dir.put(hdr.ns, hdr.key, hdr.len).is_err() {
                self.free[d].push(slot);
                continue;
            }
            self.index.insert((hdr.ns, hdr.key), Loc { dev: d, slot, hdr });
            self.order.push_back((hdr.ns, hdr.key, hdr.seq));
            n += 1;
            let held = self.index.len() as u64;
            self.counters.add(|c| {
                c.spills += 1;
                c.held = held;
                c.bytes_written += io_len as u64;
            });
        }
        if synced.contains(&Some(false)) {
            self.log(format_args!("a drive failed to sync: its blocks of this batch were not recorded"));
        }
        n
    }

    /// A free slot, on the drives in turn; when every drive is full (or the
    /// directory is), the oldest block held is dropped first.
    fn take_slot(&mut self, dir: &mut cxlkv_core::tier::TierDir<'_, crate::Flush>) -> Option<(usize, u32)> {
        for _ in 0..2 {
            let full = dir.live() >= dir.capacity() / 2;
            if !full {
                for i in 0..self.devs.len() {
                    let d = (self.next_dev + i) % self.devs.len();
                    if let Some(slot) = self.free[d].pop() {
                        self.next_dev = d + 1;
                        return Some((d, slot));
                    }
                }
            }
            // Drop the oldest block held.
            while let Some((ns, key, seq)) = self.order.pop_front() {
                match self.index.get(&(ns, key)) {
                    Some(l) if l.hdr.seq == seq => {
                        let l = *l;
                        let _ = dir.remove(ns, key);
                        self.index.remove(&(ns, key));
                        self.free[l.dev].push(l.slot);
                        break;
                    }
                    _ => continue,
                }
            }
        }
        None
    }

    /// Reads the blocks asked for back into the region, the reads in
    /// flight at once. Each block is reserved first; where its payload is
    /// aligned for the drive, the drive reads straight into it (this host's
    /// lines of it flushed first, so none lands later over what the drive
    /// wrote), else into the tier's buffer, copied in after. Published only
    /// after its read completed and its header and checksum verified;
    /// aborted otherwise. `there[i]`: block `i` is in the region now.
    fn promote_batch(
        &mut self,
        node: &Node,
        dir: &mut cxlkv_core::tier::TierDir<'_, crate::Flush>,
        asks: &[(u32, Key)],
    ) -> Vec<bool> {
        let core = node.core();
        let st = node.store();
        let mut there = vec![false; asks.len()];
        // (request, buffer, location, reservation, payload straight into it)
        let mut staged: Vec<(usize, usize, Loc, cxlkv_core::index::Handle, bool)> = Vec::new();
        for (r, (ns, key)) in asks.iter().enumerate() {
            let Some(loc) = self.index.get(&(*ns, *key)).copied() else {
                self.counters.add(|c| c.misses += 1);
                continue;
            };
            let item = ReserveItem { key: loc.hdr.key, len: loc.hdr.len, tokens: loc.hdr.tokens };
            let mut h = [Err(CoreError::InvalidArgument)];
            match core.reserve_batch(*ns, &[item], &mut h).and(h[0]) {
                Ok(h) => {
                    let align = self.devs[loc.dev].align;
                    let direct = h.off % align == 0
                        && h.len % align == 0
                        && st.view.ptr(h.off, h.len, align).is_ok()
                        // SYNC: this host's lines of the block leave its
                        // caches before the drive writes it.
                        && st.co.flush(&st.view, h.off, h.len, Site("tier.promote.dma")).is_ok();
                    staged.push((r, staged.len(), loc, h, direct));
                }
                Err(CoreError::Exists) => there[r] = true,
                Err(e) => self.log(format_args!("no room in the region to put a block back: {e}")),
            }
        }
        let mut ops: Vec<crate::nvme::Op<'_>> = Vec::new();
        for &(_, i, loc, h, direct) in &staged {
            let dev = &self.devs[loc.dev];
            let align = dev.align as usize;
            let at = dev.at(loc.slot);
            let body = (loc.hdr.len as usize).div_ceil(align) * align;
            if direct {
                let region = st.view.ptr(h.off, h.len, 1).unwrap_or(std::ptr::null_mut());
                ops.push(crate::nvme::Op {
                    file: &dev.file,
                    offset: at,
                    buf: self.bufs[i].ptr,
                    len: align,
                    write: false,
                });
                ops.push(crate::nvme::Op {
                    file: &dev.file,
                    offset: at + align as u64,
                    buf: region,
                    len: body,
                    write: false,
                });
            } else {
                ops.push(crate::nvme::Op {
                    file: &dev.file,
                    offset: at,
                    buf: self.bufs[i].ptr,
                    len: align + body,
                    write: false,
                });
            }
        }
        let mut out: Vec<std::io::Result<usize>> = (0..ops.len()).map(|_| Ok(0)).collect();
        self.io.run(&ops, &mut out);
        drop(ops);
        let mut res = out.into_iter();
        for &(r, i, loc, h, direct) in &staged {
            let mut read = res.next().unwrap_or(Ok(0));
            if direct {
                let second = res.next().unwrap_or(Ok(0));
                if read.is_ok() {
                    read = second;
                }
            }
            let (align, len) = (self.devs[loc.dev].align as usize, loc.hdr.len as usize);
            let body: &[u8] = if direct {
                // SYNC: the drive's bytes, fresh in this host's cache.
                if st.co.invalidate(&st.view, h.off, h.len, Site("tier.promote.fresh")).is_err() {
                    read = Err(std::io::Error::other("region invalidate"));
                }
                let p = st.view.ptr(h.off, h.len, 1).unwrap_or(std::ptr::null_mut());
                if p.is_null() {
                    &[]
                } else {
                    // SAFETY: `p` names the block inside the mapping (checked
                    // by `ptr`); it is this node's reservation (WRITING: no
                    // other node reads or writes it), the drive's write to it
                    // completed, and it is only read here until published.
                    unsafe { std::slice::from_raw_parts(p, len) }
                }
            } else {
                &self.bufs[i].view()[align..align + len]
            };
            let hdr_ok = Header::read(&self.bufs[i].view()[..align]) == Some(loc.hdr);
            let ok = read.is_ok() && hdr_ok && payload_sum(body) == loc.hdr.sum;
            if !ok {
                let _ = core.abort(&h);
                let what = match read {
                    Err(e) => format!("read failed: {e}"),
                    Ok(_) => "header or checksum does not match".to_string(),
                };
                let path = self.devs[loc.dev].path.clone();
                self.log(format_args!("slot {} of {} unusable ({what}): a miss", loc.slot, path.display()));
                self.forget(dir, loc.hdr.ns, loc.hdr.key);
                self.counters.add(|c| c.misses += 1);
                continue;
            }
            let put = if direct { Ok(()) } else { core.write(&h, 0, body) };
            let put = put.and_then(|()| {
                let mut done = [Ok(())];
                core.publish_flushed(&[h], &mut done)?;
                done[0]
            });
            match put {
                Ok(()) => {
                    there[r] = true;
                    let io_len = (align + len.div_ceil(align) * align) as u64;
                    self.counters.add(|c| {
                        c.promotions += 1;
                        c.bytes_read += io_len;
                        c.direct_reads += direct as u64;
                    });
                }
                Err(e) => {
                    let _ = core.abort(&h);
                    self.log(format_args!("a block read back could not be published: {e}"));
                }
            }
        }
        there
    }

    /// Forgets a block whose slot failed (its record removed, its slot
    /// freed for reuse).
    fn forget(&mut self, dir: &mut cxlkv_core::tier::TierDir<'_, crate::Flush>, ns: u32, key: Key) {
        let _ = dir.remove(ns, key);
        if let Some(l) = self.index.remove(&(ns, key)) {
            self.free[l.dev].push(l.slot);
        }
        let held = self.index.len() as u64;
        self.counters.add(|c| c.held = held);
    }
}

/// Checks the slot files of this host's tier on `dirs` (slots holding
/// `slot_bytes`, as the tier was started with) against themselves and the
/// region: every slot header is readable (a slot torn by a crash fails its
/// checksums and is counted as free, not reported), no two slots claim one
/// key with the same write, and every block the region records for a live
/// tier of this host has a slot. Returns one line per finding.
pub fn check_slots(
    store: &cxlkv_core::store::Store<crate::Flush>,
    dirs: &[PathBuf],
    slot_bytes: u64,
) -> Result<Vec<String>> {
    let mut findings = Vec::new();
    let mut held: HashMap<(u32, Key), (u64, String)> = HashMap::new();
    for dir in dirs {
        let path = dir.join("cxlkv-tier.slots");
        let file = File::open(&path).map_err(|err| Error::Io { what: "open a slot file", err })?;
        let align = dio_align(&file).max(512);
        let stride = align + slot_bytes.div_ceil(align) * align;
        let len = file.metadata().map_err(|err| Error::Io { what: "stat a slot file", err })?.len();
        let mut unit = vec![0u8; HEADER_BYTES];
        for slot in 0..len / stride {
            let at = slot * stride;
            if file.read_exact_at(&mut unit, at).is_err() {
                findings.push(format!("{}: slot {slot} unreadable", path.display()));
                continue;
            }
            let Some(h) = Header::read(&unit) else { continue };
            if h.len > slot_bytes {
                findings.push(format!("{}: slot {slot} claims {} bytes, more than a slot", path.display(), h.len));
                continue;
            }
            let here = format!("{} slot {slot}", path.display());
            if let Some((seq, other)) = held.get(&(h.ns, h.key)) {
                if *seq == h.seq {
                    findings.push(format!("{here} and {other} claim one key with one write ({})", h.seq));
                }
                if *seq >= h.seq {
                    continue;
                }
            }
            held.insert((h.ns, h.key), (h.seq, here));
        }
    }
    let host = crate::host::host_id();
    for d in 0..store.layout.caps.tier_slots {
        let Some(owner) = store.tier_owner(d)? else { continue };
        let info: NodeInfo = store.fresh(store.layout.node_info(owner), Site("check.tier.owner"))?;
        if info.host_id != host {
            continue;
        }
        store.tier_records(d, |_, r| {
            let key = Key { lo: r.key_lo, hi: r.key_hi };
            if !held.contains_key(&(r.ns, key)) {
                findings.push(format!(
                    "directory {d} records block {:016x}{:016x} (ns {}) that no slot holds",
                    key.hi, key.lo, r.ns
                ));
            }
            Ok(())
        })?;
    }
    Ok(findings)
}

/// Keys one promote request carries at most.
const PROMOTE_KEYS: usize = 96;

impl Node {
    /// Asks the SSD tiers that hold blocks `keys` of namespace `ns` (found
    /// in the region's tier directories) to put them back into the region,
    /// one request per tier and up to 96 keys, all sent before any answer
    /// is awaited; `there[i]` is true when block `i` is in the region now.
    /// A dead or silent tier, or a slot failing its checks, is a miss.
    pub fn promote(&self, ns: u32, keys: &[Key], timeout: Duration) -> Result<Vec<bool>> {
        let mut there = vec![false; keys.len()];
        if keys.is_empty() || !self.store().tiers_active()? {
            return Ok(there);
        }
        let mut by_owner: HashMap<u32, Vec<usize>> = HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            if let Some(t) = self.store().tier_find(ns, *k)? {
                if t.owner != self.id() {
                    by_owner.entry(t.owner).or_default().push(i);
                }
            }
        }
        let cap = (self.store().layout.caps.inbox_slots as usize / 2).max(1) * cxlkv_core::layout::KEYS_PER_SLOT;
        for (owner, idx) in by_owner {
            for part in idx.chunks(PROMOTE_KEYS.min(cap)) {
                let ks: Vec<Key> = part.iter().map(|&i| keys[i]).collect();
                let msg = Message { kind: KIND_TIER_PROMOTE, ns, ..Message::default() };
                match self.call(owner, &msg, &ks, timeout) {
                    Ok((m, back)) if m.status == 0 => {
                        for &i in part {
                            there[i] = back.contains(&keys[i]);
                        }
                    }
                    Ok(_) | Err(Error::Core(CoreError::Timeout | CoreError::BadNode | CoreError::InboxFull)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(there)
    }
}
