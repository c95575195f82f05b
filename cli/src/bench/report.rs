//! What `cxlkv bench` reports: the rows of each section, serialized for `--json`.

use serde::{Deserialize, Serialize};

/// What `cxlkv bench` reports (printed as tables, or as JSON with --json).
#[derive(Debug, Serialize)]
pub struct Report {
    pub unix_time: u64,
    /// Blocks and their size in the one-process rows.
    pub blocks: usize,
    pub block_bytes: usize,
    /// Cost per line of each flush primitive.
    pub flush: Vec<FlushRow>,
    /// The demo's payload checker against memcpy.
    pub checker: Vec<CheckerRow>,
    /// Every measure, per coherence mode.
    pub modes: Vec<ModeReport>,
}

/// One flush primitive's cost per 64-byte line.
#[derive(Debug, Serialize)]
pub struct FlushRow {
    pub primitive: &'static str,
    pub ns_per_line: f64,
    /// Against plain stores.
    pub x_plain: f64,
}

/// Bandwidth of one pass over payload bytes (the demo's pattern fill or
/// verify, or the memcpy reference).
#[derive(Debug, Serialize)]
pub struct CheckerRow {
    pub what: &'static str,
    pub gb_per_s: f64,
    /// Against the same run's memcpy.
    pub x_memcpy: f64,
}

/// The measures of one coherence mode.
#[derive(Debug, Serialize)]
pub struct ModeReport {
    pub mode: &'static str,
    /// Per-block costs in one process.
    pub rows: Vec<OpRow>,
    /// Copying puts of each block size, as users make them.
    pub put: Vec<PutReport>,
    pub cross_process: CrossProcess,
}

/// One operation's cost per block.
#[derive(Debug, Serialize)]
pub struct OpRow {
    pub op: &'static str,
    pub ns_per_block: f64,
}

/// The measures between two processes.
#[derive(Debug, Serialize)]
pub struct CrossProcess {
    pub working_set_bytes: usize,
    /// Waking a sleeping thread of another process (the floor under a grant
    /// by a sleeping manager there).
    pub wake_reference_ns: Quantiles,
    pub lock_other_process_uncontended: LockPeer,
    /// The same, each lock after a pause of 5 ms.
    pub lock_other_process_after_pause: LockPeer,
    /// Gets of each block size.
    pub get: Vec<GetReport>,
    pub rpc_round_trip_ns: Quantiles,
    pub handoff_ns: Quantiles,
    pub lock_contended: Contended,
}

/// Median and 99th percentile, nanoseconds.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Quantiles {
    pub p50: u64,
    pub p99: u64,
}

/// Lock+unlock by a process other than the manager's.
#[derive(Debug, Serialize, Deserialize)]
pub struct LockPeer {
    pub ns_per_op: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
}

/// Two processes contending for one lock.
#[derive(Debug, Serialize)]
pub struct Contended {
    pub ns_per_op: f64,
    pub peer_ns_per_op: f64,
}

/// Gets of one block size by a second process.
#[derive(Debug, Serialize, Deserialize)]
pub struct GetReport {
    pub bytes: usize,
    pub blocks: usize,
    /// The reader's first pass (page tables empty).
    pub cold: GetRow,
    /// Its second pass.
    pub warm: GetRow,
    /// Same-run memcpy from a faulted-in pool.
    pub memcpy: CopyRow,
    /// Same-run memcpy from a freshly mapped file.
    pub memcpy_cold: CopyRow,
}

/// QD1 puts of one block size through `Node::put` (what `cxlkv_put` and
/// Python's `Node.put` call), fresh keys over the working set.
#[derive(Debug, Serialize)]
pub struct PutReport {
    pub bytes: usize,
    pub blocks: usize,
    /// Payloads by the default stores of the mode (streaming where it flushes).
    pub default_stores: PutRow,
    /// Payloads by plain stores, then the mode's flush of every line.
    pub plain_stores: PutRow,
    /// Default stores into a full region (a quarter of the working set):
    /// each put evicts, in the second half of the puts, which alone count.
    pub full_region: PutRow,
    /// Blocks evicted per put of the full-region pass.
    pub full_evictions_per_put: f64,
    /// Same-run memcpy of as many blocks into a faulted-in /dev/shm mapping
    /// as large.
    pub memcpy: CopyRow,
}

/// One pass of puts.
#[derive(Debug, Serialize)]
pub struct PutRow {
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub gb_per_s: f64,
    /// Against the same run's memcpy.
    pub pct_of_memcpy: f64,
}

/// One pass of gets.
#[derive(Debug, Serialize, Deserialize)]
pub struct GetRow {
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub gb_per_s: f64,
    /// Against the memcpy of data as cold or as warm.
    pub pct_of_memcpy: f64,
}

/// A memcpy reference.
#[derive(Debug, Serialize, Deserialize)]
pub struct CopyRow {
    pub p50_ns: f64,
    pub gb_per_s: f64,
}

/// What the echo peer measured.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Echo {
    pub(super) handoff_ns: Quantiles,
}

/// What the lock peer measured.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct LockRun {
    pub(super) ns_per_op: f64,
    pub(super) p50_ns: u64,
    pub(super) p99_ns: u64,
}
