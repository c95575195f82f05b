use std::ffi::OsStr;
use std::time::Duration;

use cxlkv_core::hash::Key;
use cxlkv_core::layout::Capacities;

use super::*;
use crate::node::Options;
use crate::region::Region;

/// CUDA can be missing for three reasons, each reported the same way.
fn expect_unavailable() -> bool {
    !cfg!(feature = "cuda") || !library_present() || disabled_by(std::env::var_os("CXLKV_CUDA").as_deref())
}

#[test]
fn the_switch_turns_cuda_off() {
    assert!(disabled_by(Some(OsStr::new("off"))));
    assert!(disabled_by(Some(OsStr::new("OFF"))));
    assert!(disabled_by(Some(OsStr::new("0"))));
    assert!(!disabled_by(Some(OsStr::new("on"))));
    assert!(!disabled_by(Some(OsStr::new(""))));
    assert!(!disabled_by(None));
}

#[test]
fn opening_a_device_without_cuda_is_a_typed_error() {
    match Cuda::open(0) {
        Err(Error::CudaUnavailable(why)) => assert!(!why.is_empty()),
        Ok(c) => assert!(!expect_unavailable(), "opened {c:?} where CUDA cannot be"),
        Err(e) => panic!("unexpected error {e}"),
    }
    if expect_unavailable() {
        assert!(matches!(Cuda::open(u32::MAX), Err(Error::CudaUnavailable(_))));
    }
}

#[test]
fn a_cache_without_cuda_refuses_registration_and_keeps_its_blocks() {
    let caps =
        Capacities { max_nodes: 2, n_stripes: 2, entries_per_stripe: 64, chunk_shift: 16, ..Capacities::default() };
    let opts = Options { local_dir: std::env::temp_dir(), lock_timeout: Duration::from_secs(30), ..Options::default() };
    let attached = Node::format_new(Region::memfd(8 << 20, false).unwrap(), caps, opts).unwrap();
    let key = Key { lo: 7, hi: 9 };
    let h = attached.core().reserve(1, key, 4096, 16).unwrap();
    attached.core().write(&h, 0, &[0x5a; 4096]).unwrap();
    attached.core().publish_flushed(&[h], &mut [Ok(())]).unwrap();

    assert!(matches!(attached.cuda(), Err(Error::CudaUnavailable(_))));
    if expect_unavailable() {
        assert!(matches!(attached.register_cuda(0), Err(Error::CudaUnavailable(_))));
        assert!(matches!(attached.cuda(), Err(Error::CudaUnavailable(_))));
    }
    let mut buf = [0u8; 4096];
    assert_eq!(attached.core().get(1, key, &mut buf).unwrap(), 4096);
    assert!(buf.iter().all(|&b| b == 0x5a));
    assert!(attached.check().unwrap().is_empty());
    attached.close().unwrap();
}
