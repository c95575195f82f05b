// Bytes from drives and the network are parsed here: no indexing, slicing or
// arithmetic that can panic, no unwrap (as in core; relaxed in tests).
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::arithmetic_side_effects, clippy::unwrap_used, clippy::expect_used)
)]
//! `cxlkv check --tier`: the slot files read in full against their headers
//! and the region's tier directory.

use super::*;

/// Checks the slot files of this host's tier on `dirs` (the tier's
/// directories in the order it was started with, slots holding
/// `slot_bytes`) against themselves and the region: every slot is readable,
/// every written slot's payload matches its header's checksum (every byte
/// is read: damage or a write torn by a crash shows; a slot whose header
/// fails its own checksum is free), no two slots claim one piece of one
/// write, and every block the region records for a live tier of this host
/// has a whole set of slots. Returns one line per finding.
pub fn check_slots(
    store: &cxlkv_core::store::Store<crate::flush::Flush>,
    dirs: &[PathBuf],
    slot_bytes: u64,
) -> Result<Vec<String>> {
    let mut findings = Vec::new();
    let mut files = Vec::new();
    for dir in dirs {
        let path = dir.join("cxlkv-tier.slots");
        let file = File::open(&path).map_err(|err| Error::Io { what: "open a slot file", err })?;
        let align = dio_align(&file).max(512);
        files.push((path, file, align));
    }
    let geo = Geometry::new(&files.iter().map(|f| f.2).collect::<Vec<_>>(), slot_bytes);
    let stride = geo.unit.saturating_add(geo.piece_cap);
    let mut found: Found = Vec::new();
    let mut unit = vec![0u8; HEADER_BYTES];
    let mut body = Vec::new();
    for (d, (path, file, _)) in files.iter().enumerate() {
        let len = file.metadata().map_err(|err| Error::Io { what: "stat a slot file", err })?.len();
        for slot in 0..len.checked_div(stride).unwrap_or(0).min(u32::MAX as u64) as u32 {
            if file.read_exact_at(&mut unit, (slot as u64).saturating_mul(stride)).is_err() {
                findings.push(format!("{}: slot {slot} unreadable", path.display()));
                continue;
            }
            let Some(mut h) = Header::read(&unit) else { continue };
            // A registered namespace under its id in the region now (the
            // directory records that one); one not registered here keeps the
            // drive's id, which no record of this region can name with its
            // key but by a 128-bit coincidence.
            if h.digest != [0; 16] {
                if let Some(ns) = cxlkv_core::namespaces::find(store, h.digest)? {
                    h.ns = ns;
                }
            }
            if h.len > slot_bytes || h.plen > geo.piece_cap {
                findings.push(format!("{}: slot {slot} claims {} bytes, more than a slot", path.display(), h.len));
                continue;
            }
            // The payload too: a header that verifies says nothing of the
            // bytes after it.
            body.resize(piece(&h, h.piece as usize, geo.unit).len, 0);
            let at = (slot as u64).saturating_mul(stride).saturating_add(geo.unit);
            if file.read_exact_at(&mut body, at).is_err() || payload_sum(&body) != h.sum {
                findings.push(format!(
                    "{}: slot {slot}: piece {} of block {:016x}{:016x} (ns {}) fails its checksum",
                    path.display(),
                    h.piece,
                    h.key.hi,
                    h.key.lo,
                    h.ns
                ));
                continue;
            }
            found.push((d, slot, h));
        }
    }
    let (held, twice) = whole_blocks(&found);
    let name = |d: usize| files.get(d).map_or_else(|| format!("drive {d}"), |f| f.0.display().to_string());
    for ((d0, s0), (d1, s1)) in twice {
        findings.push(format!("{} slot {s0} and {} slot {s1} claim one piece of one write", name(d0), name(d1)));
    }
    let host = crate::host::host_id();
    for d in 0..store.layout.caps.tier_slots {
        let Some(owner) = store.tier_owner(d)? else { continue };
        let info: NodeInfo = store.fresh(store.layout.node_info(owner), Site("check.tier.owner"))?;
        if info.host_id != host {
            continue;
        }
        store.tier_records(d, |_, r| {
            let key = Key { lo: r.key_lo, hi: r.key_hi };
            if !held.contains_key(&(r.ns, key)) {
                findings.push(format!(
                    "directory {d} records block {:016x}{:016x} (ns {}) that no whole set of slots holds",
                    key.hi, key.lo, r.ns
                ));
            }
            Ok(())
        })?;
    }
    Ok(findings)
}
