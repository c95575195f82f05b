//! The block-event feed: stores by one node and evictions by another arrive
//! once each, in order; a feed left behind by more than the change log holds
//! repairs the gap with exact events (a recovery's rebuild meets the same
//! repair: core's and the simulator's tests).

use std::collections::HashSet;
use std::time::Duration;

use cxlkv_core::hash::Key;
use cxlkv_core::index::Lru;
use cxlkv_core::layout::Capacities;
use cxlkv_platform::events::Event;
use cxlkv_platform::{FlushMode, Node, Options, Region};

fn caps() -> Capacities {
    Capacities {
        max_nodes: 4,
        n_stripes: 4,
        entries_per_stripe: 256,
        chunk_shift: 16,
        change_records: 16,
        max_tenants: 2,
        ..Capacities::default()
    }
}

fn opts() -> Options {
    Options { local_dir: std::env::temp_dir(), lock_timeout: Duration::from_secs(30), ..Options::default() }
}

fn key(i: u64) -> Key {
    Key { lo: i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1, hi: i }
}

fn put(n: &Node, i: u64) {
    let h = n.core().reserve(1, key(i), 100 + i, 16).unwrap();
    n.core().write(&h, 0, &vec![i as u8; 100 + i as usize]).unwrap();
    n.core().publish_flushed(&[h], &mut [Ok(())]).unwrap();
}

/// Applies events to a set of stored keys, checking each is news.
fn apply(set: &mut HashSet<Key>, events: &[Event]) {
    for e in events {
        match *e {
            Event::Cleared => set.clear(),
            Event::Stored { key, .. } => assert!(set.insert(key), "stored twice: {}", key.hi),
            Event::Removed { key, .. } => assert!(set.remove(&key), "removed while not stored: {}", key.hi),
        }
    }
}

fn truth(n: &Node, upto: u64) -> HashSet<Key> {
    (0..upto).map(key).filter(|k| n.exists(1, *k).unwrap()).collect()
}

#[test]
fn stores_and_evictions_by_two_nodes_arrive_once_each_and_gaps_repair_exactly() {
    let path = std::env::temp_dir().join(format!("cxlkv-events-{}", std::process::id()));
    let a = Node::create(&path, 16 << 20, caps(), opts()).unwrap();
    let b = Node::open(&path, opts()).unwrap();
    put(&a, 0);
    let observed = Region::open(&path).unwrap().observe(FlushMode::Clflush).unwrap();
    let mut feed = observed.feed();
    let mut set = HashSet::new();
    let mut ev = Vec::new();
    feed.poll(&mut ev).unwrap();
    assert_eq!(ev[0], Event::Cleared, "a feed starts from the region's state");
    assert!(matches!(ev[1], Event::Stored { key: k, node: None, .. } if k == key(0)));
    apply(&mut set, &ev);

    // Node a stores, node b evicts: each once, with who did it, in order.
    for i in 1..5 {
        put(&a, i);
    }
    b.core().evict(u64::MAX, &mut Lru).unwrap();
    ev.clear();
    feed.poll(&mut ev).unwrap();
    let by_a = ev.iter().filter(|e| matches!(e, Event::Stored { node: Some(n), .. } if *n == a.id())).count();
    assert_eq!(by_a, 4, "{ev:?}");
    let by_b = ev.iter().filter(|e| matches!(e, Event::Removed { node: Some(n), .. } if *n == b.id())).count();
    assert_eq!(by_b, 5, "{ev:?}");
    for i in 1..5 {
        let stored = ev.iter().position(|e| matches!(*e, Event::Stored { key: k, .. } if k == key(i)));
        let removed = ev.iter().position(|e| matches!(*e, Event::Removed { key: k, .. } if k == key(i)));
        assert!(stored.is_some() && stored < removed, "key {i}: stored, then removed");
    }
    apply(&mut set, &ev);
    assert_eq!(set, truth(&a, 5));
    assert_eq!(feed.stats().gaps, 0);

    // Far more changes than a stripe's log holds, unread: the feed meets
    // gaps and reports exactly the difference.
    for i in 100..300 {
        put(&a, i);
    }
    for i in (100..300).step_by(3) {
        assert!(b.remove(1, &[key(i)]).unwrap()[0]);
    }
    ev.clear();
    feed.poll(&mut ev).unwrap();
    assert!(feed.stats().gaps > 0, "the log was outrun");
    apply(&mut set, &ev);
    assert_eq!(set, truth(&a, 300));

    assert!(a.check().unwrap().is_empty(), "{:?}", a.check().unwrap());
    drop((a, b));
    let _ = std::fs::remove_file(&path);
}

/// A feed polled by one thread while another stores and removes: at every
/// quiet point the feed's view is exactly what the region stores.
#[test]
fn a_feed_polled_while_a_node_stores_and_removes_misses_nothing() {
    let path = std::env::temp_dir().join(format!("cxlkv-events-race-{}", std::process::id()));
    let caps = Capacities { change_records: 256, ..caps() };
    let a = std::sync::Arc::new(Node::create(&path, 16 << 20, caps, opts()).unwrap());
    let region = Region::open(&path).unwrap();
    let obs = region.observe(FlushMode::Clflush).unwrap();
    let mut feed = obs.feed();
    let mut seen = HashSet::new();
    let mut events = Vec::new();
    for round in 0..40u64 {
        let writer = {
            let a = a.clone();
            std::thread::spawn(move || {
                for i in 0..8 {
                    put(&a, round * 8 + i);
                }
                let gone: Vec<Key> = (0..8).filter(|i| i % 3 == 0).map(|i| key(round * 8 + i)).collect();
                assert!(a.remove(1, &gone).unwrap().iter().all(|&r| r));
            })
        };
        while !writer.is_finished() {
            events.clear();
            feed.poll(&mut events).unwrap();
            apply(&mut seen, &events);
        }
        writer.join().unwrap();
        events.clear();
        feed.poll(&mut events).unwrap();
        apply(&mut seen, &events);
        assert_eq!(seen, truth(&a, (round + 1) * 8), "round {round}: {:?}", feed.stats());
    }
    drop(feed);
    drop(obs);
    drop(std::sync::Arc::try_unwrap(a).ok());
    let _ = std::fs::remove_file(&path);
}

/// The publisher on an attached node: stores (with route records, read back
/// by the publisher through the same node) and a removal are all published.
#[test]
fn a_publisher_on_the_storing_node_publishes_every_store_and_removal() {
    use cxlkv_platform::publish::{Publisher, PublisherOptions};
    use cxlkv_platform::route::Route;
    for round in 0..60u64 {
        let path = std::env::temp_dir().join(format!("cxlkv-events-pub-{}-{round}", std::process::id()));
        let caps = Capacities { max_nodes: 4, chunk_shift: 16, ..Capacities::default() };
        let a = std::sync::Arc::new(Node::create(&path, 32 << 20, caps, opts()).unwrap());
        let p = Publisher::attached(
            a.clone(),
            PublisherOptions { endpoint: "tcp://127.0.0.1:0".into(), ..PublisherOptions::default() },
        )
        .unwrap();
        // A block stored and removed before the publisher's first look at
        // the region is rightly never reported: start from that look.
        let t = std::time::Instant::now();
        while p.stats().batches == 0 {
            assert!(t.elapsed() < Duration::from_secs(10), "no first batch");
            std::thread::sleep(Duration::from_millis(1));
        }
        let keys: Vec<Key> = (0..3)
            .map(|i| Key {
                lo: cxlkv_core::hash::mix64(round * 10 + i),
                hi: cxlkv_core::hash::mix64(!(round * 10 + i)),
            })
            .collect();
        let routes: Vec<(Key, Route)> =
            keys.iter().map(|&k| (k, Route { block_size: 4, tokens: vec![1, 2, 3, 4], ..Route::default() })).collect();
        let mut out = vec![Ok(()); 3];
        a.put_routes(1, &routes, &mut out).unwrap();
        assert!(out.iter().all(|r| r.is_ok()));
        let payload = vec![7u8; 256];
        let parts: [&[u8]; 1] = [&payload];
        let items: Vec<cxlkv_platform::PutItem<'_>> =
            keys.iter().map(|&k| cxlkv_platform::PutItem { key: k, tokens: 4, parts: &parts }).collect();
        a.put(1, &items, &mut out).unwrap();
        assert!(out.iter().all(|r| r.is_ok()));
        assert_eq!(a.remove(1, &keys[2..]).unwrap(), vec![true]);
        let t = std::time::Instant::now();
        while p.stats().events < 5 {
            assert!(t.elapsed() < Duration::from_secs(10), "round {round}: {:?}", p.stats());
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(p.stop().events, 5);
        drop(a);
        let _ = std::fs::remove_file(&path);
    }
}

/// A change cursor keeps nothing per block: it reports what changed since
/// its last poll, and a stripe it fell a whole log behind on as a gap.
#[test]
fn a_change_cursor_reports_changes_once_and_a_stripe_it_lost_as_a_gap() {
    use cxlkv_platform::events::ChangeCursor;
    let path = std::env::temp_dir().join(format!("cxlkv-cursor-{}", std::process::id()));
    let a = Node::create(&path, 16 << 20, caps(), opts()).unwrap();
    let b = Node::open(&path, opts()).unwrap();
    put(&a, 0);
    let mut cursor = ChangeCursor::at_head(a.store()).unwrap();
    let (mut out, mut gaps) = (Vec::new(), Vec::new());
    cursor.poll(a.store(), &[], &mut out, &mut gaps).unwrap();
    assert!(out.is_empty() && gaps.is_empty(), "nothing before the cursor");
    put(&b, 1);
    b.core().evict(u64::MAX, &mut Lru).unwrap();
    cursor.poll(a.store(), &[1], &mut out, &mut gaps).unwrap();
    assert!(gaps.is_empty());
    let seen: Vec<(bool, u64)> = out.iter().map(|c| (c.stored, c.key.hi)).collect();
    assert!(seen.contains(&(true, 1)) && seen.contains(&(false, 0)) && seen.contains(&(false, 1)), "{seen:?}");
    assert_eq!(out.len(), 3);
    out.clear();
    cursor.poll(a.store(), &[2], &mut out, &mut gaps).unwrap();
    assert!(out.is_empty() && gaps.is_empty());
    // More changes in one stripe than its log holds (16): a gap there.
    let s = a.store().stripe_of(1, key(100));
    let mut n = 0;
    for i in 100u64.. {
        if a.store().stripe_of(1, key(i)) == s {
            put(&a, i);
            n += 1;
            if n == 20 {
                break;
            }
        }
    }
    cursor.poll(a.store(), &[], &mut out, &mut gaps).unwrap();
    assert_eq!(gaps, vec![s]);
    out.clear();
    gaps.clear();
    put(&b, 5000);
    cursor.poll(a.store(), &[], &mut out, &mut gaps).unwrap();
    assert!(gaps.is_empty(), "past the gap, changes are read again");
    assert_eq!(out.iter().map(|c| (c.stored, c.key.hi)).collect::<Vec<_>>(), vec![(true, 5000)]);
    b.close().unwrap();
    a.close().unwrap();
    let _ = std::fs::remove_file(&path);
}
