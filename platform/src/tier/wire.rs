//! What a node and a tier say to each other: the request kind, and how long
//! a node waits for the answer. The lowest room of the tier: the node's own
//! module uses it, and it uses nothing of the node's.

use std::time::Duration;

/// `Message::kind` of a promotion request to a tier: put the blocks `keys`
/// (up to 96) of namespace `ns` back into the region. The answer (kind
/// `KIND_TIER_PROMOTE | KIND_RESPONSE`) lists the keys that are in the
/// region now (put back, or there already); a key it leaves out is a miss
/// (the tier does not hold it, or its slot failed its checks). A request
/// that is not understood is answered with status `InvalidArgument`.
pub const KIND_TIER_PROMOTE: u32 = 0x7469_0001;

/// The round trips of a node's last answered promotions: what the adaptive
/// promotion wait follows ([`Options::promote_wait`](crate::node::Options)).
#[derive(Debug, Default)]
pub(crate) struct RoundTrips {
    last: [Duration; 8],
    next: usize,
}

impl RoundTrips {
    /// The shortest wait; also the wait before any promotion was answered.
    pub(crate) const FLOOR: Duration = Duration::from_secs(1);
    /// The longest wait the adaptive rule picks.
    pub(crate) const CEILING: Duration = Duration::from_secs(10);

    pub(crate) fn record(&mut self, took: Duration) {
        let i = self.next % self.last.len();
        self.last[i] = took;
        self.next = self.next.wrapping_add(1);
    }

    /// Four times the slowest recorded round trip, within the floor and
    /// the ceiling.
    pub(crate) fn wait(&self) -> Duration {
        let slowest = self.last.iter().max().copied().unwrap_or_default();
        slowest.saturating_mul(4).clamp(Self::FLOOR, Self::CEILING)
    }
}
