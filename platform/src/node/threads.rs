//! A node's two threads: the heartbeat, alone on its own so that nothing
//! delays it, and the background thread (lock manager steps, automatic
//! recovery, burial of this host's gone siblings).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cxlkv_core::lock::StepReport;

use super::Inner;

/// The heartbeat's own thread: it beats every eighth of the lease and does
/// nothing else, at a raised CPU priority where allowed, so that neither
/// the lock manager's work nor a lock an operation thread holds can delay
/// it. Learning that the node was declared dead, it marks the node fenced
/// (every call then fails with `Revoked`) and ends.
///
/// It starts before the node attaches and waits for it: a thread started
/// after would first have to be scheduled, which on an overloaded host took
/// longer than the lease (the node was declared dead before its first beat;
/// a waiting thread that wakes is scheduled at once).
pub(super) fn beat(attached: std::sync::mpsc::Receiver<Arc<Inner>>) {
    let raised = crate::host::raise_cpu_priority();
    let Ok(inner) = attached.recv() else { return };
    inner.raised_priority.set(raised);
    let beat_every = (inner.opts.lease / 8).max(Duration::from_millis(1));
    while !inner.stop.get() {
        let t = Instant::now();
        if inner.core().heartbeat(inner.nonce) == Err(cxlkv_core::Error::Revoked) {
            inner.fenced.set(true);
            inner.disown_cell();
            eprintln!(
                "cxlkv: node {} learnt it was declared dead (silent for a lease of {:?}: stopped, or starved of \
                 CPU) and recovered; every call now fails with REVOKED: attach again to go on",
                inner.id, inner.opts.lease
            );
            return;
        }
        // Parked, so that a close wakes it at once (`shutdown` unparks it);
        // a spurious wake-up only goes round the loop again.
        while !inner.stop.get() && t.elapsed() < beat_every {
            std::thread::park_timeout(beat_every - t.elapsed().min(beat_every));
        }
    }
}

/// How long a manager's thread keeps stepping without sleeping after a
/// grant: waking a sleeping thread can take longer than many steps (an
/// idle virtual CPU), and locks come in bursts.
const HOT: Duration = Duration::from_millis(1);

/// How long a grant kept past its release (see core's `lock.rs`, "Parked
/// grants") stays kept unless taken back or recalled: past it, the lock
/// goes back to the manager, so a node of another host that asks much
/// later finds it free.
const KEEP_FOR: Duration = Duration::from_millis(100);

/// How often the background thread looks for recalls while the node keeps
/// grants: a ring of a waiter of this host wakes it at once, a waiter on
/// another host waits up to this long more.
const RECALL_POLL: Duration = Duration::from_micros(250);

/// The lock manager's steps, automatic recovery and the burial of this
/// host's gone siblings, until the node closes or is fenced.
pub(super) fn background(inner: Arc<Inner>) {
    let beat_every = (inner.opts.lease / 8).max(Duration::from_millis(1));
    let mut last_bury = Instant::now();
    let mut idle = 0u32;
    let mut granted_at = Instant::now();
    while !inner.stop.get() && !inner.fenced.get() {
        if last_bury.elapsed() >= beat_every {
            last_bury = Instant::now();
            // Siblings gone from this host are buried long before the manager
            // (maybe on another host) could take their silence for death.
            let _ = inner.bury_siblings();
            // A replaced manager's grant that landed in one of this node's
            // idle slots would hold its lock forever.
            let _ = inner.core().give_back_strays();
        }
        let bell = inner.host_locks.bell_count();
        // Skipped while another thread steps it (a waiter of this or
        // another process of the host).
        let rep = match inner.step_own() {
            Some(r) => r.unwrap_or_default(),
            None => StepReport { active: inner.is_manager.get(), ..StepReport::default() },
        };
        // Kept grants another node asks for (or kept too long) go back:
        // after the step, which may have recalled one itself.
        let keeps = inner.core().keeps_grants() && {
            let before = crate::sync::monotonic_ns().saturating_sub(KEEP_FOR.as_nanos() as u64);
            let _ = inner.core().release_parks(before);
            inner.core().keeps_grants()
        };
        // A dead node's bit stays in the manager's mask until its next
        // liveness scan: one that ran before the last recovery ended names
        // nodes that recovery freed already (recovering again would rebuild
        // every stripe for nothing, under readers' feet).
        let fresh = inner.recovered_at.lock().is_ok_and(|at| at.is_none_or(|at| rep.scanned_at > at));
        if rep.dead != 0 && fresh && inner.opts.auto_recover && !inner.recovering.claim() {
            let i2 = inner.clone();
            let t = std::thread::spawn(move || {
                let _ = i2.core().recover(0);
                if let Ok(mut at) = i2.recovered_at.lock() {
                    *at = Some(i2.now_ms());
                }
                i2.recovering.release();
            });
            // The last one has ended (`recovering` was free): joined now.
            if let Some(done) = inner.recovery.lock().ok().and_then(|mut r| r.replace(t)) {
                let _ = done.join();
            }
        }
        if rep.grants > 0 {
            idle = 0;
            granted_at = Instant::now();
            std::thread::yield_now();
            continue;
        }
        idle = idle.saturating_add(1);
        let pause = if !rep.active && keeps {
            RECALL_POLL
        } else if !rep.active {
            Duration::from_millis(5).min(beat_every)
        } else if idle < 16 || granted_at.elapsed() < HOT {
            Duration::from_micros(0)
        } else if idle < 2000 {
            Duration::from_micros(50)
        } else {
            Duration::from_micros(500)
        };
        if pause.is_zero() {
            std::thread::yield_now();
        } else if !rep.active && !keeps {
            // Not the manager: a lock request's ring is not for this
            // thread. It steps again after the pause (a vacant role is
            // claimed then), or when the node closes (`shutdown` unparks
            // it).
            std::thread::park_timeout(pause);
        } else {
            // Woken early by a request of any process of this host (a ring
            // since `bell` was read returns at once), or to stop: the
            // manager's step, or a kept grant's recall.
            inner.host_locks.sleep(bell, pause);
        }
    }
}
