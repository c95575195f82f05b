//! Invariants checked during and after a run: the region's own `check`
//! and the model's agreement with what the region holds.

use cxlkv_core::coherence::{Coherence, Site};
use cxlkv_core::layout::NodeInfo;
use cxlkv_core::store::{attach, Store};

use crate::harness::feed::feed_final;
use crate::harness::world::World;

pub(crate) fn final_checks(w: &World) {
    // First, before any check below reads stripe headers fresh through the
    // hosts' caches: each host's change-log reader catches up through its
    // cache as the run left it (a reader that trusts a stale header would
    // stay behind for good).
    feed_final(w);
    // Every live host checks the region through its own cache; host 0 (or 1)
    // then reads the results.
    let crashed = w.crashed();
    for h in (0..w.hosts).filter(|&h| Some(h) != crashed) {
        match attach(w.mem.view(h), w.mem.host(h)) {
            Ok(s) => check_from(w, &s, h, "after the run"),
            Err(e) => w.violation(format!("final attach on host {h}: {e}")),
        }
    }
    let h = if crashed == Some(0) { 1 } else { 0 };
    let store = match attach(w.mem.view(h), w.mem.host(h)) {
        Ok(s) => s,
        Err(e) => return w.violation(format!("final attach: {e}")),
    };
    let m = w.model.lock().unwrap();
    let (want, maybe, root) = (m.counter, m.counter_maybe, m.counter_root);
    let inserts = m.inserts.clone();
    drop(m);
    if root != 0 {
        let len = 64 * store.layout.caps.max_nodes as u64;
        let got = store
            .co
            .invalidate(&store.view, root, len, Site("harness.counter"))
            .and_then(|()| super::actors::counter_value(&store, root));
        if !got.is_ok_and(|g| g >= want && g <= want + maybe) {
            w.violation(format!("lock counter: {got:?} after {want} increments (a lost update)"));
        }
    }
    let stripes: Result<u64, _> = (0..store.layout.caps.n_stripes)
        .map(|s| {
            store
                .fresh::<cxlkv_core::layout::StripeHeader>(store.layout.stripe(s), Site("harness.stripe"))
                .map(|x| x.inserts)
        })
        .sum();
    let (total, least) = {
        let m = w.model.lock().unwrap();
        // A void header's repair keeps the counts of the zombie's header,
        // which may be older than its stop: only the bound above holds.
        (m.total_inserts, if m.void_repairs > 0 { 0 } else { m.total_inserts })
    };
    // A crashed host may have counted reserves (one batch of three) that the
    // model never saw return.
    let (stalled_any, killed) = {
        let m = w.model.lock().unwrap();
        (m.stalled, m.killed)
    };
    let slack = 3 * (crashed.is_some() as u64 + stalled_any as u64 + killed as u64);
    if !stripes.as_ref().is_ok_and(|&n| n >= least && n <= total + slack) {
        w.violation(format!("stripe insert counters {stripes:?}, harness counted {total}"));
    }
    for n in 0..w.hosts as u32 {
        let info = store.fresh_state_first::<NodeInfo>(store.layout.node_info(n), Site("harness.final.info"));
        if info.map(|i| i.state) != Ok(cxlkv_core::layout::NODE_FREE) {
            let line = (store.layout.node_info(n) / 64) as usize;
            w.violation(format!(
                "node {n} not free after the run: {info:?} (line {line} last written by {:?})",
                w.mem.provenance(line)
            ));
        }
    }
    let (stalled, was, fenced) = {
        let m = w.model.lock().unwrap();
        (m.stall, m.stalled, m.fenced)
    };
    if was && !fenced {
        w.violation(format!("host {stalled:?} stalled past its lease, but its heartbeat never noticed it was fenced"));
    }
    for (n, want) in inserts.iter().enumerate() {
        if Some(n) == crashed || Some(n) == stalled {
            continue;
        }
        let got =
            store.fresh::<cxlkv_core::layout::NodeStats>(store.layout.node_stats(n as u32), Site("harness.stats"));
        if got.map(|s| s.inserts) != Ok(*want) {
            w.violation(format!("node {n} stats: inserts {:?}, harness counted {want}", got.map(|s| s.inserts)));
        }
    }
}

/// Invariants that hold in memory at every moment, whatever is in flight
/// (but a recovery, which rebuilds under every lock):
/// no two live entries share a payload block, every live entry's block is
/// allocated, no lock has two holders.
pub(crate) fn always_invariants(w: &World, h: usize, op: u32) {
    if w.model.lock().unwrap().recovering > 0 {
        // Mid-rebuild under every lock: memory is consistent again when the
        // recovery returns.
        return;
    }
    let Ok(store) = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return };
    // A stripe's change count never goes back in memory (its log's numbers
    // are unique) in a header that is not void: one stamped below its
    // lock's repair floor is a revoked holder's late write, which no holder
    // uses (it has the stripe repaired first).
    for s in 0..store.layout.caps.n_stripes {
        let Ok(hd) = store.view.read::<cxlkv_core::layout::StripeHeader>(store.layout.stripe(s)) else { continue };
        let lock = store.layout.locks().stripe(s);
        let Ok(ll) = store.view.read::<cxlkv_core::layout::LockLine>(store.layout.lock_line(lock)) else { continue };
        if hd.ticket < ll.floor.max(w.model.lock().unwrap().floor_seen(lock)) {
            continue;
        }
        let mut m = w.model.lock().unwrap();
        if m.changes_seen.len() <= s as usize {
            m.changes_seen.resize(s as usize + 1, 0);
        }
        let seen = m.changes_seen[s as usize];
        m.changes_seen[s as usize] = seen.max(hd.changes);
        drop(m);
        if hd.changes < seen {
            let line = (store.layout.stripe(s) / 64) as usize;
            w.violation(format!(
                "step {} (host {h} after op {op}): stripe {s}'s change count went back from {seen} to {} (line {line}, last written by {:?})",
                w.now(),
                hd.changes,
                w.mem.provenance(line)
            ));
        }
    }
    let mut scratch = vec![0u64; cxlkv_core::check::scratch_words(&store)];
    let mut bad = Vec::new();
    let _ = cxlkv_core::check::check(&store, &mut scratch, &mut |f| {
        use cxlkv_core::check::FindingKind as K;
        if matches!(f.kind, K::SharedBlock | K::EntryPayload | K::TwoHolders) {
            bad.push(f);
        }
    });
    bad.retain(|f| f.kind != cxlkv_core::check::FindingKind::TwoHolders || !late_grant_beside(w, &store, f.a as u32));
    for f in bad.iter().take(3) {
        let mut more = String::new();
        if f.kind == cxlkv_core::check::FindingKind::EntryPayload {
            // The entry and the chunk record its payload falls in.
            if let Ok(e) = store.view.read::<cxlkv_core::layout::Entry>(store.layout.entry(f.a as u32, f.b as u32)) {
                let l = &store.layout;
                let c = e.payload_off.saturating_sub(l.payload.start) / l.chunk_size();
                let rec: Result<cxlkv_core::layout::ChunkRecord, _> = store.view.read(l.chunk(c as u32));
                let line = (l.chunk(c as u32) / 64) as usize;
                more = format!(
                    "; entry {e:?}; chunk {c} record {rec:?} (line {line} last written by {:?})",
                    w.mem.provenance(line)
                );
            }
        }
        if f.kind == cxlkv_core::check::FindingKind::TwoHolders {
            // Who wrote each LOCKED slot (a late write-back names its host).
            let l = &store.layout;
            for n in 0..l.caps.max_nodes {
                let off = l.lock_slot(f.a as u32, n);
                let slot: Result<cxlkv_core::layout::LockSlot, _> = store.view.read(off);
                if slot.is_ok_and(|x| x.state == cxlkv_core::layout::SLOT_LOCKED) {
                    more += &format!(
                        "; node {n}'s slot {slot:?} last written by {:?}",
                        w.mem.provenance((off / 64) as usize)
                    );
                }
            }
        }
        w.violation(format!("step {} (host {h} after op {op}): in memory: {f}{more}", w.now()));
    }
}

/// Lock `lock` shows two LOCKED slots in memory only because a stopped
/// manager (the zombie's) wrote a grant back late: one of them was last
/// written by the zombie's host and carries an older manager claim than
/// another LOCKED slot. Its grantee rejects such a grant (it is not the
/// newest claim's; `zombie-manager-grants-late` proves it) and overwrites it
/// with its next request, so nobody holds by it.
fn late_grant_beside<C: Coherence>(w: &World, store: &Store<C>, lock: u32) -> bool {
    use cxlkv_core::layout::{LockSlot, SLOT_LOCKED};
    let zombie = {
        let m = w.model.lock().unwrap();
        m.stall.filter(|_| m.zombie)
    };
    let Some(z) = zombie else { return false };
    let l = &store.layout;
    let locked: Vec<(LockSlot, usize)> = (0..l.caps.max_nodes)
        .filter_map(|n| {
            let off = l.lock_slot(lock, n);
            let s: LockSlot = store.view.read(off).ok()?;
            (s.state == SLOT_LOCKED).then(|| (s, w.mem.provenance((off / 64) as usize).0 as usize))
        })
        .collect();
    let newest = locked.iter().map(|(s, _)| s.reserved[0]).max().unwrap_or(0);
    let current = locked.iter().filter(|(s, by)| !(*by == z && s.reserved[0] < newest)).count();
    current <= 1
}

/// Runs `check` on host `h`'s view; every finding is a violation.
pub(crate) fn check_from<C: Coherence>(w: &World, store: &Store<C>, h: usize, when: &str) {
    let mut findings = Vec::new();
    let mut scratch = vec![0u64; cxlkv_core::check::scratch_words(store)];
    if let Err(e) = cxlkv_core::check::check(store, &mut scratch, &mut |f| findings.push(f)) {
        w.violation(format!("host {h} check {when} failed: {e}"));
    }
    for f in findings.iter().take(5) {
        let mut more = String::new();
        if f.kind == cxlkv_core::check::FindingKind::VoidStripe {
            let line = (store.layout.stripe(f.a as u32) / 64) as usize;
            more = format!(" (line {line} last written by {:?})", w.mem.provenance(line));
        }
        w.violation(format!("host {h} check {when}: {f}{more}"));
    }
}
