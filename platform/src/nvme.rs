// Bytes from drives and the network are parsed here: no indexing, slicing or
// arithmetic that can panic, no unwrap (as in core; relaxed in tests).
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::arithmetic_side_effects, clippy::unwrap_used, clippy::expect_used)
)]
//! NVMe I/O for the SSD tier: batches of aligned reads and writes on
//! `O_DIRECT` files, through io_uring (one ring per tier thread, the batch
//! in flight at once, buffers registered as fixed buffers when the memlock
//! limit allows) or, where io_uring is refused (containers often block it)
//! or `CXLKV_TIER_URING=off` is set, through a pool of threads doing
//! `pread`/`pwrite`.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

/// Most operations a batch puts in flight at once.
pub const QUEUE_DEPTH: u32 = 64;
/// Largest buffer registered as one fixed buffer.
const FIXED_MAX: usize = 1 << 30;

/// One read or write of a batch.
pub struct Op<'a> {
    /// The file (opened with `O_DIRECT`).
    pub file: &'a File,
    /// Its offset (aligned).
    pub offset: u64,
    /// The buffer: its address and length aligned for `O_DIRECT`; read into
    /// or written from.
    pub buf: *mut u8,
    /// Bytes.
    pub len: usize,
    /// A write (else a read).
    pub write: bool,
}

// SAFETY: an `Op` names a buffer the caller keeps alive and does not touch
// until the batch returns; only the I/O thread that runs it uses the pointer.
unsafe impl Send for Op<'_> {}
// SAFETY: as above; shared references to an `Op` only read its fields.
unsafe impl Sync for Op<'_> {}

/// Which engine runs batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// io_uring, with registered buffers or without.
    Uring {
        /// The buffers are registered (fixed buffers).
        fixed: bool,
    },
    /// `pread`/`pwrite` on a pool of threads.
    Threads,
}

/// Runs batches of operations.
pub struct Io {
    ring: Option<io_uring::IoUring>,
    /// Registered buffers: (address, length), by index.
    fixed: Vec<(usize, usize)>,
}

impl Io {
    /// An engine for buffers `bufs` (registered when possible): io_uring
    /// unless it is refused or `CXLKV_TIER_URING=off`.
    pub fn new(bufs: &[(*mut u8, usize)]) -> Io {
        let off = std::env::var("CXLKV_TIER_URING").is_ok_and(|v| v == "off" || v == "0");
        let ring = if off { None } else { io_uring::IoUring::new(QUEUE_DEPTH * 2).ok() };
        let mut io = Io { ring, fixed: Vec::new() };
        io.register(bufs);
        io
    }

    /// Registers `bufs` (in place of what was registered) as fixed buffers,
    /// each cut into pieces of at most 1 GiB; false when io_uring or the
    /// memlock limit refuses, and then nothing is registered. The caller
    /// keeps the memory alive as long as this engine.
    pub fn register(&mut self, bufs: &[(*mut u8, usize)]) -> bool {
        let Some(ring) = &self.ring else { return false };
        if !self.fixed.is_empty() {
            let _ = ring.submitter().unregister_buffers();
            self.fixed.clear();
        }
        let mut iov = Vec::new();
        for &(p, len) in bufs {
            let mut at = 0;
            while at < len {
                let n = len.saturating_sub(at).min(FIXED_MAX);
                // Inside the caller's buffer (`at < len`).
                iov.push(libc::iovec { iov_base: p.wrapping_add(at).cast(), iov_len: n });
                at = at.saturating_add(n);
            }
        }
        if iov.is_empty() || iov.len() > u16::MAX as usize {
            return false;
        }
        // SAFETY: every iovec names memory the caller keeps alive as long as
        // this engine (the tier's buffers and the region's mapping, both
        // dropped after it).
        if unsafe { ring.submitter().register_buffers(&iov) }.is_err() {
            return false;
        }
        self.fixed = iov.iter().map(|v| (v.iov_base as usize, v.iov_len)).collect();
        true
    }

    /// Bytes registered as fixed buffers.
    pub fn registered(&self) -> u64 {
        self.fixed.iter().map(|&(_, l)| l as u64).sum()
    }

    /// The engine in use.
    pub fn engine(&self) -> Engine {
        match self.ring {
            Some(_) => Engine::Uring { fixed: !self.fixed.is_empty() },
            None => Engine::Threads,
        }
    }

    /// Runs every operation of `ops`, up to [`QUEUE_DEPTH`] in flight at
    /// once; `out[i]` is operation `i`'s result: its bytes, or the OS error.
    /// A short transfer is an error (`UnexpectedEof`).
    pub fn run(&mut self, ops: &[Op<'_>], out: &mut [std::io::Result<usize>]) {
        let mut b = self.batch();
        for op in ops {
            b.push(Op { ..*op });
        }
        for (o, r) in out.iter_mut().zip(b.finish()) {
            *o = r;
        }
    }

    /// A batch of operations started as they are pushed (io_uring) and
    /// handed back as they complete.
    pub fn batch<'a>(&mut self) -> Batch<'_, 'a> {
        Batch {
            io: self,
            waiting: Vec::new(),
            lens: Vec::new(),
            done: Vec::new(),
            flying: Vec::new(),
            ready: Default::default(),
            in_flight: 0,
        }
    }
}

impl Clone for Op<'_> {
    fn clone(&self) -> Self {
        Op { ..*self }
    }
}

/// Operations in flight: pushed one at a time, started at once on io_uring
/// (at most [`QUEUE_DEPTH`] in flight; a push past that first waits for
/// one to complete), run together on the thread pool when a result is first
/// asked for. Dropping a batch waits for what is in flight, so no buffer
/// it names is freed while a device still writes it.
pub struct Batch<'io, 'a> {
    io: &'io mut Io,
    /// Operations the thread pool has not run yet, with their indices.
    waiting: Vec<(usize, Op<'a>)>,
    lens: Vec<usize>,
    /// Results not yet handed out, by index.
    done: Vec<Option<std::io::Result<usize>>>,
    /// In flight on the ring, by index.
    flying: Vec<bool>,
    /// Indices completed and not yet handed out, in completion order.
    ready: std::collections::VecDeque<usize>,
    in_flight: usize,
}

impl<'a> Batch<'_, 'a> {
    /// Starts `op` (the buffer it names stays alive and untouched until the
    /// batch hands back its result or is dropped); returns its index.
    pub fn push(&mut self, op: Op<'a>) -> usize {
        let i = self.lens.len();
        self.lens.push(op.len);
        self.done.push(None);
        self.flying.push(false);
        if self.io.ring.is_none() {
            self.waiting.push((i, op));
            if self.waiting.len() >= QUEUE_DEPTH as usize {
                self.run_waiting();
            }
            return i;
        }
        while self.in_flight >= QUEUE_DEPTH as usize {
            if !self.reap(1) {
                break;
            }
        }
        self.submit(i, &op);
        i
    }

    /// The next completed operation, waiting for one if none has; `None`
    /// when every operation pushed has been handed back.
    pub fn wait_one(&mut self) -> Option<(usize, std::io::Result<usize>)> {
        let i = loop {
            if let Some(i) = self.ready.pop_front() {
                break i;
            }
            if !self.waiting.is_empty() {
                self.run_waiting();
            } else if self.in_flight > 0 {
                self.reap(1);
            } else {
                return None;
            }
        };
        let r = self.done.get_mut(i).and_then(Option::take).unwrap_or(Ok(0));
        let want = self.lens.get(i).copied().unwrap_or(0);
        Some((
            i,
            match r {
                Ok(n) if n != want => Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "short transfer")),
                r => r,
            },
        ))
    }

    /// Waits for every operation; the results by index.
    pub fn finish(mut self) -> Vec<std::io::Result<usize>> {
        let mut out: Vec<std::io::Result<usize>> = (0..self.lens.len()).map(|_| Ok(0)).collect();
        while let Some((i, r)) = self.wait_one() {
            if let Some(o) = out.get_mut(i) {
                *o = r;
            }
        }
        out
    }

    fn complete(&mut self, i: usize, r: std::io::Result<usize>) {
        if let (Some(d), Some(f)) = (self.done.get_mut(i), self.flying.get_mut(i)) {
            *d = Some(r);
            *f = false;
            self.ready.push_back(i);
        }
    }

    fn run_waiting(&mut self) {
        let waiting = std::mem::take(&mut self.waiting);
        let ops: Vec<Op<'a>> = waiting.iter().map(|(_, op)| op.clone()).collect();
        let mut out: Vec<std::io::Result<usize>> = (0..ops.len()).map(|_| Ok(0)).collect();
        run_threads(&ops, &mut out);
        for ((i, _), r) in waiting.into_iter().zip(out) {
            self.complete(i, r);
        }
    }

    fn submit(&mut self, i: usize, op: &Op<'_>) {
        use io_uring::{opcode, types};
        let fixed = self.io.fixed.iter().position(|&(a, l)| {
            let p = op.buf as usize;
            p >= a && p.saturating_add(op.len) <= a.saturating_add(l)
        });
        let Some(ring) = self.io.ring.as_mut() else { return };
        let fd = types::Fd(op.file.as_raw_fd());
        let len = op.len as u32;
        let e = match (op.write, fixed) {
            (true, Some(b)) => opcode::WriteFixed::new(fd, op.buf, len, b as u16).offset(op.offset).build(),
            (false, Some(b)) => opcode::ReadFixed::new(fd, op.buf, len, b as u16).offset(op.offset).build(),
            (true, None) => opcode::Write::new(fd, op.buf, len).offset(op.offset).build(),
            (false, None) => opcode::Read::new(fd, op.buf, len).offset(op.offset).build(),
        };
        // SAFETY: the entry names a buffer and file the caller keeps alive
        // and untouched until the batch hands back this operation's result
        // or is dropped, both after it completed (`Drop` waits).
        if unsafe { ring.submission().push(&e.user_data(i as u64)) }.is_err() {
            return self.complete(i, Err(std::io::Error::other("submission queue full")));
        }
        self.in_flight = self.in_flight.saturating_add(1);
        if let Some(f) = self.flying.get_mut(i) {
            *f = true;
        }
        loop {
            match ring.submit() {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return self.fail(e),
                Ok(_) => return,
            }
        }
    }

    /// Waits for at least `want` completions (fewer if fewer are in
    /// flight) and collects every completion there is; false when the ring
    /// failed.
    fn reap(&mut self, want: usize) -> bool {
        let Some(ring) = self.io.ring.as_mut() else { return false };
        let want = want.min(self.in_flight);
        if let Err(e) = ring.submit_and_wait(want) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                self.fail(e);
                return false;
            }
        }
        let got: Vec<(usize, i32)> = ring.completion().map(|c| (c.user_data() as usize, c.result())).collect();
        for (i, res) in got {
            // One given up on when the ring failed is not handed out twice.
            if !self.flying.get(i).copied().unwrap_or(false) {
                continue;
            }
            self.in_flight = self.in_flight.saturating_sub(1);
            let r =
                if res < 0 { Err(std::io::Error::from_raw_os_error(res.saturating_neg())) } else { Ok(res as usize) };
            self.complete(i, r);
        }
        true
    }

    /// The ring failed: what did not complete is not known to have run, and
    /// is reported failed; nothing more is waited for (the ring, which may
    /// still hold the buffers, lives as long as the tier's buffers do).
    fn fail(&mut self, e: std::io::Error) {
        for i in 0..self.done.len() {
            if self.flying.get(i).copied().unwrap_or(false) {
                self.complete(i, Err(std::io::Error::new(e.kind(), e.to_string())));
            }
        }
        self.in_flight = 0;
    }
}

impl Drop for Batch<'_, '_> {
    fn drop(&mut self) {
        while self.in_flight > 0 && self.reap(self.in_flight) {}
    }
}

/// The thread-pool engine: the batch split over up to eight threads.
fn run_threads(ops: &[Op<'_>], out: &mut [std::io::Result<usize>]) {
    let per = ops.len().div_ceil(8).max(1);
    std::thread::scope(|s| {
        for (ops, out) in ops.chunks(per).zip(out.chunks_mut(per)) {
            s.spawn(move || {
                for (op, o) in ops.iter().zip(out.iter_mut()) {
                    *o = if op.write {
                        // SAFETY: `buf` is valid for `len` bytes and not
                        // written while the batch runs (the `Op` contract).
                        let b = unsafe { std::slice::from_raw_parts(op.buf, op.len) };
                        op.file.write_at(b, op.offset)
                    } else {
                        // SAFETY: `buf` is valid for `len` bytes and used by
                        // nothing else while the batch runs.
                        let b = unsafe { std::slice::from_raw_parts_mut(op.buf, op.len) };
                        op.file.read_at(b, op.offset)
                    };
                }
            });
        }
    });
}
