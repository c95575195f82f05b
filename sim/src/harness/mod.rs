//! The proof harness: runs simulated hosts over [`SimMemory`] under a seeded
//! deterministic scheduler, injects crashes, and checks every result against
//! a reference model and the region's invariants.
//!
//! Each simulated host has two actors (OS threads that only ever run one at a
//! time, handing a baton at every coherence call): an *op actor* doing random
//! cache operations, and a *manager actor* beating the heartbeat and stepping
//! the lock manager. The same seed replays the same interleaving exactly.

pub(crate) use crate::memory::{SimCoherence, SimConfig, SimMemory};
pub(crate) use cxlkv_core::channel::Message;
pub(crate) use cxlkv_core::coherence::{Coherence, Site};
pub(crate) use cxlkv_core::format::format;
pub(crate) use cxlkv_core::hash::{mix64, Key};
pub(crate) use cxlkv_core::index::{Handle, Lru, ReserveItem};
pub(crate) use cxlkv_core::layout::{Capacities, Entry, Layout, NodeInfo};
pub(crate) use cxlkv_core::lock::{LeaseConfig, Manager};
pub(crate) use cxlkv_core::node::{attach_node, Identity, Node, NodeLocal};
pub(crate) use cxlkv_core::store::{attach, read_header, NodeEnv, Store};
pub(crate) use cxlkv_core::Error;
pub(crate) use std::cell::Cell;
pub(crate) use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
pub(crate) use std::panic::AssertUnwindSafe;
pub(crate) use std::sync::{Arc, Condvar, Mutex};

mod actors;
mod checks;
mod debug;
mod feed;
mod model;
mod ops;
mod scenarios;
mod sched;
mod tier;
mod world;

pub(crate) use actors::*;
pub(crate) use checks::*;
pub(crate) use debug::*;
pub(crate) use feed::*;
pub(crate) use model::*;
pub(crate) use ops::*;
pub(crate) use scenarios::*;
pub use scenarios::{reformat_run, run, sim_caps, RunConfig, RunResult, SIM_BYTES};
pub(crate) use sched::*;
pub(crate) use tier::*;
pub(crate) use world::*;
