//! The op actor's operations on blocks (reserve, acquire, get, lookup, a
//! batch reserve, a stale handle misused), each result checked against the
//! model, and the checks of pinned payloads.

use cxlkv_core::coherence::Coherence;
use cxlkv_core::hash::Key;
use cxlkv_core::index::{Handle, ReserveItem};
use cxlkv_core::node::Node;
use cxlkv_core::store::attach;
use cxlkv_core::Error;

use crate::harness::model::{key, len_of, ns, payload, Pin, IN_ACQUIRE};
use crate::harness::ops::{revoked_ok, write_payload};
use crate::harness::params::{sim_caps, KEYS};
use crate::harness::sched::rnd;
use crate::harness::tier::tier_find;
use crate::harness::world::{
    counted_insert, log, may_be_expired, pins_of, read_begins, read_returned, reserve_begins, reserve_ends,
    unpin_model, World,
};

/// The block an op actor is writing: its handle, the op that finishes it,
/// and whether its payload goes in by plain stores (flushed by `publish`).
pub(crate) type Writing = (Handle, u32, bool);

/// A failed call of host `h` is a violation unless its error is one of `ok`
/// or a revocation the model expects.
pub(crate) fn check(w: &World, h: usize, what: &str, e: Error, ok: &[Error]) {
    if !ok.contains(&e) && !revoked_ok(w, h, e) {
        w.violation(format!("host {h} {what}: unexpected {e:?}"));
        if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
            crate::harness::world::dump_slots(w, h);
        }
    }
}

/// Reserves `k` and writes half its payload now; the rest (and the
/// publish) follows a few ops later, so readers run while it is WRITING.
pub(crate) fn reserve_op<C: Coherence>(
    w: &World,
    node: &Node<'_, C>,
    h: usize,
    op: u32,
    r: u64,
    k: Key,
) -> Option<Writing> {
    let t0 = reserve_begins(w, &[k]);
    let got = node.reserve(ns(), k, len_of(k), 16);
    reserve_ends(w, &[k]);
    match got {
        Ok(hd) => {
            counted_insert(w, h, k, t0);
            log(w, hd.off, format!("host {h} reserve key {} len {}", k.hi, hd.len));
            let p = payload(k, hd.len as usize);
            let half = p.len() / 2;
            let raw = (r >> 44).is_multiple_of(2);
            write_payload(w, node, h, &hd, 0, &p[..half], raw);
            Some((hd, op + 1 + (r >> 40) as u32 % 3, raw))
        }
        Err(e) => {
            check(
                w,
                h,
                "reserve",
                e,
                &[Error::Exists, Error::OutOfSpace, Error::OverQuota, Error::TableFull, Error::Recovering],
            );
            None
        }
    }
}

/// Acquires keys `i..i + 3`: each pin must be of a published key with its
/// payload, and is held for a few ops.
pub(crate) fn acquire_op<C: Coherence>(
    w: &World,
    node: &Node<'_, C>,
    h: usize,
    op: u32,
    i: u64,
    x: &mut u64,
    pins: &mut Vec<Pin>,
) {
    let keys: Vec<Key> = (i..i + 3).map(key).collect();
    let mut out = vec![Err(Error::InvalidArgument); keys.len()];
    let before: Vec<_> = keys.iter().map(|k| read_begins(w, *k)).collect();
    IN_ACQUIRE.with(|c| c.set(true));
    let got = node.acquire(ns(), &keys, &mut out);
    IN_ACQUIRE.with(|c| c.set(false));
    if let Err(e) = got {
        return check(w, h, "acquire", e, &[]);
    }
    for ((k, r), b) in keys.iter().zip(out).zip(before) {
        match r {
            Ok(hd) => {
                if !w.model.lock().unwrap().published.contains(k) {
                    w.violation(format!("host {h} acquired key {} never published", k.hi));
                }
                read_returned(w, h, *k, b, "acquired");
                if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
                    let line = node.store.layout.entry(hd.stripe, hd.entry) / 64;
                    eprintln!(
                        "step {}: host {h} pinned key {} entry {}/{} gen {} line {line}",
                        w.now(),
                        k.hi,
                        hd.stripe,
                        hd.entry,
                        hd.gen
                    );
                }
                verify_pinned(w, node, h, &hd);
                let id = {
                    let mut m = w.model.lock().unwrap();
                    m.pin_ids += 1;
                    let id = m.pin_ids;
                    m.pinned.entry(*k).or_default().insert(id);
                    id
                };
                pins.push(Pin { h: hd, until: op + 1 + (rnd(x) % 4) as u32, id });
            }
            Err(Error::NotFound) => {}
            Err(e) => check(w, h, "acquire item", e, &[Error::JournalFull]),
        }
    }
}

/// Where a wrong payload of `k` differs first (byte `at`): the line, and
/// who last wrote it.
fn where_wrong<C: Coherence>(w: &World, node: &Node<'_, C>, k: Key, at: Option<usize>) -> String {
    let Some(at) = at else { return " (its length)".to_string() };
    let l = &node.store.layout;
    for s in 0..l.caps.n_stripes {
        for e in 0..l.caps.entries_per_stripe {
            let Ok(ent) = node.store.view.read::<cxlkv_core::layout::Entry>(l.entry(s, e)) else { continue };
            if ent.key_lo == k.lo && ent.key_hi == k.hi && ent.ns == ns() {
                let line = ((ent.payload_off + at as u64) / 64) as usize;
                return format!(
                    " from byte {at}: entry {s}/{e} gen {} at {}, line {line} last written by {:?}",
                    ent.gen,
                    ent.payload_off,
                    w.mem.provenance(line)
                );
            }
        }
    }
    format!(" from byte {at}")
}

/// Copies `k` out: only a published key, with its payload; a miss looks in
/// the SSD tiers next, as the platform's get does.
pub(crate) fn get_op<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, k: Key) {
    let mut buf = vec![0u8; (2 << sim_caps(2).chunk_shift) + 64];
    let before = read_begins(w, k);
    match node.get(ns(), k, &mut buf) {
        Ok(n) => {
            read_returned(w, h, k, before, "got");
            if !w.model.lock().unwrap().published.contains(&k) {
                w.violation(format!("host {h} got key {} never published", k.hi));
            } else if buf[..n] != payload(k, n)[..] || n as u64 != len_of(k) {
                let want = payload(k, n);
                let at = buf[..n].iter().zip(&want).position(|(a, b)| a != b);
                w.violation(format!("host {h} get key {}: wrong payload{}", k.hi, where_wrong(w, node, k, at)));
            }
        }
        Err(Error::NotFound) => tier_find(w, node, h, k),
        Err(e) => check(w, h, "get", e, &[Error::Changed]),
    }
}

/// Looks keys `i..i + 4` up (by prefix or one by one): a hit must be a
/// published key, and a key pinned by the same pin from before to after
/// the call was READY all along, so a miss of it is a stale read.
pub(crate) fn lookup_op<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, r: u64, i: u64) {
    let keys: Vec<Key> = (i..i + 4).map(key).collect();
    let pinned_before = pins_of(w, &keys);
    let before: Vec<_> = keys.iter().map(|k| read_begins(w, *k)).collect();
    let mut present = vec![false; keys.len()];
    let got = if r.is_multiple_of(2) {
        node.lookup(ns(), &keys).map(|n| present[..n].fill(true))
    } else {
        node.presence(ns(), &keys, &mut present).map(|_| ())
    };
    if let Err(e) = got {
        return check(w, h, "lookup", e, &[]);
    }
    let m = w.model.lock().unwrap();
    if let Some(k) = keys.iter().zip(&present).find(|(k, p)| **p && !m.published.contains(k)) {
        let k = k.0.hi;
        drop(m);
        return w.violation(format!("host {h} lookup hit key {k} never published"));
    }
    drop(m);
    for ((k, p), b) in keys.iter().zip(&present).zip(before) {
        if *p {
            read_returned(w, h, *k, b, "looked up");
        }
    }
    // Lookup reports a prefix: only the pinned keys before its first
    // unpinned one count. A block past its lifetime is missing, pinned or
    // not.
    let pinned_after = pins_of(w, &keys);
    let end = w.now();
    let held = |j: usize| match (&pinned_before[j], &pinned_after[j]) {
        (Some((r0, a)), Some((r1, b))) => r0 == r1 && !a.is_disjoint(b) && !may_be_expired(w, keys[j], end),
        _ => false,
    };
    let upto = if r.is_multiple_of(2) { (0..keys.len()).take_while(|&j| held(j)).count() } else { keys.len() };
    if let Some(j) = (0..upto).find(|&j| held(j) && !present[j]) {
        w.violation(format!("host {h} lookup missed key {} pinned all along", keys[j].hi));
    }
}

/// Reserves keys `i..i + 3` in one batch, writes each reserved one whole
/// and publishes them in one batch.
pub(crate) fn reserve_batch_op<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, i: u64) {
    let items: Vec<ReserveItem> =
        (i..i + 3).map(|j| ReserveItem { key: key(j), len: len_of(key(j)), tokens: 16 }).collect();
    let mut out = vec![Err(Error::InvalidArgument); items.len()];
    let keys: Vec<Key> = items.iter().map(|it| it.key).collect();
    let t0 = reserve_begins(w, &keys);
    let r = node.reserve_batch(ns(), &items, &mut out);
    reserve_ends(w, &keys);
    if let Err(e) = r {
        check(w, h, "reserve_batch", e, &[]);
        // Items a failed call did not reach keep their placeholder.
        out.iter_mut().for_each(|r| {
            if *r == Err(Error::InvalidArgument) {
                *r = Err(e);
            }
        });
    }
    let mut done = Vec::new();
    for (it, r) in items.iter().zip(out) {
        match r {
            Ok(hd) => {
                counted_insert(w, h, hd.key, t0);
                log(w, hd.off, format!("host {h} batch-reserve key {} len {}", hd.key.hi, hd.len));
                if let Err(e) = node.write(&hd, 0, &payload(it.key, hd.len as usize)) {
                    check(w, h, "write", e, &[]);
                }
                done.push(hd);
            }
            Err(e) => check(
                w,
                h,
                "reserve batch item",
                e,
                &[
                    Error::Exists,
                    Error::OutOfSpace,
                    Error::OverQuota,
                    Error::TableFull,
                    Error::JournalFull,
                    Error::Recovering,
                ],
            ),
        }
    }
    let mut st = vec![Ok(()); done.len()];
    {
        let mut m = w.model.lock().unwrap();
        for hd in &done {
            m.published.insert(hd.key);
        }
    }
    if let Err(e) = node.publish_flushed(&done, &mut st) {
        check(w, h, "publish batch", e, &[]);
    }
    for (s, hd) in st.into_iter().zip(&done) {
        if let Err(e) = s {
            if !lost_ok(w, hd, e) {
                check(w, h, "publish batch item", e, &[]);
            }
        }
    }
}

/// Puts keys `i..i + 3` one at a time, each reserved, written and published
/// under one hold of its stripe lock (`put_with`, as the C and Python doors
/// put one small block); one that finds no room is reserved the usual way.
pub(crate) fn put_with_op<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, i: u64) {
    for k in (i..i + 3).map(key) {
        let item = ReserveItem { key: k, len: len_of(k), tokens: 16 };
        let mut reserved = None;
        let t0 = reserve_begins(w, &[k]);
        let r = node.put_with(ns(), item, |hd| {
            reserved = Some(*hd);
            log(w, hd.off, format!("host {h} put-with key {} len {}", k.hi, hd.len));
            // Published before the call returns: the model knows it first.
            w.model.lock().unwrap().published.insert(k);
            node.write(hd, 0, &payload(k, hd.len as usize))
        });
        reserve_ends(w, &[k]);
        // Counted once the call returned, as a reserve is: its stripe's
        // header (which counts it) is published by then.
        if r.is_ok() && reserved.is_some() {
            counted_insert(w, h, k, t0);
        }
        match r {
            Err(e) => check(w, h, "put_with", e, &[]),
            Ok(None) => {
                if let Some(hd) = reserved {
                    w.violation(format!("host {h} put_with reserved key {} yet said no room", hd.key.hi));
                }
            }
            Ok(Some(Ok(()))) => {}
            Ok(Some(Err(e))) => match reserved {
                Some(hd) if lost_ok(w, &hd, e) => {}
                Some(_) => check(w, h, "put_with publish", e, &[]),
                None => check(
                    w,
                    h,
                    "put_with reserve",
                    e,
                    &[Error::Exists, Error::TableFull, Error::JournalFull, Error::Recovering],
                ),
            },
        }
    }
}

pub(crate) fn finish_write<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, hd: Handle, raw: bool, r: u64) {
    let p = payload(hd.key, hd.len as usize);
    let half = p.len() / 2;
    write_payload(w, node, h, &hd, half, &p[half..], raw);
    log(w, hd.off, format!("host {h} finish-write key {} (abort: {})", hd.key.hi, r.is_multiple_of(7)));
    if r.is_multiple_of(7) {
        match node.abort(&hd) {
            Err(e) if !revoked_ok(w, h, e) && !lost_ok(w, &hd, e) => w.violation(format!("host {h} abort: {e:?}")),
            _ => {}
        }
        return;
    }
    w.model.lock().unwrap().published.insert(hd.key);
    let r = if raw && r % 4 == 1 {
        // The batch form, as the C and Python doors publish.
        let mut out = [Ok(())];
        node.publish_batch(&[hd], &mut out).and(out[0])
    } else if raw || r.is_multiple_of(2) {
        node.publish(&hd)
    } else {
        node.publish_flushed(&[hd], &mut [Ok(())])
    };
    match r {
        Err(e) if !revoked_ok(w, h, e) && !lost_ok(w, &hd, e) => w.violation(format!("host {h} publish: {e:?}")),
        _ => {}
    }
}

/// `StaleHandle` from a publish or an abort is right for a reservation a
/// repair lost: a stopped host's late line landed over its entry, which the
/// stripe's repair dropped (seed 115015); memory's entry is then at another
/// generation, or empty, and the block went back when the writer let go.
pub(crate) fn lost_ok(w: &World, hd: &Handle, e: Error) -> bool {
    if e != Error::StaleHandle || w.model.lock().unwrap().stall.is_none() {
        return false;
    }
    let Ok(g) = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return false };
    let Ok(ent) = g.view.read::<cxlkv_core::layout::Entry>(g.layout.entry(hd.stripe, hd.entry)) else { return false };
    ent.gen != hd.gen || ent.state == cxlkv_core::layout::state::EMPTY
}

pub(crate) fn verify_pinned<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, hd: &Handle) {
    let mut buf = vec![0u8; hd.len as usize];
    // Half the pins are read through a pointer, as the C and Python doors'
    // zero-copy views are: made fresh once, then plain loads.
    let by_pointer = hd.gen.is_multiple_of(2);
    let read = if by_pointer {
        node.fresh_payload(hd).and_then(|_| node.store.view.copy_out(hd.off, &mut buf))
    } else {
        node.read(hd, 0, &mut buf)
    };
    match read {
        Ok(()) => {
            if hd.len != len_of(hd.key) || buf != payload(hd.key, buf.len()) {
                let want = payload(hd.key, buf.len());
                let at = buf.iter().zip(&want).position(|(a, b)| a != b);
                let mut mem = vec![0u8; buf.len()];
                let _ = w.mem.shared_region().copy_out(hd.off, &mut mem);
                let mem_ok = mem == want;
                let mut who = String::new();
                if let Some(at) = at {
                    let a = at & !63;
                    let end = (a + 64).min(mem.len());
                    for j in 0..KEYS {
                        let pj = payload(key(j), 4096);
                        for o in (0..4096 - 64).step_by(64) {
                            if pj[o..o + (end - a)] == mem[a..end] {
                                who += &format!(" key {j}@{o}");
                            }
                        }
                    }
                    if mem[a..end].iter().all(|&b| b == 0) {
                        who += " zeros";
                    }
                    let (wh, how) = w.mem.provenance(((hd.off as usize) + a) / 64);
                    who += &format!("; last written back by host {wh} ({how})");
                }
                let mut hist = String::new();
                let logged = w.model.lock().unwrap().log.clone();
                for (o, st, what) in &logged {
                    if (*o & !4095) == (hd.off & !4095) {
                        hist += &format!("\n      step {st} off {o}: {what}");
                    }
                }
                who += &hist;
                let e: Result<cxlkv_core::layout::Entry, _> =
                    w.mem.shared_region().read(node.store.layout.entry(hd.stripe, hd.entry));
                let counter_at = w.model.lock().unwrap().counter_root;
                w.violation(format!(
                    "host {h} pinned key {} (off {} len {}; counter at {}): payload differs at byte {at:?}; memory holds the right bytes: {mem_ok} (line there matches:{who}); entry in memory {e:?}; step {}",
                    hd.key.hi, hd.off, hd.len, counter_at, w.now()
                ));
            }
        }
        Err(e) => w.violation(format!("host {h} read pinned: {e:?}")),
    }
}

/// A caller's mistake: reserves `k`, aborts it, reserves it again, and
/// publishes the first (stale) handle. Refused; the new reservation is then
/// written and published as usual.
pub(crate) fn stale_handle_misuse<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, k: Key) {
    let ok = [Error::Exists, Error::OutOfSpace, Error::OverQuota, Error::TableFull, Error::Recovering];
    let t0 = reserve_begins(w, &[k]);
    let old = node.reserve(ns(), k, len_of(k), 16);
    reserve_ends(w, &[k]);
    let old = match old {
        Ok(hd) => hd,
        Err(e) if ok.contains(&e) || revoked_ok(w, h, e) => return,
        Err(e) => return w.violation(format!("host {h} reserve (misuse): {e:?}")),
    };
    counted_insert(w, h, k, t0);
    if let Err(e) = node.abort(&old) {
        if !revoked_ok(w, h, e) {
            w.violation(format!("host {h} abort (misuse): {e:?}"));
        }
        return;
    }
    let t0 = reserve_begins(w, &[k]);
    let new = node.reserve(ns(), k, len_of(k), 16);
    reserve_ends(w, &[k]);
    let new = match new {
        Ok(hd) => hd,
        Err(e) if ok.contains(&e) || revoked_ok(w, h, e) => return,
        Err(e) => return w.violation(format!("host {h} reserve again (misuse): {e:?}")),
    };
    counted_insert(w, h, k, t0);
    let mut out = [Ok(())];
    match node.publish_flushed(&[old], &mut out).and(out[0]) {
        Err(Error::StaleHandle) => {}
        Err(e) if revoked_ok(w, h, e) => return,
        r => return w.violation(format!("host {h}: publishing a stale handle of key {} gave {r:?}", k.hi)),
    }
    write_payload(w, node, h, &new, 0, &payload(k, new.len as usize), false);
    w.model.lock().unwrap().published.insert(k);
    if let Err(e) = node.publish_flushed(&[new], &mut [Ok(())]) {
        if !revoked_ok(w, h, e) {
            w.violation(format!("host {h} publish (misuse): {e:?}"));
        }
    }
}

/// Releases every pin the op actor holds, each verified first.
pub(crate) fn release_pins<C: Coherence>(
    w: &World,
    node: &Node<'_, C>,
    h: usize,
    pins: &mut Vec<Pin>,
    check_err: &dyn Fn(&str, Error, &[Error]),
) {
    for p in pins.drain(..) {
        unpin_model(w, &p);
        verify_pinned(w, node, h, &p.h);
        if let Err(e) = node.release(&[p.h]) {
            check_err("release", e, &[]);
        }
    }
}
