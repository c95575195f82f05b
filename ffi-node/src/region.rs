//! Regions: map, format, attach and close.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use cxlkv_platform::kv::Capacities;
use cxlkv_platform::{Code, FlushMode, Node as Attached, Options, Region as Mapped};
use napi::bindgen_prelude::AsyncTask;
use napi::{Env, Unknown};
use napi_derive::napi;

use crate::args::{self, camel, u64_of, Opts};
use crate::error::{coded, range_error, OrThrow};
use crate::node::Node;
use crate::tasks::{Job, Pending};

fn mode_of(env: &Env, s: Option<String>) -> napi::Result<FlushMode> {
    match s.as_deref() {
        None => Ok(FlushMode::default_for_arch()),
        Some(m) => FlushMode::from_str(m).map_err(|e| range_error(env, &format!("flushMode: {e}"))),
    }
}

/// Options of `Region.create`.
#[napi(object)]
#[allow(dead_code)] // declares the TypeScript type; `Opts` reads the values
pub struct CreateOptions {
    /// Replace an existing file (default false: an existing file is refused;
    /// a file another user owns is never replaced).
    pub overwrite: Option<bool>,
    /// The file's permission bits, exactly (default 0o600, its owner
    /// alone; 0o660 lets its group map it too). The owner must read and
    /// write. Every process that maps a region can read all of it.
    pub mode: Option<u32>,
}

/// Options of `Region.memfd`.
#[napi(object)]
#[allow(dead_code)] // declares the TypeScript type; `Opts` reads the values
pub struct MemfdOptions {
    /// Back the region with 2 MiB huge pages.
    pub hugetlb: Option<bool>,
}

/// Options of `Region.format`: capacities left out keep their defaults.
/// The capacities are core's table (`Capacities::FIELDS`) in camelCase,
/// which the options are read by; a test holds this declaration to it.
#[napi(object)]
#[allow(dead_code)] // declares the TypeScript type; `Opts` reads the values
pub struct FormatOptions {
    /// `"auto"` (the default), `"coherent"`, `"clflush"`, `"clflushopt"`, `"clwb"`, ...
    pub flush_mode: Option<String>,
    /// Most nodes attached at once (at most 64).
    pub max_nodes: Option<u32>,
    /// Index stripes (each with its own lock).
    pub n_stripes: Option<u32>,
    /// Entries per stripe.
    pub entries_per_stripe: Option<u32>,
    /// Named roots.
    pub n_roots: Option<u32>,
    /// Pin slots per node.
    pub pin_slots: Option<u32>,
    /// log2 of the allocator's chunk size.
    pub chunk_shift: Option<u32>,
    /// Slots of each sender's ring in each node's inbox (a power of two).
    pub inbox_slots: Option<u32>,
    /// Application locks.
    pub app_locks: Option<u32>,
    /// Tier directories (hosts whose SSD tier the region can record).
    pub tier_slots: Option<u32>,
    /// Records of each tier directory (a power of two).
    pub tier_records: Option<u32>,
    /// Records of each stripe's change log (a power of two).
    pub change_records: Option<u32>,
    /// Tenant slots, the default tenant's included (1 to 64).
    pub max_tenants: Option<u32>,
}

/// Options of `Region.attach`.
#[napi(object)]
#[allow(dead_code)] // declares the TypeScript type; `Opts` reads the values
pub struct AttachOptions {
    /// Node id to claim (default: the first free one).
    pub node_id: Option<u32>,
    /// Cache maintenance (default: this machine's).
    pub flush_mode: Option<String>,
    /// A heartbeat silent this long means dead (default 2000).
    pub lease_ms: Option<u32>,
    /// Give up waiting for a lock after this long (default 60000).
    pub lock_timeout_ms: Option<u32>,
    /// Wait after claiming the manager role before granting (default 50).
    pub settle_ms: Option<u32>,
    /// Recover automatically when a node is declared dead (default true).
    pub auto_recover: Option<bool>,
    /// Directory of the host-local lock file (default /dev/shm).
    pub local_dir: Option<String>,
}

const ATTACH_FIELDS: &[&str] =
    &["nodeId", "flushMode", "leaseMs", "lockTimeoutMs", "settleMs", "autoRecover", "localDir"];

fn attach_options(env: &Env, opts: &Unknown<'_>) -> napi::Result<Options> {
    let o = Opts::of(env, opts, "options", ATTACH_FIELDS)?;
    let d = Options::default();
    let ms = |name: &str, dflt: Duration| -> napi::Result<Duration> {
        Ok(o.u64(name)?.map(Duration::from_millis).unwrap_or(dflt))
    };
    let opts = Options {
        node: o.u32("nodeId")?,
        mode: mode_of(env, o.string("flushMode")?)?,
        lease: ms("leaseMs", d.lease)?,
        lock_timeout: ms("lockTimeoutMs", d.lock_timeout)?,
        settle: ms("settleMs", d.settle)?,
        auto_recover: o.bool("autoRecover")?.unwrap_or(d.auto_recover),
        local_dir: o.string("localDir")?.map(PathBuf::from).unwrap_or(d.local_dir.clone()),
        ..d
    };
    opts.validate().map_err(|_| range_error(env, "options: leaseMs and lockTimeoutMs must be positive"))?;
    Ok(opts)
}

/// A mapped region: a file, /dev/shm, hugetlbfs, a device-DAX device, or an
/// anonymous memfd. Closing it leaves nodes attached through it working.
#[napi]
pub struct Region {
    map: Mutex<Option<Mapped>>,
}

impl Region {
    fn new(m: Mapped) -> Region {
        Region { map: Mutex::new(Some(m)) }
    }

    fn mapping(&self, env: &Env) -> napi::Result<Mapped> {
        let m = self.map.lock().unwrap_or_else(|e| e.into_inner()).clone();
        m.ok_or_else(|| coded(env, Code::InvalidHandle, "the region is closed"))
    }
}

#[napi]
impl Region {
    /// Creates a region file of `size` bytes at `path` (owner-only), not yet
    /// formatted. An existing file is refused unless `overwrite`. A
    /// device-DAX path (/dev/daxX.Y) is opened instead.
    #[napi(factory, catch_unwind, ts_args_type = "path: string, size: number, options?: CreateOptions")]
    pub fn create(env: Env, path: Unknown<'_>, size: Unknown<'_>, options: Unknown<'_>) -> napi::Result<Region> {
        let path = args::string_of(&env, &path, "path")?;
        let size = u64_of(&env, &size, "size")?;
        let o = Opts::of(&env, &options, "options", &["overwrite", "mode"])?;
        let overwrite = o.bool("overwrite")?.unwrap_or(false);
        let mode = o.u32("mode")?.unwrap_or(cxlkv_platform::region::REGION_FILE_MODE);
        let m = Mapped::create_with_mode(path.as_ref(), size, overwrite, mode).or_throw(&env)?;
        Ok(Region::new(m))
    }

    /// Maps the existing region at `path` (file, /dev/shm, hugetlbfs or
    /// /dev/daxX.Y).
    #[napi(factory, catch_unwind, ts_args_type = "path: string")]
    pub fn open(env: Env, path: Unknown<'_>) -> napi::Result<Region> {
        let path = args::string_of(&env, &path, "path")?;
        let m = Mapped::open(path.as_ref()).or_throw(&env)?;
        Ok(Region::new(m))
    }

    /// An anonymous shared region of `size` bytes (on 2 MiB huge pages with
    /// `hugetlb`), private to this process (Node cannot fork).
    #[napi(factory, catch_unwind, ts_args_type = "size: number, options?: MemfdOptions")]
    pub fn memfd(env: Env, size: Unknown<'_>, options: Unknown<'_>) -> napi::Result<Region> {
        let size = u64_of(&env, &size, "size")?;
        let hugetlb = Opts::of(&env, &options, "options", &["hugetlb"])?.bool("hugetlb")?.unwrap_or(false);
        let m = Mapped::memfd(size, hugetlb).or_throw(&env)?;
        Ok(Region::new(m))
    }

    /// Formats the region, erasing it. `BUSY` while a node of this process
    /// is attached to it.
    #[napi(catch_unwind, ts_args_type = "options?: FormatOptions")]
    pub fn format(&self, env: Env, options: Unknown<'_>) -> napi::Result<()> {
        let map = self.mapping(&env)?;
        // Core's capacity table, named in camelCase, and the flush mode.
        let names: Vec<String> = Capacities::FIELDS.iter().map(|f| camel(f.name)).collect();
        let known: Vec<&str> = std::iter::once("flushMode").chain(names.iter().map(String::as_str)).collect();
        let o = Opts::of(&env, &options, "options", &known)?;
        let mut caps = Capacities::default();
        for (f, name) in Capacities::FIELDS.iter().zip(&names) {
            if let Some(v) = o.u32(name)? {
                caps.set(f.name, v);
            }
        }
        let mode = mode_of(&env, o.string("flushMode")?)?;
        if map.in_use() {
            return Err(coded(&env, Code::Busy, "a node of this process is attached to the region"));
        }
        map.format(caps, mode).or_throw(&env)?;
        Ok(())
    }

    /// Attaches a node (starting its heartbeat and lock-manager thread).
    #[napi(catch_unwind, ts_args_type = "options?: AttachOptions")]
    pub fn attach(&self, env: Env, options: Unknown<'_>) -> napi::Result<Node> {
        let map = self.mapping(&env)?;
        let opts = attach_options(&env, &options)?;
        let node = map.attach(opts).or_throw(&env)?;
        Ok(Node::new(node))
    }

    /// `attach` off the event loop.
    #[napi(catch_unwind, ts_args_type = "options?: AttachOptions", ts_return_type = "Promise<Node>")]
    pub fn attach_async(&self, env: Env, options: Unknown<'_>) -> napi::Result<Pending<Attached, Node>> {
        let map = self.mapping(&env)?;
        let opts = attach_options(&env, &options)?;
        Ok(AsyncTask::new(Job::new(move || Ok(map.attach(opts)?), |_, n| Ok(Node::new(n)))))
    }

    /// The mapped size in bytes.
    #[napi(getter, catch_unwind)]
    pub fn size(&self, env: Env) -> napi::Result<f64> {
        Ok(self.mapping(&env)?.len() as f64)
    }

    /// True once closed.
    #[napi(getter, catch_unwind)]
    pub fn closed(&self) -> bool {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// Closes this handle (nodes attached through it keep the mapping).
    #[napi(catch_unwind)]
    pub fn close(&self) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}
