//! Tenants end to end in one process: two nodes on one region file, each
//! putting from its own threads. A busy tenant never passes its hard quota
//! and never pushes a quiet tenant below its share; dropping the busy one
//! frees its space while the quiet one keeps working.

use std::sync::Arc;
use std::time::Duration;

use cxlkv_core::hash::{Key, Namespace};
use cxlkv_core::layout::Capacities;
use cxlkv_core::Error as CoreError;
use cxlkv_platform::copy::PutItem;
use cxlkv_platform::tenants::Limits;
use cxlkv_platform::{Node, Options};

fn caps() -> Capacities {
    Capacities { max_nodes: 4, n_stripes: 4, entries_per_stripe: 512, chunk_shift: 16, ..Capacities::default() }
}

fn opts() -> Options {
    Options { local_dir: std::env::temp_dir(), lock_timeout: Duration::from_secs(30), ..Options::default() }
}

fn put(n: &Node, ns: u32, i: u64, len: usize) -> Result<(), CoreError> {
    let data = vec![(i % 251) as u8; len];
    let parts: [&[u8]; 1] = [&data];
    let mut out = [Ok(())];
    n.put(ns, &[PutItem { key: Key { lo: i * 7 + 1, hi: i }, tokens: 16, parts: &parts }], &mut out)
        .map_err(|_| CoreError::Corrupt)?;
    out[0]
}

fn usage(n: &Node, name: &[u8]) -> (u64, u64) {
    let t = n.tenant_list().unwrap().into_iter().find(|t| t.name() == name).unwrap();
    (t.bytes, t.blocks)
}

#[test]
fn a_busy_tenant_keeps_to_its_quota_and_leaves_a_quiet_one_its_share() {
    let p = std::env::temp_dir().join(format!("cxlkv-tenants-{}", std::process::id()));
    let a = Arc::new(Node::create(&p, 8 << 20, caps(), opts()).unwrap());
    let b = Arc::new(Node::open(&p, opts()).unwrap());
    let quota = 2 << 20;
    let share = 1 << 20;
    let busy = a.tenant_add(b"busy", Limits { quota, ..Limits::default() }).unwrap();
    let quiet = b.tenant_add(b"quiet", Limits { share, ..Limits::default() }).unwrap();
    let model = Namespace { model: b"llama", ..Namespace::default() };
    let nb = a.namespace_in(busy, &model).unwrap();
    let nq = b.namespace_in(quiet, &model).unwrap();
    assert_ne!(nb, nq, "one model in two tenants is two namespaces");
    assert_eq!(b.namespace_in(busy, &model).unwrap(), nb);
    // The quiet tenant writes a little more than its share, once.
    for i in 0..40 {
        put(&b, nq, 1_000_000 + i, 32 << 10).unwrap();
    }
    // The busy tenant, from both nodes and four threads, writes far more
    // than its quota; the default tenant far more than the region.
    let mut threads = Vec::new();
    for (t, n) in [a.clone(), b.clone(), a.clone(), b.clone()].into_iter().enumerate() {
        threads.push(std::thread::spawn(move || {
            for i in 0..300u64 {
                let k = (t as u64) << 32 | i;
                match put(&n, if i % 2 == 0 { nb } else { 5 }, k, 24 << 10) {
                    Ok(()) => {}
                    Err(e) => panic!("put {k}: {e:?}"),
                }
                let (bytes, _) = usage(&n, b"busy");
                assert!(bytes <= quota, "busy holds {bytes} over its quota {quota}");
                let (q, _) = usage(&n, b"quiet");
                assert!(q >= share, "quiet holds {q} below its share {share}");
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    let (bytes, blocks) = usage(&a, b"busy");
    assert!(bytes <= quota && bytes > quota / 2, "{bytes}");
    assert_eq!(bytes, blocks * (24 << 10));
    assert!(a.check().unwrap().is_empty(), "{:?}", a.check().unwrap());
    // Dropped: its space is free, the quiet tenant goes on.
    let rep = b.tenant_drop(busy).unwrap();
    assert_eq!((rep.blocks, rep.bytes), (blocks, bytes));
    assert!(a.tenant_find(b"busy").unwrap().is_none());
    let mut out = [Ok(())];
    let parts: [&[u8]; 1] = [&[1u8; 100]];
    let r = a.put(nb, &[PutItem { key: Key { lo: 1, hi: 1 }, tokens: 16, parts: &parts }], &mut out);
    assert!(
        matches!(r, Err(cxlkv_platform::Error::Core(CoreError::NoTenant))),
        "a dropped tenant takes no block: {r:?}"
    );
    put(&a, nq, 2_000_000, 32 << 10).unwrap();
    assert!(usage(&a, b"quiet").0 >= share);
    assert!(a.check().unwrap().is_empty(), "{:?}", a.check().unwrap());
    drop(a);
    Arc::try_unwrap(b).ok().unwrap().close().unwrap();
    let _ = std::fs::remove_file(&p);
}
