//! A region as the bindings and tools hold it: the mapped memory (a file,
//! /dev/shm, a hugetlb memfd or device DAX) that nodes attach to. The one
//! place that formats a region and decides when formatting would pull the
//! memory out from under an attached node of this process.

use std::path::Path;
use std::sync::{Arc, Mutex};

use cxlkv_core::layout::{Capacities, Layout};

use crate::error::{Error, Result};
use crate::flush::{Flush, FlushMode};
use crate::host::random_u64;
use crate::map::{Mapping, Source};

/// A mapped region. Clones share the mapping; nodes attached through any
/// clone keep it mapped after every clone is dropped.
#[derive(Clone)]
pub struct Region(Arc<Shared>);

struct Shared {
    map: Arc<Mapping>,
    /// Nodes attached through this region (of this process) and not yet
    /// closed.
    attached: Mutex<u32>,
}

/// A node's claim on its [`Region`]: counted while the node is attached.
pub(crate) struct Attachment(Arc<Shared>);

impl Drop for Attachment {
    fn drop(&mut self) {
        let mut n = self.0.attached.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
    }
}

/// A node that may still be running (see [`crate::inspect::Observed::live_nodes`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct LiveNode {
    /// Node id.
    pub id: u32,
    /// Process id (in its PID namespace).
    pub pid: u32,
    /// Its host id, in hex.
    pub host_id: String,
    /// Why it counts as live.
    pub how: &'static str,
}

impl std::fmt::Display for LiveNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {} (pid {} on host {}, {})", self.id, self.pid, self.host_id, self.how)
    }
}

/// Permissions of a region file by default: its owner's alone.
pub const REGION_FILE_MODE: u32 = 0o600;

/// Permissions of a region file its owner's group shares (`cxlkv format
/// --group`).
pub const REGION_GROUP_MODE: u32 = 0o660;

/// How long a format watches the heartbeats of nodes this host cannot
/// probe (another host or PID namespace) before it counts them as stopped:
/// a default lease.
pub const LIVE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Region {
    /// Wraps a mapping.
    pub fn from_mapping(map: impl Into<Arc<Mapping>>) -> Region {
        Region(Arc::new(Shared { map: map.into(), attached: Mutex::new(0) }))
    }

    /// Creates a region file of `size` bytes at `path`, readable and
    /// writable by its owner only (not formatted). `overwrite` false refuses
    /// an existing file; `overwrite` replaces it with a new file (never
    /// truncating one that processes map), and fails with `Busy` while the
    /// region it holds has nodes that may still run. A device-DAX path is
    /// opened instead: the device is the region, whatever its size.
    pub fn create(path: &Path, size: u64, overwrite: bool) -> Result<Region> {
        Region::create_with_mode(path, size, overwrite, REGION_FILE_MODE)
    }

    /// [`Region::create`] with the file's permissions: `mode` exactly
    /// (0o600 is [`REGION_FILE_MODE`], owner-only; 0o660 is
    /// [`REGION_GROUP_MODE`], the owner's group too). Every process that
    /// maps a region can read and write all of it: the mode is the only
    /// boundary between users. `InvalidArgument` for bits beyond 0o777 or
    /// a mode the owner cannot read and write; a device-DAX path keeps the
    /// device's own permissions.
    pub fn create_with_mode(path: &Path, size: u64, overwrite: bool, mode: u32) -> Result<Region> {
        let map = match Source::for_path(path) {
            Source::DevDax(_) => Mapping::open(path)?,
            _ => {
                if overwrite {
                    Region::refuse_foreign(path)?;
                }
                if overwrite && !Region::live_nodes_at(path, LIVE_WAIT)?.is_empty() {
                    return Err(Error::Core(cxlkv_core::Error::Busy));
                }
                Mapping::create_file(path, size, mode, overwrite)?
            }
        };
        Ok(Region::from_mapping(map))
    }

    /// `Io` (permission denied) when a file exists at `path` and another
    /// user owns it: [`Region::create`] never replaces such a file.
    pub fn refuse_foreign(path: &Path) -> Result<()> {
        crate::map::refuse_foreign(path)
    }

    /// Maps the existing region at `path`: a file, /dev/shm, hugetlbfs or a
    /// device-DAX character device (/dev/daxX.Y).
    pub fn open(path: &Path) -> Result<Region> {
        Ok(Region::from_mapping(Mapping::open(path)?))
    }

    /// Creates an anonymous shared region of `size` bytes (a memfd; on
    /// 2 MiB huge pages when `hugetlb`), shared with processes forked
    /// afterwards. Not formatted.
    pub fn memfd(size: u64, hugetlb: bool) -> Result<Region> {
        Ok(Region::from_mapping(Mapping::memfd(size, hugetlb)?))
    }

    /// The layout `caps` would have in a region of `size` bytes, or why it
    /// cannot be formatted so (checked before anything is touched).
    pub fn plan(caps: Capacities, size: u64) -> Result<Layout> {
        Ok(Layout::compute(caps, size)?)
    }

    /// The smallest region size `caps` fit in (metadata and one chunk), or
    /// `None` when no size does (capacities out of range).
    pub fn min_size(caps: Capacities) -> Option<u64> {
        let fits = |size: u64| Layout::compute(caps, size).is_ok();
        let mut hi = 1u64 << 20;
        while !fits(hi) {
            hi = hi.checked_mul(2).filter(|&h| h <= 1 << 56)?;
        }
        // Fitting is monotone in the size: the least one that fits.
        let mut lo = 0u64;
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Some(hi)
    }

    /// Formats the region with `caps`, erasing what it held, with cache
    /// maintenance `mode`. The header is written last, so a crash leaves an
    /// unformatted region, never a half-formatted one. `Busy` while a node of
    /// this process is attached through it, or while the region it holds has
    /// nodes that may still run ([`Region::live_nodes`], waiting up to
    /// [`LIVE_WAIT`] for the heartbeats of nodes this host cannot probe):
    /// only a region whose nodes all stopped is erased.
    pub fn format(&self, caps: Capacities, mode: FlushMode) -> Result<Layout> {
        if self.in_use() || !self.live_nodes(LIVE_WAIT)?.is_empty() {
            return Err(Error::Core(cxlkv_core::Error::Busy));
        }
        let co = Flush::new(mode, false)?;
        let store = cxlkv_core::format::format(self.0.map.view(), co, caps, random_u64())?;
        Ok(store.layout)
    }

    /// The nodes of the region this mapping holds that may still run (see
    /// [`crate::inspect::Observed::live_nodes`]); none when it holds no
    /// formatted region.
    pub fn live_nodes(&self, wait: std::time::Duration) -> Result<Vec<LiveNode>> {
        match self.observe(FlushMode::default_for_arch()) {
            Ok(o) => o.live_nodes(wait),
            Err(_) => Ok(Vec::new()),
        }
    }

    /// [`Region::live_nodes`] of the region at `path`: none when nothing is
    /// there, or nothing formatted.
    pub fn live_nodes_at(path: &Path, wait: std::time::Duration) -> Result<Vec<LiveNode>> {
        match Region::open(path) {
            Ok(r) => r.live_nodes(wait),
            Err(_) => Ok(Vec::new()),
        }
    }

    /// Counts one more node attached through this region, until the
    /// returned attachment drops (see `Region::attach` in `node.rs`).
    pub(crate) fn attachment(&self) -> Attachment {
        let mut n = self.0.attached.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_add(1);
        Attachment(self.0.clone())
    }

    /// True while a node attached through this region is open.
    pub fn in_use(&self) -> bool {
        *self.0.attached.lock().unwrap_or_else(|e| e.into_inner()) > 0
    }

    /// The mapped size in bytes.
    pub fn len(&self) -> u64 {
        self.0.map.len() as u64
    }

    /// True for an empty mapping (never: mappings are at least a page).
    pub fn is_empty(&self) -> bool {
        self.0.map.is_empty()
    }

    /// The mapping.
    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.0.map
    }
}
