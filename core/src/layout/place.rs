//! Where each area of a region lies, computed from its capacities.

use core::mem::size_of;

use zerocopy::IntoBytes;

use crate::mem::LINE;
use crate::off::Area;
use crate::{Error, Result};

use super::caps::Capacities;
use super::lines::{
    Bucket, Header, MsgHeader, MsgKeys, PinRecord, TierRecord, EXPIRY_SLOTS, FORMAT_VERSION, LAYOUT_FINGERPRINT, MAGIC,
    MAX_GRANULES, MIN_GRANULE, NODE_LINES,
};

/// Lock ids, in lock order (a node only takes a lock with a higher id than
/// any it holds).
#[derive(Clone, Copy, Debug)]
pub struct LockIds {
    n_stripes: u32,
    max_tenants: u32,
    max_nodes: u32,
}

impl LockIds {
    /// Lock of index stripe `s`.
    pub fn stripe(&self, s: u32) -> u32 {
        s
    }
    /// Lock of the named-root table.
    pub fn roots(&self) -> u32 {
        self.n_stripes
    }
    /// Lock of tenant slot `t`: after the stripes (a stripe's holder takes
    /// it for the tenant's usage) and the roots (a tenant is added under
    /// both), before the heaps.
    pub fn tenant(&self, t: u32) -> u32 {
        self.n_stripes.wrapping_add(1).wrapping_add(t)
    }
    /// Lock of node `n`'s heap.
    pub fn heap(&self, n: u32) -> u32 {
        self.tenant(self.max_tenants).wrapping_add(n)
    }
    /// Lock of the global chunk bitmap.
    pub fn alloc(&self) -> u32 {
        self.heap(self.max_nodes)
    }
    /// Number of locks core itself uses; application lock `i` has id
    /// `n_core() + i`, after every one of them. Recovery takes exactly these.
    pub fn n_core(&self) -> u32 {
        self.alloc().wrapping_add(1)
    }
    /// Id of application lock `i`.
    pub fn app(&self, i: u32) -> u32 {
        self.n_core().wrapping_add(i)
    }
}

/// Where every area lies; computed from capacities and region size, and
/// recomputed on attach to validate the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Capacities.
    pub caps: Capacities,
    /// View size in bytes.
    pub region_size: u64,
    /// Buckets per stripe.
    pub buckets_per_stripe: u32,
    /// Global locks.
    pub n_locks: u32,
    /// Payload chunks.
    pub n_chunks: u32,
    /// Node table.
    pub nodes: Area,
    /// Manager line.
    pub manager: Area,
    /// Lock table: per lock, one `LockLine` then `max_nodes` slots.
    pub locks: Area,
    /// Root table.
    pub roots: Area,
    /// Chunk bitmap.
    pub chunk_bitmap: Area,
    /// Chunk records.
    pub chunks: Area,
    /// Stripe headers.
    pub stripes: Area,
    /// Buckets.
    pub buckets: Area,
    /// Entries.
    pub entries: Area,
    /// Pin journals.
    pub journals: Area,
    /// Inbox rings: per node, its head line then its slots.
    pub inboxes: Area,
    /// Tier directories: per directory, its head line then its records.
    pub tiers: Area,
    /// Every stripe's change log.
    pub changes: Area,
    /// Tenant slots: per slot, a `TenantConfig` then a `TenantUsage`.
    pub tenants: Area,
    /// Expiry stamps: per stripe, its entries' `ExpiryLine`s.
    pub expiry: Area,
    /// Payload chunks.
    pub payload: Area,
}

/// Offset `base + index * stride`: every layout offset is one, of values the
/// layout validated, far below `u64::MAX` (and every access through the
/// region's view is bounds-checked anyway).
#[inline]
const fn at(base: u64, index: u64, stride: u64) -> u64 {
    base.wrapping_add(index.wrapping_mul(stride))
}

const fn align_up(v: u64, a: u64) -> u64 {
    v.wrapping_add(a).wrapping_sub(1) & !a.wrapping_sub(1)
}

/// Expiry lines of a stripe of `eps` entries.
const fn expiry_lines(eps: u32) -> u64 {
    (eps as u64).div_ceil(EXPIRY_SLOTS as u64)
}

/// Lines of one inbox slot: a `MsgHeader` and a `MsgKeys`.
pub const SLOT_LINES: u64 = 4;
/// Keys one inbox slot carries.
pub const KEYS_PER_SLOT: usize = 12;
static_assertions::const_assert_eq!(
    size_of::<MsgHeader>().wrapping_add(size_of::<MsgKeys>()),
    (SLOT_LINES * LINE) as usize
);
static_assertions::const_assert_eq!(size_of::<MsgKeys>(), KEYS_PER_SLOT * 16);

/// Payload alignment: pages, so payload can be registered with devices and
/// read with O_DIRECT.
pub const PAYLOAD_ALIGN: u64 = 4096;
/// Bytes of the header area.
pub const HEADER_AREA: u64 = 4096;

impl Layout {
    /// Lays out a region of `region_size` bytes with `caps`.
    pub fn compute(caps: Capacities, region_size: u64) -> Result<Layout> {
        caps.validate()?;
        let n = caps.max_nodes as u64;
        let s = caps.n_stripes as u64;
        let eps = caps.entries_per_stripe as u64;
        let bps = caps.buckets_per_stripe() as u64;
        let n_locks = caps.n_locks() as u64;
        let chunk = 1u64 << caps.chunk_shift;

        let mut at = HEADER_AREA;
        fn area(at: &mut u64, len: u64) -> Area {
            let start = *at;
            // Validated capacities keep every area far below u64::MAX.
            *at = align_up(start.wrapping_add(len), LINE);
            Area { start, end: start.wrapping_add(len) }
        }
        let mul = |a: u64, b: u64| a.saturating_mul(b);
        let nodes = area(&mut at, mul(n, NODE_LINES * LINE));
        let manager = area(&mut at, LINE);
        let locks = area(&mut at, mul(mul(n_locks, n.saturating_add(1)), LINE));
        let roots = area(&mut at, mul(caps.n_roots as u64, LINE));
        let stripes = area(&mut at, mul(s, LINE));
        let buckets = area(&mut at, mul(mul(s, bps), size_of::<Bucket>() as u64));
        let entries = area(&mut at, mul(mul(s, eps), LINE));
        let journals = area(&mut at, mul(n, journal_len(caps.pin_slots)));
        // Each node's inbox: one ring per sender (its head line, then its
        // slots).
        let inboxes =
            area(&mut at, mul(mul(mul(n, n), mul(caps.inbox_slots as u64, SLOT_LINES).saturating_add(1)), LINE));
        let tiers = area(&mut at, mul(caps.tier_slots as u64, tier_dir_len(caps.tier_records)));
        let changes = area(&mut at, mul(mul(s, caps.change_records as u64), LINE));
        let tenants = area(&mut at, mul(caps.max_tenants as u64, 2 * LINE));
        let expiry = area(&mut at, mul(mul(s, expiry_lines(caps.entries_per_stripe)), LINE));
        // Chunk metadata depends on the chunk count, which depends on what is
        // left: solve with the per-chunk cost (record + bitmap bit).
        let meta_end = at;
        let avail = region_size.checked_sub(meta_end).ok_or(Error::TooSmall)?;
        let stride = chunk_stride(caps.chunk_shift);
        // Upper bound on chunks ignoring alignment, then shrink until it fits.
        let mut n_chunks = avail.checked_div(chunk.saturating_add(stride)).unwrap_or(0);
        loop {
            let bitmap_len = align_up(mul(n_chunks.div_ceil(64), 8), LINE);
            let chunks_len = mul(n_chunks, stride);
            let payload_start = align_up(
                align_up(meta_end.saturating_add(bitmap_len), LINE).saturating_add(chunks_len),
                PAYLOAD_ALIGN.max(LINE),
            );
            let end = payload_start.checked_add(mul(n_chunks, chunk)).ok_or(Error::TooSmall)?;
            if end <= region_size || n_chunks == 0 {
                break;
            }
            n_chunks = n_chunks.saturating_sub(1);
        }
        if n_chunks == 0 || n_chunks > u32::MAX as u64 {
            return Err(Error::TooSmall);
        }
        let chunk_bitmap = area(&mut at, mul(n_chunks.div_ceil(64), 8));
        let chunks = area(&mut at, mul(n_chunks, stride));
        let payload_start = align_up(at, PAYLOAD_ALIGN);
        let payload = Area { start: payload_start, end: payload_start.saturating_add(mul(n_chunks, chunk)) };
        if payload.end > region_size {
            return Err(Error::TooSmall);
        }
        Ok(Layout {
            caps,
            region_size,
            buckets_per_stripe: bps as u32,
            n_locks: n_locks as u32,
            n_chunks: n_chunks as u32,
            nodes,
            manager,
            locks,
            roots,
            chunk_bitmap,
            chunks,
            stripes,
            buckets,
            entries,
            journals,
            inboxes,
            tiers,
            changes,
            tenants,
            expiry,
            payload,
        })
    }

    /// The header describing this layout (magic still zero: format writes it
    /// last).
    pub fn header(&self, creation_id: u64, flags: u64) -> Header {
        let c = &self.caps;
        let mut h = Header {
            magic: 0,
            version: FORMAT_VERSION,
            header_len: size_of::<Header>() as u32,
            fingerprint: LAYOUT_FINGERPRINT,
            region_size: self.region_size,
            creation_id,
            flags,
            max_nodes: c.max_nodes,
            n_stripes: c.n_stripes,
            entries_per_stripe: c.entries_per_stripe,
            buckets_per_stripe: self.buckets_per_stripe,
            n_chunks: self.n_chunks,
            chunk_shift: c.chunk_shift,
            n_roots: c.n_roots,
            pin_slots: c.pin_slots,
            n_locks: self.n_locks,
            inbox_slots: c.inbox_slots,
            off_nodes: self.nodes.start,
            off_manager: self.manager.start,
            off_locks: self.locks.start,
            off_roots: self.roots.start,
            off_chunk_bitmap: self.chunk_bitmap.start,
            off_chunks: self.chunks.start,
            off_stripes: self.stripes.start,
            off_buckets: self.buckets.start,
            off_entries: self.entries.start,
            off_journals: self.journals.start,
            off_payload: self.payload.start,
            payload_len: self.payload.len(),
            off_inboxes: self.inboxes.start,
            app_locks: c.app_locks,
            tier_slots: c.tier_slots,
            tier_records: c.tier_records,
            change_records: c.change_records,
            off_tiers: self.tiers.start,
            off_changes: self.changes.start,
            off_tenants: self.tenants.start,
            max_tenants: c.max_tenants,
            pad: 0,
            reserved: [0; 1],
            checksum: 0,
        };
        h.checksum = header_checksum(&h);
        h
    }

    /// Validates a header read from a region of `mapped_len` bytes and
    /// returns the layout it describes. Each mismatch has its own error.
    pub fn from_header(h: &Header, mapped_len: u64) -> Result<Layout> {
        if h.magic == 0 {
            return Err(Error::NotInitialized);
        }
        if h.magic != MAGIC {
            return Err(Error::BadMagic);
        }
        if h.version != FORMAT_VERSION {
            return Err(Error::WrongVersion);
        }
        if h.fingerprint != LAYOUT_FINGERPRINT || h.header_len != size_of::<Header>() as u32 {
            return Err(Error::WrongLayout);
        }
        if h.checksum != header_checksum(h) {
            return Err(Error::CorruptHeader);
        }
        if h.region_size > mapped_len {
            return Err(Error::TooSmall);
        }
        let caps = Capacities {
            max_nodes: h.max_nodes,
            n_stripes: h.n_stripes,
            entries_per_stripe: h.entries_per_stripe,
            n_roots: h.n_roots,
            pin_slots: h.pin_slots,
            chunk_shift: h.chunk_shift,
            inbox_slots: h.inbox_slots,
            app_locks: h.app_locks,
            tier_slots: h.tier_slots,
            tier_records: h.tier_records,
            change_records: h.change_records,
            max_tenants: h.max_tenants,
        };
        let l = Layout::compute(caps, h.region_size).map_err(|_| Error::CorruptHeader)?;
        let mut expect = l.header(h.creation_id, h.flags);
        expect.magic = h.magic;
        if expect != *h {
            return Err(Error::CorruptHeader);
        }
        Ok(l)
    }

    /// Lock ids of this layout.
    pub fn locks(&self) -> LockIds {
        LockIds { n_stripes: self.caps.n_stripes, max_tenants: self.caps.max_tenants, max_nodes: self.caps.max_nodes }
    }

    /// Chunk size in bytes.
    pub fn chunk_size(&self) -> u64 {
        1 << self.caps.chunk_shift
    }

    /// Offset of node `n`'s info line.
    pub fn node_info(&self, n: u32) -> u64 {
        at(self.nodes.start, n as u64, NODE_LINES * LINE)
    }
    /// Offset of node `n`'s heartbeat line.
    pub fn heartbeat(&self, n: u32) -> u64 {
        self.node_info(n).wrapping_add(LINE)
    }
    /// Offset of node `n`'s stats line.
    pub fn node_stats(&self, n: u32) -> u64 {
        self.node_info(n).wrapping_add(2 * LINE)
    }
    /// Offset of node `n`'s request line.
    pub fn requests(&self, n: u32) -> u64 {
        self.node_info(n).wrapping_add(3 * LINE)
    }
    /// Offset of lock `l`'s state line.
    pub fn lock_line(&self, l: u32) -> u64 {
        at(self.locks.start, l as u64, (self.caps.max_nodes as u64).wrapping_add(1).wrapping_mul(LINE))
    }
    /// Offset of node `n`'s slot in lock `l`.
    pub fn lock_slot(&self, l: u32, n: u32) -> u64 {
        at(self.lock_line(l), (n as u64).wrapping_add(1), LINE)
    }
    /// Offset of root record `i`.
    pub fn root(&self, i: u32) -> u64 {
        at(self.roots.start, i as u64, LINE)
    }
    /// Offset of chunk record `c`.
    pub fn chunk(&self, c: u32) -> u64 {
        at(self.chunks.start, c as u64, chunk_stride(self.caps.chunk_shift))
    }
    /// Offset of chunk `c`'s granule maps: the used map ([`Layout::map_words`]
    /// words), then the start map (as many).
    pub fn chunk_map(&self, c: u32) -> u64 {
        self.chunk(c).wrapping_add(LINE)
    }
    /// Granules per chunk: a power of two, at most [`MAX_GRANULES`].
    pub fn granules(&self) -> u32 {
        granules_of(self.caps.chunk_shift)
    }
    /// Bytes per granule.
    pub fn granule(&self) -> u64 {
        self.chunk_size().checked_div(self.granules() as u64).unwrap_or(0)
    }
    /// 64-bit words of each of a chunk's two granule maps.
    pub fn map_words(&self) -> usize {
        (self.granules() / 64) as usize
    }
    /// Offset of the first payload byte of chunk `c`.
    pub fn chunk_payload(&self, c: u32) -> u64 {
        self.payload.start.wrapping_add((c as u64) << self.caps.chunk_shift)
    }
    /// Offset of stripe `s`'s header.
    pub fn stripe(&self, s: u32) -> u64 {
        at(self.stripes.start, s as u64, LINE)
    }
    /// Offset of bucket `b` of stripe `s`.
    pub fn bucket(&self, s: u32, b: u32) -> u64 {
        let i = (s as u64).wrapping_mul(self.buckets_per_stripe as u64).wrapping_add(b as u64);
        at(self.buckets.start, i, size_of::<Bucket>() as u64)
    }
    /// Offset of entry `e` of stripe `s`.
    pub fn entry(&self, s: u32, e: u32) -> u64 {
        let i = (s as u64).wrapping_mul(self.caps.entries_per_stripe as u64).wrapping_add(e as u64);
        at(self.entries.start, i, LINE)
    }
    /// Offset of the head line of sender `from`'s ring in node `n`'s inbox.
    pub fn inbox_head(&self, n: u32, from: u32) -> u64 {
        let per_ring = (self.caps.inbox_slots as u64).wrapping_mul(SLOT_LINES).wrapping_add(1).wrapping_mul(LINE);
        let ring = (n as u64).wrapping_mul(self.caps.max_nodes as u64).wrapping_add(from as u64);
        at(self.inboxes.start, ring, per_ring)
    }
    /// Offset of the slot of sender `from`'s ring in node `n`'s inbox that
    /// ring position `pos` uses.
    pub fn inbox_slot(&self, n: u32, from: u32, pos: u64) -> u64 {
        // `inbox_slots` is a power of two (validated): its mask.
        let i = pos & (self.caps.inbox_slots as u64).wrapping_sub(1);
        at(self.inbox_head(n, from).wrapping_add(LINE), i, SLOT_LINES * LINE)
    }
    /// Offset of node `n`'s pin journal: its summary line, then its records.
    pub fn journal(&self, n: u32) -> u64 {
        at(self.journals.start, n as u64, journal_len(self.caps.pin_slots))
    }
    /// Offset of node `n`'s pin summary line (the head of its journal).
    pub fn pin_summary(&self, n: u32) -> u64 {
        self.journal(n)
    }
    /// Offset of pin record `i` of node `n`.
    pub fn pin_record(&self, n: u32, i: u32) -> u64 {
        at(self.journal(n).wrapping_add(LINE), i as u64, size_of::<PinRecord>() as u64)
    }
    /// Bytes of one node's journal (summary line and records).
    pub fn journal_len(&self) -> u64 {
        journal_len(self.caps.pin_slots)
    }
    /// Offset of tier directory `d`'s head line.
    pub fn tier_head(&self, d: u32) -> u64 {
        at(self.tiers.start, d as u64, tier_dir_len(self.caps.tier_records))
    }
    /// Offset of record `i` (a sequence number: taken modulo the ring) of
    /// stripe `s`'s change log.
    pub fn change(&self, s: u32, i: u64) -> u64 {
        let n = self.caps.change_records as u64;
        at(self.changes.start, (s as u64).wrapping_mul(n).wrapping_add(i & n.wrapping_sub(1)), LINE)
    }
    /// Offset of tenant slot `t`'s config line.
    pub fn tenant_config(&self, t: u32) -> u64 {
        at(self.tenants.start, t as u64, 2 * LINE)
    }
    /// Offset of the expiry line holding entry `e` of stripe `s`'s stamp
    /// (word `e % EXPIRY_SLOTS`).
    pub fn expiry_line(&self, s: u32, e: u32) -> u64 {
        let per = expiry_lines(self.caps.entries_per_stripe);
        let i = (s as u64).wrapping_mul(per).wrapping_add((e / EXPIRY_SLOTS) as u64);
        at(self.expiry.start, i, LINE)
    }
    /// Offset of stripe `s`'s first expiry line, and its lines' length.
    pub fn expiry_lines(&self, s: u32) -> (u64, u64) {
        let per = expiry_lines(self.caps.entries_per_stripe);
        (at(self.expiry.start, (s as u64).wrapping_mul(per), LINE), per.wrapping_mul(LINE))
    }
    /// Offset of tenant slot `t`'s usage line.
    pub fn tenant_usage(&self, t: u32) -> u64 {
        self.tenant_config(t).wrapping_add(LINE)
    }
    /// Offset of record `i` of tier directory `d`.
    pub fn tier_record(&self, d: u32, i: u32) -> u64 {
        at(self.tier_head(d).wrapping_add(LINE), i as u64, size_of::<TierRecord>() as u64)
    }
}

/// Bytes of one tier directory: its head line, then its records (whole
/// lines: `records` is a power of two of at least two).
pub const fn tier_dir_len(records: u32) -> u64 {
    LINE.wrapping_add((records as u64).wrapping_mul(size_of::<TierRecord>() as u64))
}

/// Bytes of one node's pin journal: a summary line, then `pin_slots`
/// records (a multiple of two, so whole lines).
pub const fn journal_len(pin_slots: u32) -> u64 {
    LINE.wrapping_add((pin_slots as u64).wrapping_mul(size_of::<PinRecord>() as u64))
}

/// Granules per chunk for chunks of `1 << chunk_shift` bytes.
pub const fn granules_of(chunk_shift: u32) -> u32 {
    let lines = (1u64 << chunk_shift) / MIN_GRANULE;
    if lines > MAX_GRANULES as u64 {
        MAX_GRANULES
    } else {
        lines as u32
    }
}

/// Bytes from one chunk record to the next: the record line and its two
/// granule maps, rounded up to lines.
pub const fn chunk_stride(chunk_shift: u32) -> u64 {
    let map_bytes = granules_of(chunk_shift) as u64 / 8;
    LINE.wrapping_add(map_bytes.wrapping_mul(2).div_ceil(LINE).wrapping_mul(LINE))
}

/// Checksum of a header with its `checksum` and `magic` fields taken as 0
/// (magic is written after the checksum, last of all).
pub fn header_checksum(h: &Header) -> u64 {
    let mut c = *h;
    c.checksum = 0;
    c.magic = 0;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for chunk in c.as_bytes().chunks_exact(8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        x = crate::hash::mix64(x ^ u64::from_le_bytes(w));
    }
    x
}
