//! cxlkv core: the bytes of a shared region and the protocol that changes them.
//!
//! Everything here is `no_std` and allocation-free. Shared memory is reached
//! only through [`mem::View`] (bounds-checked offsets) and the
//! [`coherence::Coherence`] trait (flush, invalidate, fences), so the same code
//! runs on coherent memory, on non-coherent CXL memory with explicit cache
//! maintenance, and on a simulator.
#![no_std]
#![deny(clippy::std_instead_of_core, clippy::alloc_instead_of_core)]
// Never a panic on bad bytes: outside tests, no unwrap, no panic, no
// indexing or slicing that can fail, no arithmetic that can overflow or
// divide by zero (wrapping where the value is validated, saturating or
// checked where it comes from the region).
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )
)]

#[cfg(test)]
extern crate std;

pub mod alloc;
pub mod applock;
pub mod changes;
pub mod channel;
pub mod check;
pub mod coherence;
pub mod error;
pub mod format;
pub mod hash;
pub mod index;
pub mod layout;
pub mod lock;
pub mod mem;
pub mod mutant;
pub mod namespaces;
pub mod node;
pub mod off;
pub mod pins;
pub mod recover;
pub mod roots;
pub mod store;
pub mod tenants;
pub mod tier;

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod testutil;

pub use error::Error;

/// Result type of every fallible core operation.
pub type Result<T> = core::result::Result<T, Error>;
