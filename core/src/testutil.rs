//! Test fixtures: an in-memory region, a coherent store, and an environment
//! whose waits drive a lock manager inline (single-threaded tests).

use std::boxed::Box;
use std::vec::Vec;

use crate::coherence::Coherent;
use crate::format::format;
use crate::layout::{Capacities, NodeInfo};
use crate::lock::{LeaseConfig, Manager};
use crate::mem::View;
use crate::node::{attach_node, Identity, Node, NodeLocal};
use crate::store::{NodeEnv, Store};
use crate::Result;

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

/// Heap memory standing in for a mapped region.
pub struct Mem {
    lines: Vec<Line>,
}

impl Mem {
    pub fn new(len: usize) -> Box<Mem> {
        Box::new(Mem { lines: std::vec![Line([0; 64]); len.div_ceil(64)] })
    }
    pub fn view(&mut self) -> View {
        let len = self.lines.len() * 64;
        // SAFETY: the Vec's buffer is 64-aligned, `len` bytes, lives as long as the
        // boxed `Mem` (kept alive past its store), and is only used via Regions.
        unsafe { View::new(self.lines.as_mut_ptr().cast::<u8>(), len) }.unwrap()
    }
}

/// Small capacities so tests exercise full tables and chunk reuse.
pub fn small_caps() -> Capacities {
    Capacities {
        max_nodes: 4,
        n_stripes: 4,
        entries_per_stripe: 32,
        n_roots: 8,
        pin_slots: 64,
        chunk_shift: 16,
        inbox_slots: 8,
        app_locks: 4,
        tier_slots: 2,
        tier_records: 32,
        change_records: 16,
        max_tenants: 4,
    }
}

/// An environment whose waits step a shared manager: lets one thread play
/// every node. Dead nodes can be forced through `kill`.
pub struct InlineEnv<'a> {
    pub store: &'a Store<Coherent>,
    pub mgr: spin::Mutex<Manager>,
    pub now: spin::Mutex<u64>,
    pub killed: spin::Mutex<u64>,
    /// Nodes whose process is stopped: they do not beat, and the probe
    /// finds them running (silence alone declares them dead).
    pub stopped: spin::Mutex<u64>,
    /// The manager's quarantine (see `LeaseConfig::quarantine`; 0 never).
    pub quarantine: spin::Mutex<u64>,
    /// Whether releases may keep grants (see `NodeEnv::keeps_grants`); the
    /// test then gives them back itself (`Node::release_parks`).
    pub keeps: spin::Mutex<bool>,
    /// The wall clock in milliseconds (tenants' lifetimes), moved by tests.
    pub wall: spin::Mutex<u64>,
}

impl<'a> InlineEnv<'a> {
    pub fn new(store: &'a Store<Coherent>) -> Self {
        InlineEnv {
            store,
            mgr: spin::Mutex::new(Manager::new(0)),
            now: spin::Mutex::new(0),
            killed: spin::Mutex::new(0),
            stopped: spin::Mutex::new(0),
            quarantine: spin::Mutex::new(0),
            keeps: spin::Mutex::new(false),
            wall: spin::Mutex::new(1_000_000),
        }
    }
    pub fn step(&self) -> Result<crate::lock::StepReport> {
        let now = {
            let mut t = self.now.lock();
            *t += 1;
            *t
        };
        let killed = *self.killed.lock();
        let quiet = killed | *self.stopped.lock();
        // The nodes that live beat their heartbeats, as their threads would
        // (silence past the lease is death whatever the probe says).
        let l = &self.store.layout;
        for n in (0..l.caps.max_nodes).filter(|n| quiet & (1 << n) == 0) {
            let mut hb: crate::layout::Heartbeat = self.store.view.read(l.heartbeat(n))?;
            hb.beat = hb.beat.wrapping_add(1);
            self.store.view.write(l.heartbeat(n), &hb)?;
        }
        let probe = move |n: u32, _: &NodeInfo| if killed & (1 << n) != 0 { Some(false) } else { None };
        let cfg = LeaseConfig { lease: 1000, settle: 0, quarantine: *self.quarantine.lock() };
        self.mgr.lock().step(self.store, now, cfg, &probe)
    }
}

impl NodeEnv for InlineEnv<'_> {
    fn local_lock(&self, _lock: u32) -> Result<()> {
        Ok(())
    }
    fn local_unlock(&self, _lock: u32) {}
    fn wait(&self, iteration: u32) -> Result<()> {
        if iteration > 10_000 {
            return Err(crate::Error::Timeout);
        }
        self.step().map(|_| ())
    }
    fn keeps_grants(&self) -> bool {
        *self.keeps.lock()
    }
    fn wall_ms(&self) -> u64 {
        *self.wall.lock()
    }
}

pub struct Fixture {
    pub _mem: Box<Mem>,
    pub store: Box<Store<Coherent>>,
}

impl Fixture {
    pub fn new(len: usize, caps: Capacities) -> Fixture {
        let mut mem = Mem::new(len);
        let store = Box::new(format(mem.view(), Coherent, caps, 42).unwrap());
        Fixture { _mem: mem, store }
    }
    pub fn attach(&self, id: u32) -> u32 {
        attach_node(
            &self.store,
            Some(id),
            Identity { pid: 1000 + id, host_id: 1, nonce: 77 + id as u64, now: 0, pid_ns: 0 },
        )
        .unwrap()
    }
}

/// Builds a node handle; `local` must outlive it.
pub fn node<'a>(f: &'a Fixture, env: &'a InlineEnv<'a>, local: &'a NodeLocal, id: u32) -> Node<'a, Coherent> {
    Node::new(&f.store, id, env, local).unwrap()
}

/// Runs `body` on a fresh 8 MiB region of `small_caps` with nodes 0 and 1
/// attached, handing it the fixture, the inline environment and both nodes.
pub fn with_two_nodes(body: impl FnOnce(&Fixture, &InlineEnv<'_>, Node<'_, Coherent>, Node<'_, Coherent>)) {
    let f = Fixture::new(8 << 20, small_caps());
    f.attach(0);
    f.attach(1);
    let env = InlineEnv::new(&f.store);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    body(&f, &env, node(&f, &env, &l0, 0), node(&f, &env, &l1, 1));
}

/// Runs `body` on a fresh region of `len` bytes formatted with `caps`, node
/// 0 attached, handing it the fixture, the inline environment, the node's
/// local state (its counters) and the node.
pub fn with_one_node(
    len: usize,
    caps: Capacities,
    body: impl FnOnce(&Fixture, &InlineEnv<'_>, &NodeLocal, Node<'_, Coherent>),
) {
    let f = Fixture::new(len, caps);
    f.attach(0);
    let env = InlineEnv::new(&f.store);
    let local = NodeLocal::default();
    body(&f, &env, &local, node(&f, &env, &local, 0));
}

/// Every finding of `check` on the fixture's region.
pub fn findings(f: &Fixture) -> Vec<crate::check::Finding> {
    let mut v = Vec::new();
    let mut scratch = std::vec![0u64; crate::check::scratch_words(&f.store)];
    crate::check::check(&f.store, &mut scratch, &mut |x| v.push(x)).unwrap();
    v
}
