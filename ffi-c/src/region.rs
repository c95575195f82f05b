//! Regions and nodes: map a region (file, /dev/shm, hugetlb memfd, device
//! DAX), format it, attach nodes (each with its heartbeat and lock-manager
//! thread), and the node-wide operations: stats, evict, recover, check.

use core::ffi::c_char;
use std::path::Path;
use std::time::Duration;

use cxlkv_platform::kv::Lru;
use cxlkv_platform::kv::{Capacities, NodeStats};
use cxlkv_platform::{FlushMode, Node, Options, Region};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::{cxlkv_result, guard, handle, slice_mut, text, Live, Out, Res, Shell};

/// A mapped region (opaque). Made by `cxlkv_region_create`, `_open` or
/// `_memfd`; closed by `cxlkv_region_close`. Nodes attached to it keep the
/// mapping alive after the handle is closed.
pub struct cxlkv_region(Shell<Region>);

/// An attached node (opaque): the handle of every cache operation. Made by
/// `cxlkv_node_attach`, closed by `cxlkv_node_detach`.
pub struct cxlkv_node(Shell<Node>);

const REGION_MAGIC: u64 = u64::from_le_bytes(*b"cxlkvREG");
const NODE_MAGIC: u64 = u64::from_le_bytes(*b"cxlkvNOD");

/// Any free node slot (for `cxlkv_node_options.node_id`).
pub const CXLKV_ANY_NODE: u32 = u32::MAX;

/// Cache maintenance: the cheapest mode of this CPU that is correct on
/// non-coherent CXL memory (clwb, else clflushopt, else clflush on x86-64;
/// dc civac on aarch64), payloads by streaming stores: the mode called
/// `auto` at every door.
pub const CXLKV_FLUSH_AUTO: u32 = 0;
/// The former name of `CXLKV_FLUSH_AUTO`, kept for existing callers.
pub const CXLKV_FLUSH_DEFAULT: u32 = CXLKV_FLUSH_AUTO;
/// No cache maintenance: only for memory that is coherent for every user
/// (one host, /dev/shm).
pub const CXLKV_FLUSH_COHERENT: u32 = 1;
/// x86 clflush.
pub const CXLKV_FLUSH_CLFLUSH: u32 = 2;
/// x86 clflushopt + sfence.
pub const CXLKV_FLUSH_CLFLUSHOPT: u32 = 3;
/// x86 clwb + sfence (invalidation by clflushopt).
pub const CXLKV_FLUSH_CLWB: u32 = 4;
/// aarch64 dc cvac / dc civac + dsb sy.
pub const CXLKV_FLUSH_DC_CIVAC: u32 = 5;

fn mode(m: u32) -> Res<FlushMode> {
    Ok(match m {
        CXLKV_FLUSH_AUTO => FlushMode::default_for_arch(),
        CXLKV_FLUSH_COHERENT => FlushMode::Coherent,
        CXLKV_FLUSH_CLFLUSH => FlushMode::Clflush,
        CXLKV_FLUSH_CLFLUSHOPT => FlushMode::Clflushopt,
        CXLKV_FLUSH_CLWB => FlushMode::Clwb,
        CXLKV_FLUSH_DC_CIVAC => FlushMode::DcCivac,
        _ => return Err(cxlkv_result::InvalidArgument.into()),
    })
}

/// Capacities of a region, chosen when it is formatted. Start from
/// `cxlkv_capacities_default`. The fields are core's table of capacities
/// (`Capacities::FIELDS`), in its order: a test holds them to it.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct cxlkv_capacities {
    /// Node slots (1 to 64).
    pub max_nodes: u32,
    /// Index stripes, each with its own lock (a power of two, at most 128).
    pub n_stripes: u32,
    /// Index entries per stripe: the most blocks a stripe holds.
    pub entries_per_stripe: u32,
    /// Named roots.
    pub n_roots: u32,
    /// Pins each node may hold at once (a multiple of 4).
    pub pin_slots: u32,
    /// log2 of the allocator's chunk size (12 to 32; 21 = 2 MiB).
    pub chunk_shift: u32,
    /// Slots of each sender's ring in each node's inbox (a power of two);
    /// an inbox holds one ring per node.
    pub inbox_slots: u32,
    /// Application locks (`cxlkv_lock_alloc`), at most 128.
    pub app_locks: u32,
    /// Tier directories: hosts whose SSD tier the region can record (at
    /// most 64; 0 for none).
    pub tier_slots: u32,
    /// Records of each tier directory (a power of two, 2 to 2^26): blocks
    /// one SSD tier can make known to the rack, up to three quarters of it.
    pub tier_records: u32,
    /// Records of each stripe's change log (a power of two, 4 to 2^20): how
    /// far a reader of the log may fall behind before it must rescan.
    pub change_records: u32,
    /// Tenant slots, the default tenant's included (1 to 64).
    pub max_tenants: u32,
}

// The same table on both sides (equal sizes checked by `transmute!`, names
// and order by the test `c_structs_are_the_tables`): converted whole.
impl From<Capacities> for cxlkv_capacities {
    fn from(c: Capacities) -> Self {
        zerocopy::transmute!(c)
    }
}

impl From<cxlkv_capacities> for Capacities {
    fn from(c: cxlkv_capacities) -> Self {
        zerocopy::transmute!(c)
    }
}

/// How a node attaches. Start from `cxlkv_node_options_default`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_node_options {
    /// Node slot to claim, or `CXLKV_ANY_NODE` for the first free one. Nodes
    /// on different hosts should be given disjoint ids.
    pub node_id: u32,
    /// One of `CXLKV_FLUSH_*`.
    pub flush_mode: u32,
    /// A heartbeat silent this long (ms) means the node is dead.
    pub lease_ms: u32,
    /// Give up waiting for a lock after this long (ms).
    pub lock_timeout_ms: u32,
    /// After claiming the lock-manager role, wait this long (ms) before
    /// granting, so that a node that claimed it at the same moment sees it
    /// lost (default 50; a few ms suffice on one host).
    pub settle_ms: u32,
    /// Recover automatically when a node is declared dead.
    pub auto_recover: bool,
    /// Directory of the host-local lock file; NULL for /dev/shm.
    pub local_dir: *const c_char,
}

/// Writes the default capacities (16 nodes, 16 stripes of 4096 entries, 1024
/// roots, 512 pins, 2 MiB chunks, 64 inbox slots, 64 application locks).
///
/// # Safety
/// `out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_capacities_default(out: *mut cxlkv_capacities) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        out.write(Capacities::default().into());
        Ok(())
    })
}

/// Writes the default node options (any slot, default flush mode, 2 s lease,
/// 60 s lock timeout, automatic recovery, /dev/shm).
///
/// # Safety
/// `out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_node_options_default(out: *mut cxlkv_node_options) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        let d = Options::default();
        let o = cxlkv_node_options {
            node_id: CXLKV_ANY_NODE,
            flush_mode: CXLKV_FLUSH_AUTO,
            lease_ms: d.lease.as_millis() as u32,
            lock_timeout_ms: d.lock_timeout.as_millis() as u32,
            settle_ms: d.settle.as_millis() as u32,
            auto_recover: d.auto_recover,
            local_dir: core::ptr::null(),
        };
        out.write(o);
        Ok(())
    })
}

fn new_region(out: Out<*mut cxlkv_region>, r: Region) {
    out.write(Box::into_raw(Box::new(cxlkv_region(Shell::new(REGION_MAGIC, r)))));
}

/// Creates a region file of `size` bytes at `path` (a file, or one in
/// /dev/shm or on hugetlbfs), readable and writable by its owner only. It is
/// not formatted: call `cxlkv_region_format`. `overwrite` false refuses an
/// existing file (CXLKV_RESULT_IO). A device-DAX path (/dev/daxX.Y) is
/// opened instead: the device is the region, whatever `size` says.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_region_create(
    path: *const c_char,
    size: u64,
    overwrite: bool,
    out: *mut *mut cxlkv_region,
) -> cxlkv_result {
    // SAFETY: the same contract, passed on whole.
    unsafe { cxlkv_region_create_mode(path, size, overwrite, cxlkv_platform::region::REGION_FILE_MODE, out) }
}

/// `cxlkv_region_create` with the file's permission bits: `mode` exactly,
/// whatever the umask (0600 is the default, its owner alone; 0660 lets its
/// group map it too). CXLKV_RESULT_INVALID_ARGUMENT for bits beyond 0777 or
/// a mode its owner cannot read and write. Neither call replaces a file
/// another user owns (CXLKV_RESULT_IO). Every process that maps a region can
/// read and write all of it: the mode is the boundary between users.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_region_create_mode(
    path: *const c_char,
    size: u64,
    overwrite: bool,
    mode: u32,
    out: *mut *mut cxlkv_region,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `path` is NUL-terminated by the contract.
        let p = unsafe { text(path) }?;
        new_region(out, Region::create_with_mode(Path::new(p), size, overwrite, mode)?);
        Ok(())
    })
}

/// Maps the existing region at `path`: a file, /dev/shm, hugetlbfs or a
/// device-DAX character device (/dev/daxX.Y).
///
/// # Safety
/// `path` is a NUL-terminated string; `out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_region_open(path: *const c_char, out: *mut *mut cxlkv_region) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `path` is NUL-terminated by the contract.
        let p = unsafe { text(path) }?;
        new_region(out, Region::open(Path::new(p))?);
        Ok(())
    })
}

/// Creates an anonymous shared region of `size` bytes (memfd; on 2 MiB huge
/// pages when `hugetlb`), shared with processes forked afterwards. Not
/// formatted.
///
/// # Safety
/// `out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_region_memfd(size: u64, hugetlb: bool, out: *mut *mut cxlkv_region) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        new_region(out, Region::memfd(size, hugetlb)?);
        Ok(())
    })
}

/// Formats the region with `caps` (NULL: defaults), erasing what it held.
/// Formatting writes the header last, so a crash leaves an unformatted
/// region, never a half-formatted one. CXLKV_RESULT_BUSY when a node of this
/// process is attached to it; nodes of other processes must be detached.
///
/// # Safety
/// `region` is a handle from this library or NULL; `caps` is NULL or valid
/// for one read.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_region_format(
    region: *const cxlkv_region,
    caps: *const cxlkv_capacities,
    flush_mode: u32,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `region` is NULL or a shell from this library.
        let r = unsafe { handle(region) }?.0.live(REGION_MAGIC)?;
        let caps = if caps.is_null() {
            Capacities::default()
        } else {
            // SAFETY:
            // - `caps` non-NULL and valid for a read by the contract.
            Capacities::from(unsafe { caps.read() })
        };
        r.format(caps, mode(flush_mode)?)?;
        Ok(())
    })
}

/// The region's mapped size in bytes.
///
/// # Safety
/// `region` is a handle from this library or NULL; `out` is valid for one
/// write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_region_size(region: *const cxlkv_region, out: *mut u64) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `region` is NULL or a shell from this library.
        let r = unsafe { handle(region) }?.0.live(REGION_MAGIC)?;
        out.write(r.len());
        Ok(())
    })
}

/// Closes the region handle. Accepts NULL and closed handles (does nothing).
/// Nodes attached through it stay usable until detached.
///
/// # Safety
/// `region` is NULL or a handle from this library, not in use by another
/// thread.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_region_close(region: *mut cxlkv_region) {
    let _ = guard(|| {
        // SAFETY:
        // - `region` is NULL or a handle from this library.
        if let Ok(r) = unsafe { handle(region) } {
            drop(r.0.close(REGION_MAGIC));
        }
        Ok(())
    });
}

/// Attaches a node to the formatted region (`opts` NULL: defaults). Starts
/// the node's background thread (heartbeat, lock manager). Each process
/// may attach several nodes; each is one participant of the region.
///
/// # Safety
/// `region` is a handle from this library or NULL; `opts` is NULL or valid
/// for one read (its `local_dir` NULL or NUL-terminated); `out` is valid for
/// one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_node_attach(
    region: *const cxlkv_region,
    opts: *const cxlkv_node_options,
    out: *mut *mut cxlkv_node,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `region` is NULL or a shell from this library.
        let r = Region::clone(&*unsafe { handle(region) }?.0.live(REGION_MAGIC)?);
        // SAFETY:
        // - `opts` is NULL or valid for one read (its `local_dir` NULL or
        //   NUL-terminated) by the contract.
        let o = unsafe { node_options(opts) }?;
        let node = r.attach(o)?;
        out.write(Box::into_raw(Box::new(cxlkv_node(Shell::new(NODE_MAGIC, node)))));
        Ok(())
    })
}

/// The options `opts` describes (NULL: defaults).
///
/// # Safety
/// `opts` is NULL or valid for one read, its `local_dir` NULL or
/// NUL-terminated.
pub(crate) unsafe fn node_options(opts: *const cxlkv_node_options) -> Res<Options> {
    let mut o = Options::default();
    if !opts.is_null() {
        // SAFETY:
        // - `opts` non-NULL and valid for a read by the contract.
        let c = unsafe { opts.read() };
        o.node = (c.node_id != CXLKV_ANY_NODE).then_some(c.node_id);
        o.mode = mode(c.flush_mode)?;
        o.lease = Duration::from_millis(c.lease_ms as u64);
        o.lock_timeout = Duration::from_millis(c.lock_timeout_ms as u64);
        o.settle = Duration::from_millis(c.settle_ms as u64);
        o.auto_recover = c.auto_recover;
        if !c.local_dir.is_null() {
            // SAFETY:
            // - non-NULL `local_dir` is NUL-terminated by the contract.
            o.local_dir = unsafe { text(c.local_dir) }?.into();
        }
    }
    Ok(o)
}

/// The region behind `region`, for one call.
///
/// # Safety
/// `region` is NULL or a handle from this library.
pub(crate) unsafe fn live_region(region: *const cxlkv_region) -> Res<Region> {
    // SAFETY:
    // - `region` is NULL or a handle from this library (caller's contract).
    Ok(Region::clone(&*unsafe { handle(region) }?.0.live(REGION_MAGIC)?))
}

/// Detaches the node: drops every pin and reservation it holds, stops its
/// thread and frees its slot. Refuses with CXLKV_RESULT_BUSY, changing
/// nothing (the handle stays open), while the node holds an application
/// lock: release it first. Otherwise the handle is closed even when this
/// fails (CXLKV_RESULT_REVOKED: the node had been declared dead; recovery
/// frees what it held). Accepts NULL and closed handles (returns OK).
///
/// # Safety
/// `node` is NULL or a handle from this library, not in use by another
/// thread.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_node_detach(node: *mut cxlkv_node) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let Ok(n) = (unsafe { handle(node) }) else { return Ok(()) };
        if let Ok(c) = n.0.live(NODE_MAGIC) {
            if c.held_app_lock()?.is_some() {
                return Err(cxlkv_result::Busy.into());
            }
        }
        match n.0.close(NODE_MAGIC) {
            Some(c) => Ok(c.close()?),
            None => Ok(()),
        }
    })
}

/// The live node behind `node`, for one call.
///
/// # Safety
/// `node` is NULL or a handle from this library.
pub(crate) unsafe fn live<'a>(node: *const cxlkv_node) -> Res<Live<'a, Node>> {
    // SAFETY:
    // - `node` is NULL or a handle from this library (caller's contract).
    unsafe { handle(node) }?.0.live(NODE_MAGIC)
}

/// This node's id (its slot in the node table).
///
/// # Safety
/// `node` is a handle from this library or NULL; `out` is valid for one
/// write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_node_id(node: *const cxlkv_node, out: *mut u32) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        out.write(c.id());
        Ok(())
    })
}

/// A node's counters: core's table of them (`NodeStats::COUNTERS`), in its
/// order (a test holds the header to it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct cxlkv_counters {
    /// Blocks found (lookup, acquire, get).
    pub hits: u64,
    /// Blocks not found.
    pub misses: u64,
    /// Blocks reserved.
    pub inserts: u64,
    /// Puts refused because the key was stored.
    pub exists: u64,
    /// Blocks evicted.
    pub evictions: u64,
    /// Payload bytes written.
    pub bytes_written: u64,
    /// Payload bytes read.
    pub bytes_read: u64,
    /// Blocks asked of an SSD tier that did not come back within the wait
    /// (they read as misses).
    pub tier_timeouts: u64,
}

// The same table on both sides (sizes checked by `transmute!`, names and
// order by the test `c_structs_are_the_tables`): converted whole.
impl From<NodeStats> for cxlkv_counters {
    fn from(s: NodeStats) -> Self {
        zerocopy::transmute!(s)
    }
}

/// A snapshot of a node's and its region's state (`cxlkv_node_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_stats {
    /// This node's counters.
    pub node: cxlkv_counters,
    /// The counters of every attached (or dead, not yet recovered) node.
    pub total: cxlkv_counters,
    /// Attached nodes, one bit per node id.
    pub alive_mask: u64,
    /// Nodes declared dead whose recovery is pending.
    pub dead_mask: u64,
    /// Published blocks.
    pub live_blocks: u64,
    /// Their payload bytes.
    pub live_bytes: u64,
    /// The region's payload capacity in bytes.
    pub capacity_bytes: u64,
}

/// Counters, liveness (which nodes are alive or dead) and occupancy. Reads
/// without locks: a snapshot.
///
/// # Safety
/// `node` is a handle from this library or NULL; `out` is valid for one
/// write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_node_stats(node: *const cxlkv_node, out: *mut cxlkv_stats) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let s = c.stats()?;
        out.write(cxlkv_stats {
            node: s.node.into(),
            total: s.total.into(),
            alive_mask: s.alive,
            dead_mask: s.dead,
            live_blocks: s.live_entries,
            live_bytes: s.live_bytes,
            capacity_bytes: s.payload_bytes,
        });
        Ok(())
    })
}

/// What `cxlkv_evict` freed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_evict_report {
    /// Blocks evicted.
    pub blocks: u64,
    /// Payload bytes freed.
    pub bytes: u64,
}

/// Evicts least-recently-used unpinned blocks until at least `bytes` of
/// payload are freed or none is left to evict. `out` may be NULL.
///
/// # Safety
/// `node` is a handle from this library or NULL; `out` is NULL or valid for
/// one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_evict(
    node: *const cxlkv_node,
    bytes: u64,
    out: *mut cxlkv_evict_report,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is NULL or valid for one write by the contract.
        let out = unsafe { Out::maybe(out) };
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let r = c.core().evict(bytes, &mut Lru)?;
        if let Some(o) = out {
            o.write(cxlkv_evict_report { blocks: r.entries, bytes: r.bytes });
        }
        Ok(())
    })
}

/// What `cxlkv_recover` did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_recover_report {
    /// Dead nodes whose slots were freed (bit per node id).
    pub nodes_freed: u64,
    /// Pins of dead nodes dropped.
    pub pins_dropped: u64,
    /// Reservations of dead nodes aborted.
    pub writes_aborted: u64,
    /// Corrupt or duplicated entries dropped.
    pub entries_dropped: u64,
    /// Unreferenced payload blocks returned to the allocator.
    pub blocks_reclaimed: u64,
    /// Chunks returned to the global bitmap.
    pub chunks_reclaimed: u64,
    /// Locks that awaited repair.
    pub locks_repaired: u32,
    /// Always 0.
    pub reserved: u32,
    /// Reservations of dead nodes not known quiet, kept allocated until
    /// they are (quarantined).
    pub writes_quarantined: u64,
    /// Dead nodes not known quiet, fenced rather than freed (bit per node id).
    pub nodes_fenced: u64,
}

/// Recovers the region: nodes declared dead lose their pins, reservations
/// and slots, and every structure is rebuilt from its state of record.
/// Other nodes keep working meanwhile. Nodes recover automatically unless
/// attached with `auto_recover` false. `out` may be NULL.
///
/// # Safety
/// `node` is a handle from this library or NULL; `out` is NULL or valid for
/// one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_recover(node: *const cxlkv_node, out: *mut cxlkv_recover_report) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is NULL or valid for one write by the contract.
        let out = unsafe { Out::maybe(out) };
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let r = c.recover()?;
        if let Some(o) = out {
            o.write(cxlkv_recover_report {
                nodes_freed: r.nodes_freed,
                pins_dropped: r.pins_dropped,
                writes_aborted: r.writes_aborted,
                entries_dropped: r.entries_dropped,
                blocks_reclaimed: r.blocks_reclaimed,
                chunks_reclaimed: r.chunks_reclaimed,
                locks_repaired: r.locks_repaired,
                reserved: 0,
                writes_quarantined: r.writes_quarantined,
                nodes_fenced: r.nodes_fenced,
            });
        }
        Ok(())
    })
}

/// An operator's word that node `n`, declared dead, will never store again
/// (its host is powered off, or was rebooted since): the next recovery frees
/// the reservations and raw blocks kept quarantined for it. Never say it of
/// a host that may only be stopped: should it resume, its late stores land
/// in blocks others reuse. `*said` is true when said now, false when `n` is
/// not dead or is quiet already; a node id beyond the region's is
/// CXLKV_RESULT_BAD_NODE.
///
/// # Safety
/// `node` is a handle from this library or NULL; `said` is valid for one
/// write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_declare_quiet(node: *const cxlkv_node, n: u32, said: *mut bool) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `said` is valid for one write by the contract (NULL is refused).
        let said = unsafe { Out::new(said) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        said.write(c.declare_quiet(n)?);
        Ok(())
    })
}

/// One violated invariant found by `cxlkv_check`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_finding {
    /// What is wrong, NUL-terminated.
    pub what: [c_char; 48],
    /// First location (node, lock, stripe, chunk... by kind).
    pub a: u64,
    /// Second location.
    pub b: u64,
}

/// Checks every invariant of the region (read-only; meaningful when no
/// writer is active). Writes up to `cap` findings to `findings` (NULL when
/// `cap` is 0) and their total number to `*n_findings`; 0 means clean.
///
/// # Safety
/// `node` is a handle from this library or NULL; `findings` is valid for
/// `cap` writes; `n_findings` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_check(
    node: *const cxlkv_node,
    findings: *mut cxlkv_finding,
    cap: usize,
    n_findings: *mut usize,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `n_findings` is valid for one write by the contract.
        let n_out = unsafe { Out::new(n_findings) }?;
        // SAFETY:
        // - `findings` is valid for `cap` writes by the contract.
        let out = unsafe { slice_mut(findings, cap) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let all = c.check()?;
        for (o, f) in out.iter_mut().zip(&all) {
            let mut what = [0 as c_char; 48];
            for (w, b) in what.iter_mut().zip(f.kind.as_str().bytes().take(47)) {
                *w = b as c_char;
            }
            *o = cxlkv_finding { what, a: f.a, b: f.b };
        }
        n_out.write(all.len());
        Ok(())
    })
}

#[cfg(test)]
mod capacity_table {
    use super::*;

    /// The fields of C struct `name` as the header declares it.
    fn header_fields(name: &str, ty: &str) -> Vec<&'static str> {
        let header = include_str!("../include/cxlkv.h");
        let body = header
            .split(&format!("struct {name} {{"))
            .nth(1)
            .and_then(|rest| rest.split('}').next())
            .unwrap_or_else(|| panic!("cxlkv.h declares struct {name}"));
        body.lines()
            .map(str::trim)
            .filter_map(|l| l.strip_prefix(ty).and_then(|l| l.strip_suffix(';')))
            .map(str::trim)
            .collect()
    }

    /// Every flush mode of platform's table (`FlushMode::ALL`) has its
    /// `CXLKV_FLUSH_<NAME>` in the header, and the C door reads that number
    /// as that mode; `CXLKV_FLUSH_AUTO` is the architecture's choice.
    #[test]
    fn every_flush_mode_has_its_c_constant() {
        let header = include_str!("../include/cxlkv.h");
        let number = |name: &str| -> u32 {
            let prefix = format!("#define {name} ");
            let line = header.lines().find_map(|l| l.strip_prefix(prefix.as_str()));
            line.and_then(|v| v.trim().parse().ok()).unwrap_or_else(|| panic!("cxlkv.h defines {name} as a number"))
        };
        for m in FlushMode::ALL {
            let name = format!("CXLKV_FLUSH_{}", m.name().to_uppercase().replace('-', "_"));
            assert_eq!(mode(number(&name)).ok(), Some(m), "{name}");
        }
        assert_eq!(mode(number("CXLKV_FLUSH_AUTO")).ok(), Some(FlushMode::default_for_arch()));
        assert!(mode(6).is_err());
    }

    /// The C structs (as the header declares them) list core's tables of
    /// capacities and counters, name by name, in order; values cross.
    #[test]
    fn c_structs_are_the_tables() {
        let table: Vec<&str> = Capacities::FIELDS.iter().map(|f| f.name).collect();
        assert_eq!(header_fields("cxlkv_capacities", "uint32_t "), table);
        let counters: Vec<&str> = NodeStats::COUNTERS.iter().map(|f| f.name).collect();
        assert_eq!(header_fields("cxlkv_counters", "uint64_t "), counters);
        let stats = NodeStats { hits: 1, tier_timeouts: 8, ..NodeStats::default() };
        let c = cxlkv_counters::from(stats);
        assert_eq!((c.hits, c.tier_timeouts), (1, 8));
        let mut caps = Capacities::default();
        for (i, f) in Capacities::FIELDS.iter().enumerate() {
            assert!(caps.set(f.name, 1000 + i as u32));
        }
        let c = cxlkv_capacities::from(caps);
        assert_eq!(c.max_nodes, 1000, "the first field is the first of the table");
        assert_eq!(Capacities::from(c), caps);
    }
}
