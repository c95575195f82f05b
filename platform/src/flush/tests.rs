//! One conformance suite, run against every `Coherence` implementation this
//! machine can execute (and core's `Coherent`).

use cxlkv_core::coherence::{Coherence, Coherent, Site};
use cxlkv_core::format::format;
use cxlkv_core::hash::Key;
use cxlkv_core::layout::Capacities;
use cxlkv_core::node::{attach_node, Identity, Node, NodeLocal};
use cxlkv_core::store::{attach, NodeEnv};

use super::{Flush, FlushMode, PayloadStores};
use crate::map::Mapping;

const S: Site = Site("test");

fn impls() -> Vec<Box<dyn Coherence + Sync>> {
    let mut v: Vec<Box<dyn Coherence + Sync>> = vec![Box::new(Coherent)];
    for m in FlushMode::ALL {
        if m.available() {
            v.push(Box::new(Flush::new(m, false).unwrap()));
            if cfg!(target_arch = "x86_64") && m != FlushMode::Coherent {
                v.push(Box::new(Flush::new(m, true).unwrap()));
            }
        } else {
            assert!(Flush::new(m, false).is_err(), "{m:?} unavailable must be refused");
        }
    }
    v
}

#[test]
fn every_impl_rejects_ranges_outside_the_region() {
    let m = Mapping::memfd(1 << 20, false).unwrap();
    let r = m.view();
    for co in impls() {
        assert!(co.flush(&r, (1 << 20) - 32, 64, S).is_err(), "{}", co.name());
        assert!(co.invalidate(&r, u64::MAX - 10, 64, S).is_err(), "{}", co.name());
        assert!(co.write_payload(&r, (1 << 20) - 3, &[1, 2, 3, 4], S).is_err(), "{}", co.name());
        co.flush(&r, 0, 0, S).unwrap();
        co.invalidate(&r, (1 << 20) - 1, 1, S).unwrap();
        co.store_fence(S);
        co.full_fence(S);
    }
}

#[test]
fn every_impl_publishes_what_another_mapping_reads_fresh() {
    let p = std::env::temp_dir().join(format!("cxlkv-conf-{}", std::process::id()));
    let a = Mapping::create_file(&p, 1 << 20, 0o600, true).unwrap();
    let b = Mapping::open_file(&p).unwrap();
    for (k, co) in impls().into_iter().enumerate() {
        let v = 0x1000 + k as u64;
        a.view().store_u64(8192 + 64 * k as u64, v).unwrap();
        co.flush(&a.view(), 8192 + 64 * k as u64, 8, S).unwrap();
        co.store_fence(S);
        co.invalidate(&b.view(), 8192 + 64 * k as u64, 8, S).unwrap();
        assert_eq!(b.view().load_u64(8192 + 64 * k as u64).unwrap(), v, "{}", co.name());
        // A payload-sized range (the bulk path of clflush mode).
        let base = 65536 + 8192 * k as u64;
        let bytes: Vec<u8> = (0..4096u32).map(|i| (i as u8) ^ k as u8).collect();
        a.view().copy_in(base, &bytes).unwrap();
        co.flush(&a.view(), base, 4096, S).unwrap();
        co.store_fence(S);
        co.invalidate(&b.view(), base, 4096, S).unwrap();
        let mut got = vec![0u8; 4096];
        b.view().copy_out(base, &mut got).unwrap();
        assert_eq!(got, bytes, "{}", co.name());
        // A payload through the bulk path (streaming stores where the
        // implementation has them), partial lines at both edges.
        let at = base + 4096 + 13;
        let bytes: Vec<u8> = (0..3000u32).map(|i| (i as u8).wrapping_mul(3) ^ k as u8 ^ 0x80).collect();
        co.invalidate(&b.view(), at, 3000, S).unwrap();
        co.write_payload(&a.view(), at, &bytes, S).unwrap();
        co.store_fence(S);
        co.invalidate(&b.view(), at, 3000, S).unwrap();
        let mut got = vec![0u8; 3000];
        b.view().copy_out(at, &mut got).unwrap();
        assert_eq!(got, bytes, "{}", co.name());
    }
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn every_impl_writes_payloads_exactly_at_any_alignment() {
    let m = Mapping::memfd(1 << 20, false).unwrap();
    let r = m.view();
    for co in impls() {
        for (off, len) in [(4096u64, 4096usize), (4099, 1), (4101, 77), (8191, 130), (12288 + 5, 9000)] {
            r.zero(off - 8, len as u64 + 16).unwrap();
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + off as usize) as u8 | 1).collect();
            co.write_payload(&r, off, &src, S).unwrap();
            co.store_fence(S);
            let mut back = vec![0u8; len + 16];
            r.copy_out(off - 8, &mut back).unwrap();
            assert_eq!(&back[8..8 + len], &src[..], "{} at {off}+{len}", co.name());
            assert!(back[..8].iter().all(|&b| b == 0), "{} wrote before {off}", co.name());
            assert!(back[8 + len..].iter().all(|&b| b == 0), "{} wrote past {off}+{len}", co.name());
        }
    }
}

#[test]
fn every_impl_writes_payloads_exactly_at_every_line_edge() {
    let m = Mapping::memfd(1 << 20, false).unwrap();
    let r = m.view();
    for co in impls() {
        for head in 0..64u64 {
            for len in [0usize, 1, 7, 8, 15, 16, 63, 64, 65, 127, 128, 129, 191, 256, 1000] {
                let off = 4096 + head;
                r.zero(off - 64, len as u64 + 128).unwrap();
                let src: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_add(head as u8) | 1).collect();
                co.write_payload(&r, off, &src, S).unwrap();
                co.store_fence(S);
                let mut back = vec![0u8; len + 128];
                r.copy_out(off - 64, &mut back).unwrap();
                let name = co.name();
                assert_eq!(&back[64..64 + len], &src[..], "{name} at {off}+{len}");
                assert!(back[..64].iter().all(|&b| b == 0), "{name} wrote before {off}");
                assert!(back[64 + len..].iter().all(|&b| b == 0), "{name} wrote past {off}+{len}");
            }
        }
    }
}

#[test]
fn the_default_is_the_cheapest_correct_mode_with_streaming_payloads() {
    let m = FlushMode::default_for_arch();
    assert_ne!(m, FlushMode::Coherent, "the default must be correct on non-coherent memory");
    assert!(m.available());
    #[cfg(target_arch = "x86_64")]
    {
        use super::x86::{has_clflushopt, has_clwb};
        let want = if has_clwb() && has_clflushopt() {
            FlushMode::Clwb
        } else if has_clflushopt() {
            FlushMode::Clflushopt
        } else {
            FlushMode::Clflush
        };
        assert_eq!(m, want);
        for mode in [FlushMode::Clflush, FlushMode::Clflushopt, FlushMode::Clwb] {
            assert!(PayloadStores::Auto.streaming(mode), "{mode:?}");
        }
        let co = Flush::new(m, PayloadStores::Auto.streaming(m)).unwrap();
        assert!(co.nt_payload() && co.name().ends_with("+nt"), "{}", co.name());
    }
    assert!(!PayloadStores::Auto.streaming(FlushMode::Coherent));
    assert!(!PayloadStores::Plain.streaming(m));
    assert!(crate::node::Options::default().payload == PayloadStores::Auto);
}

struct Solo<'a, C: Coherence> {
    store: &'a cxlkv_core::store::Store<C>,
    mgr: std::sync::Mutex<cxlkv_core::lock::Manager>,
    t: std::sync::Mutex<u64>,
}

impl<C: Coherence + Sync> NodeEnv for Solo<'_, C> {
    fn local_lock(&self, _: u32) -> cxlkv_core::Result<()> {
        Ok(())
    }
    fn local_unlock(&self, _: u32) {}
    fn wait(&self, i: u32) -> cxlkv_core::Result<()> {
        if i > 100_000 {
            return Err(cxlkv_core::Error::Timeout);
        }
        let now = {
            let mut t = self.t.lock().unwrap();
            *t += 1;
            *t
        };
        let cfg = cxlkv_core::lock::LeaseConfig { lease: 1 << 40, settle: 0, quarantine: 0 };
        self.mgr.lock().unwrap().step(self.store, now, cfg, &|_, _| Some(true)).map(|_| ())
    }
}

#[test]
fn every_impl_runs_the_whole_protocol() {
    for co in impls() {
        let m = Mapping::memfd(16 << 20, false).unwrap();
        let caps =
            Capacities { max_nodes: 2, n_stripes: 2, entries_per_stripe: 64, chunk_shift: 16, ..Capacities::default() };
        format(m.view(), &*co, caps, 5).unwrap();
        let store = attach(m.view(), &*co).unwrap();
        let id = attach_node(&store, None, Identity::default()).unwrap();
        let env = Solo { store: &store, mgr: std::sync::Mutex::new(cxlkv_core::lock::Manager::new(id)), t: 0.into() };
        let local = NodeLocal::default();
        let sut = Node::new(&store, id, &env, &local).unwrap();
        let keys: Vec<Key> = (1..=40u64).map(|i| Key { lo: i, hi: !i }).collect();
        for k in &keys {
            let h = sut.reserve(1, *k, 5000, 16).unwrap();
            sut.write(&h, 0, &vec![k.lo as u8; 5000]).unwrap();
            sut.publish_flushed(&[h], &mut [Ok(())]).unwrap();
        }
        assert_eq!(sut.lookup(1, &keys).unwrap(), 40, "{}", co.name());
        let mut buf = vec![0u8; 5000];
        for k in &keys {
            assert_eq!(sut.get(1, *k, &mut buf).unwrap(), 5000);
            assert!(buf.iter().all(|&b| b == k.lo as u8), "{}", co.name());
        }
        assert!(crate::node::check_store(&store).unwrap().is_empty(), "{}", co.name());
    }
}

#[test]
fn mode_names_parse_back() {
    for m in FlushMode::ALL {
        assert_eq!(m.name().parse::<FlushMode>().unwrap(), m);
    }
    assert!("bogus".parse::<FlushMode>().is_err());
    assert_eq!("auto".parse::<FlushMode>().unwrap(), FlushMode::default_for_arch());
    assert_eq!("default".parse::<FlushMode>().unwrap(), FlushMode::default_for_arch(), "the former name");
}
