//! The simulated region's size and capacities, and the constants every
//! part of the harness shares (the namespace and keys the hosts use, the
//! lease). The bottom of the harness: it imports nothing of it.

use cxlkv_core::layout::Capacities;
use cxlkv_core::lock::LeaseConfig;

/// Capacities of simulated regions: small, so tables fill and chunks recycle.
pub fn sim_caps(hosts: usize) -> Capacities {
    Capacities {
        max_nodes: hosts as u32,
        n_stripes: 2,
        entries_per_stripe: 24,
        n_roots: 8,
        pin_slots: 16,
        chunk_shift: 13,
        inbox_slots: 4,
        app_locks: 2,
        tier_slots: 2,
        tier_records: 16,
        change_records: 8,
        max_tenants: 3,
    }
}

/// Bytes of a simulated region.
pub const SIM_BYTES: usize = 192 << 10;
/// The namespace of the hosts' keys.
pub(crate) const NS: u32 = 3;
/// Hard quota of tenant `sim` in runs with a tenant: below what the keys
/// can hold, so the tenant evicts its own blocks.
pub const TENANT_QUOTA: u64 = 24 << 10;
/// Guaranteed share of tenant `sim`.
pub const TENANT_SHARE: u64 = 8 << 10;
/// Whether a run of `seed` has a tenant: seeds that are multiples of 8
/// (even: no crash in `--crash-odd`; 0 modulo 4: eager caches in
/// `--lazy-alt`). No seed below 33 that kills a mutant (`tests/*-mutants.sh`)
/// is one of them, so those kills stand.
pub fn tenants_of(seed: u64) -> bool {
    seed.is_multiple_of(8)
}
/// Lifetime of tenant `sim`'s blocks in runs that give it one: simulated
/// milliseconds, i.e. scheduler steps (a run takes hundreds of thousands).
pub const TENANT_TTL: u64 = 20_000;
/// The simulated wall clock's reading at step 0.
pub(crate) const WALL_START: u64 = 1_000_000;
/// The lifetime of tenant `sim`'s blocks in a run of `seed`: in half the
/// runs with a tenant (multiples of 16), none in the others.
pub fn ttl_of(seed: u64) -> u64 {
    if tenants_of(seed) && seed.is_multiple_of(16) {
        TENANT_TTL
    } else {
        0
    }
}
/// Keys the hosts draw from.
pub(crate) const KEYS: u64 = 40;

/// The lease of simulated nodes, in scheduler steps.
pub(crate) const LEASE: LeaseConfig = LeaseConfig { lease: 40_000, settle: 300, quarantine: 0 };
