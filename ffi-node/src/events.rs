//! The region's change log, read from JavaScript: a cursor that reports
//! every store and removal any node makes after it was opened, keeping
//! nothing per block (as Python's `Node.change_cursor` and C's
//! `cxlkv_change_cursor_*`).

use std::sync::{Mutex, Weak};

use napi::bindgen_prelude::Buffer;
use napi::{Env, Unknown};
use napi_derive::napi;

use cxlkv_platform::{Code, Node as Attached};

use crate::args::{absent, elements, u32_of, At};
use crate::error::{coded, OrThrow};

/// A change of the region's index.
#[napi(object)]
pub struct Change {
    /// True: the block was stored (published); false: removed (evicted or
    /// removed).
    pub stored: bool,
    /// Its namespace.
    pub ns: u32,
    /// Its key (16 bytes).
    pub key: Buffer,
    /// Its payload bytes.
    pub len: f64,
    /// Tokens it covers.
    pub tokens: u32,
    /// The node that made the change.
    pub node: u32,
}

/// What a poll found.
#[napi(object)]
pub struct Changes {
    /// The changes since the last poll, in each stripe's order.
    pub changes: Vec<Change>,
    /// Stripes that lost changes since the last poll (the cursor fell a
    /// whole log behind, or a recovery rebuilt the stripe): check what you
    /// know against the region.
    pub gaps: Vec<u32>,
}

/// A cursor over the region's change log (`node.changeCursor()`). It does
/// not keep its node attached: once the node detached, a poll throws
/// `INVALID_HANDLE`.
#[napi]
pub struct ChangeCursor {
    node: Weak<Attached>,
    cursor: Mutex<cxlkv_platform::events::ChangeCursor>,
}

impl ChangeCursor {
    pub(crate) fn new(node: Weak<Attached>, cursor: cxlkv_platform::events::ChangeCursor) -> ChangeCursor {
        ChangeCursor { node, cursor: Mutex::new(cursor) }
    }
}

#[napi]
impl ChangeCursor {
    /// The changes since the last poll of `namespaces` (every namespace
    /// when left out), and the stripes that lost changes meanwhile.
    #[napi(catch_unwind, ts_args_type = "namespaces?: number[]")]
    pub fn poll(&self, env: Env, namespaces: Unknown<'_>) -> napi::Result<Changes> {
        let ns = if absent(&namespaces) {
            Vec::new()
        } else {
            elements(&env, &namespaces, "namespaces")?
                .iter()
                .enumerate()
                .map(|(i, n)| u32_of(&env, n, At("namespaces", i)))
                .collect::<napi::Result<Vec<u32>>>()?
        };
        let c = self.node.upgrade().ok_or_else(|| coded(&env, Code::InvalidHandle, "the node is detached"))?;
        let (mut out, mut gaps) = (Vec::new(), Vec::new());
        let mut cursor = self.cursor.lock().unwrap_or_else(|e| e.into_inner());
        cursor.poll(c.store(), &ns, &mut out, &mut gaps).or_throw(&env)?;
        let changes = out
            .iter()
            .map(|x| Change {
                stored: x.stored,
                ns: x.ns,
                key: Buffer::from(x.key.to_bytes().to_vec()),
                len: x.len as f64,
                tokens: x.tokens,
                node: x.node,
            })
            .collect();
        Ok(Changes { changes, gaps })
    }
}
