//! The SSD tier of a host: blocks copied out of the region into
//! preallocated `O_DIRECT` slot files on the host's NVMe drives before
//! eviction needs their space, recorded in the region's tier directory (see
//! core's `tier.rs`) so any node of the rack learns they exist, and put
//! back into the region when a node asks through the tier node's inbox.
//!
//! A slot holds one block: a header (key, namespace, tokens, length, a
//! write sequence number, the payload's checksum, the header's own
//! checksum; both XXH3-64, the header a little-endian zerocopy struct) in
//! the first I/O-aligned unit, then the payload. A slot is
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
use cxlkv_core::hash::Key;
use cxlkv_core::index::ReserveItem;
use cxlkv_core::layout::NodeInfo;
use cxlkv_core::Error as CoreError;

use crate::error::{Error, Result};
use crate::node::Node;
use crate::sync::Flag;

mod check;
mod promote;
mod slots;
pub(crate) mod wire;
mod worker;

pub use check::check_slots;
use slots::*;
pub use wire::KIND_TIER_PROMOTE;
use worker::run;

/// One numeric option of a tier, as [`TierOptions::FIELDS`] lists it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierOptionField {
    /// Its name: the field of [`TierOptions`], of C's `cxlkv_tier_options`,
    /// Python's `Node.start_tier` keyword (Node's option is its camelCase).
    pub name: &'static str,
    /// What it sets, and its limits.
    pub doc: &'static str,
    /// Its default.
    pub default: f64,
    /// A whole number (bytes, blocks), else a fraction.
    pub integer: bool,
}

/// The one table of a tier's options (besides its directories): the
/// struct, its defaults and the list every door reads (C's struct, checked
/// against it; Python's keywords and stub; Node's options and typings; the
/// CLI's flags). Adding an option is a line here, plus the C struct's field,
/// which a test holds to this order.
macro_rules! tier_options {
    ($($(#[doc = $doc:literal])+ $name:ident: $ty:ident = $default:expr;)+) => {
        /// How a tier runs (see [`TierOptions::FIELDS`]).
        #[derive(Clone, Debug)]
        pub struct TierOptions {
            /// One directory per drive; a slot file is made in each.
            pub dirs: Vec<PathBuf>,
            $($(#[doc = $doc])+ pub $name: $ty,)+
        }

        impl Default for TierOptions {
            fn default() -> Self {
                TierOptions { dirs: Vec::new(), $($name: $default,)+ }
            }
        }

        impl TierOptions {
            /// Every numeric option, in order.
            pub const FIELDS: &'static [TierOptionField] = &[$(TierOptionField {
                name: stringify!($name),
                doc: concat!($($doc),+),
                default: $default as f64,
                integer: tier_options!(@integer $ty),
            },)+];

            /// Option `name`'s value.
            pub fn get(&self, name: &str) -> Option<f64> {
                match name {
                    $(stringify!($name) => Some(self.$name as f64),)+
                    _ => None,
                }
            }

            /// Sets option `name` to `v`: `InvalidArgument` for a name not
            /// in the table, or a value it cannot take (an integer option
            /// takes a whole number from 0 up).
            pub fn set(&mut self, name: &str, v: f64) -> Result<()> {
                let bad = || Error::Core(cxlkv_core::Error::InvalidArgument);
                match name {
                    $(stringify!($name) => {
                        if !v.is_finite() || tier_options!(@integer $ty) && (v < 0.0 || v.fract() != 0.0 || v > u64::MAX as f64) {
                            return Err(bad());
                        }
                        self.$name = v as $ty;
                    })+
                    _ => return Err(bad()),
                }
                Ok(())
            }
        }
    };
    (@integer f64) => { false };
    (@integer $ty:ident) => { true };
}

tier_options! {
    /// Largest block a slot holds, in bytes (blocks larger stay in the
    /// region only).
    slot_bytes: u64 = 2 << 20;
    /// Bytes of slot file per directory.
    capacity: u64 = 1 << 30;
    /// Copy cold blocks out once the region's payload is this full (0 to
    /// 1): ahead of eviction, which starts when it is full.
    high_water: f64 = 0.7;
    /// Blocks copied out per round at most (each with a buffer of its own).
    batch: usize = 64;
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

impl TierStats {
    /// Every count by its name, in one order: what a binding reporting them
    /// as a table (Python's dict) lists, so none is left out.
    pub fn counters(&self) -> [(&'static str, u64); 10] {
        [
            ("spills", self.spills),
            ("promotions", self.promotions),
            ("misses", self.misses),
            ("errors", self.errors),
            ("held", self.held),
            ("bytes_written", self.bytes_written),
            ("bytes_read", self.bytes_read),
            ("direct_reads", self.direct_reads),
            ("registered_bytes", self.registered_bytes),
            ("memory_dirs", u64::from(self.memory_dirs)),
        ]
    }
}

/// The counters, shared by the tier thread and its handle.
#[derive(Default)]
struct TierCounters(Mutex<TierStats>);

impl TierCounters {
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
    counters: Arc<TierCounters>,
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
        let counters = Arc::new(TierCounters::default());
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The table names every numeric option once, with the defaults the
    /// struct has; `set` and `get` cross by name and refuse what does not fit.
    #[test]
    fn tier_options_are_one_table() {
        let d = TierOptions::default();
        let names: Vec<&str> = TierOptions::FIELDS.iter().map(|f| f.name).collect();
        assert_eq!(names, ["slot_bytes", "capacity", "high_water", "batch"]);
        for f in TierOptions::FIELDS {
            assert_eq!(d.get(f.name), Some(f.default), "{}", f.name);
        }
        assert_eq!(TierOptions::FIELDS.iter().filter(|f| !f.integer).count(), 1);
        let mut o = TierOptions::default();
        o.set("batch", 8.0).unwrap();
        o.set("high_water", 0.25).unwrap();
        o.set("slot_bytes", (256 << 10) as f64).unwrap();
        assert_eq!((o.batch, o.high_water, o.slot_bytes), (8, 0.25, 256 << 10));
        for (name, v) in [("batch", -1.0), ("capacity", 1.5), ("slot_bytes", f64::NAN), ("high_water", f64::INFINITY)] {
            assert!(o.set(name, v).is_err(), "{name} = {v}");
        }
        assert!(o.set("batches", 1.0).is_err());
        assert_eq!(o.get("batches"), None);
        assert_eq!((o.batch, o.high_water), (8, 0.25), "a refused value changes nothing");
    }
}
