//! Recovery: makes a region whole again after nodes died — possibly holding
//! locks, pins and half-made changes.
//!
//! Recovery takes every lock (as recovery, so locks revoked from a dead holder
//! are granted to it) and rebuilds derived state from the state of record:
//! entries are the truth for buckets, free lists and LRU lists; entries and
//! named roots are the truth for which payload blocks are in use. It is
//! idempotent and may itself crash and be re-run.

use crate::alloc::{chunk_of, kind_valid, read_map, set_bitmap, write_map, ChunkMap};
use crate::coherence::{Coherence, Site};
use crate::hash::{place, Key};
use crate::index::{entry_checksum, probe, NIL};
use crate::layout::{
    state, Bucket, ChunkRecord, Entry, ExpiryLine, LockLine, LockSlot, NodeInfo, PinRecord, RootRecord, StripeHeader,
    CHUNK_CONT, CHUNK_HELD, CHUNK_KV, CHUNK_LARGE, CHUNK_RAW, EXPIRY_SLOTS, MAX_NODES, NODE_ALIVE, NODE_DEAD,
    NODE_FENCED, RELEASE_AT,
};
use crate::lock::{Held, GRANT_FLOOR, GRANT_REPAIR};
use crate::mutant::mutant;
use crate::node::Node;
use crate::roots::{record_deferred, record_valid};
use crate::{Error, Result};

/// What a recovery did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecoverReport {
    /// Dead nodes whose slots were freed (bit mask).
    pub nodes_freed: u64,
    /// Pins of dead nodes dropped.
    pub pins_dropped: u64,
    /// Reservations of dead nodes aborted.
    pub writes_aborted: u64,
    /// Reservations of dead nodes not known quiet, kept allocated (see
    /// [`crate::layout::state::QUARANTINED`]).
    pub writes_quarantined: u64,
    /// Dead nodes not known quiet, fenced rather than freed (bit mask).
    pub nodes_fenced: u64,
    /// Entries dropped because they were corrupt or duplicated.
    pub entries_dropped: u64,
    /// Payload blocks nothing referenced, returned to the allocator.
    pub blocks_reclaimed: u64,
    /// Chunks returned to the global bitmap.
    pub chunks_reclaimed: u64,
    /// Locks that were awaiting repair.
    pub locks_repaired: u32,
    /// Stripes whose header was void (a revoked holder's late write-back):
    /// rebuilt, their insert and eviction counts as that header had them.
    pub void_stripes: u32,
    /// Stored blocks of tenants whose expiry stamp, in a line that was not
    /// void, was not of their generation: made expired. The protocol
    /// publishes every stamp before its entry, so this counts damage (or
    /// a stamp read stale), never a normal event.
    pub lost_stamps: u64,
}

impl<C: Coherence> Node<'_, C> {
    /// Recovers the region: nodes in `dead` (and any the manager declared
    /// dead) lose their pins, reservations and slots; every structure is
    /// rebuilt from its state of record. Other nodes keep working meanwhile
    /// (they wait on locks). A node in `dead` whose host lives must have
    /// been buried ([`crate::node::bury`]) by a process of that host first.
    pub fn recover(&self, dead: u64) -> Result<RecoverReport> {
        let st = self.store;
        let l = &st.layout;
        if dead & (1 << self.id) != 0 {
            return Err(Error::InvalidArgument);
        }
        let mut taken = 0u32;
        let mut res = Ok(());
        // The ticket of each grant, to release exactly what we hold.
        let mut grants = [0u64; crate::layout::MAX_LOCKS as usize];
        // Core's locks only: an application may hold its own locks while it
        // waits for one of core's, so recovery must not wait for those.
        let n_core = l.locks().n_core();
        for lock in 0..n_core {
            match self.lock_recovery(lock) {
                Ok(Held { seq, .. }) => {
                    if let Some(g) = grants.get_mut(lock as usize) {
                        *g = seq;
                    }
                    taken = taken.saturating_add(1);
                }
                Err(e) => {
                    res = Err(e);
                    break;
                }
            }
        }
        // (The logic mutant: a recovery that raises no floor, in the line
        // nor in its release.)
        let raise = !mutant!("recover.keep_floor");
        let out = res.and_then(|_| self.recover_locked(dead, raise));
        let mut flushed = Ok(());
        if taken == n_core {
            // SYNC: the chunk records recovery rewrote (even if it failed half
            // way) reach memory before any lock is released (readers:
            // allocators, under the heap and alloc locks).
            // Completed by the fence of the first unlock below.
            flushed = st.co.flush(&st.view, l.chunks.start, l.chunks.len(), Site("recover.chunks.publish"));
        }
        let mut rel = Ok(());
        // A recovery that ran through raised each lock's floor to its ticket
        // (step 7); its release says so too (see `Node::unlock`).
        let raised = out.is_ok() && raise;
        for lock in (0..taken).rev() {
            let seq = grants.get(lock as usize).copied().unwrap_or(0);
            let r = self.unlock(Held { lock, seq, floor: if raised { seq } else { 0 } });
            if rel.is_ok() {
                rel = r;
            }
        }
        let mut rep = out?;
        flushed?;
        rel?;
        rep.locks_repaired = rep.locks_repaired.saturating_add(self.repair_app_locks()?);
        if rep.nodes_freed != 0 {
            self.local.beat_counters.add(|c| {
                c.recoveries = c.recoveries.wrapping_add(1);
                c.nodes_recovered = c.nodes_recovered.wrapping_add(rep.nodes_freed.count_ones() as u64);
            });
        }
        Ok(rep)
    }

    /// Clears `repair` of every application lock revoked from a dead holder,
    /// taking each alone (as recovery, the only grant such a lock gets), so
    /// it is granted again. Returns how many.
    fn repair_app_locks(&self) -> Result<u32> {
        let st = self.store;
        let l = &st.layout;
        let mut n = 0u32;
        for lock in l.locks().n_core()..l.n_locks {
            let ll: LockLine = st.fresh(l.lock_line(lock), Site("recover.app_lock.peek"))?;
            if ll.repair == 0 {
                continue;
            }
            let held = self.lock_recovery(lock)?;
            // The peek above read the line fresh; since then only this
            // recovery's grant changed it (count, holder, last), and the
            // count is taken as at least this grant's below.
            let mut ll: LockLine = st.view.read(l.lock_line(lock))?;
            let repaired = ll.repair != 0;
            let r = if repaired {
                ll.repair = 0;
                // Never behind the ticket this recovery holds (see lock.rs),
                // and the floor at it: the manager takes the clear only with
                // a floor past the grant it revoked.
                ll.grant_seq = ll.grant_seq.max(held.seq);
                ll.floor = ll.floor.max(held.seq);
                n = n.saturating_add(1);
                st.publish(l.lock_line(lock), &ll, Site("recover.app_lock.repaired"))
            } else {
                Ok(())
            };
            // The release carries the floor raised (see `Node::unlock`).
            let floor = if repaired { held.seq } else { held.floor };
            self.unlock(Held { floor, ..held })?;
            r?;
        }
        Ok(n)
    }

    fn recover_locked(&self, dead_in: u64, raise: bool) -> Result<RecoverReport> {
        let l = &self.store.layout;
        let mut rep = RecoverReport::default();
        let Census { dead, alive, kept } = self.census(dead_in)?;
        // Raw chunks keep their blocks while their owner lives, or is dead
        // and not known quiet (it may still store into them).
        let owners = alive | kept;
        let reset_blocks = self.forget_claims(owners)?;
        let mut claimed = self.claim_roots(owners)?;
        self.hold_inflight_places(kept)?;
        // 3. Entries: fix states, re-claim their blocks, rebuild each stripe.
        for s in 0..l.caps.n_stripes {
            claimed = claimed.saturating_add(self.rebuild_stripe(s, Census { dead, alive, kept }, &mut rep)?);
        }
        if kept != 0 {
            claimed = claimed.saturating_add(self.claim_quarantined(kept, alive, &mut rep)?);
        }
        // Every tenant's usage counted from the entries as rebuilt.
        self.rebuild_tenants(|lock| self.ticket(lock))?;
        claimed = claimed.saturating_add(self.claim_journaled(alive | kept)?);
        rep.blocks_reclaimed = reset_blocks.saturating_sub(claimed);
        self.apply_deferred_frees(kept, &mut rep)?;
        let releasing = self.releases_in_flight(kept)?;
        self.settle_chunks(owners, kept, &releasing, &mut rep)?;
        // 5. Live nodes' journals are theirs alone: each node writes its own
        // from its cache, never re-reading it, so a record recovery changed
        // there would come back with the node's next write of that line.
        // Step 3 already dropped every pin its node's journal does not
        // record; a record naming no pin (only corruption leaves one) holds
        // a journal slot until its node detaches, and `check` reports it.
        self.free_dead(dead, kept, &mut rep)?;
        self.repair_core_locks(&mut rep, raise)?;
        Ok(rep)
    }

    /// Step 0: Which nodes are dead (declared, or named by the caller; never
    /// this one) and which alive (attached, and this one); of the dead,
    /// which are not known quiet (see [`crate::layout::Heartbeat::quiet`]):
    /// their reservations and raw blocks are kept.
    fn census(&self, dead_in: u64) -> Result<Census> {
        let st = self.store;
        let l = &st.layout;
        let mut dead = dead_in;
        let mut attached = 0u64;
        let mut unquiet = 0u64;
        for n in 0..l.caps.max_nodes {
            let info: NodeInfo = st.fresh(l.node_info(n), Site("recover.info"))?;
            let quiet = || -> Result<bool> {
                let q = crate::node::quiet_incarnation(st, n)? == Some(info.incarnation);
                Ok(q || mutant!("recover.free_unquiet"))
            };
            match info.state {
                NODE_DEAD | NODE_FENCED => {
                    dead |= 1 << n;
                    if !quiet()? {
                        unquiet |= 1 << n;
                    }
                }
                NODE_ALIVE => attached |= 1 << n,
                _ => {}
            }
        }
        dead &= !(1 << self.id);
        Ok(Census { dead, alive: (attached | 1 << self.id) & !dead, kept: dead & unquiet })
    }

    /// Step 1: Forgets every block claim that recovery can re-derive; returns
    /// how many blocks the forgotten claims counted. `owners`: the nodes
    /// whose raw chunks keep their blocks (see `recover_locked`).
    fn forget_claims(&self, owners: u64) -> Result<u64> {
        let st = self.store;
        let l = &st.layout;
        let mut reset_blocks = 0u64;
        let words = l.map_words();
        for c in 0..l.n_chunks {
            let mut rec: ChunkRecord = st.fresh(l.chunk(c), Site("recover.chunk.read"))?;
            let owner_dead =
                rec.owner == 0 || rec.owner > l.caps.max_nodes || owners & (1 << rec.owner.wrapping_sub(1)) == 0;
            let derivable = match rec.kind {
                CHUNK_KV => true,
                CHUNK_LARGE => rec.large_kind == CHUNK_KV || owner_dead,
                CHUNK_RAW => owner_dead || mutant!("recover.reclaim_live_raw"),
                _ => false,
            };
            if !kind_valid(rec.kind) || rec.owner > l.caps.max_nodes {
                rec = ChunkRecord::default();
            } else if derivable {
                reset_blocks = reset_blocks.saturating_add(rec.blocks as u64);
                rec.used = 0;
                rec.blocks = 0;
            } else {
                // Kept as it is, and stamped in step 4 with this host's
                // copy of its maps: fresh from here on (recovery holds every
                // lock).
                let map = read_map(st, c, Some(Site("recover.raw.map")))?;
                if rec.kind == CHUNK_RAW && !mutant!("recover.trust_raw_record") {
                    // A live owner keeps its raw blocks, but another process
                    // that died while freeing one of them (under the owner's
                    // heap lock, which this recovery holds now) may have
                    // published the map and not the record — or a revoked
                    // holder's map line landed late (the chunk is void):
                    // the map decides.
                    let sum = map.summary();
                    let derived = (sum.used, sum.blocks, sum.free_max);
                    if sum.well_formed && (rec.used, rec.blocks, rec.free_max) != derived {
                        (rec.used, rec.blocks, rec.free_max) = derived;
                        st.view.write(l.chunk(c), &rec)?;
                    }
                }
                continue;
            }
            // Records and maps are written back together before the locks go.
            st.view.write(l.chunk(c), &rec)?;
            write_map(st, c, &ChunkMap::empty(l.granules()), 0, words, None)?;
        }
        Ok(reset_blocks)
    }

    /// Step 2: Named roots keep raw blocks alive; returns how many they claimed.
    fn claim_roots(&self, owners: u64) -> Result<u64> {
        let st = self.store;
        let l = &st.layout;
        let mut claimed = 0u64;
        for i in 0..l.caps.n_roots {
            let r: RootRecord = st.fresh(l.root(i), Site("recover.root"))?;
            // A deferred free holds its block until step 3d frees it.
            if (record_valid(&r) || record_deferred(&r))
                && r.offset != 0
                && self.claim_block(r.offset, r.size.max(1), true, owners)? == Claim::New
            {
                claimed = claimed.saturating_add(1);
            }
        }
        Ok(claimed)
    }

    /// Step 3d: Deferred frees (see [`crate::roots::ROOT_DEFERRED_FREE`]) whose chunk
    /// no fenced node (`kept`) may still write back a map line of: each
    /// record goes first (published and fenced under the roots lock, this
    /// recovery's), then its block's map bits (written back with the chunk
    /// table at the end). A recovery that stops between leaves the block
    /// allocated and named by nothing (its owner's until that owner is
    /// gone), never a record naming a free block, which a later recovery
    /// would free again under whoever took it.
    fn apply_deferred_frees(&self, kept: u64, rep: &mut RecoverReport) -> Result<()> {
        let st = self.store;
        let l = &st.layout;
        for i in 0..l.caps.n_roots {
            // Fresh since step 2 (recovery holds the roots lock).
            let r: RootRecord = st.view.read(l.root(i))?;
            if !record_deferred(&r) {
                continue;
            }
            let Ok(c) = chunk_of(l, r.offset) else {
                self.root_clear_locked(i)?;
                continue;
            };
            // Fresh since step 1, as the claims left it.
            let mut rec: ChunkRecord = st.view.read(l.chunk(c))?;
            let tainted = (rec.taint | self.taint_due(&rec, kept)?) & kept != 0;
            if tainted && !mutant!("recover.deferred_free_while_tainted") {
                continue;
            }
            self.root_clear_locked(i)?;
            let g = l.granule();
            let at = r.offset.checked_sub(l.chunk_payload(c)).filter(|x| x.is_multiple_of(g));
            let Some(at) = at.and_then(|x| x.checked_div(g)).and_then(|x| u32::try_from(x).ok()) else {
                continue;
            };
            let mut m = read_map(st, c, None)?;
            let Some(k) = m.extent(at).filter(|_| rec.kind == CHUNK_RAW) else {
                // Freed already (a recovery that stopped after its map
                // write), or no such block: nothing to free.
                continue;
            };
            m.clear(at, k);
            let (lo, hi) = ((at / 64) as usize, at.saturating_add(k).div_ceil(64) as usize);
            write_map(st, c, &m, lo, hi, None)?;
            rec.used = rec.used.saturating_sub(k);
            rec.blocks = rec.blocks.saturating_sub(1);
            rec.free_max = m.longest_free();
            st.view.write(l.chunk(c), &rec)?;
            rep.blocks_reclaimed = rep.blocks_reclaimed.saturating_add(1);
        }
        Ok(())
    }

    /// Step 2b: A reservation of a fenced node (`kept`) whose entry is not
    /// in memory: the node journaled it (in memory before the entry was
    /// stored: see `reserve_locked`) and stopped before the entry's line
    /// landed, which it may still do, written back late. Its place is held
    /// — a QUARANTINED entry with no block, at the journaled generation, on
    /// no list — so that no reservation takes that entry meanwhile and is
    /// written over. The next recovery after the node is quiet frees it.
    fn hold_inflight_places(&self, kept: u64) -> Result<()> {
        let st = self.store;
        let l = &st.layout;
        let eps = l.caps.entries_per_stripe;
        let recs = (l.caps.pin_slots as u64).saturating_mul(core::mem::size_of::<PinRecord>() as u64);
        for n in (0..l.caps.max_nodes).filter(|&n| kept & (1 << n) != 0) {
            // SYNC: fresh records of a fenced node's journal (writer: the
            // node, which journals a reservation before storing its entry).
            st.co.invalidate(&st.view, l.pin_record(n, 0), recs, Site("recover.inflight.journal"))?;
            for i in 0..l.caps.pin_slots {
                let r: PinRecord = st.view.read(l.pin_record(n, i))?;
                let Some(g) = r.entry.checked_sub(1) else { continue };
                let (Some(s), Some(e)) = (g.checked_div(eps), g.checked_rem(eps)) else { continue };
                if s >= l.caps.n_stripes || r.count == 0 {
                    continue;
                }
                let ent = match st.ent(s, e) {
                    Ok(x) => x,
                    Err(Error::Changed) => continue,
                    Err(err) => return Err(err),
                };
                // A reservation takes an EMPTY entry at the next generation.
                let inflight = ent.state == state::EMPTY && (ent.gen as u64).wrapping_add(1) == r.gen;
                if !inflight || mutant!("recover.reuse_inflight_place") {
                    continue;
                }
                let mut held = Entry {
                    ver: ent.ver,
                    state: state::QUARANTINED,
                    // The journal's generation (a u32's, as the entry's).
                    gen: r.gen as u32,
                    writer: n.wrapping_add(1) as u8,
                    lru_prev: NIL,
                    lru_next: NIL,
                    ..Entry::default()
                };
                held.checksum = entry_checksum(&held);
                st.put_ent(s, e, &mut held, self.ticket(l.locks().stripe(s))?)?;
            }
        }
        Ok(())
    }

    /// Step 3b: The entries of fenced writers (`kept`; step 3 left them)
    /// claim their blocks, after every other entry has: one can be a late
    /// write-back, landed after the recovery that reclaimed its block, which
    /// a live entry may hold now. That entry keeps it; this one keeps only
    /// its place (no block), as step 2b's do. Returns the blocks claimed.
    fn claim_quarantined(&self, kept: u64, alive: u64, rep: &mut RecoverReport) -> Result<u64> {
        let st = self.store;
        let l = &st.layout;
        let mut claimed = 0u64;
        for s in 0..l.caps.n_stripes {
            for e in 0..l.caps.entries_per_stripe {
                let mut ent = match st.ent(s, e) {
                    Ok(x) => x,
                    Err(Error::Changed) => continue,
                    Err(err) => return Err(err),
                };
                let writer_kept = ent.pinners().count_ones() == 1 && ent.pinners() & kept != 0;
                if !matches!(ent.state, state::WRITING | state::QUARANTINED)
                    || !writer_kept
                    || ent.payload_len == 0
                    || ent.checksum != entry_checksum(&ent)
                {
                    continue;
                }
                let before = ent;
                if self.claim_block(ent.payload_off, ent.payload_len as u64, false, alive)? == Claim::New {
                    rep.writes_quarantined = rep.writes_quarantined.saturating_add(1);
                    claimed = claimed.saturating_add(1);
                    ent.state = state::QUARANTINED;
                } else {
                    ent = Entry {
                        ver: ent.ver,
                        state: state::QUARANTINED,
                        gen: ent.gen,
                        writer: ent.writer,
                        lru_prev: NIL,
                        lru_next: NIL,
                        ..Entry::default()
                    };
                    ent.checksum = entry_checksum(&ent);
                }
                if ent != before {
                    st.put_ent(s, e, &mut ent, self.ticket(l.locks().stripe(s))?)?;
                }
            }
        }
        Ok(claimed)
    }

    /// Step 3c: The chunks that fenced nodes (`kept`) journaled as changing
    /// hands, taken or given back, whose records they may still write back
    /// (see `Node::release_chunks`, `Node::mark_chunks`): per node, its
    /// first chunk and count (0 when none).
    fn releases_in_flight(&self, kept: u64) -> Result<[(u32, u32); MAX_NODES as usize]> {
        let st = self.store;
        let l = &st.layout;
        let mut out = [(0u32, 0u32); MAX_NODES as usize];
        for n in (0..l.caps.max_nodes.min(MAX_NODES)).filter(|&n| kept & (1 << n) != 0) {
            // SYNC: no invalidate: fresh enough from this host's copy. The
            // node journaled, fenced, then found its alloc grant standing:
            // so the revocation that fenced it came after, and the grant of
            // the alloc lock to this recovery after that; its poll
            // invalidated every node's request line (see
            // `Node::grant_is_current`), the journal's among them (writer:
            // the node, in `release_chunks`).
            let w = st.view.load_u64(l.requests(n).wrapping_add(RELEASE_AT))?;
            let (first, k) = ((w as u32).wrapping_sub(1), (w >> 32) as u32);
            let fits = w as u32 != 0 && k != 0 && first.checked_add(k).is_some_and(|end| end <= l.n_chunks);
            if fits && !mutant!("recover.ignore_release_journal") {
                if let Some(x) = out.get_mut(n as usize) {
                    *x = (first, k);
                }
            }
        }
        Ok(out)
    }

    /// Step 4: Chunks nothing claims go back to the bitmap, but for those a
    /// fenced node (`kept`) owns or was releasing (`releasing`), held out of
    /// use; the others get their record's counts from their maps, and this
    /// recovery's stamp.
    fn settle_chunks(&self, owners: u64, kept: u64, releasing: &[(u32, u32)], rep: &mut RecoverReport) -> Result<()> {
        let st = self.store;
        let l = &st.layout;
        let words = l.map_words();
        for c in 0..l.n_chunks {
            // Fresh since step 1: only recovery, holding every lock, writes it.
            let mut rec: ChunkRecord = st.view.read(l.chunk(c))?;
            // Who may still write back a line of it: the taint it had, and
            // this repair's, less the nodes known quiet now.
            let taint = (rec.taint | self.taint_due(&rec, kept)?) & kept;
            let keep = match rec.kind {
                CHUNK_KV | CHUNK_RAW | CHUNK_LARGE => rec.blocks > 0,
                CHUNK_CONT => {
                    let h = rec.run;
                    h < c && {
                        let head: ChunkRecord = st.view.read(l.chunk(h))?;
                        head.kind == CHUNK_LARGE && head.blocks > 0 && c < h.saturating_add(head.run)
                    }
                }
                _ => false,
            };
            // A fenced node's own empty chunk: it may have taken it just
            // before it stopped and place a block there when it wakes (a
            // record and maps stamped below the floor, landing over whoever
            // took the chunk since).
            let owned = matches!(rec.kind, CHUNK_KV | CHUNK_RAW)
                && (1..=l.caps.max_nodes).contains(&rec.owner)
                && kept & (1 << rec.owner.wrapping_sub(1)) != 0
                && !mutant!("recover.reuse_fenced_chunk");
            let holder = releasing
                .iter()
                .position(|&(first, k)| k != 0 && (first..first.saturating_add(k)).contains(&c))
                .or(owned.then(|| rec.owner.wrapping_sub(1) as usize));
            if let (false, Some(n)) = (keep, holder) {
                // Not in use, and a fenced node's release of it, or its
                // placement there, may land still: nobody takes it until
                // that node is quiet.
                let held = ChunkRecord {
                    owner: (n as u32).wrapping_add(1),
                    kind: CHUNK_HELD,
                    taint,
                    ..ChunkRecord::default()
                };
                if rec != held {
                    st.view.write(l.chunk(c), &held)?;
                }
                write_map(st, c, &ChunkMap::empty(l.granules()), 0, words, None)?;
                set_bitmap(st, c, true)?;
                continue;
            }
            if !keep {
                let free = ChunkRecord { taint, ..ChunkRecord::default() };
                if rec != free {
                    if rec != (ChunkRecord { taint: rec.taint, ..ChunkRecord::default() }) {
                        rep.chunks_reclaimed = rep.chunks_reclaimed.saturating_add(1);
                    }
                    st.view.write(l.chunk(c), &free)?;
                }
                // A free chunk's maps are empty (the next owner relies on it).
                write_map(st, c, &ChunkMap::empty(l.granules()), 0, words, None)?;
                set_bitmap(st, c, false)?;
                continue;
            }
            if rec.taint != taint {
                rec.taint = taint;
                st.view.write(l.chunk(c), &rec)?;
            }
            let owner_kept =
                rec.owner != 0 && rec.owner <= l.caps.max_nodes && owners & (1 << rec.owner.wrapping_sub(1)) != 0;
            if rec.kind == CHUNK_KV || rec.kind == CHUNK_RAW && !owner_kept {
                // Rebuilt in steps 1 to 3 (claims counted its blocks): the
                // maps in this host's view are recovery's own.
                let free_max = read_map(st, c, None)?.longest_free();
                if free_max != rec.free_max {
                    rec.free_max = free_max;
                    st.view.write(l.chunk(c), &rec)?;
                }
            }
            set_bitmap(st, c, true)?;
            if matches!(rec.kind, CHUNK_KV | CHUNK_RAW | CHUNK_LARGE) && (1..=l.caps.max_nodes).contains(&rec.owner) {
                // Stamped with this recovery's ticket of the owner's heap
                // lock, which step 7 makes that lock's floor, and with the
                // checksum of the maps as rebuilt (or kept): so the chunk is
                // not void, and a revoked holder's record or map line that
                // lands later is.
                let owner = rec.owner.wrapping_sub(1);
                let stamped = ChunkRecord {
                    ticket: self.ticket(l.locks().heap(owner))?,
                    map_sum: read_map(st, c, None)?.checksum(),
                    ..rec
                };
                if stamped != rec {
                    st.view.write(l.chunk(c), &stamped)?;
                }
            }
        }
        Ok(())
    }

    /// Step 6: Dead nodes: free slots, or fence those not known quiet
    /// (`kept`). Their journals, heartbeats and request lines are left as
    /// they are: nothing reads a free node's journal or heartbeat, its stale
    /// request bits only make the manager look at a lock, and whoever
    /// attaches the slot clears them all before turning it ALIVE (see
    /// `attach_node`). Clearing them here would race that: a clearing
    /// landing after FREE could wipe what the next attacher wrote. A freed
    /// node's pins go with its slot (evictors read a journal only while its
    /// slot is not free); a fenced one's hold until it is freed.
    fn free_dead(&self, dead: u64, kept: u64, rep: &mut RecoverReport) -> Result<()> {
        let st = self.store;
        let l = &st.layout;
        for n in 0..l.caps.max_nodes {
            if dead & (1 << n) == 0 {
                continue;
            }
            // Read fresh in step 0.
            let old: NodeInfo = st.view.read(l.node_info(n))?;
            if kept & (1 << n) != 0 {
                // Its pins hold too (evictors read its journal while the
                // slot is not free): it may still read those blocks.
                rep.nodes_fenced |= 1 << n;
                if old.state != NODE_FENCED {
                    // The line keeps its nonce and incarnation: the node's
                    // own `quiesce` checks them.
                    let fenced = NodeInfo { state: NODE_FENCED, ..old };
                    st.publish_state_last(l.node_info(n), &fenced, Site("recover.node.fence"))?;
                }
                continue;
            }
            rep.pins_dropped = rep.pins_dropped.saturating_add(self.pins_in_journal(n)?);
            // The slot keeps its incarnation.
            let free = NodeInfo { incarnation: old.incarnation, ..NodeInfo::default() };
            st.publish_state_last(l.node_info(n), &free, Site("recover.node.free"))?;
            rep.nodes_freed |= 1 << n;
        }
        Ok(())
    }

    /// Step 7: Every lock of core is repaired now, and its floor is this
    /// recovery's ticket: every stripe header was stamped with it, so one
    /// stamped below it was written by a revoked holder after this repair.
    fn repair_core_locks(&self, rep: &mut RecoverReport, raise: bool) -> Result<()> {
        let st = self.store;
        let l = &st.layout;
        for lock in 0..l.locks().n_core() {
            // The line as this host last saw it: nothing written below needs
            // it current. The manager takes from the line only a larger
            // count and floor (both raised to this recovery's ticket here)
            // and, by that floor, the clear of `repair` (see `LockMemo`);
            // the holder and round-robin fields are its own to rewrite.
            let mut ll: LockLine = st.view.read(l.lock_line(lock))?;
            let before = ll;
            let ticket = self.ticket(lock)?;
            if ll.repair != 0 {
                ll.repair = 0;
                rep.locks_repaired = rep.locks_repaired.saturating_add(1);
            }
            // Never behind the ticket this recovery holds (see lock.rs).
            ll.grant_seq = ll.grant_seq.max(ticket);
            if raise {
                ll.floor = ll.floor.max(ticket);
            }
            if ll != before {
                st.publish(l.lock_line(lock), &ll, Site("recover.lock.repaired"))?;
            }
        }
        Ok(())
    }

    /// Stripe `s`'s repair floor as this recovery's grant carried it (its
    /// own slot, as its poll read it): the manager's, which it learns from
    /// every recovery's release as well as from the line.
    fn stripe_floor(&self, s: u32) -> Result<u64> {
        let l = &self.store.layout;
        let mine: LockSlot = self.store.view.read(l.lock_slot(l.locks().stripe(s), self.id))?;
        Ok(mine.reserved.get(GRANT_FLOOR).copied().unwrap_or(0))
    }

    /// The nodes (of `kept`: dead, not known quiet) that may still write
    /// back a line of the chunk whose record is `rec`, by what this repair
    /// finds: the owner's heap lock was revoked from a holder, or the
    /// record is void (stamped below that lock's floor: a late write-back
    /// landed, and more may follow). Which of them held the lock is not
    /// known, so it is all of them: each bit goes when its node is quiet
    /// (see [`ChunkRecord::taint`]). A free chunk needs none: a chunk taken
    /// or given back under the alloc lock is journaled first, and a fenced
    /// node's are held for it (see `releases_in_flight`).
    fn taint_due(&self, rec: &ChunkRecord, kept: u64) -> Result<u64> {
        let l = &self.store.layout;
        if kept == 0 || mutant!("recover.skip_taint") {
            return Ok(0);
        }
        if !(1..=l.caps.max_nodes).contains(&rec.owner) {
            return Ok(0);
        }
        let heap = l.locks().heap(rec.owner.wrapping_sub(1));
        let void = matches!(rec.kind, CHUNK_KV | CHUNK_RAW | CHUNK_LARGE)
            && rec.ticket < self.grant_word(heap, GRANT_FLOOR)?;
        Ok(if void || self.grant_word(heap, GRANT_REPAIR)? != 0 { kept } else { 0 })
    }

    /// Word `i` of the grant of `lock` this recovery holds (its own slot, as
    /// its poll read it).
    fn grant_word(&self, lock: u32, i: usize) -> Result<u64> {
        let l = &self.store.layout;
        let mine: LockSlot = self.store.view.read(l.lock_slot(lock, self.id))?;
        Ok(mine.reserved.get(i).copied().unwrap_or(0))
    }

    /// The ticket this recovery holds `lock` under: its own slot, as its
    /// poll read it.
    fn ticket(&self, lock: u32) -> Result<u64> {
        let l = &self.store.layout;
        let mine: LockSlot = self.store.view.read(l.lock_slot(lock, self.id))?;
        Ok(mine.seq)
    }

    /// Marks the block of `len` bytes at `off` in use. Caller holds every
    /// lock. `Already` when exactly that block is claimed already, `No` when
    /// no chunk record allows it or it overlaps another block. A chunk step 1
    /// left alone (a live node's raw chunk) is its owner's record, read by
    /// nobody here: `Already` without a look.
    fn claim_block(&self, off: u64, len: u64, raw: bool, owners: u64) -> Result<Claim> {
        let st = self.store;
        let l = &st.layout;
        let Ok(c) = chunk_of(l, off) else { return Ok(Claim::No) };
        // Fresh since step 1 (read and written only by recovery, which holds
        // every lock); written back with the chunk table at the end.
        let mut rec: ChunkRecord = st.view.read(l.chunk(c))?;
        let base = l.chunk_payload(c);
        let kind_ok = match rec.kind {
            CHUNK_KV => !raw,
            CHUNK_RAW => raw,
            CHUNK_LARGE => (rec.large_kind == CHUNK_RAW) == raw,
            _ => false,
        };
        if !kind_ok || len == 0 {
            return Ok(Claim::No);
        }
        let owner_kept =
            rec.owner != 0 && rec.owner <= l.caps.max_nodes && owners & (1 << rec.owner.wrapping_sub(1)) != 0;
        if raw && owner_kept {
            return Ok(Claim::Already);
        }
        if rec.kind == CHUNK_LARGE {
            if off != base || len > rec.block_size {
                return Ok(Claim::No);
            }
            if rec.blocks != 0 {
                return Ok(Claim::Already);
            }
            rec.blocks = 1;
            rec.used = l.granules();
            st.view.write(l.chunk(c), &rec)?;
            return Ok(Claim::New);
        }
        let g = l.granule();
        let Some(rel) = off.checked_sub(base) else { return Ok(Claim::No) };
        let Some(i) = rel.checked_div(g).filter(|_| rel.is_multiple_of(g) && len <= l.chunk_size()) else {
            return Ok(Claim::No);
        };
        let (i, k) = (i as u32, len.div_ceil(g) as u32);
        let mut m = read_map(st, c, None)?;
        if m.extent(i) == Some(k) {
            return Ok(Claim::Already);
        }
        if !m.is_free(i, k) {
            return Ok(Claim::No);
        }
        m.set(i, k);
        write_map(st, c, &m, (i / 64) as usize, i.saturating_add(k).div_ceil(64) as usize, None)?;
        rec.blocks = rec.blocks.saturating_add(1);
        rec.used = rec.used.saturating_add(k);
        st.view.write(l.chunk(c), &rec)?;
        Ok(Claim::New)
    }

    /// Rebuilds stripe `s`; returns how many blocks its entries claimed.
    fn rebuild_stripe(&self, s: u32, who: Census, rep: &mut RecoverReport) -> Result<u64> {
        let st = self.store;
        let l = &st.layout;
        let old: StripeHeader = st.fresh(l.stripe(s), Site("recover.stripe.read"))?;
        let ticket = self.ticket(l.locks().stripe(s))?;
        // Every bucket stamped with this recovery's ticket, the floor to be
        // (see `Bucket::stamp`).
        let stamp = if mutant!("recover.keep_bucket_stamps") { 0 } else { ticket as u32 };
        for b in 0..l.buckets_per_stripe {
            st.view.write(l.bucket(s, b), &Bucket { stamp, ..Bucket::default() })?;
        }
        let blen = (l.buckets_per_stripe as u64).saturating_mul(core::mem::size_of::<Bucket>() as u64);
        st.co.flush(&st.view, l.bucket(s, 0), blen, Site("recover.buckets.clear"))?;
        let (mut claimed, mut ready, mut bytes) = (0u64, 0u32, 0u64);
        let stamp = Stamp { ticket, floor: self.stripe_floor(s)? };
        for e in 0..l.caps.entries_per_stripe {
            match self.rebuild_entry(s, e, who, stamp, rep)? {
                Rebuilt::Dropped | Rebuilt::Held => {}
                Rebuilt::Writing | Rebuilt::Quarantined => claimed = claimed.saturating_add(1),
                Rebuilt::Ready(len) => {
                    claimed = claimed.saturating_add(1);
                    ready = ready.saturating_add(1);
                    bytes = bytes.saturating_add(len);
                }
            }
        }
        let ticket = stamp.ticket;
        let lru_ok = self.lru_consistent(s, &old, ready)?;
        // What the rebuild dropped is not logged one by one: a new change
        // number that no record carries becomes the floor, so every reader
        // of the stripe's change log meets a gap and rescans. The header
        // may be void (a revoked holder's, written after the last repair):
        // the log's records then count too, and the number skips a whole
        // log, past any record that holder's writes may have hidden.
        let skip = mutant!("changes.no_recovery_gap");
        let void = old.ticket < stamp.floor;
        rep.void_stripes = rep.void_stripes.saturating_add(u32::from(void));
        let logged = if void { self.store.changes_logged(s)?.saturating_add(l.caps.change_records as u64) } else { 0 };
        let changes = if skip { old.changes } else { old.changes.max(old.changes_floor).max(logged).wrapping_add(1) };
        let mut h = StripeHeader {
            ticket,
            live: ready,
            bytes,
            inserts: old.inserts,
            evictions: old.evictions,
            changes,
            changes_floor: if skip { old.changes_floor } else { changes },
            ..StripeHeader::default()
        };
        h.lru_head = if lru_ok { old.lru_head } else { NIL };
        h.lru_tail = if lru_ok { old.lru_tail } else { NIL };
        self.relink(s, &mut h, lru_ok, ticket)?;
        self.restamp_expiry(s, stamp, rep)?;
        st.publish(l.stripe(s), &h, Site("recover.stripe.write"))?;
        Ok(claimed)
    }

    /// Stamps every expiry line of stripe `s` with this recovery's ticket
    /// (the floor to be): a stamp of the generation its entry now has
    /// stays, in a line that is not void; any other is made expired (its
    /// block, should it be a tenant's and stored, is then missing and goes
    /// first: nothing tells how long it had). So no late line can lengthen
    /// a block's life, and every line is valid under the new floor.
    fn restamp_expiry(&self, s: u32, stamp: Stamp, rep: &mut RecoverReport) -> Result<()> {
        let st = self.store;
        let l = &st.layout;
        let (off, len) = l.expiry_lines(s);
        // SYNC: fresh expiry lines (writer: reserves under the stripe lock,
        // which this recovery holds now).
        st.co.invalidate(&st.view, off, len, Site("recover.expiry.read"))?;
        let eps = l.caps.entries_per_stripe;
        for first in (0..eps).step_by(EXPIRY_SLOTS as usize) {
            let at = l.expiry_line(s, first);
            let mut x: ExpiryLine = st.view.read(at)?;
            let void = x.ticket < stamp.floor;
            for (i, w) in (first..eps).zip(x.at.iter_mut()) {
                let ent = st.ent(s, i)?;
                if void || crate::index::expiry::stamp_for(*w, ent.gen).is_none() {
                    let tenants = ent.state == state::READY && self.tenant_of(ent.ns).is_ok_and(|t| t.is_some());
                    rep.lost_stamps = rep.lost_stamps.saturating_add(u64::from(tenants && !void));
                    *w = crate::index::expiry::stamp(1, ent.gen);
                }
            }
            x.ticket = stamp.ticket;
            st.view.write(at, &x)?;
        }
        // SYNC: the lines restamped, in memory before the stripe's lock is
        // released with its new floor (reader: lookups, reserves).
        st.co.flush(&st.view, off, len, Site("recover.expiry.write"))
    }

    /// Entry `e` of stripe `s`: kept (its block re-claimed, its bucket
    /// inserted) when intact, its writer alive and journaled, and its key
    /// not kept already; quarantined (its block re-claimed, in no bucket)
    /// when intact and its writer is dead and not known quiet; emptied
    /// otherwise.
    fn rebuild_entry(&self, s: u32, e: u32, who: Census, stamp: Stamp, rep: &mut RecoverReport) -> Result<Rebuilt> {
        let Census { dead, alive, kept } = who;
        let st = self.store;
        let l = &st.layout;
        let mut ent = match st.ent(s, e) {
            Ok(x) => x,
            Err(Error::Changed) => Entry { ver: 0, state: u8::MAX, ..Entry::default() },
            Err(err) => return Err(err),
        };
        let before = ent;
        let writer_kept = ent.pinners().count_ones() == 1 && ent.pinners() & kept != 0;
        let late_write = matches!(ent.state, state::WRITING | state::QUARANTINED) && writer_kept;
        // A global entry number: below the region's entry count.
        let g = s.wrapping_mul(l.caps.entries_per_stripe).wrapping_add(e);
        if ent.ticket < stamp.floor
            && !late_write
            && !mutant!("recover.keep_void_entry")
            && !self.held_live(g, ent.gen, alive)?
        {
            // Void: a revoked holder's line, written back after the last
            // repair over what the entry held since (which is lost: its
            // block, claimed by no entry now, goes back to the heap). What
            // it names is that holder's old view: the block may have been
            // freed and taken since. Dropped, claiming nothing, unless a
            // live node's journal holds the entry at the line's generation
            // (a pin or the writer's reservation: the block is still the
            // entry's, whatever else the line got wrong). (A fenced
            // writer's own reservation, landed late, is not void: steps 3
            // and 3b keep its place.)
            // The entry may have held a live node's pin or reservation at a
            // later generation (its block kept for that node's record: see
            // `claim_journaled`): the entry goes on at the latest generation
            // any live journal names, so the next reservation there takes a
            // newer one than every record of it.
            rep.entries_dropped = rep.entries_dropped.saturating_add(1);
            let gen =
                if mutant!("recover.void_drop_keeps_gen") { ent.gen } else { self.journaled_gen(g, alive | kept)? };
            ent = Entry { ver: ent.ver & !1, gen: ent.gen.max(gen), lru_prev: NIL, lru_next: NIL, ..Entry::default() };
            st.put_ent(s, e, &mut ent, stamp.ticket)?;
            return Ok(Rebuilt::Dropped);
        }
        if ent.state == state::CLAIMED && !mutant!("recover.drop_claimed") {
            // Its evictor died looking for pins: it may be pinned.
            ent.state = state::READY;
        }
        let mut keep = false;
        let quarantine = matches!(ent.state, state::WRITING | state::QUARANTINED) && writer_kept;
        let intact = ent.checksum == entry_checksum(&ent);
        if quarantine && intact && (ent.payload_len == 0 || !mutant!("recover.quarantine_first")) {
            // A place held for its writer (no block), or an entry that
            // claims its block in step 3b, after every other: on no list.
            if ent.lru_prev != NIL || ent.lru_next != NIL {
                ent.lru_prev = NIL;
                ent.lru_next = NIL;
                st.put_ent(s, e, &mut ent, stamp.ticket)?;
            }
            return Ok(Rebuilt::Held);
        }
        if quarantine && intact && ent.payload_len > 0 {
            // Its writer may still store into the block, or its cache write
            // it back late: the block stays allocated, out of readers' reach.
            if self.claim_block(ent.payload_off, ent.payload_len as u64, false, alive)? == Claim::New {
                rep.writes_quarantined = rep.writes_quarantined.saturating_add(1);
                ent.state = state::QUARANTINED;
                ent.lru_prev = NIL;
                ent.lru_next = NIL;
                if ent != before {
                    st.put_ent(s, e, &mut ent, stamp.ticket)?;
                }
                return Ok(Rebuilt::Quarantined);
            }
        }
        if ent.state == state::QUARANTINED {
            // Its writer is quiet now (or the entry names no fenced node):
            // the reservation ends as a dead writer's does.
            rep.writes_aborted = rep.writes_aborted.saturating_add(1);
        }
        if ent.state == state::WRITING || ent.state == state::READY {
            // A live writer counts only if its journal records the
            // reservation. (No mutant here: the protocol never leaves one
            // without, since a node journals a reservation before it sets
            // the bit, under the same stripe lock; only damage to the region
            // does, which this repairs and `check` reports.)
            for n in 0..l.caps.max_nodes {
                if ent.pinners() & alive & (1 << n) != 0 && !self.journaled(n, g, ent.gen)? {
                    ent.set_writer(None);
                    rep.pins_dropped = rep.pins_dropped.saturating_add(1);
                }
            }
            let intact = ent.checksum == entry_checksum(&ent) && ent.payload_len > 0;
            let writer_gone = ent.state == state::WRITING && (ent.pinners() & alive == 0 || ent.pinners() & dead != 0);
            if ent.state == state::READY {
                // Pins live in journals only; a published entry names no
                // node (a bit here is damage, which `check` reports).
                ent.set_writer(None);
            }
            if !intact {
                rep.entries_dropped = rep.entries_dropped.saturating_add(1);
            } else if writer_gone {
                rep.writes_aborted = rep.writes_aborted.saturating_add(1);
            } else if self.claim_block(ent.payload_off, ent.payload_len as u64, false, alive)? != Claim::New {
                rep.entries_dropped = rep.entries_dropped.saturating_add(1);
            } else {
                let key = Key { lo: ent.key_lo, hi: ent.key_hi };
                let tag = place(ent.ns, key);
                if probe::find(st, s, tag, ent.ns, key)?.is_some() {
                    // A duplicate of a key already rebuilt: drop this one
                    // and give back the block it just claimed.
                    rep.entries_dropped = rep.entries_dropped.saturating_add(1);
                    self.unclaim_block(ent.payload_off, ent.payload_len as u64)?;
                } else {
                    probe::insert(st, s, tag, e, stamp.ticket, None)?;
                    keep = true;
                }
            }
        }
        let out = if !keep {
            // A dropped entry keeps its generation: nothing matches an EMPTY
            // entry, and whoever takes it next advances the generation
            // (reserve), so no handle or reader of what it held can match
            // what it holds next. (A bump here was a mutant that changed no
            // outcome.)
            ent = Entry { ver: ent.ver & !1, gen: ent.gen, lru_prev: NIL, lru_next: NIL, ..Entry::default() };
            Rebuilt::Dropped
        } else if ent.state == state::READY {
            Rebuilt::Ready(ent.payload_len as u64)
        } else {
            Rebuilt::Writing
        };
        if ent != before {
            st.put_ent(s, e, &mut ent, stamp.ticket)?;
        }
        Ok(out)
    }

    /// Whether a live node's journal holds global entry `g` at `gen` (a pin,
    /// or its writer's reservation). The mutant takes none for held.
    fn held_live(&self, g: u32, gen: u32, alive: u64) -> Result<bool> {
        if mutant!("recover.drop_pinned_void") {
            return Ok(false);
        }
        for n in (0..self.store.layout.caps.max_nodes).filter(|&n| alive & (1 << n) != 0) {
            if self.journaled(n, g, gen)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether the stripe's old LRU list is a consistent list of exactly its
    /// `ready` READY entries (then recovery keeps its order).
    fn lru_consistent(&self, s: u32, old: &StripeHeader, ready: u32) -> Result<bool> {
        let st = self.store;
        let eps = st.layout.caps.entries_per_stripe;
        let (mut prev, mut cur, mut n) = (NIL, old.lru_head, 0u32);
        while cur != NIL {
            if n >= ready || cur >= eps {
                return Ok(false);
            }
            let ent = st.ent(s, cur)?;
            if ent.state != state::READY || ent.lru_prev != prev {
                return Ok(false);
            }
            n = n.saturating_add(1);
            prev = cur;
            cur = ent.lru_next;
        }
        Ok(n == ready && prev == old.lru_tail)
    }

    /// Links the stripe's EMPTY entries into the free list in index order,
    /// and its READY ones into the LRU list in index order unless `lru_ok`
    /// (the old list stands); WRITING entries are on no list.
    /// Every entry is written back stamped with `ticket` (this recovery's
    /// grant of the stripe lock, the floor it leaves): below it, an entry is
    /// a revoked holder's late line.
    fn relink(&self, s: u32, h: &mut StripeHeader, lru_ok: bool, ticket: u64) -> Result<()> {
        let st = self.store;
        let mut free_prev = NIL;
        h.free_head = NIL;
        let mut last_ready = NIL;
        for e in 0..st.layout.caps.entries_per_stripe {
            let mut ent = st.ent(s, e)?;
            let before = ent;
            match ent.state {
                state::EMPTY => {
                    ent.lru_prev = NIL;
                    ent.lru_next = NIL;
                    if free_prev == NIL {
                        h.free_head = e;
                    } else {
                        let mut p = st.ent(s, free_prev)?;
                        p.lru_next = e;
                        st.put_ent(s, free_prev, &mut p, ticket)?;
                    }
                    free_prev = e;
                }
                state::READY if !lru_ok => {
                    ent.lru_prev = last_ready;
                    ent.lru_next = NIL;
                    if last_ready == NIL {
                        h.lru_head = e;
                    } else {
                        let mut p = st.ent(s, last_ready)?;
                        p.lru_next = e;
                        st.put_ent(s, last_ready, &mut p, ticket)?;
                    }
                    last_ready = e;
                    h.lru_tail = e;
                }
                state::WRITING => {
                    ent.lru_prev = NIL;
                    ent.lru_next = NIL;
                }
                _ => {}
            }
            if ent != before || ent.ticket != ticket {
                st.put_ent(s, e, &mut ent, ticket)?;
            }
        }
        Ok(())
    }

    /// How many records of node `n`'s journal pin a published entry at its
    /// generation: the pins its slot's freeing drops, for the report.
    fn pins_in_journal(&self, n: u32) -> Result<u64> {
        let st = self.store;
        let l = &st.layout;
        let eps = l.caps.entries_per_stripe;
        let recs = (l.caps.pin_slots as u64).saturating_mul(core::mem::size_of::<PinRecord>() as u64);
        // SYNC: fresh records for a count only (no outcome depends on it).
        st.co.invalidate(&st.view, l.pin_record(n, 0), recs, Site("recover.dead_pins.report"))?;
        let mut pins = 0u64;
        for i in 0..l.caps.pin_slots {
            let r: PinRecord = st.view.read(l.pin_record(n, i))?;
            let g = r.entry.wrapping_sub(1);
            let (Some(s), Some(e)) = (g.checked_div(eps), g.checked_rem(eps)) else { continue };
            if r.entry == 0 || r.count == 0 || s >= l.caps.n_stripes {
                continue;
            }
            // Rebuilt in step 3 by this recovery: this host's view is current.
            let ent: Entry = st.view.read(l.entry(s, e))?;
            pins = pins.saturating_add((ent.state == state::READY && ent.gen as u64 == r.gen) as u64);
        }
        Ok(pins)
    }

    /// Step 3c: every block a live or fenced node's journal names stays
    /// allocated. An entry's own block is claimed already (step 3); one
    /// claimed here belongs to an entry the rebuild lost (a revoked
    /// holder's line landed over it: seed 115015) while a node still pins
    /// it, or writes into it: that node lets go of it (see
    /// `Node::let_go_lost`). Returns how many blocks it claimed.
    fn claim_journaled(&self, nodes: u64) -> Result<u64> {
        if mutant!("recover.no_journal_claims") {
            return Ok(0);
        }
        let st = self.store;
        let l = &st.layout;
        let recs = (l.caps.pin_slots as u64).saturating_mul(core::mem::size_of::<PinRecord>() as u64);
        let mut claimed = 0u64;
        for n in (0..l.caps.max_nodes).filter(|&n| nodes & (1 << n) != 0) {
            // SYNC: fresh records (writer: node n, which names a block in
            // its record before the entry names it, under the stripe lock
            // this recovery holds now).
            st.co.invalidate(&st.view, l.pin_record(n, 0), recs, Site("recover.journal.blocks"))?;
            for i in 0..l.caps.pin_slots {
                let r: PinRecord = st.view.read(l.pin_record(n, i))?;
                if r.entry != 0 && r.count > 0 && self.claim_block(r.off, r.len, false, nodes)? == Claim::New {
                    claimed = claimed.saturating_add(1);
                }
            }
        }
        Ok(claimed)
    }

    /// The latest generation at which a journal of `nodes` records global
    /// entry `g` (0: none). Called for a void entry no live journal holds
    /// at its line's generation, when every journal of `nodes` is fresh in
    /// this recovery: live ones read by `held_live` just now, fenced ones
    /// in step 2b. (A record made since pins a READY entry at its own
    /// generation, which this void one is not.)
    fn journaled_gen(&self, g: u32, nodes: u64) -> Result<u32> {
        let l = &self.store.layout;
        let mut gen = 0u32;
        for n in (0..l.caps.max_nodes).filter(|&n| nodes & (1 << n) != 0) {
            for i in 0..l.caps.pin_slots {
                let r: PinRecord = self.store.view.read(l.pin_record(n, i))?;
                if r.entry == g.wrapping_add(1) && r.count > 0 {
                    // Generations are u32s (an entry's); a larger record is damage.
                    gen = gen.max(u32::try_from(r.gen).unwrap_or(0));
                }
            }
        }
        Ok(gen)
    }

    /// True when node `n`'s journal records global entry `g` at `gen`.
    fn journaled(&self, n: u32, g: u32, gen: u32) -> Result<bool> {
        let l = &self.store.layout;
        for i in 0..l.caps.pin_slots {
            let r: PinRecord = self.store.fresh(l.pin_record(n, i), Site("recover.journal.find"))?;
            if r.entry == g.wrapping_add(1) && r.gen == gen as u64 && r.count > 0 {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn unclaim_block(&self, off: u64, len: u64) -> Result<()> {
        let st = self.store;
        let l = &st.layout;
        let c = chunk_of(l, off)?;
        // As in `claim_block`.
        let mut rec: ChunkRecord = st.view.read(l.chunk(c))?;
        if rec.kind == CHUNK_LARGE {
            rec.blocks = 0;
            rec.used = 0;
            return st.view.write(l.chunk(c), &rec);
        }
        let g = l.granule();
        let Some(i) = off.checked_sub(l.chunk_payload(c)).and_then(|rel| rel.checked_div(g)) else { return Ok(()) };
        let i = i as u32;
        let mut m = read_map(st, c, None)?;
        if m.extent(i) == Some(len.div_ceil(g) as u32) {
            let k = len.div_ceil(g) as u32;
            m.clear(i, k);
            write_map(st, c, &m, (i / 64) as usize, i.saturating_add(k).div_ceil(64) as usize, None)?;
            rec.blocks = rec.blocks.saturating_sub(1);
            rec.used = rec.used.saturating_sub(k);
            st.view.write(l.chunk(c), &rec)?;
        }
        Ok(())
    }
}

/// Who is who, for a recovery (see `census`).
#[derive(Clone, Copy)]
struct Census {
    /// Declared dead (or named by the caller), fenced ones included.
    dead: u64,
    /// Attached, and this node.
    alive: u64,
    /// Dead and not known quiet: their reservations and raw blocks stay.
    kept: u64,
}

/// What recovery made of one entry.
enum Rebuilt {
    /// Emptied.
    Dropped,
    /// Left for step 3b: its writer is dead and not known quiet.
    Held,
    /// Kept, still being written by a live node (its block claimed).
    Writing,
    /// Kept, its writer dead and not known quiet (its block claimed).
    Quarantined,
    /// Kept, published (its block claimed), with this many payload bytes.
    Ready(u64),
}

/// Outcome of claiming a block during recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Claim {
    /// Claimed now.
    New,
    /// Already claimed (by a live owner's record or an earlier claim).
    Already,
    /// No chunk record allows it.
    No,
}

/// What a recovery stamps a stripe's lines with (its grant of the stripe
/// lock) and the floor its grant carried (lines stamped below are void).
#[derive(Clone, Copy)]
struct Stamp {
    ticket: u64,
    floor: u64,
}
