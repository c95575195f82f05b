//! Application locks (TraCT's lock API): inter-node locks that applications
//! allocate for structures of their own in the region, taken and released
//! through the same two-level protocol as core's locks.
//!
//! An allocated lock is recorded as a named root (`cxlkv.lock.<i>`, tag
//! [`APP_LOCK_TAG`]), so allocation reuses the root table's protocol and an
//! allocation survives the death of the node that made it. Application locks
//! come after every lock of core in the lock order: a holder may call any
//! cache operation, and recovery never needs them while it holds core's.
//! A lock revoked from a dead holder is granted again once recovery ran; what
//! it guarded may be half-updated, as with a robust mutex.

use crate::coherence::Coherence;
use crate::coherence::Site;
use crate::layout::RootRecord;
use crate::lock::Held;
use crate::node::Node;
use crate::roots::{record_valid, Root, MAX_NAME};
use crate::{Error, Result};

/// Type tag of the root records that mark allocated application locks.
pub const APP_LOCK_TAG: u32 = u32::from_le_bytes(*b"LOCK");

const PREFIX: &[u8] = b"cxlkv.lock.";

/// Root name of application lock `i`: `cxlkv.lock.<i>` in decimal.
fn lock_name(i: u32) -> [u8; MAX_NAME] {
    // The decimal digits of `i`, least significant first (at most 10).
    let mut digits = [0u8; 10];
    let mut n = 0usize;
    let mut v = i;
    for d in digits.iter_mut() {
        *d = b'0'.wrapping_add((v % 10) as u8);
        n = n.saturating_add(1);
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let mut name = [0u8; MAX_NAME];
    let decimal = digits.iter().take(n).rev();
    for (dst, src) in name.iter_mut().zip(PREFIX.iter().chain(decimal)) {
        *dst = *src;
    }
    name
}

/// The application lock a root record marks, if it marks one.
fn lock_of(r: &RootRecord) -> Option<u32> {
    if r.tag != APP_LOCK_TAG || !r.name.starts_with(PREFIX) {
        return None;
    }
    let rest = r.name.get(PREFIX.len()..)?;
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let (digits, tail) = rest.split_at_checked(end)?;
    if end == 0 || end > 9 || tail.iter().any(|&b| b != 0) {
        return None;
    }
    // At most 9 digits: below 10^9, no overflow.
    digits.iter().try_fold(0u32, |acc, &b| {
        b.is_ascii_digit().then(|| acc.wrapping_mul(10).wrapping_add(b.wrapping_sub(b'0') as u32))
    })
}

impl<C: Coherence> Node<'_, C> {
    /// Allocates an application lock; returns its number (below the region's
    /// `app_locks`). `TableFull` when every one is allocated, `RootsFull`
    /// when the root table has no record left to mark it.
    pub fn lock_alloc(&self) -> Result<u32> {
        let l = &self.store.layout;
        let n = l.caps.app_locks;
        self.with_lock(l.locks().roots(), || {
            let mut used = [0u64; (crate::layout::MAX_APP_LOCKS as usize).div_ceil(64)];
            // A first pass finds the numbers in use; the put below scans again
            // (under the same lock, so nothing changes between).
            for r in 0..l.caps.n_roots {
                let rec: RootRecord = self.store.fresh(l.root(r), Site("applock.alloc.scan"))?;
                if record_valid(&rec) {
                    if let Some(w) =
                        lock_of(&rec).filter(|&i| i < n).and_then(|i| used.get_mut((i / 64) as usize).map(|w| (w, i)))
                    {
                        *w.0 |= 1 << (w.1 % 64);
                    }
                }
            }
            let free = |i: u32| used.get((i / 64) as usize).is_some_and(|w| w & (1 << (i % 64)) == 0);
            let i = (0..n).find(|&i| free(i)).ok_or(Error::TableFull)?;
            self.root_put_locked(lock_name(i), Root { offset: 0, size: 0, tag: APP_LOCK_TAG })?;
            Ok(i)
        })
    }

    /// Frees application lock `i`. `NotFound` when it is not allocated. Free
    /// a lock only once no node holds or will take it.
    pub fn lock_free(&self, i: u32) -> Result<()> {
        if i >= self.store.layout.caps.app_locks {
            return Err(Error::InvalidArgument);
        }
        let name = lock_name(i);
        let len = name.iter().position(|&b| b == 0).unwrap_or(MAX_NAME);
        let name = name.get(..len).ok_or(Error::InvalidArgument)?;
        let root = self.root_destroy(name)?;
        if root.tag != APP_LOCK_TAG {
            // A root of the application's own happened to bear the name: put
            // it back as it was.
            self.root_put(name, root)?;
            return Err(Error::NotFound);
        }
        Ok(())
    }

    /// Takes application lock `i` (waits, like every lock, up to the node's
    /// timeout). Release it with [`Node::unlock`].
    ///
    /// The lock excludes live holders only. A holder declared dead (stopped
    /// past its lease) loses the lock, but its cache may still write back
    /// what it stored under it, at any later moment, over what later holders
    /// wrote. Data the lock guards must make such a line harmless: give each
    /// node its own line (written by no one else), stamp each write with the
    /// grant's ticket ([`Held::seq`]), and take as current the line with the
    /// largest ticket. A late line then lands only in its own node's line,
    /// under a ticket below every grant made after the revocation.
    pub fn lock_app(&self, i: u32) -> Result<Held> {
        let l = &self.store.layout;
        if i >= l.caps.app_locks {
            return Err(Error::InvalidArgument);
        }
        self.lock(l.locks().app(i))
    }

    /// Releases application lock `held` (from [`Node::lock_app`]); refuses a
    /// grant of a core lock.
    pub fn unlock_app(&self, held: Held) -> Result<()> {
        let l = &self.store.layout;
        if held.lock < l.locks().n_core() || held.lock >= l.n_locks {
            return Err(Error::InvalidArgument);
        }
        self.unlock(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_round_trip() {
        for i in [0, 7, 10, 99, 127, 1_000_000] {
            let r = RootRecord { name: lock_name(i), tag: APP_LOCK_TAG, ..RootRecord::default() };
            assert_eq!(lock_of(&r), Some(i));
        }
        let mut r = RootRecord { name: lock_name(3), tag: APP_LOCK_TAG, ..RootRecord::default() };
        r.name[PREFIX.len()] = b'x';
        assert_eq!(lock_of(&r), None);
        let r = RootRecord { name: lock_name(3), tag: 0, ..RootRecord::default() };
        assert_eq!(lock_of(&r), None);
    }
}
