//! The result codes every binding reports, from one table: their numbers
//! (stable: never reused), names (`CXLKV_RESULT_<NAME>` in C,
//! `cxlkv.Result.<NAME>` in Python, `code` of a Node error), messages and
//! families (the exception class a binding raises). Core's errors take
//! their message from core and their number from core's plus 1000.

use crate::error::Error;

/// What kind of failure a code is: bindings raise one exception class per
/// family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Success.
    Ok,
    /// An argument is out of range or malformed.
    InvalidArgument,
    /// The region is not formatted, not cxlkv's, or corrupt.
    Region,
    /// A table, the payload space or a size limit is exhausted.
    Capacity,
    /// The key (or name) is stored already.
    Exists,
    /// The key (or name) is not stored.
    NotFound,
    /// A block or handle no longer refers to what it was made for.
    StaleHandle,
    /// In use: a live node holds the slot, or recovery is due.
    Busy,
    /// A wait ran past its deadline.
    TimedOut,
    /// This node was declared dead; its locks were revoked.
    Revoked,
    /// An OS call failed, or the feature is unsupported here.
    Platform,
    /// CUDA is unavailable, or a driver call failed.
    Cuda,
    /// A bug in cxlkv (a caught panic, an error without a code).
    Internal,
}

macro_rules! message {
    (core ($e:ident)) => {
        cxlkv_core::Error::$e.as_str()
    };
    (text ($text:literal)) => {
        $text
    };
}

macro_rules! codes {
    ($( $(#[doc = $doc:literal])* $name:ident = $num:literal, $upper:literal, $family:ident, $kind:ident $msg:tt;)*) => {
        /// A result code (see the module documentation).
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Code {
            $( $(#[doc = $doc])* $name = $num, )*
        }

        impl Code {
            /// Every code, in the table's order.
            pub const ALL: &'static [Code] = &[$(Code::$name),*];

            /// The code's name in upper snake case (`INVALID_ARGUMENT`).
            pub const fn name(self) -> &'static str {
                match self {
                    $(Code::$name => $upper,)*
                }
            }

            /// The code's message (what `cxlkv_result_str` returns).
            pub const fn message(self) -> &'static str {
                match self {
                    $(Code::$name => message!($kind $msg),)*
                }
            }

            /// The code's documentation (one sentence or two).
            pub const fn doc(self) -> &'static str {
                match self {
                    $(Code::$name => concat!($($doc),*),)*
                }
            }

            /// The code's family.
            pub const fn family(self) -> Family {
                match self {
                    $(Code::$name => Family::$family,)*
                }
            }
        }
    };
}

codes! {
    /// Success.
    Ok = 1000, "OK", Ok, text("ok");
    /// An argument is out of range or malformed.
    InvalidArgument = 1001, "INVALID_ARGUMENT", InvalidArgument, core(InvalidArgument);
    /// The region was never formatted (or formatting did not finish).
    NotInitialized = 1002, "NOT_INITIALIZED", Region, core(NotInitialized);
    /// Not a cxlkv region.
    BadMagic = 1003, "BAD_MAGIC", Region, core(BadMagic);
    /// The region's format version is not supported by this library.
    WrongVersion = 1004, "WRONG_VERSION", Region, core(WrongVersion);
    /// The region was formatted by a build with other shared structs.
    WrongLayout = 1005, "WRONG_LAYOUT", Region, core(WrongLayout);
    /// The mapping is too small.
    TooSmall = 1006, "TOO_SMALL", Region, core(TooSmall);
    /// The region header is corrupt.
    CorruptHeader = 1007, "CORRUPT_HEADER", Region, core(CorruptHeader);
    /// Region metadata is corrupt.
    Corrupt = 1008, "CORRUPT", Region, core(Corrupt);
    /// An access would leave the region (or its payload area).
    OutOfBounds = 1009, "OUT_OF_BOUNDS", Region, core(OutOfBounds);
    /// No free payload space (everything left is pinned).
    OutOfSpace = 1010, "OUT_OF_SPACE", Capacity, core(OutOfSpace);
    /// The index stripe of the key is full.
    TableFull = 1011, "TABLE_FULL", Capacity, core(TableFull);
    /// The key is stored already (or being written): nothing was written.
    Exists = 1012, "EXISTS", Exists, core(Exists);
    /// The key (or name) is not stored.
    NotFound = 1013, "NOT_FOUND", NotFound, core(NotFound);
    /// A block no longer refers to the entry it was made for.
    StaleHandle = 1014, "STALE_HANDLE", StaleHandle, core(StaleHandle);
    /// This node's pin journal is full: release some blocks.
    JournalFull = 1015, "JOURNAL_FULL", Capacity, core(JournalFull);
    /// Every node slot is taken.
    NoFreeNode = 1016, "NO_FREE_NODE", Capacity, core(NoFreeNode);
    /// The node slot is held by a live node.
    NodeBusy = 1017, "NODE_BUSY", Busy, core(NodeBusy);
    /// The node id is out of range or not attached.
    BadNode = 1018, "BAD_NODE", InvalidArgument, core(BadNode);
    /// A wait ran past its deadline.
    Timeout = 1019, "TIMEOUT", TimedOut, core(Timeout);
    /// This node was declared dead; its locks were revoked.
    Revoked = 1020, "REVOKED", Revoked, core(Revoked);
    /// The named-root table is full.
    RootsFull = 1021, "ROOTS_FULL", Capacity, core(RootsFull);
    /// The entry is pinned, or the region is in use.
    Busy = 1022, "BUSY", Busy, core(Busy);
    /// The payload changed while it was copied.
    Changed = 1023, "CHANGED", StaleHandle, core(Changed);
    /// A size is too large (or a buffer too small for a block).
    TooLarge = 1024, "TOO_LARGE", Capacity, core(TooLarge);
    /// A lock awaits recovery after a node died: retry later.
    Recovering = 1025, "RECOVERING", Busy, core(Recovering);
    /// The receiver's inbox is full: retry later.
    InboxFull = 1026, "INBOX_FULL", Capacity, core(InboxFull);
    /// The block is a reservation, not a pin: publish or abort it.
    NotPinned = 1027, "NOT_PINNED", InvalidArgument, core(NotPinned);
    /// The tenant's hard quota is reached: nothing of its own can be evicted.
    OverQuota = 1028, "OVER_QUOTA", Capacity, core(OverQuota);
    /// No such tenant (dropped, or being dropped).
    NoTenant = 1029, "NO_TENANT", NotFound, core(NoTenant);
    /// Every tenant slot is taken.
    TenantsFull = 1030, "TENANTS_FULL", Capacity, core(TenantsFull);
    /// An OS call failed (see `cxlkv_last_error`).
    Io = 1100, "IO", Platform, text("operating system error");
    /// Not supported on this machine or build.
    Unsupported = 1101, "UNSUPPORTED", Platform, text("not supported here");
    /// CUDA cannot be used here (no driver, no device, or not built in).
    CudaUnavailable = 1102, "CUDA_UNAVAILABLE", Cuda, text("CUDA unavailable");
    /// A CUDA driver call failed (see `cxlkv_last_error`).
    Cuda = 1103, "CUDA", Cuda, text("CUDA driver call failed");
    /// A required pointer argument is NULL.
    NullParameter = 1200, "NULL_PARAMETER", InvalidArgument, text("NULL parameter");
    /// A handle is not one this library made, or was closed.
    InvalidHandle = 1201, "INVALID_HANDLE", StaleHandle, text("invalid or closed handle");
    /// The library caught a panic: a bug in cxlkv; the call did nothing
    /// lasting or reported what it did.
    Panic = 1202, "PANIC", Internal, text("internal panic caught");
    /// A string is not valid UTF-8 (paths and names must be).
    InvalidString = 1203, "INVALID_STRING", InvalidArgument, text("string is not valid UTF-8");
    /// An error this build has no code for.
    Internal = 1204, "INTERNAL", Internal, text("internal error");
}

impl Code {
    /// The code of number `n`, if there is one.
    pub fn from_u32(n: u32) -> Option<Code> {
        Code::ALL.iter().copied().find(|c| *c as u32 == n)
    }

    /// The code a platform error reports.
    pub fn of(e: &Error) -> Code {
        match e {
            Error::Core(c) => (*c).into(),
            Error::Io { .. } => Code::Io,
            Error::Unsupported(_) => Code::Unsupported,
            Error::CudaUnavailable(_) => Code::CudaUnavailable,
            Error::Cuda { .. } => Code::Cuda,
        }
    }
}

impl From<cxlkv_core::Error> for Code {
    /// Core error `e` is code `1000 + e.code()`; one this build's table
    /// lacks is `Internal`.
    fn from(e: cxlkv_core::Error) -> Code {
        e.code().checked_add(1000).and_then(Code::from_u32).filter(|c| *c != Code::Ok).unwrap_or(Code::Internal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cxlkv_core::Error as E;

    const CORE: [E; 30] = [
        E::InvalidArgument,
        E::NotInitialized,
        E::BadMagic,
        E::WrongVersion,
        E::WrongLayout,
        E::TooSmall,
        E::CorruptHeader,
        E::Corrupt,
        E::OutOfBounds,
        E::OutOfSpace,
        E::TableFull,
        E::Exists,
        E::NotFound,
        E::StaleHandle,
        E::JournalFull,
        E::NoFreeNode,
        E::NodeBusy,
        E::BadNode,
        E::Timeout,
        E::Revoked,
        E::RootsFull,
        E::Busy,
        E::Changed,
        E::TooLarge,
        E::Recovering,
        E::InboxFull,
        E::NotPinned,
        E::OverQuota,
        E::NoTenant,
        E::TenantsFull,
    ];

    #[test]
    fn every_core_error_has_its_own_code_with_core_s_message() {
        let mut seen = std::collections::HashSet::new();
        for e in CORE {
            let c = Code::from(e);
            assert_ne!(c, Code::Internal, "{e:?}");
            assert_eq!(c as u32, 1000 + e.code());
            assert_eq!(c.message(), e.as_str());
            assert!(seen.insert(c));
        }
    }

    #[test]
    fn numbers_and_names_are_unique_and_round_trip() {
        let mut nums = std::collections::HashSet::new();
        let mut names = std::collections::HashSet::new();
        for &c in Code::ALL {
            assert!(nums.insert(c as u32), "{c:?}");
            assert!(names.insert(c.name()), "{c:?}");
            assert_eq!(Code::from_u32(c as u32), Some(c));
            assert!(!c.message().is_empty() && !c.doc().is_empty());
            assert!(c.name().bytes().all(|b| b.is_ascii_uppercase() || b == b'_'));
        }
        assert_eq!(Code::from_u32(7), None);
    }

    #[test]
    fn platform_errors_map_to_their_codes() {
        assert_eq!(Code::of(&Error::Unsupported("x")), Code::Unsupported);
        assert_eq!(Code::of(&Error::Core(E::Busy)), Code::Busy);
        assert_eq!(Code::of(&Error::Io { what: "x", err: std::io::Error::other("y") }), Code::Io);
    }
}
