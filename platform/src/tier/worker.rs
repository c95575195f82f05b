//! The tier thread: rebuilds its index from the slot headers, answers
//! promotion requests and spills the region's coldest blocks.

use super::*;

/// The tier thread's state.
struct State {
    devs: Vec<Dev>,
    geo: Geometry,
    index: HashMap<(u32, Key), Loc>,
    /// Free slots per drive.
    free: Vec<Vec<u32>>,
    /// Blocks in the order they were written (oldest first), to drop when
    /// the drives are full.
    order: std::collections::VecDeque<(u32, Key, u64)>,
    /// The region's blocks the tier keeps copies of when it cannot keep
    /// all: each stripe's coldest (as many as the drives hold, spread over
    /// the stripes), recomputed at each spill. `None`: keep anything
    /// (`spill_all`), dropping the oldest when full.
    window: Option<std::collections::HashSet<(u32, Key)>>,
    seq: u64,
    next_dev: usize,
    /// One buffer per block of a batch.
    bufs: Vec<Aligned>,
    io: crate::nvme::Io,
    counters: Arc<TierCounters>,
    slot_bytes: u64,
}

/// Header `h` (as a drive holds it) under the id its namespace has in the
/// region now: a registered namespace is found, or registered, by its
/// digest; an application's own id is kept. `None` when a registered one
/// cannot be (a full root table) or the header names an id from 2^31 up
/// without a digest.
fn here(node: &Node, mut h: Header) -> Option<Header> {
    if h.digest != [0; 16] {
        h.ns = node.namespace_of_digest(h.digest).ok()?;
    } else if h.ns >= cxlkv_core::namespaces::REGISTERED {
        return None;
    }
    Some(h)
}

/// Counts an error and logs it.
fn log_error(counters: &TierCounters, what: std::fmt::Arguments<'_>) {
    counters.add(|c| c.errors += 1);
    eprintln!("cxlkv tier: {what}");
}

pub(super) fn run(
    node: Arc<Node>,
    opts: TierOptions,
    (devs, geo): (Vec<Dev>, Geometry),
    stop: Arc<Flag>,
    counters: Arc<TierCounters>,
    cmd: mpsc::Receiver<Command>,
    ready: Arc<Answer<Result<()>>>,
) -> Result<()> {
    // What a tier thread needs to keep up on a busy host: the highest
    // best-effort I/O priority (any process may take it) and a raised CPU
    // priority (where allowed).
    let (io_priority, cpu_priority) = (crate::host::raise_io_priority(), crate::host::raise_cpu_priority());
    counters.add(|c| {
        c.io_priority = io_priority;
        c.cpu_priority = cpu_priority;
    });
    let core = node.core();
    let st = node.store();
    let host = st.view.read::<NodeInfo>(st.layout.node_info(node.id())).map_err(Error::from)?.host_id;
    let bufs = (0..opts.batch.clamp(1, crate::nvme::QUEUE_DEPTH as usize))
        .map(|_| Aligned::new(geo.buf_len(), geo.unit as usize))
        .collect::<Result<Vec<_>>>();
    let bufs = match bufs {
        Ok(b) => b,
        Err(e) => {
            ready.give(Err(e));
            return Ok(());
        }
    };
    let mut dir = match core.tier_claim(host) {
        Ok(d) => d,
        Err(e) => {
            ready.give(Err(e.into()));
            return Ok(());
        }
    };
    let mut s = State {
        free: devs.iter().map(|d| (0..d.slots).rev().collect()).collect(),
        devs,
        geo,
        index: HashMap::new(),
        order: Default::default(),
        window: None,
        seq: 0,
        next_dev: 0,
        bufs,
        io: crate::nvme::Io::new(&[]),
        counters: counters.clone(),
        slot_bytes: opts.slot_bytes,
    };
    s.register_io(st);
    s.rebuild(&node, &mut dir);
    ready.give(Ok(()));
    let mut last_spill = Instant::now() - Duration::from_secs(1);
    while !stop.get() {
        let mut busy = s.answer(&node, &mut dir)?;
        if let Ok(Command::SpillAll(done)) = cmd.try_recv() {
            done.give(s.spill(&node, &mut dir, usize::MAX));
            busy = true;
        }
        if last_spill.elapsed() >= Duration::from_millis(5) {
            last_spill = Instant::now();
            let full = node.stats().map(|x| x.live_bytes as f64 / x.payload_bytes.max(1) as f64).unwrap_or(0.0);
            if full >= opts.high_water && s.spill(&node, &mut dir, opts.batch).unwrap_or(0) > 0 {
                busy = true;
            }
        }
        if !busy {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    dir.release().map_err(Error::from)
}

impl State {
    fn log(&self, what: std::fmt::Arguments<'_>) {
        log_error(&self.counters, what);
    }

    /// Registers the tier's buffers and the region (which drives read
    /// straight into) with the I/O engine when the memlock limit allows;
    /// else the buffers alone; else nothing. The mapping outlives the
    /// engine: the tier thread holds the node until it ends, after `self`.
    fn register_io(&mut self, st: &cxlkv_core::store::Store<crate::flush::Flush>) {
        let bufs: Vec<(*mut u8, usize)> = self.bufs.iter().map(|b| (b.ptr, b.layout.size())).collect();
        let mut all = bufs.clone();
        all.push((st.view.base(), st.view.len() as usize));
        if !self.io.register(&all) {
            self.io.register(&bufs);
        }
        let (engine, registered) = (self.io.engine(), self.io.registered());
        self.counters.add(|c| {
            c.engine = Some(engine);
            c.registered_bytes = registered;
        });
    }

    /// Answers every promotion request waiting in the node's inbox (the
    /// blocks it put back into the region), and refuses any other request.
    /// True when there was any.
    fn answer(&mut self, node: &Node, dir: &mut cxlkv_core::tier::TierDir<'_, crate::flush::Flush>) -> Result<bool> {
        let mut any = false;
        while let Some((m, keys)) = node.try_recv()? {
            any = true;
            if m.kind == KIND_TIER_PROMOTE {
                let asks: Vec<(u32, Key)> = keys.iter().map(|k| (m.ns, *k)).collect();
                let mut there = Vec::with_capacity(keys.len());
                for batch in asks.chunks(self.bufs.len()) {
                    let ok = self.promote_batch(node, dir, batch);
                    there.extend(batch.iter().zip(ok).filter(|(_, ok)| *ok).map(|((_, k), _)| *k));
                }
                let _ = node.reply(&m, 0, &there);
            } else if m.kind & crate::node::KIND_RESPONSE == 0 {
                let _ = node.reply(&m, CoreError::InvalidArgument as u32, &[]);
            }
        }
        Ok(any)
    }

    /// Reads every slot header and records the blocks whole slot sets hold,
    /// under the ids their namespaces have in the region now.
    fn rebuild(&mut self, node: &Node, dir: &mut cxlkv_core::tier::TierDir<'_, crate::flush::Flush>) {
        let unit = self.geo.unit as usize;
        let mut found: Found = Vec::new();
        for d in 0..self.devs.len() {
            for slot in 0..self.devs[d].slots {
                let buf = self.bufs[0].bytes();
                let r = self.devs[d].file.read_exact_at(&mut buf[..unit], self.devs[d].at(slot));
                let Some(hdr) = r.ok().and_then(|_| Header::read(&buf[..unit])) else { continue };
                let Some(hdr) = here(node, hdr) else {
                    self.log(format_args!("slot {slot} of drive {d}: its namespace cannot be registered here"));
                    continue;
                };
                if hdr.len <= self.slot_bytes && hdr.plen <= self.geo.piece_cap {
                    found.push((d, slot, hdr));
                }
            }
        }
        let (index, _) = whole_blocks(&found);
        self.seq = found.iter().map(|(_, _, h)| h.seq).max().unwrap_or(0);
        let mut held: Vec<((u32, Key), Loc)> = index.into_iter().collect();
        held.sort_by_key(|(_, l)| l.hdr.seq);
        for (k, l) in held {
            // A full directory: the block is dropped and its slots reused.
            if dir.put(l.hdr.ns, l.hdr.key, l.hdr.len).is_ok() {
                self.order.push_back((l.hdr.ns, l.hdr.key, l.hdr.seq));
                self.index.insert(k, l);
            }
        }
        let mut taken: Vec<Vec<bool>> = self.devs.iter().map(|d| vec![false; d.slots as usize]).collect();
        for l in self.index.values() {
            for at in &l.pieces {
                taken[at.dev][at.slot as usize] = true;
            }
        }
        for (d, t) in taken.iter().enumerate() {
            self.free[d] = (0..self.devs[d].slots).rev().filter(|&i| !t[i as usize]).collect();
        }
        let held = self.index.len() as u64;
        self.counters.add(|c| c.held = held);
    }

    /// Copies up to `max` of the region's oldest blocks the tier does not
    /// hold to the drives, a batch at a time; returns how many.
    ///
    /// The policy when the drives cannot hold every block (`max` below
    /// `usize::MAX`): the tier keeps the region's coldest blocks — each
    /// stripe's coldest, as many as the drives hold spread over the stripes
    /// (the window) — and copies only window blocks it does not hold. To
    /// make room it drops, oldest first, a held block outside the window
    /// (one warmed up since it was copied, or one the region no longer
    /// holds); when every held block is in the window it copies nothing
    /// more. A dropped block is outside the window, so it is copied again
    /// only once it is among the coldest again: an idle region is copied
    /// once, never rewritten, and the tier writes what leaves the region's
    /// cold end, not more. `spill_all` copies every block, dropping the
    /// oldest held when full.
    fn spill(
        &mut self,
        node: &Node,
        dir: &mut cxlkv_core::tier::TierDir<'_, crate::flush::Flush>,
        max: usize,
    ) -> Result<u64> {
        let core = node.core();
        let stripes = node.store().layout.caps.n_stripes;
        let all = max == usize::MAX;
        let mut todo = Vec::new();
        let mut cold = Vec::new();
        'stripes: for s in 0..stripes {
            let mut skip = 0usize;
            loop {
                cold.resize(skip + 64, (0u32, Key::default(), 0u64));
                let got = core.coldest(s, &mut cold)?;
                for &(ns, k, len) in cold[..got].iter().skip(skip) {
                    if todo.len() >= max {
                        break 'stripes;
                    }
                    if len <= self.slot_bytes && !self.index.contains_key(&(ns, k)) {
                        todo.push((ns, k, len));
                    }
                }
                if got < cold.len() || !all {
                    break;
                }
                skip = got;
            }
        }
        self.window = None;
        let free = self.free.iter().map(Vec::len).sum::<usize>();
        let need: usize = todo.iter().map(|&(_, _, len)| self.geo.cut(len).0 as usize).sum();
        if !all && !todo.is_empty() && (free < need || dir.live() >= dir.capacity() / 2) {
            // Room must be made: only for window blocks, and only by
            // dropping blocks outside it (see above).
            let room = self.devs.iter().map(|d| d.slots as usize).sum::<usize>() / self.devs.len().max(1);
            let per_stripe = room.min(dir.capacity() as usize / 2).div_ceil(stripes.max(1) as usize).max(1);
            let mut window = std::collections::HashSet::new();
            for s in 0..stripes {
                cold.resize(per_stripe, (0u32, Key::default(), 0u64));
                let got = core.coldest(s, &mut cold)?;
                window.extend(cold[..got].iter().map(|&(ns, k, _)| (ns, k)));
            }
            todo.retain(|&(ns, k, _)| window.contains(&(ns, k)));
            self.window = Some(window);
        }
        let mut n = 0;
        for batch in todo.chunks(self.bufs.len()) {
            n += self.spill_batch(node, dir, batch);
        }
        Ok(n)
    }

    /// Copies one batch of blocks out. Slots are taken first; then each
    /// block, pinned, is copied into its buffer piece by piece and its
    /// writes start at once, while the next block is copied; one sync per
    /// drive once all completed, and only then are the blocks recorded.
    fn spill_batch(
        &mut self,
        node: &Node,
        dir: &mut cxlkv_core::tier::TierDir<'_, crate::flush::Flush>,
        batch: &[(u32, Key, u64)],
    ) -> u64 {
        let mut plans: Vec<Plan> = Vec::new();
        for &(ns, key, len) in batch {
            let (count, _) = self.geo.cut(len);
            let Some(slots) = self.take_slots(dir, count as usize) else { break };
            plans.push(Plan { ns, key, len, slots });
        }
        let State { devs, geo, bufs, io, counters, seq, .. } = self;
        let unit = geo.unit;
        let mut made: Vec<Option<Written>> = Vec::with_capacity(plans.len());
        let mut op_of: Vec<usize> = Vec::new();
        let mut b = io.batch();
        for (i, plan) in plans.iter().enumerate() {
            let w = match plan.copy_out(node, geo, &mut bufs[i], seq) {
                Ok(Some(w)) => w,
                Ok(None) => {
                    made.push(None);
                    continue;
                }
                Err(e) => {
                    log_error(counters, format_args!("copy of a block out of the region failed: {e}"));
                    made.push(None);
                    continue;
                }
            };
            for (j, at) in w.pieces.iter().enumerate() {
                let p = piece(&w.hdr, j, unit);
                let op = crate::nvme::Op {
                    file: &devs[at.dev].file,
                    offset: devs[at.dev].at(at.slot),
                    // Inside buffer `i` (a piece and its header end within
                    // its length).
                    buf: bufs[i].ptr.wrapping_add(p.buf_off),
                    len: unit as usize + round_up(p.len, unit),
                    write: true,
                };
                let k = b.push(op);
                op_of.resize(k + 1, usize::MAX);
                op_of[k] = i;
            }
            made.push(Some(w));
        }
        while let Some((k, r)) = b.wait_one() {
            let i = op_of.get(k).copied().unwrap_or(usize::MAX);
            if let (Err(e), Some(Some(w))) = (r, made.get_mut(i)) {
                if w.ok {
                    let d = w.pieces[0].dev;
                    log_error(counters, format_args!("write of a block to {} failed: {e}", devs[d].path.display()));
                }
                w.ok = false;
            }
        }
        drop(b);
        self.record(dir, &plans, made)
    }

    /// Records the blocks of a spilled batch whose writes all succeeded,
    /// once their drives are synced: the slots are durable on the drives
    /// before the rack learns of them (O_DIRECT bypasses the page cache;
    /// fdatasync flushes the drive's own cache). The slots of the others
    /// are free again. Returns the blocks recorded.
    fn record(
        &mut self,
        dir: &mut cxlkv_core::tier::TierDir<'_, crate::flush::Flush>,
        plans: &[Plan],
        made: Vec<Option<Written>>,
    ) -> u64 {
        let mut synced: Vec<Option<bool>> = vec![None; self.devs.len()];
        let mut n = 0;
        for (plan, m) in plans.iter().zip(made) {
            let ok = match &m {
                Some(w) if w.ok => w
                    .pieces
                    .iter()
                    .all(|at| *synced[at.dev].get_or_insert_with(|| self.devs[at.dev].file.sync_data().is_ok())),
                _ => false,
            };
            let Some(w) = m.filter(|_| ok) else {
                for &(d, slot) in &plan.slots {
                    self.free[d].push(slot);
                }
                continue;
            };
            let hdr = w.hdr;
            if dir.put(hdr.ns, hdr.key, hdr.len).is_err() {
                for at in &w.pieces {
                    self.free[at.dev].push(at.slot);
                }
                continue;
            }
            self.index.insert((hdr.ns, hdr.key), Loc { hdr, pieces: w.pieces });
            self.order.push_back((hdr.ns, hdr.key, hdr.seq));
            n += 1;
            let held = self.index.len() as u64;
            self.counters.add(|c| {
                c.spills += 1;
                c.held = held;
                c.bytes_written += w.io_bytes;
            });
        }
        if synced.contains(&Some(false)) {
            self.log(format_args!("a drive failed to sync: its blocks of this batch were not recorded"));
        }
        n
    }

    /// `count` free slots, on the drives in turn (so a striped block's
    /// pieces land on different drives); when too few are free (or the
    /// directory is full), the oldest blocks held are dropped first.
    fn take_slots(
        &mut self,
        dir: &mut cxlkv_core::tier::TierDir<'_, crate::flush::Flush>,
        count: usize,
    ) -> Option<Vec<Slot>> {
        loop {
            let full = dir.live() >= dir.capacity() / 2;
            if !full && self.free.iter().map(Vec::len).sum::<usize>() >= count {
                let n = self.devs.len();
                let mut got = Vec::with_capacity(count);
                let mut d = self.next_dev;
                while got.len() < count {
                    if let Some(slot) = self.free[d % n].pop() {
                        got.push((d % n, slot));
                    }
                    d += 1;
                }
                self.next_dev = d % n;
                return Some(got);
            }
            // Drop the oldest block held (outside the window, when there
            // is one: see `spill`); none such, no room.
            let victim = self.order.iter().position(|&(ns, key, seq)| {
                self.index.get(&(ns, key)).is_some_and(|l| l.hdr.seq == seq)
                    && self.window.as_ref().is_none_or(|w| !w.contains(&(ns, key)))
            })?;
            // Entries before it are stale (dropped or rewritten since) or in
            // the window: the stale ones go, the others keep their place.
            let mut kept = std::collections::VecDeque::with_capacity(victim);
            for _ in 0..victim {
                if let Some((ns, key, seq)) = self.order.pop_front() {
                    if self.index.get(&(ns, key)).is_some_and(|l| l.hdr.seq == seq) {
                        kept.push_back((ns, key, seq));
                    }
                }
            }
            if let Some((ns, key, _)) = self.order.pop_front() {
                self.forget(dir, ns, key);
            }
            while let Some(e) = kept.pop_back() {
                self.order.push_front(e);
            }
        }
    }

    /// Reads the blocks asked for back into the region. Each block is
    /// reserved and its reads start at once, while the next is reserved;
    /// where its payload is aligned for the drives, they read straight into
    /// it (this host's lines of it flushed first, so none lands later over
    /// what the drive wrote), else into the tier's buffer, copied in after.
    /// Each block is checked and published as soon as its reads completed
    /// (while the others' are in flight): only when every piece's header and
    /// checksum verify; aborted otherwise. `there[i]`: block `i` is in the
    /// region now.
    fn promote_batch(
        &mut self,
        node: &Node,
        dir: &mut cxlkv_core::tier::TierDir<'_, crate::flush::Flush>,
        asks: &[(u32, Key)],
    ) -> Vec<bool> {
        let core = node.core();
        let st = node.store();
        let mut there = vec![false; asks.len()];
        let mut bad: Vec<(u32, Key)> = Vec::new();
        let State { devs, geo, bufs, io, counters, index, .. } = self;
        let unit = geo.unit;
        let mut staged: Vec<Staged> = Vec::new();
        let mut op_of: Vec<usize> = Vec::new();
        let mut b = io.batch();
        for (r, (ns, key)) in asks.iter().enumerate() {
            let Some(loc) = index.get(&(*ns, *key)).cloned() else {
                counters.add(|c| c.misses += 1);
                continue;
            };
            let item = ReserveItem { key: loc.hdr.key, len: loc.hdr.len, tokens: loc.hdr.tokens };
            let mut h = [Err(CoreError::InvalidArgument)];
            let h = match core.reserve_batch(*ns, &[item], &mut h).and(h[0]) {
                Ok(h) => h,
                Err(CoreError::Exists) => {
                    there[r] = true;
                    continue;
                }
                Err(e) => {
                    log_error(counters, format_args!("no room in the region to put a block back: {e}"));
                    continue;
                }
            };
            let i = staged.len();
            let mut s = Staged { r, loc, h, direct: false, left: 0, failed: None, io_bytes: 0 };
            for op in s.reads(st, devs, &bufs[i], unit) {
                let k = b.push(op);
                op_of.resize(k + 1, usize::MAX);
                op_of[k] = i;
            }
            staged.push(s);
        }
        while let Some((k, res)) = b.wait_one() {
            let Some(&i) = op_of.get(k) else { continue };
            let Some(s) = staged.get_mut(i) else { continue };
            s.left -= 1;
            if let Err(e) = res {
                s.failed.get_or_insert(e);
            }
            if s.left > 0 {
                continue;
            }
            let buf = bufs[i].view();
            if !s.verify(st, buf, unit) {
                let _ = core.abort(&s.h);
                let what = match &s.failed {
                    Some(e) => format!("read failed: {e}"),
                    None => "a header or checksum does not match".to_string(),
                };
                let first = &s.loc.pieces[0];
                log_error(
                    counters,
                    format_args!(
                        "block in slot {} of {} unusable ({what}): a miss",
                        first.slot,
                        devs[first.dev].path.display()
                    ),
                );
                bad.push((s.loc.hdr.ns, s.loc.hdr.key));
                counters.add(|c| c.misses += 1);
                continue;
            }
            match s.put_back(&core, buf, unit) {
                Ok(()) => {
                    there[s.r] = true;
                    let (io_bytes, direct) = (s.io_bytes, s.direct);
                    counters.add(|c| {
                        c.promotions += 1;
                        c.bytes_read += io_bytes;
                        c.direct_reads += direct as u64;
                    });
                }
                Err(e) => {
                    let _ = core.abort(&s.h);
                    log_error(counters, format_args!("a block read back could not be published: {e}"));
                }
            }
        }
        drop(b);
        for (ns, key) in bad {
            self.forget(dir, ns, key);
        }
        there
    }

    /// Forgets a block (its record removed, its slots freed for reuse).
    fn forget(&mut self, dir: &mut cxlkv_core::tier::TierDir<'_, crate::flush::Flush>, ns: u32, key: Key) {
        let _ = dir.remove(ns, key);
        if let Some(l) = self.index.remove(&(ns, key)) {
            for at in l.pieces {
                self.free[at.dev].push(at.slot);
            }
        }
        let held = self.index.len() as u64;
        self.counters.add(|c| c.held = held);
    }
}

/// A block chosen to be copied out, and the slots taken for it.
struct Plan {
    ns: u32,
    key: Key,
    len: u64,
    slots: Vec<Slot>,
}

/// A block copied into a tier buffer, its writes queued.
struct Written {
    /// Its first piece's header.
    hdr: Header,
    /// Its pieces, with their checksums.
    pieces: Vec<PieceAt>,
    /// Bytes its writes move.
    io_bytes: u64,
    /// Every one of its writes succeeded so far.
    ok: bool,
}

impl Plan {
    /// Copies the block, pinned, into `buf` piece by piece, each after its
    /// header (with the piece's checksum). `None` when the block is gone,
    /// stored again with another length, or of a registered namespace whose
    /// digest cannot be read.
    fn copy_out(
        &self,
        node: &Node,
        geo: &Geometry,
        buf: &mut Aligned,
        seq: &mut u64,
    ) -> cxlkv_core::Result<Option<Written>> {
        let core = node.core();
        let unit = geo.unit;
        let mut h = [Err(CoreError::InvalidArgument)];
        let Ok(hd) = core.acquire(self.ns, &[self.key], &mut h).and(h[0]) else { return Ok(None) };
        let (count, plen) = geo.cut(hd.len);
        // A registered namespace's digest goes with the block: on the
        // drives it outlives this format of the region and its ids.
        let digest = match node.namespace_digest(self.ns) {
            Ok(Some(d)) => Some(d),
            Ok(None) if self.ns < cxlkv_core::namespaces::REGISTERED => Some([0; 16]),
            _ => None,
        };
        let (Some(digest), true) = (digest, hd.len == self.len && count as usize == self.slots.len()) else {
            // Stored again with another length since it was chosen, or no
            // digest.
            let _ = core.release(&[hd]);
            return Ok(None);
        };
        *seq += 1;
        let hdr = Header {
            ns: self.ns,
            digest,
            tokens: hd.tokens,
            key: self.key,
            len: hd.len,
            seq: *seq,
            sum: 0,
            piece: 0,
            count,
            plen,
        };
        let buf = buf.bytes();
        let mut pieces = Vec::with_capacity(self.slots.len());
        let mut read = Ok(());
        let mut io_bytes = 0;
        for (j, &(dev, slot)) in self.slots.iter().enumerate() {
            let p = piece(&hdr, j, unit);
            let padded = round_up(p.len, unit);
            let body = &mut buf[p.body(unit).start..p.body(unit).start + padded];
            body[p.len..].fill(0);
            // The copy reads the payload fresh (it invalidates this host's
            // lines first), under the pin.
            read = read.and(core.read(&hd, p.at, &mut body[..p.len]));
            pieces.push(PieceAt { dev, slot, sum: payload_sum(&body[..p.len]) });
            io_bytes += (unit as usize + padded) as u64;
        }
        let _ = core.release(&[hd]);
        read?;
        for (j, at) in pieces.iter().enumerate() {
            hdr.of_piece(j, at.sum).write(&mut buf[piece(&hdr, j, unit).header(unit)]);
        }
        Ok(Some(Written { hdr, pieces, io_bytes, ok: true }))
    }
}

/// A block being read back into the region: its reservation, and its
/// reads in flight.
struct Staged {
    /// Its place among the blocks asked for.
    r: usize,
    loc: Loc,
    h: cxlkv_core::index::Handle,
    /// The drives read the payload straight into the reservation.
    direct: bool,
    /// Reads not completed yet.
    left: usize,
    /// The first read that failed.
    failed: Option<std::io::Error>,
    io_bytes: u64,
}

impl Staged {
    /// The reads of the block's pieces (each with its piece number): into
    /// buffer `buf` for the headers, and for the payload too unless it is
    /// aligned for the drives, when they read straight into the
    /// reservation (this host's lines of it flushed first). Counts them.
    fn reads<'a>(
        &mut self,
        st: &cxlkv_core::store::Store<crate::flush::Flush>,
        devs: &'a [Dev],
        buf: &Aligned,
        unit: u64,
    ) -> Vec<crate::nvme::Op<'a>> {
        let h = self.h;
        self.direct = h.off.is_multiple_of(unit)
            && h.len.is_multiple_of(unit)
            && st.view.ptr(h.off, h.len, unit).is_ok()
            // SYNC: this host's lines of the block leave its caches
            // before the drives write it.
            && st.co.flush(&st.view, h.off, h.len, Site("tier.promote.dma")).is_ok();
        let mut ops = Vec::with_capacity(2 * self.loc.pieces.len());
        for (j, at) in self.loc.pieces.iter().enumerate() {
            let p = piece(&self.loc.hdr, j, unit);
            let (dev, body) = (&devs[at.dev], round_up(p.len, unit));
            // Inside the buffer (a piece and its header end within its
            // length).
            let hbuf = buf.ptr.wrapping_add(p.buf_off);
            if self.direct {
                // Inside the reservation: checked by `ptr` above.
                let region = st.view.base().wrapping_add((h.off + p.at) as usize);
                let offset = dev.at(at.slot);
                ops.push(crate::nvme::Op { file: &dev.file, offset, buf: hbuf, len: unit as usize, write: false });
                ops.push(crate::nvme::Op {
                    file: &dev.file,
                    offset: offset + unit,
                    buf: region,
                    len: body,
                    write: false,
                });
            } else {
                let len = unit as usize + body;
                ops.push(crate::nvme::Op { file: &dev.file, offset: dev.at(at.slot), buf: hbuf, len, write: false });
            }
        }
        self.io_bytes += ops.iter().map(|op| op.len as u64).sum::<u64>();
        self.left += ops.len();
        ops
    }

    /// True when every read completed and every piece's header and
    /// checksum match what the tier wrote (the payload read fresh first
    /// when the drives wrote it into the region).
    fn verify(&mut self, st: &cxlkv_core::store::Store<crate::flush::Flush>, buf: &[u8], unit: u64) -> bool {
        let (h, hdr) = (self.h, self.loc.hdr);
        if self.direct && self.failed.is_none() {
            // SYNC: the drive's bytes, fresh in this host's cache.
            if let Err(e) = st.co.invalidate(&st.view, h.off, h.len, Site("tier.promote.fresh")) {
                self.failed = Some(std::io::Error::other(format!("region invalidate: {e}")));
            }
        }
        if self.failed.is_some() {
            return false;
        }
        self.loc.pieces.iter().enumerate().all(|(j, at)| {
            let p = piece(&hdr, j, unit);
            let body: &[u8] = if self.direct {
                match st.view.ptr(h.off + p.at, p.len as u64, 1) {
                    Ok(ptr) => {
                        // `ptr` names `p.len` bytes inside the mapping
                        // (checked by `ptr`) of this node's reservation
                        // (WRITING: no other node reads or writes it); the
                        // drive's write to it completed, and it is only read
                        // until published.
                        // SAFETY: in bounds, unshared and complete, as above.
                        unsafe { std::slice::from_raw_parts(ptr, p.len) }
                    }
                    Err(_) => &[],
                }
            } else {
                buf.get(p.body(unit)).unwrap_or_default()
            };
            buf.get(p.header(unit)).and_then(Header::read).is_some_and(|r| hdr.of_piece(j, at.sum).matches(&r))
                && body.len() == p.len
                && payload_sum(body) == at.sum
        })
    }

    /// Copies the payload in from buffer `buf` (unless the drives wrote it
    /// into the region) and publishes the block.
    fn put_back(
        &self,
        core: &cxlkv_core::node::Node<'_, crate::flush::Flush>,
        buf: &[u8],
        unit: u64,
    ) -> cxlkv_core::Result<()> {
        if !self.direct {
            for j in 0..self.loc.pieces.len() {
                let p = piece(&self.loc.hdr, j, unit);
                core.write(&self.h, p.at, buf.get(p.body(unit)).ok_or(CoreError::InvalidArgument)?)?;
            }
        }
        let mut done = [Ok(())];
        core.publish_flushed(&[self.h], &mut done)?;
        done[0]
    }
}
