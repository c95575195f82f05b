//! Fuzz target bodies, as plain functions: `fuzz/` runs them under
//! cargo-fuzz, and `tests/tests/fuzz_replay.rs` replays the committed corpus
//! and seeded random inputs through them on the stable toolchain.

use cxlkv_core::check::{check, scratch_words};
use cxlkv_core::coherence::{Coherence, Coherent};
use cxlkv_core::format::format;
use cxlkv_core::hash::{mix64, Key};
use cxlkv_core::index::Lru;
use cxlkv_core::layout::{Capacities, NodeInfo};
use cxlkv_core::lock::{LeaseConfig, Manager};
use cxlkv_core::mem::View;
use cxlkv_core::node::{Node, NodeLocal};
use cxlkv_core::store::{attach, NodeEnv, Store};
use cxlkv_core::Error;

/// Capacities of the small regions the targets work on.
pub fn tiny_caps() -> Capacities {
    Capacities {
        max_nodes: 2,
        n_stripes: 2,
        entries_per_stripe: 8,
        n_roots: 2,
        pin_slots: 8,
        chunk_shift: 12,
        inbox_slots: 4,
        app_locks: 2,
        tier_slots: 1,
        tier_records: 4,
        change_records: 4,
        max_tenants: 3,
    }
}

/// Bytes of a tiny region.
pub const TINY: usize = 64 << 10;

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

/// Heap memory that stands in for a mapping.
pub struct Buf(Vec<Line>);

impl Buf {
    /// `len` bytes (rounded up to lines) holding `bytes` then zeros.
    pub fn with(bytes: &[u8], len: usize) -> Buf {
        let mut v = vec![Line([0; 64]); len.div_ceil(64)];
        for (i, b) in bytes.iter().take(len).enumerate() {
            v[i / 64].0[i % 64] = *b;
        }
        Buf(v)
    }
    /// A view of it.
    pub fn view(&mut self) -> View {
        let len = self.0.len() * 64;
        // SAFETY: the buffer is 64-aligned, `len` bytes, outlives every use of the
        // view (callers keep `self` alive), and is only accessed through Regions.
        match unsafe { View::new(self.0.as_mut_ptr().cast(), len) } {
            Ok(r) => r,
            Err(_) => unreachable!("line-aligned buffer"),
        }
    }
}

/// A freshly formatted tiny region image.
pub fn tiny_image() -> Vec<u8> {
    let mut b = Buf::with(&[], TINY);
    let r = b.view();
    let _ = format(r, Coherent, tiny_caps(), 9);
    let mut out = vec![0u8; TINY];
    let _ = r.copy_out(0, &mut out);
    out
}

/// Target `attach`: a region made of the input. If the first byte is even,
/// the rest is a list of (offset, byte) patches applied to a formatted tiny
/// region (structure-aware); if odd, the rest is the region itself. Attach,
/// check, inspect and operations must return errors, never panic, and never
/// touch memory outside the region (every access is bounds-checked).
pub fn attach_target(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut buf = if mode % 2 == 0 {
        let mut img = tiny_image();
        for p in rest.chunks_exact(3) {
            let off = (u16::from_le_bytes([p[0], p[1]]) as usize * 7) % img.len();
            img[off] = p[2];
        }
        Buf::with(&img, TINY)
    } else {
        Buf::with(rest, rest.len().max(64))
    };
    let r = buf.view();
    let Ok(store) = attach(r, Coherent) else { return };
    let mut scratch = vec![0u64; scratch_words(&store)];
    let _ = check(&store, &mut scratch, &mut |_| {});
    let _ = cxlkv_core::roots::get(&store, b"counter");
    // Operate as node 0 whatever its slot says (a hostile region).
    let env = Many::new(std::slice::from_ref(&store), 64);
    let local = NodeLocal::default();
    let node = Node::attached(&store, 0, &env, &local);
    let keys: Vec<Key> = (0..6u64).map(|i| Key { lo: mix64(i), hi: i }).collect();
    let _ = node.lookup(1, &keys);
    let mut out = vec![Err(Error::InvalidArgument); keys.len()];
    if node.acquire(1, &keys, &mut out).is_ok() {
        let hs: Vec<_> = out.iter().filter_map(|r| r.ok()).collect();
        let mut b = [0u8; 64];
        for h in &hs {
            let _ = node.read(h, 0, &mut b[..(h.len as usize).min(64)]);
        }
        let _ = node.release(&hs);
    }
    let mut b = vec![0u8; 4096];
    let _ = node.get(1, keys[0], &mut b);
    if let Ok(h) = node.reserve(1, keys[5], 100, 1) {
        let _ = node.write(&h, 0, &[7; 100]);
        let _ = node.publish(&h);
    }
    let _ = node.evict(1000, &mut Lru);
    let _ = node.recover(0b10);
    let _ = check(&store, &mut scratch, &mut |_| {});
}

/// One thread playing one or several hosts: every wait steps the lock
/// manager of the first live host, through that host's own view, and gives
/// up with `Timeout` after `limit` waits.
struct Many<'a, C: Coherence> {
    stores: &'a [Store<C>],
    mgrs: Vec<std::cell::RefCell<Manager>>,
    t: std::cell::Cell<u64>,
    dead: std::cell::Cell<u64>,
    limit: u32,
}

// SAFETY: used by one thread only (the fuzz target); NodeEnv requires Sync
// for the platform's multi-threaded use.
unsafe impl<C: Coherence> Sync for Many<'_, C> {}

impl<'a, C: Coherence> Many<'a, C> {
    fn new(stores: &'a [Store<C>], limit: u32) -> Self {
        let mgrs = (0..stores.len() as u32).map(|h| std::cell::RefCell::new(Manager::new(h))).collect();
        Many { stores, mgrs, t: 0.into(), dead: 0.into(), limit }
    }
}

impl<C: Coherence> NodeEnv for Many<'_, C> {
    fn local_lock(&self, _: u32) -> cxlkv_core::Result<()> {
        Ok(())
    }
    fn local_unlock(&self, _: u32) {}
    fn wait(&self, i: u32) -> cxlkv_core::Result<()> {
        if i > self.limit {
            return Err(Error::Timeout);
        }
        self.t.set(self.t.get() + 1);
        let dead = self.dead.get();
        let h = (0..self.stores.len()).find(|&h| dead & (1 << h) == 0).unwrap_or(0);
        let cfg = LeaseConfig { lease: 1 << 40, settle: 0, quarantine: 0 };
        let probe = move |n: u32, _: &NodeInfo| Some(dead & (1 << n) == 0);
        if let Ok(mut m) = self.mgrs[h].try_borrow_mut() {
            let _ = m.step(&self.stores[h], self.t.get(), cfg, &probe);
        }
        Ok(())
    }
    fn withdrawal_expired(&self, iteration: u32) -> bool {
        // A damaged region may name a manager that never answers.
        iteration > 4 * self.limit
    }
}

fn payload(k: Key, len: usize) -> Vec<u8> {
    (0..len).map(|i| (mix64(k.lo ^ (i as u64 / 8)) >> (8 * (i % 8))) as u8).collect()
}

/// Target `ops`: the input is an operation script for three simulated hosts
/// on non-coherent memory (3 bytes an operation: host, what, key), crashes
/// included; every result is checked against a model of what was published,
/// and the region must be check-clean after a final recovery. A violation
/// panics (which the fuzzer reports and the replay test fails on).
/// Returns how many blocks were published (so replays can tell it did work).
pub fn ops_target(data: &[u8]) -> usize {
    use cxlkv_core::node::{attach_node, Identity};
    use cxlkv_sim::memory::{SimConfig, SimMemory};
    let seed = data.iter().fold(0x51u64, |h, &b| mix64(h ^ b as u64));
    let mem = SimMemory::new(TINY * 2, 3, seed, SimConfig::default());
    let caps = Capacities { max_nodes: 3, ..tiny_caps() };
    if format(mem.view(0), mem.host(0), caps, 3).is_err() {
        return 0;
    }
    let stores: Vec<_> = (0..3).map(|h| attach(mem.view(h), mem.host(h)).expect("attach formatted region")).collect();
    for (h, st) in stores.iter().enumerate() {
        let who = Identity { pid: h as u32 + 1, host_id: h as u64 + 1, nonce: h as u64 + 1, now: 0, pid_ns: 0 };
        attach_node(st, Some(h as u32), who).expect("attach node");
    }
    // Every wait steps the manager of the first live host.
    let env = Many::new(&stores, 256);
    let locals: Vec<NodeLocal> = (0..3).map(|_| NodeLocal::default()).collect();
    let nodes: Vec<_> = (0..3).map(|h| Node::attached(&stores[h], h as u32, &env, &locals[h])).collect();
    let _ = &locals;
    let mut crashed = 0u64;
    let mut published = std::collections::HashSet::new();
    let key = |i: u8| Key { lo: mix64(i as u64 + 1), hi: i as u64 };
    // Channel messages sent: id -> (receiver, keys); and those received.
    let mut sent: std::collections::HashMap<u64, (u32, usize)> = std::collections::HashMap::new();
    let mut received = std::collections::HashSet::new();
    let mut next_id = 0u64;
    let msg_keys =
        |id: u64, n: usize| (0..n as u64).map(|j| Key { lo: mix64(id ^ j << 40), hi: id }).collect::<Vec<_>>();
    let step_all = |crashed: u64| {
        env.dead.set(crashed);
        let _ = env.wait(0);
    };
    for op in data.chunks_exact(3).take(200) {
        let h = op[0] as usize % 3;
        if crashed & (1 << h) != 0 {
            continue;
        }
        let (node, k) = (&nodes[h], key(op[2] % 16));
        step_all(crashed);
        match op[1] % 10 {
            0..=2 => {
                let len = 64 + (k.lo % 900);
                if let Ok(hd) = node.reserve(1, k, len, 16) {
                    node.write(&hd, 0, &payload(k, len as usize)).expect("write reserved");
                    node.publish_flushed(&[hd], &mut [Ok(())]).expect("publish");
                    published.insert(k);
                }
            }
            3 => {
                if let Ok(hd) = node.reserve(1, k, 100, 1) {
                    node.write(&hd, 0, &[0xee; 100]).expect("write reserved");
                    node.abort(&hd).expect("abort");
                }
            }
            4 => {
                let mut out = [Err(Error::InvalidArgument)];
                if node.acquire(1, &[k], &mut out).is_ok() {
                    if let Ok(hd) = out[0] {
                        assert!(published.contains(&k), "acquired a key never published");
                        let mut b = vec![0u8; hd.len as usize];
                        node.read(&hd, 0, &mut b).expect("read pinned");
                        assert_eq!(b, payload(k, b.len()), "pinned payload differs");
                        node.release(&[hd]).expect("release");
                    }
                }
            }
            5 => {
                let mut b = vec![0u8; 1024];
                if let Ok(n) = node.get(1, k, &mut b) {
                    assert!(published.contains(&k), "got a key never published");
                    assert_eq!(&b[..n], &payload(k, n)[..], "copied payload differs");
                }
            }
            6 => {
                let _ = node.evict(2048, &mut Lru);
            }
            7 => {
                next_id += 1;
                let id = next_id;
                let (to, n) = ((op[2] % 3) as u32, (op[2] / 3) as usize % 30);
                let m = cxlkv_core::channel::Message { kind: 1, request_id: id, ..Default::default() };
                // (Recorded first: a send that fails half way may still land.)
                sent.insert(id, (to, n));
                let _ = node.send(to, &m, &msg_keys(id, n));
            }
            8 => {
                let mut buf = [Key::default(); 64];
                if let Ok(Some(m)) = node.try_recv(&mut buf) {
                    let id = m.request_id;
                    let (to, n) = *sent.get(&id).expect("received a message never sent");
                    assert_eq!(to, h as u32, "message delivered to the wrong node");
                    assert!(received.insert(id), "message delivered twice");
                    assert_eq!(&buf[..m.n_keys as usize], &msg_keys(id, n)[..], "message keys differ");
                }
            }
            _ => {
                if (crashed | (1 << h)).count_ones() < 3 {
                    mem.crash(h);
                    crashed |= 1 << h;
                    let live = (0..3).find(|&x| crashed & (1 << x) == 0).unwrap_or(0);
                    step_all(crashed);
                    nodes[live].recover(crashed).expect("recover");
                }
            }
        }
    }
    mem.drain_zombies();
    let live = (0..3).find(|&x| crashed & (1 << x) == 0).unwrap_or(0);
    step_all(crashed);
    nodes[live].recover(crashed).expect("final recover");
    let mut scratch = vec![0u64; scratch_words(&stores[live])];
    let mut findings = Vec::new();
    check(&stores[live], &mut scratch, &mut |f| findings.push(f)).expect("check");
    // Other live nodes still pin nothing (all released), so the region is clean.
    assert!(findings.is_empty(), "findings after recovery: {findings:?}");
    published.len()
}
