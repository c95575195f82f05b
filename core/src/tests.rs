//! Cross-module tests of core: locks, recovery, allocator, roots, check.

use std::vec::Vec;

use crate::check::FindingKind;
use crate::hash::Key;
use crate::node::NodeLocal;
use crate::roots::{get, Root};
use crate::testutil::{findings, node, small_caps, Fixture, InlineEnv};
use crate::Error;

fn key(i: u64) -> Key {
    Key { lo: i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1, hi: i }
}

#[test]
fn recover_drops_dead_nodes_pins_and_aborts_its_writes() {
    let f = Fixture::new(8 << 20, small_caps());
    f.attach(0);
    f.attach(1);
    let env = InlineEnv::new(&f.store);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let a = node(&f, &env, &l0, 0);
    let b = node(&f, &env, &l1, 1);
    let h = a.reserve(1, key(1), 5000, 1).unwrap();
    a.publish(&h).unwrap();
    let mut out = [Err(Error::InvalidArgument)];
    b.acquire(1, &[key(1)], &mut out).unwrap();
    let _w = b.reserve(1, key(2), 5000, 1).unwrap();
    let _raw = b.alloc(1000).unwrap();
    *env.killed.lock() = 1 << 1;
    let rep = env.step().unwrap();
    assert_eq!(rep.newly_dead, 1 << 1);
    assert!(findings(&f).iter().any(|x| x.kind == FindingKind::NodeDead));

    let rep = a.recover(0).unwrap();
    assert_eq!(rep.nodes_freed, 1 << 1);
    assert_eq!(rep.pins_dropped, 1);
    assert_eq!(rep.writes_aborted, 1);
    assert_eq!(rep.blocks_reclaimed, 2, "the aborted write's block and the raw block");
    assert!(findings(&f).is_empty(), "{:?}", findings(&f));
    assert_eq!(a.lookup(1, &[key(1), key(2)]).unwrap(), 1);
    assert_eq!(a.evict(u64::MAX, &mut crate::index::Lru).unwrap().entries, 1, "dead pin no longer blocks eviction");
    assert!(findings(&f).is_empty(), "{:?}", findings(&f));
}

#[test]
fn dead_holders_lock_is_revoked_and_granted_only_to_recovery() {
    let f = Fixture::new(8 << 20, small_caps());
    f.attach(0);
    f.attach(1);
    let env = InlineEnv::new(&f.store);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let a = node(&f, &env, &l0, 0);
    let b = node(&f, &env, &l1, 1);
    let held = b.lock(2).unwrap();
    *env.killed.lock() = 1 << 1;
    // A plain request is not granted while the lock awaits repair.
    assert_eq!(a.lock(2), Err(Error::Timeout));
    assert!(findings(&f).iter().any(|x| x.kind == FindingKind::NeedsRepair));
    let rep = a.recover(0).unwrap();
    assert_eq!(rep.locks_repaired, 1);
    let g = a.lock(2).unwrap();
    assert!(g.epoch > held.epoch, "grant after revocation carries a new epoch");
    a.unlock(g).unwrap();
    assert_eq!(b.unlock(held), Err(Error::Revoked));
}

#[test]
fn lock_is_exclusive_and_round_robin() {
    let f = Fixture::new(8 << 20, small_caps());
    f.attach(0);
    f.attach(1);
    let env = InlineEnv::new(&f.store);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let a = node(&f, &env, &l0, 0);
    let b = node(&f, &env, &l1, 1);
    let ga = a.lock(0).unwrap();
    // b's request cannot be granted while a holds the lock.
    assert_eq!(b.lock(0), Err(Error::Timeout));
    a.unlock(ga).unwrap();
    let gb = b.lock(0).unwrap();
    b.unlock(gb).unwrap();
}

#[test]
fn block_freed_by_another_node_returns_its_chunk() {
    let f = Fixture::new(8 << 20, small_caps());
    f.attach(0);
    f.attach(1);
    let env = InlineEnv::new(&f.store);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let a = node(&f, &env, &l0, 0);
    let b = node(&f, &env, &l1, 1);
    let offs: Vec<u64> = (0..10).map(|_| a.alloc(3000).unwrap()).collect();
    let mut sorted = offs.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 10, "no block handed out twice");
    for o in &offs {
        b.free(*o).unwrap();
    }
    assert_eq!(b.free(offs[0]), Err(Error::InvalidArgument), "double free is refused");
    let big = a.alloc(3 * f.store.layout.chunk_size() + 1).unwrap();
    a.free(big).unwrap();
    // Every chunk is free again: the whole payload can be taken in one run.
    let all = a.alloc(f.store.layout.n_chunks as u64 * f.store.layout.chunk_size()).unwrap();
    a.free(all).unwrap();
    assert!(findings(&f).is_empty(), "{:?}", findings(&f));
}

#[test]
fn alloc_fails_with_out_of_space_and_too_large() {
    let f = Fixture::new(4 << 20, small_caps());
    f.attach(0);
    let env = InlineEnv::new(&f.store);
    let l0 = NodeLocal::default();
    let a = node(&f, &env, &l0, 0);
    let total = f.store.layout.n_chunks as u64 * f.store.layout.chunk_size();
    assert_eq!(a.alloc(total + 1), Err(Error::TooLarge));
    assert_eq!(a.alloc(0), Err(Error::InvalidArgument));
    let x = a.alloc(total).unwrap();
    assert_eq!(a.alloc(64), Err(Error::OutOfSpace));
    a.free(x).unwrap();
}

#[test]
fn roots_put_get_destroy() {
    let f = Fixture::new(8 << 20, small_caps());
    f.attach(0);
    let env = InlineEnv::new(&f.store);
    let l0 = NodeLocal::default();
    let a = node(&f, &env, &l0, 0);
    let off = a.alloc(256).unwrap();
    let r = Root { offset: off, size: 256, tag: 9 };
    a.root_put(b"model-config", r).unwrap();
    assert_eq!(a.root_put(b"model-config", r), Err(Error::Exists));
    assert_eq!(get(&f.store, b"model-config"), Ok(r));
    assert_eq!(get(&f.store, b"nope"), Err(Error::NotFound));
    assert_eq!(get(&f.store, b""), Err(Error::InvalidArgument));
    assert_eq!(a.root_put(&[b'x'; 33], r), Err(Error::InvalidArgument));
    assert_eq!(a.root_destroy(b"model-config"), Ok(r));
    assert_eq!(get(&f.store, b"model-config"), Err(Error::NotFound));
    for i in 0..8u8 {
        a.root_put(&[b'a' + i], r).unwrap();
    }
    assert_eq!(a.root_put(b"z", r), Err(Error::RootsFull));
}

#[test]
fn check_reports_scribbled_metadata_and_recovery_repairs_it() {
    let f = Fixture::new(8 << 20, small_caps());
    f.attach(0);
    let env = InlineEnv::new(&f.store);
    let l0 = NodeLocal::default();
    let a = node(&f, &env, &l0, 0);
    for i in 0..40 {
        let h = a.reserve(3, key(i), 2000, 1).unwrap();
        a.publish(&h).unwrap();
    }
    let l = f.store.layout;
    let mut x = 0x9e37_79b9u64;
    for i in 0..200u64 {
        x = crate::hash::mix64(x + i);
        let off = l.entries.start + (x % (l.entries.len() / 8)) * 8;
        f.store.region.store_u64(off, crate::hash::mix64(x)).unwrap();
        let boff = l.buckets.start + (x % (l.buckets.len() / 8)) * 8;
        f.store.region.store_u64(boff, x).unwrap();
    }
    assert!(!findings(&f).is_empty());
    // Operations on a corrupt region return errors or succeed; never panic.
    for i in 0..40 {
        let _ = a.lookup(3, &[key(i)]);
        let mut buf = [0u8; 2000];
        let _ = a.get(3, key(i), &mut buf);
    }
    a.recover(0).unwrap();
    assert!(findings(&f).is_empty(), "{:?}", findings(&f));
    // The survivors still read back as published.
    let survivors = (0..40).filter(|&i| a.lookup(3, &[key(i)]).unwrap() == 1).count();
    assert!(survivors > 0);
    let h = a.reserve(3, key(1000), 2000, 1).unwrap();
    a.publish(&h).unwrap();
    assert!(findings(&f).is_empty(), "{:?}", findings(&f));
}

#[test]
fn attach_rejects_busy_and_out_of_range_nodes() {
    let f = Fixture::new(8 << 20, small_caps());
    f.attach(0);
    let who = crate::node::Identity::default();
    assert_eq!(crate::node::attach_node(&f.store, Some(0), who), Err(Error::NodeBusy));
    assert_eq!(crate::node::attach_node(&f.store, Some(4), who), Err(Error::BadNode));
    for _ in 0..3 {
        crate::node::attach_node(&f.store, None, who).unwrap();
    }
    assert_eq!(crate::node::attach_node(&f.store, None, who), Err(Error::NoFreeNode));
}

#[test]
fn a_slot_counts_its_incarnations_across_detach() {
    let f = Fixture::new(8 << 20, small_caps());
    let env = InlineEnv::new(&f.store);
    let local = crate::node::NodeLocal::default();
    let incarnation =
        || f.store.region.read::<crate::layout::NodeInfo>(f.store.layout.node_info(1)).unwrap().incarnation;
    for want in 1..=3 {
        f.attach(1);
        assert_eq!(incarnation(), want);
        node(&f, &env, &local, 1).detach().unwrap();
        assert_eq!(incarnation(), want, "a free slot keeps its incarnation");
    }
}

#[test]
fn app_locks_are_allocated_once_and_freed() {
    let f = Fixture::new(8 << 20, small_caps());
    f.attach(0);
    f.attach(1);
    let env = InlineEnv::new(&f.store);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let a = node(&f, &env, &l0, 0);
    let b = node(&f, &env, &l1, 1);
    let mut got: Vec<u32> = (0..4).map(|i| if i % 2 == 0 { a.lock_alloc() } else { b.lock_alloc() }.unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, [0, 1, 2, 3], "every node sees the others' allocations");
    assert_eq!(a.lock_alloc(), Err(Error::TableFull));
    b.lock_free(2).unwrap();
    assert_eq!(b.lock_free(2), Err(Error::NotFound));
    assert_eq!(a.lock_free(4), Err(Error::InvalidArgument));
    assert_eq!(a.lock_alloc(), Ok(2), "a freed number is reused");
    // An application root that happens to bear a lock's name is not a lock.
    a.lock_free(3).unwrap();
    a.root_put(b"cxlkv.lock.3", Root { offset: 0, size: 0, tag: 7 }).unwrap();
    assert_eq!(a.lock_free(3), Err(Error::NotFound));
    assert_eq!(get(&f.store, b"cxlkv.lock.3").unwrap().tag, 7, "the application's root is kept");
    assert!(findings(&f).is_empty(), "{:?}", findings(&f));
}

#[test]
fn app_lock_is_exclusive_and_repaired_after_its_holder_dies() {
    let f = Fixture::new(8 << 20, small_caps());
    f.attach(0);
    f.attach(1);
    let env = InlineEnv::new(&f.store);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let a = node(&f, &env, &l0, 0);
    let b = node(&f, &env, &l1, 1);
    let i = a.lock_alloc().unwrap();
    assert_eq!(a.lock_app(4), Err(Error::InvalidArgument));
    let held = b.lock_app(i).unwrap();
    assert_eq!(a.lock_app(i), Err(Error::Timeout), "held by b");
    // A holder of an application lock may use the cache (core's locks come
    // first in the order).
    let h = b.reserve(1, key(1), 100, 1).unwrap();
    b.publish(&h).unwrap();
    let g = a.lock(0).unwrap();
    assert_eq!(a.unlock_app(g), Err(Error::InvalidArgument), "a core lock is not an application lock");
    *env.killed.lock() = 1 << 1;
    env.step().unwrap();
    let rep = a.recover(0).unwrap();
    assert_eq!(rep.locks_repaired, 1, "the dead holder's application lock");
    let mine = a.lock_app(i).unwrap();
    assert!(mine.epoch > held.epoch);
    a.unlock_app(mine).unwrap();
    assert!(findings(&f).is_empty(), "{:?}", findings(&f));
    assert_eq!(a.lookup(1, &[key(1)]).unwrap(), 1);
}
