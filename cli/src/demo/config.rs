//! What a demo run is: its settings, the region's capacities and each
//! worker's options they imply, and the protocol's constants.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cxlkv_platform::kv::Capacities;
use cxlkv_platform::kv::{mix64, Key};
use cxlkv_platform::tenants::Limits;
use cxlkv_platform::{pattern, FlushMode, Options};
use serde::{Deserialize, Serialize};

pub(super) const NS: u32 = 1;

pub(super) const TOKENS_PER_BLOCK: usize = 16;

pub(super) const MAX_TOKENS: usize = 16_384;

pub(super) const HANDOFF: u32 = 1;

pub(super) const STOP: u32 = 2;

/// What the demo runs (sent to each worker as JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Config {
    pub prefill: usize,
    pub decode: usize,
    pub duration: Duration,
    /// Largest block (every block when `block_min` equals it).
    pub block_bytes: u64,
    /// Smallest block: blocks of a mix take a length between the two, fixed
    /// per key (models, layouts and layer-wise chunks mix sizes).
    pub block_min: u64,
    pub region: u64,
    #[serde(with = "mode_name")]
    pub mode: FlushMode,
    pub seed: u64,
    /// Requests a prefill worker keeps handed off at once (their blocks pinned).
    pub inflight: usize,
    /// Requests a second, all prefill workers together, on a fixed schedule
    /// (open loop); `None`: each worker as fast as it can.
    #[serde(default)]
    pub rate: Option<f64>,
    /// An SSD tier on this directory: blocks evicted from the region are
    /// kept there and prefill workers get missing prefixes back from it.
    #[serde(default)]
    pub ssd: Option<PathBuf>,
    /// Tenants (`--tenants N`, 0: none): prefill worker `i` serves tenant
    /// `i % N` (see [`tenant_plan`]).
    #[serde(default)]
    pub tenants: usize,
}

/// Most tenants of a `--tenants` run (the region's default eight slots,
/// the default tenant's included).
pub const MAX_DEMO_TENANTS: usize = 7;

/// Tenant `k` of a `--tenants` run: its name, its limits in a region of
/// `payload` bytes of payload capacity, and the requests a second each of
/// its prefill workers starts (`None`: as many as it can).
///   - `busy` (k = 0): as fast as it goes, a hard quota of 2/5 of the
///     region: it evicts its own blocks, and a request larger than its
///     quota is refused while the others are served;
///   - `quiet` (k = 1): one request a second, a guaranteed share of 1/5:
///     nobody else's evictions take it below;
///   - `team-k` (k >= 2): three a second, a quota of 3/10 and a share of
///     1/20.
pub(super) fn tenant_plan(k: usize, payload: u64) -> (String, Limits, Option<f64>) {
    match k {
        0 => ("busy".into(), Limits { quota: payload / 5 * 2, ..Limits::default() }, None),
        1 => ("quiet".into(), Limits { share: payload / 5, ..Limits::default() }, Some(1.0)),
        k => (
            format!("team-{k}"),
            Limits { quota: payload / 10 * 3, share: payload / 20, ..Limits::default() },
            Some(3.0),
        ),
    }
}

/// A flush mode as its name.
mod mode_name {
    use cxlkv_platform::FlushMode;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(m: &FlushMode, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(m.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FlushMode, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(|_| serde::de::Error::custom(format!("not a flush mode: {name}")))
    }
}

/// The payload length of `key`'s block: the configured size, or one fixed
/// per key in the configured range (a multiple of 64 bytes).
pub(super) fn len_of(cfg: &Config, key: Key) -> u64 {
    if cfg.block_min >= cfg.block_bytes {
        return cfg.block_bytes;
    }
    let span = cfg.block_bytes - cfg.block_min + 1;
    ((cfg.block_min + mix64(pattern::seed_of(key) ^ 0x1e57) % span) & !63).max(cfg.block_min)
}

pub(super) fn caps(cfg: &Config) -> Capacities {
    let mean = (cfg.block_min.min(cfg.block_bytes) + cfg.block_bytes) / 2;
    let blocks = (cfg.region / mean).max(64) as u32;
    let chunk = cfg.block_bytes.next_power_of_two().max(1 << 21);
    Capacities {
        // The workers, the SSD tier's node, the final check's; and with
        // tenants, the watcher's.
        max_nodes: (cfg.prefill + cfg.decode + 2 + usize::from(cfg.tenants > 0)) as u32,
        n_stripes: 16,
        entries_per_stripe: (blocks * 2).div_ceil(16).max(16),
        n_roots: 8,
        pin_slots: ((MAX_TOKENS / TOKENS_PER_BLOCK) as u32 * (cfg.inflight as u32 + 1)).next_multiple_of(4),
        chunk_shift: chunk.trailing_zeros(),
        inbox_slots: 256,
        app_locks: 0,
        ..Capacities::default()
    }
}

pub(super) fn worker_opts(cfg: &Config, local: &Path, node: u32) -> Options {
    Options {
        node: Some(node),
        mode: cfg.mode,
        local_dir: local.to_path_buf(),
        lock_timeout: Duration::from_secs(30),
        ..Options::default()
    }
}

/// The most bytes the SSD tier may write per byte prefill publishes before
/// the demo fails: a block is copied out once (its slot header and padding
/// add a little); more means the tier copies blocks again that did not
/// change.
pub const MAX_WRITE_AMPLIFICATION: f64 = 1.1;
