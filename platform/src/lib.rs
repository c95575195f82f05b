//! cxlkv platform layer: everything that touches the OS or the hardware.
//!
//! - [`map`]: maps a region from a file, /dev/shm, a hugetlb memfd or a
//!   device-DAX character device;
//! - [`flush`]: `Coherence` implementations with real cache-maintenance
//!   instructions, chosen by CPUID with an explicit override;
//! - [`local`]: the host-local lock layer, shared by the processes of a host;
//! - [`node`]: an attached node with its heartbeat and lock-manager thread;
//! - [`copy`]: batch put and get through lists of buffers;
//! - [`blocks`]: a batch of pinned or reserved blocks handed to a user,
//!   ended once;
//! - [`gpu`]: the region registered with CUDA, and DMA copies of KV blocks;
//! - [`events`], [`publish`], [`zmtp`]: the region's block events, published
//!   to KV-aware routers in vLLM's wire format over ZeroMQ.

pub mod blocks;
pub mod code;
pub mod copy;
pub mod error;
pub mod events;
pub mod flush;
pub mod gpu;
pub mod host;
pub mod host_locks;
pub mod inspect;
pub mod map;
pub mod metrics;
mod mgr_cell;
pub mod node;
pub mod nvme;
pub mod pattern;
pub mod publish;
pub mod region;
pub mod route;
pub mod size;
mod sync;
pub mod tenants;
pub mod tier;
pub mod user;
pub mod zmtp;

pub use blocks::{Blocks, Finish, Kind};
pub use code::{Code, Family};
pub use copy::{GetItem, PutItem};
pub use error::{Error, Result};
pub use flush::{Flush, FlushMode, PayloadStores};
pub use map::{Mapping, Populate, Source};
pub use node::{Node, Options, Stats, KIND_RESPONSE};
pub use region::Region;
pub use tier::{Tier, TierOptionField, TierOptions, TierStats, KIND_TIER_PROMOTE};
pub use user::ReserveRefused;

/// The protocol's values a binding passes in and gets back, defined by core:
/// keys, namespaces and the chained-key hash, block handles and batch items,
/// capacities, messages, reports. A binding names them from here and needs
/// no other dependency than platform.
pub mod kv {
    pub use cxlkv_core::channel::Message;
    pub use cxlkv_core::hash::{chain_keys, mix64, Key, Namespace};
    pub use cxlkv_core::index::{EvictReport, Handle, Lru, ReserveItem};
    pub use cxlkv_core::layout::{Capacities, CapacityField, NodeStats, KEYS_PER_SLOT};
    pub use cxlkv_core::recover::RecoverReport;
    pub use cxlkv_core::roots::{Root, MAX_NAME as MAX_ROOT_NAME};
    pub use cxlkv_core::{Error as CoreError, Result as CoreResult};
}

/// The coherence interface a flush mode implements ([`Flush`]), for code
/// that measures or drives it directly (the CLI's bench).
pub mod coherence {
    pub use cxlkv_core::coherence::{Coherence, Site};
}
