//! cxlkv's proof harness, apart from the code it proves:
//!
//! - [`memory`]: simulated non-coherent memory — every host works on its own
//!   copy of the region (its cache), and lines move only as hardware moves
//!   them (write-back on flush or at random, refill on invalidate or at
//!   random); every coherence call names its site, and one can be disabled
//!   (a coherence mutant);
//! - [`harness`]: simulated hosts over that memory under a seeded
//!   deterministic scheduler, with crashes, checked against a reference model
//!   and the region's invariants;
//! - [`steer`]: named scenarios that steer core into one interleaving each
//!   (a store seen through a shared cache before it lands, a host stopped
//!   and declared dead that wakes up), deterministic, for the mutant checks.

pub mod harness;
pub mod memory;
pub mod steer;
