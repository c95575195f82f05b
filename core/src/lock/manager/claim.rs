//! The manager's claim of its role: publishing and withdrawing its claim
//! word, resigning, and the fresh state after a step cut off part-way.

use crate::coherence::{Coherence, Site};
use crate::layout::ManagerLine;
use crate::lock::CLAIM_AT;
use crate::store::Store;
use crate::Result;

use super::{Manager, UNCLAIMED};

impl Manager {
    /// Publishes this node's claim word for `epoch` in its request line
    /// (flushed; the caller fences before it settles).
    pub(super) fn publish_claim<C: Coherence>(&mut self, store: &Store<C>, epoch: u64) -> Result<()> {
        let off = store.layout.requests(self.me).wrapping_add(CLAIM_AT);
        self.claim = claim_word(epoch, self.me);
        // Another manager may have revoked locks since this one last read
        // their lines: each line's `repair` is learnt afresh.
        for m in self.memo.iter_mut() {
            m.known = 0;
        }
        store.view.store_u64(off, self.claim)?;
        // SYNC: the claim on its way to memory (reader: every other
        // manager's doorbell scan; completed by the caller's fence).
        store.co.flush(&store.view, off, 8, Site("mgr.claim.word"))
    }

    /// Withdraws this node's claim word. (A withdrawn claim is either below
    /// a rival's, which wins whatever this one shows, or the claim of a node
    /// no longer named in the manager line; any later claim is made above
    /// every claim its maker saw. It is written back at once all the same:
    /// a manager step leaves no line of its own in flight.)
    pub(super) fn drop_claim<C: Coherence>(&mut self, store: &Store<C>) -> Result<()> {
        if self.claim != 0 {
            self.claim = 0;
            self.claimed_at = UNCLAIMED;
            self.full_scan = 1;
            let off = store.layout.requests(self.me).wrapping_add(CLAIM_AT);
            store.view.store_u64(off, 0)?;
            // SYNC: the withdrawal on its way to memory (reader: the other
            // managers' doorbell scans).
            store.co.flush(&store.view, off, 8, Site("mgr.claim.drop"))?;
            store.co.store_fence(Site("mgr.claim.drop.fence"));
        }
        Ok(())
    }

    /// Fresh manager state for node `me` after a step of it was cut off
    /// part-way (the process stepping it died; its host lives on): every
    /// line that step may have stored and not yet written back is written
    /// back from this host's cache first. The fresh state then claims anew
    /// above every claim seen and settles before it grants, like any
    /// claimant (see [`Manager::step`]).
    pub fn after_cut<C: Coherence>(store: &Store<C>, me: u32) -> Result<Manager> {
        // SYNC: what the cut step stored (manager line, claim word, lock
        // lines and slots, node infos: all metadata) reaches memory before
        // the fresh state reads or writes any of it; left in this host's
        // cache it could land whenever it liked, over a later step's lines
        // (reader: every other host).
        store.co.flush(&store.view, 0, store.layout.payload.start, Site("mgr.cut.flush"))?;
        store.co.store_fence(Site("mgr.cut.fence"));
        Ok(Manager::new(me))
    }

    /// Gives up the manager role if this node holds it, so another node can
    /// claim it at once instead of waiting out the lease (detach).
    pub fn resign<C: Coherence>(&mut self, store: &Store<C>) -> Result<()> {
        let moff = store.layout.manager.start;
        let mut ml: ManagerLine = store.fresh(moff, Site("mgr.resign.read"))?;
        if ml.manager == self.me.wrapping_add(1) {
            ml.manager = 0;
            // SYNC: vacancy visible to contenders (reader: step's claim).
            store.publish(moff, &ml, Site("mgr.resign"))?;
            store.co.store_fence(Site("mgr.resign.fence"));
        }
        self.drop_claim(store)?;
        self.claimed_at = UNCLAIMED;
        self.full_scan = 1;
        Ok(())
    }
}

/// The claim word of a node `me` claiming the manager role at `epoch`: claims
/// compare as integers, a later epoch first, then the larger node id.
fn claim_word(epoch: u64, me: u32) -> u64 {
    epoch.wrapping_shl(8) | u64::from(me.wrapping_add(1) & 0xff)
}
