//! The shared structs, line by line, with their constants and the
//! fingerprint of the whole layout.

use core::mem::{offset_of, size_of};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::mem::LINE;

/// "CXLKV\0\0\1" little-endian: the region magic.
pub const MAGIC: u64 = u64::from_le_bytes(*b"CXLKV\0\0\x01");
/// Format version; bumped with every incompatible change (17: an expiry
/// stamp per entry, for tenants' lifetimes; 16: tenants, a
/// table of them and a lock each, between the roots lock and the heap
/// locks; 12: a chunk
/// record carries the heap-lock ticket it was written under and its maps'
/// checksum; 11: fenced nodes and quarantined entries; 10: a lock's
/// repair floor and a stripe header's ticket, so a region whose headers
/// carry no ticket is refused rather than read as void; 9: namespace ids
/// from 2^31 up name registered namespaces).
pub const FORMAT_VERSION: u32 = 17;
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
        pub off_tenants: u64,
        pub max_tenants: u32,
        pub pad: u32,
        pub reserved: [u64; 1],
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
        /// The node's incarnation once it is known quiet (0: not known):
        /// nothing it stored can land in memory any more. Written by the
        /// node itself once fenced, after it wrote back every line it may
        /// have dirtied ([`crate::node::Node::quiesce`]); by a process of its
        /// host that found its process gone ([`crate::node::bury`]); or by
        /// an operator who knows its host is down ([`crate::node::declare_quiet`]).
        /// Until then recovery keeps its reservations and raw blocks
        /// allocated (quarantined): a late write-back into them corrupts
        /// nobody's block.
        pub quiet: u64,
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
    /// written by that node's manager alone. `reserved[1]` journals a chunk
    /// release in flight (`alloc`: first chunk + 1, and the count << 32;
    /// 0 = none), written by the node under the alloc lock; `reserved[2]`
    /// the root slot it is writing under the roots lock ([`ROOT_AT`]).
    pub struct RequestLine {
        pub want: [u64; 4],
        pub reserved: [u64; 4],
    } size 64
}

/// Most global locks a region can have (the request bitmap's width).
pub const MAX_LOCKS: u32 = 256;

/// Where a node's request line journals a chunk release in flight.
pub const RELEASE_AT: u64 = core::mem::offset_of!(RequestLine, reserved) as u64 + 8;

/// Where a node's request line journals the root slot it is writing
/// (`reserved[2]`: slot + 1; 0 = none), under the roots lock.
pub const ROOT_AT: u64 = core::mem::offset_of!(RequestLine, reserved) as u64 + 16;

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
    /// by recovery (holding the lock) to clear `repair` and raise `floor`.
    /// The manager keeps its own copy of the count, `repair` and `floor`
    /// and never takes a smaller value from memory: a line written back late
    /// by a manager that stopped and was replaced cannot turn them back.
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
        /// The ticket of the last recovery that repaired what the lock
        /// guards: a guarded line stamped with a smaller ticket was written
        /// before that repair and not rewritten by it, i.e. by a revoked
        /// holder woken late (see `lock.rs`, "Zombies"). Only grows.
        pub floor: u64,
        pub reserved: [u64; 4],
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
        /// A grant's manager claim (`reserved[0]`) and the lock's repair
        /// floor (`reserved[1]`) as that manager knows it.
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
    ///
    /// Zombies: a chunk owned by a node carries the ticket of the owner's
    /// heap lock it was written under and the checksum of its maps. One
    /// stamped below that lock's repair floor, or whose maps do not sum to
    /// its checksum, holds a revoked holder's late write-back (record or
    /// maps): it is void, and its next holder has it repaired before use.
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
        /// Ticket of the owner's heap lock this record was written under
        /// (0 when free).
        pub ticket: u64,
        /// [`crate::alloc::ChunkMap::checksum`] of the chunk's maps as this
        /// record's writer left them (0 when free).
        pub map_sum: u64,
        /// Nodes (bit n: node n) declared dead and not yet known quiet that
        /// may still write back a line of this chunk — its record or maps,
        /// written under a lock a recovery revoked from them. Set by
        /// recovery, cleared by the recovery that finds them quiet, and
        /// carried by every other write of the record, free ones included.
        /// A chunk with a taint is never taken for raw blocks: a late map
        /// line over raw blocks cannot be undone (nothing else in the region
        /// says where they are), while a KV chunk's maps are rebuilt from
        /// its entries.
        pub taint: u64,
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
        /// The grant sequence of the stripe lock under which this header
        /// was written. Below the lock's repair floor (which the grant
        /// carries), the header is void: a revoked holder wrote it after the
        /// repair, and the next holder has the stripe repaired again.
        pub ticket: u64,
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
        /// The stripe lock's ticket it was written under: below the lock's
        /// repair floor, a revoked holder's late write over a newer record.
        pub ticket: u64,
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
    ///
    /// Zombies: every bucket, empty ones too, carries the low 32 bits of the
    /// stripe lock's grant it was written under; recovery stamps them all
    /// with its own, which becomes the floor. A bucket stamped before the
    /// floor is a revoked holder's line written back late (it may hide a key
    /// or name a removed one): void, and its stripe's next holder has it
    /// repaired (see `HeldStripe::check_bucket`).
    pub struct Bucket {
        pub tag: u64,
        /// Entry index within the stripe + 1; 0 = empty.
        pub entry: u32,
        /// The writer's grant, its low 32 bits.
        pub stamp: u32,
    } size 16
}

shared_struct! {
    /// An index entry: one line, written under the stripe lock. `ver` is a
    /// sequence word (odd while being changed) for readers without the lock.
    pub struct Entry {
        pub ver: u16,
        pub state: u8,
        /// The node writing the entry (WRITING, QUARANTINED) + 1; 0 = none.
        /// Pins live in the pinners' journals, not here.
        pub writer: u8,
        pub gen: u32,
        pub key_lo: u64,
        pub key_hi: u64,
        pub ns: u32,
        pub tokens: u32,
        pub payload_off: u64,
        pub payload_len: u32,
        pub checksum: u32,
        /// The grant sequence of the stripe lock under which the line was
        /// written (recovery's, for every entry it rebuilt). Below the lock's
        /// repair floor the entry is void: a revoked holder's line written
        /// back after the repair, over whatever the entry held since. No
        /// holder uses it; the stripe is repaired again first.
        pub ticket: u64,
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

impl Entry {
    /// The writer's bit (node n: `1 << n`), 0 when none (or out of range).
    pub fn pinners(&self) -> u64 {
        match self.writer {
            w @ 1..=64 => 1u64 << w.wrapping_sub(1),
            _ => 0,
        }
    }
    /// Names node `n` the entry's writer (`None`: no writer).
    pub fn set_writer(&mut self, n: Option<u32>) {
        // Node ids are below `MAX_NODES` (64): `n + 1` fits a byte.
        self.writer = n.map_or(0, |n| (n.min(MAX_NODES - 1) as u8).wrapping_add(1));
    }
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
    /// A pin journal record: node-private, two per line. It names the
    /// entry's block too: a repair that loses the entry (a revoked holder's
    /// line landed over it) keeps the block for the node, which frees it
    /// when it lets go (see `Node::let_go_lost`).
    pub struct PinRecord {
        /// Global entry index + 1; 0 = free record.
        pub entry: u32,
        pub count: u32,
        pub gen: u64,
        /// The block's offset and length when the record was made.
        pub off: u64,
        pub len: u64,
    } size 32
}

shared_struct! {
    /// Head of one sender's ring in node n's inbox: how many of its slots
    /// the inbox's owner has consumed. Written only by the owner.
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

shared_struct! {
    /// First line of a tenant's slot: who it is and its limits. Written
    /// under the tenant's lock (and a slot taken or freed under the roots
    /// lock as well, which keeps names unique).
    pub struct TenantConfig {
        /// Its name, NUL-padded (1 to [`TENANT_NAME`] bytes, no NUL).
        pub name: [u8; 20],
        /// Relative weight (reported; eviction order among tenants above
        /// their share does not use it yet).
        pub priority: u32,
        /// Hard quota in payload bytes; 0 = none.
        pub quota: u64,
        /// Guaranteed share in payload bytes: eviction for another tenant
        /// never takes the tenant below it.
        pub share: u64,
        /// Lifetime of its blocks in milliseconds; 0 = none.
        pub ttl_ms: u64,
        /// Changes every time the slot is taken: a namespace bound to an
        /// earlier tenant of the slot names another nonce.
        pub nonce: u32,
        /// `TENANT_FREE`, `TENANT_LIVE` or `TENANT_DROPPING`.
        pub state: u16,
        /// `TENANT_SCRUB` or 0.
        pub flags: u16,
        /// The grant of the tenant's lock it was written under (recovery's
        /// for a slot it rebuilt): below the lock's repair floor, a revoked
        /// holder's line written back late.
        pub ticket: u64,
    } size 64
}

shared_struct! {
    /// Second line of a tenant's slot: what it holds, kept exact under its
    /// lock by every reserve, abort and removal of its blocks, rebuilt by
    /// recovery from the entries.
    pub struct TenantUsage {
        /// Payload bytes of its blocks being written or stored.
        pub bytes: u64,
        /// Its blocks being written or stored.
        pub blocks: u64,
        /// Its blocks evicted (for any tenant, itself included).
        pub evictions: u64,
        /// Reserves refused at its hard quota.
        pub refused: u64,
        /// The slot's nonce when the line was written.
        pub nonce: u32,
        pub pad: u32,
        /// As [`TenantConfig::ticket`].
        pub ticket: u64,
        /// Of its evictions, blocks removed past their lifetime.
        pub expired: u64,
        pub reserved: u64,
    } size 64
}

shared_struct! {
    /// Expiry stamps of [`EXPIRY_SLOTS`] entries of one stripe (entry `e`'s
    /// in line `e / EXPIRY_SLOTS`, word `e % EXPIRY_SLOTS`), written under
    /// the stripe lock by the reserve of an entry of a tenant's namespace
    /// (the default tenant's entries have none: nothing reads theirs).
    /// A stamp is `expiry_ms << 16 | (gen & 0xffff)`: the wall-clock
    /// millisecond from which the entry's block is expired (0: it has no
    /// lifetime), for the entry's generation `gen`. A stamp of another
    /// generation says nothing about the entry.
    ///
    /// Zombies: the line carries the stripe lock's grant it was written
    /// under (recovery stamps every line with its own); below the lock's
    /// repair floor it is a revoked holder's late line: void, its entries
    /// read as expired, and a holder meeting it has the stripe repaired.
    pub struct ExpiryLine {
        pub ticket: u64,
        pub at: [u64; 7],
    } size 64
}

/// Entries whose expiry stamps one [`ExpiryLine`] holds.
pub const EXPIRY_SLOTS: u32 = 7;

/// Longest tenant name.
pub const TENANT_NAME: usize = 20;
/// Most tenants a region holds (the default tenant's slot 0 included).
pub const MAX_TENANTS: u32 = 64;
/// Tenant slot states: never taken or dropped.
pub const TENANT_FREE: u16 = 0;
/// A tenant: its namespaces take blocks.
pub const TENANT_LIVE: u16 = 1;
/// Being dropped: its blocks are being removed, it takes no new ones.
pub const TENANT_DROPPING: u16 = 2;
/// Tenant flag: its blocks' payload is zeroed when they are removed,
/// before the space goes back to the allocator (see `Limits::scrub`).
pub const TENANT_SCRUB: u16 = 1;

/// Entry states.
pub mod state {
    /// Free entry.
    pub const EMPTY: u8 = 0;
    /// Reserved, payload being written; invisible to readers.
    pub const WRITING: u8 = 1;
    /// Published.
    pub const READY: u8 = 2;
    /// Being removed (transient under the stripe lock).
    pub const EVICTING: u8 = 3;
    /// Published, and offered for eviction: an evictor, holding the stripe
    /// lock, is looking for pins of it; it becomes READY again if it finds
    /// one, EVICTING if not. Readers treat it as gone; recovery makes it
    /// READY (its evictor died before deciding, or before it changed
    /// anything else).
    pub const CLAIMED: u8 = 4;
    /// A reservation of a node declared dead that is not known quiet
    /// (see [`super::Heartbeat::quiet`]): recovery keeps its block
    /// allocated, since the node may still store into it or its cache
    /// write the payload back late; the writer stays named in `writer`.
    /// Invisible to readers, in no bucket and on no list; the first
    /// recovery after its writer is quiet empties it.
    pub const QUARANTINED: u8 = 5;
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
/// Held out of use by recovery for a fenced node (`owner`) that was
/// releasing it: the node may still write back its release (a free record
/// and bitmap word) late. Its maps are empty; the first recovery after the
/// node is quiet frees it.
pub const CHUNK_HELD: u32 = 5;

/// Node info states.
pub const NODE_FREE: u32 = 0;
/// Attached.
pub const NODE_ALIVE: u32 = 1;
/// Declared dead, recovery pending.
pub const NODE_DEAD: u32 = 2;
/// Declared dead and recovered, but not known quiet (see
/// [`Heartbeat::quiet`]): its locks and pins are gone, its reservations and
/// raw blocks quarantined; the slot is freed by the first recovery after it
/// is quiet.
pub const NODE_FENCED: u32 = 3;

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
    h = TenantConfig::fold_layout(h);
    h = TenantUsage::fold_layout(h);
    h = ExpiryLine::fold_layout(h);
    h
};
