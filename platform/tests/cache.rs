//! A `Cache` end to end in one process: two nodes on one region file, each
//! with its own thread; locks granted by whichever holds the manager lease.

use std::time::Duration;

use cxlkv_core::hash::Key;
use cxlkv_core::layout::Capacities;
use cxlkv_platform::{Cache, Options};

fn caps() -> Capacities {
    Capacities { max_nodes: 4, n_stripes: 4, entries_per_stripe: 256, chunk_shift: 18, ..Capacities::default() }
}

fn opts() -> Options {
    Options { local_dir: std::env::temp_dir(), lock_timeout: Duration::from_secs(30), ..Options::default() }
}

#[test]
fn two_nodes_share_blocks_through_one_file() {
    let p = std::env::temp_dir().join(format!("cxlkv-cache-{}", std::process::id()));
    let a = Cache::create(&p, 32 << 20, caps(), opts()).unwrap();
    let b = Cache::open(&p, opts()).unwrap();
    assert_ne!(a.id(), b.id());
    let keys: Vec<Key> = (0..50u64).map(|i| Key { lo: i * 7 + 1, hi: i }).collect();
    for k in &keys {
        let h = a.node().reserve(3, *k, 10_000, 16).unwrap();
        a.node().write(&h, 0, &vec![(k.lo % 251) as u8; 10_000]).unwrap();
        a.node().publish_flushed(&[h], &mut [Ok(())]).unwrap();
    }
    assert_eq!(b.node().lookup(3, &keys).unwrap(), 50);
    let mut out = vec![Err(cxlkv_core::Error::InvalidArgument); keys.len()];
    assert_eq!(b.node().acquire(3, &keys, &mut out).unwrap(), 50);
    let mut buf = vec![0u8; 10_000];
    for (k, h) in keys.iter().zip(&out) {
        b.node().read(h.as_ref().unwrap(), 0, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == (k.lo % 251) as u8));
    }
    let hs: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
    b.node().release(&hs).unwrap();
    assert!(a.check().unwrap().is_empty());
    b.close().unwrap();
    a.close().unwrap();
    let _ = std::fs::remove_file(&p);
}

/// Two nodes, two threads each, hammer one global lock and increment a word
/// of the region with a plain read-modify-write under it: no update is lost.
#[test]
fn lock_serialises_read_modify_write_across_nodes() {
    let p = std::env::temp_dir().join(format!("cxlkv-lock-{}", std::process::id()));
    let a = std::sync::Arc::new(Cache::create(&p, 32 << 20, caps(), opts()).unwrap());
    let b = std::sync::Arc::new(Cache::open(&p, opts()).unwrap());
    let word = a.store().layout.payload.start;
    let mut threads = Vec::new();
    for c in [a.clone(), a.clone(), b.clone(), b.clone()] {
        threads.push(std::thread::spawn(move || {
            let r = c.store().region;
            for _ in 0..300 {
                let h = c.node().lock(1).unwrap();
                let v = r.load_u64(word).unwrap();
                std::hint::spin_loop();
                r.store_u64(word, v + 1).unwrap();
                c.node().unlock(h).unwrap();
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(a.store().region.load_u64(word).unwrap(), 1200);
    drop(b);
    drop(a);
    let _ = std::fs::remove_file(&p);
}
