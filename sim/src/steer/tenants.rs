//! Scenarios of tenants: a tenant or a namespace added on one host and met
//! on another whose cache holds the old lines, a guaranteed share held
//! against another tenant's evictions, and blocks past their lifetime
//! never read, whatever a cache or a late line says.

use cxlkv_core::hash::{Key, Namespace};
use cxlkv_core::node::{Node, NodeLocal};
use cxlkv_core::tenants::{Limits, TenantInfo};
use cxlkv_core::{Error, Result};

use super::{Rig, StepEnv};

fn key(i: u64) -> Key {
    Key { lo: i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1, hi: i }
}

fn put<C: cxlkv_core::coherence::Coherence>(n: &Node<'_, C>, ns: u32, i: u64, len: u64) -> Result<()> {
    let h = n.reserve(ns, key(i), len, 1)?;
    n.write(&h, 0, &vec![i as u8; len as usize])?;
    n.publish_flushed(core::slice::from_ref(&h), &mut [Ok(())])
}

/// Bytes and blocks tenant `name` holds, as node `n` lists them.
fn usage_of<C: cxlkv_core::coherence::Coherence>(n: &Node<'_, C>, name: &[u8]) -> Result<Option<(u64, u64)>> {
    let mut out = [TenantInfo::default(); 4];
    let k = n.tenant_list(&mut out)?;
    Ok(out.iter().take(k).find(|t| t.name() == name).map(|t| (t.bytes, t.blocks)))
}

/// Host 1 looks for tenant `t` and finds none (its cache keeps the table's
/// empty lines); host 0 adds `t`. Host 1 adding `t` must be refused
/// (`Exists`), and host 1 must find it: one name, one tenant.
pub(super) fn tenant_added_elsewhere(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "tenant-added-elsewhere";
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let mut out = Vec::new();
    if n1.tenant_find(b"t")?.is_some() {
        out.push(format!("{NAME}: a tenant found before any was added"));
    }
    let t = n0.tenant_add(b"t", Limits::default())?;
    match n1.tenant_add(b"t", Limits::default()) {
        Err(Error::Exists) => {}
        r => out.push(format!("{NAME}: host 1 added a tenant host 0 added already: {r:?}")),
    }
    match n1.tenant_find(b"t")? {
        Some(found) if found == t => {}
        r => out.push(format!("{NAME}: host 1 found {r:?} for the tenant host 0 added ({t:?})")),
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Host 1 scans the root table (its cache keeps the empty records); host 0
/// adds tenant `t` and registers a namespace in it. Host 1, handed the
/// namespace's id, puts a block there: the block must count to `t` (host 1
/// reads the namespace's record afresh, not its cached empty line).
pub(super) fn namespace_bound_elsewhere(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "namespace-bound-elsewhere";
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let mut out = Vec::new();
    if cxlkv_core::roots::get(&s1, b"r") != Err(Error::NotFound) {
        out.push(format!("{NAME}: a root named before any put"));
    }
    let t = n0.tenant_add(b"t", Limits::default())?;
    let ns = n0.namespace_in(t, Namespace { model: b"m", ..Namespace::default() }.digest())?;
    put(&n1, ns, 1, 512)?;
    match usage_of(&n0, b"t")? {
        Some((512, 1)) => {}
        r => out.push(format!("{NAME}: tenant t holds {r:?} after host 1 put a 512-byte block in its namespace")),
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 0 puts blocks of tenant `quiet` (a share of 8 KiB) beyond its
/// share; node 1 (host 1) puts blocks of the default tenant until the
/// region has evicted many times over. Evictions for the default tenant
/// may take `quiet`'s blocks above its share, never below it.
pub(super) fn share_held_against_others(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "share-held-against-others";
    const SHARE: u64 = 8 << 10;
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let mut out = Vec::new();
    let t = n0.tenant_add(b"quiet", Limits { share: SHARE, ..Limits::default() })?;
    let ns = n0.namespace_in(t, Namespace { model: b"q", ..Namespace::default() }.digest())?;
    for i in 0..6 {
        put(&n0, ns, i, 2000)?;
    }
    let mut evicted = false;
    for i in 100..400 {
        match put(&n1, 7, i, 3000) {
            Ok(()) | Err(Error::Exists) => {}
            Err(e) => return Err(e),
        }
        let Some((bytes, _)) = usage_of(&n1, b"quiet")? else {
            out.push(format!("{NAME}: tenant quiet is gone"));
            break;
        };
        if bytes < SHARE {
            out.push(format!("{NAME}: tenant quiet holds {bytes} bytes, below its share {SHARE}, after block {i}"));
            break;
        }
        evicted |= bytes < 12_000;
    }
    if !evicted {
        out.push(format!("{NAME}: no block of tenant quiet above its share was evicted"));
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 0 puts two blocks of tenant `t`; node 1 takes `t`'s lock (as a
/// reserve or a removal of `t`'s blocks does) and stops there, `t`'s usage
/// line in its cache. It is declared dead and recovered (the recovery
/// counts `t`'s blocks and raises the lock's floor); node 0 puts two more.
/// Node 1's old usage line lands. Node 2's next put of `t` must not take it
/// for the count (it is stamped below the floor: void), so `t`'s usage
/// stays the count of its blocks.
pub(super) fn zombie_tenant_usage_lands_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "zombie-tenant-usage-lands-late";
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let l = &s0.layout;
    let mut out = Vec::new();
    let t = n0.tenant_add(b"t", Limits::default())?;
    let ns = n0.namespace_in(t, Namespace { model: b"m", ..Namespace::default() }.digest())?;
    put(&n0, ns, 1, 256)?;
    put(&n0, ns, 2, 256)?;
    let line = l.tenant_usage(t.slot);
    let old: [u8; 64] = rig.mem.shared_region().read(line)?;
    let _held = n1.lock(l.locks().tenant(t.slot))?;
    super::declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    put(&n0, ns, 3, 256)?;
    put(&n0, ns, 4, 256)?;
    // Node 1's copy of the usage line, from before those two blocks, lands.
    rig.cache(1).write(line, &old)?;
    rig.mem.evict_line(1, (line / 64) as usize);
    let mut r = put(&n2, ns, 5, 256);
    for _ in 0..3 {
        if r != Err(Error::Recovering) {
            break;
        }
        r = put(&n2, ns, 5, 256);
    }
    if let Err(e) = r {
        out.push(format!("{NAME}: node 2's put after the late usage line failed: {e}"));
    }
    match usage_of(&n2, b"t")? {
        Some((1280, 5)) => {}
        u => out.push(format!("{NAME}: tenant t holds {u:?}, not its five blocks of 256 bytes")),
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Nodes 0 and 1 (two hosts) take turns putting blocks of tenant `busy`
/// (a hard quota of 6 KiB) far beyond its quota: after every put the
/// tenant holds at most its quota, its own oldest blocks going to make
/// room, and a block larger than the whole quota is refused.
pub(super) fn quota_held_across_hosts(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "quota-held-across-hosts";
    const QUOTA: u64 = 6 << 10;
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let mut out = Vec::new();
    let t = n0.tenant_add(b"busy", Limits { quota: QUOTA, ..Limits::default() })?;
    let ns = n1.namespace_in(t, Namespace { model: b"b", ..Namespace::default() }.digest())?;
    for i in 0..24u64 {
        let n = if i % 2 == 0 { &n0 } else { &n1 };
        put(n, ns, i, 1000 + 100 * (i % 5))?;
        match usage_of(&n0, b"busy")? {
            Some((bytes, _)) if bytes <= QUOTA => {}
            u => {
                out.push(format!("{NAME}: tenant busy holds {u:?} after block {i}, over its quota {QUOTA}"));
                break;
            }
        }
    }
    match n1.reserve(ns, key(1000), QUOTA + 1, 1) {
        Err(Error::OverQuota) => {}
        r => out.push(format!("{NAME}: a block larger than the quota gave {r:?}")),
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Every read of node `n` must find `k` of namespace `ns` missing: lookup,
/// presence, exists, get and acquire.
fn all_miss<C: cxlkv_core::coherence::Coherence>(
    n: &Node<'_, C>,
    ns: u32,
    k: Key,
    what: &str,
    out: &mut Vec<String>,
) -> Result<()> {
    let mut present = [true];
    let mut buf = vec![0u8; 4096];
    let mut pin = [Err(Error::InvalidArgument)];
    let hits = [
        ("lookup", n.lookup(ns, &[k])? != 0),
        ("presence", n.presence(ns, &[k], &mut present)? != 0 || present[0]),
        ("exists", n.exists(ns, k)?),
        ("get", n.get(ns, k, &mut buf) != Err(Error::NotFound)),
        ("acquire", n.acquire(ns, &[k], &mut pin)? != 0),
    ];
    if let Ok(h) = pin[0] {
        n.release(&[h])?;
    }
    for (call, hit) in hits {
        if hit {
            out.push(format!("{what}: {call} found key {} past its lifetime", k.hi));
        }
    }
    Ok(())
}

/// Node 1 puts a block of tenant `brief` (a lifetime of 100 ms) and node 0
/// reads it, its cache keeping the line of the block's expiry stamp. The
/// block expires; node 1 puts the key again (the expired block replaced)
/// and that block expires too. Node 0 must find the key missing by every
/// read: neither its cached stamp (another generation's) nor a stamp node
/// 1 kept in its cache may make the block live.
pub(super) fn expired_never_read(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "expired-never-read";
    const TTL: u64 = 100;
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let mut out = Vec::new();
    let t = n0.tenant_add(b"brief", Limits { ttl_ms: TTL, ..Limits::default() })?;
    let ns = n0.namespace_in(t, Namespace { model: b"m", ..Namespace::default() }.digest())?;
    put(&n1, ns, 1, 512)?;
    env.pass_ms(TTL - 1);
    let mut buf = vec![0u8; 512];
    if n0.get(ns, key(1), &mut buf) != Ok(512) {
        out.push(format!("{NAME}: node 0 missed the block before its lifetime ended"));
    }
    env.pass_ms(1);
    all_miss(&n1, ns, key(1), NAME, &mut out)?;
    put(&n1, ns, 1, 512)?;
    env.pass_ms(TTL);
    all_miss(&n0, ns, key(1), NAME, &mut out)?;
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 1 takes the stripe lock of a tenant's key (as a reserve does) and
/// stops there, the stripe's expiry lines in its cache as they were before
/// any block. It is declared dead and recovered (the lines restamped, the
/// lock's floor raised); node 0 puts the key (a lifetime of 100 ms). Node
/// 1's old lines land. Past the block's lifetime, node 2 must find the key
/// missing: the landed line is void (stamped below the floor), and what it
/// says of the entry is nobody's word.
pub(super) fn zombie_expiry_lands_late(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "zombie-expiry-lands-late";
    const TTL: u64 = 100;
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let l = &s0.layout;
    let mut out = Vec::new();
    let t = n0.tenant_add(b"t", Limits { ttl_ms: TTL, ..Limits::default() })?;
    let ns = n0.namespace_in(t, Namespace { model: b"m", ..Namespace::default() }.digest())?;
    let s = s0.stripe_of(ns, key(1));
    let (first, len) = l.expiry_lines(s);
    let old: Vec<[u8; 64]> =
        (0..len / 64).map(|i| rig.mem.shared_region().read(first + 64 * i)).collect::<Result<_>>()?;
    let _held = n1.lock(l.locks().stripe(s))?;
    super::declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    put(&n0, ns, 1, 256)?;
    if n2.lookup(ns, &[key(1)])? != 1 {
        out.push(format!("{NAME}: node 2 missed the block within its lifetime"));
    }
    // Node 1's copies of the stripe's expiry lines land.
    for (i, line) in old.iter().enumerate() {
        let off = first + 64 * i as u64;
        rig.cache(1).write(off, line)?;
        rig.mem.evict_line(1, (off / 64) as usize);
    }
    env.pass_ms(TTL);
    all_miss(&n2, ns, key(1), NAME, &mut out)?;
    // A recovery stamps the lines afresh.
    n0.recover(0)?;
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 0 puts a block of the default tenant, its bytes 0xab, and evicts
/// it; node 1 reserves a block of tenant `clean` (which scrubs) in the same
/// space, writes its first half (flushed) and publishes. Node 0 must read
/// the second half as zeros: the zeros node 1 wrote at the reserve reached
/// memory, and none of the evicted block's bytes shows.
pub(super) fn scrubbed_block_read_elsewhere(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "scrubbed-block-read-elsewhere";
    const LEN: u64 = 2048;
    let rig = Rig::new(2, 2, disable)?;
    two_nodes!(rig => (s0, s1), env, (l0, l1), (n0, n1));
    let mut out = Vec::new();
    let t = n0.tenant_add(b"clean", Limits { scrub: true, ..Limits::default() })?;
    let ns = n0.namespace_in(t, Namespace { model: b"m", ..Namespace::default() }.digest())?;
    let old = n0.reserve(7, key(1), LEN, 1)?;
    n0.write(&old, 0, &[0xab; LEN as usize])?;
    n0.publish_flushed(core::slice::from_ref(&old), &mut [Ok(())])?;
    n0.evict(u64::MAX, &mut cxlkv_core::index::Lru)?;
    let h = n1.reserve(ns, key(2), LEN, 1)?;
    if h.off != old.off {
        out.push(format!("{NAME}: the reserve did not get the evicted block's space ({} vs {})", h.off, old.off));
    }
    n1.write(&h, 0, &[7; (LEN / 2) as usize])?;
    n1.publish_flushed(core::slice::from_ref(&h), &mut [Ok(())])?;
    let mut buf = vec![0u8; LEN as usize];
    match n0.get(ns, key(2), &mut buf) {
        Ok(n) if n == LEN as usize => {
            let (a, b) = buf.split_at((LEN / 2) as usize);
            if !a.iter().all(|&x| x == 7) || !b.iter().all(|&x| x == 0) {
                let stale = b.iter().filter(|&&x| x == 0xab).count();
                out.push(format!(
                    "{NAME}: node 0 read the block's unwritten half with {stale} bytes of the evicted one"
                ));
            }
        }
        r => out.push(format!("{NAME}: node 0's get gave {r:?}")),
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}

/// Node 1 drops tenant `t` (four blocks) and dies inside the drop, at the
/// fence of its first eviction's claim: the tenant is DROPPING, a block is
/// CLAIMED. Declared dead and recovered, the tenant stays DROPPING (no
/// reserve of its namespace is taken) and its usage counts its blocks as
/// recovery rebuilt them; node 0 drops it again, which finishes: every
/// block gone, the slot free, and the region checks clean.
pub(super) fn tenant_drop_cut_by_a_crash(disable: Option<&'static str>) -> Result<Vec<String>> {
    const NAME: &str = "tenant-drop-cut-by-a-crash";
    three_node_rig!(disable => rig, (s0, s1, s2), env, (l0, l1, l2), (n0, n1, n2));
    let mut out = Vec::new();
    let t = n0.tenant_add(b"t", Limits::default())?;
    let ns = n0.namespace_in(t, Namespace { model: b"m", ..Namespace::default() }.digest())?;
    for i in 1..=4 {
        put(&n0, ns, i, 512)?;
    }
    if !rig.dies_at(1, "evict.announce.fence", || n1.tenant_drop(t)) {
        out.push(format!("{NAME}: node 1's drop did not reach its first eviction's claim"));
    }
    super::declare_dead(&s0, 1)?;
    env.step()?;
    n0.recover(0)?;
    match n2.reserve(ns, key(9), 512, 1) {
        Err(Error::NoTenant) => {}
        r => out.push(format!("{NAME}: a reserve of the tenant being dropped gave {r:?}")),
    }
    let left = (1..=4).filter(|&i| n2.lookup(ns, &[key(i)]).is_ok_and(|n| n == 1)).count() as u64;
    match usage_of(&n2, b"t")? {
        Some((bytes, blocks)) if blocks == left && bytes == 512 * left => {}
        u => out.push(format!("{NAME}: after recovery tenant t holds {u:?}, its blocks {left} of 512 bytes")),
    }
    match n0.tenant_drop(t) {
        Ok(rep) if rep.blocks == left => {}
        r => out.push(format!("{NAME}: the drop again gave {r:?}, {left} blocks left")),
    }
    if n2.tenant_find(b"t")?.is_some() || (1..=4).any(|i| n2.lookup(ns, &[key(i)]).is_ok_and(|n| n == 1)) {
        out.push(format!("{NAME}: tenant t or a block of it is still there after the drop"));
    }
    rig.expect_clean(NAME, &mut out)?;
    Ok(out)
}
