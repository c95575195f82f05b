//! x86-64 cache-line maintenance and non-temporal stores.

use core::arch::asm;
use core::arch::x86_64::__cpuid_count;

const LINE: usize = 64;

/// CPUID.(EAX=7,ECX=0):EBX bit 23.
pub fn has_clflushopt() -> bool {
    __cpuid_count(7, 0).ebx & (1 << 23) != 0
}

/// CPUID.(EAX=7,ECX=0):EBX bit 24.
pub fn has_clwb() -> bool {
    __cpuid_count(7, 0).ebx & (1 << 24) != 0
}

/// `mfence`.
#[inline]
pub fn mfence() {
    // SAFETY: a barrier; no memory operands.
    unsafe { asm!("mfence", options(nostack, preserves_flags)) };
}

/// `sfence`.
#[inline]
pub fn sfence() {
    // SAFETY: a barrier; no memory operands.
    unsafe { asm!("sfence", options(nostack, preserves_flags)) };
}

/// A hint to load the line at `p` into every cache level.
#[inline]
pub fn prefetch(p: *mut u8) {
    // SAFETY: a prefetch never faults, whatever the address.
    unsafe { asm!("prefetcht0 [{}]", in(reg) p, options(nostack, preserves_flags, readonly)) };
}

/// `clflush` of `n` lines from `p` (caller checked the range is mapped).
#[inline]
pub fn clflush_lines(p: *mut u8, n: usize) {
    for i in 0..n {
        let a = p.wrapping_add(i * LINE);
        // SAFETY: `a` is inside a mapped range (checked by the caller's bounds
        // check); clflush reads no data and faults only on unmapped memory.
        unsafe { asm!("clflush [{}]", in(reg) a, options(nostack, preserves_flags)) };
    }
}

/// `clflushopt` of `n` lines (ordered by a later `sfence`/`mfence`).
#[inline]
pub fn clflushopt_lines(p: *mut u8, n: usize) {
    for i in 0..n {
        let a = p.wrapping_add(i * LINE);
        // SAFETY: as for clflush; the mode is only chosen when CPUID reports it.
        unsafe { asm!("clflushopt [{}]", in(reg) a, options(nostack, preserves_flags)) };
    }
}

/// `clwb` of `n` lines (ordered by a later `sfence`).
#[inline]
pub fn clwb_lines(p: *mut u8, n: usize) {
    for i in 0..n {
        let a = p.wrapping_add(i * LINE);
        // SAFETY: as for clflush; the mode is only chosen when CPUID reports it.
        unsafe { asm!("clwb [{}]", in(reg) a, options(nostack, preserves_flags)) };
    }
}

/// Copies `src` to `dst` with non-temporal stores: every whole line of the
/// destination by streaming stores ([`stream_lines`]), so the copy leaves no dirty line in this host's caches
/// and a line already cached here is evicted (Intel SDM vol. 1, 10.4.6.2);
/// the partial lines at either edge by plain stores, then written back with
/// `clflush`. Visible to other hosts after the caller's next `sfence` or
/// `mfence`, which also orders the streaming stores.
///
/// # Safety
/// - `dst..dst+src.len()` is mapped, writable, and not read or written by
///   anyone else during the copy;
/// - `src` does not overlap it.
pub unsafe fn nt_copy(dst: *mut u8, src: &[u8]) {
    let n = src.len();
    let head = ((dst as usize).wrapping_neg() & (LINE - 1)).min(n);
    let body = (n - head) & !(LINE - 1);
    // SAFETY: `dst..dst+head` is within the caller's range; no overlap.
    unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), dst, head) };
    // SAFETY: `dst+head` is line-aligned and `body` bytes from it lie in the
    // caller's range; `src[head..head+body]` is readable and disjoint from it.
    unsafe { stream_lines(dst.wrapping_add(head), src[head..head + body].as_ptr(), body / LINE) };
    let i = head + body;
    // SAFETY: the tail `dst+i..dst+n` is within the caller's range.
    unsafe { core::ptr::copy_nonoverlapping(src[i..].as_ptr(), dst.wrapping_add(i), n - i) };
    if head > 0 {
        clflush_lines((dst as usize & !(LINE - 1)) as *mut u8, 1);
    }
    if i < n {
        clflush_lines((dst.wrapping_add(i) as usize & !(LINE - 1)) as *mut u8, 1);
    }
}

/// Streams `lines` whole lines from `src` (any alignment) to `dst`: one
/// 64-byte store a line with AVX-512, two with AVX, four 16-byte stores
/// (`movntdq`, SSE2: every x86-64 has it) otherwise. A line written whole by
/// streaming stores leaves the write-combining buffer as one full-line write.
///
/// # Safety
/// - `dst` is 64-byte aligned; `dst..dst+64*lines` is mapped, writable and
///   written by no one else meanwhile;
/// - `src..src+64*lines` is readable and does not overlap it.
unsafe fn stream_lines(dst: *mut u8, src: *const u8, lines: usize) {
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked above); the caller's contract.
        return unsafe { stream_lines_avx512(dst, src, lines) };
    }
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX (checked above); the caller's contract.
        return unsafe { stream_lines_avx(dst, src, lines) };
    }
    use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    for l in 0..lines {
        for k in 0..4 {
            let at = l * LINE + 16 * k;
            // SAFETY: `at..at+16` is inside the source range (caller); an
            // unaligned load; SSE2 is part of x86-64.
            let v = unsafe { _mm_loadu_si128(src.wrapping_add(at).cast::<__m128i>()) };
            // SAFETY: `at..at+16` is inside the destination range (caller);
            // the store is 16-byte aligned (`dst` is line-aligned).
            unsafe { _mm_stream_si128(dst.wrapping_add(at).cast(), v) };
        }
    }
}

/// [`stream_lines`] with 64-byte stores.
///
/// # Safety
/// As [`stream_lines`], on a CPU with AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn stream_lines_avx512(dst: *mut u8, src: *const u8, lines: usize) {
    use core::arch::x86_64::{_mm512_loadu_si512, _mm512_stream_si512};
    for l in 0..lines {
        let at = l * LINE;
        // SAFETY: `at..at+64` is inside the source range (caller); an
        // unaligned load.
        let v = unsafe { _mm512_loadu_si512(src.wrapping_add(at).cast()) };
        // SAFETY: `at..at+64` is inside the destination range (caller); the
        // store is line-aligned, as `vmovntdq zmm` requires.
        unsafe { _mm512_stream_si512(dst.wrapping_add(at).cast(), v) };
    }
}

/// [`stream_lines`] with 32-byte stores.
///
/// # Safety
/// As [`stream_lines`], on a CPU with AVX.
#[target_feature(enable = "avx")]
unsafe fn stream_lines_avx(dst: *mut u8, src: *const u8, lines: usize) {
    use core::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256};
    for l in 0..lines {
        for k in 0..2 {
            let at = l * LINE + 32 * k;
            // SAFETY: `at..at+32` is inside the source range (caller); an
            // unaligned load.
            let v = unsafe { _mm256_loadu_si256(src.wrapping_add(at).cast::<__m256i>()) };
            // SAFETY: `at..at+32` is inside the destination range (caller);
            // the store is 32-byte aligned (`dst` is line-aligned), as
            // `vmovntdq ymm` requires.
            unsafe { _mm256_stream_si256(dst.wrapping_add(at).cast(), v) };
        }
    }
}
