//! aarch64 cache maintenance: `dc cvac` (clean to the point of coherence),
//! `dc civac` (clean and invalidate), `dsb sy`.

use core::arch::asm;

const LINE: usize = 64;

/// `dc cvac` of `n` lines.
pub fn clean_lines(p: *mut u8, n: usize) {
    for i in 0..n {
        let a = p.wrapping_add(i * LINE);
        // SAFETY: `a` is inside a mapped range checked by the caller.
        unsafe { asm!("dc cvac, {}", in(reg) a, options(nostack, preserves_flags)) };
    }
    dsb_sy();
}

/// `dc civac` of `n` lines.
pub fn clean_invalidate_lines(p: *mut u8, n: usize) {
    for i in 0..n {
        let a = p.wrapping_add(i * LINE);
        // SAFETY: `a` is inside a mapped range checked by the caller.
        unsafe { asm!("dc civac, {}", in(reg) a, options(nostack, preserves_flags)) };
    }
    dsb_sy();
}

/// `dsb sy`.
pub fn dsb_sy() {
    // SAFETY: a barrier; no memory operands.
    unsafe { asm!("dsb sy", options(nostack, preserves_flags)) };
}
