//! The one error type of core. Every failure is typed; nothing panics on bad
//! region contents.

use core::fmt;

/// Every way a core operation can fail. Numbers are stable (the C API uses
/// them, offset by its base) and never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
#[non_exhaustive]
pub enum Error {
    /// An argument is out of range or malformed.
    InvalidArgument = 1,
    /// The region does not carry the cxlkv magic: it was never formatted, or
    /// formatting did not finish.
    NotInitialized = 2,
    /// The magic is present but wrong: this is not a cxlkv region.
    BadMagic = 3,
    /// The region was formatted by an incompatible format version.
    WrongVersion = 4,
    /// The shared structs of the formatter differ from ours.
    WrongLayout = 5,
    /// The mapping is smaller than the region the header describes, or too
    /// small to hold any region.
    TooSmall = 6,
    /// The header fails its checksum or describes impossible areas.
    CorruptHeader = 7,
    /// An offset or index read from the region points outside where it must.
    Corrupt = 8,
    /// A memory access would leave the region or is misaligned.
    OutOfBounds = 9,
    /// No free payload space.
    OutOfSpace = 10,
    /// No free index entry in the key's stripe.
    TableFull = 11,
    /// The key is already stored (or being written): nothing was written.
    Exists = 12,
    /// The key is not stored.
    NotFound = 13,
    /// A handle no longer refers to the entry it was made for.
    StaleHandle = 14,
    /// The node's pin journal has no free record.
    JournalFull = 15,
    /// Every node slot is taken.
    NoFreeNode = 16,
    /// The node slot is held by a live node.
    NodeBusy = 17,
    /// The node id is out of range or not attached.
    BadNode = 18,
    /// A wait ran past its deadline.
    Timeout = 19,
    /// The lock was revoked from this node (it was declared dead).
    Revoked = 20,
    /// The named root table is full.
    RootsFull = 21,
    /// The entry is pinned and cannot be changed.
    Busy = 22,
    /// The payload changed while it was being copied.
    Changed = 23,
    /// A size is not supported by the allocator.
    TooLarge = 24,
    /// A lock this operation needs awaits recovery after a node died; the
    /// operation did nothing lasting. Retry after recovery.
    Recovering = 25,
    /// The receiver's inbox has no room now; retry once it has read.
    InboxFull = 26,
    /// The handle is a reservation, not a pin: publish or abort it.
    NotPinned = 27,
    /// The tenant's hard quota is reached and none of its own blocks can be
    /// evicted (all pinned or being written): nothing was reserved.
    OverQuota = 28,
    /// No such tenant: never added, dropped, or being dropped (a namespace
    /// bound to it takes no new blocks).
    NoTenant = 29,
    /// Every tenant slot is taken.
    TenantsFull = 30,
}

impl Error {
    /// Short human description.
    pub const fn as_str(self) -> &'static str {
        match self {
            Error::InvalidArgument => "invalid argument",
            Error::NotInitialized => "region not initialised",
            Error::BadMagic => "not a cxlkv region (bad magic)",
            Error::WrongVersion => "region format version not supported",
            Error::WrongLayout => "region layout fingerprint differs from this build",
            Error::TooSmall => "region too small",
            Error::CorruptHeader => "region header corrupt",
            Error::Corrupt => "region metadata corrupt",
            Error::OutOfBounds => "access outside the region",
            Error::OutOfSpace => "no free payload space",
            Error::TableFull => "index stripe full",
            Error::Exists => "key exists",
            Error::NotFound => "key not found",
            Error::StaleHandle => "stale handle",
            Error::JournalFull => "pin journal full",
            Error::NoFreeNode => "no free node slot",
            Error::NodeBusy => "node slot in use by a live node",
            Error::BadNode => "bad node id",
            Error::Timeout => "timed out",
            Error::Revoked => "lock revoked",
            Error::RootsFull => "root table full",
            Error::Busy => "busy (a pinned block, a held lock, or the region in use)",
            Error::Changed => "entry changed during read",
            Error::TooLarge => "size too large",
            Error::Recovering => "recovery in progress, retry",
            Error::InboxFull => "inbox full, retry",
            Error::NotPinned => "block is reserved, not pinned: publish or abort it",
            Error::OverQuota => "the tenant's hard quota is reached (its own blocks are all pinned or being written)",
            Error::NoTenant => "no such tenant (dropped, or being dropped)",
            Error::TenantsFull => "every tenant slot is taken",
        }
    }

    /// Stable numeric code.
    pub const fn code(self) -> u32 {
        self as u32
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl core::error::Error for Error {}
