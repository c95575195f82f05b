//! `Off<T>`: a reference stored in the region as a distance from its base.
//!
//! Each host maps the region at its own address, so the region never holds a
//! pointer. An `Off` read from the region is untrusted; [`Off::resolve`]
//! checks it lies inside the area it must point into, is aligned for `T` and
//! leaves room for a whole `T`.

use core::marker::PhantomData;

use crate::{Error, Result};

/// Offset of a `T` from the region base; 0 is null.
#[derive(Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Off<T> {
    raw: u64,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for Off<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Off<T> {}

/// A half-open byte range `[start, end)` of the region that an offset must
/// point into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Area {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

impl Area {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
    /// True when `off..off+size` lies inside the area.
    pub fn contains(&self, off: u64, size: u64) -> bool {
        off >= self.start && off.checked_add(size).is_some_and(|e| e <= self.end)
    }
}

impl<T> Off<T> {
    /// The null offset.
    pub const NULL: Self = Off { raw: 0, _t: PhantomData };

    /// Wraps a raw offset (from the region or from arithmetic).
    pub const fn from_raw(raw: u64) -> Self {
        Off { raw, _t: PhantomData }
    }

    /// The raw distance from the region base.
    pub const fn raw(self) -> u64 {
        self.raw
    }

    /// True for the null offset.
    pub const fn is_null(self) -> bool {
        self.raw == 0
    }

    /// Checks the offset: not null, `size_of::<T>()` bytes inside `area`,
    /// aligned to `align` (a power of two). Returns the raw offset for use with
    /// [`crate::mem::View`].
    pub fn resolve(self, area: Area, align: u64) -> Result<u64> {
        self.resolve_len(area, core::mem::size_of::<T>() as u64, align)
    }

    /// Like [`Off::resolve`] for a run of `len` bytes (payloads).
    pub fn resolve_len(self, area: Area, len: u64, align: u64) -> Result<u64> {
        // `align - 1` only once `align` is a power of two (at least 1).
        if self.raw == 0 || !align.is_power_of_two() || self.raw & align.wrapping_sub(1) != 0 {
            return Err(Error::Corrupt);
        }
        if !area.contains(self.raw, len) {
            return Err(Error::Corrupt);
        }
        Ok(self.raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_rejects_null_misaligned_and_outside() {
        let area = Area { start: 4096, end: 8192 };
        assert_eq!(Off::<[u8; 64]>::NULL.resolve(area, 64), Err(Error::Corrupt));
        assert_eq!(Off::<[u8; 64]>::from_raw(4096 + 8).resolve(area, 64), Err(Error::Corrupt));
        assert_eq!(Off::<[u8; 64]>::from_raw(8192 - 32).resolve(area, 32), Err(Error::Corrupt));
        assert_eq!(Off::<[u8; 64]>::from_raw(8192).resolve(area, 64), Err(Error::Corrupt));
        assert_eq!(Off::<[u8; 64]>::from_raw(u64::MAX - 63).resolve(area, 64), Err(Error::Corrupt));
        assert_eq!(Off::<[u8; 64]>::from_raw(8192 - 64).resolve(area, 64), Ok(8192 - 64));
    }
}
