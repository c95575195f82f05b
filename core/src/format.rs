//! Formatting: writes an empty cxlkv region (layout, index stripes, header,
//! magic last). Apart from `store`, so that the store does not depend on the
//! index built on it.

use crate::coherence::{Coherence, Site};
use crate::layout::{Capacities, Layout, MAGIC};
use crate::mem::{View, LINE};
use crate::store::Store;
use crate::Result;

/// Formats `region` as an empty cxlkv region. Everything is written and
/// flushed before the header; the magic is written last of all.
pub fn format<C: Coherence>(region: View, co: C, caps: Capacities, creation_id: u64) -> Result<Store<C>> {
    let layout = Layout::compute(caps, region.len())?;
    let meta_end = layout.payload.start;
    // SYNC: clear the magic first and make that visible, so a peer attaching
    // during format sees "not initialised", never a half-written region.
    region.store_u64(0, 0)?;
    co.flush(&region, 0, LINE, Site("format.unmagic"))?;
    co.store_fence(Site("format.unmagic.fence"));
    region.zero(0, meta_end)?;
    let store = Store { view: region, layout, co, creation_id };
    crate::index::format_stripes(&store)?;
    crate::tenants::format_tenants(&store)?;
    // Completed (with the header) by the header fence, before the magic.
    store.co.flush(&store.view, 0, meta_end, Site("format.meta"))?;
    let mut h = layout.header(creation_id, 0);
    store.publish(0, &h, Site("format.header"))?;
    store.co.store_fence(Site("format.header.fence"));
    h.magic = MAGIC;
    // SYNC: the magic publishes the whole region (reader: attach).
    store.view.store_u64(0, h.magic)?;
    store.co.flush(&store.view, 0, LINE, Site("format.magic"))?;
    store.co.full_fence(Site("format.magic.fence"));
    Ok(store)
}
