//! The two-level lock (TraCT §3.3): a host-local level (the `NodeEnv`) so at most
//! one node per host contends, and a global level of one slot line per node per
//! lock, granted by a lock manager.
//!
//! Slot protocol: the node writes WAITING; the manager writes LOCKED with a
//! grant sequence number; the holder writes IDLE. The writers of a slot line
//! take turns, so no two ever write it at once. The manager runs under a
//! lease (its line's counter); any node may take over a stale lease and
//! rebuilds everything it needs from the region. A dead holder's slot is
//! reset by the manager with `repair` set: such a lock is then granted only
//! to recovery, which repairs what the lock guards.
//!
//! A ticket ([`Held`]) is the lock and its grant's sequence number. A
//! node's tickets of a lock only grow: the count lives in the lock line, and
//! whoever bumps or writes it back (the manager granting, recovery holding
//! the lock) starts from at least the largest ticket a slot shows, so even a
//! line lost with a crashed manager cannot hand a node its old ticket again.
//! That is all a ticket needs, so there is no epoch beside it: a revoked
//! holder's ticket fails because its slot is no longer LOCKED, and any later
//! grant to that slot (a new incarnation) carries a larger number.
//!
//! Zombies. A holder (or a manager) that stopped past its lease, was
//! declared dead and replaced, and then woke, runs on until it learns it is
//! fenced, and its cache writes back what it dirtied whenever it likes: no
//! check it makes can keep its stores out of memory. So the rack does not
//! trust what such a node writes, on the readers' side:
//! - The manager keeps its own copy of each lock's count, `repair` and
//!   repair floor (`LockMemo`) and takes from memory only what can be
//!   trusted there: a larger count (a recovery's ticket), a recovery's clear
//!   of `repair` (which raises the floor past the revoked grant), and, when
//!   it starts managing, the line as it finds it. A lock line written back
//!   late by a replaced manager cannot turn the count, `repair` or the
//!   floor back; the manager writes the line again from its copy.
//! - A manager that starts managing has no copy yet, and the line it finds
//!   may be such a late one. So every slot shows, in every state, the
//!   largest ticket its node was granted and the largest floor its node
//!   learnt (from a grant, or as the recovery that raised it), and every
//!   manager reset of a slot keeps both: a manager takes the largest of
//!   them from the slots it reads before it grants, and the floor a
//!   recovery raised lives on in the slots of every node granted since.
//! - Recovery raises each lock's floor to its own ticket and stamps what it
//!   rebuilt with that ticket (a stripe header carries the ticket it was
//!   written under). A grant carries the floor, so the holder knows that a
//!   guarded line stamped below the floor was written by a revoked holder
//!   after the repair: the line is void, and the holder has the structure
//!   repaired again before it uses it (see `Node::with_stripe`).
//! - A chunk record carries the ticket of the heap lock it was written
//!   under and the checksum of the chunk's maps. A record stamped below the
//!   floor, or maps that do not sum to the record's checksum (a revoked
//!   holder's map line landed over a newer one), make the chunk void: the
//!   holder neither places nor frees there, and once it holds no lock it
//!   has the chunks repaired (see `Node::repair_void_chunks`).

//!
//! Parked grants. A lock one node takes again and again (a writer's stripe
//! and heap locks) would cost a manager round trip each time. So a grant
//! says whether its holder may keep it past its release (`GRANT_PARK`: the
//! manager's last `KEEP_AFTER` + 1 grants of the lock went to this node,
//! no kept grant of it was recalled in its last `COOL_GRANTS` grants, nobody
//! else asks for it now, the grant is not a recovery's and the lock awaits
//! no repair). Such a release leaves the slot LOCKED and
//! records the grant node-locally (`NodeLocal::parked`); the node's next
//! request of the lock takes it back after reading its slot fresh (still
//! LOCKED with that ticket: not revoked) and the lock line (not recalled).
//! To everyone else a kept grant is held: the manager grants nobody else,
//! and revokes it if the node is declared dead, as any grant. When another
//! node asks, the manager writes the holder's ticket into the lock line
//! (`LINE_RECALL`); the node's background thread, polling while it keeps
//! any grant, gives a recalled one back (IDLE, as a release). A release
//! keeps nothing once the line shows the recall. Detach gives every kept
//! grant back first; the platform's background thread also gives back a
//! grant kept for 100 ms unused. The flushes made under the lock completed
//! before the grant was kept (the release's fence), so the later IDLE from
//! another thread orders nothing it has not.
//!
//! What a node read fresh or wrote under a grant stays current in its cache
//! while it holds or keeps that grant: every other writer of what the lock
//! guards needs a grant of its own, with a ticket of its own. The
//! allocator reads a chunk's record and maps from cache on that ground
//! (`alloc::FreshChunks`, keyed by lock and ticket: tickets are counted per
//! lock). A revoked holder's late write-back is not seen that way; the next
//! fresh reader finds it, as it finds one that lands just after a fresh
//! read.

mod manager;

#[cfg(test)]
pub(crate) use manager::COOL_GRANTS;
pub use manager::{LeaseConfig, LivenessProbe, Manager, StepReport, KEEP_AFTER};

use crate::coherence::{Coherence, Site};
use crate::layout::{
    LockLine, LockSlot, RequestLine, MAX_NODES, SLOT_CANCEL, SLOT_IDLE, SLOT_LOCKED, SLOT_RECOVERY, SLOT_WAITING,
};
use crate::mutant::mutant;
use crate::node::Node;
use crate::{Error, Result};

/// A held global lock. Release it with [`Node::unlock`]; dropping it without
/// releasing leaves the lock held until the node is declared dead.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a held lock must be released with Node::unlock"]
pub struct Held {
    /// Lock id.
    pub lock: u32,
    /// Grant sequence number: this grant's alone.
    pub seq: u64,
    /// The lock's repair floor as the grant carried it (0 when unknown, as
    /// in a ticket rebuilt from its sequence number alone): lines the lock
    /// guards stamped with a smaller ticket are void.
    pub floor: u64,
}

impl<C: Coherence> Node<'_, C> {
    /// Takes lock `lock`: host-local lock, then the global slot. Taking a
    /// lock fences before the request becomes visible: every flush this
    /// thread issued earlier has reached memory before the grant (callers
    /// rely on this to order, e.g., a payload before its READY entry).
    pub fn lock(&self, lock: u32) -> Result<Held> {
        self.lock_with(lock, 0, false)
    }

    /// Takes lock `lock` as recovery (granted even while the lock awaits repair).
    pub fn lock_recovery(&self, lock: u32) -> Result<Held> {
        self.lock_with(lock, SLOT_RECOVERY, false)
    }

    pub(crate) fn lock_with(&self, lock: u32, flags: u32, nested: bool) -> Result<Held> {
        let l = &self.store.layout;
        if lock >= l.n_locks {
            return Err(Error::InvalidArgument);
        }
        let mut i = 0u32;
        let t0 = self.env.now_ns();
        loop {
            match self.try_request(lock, flags, &mut i)? {
                Some(held) => {
                    let waited = self.env.now_ns().saturating_sub(t0);
                    self.local.beat_counters.add(|c| {
                        c.lock_grants = c.lock_grants.wrapping_add(1);
                        c.lock_wait_ns = c.lock_wait_ns.wrapping_add(waited);
                    });
                    return Ok(held);
                }
                None if nested => return Err(Error::Recovering),
                None => {
                    // The lock awaits repair after a revocation; only recovery
                    // is granted it. Step aside, host-local lock included (a
                    // recovery on this host may need it), until it is repaired.
                    loop {
                        let ll: LockLine = self.store.fresh(l.lock_line(lock), Site("lock.repair.poll"))?;
                        if ll.repair == 0 {
                            break;
                        }
                        self.env.wait(i)?;
                        i = i.wrapping_add(1);
                    }
                }
            }
        }
    }

    /// One request for `lock`: `Some` when granted, `None` when withdrawn
    /// because the lock awaits repair (and this is not recovery).
    fn try_request(&self, lock: u32, flags: u32, i: &mut u32) -> Result<Option<Held>> {
        let l = &self.store.layout;
        self.env.local_lock(lock)?;
        let slot_off = l.lock_slot(lock, self.id);
        match self.relock(lock, flags, slot_off) {
            // Held as a grant is: the host-local lock stays taken.
            Ok(Some(held)) => return Ok(Some(held)),
            Ok(None) => {}
            Err(e) => {
                self.env.local_unlock(lock);
                return Err(e);
            }
        }
        // Every state of the slot shows the largest ticket this node holds
        // or held (see `Manager::step_lock`).
        let req = self.slot(lock, SLOT_WAITING, flags);
        // SYNC: no flush: the first poll below invalidates this slot, which
        // writes the WAITING request back (reader: the manager's scan).
        if let Err(e) = self.store.write_state_last(slot_off, &req) {
            self.env.local_unlock(lock);
            return Err(e);
        }
        if let Err(e) = self.bell(lock, true) {
            self.env.local_unlock(lock);
            return Err(e);
        }
        let withdraw = |e: Option<Error>| {
            // A fenced node does not wait for an answer: the manager drops a
            // dead node's requests itself.
            let r = if e == Some(Error::Revoked) { Ok(()) } else { self.cancel(lock, flags, slot_off) };
            self.env.local_unlock(lock);
            match (e, r) {
                // Learnt while withdrawing: fencing outranks a deadline.
                (_, Err(Error::Revoked)) => Err(Error::Revoked),
                (Some(e), _) | (None, Err(e)) => Err(e),
                (None, Ok(())) => Ok(None),
            }
        };
        loop {
            // SYNC: fresh slot each poll (writer: manager grant).
            let s: LockSlot = match self.store.fresh_state_first(slot_off, Site("lock.poll")) {
                Ok(s) => s,
                Err(e) => return withdraw(Some(e)),
            };
            if s.state == SLOT_LOCKED {
                match self.grant_is_current(&s) {
                    Ok(true) => {
                        self.local.tickets.hold(lock, s.seq);
                        self.local.tickets.saw_floor(lock, s.reserved[GRANT_FLOOR]);
                        let _ = self.bell(lock, false);
                        return Ok(Some(Held { lock, seq: s.seq, floor: s.reserved[GRANT_FLOOR] }));
                    }
                    Ok(false) => {
                        // A grant by a manager that a newer claimant has
                        // replaced (stopped mid-step, it granted from what it
                        // read before the newer claim): the newer manager
                        // may have granted the lock elsewhere. Ask again;
                        // the current manager answers.
                        // SYNC: no flush: the next poll invalidates this slot,
                        // which writes the request back (reader: the manager's
                        // scan; the bell still rings).
                        if let Err(e) = self.store.write_state_last(slot_off, &req) {
                            return withdraw(Some(e));
                        }
                    }
                    Err(e) => return withdraw(Some(e)),
                }
            }
            if s.state == SLOT_IDLE {
                // The manager reset our request: we were declared dead.
                let _ = self.bell(lock, false);
                self.env.local_unlock(lock);
                return Err(Error::Revoked);
            }
            // A node declared dead or freed meanwhile (stopped past its
            // lease, woken) learns it here even when no heartbeat tells it
            // and no live node runs a manager to drop its request.
            if *i % 64 == 63 && !mutant!("lock.wait_ignores_fencing") {
                if let Err(e) = self.owns_slot() {
                    return withdraw(Some(e));
                }
            }
            if flags & SLOT_RECOVERY == 0 && *i % 16 == 15 {
                let ll: LockLine = match self.store.fresh(l.lock_line(lock), Site("lock.repair.check")) {
                    Ok(x) => x,
                    Err(e) => return withdraw(Some(e)),
                };
                if ll.repair != 0 {
                    return withdraw(None);
                }
            }
            if let Err(e) = self.env.wait(*i) {
                return withdraw(Some(e));
            }
            *i = i.wrapping_add(1);
        }
    }

    /// Whether grant `s` (LOCKED) comes from the current manager: no node's
    /// claim word in memory is larger than the claim the grant carries.
    ///
    /// A manager stopped in the middle of a step (after it read the slots,
    /// before it wrote the grant) can wake after a newer claimant settled
    /// and granted the lock elsewhere; its grant then lands late. The newer
    /// claimant published its claim and fenced before its settle, and reads
    /// every slot after it: so either this read (after the LOCKED one) sees
    /// the newer claim, or the LOCKED slot was in memory before that claim
    /// and the newer manager's scan finds this node holding the lock.
    pub(crate) fn grant_is_current(&self, s: &LockSlot) -> Result<bool> {
        let l = &self.store.layout;
        let nn = l.caps.max_nodes.min(MAX_NODES);
        let mut lines = [0u64; MAX_NODES as usize];
        for (n, x) in lines.iter_mut().enumerate().take(nn as usize) {
            *x = l.requests(n as u32);
        }
        // SYNC: every node's claim word fresh, read after the grant was
        // (writers: managers claiming the role).
        let lines = lines.get(..nn as usize).unwrap_or(&[]);
        self.store.co.invalidate_lines(&self.store.view, lines, Site("lock.grant.claims"))?;
        let stamp = s.reserved[GRANT_CLAIM];
        for &off in lines {
            let claim = self.store.view.load_u64(off.wrapping_add(CLAIM_AT))?;
            if claim > stamp && !mutant!("lock.accept_stale_grant") {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Withdraws this node's WAITING request for `lock`: writes CANCEL into
    /// the slot and waits for the manager's answer there: IDLE (dropped), or
    /// LOCKED (a grant that landed after the CANCEL, or that the CANCEL
    /// overwrote and the manager then answered): given back here, which is a
    /// release. Either way no grant is left in flight to strand the lock with
    /// this node. Only this withdrawal writes a slot while the request is
    /// the manager's to answer; whichever write lands last, the poll below
    /// sees an answer the manager will not change.
    fn cancel(&self, lock: u32, flags: u32, slot_off: u64) -> Result<()> {
        let c = self.slot(lock, SLOT_CANCEL, flags);
        // SYNC: no flush: the first poll below invalidates this slot, which
        // writes CANCEL back (reader: the manager's scan; the bell still
        // rings).
        self.store.write_state_last(slot_off, &c)?;
        let mut j = 0u32;
        let answer = loop {
            // SYNC: fresh slot each poll (writer: the manager's answer).
            let s: LockSlot = match self.store.fresh_state_first(slot_off, Site("lock.withdraw.poll")) {
                Ok(s) => s,
                Err(e) => break Err(e),
            };
            if s.state == SLOT_LOCKED && mutant!("lock.withdraw_keeps_grant") {
                break Ok(());
            }
            if s.state == SLOT_LOCKED {
                self.local.tickets.saw(lock, s.seq);
                self.local.tickets.saw_floor(lock, s.reserved[GRANT_FLOOR]);
                let idle = self.slot(lock, SLOT_IDLE, 0);
                // SYNC: the release reaches memory before we give up the
                // lock (left dirty, it could land over a later grant); the
                // doorbell's fence below completes it.
                break self.store.publish_state_last(slot_off, &idle, Site("lock.withdraw"));
            }
            if s.state == SLOT_IDLE {
                break Ok(());
            }
            // A manager answers within a lease (another takes over a dead
            // one); only fencing ends the wait early, and the environment's
            // watchdog when no manager answers at all (a grant that raced
            // the CANCEL then stays with this node's slot until its next
            // request of the lock, or its death).
            if self.env.wait(j) == Err(Error::Revoked) {
                break Err(Error::Revoked);
            }
            // Fencing is learnt here too, not only from the environment (whose
            // heartbeat thread may be gone): a node declared dead or freed
            // gets no answer once no live node runs a manager.
            if j % 16 == 15 && !mutant!("lock.withdraw_ignores_fencing") {
                if let Err(e) = self.owns_slot() {
                    break Err(e);
                }
            }
            if self.env.withdrawal_expired(j) {
                break Err(Error::Timeout);
            }
            j = j.wrapping_add(1);
        };
        let quiet = self.bell(lock, false);
        answer.and(quiet)
    }

    /// Sets or clears this node's request bit for `lock` and publishes the
    /// request line (reader: the manager's doorbell scan).
    fn bell(&self, lock: u32, on: bool) -> Result<()> {
        let off = self.store.layout.requests(self.id).saturating_add(((lock / 64) as u64).saturating_mul(8));
        let bit = 1u64 << (lock % 64);
        if on {
            self.store.view.fetch_or_u64(off, bit)?;
        } else {
            self.store.view.fetch_and_u64(off, !bit)?;
        }
        self.store.co.flush(&self.store.view, off, 8, Site("lock.doorbell"))?;
        // SYNC: the doorbell (and the request slot flushed before it) reach
        // memory now, not whenever the write-back completes (reader: the
        // manager's doorbell scan).
        self.store.co.store_fence(Site("lock.doorbell.fence"));
        Ok(())
    }

    /// Releases a held lock. Everything written under it must already be
    /// flushed; the fence here orders those flushes before the release.
    ///
    /// A ticket that is not the slot's current grant changes nothing in the
    /// region and fails with `Revoked`: the grant was revoked (this node was
    /// declared dead; the host-local locks is given back), or the ticket is an
    /// old one of a lock held again since (the current grant stays held).
    pub fn unlock(&self, held: Held) -> Result<()> {
        let l = &self.store.layout;
        if held.lock >= l.n_locks {
            return Err(Error::InvalidArgument);
        }
        let slot_off = l.lock_slot(held.lock, self.id);
        // SYNC: every flush made under the lock completes before IDLE is seen.
        self.store.co.store_fence(Site("lock.release.fence"));
        let mine: LockSlot = self.store.fresh_state_first(slot_off, Site("lock.release.check"))?;
        if mine.state == SLOT_LOCKED && mine.seq > held.seq && !mutant!("unlock.stale_ticket") {
            // A stale ticket: the slot carries a later grant, which whoever
            // holds it releases with its own ticket.
            return Err(Error::Revoked);
        }
        if mine.state == SLOT_LOCKED && mine.seq < held.seq {
            // A grant older than ours, landed over it late: a replaced
            // manager's write-back (this node's tickets only grow, so no
            // grant after ours carries less). Ours stands while this node
            // still owns its slot: nobody else writes the slot then (the
            // manager waits for our release; this thread's host-local hold
            // keeps the node's other threads out), so the release below is
            // ours to write. A fenced node's slot is not: revoked.
            let owned = if mutant!("unlock.late_grant_revokes") { Err(Error::Revoked) } else { self.owns_slot() };
            if let Err(e) = owned {
                self.local.tickets.let_go(held.lock, held.seq);
                self.env.local_unlock(held.lock);
                return Err(e);
            }
        }
        if mine.state != SLOT_LOCKED {
            // Revoked (the manager reset the slot), or released already. The
            // slot is not ours to write: a request of another thread of this
            // node, or of the slot's next owner, may be in it. Only this
            // thread's host-local hold, if any, goes.
            self.local.tickets.let_go(held.lock, held.seq);
            self.env.local_unlock(held.lock);
            return Err(Error::Revoked);
        }
        // A recall this host's cache shows (a manager of this host wrote
        // it) is heeded here; one from another host's manager is the
        // background thread's to find (its poll reads the line fresh).
        let recalled = || {
            let ll: Result<LockLine> = self.store.view.read(l.lock_line(held.lock));
            ll.map(|ll| ll.reserved[LINE_RECALL] == held.seq)
        };
        if mine.state == SLOT_LOCKED
            && mine.seq == held.seq
            && mine.reserved[GRANT_PARK] != 0
            && self.env.keeps_grants()
            && !recalled()?
        {
            // Kept for this node's next request of the lock (see "Parked
            // grants"): the slot stays LOCKED. Recorded before the
            // host-local lock goes, so the next thread of this process to
            // take it finds the grant.
            self.local.tickets.saw_floor(held.lock, held.floor);
            self.local.tickets.let_go(held.lock, held.seq);
            self.local.parked.lock().put(held.lock, held.seq, held.floor, self.env.now_ns());
            self.env.local_unlock(held.lock);
            return Ok(());
        }
        // SYNC(release-landed): a manager of this host may see this IDLE in
        // the shared cache before it lands; it writes the line back itself
        // before its next grant of the lock.
        // The IDLE slot carries the floor the holder knows: a recovery's
        // release tells the manager the floor it raised even when a late
        // lock line of a replaced manager hides it in the line.
        self.local.tickets.saw(held.lock, held.seq);
        self.local.tickets.saw_floor(held.lock, held.floor);
        self.local.tickets.let_go(held.lock, held.seq);
        let idle = self.slot(held.lock, SLOT_IDLE, 0);
        let r = self.store.publish_state_last(slot_off, &idle, Site("lock.release"));
        self.store.co.store_fence(Site("lock.release.done"));
        self.env.local_unlock(held.lock);
        r
    }

    /// Gives back every grant this node's slots show that none of its
    /// threads holds or waits for: a replaced manager, stopped mid-step,
    /// woke and granted a lock to this node from what it had read before
    /// (a request since withdrawn or served), and its line and grant landed
    /// in memory after the newer manager's. That manager then takes this
    /// node for the holder, and the lock waits for a release nobody would
    /// make (seed 116066: two recoveries each waiting for a lock the other
    /// had, one of them held by such a grant). Called from the background
    /// thread, a lease's fraction apart. Only locks whose host-local lock
    /// is free are looked at (taken without waiting): a thread of this host
    /// that waits for a lock or holds it keeps that lock's host-local lock
    /// all along. Returns how many grants went back.
    pub fn give_back_strays(&self) -> Result<u32> {
        let l = &self.store.layout;
        self.owns_slot()?;
        let mut n = 0u32;
        for lock in 0..l.n_locks {
            if !self.env.try_local_lock(lock) {
                continue;
            }
            let r = self.give_back_stray(lock);
            self.env.local_unlock(lock);
            n = n.saturating_add(u32::from(r?));
        }
        Ok(n)
    }

    /// [`Node::give_back_strays`] for one lock, its host-local lock held.
    fn give_back_stray(&self, lock: u32) -> Result<bool> {
        if self.local.parked.lock().get(lock).is_some() {
            // Kept on purpose: not a stray (`release_parks` gives it back;
            // giving it back here would be safe too, only sooner).
            return Ok(false);
        }
        let slot_off = self.store.layout.lock_slot(lock, self.id);
        // SYNC: this node's slot fresh (writer: a manager's grant, which
        // may be a replaced one's, landed late).
        let s: LockSlot = self.store.fresh_state_first(slot_off, Site("lock.stray.read"))?;
        let held = self.local.tickets.holds(lock) && !mutant!("stray.ignores_holders");
        if s.state != SLOT_LOCKED || held || mutant!("stray.kept") {
            return Ok(false);
        }
        // Released as a holder releases (the slot keeps the largest ticket
        // and floor seen: the manager's count goes past the stray grant).
        self.local.tickets.saw(lock, s.seq);
        self.local.tickets.saw_floor(lock, s.reserved[GRANT_FLOOR]);
        let idle = self.slot(lock, SLOT_IDLE, 0);
        // SYNC: the release reaches memory (reader: the manager's scan).
        self.store.publish_state_last(slot_off, &idle, Site("lock.stray.release"))?;
        self.store.co.store_fence(Site("lock.stray.fence"));
        Ok(true)
    }

    /// Gives back the grants this node keeps past their release (see
    /// "Parked grants"): those the manager recalls (another node asks for
    /// the lock), and those kept before time `before` (the environment's
    /// clock, `NodeEnv::now_ns`; `u64::MAX`: every one, before detaching).
    /// Called from the background thread while the node keeps any. Returns
    /// how many went back.
    ///
    /// No host-local lock is taken: a node of another process of this host
    /// may hold it while it waits for this very grant. A thread of this
    /// process that asks for the lock meanwhile waits in `relock` until the
    /// release is done, so its request cannot meet the IDLE in the slot.
    pub fn release_parks(&self, before: u64) -> Result<u32> {
        let mut n = 0u32;
        let mut lock = 0u32;
        while lock < self.store.layout.n_locks && self.keeps_grants() {
            let kept = self.local.parked.lock().get(lock).filter(|k| !k.releasing);
            if let Some(k) = kept {
                let due = k.when < before || self.recalled(lock, k.seq, Site("lock.park.poll"))?;
                if due && self.local.parked.lock().mark_releasing(lock, k.seq) {
                    let r = self.release_kept(lock, k.seq);
                    self.local.parked.lock().take(lock);
                    r?;
                    n = n.saturating_add(1);
                }
            }
            lock = lock.wrapping_add(1);
        }
        Ok(n)
    }

    /// True when this node keeps any grant past its release.
    pub fn keeps_grants(&self) -> bool {
        self.local.parked.lock().n > 0
    }

    /// Takes back the grant of `lock` this node kept at its last release,
    /// if it still stands: its slot (fresh) LOCKED with that ticket, and
    /// the lock line not recalling it. A recalled one (or any, asked for by
    /// recovery, whose grants carry its flag) is given back here. `None`:
    /// ask the manager. Its caller holds the host-local lock.
    fn relock(&self, lock: u32, flags: u32, slot_off: u64) -> Result<Option<Held>> {
        let mut i = 0u32;
        let k = loop {
            let mut parked = self.local.parked.lock();
            match parked.get(lock) {
                None => return Ok(None),
                Some(k) if !k.releasing => {
                    // Taken out: this thread owns the grant now.
                    parked.take(lock);
                    break k;
                }
                // The background thread is giving it back: its IDLE must
                // land before this thread's request.
                Some(_) => {}
            }
            drop(parked);
            self.env.wait(i)?;
            i = i.wrapping_add(1);
        };
        // SYNC: this node's slot fresh (writer: a manager revoking the grant,
        // this node declared dead meanwhile), and the lock line with it for
        // the recall below (one ordering for both).
        let line = self.store.layout.lock_line(lock);
        self.store.co.invalidate_lines(&self.store.view, &[slot_off, line], Site("lock.relock.slot"))?;
        let s: LockSlot = self.store.state_first_invalidated(slot_off)?;
        if (s.state != SLOT_LOCKED || s.seq != k.seq) && !mutant!("relock.trusts_parked") {
            // Revoked (reset IDLE) or overwritten: not this node's any more.
            // The request that follows finds out which.
            return Ok(None);
        }
        // A recall from another host's manager is seen here (the line was
        // dropped with the slot's), or by the background thread's poll,
        // which gives the grant back once it is kept again: the outcome is
        // the same.
        let ll: LockLine = self.store.view.read(line)?;
        if flags & SLOT_RECOVERY == 0 && !recall_names(&ll, k.seq) {
            self.local.tickets.hold(lock, k.seq);
            return Ok(Some(Held { lock, seq: k.seq, floor: k.floor }));
        }
        self.release_kept(lock, k.seq)?;
        Ok(None)
    }

    /// Whether the manager recalls grant `seq` of `lock` (its line, read
    /// fresh, names the ticket).
    fn recalled(&self, lock: u32, seq: u64, site: Site) -> Result<bool> {
        // SYNC: the lock line fresh (writer: the manager, recalling a kept
        // grant another node asks for).
        let ll: LockLine = self.store.fresh(self.store.layout.lock_line(lock), site)?;
        Ok(recall_names(&ll, seq))
    }

    /// Gives back kept grant `seq` of `lock`, which the calling thread took
    /// out of `parked` (or marked releasing), as a release: IDLE, when the
    /// slot, read fresh, still shows it LOCKED.
    fn release_kept(&self, lock: u32, seq: u64) -> Result<()> {
        let slot_off = self.store.layout.lock_slot(lock, self.id);
        // SYNC: this node's slot fresh (writer: a manager revoking the grant).
        let s: LockSlot = self.store.fresh_state_first(slot_off, Site("lock.park.check"))?;
        if s.state != SLOT_LOCKED || s.seq != seq {
            return Ok(());
        }
        self.local.tickets.saw(lock, seq);
        let idle = self.slot(lock, SLOT_IDLE, 0);
        // SYNC: the release reaches memory (reader: the manager's scan, which
        // grants the waiter it recalled the grant for).
        self.store.publish_state_last(slot_off, &idle, Site("lock.park.release"))?;
        self.store.co.store_fence(Site("lock.park.release.fence"));
        Ok(())
    }

    /// Runs `f` holding lock `lock`, releasing it afterwards whatever `f`
    /// returns. The release fence orders `f`'s flushes before the release. Fails
    /// with `Revoked` when the lock was revoked meanwhile, whatever `f` returned.
    pub fn with_lock<T>(&self, lock: u32, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.with_lock_mode(lock, false, f)
    }

    /// [`Node::with_lock`], or with `nested` for a lock taken while another
    /// is held: if it awaits repair, fails at once with `Recovering` instead
    /// of waiting, because the recovery that would repair it may need the
    /// lock already held (waiting there deadlocks against recovery).
    pub(crate) fn with_lock_mode<T>(&self, lock: u32, nested: bool, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.with_held(lock, nested, |_| f())
    }

    /// [`Node::with_lock_mode`] whose `f` is shown the grant it runs under.
    /// An outermost lock (`!nested`) released, the chunks found void under
    /// it are repaired (see [`Node::repair_void_chunks`]).
    pub(crate) fn with_held<T>(&self, lock: u32, nested: bool, f: impl FnOnce(&Held) -> Result<T>) -> Result<T> {
        let held = self.lock_with(lock, 0, nested)?;
        let r = f(&held);
        let u = self.unlock(held);
        if !nested {
            self.repair_void_chunks();
        }
        // A revoked lock outranks what ran under it: recovery may have
        // rebuilt the structure meanwhile, so neither its result nor its
        // error can be trusted.
        match u {
            Err(Error::Revoked) => Err(Error::Revoked),
            u => {
                let v = r?;
                u?;
                Ok(v)
            }
        }
    }
}

// A doorbell step loads the request bitmap word by word from the line's start.
const _: () = assert!(core::mem::offset_of!(RequestLine, want) == 0);

/// The coherence sites of one journal (see [`Node::journal_then_check`]).
pub(crate) struct JournalSites {
    /// The journal word's write-back.
    pub write: Site,
    /// Its fence (in memory before the check).
    pub fence: Site,
    /// The fresh read of the node's own slot.
    pub check: Site,
    /// The fence that lands what the journal vouches for before it clears.
    pub landed: Site,
    /// The clear's write-back.
    pub clear: Site,
}

impl<C: Coherence> Node<'_, C> {
    /// Journals `word` at `at` in this node's request line, in memory
    /// before this node checks, fresh, that it still holds `held`:
    /// `Revoked`, and nothing to write, when it does not (`unchecked`: the
    /// caller's logic mutant skips the check). What it writes next under
    /// the lock, a recovery that revoked the lock after the check finds
    /// named in the journal: so a write that lands late (the node stopped,
    /// declared dead, woken) lands only where that recovery held the place
    /// for it. Zombies of a lock whose lines carry no ticket (free chunk
    /// records, root records) are fenced so.
    pub(crate) fn journal_then_check(
        &self,
        at: u64,
        word: u64,
        held: &Held,
        sites: &JournalSites,
        unchecked: bool,
    ) -> Result<()> {
        let l = &self.store.layout;
        let journal = l.requests(self.id).wrapping_add(at);
        self.store.view.store_u64(journal, word)?;
        // SYNC: the journal in memory before the check below (reader:
        // recovery, and whoever must keep off what it names).
        self.store.co.flush(&self.store.view, journal, 8, sites.write)?;
        self.store.co.store_fence(sites.fence);
        // SYNC: this node's slot fresh (writer: the manager revoking).
        let slot: LockSlot = self.store.fresh_state_first(l.lock_slot(held.lock, self.id), sites.check)?;
        if (slot.state != SLOT_LOCKED || slot.seq != held.seq) && !unchecked {
            return Err(Error::Revoked);
        }
        Ok(())
    }

    /// Clears the journal word at `at` once what it vouched for is in
    /// memory (the fence first: a clear landing before the lines it
    /// names would leave them unnamed while still in flight).
    pub(crate) fn clear_journal(&self, at: u64, sites: &JournalSites) -> Result<()> {
        self.store.co.store_fence(sites.landed);
        let journal = self.store.layout.requests(self.id).wrapping_add(at);
        self.store.view.store_u64(journal, 0)?;
        // SYNC: the clear reaches memory before the lock goes (its release
        // fences first). (Left in memory, a journal would only keep others
        // off what it names.)
        self.store.co.flush(&self.store.view, journal, 8, sites.clear)
    }
}

impl<C: Coherence> Node<'_, C> {
    /// This node's slot of `lock` in `state`: it shows the largest ticket
    /// of the lock this node was granted and the largest floor it learnt
    /// (see "Zombies" above).
    fn slot(&self, lock: u32, state: u32, flags: u32) -> LockSlot {
        let mut s = LockSlot { state, flags, seq: self.local.tickets.get(lock), ..LockSlot::default() };
        if !mutant!("lock.slot_drops_floor") {
            s.reserved[GRANT_FLOOR] = self.local.tickets.floor(lock);
        }
        s
    }
}

/// A reset of slot `s` to IDLE (a manager's, or an attaching node's): it
/// keeps the ticket and the floor the slot shows (see "Zombies" above).
pub(crate) fn reset_slot(s: &LockSlot) -> LockSlot {
    let mut idle = LockSlot { seq: s.seq, ..LockSlot::default() };
    idle.reserved[GRANT_FLOOR] = s.reserved[GRANT_FLOOR];
    idle
}

/// Where a node's manager claim lies in its request line (`reserved[0]`).
pub(super) const CLAIM_AT: u64 = core::mem::offset_of!(RequestLine, reserved) as u64;

/// Where a grant carries its manager's claim word (`LockSlot::reserved`).
pub const GRANT_CLAIM: usize = 0;

/// Where a grant carries the lock's repair floor (`LockSlot::reserved`).
pub const GRANT_FLOOR: usize = 1;

/// Where a grant says the lock awaits repair (`LockSlot::reserved`; 1:
/// revoked from a holder declared dead, only recovery is granted it).
pub(crate) const GRANT_REPAIR: usize = 2;

/// Where a grant says its holder may keep it past its release
/// (`LockSlot::reserved`; 1: may; see "Parked grants" above).
pub(crate) const GRANT_PARK: usize = 3;

/// Where a lock line carries the ticket its manager recalls
/// (`LockLine::reserved`): a grant kept past its release with that ticket
/// goes back (another node asks for the lock).
pub const LINE_RECALL: usize = 0;

/// Whether lock line `ll` recalls kept grant `seq`.
fn recall_names(ll: &LockLine, seq: u64) -> bool {
    ll.reserved[LINE_RECALL] == seq && !mutant!("park.ignores_recall")
}
