//! The SSD tier of a host: started on a node of its own, it copies cold
//! blocks to slot files on the host's drives ahead of eviction, records
//! them in the region for the rack, and puts them back when a node's get or
//! acquire misses them.

use std::ffi::c_char;
use std::sync::Arc;

use cxlkv_platform::{Tier, TierOptions};

use crate::region::{cxlkv_node_options, cxlkv_region, live_region, node_options};
use crate::{cxlkv_result, guard, handle, slice, text, Out, Shell};

/// A running SSD tier.
pub struct cxlkv_tier(Shell<Tier>);

const TIER_MAGIC: u64 = u64::from_le_bytes(*b"cxlkvTIR");

/// How a tier runs. Start from `cxlkv_tier_options_default`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cxlkv_tier_options {
    /// Directories, one per drive, on a disk file system (not tmpfs): a
    /// slot file is made in each.
    pub dirs: *const *const c_char,
    /// Entries of `dirs`.
    pub n_dirs: usize,
    /// Largest block a slot holds (larger blocks stay in the region only).
    pub slot_bytes: u64,
    /// Bytes of slot file per directory.
    pub capacity: u64,
    /// Copy cold blocks out once the region's payload is this full (0 to 1).
    pub high_water: f64,
    /// Blocks copied out per round at most (each with a buffer of its own).
    pub batch: u64,
}

impl cxlkv_tier_options {
    /// The options `o` sets besides the directories, by the table's names
    /// (`TierOptions::FIELDS`; a test holds this struct to it).
    fn numbers(&self) -> [(&'static str, f64); 4] {
        [
            ("slot_bytes", self.slot_bytes as f64),
            ("capacity", self.capacity as f64),
            ("high_water", self.high_water),
            ("batch", self.batch as f64),
        ]
    }
}

/// A tier's counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_tier_counters {
    /// Blocks copied to the drives.
    pub spills: u64,
    /// Blocks put back into the region.
    pub promotions: u64,
    /// Requests for blocks the tier does not hold, or whose slot failed.
    pub misses: u64,
    /// I/O or checksum errors (each also logged on stderr).
    pub errors: u64,
    /// Blocks held now.
    pub held: u64,
    /// Bytes written to the drives.
    pub bytes_written: u64,
    /// Bytes read from the drives.
    pub bytes_read: u64,
    /// Blocks a drive read straight into the region (no copy).
    pub direct_reads: u64,
    /// Bytes registered with io_uring as fixed buffers (the region and the
    /// tier's buffers, the buffers alone, or none under a low memlock limit).
    pub registered_bytes: u64,
    /// Directories on memory-backed file systems (tmpfs; warned at start).
    pub memory_dirs: u32,
    /// The tier thread runs at the highest best-effort I/O priority.
    pub io_priority: bool,
    /// The tier thread runs at a raised CPU priority.
    pub cpu_priority: bool,
}

/// Writes the default options (no directories: set `dirs` and `n_dirs`),
/// as `cxlkv_capacities_default` and `cxlkv_node_options_default` do.
///
/// # Safety
/// `out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_tier_options_default(out: *mut cxlkv_tier_options) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        let d = TierOptions::default();
        out.write(cxlkv_tier_options {
            dirs: core::ptr::null(),
            n_dirs: 0,
            slot_bytes: d.slot_bytes,
            capacity: d.capacity,
            high_water: d.high_water,
            batch: d.batch as u64,
        });
        Ok(())
    })
}

/// Starts this host's SSD tier on a node of its own, attached to `region`
/// with `node_opts` (NULL: defaults): one tier per host.
/// CXLKV_RESULT_BUSY when this host runs one already.
///
/// # Safety
/// `region` is a handle from this library or NULL; `opts` is valid for one
/// read, its `dirs` valid for `n_dirs` reads of NUL-terminated strings;
/// `node_opts` as for `cxlkv_node_attach`; `out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_tier_start(
    region: *const cxlkv_region,
    opts: *const cxlkv_tier_options,
    node_opts: *const cxlkv_node_options,
    out: *mut *mut cxlkv_tier,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        if opts.is_null() {
            return Err(cxlkv_result::NullParameter.into());
        }
        // SAFETY:
        // - `opts` non-NULL and valid for one read by the contract.
        let c = unsafe { opts.read() };
        // SAFETY:
        // - `dirs` valid for `n_dirs` reads by the contract.
        let dirs = unsafe { slice(c.dirs, c.n_dirs) }?;
        let mut paths = Vec::with_capacity(dirs.len());
        for &d in dirs {
            // SAFETY:
            // - each entry NUL-terminated by the contract.
            paths.push(unsafe { text(d) }?.into());
        }
        // SAFETY:
        // - `region` is NULL or a handle from this library.
        let r = unsafe { live_region(region) }?;
        // SAFETY:
        // - `node_opts` as for `cxlkv_node_attach` by the contract.
        let o = unsafe { node_options(node_opts) }?;
        let node = Arc::new(r.attach(o)?);
        let mut topts = TierOptions { dirs: paths, ..TierOptions::default() };
        for (name, v) in c.numbers() {
            topts.set(name, v)?;
        }
        let t = Tier::start(node, topts)?;
        out.write(Box::into_raw(Box::new(cxlkv_tier(Shell::new(TIER_MAGIC, t)))));
        Ok(())
    })
}

/// Copies every block of the region the tier does not hold yet (up to its
/// capacity), whatever the high-water mark. `n` (NULL allowed) gets how
/// many.
///
/// # Safety
/// `tier` is a handle from this library or NULL; `n` is NULL or valid for
/// one write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_tier_spill_all(tier: *const cxlkv_tier, n: *mut u64) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `n` is NULL or valid for one write by the contract.
        let n = unsafe { Out::maybe(n) };
        // SAFETY:
        // - `tier` is NULL or a handle from this library.
        let t = unsafe { handle(tier) }?.0.live(TIER_MAGIC)?;
        let k = t.spill_all()?;
        if let Some(n) = n {
            n.write(k);
        }
        Ok(())
    })
}

/// The tier's counters.
///
/// # Safety
/// `tier` is a handle from this library or NULL; `out` is valid for one
/// write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_tier_stats(tier: *const cxlkv_tier, out: *mut cxlkv_tier_counters) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `tier` is NULL or a handle from this library.
        let s = unsafe { handle(tier) }?.0.live(TIER_MAGIC)?.stats();
        out.write(cxlkv_tier_counters {
            spills: s.spills,
            promotions: s.promotions,
            misses: s.misses,
            errors: s.errors,
            held: s.held,
            bytes_written: s.bytes_written,
            bytes_read: s.bytes_read,
            direct_reads: s.direct_reads,
            registered_bytes: s.registered_bytes,
            memory_dirs: s.memory_dirs,
            io_priority: s.io_priority,
            cpu_priority: s.cpu_priority,
        });
        Ok(())
    })
}

/// Stops the tier (its blocks stop being offered to the rack; its slot
/// files stay for the next start) and detaches its node; closes the handle.
/// Accepts NULL and closed handles (returns OK).
///
/// # Safety
/// `tier` is NULL or a handle from this library, not in use by another
/// thread.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_tier_stop(tier: *mut cxlkv_tier) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `tier` is NULL or a handle from this library.
        let Ok(t) = (unsafe { handle(tier) }) else { return Ok(()) };
        match t.0.close(TIER_MAGIC) {
            Some(t) => Ok(t.stop()?),
            None => Ok(()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cxlkv_tier_options`, as the header declares it, is the directories
    /// then the table of tier options, name by name, in order; its default
    /// is the table's.
    #[test]
    fn tier_options_struct_is_the_table() {
        let header = include_str!("../include/cxlkv.h");
        let body = header.split("struct cxlkv_tier_options {").nth(1).and_then(|r| r.split('}').next()).unwrap();
        let fields: Vec<&str> = body
            .lines()
            .map(str::trim)
            .filter(|l| l.ends_with(';'))
            .filter_map(|l| l.trim_end_matches(';').rsplit([' ', '*']).next())
            .collect();
        let mut want = vec!["dirs", "n_dirs"];
        want.extend(TierOptions::FIELDS.iter().map(|f| f.name));
        assert_eq!(fields, want);
        let mut c = core::mem::MaybeUninit::<cxlkv_tier_options>::uninit();
        // SAFETY: `c` is valid for one write.
        assert_eq!(unsafe { cxlkv_tier_options_default(c.as_mut_ptr()) }, cxlkv_result::Ok);
        // SAFETY: written just above.
        let c = unsafe { c.assume_init() };
        let names: Vec<&str> = c.numbers().iter().map(|n| n.0).collect();
        assert_eq!(names, want[2..]);
        for ((_, v), f) in c.numbers().iter().zip(TierOptions::FIELDS) {
            assert_eq!(*v, f.default, "{}", f.name);
        }
    }
}
