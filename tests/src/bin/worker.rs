//! Worker process for the multi-process tests.
//!
//! `cxlkv-test-worker mixed PATH SEED OPS`: random publish / lookup / pin /
//! read / evict over a shared key space, verifying every payload byte; prints
//! one JSON line of counts and exits 0 (1 on any verification failure).
//!
//! `cxlkv-test-worker hold PATH`: publishes, pins, reserves and takes a lock,
//! prints `ready`, and sleeps until killed.
//!
//! `cxlkv-test-worker hold-for PATH MILLIS`: attaches (lease from
//! `CXLKV_TEST_LEASE_MS`), publishes and pins blocks, reserves one, takes an
//! application lock, prints `ready <pid> <lock>`, sleeps MILLIS (it may be
//! stopped meanwhile), then releases, aborts, unlocks and detaches, and
//! prints one JSON line with each result ("ok" or the error).
//!
//! `cxlkv-test-worker tier PATH DIR`: runs an SSD tier on DIR (waiting
//! while a killed predecessor's node is still taken for alive), prints
//! `ready <node> <held>`, then copies every block out again and again,
//! printing `spilled <n>` after each round, until killed.
//!
//! `cxlkv-test-worker hostile PATH SEED MILLIS`: a hostile peer: maps the
//! region and writes random bytes over its metadata (past the header) for
//! MILLIS milliseconds; prints how many words it wrote.
//!
//! `cxlkv-test-worker tenant PATH NAME SEED MILLIS PAUSE_US`: puts and gets
//! blocks of a namespace of tenant NAME (`default`: the plain test
//! namespace) for MILLIS milliseconds or until a file PATH.stop exists,
//! pausing PAUSE_US microseconds after each, verifying every payload it reads; a refusal at the quota is
//! counted and the put tried later; the tenant dropped ends the run
//! early. Prints one JSON line of counts; exits 1 on a wrong payload or an
//! unexpected error.
//!
//! `cxlkv-test-worker tolerant PATH SEED MILLIS`: works like `mixed` for
//! MILLIS milliseconds while a hostile peer scribbles: every error is
//! counted, nothing is asserted; prints one JSON line of counts and exits 0.
//! Crashing, hanging or touching memory outside the region is the failure.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use cxlkv_core::hash::Namespace;
use cxlkv_core::index::Lru;
use cxlkv_core::Error;
use cxlkv_platform::{Node, Options};
use cxlkv_tests::{fill, key, len_of, verify, NS};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn opts() -> Options {
    Options { lock_timeout: Duration::from_secs(60), ..Options::default() }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let code = match a.get(1).map(String::as_str) {
        Some("mixed") if a.len() == 5 => {
            mixed(Path::new(&a[2]), a[3].parse().unwrap_or(1), a[4].parse().unwrap_or(100))
        }
        Some("hold") if a.len() == 3 => hold(Path::new(&a[2])),
        Some("tier") if a.len() == 4 => tier(Path::new(&a[2]), Path::new(&a[3])),
        Some("hold-for") if a.len() == 4 => hold_for(Path::new(&a[2]), a[3].parse().unwrap_or(1000)),
        Some("locks") if a.len() == 4 => locks(Path::new(&a[2]), a[3].parse().unwrap_or(100)),
        Some("tenant") if a.len() == 7 => {
            let num = |i: usize| a[i].parse().unwrap_or(0);
            tenant(Path::new(&a[2]), &a[3], num(4), Duration::from_millis(num(5)), Duration::from_micros(num(6)))
        }
        Some(m @ ("hostile" | "tolerant")) if a.len() == 5 => {
            let (seed, ms) = (a[3].parse().unwrap_or(1), a[4].parse().unwrap_or(1000));
            let until = std::time::Instant::now() + Duration::from_millis(ms);
            if m == "hostile" {
                hostile(Path::new(&a[2]), seed, until)
            } else {
                tolerant(Path::new(&a[2]), seed, until)
            }
        }
        _ => {
            eprintln!(
                "usage: cxlkv-test-worker mixed PATH SEED OPS | hold PATH | hold-for PATH MILLIS | locks PATH N | tenant PATH NAME SEED MILLIS PAUSE_US | hostile PATH SEED MILLIS | tolerant PATH SEED MILLIS"
            );
            2
        }
    };
    std::process::exit(code);
}

/// What `mixed` does for each draw of an operation in `0..20`.
const OP_NAMES: [&str; 20] = [
    "publish",
    "publish",
    "publish",
    "publish",
    "publish",
    "publish",
    "publish",
    "publish",
    "acquire+read+release",
    "acquire+read+release",
    "acquire+read+release",
    "acquire+read+release",
    "acquire+read+release",
    "acquire+read+release",
    "get",
    "get",
    "get",
    "get",
    "lookup",
    "evict",
];

fn publish(c: &Node, i: u64, buf: &mut Vec<u8>) -> Result<bool, Error> {
    publish_in(c, NS, i, buf)
}

/// Puts key `i` in namespace `ns`: true when stored, false when it was.
fn publish_in(c: &Node, ns: u32, i: u64, buf: &mut Vec<u8>) -> Result<bool, Error> {
    let k = key(i);
    let len = len_of(k);
    match c.core().reserve(ns, k, len as u64, 16) {
        Ok(h) => {
            buf.resize(len, 0);
            fill(k, buf);
            c.core().write(&h, 0, buf)?;
            c.core().publish_flushed(&[h], &mut [Ok(())])?;
            Ok(true)
        }
        Err(Error::Exists) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The `tenant` mode (see the top of the file).
fn tenant(path: &Path, name: &str, seed: u64, run: Duration, pause: Duration) -> i32 {
    let c = match Node::open(path, opts()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("attach: {e}");
            return 3;
        }
    };
    let ns = if name == "default" {
        Ok(NS)
    } else {
        c.tenant_find(name.as_bytes())
            .and_then(|t| t.ok_or(cxlkv_platform::Error::Core(Error::NoTenant)))
            .and_then(|t| c.namespace_in(t, &Namespace { model: b"multi-process", ..Namespace::default() }))
    };
    let ns = match ns {
        Ok(ns) => ns,
        Err(e) => {
            eprintln!("tenant {name}: {e}");
            return 3;
        }
    };
    let until = std::time::Instant::now() + run;
    let stop = path.with_extension("stop");
    let mut rng = SmallRng::seed_from_u64(seed);
    let (mut published, mut read, mut bad, mut refused, mut errors, mut dropped) =
        (0u64, 0u64, 0u64, 0u64, 0u64, false);
    let (mut buf, mut rd) = (Vec::new(), vec![0u8; 80 << 10]);
    for n in 0u64.. {
        if std::time::Instant::now() >= until || n % 64 == 0 && stop.exists() {
            break;
        }
        let i = rng.random_range(0..2000u64);
        match publish_in(&c, ns, i, &mut buf) {
            Ok(true) => published += 1,
            Ok(false) => {}
            Err(Error::OverQuota) => refused += 1,
            Err(Error::NoTenant) => {
                dropped = true;
                break;
            }
            Err(e) => {
                eprintln!("put {i}: {e}");
                errors += 1;
            }
        }
        let j = rng.random_range(0..2000u64);
        match c.core().get(ns, key(j), &mut rd) {
            Ok(n) => {
                read += 1;
                bad += u64::from(!verify(key(j), &rd[..n]));
            }
            Err(Error::NotFound | Error::Changed) => {}
            Err(e) => {
                eprintln!("get {j}: {e}");
                errors += 1;
            }
        }
        std::thread::sleep(pause);
    }
    println!(
        "{{\"published\":{published},\"read\":{read},\"bad\":{bad},\"refused\":{refused},\"errors\":{errors},\"dropped\":{dropped}}}"
    );
    let closed = c.close();
    i32::from(bad > 0 || errors > 0 || closed.is_err())
}

fn mixed(path: &Path, seed: u64, ops: u64) -> i32 {
    let _ = writeln!(std::io::stderr(), "at attach");
    let c = match Node::open(path, opts()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("attach: {e}");
            return 3;
        }
    };
    let keyspace = 600u64;
    let (mut published, mut exists, mut pinned, mut got, mut misses, mut bad, mut errors) = (0, 0, 0, 0, 0, 0u64, 0u64);
    let mut buf = Vec::new();
    let mut rd = vec![0u8; 80 << 10];
    let mut rng = SmallRng::seed_from_u64(seed);
    for n in 0..ops {
        let (i, op) = (rng.random_range(0..keyspace), rng.random_range(0..20u64));
        // Where this worker is, for the crash loop's hang reports (stderr is
        // a pipe it drains; a closed one is ignored).
        let _ = writeln!(std::io::stderr(), "at op {n}: {} key {i}", OP_NAMES[op as usize]);
        match op {
            0..=7 => match publish(&c, i, &mut buf) {
                Ok(true) => published += 1,
                Ok(false) => exists += 1,
                Err(e) => {
                    eprintln!("publish {i}: {e}");
                    errors += 1;
                }
            },
            8..=13 => {
                let keys: Vec<_> = (i..i + 4).map(key).collect();
                let mut out = vec![Err(Error::InvalidArgument); 4];
                if let Err(e) = c.core().acquire(NS, &keys, &mut out) {
                    eprintln!("acquire {i}: {e}");
                    errors += 1;
                    continue;
                }
                let mut hs = Vec::new();
                for (k, r) in keys.iter().zip(&out) {
                    if let Ok(h) = r {
                        let b = &mut rd[..h.len as usize];
                        if c.core().read(h, 0, b).is_err() || !verify(*k, b) {
                            bad += 1;
                        }
                        pinned += 1;
                        hs.push(*h);
                    }
                }
                if let Err(e) = c.core().release(&hs) {
                    eprintln!("release {i}: {e}");
                    errors += 1;
                }
            }
            14..=17 => match c.core().get(NS, key(i), &mut rd) {
                Ok(n) => {
                    got += 1;
                    if !verify(key(i), &rd[..n]) {
                        bad += 1;
                    }
                }
                Err(Error::NotFound | Error::Changed) => misses += 1,
                Err(e) => {
                    eprintln!("get {i}: {e}");
                    errors += 1;
                }
            },
            18 => {
                let keys: Vec<_> = (i..i + 16).map(key).collect();
                if let Err(e) = c.core().lookup(NS, &keys) {
                    eprintln!("lookup {i}: {e}");
                    errors += 1;
                }
            }
            _ => {
                if rng.random_range(0..8u32) == 0 {
                    if let Err(e) = c.core().evict(256 << 10, &mut Lru) {
                        eprintln!("evict: {e}");
                        errors += 1;
                    }
                }
            }
        }
    }
    let ev = c.core().stats().map(|s| s.evictions).unwrap_or(0);
    // The reader may be gone (a killed test): never panic on a closed pipe.
    let _ = writeln!(
        std::io::stdout(),
        "{{\"published\":{published},\"exists\":{exists},\"pinned\":{pinned},\"got\":{got},\"misses\":{misses},\"evictions\":{ev},\"verify_failures\":{bad},\"errors\":{errors}}}"
    );
    let _ = writeln!(std::io::stderr(), "at close (detach)");
    let closed = c.close();
    let _ = writeln!(std::io::stderr(), "closed: {closed:?}");
    if bad > 0 || errors > 0 || closed.is_err() {
        1
    } else {
        0
    }
}

fn tier(path: &Path, dir: &Path) -> i32 {
    let c = match Node::open(path, opts()) {
        Ok(c) => std::sync::Arc::new(c),
        Err(e) => {
            eprintln!("attach: {e}");
            return 3;
        }
    };
    let topts = cxlkv_platform::TierOptions {
        dirs: vec![dir.to_path_buf()],
        slot_bytes: 128 << 10,
        capacity: 32 << 20,
        high_water: 1.0,
        batch: 64,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let tier = loop {
        match cxlkv_platform::Tier::start(c.clone(), topts.clone()) {
            Ok(t) => break t,
            Err(cxlkv_platform::Error::Core(Error::Busy)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                eprintln!("tier: {e}");
                return 4;
            }
        }
    };
    let _ = writeln!(std::io::stdout(), "ready {} {}", c.id(), tier.stats().held);
    let _ = std::io::stdout().flush();
    loop {
        match tier.spill_all() {
            Ok(n) => {
                let _ = writeln!(std::io::stdout(), "spilled {n}");
                let _ = std::io::stdout().flush();
            }
            Err(e) => {
                eprintln!("spill: {e}");
                return 5;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Takes and gives back global lock 1 `n` times, then says `done`.
fn locks(path: &Path, n: u64) -> i32 {
    let c = match Node::open(path, opts()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("attach: {e}");
            return 3;
        }
    };
    for i in 0..n {
        match c.core().lock(1) {
            Ok(h) => {
                if let Err(e) = c.core().unlock(h) {
                    eprintln!("unlock {i}: {e}");
                    return 5;
                }
            }
            Err(e) => {
                eprintln!("lock {i}: {e}");
                return 4;
            }
        }
    }
    let _ = writeln!(std::io::stdout(), "done");
    0
}

fn hold(path: &Path) -> i32 {
    let c = match Node::open(path, opts()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("attach: {e}");
            return 3;
        }
    };
    let mut buf = Vec::new();
    for i in 1000..1010 {
        if publish(&c, i, &mut buf).is_err() {
            return 4;
        }
    }
    let keys: Vec<_> = (1000..1010).map(key).collect();
    let mut out = vec![Err(Error::InvalidArgument); keys.len()];
    if c.core().acquire(NS, &keys, &mut out) != Ok(10) {
        return 5;
    }
    let Ok(_w) = c.core().reserve(NS, key(2000), 4096, 16) else { return 6 };
    let Ok(_raw) = c.core().alloc(10_000) else { return 7 };
    let Ok(_held) = c.core().lock(0) else { return 8 };
    let _ = writeln!(std::io::stdout(), "ready");
    let _ = std::io::stdout().flush();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn hold_for(path: &Path, millis: u64) -> i32 {
    let lease = std::env::var("CXLKV_TEST_LEASE_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let o =
        Options { lease: Duration::from_millis(lease), lock_timeout: Duration::from_secs(20), ..Options::default() };
    let c = match Node::open(path, o) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("attach: {e}");
            return 3;
        }
    };
    let mut buf = Vec::new();
    let keys: Vec<_> = (4000..4004).map(key).collect();
    for i in 4000..4004 {
        if publish(&c, i, &mut buf).is_err() {
            return 4;
        }
    }
    let mut out = vec![Err(Error::InvalidArgument); keys.len()];
    if c.core().acquire(NS, &keys, &mut out) != Ok(keys.len()) {
        return 5;
    }
    let pins: Vec<_> = out.iter().filter_map(|r| r.ok()).collect();
    let Ok(w) = c.core().reserve(NS, key(4100), 4096, 16) else { return 6 };
    let Ok(lock) = c.core().lock_alloc() else { return 7 };
    let Ok(held) = c.core().lock_app(lock) else { return 8 };
    let _ = writeln!(std::io::stdout(), "ready {} {lock}", std::process::id());
    let _ = std::io::stdout().flush();
    std::thread::sleep(Duration::from_millis(millis));
    let text = |r: Result<(), String>| r.err().unwrap_or_else(|| "ok".to_string());
    // Calls that take no lock learn the fencing too (the heartbeat thread
    // marked it while the process ran on).
    let lookup = text(c.core().lookup(NS, &keys).map(|_| ()).map_err(|e| e.to_string()));
    let mut b = vec![0u8; 1 << 16];
    let get = text(c.core().get(NS, keys[0], &mut b).map(|_| ()).map_err(|e| e.to_string()));
    let mut one = vec![Err(Error::InvalidArgument)];
    let pin = text(c.core().acquire(NS, &keys[..1], &mut one).map(|_| ()).map_err(|e| e.to_string()));
    let exists = text(c.exists(NS, keys[0]).map(|_| ()).map_err(|e| e.to_string()));
    let release = text(c.core().release(&pins).map_err(|e| e.to_string()));
    let abort = text(c.core().abort(&w).map_err(|e| e.to_string()));
    let unlock = text(c.core().unlock_app(held).map_err(|e| e.to_string()));
    let close = text(c.close().map_err(|e| e.to_string()));
    let _ = writeln!(
        std::io::stdout(),
        "{{\"lookup\":\"{lookup}\",\"get\":\"{get}\",\"pin\":\"{pin}\",\"exists\":\"{exists}\",\"release\":\"{release}\",\"abort\":\"{abort}\",\"unlock\":\"{unlock}\",\"close\":\"{close}\"}}"
    );
    0
}

fn hostile(path: &Path, seed: u64, until: std::time::Instant) -> i32 {
    let map = match cxlkv_platform::map::Mapping::open_file(path) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("map: {e}");
            return 3;
        }
    };
    let region = map.view();
    let meta_end = match cxlkv_core::store::attach(region, cxlkv_core::coherence::Coherent) {
        Ok(s) => s.layout.payload.start,
        Err(e) => {
            eprintln!("attach: {e}");
            return 3;
        }
    };
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut words = 0u64;
    while std::time::Instant::now() < until {
        for _ in 0..64 {
            // Past the 256-byte header: every word of the metadata.
            let off = 256 + rng.random_range(0..(meta_end - 256) / 8) * 8;
            let y: u64 = rng.random();
            // Plausible values (small counts, states, indices, offsets near
            // the region's size) hurt more than noise.
            let v = match y % 4 {
                0 => y >> 8,
                1 => y % 8,
                2 => y % 256,
                _ => (y >> 8) % (region.len() as u64 + 4096),
            };
            if region.store_u64(off, v).is_ok() {
                words += 1;
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let _ = writeln!(std::io::stdout(), "{{\"words_written\":{words}}}");
    0
}

fn tolerant(path: &Path, seed: u64, until: std::time::Instant) -> i32 {
    let opts = Options { lock_timeout: Duration::from_millis(300), ..Options::default() };
    let c = match Node::open(path, opts) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("attach: {e}");
            return 3;
        }
    };
    let (mut ok, mut errors, mut wrong) = (0u64, 0u64, 0u64);
    let mut buf = Vec::new();
    let mut rd = vec![0u8; 80 << 10];
    let mut rng = SmallRng::seed_from_u64(seed);
    while std::time::Instant::now() < until {
        let i = rng.random_range(0..300u64);
        let r = match rng.random_range(0..6u64) {
            0 | 1 => publish(&c, i, &mut buf).map(|_| ()),
            2 => {
                let keys: Vec<_> = (i..i + 4).map(key).collect();
                let mut out = vec![Err(Error::InvalidArgument); 4];
                c.core().acquire(NS, &keys, &mut out).and_then(|_| {
                    let hs: Vec<_> = out.iter().filter_map(|r| r.ok()).collect();
                    for h in &hs {
                        let b = &mut rd[..(h.len as usize).min(80 << 10)];
                        if c.core().read(h, 0, b).is_ok() && !verify(h.key, b) {
                            wrong += 1;
                        }
                    }
                    c.core().release(&hs)
                })
            }
            3 => c.core().get(NS, key(i), &mut rd).map(|n| {
                if !verify(key(i), &rd[..n]) {
                    wrong += 1;
                }
            }),
            4 => c.core().lookup(NS, &[key(i), key(i + 1)]).map(|_| ()),
            _ => c.core().evict(128 << 10, &mut Lru).map(|_| ()),
        };
        match r {
            Ok(()) => ok += 1,
            Err(_) => errors += 1,
        }
    }
    let findings = c.check().map(|f| f.len()).unwrap_or(0);
    let closed = c.close().is_ok();
    let _ = writeln!(
        std::io::stdout(),
        "{{\"ok\":{ok},\"errors\":{errors},\"wrong_payloads\":{wrong},\"findings\":{findings},\"closed\":{closed}}}"
    );
    0
}
