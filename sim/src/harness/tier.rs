//! The op actors' SSD-tier operations: one host's tier claims a directory,
//! records blocks it copied out of the region (its "SSD" is a map in the
//! actor), removes some, and puts some back; every host looks keys up in
//! the directories. A record found must have been written by the tier and
//! not removed before the lookup began; a record written before a lookup
//! began and not removed until it ended must be found.

use std::collections::HashMap;

use cxlkv_core::coherence::Coherence;
use cxlkv_core::hash::Key;
use cxlkv_core::node::Node;
use cxlkv_core::tier::TierDir;
use cxlkv_core::Error;

use crate::harness::model::{key, len_of, ns, payload, TierRec, IN_ACQUIRE};
use crate::harness::ops::{revoked_ok, write_payload};
use crate::harness::params::KEYS;
use crate::harness::world::counted_insert;
use crate::harness::world::{log, World};
use crate::memory::SimCoherence;

/// The host whose op actor runs the tier: the last one (host 0 restarts
/// mid-run).
pub(crate) fn tier_host(w: &World) -> usize {
    w.hosts - 1
}

/// The tier actor's state: its directory and its "SSD".
pub(crate) struct TierState<'a> {
    pub(crate) dir: Option<TierDir<'a, SimCoherence<'a>>>,
    pub(crate) ssd: HashMap<Key, Vec<u8>>,
}

pub(crate) fn tier_op<'a>(w: &World, node: &Node<'a, SimCoherence<'a>>, h: usize, r: u64, t: &mut TierState<'a>) {
    let i = r % KEYS;
    if h != tier_host(w) {
        return tier_find(w, node, h, key(i));
    }
    if t.dir.is_none() {
        let now = w.now();
        match node.tier_claim(0x7469_6572 ^ h as u64) {
            Ok(d) => {
                let end = w.now();
                let mut m = w.model.lock().unwrap();
                for rec in m.tier.recs.iter_mut().filter(|x| x.gone.is_none()) {
                    rec.gone = Some((now, Some(end)));
                }
                m.tier.released = None;
                t.dir = Some(d);
                t.ssd.clear();
            }
            Err(e) => {
                if !revoked_ok(w, h, e) && e != Error::Recovering {
                    w.violation(format!("host {h} tier claim: {e:?}"));
                }
            }
        }
        return;
    }
    match (r >> 8) % 4 {
        0 | 1 => tier_spill(w, node, h, key(i), t),
        2 => {
            let Some(k) = t.ssd.keys().min_by_key(|k| k.hi.wrapping_sub(i)).copied() else { return };
            let begin = w.now();
            {
                let mut m = w.model.lock().unwrap();
                if let Some(rec) = m.tier.recs.iter_mut().rev().find(|x| x.key == k && x.gone.is_none()) {
                    rec.gone = Some((begin, None));
                }
            }
            let dir = t.dir.as_mut().expect("claimed");
            let res = dir.remove(ns(), k);
            let end = w.now();
            if let Some(rec) = w.model.lock().unwrap().tier.recs.iter_mut().rev().find(|x| x.key == k) {
                if let Some((b, None)) = rec.gone {
                    rec.gone = Some((b, Some(end)));
                }
            }
            t.ssd.remove(&k);
            match res {
                Ok(true) => {}
                Ok(false) => w.violation(format!("host {h} tier remove: key {} had no record", k.hi)),
                Err(e) if revoked_ok(w, h, e) => {}
                Err(e) => w.violation(format!("host {h} tier remove: {e:?}")),
            }
        }
        _ => tier_promote(w, node, h, t, i),
    }
}

/// Copies a published block out of the region (pinned) and records it.
fn tier_spill<'a>(w: &World, node: &Node<'a, SimCoherence<'a>>, h: usize, k: Key, t: &mut TierState<'a>) {
    if t.ssd.contains_key(&k) {
        return;
    }
    let mut out = [Err(Error::InvalidArgument)];
    IN_ACQUIRE.with(|c| c.set(true));
    let got = node.acquire(ns(), &[k], &mut out);
    IN_ACQUIRE.with(|c| c.set(false));
    if let Err(e) = got {
        if !revoked_ok(w, h, e) {
            w.violation(format!("host {h} tier acquire: {e:?}"));
        }
        return;
    }
    let hd = match out[0] {
        Ok(hd) => hd,
        Err(Error::NotFound | Error::JournalFull) => return,
        Err(e) => return w.violation(format!("host {h} tier acquire item: {e:?}")),
    };
    let mut buf = vec![0u8; hd.len as usize];
    let read = node.read(&hd, 0, &mut buf);
    if let Err(e) = node.release(&[hd]) {
        if !revoked_ok(w, h, e) {
            w.violation(format!("host {h} tier release: {e:?}"));
        }
    }
    if let Err(e) = read {
        return w.violation(format!("host {h} tier read: {e:?}"));
    }
    if buf != payload(k, buf.len()) {
        return w.violation(format!("host {h} tier copied wrong bytes of key {}", k.hi));
    }
    let begin = w.now();
    let at = {
        let mut m = w.model.lock().unwrap();
        m.tier.recs.push(TierRec { key: k, put: (begin, None), gone: None });
        m.tier.puts.push((begin, None));
        (m.tier.recs.len() - 1, m.tier.puts.len() - 1)
    };
    let res = t.dir.as_mut().expect("claimed").put(ns(), k, hd.len);
    let end = w.now();
    {
        let mut m = w.model.lock().unwrap();
        m.tier.puts[at.1].1 = Some(end);
        match res {
            Ok(()) => m.tier.recs[at.0].put.1 = Some(end),
            // Not recorded (the directory is full): as if removed at once.
            Err(_) => m.tier.recs[at.0].gone = Some((begin, Some(end))),
        }
    }
    match res {
        Ok(()) => {
            t.ssd.insert(k, buf);
        }
        Err(Error::TableFull) => {}
        Err(e) if revoked_ok(w, h, e) => {}
        Err(e) => w.violation(format!("host {h} tier put: {e:?}")),
    }
}

/// Puts a block the tier holds back into the region (as the tier does for
/// a request), if it is not there.
fn tier_promote<'a>(w: &World, node: &Node<'a, SimCoherence<'a>>, h: usize, t: &TierState<'a>, i: u64) {
    let Some((k, bytes)) = t.ssd.iter().min_by_key(|(k, _)| k.hi.wrapping_sub(i)) else { return };
    let t0 = crate::harness::world::reserve_begins(w, &[*k]);
    let hd = node.reserve(ns(), *k, bytes.len() as u64, 16);
    crate::harness::world::reserve_ends(w, &[*k]);
    let hd = match hd {
        Ok(hd) => hd,
        Err(
            Error::Exists
            | Error::OutOfSpace
            | Error::OverQuota
            | Error::TableFull
            | Error::Recovering
            | Error::JournalFull,
        ) => return,
        Err(e) if revoked_ok(w, h, e) => return,
        Err(e) => return w.violation(format!("host {h} tier promote reserve: {e:?}")),
    };
    counted_insert(w, h, *k, t0);
    log(w, hd.off, format!("host {h} tier promote key {} len {}", k.hi, hd.len));
    write_payload(w, node, h, &hd, 0, bytes, false);
    w.model.lock().unwrap().published.insert(*k);
    if let Err(e) = node.publish_flushed(&[hd], &mut [Ok(())]) {
        if !revoked_ok(w, h, e) {
            w.violation(format!("host {h} tier promote publish: {e:?}"));
        }
    }
}

/// Looks `k` up in the tier directories and checks the answer against the
/// model.
pub(crate) fn tier_find<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, k: Key) {
    let begin = w.now();
    let found = node.store.tier_find(ns(), k);
    let end = w.now();
    let m = w.model.lock().unwrap();
    let tm = &m.tier;
    match found {
        Ok(Some(t)) => {
            let recorded = tm
                .recs
                .iter()
                .any(|x| x.key == k && x.put.0 <= end && x.gone.is_none_or(|g| g.1.is_none_or(|ge| ge >= begin)));
            let released = tm.released.is_some_and(|r| r.1.is_some_and(|re| re < begin));
            if !recorded || released {
                drop(m);
                return w.violation(format!(
                    "step {begin}..{end}: host {h} found key {} in tier directory {} (recorded {recorded}, released {released})",
                    k.hi, t.dir
                ));
            }
            if t.owner as usize != tier_host(w) || t.len != len_of(k) {
                drop(m);
                w.violation(format!("host {h} tier find key {}: owner {} len {}", k.hi, t.owner, t.len));
            }
        }
        Ok(None) => {
            let th = tier_host(w);
            let unsure = m.killed || w.crashed().is_some() || m.stall.is_some() || !m.attached[th];
            let putting = tm.puts.iter().any(|p| p.0 <= end && p.1.is_none_or(|pe| pe >= begin));
            let releasing = tm.released.is_some_and(|r| r.0 <= end);
            let held = tm
                .recs
                .iter()
                .any(|x| x.key == k && x.put.1.is_some_and(|pe| pe < begin) && x.gone.is_none_or(|g| g.0 > end));
            if held && !unsure && !putting && !releasing {
                drop(m);
                w.violation(format!("step {begin}..{end}: host {h} missed key {} its tier recorded all along", k.hi));
            }
        }
        Err(Error::Changed) => {}
        Err(e) => {
            drop(m);
            w.violation(format!("host {h} tier find: {e:?}"));
        }
    }
}

/// The tier lets its directory go (before its process closes).
pub(crate) fn tier_release<'a>(w: &World, h: usize, t: &mut TierState<'a>) {
    let Some(dir) = t.dir.take() else { return };
    let begin = w.now();
    w.model.lock().unwrap().tier.released = Some((begin, None));
    let r = dir.release();
    let end = w.now();
    w.model.lock().unwrap().tier.released = Some((begin, Some(end)));
    match r {
        Ok(()) => {}
        Err(e) if revoked_ok(w, h, e) => {}
        Err(e) => w.violation(format!("host {h} tier release: {e:?}")),
    }
}
