//! The region's change log, read from C: a cursor that reports every store
//! and removal any node makes after it was opened, keeping nothing per
//! block (as Python's `Node.change_cursor`).

use std::collections::VecDeque;
use std::sync::Mutex;

use cxlkv_platform::events::{Change, ChangeCursor};

use crate::kv::cxlkv_key;
use crate::region::{cxlkv_node, live};
use crate::{cxlkv_result, guard, handle, slice, slice_mut, Out, Shell};

/// A cursor over a region's change log (`cxlkv_change_cursor_open`).
pub struct cxlkv_change_cursor(Shell<Mutex<Pending>>);

const CURSOR_MAGIC: u64 = u64::from_le_bytes(*b"cxlkvCCR");

/// Changes read from the log and not yet handed out, and the stripes that
/// had a gap since the last poll.
struct Pending {
    cursor: ChangeCursor,
    changes: VecDeque<Change>,
    gaps: u32,
}

/// One change of a region's index.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cxlkv_change {
    /// The block's key.
    pub key: cxlkv_key,
    /// Its payload bytes.
    pub len: u64,
    /// Its namespace.
    pub ns: u32,
    /// Tokens it covers.
    pub tokens: u32,
    /// The node that made the change.
    pub node: u32,
    /// True: the block was stored (published); false: removed (evicted or
    /// removed).
    pub stored: bool,
}

/// Opens a cursor at the head of the change log of `node`'s region: its
/// polls report the changes any node makes from now on. Close it with
/// `cxlkv_change_cursor_close`.
///
/// # Safety
/// `node` is NULL or a handle from this library; `out` is valid for one
/// write.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_change_cursor_open(
    node: *const cxlkv_node,
    out: *mut *mut cxlkv_change_cursor,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `out` is valid for one write by the contract.
        let out = unsafe { Out::new(out) }?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let cursor = ChangeCursor::at_head(c.store())?;
        let p = Pending { cursor, changes: VecDeque::new(), gaps: 0 };
        out.write(Box::into_raw(Box::new(cxlkv_change_cursor(Shell::new(CURSOR_MAGIC, Mutex::new(p))))));
        Ok(())
    })
}

/// Writes up to `cap` changes made since the last poll to `out` (their
/// number to `*n_out`), in each stripe's order, leaving out namespaces not
/// in `ns[0..n_ns]` (every namespace when `n_ns` is 0); changes that do not
/// fit wait for the next poll. `*gaps` (may be NULL) gets how many stripes
/// lost changes since the last poll (the cursor fell a whole log behind, or
/// a recovery rebuilt the stripe): check what you know against the region.
/// `node` is a node of the region the cursor was opened on.
///
/// # Safety
/// `cursor` and `node` are NULL or handles from this library; `ns` is valid
/// for `n_ns` reads, `out` for `cap` writes, `n_out` for one write, `gaps`
/// NULL or valid for one write.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cxlkv_change_cursor_poll(
    cursor: *const cxlkv_change_cursor,
    node: *const cxlkv_node,
    ns: *const u32,
    n_ns: usize,
    out: *mut cxlkv_change,
    cap: usize,
    n_out: *mut usize,
    gaps: *mut u32,
) -> cxlkv_result {
    guard(|| {
        // SAFETY:
        // - `n_out` is valid for one write by the contract.
        let n_out = unsafe { Out::new(n_out) }?;
        // SAFETY:
        // - `ns` is valid for `n_ns` reads by the contract.
        let ns = unsafe { slice(ns, n_ns) }?;
        // SAFETY:
        // - `out` is valid for `cap` writes by the contract.
        let out = unsafe { slice_mut(out, cap) }?;
        // SAFETY:
        // - `cursor` is NULL or a handle from this library.
        let shell = unsafe { handle(cursor) }?;
        let live_cursor = shell.0.live(CURSOR_MAGIC)?;
        // SAFETY:
        // - `node` is NULL or a handle from this library.
        let c = unsafe { live(node) }?;
        let mut p = live_cursor.lock().unwrap_or_else(|e| e.into_inner());
        if p.changes.is_empty() {
            let (mut read, mut lost) = (Vec::new(), Vec::new());
            let Pending { cursor, .. } = &mut *p;
            cursor.poll(c.store(), &[], &mut read, &mut lost)?;
            p.changes.extend(read);
            p.gaps = p.gaps.saturating_add(lost.len() as u32);
        }
        let mut n = 0usize;
        while n < out.len() {
            let Some(ch) = p.changes.pop_front() else { break };
            if !ns.is_empty() && !ns.contains(&ch.ns) {
                continue;
            }
            if let Some(o) = out.get_mut(n) {
                *o = cxlkv_change {
                    key: ch.key.into(),
                    len: ch.len,
                    ns: ch.ns,
                    tokens: ch.tokens,
                    node: ch.node,
                    stored: ch.stored,
                };
            }
            n = n.saturating_add(1);
        }
        n_out.write(n);
        if !gaps.is_null() {
            // SAFETY:
            // - a non-NULL `gaps` is valid for one write by the contract.
            unsafe { gaps.write(p.gaps) };
            p.gaps = 0;
        }
        Ok(())
    })
}

/// Closes the cursor. Accepts NULL and closed handles.
///
/// # Safety
/// `cursor` is NULL or a handle from this library, not in use by another
/// thread.
#[no_mangle]
pub unsafe extern "C" fn cxlkv_change_cursor_close(cursor: *mut cxlkv_change_cursor) {
    let _ = guard(|| {
        // SAFETY:
        // - `cursor` is NULL or a handle from this library.
        let Ok(c) = (unsafe { handle(cursor) }) else { return Ok(()) };
        drop(c.0.close(CURSOR_MAGIC));
        Ok(())
    });
}
