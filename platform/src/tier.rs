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

const MAGIC: u64 = u64::from_le_bytes(*b"CXLKVSL3");
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
    /// Bytes registered with io_uring as fixed buffers: the region and the
    /// tier's buffers, the buffers alone, or none (memlock limit).
    pub registered_bytes: u64,
    /// Directories on memory-backed file systems (tmpfs): blocks "spilled"
    /// there take RAM, not a drive (warned at start).
    pub memory_dirs: u32,
    /// The tier thread runs at the highest best-effort I/O priority.
    pub io_priority: bool,
    /// The tier thread runs at a raised CPU priority (nice -5: needs
    /// CAP_SYS_NICE or a permissive RLIMIT_NICE).
    pub cpu_priority: bool,
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
    slot_stride: u64,
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
        let bad = |msg: String| Error::Io {
            what: "tier directories",
            err: std::io::Error::new(std::io::ErrorKind::InvalidInput, msg),
        };
        if opts.dirs.iter().any(|d| d.as_os_str().is_empty()) {
            return Err(bad("an empty directory name (name the drive's directory)".into()));
        }
        // What each directory is on: ramfs has no O_DIRECT (refused, said
        // so); tmpfs takes it, but its "drive" is RAM (warned, counted).
        let mut memory_dirs = 0u32;
        for d in &opts.dirs {
            std::fs::create_dir_all(d).map_err(|err| Error::Io { what: "create the tier directory", err })?;
            match fs_kind(d) {
                FsKind::Ramfs => {
                    return Err(bad(format!(
                        "{} is on ramfs (memory, no O_DIRECT): a tier directory must be on a drive",
                        d.display()
                    )))
                }
                FsKind::Tmpfs => {
                    eprintln!(
                        "cxlkv tier: {} is on tmpfs: blocks spilled there take RAM, not a drive (use a directory on an SSD)",
                        d.display()
                    );
                    memory_dirs += 1;
                }
                FsKind::Other => {}
            }
        }
        let mut devs = opts.dirs.iter().map(|d| Dev::open(d)).collect::<Result<Vec<_>>>()?;
        // One slot file per drive: two names of one directory (`D` and
        // `D/.`, a symlink, a bind mount) would share a slot file.
        let mut seen: Vec<(u64, u64, &Path)> = Vec::new();
        for (d, dev) in opts.dirs.iter().zip(&devs) {
            use std::os::unix::fs::MetadataExt;
            let m = dev.file.metadata().map_err(|err| Error::Io { what: "stat the slot file", err })?;
            if let Some((_, _, first)) = seen.iter().find(|(dv, ino, _)| *dv == m.dev() && *ino == m.ino()) {
                return Err(bad(format!(
                    "{} and {} are the same directory: one slot file each drive",
                    first.display(),
                    d.display()
                )));
            }
            seen.push((m.dev(), m.ino(), d.as_path()));
        }
        let geo = Geometry::new(&devs.iter().map(|d| d.align).collect::<Vec<_>>(), opts.slot_bytes);
        for d in &mut devs {
            d.fit(geo, opts.capacity)?;
        }
        let slot_stride = geo.unit + geo.piece_cap;
        let stop = Arc::new(Flag::new(false));
        let counters = Arc::new(Counters::default());
        counters.add(|c| c.memory_dirs = memory_dirs);
        let (cmd, rx) = mpsc::channel();
        let ready = Answer::new();
        let ready_tx = ready.clone();
        let (s, c) = (stop.clone(), counters.clone());
        let thread = std::thread::Builder::new()
            .name("cxlkv-tier".into())
            .spawn(move || run(node, opts, (devs, geo), s, c, rx, ready_tx))
            .map_err(|err| Error::Io { what: "spawn the tier thread", err })?;
        let mut tier = Tier { stop, counters, cmd, thread: Some(thread), slot_stride };
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

    /// Bytes from one slot to the next in each drive's slot file
    /// (`cxlkv-tier.slots`): a header unit, then a piece.
    pub fn slot_stride(&self) -> u64 {
        self.slot_stride
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
    /// The drive's own I/O alignment (offsets, lengths, buffer addresses).
    align: u64,
    /// Bytes from one slot to the next: a header unit, then a piece.
    stride: u64,
    slots: u32,
}

impl Dev {
    fn open(dir: &Path) -> Result<Dev> {
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
        Ok(Dev { file, path, align, stride: 0, slots: 0 })
    }

    /// Sizes the slot file for the tier's geometry: as many slots as
    /// `capacity` bytes hold, preallocated.
    fn fit(&mut self, g: Geometry, capacity: u64) -> Result<()> {
        self.stride = g.unit + g.piece_cap;
        self.slots = (capacity / self.stride).min(u32::MAX as u64) as u32;
        if self.slots == 0 {
            return Err(CoreError::InvalidArgument.into());
        }
        let len = self.stride * self.slots as u64;
        let io = |what: &'static str| move |err| Error::Io { what, err };
        if self.file.metadata().map_err(io("stat the slot file"))?.len() < len {
            use std::os::fd::AsRawFd;
            // SAFETY: `fallocate` on the open descriptor with in-range
            // arguments; it touches no memory of this process.
            let r = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, 0, len as libc::off_t) };
            if r != 0 {
                return Err(io("preallocate the slot file")(std::io::Error::last_os_error()));
            }
        }
        Ok(())
    }

    fn at(&self, slot: u32) -> u64 {
        self.stride * slot as u64
    }
}

/// Blocks of at least this many bytes are striped over every drive.
pub const STRIPE_MIN: u64 = 1 << 20;

/// The shape of a tier's slots, the same on every drive.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    /// A slot's header unit, and the alignment of every piece: the largest
    /// I/O alignment of the drives.
    unit: u64,
    /// Bytes of a slot's piece: an equal share of the largest block.
    piece_cap: u64,
    drives: usize,
}

impl Geometry {
    fn new(aligns: &[u64], slot_bytes: u64) -> Geometry {
        let unit = aligns.iter().copied().max().unwrap_or(4096).max(512);
        let drives = aligns.len().max(1);
        let piece_cap = slot_bytes.div_ceil(drives as u64).div_ceil(unit).max(1) * unit;
        Geometry { unit, piece_cap, drives }
    }

    /// How a block of `len` bytes is cut: (pieces, bytes of each piece but
    /// the last). A block of at least [`STRIPE_MIN`] gets a piece on every
    /// drive, a smaller one as few as fit.
    fn cut(&self, len: u64) -> (u16, u64) {
        let mut k = len.div_ceil(self.piece_cap).max(1);
        if len >= STRIPE_MIN {
            k = k.max(self.drives as u64);
        }
        let p = len.div_ceil(k).div_ceil(self.unit).max(1) * self.unit;
        (len.div_ceil(p).max(1) as u16, p)
    }

    /// Bytes of a buffer holding any block, every piece with its header.
    fn buf_len(&self) -> usize {
        (self.drives as u64 * (self.unit + self.piece_cap)) as usize
    }
}

/// Piece `j` of a block: its offset in the block, its bytes, and its
/// offset in a tier buffer (header unit first).
fn piece(hdr: &Header, j: usize, unit: u64) -> (u64, usize, usize) {
    let at = j as u64 * hdr.plen;
    let len = hdr.len.saturating_sub(at).min(hdr.plen) as usize;
    (at, len, (j as u64 * (unit + hdr.plen)) as usize)
}

fn round_up(n: usize, unit: u64) -> usize {
    n.div_ceil(unit as usize) * unit as usize
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

/// A slot's header: one piece of one write of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    ns: u32,
    tokens: u32,
    key: Key,
    /// The block's bytes.
    len: u64,
    seq: u64,
    /// Checksum of this piece's bytes.
    sum: u64,
    /// This piece, of `count`.
    piece: u16,
    count: u16,
    /// Bytes of each piece but the last (a multiple of 512).
    plen: u64,
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
            self.piece as u64 | (self.count as u64) << 16 | (self.plen / 512) << 32,
        ];
        for (c, f) in w.chunks_exact_mut(8).zip(fields) {
            c.copy_from_slice(&f.to_le_bytes());
        }
        let hsum = payload_sum(&w[..64]);
        w[64..72].copy_from_slice(&hsum.to_le_bytes());
        out.fill(0);
        out[..HEADER_BYTES].copy_from_slice(&w);
    }

    /// The header in `b`, when it is one (its checksum holds and its cut is
    /// consistent).
    fn read(b: &[u8]) -> Option<Header> {
        if b.len() < HEADER_BYTES {
            return None;
        }
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        if w(0) != MAGIC || w(8) != payload_sum(&b[..64]) {
            return None;
        }
        let h = Header {
            ns: w(1) as u32,
            tokens: (w(1) >> 32) as u32,
            key: Key { lo: w(2), hi: w(3) },
            len: w(4),
            seq: w(5),
            sum: w(6),
            piece: w(7) as u16,
            count: (w(7) >> 16) as u16,
            plen: (w(7) >> 32) * 512,
        };
        let whole = h.plen > 0 && h.len.div_ceil(h.plen).max(1) == h.count as u64;
        (whole && h.piece < h.count).then_some(h)
    }

    /// The header of piece `j` of the same write, with checksum `sum`.
    fn of_piece(&self, j: usize, sum: u64) -> Header {
        Header { piece: j as u16, sum, ..*self }
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

/// Where the tier holds a block: its first piece's header, and each
/// piece's drive, slot and checksum.
#[derive(Clone, Debug)]
struct Loc {
    hdr: Header,
    pieces: Vec<(usize, u32, u64)>,
}

/// A slot: (drive, slot number).
type Slot = (usize, u32);
/// A piece found in a slot: (drive, slot number, its header).
type FoundPiece = (usize, u32, Header);
/// Pieces found in slots.
type Found = Vec<FoundPiece>;
/// Blocks held, by (namespace, key).
type Held = HashMap<(u32, Key), Loc>;

/// The blocks whole slot sets hold (for each key, the newest write whose
/// every piece is in a slot that verifies), and the pairs of slots that
/// claim one piece of one write.
fn whole_blocks(found: &Found) -> (Held, Vec<(Slot, Slot)>) {
    let mut sets: HashMap<(u32, Key, u64), Vec<Option<FoundPiece>>> = HashMap::new();
    let mut twice = Vec::new();
    for &(d, slot, h) in found {
        let set = sets.entry((h.ns, h.key, h.seq)).or_insert_with(|| vec![None; h.count as usize]);
        match set.get(h.piece as usize) {
            Some(Some((d0, s0, _))) => twice.push(((*d0, *s0), (d, slot))),
            Some(None) if set.len() == h.count as usize => set[h.piece as usize] = Some((d, slot, h)),
            _ => {}
        }
    }
    let mut held = Held::new();
    for ((ns, key, seq), set) in sets {
        let Some(pieces) = set.into_iter().collect::<Option<Vec<_>>>() else { continue };
        let first = pieces[0].2;
        let same = |h: &Header| h.len == first.len && h.tokens == first.tokens && h.plen == first.plen;
        if !pieces.iter().all(|(_, _, h)| same(h)) {
            continue;
        }
        if held.get(&(ns, key)).is_some_and(|l| l.hdr.seq > seq) {
            continue;
        }
        let loc = Loc { hdr: first, pieces: pieces.iter().map(|&(d, s, h)| (d, s, h.sum)).collect() };
        held.insert((ns, key), loc);
    }
    (held, twice)
}

/// What a tier directory's file system is, as far as the tier cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FsKind {
    Tmpfs,
    Ramfs,
    Other,
}

/// The file system `dir` is on (`statfs`); `Other` when it cannot be told.
fn fs_kind(dir: &Path) -> FsKind {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return FsKind::Other };
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path; `statfs` fills `st`.
    if unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return FsKind::Other;
    }
    // `f_type`'s width differs between C libraries and architectures.
    #[allow(clippy::unnecessary_cast)]
    // SAFETY: zero-initialised, then filled by the successful `statfs`.
    let kind = unsafe { st.assume_init() }.f_type as i64;
    match kind {
        TMPFS_MAGIC => FsKind::Tmpfs,
        RAMFS_MAGIC => FsKind::Ramfs,
        _ => FsKind::Other,
    }
}

/// The tier thread's state.
struct State {
    devs: Vec<Dev>,
    geo: Geometry,
    index: HashMap<(u32, Key), Loc>,
    /// Free slots per drive.
    free: Vec<Vec<u32>>,
    /// Blocks in the order they were written (oldest first), to drop when
    /// the drives are full.
    order: std::collections::VecDeque<(u32, Key, u64)>,
    /// The region's blocks the tier keeps copies of when it cannot keep
    /// all: each stripe's coldest (as many as the drives hold, spread over
    /// the stripes), recomputed at each spill. `None`: keep anything
    /// (`spill_all`), dropping the oldest when full.
    window: Option<std::collections::HashSet<(u32, Key)>>,
    seq: u64,
    next_dev: usize,
    /// One buffer per block of a batch.
    bufs: Vec<Aligned>,
    io: crate::nvme::Io,
    counters: Arc<Counters>,
    slot_bytes: u64,
}

/// Counts an error and logs it.
fn log_error(counters: &Counters, what: std::fmt::Arguments<'_>) {
    counters.add(|c| c.errors += 1);
    eprintln!("cxlkv tier: {what}");
}

fn run(
    node: Arc<Node>,
    opts: TierOptions,
    (devs, geo): (Vec<Dev>, Geometry),
    stop: Arc<Flag>,
    counters: Arc<Counters>,
    cmd: mpsc::Receiver<Command>,
    ready: Arc<Answer<Result<()>>>,
) -> Result<()> {
    // What a tier thread needs to keep up on a busy host: the highest
    // best-effort I/O priority (any process may take it) and a raised CPU
    // priority (where allowed).
    let (io_priority, cpu_priority) = (crate::host::raise_io_priority(), crate::host::raise_cpu_priority());
    counters.add(|c| {
        c.io_priority = io_priority;
        c.cpu_priority = cpu_priority;
    });
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
    let mut s = State {
        free: devs.iter().map(|d| (0..d.slots).rev().collect()).collect(),
        devs,
        geo,
        index: HashMap::new(),
        order: Default::default(),
        window: None,
        seq: 0,
        next_dev: 0,
        bufs: (0..opts.batch.clamp(1, crate::nvme::QUEUE_DEPTH as usize))
            .map(|_| Aligned::new(geo.buf_len(), geo.unit as usize))
            .collect(),
        io: crate::nvme::Io::new(&[]),
        counters: counters.clone(),
        slot_bytes: opts.slot_bytes,
    };
    // The tier's buffers and the region (which drives read straight into)
    // registered when the memlock limit allows; else the buffers alone;
    // else nothing. The mapping outlives the engine: `node` is held until
    // this thread ends, after `s`.
    let bufs: Vec<(*mut u8, usize)> = s.bufs.iter().map(|b| (b.ptr, b.layout.size())).collect();
    let mut all = bufs.clone();
    all.push((st.view.base(), st.view.len() as usize));
    if !s.io.register(&all) {
        s.io.register(&bufs);
    }
    let registered = s.io.registered();
    counters.add(|c| {
        c.engine = Some(s.io.engine());
        c.registered_bytes = registered;
    });
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
        log_error(&self.counters, what);
    }

    /// Reads every slot header and records the blocks whole slot sets hold.
    fn rebuild(&mut self, dir: &mut cxlkv_core::tier::TierDir<'_, crate::Flush>) {
        let unit = self.geo.unit as usize;
        let mut found: Found = Vec::new();
        for d in 0..self.devs.len() {
            for slot in 0..self.devs[d].slots {
                let buf = self.bufs[0].bytes();
                let r = self.devs[d].file.read_exact_at(&mut buf[..unit], self.devs[d].at(slot));
                let Some(hdr) = r.ok().and_then(|_| Header::read(&buf[..unit])) else { continue };
                if hdr.len <= self.slot_bytes && hdr.plen <= self.geo.piece_cap {
                    found.push((d, slot, hdr));
                }
            }
        }
        let (index, _) = whole_blocks(&found);
        self.seq = found.iter().map(|(_, _, h)| h.seq).max().unwrap_or(0);
        let mut held: Vec<((u32, Key), Loc)> = index.into_iter().collect();
        held.sort_by_key(|(_, l)| l.hdr.seq);
        for (k, l) in held {
            // A full directory: the block is dropped and its slots reused.
            if dir.put(l.hdr.ns, l.hdr.key, l.hdr.len).is_ok() {
                self.order.push_back((l.hdr.ns, l.hdr.key, l.hdr.seq));
                self.index.insert(k, l);
            }
        }
        let mut taken: Vec<Vec<bool>> = self.devs.iter().map(|d| vec![false; d.slots as usize]).collect();
        for l in self.index.values() {
            for &(d, slot, _) in &l.pieces {
                taken[d][slot as usize] = true;
            }
        }
        for (d, t) in taken.iter().enumerate() {
            self.free[d] = (0..self.devs[d].slots).rev().filter(|&i| !t[i as usize]).collect();
        }
        let held = self.index.len() as u64;
        self.counters.add(|c| c.held = held);
    }

    /// Copies up to `max` of the region's oldest blocks the tier does not
    /// hold to the drives, a batch at a time; returns how many.
    ///
    /// The policy when the drives cannot hold every block (`max` below
    /// `usize::MAX`): the tier keeps the region's coldest blocks — each
    /// stripe's coldest, as many as the drives hold spread over the stripes
    /// (the window) — and copies only window blocks it does not hold. To
    /// make room it drops, oldest first, a held block outside the window
    /// (one warmed up since it was copied, or one the region no longer
    /// holds); when every held block is in the window it copies nothing
    /// more. A dropped block is outside the window, so it is copied again
    /// only once it is among the coldest again: an idle region is copied
    /// once, never rewritten, and the tier writes what leaves the region's
    /// cold end, not more. `spill_all` copies every block, dropping the
    /// oldest held when full.
    fn spill(&mut self, node: &Node, dir: &mut cxlkv_core::tier::TierDir<'_, crate::Flush>, max: usize) -> Result<u64> {
        let core = node.core();
        let stripes = node.store().layout.caps.n_stripes;
        let all = max == usize::MAX;
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
                        todo.push((ns, k, len));
                    }
                }
                if got < cold.len() || !all {
                    break;
                }
                skip = got;
            }
        }
        self.window = None;
        let free = self.free.iter().map(Vec::len).sum::<usize>();
        let need: usize = todo.iter().map(|&(_, _, len)| self.geo.cut(len).0 as usize).sum();
        if !all && !todo.is_empty() && (free < need || dir.live() >= dir.capacity() / 2) {
            // Room must be made: only for window blocks, and only by
            // dropping blocks outside it (see above).
            let room = self.devs.iter().map(|d| d.slots as usize).sum::<usize>() / self.devs.len().max(1);
            let per_stripe = room.min(dir.capacity() as usize / 2).div_ceil(stripes.max(1) as usize).max(1);
            let mut window = std::collections::HashSet::new();
            for s in 0..stripes {
                cold.resize(per_stripe, (0u32, Key::default(), 0u64));
                let got = core.coldest(s, &mut cold)?;
                window.extend(cold[..got].iter().map(|&(ns, k, _)| (ns, k)));
            }
            todo.retain(|&(ns, k, _)| window.contains(&(ns, k)));
            self.window = Some(window);
        }
        let mut n = 0;
        for batch in todo.chunks(self.bufs.len()) {
            n += self.spill_batch(node, dir, batch);
        }
        Ok(n)
    }

    /// Copies one batch of blocks out. Slots are taken first; then each
    /// block, pinned, is copied into its buffer piece by piece and its
    /// writes start at once, while the next block is copied; one sync per
    /// drive once all completed, and only then are the blocks recorded.
    fn spill_batch(
        &mut self,
        node: &Node,
        dir: &mut cxlkv_core::tier::TierDir<'_, crate::Flush>,
        batch: &[(u32, Key, u64)],
    ) -> u64 {
        let core = node.core();
        let mut plans: Vec<(u32, Key, u64, Vec<Slot>)> = Vec::new();
        for &(ns, key, len) in batch {
            let (count, _) = self.geo.cut(len);
            let Some(slots) = self.take_slots(dir, count as usize) else { break };
            plans.push((ns, key, len, slots));
        }
        let State { devs, geo, bufs, io, counters, seq, .. } = self;
        let unit = geo.unit;
        // Per plan: the write's first header, its pieces (with checksums),
        // its I/O bytes, and whether every one of its writes succeeded so
        // far.
        type Made = (Header, Vec<(usize, u32, u64)>, u64, bool);
        let mut made: Vec<Option<Made>> = vec![None; plans.len()];
        let mut op_of: Vec<usize> = Vec::new();
        let mut b = io.batch();
        for (i, (ns, key, len, slots)) in plans.iter().enumerate() {
            let mut h = [Err(CoreError::InvalidArgument)];
            let Ok(hd) = core.acquire(*ns, &[*key], &mut h).and(h[0]) else { continue };
            let (count, plen) = geo.cut(hd.len);
            if hd.len != *len || count as usize != slots.len() {
                // Stored again with another length since it was chosen.
                let _ = core.release(&[hd]);
                continue;
            }
            *seq += 1;
            let hdr =
                Header { ns: *ns, tokens: hd.tokens, key: *key, len: hd.len, seq: *seq, sum: 0, piece: 0, count, plen };
            let buf = bufs[i].bytes();
            let mut pieces = Vec::with_capacity(slots.len());
            let mut read = Ok(());
            for (j, &(d, slot)) in slots.iter().enumerate() {
                let (at, l, o) = piece(&hdr, j, unit);
                let body = &mut buf[o + unit as usize..o + unit as usize + round_up(l, unit)];
                body[l..].fill(0);
                // The copy reads the payload fresh (it invalidates this
                // host's lines first), under the pin.
                read = read.and(core.read(&hd, at, &mut body[..l]));
                pieces.push((d, slot, payload_sum(&body[..l])));
            }
            let _ = core.release(&[hd]);
            if let Err(e) = read {
                log_error(counters, format_args!("copy of a block out of the region failed: {e}"));
                continue;
            }
            for (j, &(_, _, sum)) in pieces.iter().enumerate() {
                let (_, _, o) = piece(&hdr, j, unit);
                hdr.of_piece(j, sum).write(&mut buf[o..o + unit as usize]);
            }
            let mut io_bytes = 0;
            for (j, &(d, slot, _)) in pieces.iter().enumerate() {
                let (_, l, o) = piece(&hdr, j, unit);
                let n = unit as usize + round_up(l, unit);
                io_bytes += n as u64;
                let op = crate::nvme::Op {
                    file: &devs[d].file,
                    offset: devs[d].at(slot),
                    // Inside buffer `i` (`o + n` is at most its length).
                    buf: bufs[i].ptr.wrapping_add(o),
                    len: n,
                    write: true,
                };
                let k = b.push(op);
                op_of.resize(k + 1, usize::MAX);
                op_of[k] = i;
            }
            made[i] = Some((hdr, pieces, io_bytes, true));
        }
        while let Some((k, r)) = b.wait_one() {
            let i = op_of.get(k).copied().unwrap_or(usize::MAX);
            if let (Err(e), Some(Some(m))) = (r, made.get_mut(i)) {
                if m.3 {
                    let (d, _) = plans[i].3[0];
                    log_error(counters, format_args!("write of a block to {} failed: {e}", devs[d].path.display()));
                }
                m.3 = false;
            }
        }
        drop(b);
        // The slots are durable on the drives before the rack learns of
        // them (O_DIRECT bypasses the page cache; fdatasync flushes the
        // drive's own cache).
        let mut synced: Vec<Option<bool>> = vec![None; self.devs.len()];
        let mut n = 0;
        for (plan, m) in plans.iter().zip(made) {
            let ok = match &m {
                Some((_, pieces, _, true)) => pieces
                    .iter()
                    .all(|&(d, _, _)| *synced[d].get_or_insert_with(|| self.devs[d].file.sync_data().is_ok())),
                _ => false,
            };
            let Some((hdr, pieces, io_bytes, _)) = m.filter(|_| ok) else {
                for &(d, slot) in &plan.3 {
                    self.free[d].push(slot);
                }
                continue;
            };
            if dir.put(hdr.ns, hdr.key, hdr.len).is_err() {
                for &(d, slot, _) in &pieces {
                    self.free[d].push(slot);
                }
                continue;
            }
            self.index.insert((hdr.ns, hdr.key), Loc { hdr, pieces });
            self.order.push_back((hdr.ns, hdr.key, hdr.seq));
            n += 1;
            let held = self.index.len() as u64;
            self.counters.add(|c| {
                c.spills += 1;
                c.held = held;
                c.bytes_written += io_bytes;
            });
        }
        if synced.contains(&Some(false)) {
            self.log(format_args!("a drive failed to sync: its blocks of this batch were not recorded"));
        }
        n
    }

    /// `count` free slots, on the drives in turn (so a striped block's
    /// pieces land on different drives); when too few are free (or the
    /// directory is full), the oldest blocks held are dropped first.
    fn take_slots(&mut self, dir: &mut cxlkv_core::tier::TierDir<'_, crate::Flush>, count: usize) -> Option<Vec<Slot>> {
        loop {
            let full = dir.live() >= dir.capacity() / 2;
            if !full && self.free.iter().map(Vec::len).sum::<usize>() >= count {
                let n = self.devs.len();
                let mut got = Vec::with_capacity(count);
                let mut d = self.next_dev;
                while got.len() < count {
                    if let Some(slot) = self.free[d % n].pop() {
                        got.push((d % n, slot));
                    }
                    d += 1;
                }
                self.next_dev = d % n;
                return Some(got);
            }
            // Drop the oldest block held (outside the window, when there
            // is one: see `spill`); none such, no room.
            let victim = self.order.iter().position(|&(ns, key, seq)| {
                self.index.get(&(ns, key)).is_some_and(|l| l.hdr.seq == seq)
                    && self.window.as_ref().is_none_or(|w| !w.contains(&(ns, key)))
            })?;
            // Entries before it are stale (dropped or rewritten since) or in
            // the window: the stale ones go, the others keep their place.
            let mut kept = std::collections::VecDeque::with_capacity(victim);
            for _ in 0..victim {
                if let Some((ns, key, seq)) = self.order.pop_front() {
                    if self.index.get(&(ns, key)).is_some_and(|l| l.hdr.seq == seq) {
                        kept.push_back((ns, key, seq));
                    }
                }
            }
            if let Some((ns, key, _)) = self.order.pop_front() {
                self.forget(dir, ns, key);
            }
            while let Some(e) = kept.pop_back() {
                self.order.push_front(e);
            }
        }
    }

    /// Reads the blocks asked for back into the region. Each block is
    /// reserved and its reads start at once, while the next is reserved;
    /// where its payload is aligned for the drives, they read straight into
    /// it (this host's lines of it flushed first, so none lands later over
    /// what the drive wrote), else into the tier's buffer, copied in after.
    /// Each block is checked and published as soon as its reads completed
    /// (while the others' are in flight): only when every piece's header and
    /// checksum verify; aborted otherwise. `there[i]`: block `i` is in the
    /// region now.
    fn promote_batch(
        &mut self,
        node: &Node,
        dir: &mut cxlkv_core::tier::TierDir<'_, crate::Flush>,
        asks: &[(u32, Key)],
    ) -> Vec<bool> {
        let core = node.core();
        let st = node.store();
        let mut there = vec![false; asks.len()];
        let mut bad: Vec<(u32, Key)> = Vec::new();
        let State { devs, geo, bufs, io, counters, index, .. } = self;
        let unit = geo.unit;
        struct Staged {
            r: usize,
            loc: Loc,
            h: cxlkv_core::index::Handle,
            direct: bool,
            left: usize,
            failed: Option<std::io::Error>,
            io_bytes: u64,
        }
        let mut staged: Vec<Staged> = Vec::new();
        let mut op_of: Vec<usize> = Vec::new();
        let mut b = io.batch();
        for (r, (ns, key)) in asks.iter().enumerate() {
            let Some(loc) = index.get(&(*ns, *key)).cloned() else {
                counters.add(|c| c.misses += 1);
                continue;
            };
            let item = ReserveItem { key: loc.hdr.key, len: loc.hdr.len, tokens: loc.hdr.tokens };
            let mut h = [Err(CoreError::InvalidArgument)];
            let h = match core.reserve_batch(*ns, &[item], &mut h).and(h[0]) {
                Ok(h) => h,
                Err(CoreError::Exists) => {
                    there[r] = true;
                    continue;
                }
                Err(e) => {
                    log_error(counters, format_args!("no room in the region to put a block back: {e}"));
                    continue;
                }
            };
            let direct = h.off % unit == 0
                && h.len % unit == 0
                && st.view.ptr(h.off, h.len, unit).is_ok()
                // SYNC: this host's lines of the block leave its caches
                // before the drives write it.
                && st.co.flush(&st.view, h.off, h.len, Site("tier.promote.dma")).is_ok();
            let i = staged.len();
            let mut s = Staged { r, loc, h, direct, left: 0, failed: None, io_bytes: 0 };
            for (j, &(d, slot, _)) in s.loc.pieces.iter().enumerate() {
                let (at, l, o) = piece(&s.loc.hdr, j, unit);
                let (dev, body) = (&devs[d], round_up(l, unit));
                // Inside buffer `i` (`o` plus a piece and its header is at
                // most its length).
                let hbuf = bufs[i].ptr.wrapping_add(o);
                let mut ops = Vec::with_capacity(2);
                if direct {
                    // Inside the reservation: checked by `ptr` above.
                    let region = st.view.base().wrapping_add((h.off + at) as usize);
                    ops.push(crate::nvme::Op {
                        file: &dev.file,
                        offset: dev.at(slot),
                        buf: hbuf,
                        len: unit as usize,
                        write: false,
                    });
                    ops.push(crate::nvme::Op {
                        file: &dev.file,
                        offset: dev.at(slot) + unit,
                        buf: region,
                        len: body,
                        write: false,
                    });
                } else {
                    ops.push(crate::nvme::Op {
                        file: &dev.file,
                        offset: dev.at(slot),
                        buf: hbuf,
                        len: unit as usize + body,
                        write: false,
                    });
                }
                for op in ops {
                    s.io_bytes += op.len as u64;
                    s.left += 1;
                    let k = b.push(op);
                    op_of.resize(k + 1, usize::MAX);
                    op_of[k] = i;
                }
            }
            staged.push(s);
        }
        while let Some((k, res)) = b.wait_one() {
            let Some(s) = op_of.get(k).and_then(|&i| staged.get_mut(i)) else { continue };
            s.left -= 1;
            if let Err(e) = res {
                s.failed.get_or_insert(e);
            }
            if s.left > 0 {
                continue;
            }
            let (h, hdr) = (s.h, s.loc.hdr);
            if s.direct && s.failed.is_none() {
                // SYNC: the drive's bytes, fresh in this host's cache.
                if let Err(e) = st.co.invalidate(&st.view, h.off, h.len, Site("tier.promote.fresh")) {
                    s.failed = Some(std::io::Error::other(format!("region invalidate: {e}")));
                }
            }
            let i = op_of[k];
            let buf = bufs[i].view();
            let mut verified = s.failed.is_none();
            for (j, &(_, _, sum)) in s.loc.pieces.iter().enumerate() {
                if !verified {
                    break;
                }
                let (at, l, o) = piece(&hdr, j, unit);
                let body: &[u8] = if s.direct {
                    match st.view.ptr(h.off + at, l as u64, 1) {
                        Ok(p) => {
                            // `p` names `l` bytes inside the mapping (checked by
                            // `ptr`) of this node's reservation (WRITING: no
                            // other node reads or writes it); the drive's write
                            // to it completed, and it is only read until published.
                            // SAFETY: in bounds, unshared and complete, as above.
                            unsafe { std::slice::from_raw_parts(p, l) }
                        }
                        Err(_) => &[],
                    }
                } else {
                    &buf[o + unit as usize..o + unit as usize + l]
                };
                verified = Header::read(&buf[o..o + unit as usize]) == Some(hdr.of_piece(j, sum))
                    && body.len() == l
                    && payload_sum(body) == sum;
            }
            if !verified {
                let _ = core.abort(&h);
                let what = match &s.failed {
                    Some(e) => format!("read failed: {e}"),
                    None => "a header or checksum does not match".to_string(),
                };
                let (d, slot, _) = s.loc.pieces[0];
                log_error(
                    counters,
                    format_args!("block in slot {slot} of {} unusable ({what}): a miss", devs[d].path.display()),
                );
                bad.push((hdr.ns, hdr.key));
                counters.add(|c| c.misses += 1);
                continue;
            }
            let mut put = Ok(());
            if !s.direct {
                for j in 0..s.loc.pieces.len() {
                    let (at, l, o) = piece(&hdr, j, unit);
                    put = put.and_then(|()| core.write(&h, at, &buf[o + unit as usize..o + unit as usize + l]));
                }
            }
            let put = put.and_then(|()| {
                let mut done = [Ok(())];
                core.publish_flushed(&[h], &mut done)?;
                done[0]
            });
            match put {
                Ok(()) => {
                    there[s.r] = true;
                    let (io_bytes, direct) = (s.io_bytes, s.direct);
                    counters.add(|c| {
                        c.promotions += 1;
                        c.bytes_read += io_bytes;
                        c.direct_reads += direct as u64;
                    });
                }
                Err(e) => {
                    let _ = core.abort(&h);
                    log_error(counters, format_args!("a block read back could not be published: {e}"));
                }
            }
        }
        drop(b);
        for (ns, key) in bad {
            self.forget(dir, ns, key);
        }
        there
    }

    /// Forgets a block (its record removed, its slots freed for reuse).
    fn forget(&mut self, dir: &mut cxlkv_core::tier::TierDir<'_, crate::Flush>, ns: u32, key: Key) {
        let _ = dir.remove(ns, key);
        if let Some(l) = self.index.remove(&(ns, key)) {
            for (d, slot, _) in l.pieces {
                self.free[d].push(slot);
            }
        }
        let held = self.index.len() as u64;
        self.counters.add(|c| c.held = held);
    }
}

/// Checks the slot files of this host's tier on `dirs` (the tier's
/// directories in the order it was started with, slots holding
/// `slot_bytes`) against themselves and the region: every slot is readable,
/// every written slot's payload matches its header's checksum (every byte
/// is read: damage or a write torn by a crash shows; a slot whose header
/// fails its own checksum is free), no two slots claim one piece of one
/// write, and every block the region records for a live tier of this host
/// has a whole set of slots. Returns one line per finding.
pub fn check_slots(
    store: &cxlkv_core::store::Store<crate::Flush>,
    dirs: &[PathBuf],
    slot_bytes: u64,
) -> Result<Vec<String>> {
    let mut findings = Vec::new();
    let mut files = Vec::new();
    for dir in dirs {
        let path = dir.join("cxlkv-tier.slots");
        let file = File::open(&path).map_err(|err| Error::Io { what: "open a slot file", err })?;
        let align = dio_align(&file).max(512);
        files.push((path, file, align));
    }
    let geo = Geometry::new(&files.iter().map(|f| f.2).collect::<Vec<_>>(), slot_bytes);
    let stride = geo.unit + geo.piece_cap;
    let mut found: Found = Vec::new();
    let mut unit = vec![0u8; HEADER_BYTES];
    let mut body = Vec::new();
    for (d, (path, file, _)) in files.iter().enumerate() {
        let len = file.metadata().map_err(|err| Error::Io { what: "stat a slot file", err })?.len();
        for slot in 0..(len / stride).min(u32::MAX as u64) as u32 {
            if file.read_exact_at(&mut unit, slot as u64 * stride).is_err() {
                findings.push(format!("{}: slot {slot} unreadable", path.display()));
                continue;
            }
            let Some(h) = Header::read(&unit) else { continue };
            if h.len > slot_bytes || h.plen > geo.piece_cap {
                findings.push(format!("{}: slot {slot} claims {} bytes, more than a slot", path.display(), h.len));
                continue;
            }
            // The payload too: a header that verifies says nothing of the
            // bytes after it.
            let (_, l, _) = piece(&h, h.piece as usize, geo.unit);
            body.resize(l, 0);
            let at = slot as u64 * stride + geo.unit;
            if file.read_exact_at(&mut body, at).is_err() || payload_sum(&body) != h.sum {
                findings.push(format!(
                    "{}: slot {slot}: piece {} of block {:016x}{:016x} (ns {}) fails its checksum",
                    path.display(),
                    h.piece,
                    h.key.hi,
                    h.key.lo,
                    h.ns
                ));
                continue;
            }
            found.push((d, slot, h));
        }
    }
    let (held, twice) = whole_blocks(&found);
    for ((d0, s0), (d1, s1)) in twice {
        findings.push(format!(
            "{} slot {s0} and {} slot {s1} claim one piece of one write",
            files[d0].0.display(),
            files[d1].0.display()
        ));
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
                    "directory {d} records block {:016x}{:016x} (ns {}) that no whole set of slots holds",
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

/// The round trips of a node's last answered promotions: what the adaptive
/// promotion wait follows ([`Options::promote_wait`](crate::Options)).
#[derive(Debug, Default)]
pub(crate) struct RoundTrips {
    last: [Duration; 8],
    next: usize,
}

impl RoundTrips {
    /// The shortest wait; also the wait before any promotion was answered.
    pub(crate) const FLOOR: Duration = Duration::from_secs(1);
    /// The longest wait the adaptive rule picks.
    pub(crate) const CEILING: Duration = Duration::from_secs(10);

    fn record(&mut self, took: Duration) {
        let i = self.next % self.last.len();
        self.last[i] = took;
        self.next = self.next.wrapping_add(1);
    }

    /// Four times the slowest recorded round trip, within the floor and
    /// the ceiling.
    pub(crate) fn wait(&self) -> Duration {
        let slowest = self.last.iter().max().copied().unwrap_or_default();
        slowest.saturating_mul(4).clamp(Self::FLOOR, Self::CEILING)
    }
}

impl Node {
    /// How long the next promotion waits for its answers: the option when
    /// set, else four times the slowest of the last answered ones (at least
    /// a second, at most ten).
    pub fn promote_wait(&self) -> Duration {
        self.options().promote_wait.unwrap_or_else(|| self.promotions().wait())
    }

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
                let asked = Instant::now();
                match self.call(owner, &msg, &ks, timeout) {
                    Ok((m, back)) if m.status == 0 => {
                        self.promotions().record(asked.elapsed());
                        for &i in part {
                            there[i] = back.contains(&keys[i]);
                        }
                    }
                    Err(Error::Core(CoreError::Timeout)) => {
                        // Counted, and the next waits follow: a late answer
                        // is dropped, but a tier this slow is measured by
                        // the wait that ran out.
                        self.promotions().record(timeout);
                        self.core().count_tier_timeouts(part.len() as u64)?;
                    }
                    Ok(_) | Err(Error::Core(CoreError::BadNode | CoreError::InboxFull)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(there)
    }
}
