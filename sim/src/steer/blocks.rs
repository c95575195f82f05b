//! Scenarios of blocks, roots and raw allocations: a free, an eviction or an
//! eviction's claim cut by a death, a root put from another host, a pin
//! racing an eviction.

use cxlkv_core::hash::Key;
use cxlkv_core::node::{Node, NodeLocal};
use cxlkv_core::{Error, Result};

use super::zombies::{put, NS};
use super::{attach_as, declare_dead, Rig, StepEnv};

/// Host 1 looks for root `r` and finds none (its cache keeps the empty
/// record); host 0 puts `r` naming a block; host 1 then frees `r` with
/// `root_free`, which must find it (the scan reads each record afresh).
pub(super) fn root_put_elsewhere(disable: Option<&'static str>) -> Result<Vec<String>> {
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let mut out = Vec::new();
    if cxlkv_core::roots::get(&s1, b"r") != Err(Error::NotFound) {
        out.push("root-put-elsewhere: a root named before any put".to_string());
    }
    let off = n0.alloc(256)?;
    n0.root_put(b"r", cxlkv_core::roots::Root { offset: off, size: 256, tag: 0 })?;
    match n1.root_free(b"r") {
        Ok(root) if root.offset == off => {}
        other => out.push(format!("root-put-elsewhere: host 1's root_free of a root host 0 put gave {other:?}")),
    }
    if cxlkv_core::roots::get(&s0, b"r") != Err(Error::NotFound) {
        out.push("root-put-elsewhere: the root is still there after root_free".to_string());
    }
    Ok(out)
}

/// Node 0 allocates two raw blocks; node 1, on another host, frees one of
/// them (under node 0's heap lock) and dies inside the free: the chunk's
/// map words reached memory, its record's new counts did not (they stay in
/// host 1's cache, which nothing writes back). Node 1 is declared dead, its
/// locks revoked; node 0 recovers. Node 0 lives, so its raw chunk is not
/// re-derived: but the map is the state of record, and the record must be
/// made to agree with it (`check` clean), not trusted.
pub(super) fn free_cut_after_its_map(disable: Option<&'static str>) -> Result<Vec<String>> {
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let a = n0.alloc(1000)?;
    let _b = n0.alloc(1000)?;
    // The map's write-back (queued at its flush) lands; the record, stored
    // just now, stays in host 1's cache; node 1 dies here.
    let mut out = Vec::new();
    if !rig.dies_at(1, "alloc.free.publish", || n1.free(a)) {
        out.push("free-cut-after-its-map: node 1's free was not cut where intended".to_string());
        return Ok(out);
    }
    // Node 1 is declared dead; the manager revokes what it held. Its host
    // is down for good (its cache lost), as an operator says: recovery
    // frees the node rather than keeping its blocks for it.
    declare_dead(&s0, 1)?;
    cxlkv_core::node::declare_quiet(&s0, 1)?;
    env.step()?;
    let rep = n0.recover(0)?;
    if rep.nodes_freed != 1 << 1 {
        out.push(format!("free-cut-after-its-map: recovery freed nodes {:b}, not node 1", rep.nodes_freed));
    }
    let left = rig.memory_findings()?;
    if !left.is_empty() {
        out.push(format!(
            "free-cut-after-its-map: after recovery the region has findings {left:?}: the chunk record was trusted \
             over its map"
        ));
    }
    Ok(out)
}

/// Node 1 (host 1) publishes a block; a router-like reader on host 0 reads
/// the change log and holds it as stored. Node 1 then evicts it and dies
/// after the index dropped it (entry EVICTING and bucket deleted, written
/// back) and before its removal record reached memory. Recovery empties
/// the entry without logging it; the reader, reading on, must meet a gap
/// (and rescan), never go on believing the block is stored.
pub(super) fn eviction_cut_before_its_record(disable: Option<&'static str>) -> Result<Vec<String>> {
    use cxlkv_core::changes::{Change, Tail};
    use cxlkv_core::hash::Key;
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let key = Key { lo: 0x1234_5678_9abc_def1, hi: 7 };
    let h = n1.reserve(1, key, 256, 16)?;
    n1.publish(&h)?;
    // The reader: every stripe's log from the start, into a replica.
    let stripes = s0.layout.caps.n_stripes;
    let mut cursor = vec![0u64; stripes as usize];
    let mut replica: Vec<Vec<Key>> = vec![Vec::new(); stripes as usize];
    let mut buf = [Change::default(); 16];
    let mut out = Vec::new();
    let mut read_all = |cursor: &mut Vec<u64>, replica: &mut Vec<Vec<Key>>, out: &mut Vec<String>| -> Result<()> {
        for st in 0..stripes {
            match s0.read_changes(st, cursor[st as usize], &mut buf)? {
                Tail::Read { n } => {
                    for c in &buf[..n] {
                        cursor[st as usize] = c.seq;
                        let r = &mut replica[st as usize];
                        if c.stored {
                            r.push(c.key);
                        } else {
                            r.retain(|k| *k != c.key);
                        }
                    }
                }
                Tail::Gap { resume } => {
                    // Rescan the stripe, then read on from `resume`.
                    let mut now = Vec::new();
                    s0.scan_stored(st, |_, k, _, _| now.push(k))?;
                    replica[st as usize] = now;
                    cursor[st as usize] = resume;
                    out.push(String::new());
                }
            }
        }
        Ok(())
    };
    read_all(&mut cursor, &mut replica, &mut out)?;
    out.clear();
    if !replica.iter().any(|r| r.contains(&key)) {
        return Ok(vec!["eviction-cut-before-its-record: the reader never saw the block stored".to_string()]);
    }
    // What the eviction wrote back so far lands; the removal record does
    // not; node 1 dies here.
    if !rig.dies_at(1, "changes.record.write", || n1.evict(u64::MAX, &mut cxlkv_core::index::Lru)) {
        return Ok(vec!["eviction-cut-before-its-record: the eviction was not cut where intended".to_string()]);
    }
    declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    read_all(&mut cursor, &mut replica, &mut out)?;
    let mut stored = Vec::new();
    for st in 0..stripes {
        s0.scan_stored(st, |_, k, _, _| stored.push(k))?;
    }
    let mut v = Vec::new();
    if replica.iter().any(|r| r.contains(&key)) && !stored.contains(&key) {
        v.push(format!(
            "eviction-cut-before-its-record: after recovery the reader still holds the block as stored (gaps met: \
             {}), though the index dropped it",
            out.len()
        ));
    }
    Ok(v)
}

/// Node 0 (host 0) publishes a block and pins it. Node 1 (host 1) evicts:
/// it marks the block CLAIMED to look for pins, and dies right there, its
/// CLAIMED in memory. Recovery of node 1 must put the block back (READY):
/// the pin holds it, so the index keeps it, a reader finds it, and its bytes
/// stay the pinned ones (never freed and reused).
pub(super) fn evictor_dies_claiming_a_pinned_block(disable: Option<&'static str>) -> Result<Vec<String>> {
    use cxlkv_core::hash::Key;
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let key = Key { lo: 0x0bad_cafe_1234_5678, hi: 11 };
    let bytes: Vec<u8> = (0..256u32).map(|i| (i * 7 + 3) as u8).collect();
    let h = n0.reserve(1, key, bytes.len() as u64, 16)?;
    n0.write(&h, 0, &bytes)?;
    n0.publish(&h)?;
    let mut pin = [Err(Error::InvalidArgument)];
    n0.acquire(1, &[key], &mut pin)?;
    let pin = pin[0]?;
    // The CLAIMED entry reaches memory; node 1 dies before it looks for
    // pins.
    if !rig.dies_at(1, "evict.announce.fence", || n1.evict(u64::MAX, &mut cxlkv_core::index::Lru)) {
        return Ok(vec!["evictor-dies-claiming-a-pinned-block: the eviction was not cut where intended".to_string()]);
    }
    declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    let mut v = Vec::new();
    if n0.lookup(1, &[key])? != 1 {
        v.push("evictor-dies-claiming-a-pinned-block: recovery dropped a block a live node pins".to_string());
    }
    // Another block, reserved now, must not land on the pinned one's bytes.
    let other = Key { lo: 0x0bad_cafe_8765_4321, hi: 12 };
    if let Ok(o) = n0.reserve(1, other, bytes.len() as u64, 16) {
        n0.write(&o, 0, &[0xee; 256])?;
        n0.publish(&o)?;
    }
    let mut now = vec![0u8; bytes.len()];
    n0.read(&pin, 0, &mut now)?;
    if now != bytes {
        v.push("evictor-dies-claiming-a-pinned-block: the pinned block's bytes changed under its pin".to_string());
    }
    n0.release(&[pin])?;
    for f in rig.memory_findings()? {
        v.push(format!("evictor-dies-claiming-a-pinned-block: after recovery: {f:?}"));
    }
    Ok(v)
}

/// Node 1 (host 1) looks key K up while node 0 (host 0) has it reserved:
/// host 1's cache keeps the WRITING entry. Node 0 publishes K and pins it.
/// Node 1's next lookup must find K: it reads the candidate entry fresh,
/// not the WRITING copy its cache kept (the bucket line, fresh, still names
/// the same entry).
pub(super) fn lookup_after_a_publish_elsewhere(disable: Option<&'static str>) -> Result<Vec<String>> {
    use cxlkv_core::hash::Key;
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let key = Key { lo: 0x5eed_0000_1111_2222, hi: 21 };
    let h = n0.reserve(1, key, 512, 16)?;
    if n1.lookup(1, &[key])? != 0 {
        return Ok(vec!["lookup-after-a-publish-elsewhere: a reserved block was found before its publish".to_string()]);
    }
    n0.write(&h, 0, &[0x5a; 512])?;
    n0.publish(&h)?;
    let mut pin = [Err(Error::InvalidArgument)];
    n0.acquire(1, &[key], &mut pin)?;
    let pin = pin[0]?;
    let mut v = Vec::new();
    if n1.lookup(1, &[key])? != 1 {
        v.push("lookup-after-a-publish-elsewhere: a lookup after the publish missed a block pinned all along".into());
    }
    n0.release(&[pin])?;
    Ok(v)
}

/// Host 0 runs node 0 and node 1; node 2 runs on host 1. Node 1 reserves a
/// block and stores its payload through the mapping (as a zero-copy writer
/// does), unflushed, and its process dies. Node 0 buries it (writing back
/// what it left dirty in the host's cache), the manager declares it dead,
/// recovery (node 2's) aborts the block and frees it, and node 2 reserves, writes and
/// publishes a block of the same size, likely the same one. When host 0's
/// cache later writes back everything it holds, no line of the dead
/// process may land: node 2's block keeps its bytes, and the freed one the
/// bytes memory had after recovery.
pub(super) fn buried_writer_payload_lands_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    use cxlkv_core::hash::Key;
    const LEN: usize = 1024;
    let rig = Rig::new(2, 3, disable)?;
    let (s0, s1) = (rig.store(0)?, rig.store(1)?);
    attach_as(&s0, 0, 0)?;
    attach_as(&s0, 1, 0)?;
    attach_as(&s1, 2, 1)?;
    let env = StepEnv::new(&s0, 0);
    let (l0, l1, l2) = (NodeLocal::default(), NodeLocal::default(), NodeLocal::default());
    let (n0, n1, n2) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s0, 1, &env, &l1)?, Node::new(&s1, 2, &env, &l2)?);
    let dead = n1.reserve(1, Key { lo: 0xdead_0000_0000_0001, hi: 31 }, LEN as u64, 16)?;
    s0.view.copy_in(dead.off, &[0xd1; LEN])?;
    // Node 1's process is gone; its sibling finds it so and buries it.
    if !cxlkv_core::node::bury(&s0, 1)? {
        return Ok(vec!["buried-writer-payload-lands-late: the bury found node 1 not alive".to_string()]);
    }
    env.step()?;
    // Recovery runs on the other host: nothing of host 0 touches the
    // block's lines until its cache writes them back below.
    n2.recover(0)?;
    let mut after = vec![0u8; LEN];
    rig.mem.shared_region().copy_out(dead.off, &mut after)?;
    let key = Key { lo: 0x0a11_0000_0000_0002, hi: 32 };
    let h = n2.reserve(1, key, LEN as u64, 16)?;
    n2.write(&h, 0, &[0x22; LEN])?;
    n2.publish(&h)?;
    // Host 0's cache writes back the block's lines it still holds dirty,
    // as it may at any moment.
    rig.mem.drain(0);
    for line in (dead.off as usize / 64)..(dead.off as usize + LEN).div_ceil(64) {
        rig.mem.evict_line(0, line);
    }
    let mut v = Vec::new();
    let mut got = vec![0u8; LEN];
    let mut pin = [Err(Error::InvalidArgument)];
    n2.acquire(1, &[key], &mut pin)?;
    let pin = pin[0]?;
    n2.read(&pin, 0, &mut got)?;
    n2.release(&[pin])?;
    if got != [0x22; LEN] {
        v.push(format!(
            "buried-writer-payload-lands-late: a block another host published lost its bytes to the dead process's \
             (same block: {})",
            h.off == dead.off
        ));
    }
    if h.off != dead.off {
        let mut now = vec![0u8; LEN];
        rig.mem.shared_region().copy_out(dead.off, &mut now)?;
        if now != after {
            v.push("buried-writer-payload-lands-late: the dead process's payload landed in a freed block".into());
        }
    }
    let _ = (n0, n1);
    Ok(v)
}

/// Host 0 runs node 0 and node 1; node 2 runs on host 1. Node 1's process
/// dies part-way through a reserve, after it stored an index entry and
/// before that line's flush: the line is left dirty in host 0's cache.
/// Node 0 buries it. A burial writes back every line the dead process may
/// have left dirty in the host's cache before it says the node is dead:
/// none of its metadata lines may still be dirty there afterwards (left,
/// the cache writes it back whenever it likes, over what recovery on
/// another host rebuilt).
pub(super) fn buried_metadata_written_back(disable: Option<&'static str>) -> Result<Vec<String>> {
    use cxlkv_core::hash::Key;
    const NAME: &str = "buried-metadata-written-back";
    let rig = Rig::new(2, 3, disable)?;
    let (s0, s1) = (rig.store(0)?, rig.store(1)?);
    attach_as(&s0, 0, 0)?;
    attach_as(&s0, 1, 0)?;
    attach_as(&s1, 2, 1)?;
    let env = StepEnv::new(&s0, 0);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let (n0, n1) = (Node::new(&s0, 0, &env, &l0)?, Node::new(&s0, 1, &env, &l1)?);
    let mut v = Vec::new();
    if !rig.dies_at(0, "index.entry.write", || n1.reserve(1, Key { lo: 0xb0_0001, hi: 41 }, 512, 16)) {
        v.push(format!("{NAME}: node 1's reserve was not cut at its entry's write"));
        return Ok(v);
    }
    let meta_lines = (s0.layout.payload.start / 64) as usize;
    let left: Vec<usize> = (0..meta_lines).filter(|&i| rig.mem.is_dirty(0, i)).collect();
    if left.is_empty() {
        v.push(format!("{NAME}: the cut reserve left no metadata line dirty in host 0's cache"));
        return Ok(v);
    }
    if !cxlkv_core::node::bury(&s0, 1)? {
        v.push(format!("{NAME}: the bury found node 1 not alive"));
        return Ok(v);
    }
    let still: Vec<usize> = left.iter().copied().filter(|&i| rig.mem.is_dirty(0, i)).collect();
    if !still.is_empty() {
        v.push(format!(
            "{NAME}: after the burial, {} metadata line(s) the dead process stored are still dirty in host 0's \
             cache (first line {})",
            still.len(),
            still[0]
        ));
    }
    let _ = n0;
    Ok(v)
}

/// Node 1 (host 1) pins a block and stops after it journaled the pin, before
/// the fence that publishes it; node 0 (host 0) evicts the block meanwhile
/// (it sees no pin in memory) and publishes another one in its place. Node
/// 1 goes on: it must read the entry again and find the block gone, never
/// hand out a pin of bytes that are no longer the key's.
pub(super) fn pin_races_an_eviction(disable: Option<&'static str>) -> Result<Vec<String>> {
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    let l0 = NodeLocal::default();
    let n0 = Node::new(&s0, 0, &env, &l0)?;
    let (k, k2) = (Key { lo: 11, hi: 11 }, Key { lo: 12, hi: 12 });
    put(&n0, k)?;
    let (stopped_rx, go_tx) = rig.parks_at(1, "pins.announce.fence");
    let mut out = Vec::new();
    let got = std::thread::scope(|sc| -> Result<(Result<usize>, Vec<u8>)> {
        let t = sc.spawn(|| -> Result<(Result<usize>, Vec<u8>)> {
            let l1 = NodeLocal::default();
            let n1 = Node::new(&s1, 1, &env, &l1)?;
            let mut h = [Err(Error::NotFound)];
            let r = n1.acquire(NS, &[k], &mut h);
            let mut bytes = vec![0u8; 256];
            if let [Ok(h)] = &h {
                n1.read(h, 0, &mut bytes)?;
            }
            Ok((r, bytes))
        });
        if stopped_rx.recv().is_err() {
            return t.join().unwrap_or(Err(Error::Corrupt));
        }
        let ev = n0.evict(256, &mut cxlkv_core::index::Lru)?;
        if ev.entries != 1 {
            out.push(format!("pin-races-an-eviction: the eviction took {} blocks, not the one", ev.entries));
        }
        put(&n0, k2)?;
        let _ = go_tx.send(());
        t.join().unwrap_or(Err(Error::Corrupt))
    })?;
    match got {
        (Ok(0), _) => {}
        (Ok(_), bytes) if bytes.iter().all(|&b| b == k.hi as u8) => {}
        (r, bytes) => out.push(format!(
            "pin-races-an-eviction: a pin of an evicted block was handed out ({r:?}); its bytes are {:?}, not the key's",
            &bytes[..4]
        )),
    }
    Ok(out)
}

/// Host 0 looks at the tier directories (its cache keeps every head, each
/// free); then node 1 (host 1) claims one. Node 0 claims one next: under
/// the roots lock it must read the heads fresh and take another directory,
/// never the one node 1 owns.
pub(super) fn tier_claimed_elsewhere(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "tier-claimed-elsewhere";
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let mut out = Vec::new();
    if s0.tiers_active()? {
        out.push(format!("{NAME}: a tier is active before any claim"));
    }
    // Host ids as `attach_as` gives them (host + 1).
    let t1 = n1.tier_claim(2)?;
    let t0 = n0.tier_claim(1)?;
    if t0.dir() == t1.dir() {
        out.push(format!("{NAME}: node 0 claimed directory {}, which node 1 owns", t0.dir()));
    }
    match s1.tier_owner(t1.dir()) {
        Ok(Some(1)) => {}
        r => out.push(format!("{NAME}: node 1's directory {} names owner {r:?}", t1.dir())),
    }
    t0.release()?;
    t1.release()?;
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 1 (host 1) records a key in its tier directory; host 0 finds it
/// there (its cache keeps the record's line). Node 1 removes the key and
/// records it again, another length: host 0's next look must read the
/// record fresh and find the new length, never the record that is gone.
pub(super) fn tier_record_changed_elsewhere(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "tier-record-changed-elsewhere";
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let _ = &n0;
    let mut out = Vec::new();
    let key = Key { lo: 0x7469_6572_0000_0001, hi: 21 };
    let mut t1 = n1.tier_claim(2)?;
    t1.put(1, key, 4096)?;
    match s0.tier_find(1, key)? {
        Some(t) if t.len == 4096 && t.owner == 1 => {}
        r => out.push(format!("{NAME}: host 0 found {r:?} where node 1 recorded 4096 bytes")),
    }
    t1.remove(1, key)?;
    t1.put(1, key, 8192)?;
    match s0.tier_find(1, key)? {
        Some(t) if t.len == 8192 => {}
        r => out.push(format!("{NAME}: host 0 found {r:?} after node 1 recorded the key again with 8192 bytes")),
    }
    t1.remove(1, key)?;
    if let Some(t) = s0.tier_find(1, key)? {
        out.push(format!("{NAME}: host 0 found {t:?} after node 1 removed the key"));
    }
    t1.release()?;
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 0 (host 0) fills every free chunk with raw blocks; node 1 (host 1)
/// asks for a chunk and is refused (its cache now holds the bitmap full).
/// Node 0 frees one block, which gives its chunk back; node 1 asks again:
/// it must get that chunk, never `OutOfSpace` from its cached bitmap.
pub(super) fn freed_chunk_seen_elsewhere(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "freed-chunk-seen-elsewhere";
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let chunk = s0.layout.chunk_size();
    let mut mine = Vec::new();
    loop {
        match n0.alloc(chunk) {
            Ok(off) => mine.push(off),
            Err(Error::OutOfSpace) => break,
            Err(e) => return Err(e),
        }
    }
    let mut out = Vec::new();
    let Some(&freed) = mine.first() else {
        out.push(format!("{NAME}: node 0 got no chunk at all"));
        return Ok(out);
    };
    if let Ok(off) = n1.alloc(chunk) {
        out.push(format!("{NAME}: node 1 got a chunk ({off}) from a full region"));
        return Ok(out);
    }
    n0.free(freed)?;
    match n1.alloc(chunk) {
        Ok(off) => n1.free(off)?,
        Err(e) => out.push(format!("{NAME}: node 1 was refused the chunk node 0 gave back ({e})")),
    }
    for off in mine.into_iter().skip(1) {
        n0.free(off)?;
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 0 (host 0) looks into its inbox while it is empty: host 0's cache
/// keeps node 1's ring there as empty. Node 1 (host 1) sends M1 and exits;
/// a successor process attaches as node 1 on host 0 and sends M2. Its walk
/// must find M1 in memory (not the empty slot its host's cache shows) and
/// write M2 after it: node 0 receives M1, then M2.
pub(super) fn successor_sends_from_the_receivers_host(disable: Option<&'static str>) -> Result<Vec<String>> {
    use cxlkv_core::channel::Message;
    const NAME: &str = "successor-sends-from-the-receivers-host";
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
    let n0 = Node::new(&s0, 0, &env, &l0)?;
    let mut keys = [Key::default(); 4];
    let mut out = Vec::new();
    if let Ok(Some(m)) = n0.try_recv(&mut keys) {
        out.push(format!("{NAME}: an empty inbox gave {m:?}"));
    }
    let msg = |id| Message { kind: 1, request_id: id, ..Message::default() };
    {
        let n1 = Node::new(&s1, 1, &env, &l1)?;
        n1.send(0, &msg(1), &[Key { lo: 1, hi: 1 }])?;
        n1.detach()?;
    }
    attach_as(&s0, 1, 0)?;
    let l1b = NodeLocal::default();
    let n1b = Node::new(&s0, 1, &env, &l1b)?;
    n1b.send(0, &msg(2), &[Key { lo: 2, hi: 2 }])?;
    let got: Vec<_> = (0..3).map(|_| n0.try_recv(&mut keys).map(|m| m.map(|m| m.request_id))).collect();
    if got != [Ok(Some(1)), Ok(Some(2)), Ok(None)] {
        out.push(format!("{NAME}: node 0 received {got:?}, not M1, then M2, then nothing"));
    }
    Ok(out)
}

/// Node 0's inbox is owned by a process on host 2, which reads node 1's
/// ring there empty (host 2's cache keeps its head line), then by one on
/// host 0, which takes more than a ring of node 1's messages, then by a
/// process on host 2 again. Its first receive must read the head from
/// memory, not from host 2's old copy: from there, the slot it would look
/// at holds a later message, and the owner would never receive again.
pub(super) fn owner_returns_to_a_host_with_an_old_head(disable: Option<&'static str>) -> Result<Vec<String>> {
    use cxlkv_core::channel::Message;
    const NAME: &str = "owner-returns-to-a-host-with-an-old-head";
    let rig = Rig::new(3, 2, disable)?;
    let (s0, s1, s2) = (rig.store(0)?, rig.store(1)?, rig.store(2)?);
    let env = StepEnv::new(&s1, 1);
    attach_as(&s1, 1, 1)?;
    let l1 = NodeLocal::default();
    let n1 = Node::new(&s1, 1, &env, &l1)?;
    let mut keys = [Key::default(); 4];
    let mut out = Vec::new();
    let msg = |id| Message { kind: 1, request_id: id, ..Message::default() };
    let cap = s0.layout.caps.inbox_slots as u64;
    // A first owner on host 2 finds the inbox empty, and goes.
    attach_as(&s2, 0, 2)?;
    {
        let l = NodeLocal::default();
        let n0 = Node::new(&s2, 0, &env, &l)?;
        if let Ok(Some(m)) = n0.try_recv(&mut keys) {
            out.push(format!("{NAME}: an empty inbox gave {m:?}"));
        }
        n0.detach()?;
    }
    // The next, on host 0, takes more than a ring of messages.
    attach_as(&s0, 0, 0)?;
    {
        let l = NodeLocal::default();
        let n0 = Node::new(&s0, 0, &env, &l)?;
        for id in 1..=cap + 1 {
            n1.send(0, &msg(id), &[])?;
            let got = n0.try_recv(&mut keys).map(|m| m.map(|m| m.request_id));
            if got != Ok(Some(id)) {
                out.push(format!("{NAME}: the owner on host 0 received {got:?}, not message {id}"));
            }
        }
        n0.detach()?;
    }
    // The third, on host 2 again.
    attach_as(&s2, 0, 2)?;
    let l = NodeLocal::default();
    let n0 = Node::new(&s2, 0, &env, &l)?;
    let last = cap + 2;
    n1.send(0, &msg(last), &[])?;
    let got: Vec<_> = (0..2).map(|_| n0.try_recv(&mut keys).map(|m| m.map(|m| m.request_id))).collect();
    if got != [Ok(Some(last)), Ok(None)] {
        out.push(format!("{NAME}: the owner back on host 2 received {got:?}, not message {last}, then nothing"));
    }
    Ok(out)
}

/// Node 1 sends node 0 three rings' worth of messages, one at a time, each
/// received before the next: the sender's cursor finds its ring full as
/// last seen after a ring of them, and must read the head again to see the
/// room the owner made, not refuse with `InboxFull` from then on.
pub(super) fn a_drained_ring_takes_messages_again(disable: Option<&'static str>) -> Result<Vec<String>> {
    use cxlkv_core::channel::Message;
    const NAME: &str = "a-drained-ring-takes-messages-again";
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let mut keys = [Key::default(); 16];
    let mut out = Vec::new();
    let cap = s0.layout.caps.inbox_slots as u64;
    for id in 1..=3 * cap {
        let sent: Vec<Key> = (0..id % 14).map(|i| Key { lo: id, hi: i }).collect();
        if let Err(e) = n1.send(0, &Message { kind: 1, request_id: id, ..Message::default() }, &sent) {
            out.push(format!("{NAME}: message {id} to a drained ring was refused: {e:?}"));
            break;
        }
        match n0.try_recv(&mut keys) {
            Ok(Some(m)) if m.request_id == id && keys.get(..sent.len()) == Some(&sent[..]) => {}
            got => out.push(format!("{NAME}: the owner received {got:?}, not message {id} whole")),
        }
    }
    Ok(out)
}

/// Node 1 (host 1) puts a block with `put_with` (reserved, written and
/// published under one hold of its stripe lock) and stops at its change
/// record, just after the entry turned READY. What it queued for
/// write-back since its last fence lands, but its payload's lines. Node 0
/// (host 0) gets the block meanwhile, without a lock: finding it READY, it
/// must copy the key's bytes (the payload reached memory before the entry
/// was stored), never what the block held before.
pub(super) fn put_with_payload_before_ready(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "put-with-payload-before-ready";
    let rig = Rig::new(2, 2, disable)?;
    let (s0, s1) = rig.two_hosts_one_node_each()?;
    let env = StepEnv::new(&s0, 0);
    let l0 = NodeLocal::default();
    let n0 = Node::new(&s0, 0, &env, &l0)?;
    let k = Key { lo: 31, hi: 31 };
    let mut out = Vec::new();
    let (stopped_rx, go_tx) = rig.parks_at(1, "changes.record.write");
    // The block's payload lines, as node 1 reserved them.
    let payload = std::sync::Mutex::new(None);
    let put = std::thread::scope(|sc| -> Result<Result<Option<Result<()>>>> {
        let t = sc.spawn(|| -> Result<Option<Result<()>>> {
            let l1 = NodeLocal::default();
            let n1 = Node::new(&s1, 1, &env, &l1)?;
            let item = cxlkv_core::index::ReserveItem { key: k, len: 256, tokens: 1 };
            n1.put_with(NS, item, |h| {
                *payload.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((h.off / 64) as usize..(h.off + 256).div_ceil(64) as usize);
                // Streamed (flushed here), as a writer other than
                // `Node::write` leaves it: nothing fences it but the put.
                cxlkv_core::coherence::Coherence::write_payload(
                    &s1.co,
                    &s1.view,
                    h.off,
                    &[k.hi as u8; 256],
                    cxlkv_core::coherence::Site("steer.put"),
                )
            })
        });
        // Its lock requests are granted by node 0's manager, stepped here.
        if !super::zombies::parked(&stopped_rx, || t.is_finished(), &env)? {
            out.push(format!("{NAME}: node 1's put did not stop at its change record"));
            return Ok(t.join().unwrap_or(Err(Error::Corrupt)));
        }
        let Some(lines) = payload.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
            out.push(format!("{NAME}: node 1 stopped before it reserved the block"));
            let _ = go_tx.send(());
            return Ok(t.join().unwrap_or(Err(Error::Corrupt)));
        };
        // Everything node 1 queued lands (its entry, READY, among it) but
        // its payload's lines, should any still be queued.
        rig.mem.drain_but(1, |i| lines.contains(&i));
        let mut bytes = [0u8; 256];
        match n0.get_into(NS, k, &mut [&mut bytes[..]]) {
            Ok(cxlkv_core::index::Got::Copied(256)) if bytes.iter().all(|&b| b == k.hi as u8) => {}
            Ok(cxlkv_core::index::Got::Copied(n)) => out.push(format!(
                "{NAME}: node 0 got {n} bytes of the READY block starting {:?}, not the key's payload",
                &bytes[..4]
            )),
            r => out.push(format!("{NAME}: node 0's get of the READY block gave {r:?}")),
        }
        let _ = go_tx.send(());
        Ok(t.join().unwrap_or(Err(Error::Corrupt)))
    })?;
    if put != Ok(Some(Ok(()))) {
        out.push(format!("{NAME}: node 1's put gave {put:?}"));
    }
    rig.expect_clean(NAME, &mut out)?;
    let _ = n0;
    Ok(out)
}
