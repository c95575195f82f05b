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

/// Copies `src` to `dst` with non-temporal stores where aligned (8-byte
/// `movnti`), plain stores at the unaligned edges, which are then flushed.
///
/// # Safety
/// - `dst..dst+src.len()` is mapped, writable, and not read or written by
///   anyone else during the copy;
/// - `src` does not overlap it.
pub unsafe fn nt_copy(dst: *mut u8, src: &[u8]) {
    let n = src.len();
    let head = (dst as usize).wrapping_neg() & 7;
    let head = head.min(n);
    // SAFETY: `dst..dst+head` is within the caller's range; no overlap.
    unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), dst, head) };
    let mut i = head;
    while i + 8 <= n {
        let mut w = [0u8; 8];
        w.copy_from_slice(&src[i..i + 8]);
        let v = u64::from_ne_bytes(w);
        let a = dst.wrapping_add(i);
        // SAFETY: `a` is 8-aligned (after the head) and `a..a+8` is within the
        // caller's range.
        unsafe { asm!("movnti [{}], {}", in(reg) a, in(reg) v, options(nostack, preserves_flags)) };
        i += 8;
    }
    // SAFETY: the tail `dst+i..dst+n` is within the caller's range.
    unsafe { core::ptr::copy_nonoverlapping(src[i..].as_ptr(), dst.wrapping_add(i), n - i) };
    if head > 0 {
        clflush_lines((dst as usize & !(LINE - 1)) as *mut u8, 1);
    }
    if i < n {
        clflush_lines((dst.wrapping_add(i) as usize & !(LINE - 1)) as *mut u8, 1);
    }
}
