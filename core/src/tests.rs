//! Cross-module tests of core: locks, recovery, allocator, roots, check.

use std::vec::Vec;

use crate::check::FindingKind;
use crate::hash::Key;
use crate::node::NodeLocal;
use crate::roots::{get, Root};
use crate::testutil::{findings, node, small_caps, with_two_nodes, Fixture, InlineEnv};
use crate::Error;

fn key(i: u64) -> Key {
    Key { lo: i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1, hi: i }
}

#[test]
fn recover_drops_dead_nodes_pins_and_aborts_its_writes() {
    with_two_nodes(|f, env, a, b| {
        let h = a.reserve(1, key(1), 5000, 1).unwrap();
        a.publish(&h).unwrap();
        let mut out = [Err(Error::InvalidArgument)];
        b.acquire(1, &[key(1)], &mut out).unwrap();
        let _w = b.reserve(1, key(2), 5000, 1).unwrap();
        let _raw = b.alloc(1000).unwrap();
        *env.killed.lock() = 1 << 1;
        let rep = env.step().unwrap();
        assert_eq!(rep.newly_dead, 1 << 1);
        assert!(findings(f).iter().any(|x| x.kind == FindingKind::NodeDead));

        let rep = a.recover(0).unwrap();
        assert_eq!(rep.nodes_freed, 1 << 1);
        assert_eq!(rep.pins_dropped, 1);
        assert_eq!(rep.writes_aborted, 1);
        assert_eq!(rep.blocks_reclaimed, 2, "the aborted write's block and the raw block");
        assert!(findings(f).is_empty(), "{:?}", findings(f));
        assert_eq!(a.lookup(1, &[key(1), key(2)]).unwrap(), 1);
        assert_eq!(a.evict(u64::MAX, &mut crate::index::Lru).unwrap().entries, 1, "dead pin no longer blocks eviction");
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn heartbeat_publishes_the_lock_and_recovery_counters() {
    with_two_nodes(|f, env, a, b| {
        let beat = |n: &crate::node::Node<'_, crate::coherence::Coherent>| {
            n.heartbeat(77 + n.id as u64).unwrap();
            f.store.view.read::<crate::layout::Heartbeat>(f.store.layout.heartbeat(n.id)).unwrap()
        };
        assert_eq!((beat(&a).lock_grants, beat(&a).recoveries), (0, 0));
        let held = a.lock(2).unwrap();
        a.unlock(held).unwrap();
        assert_eq!(beat(&a).lock_grants, 1, "one grant, published with the beat");
        let _w = b.reserve(1, key(2), 5000, 1).unwrap();
        *env.killed.lock() = 1 << 1;
        env.step().unwrap();
        let grants = beat(&a).lock_grants;
        a.recover(0).unwrap();
        let hb = beat(&a);
        assert_eq!((hb.recoveries, hb.nodes_recovered), (1, 1));
        assert!(hb.lock_grants > grants, "recovery takes every core lock");
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn dead_holders_lock_is_revoked_and_granted_only_to_recovery() {
    with_two_nodes(|f, env, a, b| {
        let held = b.lock(2).unwrap();
        *env.killed.lock() = 1 << 1;
        // A plain request is not granted while the lock awaits repair.
        assert_eq!(a.lock(2), Err(Error::Timeout));
        assert!(findings(f).iter().any(|x| x.kind == FindingKind::NeedsRepair));
        let rep = a.recover(0).unwrap();
        assert_eq!(rep.locks_repaired, 1);
        let g = a.lock(2).unwrap();
        assert!(g.seq > held.seq, "a grant after the revocation carries a new ticket");
        a.unlock(g).unwrap();
        assert_eq!(b.unlock(held), Err(Error::Revoked));
    });
}

#[test]
fn lock_is_exclusive_and_round_robin() {
    with_two_nodes(|_, _, a, b| {
        let ga = a.lock(0).unwrap();
        // b's request cannot be granted while a holds the lock.
        assert_eq!(b.lock(0), Err(Error::Timeout));
        a.unlock(ga).unwrap();
        let gb = b.lock(0).unwrap();
        b.unlock(gb).unwrap();
    });
}

#[test]
fn block_freed_by_another_node_returns_its_chunk() {
    with_two_nodes(|f, _, a, b| {
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
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn free_refused_while_the_alloc_lock_awaits_repair_changes_nothing() {
    with_two_nodes(|f, env, a, b| {
        // The only block of its chunk: freeing it gives the chunk back, which
        // needs the alloc lock, revoked from a dead holder.
        let off = a.alloc(1000).unwrap();
        let held = b.lock(f.store.layout.locks().alloc()).unwrap();
        *env.killed.lock() = 1 << 1;
        assert_eq!(env.step().unwrap().newly_dead, 1 << 1);
        assert_eq!(a.free(off), Err(Error::Recovering));
        let wrong: Vec<_> = findings(f)
            .into_iter()
            .filter(|x| !matches!(x.kind, FindingKind::NodeDead | FindingKind::NeedsRepair | FindingKind::HeldByDead))
            .collect();
        assert!(wrong.is_empty(), "a refused free changed the chunk: {wrong:?}");
        a.recover(0).unwrap();
        a.free(off).unwrap();
        assert!(findings(f).is_empty(), "{:?}", findings(f));
        let _ = held;
    });
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
fn root_free_takes_the_root_and_frees_its_allocation_at_once() {
    with_two_nodes(|f, _, a, b| {
        let off = a.alloc(3000).unwrap();
        let r = Root { offset: off, size: 3000, tag: 5 };
        a.root_put(b"obj", r).unwrap();
        // A root naming no allocation is refused and kept.
        let inside = Root { offset: off + 64, size: 64, tag: 6 };
        a.root_put(b"inside", inside).unwrap();
        assert_eq!(b.root_free(b"inside"), Err(Error::InvalidArgument));
        assert_eq!(get(&f.store, b"inside"), Ok(inside));
        assert_eq!(b.root_destroy(b"inside"), Ok(inside));
        // Another node frees what a's root named.
        assert_eq!(b.root_free(b"obj"), Ok(r));
        assert_eq!(get(&f.store, b"obj"), Err(Error::NotFound));
        assert_eq!(b.root_free(b"obj"), Err(Error::NotFound));
        assert_eq!(a.free(off), Err(Error::InvalidArgument), "freed already");
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn root_free_of_a_dead_nodes_allocation_after_recovery() {
    with_two_nodes(|f, env, a, b| {
        let kept = b.alloc(1000).unwrap();
        let r = Root { offset: kept, size: 1000, tag: 1 };
        b.root_put(b"kept", r).unwrap();
        let _lost = b.alloc(1000).unwrap();
        *env.killed.lock() = 1 << 1;
        assert_eq!(env.step().unwrap().newly_dead, 1 << 1);
        let rep = a.recover(0).unwrap();
        assert_eq!(rep.blocks_reclaimed, 1, "the unrooted block only");
        assert_eq!(a.root_free(b"kept"), Ok(r));
        assert_eq!(a.free(kept), Err(Error::InvalidArgument), "freed already");
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn root_free_refused_while_the_alloc_lock_awaits_repair_changes_nothing() {
    with_two_nodes(|f, env, a, b| {
        // The only block of its chunk: freeing it gives the chunk back, which
        // needs the alloc lock, revoked from a dead holder. The root, taken
        // away once the block was found, comes back.
        let off = a.alloc(1000).unwrap();
        let r = Root { offset: off, size: 1000, tag: 2 };
        a.root_put(b"obj", r).unwrap();
        let held = b.lock(f.store.layout.locks().alloc()).unwrap();
        *env.killed.lock() = 1 << 1;
        assert_eq!(env.step().unwrap().newly_dead, 1 << 1);
        assert_eq!(a.root_free(b"obj"), Err(Error::Recovering));
        assert_eq!(get(&f.store, b"obj"), Ok(r));
        let wrong: Vec<_> = findings(f)
            .into_iter()
            .filter(|x| !matches!(x.kind, FindingKind::NodeDead | FindingKind::NeedsRepair | FindingKind::HeldByDead))
            .collect();
        assert!(wrong.is_empty(), "a refused root_free changed the chunk: {wrong:?}");
        a.recover(0).unwrap();
        assert_eq!(a.root_free(b"obj"), Ok(r));
        assert_eq!(get(&f.store, b"obj"), Err(Error::NotFound));
        assert!(findings(f).is_empty(), "{:?}", findings(f));
        let _ = held;
    });
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
        f.store.view.store_u64(off, crate::hash::mix64(x)).unwrap();
        let boff = l.buckets.start + (x % (l.buckets.len() / 8)) * 8;
        f.store.view.store_u64(boff, x).unwrap();
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
    let incarnation = || f.store.view.read::<crate::layout::NodeInfo>(f.store.layout.node_info(1)).unwrap().incarnation;
    for want in 1..=3 {
        f.attach(1);
        assert_eq!(incarnation(), want);
        node(&f, &env, &local, 1).detach().unwrap();
        assert_eq!(incarnation(), want, "a free slot keeps its incarnation");
    }
}

#[test]
fn app_locks_are_allocated_once_and_freed() {
    with_two_nodes(|f, _, a, b| {
        let mut got: Vec<u32> =
            (0..4).map(|i| if i % 2 == 0 { a.lock_alloc() } else { b.lock_alloc() }.unwrap()).collect();
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
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn app_lock_is_exclusive_and_repaired_after_its_holder_dies() {
    with_two_nodes(|f, env, a, b| {
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
        assert!(mine.seq > held.seq);
        a.unlock_app(mine).unwrap();
        assert!(findings(f).is_empty(), "{:?}", findings(f));
        assert_eq!(a.lookup(1, &[key(1)]).unwrap(), 1);
    });
}

#[test]
fn a_dead_holders_app_lock_is_repaired_though_no_manager_saw_it_held() {
    with_two_nodes(|f, env, a, b| {
        let i = a.lock_alloc().unwrap();
        let held = b.lock_app(i).unwrap();
        // The manager role changes hands: the new manager never granted this
        // lock, and nobody asks for it while its holder is dead.
        *env.mgr.lock() = crate::lock::Manager::new(0);
        *env.killed.lock() = 1 << 1;
        // Named in the manager line but holding no claim of its own, the new
        // manager claims first (and settles: no time here), then steps.
        assert!(!env.step().unwrap().active);
        assert_eq!(env.step().unwrap().newly_dead, 1 << 1);
        let rep = a.recover(0).unwrap();
        assert_eq!(rep.locks_repaired, 1, "the dead holder's application lock");
        let mine = a.lock_app(i).expect("granted again after recovery");
        assert!(mine.seq > held.seq);
        a.unlock_app(mine).unwrap();
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn stale_ticket_release_changes_nothing() {
    with_two_nodes(|f, _, a, b| {
        let old = a.lock(2).unwrap();
        let stale = crate::lock::Held { lock: old.lock, seq: old.seq, floor: 0 };
        a.unlock(old).unwrap();
        let current = a.lock(2).unwrap();
        assert_eq!(a.unlock(stale), Err(Error::Revoked), "an old ticket is refused");
        assert_eq!(b.lock(2), Err(Error::Timeout), "the current grant is still held");
        let again = crate::lock::Held { lock: current.lock, seq: current.seq, floor: 0 };
        a.unlock(current).unwrap();
        assert_eq!(a.unlock(again), Err(Error::Revoked), "a second release is refused");
        let gb = b.lock(2).unwrap();
        b.unlock(gb).unwrap();
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn a_late_grant_to_a_free_node_is_nobodys_and_attach_resets_it() {
    with_two_nodes(|f, _, a, b| {
        let l = &f.store.layout;
        let slot = l.lock_slot(2, 1);
        let first = b.lock(2).unwrap();
        let late: crate::layout::LockSlot = f.store.view.read(slot).unwrap();
        b.unlock(first).unwrap();
        let second = b.lock(2).unwrap();
        let last = second.seq;
        b.unlock(second).unwrap();
        b.detach().unwrap();
        // A grant older than the lock's last lands after node 1 left: a
        // cut-off manager step's line, written back late.
        f.store.view.write(slot, &late).unwrap();
        assert!(findings(f).is_empty(), "nobody holds by it: {:?}", findings(f));
        // The lock's last grant in a free node's slot is a hold recovery
        // missed: reported.
        f.store.view.write(slot, &crate::layout::LockSlot { seq: last, ..late }).unwrap();
        let found = findings(f);
        assert!(found.iter().any(|x| x.kind == FindingKind::HeldByDead && x.a == 2 && x.b == 1), "{found:?}");
        // A node attaching to the slot does not inherit it.
        f.store.view.write(slot, &late).unwrap();
        f.attach(1);
        let s: crate::layout::LockSlot = f.store.view.read(slot).unwrap();
        assert_eq!((s.state, s.seq), (crate::layout::SLOT_IDLE, late.seq), "reset, keeping its ticket");
        let g = a.lock(2).unwrap();
        a.unlock(g).unwrap();
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn a_kept_grant_is_taken_back_without_the_manager_and_given_back_when_recalled() {
    with_two_nodes(|f, env, b, a| {
        *env.keeps.lock() = true;
        let l = &f.store.layout;
        let slot = |n: u32| f.store.view.read::<crate::layout::LockSlot>(l.lock_slot(2, n)).unwrap();
        let line = || f.store.view.read::<crate::layout::LockLine>(l.lock_line(2)).unwrap();
        // Grants in a row to node 1, nobody else asking: the one after
        // KEEP_AFTER is kept.
        for _ in 0..crate::lock::KEEP_AFTER {
            let g = a.lock(2).unwrap();
            a.unlock(g).unwrap();
            assert!(!a.keeps_grants());
        }
        let g = a.lock(2).unwrap();
        let kept = g.seq;
        a.unlock(g).unwrap();
        assert!(a.keeps_grants());
        assert_eq!((slot(1).state, slot(1).seq), (crate::layout::SLOT_LOCKED, kept), "kept LOCKED");
        // Taken back with no manager step: the same ticket.
        let steps = *env.now.lock();
        let g = a.lock(2).unwrap();
        assert_eq!((g.seq, *env.now.lock()), (kept, steps), "taken back without asking the manager");
        a.unlock(g).unwrap();
        // Node 0 asks: the manager recalls it; node 0 waits until node 1
        // gives it back (its background thread's part).
        assert_eq!(b.lock(2), Err(Error::Timeout), "a kept grant is held");
        assert_eq!(line().reserved[crate::lock::LINE_RECALL], kept, "recalled");
        assert_eq!(a.release_parks(0), Ok(1));
        assert!(!a.keeps_grants());
        let gb = b.lock(2).unwrap();
        assert!(gb.seq > kept);
        // A recalled grant is not kept at its release either.
        assert_eq!(a.lock(2), Err(Error::Timeout));
        b.unlock(gb).unwrap();
        assert!(findings(f).is_empty(), "{:?}", findings(f));
        // Not kept for a while after a recall; then kept again, and node 1
        // is declared dead: the manager revokes the kept grant as any
        // other, and node 1 cannot take it back.
        let mut grants = 0;
        while !a.keeps_grants() && grants < 4 * u32::from(crate::lock::COOL_GRANTS) {
            let g = a.lock(2).unwrap();
            a.unlock(g).unwrap();
            grants += 1;
        }
        assert!(grants >= u32::from(crate::lock::COOL_GRANTS), "kept again after {grants} grants");
        assert!(a.keeps_grants());
        let kept = slot(1).seq;
        *env.killed.lock() = 1 << 1;
        assert_eq!(b.lock(2), Err(Error::Timeout), "revoked, it awaits repair");
        assert_eq!(slot(1).state, crate::layout::SLOT_IDLE, "revoked");
        assert!(a.lock(2).is_err(), "a revoked kept grant is not taken back");
        assert!(!a.keeps_grants());
        let rep = b.recover(0).unwrap();
        assert_eq!(rep.locks_repaired, 1);
        let gb = b.lock(2).unwrap();
        assert!(gb.seq > kept);
        b.unlock(gb).unwrap();
    });
}

#[test]
fn detach_gives_kept_grants_back() {
    with_two_nodes(|f, env, a, b| {
        *env.keeps.lock() = true;
        for _ in 0..=crate::lock::KEEP_AFTER {
            let g = a.lock(1).unwrap();
            a.unlock(g).unwrap();
        }
        assert!(a.keeps_grants());
        a.detach().unwrap();
        let s: crate::layout::LockSlot = f.store.view.read(f.store.layout.lock_slot(1, 0)).unwrap();
        assert_eq!(s.state, crate::layout::SLOT_IDLE);
        let g = b.lock(1).unwrap();
        b.unlock(g).unwrap();
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn detach_is_refused_while_an_app_lock_is_held() {
    with_two_nodes(|f, _, a, b| {
        let i = a.lock_alloc().unwrap();
        let held = a.lock_app(i).unwrap();
        assert_eq!(a.detach(), Err(Error::Busy));
        assert!(findings(f).is_empty(), "the node is still attached: {:?}", findings(f));
        a.unlock_app(held).unwrap();
        a.detach().unwrap();
        let g = b.lock_app(i).unwrap();
        b.unlock_app(g).unwrap();
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn release_of_a_reservation_is_refused_and_changes_nothing() {
    let f = Fixture::new(8 << 20, small_caps());
    f.attach(0);
    let env = InlineEnv::new(&f.store);
    let l0 = NodeLocal::default();
    let a = node(&f, &env, &l0, 0);
    let h = a.reserve(1, key(1), 5000, 1).unwrap();
    assert_eq!(a.release(&[h]), Err(Error::NotPinned));
    assert!(findings(&f).is_empty(), "{:?}", findings(&f));
    a.write(&h, 0, &[7u8; 5000]).unwrap();
    a.publish_flushed(&[h], &mut [Ok(())]).unwrap();
    let mut buf = [0u8; 5000];
    assert_eq!(a.get(1, key(1), &mut buf), Ok(5000));
    assert_eq!(buf, [7u8; 5000]);
    assert!(findings(&f).is_empty(), "{:?}", findings(&f));
}

#[test]
fn free_takes_raw_allocations_only() {
    let f = Fixture::new(8 << 20, small_caps());
    f.attach(0);
    let env = InlineEnv::new(&f.store);
    let l0 = NodeLocal::default();
    let a = node(&f, &env, &l0, 0);
    let h = a.reserve(1, key(1), 5000, 1).unwrap();
    a.write(&h, 0, &[9u8; 5000]).unwrap();
    a.publish_flushed(&[h], &mut [Ok(())]).unwrap();
    let l = f.store.layout;
    for bad in [h.off, h.off + 64, 0, 64, l.payload.start - 64, l.payload.end, u64::MAX] {
        assert_eq!(a.free(bad), Err(Error::InvalidArgument), "offset {bad}");
    }
    let raws: Vec<u64> = (0..8).map(|_| a.alloc(5000).unwrap()).collect();
    for &r in &raws {
        assert!(r + 5000 <= h.off || r >= h.off + 5000, "a raw block overlaps the KV block");
        a.free(r).unwrap();
    }
    let mut buf = [0u8; 5000];
    assert_eq!(a.get(1, key(1), &mut buf), Ok(5000));
    assert_eq!(buf, [9u8; 5000], "the KV block kept its bytes");
    assert!(findings(&f).is_empty(), "{:?}", findings(&f));
}

/// Capacities with the default 2 MiB chunks, for space tests.
fn space_caps() -> crate::layout::Capacities {
    crate::layout::Capacities {
        max_nodes: 8,
        n_stripes: 8,
        entries_per_stripe: 1024,
        chunk_shift: 21,
        pin_slots: 4096,
        ..small_caps()
    }
}

/// Puts blocks of `len(i)` bytes from `nodes` nodes in turn, each by its
/// own node, until the first eviction; returns the share of the payload
/// capacity that was live just before it.
fn live_share_at_first_eviction(nodes: u32, len: impl Fn(u64) -> u64) -> f64 {
    let f = Fixture::new(72 << 20, space_caps());
    let env = InlineEnv::new(&f.store);
    let locals: Vec<NodeLocal> = (0..nodes).map(|_| NodeLocal::default()).collect();
    let ns: Vec<_> = (0..nodes)
        .map(|i| {
            f.attach(i);
            node(&f, &env, &locals[i as usize], i)
        })
        .collect();
    let cap = f.store.layout.payload.len() as f64;
    let mut live = 0u64;
    for i in 0..100_000u64 {
        let n = &ns[(i % nodes as u64) as usize];
        let bytes = len(i);
        let h = n.reserve(1, key(i), bytes, 16).unwrap();
        n.publish(&h).unwrap();
        if ns.iter().any(|n| n.stats().unwrap().evictions > 0) {
            assert!(findings(&f).is_empty(), "{:?}", findings(&f));
            std::eprintln!("eviction began with {:.3} of the payload capacity live", live as f64 / cap);
            return live as f64 / cap;
        }
        live += bytes;
    }
    panic!("no eviction");
}

#[test]
fn mixed_sizes_fill_most_of_the_region_before_eviction() {
    let rnd = |i: u64| crate::hash::mix64(i ^ 0x5eed);
    // Random lengths from 4 KiB to 1 MiB, from six nodes.
    let share = live_share_at_first_eviction(6, |i| 4096 + rnd(i) % (1 << 20));
    assert!(share >= 0.85, "eviction began at {share:.3} of capacity live");
    // Twelve fixed sizes, a few just above a granule multiple.
    let sizes = [4097u64, 8192, 12_000, 16_384, 50_000, 65_536, 100_001, 131_072, 300_000, 524_288, 700_000, 1 << 20];
    let share = live_share_at_first_eviction(6, |i| sizes[(rnd(i) % 12) as usize]);
    assert!(share >= 0.85, "eviction began at {share:.3} of capacity live");
    // Up to a whole chunk.
    let share = live_share_at_first_eviction(3, |i| 4096 + rnd(i) % (2 << 20));
    assert!(share >= 0.85, "eviction began at {share:.3} of capacity live");
}

#[test]
fn out_of_space_only_when_everything_evictable_is_pinned() {
    let f = Fixture::new(72 << 20, space_caps());
    let env = InlineEnv::new(&f.store);
    let locals: Vec<NodeLocal> = (0..6).map(|_| NodeLocal::default()).collect();
    let ns: Vec<_> = (0..6u32)
        .map(|i| {
            f.attach(i);
            node(&f, &env, &locals[i as usize], i)
        })
        .collect();
    let sizes =
        [4096u64, 9000, 16_384, 40_000, 65_536, 128 << 10, 200_000, 256 << 10, 500_000, 1 << 20, 1_500_000, 2 << 20];
    // Many times the region, every size from every node: never refused.
    for i in 0..1500u64 {
        let n = &ns[(i % 6) as usize];
        let len = sizes[(crate::hash::mix64(i) % 12) as usize];
        let h = n.reserve(1, key(i), len, 16).unwrap_or_else(|e| panic!("put {i} of {len} bytes: {e:?}"));
        n.publish(&h).unwrap();
    }
    assert!(findings(&f).is_empty(), "{:?}", findings(&f));
    // Pin everything stored, then keep putting (and pinning) 1 MiB blocks:
    // each fits until no room is left, and then nothing is evictable.
    let keys: Vec<Key> = (0..1500).map(key).collect();
    let mut out = std::vec![Err(Error::InvalidArgument); keys.len()];
    assert!(ns[0].acquire(1, &keys, &mut out).unwrap() > 0);
    let mut held: Vec<_> = out.iter().filter_map(|r| r.ok()).collect();
    let mut i = 10_000;
    let full = loop {
        match ns[1].reserve(1, key(i), 1 << 20, 16) {
            Ok(h) => {
                ns[1].publish(&h).unwrap();
                let mut o = [Err(Error::InvalidArgument)];
                ns[0].acquire(1, &[key(i)], &mut o).unwrap();
                held.push(o[0].unwrap());
            }
            Err(e) => break e,
        }
        i += 1;
        assert!(i < 20_000, "the region never filled");
    };
    assert_eq!(full, Error::OutOfSpace);
    assert_eq!(ns[1].evict(u64::MAX, &mut crate::index::Lru).unwrap().entries, 0, "something was evictable");
    ns[0].release(&held).unwrap();
    let h = ns[1].reserve(1, key(99_999), 1 << 20, 16).unwrap();
    ns[1].publish(&h).unwrap();
    assert!(findings(&f).is_empty(), "{:?}", findings(&f));
}

/// Two keys of namespace 1 in one stripe, and that stripe.
fn keys_in_one_stripe(f: &Fixture) -> (Key, Key, u32) {
    let s = f.store.stripe_of(1, key(1));
    let other = (2..).map(key).find(|k| f.store.stripe_of(1, *k) == s).unwrap();
    (key(1), other, s)
}

#[test]
fn a_revoked_holders_late_header_is_void_and_the_next_holder_has_it_repaired() {
    use crate::layout::StripeHeader;
    with_two_nodes(|f, env, a, b| {
        let l = &f.store.layout;
        let (k1, k2, s) = keys_in_one_stripe(f);
        let h = a.reserve(1, k1, 3000, 1).unwrap();
        a.publish(&h).unwrap();
        // Node 1 takes the stripe's lock and changes the header (as its
        // critical section would), then stops past its lease holding it.
        let held = b.lock(l.locks().stripe(s)).unwrap();
        let mut late: StripeHeader = f.store.view.read(l.stripe(s)).unwrap();
        late.ticket = held.seq;
        late.changes = late.changes.wrapping_add(1);
        *env.killed.lock() = 1 << 1;
        env.step().unwrap();
        a.recover(0).unwrap();
        let h = a.reserve(1, k2, 3000, 1).unwrap();
        a.publish(&h).unwrap();
        let before: StripeHeader = f.store.view.read(l.stripe(s)).unwrap();
        assert!(before.ticket >= held.seq, "holders after the repair stamp their own tickets");
        // It wakes and its write lands over what the rack did since.
        f.store.view.write(l.stripe(s), &late).unwrap();
        assert!(findings(f).iter().any(|x| x.kind == FindingKind::VoidStripe), "{:?}", findings(f));
        // The next holder of the stripe finds the header void and has the
        // stripe repaired before it uses it: both blocks stay stored.
        let mut out = [(0u32, Key::default(), 0u64); 4];
        assert_eq!(a.coldest(s, &mut out).unwrap(), 2);
        assert!(findings(f).is_empty(), "{:?}", findings(f));
        assert_eq!(a.lookup(1, &[k1, k2]).unwrap(), 2);
        let after: StripeHeader = f.store.view.read(l.stripe(s)).unwrap();
        assert!(after.changes > before.changes, "the change count never goes back");
        assert_eq!(b.unlock(held), Err(Error::Revoked));
    });
}

#[test]
fn a_revoked_holders_late_chunk_record_is_void_and_the_next_holder_has_it_repaired() {
    use crate::layout::ChunkRecord;
    with_two_nodes(|f, env, a, b| {
        let l = &f.store.layout;
        let first = a.alloc(1000).unwrap();
        let c = crate::alloc::chunk_of(l, first).unwrap();
        // Node 1 takes node 0's heap lock (as freeing one of node 0's raw
        // blocks does) and stops past its lease holding it: the record as
        // its cache would write it back later.
        let held = b.lock(l.locks().heap(a.id)).unwrap();
        let mut late: ChunkRecord = f.store.view.read(l.chunk(c)).unwrap();
        late.ticket = held.seq;
        *env.killed.lock() = 1 << 1;
        env.step().unwrap();
        a.recover(0).unwrap();
        let second = a.alloc(1000).unwrap();
        let now: ChunkRecord = f.store.view.read(l.chunk(c)).unwrap();
        assert!(now.ticket > held.seq, "holders after the repair stamp their own tickets");
        assert_eq!(crate::alloc::chunk_of(l, second).unwrap(), c);
        // It wakes and its record lands over what the rack did since.
        f.store.view.write(l.chunk(c), &late).unwrap();
        assert!(findings(f).iter().any(|x| x.kind == FindingKind::VoidChunk), "{:?}", findings(f));
        // The next holder finds the chunk void and has it repaired before
        // it changes anything there: the free goes through, and the chunk
        // keeps the first block.
        a.free(second).unwrap();
        assert!(findings(f).is_empty(), "{:?}", findings(f));
        let third = a.alloc(1000).unwrap();
        assert_ne!(third, first);
        a.free(first).unwrap();
        a.free(third).unwrap();
        assert_eq!(b.unlock(held), Err(Error::Revoked));
    });
}

#[test]
fn a_replaced_managers_late_lock_line_turns_nothing_back() {
    use crate::layout::LockLine;
    with_two_nodes(|f, env, a, b| {
        let l = &f.store.layout;
        let lock = 2;
        for _ in 0..3 {
            let g = a.lock(lock).unwrap();
            a.unlock(g).unwrap();
        }
        // The line as a manager that stopped now would write it back later.
        let late: LockLine = f.store.view.read(l.lock_line(lock)).unwrap();
        let held = b.lock(lock).unwrap();
        *env.killed.lock() = 1 << 1;
        env.step().unwrap();
        // The late line lands: count back, no repair pending.
        f.store.view.write(l.lock_line(lock), &late).unwrap();
        // The manager still refuses a plain request (the lock awaits repair)
        // and writes its own line again.
        assert_eq!(a.lock(lock), Err(Error::Timeout));
        let now: LockLine = f.store.view.read(l.lock_line(lock)).unwrap();
        assert!(now.repair != 0 && now.grant_seq >= held.seq, "{now:?}");
        let rep = a.recover(0).unwrap();
        assert_eq!(rep.locks_repaired, 1);
        let g = a.lock(lock).unwrap();
        assert!(g.seq > held.seq, "no ticket is handed out twice");
        assert!(g.floor > held.seq, "the grant carries the repair's floor");
        let (seq, floor) = (g.seq, g.floor);
        a.unlock(g).unwrap();
        // The late line lands again, after the repair: the count, the floor
        // and the cleared repair stay as they were.
        f.store.view.write(l.lock_line(lock), &late).unwrap();
        let g2 = a.lock(lock).unwrap();
        assert!(g2.seq > seq && g2.floor == floor, "{g2:?} after ticket {seq}, floor {floor}");
        a.unlock(g2).unwrap();
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

/// Node 0 publishes key 1 and node 1 pins it; node 1 reserves key 2 and allocates a raw block, then
/// stops: it is declared dead by its silence and recovered. Returns the
/// reservation and the raw block's offset.
fn stop_node_1_holding_a_pin_a_reservation_and_a_raw_block(
    f: &Fixture,
    env: &InlineEnv<'_>,
    a: &crate::node::Node<'_, crate::coherence::Coherent>,
    b: &crate::node::Node<'_, crate::coherence::Coherent>,
) -> (crate::index::Handle, u64) {
    let h = a.reserve(1, key(1), 5000, 1).unwrap();
    a.publish(&h).unwrap();
    let mut out = [Err(Error::InvalidArgument)];
    b.acquire(1, &[key(1)], &mut out).unwrap();
    let w = b.reserve(1, key(2), 5000, 1).unwrap();
    let raw = b.alloc(1000).unwrap();
    *env.stopped.lock() = 1 << 1;
    env.step().unwrap();
    *env.now.lock() += 5000;
    assert_eq!(env.step().unwrap().newly_dead, 1 << 1, "declared dead by its silence");
    let rep = a.recover(0).unwrap();
    assert_eq!((rep.nodes_freed, rep.nodes_fenced), (0, 1 << 1), "not known quiet: fenced, not freed");
    assert_eq!((rep.writes_aborted, rep.writes_quarantined, rep.pins_dropped), (0, 1, 0));
    assert!(findings(f).is_empty(), "{:?}", findings(f));
    (w, raw)
}

#[test]
fn a_stopped_nodes_blocks_stay_allocated_until_it_says_it_is_quiet() {
    with_two_nodes(|f, env, a, b| {
        let (w, raw) = stop_node_1_holding_a_pin_a_reservation_and_a_raw_block(f, env, &a, &b);
        // Its reservation's key is free for others, in another block; its
        // pin still holds (it may read the block when it wakes).
        let h2 = a.reserve(1, key(2), 5000, 1).unwrap();
        assert_ne!(h2.off, w.off, "a quarantined block is handed out again");
        a.publish(&h2).unwrap();
        for _ in 0..8 {
            let o = a.alloc(1000).unwrap();
            assert_ne!(o, raw, "a quarantined raw block is handed out again");
        }
        assert_eq!(a.evict(u64::MAX, &mut crate::index::Lru).unwrap().entries, 1, "only key 2: key 1 is pinned");
        assert!(findings(f).is_empty(), "{:?}", findings(f));
        // Another recovery keeps all of it.
        let rep = a.recover(0).unwrap();
        assert_eq!((rep.nodes_freed, rep.nodes_fenced, rep.writes_quarantined), (0, 1 << 1, 1));

        // It wakes: fenced. It writes back what it holds and says so.
        assert_eq!(b.heartbeat(78), Err(Error::Revoked));
        assert_eq!(b.quiesce(77), Ok(false), "another nonce: not its slot");
        assert_eq!(b.quiesce(78), Ok(true));
        assert_eq!(b.quiesce(78), Ok(false), "said already");
        assert_eq!(env.step().unwrap().dead, 1 << 1, "the manager calls for the recovery that frees it");
        let rep = a.recover(0).unwrap();
        assert_eq!((rep.nodes_freed, rep.nodes_fenced), (1 << 1, 0));
        assert_eq!((rep.writes_aborted, rep.writes_quarantined, rep.pins_dropped), (1, 0, 1));
        assert_eq!(rep.blocks_reclaimed, 2, "the reservation's block and the raw block");
        assert!(findings(f).is_empty(), "{:?}", findings(f));
        assert_eq!(a.evict(u64::MAX, &mut crate::index::Lru).unwrap().entries, 1, "key 1, its pin gone");
    });
}

#[test]
fn an_operator_says_a_dead_nodes_host_is_down_and_recovery_frees_its_blocks() {
    with_two_nodes(|f, env, a, b| {
        stop_node_1_holding_a_pin_a_reservation_and_a_raw_block(f, env, &a, &b);
        assert_eq!(crate::node::declare_quiet(&f.store, 0), Ok(false), "node 0 is alive");
        assert_eq!(crate::node::declare_quiet(&f.store, 1), Ok(true));
        assert_eq!(crate::node::declare_quiet(&f.store, 1), Ok(false), "said already");
        let rep = a.recover(0).unwrap();
        assert_eq!((rep.nodes_freed, rep.writes_aborted, rep.blocks_reclaimed), (1 << 1, 1, 2));
        assert!(findings(f).is_empty(), "{:?}", findings(f));
        assert_eq!(crate::node::declare_quiet(&f.store, 1), Ok(false), "free now");
    });
}

#[test]
fn a_node_whose_process_is_gone_from_its_host_is_quiet_at_once() {
    with_two_nodes(|f, env, a, b| {
        let _w = b.reserve(1, key(2), 5000, 1).unwrap();
        *env.killed.lock() = 1 << 1;
        env.step().unwrap();
        let rep = a.recover(0).unwrap();
        assert_eq!((rep.nodes_freed, rep.nodes_fenced, rep.writes_aborted), (1 << 1, 0, 1), "buried: quiet");
        assert!(findings(f).is_empty(), "{:?}", findings(f));
    });
}

#[test]
fn a_quarantined_entry_naming_no_fenced_node_is_reported() {
    with_two_nodes(|f, env, a, b| {
        let (w, _) = stop_node_1_holding_a_pin_a_reservation_and_a_raw_block(f, env, &a, &b);
        let l = &f.store.layout;
        let mut e: crate::layout::Entry = f.store.view.read(l.entry(w.stripe, w.entry)).unwrap();
        assert_eq!(e.state, crate::layout::state::QUARANTINED);
        e.set_writer(Some(0));
        f.store.view.write(l.entry(w.stripe, w.entry), &e).unwrap();
        assert!(findings(f).iter().any(|x| x.kind == FindingKind::Writer), "{:?}", findings(f));
    });
}

#[test]
fn a_fenced_node_is_taken_as_quiet_once_its_quarantine_is_over() {
    with_two_nodes(|f, env, a, b| {
        *env.quarantine.lock() = 3000;
        let (w, raw) = stop_node_1_holding_a_pin_a_reservation_and_a_raw_block(f, env, &a, &b);
        let rep = env.step().unwrap();
        assert_eq!((rep.quarantine_ended, rep.dead), (0, 0), "the quarantine has just begun");
        *env.now.lock() += 2000;
        assert_eq!(env.step().unwrap().quarantine_ended, 0, "not over yet");
        *env.now.lock() += 2000;
        let rep = env.step().unwrap();
        assert_eq!((rep.quarantine_ended, rep.dead), (1 << 1, 1 << 1), "over: taken as quiet, recovery due");
        let rep = a.recover(0).unwrap();
        assert_eq!((rep.nodes_freed, rep.writes_aborted, rep.blocks_reclaimed), (1 << 1, 1, 2));
        assert!(findings(f).is_empty(), "{:?}", findings(f));
        let _ = (w, raw);
    });
}
