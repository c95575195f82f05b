use std::vec::Vec;

use crate::hash::Key;
use crate::index::{Lru, ReserveItem};
use crate::node::NodeLocal;
use crate::testutil::{findings, node, small_caps, with_one_node, Fixture, InlineEnv};
use crate::Error;

fn key(i: u64) -> Key {
    Key { lo: i.wrapping_mul(0x9e37_79b9_7f4a_7c15), hi: i ^ 0xabcd }
}

fn payload(k: Key, len: usize) -> Vec<u8> {
    (0..len).map(|i| (k.lo as usize).wrapping_add(i * 31) as u8 ^ (k.hi as u8)).collect()
}

#[test]
fn put_then_lookup_acquire_and_read_returns_published_bytes() {
    with_one_node(8 << 20, small_caps(), |f, _env, _local, sut| {
        let keys: Vec<Key> = (0..10).map(key).collect();
        for &k in &keys[..6] {
            let h = sut.reserve(7, k, 3000, 16).unwrap();
            sut.write(&h, 0, &payload(k, 3000)).unwrap();
            sut.publish(&h).unwrap();
        }
        assert_eq!(sut.lookup(7, &keys).unwrap(), 6);
        assert_eq!(sut.lookup(8, &keys).unwrap(), 0, "other namespace sees nothing");
        let mut out = std::vec![Err(Error::InvalidArgument); 10];
        assert_eq!(sut.acquire(7, &keys, &mut out).unwrap(), 6);
        for (i, r) in out.iter().enumerate() {
            if i < 6 {
                let h = r.unwrap();
                let mut buf = std::vec![0u8; 3000];
                sut.read(&h, 0, &mut buf).unwrap();
                assert_eq!(buf, payload(keys[i], 3000));
            } else {
                assert_eq!(*r, Err(Error::NotFound));
            }
        }
        let hs: Vec<_> = out.iter().filter_map(|r| r.ok()).collect();
        sut.release(&hs).unwrap();
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn reserve_of_existing_key_reports_exists_and_writes_nothing() {
    with_one_node(8 << 20, small_caps(), |f, _env, _local, sut| {
        let h = sut.reserve(1, key(1), 100, 1).unwrap();
        assert_eq!(sut.reserve(1, key(1), 100, 1), Err(Error::Exists), "while writing");
        sut.write(&h, 0, &[5; 100]).unwrap();
        sut.publish(&h).unwrap();
        assert_eq!(sut.reserve(1, key(1), 200, 1), Err(Error::Exists), "when ready");
        let mut buf = [0u8; 100];
        assert_eq!(sut.get(1, key(1), &mut buf), Ok(100));
        assert_eq!(buf, [5; 100]);
        assert!(findings(f).is_empty());
    });
}

#[test]
fn reader_never_sees_block_before_publish() {
    with_one_node(8 << 20, small_caps(), |f, _env, _local, sut| {
        let h = sut.reserve(1, key(3), 64, 1).unwrap();
        assert_eq!(sut.lookup(1, &[key(3)]).unwrap(), 0);
        let mut buf = [0u8; 64];
        assert_eq!(sut.get(1, key(3), &mut buf), Err(Error::NotFound));
        sut.abort(&h).unwrap();
        assert_eq!(sut.lookup(1, &[key(3)]).unwrap(), 0);
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn acquire_blocks_eviction_until_release() {
    with_one_node(8 << 20, small_caps(), |f, _env, _local, sut| {
        for i in 0..4 {
            let h = sut.reserve(1, key(i), 1000, 1).unwrap();
            sut.publish(&h).unwrap();
        }
        let mut out = [Err(Error::InvalidArgument)];
        sut.acquire(1, &[key(0)], &mut out).unwrap();
        let rep = sut.evict(u64::MAX, &mut Lru).unwrap();
        assert_eq!(rep.entries, 3);
        assert_eq!(sut.lookup(1, &[key(0)]).unwrap(), 1, "pinned block survives");
        sut.release(&[out[0].unwrap()]).unwrap();
        assert_eq!(sut.evict(u64::MAX, &mut Lru).unwrap().entries, 1);
        assert_eq!(sut.lookup(1, &[key(0)]).unwrap(), 0);
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn eviction_takes_least_recently_used_first() {
    with_one_node(8 << 20, crate::layout::Capacities { n_stripes: 1, ..small_caps() }, |_f, _env, _local, sut| {
        for i in 0..5 {
            let h = sut.reserve(1, key(i), 4096, 1).unwrap();
            sut.publish(&h).unwrap();
        }
        let mut out = [Err(Error::InvalidArgument)];
        sut.acquire(1, &[key(0)], &mut out).unwrap();
        sut.release(&[out[0].unwrap()]).unwrap();
        let rep = sut.evict(2 * 4096, &mut Lru).unwrap();
        assert_eq!(rep.entries, 2);
        assert_eq!(sut.lookup(1, &[key(0)]).unwrap(), 1, "recently used key 0 kept");
        assert_eq!(sut.lookup(1, &[key(1)]).unwrap(), 0);
        assert_eq!(sut.lookup(1, &[key(2)]).unwrap(), 0);
        assert_eq!(sut.lookup(1, &[key(3)]).unwrap(), 1);
    });
}

#[test]
fn reserve_evicts_when_space_runs_out() {
    with_one_node(4 << 20, small_caps(), |f, _env, _local, sut| {
        let n = f.store.layout.n_chunks as u64 * 3;
        for i in 0..n {
            let h = sut.reserve(1, key(i), 30_000, 1).unwrap();
            sut.write(&h, 0, &payload(key(i), 30_000)).unwrap();
            sut.publish(&h).unwrap();
        }
        assert!(sut.stats().unwrap().evictions > 0);
        let mut buf = std::vec![0u8; 30_000];
        assert_eq!(sut.get(1, key(n - 1), &mut buf), Ok(30_000));
        assert_eq!(buf, payload(key(n - 1), 30_000));
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn reserve_fails_when_table_full_and_all_pinned() {
    let caps = crate::layout::Capacities { n_stripes: 1, entries_per_stripe: 4, ..small_caps() };
    with_one_node(8 << 20, caps, |_f, _env, _local, sut| {
        let hs: Vec<_> = (0..4).map(|i| sut.reserve(1, key(i), 64, 1).unwrap()).collect();
        assert_eq!(sut.reserve(1, key(9), 64, 1), Err(Error::TableFull));
        for h in &hs {
            sut.publish(h).unwrap();
        }
        // Now unpinned: a new key evicts the oldest.
        sut.reserve(1, key(9), 64, 1).unwrap();
        assert_eq!(sut.lookup(1, &[key(0)]).unwrap(), 0);
    });
}

#[test]
fn batch_reserve_reports_status_per_key() {
    with_one_node(8 << 20, small_caps(), |f, _env, _local, sut| {
        let h = sut.reserve(1, key(2), 64, 1).unwrap();
        sut.publish(&h).unwrap();
        let items: Vec<_> = (0..20).map(|i| ReserveItem { key: key(i), len: 512, tokens: 16 }).collect();
        let mut out = std::vec![Err(Error::InvalidArgument); 20];
        sut.reserve_batch(1, &items, &mut out).unwrap();
        for (i, r) in out.iter().enumerate() {
            if i == 2 {
                assert_eq!(*r, Err(Error::Exists));
            } else {
                assert!(r.is_ok(), "{i}: {r:?}");
            }
        }
        let hs: Vec<_> = out.iter().filter_map(|r| r.ok()).collect();
        let mut st = std::vec![Err(Error::InvalidArgument); hs.len()];
        sut.publish_flushed(&hs, &mut st).unwrap();
        assert!(st.iter().all(|r| r.is_ok()));
        let keys: Vec<_> = (0..20).map(key).collect();
        assert_eq!(sut.lookup(1, &keys).unwrap(), 20);
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

/// Deletion from the linear-probing table must keep every other key findable.
/// One stripe, tiny table, many clusters, random insert/delete against a model.
#[test]
fn delete_keeps_every_other_key_findable() {
    let caps = crate::layout::Capacities { n_stripes: 1, entries_per_stripe: 24, ..small_caps() };
    with_one_node(8 << 20, caps, |f, _env, _local, sut| {
        let mut live: Vec<u64> = Vec::new();
        let mut rng = 0x1234_5678u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for step in 0..3000 {
            let r = next();
            if live.len() < 22 && (r % 3 != 0 || live.is_empty()) {
                let k = next() % 64;
                if live.contains(&k) {
                    continue;
                }
                let h = sut.reserve(1, key(k), 64, 1).unwrap();
                if r % 7 == 0 {
                    sut.abort(&h).unwrap();
                } else {
                    sut.publish(&h).unwrap();
                    live.push(k);
                }
            } else {
                // Evict a random live key by pinning all others and evicting one.
                let victim = live.swap_remove((r as usize / 3) % live.len());
                let others: Vec<Key> = live.iter().map(|&k| key(k)).collect();
                let mut out = std::vec![Err(Error::InvalidArgument); others.len()];
                sut.acquire(1, &others, &mut out).unwrap();
                let rep = sut.evict(1, &mut Lru).unwrap();
                assert_eq!(rep.entries, 1, "step {step}");
                let hs: Vec<_> = out
                    .iter()
                    .map(|r| {
                        r.unwrap_or_else(|e| {
                            panic!("{e:?} in {:?}", out.iter().map(|r| r.map(|_| ())).collect::<Vec<_>>())
                        })
                    })
                    .collect();
                sut.release(&hs).unwrap();
                assert_eq!(sut.lookup(1, &[key(victim)]).unwrap(), 0);
            }
            for &k in &live {
                assert_eq!(sut.lookup(1, &[key(k)]).unwrap(), 1, "step {step}: key {k} lost");
            }
        }
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn batched_lookup_and_presence_agree_with_one_key_at_a_time() {
    use crate::hash::{mix64, place};
    with_one_node(8 << 20, small_caps(), |f, _env, _local, sut| {
        // 40 keys: three probe batches, the last one short.
        let mut keys: Vec<Key> = (100..140).map(key).collect();
        // Key 37 shares key 36's placement tag (same stripe, home and tag): its
        // first tag match names key 36's entry, and the full probe must decide.
        let x = |hi: u64| mix64(hi ^ mix64(7 ^ 0x5bd1_e995));
        let (a, hi) = (keys[36], 0x77);
        keys[37] = Key { lo: a.lo ^ x(a.hi) ^ x(hi), hi };
        assert_eq!(place(7, keys[36]), place(7, keys[37]));
        let publish = |k: Key| {
            let h = sut.reserve(7, k, 64, 1).unwrap();
            sut.write(&h, 0, &[1; 64]).unwrap();
            sut.publish(&h).unwrap();
        };
        for (i, &k) in keys.iter().enumerate() {
            if i != 20 && i != 30 {
                publish(k);
            }
        }
        // Key 30 is being written: not present.
        let writing = sut.reserve(7, keys[30], 64, 1).unwrap();
        let mut present = std::vec![false; keys.len()];
        assert_eq!(sut.presence(7, &keys, &mut present).unwrap(), 20);
        for (i, &p) in present.iter().enumerate() {
            assert_eq!(p, f.store.find_ready(7, keys[i]).unwrap().is_some(), "key {i}");
            assert_eq!(p, i != 20 && i != 30, "key {i}");
        }
        assert_eq!(sut.lookup(7, &keys).unwrap(), 20);
        publish(keys[20]);
        assert_eq!(sut.lookup(7, &keys).unwrap(), 30);
        sut.write(&writing, 0, &[2; 64]).unwrap();
        sut.publish(&writing).unwrap();
        assert_eq!(sut.lookup(7, &keys).unwrap(), 40);
        assert_eq!(sut.lookup(7, &keys[36..38]).unwrap(), 2, "both keys of one tag");
        assert!(sut.presence(7, &keys, &mut present[..39]).is_err(), "too few answer slots");
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn lookup_reports_an_entry_whose_checksum_fails_as_missing() {
    with_one_node(8 << 20, small_caps(), |f, _env, _local, sut| {
        let keys: Vec<Key> = (200..240).map(key).collect();
        for &k in &keys {
            let h = sut.reserve(3, k, 64, 1).unwrap();
            sut.write(&h, 0, &[9; 64]).unwrap();
            sut.publish(&h).unwrap();
        }
        assert_eq!(sut.lookup(3, &keys).unwrap(), 40);
        // A word of key 35's entry (its payload offset) changed behind the
        // index's back: the checksum no longer matches.
        let (s, found) = f.store.find_ready(3, keys[35]).unwrap().unwrap();
        let off = f.store.layout.entry(s, found.entry) + 32;
        let was = f.store.view.load_u64(off).unwrap();
        f.store.view.store_u64(off, was ^ 0x40).unwrap();
        assert_eq!(sut.lookup(3, &keys).unwrap(), 35);
        let mut present = std::vec![false; keys.len()];
        sut.presence(3, &keys, &mut present).unwrap();
        assert_eq!(present.iter().filter(|&&p| !p).count(), 1);
        assert!(!present[35]);
        f.store.view.store_u64(off, was).unwrap();
        assert_eq!(sut.lookup(3, &keys).unwrap(), 40);
    });
}

/// An environment whose waits let a writer that was descheduled in the
/// middle of rewriting an entry (its sequence word odd) finish after a few
/// of them: the entry's first word is put back as it was.
struct ResumingWriter<'a> {
    inner: &'a InlineEnv<'a>,
    off: u64,
    word: u64,
    waits: spin::Mutex<u32>,
}

impl crate::store::NodeEnv for ResumingWriter<'_> {
    fn local_lock(&self, lock: u32) -> crate::Result<()> {
        self.inner.local_lock(lock)
    }
    fn local_unlock(&self, lock: u32) {
        self.inner.local_unlock(lock)
    }
    fn wait(&self, iteration: u32) -> crate::Result<()> {
        let mut w = self.waits.lock();
        *w += 1;
        if *w == 3 {
            self.inner.store.view.store_u64(self.off, self.word)?;
        }
        drop(w);
        self.inner.wait(iteration)
    }
}

/// Node 0 publishes 1000 bytes under key 5 (namespace 1): its handle, the
/// offset of its entry, and the entry's first word as published.
fn published_key_5(f: &Fixture, inline: &InlineEnv<'_>, local: &NodeLocal) -> (crate::index::Handle, u64, u64) {
    let sut = node(f, inline, local, 0);
    let h = sut.reserve(1, key(5), 1000, 1).unwrap();
    sut.write(&h, 0, &payload(key(5), 1000)).unwrap();
    sut.publish(&h).unwrap();
    let off = f.store.layout.entry(h.stripe, h.entry);
    (h, off, f.store.view.load_u64(off).unwrap())
}

/// A lock-free read that meets an entry in the middle of a locked rewrite
/// (another thread's LRU relink, descheduled) waits for it or takes the
/// lock; it never reports the key as missing or fails the call: an acquire
/// pins it, and a release drops its pin (a failed release would leak it).
#[test]
fn reads_that_meet_an_entry_mid_rewrite_wait_for_the_writer() {
    let f = Fixture::new(8 << 20, small_caps());
    f.attach(0);
    let inline = InlineEnv::new(&f.store);
    let local = NodeLocal::default();
    let (h, off, word) = published_key_5(&f, &inline, &local);
    let tear = || f.store.view.store_u64(off, word.wrapping_add(1)).unwrap();

    tear();
    let env = ResumingWriter { inner: &inline, off, word, waits: spin::Mutex::new(0) };
    let sut = crate::node::Node::new(&f.store, 0, &env, &local).unwrap();
    let mut out = [Err(Error::InvalidArgument)];
    assert_eq!(sut.acquire(1, &[key(5)], &mut out), Ok(1));
    let pinned = out[0].unwrap();
    assert_eq!((pinned.stripe, pinned.entry, pinned.gen), (h.stripe, h.entry, h.gen));

    tear();
    let env = ResumingWriter { inner: &inline, off, word, waits: spin::Mutex::new(0) };
    let sut = crate::node::Node::new(&f.store, 0, &env, &local).unwrap();
    assert_eq!(sut.release(&[pinned]), Ok(()));
    assert_eq!(sut.evict(u64::MAX, &mut Lru).unwrap().entries, 1, "the pin was dropped");
    assert!(findings(&f).is_empty(), "{:?}", findings(&f));
}

/// A block an evictor has CLAIMED (it looks for pins, and puts the entry
/// back when it finds one: another node pins it) is not missing: an acquire
/// and a copying get wait for the evictor's answer instead of reporting it
/// gone (a decode worker lost a block its prefill worker had pinned).
#[test]
fn reads_that_meet_an_evictors_claim_wait_for_its_answer() {
    let f = Fixture::new(8 << 20, small_caps());
    f.attach(0);
    let inline = InlineEnv::new(&f.store);
    let local = NodeLocal::default();
    let (h, off, word) = published_key_5(&f, &inline, &local);
    let claim = || {
        let mut e = f.store.ent(h.stripe, h.entry).unwrap();
        e.state = crate::layout::state::CLAIMED;
        let t = e.ticket;
        f.store.put_ent(h.stripe, h.entry, &mut e, t).unwrap();
    };

    claim();
    let env = ResumingWriter { inner: &inline, off, word, waits: spin::Mutex::new(0) };
    let sut = crate::node::Node::new(&f.store, 0, &env, &local).unwrap();
    let mut out = [Err(Error::InvalidArgument)];
    assert_eq!(sut.acquire(1, &[key(5)], &mut out), Ok(1), "{out:?}");
    let pinned = out[0].unwrap();
    assert_eq!((pinned.stripe, pinned.entry, pinned.gen), (h.stripe, h.entry, h.gen));
    sut.release(&[pinned]).unwrap();

    claim();
    let env = ResumingWriter { inner: &inline, off, word, waits: spin::Mutex::new(0) };
    let sut = crate::node::Node::new(&f.store, 0, &env, &local).unwrap();
    let mut buf = std::vec![0u8; 1000];
    assert_eq!(sut.get_into(1, key(5), &mut [&mut buf[..]]), Ok(crate::index::Got::Copied(1000)));
    assert_eq!(buf, payload(key(5), 1000));
    assert!(findings(&f).is_empty(), "{:?}", findings(&f));
}

/// `put_with` reserves, writes and publishes under one hold of the stripe
/// lock: the block reads back; a second put of the key says `Exists` and
/// writes nothing; a write that fails aborts the reservation (the key stays
/// absent, its space goes back); a block too large for the region finds no
/// room (`None`, nothing reserved) and the usual reserve, which evicts, is
/// the caller's to make.
#[test]
fn put_with_publishes_refuses_a_stored_key_aborts_on_a_failed_write_and_says_when_no_room() {
    with_one_node(8 << 20, small_caps(), |f, _env, _local, sut| {
        let item = |i: u64, len: u64| ReserveItem { key: key(i), len, tokens: 16 };
        let wrote = sut.put_with(3, item(1, 5000), |h| sut.write(h, 0, &payload(key(1), 5000))).unwrap();
        assert_eq!(wrote, Some(Ok(())));
        let mut buf = std::vec![0u8; 5000];
        let mut parts = [&mut buf[..]];
        assert_eq!(sut.get_into(3, key(1), &mut parts).unwrap(), crate::index::Got::Copied(5000));
        assert_eq!(buf, payload(key(1), 5000));
        let mut called = false;
        let again = sut.put_with(3, item(1, 100), |_| {
            called = true;
            Ok(())
        });
        assert_eq!(again, Ok(Some(Err(Error::Exists))));
        assert!(!called, "nothing written for a stored key");
        let failed = sut.put_with(3, item(2, 4000), |_| Err(Error::TooLarge));
        assert_eq!(failed, Ok(Some(Err(Error::TooLarge))), "the write's error");
        assert_eq!(sut.lookup(3, &[key(2)]).unwrap(), 0, "an aborted put leaves no block");
        // Nor a reservation: the key can be put again.
        let retry = sut.put_with(3, item(2, 4000), |h| sut.write(h, 0, &payload(key(2), 4000)));
        assert_eq!(retry, Ok(Some(Ok(()))), "the key is free after the aborted put");
        // Its block went back: `check` finds no allocated block without its entry.
        assert!(findings(f).is_empty(), "{:?}", findings(f));
        let c = sut.stats().unwrap();
        assert_eq!((c.inserts, c.exists), (3, 1), "reserves counted as the usual path counts them");
        // Blocks of 1 MiB until the region is full: then no room, and the write
        // is not called.
        let mut full = false;
        for i in 10..30 {
            let mut called = false;
            match sut.put_with(3, item(i, 1 << 20), |h| {
                called = true;
                sut.write(h, 0, &payload(key(i), 1 << 20))
            }) {
                Ok(Some(Ok(()))) => assert!(called),
                Ok(None) => {
                    assert!(!called, "nothing reserved, nothing written");
                    full = true;
                    break;
                }
                r => panic!("put {i}: {r:?}"),
            }
        }
        assert!(full, "an 8 MiB region holds fewer than twenty 1 MiB blocks");
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

/// A batch's blocks of one stripe share one hold of the node's heap lock:
/// twelve blocks take two grants (the stripe's, the heap's), not thirteen.
/// A batch that fills the stripe (evicting, whose frees take the heap lock)
/// and holds a block larger than a chunk (placed the usual way) gives the
/// hold back first: every block is reserved, reads back once published,
/// and the region checks clean.
#[test]
fn a_batch_places_its_blocks_under_one_heap_hold_and_gives_it_back_to_evict() {
    with_one_node(8 << 20, small_caps(), |f, _env, local, sut| {
        let grants = || local.beat_counters.get().lock_grants;
        let s = f.store.stripe_of(5, key(0));
        let keys: Vec<Key> = (0..400).map(key).filter(|&k| f.store.stripe_of(5, k) == s).take(44).collect();
        assert_eq!(keys.len(), 44);
        let put_all = |items: &[ReserveItem]| {
            let mut out = std::vec![Err(Error::InvalidArgument); items.len()];
            sut.reserve_batch(5, items, &mut out).unwrap();
            let hs: Vec<_> = out
                .iter()
                .map(|r| {
                    r.unwrap_or_else(|e| panic!("{e:?} in {:?}", out.iter().map(|r| r.map(|_| ())).collect::<Vec<_>>()))
                })
                .collect();
            for h in &hs {
                sut.write(h, 0, &payload(h.key, h.len as usize)).unwrap();
            }
            let mut done = std::vec![Ok(()); hs.len()];
            sut.publish_flushed(&hs, &mut done).unwrap();
            assert!(done.iter().all(|r| r.is_ok()), "{done:?}");
        };
        let item = |k: Key, len: u64| ReserveItem { key: k, len, tokens: 1 };
        // A first block gives the node a chunk with room.
        put_all(&[item(keys[0], 3000)]);
        let before = grants();
        put_all(&keys[1..13].iter().map(|&k| item(k, 3000)).collect::<Vec<_>>());
        // The publish takes the stripe lock once more.
        assert_eq!(grants() - before, 3, "stripe and heap for the reserves, stripe for the publish");
        // 13 blocks stored; 31 more fill the stripe's 32 entries and evict.
        let big = 100 << 10;
        let rest: Vec<ReserveItem> =
            keys[13..].iter().enumerate().map(|(i, &k)| item(k, if i == 9 { big } else { 2000 })).collect();
        put_all(&rest);
        let mut buf = std::vec![0u8; big as usize];
        for it in &rest {
            let n = it.len as usize;
            let mut parts = [&mut buf[..n]];
            assert_eq!(sut.get_into(5, it.key, &mut parts).unwrap(), crate::index::Got::Copied(it.len));
            assert_eq!(buf[..n], payload(it.key, n)[..]);
        }
        let present = keys.iter().filter(|&&k| sut.lookup(5, &[k]).unwrap() == 1).count();
        assert!((rest.len()..=32).contains(&present), "the stripe's 32 entries filled and evicted: {present} present");
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

/// An eviction removes a run of a stripe's entries, then frees their blocks
/// with one heap-lock hold per run of blocks of one chunk owner: fewer
/// grants than blocks. Blocks of two nodes' chunks, interleaved, all go
/// back, and the region checks clean.
#[test]
fn an_eviction_frees_its_blocks_under_one_heap_hold_per_owner_run() {
    crate::testutil::with_two_nodes(|f, _env, a, b| {
        let s = f.store.stripe_of(5, key(0));
        let keys: Vec<Key> = (0..600).map(key).filter(|&k| f.store.stripe_of(5, k) == s).take(24).collect();
        assert_eq!(keys.len(), 24);
        // Three blocks fill a 64 KiB chunk: both nodes take chunks of their
        // own and place blocks in each other's.
        for (i, &k) in keys.iter().enumerate() {
            let n = if (i / 2) % 2 == 0 { &a } else { &b };
            let h = n.reserve(5, k, 20_000, 1).unwrap();
            n.write(&h, 0, &payload(k, 20_000)).unwrap();
            n.publish(&h).unwrap();
        }
        let before = a.local.beat_counters.get().lock_grants;
        let rep = a.evict(u64::MAX, &mut Lru).unwrap();
        assert_eq!((rep.entries, rep.bytes, rep.deferred), (24, 24 * 20_000, 0));
        let grants = a.local.beat_counters.get().lock_grants - before;
        // Each of the 4 stripes visited twice (the second pass finds none
        // left); a grant a block on top would make 8 + 24.
        assert!(grants < 8 + 24, "{grants} grants");
        assert_eq!(a.lookup(5, &keys[..1]).unwrap(), 0);
        assert!(findings(f).is_empty(), "{:?}", findings(f));
        // The space is free again: the same blocks fit.
        for &k in &keys {
            let h = b.reserve(5, k, 20_000, 1).unwrap();
            b.publish(&h).unwrap();
        }
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

/// Evictions take turns over the stripes: sixteen evictions of one block
/// each, in a region of sixteen stripes holding four blocks each, take one
/// block from every stripe (none is emptied while others keep their
/// oldest blocks).
#[test]
fn evictions_take_every_stripe_in_turn() {
    let caps = crate::layout::Capacities { n_stripes: 16, ..small_caps() };
    with_one_node(8 << 20, caps, |f, _env, _local, sut| {
        let mut per = std::vec![0u32; 16];
        let mut i = 0u64;
        while per.iter().any(|&n| n < 4) {
            let k = key(i);
            i += 1;
            let s = f.store.stripe_of(2, k) as usize;
            if per[s] < 4 {
                per[s] += 1;
                let h = sut.reserve(2, k, 1000, 1).unwrap();
                sut.publish(&h).unwrap();
            }
        }
        for _ in 0..16 {
            assert_eq!(sut.evict(1, &mut Lru).unwrap().entries, 1);
        }
        let mut left = std::vec![0u32; 16];
        for j in 0..i {
            let k = key(j);
            if sut.lookup(2, &[k]).unwrap() == 1 {
                left[f.store.stripe_of(2, k) as usize] += 1;
            }
        }
        assert_eq!(left, std::vec![3u32; 16], "one block from each stripe");
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

/// A block of a whole chunk into a region whose chunks are all taken:
/// the reserve evicts before it tries (the bitmap shows no free chunk),
/// rather than being refused once with its locks taken for nothing. Its
/// lock grants say so: the eviction's (stripe, heap, alloc), then the
/// reserve's (stripe, heap, alloc), the publish's stripe.
#[test]
fn a_whole_chunk_block_into_a_full_region_evicts_first() {
    // Stripes with room to spare: only the region fills.
    let caps = crate::layout::Capacities { entries_per_stripe: 256, ..small_caps() };
    with_one_node(8 << 20, caps, |f, _env, local, sut| {
        let chunk = f.store.layout.chunk_size();
        let n = f.store.layout.n_chunks as u64;
        let put = |i: u64| {
            let h = sut.reserve(4, key(i), chunk, 1).unwrap();
            sut.write(&h, 0, &payload(key(i), chunk as usize)).unwrap();
            sut.publish(&h).unwrap();
        };
        // Until every chunk is taken (a stripe that fills evicts on its own).
        let mut i = 0;
        while sut.free_chunks_hint().unwrap() > 0 {
            assert!(i < 4 * n, "the region never filled");
            put(i);
            i += 1;
        }
        let before = local.beat_counters.get().lock_grants;
        put(i);
        let grants = local.beat_counters.get().lock_grants - before;
        assert!(grants <= 7, "{grants} grants: refused once before the eviction");
        assert_eq!(sut.lookup(4, &[key(i)]).unwrap(), 1);
        // A block already stored evicts nothing.
        let evicted = sut.stats().unwrap().evictions;
        assert_eq!(sut.reserve(4, key(i), chunk, 1), Err(Error::Exists));
        assert_eq!(sut.stats().unwrap().evictions, evicted);
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}
