//! `Coherence` with real cache-maintenance instructions.
//!
//! | mode         | flush (publish)      | invalidate (read fresh) | store fence |
//! |--------------|----------------------|-------------------------|-------------|
//! | `coherent`   | nothing              | nothing                 | `mfence`    |
//! | `clflush`    | `clflush`            | `clflush`               | `mfence`    |
//! | `clflushopt` | `clflushopt`         | `clflushopt`            | `sfence`    |
//! | `clwb`       | `clwb`               | `clflushopt`/`clflush`  | `sfence`    |
//! | aarch64      | `dc cvac`            | `dc civac`              | `dsb sy`    |
//!
//! The default (`auto`) is the cheapest mode that is correct on
//! non-coherent memory on this CPU: `clwb` where the CPU has it (and
//! `clflushopt`, which invalidates in that mode), else `clflushopt`, else
//! `clflush`; `dc civac` on aarch64. `clwb` writes a line back and may keep
//! a now possibly stale copy in this host's cache — exactly the behaviour the
//! simulator gives every flush (a flush queues a write-back, the host keeps
//! its copy), so the protocol is proven under the weakest of the three;
//! every read that must be fresh invalidates first. `clflush` (synchronous,
//! TraCT §3.4) stays selectable. Payloads are written with streaming
//! (non-temporal) stores in every mode that flushes ([`PayloadStores`]):
//! they leave no dirty line behind, and the store fence that orders the
//! publication drains them.
//!
//! In `clflush` mode a range of [`BULK_LINES`] lines or more (a payload) is
//! invalidated with `clflushopt` where the CPU has it: `clflush` runs one
//! line at a time, `clflushopt` overlaps them, and the `mfence` that follows
//! either way completes every one before a load is served, so the guarantee
//! is the same.

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
pub mod x86;

use core::str::FromStr;

use cxlkv_core::coherence::{line_span, Coherence, Site};
use cxlkv_core::mem::{View, LINE};

use crate::error::{Error, Result};

/// Which instructions carry flushes and invalidations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlushMode {
    /// Genuinely coherent memory (one host): no cache maintenance.
    Coherent,
    /// x86 `clflush` (synchronous; the conservative choice).
    Clflush,
    /// x86 `clflushopt` + `sfence`.
    Clflushopt,
    /// x86 `clwb` + `sfence` to publish; invalidation by `clflushopt`.
    Clwb,
    /// aarch64 `dc cvac` / `dc civac` + `dsb sy`.
    DcCivac,
}

impl FlushMode {
    /// Every mode, for reports and benchmarks.
    pub const ALL: [FlushMode; 5] =
        [FlushMode::Coherent, FlushMode::Clflush, FlushMode::Clflushopt, FlushMode::Clwb, FlushMode::DcCivac];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            FlushMode::Coherent => "coherent",
            FlushMode::Clflush => "clflush",
            FlushMode::Clflushopt => "clflushopt",
            FlushMode::Clwb => "clwb",
            FlushMode::DcCivac => "dc-civac",
        }
    }

    /// True when this machine can execute the mode.
    pub fn available(self) -> bool {
        match self {
            FlushMode::Coherent => true,
            #[cfg(target_arch = "x86_64")]
            FlushMode::Clflush => true,
            #[cfg(target_arch = "x86_64")]
            FlushMode::Clflushopt => x86::has_clflushopt(),
            #[cfg(target_arch = "x86_64")]
            FlushMode::Clwb => x86::has_clwb() && x86::has_clflushopt(),
            #[cfg(target_arch = "aarch64")]
            FlushMode::DcCivac => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The default for non-coherent memory: the cheapest mode this CPU has
    /// that is correct there (see the module notes).
    pub fn default_for_arch() -> FlushMode {
        [FlushMode::Clwb, FlushMode::Clflushopt, FlushMode::DcCivac, FlushMode::Clflush]
            .into_iter()
            .find(|m| m.available())
            .unwrap_or(FlushMode::Coherent)
    }

    /// The cheapest available mode that still publishes and invalidates
    /// (the same as [`FlushMode::default_for_arch`]; kept as `fastest`).
    pub fn fastest_available() -> FlushMode {
        FlushMode::default_for_arch()
    }
}

impl FromStr for FlushMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            // `default`: the name Python and Node used for it first.
            "auto" | "default" => Ok(FlushMode::default_for_arch()),
            "fastest" => Ok(FlushMode::fastest_available()),
            _ => FlushMode::ALL
                .into_iter()
                .find(|m| m.name() == s)
                .ok_or(Error::Core(cxlkv_core::Error::InvalidArgument)),
        }
    }
}

/// How payloads are written into the region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PayloadStores {
    /// Streaming (non-temporal) stores in every mode that flushes, where the
    /// CPU has them (x86-64); plain stores on coherent memory and elsewhere.
    #[default]
    Auto,
    /// Streaming stores in every mode (x86-64 only).
    Streaming,
    /// Plain stores, then the mode's flush of every line.
    Plain,
}

impl PayloadStores {
    /// Whether payloads written in `mode` use streaming stores.
    pub fn streaming(self, mode: FlushMode) -> bool {
        match self {
            PayloadStores::Auto => cfg!(target_arch = "x86_64") && mode != FlushMode::Coherent,
            PayloadStores::Streaming => true,
            PayloadStores::Plain => false,
        }
    }
}

/// Lines from which `clflush` mode invalidates with `clflushopt`.
pub const BULK_LINES: usize = 16;

/// A `Coherence` implementation backed by a [`FlushMode`].
#[derive(Clone, Copy, Debug)]
pub struct Flush {
    mode: FlushMode,
    nt_payload: bool,
    /// `clflush` mode invalidates bulk ranges with `clflushopt` (the CPU has
    /// it; asked once: CPUID is slow in a virtual machine). Always false,
    /// and unread, off x86-64.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    bulk_opt: bool,
}

impl Flush {
    /// Coherence by `mode`; `nt_payload` writes payloads with non-temporal
    /// stores. Fails with `Unsupported` when this CPU lacks the instructions.
    pub fn new(mode: FlushMode, nt_payload: bool) -> Result<Flush> {
        if !mode.available() {
            return Err(Error::Unsupported("flush mode not available on this CPU"));
        }
        if nt_payload && !cfg!(target_arch = "x86_64") {
            return Err(Error::Unsupported("non-temporal payload stores need x86-64"));
        }
        #[cfg(target_arch = "x86_64")]
        let bulk_opt = mode == FlushMode::Clflush && x86::has_clflushopt();
        #[cfg(not(target_arch = "x86_64"))]
        let bulk_opt = false;
        Ok(Flush { mode, nt_payload, bulk_opt })
    }

    /// The mode.
    pub fn mode(&self) -> FlushMode {
        self.mode
    }

    /// Whether payloads use non-temporal stores.
    pub fn nt_payload(&self) -> bool {
        self.nt_payload
    }

    fn lines(region: &View, off: u64, len: u64) -> cxlkv_core::Result<(*mut u8, usize)> {
        region.check(off, len, 1)?;
        let (start, end) = line_span(off, len);
        let end = end.min(region.len().div_ceil(LINE) * LINE);
        let n = ((end - start) / LINE) as usize;
        // `start` is inside the region (rounded down from a checked offset).
        Ok((region.base().wrapping_add(start as usize), n))
    }
}

impl Coherence for Flush {
    fn flush(&self, region: &View, off: u64, len: u64, _site: Site) -> cxlkv_core::Result<()> {
        let (p, n) = Self::lines(region, off, len)?;
        match self.mode {
            FlushMode::Coherent => {}
            // A payload written through a pointer: `clflushopt` overlaps the
            // write-backs, and the `mfence` that `store_fence` is in this
            // mode completes every one before the store that publishes them.
            #[cfg(target_arch = "x86_64")]
            FlushMode::Clflush if self.bulk_opt && n >= BULK_LINES => x86::clflushopt_lines(p, n),
            #[cfg(target_arch = "x86_64")]
            FlushMode::Clflush => x86::clflush_lines(p, n),
            #[cfg(target_arch = "x86_64")]
            FlushMode::Clflushopt => x86::clflushopt_lines(p, n),
            #[cfg(target_arch = "x86_64")]
            FlushMode::Clwb => x86::clwb_lines(p, n),
            #[cfg(target_arch = "aarch64")]
            FlushMode::DcCivac => aarch64::clean_lines(p, n),
            #[allow(unreachable_patterns)]
            _ => {}
        }
        Ok(())
    }

    fn invalidate(&self, region: &View, off: u64, len: u64, _site: Site) -> cxlkv_core::Result<()> {
        let (p, n) = Self::lines(region, off, len)?;
        match self.mode {
            // Nothing to drop; loads stay ordered as the contract says.
            FlushMode::Coherent => cxlkv_core::mem::fence_acquire(),
            #[cfg(target_arch = "x86_64")]
            FlushMode::Clflush => {
                if self.bulk_opt && n >= BULK_LINES {
                    x86::clflushopt_lines(p, n);
                } else {
                    x86::clflush_lines(p, n);
                }
                // The loads that follow must not be served before the lines
                // were dropped (for `clflushopt`, before they completed).
                x86::mfence();
            }
            #[cfg(target_arch = "x86_64")]
            FlushMode::Clflushopt | FlushMode::Clwb => {
                x86::clflushopt_lines(p, n);
                x86::mfence();
            }
            #[cfg(target_arch = "aarch64")]
            FlushMode::DcCivac => aarch64::clean_invalidate_lines(p, n),
            #[allow(unreachable_patterns)]
            _ => {}
        }
        Ok(())
    }

    fn invalidate_lines(&self, region: &View, lines: &[u64], _site: Site) -> cxlkv_core::Result<()> {
        for &l in lines {
            let (p, n) = Self::lines(region, l, 1)?;
            match self.mode {
                // Nothing to drop: start the loads early instead.
                #[cfg(target_arch = "x86_64")]
                FlushMode::Coherent => x86::prefetch(p),
                #[cfg(target_arch = "x86_64")]
                FlushMode::Clflush if !self.bulk_opt => x86::clflush_lines(p, n),
                #[cfg(target_arch = "x86_64")]
                FlushMode::Clflush | FlushMode::Clflushopt | FlushMode::Clwb => x86::clflushopt_lines(p, n),
                #[cfg(target_arch = "aarch64")]
                FlushMode::DcCivac => aarch64::clean_invalidate_lines(p, n),
                #[allow(unreachable_patterns)]
                _ => {}
            }
        }
        // One ordering for the batch: the loads that follow are not served
        // before every line was dropped (`mfence` completes `clflushopt`).
        match self.mode {
            FlushMode::Coherent => cxlkv_core::mem::fence_acquire(),
            #[cfg(target_arch = "x86_64")]
            _ => {
                x86::mfence();
                // Then start every load at once: the lines come from memory
                // now, since this host's copies are gone (the validated
                // reads that follow serialise their own loads).
                for &l in lines {
                    x86::prefetch(Self::lines(region, l, 1)?.0);
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => {}
        }
        Ok(())
    }

    fn store_fence(&self, _site: Site) {
        match self.mode {
            #[cfg(target_arch = "x86_64")]
            FlushMode::Clflushopt | FlushMode::Clwb => x86::sfence(),
            #[cfg(target_arch = "aarch64")]
            FlushMode::DcCivac => aarch64::dsb_sy(),
            // `mfence` itself, not whatever a compiler lowers a fence to (a
            // locked instruction may not drain streaming stores).
            #[cfg(target_arch = "x86_64")]
            _ => x86::mfence(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => cxlkv_core::mem::fence_seq_cst(),
        }
    }

    fn full_fence(&self, _site: Site) {
        match self.mode {
            #[cfg(target_arch = "aarch64")]
            FlushMode::DcCivac => aarch64::dsb_sy(),
            #[cfg(target_arch = "x86_64")]
            _ => x86::mfence(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => cxlkv_core::mem::fence_seq_cst(),
        }
    }

    fn write_payload(&self, region: &View, off: u64, src: &[u8], site: Site) -> cxlkv_core::Result<()> {
        #[cfg(target_arch = "x86_64")]
        if self.nt_payload {
            let p = region.ptr(off, src.len() as u64, 1)?;
            // SAFETY:
            // - `p..p+src.len()` is inside the region (checked by `ptr`);
            // - the payload range is owned by the writer (entry WRITING).
            unsafe { x86::nt_copy(p, src) };
            // No fence here: the caller's next `store_fence` (`sfence`, or
            // `mfence` in `clflush` and `coherent` mode) orders the streaming
            // stores before the entry that publishes them, once per batch.
            return Ok(());
        }
        region.copy_in(off, src)?;
        self.flush(region, off, src.len() as u64, site)
    }

    fn name(&self) -> &'static str {
        if self.nt_payload {
            match self.mode {
                FlushMode::Clflush => "clflush+nt",
                FlushMode::Clflushopt => "clflushopt+nt",
                FlushMode::Clwb => "clwb+nt",
                _ => "coherent+nt",
            }
        } else {
            self.mode.name()
        }
    }
}

#[cfg(test)]
mod tests;
