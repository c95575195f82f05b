//! The region format: every shared struct, the header, and where each area
//! lies. This file is the wire format; changing a struct changes
//! [`LAYOUT_FINGERPRINT`] and attach refuses regions of the other layout.
//!
//! Every struct is `#[repr(C)]`, made of fixed-width integers, 8-byte multiple
//! sized (64 where it is a line), with size and offsets asserted here.

use core::mem::{offset_of, size_of};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::mem::LINE;
use crate::off::Area;
use crate::{Error, Result};

/// "CXLKV\0\0\1" little-endian: the region magic.
pub const MAGIC: u64 = u64::from_le_bytes(*b"CXLKV\0\0\x01");
/// Format version; bumped with every incompatible change (9: namespace ids
/// from 2^31 up name registered namespaces, so a region whose blocks carry
/// the hashed ids of version 8 is refused rather than read under them).
pub const FORMAT_VERSION: u32 = 9;
/// Largest number of nodes (pinner bitmask is one u64).
pub const MAX_NODES: u32 = 64;
/// Most granules a chunk is cut into (two maps of 4096 bits follow its
/// record): 512-byte granules in 2 MiB chunks, so any block of 4 KiB or more
/// wastes at most 1/9 of its space to rounding.
pub const MAX_GRANULES: u32 = 4096;
/// Granules are never smaller than a line.
pub const MIN_GRANULE: u64 = LINE;

macro_rules! shared_struct {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty),* $(,)? } size $size:expr) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
        #[repr(C)]
        #[allow(missing_docs)] // wire-format fields: named for what they hold, described above
        pub struct $name { $($(#[$fm])* pub $f: $t),* }
        static_assertions::const_assert_eq!(size_of::<$name>(), $size);
        static_assertions::const_assert_eq!(size_of::<$name>() % 8, 0);
        impl $name {
            /// Every field's name, in order.
            pub const FIELD_NAMES: &'static [&'static str] = &[$(stringify!($f)),*];

            /// Folds this struct's size and every field offset into `h`.
            pub const fn fold_layout(mut h: u64) -> u64 {
                h = fnv_step(h, size_of::<$name>() as u64);
                $( h = fnv_step(h, offset_of!($name, $f) as u64); )*
                h
            }
        }
    };
}

/// One FNV-1a-style step over a 64-bit value.
pub const fn fnv_step(mut h: u64, v: u64) -> u64 {
    let mut i = 0u32;
    while i < 8 {
        h ^= (v >> i.wrapping_mul(8)) & 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i = i.wrapping_add(1);
    }
    h
}

shared_struct! {
    /// View header, 256 bytes at offset 0. `magic` is written last.
    pub struct Header {
        pub magic: u64,
        pub version: u32,
        pub header_len: u32,
        pub fingerprint: u64,
        pub region_size: u64,
        pub creation_id: u64,
        pub flags: u64,
        pub max_nodes: u32,
        pub n_stripes: u32,
        pub entries_per_stripe: u32,
        pub buckets_per_stripe: u32,
        pub n_chunks: u32,
        pub chunk_shift: u32,
        pub n_roots: u32,
        pub pin_slots: u32,
        pub n_locks: u32,
        pub inbox_slots: u32,
        pub off_nodes: u64,
        pub off_manager: u64,
        pub off_locks: u64,
        pub off_roots: u64,
        pub off_chunk_bitmap: u64,
        pub off_chunks: u64,
        pub off_stripes: u64,
        pub off_buckets: u64,
        pub off_entries: u64,
        pub off_journals: u64,
        pub off_payload: u64,
        pub payload_len: u64,
        pub off_inboxes: u64,
        pub app_locks: u32,
        pub tier_slots: u32,
        pub tier_records: u32,
        pub change_records: u32,
        pub off_tiers: u64,
        pub off_changes: u64,
        pub reserved: [u64; 3],
        pub checksum: u64,
    } size 256
}

shared_struct! {
    /// A node's identity line (written by the node at attach/detach, by the
    /// manager when it declares the node dead, by recovery when it frees it).
    pub struct NodeInfo {
        pub state: u32,
        /// Process id, in the process's own PID namespace.
        pub pid: u32,
        /// Host (cache-coherence domain) identity: the kernel's boot id.
        pub host_id: u64,
        pub nonce: u64,
        pub attached_at: u64,
        pub incarnation: u64,
        /// PID namespace identity (0: unknown): a pid means something only
        /// to processes of the same host and PID namespace.
        pub pid_ns: u64,
        pub reserved: [u64; 2],
    } size 64
}

shared_struct! {
    /// Head line of a tier directory (see `tier.rs`): which node's SSD tier
    /// owns it. Written by a claiming node under the roots lock, and by its
    /// owner when it lets go.
    pub struct TierHead {
        /// Owner node id + 1; 0 = free.
        pub owner: u32,
        pub reserved0: u32,
        /// The owner's `NodeInfo::incarnation` when it claimed the directory:
        /// a later node in the same slot does not own it.
        pub incarnation: u64,
        /// The owner's host.
        pub host_id: u64,
        /// Claims so far.
        pub epoch: u64,
        pub reserved: [u64; 4],
    } size 64
}

shared_struct! {
    /// A block held on a tier's SSD: two per line, written only by the
    /// directory's owner. `ver` is a sequence word (odd while changing).
    pub struct TierRecord {
        pub ver: u32,
        /// `TIER_*` state.
        pub state: u32,
        pub key_lo: u64,
        pub key_hi: u64,
        pub ns: u32,
        pub len: u32,
    } size 32
}

/// Tier record states: never used, live, removed (a probe goes on past it).
pub const TIER_EMPTY: u32 = 0;
/// A live tier record.
pub const TIER_LIVE: u32 = 1;
/// A removed tier record.
pub const TIER_GONE: u32 = 2;

shared_struct! {
    /// A node's heartbeat line, written only by that node. Beside the beat
    /// it carries the node's lock and recovery counters, counted in
    /// host-local memory and published with each beat (so counting costs
    /// the locks' callers no flush).
    pub struct Heartbeat {
        pub beat: u64,
        pub nonce: u64,
        /// Global locks granted to the node.
        pub lock_grants: u64,
        /// Nanoseconds its lock requests waited for the grant, in all.
        pub lock_wait_ns: u64,
        /// Recoveries it ran that freed at least one dead node.
        pub recoveries: u64,
        /// Dead nodes those recoveries freed.
        pub nodes_recovered: u64,
        /// Nodes its lock manager declared dead by silence while their
        /// process was running on its host (stopped, frozen or starved of
        /// CPU: a false death unless it was stopped on purpose).
        pub running_declared_dead: u64,
        pub reserved: [u64; 1],
    } size 64
}

shared_struct! {
    /// A node's counters (one line, written only by the node): the table of
    /// them is [`NodeStats::COUNTERS`].
    pub struct NodeStats {
        pub hits: u64,
        pub misses: u64,
        pub inserts: u64,
        pub exists: u64,
        pub evictions: u64,
        pub bytes_written: u64,
        pub bytes_read: u64,
        pub tier_timeouts: u64,
    } size 64
}

/// One counter of [`NodeStats`], as every door reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterField {
    /// The field's name (C's and Python's too; Node's is its camelCase).
    pub name: &'static str,
    /// Its OpenMetrics name (after `cxlkv_`, before `_total`).
    pub metric: &'static str,
    /// What it counts.
    pub help: &'static str,
}

impl NodeStats {
    /// The one table of a node's counters, in field order (a compile-time
    /// check holds it to the struct): the C struct converts through it, and
    /// Python's stats, Node's typings, `cxlkv inspect` and the OpenMetrics
    /// output read it. Adding a counter: a field above and a line here.
    pub const COUNTERS: [CounterField; 8] = [
        CounterField { name: "hits", metric: "hits", help: "Blocks found by the node's lookups, acquires and gets" },
        CounterField { name: "misses", metric: "misses", help: "Blocks the node looked for and did not find" },
        CounterField { name: "inserts", metric: "inserts", help: "Blocks the node reserved" },
        CounterField { name: "exists", metric: "exists", help: "Puts of keys already stored" },
        CounterField { name: "evictions", metric: "node_evictions", help: "Blocks the node evicted" },
        CounterField { name: "bytes_written", metric: "written_bytes", help: "Payload bytes the node wrote" },
        CounterField { name: "bytes_read", metric: "read_bytes", help: "Payload bytes the node read" },
        CounterField {
            name: "tier_timeouts",
            metric: "tier_timeouts",
            help: "Blocks the node asked an SSD tier for that did not come back within the wait",
        },
    ];

    /// Every counter's value, in the table's order.
    pub fn values(&self) -> [u64; 8] {
        zerocopy::transmute!(*self)
    }

    /// Every counter, by name, in the table's order.
    pub fn counters(&self) -> impl Iterator<Item = (&'static str, u64)> {
        Self::COUNTERS.iter().map(|c| c.name).zip(self.values())
    }
}

// The counter table names the struct's fields, in order. Evaluated by the
// compiler only: an index out of range or a failed check is a build error.
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects, clippy::panic)]
const _: () = {
    let (t, f) = (&NodeStats::COUNTERS, NodeStats::FIELD_NAMES);
    assert!(t.len() == f.len());
    let mut i = 0;
    while i < t.len() {
        let (a, b) = (t[i].name.as_bytes(), f[i].as_bytes());
        assert!(a.len() == b.len());
        let mut j = 0;
        while j < a.len() {
            assert!(a[j] == b[j]);
            j += 1;
        }
        i += 1;
    }
};

shared_struct! {
    /// A node's lock requests: bit `l` of `want` set while the node waits for
    /// lock `l` (or withdraws its request). Written only by that node (its
    /// threads set and clear bits with host-local atomics); the manager reads
    /// it to find waiters without scanning every slot. `reserved[0]` is the
    /// node's manager claim (`lock.rs`: epoch << 8 | id + 1, 0 = none),
    /// written by that node's manager alone.
    pub struct RequestLine {
        pub want: [u64; 4],
        pub reserved: [u64; 4],
    } size 64
}

/// Most global locks a region can have (the request bitmap's width).
pub const MAX_LOCKS: u32 = 256;

/// Most application locks a region can have.
pub const MAX_APP_LOCKS: u32 = 128;

/// Lines per node in the node table: info, heartbeat, stats, requests.
pub const NODE_LINES: u64 = 4;

shared_struct! {
    /// The lock manager's line, written only by the current manager.
    pub struct ManagerLine {
        /// Node id + 1 of the manager; 0 = none yet.
        pub manager: u32,
        pub reserved0: u32,
        /// Incremented on every manager step: its lease.
        pub lease: u64,
        /// Incremented at each takeover.
        pub epoch: u64,
        /// Nodes the manager has declared dead and whose recovery is pending.
        pub dead_mask: u64,
        pub reserved: [u64; 4],
    } size 64
}

shared_struct! {
    /// Per-lock state, written by the manager when it grants or revokes, and
    /// by the holder (while holding) to clear `repair`.
    pub struct LockLine {
        /// Grants made so far: a grant carries the count after it, so no
        /// two grants of the lock carry the same (see `lock.rs`).
        pub grant_seq: u64,
        /// Node id + 1 of the node last granted; 0 none.
        pub holder: u32,
        /// Non-zero after a revocation until recovery repaired what it guards.
        pub repair: u32,
        /// Node id of the last grant, for round robin.
        pub last: u32,
        pub reserved0: u32,
        pub reserved: [u64; 5],
    } size 64
}

shared_struct! {
    /// One node's slot in one global lock. IDLE → WAITING (node) → LOCKED
    /// (manager) → IDLE (node); the manager may also reset a dead node's slot.
    pub struct LockSlot {
        pub state: u32,
        /// Request flags (`SLOT_RECOVERY`).
        pub flags: u32,
        /// The grant's sequence number (LOCKED).
        pub seq: u64,
        pub reserved: [u64; 6],
    } size 64
}

shared_struct! {
    /// A named root, written under the roots lock.
    pub struct RootRecord {
        pub name: [u8; 32],
        pub offset: u64,
        pub size: u64,
        pub tag: u32,
        pub state: u32,
        pub checksum: u64,
    } size 64
}

shared_struct! {
    /// A payload chunk's record line; the chunk's granule maps follow it
    /// ([`Layout::chunk_map`]). Ownership changes under the alloc lock;
    /// blocks under the heap lock of the owner (whose lock guards the chunk:
    /// any node may place KV blocks in any KV chunk, taking that lock).
    ///
    /// A `CHUNK_KV` or `CHUNK_RAW` chunk is cut into granules
    /// ([`Layout::granules`] of [`Layout::granule`] bytes); a block is a run
    /// of used granules whose first carries a start bit. A `CHUNK_LARGE`
    /// chunk heads a run of whole chunks holding one block (`CHUNK_CONT` for
    /// the rest of the run); its maps stay empty.
    pub struct ChunkRecord {
        /// Owner node id + 1; 0 = free.
        pub owner: u32,
        /// `CHUNK_*` kind.
        pub kind: u32,
        /// Chunks in the run (`CHUNK_LARGE`); the head chunk (`CHUNK_CONT`);
        /// else 1 (0 when free).
        pub run: u32,
        /// `CHUNK_KV` or `CHUNK_RAW` for a `CHUNK_LARGE` run, else 0.
        pub large_kind: u32,
        /// Granules in use (all of them for `CHUNK_LARGE`).
        pub used: u32,
        /// Blocks allocated.
        pub blocks: u32,
        /// Longest run of free granules (0 unless `CHUNK_KV`/`CHUNK_RAW`).
        pub free_max: u32,
        /// Granules per chunk of this layout (0 when free or `CHUNK_CONT`).
        pub granules: u32,
        /// Bytes of the run's block (`CHUNK_LARGE`), else 0.
        pub block_size: u64,
        pub reserved: [u64; 3],
    } size 64
}

shared_struct! {
    /// A stripe's header line, written under the stripe lock.
    pub struct StripeHeader {
        pub lru_head: u32,
        pub lru_tail: u32,
        pub free_head: u32,
        pub live: u32,
        pub bytes: u64,
        pub inserts: u64,
        pub evictions: u64,
        /// Sequence number of the stripe's last change (see `changes.rs`):
        /// its change log holds changes `changes - change_records + 1 ..=
        /// changes`, none at or below `changes_floor`.
        pub changes: u64,
        /// Changes at or below this number are not in the log (recovery
        /// raises it: what it rebuilt is known only by a scan).
        pub changes_floor: u64,
        pub reserved: u64,
    } size 64
}

shared_struct! {
    /// One change of a stripe's index, in its change log ring (record `seq %
    /// change_records`): written under the stripe lock, before the stripe
    /// header that counts it; read without a lock.
    pub struct ChangeRecord {
        /// The change's sequence number in its stripe (from 1).
        pub seq: u64,
        /// `CHANGE_STORED` or `CHANGE_REMOVED`.
        pub kind: u32,
        pub ns: u32,
        pub key_lo: u64,
        pub key_hi: u64,
        /// Payload bytes of the block.
        pub len: u64,
        pub tokens: u32,
        /// The node that made the change.
        pub node: u32,
        pub reserved: u64,
        /// Over every field but itself (see `changes::record_check`).
        pub check: u64,
    } size 64
}

/// A change record: a block was published.
pub const CHANGE_STORED: u32 = 1;
/// A change record: a published block was removed (evicted or removed).
pub const CHANGE_REMOVED: u32 = 2;

shared_struct! {
    /// An index bucket: a tag of the key's hash and the entry it names.
    /// Four per line.
    pub struct Bucket {
        pub tag: u64,
        /// Entry index within the stripe + 1; 0 = empty.
        pub entry: u32,
        pub reserved: u32,
    } size 16
}

shared_struct! {
    /// An index entry: one line, written under the stripe lock. `ver` is a
    /// sequence word (odd while being changed) for readers without the lock.
    pub struct Entry {
        pub ver: u16,
        pub state: u16,
        pub gen: u32,
        pub key_lo: u64,
        pub key_hi: u64,
        pub ns: u32,
        pub tokens: u32,
        pub payload_off: u64,
        pub payload_len: u32,
        pub checksum: u32,
        /// Bit n set = node n pins the entry (or is writing it).
        pub pinners: u64,
        pub lru_prev: u32,
        pub lru_next: u32,
    } size 64
}

shared_struct! {
    /// Head line of a node's pin journal: bit `g % 512` is set while the
    /// journal holds a record of global entry `g`. Written only by the node;
    /// an evictor reads it (one line per node) before the records it covers.
    pub struct PinSummary {
        pub bits: [u64; 8],
    } size 64
}

impl PinSummary {
    /// Bits in a summary line.
    pub const BITS: u32 = 512;
    /// The bit of global entry `g`.
    pub fn bit(g: u32) -> (usize, u64) {
        let b = g % Self::BITS;
        ((b / 64) as usize, 1 << (b % 64))
    }
    /// True when the bit of global entry `g` is set.
    pub fn covers(&self, g: u32) -> bool {
        let (w, m) = Self::bit(g);
        self.bits.get(w).is_some_and(|x| x & m != 0)
    }
}

shared_struct! {
    /// A pin journal record: node-private, four per line.
    pub struct PinRecord {
        /// Global entry index + 1; 0 = free record.
        pub entry: u32,
        pub count: u32,
        pub gen: u64,
    } size 16
}

shared_struct! {
    /// Head of node n's inbox ring: how many slots its owner has consumed.
    /// Written only by the owner.
    pub struct InboxHead {
        pub head: u64,
        pub reserved: [u64; 7],
    } size 64
}

shared_struct! {
    /// First line of an inbox slot. `seq` (position + 1) is the state word:
    /// written last in a message's first slot, read first.
    pub struct MsgHeader {
        pub seq: u64,
        pub request_id: u64,
        pub stamp: u64,
        /// Over every field but `seq` and itself, and every key.
        pub checksum: u64,
        pub kind: u32,
        pub n_keys: u32,
        pub ns: u32,
        pub from: u32,
        pub to_incarnation: u32,
        /// Slots the message spans (first slot), 0 in later slots.
        pub slots: u32,
        pub status: u32,
        /// Index of this slot in its message.
        pub index: u32,
    } size 64
}

shared_struct! {
    /// The three key lines of an inbox slot: 12 keys as (lo, hi).
    pub struct MsgKeys {
        pub words: [u64; 24],
    } size 192
}

/// Entry states.
pub mod state {
    /// Free entry.
    pub const EMPTY: u16 = 0;
    /// Reserved, payload being written; invisible to readers.
    pub const WRITING: u16 = 1;
    /// Published.
    pub const READY: u16 = 2;
    /// Being removed (transient under the stripe lock).
    pub const EVICTING: u16 = 3;
    /// Published, and offered for eviction: an evictor, holding the stripe
    /// lock, is looking for pins of it; it becomes READY again if it finds
    /// one, EVICTING if not. Readers treat it as gone; recovery makes it
    /// READY (its evictor died before deciding, or before it changed
    /// anything else).
    pub const CLAIMED: u16 = 4;
}

/// Chunk kinds.
pub const CHUNK_FREE: u32 = 0;
/// Carved into KV payload blocks.
pub const CHUNK_KV: u32 = 1;
/// Carved into raw allocations.
pub const CHUNK_RAW: u32 = 2;
/// First chunk of a multi-chunk block.
pub const CHUNK_LARGE: u32 = 3;
/// Later chunk of a multi-chunk block.
pub const CHUNK_CONT: u32 = 4;

/// Node info states.
pub const NODE_FREE: u32 = 0;
/// Attached.
pub const NODE_ALIVE: u32 = 1;
/// Declared dead, recovery pending.
pub const NODE_DEAD: u32 = 2;

/// Lock slot states.
pub const SLOT_IDLE: u32 = 0;
/// Requested by its node.
pub const SLOT_WAITING: u32 = 1;
/// Granted by the manager.
pub const SLOT_LOCKED: u32 = 2;
/// Withdrawn by its node, which awaits the manager's answer: IDLE (dropped)
/// or LOCKED (granted before the manager saw it; the node gives it back).
pub const SLOT_CANCEL: u32 = 3;
bitflags::bitflags! {
    /// Flags of a lock request (`LockSlot::flags`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct SlotFlags: u32 {
        /// Recovery: grant even a lock that awaits repair.
        const RECOVERY = 1;
    }
}

/// Request flag word for recovery (`SlotFlags::RECOVERY`).
pub const SLOT_RECOVERY: u32 = SlotFlags::RECOVERY.bits();

/// Hash of every shared struct's size and field offsets.
pub const LAYOUT_FINGERPRINT: u64 = {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    h = Header::fold_layout(h);
    h = NodeInfo::fold_layout(h);
    h = Heartbeat::fold_layout(h);
    h = NodeStats::fold_layout(h);
    h = RequestLine::fold_layout(h);
    h = ManagerLine::fold_layout(h);
    h = LockLine::fold_layout(h);
    h = LockSlot::fold_layout(h);
    h = RootRecord::fold_layout(h);
    h = ChunkRecord::fold_layout(h);
    h = StripeHeader::fold_layout(h);
    h = Bucket::fold_layout(h);
    h = Entry::fold_layout(h);
    h = PinSummary::fold_layout(h);
    h = PinRecord::fold_layout(h);
    h = InboxHead::fold_layout(h);
    h = MsgHeader::fold_layout(h);
    h = MsgKeys::fold_layout(h);
    h = TierHead::fold_layout(h);
    h = TierRecord::fold_layout(h);
    h = ChangeRecord::fold_layout(h);
    h
};

/// One capacity of a region, as [`Capacities::FIELDS`] lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapacityField {
    /// Its name: the field of [`Capacities`], of C's `cxlkv_capacities` and
    /// Python's `Region.format` keyword (Node's option is its camelCase).
    pub name: &'static str,
    /// What it counts, and its limits.
    pub doc: &'static str,
    /// Its default.
    pub default: u32,
}

/// The one table of capacities: the struct, its defaults, the list every
/// door reads (C's struct is converted through it and checked against it,
/// Python's keywords and stub, Node's options and typings, the CLI's flags).
/// Adding a capacity is a line here (plus the C struct's field, which a
/// test holds to this order).
macro_rules! capacities {
    ($($(#[doc = $doc:literal])+ $name:ident = $default:expr;)+) => {
        /// Capacities chosen at format time (see [`Capacities::FIELDS`]).
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
        pub struct Capacities {
            $($(#[doc = $doc])+ pub $name: u32,)+
        }

        impl Default for Capacities {
            fn default() -> Self {
                Capacities { $($name: $default,)+ }
            }
        }

        impl Capacities {
            /// Every capacity, in the struct's order.
            pub const FIELDS: &'static [CapacityField] = &[$(CapacityField {
                name: stringify!($name),
                doc: concat!($($doc),+),
                default: $default,
            }),+];

            /// The capacity called `name`.
            pub fn get(&self, name: &str) -> Option<u32> {
                match name {
                    $(stringify!($name) => Some(self.$name),)+
                    _ => None,
                }
            }

            /// Sets the capacity called `name`; false when there is none.
            pub fn set(&mut self, name: &str, value: u32) -> bool {
                match name {
                    $(stringify!($name) => self.$name = value,)+
                    _ => return false,
                }
                true
            }
        }
    };
}

capacities! {
    /// Node slots (1 to 64).
    max_nodes = 16;
    /// Index stripes, each with its own lock (a power of two, at most 128).
    n_stripes = 16;
    /// Index entries per stripe: the most blocks a stripe holds.
    entries_per_stripe = 4096;
    /// Named roots: application roots, application locks and registered
    /// namespaces (one record each; 1 to 65536).
    n_roots = 1024;
    /// Pins each node may hold at once (a multiple of 4).
    pin_slots = 512;
    /// log2 of the allocator's chunk size (12 to 32; 21 = 2 MiB).
    chunk_shift = 21;
    /// Slots of each node's inbox ring (a power of two, 4 to 65536).
    inbox_slots = 64;
    /// Inter-node locks applications allocate for their own structures
    /// (TraCT's lock API; at most 128); each allocated one takes a root
    /// record.
    app_locks = 64;
    /// Tier directories: hosts whose SSD tier the region can record (at
    /// most 64; 0 for none).
    tier_slots = 4;
    /// Records of each tier directory (a power of two, 2 to 2^26): blocks
    /// one SSD tier can make known to the rack, up to three quarters of it.
    tier_records = 8192;
    /// Records of each stripe's change log (a power of two, 4 to 2^20): how
    /// far a reader of the log may fall behind before it must rescan.
    change_records = 256;
}

impl Capacities {
    /// Checks every capacity is within what the format supports.
    pub fn validate(&self) -> Result<()> {
        let ok = (1..=MAX_NODES).contains(&self.max_nodes)
            && self.n_stripes.is_power_of_two()
            && self.n_stripes <= 128
            && (1..=1 << 24).contains(&self.entries_per_stripe)
            && (1..=65536).contains(&self.n_roots)
            && (4..=1 << 20).contains(&self.pin_slots)
            && self.pin_slots.is_multiple_of(4)
            && (12..=32).contains(&self.chunk_shift)
            && self.inbox_slots.is_power_of_two()
            && (4..=65536).contains(&self.inbox_slots)
            && self.app_locks <= MAX_APP_LOCKS
            && self.tier_slots <= MAX_NODES
            && self.change_records.is_power_of_two()
            && (4..=1 << 20).contains(&self.change_records)
            && self.tier_records.is_power_of_two()
            && (2..=1 << 26).contains(&self.tier_records)
            && self.n_locks() <= MAX_LOCKS;
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidArgument)
        }
    }

    /// Buckets per stripe: a power of two at least twice the entries.
    pub fn buckets_per_stripe(&self) -> u32 {
        self.entries_per_stripe.max(2).saturating_mul(2).next_power_of_two()
    }

    /// Number of global locks: stripes, roots, one heap per node, alloc, one
    /// inbox per node, then the application locks.
    pub fn n_locks(&self) -> u32 {
        // Validated capacities keep this far below u32::MAX.
        let n = self.n_stripes.wrapping_add(1).wrapping_add(self.max_nodes);
        n.wrapping_add(1).wrapping_add(self.max_nodes).wrapping_add(self.app_locks)
    }
}

/// Lock ids, in lock order (a node only takes a lock with a higher id than
/// any it holds).
#[derive(Clone, Copy, Debug)]
pub struct LockIds {
    n_stripes: u32,
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
    /// Lock of node `n`'s heap.
    pub fn heap(&self, n: u32) -> u32 {
        self.n_stripes.wrapping_add(1).wrapping_add(n)
    }
    /// Lock of the global chunk bitmap.
    pub fn alloc(&self) -> u32 {
        self.n_stripes.wrapping_add(1).wrapping_add(self.max_nodes)
    }
    /// Lock of node `n`'s inbox (producers serialise on it; taken alone).
    pub fn inbox(&self, n: u32) -> u32 {
        self.alloc().wrapping_add(1).wrapping_add(n)
    }
    /// Number of locks core itself uses; application lock `i` has id
    /// `n_core() + i`, after every one of them. Recovery takes exactly these.
    pub fn n_core(&self) -> u32 {
        self.inbox(self.max_nodes)
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
        let inboxes = area(&mut at, mul(mul(n, mul(caps.inbox_slots as u64, SLOT_LINES).saturating_add(1)), LINE));
        let tiers = area(&mut at, mul(caps.tier_slots as u64, tier_dir_len(caps.tier_records)));
        let changes = area(&mut at, mul(mul(s, caps.change_records as u64), LINE));
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
            reserved: [0; 3],
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
        LockIds { n_stripes: self.caps.n_stripes, max_nodes: self.caps.max_nodes }
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
    /// Offset of node `n`'s inbox head line.
    pub fn inbox_head(&self, n: u32) -> u64 {
        let per_node = (self.caps.inbox_slots as u64).wrapping_mul(SLOT_LINES).wrapping_add(1).wrapping_mul(LINE);
        at(self.inboxes.start, n as u64, per_node)
    }
    /// Offset of the slot of node `n`'s inbox that ring position `pos` uses.
    pub fn inbox_slot(&self, n: u32, pos: u64) -> u64 {
        // `inbox_slots` is a power of two (validated): its mask.
        let i = pos & (self.caps.inbox_slots as u64).wrapping_sub(1);
        at(self.inbox_head(n).wrapping_add(LINE), i, SLOT_LINES * LINE)
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
/// records (a multiple of four, so whole lines).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_places_areas_in_order_without_overlap() {
        let sut = Layout::compute(Capacities::default(), 256 << 20).unwrap();
        let areas = [
            sut.nodes,
            sut.manager,
            sut.locks,
            sut.roots,
            sut.stripes,
            sut.buckets,
            sut.entries,
            sut.journals,
            sut.inboxes,
            sut.tiers,
            sut.changes,
            sut.chunk_bitmap,
            sut.chunks,
            sut.payload,
        ];
        for w in areas.windows(2) {
            assert!(w[0].end <= w[1].start, "{:?} overlaps {:?}", w[0], w[1]);
            assert_eq!(w[1].start % LINE, 0);
        }
        assert_eq!(sut.payload.start % PAYLOAD_ALIGN, 0);
        assert!(sut.payload.end <= 256 << 20);
        assert!(sut.n_chunks > 50);
    }

    #[test]
    fn compute_fails_when_region_too_small() {
        assert_eq!(Layout::compute(Capacities::default(), 1 << 20), Err(Error::TooSmall));
    }

    #[test]
    fn header_round_trips_and_rejects_each_mismatch() {
        let l = Layout::compute(Capacities::default(), 64 << 20).unwrap();
        let mut h = l.header(7, 0);
        assert_eq!(Layout::from_header(&h, 64 << 20), Err(Error::NotInitialized));
        h.magic = MAGIC;
        assert_eq!(Layout::from_header(&h, 64 << 20), Ok(l));
        assert_eq!(Layout::from_header(&h, 32 << 20), Err(Error::TooSmall));
        let mut bad = h;
        bad.magic = 1;
        assert_eq!(Layout::from_header(&bad, 64 << 20), Err(Error::BadMagic));
        let mut bad = h;
        bad.version = 99;
        assert_eq!(Layout::from_header(&bad, 64 << 20), Err(Error::WrongVersion));
        let mut bad = h;
        bad.fingerprint ^= 1;
        assert_eq!(Layout::from_header(&bad, 64 << 20), Err(Error::WrongLayout));
        let mut bad = h;
        bad.off_entries += 64;
        assert_eq!(Layout::from_header(&bad, 64 << 20), Err(Error::CorruptHeader));
        let mut bad = h;
        bad.off_entries += 64;
        bad.checksum = header_checksum(&bad);
        assert_eq!(Layout::from_header(&bad, 64 << 20), Err(Error::CorruptHeader));
    }
}
