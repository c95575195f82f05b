//! A node's side of promotion: asks the tiers that hold missing blocks to
//! put them back, and how long it waits for them.

use super::*;

/// Keys one promote request carries at most.
const PROMOTE_KEYS: usize = 96;

impl Node {
    /// How long the next promotion waits for its answers: the option when
    /// set, else four times the slowest of the last answered ones (at least
    /// a second, at most ten).
    pub fn promote_wait(&self) -> Duration {
        self.options().promote_wait.unwrap_or_else(|| self.promotions().wait())
    }

    /// Asks the SSD tiers that hold blocks `keys` of namespace `ns` (found
    /// in the region's tier directories) to put them back into the region,
    /// one request per tier and up to 96 keys, all sent before any answer
    /// is awaited; `there[i]` is true when block `i` is in the region now.
    /// A dead or silent tier, or a slot failing its checks, is a miss.
    pub fn promote(&self, ns: u32, keys: &[Key], timeout: Duration) -> Result<Vec<bool>> {
        let mut there = vec![false; keys.len()];
        if keys.is_empty() || !self.store().tiers_active()? {
            return Ok(there);
        }
        let mut by_owner: HashMap<u32, Vec<usize>> = HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            if let Some(t) = self.store().tier_find(ns, *k)? {
                if t.owner != self.id() {
                    by_owner.entry(t.owner).or_default().push(i);
                }
            }
        }
        let cap = (self.store().layout.caps.inbox_slots as usize / 2).max(1) * cxlkv_core::layout::KEYS_PER_SLOT;
        for (owner, idx) in by_owner {
            for part in idx.chunks(PROMOTE_KEYS.min(cap)) {
                let ks: Vec<Key> = part.iter().map(|&i| keys[i]).collect();
                let msg = Message { kind: KIND_TIER_PROMOTE, ns, ..Message::default() };
                let asked = Instant::now();
                match self.call(owner, &msg, &ks, timeout) {
                    Ok((m, back)) if m.status == 0 => {
                        self.promotions().record(asked.elapsed());
                        for &i in part {
                            there[i] = back.contains(&keys[i]);
                        }
                    }
                    Err(Error::Core(CoreError::Timeout)) => {
                        // Counted, and the next waits follow: a late answer
                        // is dropped, but a tier this slow is measured by
                        // the wait that ran out.
                        self.promotions().record(timeout);
                        self.core().count_tier_timeouts(part.len() as u64)?;
                    }
                    Ok(_) | Err(Error::Core(CoreError::BadNode | CoreError::InboxFull)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(there)
    }
}
