//! Tracing aids for replaying a failing run (environment variables, off by
//! default): a published entry's life in memory (`CXLKV_SIM_ENTRY_LINE`),
//! every coherence call in a step range (`CXLKV_SIM_CALLS=FROM,TO`), and a
//! lock's line and slots in memory and in every host's cache
//! (`CXLKV_SIM_LOCK_WATCH=LOCK`; `*` marks a line dirty in that cache), and
//! the manager line likewise (`CXLKV_SIM_MGR_WATCH=1`), and any line's
//! contents in memory with who wrote it (`CXLKV_SIM_MEM_LINE=N`, or
//! `chunk:C` for chunk C's record, `node:N` for node N's info line, `map:C`, `root:I`, `slot:N` for node N's slot of the watched lock or lock 0),
//! and each operation as an op actor begins it (`CXLKV_SIM_OPS=1`). A
//! livelock's report ends with every node's state and journal records.

use cxlkv_core::store::attach;

use crate::harness::sched::entry_line;
use crate::harness::world::World;

/// Called at every coherence call of actor `a`, before it may yield.
pub(crate) fn watch(w: &World, a: usize, site: &str) {
    if let Some(line) = entry_line() {
        // A published entry's life in memory (`CXLKV_SIM_ENTRY_LINE`).
        static LAST: std::sync::Mutex<(u8, u32)> = std::sync::Mutex::new((u8::MAX, 0));
        let e: Result<cxlkv_core::layout::Entry, _> = w.mem.shared_region().read(line * 64);
        let mut last = LAST.lock().unwrap();
        if let Ok(e) = e.map(|e| (e.state, e.gen)).map_err(|_| ()) {
            if e != *last {
                *last = e;
                eprintln!("step {}: actor {a} at {site}: entry line {line} state {} gen {}", w.now(), e.0, e.1);
            }
        }
    }
    if let Some(spec) = mem_line() {
        // A line's contents in memory, and who last wrote it there.
        static LAST: std::sync::Mutex<Option<[u8; 64]>> = std::sync::Mutex::new(None);
        let at = |f: &dyn Fn(&cxlkv_core::layout::Layout) -> u64| {
            attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent).map(|st| f(&st.layout) / 64).ok()
        };
        let line = match spec.split_once(':').map(|(k, n)| (k, n.parse::<u32>().ok())) {
            Some(("chunk", Some(c))) => at(&|l| l.chunk(c)),
            Some(("node", Some(n))) => at(&|l| l.node_info(n)),
            Some(("map", Some(c))) => at(&|l| l.chunk_map(c)),
            Some(("root", Some(i))) => at(&|l| l.root(i)),
            Some(("slot", Some(n))) => at(&|l| l.lock_slot(lock_watch().unwrap_or(0), n)),
            _ => spec.parse::<u64>().ok(),
        };
        if let Some(line) = line {
            if let Ok(now) = w.mem.shared_region().read::<[u8; 64]>(line * 64) {
                let mut last = LAST.lock().unwrap();
                if *last != Some(now) {
                    *last = Some(now);
                    let (h, how) = w.mem.provenance(line as usize);
                    let hex: String = now[..32].iter().map(|b| format!("{b:02x}")).collect();
                    eprintln!("step {}: actor {a} at {site}: line {line} in memory {hex} (host {h}, {how})", w.now());
                }
            }
        }
    }
    if mgr_watch() {
        // The manager line in memory and in every host's cache.
        static LAST: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());
        if let Ok(st) = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent) {
            let off = st.layout.manager.start;
            let show = |v: &cxlkv_core::mem::View| {
                v.read::<cxlkv_core::layout::ManagerLine>(off)
                    .map_or("?".to_string(), |m| format!("m{} e{} l{}", m.manager, m.epoch, m.lease))
            };
            let mut now = format!("memory [{}]", show(&st.view));
            for h in 0..w.hosts {
                let d = if w.mem.is_dirty(h, (off / 64) as usize) { "*" } else { "" };
                now += &format!(" h{h}{d}[{}]", show(&w.mem.view(h)));
            }
            let mut last = LAST.lock().unwrap();
            if *last != now {
                eprintln!("step {}: actor {a} at {site}: manager line {now}", w.now());
                *last = now;
            }
        }
    }
    if let Some((from, to)) = calls() {
        let now = w.now();
        if (from..=to).contains(&now) {
            eprintln!("call {now}: actor {a} {site}");
        }
    }
    if let Some(lock) = lock_watch() {
        // Lock `lock`'s line and slots in memory (`CXLKV_SIM_LOCK_WATCH`).
        static LAST: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        if let Ok(st) = attach(w.mem.shared_region(), cxlkv_core::coherence::Coherent) {
            let l = &st.layout;
            let mut now = vec![format!("{:?}", st.view.read::<cxlkv_core::layout::LockLine>(l.lock_line(lock)))];
            for n in 0..l.caps.max_nodes {
                now.push(format!(
                    "{:?}",
                    st.view
                        .read::<cxlkv_core::layout::LockSlot>(l.lock_slot(lock, n))
                        .map(|x| (x.state, x.flags, x.seq))
                ));
            }
            for h in 0..w.hosts {
                let v = w.mem.view(h);
                let c: Vec<String> = (0..l.caps.max_nodes)
                    .map(|n| {
                        let d = if w.mem.is_dirty(h, (l.lock_slot(lock, n) / 64) as usize) { "*" } else { "" };
                        v.read::<cxlkv_core::layout::LockSlot>(l.lock_slot(lock, n))
                            .map_or("?".into(), |x| format!("{}{}/{}", d, x.state, x.seq))
                    })
                    .collect();
                now.push(format!("h{h}[{}]", c.join(",")));
            }
            let mut last = LAST.lock().unwrap();
            if *last != now {
                eprintln!("step {}: actor {a} at {site}: lock {lock} {}", w.now(), now.join(" | "));
                *last = now;
            }
        }
    }
}

/// Step range whose coherence calls are printed (`CXLKV_SIM_CALLS=FROM,TO`).
fn calls() -> Option<(u64, u64)> {
    static R: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();
    *R.get_or_init(|| {
        let v: Vec<u64> = std::env::var("CXLKV_SIM_CALLS").ok()?.split(',').filter_map(|x| x.parse().ok()).collect();
        match v.as_slice() {
            [a, b] => Some((*a, *b)),
            _ => None,
        }
    })
}

/// Lock whose line and slots in memory are traced (`CXLKV_SIM_LOCK_WATCH`).
fn lock_watch() -> Option<u32> {
    static N: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::env::var("CXLKV_SIM_LOCK_WATCH").ok().and_then(|v| v.parse().ok()))
}

/// A memory line traced (`CXLKV_SIM_MEM_LINE=N` or `chunk:C`).
fn mem_line() -> Option<&'static str> {
    static N: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    N.get_or_init(|| std::env::var("CXLKV_SIM_MEM_LINE").ok()).as_deref()
}

/// Whether the manager line is traced (`CXLKV_SIM_MGR_WATCH=1`).
fn mgr_watch() -> bool {
    static N: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::env::var("CXLKV_SIM_MGR_WATCH").is_ok_and(|v| v == "1"))
}
