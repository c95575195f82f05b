//! Cache maintenance: the only way core makes a store visible to other hosts
//! or a load fresh from them.
//!
//! The rules (DESIGN.md, "Coherence rules"): publish = store, flush the touched
//! lines, store fence, then make the change reachable with a state word written
//! last and flushed on its own; read fresh = invalidate, then load. Each call
//! names its [`Site`], so the simulator can disable one call site at a time and
//! prove the harness notices.

use crate::mem::{View, LINE};
use crate::Result;

/// Identity of one flush, invalidate or fence call site in core.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Site(pub &'static str);

/// Cache maintenance for one participant's view of the region.
///
/// Implementations: platform's instruction-backed ones (clflush, clflushopt,
/// clwb, non-temporal stores, aarch64 `dc`), an explicit no-op for coherent
/// single-host use, and the simulator.
pub trait Coherence {
    /// Writes back every line overlapping `off..off+len` so that other hosts
    /// can read it. Ordered with respect to later stores only after
    /// [`Coherence::store_fence`].
    fn flush(&self, region: &View, off: u64, len: u64, site: Site) -> Result<()>;

    /// Drops this host's copy of every line overlapping `off..off+len`, so the
    /// next load reads memory. A dirty line is written back first (real
    /// instructions do that: `clflush`, `clflushopt`, `dc civac`), so a store
    /// that this host invalidates next needs no flush of its own. Loads after
    /// it are ordered after it, and loads before it complete before it (a
    /// re-validating read after a copy needs no extra fence). Every
    /// implementation must keep both.
    fn invalidate(&self, region: &View, off: u64, len: u64, site: Site) -> Result<()>;

    /// [`Coherence::invalidate`] of one line at each of `lines` (line
    /// offsets), for reads whose addresses are all known up front: the
    /// lines are dropped together and ordered once, so the loads after it
    /// can miss in parallel. Coherent memory may prefetch them instead.
    fn invalidate_lines(&self, region: &View, lines: &[u64], site: Site) -> Result<()> {
        for &l in lines {
            self.invalidate(region, l, LINE, site)?;
        }
        Ok(())
    }

    /// Orders earlier stores and flushes before later stores (`sfence`, or
    /// nothing where flushes are synchronous and stores are ordered).
    fn store_fence(&self, site: Site);

    /// Orders everything before everything after (`mfence`, `dsb sy`).
    fn full_fence(&self, site: Site);

    /// Writes a payload into the region and flushes it (bulk path: an
    /// implementation may use non-temporal stores). Visible to others after a
    /// following `store_fence`.
    fn write_payload(&self, region: &View, off: u64, src: &[u8], site: Site) -> Result<()> {
        region.copy_in(off, src)?;
        self.flush(region, off, src.len() as u64, site)
    }

    /// Short name of the implementation, for reports.
    fn name(&self) -> &'static str;
}

/// Rounds `off..off+len` out to whole lines: returns (first line offset, end).
#[inline]
pub fn line_span(off: u64, len: u64) -> (u64, u64) {
    let start = off & !(LINE - 1);
    let end = off.saturating_add(len).saturating_add(LINE - 1) & !(LINE - 1);
    (start, end)
}

/// Coherence for memory that is genuinely coherent for every participant
/// (one host, /dev/shm). Flushes and invalidates do nothing; fences still
/// order this thread's accesses.
#[derive(Clone, Copy, Debug, Default)]
pub struct Coherent;

impl Coherence for Coherent {
    fn flush(&self, region: &View, off: u64, len: u64, _site: Site) -> Result<()> {
        region.check(off, len, 1)
    }
    fn invalidate(&self, region: &View, off: u64, len: u64, _site: Site) -> Result<()> {
        region.check(off, len, 1)?;
        // Nothing to drop, but the load ordering of the contract holds.
        crate::mem::fence_acquire();
        Ok(())
    }
    fn store_fence(&self, _site: Site) {
        crate::mem::fence_seq_cst();
    }
    fn full_fence(&self, _site: Site) {
        crate::mem::fence_seq_cst();
    }
    fn name(&self) -> &'static str {
        "coherent"
    }
}

impl<C: Coherence + ?Sized> Coherence for &C {
    fn flush(&self, region: &View, off: u64, len: u64, site: Site) -> Result<()> {
        (**self).flush(region, off, len, site)
    }
    fn invalidate(&self, region: &View, off: u64, len: u64, site: Site) -> Result<()> {
        (**self).invalidate(region, off, len, site)
    }
    fn store_fence(&self, site: Site) {
        (**self).store_fence(site)
    }
    fn full_fence(&self, site: Site) {
        (**self).full_fence(site)
    }
    fn write_payload(&self, region: &View, off: u64, src: &[u8], site: Site) -> Result<()> {
        (**self).write_payload(region, off, src, site)
    }
    fn invalidate_lines(&self, region: &View, lines: &[u64], site: Site) -> Result<()> {
        (**self).invalidate_lines(region, lines, site)
    }
    fn name(&self) -> &'static str {
        (**self).name()
    }
}
