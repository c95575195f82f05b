//! Change-log readers: every host follows the region's change log as a
//! router would (read the log on; at a gap, rescan the stripe and go on),
//! keeping a replica of the stored keys. Mid-run, every record it reads
//! must be well formed and numbered densely; at the end, each live host's
//! replica, brought up to date through its own cache, must be exactly the
//! set of blocks the region stores.

use std::collections::HashSet;

use cxlkv_core::changes::{Change, Tail};
use cxlkv_core::coherence::Coherence;
use cxlkv_core::store::{attach, Store};
use cxlkv_core::Error;

use crate::harness::model::Feed;
use crate::harness::world::World;

/// Brings host `h`'s reader up to date through `st` (the host's view).
pub(crate) fn feed_tail<C: Coherence>(w: &World, st: &Store<C>, h: usize) {
    let n = st.layout.caps.n_stripes as usize;
    let mut f = {
        let mut m = w.model.lock().unwrap();
        if m.feeds.len() <= h {
            m.feeds.resize(h + 1, Feed::default());
        }
        std::mem::take(&mut m.feeds[h])
    };
    if f.cursors.len() != n {
        f.cursors = vec![0; n];
        f.rescan = vec![false; n];
        f.live = vec![HashSet::new(); n];
    }
    for s in 0..n {
        let mut buf = [Change::default(); 8];
        // Bounded: a stripe that keeps changing is read on next time.
        for _ in 0..64 {
            let tail = if f.rescan[s] {
                Ok(Tail::Gap { resume: f.cursors[s] })
            } else {
                st.read_changes(s as u32, f.cursors[s], &mut buf)
            };
            match tail {
                Ok(Tail::Read { n: 0 }) => break,
                Ok(Tail::Read { n }) => {
                    for c in &buf[..n] {
                        if c.seq != f.cursors[s] + 1 {
                            w.violation(format!(
                                "host {h} change log of stripe {s}: change {} after {}",
                                c.seq, f.cursors[s]
                            ));
                        }
                        f.cursors[s] = c.seq;
                        f.applied += 1;
                        if c.stored {
                            f.live[s].insert((c.ns, c.key));
                        } else {
                            f.live[s].remove(&(c.ns, c.key));
                        }
                    }
                }
                Ok(Tail::Gap { .. }) => {
                    f.gaps += 1;
                    // Where to go on from: read before the scan, so what
                    // changes during it is also in the log after it.
                    let start = match st.changes_head(s as u32) {
                        Ok((count, _)) => count,
                        Err(e) => {
                            w.violation(format!("host {h} change log head of stripe {s}: {e:?}"));
                            break;
                        }
                    };
                    let mut seen = HashSet::new();
                    match st.scan_stored(s as u32, |ns, k, _, _| {
                        seen.insert((ns, k));
                    }) {
                        Ok(()) => {
                            f.live[s] = seen;
                            f.cursors[s] = start;
                            f.rescan[s] = false;
                        }
                        Err(Error::Changed) => {
                            f.rescan[s] = true;
                            break;
                        }
                        Err(e) => {
                            w.violation(format!("host {h} rescan of stripe {s}: {e:?}"));
                            break;
                        }
                    }
                }
                Err(e) => {
                    // What memory holds: the header and the next record,
                    // and who last wrote their lines.
                    let l = &st.layout;
                    let next = f.cursors[s] + 1;
                    let (hl, rl) = ((l.stripe(s as u32) / 64) as usize, (l.change(s as u32, next) / 64) as usize);
                    let mem = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent).ok();
                    let hdr = mem.as_ref().map(|m| m.view.read::<cxlkv_core::layout::StripeHeader>(l.stripe(s as u32)));
                    let rec =
                        mem.as_ref().map(|m| m.view.read::<cxlkv_core::layout::ChangeRecord>(l.change(s as u32, next)));
                    w.violation(format!(
                        "step {}: host {h} change log of stripe {s} after {}: {e:?} (memory: header {hdr:?} by {:?}; record {rec:?} by {:?})",
                        w.now(),
                        f.cursors[s],
                        w.mem.provenance(hl),
                        w.mem.provenance(rl)
                    ));
                    break;
                }
            }
        }
    }
    w.model.lock().unwrap().feeds[h] = f;
}

/// At the end (quiescent): each live host's reader, brought up to date
/// through its own cache, holds exactly the blocks memory stores.
pub(crate) fn feed_final(w: &World) {
    let Ok(truth_store) = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent) else { return };
    let n = truth_store.layout.caps.n_stripes;
    let crashed = w.crashed();
    for h in (0..w.hosts).filter(|&h| Some(h) != crashed) {
        let st = match attach(w.mem.view(h), w.mem.host(h)) {
            Ok(s) => s,
            Err(_) => continue,
        };
        feed_tail(w, &st, h);
        let f = w.model.lock().unwrap().feeds.get(h).cloned().unwrap_or_default();
        for s in 0..n {
            let mut truth = HashSet::new();
            if let Err(e) = truth_store.scan_stored(s, |ns, k, _, _| {
                truth.insert((ns, k));
            }) {
                return w.violation(format!("final scan of stripe {s}: {e:?}"));
            }
            let have = f.live.get(s as usize).cloned().unwrap_or_default();
            if have != truth {
                let extra: Vec<u64> = have.difference(&truth).map(|(_, k)| k.hi).take(4).collect();
                let missing: Vec<u64> = truth.difference(&have).map(|(_, k)| k.hi).take(4).collect();
                w.violation(format!(
                    "host {h}'s change-log replica of stripe {s} disagrees with the region: extra keys {extra:?}, missing {missing:?} (cursor {}, {} applied, {} gaps)",
                    f.cursors.get(s as usize).copied().unwrap_or(0),
                    f.applied,
                    f.gaps
                ));
            }
        }
    }
}
