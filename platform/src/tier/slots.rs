// Bytes from drives and the network are parsed here: no indexing, slicing or
// arithmetic that can panic, no unwrap (as in core; relaxed in tests).
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::arithmetic_side_effects, clippy::unwrap_used, clippy::expect_used)
)]
//! The tier's slots on its drives: slot files, their geometry, aligned
//! buffers, slot headers and checksums, and the blocks whole slot sets hold.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::*;

/// One drive's slot file.
pub(super) struct Dev {
    pub(super) file: File,
    pub(super) path: PathBuf,
    /// The drive's own I/O alignment (offsets, lengths, buffer addresses).
    pub(super) align: u64,
    /// Bytes from one slot to the next: a header unit, then a piece.
    pub(super) stride: u64,
    pub(super) slots: u32,
}

impl Dev {
    pub(super) fn open(dir: &Path) -> Result<Dev> {
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
    pub(super) fn fit(&mut self, g: Geometry, capacity: u64) -> Result<()> {
        self.stride = g.unit.saturating_add(g.piece_cap);
        self.slots = capacity.checked_div(self.stride).unwrap_or(0).min(u32::MAX as u64) as u32;
        if self.slots == 0 {
            return Err(CoreError::InvalidArgument.into());
        }
        let len = self.stride.saturating_mul(self.slots as u64);
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

    pub(super) fn at(&self, slot: u32) -> u64 {
        self.stride.saturating_mul(slot as u64)
    }
}

/// Blocks of at least this many bytes are striped over every drive.
pub const STRIPE_MIN: u64 = 1 << 20;

/// The shape of a tier's slots, the same on every drive.
#[derive(Clone, Copy, Debug)]
pub(super) struct Geometry {
    /// A slot's header unit, and the alignment of every piece: the largest
    /// I/O alignment of the drives.
    pub(super) unit: u64,
    /// Bytes of a slot's piece: an equal share of the largest block.
    pub(super) piece_cap: u64,
    pub(super) drives: usize,
}

impl Geometry {
    pub(super) fn new(aligns: &[u64], slot_bytes: u64) -> Geometry {
        let unit = aligns.iter().copied().max().unwrap_or(4096).max(512);
        let drives = aligns.len().max(1);
        let piece_cap = slot_bytes.div_ceil(drives as u64).div_ceil(unit).max(1).saturating_mul(unit);
        Geometry { unit, piece_cap, drives }
    }

    /// How a block of `len` bytes is cut: (pieces, bytes of each piece but
    /// the last). A block of at least [`STRIPE_MIN`] gets a piece on every
    /// drive, a smaller one as few as fit.
    pub(super) fn cut(&self, len: u64) -> (u16, u64) {
        let mut k = len.div_ceil(self.piece_cap).max(1);
        if len >= STRIPE_MIN {
            k = k.max(self.drives as u64);
        }
        let p = len.div_ceil(k).div_ceil(self.unit).max(1).saturating_mul(self.unit);
        (len.div_ceil(p).max(1) as u16, p)
    }

    /// Bytes of a buffer holding any block, every piece with its header.
    pub(super) fn buf_len(&self) -> usize {
        (self.drives as u64).saturating_mul(self.unit.saturating_add(self.piece_cap)) as usize
    }
}

/// Where one piece of a block lies: in the block, and in a tier buffer
/// (its header unit first, then its bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Piece {
    /// Its offset in the block.
    pub(super) at: u64,
    /// Its bytes.
    pub(super) len: usize,
    /// The offset of its header unit in a tier buffer.
    pub(super) buf_off: usize,
}

impl Piece {
    /// Its header unit in a tier buffer.
    pub(super) fn header(&self, unit: u64) -> std::ops::Range<usize> {
        self.buf_off..self.buf_off.saturating_add(unit as usize)
    }

    /// Its bytes in a tier buffer (after the header unit).
    pub(super) fn body(&self, unit: u64) -> std::ops::Range<usize> {
        let start = self.buf_off.saturating_add(unit as usize);
        start..start.saturating_add(self.len)
    }
}

/// Piece `j` of a block whose first header is `hdr`.
pub(super) fn piece(hdr: &Header, j: usize, unit: u64) -> Piece {
    let at = (j as u64).saturating_mul(hdr.plen);
    let len = hdr.len.saturating_sub(at).min(hdr.plen) as usize;
    Piece { at, len, buf_off: (j as u64).saturating_mul(unit.saturating_add(hdr.plen)) as usize }
}

pub(super) fn round_up(n: usize, unit: u64) -> usize {
    n.div_ceil(unit as usize).saturating_mul(unit as usize)
}

/// The I/O alignment of `file`: `statx`'s `STATX_DIOALIGN` when the kernel
/// reports it, else the file system's block size.
pub(super) fn dio_align(file: &File) -> u64 {
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
pub(super) struct Aligned {
    pub(super) ptr: *mut u8,
    pub(super) layout: std::alloc::Layout,
}

// SAFETY: the buffer is owned memory, used by one thread at a time.
unsafe impl Send for Aligned {}

impl Aligned {
    /// A zeroed buffer of `len` bytes aligned to `align`; `InvalidArgument`
    /// when the drives report an alignment that is no power of two.
    pub(super) fn new(len: usize, align: usize) -> Result<Aligned> {
        let layout = std::alloc::Layout::from_size_align(len.max(align).max(1), align)
            .map_err(|_| Error::Core(CoreError::InvalidArgument))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Ok(Aligned { ptr, layout })
    }

    pub(super) fn view(&self) -> &[u8] {
        // SAFETY: `ptr` is a live allocation of `layout.size()` bytes owned
        // by `self`; shared here while no mutable borrow exists.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }

    pub(super) fn bytes(&mut self) -> &mut [u8] {
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
pub(super) struct Header {
    /// The namespace id in the region the tier serves now (see
    /// `State::here`); on the drive, the id when the block was written.
    pub(super) ns: u32,
    /// A registered namespace's digest (zero for an application's own id):
    /// what the namespace is across formats of the region, where its id may
    /// name another namespace.
    pub(super) digest: [u8; 16],
    pub(super) tokens: u32,
    pub(super) key: Key,
    /// The block's bytes.
    pub(super) len: u64,
    pub(super) seq: u64,
    /// Checksum of this piece's bytes.
    pub(super) sum: u64,
    /// This piece, of `count`.
    pub(super) piece: u16,
    pub(super) count: u16,
    /// Bytes of each piece but the last (a multiple of 512).
    pub(super) plen: u64,
}

/// The slot format's magic: its first eight bytes ("CXLKVSL5": headers and
/// payloads checked by XXH3-64, namespaces by digest).
const MAGIC: u64 = u64::from_le_bytes(*b"CXLKVSL5");
/// Bytes of a slot header (the rest of its unit is zero).
pub(super) const HEADER_BYTES: usize = size_of::<SlotHeader>();

/// A slot header as it lies at the start of its slot: little-endian
/// whatever the host, checked by the XXH3-64 of the bytes before `hsum`.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
struct SlotHeader {
    magic: U64,
    ns: U32,
    tokens: U32,
    key_lo: U64,
    key_hi: U64,
    len: U64,
    seq: U64,
    sum: U64,
    piece: U16,
    count: U16,
    /// Bytes of each piece but the last, in units of 512.
    plen_units: U32,
    /// The namespace's digest (zero for an application's own id).
    ns_digest: [u8; 16],
    /// XXH3-64 of every field above.
    hsum: U64,
}

const _: () = assert!(size_of::<SlotHeader>() == 88);
const _: () = assert!(core::mem::offset_of!(SlotHeader, hsum) == HSUM_AT);

/// Where a slot header's checksum sits: it covers the bytes before it.
const HSUM_AT: usize = 80;

impl Header {
    pub(super) fn write(&self, out: &mut [u8]) {
        let mut h = SlotHeader {
            magic: MAGIC.into(),
            ns: self.ns.into(),
            tokens: self.tokens.into(),
            key_lo: self.key.lo.into(),
            key_hi: self.key.hi.into(),
            len: self.len.into(),
            seq: self.seq.into(),
            sum: self.sum.into(),
            piece: self.piece.into(),
            count: self.count.into(),
            plen_units: ((self.plen / 512).min(u32::MAX as u64) as u32).into(),
            ns_digest: self.digest,
            hsum: 0.into(),
        };
        h.hsum = payload_sum(h.as_bytes().get(..HSUM_AT).unwrap_or_default()).into();
        out.fill(0);
        if let Some(head) = out.get_mut(..HEADER_BYTES) {
            head.copy_from_slice(h.as_bytes());
        }
    }

    /// The header in `b`, when it is one (its checksum holds and its cut is
    /// consistent).
    pub(super) fn read(b: &[u8]) -> Option<Header> {
        let (s, _) = SlotHeader::read_from_prefix(b).ok()?;
        if s.magic.get() != MAGIC || s.hsum.get() != payload_sum(s.as_bytes().get(..HSUM_AT)?) {
            return None;
        }
        let h = Header {
            ns: s.ns.get(),
            digest: s.ns_digest,
            tokens: s.tokens.get(),
            key: Key { lo: s.key_lo.get(), hi: s.key_hi.get() },
            len: s.len.get(),
            seq: s.seq.get(),
            sum: s.sum.get(),
            piece: s.piece.get(),
            count: s.count.get(),
            plen: (s.plen_units.get() as u64).saturating_mul(512),
        };
        let whole = h.plen > 0 && h.len.div_ceil(h.plen).max(1) == h.count as u64;
        (whole && h.piece < h.count).then_some(h)
    }

    /// True when `read` (a header as the drive holds it) is this header: every
    /// field equal, except a registered namespace's id, for which the digest
    /// stands (the region may have given it another since).
    pub(super) fn matches(&self, read: &Header) -> bool {
        let ns = if self.digest != [0; 16] { self.ns } else { read.ns };
        *self == Header { ns, ..*read }
    }

    /// The header of piece `j` of the same write, with checksum `sum`.
    pub(super) fn of_piece(&self, j: usize, sum: u64) -> Header {
        Header { piece: j as u16, sum, ..*self }
    }
}

/// Checksum of a payload (and of a header's fields): XXH3-64.
pub(super) fn payload_sum(b: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(b)
}

/// Where the tier holds a block: its first piece's header, and each
/// piece's drive, slot and checksum.
#[derive(Clone, Debug)]
pub(super) struct Loc {
    pub(super) hdr: Header,
    pub(super) pieces: Vec<PieceAt>,
}

/// Where the tier wrote one piece of a block, and the checksum of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PieceAt {
    /// The drive.
    pub(super) dev: usize,
    /// The slot on it.
    pub(super) slot: u32,
    /// XXH3-64 of the piece's bytes.
    pub(super) sum: u64,
}

/// A slot: (drive, slot number).
pub(super) type Slot = (usize, u32);
/// A piece found in a slot: (drive, slot number, its header).
pub(super) type FoundPiece = (usize, u32, Header);
/// Pieces found in slots.
pub(super) type Found = Vec<FoundPiece>;
/// Blocks held, by (namespace, key).
pub(super) type Held = HashMap<(u32, Key), Loc>;

/// The blocks whole slot sets hold (for each key, the newest write whose
/// every piece is in a slot that verifies), and the pairs of slots that
/// claim one piece of one write.
pub(super) fn whole_blocks(found: &Found) -> (Held, Vec<(Slot, Slot)>) {
    let mut sets: HashMap<(u32, Key, u64), Vec<Option<FoundPiece>>> = HashMap::new();
    let mut twice = Vec::new();
    for &(d, slot, h) in found {
        let set = sets.entry((h.ns, h.key, h.seq)).or_insert_with(|| vec![None; h.count as usize]);
        match set.get(h.piece as usize) {
            Some(Some((d0, s0, _))) => twice.push(((*d0, *s0), (d, slot))),
            Some(None) if set.len() == h.count as usize => {
                if let Some(p) = set.get_mut(h.piece as usize) {
                    *p = Some((d, slot, h));
                }
            }
            _ => {}
        }
    }
    let mut held = Held::new();
    for ((ns, key, seq), set) in sets {
        let Some(pieces) = set.into_iter().collect::<Option<Vec<_>>>() else { continue };
        let Some(&(_, _, first)) = pieces.first() else { continue };
        let same = |h: &Header| h.len == first.len && h.tokens == first.tokens && h.plen == first.plen;
        if !pieces.iter().all(|(_, _, h)| same(h)) {
            continue;
        }
        if held.get(&(ns, key)).is_some_and(|l| l.hdr.seq > seq) {
            continue;
        }
        let loc = Loc {
            hdr: first,
            pieces: pieces.iter().map(|&(dev, slot, h)| PieceAt { dev, slot, sum: h.sum }).collect(),
        };
        held.insert((ns, key), loc);
    }
    (held, twice)
}

/// What a tier directory's file system is, as far as the tier cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FsKind {
    Tmpfs,
    Ramfs,
    Other,
}

/// The file system `dir` is on (`statfs`); `Other` when it cannot be told.
pub(super) fn fs_kind(dir: &Path) -> FsKind {
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
