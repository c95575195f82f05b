//! `cxlkv gpu-check`: checks and measures the GPU path on any x86-64 Linux
//! machine with an NVIDIA GPU and driver (it needs nothing else there).
//!
//! ```text
//! cxlkv gpu-check [--device N] [--mode clflush|clflushopt|clwb|coherent] [--quick]
//! ```
//!
//! Checks: round trips of random blocks through region and device (DMA both
//! ways, publish after completion, CPU and device reads), gather and scatter
//! against a CPU reference (aligned and unaligned pieces, more than one
//! launch), bad segments refused. Measures: H2D/D2H bandwidth from the
//! registered region (through the cxlkv path and raw) vs a pageable buffer vs
//! `cuMemAllocHost` memory, 16 KiB … 64 MiB; a 2 MiB block in 128 pieces by
//! one gather/scatter launch vs 128 async copies; registration time per GiB.
//!
//! Exit status: 0 every check passed, 1 a check failed, 2 CUDA unavailable.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use cxlkv_platform::gpu::{Cuda, CudaPath, DeviceBuffer, Segment};
use cxlkv_platform::kv::Capacities;
use cxlkv_platform::kv::Key;
use cxlkv_platform::{Error, FlushMode, Mapping, Node, Options, Region, Result};
use rand::rngs::SmallRng;
use rand::{Rng as _, RngCore, SeedableRng};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

struct Args {
    device: u32,
    mode: FlushMode,
    quick: bool,
}

/// Deterministic test data.
type Rng = SmallRng;

/// A number below `n` (0 when `n` is 0).
fn below(rng: &mut Rng, n: u64) -> u64 {
    rng.random_range(0..n.max(1))
}

/// `n` random bytes.
fn bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill_bytes(&mut v);
    v
}

/// Counts checks and prints failures.
#[derive(Default)]
struct Checks {
    passed: u32,
    failed: u32,
}

impl Checks {
    fn check(&mut self, what: &str, ok: bool) {
        if ok {
            self.passed += 1;
        } else {
            self.failed += 1;
            println!("  FAILED: {what}");
        }
    }
}

fn opts(mode: FlushMode) -> Options {
    Options { mode, local_dir: std::env::temp_dir(), lock_timeout: Duration::from_secs(30), ..Options::default() }
}

fn region(size: usize, chunk_shift: u32, mode: FlushMode) -> Result<Node> {
    let caps =
        Capacities { max_nodes: 2, n_stripes: 4, entries_per_stripe: 1024, chunk_shift, ..Capacities::default() };
    let attached = Node::format_new(Region::memfd(size as u64, false)?, caps, opts(mode))?;
    attached.prefault()?;
    Ok(attached)
}

fn key(i: u64) -> Key {
    Key { lo: i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1, hi: i }
}

fn run(a: &Args) -> Result<Checks> {
    let cuda = Cuda::open(a.device)?;
    println!("device {}: {} (flush mode {})", a.device, cuda.name(), a.mode.name());
    let mut c = Checks::default();
    correctness(a, &cuda, &mut c)?;
    println!("checks: {} passed, {} failed", c.passed, c.failed);
    bench(a, &cuda)?;
    Ok(c)
}

fn correctness(a: &Args, cuda: &Cuda, c: &mut Checks) -> Result<()> {
    let attached = region(256 * MIB, 21, a.mode)?;
    let path = attached.register_cuda(a.device)?;
    let st = path.stats();
    println!(
        "registered {} MiB in {} range(s) in {:.1} ms",
        st.registered_bytes >> 20,
        st.ranges.len(),
        st.register_seconds * 1e3
    );
    c.check("registered bytes = region", st.registered_bytes == attached.store().view.len());
    c.check("same device registers again", attached.register_cuda(a.device).is_ok());
    c.check(
        "another device is refused",
        matches!(
            attached.register_cuda(a.device + 1),
            Err(Error::Core(cxlkv_platform::kv::CoreError::InvalidArgument))
        ),
    );
    let stream = cuda.stream()?;
    let s = stream.raw();
    let dev_a = cuda.alloc(4 * MIB)?;
    let dev_b = cuda.alloc(4 * MIB)?;
    let pay = attached.store().layout.payload;
    let bad = [
        Segment { region_off: 0, device_ptr: dev_a.ptr(), len: 64 },
        Segment { region_off: pay.end - 64, device_ptr: dev_a.ptr(), len: 128 },
        Segment { region_off: u64::MAX - 8, device_ptr: dev_a.ptr(), len: 64 },
    ];
    for seg in bad {
        let refused = |r: Result<()>| matches!(r, Err(Error::Core(_)));
        c.check("metadata or out-of-region segment refused (DMA)", refused(path.to_device(&[seg], s)));
        c.check("metadata or out-of-region segment refused (scatter)", refused(path.scatter(&[seg], s)));
    }
    let null = Segment { region_off: pay.start, device_ptr: 0, len: 64 };
    c.check(
        "null device pointer refused",
        matches!(path.gather(&[null], s), Err(Error::Core(cxlkv_platform::kv::CoreError::InvalidArgument))),
    );
    let mut rng = Rng::seed_from_u64(0x5eed);
    round_trips(&attached, &path, &dev_a, &dev_b, s, &mut rng, c)?;
    gather_scatter(&attached, &path, cuda, s, &mut rng, c)?;
    let st = path.stats();
    println!(
        "moved {} KiB to devices, {} KiB into the region, {} copies, {} launches",
        st.bytes_to_device >> 10,
        st.bytes_to_region >> 10,
        st.copies,
        st.launches
    );
    c.check("region check clean", attached.check()?.is_empty());
    drop(stream);
    attached.close()
}

/// Random blocks: device → region by DMA, published after completion, read
/// back by the CPU and by DMA into another device buffer.
fn round_trips(
    attached: &Node,
    path: &CudaPath<'_>,
    dev_a: &DeviceBuffer,
    dev_b: &DeviceBuffer,
    s: usize,
    rng: &mut Rng,
    c: &mut Checks,
) -> Result<()> {
    let node = attached.core();
    for (i, len) in [4 * KIB, 16 * KIB + 3, 256 * KIB, 2 * MIB, 1, 2 * MIB - 17].into_iter().enumerate() {
        let k = key(i as u64);
        let data = bytes(rng, len);
        dev_a.upload(0, &data)?;
        let h = node.reserve(1, k, len as u64, 16)?;
        path.block_from_device(&h, dev_a.ptr(), s)?;
        let mut out = [Ok(())];
        path.publish_after(s, &[h], &mut out)?;
        c.check("publish after DMA", out[0].is_ok());
        let mut back = vec![0u8; len];
        c.check("CPU get length", node.get(1, k, &mut back)? == len);
        c.check(&format!("CPU sees the DMA-written block ({len} B)"), back == data);
        let mut acq = [Err(cxlkv_platform::kv::CoreError::NotFound)];
        node.acquire(1, &[k], &mut acq)?;
        let h2 = acq[0]?;
        dev_b.fill(0)?;
        path.block_to_device(&h2, dev_b.ptr(), s)?;
        path.synchronize(s)?;
        node.release(&[h2])?;
        let mut dev_back = vec![0u8; len];
        dev_b.download(0, &mut dev_back)?;
        c.check(&format!("device reads the block back ({len} B)"), dev_back == data);
    }
    Ok(())
}

/// Pieces of one slot each (so destinations never overlap): half 16-byte
/// aligned, half not. Returns (offset in block, offset in device buffer, len).
fn pieces(rng: &mut Rng, n: usize, slot: usize, dev_slot: usize) -> Vec<(usize, usize, usize)> {
    (0..n)
        .map(|i| {
            let aligned = i % 2 == 0;
            let mut start = below(rng, slot as u64 / 4) as usize;
            let mut len = 1 + below(rng, (slot - start) as u64 - 1) as usize;
            let mut dst = below(rng, (dev_slot - slot) as u64) as usize;
            if aligned {
                start &= !15;
                dst &= !15;
                len = (len & !15).max(16);
            }
            (i * slot + start, i * dev_slot + dst, len)
        })
        .collect()
}

fn gather_scatter(
    attached: &Node,
    path: &CudaPath<'_>,
    cuda: &Cuda,
    s: usize,
    rng: &mut Rng,
    c: &mut Checks,
) -> Result<()> {
    let node = attached.core();
    let block = 2 * MIB;
    for (round, n_pieces) in [128usize, 300].into_iter().enumerate() {
        let slot = (block / n_pieces) & !15;
        let dev_slot = slot * 2;
        let dev = cuda.alloc(n_pieces * dev_slot)?;
        // Gather: a published block's pieces into device memory.
        let data = bytes(rng, block);
        let k = key(100 + round as u64);
        let h = node.reserve(2, k, block as u64, 16)?;
        node.write(&h, 0, &data)?;
        node.publish_flushed(&[h], &mut [Ok(())])?;
        let mut acq = [Err(cxlkv_platform::kv::CoreError::NotFound)];
        node.acquire(2, &[k], &mut acq)?;
        let h = acq[0]?;
        let ps = pieces(rng, n_pieces, slot, dev_slot);
        let segs: Vec<Segment> = ps
            .iter()
            .map(|&(b, d, l)| Segment { region_off: h.off + b as u64, device_ptr: dev.ptr() + d as u64, len: l as u64 })
            .collect();
        dev.fill(0)?;
        path.gather(&segs, s)?;
        path.synchronize(s)?;
        node.release(&[h])?;
        let mut got = vec![0u8; dev.len()];
        dev.download(0, &mut got)?;
        let mut want = vec![0u8; dev.len()];
        for &(b, d, l) in &ps {
            want[d..d + l].copy_from_slice(&data[b..b + l]);
        }
        c.check(&format!("gather of {n_pieces} pieces matches the CPU reference"), got == want);

        // Scatter: device pieces into a reserved block, then published.
        let src = bytes(rng, dev.len());
        dev.upload(0, &src)?;
        let k2 = key(200 + round as u64);
        let h2 = node.reserve(2, k2, block as u64, 16)?;
        node.write(&h2, 0, &vec![0u8; block])?;
        let segs: Vec<Segment> = ps
            .iter()
            .map(|&(b, d, l)| Segment {
                region_off: h2.off + b as u64,
                device_ptr: dev.ptr() + d as u64,
                len: l as u64,
            })
            .collect();
        path.scatter(&segs, s)?;
        let mut out = [Ok(())];
        path.publish_after(s, &[h2], &mut out)?;
        c.check("publish after scatter", out[0].is_ok());
        let mut got = vec![0u8; block];
        node.get(2, k2, &mut got)?;
        let mut want = vec![0u8; block];
        for &(b, d, l) in &ps {
            want[b..b + l].copy_from_slice(&src[d..d + l]);
        }
        c.check(&format!("scatter of {n_pieces} pieces matches the CPU reference"), got == want);
    }
    Ok(())
}

/// Runs `f` `iters` times after one warm-up and returns seconds per run.
fn time(iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let t = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    Ok(t.elapsed().as_secs_f64() / iters as f64)
}

fn gbps(bytes: usize, secs: f64) -> String {
    format!("{:>8.2}", bytes as f64 / secs / 1e9)
}

fn bench(a: &Args, cuda: &Cuda) -> Result<()> {
    let reg_size = if a.quick { GIB } else { 4 * GIB };
    registration(cuda, reg_size)?;

    let attached = region(320 * MIB, 26, a.mode)?;
    let path = attached.register_cuda(a.device)?;
    let stream = cuda.stream()?;
    let s = stream.raw();
    let region = attached.store().view;
    let base_off = attached.store().layout.payload.start.next_multiple_of(MIB as u64);
    let max = 64 * MIB;
    let dev = cuda.alloc(max)?;
    let pinned = cuda.alloc_host(max)?;
    let mut pageable = vec![1u8; max];
    let host_region = region.ptr(base_off, max as u64, 64)?;
    let budget = if a.quick { 128 * MIB } else { 1024 * MIB };

    println!();
    println!("H2D / D2H bandwidth, GB/s (one stream, back-to-back copies, flush mode {})", a.mode.name());
    println!(
        "{:>8} | {:>8} {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} {:>8}",
        "size", "path", "region", "pageable", "pinned", "path", "region", "pageable", "pinned"
    );
    println!("{:>8} | {:^35} | {:^35}", "", "host -> device", "device -> host");
    for size in [16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB] {
        let iters = (budget / size).clamp(4, 4000);
        let seg = [Segment { region_off: base_off, device_ptr: dev.ptr(), len: size as u64 }];
        let sync = || cuda.synchronize(s);
        let h2d_path = time(iters, || path.to_device(&seg, s).and_then(|_| sync()))?;
        // SAFETY: the registered region range, device buffer and pageable and
        // pinned buffers all hold `size` bytes and outlive the synchronised copy.
        let h2d_region =
            time(iters, || unsafe { cuda.copy_to_device(dev.ptr(), host_region, size, s) }.and_then(|_| sync()))?;
        // SAFETY: as above.
        let h2d_page =
            time(iters, || unsafe { cuda.copy_to_device(dev.ptr(), pageable.as_ptr(), size, s) }.and_then(|_| sync()))?;
        // SAFETY: as above.
        let h2d_pin =
            time(iters, || unsafe { cuda.copy_to_device(dev.ptr(), pinned.ptr(), size, s) }.and_then(|_| sync()))?;
        let d2h_path = time(iters, || path.from_device(&seg, s).and_then(|_| sync()))?;
        // SAFETY: as above.
        let d2h_region =
            time(iters, || unsafe { cuda.copy_to_host(host_region, dev.ptr(), size, s) }.and_then(|_| sync()))?;
        let pp = pageable.as_mut_ptr();
        // SAFETY: as above.
        let d2h_page = time(iters, || unsafe { cuda.copy_to_host(pp, dev.ptr(), size, s) }.and_then(|_| sync()))?;
        // SAFETY: as above.
        let d2h_pin =
            time(iters, || unsafe { cuda.copy_to_host(pinned.ptr(), dev.ptr(), size, s) }.and_then(|_| sync()))?;
        println!(
            "{:>8} | {} {} {} {} | {} {} {} {}",
            human(size),
            gbps(size, h2d_path),
            gbps(size, h2d_region),
            gbps(size, h2d_page),
            gbps(size, h2d_pin),
            gbps(size, d2h_path),
            gbps(size, d2h_region),
            gbps(size, d2h_page),
            gbps(size, d2h_pin),
        );
    }
    println!("  path = the cxlkv API (H2D: invalidate, then DMA; D2H: DMA); region = raw DMA on the registered region");

    block_pieces(a, cuda, &path, &attached, Block { stream: s, base_off, dev_ptr: dev.ptr(), host_region })?;
    drop(pinned);
    drop(dev);
    drop(stream);
    attached.close()
}

/// Where the bench's 2 MiB block lies: its stream, its place in the
/// registered region (offset and pointer) and on the device.
struct Block {
    stream: usize,
    base_off: u64,
    dev_ptr: u64,
    host_region: *mut u8,
}

/// A 2 MiB block moved as 128 scattered pieces (one kernel launch against
/// 128 copies) beside one contiguous DMA and a host invalidation.
fn block_pieces(a: &Args, cuda: &Cuda, path: &CudaPath<'_>, attached: &Node, at: Block) -> Result<()> {
    // A 2 MiB block in 128 pieces of 16 KiB, each to its own device page.
    let pieces = 128;
    let piece = 2 * MIB / pieces;
    let segs: Vec<Segment> = (0..pieces)
        .map(|i| {
            let page = (i * 37) % pieces;
            Segment {
                region_off: at.base_off + (i * piece) as u64,
                device_ptr: at.dev_ptr + (page * 4 * piece) as u64,
                len: piece as u64,
            }
        })
        .collect();
    let iters = if a.quick { 50 } else { 500 };
    let sync = || cuda.synchronize(at.stream);
    let g = time(iters, || path.gather(&segs, at.stream).and_then(|_| sync()))?;
    let g_copies = time(iters, || path.to_device(&segs, at.stream).and_then(|_| sync()))?;
    let sc = time(iters, || path.scatter(&segs, at.stream).and_then(|_| sync()))?;
    let sc_copies = time(iters, || path.from_device(&segs, at.stream).and_then(|_| sync()))?;
    let whole = [Segment { region_off: at.base_off, device_ptr: at.dev_ptr, len: 2 * MIB as u64 }];
    let contiguous = time(iters, || {
        // SAFETY: the registered region range and the device buffer hold
        // 2 MiB and outlive the synchronised copy (the caller's).
        unsafe { cuda.copy_to_device(at.dev_ptr, at.host_region, 2 * MIB, at.stream) }.and_then(|_| sync())
    })?;
    let contiguous_path = time(iters, || path.to_device(&whole, at.stream).and_then(|_| sync()))?;
    let inval = time(iters, || attached.invalidate_range(at.base_off, 2 * MIB as u64))?;
    println!();
    println!("2 MiB block in {pieces} pieces of {} KiB (scattered device pages), per block", piece / KIB);
    println!("{:>28} | {:>10} {:>8}", "", "us", "GB/s");
    for (what, t) in [
        ("gather: one kernel launch", g),
        ("gather: 128 async copies", g_copies),
        ("scatter: one kernel launch", sc),
        ("scatter: 128 async copies", sc_copies),
        ("one contiguous DMA (raw)", contiguous),
        ("one contiguous DMA (path)", contiguous_path),
        ("invalidate 2 MiB (host)", inval),
    ] {
        println!("{what:>28} | {:>10.1} {}", t * 1e6, gbps(2 * MIB, t));
    }
    Ok(())
}

fn registration(cuda: &Cuda, size: usize) -> Result<()> {
    let map = Mapping::memfd(size as u64, false)?;
    map.prefault()?;
    let region = map.view();
    let t = Instant::now();
    // SAFETY: `map` stays mapped until after `reg` is dropped below.
    let reg = unsafe { cuda.register(region.base(), size, cxlkv_platform::gpu::REGISTER_CHUNK) }?;
    let reg_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    drop(reg);
    let unreg_s = t.elapsed().as_secs_f64();
    let gib = size as f64 / GIB as f64;
    println!();
    println!(
        "registration of {} (prefaulted memfd, 1 GiB chunks): register {:.1} ms/GiB, unregister {:.1} ms/GiB",
        human(size),
        reg_s * 1e3 / gib,
        unreg_s * 1e3 / gib
    );
    drop(map);
    Ok(())
}

fn human(n: usize) -> String {
    if n >= GIB {
        format!("{} GiB", n / GIB)
    } else if n >= MIB {
        format!("{} MiB", n / MIB)
    } else {
        format!("{} KiB", n / KIB)
    }
}

/// Runs `cxlkv gpu-check`: on device `device`, cache maintenance `mode`,
/// `quick` for fewer sizes and repetitions.
pub fn main(device: u32, mode: FlushMode, quick: bool) -> ExitCode {
    match run(&Args { device, mode, quick }) {
        Ok(c) if c.failed == 0 => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(Error::CudaUnavailable(why)) => {
            println!("CUDA unavailable: {why}");
            ExitCode::from(2)
        }
        Err(e) => {
            println!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
