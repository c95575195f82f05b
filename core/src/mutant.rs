//! Logic mutants: named places where a build made for the mutant check
//! (`RUSTFLAGS="--cfg cxlkv_mutants"`, `tests/logic-mutants.sh`) can break
//! one rule of the protocol on purpose — skip a re-validation, grant a held
//! lock, forget a repair — to show the proof harness notices. In every other
//! build `mutant!` is the constant `false`, and the library carries no trace
//! of it.
//!
//! A place where breaking the rule could change no outcome (an equivalent
//! mutant) has no switch; the reason is written where the switch would be.

/// True when the build is the mutant check's and `$name` is the mutant
/// switched on (see [`set`]).
macro_rules! mutant {
    ($name:literal) => {
        $crate::mutant::on($name)
    };
}
pub(crate) use mutant;

#[cfg(cxlkv_mutants)]
static ACTIVE: spin::Mutex<Option<&'static str>> = spin::Mutex::new(None);

/// Switches mutant `name` on (`None`: every one off). Only in the mutant
/// check's build.
#[cfg(cxlkv_mutants)]
pub fn set(name: Option<&'static str>) {
    *ACTIVE.lock() = name;
}

/// True when mutant `name` is on.
#[cfg(cxlkv_mutants)]
pub fn on(name: &str) -> bool {
    *ACTIVE.lock() == Some(name)
}

/// Always false outside the mutant check's build.
#[cfg(not(cxlkv_mutants))]
#[inline(always)]
pub const fn on(_name: &str) -> bool {
    false
}
