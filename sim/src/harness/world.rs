//! The world of one run: simulated memory, the hosts' stores and nodes,
//! the scheduler and the model, and what a node needs from it (`Env`).

use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex};

use cxlkv_core::hash::Key;
use cxlkv_core::layout::{Entry, Layout, NodeInfo};
use cxlkv_core::node::{Identity, NodeLocal};
use cxlkv_core::store::{attach, read_header, NodeEnv, Store};
use cxlkv_core::Error;

use crate::harness::model::{Model, Pin, ACTOR, WAIT_LIMIT};
use crate::harness::params::LEASE;
use crate::harness::sched::{
    park, rnd, step_cap, step_limit, tag_of, trace_len, watch_line, Crashed, Killed, Sched, StepCut,
};
use crate::memory::{SimCoherence, SimMemory};

pub(crate) struct World {
    pub(crate) mem: SimMemory,
    pub(crate) sched: Mutex<Sched>,
    /// One condition variable per actor: handing the baton wakes only the
    /// actor that gets it.
    pub(crate) cvs: Vec<Condvar>,
    pub(crate) model: Mutex<Model>,
    pub(crate) hosts: usize,
    /// Each host's process-local node state and the process generation it
    /// belongs to: the threads of one process share it, as platform's
    /// background threads share their node's.
    pub(crate) locals: Mutex<Vec<(u32, Arc<NodeLocal>)>>,
}

impl World {
    /// The node state of host `h`'s current process, shared by its actors
    /// (a process killed and started again has a new one).
    pub(crate) fn local(&self, h: usize) -> Arc<NodeLocal> {
        let gen = self.sched.lock().unwrap().gen.get(h).copied().unwrap_or(0);
        let mut locals = self.locals.lock().unwrap();
        if locals.len() < self.hosts {
            locals.resize_with(self.hosts, || (u32::MAX, Arc::new(NodeLocal::default())));
        }
        let slot = &mut locals[h];
        if slot.0 != gen {
            *slot = (gen, Arc::new(NodeLocal::default()));
        }
        slot.1.clone()
    }

    pub(crate) fn violation(&self, s: String) {
        let mut m = self.model.lock().unwrap();
        if m.violations.is_empty() && std::env::var("CXLKV_SIM_DEBUG").is_ok() {
            // The events that led to the first violation (later ones bury them).
            eprintln!("first violation: {s}\nevents before it:");
            if let Ok(sched) = self.sched.try_lock() {
                for e in &sched.trace {
                    eprintln!("  {e}");
                }
            }
        }
        if m.violations.len() < 20 {
            m.violations.push(s);
        }
    }

    /// Hands the baton on; returns when this actor runs again. Unwinds the
    /// thread with `Crashed` if its host was crashed meanwhile.
    pub(crate) fn yield_now(&self, actor: usize, what: &'static str) {
        self.yield_maybe(actor, what, true)
    }

    /// A scheduling point: hands the baton on (always when `force`, else
    /// with probability 1/3, so runs interleave at random points without
    /// paying a thread switch at every one).
    pub(crate) fn yield_maybe(&self, actor: usize, what: impl std::fmt::Display, force: bool) {
        let mut s = self.sched.lock().unwrap();
        s.steps += 1;
        let (limit, cap) = (step_limit(), step_cap());
        if !s.out_of_steps && (s.steps.saturating_sub(s.progress) >= limit || s.steps >= cap) {
            s.out_of_steps = true;
            let m = if s.steps >= cap {
                format!("run did not finish within {cap} scheduler steps (livelock)")
            } else {
                format!("no operation finished within {limit} scheduler steps (livelock)")
            };
            let m = format!("{m}; host-local locks held {:?}, finished {:?}", s.local, s.finished);
            drop(s);
            self.violation(m);
            // The next scheduling point stops everyone.
            return;
        }
        if s.out_of_steps {
            // Stop everyone: unwind this actor like a crash.
            for r in s.runnable.iter_mut() {
                *r = false;
            }
            s.stop = true;
            for cv in &self.cvs {
                cv.notify_all();
            }
            drop(s);
            std::panic::resume_unwind(Box::new(Crashed));
        }
        self.note_watched_line(&mut s, actor, &what);
        let steps = s.steps;
        let due = |x: Option<(usize, u64)>| x.is_some_and(|(h, at)| actor / 3 == h && steps >= at);
        let pending = due(s.crash_at) || due(s.kill_at);
        if !force && !rnd(&mut s.rng).is_multiple_of(3) && !pending {
            return;
        }
        let step = s.steps;
        if s.trace.len() >= trace_len() {
            s.trace.pop_front();
        }
        s.trace.push_back(format!("{step}: actor {actor} {what}"));
        let s = self.maybe_kill(s, actor, step, &what);
        let mut s = self.maybe_crash(s, actor, step, &what);
        self.pass(&mut s);
        while s.turn != actor && !s.stop {
            s = self.cvs[actor].wait(s).unwrap();
        }
        self.mem.set_tag(tag_of(&s, actor));
        if s.host_crashed[actor / 3] || s.out_of_steps {
            drop(s);
            std::panic::resume_unwind(Box::new(Crashed));
        }
        if s.actor_gen[actor] != s.gen[actor / 3] {
            drop(s);
            std::panic::resume_unwind(Box::new(Killed));
        }
        if let Some(n) = s.cut_in.get_mut(actor).filter(|n| **n != 0) {
            *n -= 1;
            if *n == 0 {
                // This actor holds the baton: its manager actor catches the
                // cut and runs on from here (see `StepCut`).
                s.cuts += 1;
                s.trace.push_back(format!("{step}: actor {actor}'s manager step is cut off"));
                drop(s);
                std::panic::resume_unwind(Box::new(StepCut));
            }
        }
    }

    /// With `CXLKV_SIM_WATCH_LINE` set: reports each change of whether the
    /// actor's host holds the watched line dirty.
    fn note_watched_line(&self, s: &mut Sched, actor: usize, what: &impl std::fmt::Display) {
        if let Some(line) = watch_line() {
            let d = self.mem.is_dirty(actor / 3, line);
            let was = s.watch_dirty.get(actor / 3).copied().unwrap_or(false);
            if d != was {
                let step = s.steps;
                eprintln!("watch: step {step} actor {actor} line {line} dirty {was} -> {d} at {what}");
                if s.watch_dirty.len() < self.hosts {
                    s.watch_dirty.resize(self.hosts, false);
                }
                s.watch_dirty[actor / 3] = d;
            }
        }
    }

    /// Kills the process of the host chosen to be killed (unwinding the
    /// actor) when its moment has come at `step`; else hands the guard back.
    fn maybe_kill<'a>(
        &'a self,
        mut s: std::sync::MutexGuard<'a, Sched>,
        actor: usize,
        step: u64,
        what: &impl std::fmt::Display,
    ) -> std::sync::MutexGuard<'a, Sched> {
        if let Some((h, at)) = s.kill_at {
            // The op actor's process is killed, preferably while it holds a
            // lock; never while its recovery thread rebuilds (the model
            // counts a recovery as running until it returns).
            let holding = s.local.keys().any(|&(lh, _)| lh == h);
            let m = self.model.lock().unwrap();
            // (Nor at the end, when the others may be checking.)
            let ok =
                m.attached[h] && m.recovering_on & (1 << h) == 0 && !m.need_recovery && m.op_at[h] < m.ops_per_host;
            drop(m);
            // Best while it has payload stored by plain stores and not yet
            // flushed (a block it is writing): its successor must flush it.
            let (dirty_payload, filling, in_fill) = {
                let m = self.model.lock().unwrap();
                (m.raw_writing[h], m.raw_filling[h], m.kill_in_fill)
            };
            // Or, on some seeds, while it fills a raw block (stored, not
            // yet flushed): its successor must write that back.
            let due = if in_fill {
                filling || step >= at + 200_000
            } else {
                holding && (dirty_payload || step >= at + 30_000) || step >= at + 50_000
            };
            if actor == 3 * h && step >= at && due && ok && !s.finished[actor] {
                s.kill_at = None;
                s.gen[h] += 1;
                s.local.retain(|&(lh, _), _| lh != h);
                s.trace.push_back(format!("{step}: host {h}'s process is killed"));
                if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
                    eprintln!("step {step}: host {h}'s process is killed at {what}");
                }
                if self.model.lock().unwrap().kill_late {
                    // No sibling on the host: what the process left in the
                    // cache lands on its own, within the lease.
                    self.mem.orphan(h);
                }
                {
                    let mut m = self.model.lock().unwrap();
                    m.attached[h] = false;
                    m.killed = true;
                    m.raw.retain(|b| b.2 != h);
                    m.counter_maybe += 1;
                    for r in m.roots.iter_mut() {
                        r.state = None;
                    }
                }
                self.pass(&mut s);
                drop(s);
                std::panic::resume_unwind(Box::new(Killed));
            }
        }
        s
    }

    /// Crashes the host chosen to crash (unwinding the actor) when its
    /// moment has come at `step`; else hands the guard back.
    fn maybe_crash<'a>(
        &'a self,
        mut s: std::sync::MutexGuard<'a, Sched>,
        actor: usize,
        step: u64,
        what: &impl std::fmt::Display,
    ) -> std::sync::MutexGuard<'a, Sched> {
        if let Some((h, at)) = s.crash_at {
            // Prefer a moment when the host holds a lock (its host-local
            // tier): revocation, repair and recovery of half-done critical
            // sections are then exercised in most crash runs. Best, one
            // that holds a global lock another host waits for:
            // revocation, repair and the waiter's stepping aside all run.
            let holding = s.local.keys().any(|&(lh, _)| lh == h);
            let (app, in_free) = {
                let m = self.model.lock().unwrap();
                (m.crash_in_app_lock, m.crash_in_free)
            };
            let due = step >= at
                && (step >= at + 50_000
                // Between a free's map and its record (often another
                // host's chunk, whose owner lives on).
                || in_free && actor / 3 == h && what.to_string() == "alloc.free.publish"
                || app && actor / 3 == h && self.holds_app_lock(h)
                || !app && holding && (step >= at + 30_000 || actor / 3 == h && self.contended_holder(h)));
            if actor / 3 == h && due && s.crashed.is_none() && !s.finished[3 * h] {
                s.crashed = Some(h);
                s.crash_at = None;
                s.host_crashed[h] = true;
                for a in 3 * h..3 * h + 3 {
                    s.runnable[a] = false;
                }
                s.trace.push_back(format!("{step}: host {h} crashes"));
                if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
                    eprintln!("step {step}: host {h} crashes");
                }
                // A node that was attached must be recovered; one that was
                // detached (mid-restart) leaves nothing to recover.
                {
                    let mut m = self.model.lock().unwrap();
                    m.crash_needs_recovery = m.attached[h];
                    // A recovery the host was running dies with it.
                    let cut = std::mem::take(&mut m.recovering_per[h]);
                    m.recovering = m.recovering.saturating_sub(cut as _);
                    m.recovering_on &= !(1 << h);
                }
                self.mem.crash(h);
                self.pass(&mut s);
                drop(s);
                std::panic::resume_unwind(Box::new(Crashed));
            }
        }
        s
    }

    /// Lines host `h`'s killed processes stored that are not in memory yet.
    /// Asks another host's op actor to acquire the key of the entry that
    /// host `h`'s evictor has CLAIMED (as `h` sees it): the pin handshake's
    /// two halves at once.
    pub(crate) fn offer_claimed(&self, h: usize) {
        let region = self.mem.view(h);
        let Ok(l) = read_header(&region).and_then(|hd| Layout::from_header(&hd, region.len())) else { return };
        for st in 0..l.caps.n_stripes {
            for e in 0..l.caps.entries_per_stripe {
                let ent: Result<Entry, _> = region.read(l.entry(st, e));
                if let Ok(ent) = ent {
                    if ent.state == cxlkv_core::layout::state::CLAIMED {
                        self.model.lock().unwrap().hot = Some((ent.key_hi, h));
                        return;
                    }
                }
            }
        }
    }

    pub(crate) fn orphaned_lines(&self, h: usize) -> Vec<(usize, &'static str)> {
        let tags: Vec<u32> = {
            let s = self.sched.lock().unwrap();
            (0..s.gen[h]).flat_map(|g| (3 * h..3 * h + 3).map(move |a| a as u32 + 1000 * g)).collect()
        };
        tags.into_iter().flat_map(|t| self.mem.dirty_tagged(h, t)).collect()
    }

    /// While host `h` buries its killed process's node: memory must not
    /// show the node DEAD before everything that process stored landed
    /// (recovery may begin as soon as it does).
    pub(crate) fn bury_in_order(&self, h: usize) {
        let Ok(st) = attach(self.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return };
        let dead = st
            .view
            .read::<NodeInfo>(st.layout.node_info(h as u32))
            .is_ok_and(|i| i.state == cxlkv_core::layout::NODE_DEAD);
        if dead {
            if let Some(&(i, site)) = self.orphaned_lines(h).first() {
                self.violation(format!(
                    "step {}: host {h}'s killed process is DEAD in memory before its line {i} (stored after {site}) landed",
                    self.now()
                ));
            }
        }
    }

    /// The bury race: parks actor `a` (its host's restarted op actor) until
    /// recovery freed the node its bury looks at (or a long while passed).
    pub(crate) fn park_until_recovered(&self, a: usize) {
        let t = self.now();
        while !self.model.lock().unwrap().recovered && self.now() < t + 4 * LEASE.lease {
            self.yield_now(a, "bury-race");
        }
    }

    /// Host `h`'s node holds the counter's application lock (in memory).
    pub(crate) fn holds_app_lock(&self, h: usize) -> bool {
        use cxlkv_core::layout::{LockSlot, SLOT_LOCKED};
        let Some(i) = self.model.lock().unwrap().counter_lock else { return false };
        let Ok(st) = attach(self.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return false };
        let l = &st.layout;
        st.view.read::<LockSlot>(l.lock_slot(l.locks().app(i), h as u32)).is_ok_and(|s| s.state == SLOT_LOCKED)
    }

    /// Checks that no lock's grant sequence (nor its repair floor) went back
    /// in memory, but in a line the stopped host (a zombie) wrote back after
    /// it stopped: managers keep their own count and floor and write the
    /// line again from them (`LockMemo` in core), so such a line only shows
    /// what no manager takes from it. The floor may also show less while
    /// the recovery that raised it holds the lock still (see below).
    pub(crate) fn grants_monotonic(&self, who: usize) {
        use cxlkv_core::layout::{LockLine, LockSlot, SLOT_LOCKED};
        use cxlkv_core::lock::GRANT_FLOOR;
        let Ok(st) = attach(self.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return };
        let l = &st.layout;
        let mut m = self.model.lock().unwrap();
        let zombie = m.stall.filter(|_| m.zombie && m.stalled);
        for lock in 0..l.n_locks {
            let Ok(ll) = st.view.read::<LockLine>(l.lock_line(lock)) else { continue };
            if zombie.is_some_and(|z| self.mem.provenance((l.lock_line(lock) / 64) as usize).0 as usize == z) {
                continue;
            }
            let floor = m.floors_seen.entry(lock).or_insert(ll.floor);
            // Memory keeps the floor elsewhere: the recovery that raised it
            // holds the lock still (its ticket is the floor), or a slot
            // shows it (a release, a request: see "Zombies" in core's
            // `lock`). A manager that has not read that slot yet may write
            // the line again from a late line's floor; it reads the slot
            // before it grants (checked below: no grant made since carries
            // less).
            let kept = ll.floor < *floor
                && (0..l.caps.max_nodes).any(|n| {
                    st.view
                        .read::<LockSlot>(l.lock_slot(lock, n))
                        .is_ok_and(|s| s.state == SLOT_LOCKED && s.seq == *floor || s.reserved[GRANT_FLOOR] >= *floor)
                });
            if ll.floor < *floor && !kept {
                let line = (l.lock_line(lock) / 64) as usize;
                let msg = format!(
                    "lock {lock}: repair floor went back from {floor} to {} in memory (seen after actor {who}; line \
                     {line} last written by {:?})",
                    ll.floor,
                    self.mem.provenance(line)
                );
                drop(m);
                return self.violation(msg);
            }
            *floor = (*floor).max(ll.floor);
            let raised = *floor;
            for n in 0..l.caps.max_nodes {
                let soff = l.lock_slot(lock, n);
                let Ok(s) = st.view.read::<LockSlot>(soff) else { continue };
                let by = self.mem.provenance((soff / 64) as usize);
                if s.state == SLOT_LOCKED
                    && s.seq > raised
                    && s.reserved[GRANT_FLOOR] < raised
                    && zombie != Some(by.0 as usize)
                {
                    let msg = format!(
                        "lock {lock}: node {n} was granted ticket {} with floor {}, below the floor {raised} a recovery \
                         raised before (slot written by {by:?})",
                        s.seq, s.reserved[GRANT_FLOOR]
                    );
                    drop(m);
                    return self.violation(msg);
                }
            }
            let now = ll.grant_seq;
            let seen = m.grants_seen.entry(lock).or_insert(now);
            if now < *seen {
                let line = (l.lock_line(lock) / 64) as usize;
                let msg = format!(
                    "lock {lock}: grant sequence went back from {seen} to {now} in memory (seen after actor {who}; line {line} last written by {:?})",
                    self.mem.provenance(line)
                );
                drop(m);
                return self.violation(msg);
            }
            *seen = now;
        }
    }

    /// Host `h` holds a global lock (in memory) that another node waits for.
    pub(crate) fn contended_holder(&self, h: usize) -> bool {
        use cxlkv_core::layout::{LockSlot, SLOT_LOCKED, SLOT_WAITING};
        let Ok(st) = attach(self.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return false };
        let l = &st.layout;
        let slot = |lock: u32, n: u32| st.view.read::<LockSlot>(l.lock_slot(lock, n)).map_or(0, |x| x.state);
        (0..l.n_locks).any(|lock| {
            slot(lock, h as u32) == SLOT_LOCKED
                && (0..l.caps.max_nodes).any(|n| n != h as u32 && slot(lock, n) == SLOT_WAITING)
        })
    }

    /// Picks the next runnable actor at random and wakes it. Now and then the
    /// actor handing over is parked for a while, as a preempted thread is:
    /// what it left in flight stays half-done for others to run into.
    pub(crate) fn pass(&self, s: &mut Sched) {
        let n = s.runnable.len();
        if s.sleep_until.len() != n {
            s.sleep_until = vec![0; n];
        }
        let cur = s.turn;
        if park() && cur < n && s.runnable[cur] && rnd(&mut s.rng).is_multiple_of(64) {
            s.sleep_until[cur] = s.steps + 500 + rnd(&mut s.rng) % 8000;
        }
        let awake = |s: &Sched, a: usize| s.runnable[a] && s.sleep_until[a] <= s.steps;
        loop {
            if s.runnable.iter().any(|&r| r) && !(0..n).any(|a| awake(s, a)) {
                // Everyone is parked: time jumps to the first wake-up.
                let t = (0..n).filter(|&a| s.runnable[a]).map(|a| s.sleep_until[a]).min().unwrap_or(s.steps);
                s.steps = s.steps.max(t);
            }
            if !crate::harness::stalls::hold_parked(self, s) {
                break;
            }
        }
        let live = (0..n).filter(|&a| awake(s, a)).count();
        if live == 0 {
            s.stop = true;
            for cv in &self.cvs {
                cv.notify_all();
            }
        } else {
            let mut k = (rnd(&mut s.rng) as usize) % live;
            for a in 0..n {
                if awake(s, a) {
                    if k == 0 {
                        s.turn = a;
                        break;
                    }
                    k -= 1;
                }
            }
            self.cvs[s.turn].notify_all();
        }
    }

    pub(crate) fn wait_turn(&self, actor: usize) {
        let mut s = self.sched.lock().unwrap();
        while s.turn != actor && !s.stop {
            s = self.cvs[actor].wait(s).unwrap();
        }
        self.mem.set_tag(tag_of(&s, actor));
    }

    /// An operation of `actor` returned: everything it stored must be in
    /// memory by now (flushed and fenced), except the payload range `keep`
    /// that the caller is still writing. A returned operation is visible to
    /// every other host and survives its own host's crash; a line left
    /// dirty would reach memory whenever the cache liked, whole, over other
    /// hosts' newer data.
    pub(crate) fn published_all(&self, actor: usize, what: &str, keep: Option<(u64, u64)>) {
        let h = actor / 3;
        let inside = |i: usize| keep.is_some_and(|(a, n)| (i as u64 + 1) * 64 > a && (i as u64) * 64 < a + n);
        let tag = tag_of(&self.sched.lock().unwrap(), actor);
        let left: Vec<_> = self.mem.dirty_tagged(h, tag).into_iter().filter(|&(i, _)| !inside(i)).collect();
        if let Some(&(i, site)) = left.first() {
            self.violation(format!(
                "step {}: host {h} actor {actor}: {what} returned with {} line(s) not written back, first line {i} (offset {}), stored after site {site}",
                self.now(),
                left.len(),
                i * 64
            ));
        }
    }

    /// An operation finished: the run is not livelocked.
    pub(crate) fn progressed(&self) {
        let mut s = self.sched.lock().unwrap();
        s.progress = s.steps;
    }

    pub(crate) fn finish(&self, actor: usize) {
        let mut s = self.sched.lock().unwrap();
        s.runnable[actor] = false;
        s.finished[actor] = true;
        s.progress = s.steps;
        self.pass(&mut s);
    }

    /// Every op actor finished or crashed, any crash was recovered, and no
    /// recovery is under way.
    pub(crate) fn settled(&self) -> bool {
        let s = self.sched.lock().unwrap();
        let ops_done = (0..self.hosts).all(|h| s.finished[3 * h] || s.host_crashed[h]);
        drop(s);
        // A recovery under way needs the managers to finish.
        let m = self.model.lock().unwrap();
        ops_done && !m.awaits_recovery() && m.recovering == 0
    }

    pub(crate) fn crashed(&self) -> Option<usize> {
        self.sched.lock().unwrap().crashed
    }

    pub(crate) fn now(&self) -> u64 {
        self.sched.lock().unwrap().steps
    }
}

pub(crate) struct Env<'w> {
    pub(crate) w: &'w World,
}

impl NodeEnv for Env<'_> {
    /// The host's manager actor gives kept grants back once recalled (see
    /// `actors::manager`), as the platform's background thread does.
    fn keeps_grants(&self) -> bool {
        true
    }
    /// The simulated wall clock: one millisecond a scheduler step, the
    /// same on every host.
    fn wall_ms(&self) -> u64 {
        crate::harness::params::WALL_START + self.w.now()
    }
    /// An operation repairs a void stripe or chunk: the model's
    /// bookkeeping of a recovery, as the recovery actor keeps it.
    fn recovering(&self, on: bool) {
        let me = ACTOR.with(|a| a.get());
        let h = me / 3;
        let mut stale = false;
        {
            let mut m = self.w.model.lock().unwrap();
            if on {
                // Only a holder revoked while it stopped (declared dead
                // while alive) writes a void line; in a run where no host
                // ever stopped, a structure read void was read stale (a
                // missing invalidate), which the repair would only hide.
                stale = !m.stalled;
                m.recovering += 1;
                m.recoveries += 1;
                m.void_repairs += 1;
                m.pinned.clear();
                m.recovering_on |= 1 << h;
                m.recovering_per[h] += 1;
            } else {
                m.recovering -= 1;
                m.recovering_per[h] = m.recovering_per[h].saturating_sub(1);
                // (Another thread of the process may recover still: a void
                // structure's repair beside the recovery thread's.)
                if m.recovering_per[h] == 0 {
                    m.recovering_on &= !(1 << h);
                }
            }
        }
        if stale {
            self.w.violation(format!(
                "step {}: host {h} found a structure void (a stripe header or a chunk) though no host ever stopped: \
                 read stale",
                self.w.now()
            ));
        }
        if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
            eprintln!(
                "step {}: host {h} {} a void structure's repair",
                self.w.now(),
                if on { "starts" } else { "ends" }
            );
        }
    }
    /// The host-local locks: actors of one host take turns on each lock.
    fn local_lock(&self, lock: u32) -> cxlkv_core::Result<()> {
        let me = ACTOR.with(|a| a.get());
        let h = me / 3;
        loop {
            {
                let mut s = self.w.sched.lock().unwrap();
                let slot = s.local.entry((h, lock)).or_insert(usize::MAX);
                if *slot == usize::MAX || *slot == me {
                    *slot = me;
                    return Ok(());
                }
            }
            self.w.yield_now(me, "local-lock");
        }
    }
    fn try_local_lock(&self, lock: u32) -> bool {
        let me = ACTOR.with(|a| a.get());
        let mut s = self.w.sched.lock().unwrap();
        let slot = s.local.entry((me / 3, lock)).or_insert(usize::MAX);
        if *slot == usize::MAX {
            *slot = me;
            return true;
        }
        false
    }
    fn local_unlock(&self, lock: u32) {
        let me = ACTOR.with(|a| a.get());
        let mut s = self.w.sched.lock().unwrap();
        if s.local.get(&(me / 3, lock)) == Some(&me) {
            s.local.remove(&(me / 3, lock));
        }
    }
    fn wait(&self, iteration: u32) -> cxlkv_core::Result<()> {
        {
            // As the platform's: a process whose heartbeat found it fenced
            // stops waiting, whatever its deadline.
            let h = ACTOR.with(|a| a.get()) / 3;
            let m = self.w.model.lock().unwrap();
            if m.fenced && m.stall == Some(h) {
                return Err(Error::Revoked);
            }
        }
        if iteration > WAIT_LIMIT.with(|l| l.get()) {
            // `CXLKV_SIM_DEBUG`: what the locks were when a wait timed out.
            if std::env::var_os("CXLKV_SIM_DEBUG").is_some() {
                dump_locks(self.w);
            }
            return Err(Error::Timeout);
        }
        if iteration == 50_000 && std::env::var("CXLKV_SIM_DEBUG").is_ok() {
            let a = ACTOR.with(|a| a.get());
            eprintln!(
                "step {}: actor {a} waited 50000 times; locks in memory:{}",
                self.w.now(),
                locks_in_memory(self.w)
            );
        }
        self.w.yield_now(ACTOR.with(|a| a.get()), "wait");
        Ok(())
    }
}

/// The first lock whose line in memory says it awaits repair.
pub(crate) fn locks_awaiting_repair(w: &World) -> Option<u32> {
    use cxlkv_core::layout::LockLine;
    let st = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent).ok()?;
    let l = &st.layout;
    (0..l.n_locks).find(|&k| st.view.read::<LockLine>(l.lock_line(k)).is_ok_and(|ll| ll.repair != 0))
}

/// Every lock's line and slots as memory holds them (for reports).
pub(crate) fn locks_in_memory(w: &World) -> String {
    use cxlkv_core::layout::{LockLine, LockSlot};
    let Ok(st) = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return String::new() };
    let l = &st.layout;
    let mut out = String::new();
    if let Ok(ml) = st.view.read::<cxlkv_core::layout::ManagerLine>(l.manager.start) {
        out += &format!(" [manager {} lease {} dead {:b}]", ml.manager, ml.lease, ml.dead_mask);
    }
    for n in 0..l.caps.max_nodes {
        if let Ok(r) = st.view.read::<cxlkv_core::layout::RequestLine>(l.requests(n)) {
            if r.want[0] != 0 {
                out += &format!(" [node {n} wants {:b}]", r.want[0]);
            }
        }
    }
    for lock in 0..l.n_locks {
        let ll = st.view.read::<LockLine>(l.lock_line(lock));
        let slots: Vec<u32> = (0..l.caps.max_nodes)
            .map(|n| st.view.read::<LockSlot>(l.lock_slot(lock, n)).map_or(9, |x| x.state))
            .collect();
        if let Ok(ll) = ll {
            if ll.repair != 0 || slots.iter().any(|&x| x != 0) {
                out += &format!(" [lock {lock}: holder {} repair {} slots {slots:?}]", ll.holder, ll.repair);
            }
        }
    }
    out
}

/// Whether host `h` may run recovery now (see `Model::single_recovery`).
pub(crate) fn recovers_here(w: &World, h: usize) -> bool {
    if !w.model.lock().unwrap().single_recovery {
        return true;
    }
    let gone = {
        let s = w.sched.lock().unwrap();
        let m = w.model.lock().unwrap();
        // (A host whose process was killed has none attached to recover
        // with until recovery freed the node.)
        (0..w.hosts)
            .map(|x| s.host_crashed[x] || (m.stall == Some(x) && m.stalled) || (m.killed && !m.attached[x]))
            .collect::<Vec<_>>()
    };
    let manager = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent)
        .ok()
        .and_then(|st| st.view.read::<cxlkv_core::layout::ManagerLine>(st.layout.manager.start).ok())
        .map_or(0, |ml| ml.manager as usize);
    let live = (0..w.hosts).filter(|&x| !gone[x]);
    let pick = live.clone().find(|&x| x + 1 != manager).or_else(|| live.clone().next());
    pick == Some(h)
}

pub(crate) fn attach_retry(w: &World, h: usize) -> Option<Store<SimCoherence<'_>>> {
    for _ in 0..10_000 {
        match attach(w.mem.view(h), w.mem.host(h)) {
            Ok(s) => return Some(s),
            Err(Error::NotInitialized) => w.yield_now(ACTOR.with(|a| a.get()), "attach-retry"),
            Err(e) => {
                w.violation(format!("host {h} attach: {e}"));
                return None;
            }
        }
    }
    w.violation(format!("host {h} never saw a formatted region"));
    None
}

pub(crate) fn log(w: &World, off: u64, what: String) {
    let step = w.now();
    w.model.lock().unwrap().log.push((off, step, what));
}

/// Whether a killed process's successor takes the first free slot (else it
/// names its own). Kill runs are the seeds 4 (mod 6); their lazy ones are
/// every other one, so each choice meets both cache kinds.
pub(crate) fn kill_scans(seed: u64) -> bool {
    (seed / 6) % 4 >= 2
}

/// Whether a killed process restarts two leases late (else at once).
pub(crate) fn kill_late(seed: u64) -> bool {
    (seed / 6) % 8 >= 4
}

/// Who host `h`'s current process is (pid and nonce change with each
/// process the host runs).
pub(crate) fn identity(w: &World, h: usize) -> Identity {
    let g = w.sched.lock().unwrap().gen[h] as u64;
    Identity {
        pid: 100 + h as u32 + 16 * g as u32,
        host_id: h as u64 + 1,
        nonce: 1000 + h as u64 + 100 * g,
        now: 0,
        pid_ns: 0,
    }
}

/// With `CXLKV_SIM_DEBUG`, after host `h`'s unexpected error: prints every
/// lock slot of node `h` and every slot in use, with who wrote its line
/// last and each host's cached (state, ticket), and every lock line.
pub(crate) fn dump_slots(w: &World, h: usize) {
    use cxlkv_core::layout::{LockLine, LockSlot};
    let g = match attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent) {
        Ok(g) => g,
        Err(e) => return eprintln!("slots: no view ({e:?})"),
    };
    let l = &g.layout;
    for lock in 0..l.n_locks {
        for n in 0..l.caps.max_nodes {
            let off = l.lock_slot(lock, n);
            let Ok(sl) = g.view.read::<LockSlot>(off) else { continue };
            if sl.state != 0 || n as usize == h {
                let cached: Vec<_> =
                    (0..w.hosts).map(|c| w.mem.view(c).read::<LockSlot>(off).map(|r| (r.state, r.seq))).collect();
                let by = w.mem.provenance((off / 64) as usize);
                eprintln!("slots: lock {lock} node {n}: {sl:?} by {by:?}, cached {cached:?}");
            }
        }
        if let Ok(ll) = g.view.read::<LockLine>(l.lock_line(lock)) {
            eprintln!("slots: lock {lock} line {ll:?} by {:?}", w.mem.provenance((l.lock_line(lock) / 64) as usize));
        }
    }
}

/// Prints every lock slot in use, every lock line with a holder or a
/// repair, every node's request bits (memory's and each host's cached
/// copy) and the manager line, as memory holds them.
fn dump_locks(w: &World) {
    use cxlkv_core::layout::{LockLine, LockSlot, ManagerLine, RequestLine};
    let Ok(g) = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return };
    let l = &g.layout;
    for lock in 0..l.n_locks {
        for n in 0..l.caps.max_nodes {
            if let Ok(sl) = g.view.read::<LockSlot>(l.lock_slot(lock, n)) {
                if sl.state != 0 {
                    eprintln!("at timeout: lock {lock} node {n}: {sl:?}");
                }
            }
        }
        if let Ok(ll) = g.view.read::<LockLine>(l.lock_line(lock)) {
            if ll.repair != 0 || ll.holder != 0 {
                eprintln!("at timeout: lock {lock} line {ll:?}");
            }
        }
    }
    for n in 0..l.caps.max_nodes {
        let off = l.requests(n);
        let cached: Vec<_> = (0..w.hosts).map(|h| w.mem.view(h).read::<RequestLine>(off).map(|r| r.want)).collect();
        eprintln!(
            "at timeout: requests of node {n}: {:?} (line by {:?}); hosts' copies {cached:?}",
            g.view.read::<RequestLine>(off).map(|r| r.want),
            w.mem.provenance((off / 64) as usize)
        );
    }
    eprintln!("at timeout: manager {:?} step {}", g.view.read::<ManagerLine>(l.manager.start), w.now());
    // Every node's state and journal records (a pin no one drops blocks
    // every evictor that meets its entry).
    for n in 0..l.caps.max_nodes {
        let Ok(info) = g.view.read::<cxlkv_core::layout::NodeInfo>(l.node_info(n)) else { continue };
        let mut recs = Vec::new();
        for i in 0..l.caps.pin_slots {
            if let Ok(r) = g.view.read::<cxlkv_core::layout::PinRecord>(l.pin_record(n, i)) {
                if r.entry != 0 {
                    let e = r.entry - 1;
                    let eps = l.caps.entries_per_stripe;
                    recs.push((e / eps, e % eps, r.gen, r.count));
                }
            }
        }
        if info.state != 0 || !recs.is_empty() {
            eprintln!(
                "at timeout: node {n} state {} incarnation {} journal (stripe, entry, gen, count) {recs:?}",
                info.state, info.incarnation
            );
        }
    }
}

/// Each key's pin ids held now, with the count of recoveries begun (`None`
/// while one runs).
pub(crate) fn pins_of(w: &World, keys: &[Key]) -> Vec<Option<(u64, HashSet<u64>)>> {
    let m = w.model.lock().unwrap();
    keys.iter()
        .map(|k| (m.recovering == 0).then(|| (m.recoveries, m.pinned.get(k).cloned().unwrap_or_default())))
        .collect()
}

/// Takes a pin out of the model's `pinned` (before it is released).
pub(crate) fn unpin_model(w: &World, p: &Pin) {
    let mut m = w.model.lock().unwrap();
    if let Some(ids) = m.pinned.get_mut(&p.h.key) {
        ids.remove(&p.id);
    }
}

/// Counts an insert by host `h` in the model.
/// A reserve of `keys` begins: returns the step it begins at (see
/// [`Lifetimes`]).
pub(crate) fn reserve_begins(w: &World, keys: &[cxlkv_core::hash::Key]) -> u64 {
    let now = w.now();
    let mut m = w.model.lock().unwrap();
    for k in keys {
        let r = m.reserving.entry(*k).or_default();
        r.0 += 1;
        r.1 += 1;
    }
    now
}

/// A reserve of `keys` returned (whatever its result).
pub(crate) fn reserve_ends(w: &World, keys: &[cxlkv_core::hash::Key]) {
    let mut m = w.model.lock().unwrap();
    for k in keys {
        let r = m.reserving.entry(*k).or_default();
        r.1 = r.1.saturating_sub(1);
    }
}

/// What a read of one key must know to tell whether the block it returned
/// was past its lifetime: the key's reserves as they stood when the read
/// began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lifetimes {
    /// The step the read began at.
    at: u64,
    /// Reserves of the key begun so far, and in flight then.
    reserving: (u64, u64),
    /// The last successful reserve's steps (see `Model::born`).
    born: Option<(u64, u64)>,
}

/// The key's reserves as a read of it begins.
pub(crate) fn read_begins(w: &World, k: cxlkv_core::hash::Key) -> Lifetimes {
    let at = w.now();
    let m = w.model.lock().unwrap();
    Lifetimes { at, reserving: m.reserving.get(&k).copied().unwrap_or_default(), born: m.born.get(&k).copied() }
}

/// Host `h`'s read of `k` (`what`), begun as `before` says, returned its
/// block: in a run whose tenant has a lifetime `ttl`, a violation when the
/// block was certainly past it. Certain when no reserve of the key was in
/// flight as the read began and none began since (so the block is the
/// last successful reserve's), and that reserve ended `ttl` or more before
/// the read began (its stamp's clock read no later than that end).
pub(crate) fn read_returned(w: &World, h: usize, k: cxlkv_core::hash::Key, before: Lifetimes, what: &str) {
    let ttl = crate::harness::model::TTL.with(|t| t.get());
    if ttl == 0 {
        return;
    }
    let now = read_begins(w, k);
    let Some((_, end)) = before.born else { return };
    if before.reserving.1 == 0 && now.reserving.0 == before.reserving.0 && before.at >= end.saturating_add(ttl) {
        w.violation(format!(
            "step {}: host {h} {what} key {} past its lifetime (reserved by step {end}, lifetime {ttl}, read from step {})",
            w.now(),
            k.hi,
            before.at
        ));
    }
}

/// Whether `k`'s block (the last successful reserve's) may be past its
/// lifetime at step `at`: a lookup may miss it though pinned.
pub(crate) fn may_be_expired(w: &World, k: cxlkv_core::hash::Key, at: u64) -> bool {
    let ttl = crate::harness::model::TTL.with(|t| t.get());
    ttl != 0 && w.model.lock().unwrap().born.get(&k).is_none_or(|&(begin, _)| at >= begin.saturating_add(ttl))
}

/// Counts a reserve of `k` by host `h` that succeeded, begun at step `t0`:
/// the block's lifetime (in a run whose tenant has one) began between `t0`
/// and now.
pub(crate) fn counted_insert(w: &World, h: usize, k: cxlkv_core::hash::Key, t0: u64) {
    let now = w.now();
    let mut m = w.model.lock().unwrap();
    m.inserts[h] += 1;
    m.total_inserts += 1;
    m.born.insert(k, (t0, now));
}
