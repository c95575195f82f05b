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
        if let Some(ring) = &io.ring {
            let mut iov = Vec::new();
            for &(p, len) in bufs {
                let mut at = 0;
                while at < len {
                    let n = (len - at).min(FIXED_MAX);
                    // Inside the caller's buffer (`at < len`).
                    iov.push(libc::iovec { iov_base: p.wrapping_add(at).cast(), iov_len: n });
                    at += n;
                }
            }
            // SAFETY: every iovec names memory the caller keeps alive as long
            // as this engine (the tier's buffers, dropped after it).
            let r = unsafe { ring.submitter().register_buffers(&iov) };
            if r.is_ok() && iov.len() <= u16::MAX as usize {
                io.fixed = iov.iter().map(|v| (v.iov_base as usize, v.iov_len)).collect();
            }
        }
        io
    }

    /// The engine in use.
    pub fn engine(&self) -> Engine {
        match self.ring {
            Some(_) => Engine::Uring { fixed: !self.fixed.is_empty() },
            None => Engine::Threads,
        }
    }

    /// Runs every operation of `ops`, the whole batch in flight at once (at
    /// most [`QUEUE_DEPTH`]); `out[i]` is operation `i`'s result: its bytes,
    /// or the OS error. A short transfer is an error (`UnexpectedEof`).
    pub fn run(&mut self, ops: &[Op<'_>], out: &mut [std::io::Result<usize>]) {
        match &mut self.ring {
            Some(_) => {
                for (ops, out) in ops.chunks(QUEUE_DEPTH as usize).zip(out.chunks_mut(QUEUE_DEPTH as usize)) {
                    self.run_uring(ops, out);
                }
            }
            None => run_threads(ops, out),
        }
        for (op, r) in ops.iter().zip(out.iter_mut()) {
            if matches!(r, Ok(n) if *n != op.len) {
                *r = Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "short transfer"));
            }
        }
    }

    fn run_uring(&mut self, ops: &[Op<'_>], out: &mut [std::io::Result<usize>]) {
        use io_uring::{opcode, types};
        let Some(ring) = self.ring.as_mut() else { return run_threads(ops, out) };
        let mut pushed = 0usize;
        for (i, op) in ops.iter().enumerate() {
            let fd = types::Fd(op.file.as_raw_fd());
            let len = op.len as u32;
            let fixed = self.fixed.iter().position(|&(a, l)| {
                let p = op.buf as usize;
                p >= a && p.saturating_add(op.len) <= a + l
            });
            let e = match (op.write, fixed) {
                (true, Some(b)) => opcode::WriteFixed::new(fd, op.buf, len, b as u16).offset(op.offset).build(),
                (false, Some(b)) => opcode::ReadFixed::new(fd, op.buf, len, b as u16).offset(op.offset).build(),
                (true, None) => opcode::Write::new(fd, op.buf, len).offset(op.offset).build(),
                (false, None) => opcode::Read::new(fd, op.buf, len).offset(op.offset).build(),
            };
            // SAFETY: the entry names a buffer and file the caller keeps
            // alive until this call returns, which is after every entry
            // pushed here completed (waited for below).
            if unsafe { ring.submission().push(&e.user_data(i as u64)) }.is_err() {
                out[i] = Err(std::io::Error::other("submission queue full"));
                continue;
            }
            pushed += 1;
        }
        let mut done = 0usize;
        while done < pushed {
            if let Err(e) = ring.submit_and_wait(pushed - done) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                // The ring failed: what did not complete is not known to
                // have run; wait for nothing more (the kernel still holds
                // the buffers, so the ring is dropped only after them).
                for o in out.iter_mut().take(ops.len()) {
                    if matches!(o, Ok(0)) {
                        *o = Err(std::io::Error::new(e.kind(), e.to_string()));
                    }
                }
                return;
            }
            for c in ring.completion() {
                let i = c.user_data() as usize;
                if let Some(o) = out.get_mut(i) {
                    *o = if c.result() < 0 {
                        Err(std::io::Error::from_raw_os_error(-c.result()))
                    } else {
                        Ok(c.result() as usize)
                    };
                }
                done += 1;
            }
        }
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
