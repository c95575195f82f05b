//! A `Node` end to end in one process: two nodes on one region file, each
//! with its own thread; locks granted by whichever holds the manager lease.

use std::time::Duration;

use cxlkv_core::hash::Key;
use cxlkv_core::layout::Capacities;
use cxlkv_platform::{Node, Options};

fn caps() -> Capacities {
    Capacities { max_nodes: 4, n_stripes: 4, entries_per_stripe: 256, chunk_shift: 18, ..Capacities::default() }
}

fn opts() -> Options {
    Options { local_dir: std::env::temp_dir(), lock_timeout: Duration::from_secs(30), ..Options::default() }
}

#[test]
fn two_nodes_share_blocks_through_one_file() {
    let p = std::env::temp_dir().join(format!("cxlkv-cache-{}", std::process::id()));
    let a = Node::create(&p, 32 << 20, caps(), opts()).unwrap();
    let b = Node::open(&p, opts()).unwrap();
    assert_ne!(a.id(), b.id());
    let keys: Vec<Key> = (0..50u64).map(|i| Key { lo: i * 7 + 1, hi: i }).collect();
    for k in &keys {
        let h = a.core().reserve(3, *k, 10_000, 16).unwrap();
        a.core().write(&h, 0, &vec![(k.lo % 251) as u8; 10_000]).unwrap();
        a.core().publish_flushed(&[h], &mut [Ok(())]).unwrap();
    }
    assert_eq!(b.core().lookup(3, &keys).unwrap(), 50);
    let mut out = vec![Err(cxlkv_core::Error::InvalidArgument); keys.len()];
    assert_eq!(b.core().acquire(3, &keys, &mut out).unwrap(), 50);
    let mut buf = vec![0u8; 10_000];
    for (k, h) in keys.iter().zip(&out) {
        b.core().read(h.as_ref().unwrap(), 0, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == (k.lo % 251) as u8));
    }
    let hs: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
    b.core().release(&hs).unwrap();
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
    let a = std::sync::Arc::new(Node::create(&p, 32 << 20, caps(), opts()).unwrap());
    let b = std::sync::Arc::new(Node::open(&p, opts()).unwrap());
    let word = a.store().layout.payload.start;
    let mut threads = Vec::new();
    for c in [a.clone(), a.clone(), b.clone(), b.clone()] {
        threads.push(std::thread::spawn(move || {
            let r = c.store().view;
            for _ in 0..300 {
                let h = c.core().lock(1).unwrap();
                let v = r.load_u64(word).unwrap();
                std::hint::spin_loop();
                r.store_u64(word, v + 1).unwrap();
                c.core().unlock(h).unwrap();
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(a.store().view.load_u64(word).unwrap(), 1200);
    drop(b);
    drop(a);
    let _ = std::fs::remove_file(&p);
}

/// Channels between two nodes: blocking receive with its timeout, and a
/// request/response round trip with another message arriving meanwhile.
#[test]
fn channels_hand_off_and_answer_calls() {
    use cxlkv_core::channel::Message;
    let p = std::env::temp_dir().join(format!("cxlkv-chan-{}", std::process::id()));
    let a = std::sync::Arc::new(Node::create(&p, 32 << 20, caps(), opts()).unwrap());
    let b = std::sync::Arc::new(Node::open(&p, opts()).unwrap());
    let short = Duration::from_millis(20);
    assert_eq!(b.recv(short).unwrap_err().core(), Some(cxlkv_core::Error::Timeout));
    let keys: Vec<Key> = (0..100u64).map(|i| Key { lo: i, hi: 7 }).collect();
    let hand = Message { kind: 1, request_id: 42, ns: 3, stamp: 5, ..Message::default() };
    a.send(b.id(), &hand, &keys).unwrap();
    let (m, k) = b.recv(Duration::from_secs(10)).unwrap();
    assert_eq!((m.kind, m.request_id, m.ns, m.stamp, m.from), (1, 42, 3, 5, a.id()));
    assert_eq!(k, keys);

    // B serves one call; before answering it sends A an unrelated message.
    let server = {
        let (a_id, b) = (a.id(), b.clone());
        std::thread::spawn(move || {
            let (req, k) = b.recv(Duration::from_secs(30)).unwrap();
            assert_eq!((req.kind, req.from), (2, a_id));
            b.send(a_id, &Message { kind: 9, request_id: 1, ..Message::default() }, &[]).unwrap();
            b.reply(&req, 200, &k[..1]).unwrap();
        })
    };
    let (resp, k) =
        a.call(b.id(), &Message { kind: 2, ..Message::default() }, &keys[..3], Duration::from_secs(30)).unwrap();
    assert_eq!((resp.kind, resp.status, resp.from), (2 | cxlkv_platform::KIND_RESPONSE, 200, b.id()));
    assert_eq!(k, keys[..1]);
    server.join().unwrap();
    let (other, _) = a.recv(short).unwrap();
    assert_eq!(other.kind, 9, "the message that came during the call stayed queued");
    assert!(a.try_recv().unwrap().is_none());
    drop(b);
    drop(a);
    let _ = std::fs::remove_file(&p);
}

/// A tier's answer to a promotion that comes after the get stopped waiting
/// is dropped: the application's receive never sees a message it did not
/// ask for, and its own messages around it still arrive in order.
#[test]
fn a_late_internal_answer_never_reaches_the_applications_receive() {
    use cxlkv_core::channel::Message;
    let p = std::env::temp_dir().join(format!("cxlkv-late-{}", std::process::id()));
    let a = Node::create(&p, 32 << 20, caps(), opts()).unwrap();
    let b = Node::open(&p, opts()).unwrap();
    let late = Message {
        kind: cxlkv_platform::KIND_TIER_PROMOTE | cxlkv_platform::KIND_RESPONSE,
        request_id: 77,
        ..Message::default()
    };
    b.send(a.id(), &Message { kind: 1, ..Message::default() }, &[]).unwrap();
    b.send(a.id(), &late, &[Key { lo: 1, hi: 2 }]).unwrap();
    b.send(a.id(), &Message { kind: 2, ..Message::default() }, &[]).unwrap();
    b.send(a.id(), &late, &[]).unwrap();
    let (m, _) = a.recv(Duration::from_secs(10)).unwrap();
    assert_eq!(m.kind, 1);
    let (m, _) = a.recv(Duration::from_secs(10)).unwrap();
    assert_eq!(m.kind, 2, "the late tier answer came out of recv");
    assert!(a.try_recv().unwrap().is_none());
    // An answer in time reaches its caller even while another thread of
    // the node receives.
    let (a, b) = (std::sync::Arc::new(a), std::sync::Arc::new(b));
    let server = {
        let b = b.clone();
        std::thread::spawn(move || {
            let (req, _) = b.recv(Duration::from_secs(30)).unwrap();
            b.send(req.from, &Message { kind: 3, ..Message::default() }, &[]).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            b.reply(&req, 0, &[Key { lo: 9, hi: 9 }]).unwrap();
        })
    };
    let caller = {
        let (a, to) = (a.clone(), b.id());
        std::thread::spawn(move || {
            let ask = Message { kind: cxlkv_platform::KIND_TIER_PROMOTE, ..Message::default() };
            a.call(to, &ask, &[], Duration::from_secs(30)).unwrap()
        })
    };
    let mut app = Vec::new();
    while !caller.is_finished() {
        if let Some((m, _)) = a.try_recv().unwrap() {
            app.push(m.kind);
        }
    }
    let (answer, keys) = caller.join().unwrap();
    server.join().unwrap();
    assert_eq!((answer.status, keys), (0, vec![Key { lo: 9, hi: 9 }]));
    while let Some((m, _)) = a.try_recv().unwrap() {
        app.push(m.kind);
    }
    assert_eq!(app, vec![3], "only the application's message came out of try_recv");
    drop(b);
    drop(a);
    let _ = std::fs::remove_file(&p);
}

#[test]
fn the_last_node_to_leave_removes_the_host_local_lock_file() {
    let dir = std::env::temp_dir().join(format!("cxlkv-tier-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let o = Options { local_dir: dir.clone(), ..opts() };
    let p = dir.join("region");
    let files = || {
        std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("cxlkv-local-"))
            .count()
    };
    let a = Node::create(&p, 16 << 20, caps(), o.clone()).unwrap();
    let b = Node::open(&p, o).unwrap();
    assert_eq!(files(), 1, "one host-local file for the region (this PID namespace)");
    a.close().unwrap();
    assert_eq!(files(), 1, "another node of this host still uses it");
    b.close().unwrap();
    assert_eq!(files(), 0, "the last node removed it");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Recovery run by hand while other threads of the same node store and read
/// blocks: it takes every core lock, so stores wait; a read meanwhile may
/// miss (recovery relinks the buckets under it: a miss, never wrong bytes),
/// and once recovery stops every block stored is there, byte for byte.
#[test]
fn recovery_beside_live_puts_and_gets_loses_nothing() {
    use cxlkv_platform::{GetItem, PutItem};
    let p = std::env::temp_dir().join(format!("cxlkv-recover-live-{}", std::process::id()));
    let a = Node::create(&p, 32 << 20, caps(), opts()).unwrap();
    let body = |k: &Key| vec![(k.lo % 251) as u8; 4096];
    let get = |keys: &[Key]| {
        let mut bufs = vec![vec![0u8; 4096]; keys.len()];
        let mut parts: Vec<[&mut [u8]; 1]> = bufs.iter_mut().map(|b| [&mut b[..]]).collect();
        let mut items: Vec<GetItem<'_, '_>> =
            keys.iter().zip(parts.iter_mut()).map(|(k, p)| GetItem { key: *k, parts: p }).collect();
        let (mut lens, mut res) = (vec![0u64; keys.len()], vec![Ok(()); keys.len()]);
        a.get(5, &mut items, &mut lens, &mut res).unwrap();
        (res, bufs)
    };
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let mut all = Vec::new();
    std::thread::scope(|s| {
        let a_ref = &a;
        s.spawn(move || {
            let a = a_ref;
            let mut runs = 0u32;
            while stopped.try_recv().is_err() || runs == 0 {
                a.recover().unwrap();
                runs += 1;
            }
        });
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                let (a, get) = (&a, &get);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for round in 0..8u64 {
                        let keys: Vec<Key> = (0..16).map(|i| Key { lo: t * 1000 + round * 16 + i, hi: 9 }).collect();
                        let bodies: Vec<Vec<u8>> = keys.iter().map(body).collect();
                        let parts: Vec<[&[u8]; 1]> = bodies.iter().map(|b| [&b[..]]).collect();
                        let items: Vec<PutItem<'_>> =
                            keys.iter().zip(&parts).map(|(k, p)| PutItem { key: *k, tokens: 0, parts: p }).collect();
                        let mut out = vec![Ok(()); 16];
                        a.put(5, &items, &mut out).unwrap();
                        assert!(out.iter().all(|r| r.is_ok()), "put {out:?}");
                        let (res, bufs) = get(&keys);
                        for ((k, r), b) in keys.iter().zip(&res).zip(&bufs) {
                            match r {
                                Ok(()) => assert_eq!(b, &body(k), "bytes of {k:?}"),
                                Err(e) => assert_eq!(*e, cxlkv_core::Error::NotFound, "get of {k:?}"),
                            }
                        }
                        mine.extend(keys);
                    }
                    mine
                })
            })
            .collect();
        for w in workers {
            all.extend(w.join().unwrap());
        }
        stop.send(()).unwrap();
    });
    let (res, bufs) = get(&all);
    assert!(res.iter().all(|r| r.is_ok()), "{res:?}");
    assert!(all.iter().zip(&bufs).all(|(k, b)| b == &body(k)));
    assert!(a.check().unwrap().is_empty());
    a.close().unwrap();
    let _ = std::fs::remove_file(&p);
}

/// `remove` takes the blocks of the keys it is given, in their namespace
/// only, and keeps a pinned one.
#[test]
fn remove_takes_given_keys_only_and_keeps_pinned_blocks() {
    use cxlkv_platform::PutItem;
    let p = std::env::temp_dir().join(format!("cxlkv-remove-{}", std::process::id()));
    let a = Node::create(&p, 32 << 20, caps(), opts()).unwrap();
    let keys: Vec<Key> = (0..6u64).map(|i| Key { lo: i, hi: 77 }).collect();
    let body = [7u8; 512];
    let parts = [&body[..]];
    let items: Vec<PutItem<'_>> = keys.iter().map(|k| PutItem { key: *k, tokens: 0, parts: &parts }).collect();
    let mut out = vec![Ok(()); items.len()];
    a.put(1, &items, &mut out).unwrap();
    a.put(2, &items[..1], &mut out[..1]).unwrap();
    let mut pinned = [Err(cxlkv_core::Error::InvalidArgument)];
    a.core().acquire(1, &keys[5..6], &mut pinned).unwrap();
    let gone = a.remove(1, &[keys[1], keys[3], keys[5], Key { lo: 99, hi: 0 }]).unwrap();
    assert_eq!(gone, [true, true, false, false]);
    let here: Vec<bool> = keys.iter().map(|k| a.exists(1, *k).unwrap()).collect();
    assert_eq!(here, [true, false, true, false, true, true]);
    assert!(a.exists(2, keys[0]).unwrap());
    a.core().release(&[pinned[0].unwrap()]).unwrap();
    assert_eq!(a.remove(1, &[keys[5]]).unwrap(), [true]);
    assert!(a.remove(1, &[]).unwrap().is_empty());
    assert!(a.check().unwrap().is_empty());
    a.close().unwrap();
    let _ = std::fs::remove_file(&p);
}

/// Four threads share one node, each putting, getting and pinning its own
/// keys: every call answers for its own keys (no `Changed` leaks out of a
/// read whose entry another thread's locked update was rewriting).
#[test]
fn threads_of_one_node_read_their_own_keys_while_others_write() {
    use cxlkv_platform::{GetItem, PutItem};
    let p = std::env::temp_dir().join(format!("cxlkv-threads-{}", std::process::id()));
    let caps =
        Capacities { max_nodes: 4, n_stripes: 4, entries_per_stripe: 256, chunk_shift: 16, ..Capacities::default() };
    for round in 0..20 {
        let a = std::sync::Arc::new(Node::create(&p, 32 << 20, caps, opts()).unwrap());
        let mut threads = Vec::new();
        for t in 0..4u64 {
            let a = a.clone();
            threads.push(std::thread::spawn(move || {
                for i in 0..50u64 {
                    let key = Key { lo: t * 1000 + i, hi: 0 };
                    let body = vec![(t * 50 + i) as u8; 1024];
                    let mut out = [Err(cxlkv_core::Error::InvalidArgument)];
                    a.put(1, &[PutItem { key, tokens: 0, parts: &[&body] }], &mut out).unwrap();
                    assert_eq!(out[0], Ok(()));
                    let mut buf = vec![0u8; 1024];
                    let mut parts = [&mut buf[..]];
                    let mut lens = [0u64];
                    a.get(1, &mut [GetItem { key, parts: &mut parts }], &mut lens, &mut out).unwrap();
                    assert_eq!(out[0], Ok(()), "round {round} thread {t} get {i}");
                    assert_eq!(buf, body);
                    let mut hs = [Err(cxlkv_core::Error::InvalidArgument)];
                    let r = a.acquire_views(1, &[key], &mut hs);
                    assert_eq!(r.as_ref().ok(), Some(&1), "round {round} thread {t} acquire {i}: {r:?} {hs:?}");
                    a.core().release(&[hs[0].unwrap()]).unwrap();
                }
            }));
        }
        for th in threads {
            th.join().unwrap();
        }
        assert!(a.check().unwrap().is_empty());
        drop(a);
        let _ = std::fs::remove_file(&p);
    }
}

/// A node waiting for a grant steps the lock manager itself when the node
/// that holds the manager lease is attached in the same process, instead
/// of waiting for that node's thread to be scheduled.
#[test]
fn a_waiting_node_steps_a_manager_of_its_own_process() {
    let p = std::env::temp_dir().join(format!("cxlkv-peer-step-{}", std::process::id()));
    let a = Node::create(&p, 32 << 20, caps(), opts()).unwrap();
    let b = Node::open(&p, opts()).unwrap();
    // Bounded: each lock is granted whoever steps the manager; one step by
    // the waiting node itself is all this looks for.
    for i in 0..20_000 {
        let n = if i % 2 == 0 { &a } else { &b };
        let h = n.core().lock(1).unwrap();
        n.core().unlock(h).unwrap();
        if a.manager_steps_by_peers() + b.manager_steps_by_peers() > 0 && i > 100 {
            break;
        }
    }
    assert!(a.manager_steps_by_peers() + b.manager_steps_by_peers() > 0, "no grant came from the waiter's own step");
    assert!(a.check().unwrap().is_empty());
    b.close().unwrap();
    a.close().unwrap();
    let _ = std::fs::remove_file(&p);
}

/// A region file has exactly the mode asked, whatever the umask; a mode
/// its owner cannot read and write, or with more than permission bits, is
/// refused; a file another user owns is never replaced.
#[test]
fn region_files_get_the_mode_asked_and_another_users_file_is_kept() {
    use cxlkv_platform::region::{REGION_FILE_MODE, REGION_GROUP_MODE};
    use cxlkv_platform::{Error, Region};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let p = std::path::PathBuf::from(format!("/dev/shm/cxlkv-mode-{}", std::process::id()));
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    // SAFETY: umask has no preconditions; this test's files only.
    let old = unsafe { libc::umask(0o077) };
    let r = Region::create_with_mode(&p, 4 << 20, true, REGION_GROUP_MODE);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    drop(r.unwrap());
    assert_eq!(mode(&p), 0o660, "the group's bits, under a umask of 077");
    drop(Region::create(&p, 4 << 20, true).unwrap());
    assert_eq!(mode(&p), REGION_FILE_MODE);
    for bad in [0o400, 0o1600, 0o060] {
        let e = Region::create_with_mode(&p, 4 << 20, true, bad).err();
        assert!(matches!(e, Some(Error::Core(cxlkv_core::Error::InvalidArgument))), "{bad:o}: {e:?}");
    }
    assert!(p.exists(), "a refused mode leaves the file");
    let before = std::fs::metadata(&p).unwrap().ino();
    if std::os::unix::fs::chown(&p, Some(4242), None).is_err() {
        // Only root gives a file away; the rest of the check needs that.
        eprintln!("not root: another user's file is not checked here");
        let _ = std::fs::remove_file(&p);
        return;
    }
    match Region::create(&p, 4 << 20, true) {
        Err(Error::Io { err, .. }) => assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied),
        other => panic!("another user's file replaced: {:?}", other.err()),
    }
    assert_eq!(std::fs::metadata(&p).unwrap().ino(), before, "the file is still there, the same one");
    let _ = std::fs::remove_file(&p);
}
