//! Stepping lock managers: this node's own (in its cell of the host-local
//! file, see `crate::mgr_cell`, or in process memory when it has no cell),
//! and another node's of this host, stepped by a waiter of this process
//! instead of waking that node's thread.

use std::time::{Duration, Instant};

use cxlkv_core::layout::{NodeInfo, NODE_ALIVE};
use cxlkv_core::lock::{LeaseConfig, Manager, StepReport};

use super::{Inner, PROBE_EVERY};

/// How long one holder keeps this node's cell's step lock before the node
/// checks whether that thread still exists.
const CUT_AFTER: Duration = Duration::from_millis(10);
use crate::host::pid_alive;

impl Inner {
    /// Now on the clock every process of the host shares (CLOCK_MONOTONIC
    /// milliseconds): the manager's ticks, whoever steps it.
    pub(super) fn now_ms(&self) -> u64 {
        crate::sync::monotonic_ns() / 1_000_000
    }

    /// This node's lease, settle and quarantine, in milliseconds.
    pub(super) fn lease_cfg(&self) -> LeaseConfig {
        LeaseConfig {
            lease: self.opts.lease.as_millis() as u64,
            settle: self.opts.settle.as_millis() as u64,
            quarantine: self.opts.quarantine.map_or(0, |q| (q.as_millis() as u64).max(1)),
        }
    }

    /// Makes this node's cell of the host-local file its manager's home (at
    /// attach). A live stepper of a previous incarnation's manager holding
    /// the cell (a stopped process) is waited for a moment, then the node
    /// keeps its manager in process memory instead: only this process can
    /// step it then. A cut step of a killed one is written back first.
    pub(super) fn init_cell(&self) {
        let Some(cell) = self.host_locks.cell(self.id) else { return };
        let Some((mut g, cut)) = self.lock_own_cell(cell, Duration::from_millis(100)) else { return };
        let state = if cut {
            match Manager::after_cut(&self.store, self.id) {
                Ok(m) => m,
                Err(_) => return,
            }
        } else {
            Manager::new(self.id)
        };
        g.init(state, self.nonce, std::process::id(), self.lease_cfg(), self.now_ms());
        drop(g);
        self.host_locks.note_manager(self.id, false);
        self.in_cell.set(true);
    }

    /// Steps this node's own manager once, unless a thread that exists is
    /// stepping it now (`None`). In its cell: a step cut off by a killed
    /// process is written back and the manager goes on from a fresh state.
    pub(super) fn step_own(&self) -> Option<cxlkv_core::Result<StepReport>> {
        let cell = self.in_cell.get().then(|| self.host_locks.cell(self.id)).flatten();
        let Some(cell) = cell else {
            let mut m = self.mgr.try_lock().ok()?;
            return Some(self.step(&mut m));
        };
        let now = self.now_ms();
        cell.owner_ran(now);
        let (mut g, cut) = self.lock_own_cell(cell, Duration::ZERO)?;
        if cell.owner() != self.nonce {
            // A later incarnation of this node made the cell its own: this
            // one was declared dead and its slot freed while it was
            // stopped. It keeps its hands off (it learns it is fenced at
            // its next heartbeat).
            self.in_cell.set(false);
            return None;
        }
        if cut {
            self.cuts.add(1);
            eprintln!(
                "cxlkv: node {}: a process stepping its lock manager died part-way; what that step stored is \
                 written back and the manager goes on from a fresh state (it claims the role anew)",
                self.id
            );
            match Manager::after_cut(&self.store, self.id) {
                Ok(m) => *g.state() = m,
                Err(e) => return Some(Err(e)),
            }
        }
        let r = self.step_at(g.state(), now);
        let active = r.as_ref().is_ok_and(|r| r.active);
        g.stepped(active, true);
        drop(g);
        self.host_locks.note_manager(self.id, active);
        Some(r)
    }

    /// Steps node `node`'s manager (a node of this host in another process,
    /// or of this one) from its cell, for a lock this node waits for: only
    /// while the cell's owner is ALIVE in the region (that incarnation),
    /// its process exists, its own threads stepped it within half its
    /// lease, and nobody steps it now; as its own thread would step it. True
    /// when it did.
    pub(super) fn step_peer(&self, node: u32) -> bool {
        let Some(cell) = self.host_locks.cell(node) else { return false };
        let owner = cell.owner();
        if owner == 0 {
            return false;
        }
        let cfg = cell.cfg();
        let now = self.now_ms();
        if now.saturating_sub(cell.own_step_ms()) > cfg.lease / 2 || !self.pid_alive_lately(cell.owner_pid()) {
            return false;
        }
        let st = &self.store;
        let alive = node < st.layout.caps.max_nodes
            && st
                .fresh_state_first::<NodeInfo>(
                    st.layout.node_info(node),
                    cxlkv_core::coherence::Site("platform.cell.owner"),
                )
                .is_ok_and(|i| i.state == NODE_ALIVE && i.nonce == owner);
        if !alive {
            return false;
        }
        let Some(mut g) = cell.try_lock() else { return false };
        if cell.owner() != owner || g.state().node() != node {
            return false;
        }
        let r = self.step_as(g.state(), node, cfg, now);
        let active = r.as_ref().is_ok_and(|r| r.active);
        g.stepped(active, false);
        drop(g);
        self.host_locks.note_manager(node, active);
        true
    }

    /// This node learnt it was declared dead: other processes stop
    /// stepping its manager.
    pub(super) fn disown_cell(&self) {
        if let Some(cell) = self.in_cell.get().then(|| self.host_locks.cell(self.id)).flatten() {
            cell.disown(self.nonce);
            self.host_locks.note_manager(self.id, false);
        }
    }

    /// Hands this node's manager role on and empties its cell (detach). A
    /// peer's step under way is waited for a moment; after that the role
    /// goes by the lease.
    pub(super) fn resign_manager(&self) {
        let cell = self.in_cell.get().then(|| self.host_locks.cell(self.id)).flatten();
        let Some(cell) = cell else {
            if let Ok(mut m) = self.mgr.lock() {
                let _ = m.resign(&self.store);
            }
            return;
        };
        let Some((mut g, cut)) = self.lock_own_cell(cell, Duration::from_millis(100)) else { return };
        self.in_cell.set(false);
        if cell.owner() != self.nonce {
            return; // a later incarnation's (see `step_own`)
        }
        if cut {
            match Manager::after_cut(&self.store, self.id) {
                Ok(m) => *g.state() = m,
                Err(_) => return,
            }
        }
        let _ = g.state().resign(&self.store);
        g.vacate();
        drop(g);
        self.host_locks.note_manager(self.id, false);
    }

    /// This node's cell's step lock: free at once, or within `wait`; else
    /// taken over (true) from a holder that no longer exists, checked only
    /// once the same holder kept it for [`CUT_AFTER`] (a probe reads
    /// `/proc`; a step takes microseconds). `None` while a thread that
    /// exists steps it.
    fn lock_own_cell<'a>(
        &self,
        cell: crate::mgr_cell::ManagerCell<'a>,
        wait: Duration,
    ) -> Option<(crate::mgr_cell::CellGuard<'a>, bool)> {
        if let Some(g) = cell.try_lock() {
            return Some((g, false));
        }
        let until = Instant::now() + wait;
        loop {
            if let Some(g) = cell.try_lock() {
                return Some((g, false));
            }
            let cur = cell.holder();
            let now = Instant::now();
            let mut seen = self.cell_busy.lock().ok()?;
            match *seen {
                Some((w, since)) if w == cur && now.duration_since(since) >= CUT_AFTER => {
                    *seen = None;
                    if let Some(g) = cell.take_over(cur) {
                        return Some((g, true));
                    }
                }
                Some((w, _)) if w == cur => {}
                _ => *seen = Some((cur, now)),
            }
            drop(seen);
            if now >= until {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// One step of this node's own manager `m`.
    pub(super) fn step(&self, m: &mut Manager) -> cxlkv_core::Result<StepReport> {
        self.step_at(m, self.now_ms())
    }

    /// One step of this node's own manager `m` at `now`.
    fn step_at(&self, m: &mut Manager, now: u64) -> cxlkv_core::Result<StepReport> {
        let r = self.step_as(m, self.id, self.lease_cfg(), now)?;
        self.is_manager.set(r.active);
        if let Ok(mut last) = self.last.lock() {
            *last = r;
        }
        Ok(r)
    }

    /// One step of node `node`'s manager `m` with `node`'s `cfg`, at `now`,
    /// made by this node's process.
    fn step_as(&self, m: &mut Manager, node: u32, cfg: LeaseConfig, now: u64) -> cxlkv_core::Result<StepReport> {
        let here = self.here;
        // A pid is probed only where it means something (same host, same PID
        // namespace); elsewhere the heartbeat alone decides. A process that
        // exists but whose heartbeat stopped (stopped by a signal, frozen)
        // is declared dead by its silence all the same.
        let probe = move |_n: u32, info: &NodeInfo| {
            (here.can_probe(info) && info.state == NODE_ALIVE).then(|| self.pid_alive_lately(info.pid))
        };
        let r = m.step(&self.store, now, cfg, &probe)?;
        if r.quarantine_ended != 0 {
            eprintln!(
                "cxlkv: node {node} (lock manager) took fenced nodes {:#b} as quiet: nothing said so within the \
                 quarantine ({} ms); recovery frees their slots and blocks",
                r.quarantine_ended, cfg.quarantine
            );
        }
        if r.running_dead != 0 {
            self.core().count_running_declared_dead(u64::from(r.running_dead.count_ones()));
            eprintln!(
                "cxlkv: node {node} (lock manager) declared nodes {:#b} dead: silent for a lease ({} ms) while \
                 their processes ran (stopped, or starved of CPU: raise Options::lease if this host is overloaded)",
                r.running_dead, cfg.lease
            );
        }
        Ok(r)
    }

    /// Whether process `pid` of this host runs, as last probed within
    /// [`PROBE_EVERY`]. A probe reads `/proc`, and the manager scans every
    /// millisecond it steps: probing each node's pid on each scan read
    /// `/proc` a thousand times a second per local node. Only a
    /// running verdict is kept: a gone process is buried and never probed
    /// again, and a new node that reuses its pid is probed afresh.
    fn pid_alive_lately(&self, pid: u32) -> bool {
        let now = Instant::now();
        let Ok(mut seen) = self.alive_pids.lock() else { return pid_alive(pid) };
        seen.retain(|&(_, at)| now.duration_since(at) < PROBE_EVERY);
        if seen.iter().any(|&(p, _)| p == pid) {
            return true;
        }
        let alive = pid_alive(pid);
        if alive {
            seen.push((pid, now));
        }
        alive
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use cxlkv_core::layout::Capacities;

    use crate::node::{Node, Options};

    /// A process stepping this node's manager from its cell died holding
    /// the cell's step lock: the node's thread takes the lock over, writes
    /// back what the cut step stored, goes on from a fresh manager state
    /// (claiming the role anew) and grants again.
    #[test]
    fn a_step_lock_left_by_a_dead_stepper_is_taken_over_and_the_manager_goes_on() {
        let p = std::env::temp_dir().join(format!("cxlkv-cell-cut-{}", std::process::id()));
        let caps = Capacities { max_nodes: 4, n_stripes: 4, entries_per_stripe: 64, ..Capacities::default() };
        let n = Node::create(&p, 16 << 20, caps, Options::default()).unwrap();
        let t = Instant::now();
        while !n.manager_report().active {
            assert!(t.elapsed() < Duration::from_secs(30), "never the manager");
            std::thread::sleep(Duration::from_millis(2));
        }
        let cell = n.inner.host_locks.cell(n.inner.id).unwrap();
        // A thread that no longer exists, as a killed process's stepper.
        let gone = std::thread::spawn(crate::mgr_cell::lock_word_of_this_thread).join().unwrap();
        while !cell.take_as(gone) {
            std::thread::yield_now();
        }
        let h = n.core().lock(1).expect("granted once the dead stepper's lock is taken over");
        n.core().unlock(h).unwrap();
        assert_eq!(n.inner.cuts.get(), 1);
        assert_ne!(cell.holder(), gone);
        // The step that granted may not have reported yet (its thread can be
        // descheduled between the grant and its report): the role is kept.
        let t = Instant::now();
        while !n.manager_report().active {
            assert!(t.elapsed() < Duration::from_secs(30), "the node lost the manager role after the takeover");
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(n.check().unwrap().is_empty());
        drop(n);
        let _ = std::fs::remove_file(&p);
    }
}
