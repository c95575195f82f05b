//! The command line: every subcommand and its arguments, declared with clap
//! (help, defaults and validation come from here).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use cxlkv_platform::kv::Capacities;
use cxlkv_platform::FlushMode;

/// cxlkv — a shared-memory KV-cache block store.
#[derive(Parser)]
#[command(name = "cxlkv", version, arg_required_else_help = true, after_help = "Sizes take units: 64M, 2G, 512K.")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Runs the main job: prefill processes store KV blocks of prompts into
    /// one region and hand them to decode processes, which look up, pin and
    /// verify every byte; reports throughput and latencies.
    Demo(DemoArgs),
    /// Creates (or overwrites, with --force) a region file and formats it;
    /// a device-DAX path is formatted in place.
    Format(FormatArgs),
    /// Shows what a region holds, read without attaching a node.
    Inspect(PathArgs),
    /// Checks a region's invariants (and, with --tier, this host's SSD tier
    /// slots against it): exit 0 clean, 1 findings, 2 cannot open.
    Check(CheckArgs),
    /// Frees dead nodes and reclaims what they held.
    Recover(RecoverArgs),
    /// Prints the region's metrics (per node and region-wide), read without
    /// attaching a node: for people, as JSON, or with --prometheus in the
    /// OpenMetrics text format.
    Stats(StatsArgs),
    /// A live view of the region, refreshed every --interval: occupancy,
    /// then each node's state and rates (operations, hit rate, bytes read
    /// and written, evictions, lock grants and their wait, inbox, pins).
    /// Read without attaching a node; --once prints one frame and exits.
    Top(TopArgs),
    /// Serves the region's metrics over HTTP (GET /metrics, OpenMetrics
    /// text) for Prometheus to scrape, read without attaching a node, until
    /// SIGINT or SIGTERM (or --seconds).
    ServeMetrics(ServeArgs),
    /// Follows the region's change log and prints its block events, one
    /// JSON object per line: first `cleared` and every stored block, then
    /// each store and removal by any node as it happens. Read without
    /// attaching a node, until SIGINT or SIGTERM (or --seconds). With
    /// --zmq, publishes them to KV-aware routers as vLLM KV events instead
    /// (through an attached node, which reads the blocks' route records).
    Events(EventsArgs),
    /// Runs this host's SSD tier: copies cold blocks to slot files on the
    /// given drives ahead of eviction, records them in the region for the
    /// rack, and puts them back when a node asks. Runs until SIGINT or
    /// SIGTERM (or --seconds).
    Tier(TierArgs),
    /// A region's tenants: add, set (quota, share, priority), list with
    /// usage, drop.
    Tenant(crate::tenant::TenantArgs),
    /// Measures the data path through the calls the C API makes, beside
    /// same-run references.
    Bench(BenchArgs),
    /// Checks and measures the GPU path: exit 0 passed, 1 a check failed,
    /// 2 CUDA unavailable.
    GpuCheck(GpuArgs),
    /// A process the bench starts (not for people).
    #[command(hide = true)]
    BenchPeer(Helper),
    /// A process the demo starts (not for people).
    #[command(hide = true)]
    DemoWorker(Helper),
}

/// Cache maintenance: coherent, clflush, clflushopt, clwb, dc-civac or
/// auto (the architecture's safe choice).
pub(crate) fn flush_mode(s: &str) -> Result<FlushMode, String> {
    let m: FlushMode = s.parse().map_err(|_| {
        let names: Vec<&str> = FlushMode::ALL.iter().map(|m| m.name()).collect();
        format!("not a flush mode: {s} (one of: auto, fastest, {})", names.join(", "))
    })?;
    if !m.available() {
        return Err(format!("flush mode {} not available on this CPU", m.name()));
    }
    Ok(m)
}

/// A size with units (64M, 2G, 512K).
pub(crate) fn size(s: &str) -> Result<u64, String> {
    cxlkv_platform::size::parse_size(s).map_err(|_| format!("not a size: {s}"))
}

#[derive(Args)]
pub(crate) struct ModeArg {
    /// Cache maintenance (coherent, clflush, clflushopt, clwb, auto).
    #[arg(long, value_parser = flush_mode, default_value = "auto")]
    pub(crate) mode: FlushMode,
}

#[derive(Args)]
pub(crate) struct PathArgs {
    /// The region: a file, /dev/shm, hugetlbfs or /dev/daxX.Y.
    pub(crate) path: PathBuf,
    #[command(flatten)]
    pub(crate) mode: ModeArg,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    pub(crate) at: PathArgs,
    /// A drive directory of this host's tier (repeat for more drives, in
    /// the order the tier was started with): every slot is read, payload
    /// included, and checked against its checksum.
    #[arg(long = "tier")]
    pub(crate) tier: Vec<PathBuf>,
    /// The tier's slot size (as `cxlkv tier --slot-size`).
    #[arg(long, value_parser = size, default_value = "2M")]
    pub(crate) slot_size: u64,
}

#[derive(Args)]
pub(crate) struct RecoverArgs {
    #[command(flatten)]
    pub(crate) at: PathArgs,
    /// Attach as this node slot (default: the first free one).
    #[arg(long)]
    pub(crate) node: Option<u32>,
    /// Node N, declared dead, will never store again: its host is powered
    /// off, or was rebooted since (repeatable). Recovery then frees the
    /// reservations and raw blocks it keeps for a dead node until the node
    /// says it is quiet (it does when it wakes and closes, or a process of
    /// its host does once its process is gone). Never for a host that may
    /// only be stopped: should it resume, its late stores would land in
    /// blocks others reuse.
    #[arg(long = "quiet", value_name = "N")]
    pub(crate) quiet: Vec<u32>,
}

#[derive(Args)]
pub(crate) struct TopArgs {
    #[command(flatten)]
    pub(crate) at: PathArgs,
    /// Seconds between frames (the rates are over this interval).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) interval: f64,
    /// Print one frame (rates over one interval) and exit.
    #[arg(long)]
    pub(crate) once: bool,
}

#[derive(Args)]
pub(crate) struct StatsArgs {
    #[command(flatten)]
    pub(crate) at: PathArgs,
    /// Print the OpenMetrics text format (what Prometheus scrapes).
    #[arg(long)]
    pub(crate) prometheus: bool,
}

#[derive(Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) at: PathArgs,
    /// Address to listen on (loopback unless another is given; port 0
    /// picks a free one, printed at start).
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub(crate) listen: std::net::SocketAddr,
    /// Stop after this many seconds.
    #[arg(long)]
    pub(crate) seconds: Option<u64>,
}

#[derive(Args)]
pub(crate) struct EventsArgs {
    #[command(flatten)]
    pub(crate) at: PathArgs,
    /// Stop after this many seconds.
    #[arg(long)]
    pub(crate) seconds: Option<u64>,
    /// Milliseconds between polls of the log.
    #[arg(long, default_value_t = 10)]
    pub(crate) interval_ms: u64,
    /// Publish to KV-aware routers instead of printing: vLLM
    /// `KVEventBatch`es on a ZMQ PUB socket bound here (tcp://HOST:PORT;
    /// port 0 takes a free one). Prints the bound endpoints as one JSON
    /// line.
    #[arg(long, value_name = "ENDPOINT")]
    pub(crate) zmq: Option<String>,
    /// With --zmq: bind vLLM's replay socket (ROUTER) here.
    #[arg(long, value_name = "ENDPOINT", requires = "zmq")]
    pub(crate) replay: Option<String>,
    /// With --zmq: the topic frame of every message.
    #[arg(long, default_value = "", requires = "zmq")]
    pub(crate) topic: String,
    /// With --zmq: the events' medium.
    #[arg(long, default_value = "CXL", requires = "zmq")]
    pub(crate) medium: String,
    /// With --zmq: block hashes as vLLM's integers (int: the key's last 8
    /// bytes, big-endian, unsigned), as SGLang's (int64: the same bytes as
    /// a signed integer, SGLang's hash_str_to_int64 of the page hash for
    /// pages its adapter stored), or as the key's 16 bytes.
    #[arg(long, value_enum, default_value = "int", requires = "zmq")]
    pub(crate) hash: HashArg,
    /// With --zmq: publish only this namespace's blocks (repeat for more).
    #[arg(long = "ns", requires = "zmq")]
    pub(crate) namespaces: Vec<u32>,
    /// With --zmq: the batches' data-parallel rank.
    #[arg(long, requires = "zmq")]
    pub(crate) dp_rank: Option<i64>,
    /// With --zmq: batches kept for replay.
    #[arg(long, default_value_t = 10_000, requires = "zmq")]
    pub(crate) buffer: usize,
    /// With --zmq: publish without attaching a node. Stored events then
    /// carry the block hash alone: the blocks' route records (token ids,
    /// parent, block size) are read through a node.
    #[arg(long, requires = "zmq")]
    pub(crate) observe: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum HashArg {
    Int,
    Int64,
    Bytes,
}

#[derive(Args)]
pub(crate) struct TierArgs {
    #[command(flatten)]
    pub(crate) at: PathArgs,
    /// A directory on a drive, one per drive (repeat for more drives):
    /// an SSD's file system with O_DIRECT, not tmpfs (RAM: warned) or
    /// ramfs (refused).
    #[arg(long = "dir", required = true)]
    pub(crate) dirs: Vec<PathBuf>,
    /// Largest block a slot holds.
    #[arg(long, value_parser = size, default_value = "2M")]
    pub(crate) slot_size: u64,
    /// Slot file size per drive.
    #[arg(long, value_parser = size, default_value = "1G")]
    pub(crate) capacity: u64,
    /// Copy cold blocks out once the region is this full (0 to 1).
    #[arg(long, default_value_t = 0.7)]
    pub(crate) high_water: f64,
    /// Blocks copied out per round at most.
    #[arg(long, default_value_t = 64)]
    pub(crate) batch: usize,
    /// Stop after this many seconds.
    #[arg(long)]
    pub(crate) seconds: Option<u64>,
}

#[derive(Args)]
pub(crate) struct FormatArgs {
    /// The region file to create, or a device-DAX device.
    pub(crate) path: PathBuf,
    /// Region size.
    #[arg(long, value_parser = size)]
    pub(crate) size: u64,
    /// Node slots (1 to 64).
    #[arg(long, default_value_t = Capacities::default().max_nodes)]
    pub(crate) nodes: u32,
    /// Index stripes (a power of two, at most 128).
    #[arg(long, default_value_t = Capacities::default().n_stripes)]
    pub(crate) stripes: u32,
    /// Index entries in all, spread over the stripes [default: 4096 per
    /// stripe]
    #[arg(long)]
    pub(crate) entries: Option<u32>,
    /// Allocator chunk size (a power of two).
    #[arg(long, value_parser = size, default_value = "2M")]
    pub(crate) chunk: u64,
    /// Named roots.
    #[arg(long, default_value_t = Capacities::default().n_roots)]
    pub(crate) roots: u32,
    /// Pins each node may hold at once (a multiple of 4).
    #[arg(long, default_value_t = Capacities::default().pin_slots)]
    pub(crate) pins: u32,
    /// Slots of each sender's ring in each node's inbox (a power of two).
    #[arg(long, default_value_t = Capacities::default().inbox_slots)]
    pub(crate) inbox: u32,
    /// Application locks (at most 128).
    #[arg(long, default_value_t = Capacities::default().app_locks)]
    pub(crate) app_locks: u32,
    /// Tier directories: hosts whose SSD tier the region can record (at
    /// most 64).
    #[arg(long, default_value_t = Capacities::default().tier_slots)]
    pub(crate) tier_slots: u32,
    /// Records of each tier directory (a power of two): blocks one SSD tier
    /// can make known to the rack, up to three quarters of it.
    #[arg(long, default_value_t = Capacities::default().tier_records)]
    pub(crate) tier_records: u32,
    /// Records of each stripe's change log (a power of two): how far a
    /// reader of the log may fall behind before it must rescan.
    #[arg(long, default_value_t = Capacities::default().change_records)]
    pub(crate) change_records: u32,
    /// Tenant slots, the default tenant's included (1 to 64).
    #[arg(long, default_value_t = Capacities::default().max_tenants)]
    pub(crate) max_tenants: u32,
    /// Overwrite an existing file (never one another user owns).
    #[arg(long)]
    pub(crate) force: bool,
    /// Let the file's group read and write the region too (mode 0660; the
    /// default is 0600, its owner alone). Every process that maps a
    /// region can read and write all of it.
    #[arg(long)]
    pub(crate) group: bool,
    #[command(flatten)]
    pub(crate) mode: ModeArg,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct DemoArgs {
    /// Run an SSD tier on this directory (on a real disk, not tmpfs):
    /// evicted blocks are kept there and come back on a prefix hit.
    #[arg(long)]
    pub(crate) ssd: Option<PathBuf>,
    /// Prefill worker processes (1 to 16).
    #[arg(long, default_value_t = 2)]
    pub(crate) prefill: usize,
    /// Decode worker processes (1 to 16).
    #[arg(long, default_value_t = 2)]
    pub(crate) decode: usize,
    /// How long to run, in seconds (0.1 to 86400; a trailing s is allowed).
    #[arg(long, default_value = "30")]
    pub(crate) duration: String,
    /// Block size, or a range MIN-MAX each block's length is drawn from.
    #[arg(long, default_value = "2M")]
    pub(crate) block_size: String,
    /// Region size.
    #[arg(long, value_parser = size, default_value = "4G")]
    pub(crate) region: u64,
    /// Cache maintenance (default coherent: the demo's processes share one
    /// host).
    #[arg(long, value_parser = flush_mode, default_value = "coherent")]
    pub(crate) mode: FlushMode,
    /// Seed of the prompts.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Requests each decode worker keeps in flight (1 to 64).
    #[arg(long, default_value_t = 2)]
    pub(crate) inflight: usize,
    /// Requests a second, all prefill workers together, started on a fixed
    /// schedule whatever the answers (an open loop; 0.1 to 100000). Without
    /// it each prefill worker starts its next request as soon as it can, so
    /// the run measures the most the machine does, and its latencies are
    /// those of a saturated one.
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// Tenants (2 to 7): prefill worker i serves tenant i % N (at least N
    /// prefill workers run): `busy` as fast as it goes with a hard quota of
    /// 2/5 of the region, `quiet` one request a second with a guaranteed
    /// share of 1/5, `team-K` three a second with a quota of 3/10 and a
    /// share of 1/20. The run passes only if no tenant's usage is seen
    /// over its quota, nor below its share once reached.
    #[arg(long, default_value_t = 0)]
    pub(crate) tenants: usize,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// No progress on stderr (a terminal gets a line rewritten every
    /// second, a log a line every five seconds): the summary only.
    #[arg(long, short)]
    pub(crate) quiet: bool,
}

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Comma-separated flush modes (default: every one this CPU has).
    #[arg(long, value_delimiter = ',', value_parser = flush_mode)]
    pub(crate) modes: Vec<FlushMode>,
    /// Blocks of the one-process rows (at least 64).
    #[arg(long, default_value_t = 8192)]
    pub(crate) blocks: usize,
    /// Block size of the one-process rows (64 to 64M).
    #[arg(long, value_parser = size, default_value = "16K")]
    pub(crate) block_bytes: u64,
    /// A short run (a cache-resident working set, fewer repetitions).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Measure the SSD tier on this directory instead (its write and read
    /// bandwidth beside raw O_DIRECT on the same drive).
    #[arg(long)]
    pub(crate) tier: Option<PathBuf>,
    /// Blocks of the tier run (2 MiB each unless --block-bytes is given).
    #[arg(long, default_value_t = 256)]
    pub(crate) tier_blocks: usize,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct GpuArgs {
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub(crate) device: u32,
    #[command(flatten)]
    pub(crate) mode: ModeArg,
    /// Fewer sizes and repetitions.
    #[arg(long)]
    pub(crate) quick: bool,
}

#[derive(Args)]
pub(crate) struct Helper {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub(crate) args: Vec<String>,
}
