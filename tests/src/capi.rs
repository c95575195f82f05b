//! The `capi` fuzz target: arbitrary sequences of C API calls, as a C
//! program could make them (NULL handles, closed handles, handles of the
//! wrong kind, stale and forged blocks, bad sizes, names and offsets), must
//! never crash and must leave a region that checks clean.
//!
//! Every pointer this target passes is NULL or valid for the length it
//! passes with it, as the API's contract requires; payload pointers are
//! dereferenced only while their node is attached and their pin or
//! reservation is held.

use core::ffi::{c_char, c_void};

use cxlkv::blocks::*;
use cxlkv::copy::*;
use cxlkv::cxlkv_result as R;
use cxlkv::kv::*;
use cxlkv::region::*;
use cxlkv::shm::*;

/// One C call; the module doc states the contract every call here keeps.
macro_rules! c {
    ($e:expr) => {{
        // SAFETY: every pointer argument is NULL, a handle from the library
        // (never freed), or valid for the length passed with it.
        unsafe { $e }
    }};
}

/// What a run did, for the replay test's sanity checks.
#[derive(Clone, Copy, Debug, Default)]
pub struct CapiRun {
    /// Calls made.
    pub calls: usize,
    /// Blocks published (by publish or put).
    pub published: usize,
}

struct Input<'a> {
    data: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = self.data.get(self.at).copied();
        self.at += 1;
        b
    }
    fn small(&mut self, n: u8) -> usize {
        (self.byte().unwrap_or(0) % n) as usize
    }
}

struct State {
    local_dir: std::ffi::CString,
    regions: Vec<*mut cxlkv_region>,
    nodes: Vec<*mut cxlkv_node>,
    reserved: Vec<(usize, cxlkv_block)>,
    pinned: Vec<(usize, cxlkv_block)>,
    stale: Vec<cxlkv_block>,
    tickets: Vec<(usize, cxlkv_lock_ticket)>,
    offsets: Vec<u64>,
    run: CapiRun,
    /// The first `keep` nodes are the pool's (pooled mode; 0 otherwise).
    keep: usize,
}

const NS: u32 = 5;

/// True when node `n` was declared dead (its process stopped, or starved of
/// CPU, past the lease): the region no longer says it is alive. Calls that
/// take a lock answer REVOKED from then on, and it can neither recover nor
/// check for the end of an input.
fn fenced(n: *const cxlkv_node) -> bool {
    let (mut id, mut s) = (0u32, cxlkv_stats::default());
    c!(cxlkv_node_id(n, &mut id)) == R::Ok
        && c!(cxlkv_node_stats(n, &mut s)) == R::Ok
        && id < 64
        && s.alive_mask & (1 << id) == 0
}

fn key(i: usize) -> cxlkv_key {
    cxlkv_key { lo: (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15), hi: i as u64 % 5 }
}

fn pattern(k: &cxlkv_key, len: usize) -> Vec<u8> {
    (0..len).map(|j| (k.lo as usize + j * 7) as u8).collect()
}

impl State {
    fn region(&self, inp: &mut Input<'_>) -> *mut cxlkv_region {
        match inp.small(8) {
            0 => core::ptr::null_mut(),
            // A node handle where a region is expected.
            1 if !self.nodes.is_empty() => self.nodes[0].cast(),
            i => self.regions.get(i % self.regions.len().max(1)).copied().unwrap_or(core::ptr::null_mut()),
        }
    }

    /// A node slot (index) and its handle: live, closed, NULL or foreign.
    fn node(&self, inp: &mut Input<'_>) -> (usize, *const cxlkv_node) {
        match inp.small(16) {
            0 => (usize::MAX, core::ptr::null()),
            1 if !self.regions.is_empty() => (usize::MAX, self.regions[0].cast()),
            i if !self.nodes.is_empty() => (i % self.nodes.len(), self.nodes[i % self.nodes.len()]),
            _ => (usize::MAX, core::ptr::null()),
        }
    }

    /// Attached, and not declared dead (see [`fenced`]).
    fn live(&self, n: *const cxlkv_node) -> bool {
        let mut id = 0u32;
        c!(cxlkv_node_id(n, &mut id)) == R::Ok && !fenced(n)
    }

    fn step(&mut self, inp: &mut Input<'_>) -> Option<()> {
        let op = inp.byte()?;
        self.run.calls += 1;
        match op % 24 {
            0 if self.regions.len() < 3 => {
                let size = [4096u64, 1 << 20, 3 << 20][inp.small(3)];
                let mut r = core::ptr::null_mut();
                if c!(cxlkv_region_memfd(size, false, &mut r)) == R::Ok {
                    self.regions.push(r);
                }
            }
            1 => {
                let r = self.region(inp);
                let mut caps = pool_caps();
                match inp.small(4) {
                    0 => caps.n_stripes = 3,
                    1 => caps.app_locks = 100_000,
                    _ => {}
                }
                let _ = c!(cxlkv_region_format(r, &caps, CXLKV_FLUSH_CLFLUSH));
            }
            2 if self.nodes.len() < 4 => {
                let r = self.region(inp);
                let mut o = node_options(&self.local_dir);
                if inp.small(4) == 0 {
                    o.node_id = inp.small(6) as u32;
                }
                let mut n = core::ptr::null_mut();
                if c!(cxlkv_node_attach(r, &o, &mut n)) == R::Ok {
                    self.nodes.push(n);
                }
            }
            3 => {
                let (i, n) = self.node(inp);
                // A pooled node is detached (and attached again after the
                // input) only now and then: each costs milliseconds.
                if i < self.keep && inp.small(16) != 0 {
                    return Some(());
                }
                // Refused (Busy) while the node holds an application lock:
                // then it keeps everything it holds, tickets included (a
                // ticket forgotten here would keep the node from ever
                // detaching, and its threads alive).
                if c!(cxlkv_node_detach(n.cast_mut())) != R::Busy && i != usize::MAX {
                    self.forget(i);
                }
            }
            4 => {
                let r = self.region(inp);
                // The pooled region is closed (and the pool made anew after
                // the input) only now and then.
                if self.keep > 0 && self.regions.first() == Some(&r) && inp.small(16) != 0 {
                    return Some(());
                }
                c!(cxlkv_region_close(r));
            }
            5 => {
                let (i, n) = self.node(inp);
                let count = inp.small(4);
                let items: Vec<cxlkv_reserve_item> = (0..count)
                    .map(|_| {
                        let len = [0u64, 1, 100, 5000, 70_000, u64::MAX][inp.small(6)];
                        cxlkv_reserve_item { key: key(inp.small(12)), len, tokens: 16, reserved: 0 }
                    })
                    .collect();
                let mut blocks = vec![cxlkv_block::EMPTY; count];
                let mut st = vec![R::Ok; count];
                let r = c!(cxlkv_reserve(
                    n,
                    NS,
                    items.as_ptr(),
                    count,
                    blocks.as_mut_ptr(),
                    st.as_mut_ptr(),
                    core::ptr::null_mut()
                ));
                if r == R::Ok {
                    for (b, s) in blocks.iter().zip(&st) {
                        if *s == R::Ok && !b.data.is_null() {
                            let pat = pattern(&b.key, b.len as usize);
                            // SAFETY: just reserved by the live node `i`: `len`
                            // writable bytes at `data`, mapped while it is attached.
                            unsafe { core::ptr::copy_nonoverlapping(pat.as_ptr(), b.data.cast::<u8>(), pat.len()) };
                            self.reserved.push((i, *b));
                        }
                    }
                }
            }
            6 | 7 => {
                // Publish (6) or abort (7) some reserved blocks, maybe through
                // another node or with a forged field.
                let take = inp.small(3) + 1;
                let mut bs: Vec<(usize, cxlkv_block)> =
                    (0..take.min(self.reserved.len())).map(|_| self.reserved.remove(0)).collect();
                let node = bs.first().map(|b| b.0).filter(|&i| i < self.nodes.len());
                let mut n = node.map_or(core::ptr::null(), |i| self.nodes[i].cast_const());
                match inp.small(6) {
                    0 => n = self.node(inp).1,
                    1 if !bs.is_empty() => bs[0].1.gen ^= 1,
                    2 if !bs.is_empty() => bs[0].1.stripe = u32::MAX,
                    _ => {}
                }
                let blocks: Vec<cxlkv_block> = bs.iter().map(|b| b.1).collect();
                let mut st = vec![R::Ok; blocks.len()];
                let f = if op % 24 == 6 { cxlkv_publish } else { cxlkv_abort };
                if c!(f(n, blocks.as_ptr(), blocks.len(), st.as_mut_ptr())) == R::Ok && op % 24 == 6 {
                    self.run.published += st.iter().filter(|s| **s == R::Ok).count();
                }
                self.stale.extend(blocks);
            }
            8 => {
                let (i, n) = self.node(inp);
                let count = inp.small(6);
                let keys: Vec<cxlkv_key> = (0..count).map(|_| key(inp.small(12))).collect();
                let mut blocks = vec![cxlkv_block::EMPTY; count];
                let mut st = vec![R::Ok; count];
                let mut got = 0usize;
                if c!(cxlkv_acquire(n, NS, keys.as_ptr(), count, blocks.as_mut_ptr(), st.as_mut_ptr(), &mut got))
                    == R::Ok
                {
                    for b in blocks.iter().filter(|b| !b.data.is_null()) {
                        let mut copy = vec![0u8; b.len as usize];
                        // SAFETY: just pinned by the live node `i`: `len` readable
                        // bytes at `data`, unchanged until released.
                        unsafe { core::ptr::copy_nonoverlapping(b.data.cast::<u8>(), copy.as_mut_ptr(), copy.len()) };
                        assert_eq!(copy, pattern(&b.key, copy.len()), "a published block reads back as written");
                        self.pinned.push((i, *b));
                    }
                }
            }
            9 => {
                let take = inp.small(4);
                let mut blocks: Vec<cxlkv_block> =
                    (0..take.min(self.pinned.len())).map(|_| self.pinned.remove(0).1).collect();
                if inp.small(3) == 0 && !self.stale.is_empty() {
                    blocks.push(self.stale[0]);
                }
                let (_, n) = self.node(inp);
                let _ = c!(cxlkv_release(n, blocks.as_ptr(), blocks.len()));
                self.stale.extend(blocks);
            }
            10 => {
                let (_, n) = self.node(inp);
                let count = inp.small(4);
                let ks: Vec<cxlkv_key> = (0..count).map(|_| key(inp.small(12))).collect();
                let bodies: Vec<Vec<u8>> = ks.iter().map(|k| pattern(k, [0, 10, 3000][inp.small(3)])).collect();
                let parts: Vec<Vec<cxlkv_iovec>> = bodies
                    .iter()
                    .map(|b| {
                        let (x, y) = b.split_at(b.len() / 3);
                        vec![
                            cxlkv_iovec { base: x.as_ptr().cast_mut().cast(), len: x.len() },
                            cxlkv_iovec { base: y.as_ptr().cast_mut().cast(), len: y.len() },
                        ]
                    })
                    .collect();
                let items: Vec<cxlkv_put_item> = ks
                    .iter()
                    .zip(&parts)
                    .map(|(k, p)| cxlkv_put_item {
                        key: *k,
                        tokens: 16,
                        reserved: 0,
                        parts: p.as_ptr(),
                        n_parts: p.len(),
                    })
                    .collect();
                let mut st = vec![R::Ok; count];
                if c!(cxlkv_put(n, NS, items.as_ptr(), count, st.as_mut_ptr())) == R::Ok {
                    self.run.published += st.iter().filter(|s| **s == R::Ok).count();
                }
            }
            11 => {
                let (_, n) = self.node(inp);
                let count = inp.small(4);
                let mut bufs: Vec<Vec<u8>> =
                    (0..count).map(|_| vec![0u8; [0, 64, 3000, 80_000][inp.small(4)]]).collect();
                let ks: Vec<cxlkv_key> = (0..count).map(|_| key(inp.small(12))).collect();
                let parts: Vec<cxlkv_iovec> =
                    bufs.iter_mut().map(|b| cxlkv_iovec { base: b.as_mut_ptr().cast(), len: b.len() }).collect();
                let items: Vec<cxlkv_get_item> =
                    ks.iter().zip(&parts).map(|(k, p)| cxlkv_get_item { key: *k, parts: p, n_parts: 1 }).collect();
                let mut lens = vec![0u64; count];
                let mut st = vec![R::Ok; count];
                if c!(cxlkv_get(n, NS, items.as_ptr(), count, lens.as_mut_ptr(), st.as_mut_ptr())) == R::Ok {
                    for i in (0..count).filter(|&i| st[i] == R::Ok) {
                        let len = lens[i] as usize;
                        assert_eq!(bufs[i][..len], pattern(&ks[i], len)[..], "get returns what was published");
                    }
                }
            }
            12 => {
                let (_, n) = self.node(inp);
                let keys: Vec<cxlkv_key> = (0..12).map(key).collect();
                let mut bits = [0u8; 2];
                let mut prefix = 0usize;
                let present = if inp.small(2) == 0 { bits.as_mut_ptr() } else { core::ptr::null_mut() };
                let _ = c!(cxlkv_lookup(n, NS, keys.as_ptr(), keys.len(), present, &mut prefix));
                let mut there = false;
                let _ = c!(cxlkv_exists(n, NS, &keys[inp.small(12)], &mut there));
            }
            13 => {
                let (_, n) = self.node(inp);
                let mut rep = cxlkv_evict_report::default();
                match inp.small(3) {
                    0 => {
                        let _ = c!(cxlkv_evict(n, [1, 70_000, u64::MAX][inp.small(3)], &mut rep));
                    }
                    1 => {
                        let ks: Vec<cxlkv_key> = (0..inp.small(4)).map(|_| key(inp.small(12))).collect();
                        let mut removed = vec![false; ks.len()];
                        let _ = c!(cxlkv_remove(n, NS, ks.as_ptr(), ks.len(), removed.as_mut_ptr()));
                    }
                    _ => {
                        let ns = [NS, NS + 1];
                        let _ = c!(cxlkv_clear_namespaces(n, ns.as_ptr(), inp.small(3), &mut rep));
                    }
                }
            }
            14 => {
                let (_, n) = self.node(inp);
                let mut s = cxlkv_stats::default();
                let _ = c!(cxlkv_node_stats(n, &mut s));
            }
            15 => {
                let (i, n) = self.node(inp);
                match inp.small(4) {
                    0 => {
                        let mut l = 0u32;
                        let _ = c!(cxlkv_lock_alloc(n, &mut l));
                    }
                    1 => {
                        let mut t = cxlkv_lock_ticket::default();
                        if c!(cxlkv_lock_acquire(n, inp.small(4) as u32, &mut t)) == R::Ok {
                            self.tickets.push((i, t));
                        }
                    }
                    2 => {
                        if let Some((i, t)) = self.tickets.pop() {
                            let n = self.nodes.get(i).map_or(n, |p| p.cast_const());
                            let _ = c!(cxlkv_lock_release(n, &t));
                        }
                    }
                    _ => {
                        let _ = c!(cxlkv_lock_free(n, inp.small(4) as u32));
                    }
                }
            }
            16 => {
                let (_, n) = self.node(inp);
                if inp.small(2) == 0 {
                    let mut off = 0u64;
                    if c!(cxlkv_alloc(n, [0u64, 100, 70_000, u64::MAX][inp.small(4)], &mut off)) == R::Ok {
                        self.offsets.push(off);
                    }
                } else {
                    let off = match self.offsets.pop() {
                        Some(o) if inp.small(3) != 0 => o,
                        _ => inp.byte().unwrap_or(0) as u64 * 4099,
                    };
                    let _ = c!(cxlkv_free(n, off));
                }
            }
            17 => {
                let (_, n) = self.node(inp);
                let names: [&[u8]; 4] = [b"root-a\0", b"\0", b"a-name-that-is-longer-than-32-bytes!\0", b"\xff\xfe\0"];
                let name: *const c_char = names[inp.small(4)].as_ptr().cast();
                let off = self.offsets.last().copied().unwrap_or(0);
                let mut root = cxlkv_root { offset: off, size: 100, tag: 1, reserved: 0 };
                let _ = match inp.small(3) {
                    0 => c!(cxlkv_root_put(n, name, &root)),
                    1 => c!(cxlkv_root_get(n, name, &mut root)),
                    _ => c!(cxlkv_root_destroy(n, name, core::ptr::null_mut())),
                };
            }
            18 => {
                let (_, n) = self.node(inp);
                let off = self.offsets.last().copied().unwrap_or(inp.byte().unwrap_or(0) as u64 * 64);
                let mut p: *mut c_void = core::ptr::null_mut();
                if c!(cxlkv_offset_to_ptr(n, off, 100, &mut p)) == R::Ok && self.live(n) {
                    let mut back = 0u64;
                    let _ = c!(cxlkv_ptr_to_offset(n, p, &mut back));
                    assert_eq!(back, off);
                    let _ = c!(cxlkv_flush(n, p, 100));
                    let _ = c!(cxlkv_invalidate(n, p, 100));
                }
                // Never a payload address: refused, never flushed.
                let _ = c!(cxlkv_flush(n, (&off as *const u64).cast(), 8));
            }
            19 => {
                let (_, n) = self.node(inp);
                let mut f = [cxlkv_finding { what: [0; 48], a: 0, b: 0 }; 2];
                let mut nf = 0usize;
                let _ = c!(cxlkv_check(n, f.as_mut_ptr(), f.len(), &mut nf));
                // (A recovery takes every lock: in the pooled mode, one
                // check in eight recovers.)
                if self.keep == 0 || inp.small(8) == 0 {
                    let mut rep = cxlkv_recover_report::default();
                    let _ = c!(cxlkv_recover(n, &mut rep));
                }
            }
            20 => {
                // NULL outputs and arrays are refused everywhere.
                let (_, n) = self.node(inp);
                let k = key(0);
                assert_eq!(c!(cxlkv_node_id(n, core::ptr::null_mut())), R::NullParameter);
                assert_eq!(c!(cxlkv_exists(n, NS, &k, core::ptr::null_mut())), R::NullParameter);
                let mut prefix = 0usize;
                assert_eq!(
                    c!(cxlkv_lookup(n, NS, core::ptr::null(), 2, core::ptr::null_mut(), &mut prefix)),
                    R::NullParameter
                );
                assert_eq!(
                    c!(cxlkv_acquire(
                        n,
                        NS,
                        &k,
                        1,
                        core::ptr::null_mut(),
                        core::ptr::null_mut(),
                        core::ptr::null_mut()
                    )),
                    R::NullParameter
                );
            }
            21 => {
                let toks: Vec<u32> = (0..inp.small(64) as u32).collect();
                let mut keys = [cxlkv_key::default(); 4];
                let mut n = 0usize;
                let _ = c!(cxlkv_chain_keys(
                    core::ptr::null(),
                    toks.as_ptr(),
                    toks.len(),
                    inp.small(20),
                    keys.as_mut_ptr(),
                    keys.len(),
                    &mut n
                ));
                // A namespace registered through a node (any handle, even
                // none), with a salt from the input: equal fields give one
                // id, a full root table a clear refusal.
                let (_, n) = self.node(inp);
                let model = b"m\0";
                let salt = [inp.small(4) as u8, 0, 1];
                let ns = cxlkv_namespace {
                    model: model.as_ptr().cast(),
                    kv_layout: 0,
                    dtype: 0,
                    tp_rank: 0,
                    tp_size: 1,
                    pp_rank: 0,
                    block_tokens: 16,
                    extra: 0,
                    salt: if inp.small(8) == 0 { core::ptr::null() } else { salt.as_ptr() },
                    salt_len: inp.small(4),
                };
                let (mut id, mut again) = (0u32, 0u32);
                let r = c!(cxlkv_namespace_register(n, &ns, &mut id));
                if r == R::Ok {
                    assert!(id >= 1 << 31, "registered ids start at 2^31");
                    assert_eq!(c!(cxlkv_namespace_register(n, &ns, &mut again)), R::Ok);
                    assert_eq!(id, again, "equal fields, one id");
                } else {
                    assert!(!matches!(r, R::Panic | R::Internal | R::Ok), "{r:?}");
                }
            }
            22 => {
                let mut buf = [0 as c_char; 16];
                let mut n = 0usize;
                let _ = c!(cxlkv::cxlkv_last_error(buf.as_mut_ptr(), buf.len(), &mut n));
                let _ = cxlkv::cxlkv_result_str(inp.byte().unwrap_or(0) as u32 + 990);
            }
            _ => {
                // A block pinned or reserved through one node, released,
                // published or aborted through another.
                if let Some((_, b)) = self.pinned.last().copied() {
                    let (_, n) = self.node(inp);
                    let mut st = [R::Ok];
                    let _ = c!(cxlkv_abort(n, &b, 1, st.as_mut_ptr()));
                    let _ = c!(cxlkv_publish(n, &b, 1, st.as_mut_ptr()));
                }
            }
        }
        Some(())
    }

    /// Drops what node `i` held from the model (it is being detached).
    fn forget(&mut self, i: usize) {
        for list in [&mut self.reserved, &mut self.pinned] {
            let (gone, keep): (Vec<_>, Vec<_>) = list.drain(..).partition(|x| x.0 == i);
            *list = keep;
            self.stale.extend(gone.into_iter().map(|x| x.1));
        }
        self.tickets.retain(|t| t.0 != i);
    }
}

/// The fuzz target's entry: most inputs run in the pooled mode
/// ([`capi_pooled`]), one in 64 (first byte 63 modulo 64; not 0, which
/// mutations make often) in the attach-per-input mode ([`capi_target`],
/// whose region and attaches cost 20-40 ms an input); the first byte only
/// chooses.
pub fn capi_fuzz(data: &[u8]) -> CapiRun {
    match data.split_first() {
        Some((b, rest)) if b % 64 != 63 => capi_pooled(rest),
        Some((_, rest)) => capi_target(rest),
        None => CapiRun::default(),
    }
}

/// The pooled mode's region and nodes, kept from one input to the next.
struct Pool {
    region: *mut cxlkv_region,
    nodes: Vec<*mut cxlkv_node>,
    dir: std::path::PathBuf,
    local_dir: std::ffi::CString,
}

// SAFETY: the handles are the library's, usable from any thread one call at
// a time; the pool is touched only under its mutex.
unsafe impl Send for Pool {}

static POOL: std::sync::Mutex<Option<Pool>> = std::sync::Mutex::new(None);

/// Nodes the pool keeps attached.
const POOL_NODES: usize = 3;

/// The capacities every region of this target is formatted with (op 1
/// changes one now and then).
fn pool_caps() -> cxlkv_capacities {
    cxlkv_capacities {
        max_nodes: 4,
        n_stripes: 2,
        entries_per_stripe: 32,
        n_roots: 8,
        pin_slots: 16,
        chunk_shift: 16,
        inbox_slots: 4,
        app_locks: 2,
        tier_slots: 1,
        tier_records: 8,
        change_records: 8,
        max_tenants: 3,
    }
}

/// The options every node of this target attaches with (op 2 picks a node
/// id now and then).
fn node_options(local_dir: &std::ffi::CString) -> cxlkv_node_options {
    cxlkv_node_options {
        node_id: CXLKV_ANY_NODE,
        flush_mode: CXLKV_FLUSH_CLFLUSH,
        lease_ms: 2000,
        lock_timeout_ms: 50,
        settle_ms: 1,
        auto_recover: true,
        local_dir: local_dir.as_ptr(),
    }
}

fn pool_attach(region: *mut cxlkv_region, local_dir: &std::ffi::CString) -> Option<*mut cxlkv_node> {
    let o = node_options(local_dir);
    let mut n = core::ptr::null_mut();
    (c!(cxlkv_node_attach(region, &o, &mut n)) == R::Ok).then_some(n)
}

impl Pool {
    /// A formatted 8 MiB memfd region with [`POOL_NODES`] nodes attached.
    fn new() -> Option<Pool> {
        let dir = std::env::temp_dir().join(format!("cxlkv-capi-pool-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let local_dir = std::ffi::CString::new(dir.to_string_lossy().as_bytes()).ok()?;
        let mut region = core::ptr::null_mut();
        if c!(cxlkv_region_memfd(2 << 20, false, &mut region)) != R::Ok {
            return None;
        }
        let mut pool = Pool { region, nodes: Vec::new(), dir, local_dir };
        if c!(cxlkv_region_format(region, &pool_caps(), CXLKV_FLUSH_CLFLUSH)) != R::Ok {
            pool.close();
            return None;
        }
        for _ in 0..POOL_NODES {
            match pool_attach(region, &pool.local_dir) {
                Some(n) => pool.nodes.push(n),
                None => {
                    pool.close();
                    return None;
                }
            }
        }
        Some(pool)
    }

    /// Detaches every node and closes the region.
    fn close(self) {
        for &n in &self.nodes {
            let _ = c!(cxlkv_node_detach(n));
        }
        c!(cxlkv_region_close(self.region));
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// Re-attaches nodes an input detached; false when the region itself
    /// was closed (the pool is then made anew).
    fn heal(&mut self) -> bool {
        let mut size = 0u64;
        if c!(cxlkv_region_size(self.region, &mut size)) != R::Ok {
            return false;
        }
        for i in 0..self.nodes.len() {
            let mut id = 0u32;
            let closed = c!(cxlkv_node_id(self.nodes[i], &mut id)) != R::Ok;
            // A pooled node declared dead answers REVOKED to every call from
            // then on: replaced, or every later input would meet only that.
            let dead = !closed && fenced(self.nodes[i]);
            if dead {
                let _ = c!(cxlkv_node_detach(self.nodes[i]));
            }
            if closed || dead {
                match pool_attach(self.region, &self.local_dir) {
                    Some(n) => self.nodes[i] = n,
                    None => return false,
                }
            }
        }
        true
    }
}

/// Runs one input in the pooled mode: the script starts from the pool's
/// region and nodes (an empty index), may add regions and nodes of its own,
/// and ends by giving back everything it holds, emptying the index, freeing
/// its allocations and checking the region clean; what it added is closed,
/// pooled nodes it detached are attached again. Each input costs its calls,
/// not a region and three attaches.
pub fn capi_pooled(data: &[u8]) -> CapiRun {
    let mut guard = POOL.lock().unwrap_or_else(|p| p.into_inner());
    if guard.is_none() {
        *guard = Pool::new();
    }
    let Some(pool) = guard.as_mut() else { return CapiRun::default() };
    let mut st = State {
        local_dir: pool.local_dir.clone(),
        regions: vec![pool.region],
        nodes: pool.nodes.clone(),
        reserved: Vec::new(),
        pinned: Vec::new(),
        stale: Vec::new(),
        tickets: Vec::new(),
        offsets: Vec::new(),
        run: CapiRun::default(),
        keep: POOL_NODES,
    };
    let mut inp = Input { data, at: 0 };
    while st.step(&mut inp).is_some() && st.run.calls < 400 {}
    st.give_back();
    let live = st.nodes.iter().copied().find(|&n| st.live(n));
    if let Some(n) = live {
        // The index emptied and the raw blocks the script still knows freed,
        // so the next input starts from the same empty region.
        let mut rep = cxlkv_evict_report::default();
        let ns = [NS, NS + 1];
        let _ = c!(cxlkv_clear_namespaces(n, ns.as_ptr(), ns.len(), &mut rep));
        for off in core::mem::take(&mut st.offsets) {
            let _ = c!(cxlkv_free(n, off));
        }
        for name in [&b"root-a\0"[..], b"\xff\xfe\0"] {
            let _ = c!(cxlkv_root_destroy(n, name.as_ptr().cast(), core::ptr::null_mut()));
        }
        for lock in 0..4 {
            let _ = c!(cxlkv_lock_free(n, lock));
        }
    }
    st.check_clean(true);
    for &n in &st.nodes[POOL_NODES.min(st.nodes.len())..] {
        let _ = c!(cxlkv_node_detach(n));
    }
    for &r in &st.regions[1..] {
        c!(cxlkv_region_close(r));
    }
    if !pool.heal() {
        if let Some(p) = guard.take() {
            p.close();
        }
    }
    st.run
}

/// Runs one input: a script of C calls. Ends by checking every region that
/// still has a live node, then detaches and closes everything.
pub fn capi_target(data: &[u8]) -> CapiRun {
    // The host-local lock files of this run's regions go to a scratch
    // directory, removed at the end.
    let dir = std::env::temp_dir().join(format!("cxlkv-capi-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let mut st = State {
        local_dir: std::ffi::CString::new(dir.to_string_lossy().as_bytes()).unwrap_or_default(),
        regions: Vec::new(),
        nodes: Vec::new(),
        reserved: Vec::new(),
        pinned: Vec::new(),
        stale: Vec::new(),
        tickets: Vec::new(),
        offsets: Vec::new(),
        run: CapiRun::default(),
        keep: 0,
    };
    let mut inp = Input { data, at: 0 };
    while st.step(&mut inp).is_some() && st.run.calls < 400 {}
    // Locks go back from the threads that hold them; pins and
    // reservations stay, for the check to account for.
    st.release_tickets();
    st.check_clean(false);
    for &n in &st.nodes {
        let _ = c!(cxlkv_node_detach(n));
    }
    for &r in &st.regions {
        c!(cxlkv_region_close(r));
    }
    let _ = std::fs::remove_dir_all(&dir);
    st.run
}

impl State {
    /// Releases the locks, pins and reservations the script still holds,
    /// through the nodes that hold them.
    fn give_back(&mut self) {
        self.release_tickets();
        for (i, b) in core::mem::take(&mut self.pinned) {
            let _ = c!(cxlkv_release(self.nodes[i], &b, 1));
        }
        for (i, b) in core::mem::take(&mut self.reserved) {
            let mut st = [R::Ok];
            let _ = c!(cxlkv_abort(self.nodes[i], &b, 1, st.as_mut_ptr()));
        }
    }

    fn release_tickets(&mut self) {
        for (i, t) in core::mem::take(&mut self.tickets) {
            let _ = c!(cxlkv_lock_release(self.nodes[i], &t));
        }
    }

    /// Recovers and checks every region that has a live node (`first`: only
    /// the first live node's): it must check clean after any call sequence.
    fn check_clean(&self, first: bool) {
        let live: Vec<_> = self.nodes.iter().copied().filter(|&n| self.live(n)).collect();
        for &n in live.iter().take(if first { 1 } else { usize::MAX }) {
            // Checked as it is first: most inputs leave nothing for recovery,
            // and a region clean without one is the stronger finding (a
            // recovery of the whole region is most of an input's time).
            // A node that detached without freeing its raw allocations left
            // them to recovery (as a dead one does): `check` reports them
            // until it runs. A check takes no lock: one that meets a
            // recovery another node runs meanwhile (an automatic one, after
            // a node was declared dead) sees it half done; recovering again
            // waits for that one's locks, and the check after is of the
            // region at rest. Findings that stay are the target's failure.
            let mut recovered = None;
            let mut rep = cxlkv_recover_report::default();
            for attempt in 0..4 {
                if attempt > 0 {
                    recovered = Some(c!(cxlkv_recover(n, &mut rep)));
                }
                let mut nf = 0usize;
                let mut f = [cxlkv_finding { what: [0; 48], a: 0, b: 0 }; 4];
                if c!(cxlkv_check(n, f.as_mut_ptr(), f.len(), &mut nf)) != R::Ok || nf == 0 {
                    break;
                }
                if attempt < 3 {
                    continue;
                }
                let what: Vec<String> = f[..nf.min(4)]
                    .iter()
                    .map(|x| {
                        // SAFETY: `what` is NUL-terminated by cxlkv_check.
                        let t = unsafe { core::ffi::CStr::from_ptr(x.what.as_ptr()) };
                        format!("{} ({}, {})", t.to_string_lossy(), x.a, x.b)
                    })
                    .collect();
                let mut id = u32::MAX;
                let _ = c!(cxlkv_node_id(n, &mut id));
                panic!(
                    "the region checks clean after any call sequence: {what:?} (checked by node {id}, after its \
                     recovery: {recovered:?}, {rep:?})"
                );
            }
        }
    }
}
