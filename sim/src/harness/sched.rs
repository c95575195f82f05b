//! The seeded deterministic scheduler: actors are OS threads of which one
//! runs at a time, handing a baton at every coherence call; stalls, parks
//! and barriers.

use std::collections::VecDeque;

use cxlkv_core::hash::mix64;

/// Unwinds the threads of a crashed host (its actors stop where they are).
pub(crate) struct Crashed;

/// Unwinds the threads of a killed process; each starts again as a thread of
/// its host's next process.
pub(crate) struct Killed;

/// Unwinds a manager actor's step cut off part-way: the process that was
/// stepping that node's lock manager (any process of its host may) was
/// killed; the host and its cache live on, and the node steps on from a
/// fresh manager state.
pub(crate) struct StepCut;

/// A run in which no operation finishes for this many scheduler steps is
/// livelocked (`CXLKV_SIM_STEP_LIMIT`, default 3,000,000). A window, not a
/// total: a long run that keeps finishing operations (five hosts, slow
/// pinners, a zombie's lease to wait out) is not a livelock, and a wedged
/// one is found as soon as the others have nothing left to do.
pub(crate) fn step_limit() -> u64 {
    static N: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::env::var("CXLKV_SIM_STEP_LIMIT").ok().and_then(|v| v.parse().ok()).unwrap_or(3_000_000))
}

/// The most scheduler steps a run may take in all, progress or not
/// (`CXLKV_SIM_STEP_CAP`, default four windows of [`step_limit`]).
pub(crate) fn step_cap() -> u64 {
    static N: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("CXLKV_SIM_STEP_CAP")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| step_limit().saturating_mul(4))
    })
}

#[derive(Default)]
pub(crate) struct Sched {
    pub(crate) turn: usize,
    pub(crate) runnable: Vec<bool>,
    pub(crate) finished: Vec<bool>,
    pub(crate) host_crashed: Vec<bool>,
    pub(crate) rng: u64,
    pub(crate) steps: u64,
    /// The step at which an operation last finished (or an actor ended).
    pub(crate) progress: u64,
    /// The run was found livelocked: everyone unwinds.
    pub(crate) out_of_steps: bool,
    pub(crate) crash_at: Option<(usize, u64)>,
    pub(crate) crashed: Option<usize>,
    /// Kill the process of a host (SIGKILL; the host lives on) at a step.
    pub(crate) kill_at: Option<(usize, u64)>,
    /// Each host's process generation, and the generation each actor runs in.
    pub(crate) gen: Vec<u32>,
    pub(crate) actor_gen: Vec<u32>,
    pub(crate) trace: VecDeque<String>,
    pub(crate) stop: bool,
    pub(crate) watch_dirty: Vec<bool>,
    /// An actor parked (descheduled, as a preempted thread is) until this step.
    pub(crate) sleep_until: Vec<u64>,
    /// A stopped host (`stalls::park_host`), the step it wakes at, and the
    /// latest step it may be held to while not yet declared dead.
    pub(crate) parked: Option<Parked>,
    /// Per actor: cut its manager step at its n-th scheduling point from now
    /// (0: none; see [`StepCut`]).
    pub(crate) cut_in: Vec<u32>,
    /// Manager steps cut off so far.
    pub(crate) cuts: u64,
    /// Host-local locks: (host, lock) → holding actor.
    pub(crate) local: std::collections::HashMap<(usize, u32), usize>,
}

/// A host held still past its lease (see `stalls::park_host`).
#[derive(Clone, Copy)]
pub(crate) struct Parked {
    pub(crate) host: usize,
    pub(crate) until: u64,
    pub(crate) limit: u64,
    /// The heartbeat (manager actor) wakes this long after the others.
    pub(crate) late: u64,
}

/// Park actors now and then (`CXLKV_SIM_PARK=1`): long windows in which a
/// host's half-done work is visible, which kill far more coherence mutants.
/// Off by default while some parked runs still exceed the step limit.
pub(crate) fn park() -> bool {
    std::env::var("CXLKV_SIM_PARK").is_ok_and(|v| v == "1")
}

/// Scheduler events kept for a failure report (`CXLKV_SIM_TRACE`, default 64).
pub(crate) fn trace_len() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::env::var("CXLKV_SIM_TRACE").ok().and_then(|v| v.parse().ok()).unwrap_or(64))
}

/// Entry line whose state and generation in memory are traced
/// (`CXLKV_SIM_ENTRY_LINE`).
pub(crate) fn entry_line() -> Option<u64> {
    static N: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::env::var("CXLKV_SIM_ENTRY_LINE").ok().and_then(|v| v.parse().ok()))
}

pub(crate) fn watch_line() -> Option<usize> {
    std::env::var("CXLKV_SIM_WATCH_LINE").ok().and_then(|v| v.parse().ok())
}

/// The cache tag of an actor's stores: its index, and its process
/// generation (a killed process's stores keep theirs).
pub(crate) fn tag_of(s: &Sched, actor: usize) -> u32 {
    actor as u32 + 1000 * s.actor_gen.get(actor).copied().unwrap_or(0)
}

pub(crate) fn rnd(x: &mut u64) -> u64 {
    *x = mix64(x.wrapping_add(0x9e37_79b9_7f4a_7c15));
    *x
}
