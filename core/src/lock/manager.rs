//! The lock manager: the node holding the manager lease steps it, granting
//! waiting requests slot by slot, declaring silent nodes dead and revoking
//! their locks for recovery; claims and renewals of the role.

use crate::coherence::{Coherence, Site};
use crate::layout::{
    Heartbeat, LockLine, LockSlot, ManagerLine, NodeInfo, MAX_LOCKS, MAX_NODES, NODE_ALIVE, NODE_DEAD, NODE_FENCED,
    NODE_FREE, SLOT_CANCEL, SLOT_IDLE, SLOT_LOCKED, SLOT_RECOVERY, SLOT_WAITING,
};
use crate::mutant::mutant;
use crate::store::Store;
use crate::Result;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::{CLAIM_AT, GRANT_CLAIM, GRANT_FLOOR, GRANT_PARK, GRANT_REPAIR, LINE_RECALL};

mod claim;

/// Liveness verdict from the platform for a node it can check directly (a
/// process of this host and PID namespace): `Some(false)` = certainly dead,
/// declared so at once. Anything else leaves the verdict to the heartbeat:
/// a node silent past the lease is dead even if its process exists.
pub type LivenessProbe<'a> = &'a dyn Fn(u32, &NodeInfo) -> Option<bool>;

/// Timing of the manager, in the caller's ticks (e.g. milliseconds).
#[derive(Clone, Copy, Debug)]
pub struct LeaseConfig {
    /// A heartbeat or manager lease that does not move for this long is dead.
    pub lease: u64,
    /// After claiming the manager role, wait this long before granting, so a
    /// racing claimant sees it lost.
    pub settle: u64,
    /// A node fenced this long (declared dead and recovered, not known
    /// quiet: see [`crate::layout::Heartbeat::quiet`]) is taken as quiet,
    /// and the recovery that frees its slot and blocks is called for. 0:
    /// never; only the node's own word, its host's or an operator's frees
    /// it. Past this bound, a stopped node that wakes may corrupt blocks
    /// reused meanwhile; below it, a node that never comes back (a killed
    /// container whose PID namespace no other node shares, a host that
    /// failed) holds its slot and blocks.
    pub quarantine: u64,
}

/// What one manager step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// This node is the active manager.
    pub active: bool,
    /// Grants made.
    pub grants: u32,
    /// Nodes newly declared dead (bit mask).
    pub newly_dead: u64,
    /// Nodes declared dead whose recovery is pending (bit mask).
    pub dead: u64,
    /// Of `newly_dead`, those declared dead by silence while the liveness
    /// probe found their process running (stopped, frozen, or starved of
    /// CPU past the lease): a false death unless stopped on purpose.
    pub running_dead: u64,
    /// Locks revoked.
    pub revoked: u32,
    /// When the liveness scan that `dead` comes from ran (the caller's
    /// ticks): a recovery that ended later has already seen those nodes.
    pub scanned_at: u64,
    /// Fenced nodes this step took as quiet, their quarantine over (see
    /// [`LeaseConfig::quarantine`]).
    pub quarantine_ended: u64,
}

/// The lock manager's state. Driven by [`Manager::step`] from a platform
/// thread (or the simulator's scheduler), one step at a time.
///
/// Plain data of fixed layout, every bit pattern valid: the platform keeps
/// it in a host-local shared file, so that any process of the manager's
/// host can step it (under a host-local lock). Nothing in it is trusted as
/// an index: every table is read and written through bounds checks.
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Manager {
    me: u32,
    seen_manager: u32,
    /// Non-zero once the first step ran.
    started: u32,
    /// Non-zero: scan every slot of every lock next step (after start or
    /// takeover).
    full_scan: u32,
    /// When this node's current claim was made ([`UNCLAIMED`]: none).
    claimed_at: u64,
    /// This node's claim word as published in its request line (0: none).
    /// Only the node holding the largest claim of those it reads grants.
    claim: u64,
    /// The largest claim epoch read in another node's line: a new claim
    /// goes above it (a dead node's claim must not outrank every later one).
    epoch_seen: u64,
    seen_lease: u64,
    lease_moved_at: u64,
    /// Per node: the heartbeat as last seen, with the incarnation of the
    /// node it belonged to (a new incarnation restarts the silence clock).
    beat: [[u64; 2]; MAX_NODES as usize],
    beat_moved_at: [u64; MAX_NODES as usize],
    /// Per node: since when (this manager's ticks) it has seen the node
    /// fenced, with the incarnation it saw fenced.
    fenced_since: [[u64; 2]; MAX_NODES as usize],
    /// Locks this manager believes held (granted and not seen released).
    held: [u64; 4],
    /// Per lock: node id + 1 of the last holder this manager saw (0 none).
    last_holder: [u32; MAX_LOCKS as usize],
    /// Per lock: the grant sequence this manager saw released (no slot
    /// LOCKED), `u64::MAX` when unknown: while the line's count still
    /// equals it, the last grant's holder needs no reading.
    released: [u64; MAX_LOCKS as usize],
    /// Per lock: what this manager knows of its line (see `LockMemo`).
    memo: [LockMemo; MAX_LOCKS as usize],
    /// When the last full step was.
    full_at: u64,
    steps: u64,
    liveness_at: u64,
    /// Nodes ALIVE at the last liveness scan.
    alive: u64,
    /// Nodes not FREE at the last liveness scan: whose doorbells a step
    /// reads (all nodes' in a full step).
    listed: u64,
}

/// The claim time of a manager with no claim.
const UNCLAIMED: u64 = u64::MAX;

// The layout platform's host-local file holds: four u32, ten u64, per node
// 40 bytes (beat, beat_moved_at, fenced_since), `held`, per lock 44 bytes
// (last_holder, released, memo). No padding anywhere (`IntoBytes`).
const _: () = assert!(core::mem::size_of::<LockMemo>() == 32);
const _: () =
    assert!(core::mem::size_of::<Manager>() == 16 + 10 * 8 + 40 * MAX_NODES as usize + 32 + 44 * MAX_LOCKS as usize);
const _: () = assert!(core::mem::size_of::<Manager>() == 13_952 && core::mem::align_of::<Manager>() == 8);

/// A manager's own copy of a lock line's count, `repair` and floor: the
/// line in memory may be a late write-back of a replaced manager (a zombie),
/// so the manager never takes a smaller count or floor from it, nor a
/// `repair` cleared by anyone but a recovery (whose clear raises the floor
/// to its ticket, past the revoked grant).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct LockMemo {
    /// The largest grant sequence written or read.
    seq: u64,
    /// The largest repair floor read.
    floor: u64,
    /// The grant this manager revoked (or found awaiting repair), until a
    /// recovery's floor reaches it; 0 none.
    revoked: u64,
    /// Non-zero once the line was read since this manager's claim: until
    /// then, memory's `repair` is taken as it is (another manager may have
    /// revoked).
    known: u32,
    /// Grants in a row this manager made to the lock's last grantee, less
    /// one (see "Parked grants" in `lock.rs`).
    streak: u16,
    /// Grants to come that no holder may keep: a recall of a kept grant
    /// showed the lock is wanted by several nodes.
    cool: u16,
}

/// Grants in a row to one node (less one) before one may be kept past its
/// release: a lock that changes hands is never kept, and a recall costs
/// the next node a wake of the holder's background thread.
pub const KEEP_AFTER: u16 = 15;

/// Grants after a recall that no holder may keep.
pub(crate) const COOL_GRANTS: u16 = 1024;

impl LockMemo {
    /// Folds line `ll` as read from memory into the memo and `ll` into what
    /// the memo says. True when the line in memory differs from that.
    fn merge(&mut self, ll: &mut LockLine) -> bool {
        let read = *ll;
        if self.known == 0 {
            self.known = 1;
            if ll.repair != 0 {
                self.revoked = self.revoked.max(ll.grant_seq).max(1);
            }
        }
        self.seq = self.seq.max(ll.grant_seq);
        self.floor = self.floor.max(ll.floor);
        if mutant!("mgr.trust_line_repair") {
            self.revoked = if ll.repair != 0 { self.revoked.max(1) } else { 0 };
        } else if self.revoked != 0 && self.floor >= self.revoked {
            // A recovery repaired it: its ticket (the floor, from the line or
            // its released slot) is past the revoked grant. A late line from
            // before the revocation, `repair` clear or not, has a smaller
            // floor and changes nothing.
            self.revoked = 0;
        }
        ll.grant_seq = self.seq;
        ll.floor = self.floor;
        ll.repair = u32::from(self.revoked != 0);
        *ll != read
    }
}

/// What one manager step learned before it walks the locks.
struct StepCx {
    /// A full step: every node's doorbells and slots, every lock.
    full: bool,
    /// Every node slot of the region.
    all: u64,
    /// The nodes whose doorbells this step read.
    ringers: u64,
    /// Nodes dead at the last liveness scan.
    dead: u64,
    /// Each node's doorbells as this step read them.
    bells: [[u64; 4]; MAX_NODES as usize],
    /// The largest manager claim of another node this step read.
    rival: u64,
}

impl Manager {
    /// Manager state for node `me`.
    pub fn new(me: u32) -> Manager {
        Manager {
            me,
            seen_manager: u32::MAX,
            started: 0,
            full_scan: 1,
            claimed_at: UNCLAIMED,
            claim: 0,
            epoch_seen: 0,
            seen_lease: 0,
            lease_moved_at: 0,
            beat: [[0; 2]; MAX_NODES as usize],
            beat_moved_at: [0; MAX_NODES as usize],
            fenced_since: [[0; 2]; MAX_NODES as usize],
            held: [0; 4],
            last_holder: [0; MAX_LOCKS as usize],
            released: [u64::MAX; MAX_LOCKS as usize],
            memo: [LockMemo::default(); MAX_LOCKS as usize],
            full_at: 0,
            steps: 0,
            liveness_at: u64::MAX,
            alive: 0,
            listed: 0,
        }
    }

    /// The node whose manager this is.
    pub fn node(&self) -> u32 {
        self.me
    }

    /// One manager step at time `now`: renew or contest the lease, watch
    /// heartbeats, revoke dead holders, grant waiting requests round-robin.
    pub fn step<C: Coherence>(
        &mut self,
        store: &Store<C>,
        now: u64,
        cfg: LeaseConfig,
        probe: LivenessProbe<'_>,
    ) -> Result<StepReport> {
        let l = &store.layout;
        let mut rep = StepReport::default();
        if self.started == 0 {
            self.started = 1;
            self.lease_moved_at = now;
            for t in self.beat_moved_at.iter_mut() {
                *t = now;
            }
        }
        let moff = l.manager.start;
        // SYNC: fresh manager line (writer: the current manager).
        let mut ml: ManagerLine = store.fresh(moff, Site("mgr.line"))?;
        if ml.manager != self.me.wrapping_add(1) {
            self.drop_claim(store)?;
            self.contest(store, ml, now, cfg, probe)?;
            return Ok(rep);
        }
        if self.claim == 0 && !mutant!("lease.grant_without_claim") {
            // Named in the line without a claim of its own: the line may be a
            // late write-back over a newer claimant's, or this node stepped
            // down to a claim since gone. Claim above every claim seen,
            // then settle like any claimant.
            let epoch = ml.epoch.max(self.epoch_seen).wrapping_add(1);
            self.publish_claim(store, epoch)?;
            // SYNC: the claim reaches memory before the settle starts (reader:
            // a rival's doorbell scan, which then steps it down).
            store.co.full_fence(Site("mgr.reclaim.fence"));
            self.claimed_at = now;
            self.full_scan = 1;
            return Ok(rep);
        }
        if self.claimed_at == UNCLAIMED {
            self.claimed_at = now.saturating_sub(cfg.settle);
        }
        let claimed = self.claimed_at;
        if now.saturating_sub(claimed) < cfg.settle && !mutant!("lease.no_settle") {
            return Ok(rep);
        }
        rep.active = true;
        self.steps = self.steps.wrapping_add(1);

        // Liveness, at most once per tick (every heartbeat and info line).
        if self.liveness_at != now {
            self.liveness_at = now;
            ml.lease = ml.lease.wrapping_add(1);
            ml.epoch = ml.epoch.max(self.claim >> 8);
            self.liveness(store, &mut ml, now, cfg, probe, &mut rep)?;
            // Completed by the fence that ends the step.
            store.publish(moff, &ml, Site("mgr.renew"))?;
        }
        rep.dead = ml.dead_mask;
        rep.scanned_at = self.liveness_at;

        // A full step now and then (at most every 1024 steps and a
        // sixteenth of a lease) is the safety net for whatever the narrow
        // steps leave unread.
        let periodic = self.steps.is_multiple_of(1024) && now.saturating_sub(self.full_at) >= cfg.lease / 16;
        let full = self.full_scan != 0 || rep.newly_dead != 0 || periodic;
        self.full_scan = 0;
        if full {
            self.full_at = now;
        }
        let nn = l.caps.max_nodes;
        let all = if nn >= 64 { u64::MAX } else { (1u64 << nn).wrapping_sub(1) };
        // Whose doorbells: every node's in a full step; else the nodes not
        // FREE at the last liveness scan (a node attached since is heard
        // from at the next one, within a tick), and this one.
        let ringers = if full { all } else { (self.listed | 1 << self.me) & all };
        let mut cx = StepCx { full, all, ringers, dead: ml.dead_mask, bells: [[0; 4]; MAX_NODES as usize], rival: 0 };
        // Locks: those someone asks for (request lines) or holds.
        let want = self.doorbells(store, &mut cx)?;
        if cx.rival > self.claim && !mutant!("lease.ignore_rival_claims") {
            // Another node claimed the role after (or beside) this one: it
            // grants, this one steps down before granting anything (its
            // settle covers a step of this one already under way).
            self.epoch_seen = self.epoch_seen.max(cx.rival >> 8);
            self.drop_claim(store)?;
            rep.active = false;
            return Ok(rep);
        }
        // The locks to look at: every one in a full step, else those asked
        // for or held (the set bits of `want`).
        let words = if full { [u64::MAX; 4] } else { want };
        let locks = (0..words.len() as u32)
            .flat_map(|w| bits(words.at(w as usize)).map(move |b| w.wrapping_mul(64).wrapping_add(b)));
        for lock in locks.take_while(|&lock| lock < l.n_locks) {
            self.step_lock(store, &cx, lock, &mut rep)?;
        }
        store.co.store_fence(Site("mgr.step.fence"));
        Ok(rep)
    }

    /// Not the manager: contests the role when it is vacant, its holder is
    /// dead, or its lease has not moved for a whole lease.
    fn contest<C: Coherence>(
        &mut self,
        store: &Store<C>,
        mut ml: ManagerLine,
        now: u64,
        cfg: LeaseConfig,
        probe: LivenessProbe<'_>,
    ) -> Result<()> {
        let l = &store.layout;
        self.claimed_at = UNCLAIMED;
        self.full_scan = 1;
        self.liveness_at = u64::MAX;
        if ml.lease != self.seen_lease || ml.manager != self.seen_manager {
            self.seen_lease = ml.lease;
            self.seen_manager = ml.manager;
            self.lease_moved_at = now;
        }
        let holder_dead = ml.manager != 0 && {
            // Not 0 (checked above).
            let m = ml.manager.wrapping_sub(1);
            m >= l.caps.max_nodes || {
                let info: NodeInfo = store.fresh_state_first(l.node_info(m), Site("mgr.contest.info"))?;
                info.state != NODE_ALIVE || probe(m, &info) == Some(false)
            }
        };
        let stale = now.saturating_sub(self.lease_moved_at) >= cfg.lease || mutant!("lease.claim_live");
        if ml.manager == 0 || holder_dead || stale {
            ml.manager = self.me.wrapping_add(1);
            ml.epoch = ml.epoch.max(self.epoch_seen).wrapping_add(1);
            ml.lease = ml.lease.wrapping_add(1);
            // SYNC: claim visible to other contenders before we act.
            store.publish(l.manager.start, &ml, Site("mgr.claim"))?;
            self.publish_claim(store, ml.epoch)?;
            // (Completes both the line above and the claim word.)
            store.co.full_fence(Site("mgr.claim.fence"));
            self.claimed_at = now;
        }
        Ok(())
    }

    /// Reads the doorbells of `cx.ringers` into `cx.bells`; returns every
    /// lock asked for or held.
    fn doorbells<C: Coherence>(&self, store: &Store<C>, cx: &mut StepCx) -> Result<[u64; 4]> {
        let l = &store.layout;
        let mut want = self.held;
        let mut lines = [0u64; MAX_NODES as usize];
        let mut nb = 0;
        for n in bits(cx.ringers) {
            lines.set(nb, l.requests(n));
            nb = nb.saturating_add(1);
        }
        // SYNC: the doorbell lines fresh, dropped together with one ordering
        // so their loads miss in parallel (writer: `bell`).
        store.co.invalidate_lines(&store.view, lines.get(..nb).unwrap_or(&lines), Site("mgr.doorbell"))?;
        // Each node's doorbells as this step read them: a request is granted
        // only while its bell rings (a withdrawal silences it first).
        for n in bits(cx.ringers) {
            let off = l.requests(n);
            for (i, w) in want.iter_mut().enumerate() {
                let x = store.view.load_u64(off.wrapping_add((i as u64).wrapping_mul(8)))?;
                cx.bells.update(n as usize, |b| b.set(i, x));
                *w |= x;
            }
            if n != self.me {
                cx.rival = cx.rival.max(store.view.load_u64(off.wrapping_add(CLAIM_AT))?);
            }
        }
        Ok(want)
    }

    /// Lock `lock` in this step: reads its line and the slots that matter,
    /// revokes a dead holder's grant, answers withdrawals, drops strangers'
    /// requests, and grants the next waiter round-robin when it is free.
    fn step_lock<C: Coherence>(
        &mut self,
        store: &Store<C>,
        cx: &StepCx,
        lock: u32,
        rep: &mut StepReport,
    ) -> Result<()> {
        let l = &store.layout;
        let (wi, bit) = ((lock / 64) as usize, 1u64 << (lock % 64));
        let loff = l.lock_line(lock);
        let (mut ll, mask) = self.read_lock(store, cx, lock)?;
        let mut memo = self.memo.at(lock as usize);
        let (line_holder, line_seq) = (ll.holder, ll.grant_seq);
        // A line that a replaced manager wrote back late is written again
        // from the memo (with this step's changes, if any).
        let mut changed = memo.merge(&mut ll);
        let mut holder = None;
        // The lock's last grant: its ticket, and its grantee (id + 1) as
        // this manager made or saw it, or as a line carrying that very
        // ticket names it; 0 when unknown.
        let last_seq = memo.seq;
        let last = match self.last_holder.at(lock as usize) {
            0 if line_seq == last_seq => line_holder,
            h => h,
        };
        let last_open = last != 0 && self.released.at(lock as usize) != last_seq;
        // Each slot's (state, flags) as this step read it; the grant below
        // works from this snapshot (and the bells read before it). A
        // withdrawing node writes CANCEL and waits for the answer in its
        // slot, so a grant racing its withdrawal is seen by it and given
        // back.
        let mut seen = [(SLOT_IDLE, 0u32); MAX_NODES as usize];
        // The largest ticket a slot shows: granted, being given back, or (in
        // any other state) the largest its node was granted.
        let mut max_seq = 0u64;
        let mut slots = [LockSlot::default(); MAX_NODES as usize];
        for n in bits(mask) {
            let s: LockSlot = store.state_first_invalidated(l.lock_slot(lock, n))?;
            slots.set(n as usize, s);
            // A released slot carries its holder's floor: a recovery's is
            // the floor it raised (whatever the line in memory shows now).
            memo.floor = memo.floor.max(s.reserved.at(GRANT_FLOOR));
        }
        for n in bits(mask) {
            let soff = l.lock_slot(lock, n);
            let mut s = slots.at(n as usize);
            let older = s.seq < last_seq && s.state == SLOT_LOCKED;
            if older && last_open && last == n.wrapping_add(1) && !mutant!("mgr.release_by_stale_slot") {
                // The last grantee's slot shows an older grant: a replaced
                // manager's line written back late over it (only managers
                // write LOCKED, and this node's tickets only grow). The
                // grant stands until the grantee releases it, which it does
                // whatever its slot shows (see `Node::unlock`). Should the
                // late line have landed over its release instead, the lock
                // waits for the grantee's next request of it: a stall, never
                // a second holder. (An older IDLE is no late line: the
                // manager answers a withdrawal that overwrote its grant so,
                // and the grant is given back.)
                s = LockSlot { state: SLOT_LOCKED, seq: last_seq, ..s };
            }
            seen.set(n as usize, (s.state, s.flags));
            // (A node not ALIVE at the last scan is the stranger rule's below,
            // which resets its slot.)
            let alive = self.alive & (1 << n) != 0;
            let void = s.seq < memo.floor || alive && last != 0 && last != n.wrapping_add(1) && s.seq < last_seq;
            if s.state == SLOT_LOCKED && void && !mutant!("mgr.hold_by_void_grant") {
                // A grant below the repair floor (made before the repair,
                // which held the lock itself with the floor's ticket), or
                // older than the lock's last grant made to another node: so
                // released or revoked since; this one landed late (a
                // stopped or replaced manager's). Nobody holds by it: a node
                // waiting on the lock rejects it (see `grant_is_current`)
                // and asks again, one that is not waiting overwrites it
                // with its next request, and `held_lock` passes it by. It
                // is left as it is: resetting it could land over a request
                // written since, and a waiter reads IDLE as its fencing.
                continue;
            }
            if s.state == SLOT_LOCKED || !mutant!("mgr.count_from_locked_only") {
                max_seq = max_seq.max(s.seq);
            }
            // A LOCKED slot of a node dead at this step's liveness scan is
            // the dead one's: recovery (which could free the node for a
            // newcomer) needs every lock, and this step has not revoked
            // this one yet.
            let is_dead = cx.dead & (1 << n) != 0;
            match s.state {
                SLOT_LOCKED if is_dead => {
                    // (Each reset keeps the slot's ticket, see above.)
                    store.publish_state_last(soff, &super::reset_slot(&s), Site("mgr.revoke"))?;
                    if !mutant!("revoke.no_repair") {
                        memo.revoked = memo.revoked.max(s.seq).max(1);
                    }
                    ll.repair = u32::from(memo.revoked != 0);
                    ll.holder = 0;
                    changed = true;
                    rep.revoked = rep.revoked.saturating_add(1);
                }
                SLOT_LOCKED if self.alive & (1 << n) == 0 && !mutant!("lock.keep_grant_to_gone") => {
                    // Not ALIVE at the last scan, nor dead: attached since
                    // (holding it), or freed by recovery, its slot showing a
                    // grant that a replaced manager wrote back late. A free
                    // node holds nothing: its slot goes IDLE (else the lock
                    // would wait for it forever), nor does a fenced one (its
                    // locks were revoked before its recovery). One declared
                    // dead since is the next liveness scan's to revoke.
                    if self.drop_stranger(store, n, soff, &s, |st| st == NODE_FREE || st == NODE_FENCED)? {
                        seen.set(n as usize, (SLOT_IDLE, 0));
                    } else {
                        holder = Some((n, s.seq));
                    }
                }
                SLOT_LOCKED => holder = Some((n, s.seq)),
                SLOT_CANCEL if !mutant!("lock.manager_ignores_cancel") => {
                    // SYNC: the answer to a withdrawal (reader: its poll).
                    store.publish_state_last(soff, &super::reset_slot(&s), Site("mgr.drop_withdrawn"))?;
                }
                SLOT_WAITING
                    if self.alive & (1 << n) == 0
                        && !mutant!("lock.grant_to_stranger")
                        && self.drop_stranger(store, n, soff, &s, |st| st != NODE_ALIVE)? =>
                {
                    // Not ALIVE at the last scan: dead, attached since
                    // (maybe as a dead one's successor, after recovery
                    // freed it), or a node recovery already freed (it
                    // stalled, was declared dead, and woke up). Read
                    // fresh: drop all but the newly attached.
                    seen.set(n as usize, (SLOT_IDLE, 0));
                }
                _ => {}
            }
        }
        // With what the slots told: revocations, a recovery's floor, the
        // largest ticket out there (a line written back late may show less).
        memo.seq = memo.seq.max(max_seq);
        changed |= memo.merge(&mut ll);
        // A holder that may keep the grant past its release is asked to
        // give it back when another node asks for the lock (see "Parked
        // grants"): its ticket in the line, until the next grant.
        if let Some((h, seq)) = holder {
            let asked = bits(mask)
                .any(|m| m != h && seen.at(m as usize).0 == SLOT_WAITING && cx.bells.at(m as usize).at(wi) & bit != 0);
            if asked && ll.reserved[LINE_RECALL] != seq && !mutant!("mgr.no_recall") {
                ll.reserved[LINE_RECALL] = seq;
                memo.cool = COOL_GRANTS;
                changed = true;
            }
        }
        self.held.update(wi, |h| *h &= !bit);
        if let Some((n, _)) = holder {
            self.last_holder.set(lock as usize, n.wrapping_add(1));
            self.released.set(lock as usize, u64::MAX);
        } else {
            // No slot of those read is LOCKED, and the holder's (if any
            // grant is not known released) was among them.
            self.released.set(lock as usize, ll.grant_seq);
        }
        if holder.is_some() && !mutant!("lock.grant_while_held") {
            self.held.update(wi, |h| *h |= bit);
        } else if self.grant(store, cx, lock, &mut ll, &mut memo, &seen)? {
            rep.grants = rep.grants.saturating_add(1);
            memo.seq = memo.seq.max(ll.grant_seq);
            changed = false;
        }
        self.memo.set(lock as usize, memo);
        if changed {
            store.publish(loff, &ll, Site("mgr.lock.update"))?;
        }
        Ok(())
    }

    /// Slot `s` (at `soff`) of node `n`, which was not ALIVE at the last
    /// liveness scan: reads the node's info fresh and, when `gone` says so
    /// of its state, resets the slot (keeping its ticket). True when reset;
    /// a node found ALIVE is counted alive from now on.
    fn drop_stranger<C: Coherence>(
        &mut self,
        store: &Store<C>,
        n: u32,
        soff: u64,
        s: &LockSlot,
        gone: impl Fn(u32) -> bool,
    ) -> Result<bool> {
        let info: NodeInfo = store.fresh_state_first(store.layout.node_info(n), Site("mgr.waiter.info"))?;
        if info.state == NODE_ALIVE {
            self.alive |= 1 << n;
        }
        if !gone(info.state) {
            return Ok(false);
        }
        let idle = super::reset_slot(s);
        store.publish_state_last(soff, &idle, Site("mgr.drop_stranger"))?;
        Ok(true)
    }

    /// Reads lock `lock`'s line and, in the same batch, the slots this step
    /// needs: every one in a full scan; else those whose bell rings for the
    /// lock, and the last grant's holder unless this manager saw that grant
    /// released. The holder is known from the line: a guess (the last holder
    /// this manager saw) goes in, and a wrong guess reads the batch again
    /// with the holder's slot. Returns the line and the slots read.
    fn read_lock<C: Coherence>(&self, store: &Store<C>, cx: &StepCx, lock: u32) -> Result<(LockLine, u64)> {
        let l = &store.layout;
        let nn = l.caps.max_nodes;
        let (wi, bit) = ((lock / 64) as usize, 1u64 << (lock % 64));
        let loff = l.lock_line(lock);
        let mut mask = if cx.full { cx.all } else { 0 };
        for n in bits(cx.ringers) {
            if cx.bells.at(n as usize).at(wi) & bit != 0 {
                mask |= 1 << n;
            }
        }
        let guess = self.last_holder.at(lock as usize);
        if self.held.at(wi) & bit != 0 && guess != 0 && guess <= nn {
            mask |= 1 << guess.wrapping_sub(1);
        }
        let mut lines = [0u64; MAX_NODES as usize + 1];
        loop {
            lines.set(0, loff);
            let mut nb = 1usize;
            for n in bits(mask) {
                lines.set(nb, l.lock_slot(lock, n));
                nb = nb.saturating_add(1);
            }
            // SYNC: the lock line and the slots read below fresh, in one
            // batch (writers: grants, requests, withdrawals, releases).
            store.co.invalidate_lines(&store.view, lines.get(..nb).unwrap_or(&lines), Site("mgr.lock"))?;
            let ll: LockLine = store.view.read(loff)?;
            let unknown = ll.holder != 0 && self.released.at(lock as usize) != ll.grant_seq;
            let need = match ll.holder {
                0 => 0,
                h if h <= nn => 1u64 << h.wrapping_sub(1),
                _ => cx.all,
            };
            if !unknown || mask & need == need {
                return Ok((ll, mask));
            }
            mask |= need;
        }
    }

    /// Grants free lock `lock` to the next waiting node after the last one
    /// granted (round-robin) whose slot this step saw WAITING and whose bell
    /// rings; a lock awaiting repair only to recovery. True when granted.
    fn grant<C: Coherence>(
        &mut self,
        store: &Store<C>,
        cx: &StepCx,
        lock: u32,
        ll: &mut LockLine,
        memo: &mut LockMemo,
        seen: &[(u32, u32); MAX_NODES as usize],
    ) -> Result<bool> {
        let l = &store.layout;
        let nn = l.caps.max_nodes;
        let (wi, bit) = ((lock / 64) as usize, 1u64 << (lock % 64));
        let start = if ll.last < nn { ll.last.wrapping_add(1) } else { 0 };
        for k in 0..nn {
            let n = start.wrapping_add(k).checked_rem(nn).unwrap_or(0);
            if cx.dead & (1 << n) != 0 {
                continue;
            }
            let soff = l.lock_slot(lock, n);
            let (state, flags) = seen.at(n as usize);
            let rang = cx.bells.at(n as usize).at(wi) & bit != 0;
            if state != SLOT_WAITING || !rang || (ll.repair != 0 && flags & SLOT_RECOVERY == 0) {
                continue;
            }
            // SYNC(release-landed): the last grantee's release (or given-back
            // grant) reaches memory before the next grant can. This step may
            // have read that IDLE from its own host's cache, written there by
            // a sibling process whose flush has not completed: a crash of the
            // host then would leave the old grant LOCKED in memory beside the
            // new one, and revoking it would grant the lock to recovery while
            // the new holder runs. The write-back of the line as this host
            // sees it (IDLE, or a newer request) is completed by the fence
            // after the line below (writer of the IDLE: `unlock`,
            // `cancel`).
            if ll.holder != 0 && ll.holder <= nn {
                let prev = l.lock_slot(lock, ll.holder.wrapping_sub(1));
                store.co.flush(&store.view, prev, 64, Site("mgr.grant.prev"))?;
            }
            // A grant its holder may keep past its release (see "Parked
            // grants"): the lock's last grants went to this node too, no
            // recall came lately, and no other node asks for it now.
            // Recovery's are never kept.
            let others = (0..nn).any(|m| {
                m != n
                    && seen.at(m as usize).0 == SLOT_WAITING
                    && cx.bells.at(m as usize).at(wi) & bit != 0
                    && cx.dead & (1 << m) == 0
            });
            memo.streak = if ll.last == n { memo.streak.saturating_add(1) } else { 0 };
            memo.cool = memo.cool.saturating_sub(1);
            let park =
                memo.streak >= KEEP_AFTER && memo.cool == 0 && !others && flags & SLOT_RECOVERY == 0 && ll.repair == 0;
            // The count goes on from the largest ticket out there, in
            // case a line with it never landed (its manager crashed
            // after the grant landed).
            // (`memo.seq` took the largest ticket the slots show.)
            ll.grant_seq = ll.grant_seq.max(memo.seq).wrapping_add(1);
            ll.holder = n.wrapping_add(1);
            ll.last = n;
            // SYNC: the line (holder, last, grant_seq) reaches memory before
            // the grant can be seen (reader: the manager's next step, and a
            // recovery holding the lock, which rewrites the line to clear
            // `repair`: a line still in flight when the grantee sees LOCKED
            // could land over that write and bring `repair` back).
            store.publish(l.lock_line(lock), ll, Site("mgr.grant.line"))?;
            store.co.store_fence(Site("mgr.grant.line.fence"));
            let mut g = LockSlot { state: SLOT_LOCKED, flags, seq: ll.grant_seq, reserved: [0; 6] };
            // The grant carries the claim it was made under (the grantee
            // checks it is still the largest).
            g.reserved[GRANT_CLAIM] = self.claim;
            // And the floor below which what the lock guards is void.
            g.reserved[GRANT_FLOOR] = ll.floor;
            // And whether it awaits repair: the recovery it is granted to
            // learns which locks were revoked from their holders (their
            // late write-backs may still come; see `ChunkRecord::taint`).
            g.reserved[GRANT_REPAIR] = u64::from(ll.repair != 0);
            g.reserved[GRANT_PARK] = u64::from(park);
            // SYNC: LOCKED visible to the polling node (reader: lock_with).
            store.publish_state_last(soff, &g, Site("mgr.grant"))?;
            self.held.update(wi, |h| *h |= bit);
            self.last_holder.set(lock as usize, n.wrapping_add(1));
            return Ok(true);
        }
        Ok(false)
    }

    /// Watches every node's info and heartbeat; declares dead the silent ones
    /// and those the probe knows are gone. Updates `ml.dead_mask`.
    fn liveness<C: Coherence>(
        &mut self,
        store: &Store<C>,
        ml: &mut ManagerLine,
        now: u64,
        cfg: LeaseConfig,
        probe: LivenessProbe<'_>,
        rep: &mut StepReport,
    ) -> Result<()> {
        let l = &store.layout;
        let mut dead = 0u64;
        self.alive = 0;
        self.listed = 0;
        for n in 0..l.caps.max_nodes {
            let info: NodeInfo = store.fresh_state_first(l.node_info(n), Site("mgr.info"))?;
            if info.state != NODE_FREE {
                self.listed |= 1 << n;
            }
            match info.state {
                NODE_ALIVE => self.alive |= 1 << n,
                NODE_DEAD => {
                    dead |= 1 << n;
                    continue;
                }
                NODE_FENCED => {
                    // Recovered, its reservations kept until it is quiet:
                    // once it is, recovery is due again to free them.
                    let mut quiet = crate::node::quiet_incarnation(store, n)? == Some(info.incarnation);
                    let [inc, since] = self.fenced_since.at(n as usize);
                    let since = if inc == info.incarnation && since != 0 {
                        since
                    } else {
                        self.fenced_since.set(n as usize, [info.incarnation, now.max(1)]);
                        now.max(1)
                    };
                    if !quiet && cfg.quarantine != 0 && now.saturating_sub(since) >= cfg.quarantine {
                        // Its quarantine is over: taken as quiet.
                        quiet = crate::node::declare_quiet(store, n)?;
                        rep.quarantine_ended |= u64::from(quiet) << n;
                    }
                    if quiet {
                        dead |= 1 << n;
                    }
                    self.beat_moved_at.set(n as usize, now);
                    continue;
                }
                _ => {
                    self.beat_moved_at.set(n as usize, now);
                    continue;
                }
            }
            let hb: Heartbeat = store.fresh(l.heartbeat(n), Site("mgr.beat"))?;
            // A node that attached since the last scan is new, whatever its
            // heartbeat line says: attach writes that line before ALIVE but
            // without a fence between, so its predecessor's last beat can
            // still be in memory beside the new ALIVE. Silence is measured
            // per incarnation, never across one.
            let seen = [info.incarnation, hb.beat];
            if mutant!("liveness.beat_across_incarnations") {
                if hb.beat != self.beat.at(n as usize)[1] {
                    self.beat.set(n as usize, seen);
                    self.beat_moved_at.set(n as usize, now);
                }
            } else if seen != self.beat.at(n as usize) {
                self.beat.set(n as usize, seen);
                self.beat_moved_at.set(n as usize, now);
            }
            let verdict = probe(n, &info);
            let silent = now.saturating_sub(self.beat_moved_at.at(n as usize)) >= cfg.lease;
            if n != self.me && verdict == Some(false) {
                // Its process is gone from this host, which lives: what it
                // left dirty is in our cache and must land first.
                crate::node::bury(store, n)?;
                dead |= 1 << n;
                rep.newly_dead |= 1 << n;
            } else if n != self.me && silent {
                // Silence past the lease wins over a probe that finds the
                // process: a stopped or frozen process holds what it holds
                // forever otherwise. Should it wake, its heartbeat finds it
                // DEAD and its operations fail with `Revoked`.
                let mut d = info;
                d.state = NODE_DEAD;
                // SYNC: DEAD fences the node out (reader: its own heartbeat).
                store.publish_state_last(l.node_info(n), &d, Site("mgr.declare_dead"))?;
                dead |= 1 << n;
                rep.newly_dead |= 1 << n;
                if verdict == Some(true) {
                    rep.running_dead |= 1 << n;
                }
            }
        }
        ml.dead_mask = dead;
        Ok(())
    }
}

/// Checked access to the manager's per-node, per-lock and per-word tables:
/// an index beyond a table (only a corrupt region's values give one) reads
/// as the default and writes nothing.
trait Table<T> {
    fn at(&self, i: usize) -> T;
    fn set(&mut self, i: usize, v: T);
    fn update(&mut self, i: usize, f: impl FnOnce(&mut T));
}

impl<T: Copy + Default, const N: usize> Table<T> for [T; N] {
    fn at(&self, i: usize) -> T {
        self.get(i).copied().unwrap_or_default()
    }
    fn set(&mut self, i: usize, v: T) {
        if let Some(x) = self.get_mut(i) {
            *x = v;
        }
    }
    fn update(&mut self, i: usize, f: impl FnOnce(&mut T)) {
        if let Some(x) = self.get_mut(i) {
            f(x);
        }
    }
}

/// The set bits of `m`, lowest first.
fn bits(mut m: u64) -> impl Iterator<Item = u32> {
    core::iter::from_fn(move || {
        let b = m.trailing_zeros();
        (b < 64).then(|| {
            m &= m.wrapping_sub(1);
            b
        })
    })
}
