//! Blocks a binding hands to its users as one batch: pinned by an acquire or
//! reserved for writing. A batch ends once — its pins released, its
//! reservations published or aborted — when its user says so or, failing
//! that, when the last holder drops it; the node stays attached until then.

use std::sync::{Arc, Mutex};

use cxlkv_core::index::Handle;
use cxlkv_core::Error as CoreError;

use crate::error::Result;
use crate::node::Node;

/// What a batch holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Pinned blocks (read-only, never evicted or changed while pinned).
    Pinned,
    /// Reserved blocks (writable, invisible until published).
    Reserved,
}

/// How a batch ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// Pins are released; reservations aborted (their space freed).
    Release,
    /// Reservations are published (their payloads flushed); pins released.
    Publish,
    /// Reservations are published once CUDA stream `.0` completed (their
    /// bytes came by DMA); pins released.
    PublishAfter(usize),
}

/// A batch of pinned or reserved blocks of one node.
pub struct Blocks {
    kind: Kind,
    node: Mutex<Option<Arc<Node>>>,
    handles: Vec<Handle>,
}

impl Blocks {
    /// The batch of `handles` (pinned or reserved by `node`).
    pub fn new(node: Arc<Node>, kind: Kind, handles: Vec<Handle>) -> Blocks {
        Blocks { kind, node: Mutex::new(Some(node)), handles }
    }

    /// Pinned or reserved.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The blocks' handles.
    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }

    /// The node, until the batch ended.
    pub fn node(&self) -> Option<Arc<Node>> {
        self.node.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// True until the batch ended.
    pub fn is_open(&self) -> bool {
        self.node.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Ends the batch `how`, writing a result per block into `out` (for a
    /// publish or an abort). `StaleHandle` once it ended. A publish after a
    /// CUDA stream that cannot be waited for leaves the batch open (the
    /// copies may still be running).
    pub fn finish(&self, how: Finish, out: &mut [cxlkv_core::Result<()>]) -> Result<()> {
        let Some(c) = self.node.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Err(CoreError::StaleHandle.into());
        };
        let node = c.core();
        match (self.kind, how) {
            (Kind::Pinned, _) => node.release(&self.handles)?,
            (Kind::Reserved, Finish::Publish) => node.publish_batch(&self.handles, out)?,
            (Kind::Reserved, Finish::PublishAfter(stream)) => match c.cuda() {
                Ok(path) => path.publish_after(stream, &self.handles, out)?,
                Err(e) => {
                    *self.node.lock().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
                    return Err(e);
                }
            },
            (Kind::Reserved, Finish::Release) => {
                for (h, o) in self.handles.iter().zip(out.iter_mut()) {
                    *o = node.abort(h);
                }
            }
        }
        Ok(())
    }
}

impl Drop for Blocks {
    fn drop(&mut self) {
        let mut out = vec![Ok(()); self.handles.len()];
        let _ = self.finish(Finish::Release, &mut out);
    }
}
