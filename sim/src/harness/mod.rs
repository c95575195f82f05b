//! The proof harness: runs simulated hosts over [`SimMemory`] under a seeded
//! deterministic scheduler, injects crashes, and checks every result against
//! a reference model and the region's invariants.
//!
//! Each simulated host has two actors (OS threads that only ever run one at a
//! time, handing a baton at every coherence call): an *op actor* doing random
//! cache operations, and a *manager actor* beating the heartbeat and stepping
//! the lock manager. The same seed replays the same interleaving exactly.

pub(crate) mod actors;
pub(crate) mod blocks;
pub(crate) mod checks;
pub(crate) mod debug;
pub(crate) mod feed;
pub(crate) mod model;
pub(crate) mod ops;
pub(crate) mod params;
pub(crate) mod scenarios;
pub(crate) mod sched;
pub(crate) mod stalls;
pub(crate) mod tier;
pub(crate) mod world;

pub use params::{sim_caps, SIM_BYTES};
pub use scenarios::{reformat_run, run, RunConfig, RunResult};
