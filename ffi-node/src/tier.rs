//! The SSD tier of a host, started from Node (`Node.startTier`), as C and
//! Python start it.

use std::path::PathBuf;
use std::sync::Mutex;

use napi::Env;
use napi_derive::napi;

use cxlkv_platform::{Code, Tier as Running, TierOptions as Options};

use crate::args::{camel, Opts};
use crate::error::{coded, range_error, OrThrow};

/// Options of `Node.startTier`: left out, each keeps its default. They are
/// the tier's table (`TierOptions::FIELDS`) in camelCase; a test holds these
/// typings to it.
#[napi(object)]
#[allow(dead_code)] // declares the TypeScript type; `Opts` reads the values
pub struct TierOptions {
    /// Largest block a slot holds, in bytes (2 MiB).
    pub slot_bytes: Option<f64>,
    /// Bytes of slot file per directory (1 GiB).
    pub capacity: Option<f64>,
    /// How full the region is (0 to 1) before cold blocks are copied out
    /// (0.7).
    pub high_water: Option<f64>,
    /// Blocks copied out per round at most (64).
    pub batch: Option<f64>,
}

/// The tier's counters.
#[napi(object)]
pub struct TierCounters {
    /// Blocks copied to the drives.
    pub spills: f64,
    /// Blocks put back into the region on request.
    pub promotions: f64,
    /// Requests for blocks the tier does not hold, or whose slot failed.
    pub misses: f64,
    /// I/O or checksum errors.
    pub errors: f64,
    /// Blocks held now.
    pub held: f64,
    /// Bytes written to the drives.
    pub bytes_written: f64,
    /// Bytes read from the drives.
    pub bytes_read: f64,
    /// Blocks the drive read straight into the region.
    pub direct_reads: f64,
    /// Bytes registered with io_uring as fixed buffers.
    pub registered_bytes: f64,
    /// Directories on memory-backed file systems (tmpfs).
    pub memory_dirs: u32,
    /// The I/O engine in use, or null.
    pub engine: Option<String>,
    /// The tier thread runs at the highest best-effort I/O priority.
    pub io_priority: bool,
    /// The tier thread runs at a raised CPU priority.
    pub cpu_priority: bool,
}

/// A running SSD tier: copies cold blocks to slot files on its drives and
/// puts them back when a node asks. Stop it before detaching its node.
#[napi]
pub struct Tier {
    tier: Mutex<Option<Running>>,
}

/// The platform options from `startTier`'s arguments.
/// The options of `startTier`: the directories, and each option of the
/// tier's table given in `o` (by its camelCase name).
pub(crate) fn options(env: &Env, dirs: Vec<String>, o: &Opts<'_>) -> napi::Result<Options> {
    let mut opts = Options { dirs: dirs.into_iter().map(PathBuf::from).collect(), ..Options::default() };
    for f in Options::FIELDS {
        let name = camel(f.name);
        if let Some(v) = o.f64(&name)? {
            opts.set(f.name, v).map_err(|_| range_error(env, &format!("options.{name} cannot be {v}")))?;
        }
    }
    Ok(opts)
}

/// The option names `startTier` knows: the table's, in camelCase.
pub(crate) fn option_names() -> Vec<String> {
    Options::FIELDS.iter().map(|f| camel(f.name)).collect()
}

impl Tier {
    pub(crate) fn new(t: Running) -> Tier {
        Tier { tier: Mutex::new(Some(t)) }
    }

    fn with<T>(&self, env: &Env, f: impl FnOnce(&Running) -> napi::Result<T>) -> napi::Result<T> {
        let g = self.tier.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            Some(t) => f(t),
            None => Err(coded(env, Code::InvalidHandle, "the tier is stopped")),
        }
    }
}

#[napi]
impl Tier {
    /// The tier's counters.
    #[napi(catch_unwind)]
    pub fn stats(&self, env: Env) -> napi::Result<TierCounters> {
        self.with(&env, |t| {
            let s = t.stats();
            Ok(TierCounters {
                spills: s.spills as f64,
                promotions: s.promotions as f64,
                misses: s.misses as f64,
                errors: s.errors as f64,
                held: s.held as f64,
                bytes_written: s.bytes_written as f64,
                bytes_read: s.bytes_read as f64,
                direct_reads: s.direct_reads as f64,
                registered_bytes: s.registered_bytes as f64,
                memory_dirs: s.memory_dirs,
                engine: s.engine.map(|e| format!("{e:?}")),
                io_priority: s.io_priority,
                cpu_priority: s.cpu_priority,
            })
        })
    }

    /// Copies every block of the region the tier does not hold yet (up to
    /// its capacity); returns how many. Blocks the caller while it runs.
    #[napi(catch_unwind)]
    pub fn spill_all(&self, env: Env) -> napi::Result<f64> {
        self.with(&env, |t| Ok(t.spill_all().or_throw(&env)? as f64))
    }

    /// Stops the tier (its blocks stop being offered to the rack). Stopping
    /// twice does nothing.
    #[napi(catch_unwind)]
    pub fn stop(&self, env: Env) -> napi::Result<()> {
        let t = self.tier.lock().unwrap_or_else(|e| e.into_inner()).take();
        match t {
            Some(t) => t.stop().or_throw(&env),
            None => Ok(()),
        }
    }
}
