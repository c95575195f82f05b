//! Simulated non-coherent memory: every simulated host works
//! on its own private copy of the region — its cache — and the only way data
//! moves between copies is what real hardware does:
//!
//! - `flush` queues the touched lines for write-back (like `clflushopt`); a
//!   queued line reaches memory at the next fence, or earlier at random;
//! - a write-back writes the *whole* line, so a stale neighbour field in it
//!   overwrites another host's newer data exactly as hardware would;
//! - `invalidate` writes back the line if dirty, then refills it from memory;
//! - at every call the model may, at random, write back a dirty line or
//!   refill a clean one that the host recently touched (caches evict and
//!   prefetch whenever they like).
//!
//! Every call names its [`Site`]; one site can be disabled to check that the
//! harness notices (a "coherence mutant"). The model calls a yield hook at
//! every call so a scheduler can interleave hosts deterministically.

extern crate alloc;

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;

use cxlkv_core::coherence::{Coherence, Site};
use cxlkv_core::mem::{View, Watch, LINE};
use cxlkv_core::{Error, Result};

const L: usize = LINE as usize;

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; L]);

/// Lines of simulated memory: a raw heap allocation that region views reach
/// through raw pointers, as a mapping is reached (never through a Rust
/// reference: a view's stores and the simulator's line copies are the two
/// ways in, as stores and cache traffic are for hardware).
struct Lines {
    ptr: core::ptr::NonNull<Line>,
    n: usize,
}

// SAFETY: `Lines` owns its allocation; access goes through raw pointers only,
// the way threads share a mapping (races on payload bytes are validated by
// the protocol under test, as on real shared memory).
unsafe impl Send for Lines {}
// SAFETY: as above.
unsafe impl Sync for Lines {}

impl Lines {
    fn zeroed(n: usize) -> Lines {
        let layout = match core::alloc::Layout::array::<Line>(n.max(1)) {
            Ok(l) => l,
            Err(_) => unreachable!("a simulated memory fits the address space"),
        };
        // SAFETY: `layout` has a non-zero size (at least one line).
        let p = unsafe { alloc::alloc::alloc_zeroed(layout) };
        match core::ptr::NonNull::new(p.cast::<Line>()) {
            Some(ptr) => Lines { ptr, n },
            None => alloc::alloc::handle_alloc_error(layout),
        }
    }

    fn at(&self, i: usize) -> *mut Line {
        assert!(i < self.n);
        // In bounds (asserted), so the offset stays inside the allocation.
        self.ptr.as_ptr().wrapping_add(i)
    }

    fn get(&self, i: usize) -> Line {
        let p = self.at(i);
        // SAFETY: `p` is in bounds and aligned (`at`); the allocation lives as
        // long as `self`; a line is plain bytes, valid for any content.
        unsafe { p.read() }
    }

    fn set(&self, i: usize, line: Line) {
        let p = self.at(i);
        // SAFETY: `p` is in bounds and aligned (`at`); the allocation lives as
        // long as `self`; nothing holds a reference into it.
        unsafe { p.write(line) }
    }

    fn base(&self) -> *mut u8 {
        self.ptr.as_ptr().cast::<u8>()
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        if let Ok(layout) = core::alloc::Layout::array::<Line>(self.n.max(1)) {
            // SAFETY: allocated in `zeroed` with this layout, freed once.
            unsafe { alloc::alloc::dealloc(self.ptr.as_ptr().cast::<u8>(), layout) };
        }
    }
}

/// Tuning of the random cache behaviour.
#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    /// Chance (per mille) that each queued write-back completes at a call.
    pub writeback_early: u32,
    /// Lines of recent activity sampled for spontaneous write-back / refill
    /// at each call.
    pub samples: u32,
    /// Chance (per mille) that a sampled dirty line is written back.
    pub spontaneous_writeback: u32,
    /// Chance (per mille) that a sampled clean line is refilled.
    pub spontaneous_refill: u32,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig { writeback_early: 300, samples: 3, spontaneous_writeback: 250, spontaneous_refill: 250 }
    }
}

impl SimConfig {
    /// A cache that never acts on its own: queued write-backs land only at
    /// fences, nothing is evicted or refilled spontaneously. Hardware may
    /// behave so, and it is the harshest case for a missing flush (the line
    /// stays dirty) or a missing invalidate (the stale copy stays forever).
    pub fn lazy() -> SimConfig {
        SimConfig { writeback_early: 0, samples: 0, spontaneous_writeback: 0, spontaneous_refill: 0 }
    }
}

/// A queued write-back: line, tag of the flushing thread, the line's store
/// count and bytes when flushed (later stores are not covered).
#[derive(Clone, Copy)]
struct Queued {
    line: u32,
    tag: u32,
    gen: u64,
    snap: Line,
}

struct HostCache {
    private: Lines,
    /// Lines stored to since they were last written back or refilled.
    dirty: Box<[bool]>,
    /// Queued write-backs: (line, tag of the thread that flushed it). A fence
    /// waits for its own thread's flushes, as `sfence` does for `clflushopt`.
    pending: Vec<Queued>,
    /// Stores to each line so far: a queued write-back covers the stores
    /// made before its flush, not those after.
    gen: Box<[u64]>,
    /// The store count of the bytes last written back from this cache.
    landed: Box<[u64]>,
    /// A store to the line awaits its storing thread's own flush (or own
    /// invalidate). A write-back for another reason (eviction, another
    /// thread's invalidate) lands the bytes but pays no such debt: the
    /// protocol must not rely on luck.
    owed: Box<[bool]>,
    /// Who dirtied each line: the tag set when the store happened, and the
    /// last coherence site this host passed before it (for diagnosis).
    dirtied_by: Box<[(u32, &'static str)]>,
    last_site: &'static str,
    recent: [u32; 32],
    recent_at: usize,
    crashed: bool,
}

struct State {
    shared: Lines,
    hosts: Vec<HostCache>,
    rng: u64,
    cfg: SimConfig,
    disabled: Option<&'static str>,
    executed: BTreeMap<&'static str, u64>,
    /// Dirty lines of crashed hosts that may still land later.
    zombies: Vec<(u32, Line)>,
    /// Who last wrote each line of memory, and how (for diagnosis).
    provenance: Vec<(u16, u8)>,
    writes: u64,
    /// The tag stores are attributed to (the scheduler sets the running actor).
    tag: u32,
}

/// How a line reached memory.
pub const HOW: [&str; 6] = ["fence", "early", "spontaneous", "invalidate", "crash", "zombie"];

/// The scheduler's hook, called with (host, site) at every coherence call.
pub type YieldHook = Box<dyn Fn(usize, &'static str) + Send + Sync>;

/// The simulated memory shared by every simulated host. Views from
/// [`SimMemory::region`] report their stores back to it: keep it alive (and
/// in place) while they are used.
pub struct SimMemory {
    state: spin::Mutex<State>,
    hook: spin::Once<YieldHook>,
    lines: usize,
}

/// The store hook of a host's view: `ctx` is the `SimMemory`, `h` the host.
///
/// # Safety
/// `ctx` points to a live `SimMemory` with more than `h` hosts.
unsafe fn stored_hook(ctx: *const (), h: usize, off: u64, len: u64) {
    // SAFETY: the caller's contract (set up by `SimMemory::view`).
    let mem = unsafe { &*ctx.cast::<SimMemory>() };
    mem.mark_dirty(h, off, len);
}

impl SimMemory {
    /// A memory of `len` bytes (rounded up to lines) seen by `hosts` hosts.
    pub fn new(len: usize, hosts: usize, seed: u64, cfg: SimConfig) -> SimMemory {
        let lines = len.div_ceil(L);
        let blank = || Lines::zeroed(lines);
        let hosts = (0..hosts)
            .map(|_| HostCache {
                private: blank(),
                dirty: vec![false; lines].into_boxed_slice(),
                pending: Vec::new(),
                gen: vec![0; lines].into_boxed_slice(),
                landed: vec![0; lines].into_boxed_slice(),
                owed: vec![false; lines].into_boxed_slice(),
                dirtied_by: vec![(u32::MAX, ""); lines].into_boxed_slice(),
                last_site: "",
                recent: [0; 32],
                recent_at: 0,
                crashed: false,
            })
            .collect();
        SimMemory {
            state: spin::Mutex::new(State {
                shared: blank(),
                hosts,
                rng: seed | 1,
                cfg,
                disabled: None,
                executed: BTreeMap::new(),
                zombies: Vec::new(),
                provenance: vec![(u16::MAX, 0); lines],
                writes: 0,
                tag: u32::MAX,
            }),
            hook: spin::Once::new(),
            lines,
        }
    }

    fn st(&self) -> spin::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Installs the scheduler's yield hook, called with the host id at every
    /// coherence call (never with the simulator's state locked). The first
    /// hook set stays.
    pub fn set_yield_hook(&self, f: YieldHook) {
        self.hook.call_once(|| f);
    }

    fn yield_hook(&self, h: usize, site: &'static str) {
        if let Some(f) = self.hook.get() {
            f(h, site);
        }
    }

    /// Disables every call at `site` (a coherence mutant).
    pub fn disable(&self, site: Option<&'static str>) {
        self.st().disabled = site;
    }

    /// How many times each site ran.
    pub fn executed(&self) -> BTreeMap<&'static str, u64> {
        self.st().executed.clone()
    }

    /// Host `h`'s view of the region (its private copy).
    pub fn view(&self, h: usize) -> View {
        let p = self.st().hosts[h].private.base();
        // SAFETY: the private buffer is 64-aligned, `lines * 64` bytes, lives as
        // long as `self` (never reallocated), and is reached only through raw
        // pointers (View views and this simulator).
        let r = match unsafe { View::new(p, self.lines * L) } {
            Ok(r) => r,
            Err(_) => unreachable!("line-aligned buffer"),
        };
        let watch = Watch { hook: stored_hook, ctx: (self as *const SimMemory).cast(), arg: h };
        // SAFETY: callers keep the SimMemory alive (and in place) while they
        // use its views (documented on `SimMemory`), and `stored_hook` with
        // this context marks host `h`'s lines under the simulator's lock.
        unsafe { r.watched(watch) }
    }

    /// Marks host `h`'s lines overlapping `off..off+len` dirty (a store).
    fn mark_dirty(&self, h: usize, off: u64, len: u64) {
        if len == 0 {
            return;
        }
        let mut st = self.st();
        let a = (off / LINE) as usize;
        let b = ((off + len).div_ceil(LINE) as usize).min(self.lines);
        let tag = st.tag;
        let c = &mut st.hosts[h];
        for i in a..b {
            c.dirty[i] = true;
            c.gen[i] += 1;
            c.owed[i] = true;
            c.dirtied_by[i] = (tag, c.last_site);
        }
        // Stored lines are recent activity: candidates for spontaneous
        // write-back, as a cache under pressure may evict any of them.
        if b > a {
            touch(&mut st, h, a);
            touch(&mut st, h, b - 1);
        }
    }

    /// Attributes the following stores to `tag` (the scheduler calls this
    /// whenever another actor runs).
    pub fn set_tag(&self, tag: u32) {
        self.st().tag = tag;
    }

    /// Lines last stored under `tag` on host `h` whose stores that thread has
    /// not yet written back by its own flush and fence (or invalidate), with
    /// the last coherence site the host passed before the store: what an
    /// operation of that actor left unpublished.
    pub fn dirty_tagged(&self, h: usize, tag: u32) -> Vec<(usize, &'static str)> {
        let st = self.st();
        let c = &st.hosts[h];
        (0..self.lines).filter(|&i| c.owed[i] && c.dirtied_by[i].0 == tag).map(|i| (i, c.dirtied_by[i].1)).collect()
    }

    /// A view of memory itself (what a host would read after invalidating
    /// everything): for checking the ground truth.
    pub fn shared_region(&self) -> View {
        let p = self.st().shared.base();
        // SAFETY: as in `region`, for the shared buffer.
        match unsafe { View::new(p, self.lines * L) } {
            Ok(r) => r,
            Err(_) => unreachable!("line-aligned buffer"),
        }
    }

    /// The coherence implementation of host `h`.
    pub fn host(&self, h: usize) -> SimCoherence<'_> {
        SimCoherence { mem: self, host: h }
    }

    /// Crashes host `h`: each of its dirty lines is lost, written back now, or
    /// kept to land at a random later moment.
    pub fn crash(&self, h: usize) {
        let mut st = self.st();
        let st = &mut *st;
        let n = self.lines;
        for i in 0..n {
            if !st.hosts[h].dirty[i] {
                continue;
            }
            st.hosts[h].dirty[i] = false;
            match next(&mut st.rng) % 3 {
                0 => {}
                1 => {
                    st.shared.set(i, st.hosts[h].private.get(i));
                    st.provenance[i] = (h as u16, 4);
                }
                _ => {
                    let line = st.hosts[h].private.get(i);
                    st.zombies.push((i as u32, line));
                }
            }
        }
        st.hosts[h].pending.clear();
        st.hosts[h].owed.iter_mut().for_each(|o| *o = false);
        st.hosts[h].crashed = true;
    }

    /// The only process of live host `h` died and no sibling will write
    /// back what it left: the host's cache writes each dirty or queued line
    /// back now or at a random later moment (a zombie, landed before any
    /// recovery: it cannot outlive the lease that must pass before the
    /// process is declared dead). Unlike [`SimMemory::crash`] nothing is
    /// lost and the cache keeps its clean, possibly stale, copies.
    pub fn orphan(&self, h: usize) {
        let mut st = self.st();
        let st = &mut *st;
        for q in core::mem::take(&mut st.hosts[h].pending) {
            land(st, h, q, 0);
        }
        for i in 0..self.lines {
            if !st.hosts[h].dirty[i] {
                continue;
            }
            st.hosts[h].dirty[i] = false;
            st.hosts[h].landed[i] = st.hosts[h].gen[i];
            let line = st.hosts[h].private.get(i);
            if next(&mut st.rng).is_multiple_of(2) {
                st.shared.set(i, line);
                st.provenance[i] = (h as u16, 4);
            } else {
                st.zombies.push((i as u32, line));
            }
        }
        st.hosts[h].owed.iter_mut().for_each(|o| *o = false);
    }

    /// Lands every zombie line now (the end of a run: nothing stays in
    /// flight forever).
    pub fn drain_zombies(&self) {
        let mut st = self.st();
        for (i, line) in core::mem::take(&mut st.zombies) {
            st.shared.set(i as usize, line);
            st.provenance[i as usize] = (u16::MAX - 1, 5);
        }
    }

    /// Completes every queued write-back of host `h` (its caches drained).
    pub fn drain(&self, h: usize) {
        let mut st = self.st();
        let pend = core::mem::take(&mut st.hosts[h].pending);
        for q in pend {
            land(&mut st, h, q, 0);
        }
    }

    /// Completes every queued write-back of host `h` but those of the lines
    /// `keep` names, which stay queued (flushes complete in any order).
    pub fn drain_but(&self, h: usize, keep: impl Fn(usize) -> bool) {
        let mut st = self.st();
        let pend = core::mem::take(&mut st.hosts[h].pending);
        for q in pend {
            if keep(q.line as usize) {
                st.hosts[h].pending.push(q);
            } else {
                land(&mut st, h, q, 0);
            }
        }
    }

    /// Completes host `h`'s queued write-backs of line `i` now, the others
    /// staying queued: flushes not yet fenced complete in any order.
    pub fn land_queued(&self, h: usize, i: usize) {
        let mut st = self.st();
        let mut k = 0;
        while k < st.hosts[h].pending.len() {
            if st.hosts[h].pending[k].line as usize == i {
                let q = st.hosts[h].pending.swap_remove(k);
                land(&mut st, h, q, 0);
            } else {
                k += 1;
            }
        }
    }

    /// Host `h`'s cache writes line `i` back now if it is dirty (an
    /// eviction, which hardware may do at any moment): the line as the
    /// cache holds it reaches memory; a queued write-back of it stays queued.
    pub fn evict_line(&self, h: usize, i: usize) {
        let mut st = self.st();
        writeback(&mut st, h, i, 2);
    }

    /// True when host `h` holds line `i` modified and not written back.
    pub fn is_dirty(&self, h: usize, i: usize) -> bool {
        self.st().hosts[h].dirty[i]
    }

    /// Which host last wrote memory line `i` and how (`HOW[how]`).
    pub fn provenance(&self, i: usize) -> (u16, &'static str) {
        let (h, how) = self.st().provenance[i];
        (h, HOW[how as usize])
    }

    /// Draws a random number from the simulator's seeded generator.
    pub fn random(&self) -> u64 {
        next(&mut self.st().rng)
    }

    fn call(&self, h: usize, site: Site) -> bool {
        let enabled = {
            let mut st = self.st();
            *st.executed.entry(site.0).or_insert(0) += 1;
            let enabled = st.disabled != Some(site.0);
            st.hosts[h].last_site = site.0;
            // Caches act first, then other hosts may run: what landed early
            // is visible to them while this host is descheduled.
            self.chaos(&mut st, h);
            enabled
        };
        self.yield_hook(h, site.0);
        enabled
    }

    /// Random cache behaviour at a call of host `h`.
    fn chaos(&self, st: &mut State, h: usize) {
        if st.hosts[h].crashed {
            return;
        }
        let cfg = st.cfg;
        let mut k = 0;
        while k < st.hosts[h].pending.len() {
            if (next(&mut st.rng) % 1000) < cfg.writeback_early as u64 {
                let q = st.hosts[h].pending.swap_remove(k);
                land(st, h, q, 1);
            } else {
                k += 1;
            }
        }
        for _ in 0..cfg.samples {
            let r = next(&mut st.rng);
            let base = st.hosts[h].recent[(r % 32) as usize] as i64;
            let i = (base + ((r >> 8) % 5) as i64 - 2).clamp(0, self.lines as i64 - 1) as usize;
            let dirty = st.hosts[h].dirty[i];
            let p = (r >> 16) % 1000;
            if dirty && p < cfg.spontaneous_writeback as u64 {
                writeback(st, h, i, 2);
            } else if !dirty && p < cfg.spontaneous_refill as u64 {
                st.hosts[h].private.set(i, st.shared.get(i));
            }
        }
        if !st.zombies.is_empty() && next(&mut st.rng).is_multiple_of(50) {
            let (i, line) = st.zombies.swap_remove(0);
            st.shared.set(i as usize, line);
            st.provenance[i as usize] = (u16::MAX - 1, 5);
        }
    }

    fn lines_of(&self, region: &View, off: u64, len: u64) -> Result<(usize, usize)> {
        region.check(off, len, 1)?;
        if len == 0 {
            return Ok((0, 0));
        }
        let a = (off / LINE) as usize;
        let b = (off + len).div_ceil(LINE) as usize;
        if b > self.lines {
            return Err(Error::OutOfBounds);
        }
        Ok((a, b))
    }
}

/// Notes line `i` as recent activity of host `h`.
fn touch(st: &mut State, h: usize, i: usize) {
    let c = &mut st.hosts[h];
    c.recent[c.recent_at % 32] = i as u32;
    c.recent_at += 1;
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Completes a queued write-back: the line as it was at its flush reaches
/// memory (unless newer bytes of it already did). Stores made after the
/// flush are not covered: the line then stays dirty and owed.
fn land(st: &mut State, h: usize, q: Queued, how: u8) {
    let i = q.line as usize;
    if st.hosts[h].gen[i] == q.gen {
        writeback(st, h, i, how);
        st.hosts[h].owed[i] = false;
    } else if q.gen > st.hosts[h].landed[i] {
        st.shared.set(i, q.snap);
        st.hosts[h].landed[i] = q.gen;
        st.provenance[i] = (h as u16, how);
    }
}

fn writeback(st: &mut State, h: usize, i: usize, how: u8) {
    let c = &mut st.hosts[h];
    if c.dirty[i] {
        st.shared.set(i, c.private.get(i));
        c.dirty[i] = false;
        c.landed[i] = c.gen[i];
        st.provenance[i] = (h as u16, how);
        st.writes += 1;
    }
}

/// One simulated host's `Coherence`.
#[derive(Clone, Copy)]
pub struct SimCoherence<'a> {
    mem: &'a SimMemory,
    host: usize,
}

impl SimCoherence<'_> {
    /// The host id.
    pub fn host(&self) -> usize {
        self.host
    }
}

impl Coherence for SimCoherence<'_> {
    fn flush(&self, region: &View, off: u64, len: u64, site: Site) -> Result<()> {
        let (a, b) = self.mem.lines_of(region, off, len)?;
        let enabled = self.mem.call(self.host, site);
        let mut st = self.mem.st();
        if enabled {
            let tag = st.tag;
            let c = &mut st.hosts[self.host];
            for i in a..b {
                let (line, gen) = (i as u32, c.gen[i]);
                if !c.pending.iter().any(|q| q.line == line && q.tag == tag && q.gen == gen) {
                    c.pending.push(Queued { line, tag, gen, snap: c.private.get(i) });
                }
            }
        }
        if b > a {
            touch(&mut st, self.host, a);
            touch(&mut st, self.host, b - 1);
        }
        Ok(())
    }

    fn invalidate(&self, region: &View, off: u64, len: u64, site: Site) -> Result<()> {
        let (a, b) = self.mem.lines_of(region, off, len)?;
        let enabled = self.mem.call(self.host, site);
        let mut st = self.mem.st();
        let st = &mut *st;
        if enabled {
            let tag = st.tag;
            for i in a..b {
                // Queued write-backs of the line complete with it.
                let c = &mut st.hosts[self.host];
                let g = c.gen[i];
                let mut paid = c.dirtied_by[i].0 == tag;
                c.pending.retain(|q| {
                    paid |= q.line == i as u32 && q.gen == g;
                    q.line != i as u32
                });
                writeback(st, self.host, i, 3);
                if paid {
                    st.hosts[self.host].owed[i] = false;
                }
                st.hosts[self.host].private.set(i, st.shared.get(i));
            }
        }
        if b > a {
            touch(st, self.host, a);
        }
        Ok(())
    }

    fn store_fence(&self, site: Site) {
        if self.mem.call(self.host, site) {
            self.fence_all(site);
        }
    }

    fn full_fence(&self, site: Site) {
        if self.mem.call(self.host, site) {
            self.fence_all(site);
        }
    }

    fn name(&self) -> &'static str {
        "sim"
    }
}

impl SimCoherence<'_> {
    /// Completes every queued write-back, one line at a time in a random
    /// order, and other hosts may run between two of them: a fence bounds
    /// when write-backs complete, never the order in which others see them.
    fn fence_all(&self, site: Site) {
        let mut pend: Vec<Queued> = Vec::new();
        {
            let mut st = self.mem.st();
            let tag = st.tag;
            st.hosts[self.host].pending.retain(|&q| {
                if q.tag == tag {
                    pend.push(q);
                }
                q.tag != tag
            });
        }
        while !pend.is_empty() {
            {
                let mut st = self.mem.st();
                let k = (next(&mut st.rng) as usize) % pend.len();
                let q = pend.swap_remove(k);
                land(&mut st, self.host, q, 0);
            }
            if !pend.is_empty() {
                self.mem.yield_hook(self.host, site.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quiet() -> SimConfig {
        SimConfig::lazy()
    }

    #[test]
    fn store_is_invisible_to_another_host_until_flush_fence_and_invalidate() {
        let sut = SimMemory::new(4096, 2, 1, quiet());
        let (a, b) = (sut.host(0), sut.host(1));
        let (ra, rb) = (sut.view(0), sut.view(1));
        ra.store_u64(128, 7).unwrap();
        b.invalidate(&rb, 128, 8, Site("t")).unwrap();
        assert_eq!(rb.load_u64(128).unwrap(), 0, "not flushed");
        a.flush(&ra, 128, 8, Site("t")).unwrap();
        b.invalidate(&rb, 128, 8, Site("t")).unwrap();
        assert_eq!(rb.load_u64(128).unwrap(), 0, "flush queued, not fenced");
        a.store_fence(Site("t"));
        assert_eq!(rb.load_u64(128).unwrap(), 0, "stale until invalidated");
        b.invalidate(&rb, 128, 8, Site("t")).unwrap();
        assert_eq!(rb.load_u64(128).unwrap(), 7);
    }

    #[test]
    fn writeback_carries_the_whole_line_and_clobbers_stale_neighbours() {
        let sut = SimMemory::new(4096, 2, 1, quiet());
        let (a, b) = (sut.host(0), sut.host(1));
        let (ra, rb) = (sut.view(0), sut.view(1));
        ra.store_u64(0, 1).unwrap();
        rb.store_u64(8, 2).unwrap();
        a.flush(&ra, 0, 8, Site("t")).unwrap();
        a.store_fence(Site("t"));
        b.flush(&rb, 8, 8, Site("t")).unwrap();
        b.store_fence(Site("t"));
        let m = sut.shared_region();
        assert_eq!((m.load_u64(0).unwrap(), m.load_u64(8).unwrap()), (0, 2), "b's stale word 0 overwrote a's");
    }

    #[test]
    fn disabled_site_does_nothing() {
        let sut = SimMemory::new(4096, 2, 1, quiet());
        let a = sut.host(0);
        let ra = sut.view(0);
        sut.disable(Some("off"));
        ra.store_u64(64, 9).unwrap();
        a.flush(&ra, 64, 8, Site("off")).unwrap();
        a.store_fence(Site("t"));
        assert_eq!(sut.shared_region().load_u64(64).unwrap(), 0);
        assert_eq!(sut.executed().get("off"), Some(&1));
    }
}
