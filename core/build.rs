//! Refuses to build core when two call sites share a coherence site name.
//! The mutant check disables sites by name: a shared name would only ever be
//! removed in pairs, and "every single site matters" would go unshown.

use std::collections::BTreeMap;
use std::path::Path;

fn scan(dir: &Path, found: &mut BTreeMap<String, Vec<String>>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            scan(&p, found);
            continue;
        }
        if p.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find("Site(\"") {
                let tail = &rest[at + 6..];
                let Some(end) = tail.find('"') else { break };
                let name = &tail[..end];
                // Site names of core have a dot; test-only ones do not.
                if name.contains('.') {
                    found.entry(name.to_string()).or_default().push(format!("{}:{}", p.display(), n + 1));
                }
                rest = &tail[end..];
            }
        }
    }
}

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let src = Path::new(&dir).join("src");
    let mut found = BTreeMap::new();
    scan(&src, &mut found);
    let dups: Vec<String> =
        found.iter().filter(|(_, at)| at.len() > 1).map(|(name, at)| format!("{name}: {}", at.join(", "))).collect();
    if !dups.is_empty() {
        panic!("coherence site names must be unique, one per call site:\n{}", dups.join("\n"));
    }
    println!("cargo:rerun-if-changed=src");
}
