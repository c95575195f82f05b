//! The one table of capacities a region is formatted with.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::{Error, Result};

use super::lines::{MAX_APP_LOCKS, MAX_LOCKS, MAX_NODES, MAX_TENANTS};

/// One capacity of a region, as [`Capacities::FIELDS`] lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapacityField {
    /// Its name: the field of [`Capacities`], of C's `cxlkv_capacities` and
    /// Python's `Region.format` keyword (Node's option is its camelCase).
    pub name: &'static str,
    /// What it counts, and its limits.
    pub doc: &'static str,
    /// Its default.
    pub default: u32,
}

/// The one table of capacities: the struct, its defaults, the list every
/// door reads (C's struct is converted through it and checked against it,
/// Python's keywords and stub, Node's options and typings, the CLI's flags).
/// Adding a capacity is a line here (plus the C struct's field, which a
/// test holds to this order).
macro_rules! capacities {
    ($($(#[doc = $doc:literal])+ $name:ident = $default:expr;)+) => {
        /// Capacities chosen at format time (see [`Capacities::FIELDS`]).
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
        pub struct Capacities {
            $($(#[doc = $doc])+ pub $name: u32,)+
        }

        impl Default for Capacities {
            fn default() -> Self {
                Capacities { $($name: $default,)+ }
            }
        }

        impl Capacities {
            /// Every capacity, in the struct's order.
            pub const FIELDS: &'static [CapacityField] = &[$(CapacityField {
                name: stringify!($name),
                doc: concat!($($doc),+),
                default: $default,
            }),+];

            /// The capacity called `name`.
            pub fn get(&self, name: &str) -> Option<u32> {
                match name {
                    $(stringify!($name) => Some(self.$name),)+
                    _ => None,
                }
            }

            /// Sets the capacity called `name`; false when there is none.
            pub fn set(&mut self, name: &str, value: u32) -> bool {
                match name {
                    $(stringify!($name) => self.$name = value,)+
                    _ => return false,
                }
                true
            }
        }
    };
}

capacities! {
    /// Node slots (1 to 64).
    max_nodes = 16;
    /// Index stripes, each with its own lock (a power of two, at most 128).
    n_stripes = 16;
    /// Index entries per stripe: the most blocks a stripe holds.
    entries_per_stripe = 4096;
    /// Named roots: application roots, application locks and registered
    /// namespaces (one record each; 1 to 65536).
    n_roots = 1024;
    /// Pins each node may hold at once (a multiple of 4).
    pin_slots = 512;
    /// log2 of the allocator's chunk size (12 to 32; 21 = 2 MiB).
    chunk_shift = 21;
    /// Slots of each sender's ring in each node's inbox (a power of two, 4
    /// to 65536): a node's inbox holds `max_nodes` rings.
    inbox_slots = 64;
    /// Inter-node locks applications allocate for their own structures
    /// (TraCT's lock API; at most 128); each allocated one takes a root
    /// record.
    app_locks = 64;
    /// Tier directories: hosts whose SSD tier the region can record (at
    /// most 64; 0 for none).
    tier_slots = 4;
    /// Records of each tier directory (a power of two, 2 to 2^26): blocks
    /// one SSD tier can make known to the rack, up to three quarters of it.
    tier_records = 8192;
    /// Records of each stripe's change log (a power of two, 4 to 2^20): how
    /// far a reader of the log may fall behind before it must rescan.
    change_records = 256;
    /// Tenant slots, the default tenant's included (1 to 64): tenants
    /// beside the default one that may exist at once, plus one.
    max_tenants = 8;
}

impl Capacities {
    /// Checks every capacity is within what the format supports.
    pub fn validate(&self) -> Result<()> {
        let ok = (1..=MAX_NODES).contains(&self.max_nodes)
            && self.n_stripes.is_power_of_two()
            && self.n_stripes <= 128
            && (1..=1 << 24).contains(&self.entries_per_stripe)
            && (1..=65536).contains(&self.n_roots)
            && (4..=1 << 20).contains(&self.pin_slots)
            && self.pin_slots.is_multiple_of(4)
            && (12..=32).contains(&self.chunk_shift)
            && self.inbox_slots.is_power_of_two()
            && (4..=65536).contains(&self.inbox_slots)
            && self.app_locks <= MAX_APP_LOCKS
            && self.tier_slots <= MAX_NODES
            && self.change_records.is_power_of_two()
            && (4..=1 << 20).contains(&self.change_records)
            && self.tier_records.is_power_of_two()
            && (2..=1 << 26).contains(&self.tier_records)
            && (1..=MAX_TENANTS).contains(&self.max_tenants)
            && self.n_locks() <= MAX_LOCKS;
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidArgument)
        }
    }

    /// Buckets per stripe: a power of two at least twice the entries.
    pub fn buckets_per_stripe(&self) -> u32 {
        self.entries_per_stripe.max(2).saturating_mul(2).next_power_of_two()
    }

    /// Number of global locks: stripes, roots, one per tenant, one heap per
    /// node, alloc, one inbox per node, then the application locks.
    pub fn n_locks(&self) -> u32 {
        // Validated capacities keep this far below u32::MAX.
        let n = self.n_stripes.wrapping_add(1).wrapping_add(self.max_tenants).wrapping_add(self.max_nodes);
        n.wrapping_add(1).wrapping_add(self.max_nodes).wrapping_add(self.app_locks)
    }
}
