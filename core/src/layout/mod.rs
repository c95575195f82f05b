//! The region format: every shared struct, the header, and where each area
//! lies. This file is the wire format; changing a struct changes
//! [`LAYOUT_FINGERPRINT`] and attach refuses regions of the other layout.
//!
//! Every struct is `#[repr(C)]`, made of fixed-width integers, 8-byte multiple
//! sized (64 where it is a line), with size and offsets asserted here.

mod caps;
mod lines;
mod place;

pub use caps::*;
pub use lines::*;
pub use place::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::LINE;
    use crate::Error;

    #[test]
    fn compute_places_areas_in_order_without_overlap() {
        let sut = Layout::compute(Capacities::default(), 256 << 20).unwrap();
        let areas = [
            sut.nodes,
            sut.manager,
            sut.locks,
            sut.roots,
            sut.stripes,
            sut.buckets,
            sut.entries,
            sut.journals,
            sut.inboxes,
            sut.tiers,
            sut.changes,
            sut.tenants,
            sut.expiry,
            sut.chunk_bitmap,
            sut.chunks,
            sut.payload,
        ];
        for w in areas.windows(2) {
            assert!(w[0].end <= w[1].start, "{:?} overlaps {:?}", w[0], w[1]);
            assert_eq!(w[1].start % LINE, 0);
        }
        assert_eq!(sut.payload.start % PAYLOAD_ALIGN, 0);
        assert!(sut.payload.end <= 256 << 20);
        assert!(sut.n_chunks > 50);
    }

    #[test]
    fn compute_fails_when_region_too_small() {
        assert_eq!(Layout::compute(Capacities::default(), 1 << 20), Err(Error::TooSmall));
    }

    #[test]
    fn header_round_trips_and_rejects_each_mismatch() {
        let l = Layout::compute(Capacities::default(), 64 << 20).unwrap();
        let mut h = l.header(7, 0);
        assert_eq!(Layout::from_header(&h, 64 << 20), Err(Error::NotInitialized));
        h.magic = MAGIC;
        assert_eq!(Layout::from_header(&h, 64 << 20), Ok(l));
        assert_eq!(Layout::from_header(&h, 32 << 20), Err(Error::TooSmall));
        let mut bad = h;
        bad.magic = 1;
        assert_eq!(Layout::from_header(&bad, 64 << 20), Err(Error::BadMagic));
        let mut bad = h;
        bad.version = 99;
        assert_eq!(Layout::from_header(&bad, 64 << 20), Err(Error::WrongVersion));
        let mut bad = h;
        bad.fingerprint ^= 1;
        assert_eq!(Layout::from_header(&bad, 64 << 20), Err(Error::WrongLayout));
        let mut bad = h;
        bad.off_entries += 64;
        assert_eq!(Layout::from_header(&bad, 64 << 20), Err(Error::CorruptHeader));
        let mut bad = h;
        bad.off_entries += 64;
        bad.checksum = header_checksum(&bad);
        assert_eq!(Layout::from_header(&bad, 64 << 20), Err(Error::CorruptHeader));
    }
}
