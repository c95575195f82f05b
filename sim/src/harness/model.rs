//! The reference model: what every key, pin, raw block, root and message
//! must be, against which every result is checked.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};

use cxlkv_core::channel::Message;
use cxlkv_core::hash::{mix64, Key};
use cxlkv_core::index::Handle;

use crate::harness::params::sim_caps;

impl Model {
    /// The largest repair floor of `lock` seen in memory so far.
    pub(crate) fn floor_seen(&self, lock: u32) -> u64 {
        self.floors_seen.get(&lock).copied().unwrap_or(0)
    }
    /// A crash or a stall left a node that recovery has yet to free.
    pub(crate) fn awaits_recovery(&self) -> bool {
        (self.crash_needs_recovery || (self.stall.is_some() && self.stalled) || self.killed) && !self.recovered
    }
}

#[derive(Default)]
pub(crate) struct Model {
    pub(crate) published: HashSet<Key>,
    /// Each key's last successful reserve: the steps it began and ended
    /// at, between which its block's lifetime began (see [`TTL`]).
    pub(crate) born: HashMap<Key, (u64, u64)>,
    /// Each key's reserves: begun so far, and in flight now.
    pub(crate) reserving: HashMap<Key, (u64, u64)>,
    /// Pins held now, by key: ids, each pin's own. A key with one pin held
    /// all through a lookup was READY all through it (a pin holds its
    /// block until released or until recovery drops a dead node's pins).
    pub(crate) pinned: HashMap<Key, HashSet<u64>>,
    pub(crate) pin_ids: u64,
    /// Recoveries begun (they may drop pins).
    pub(crate) recoveries: u64,
    /// Recoveries that rebuilt a void stripe header (a zombie's, written
    /// back after the last repair), run by an operation or not.
    pub(crate) void_repairs: u64,
    pub(crate) violations: Vec<String>,
    pub(crate) counter: u64,
    pub(crate) inserts: Vec<u64>,
    /// Reserves that succeeded, all hosts, never reset.
    pub(crate) total_inserts: u64,
    pub(crate) ops: u64,
    pub(crate) need_recovery: bool,
    pub(crate) recovered: bool,
    /// Asks for a further recovery (a burial or a quiesce said a fenced
    /// node quiet): one made while a recovery runs is not answered by it
    /// (its census may have read the node unquiet).
    pub(crate) recovery_asks: u64,
    pub(crate) counter_root: u64,
    /// The application lock that guards the counter.
    pub(crate) counter_lock: Option<u32>,
    /// A key an evictor is deciding on, and the host of that evictor: the
    /// next operation of another host acquires it.
    pub(crate) hot: Option<(u64, usize)>,
    /// The end's search for rooted blocks no root names was made.
    pub(crate) adopted: bool,
    /// Each host's last counter ticket (grant sequence), released already:
    /// presented again while holding a newer grant, it must change nothing.
    pub(crate) old_tickets: BTreeMap<usize, u64>,
    /// Application locks allocated by the churn operation (beside the
    /// counter's), by number.
    pub(crate) churned: HashSet<u32>,
    /// The killed process's successor parks inside its bury, after the
    /// write-backs, until the node was declared dead by its silence and
    /// recovered: its second look must see that, and bury nothing.
    pub(crate) bury_race: bool,
    /// The crash waits for a moment when its host holds the counter's
    /// application lock: its repair by recovery runs.
    pub(crate) crash_in_app_lock: bool,
    /// Now and then a reader is descheduled between finding a block and
    /// copying it (others evict it and reuse its space meanwhile).
    pub(crate) slow_readers: bool,
    /// Each host's op actor has stored a raw block's bytes it has not yet
    /// flushed.
    pub(crate) raw_filling: Vec<bool>,
    /// The kill waits for a moment when its process fills a raw block.
    pub(crate) kill_in_fill: bool,
    /// The crash comes, if it can, between a raw free's map and its record.
    pub(crate) crash_in_free: bool,
    /// A stalled host's worker wakes before its heartbeat.
    pub(crate) worker_first: bool,
    /// The highest grant sequence memory has shown for each lock: it never
    /// goes back (a ticket is unique by it).
    pub(crate) grants_seen: BTreeMap<u32, u64>,
    /// Per lock: the largest repair floor seen in its line in memory.
    pub(crate) floors_seen: BTreeMap<u32, u64>,
    pub(crate) log: Vec<(u64, u64, String)>,
    /// Named root `r<g>` for each g.
    pub(crate) roots: Vec<RootModel>,
    /// Hosts whose op actor reached each barrier phase (bit masks): 0 and 1
    /// mid-run (arrived, checked), 2 and 3 at the end, 4 and 5 around the
    /// channel fill at the end.
    pub(crate) barrier: [u64; 7],
    /// Hosts whose op actor issues no more operations (done, or stopped
    /// fenced): a stalled host's late writes are over once its bit is set.
    pub(crate) quiet: u64,
    /// Live raw allocations: (offset, length, host).
    pub(crate) raw: Vec<(u64, u64, usize)>,
    /// Each host's op actor holds an attached node.
    pub(crate) attached: Vec<bool>,
    /// The host that stalls (all its threads descheduled for longer than a
    /// lease) once, mid-run: it is declared dead and recovered meanwhile.
    pub(crate) stall: Option<usize>,
    /// The stall is a zombie's ([`RunConfig::zombie`]): anywhere, once
    /// the host's op actor is a third of the way through.
    pub(crate) zombie: bool,
    /// Cut manager steps off part-way now and then (`RunConfig::cut_steps`).
    pub(crate) cut_steps: bool,
    /// The stalled host's op actor asks for the stall.
    pub(crate) stall_req: bool,
    /// Stall requests that timed out (the host's manager actor stayed the
    /// active manager, say): a few, then the run goes on without a stall.
    pub(crate) stall_misses: u32,
    /// The stall began.
    pub(crate) stalled: bool,
    /// The stalled host's heartbeat found its node no longer ALIVE.
    pub(crate) fenced: bool,
    /// The stall falls inside an unlock (of the only lock the host holds,
    /// after its critical section) instead of between operations.
    pub(crate) stall_in_release: bool,
    /// The stalling host's op actor is in an operation that may stall in
    /// its unlock (nothing pinned or being written when it began).
    pub(crate) release_armed: bool,
    /// The stall began inside an unlock; the operation must then fail
    /// with Revoked.
    pub(crate) stalled_in_release: bool,
    /// The manager actor of each host is between two steps and not the
    /// active manager (a host can stall then).
    pub(crate) mgr_idle: Vec<bool>,
    /// A maintenance recovery ran.
    pub(crate) maintained: bool,
    /// A host's process was killed (its node needs recovery until then).
    pub(crate) killed: bool,
    /// The killed process restarts after two leases, not at once.
    pub(crate) kill_late: bool,
    /// Each host's op actor is writing a block by plain stores.
    pub(crate) raw_writing: Vec<bool>,
    /// Where each host's op actor is: the operation it began last (the
    /// number of operations once it finished them).
    pub(crate) op_at: Vec<u32>,
    pub(crate) ops_per_host: u32,
    /// Resignations under way and begun so far.
    pub(crate) resigns: (u32, u64),
    /// Counter increments whose lock came back Revoked after the critical
    /// section ran: they may have landed.
    pub(crate) counter_maybe: u64,
    /// Operations of the stalled host that failed with Revoked after it woke.
    pub(crate) revoked_ops: u64,
    /// Recoveries under way: they hold every lock while memory is rebuilt.
    pub(crate) recovering: u32,
    /// The crashed host's node was attached when it crashed.
    pub(crate) crash_needs_recovery: bool,
    /// Hosts whose recovery actor is recovering (bit mask).
    pub(crate) recovering_on: u64,
    /// Per host: of `recovering`, those running there (a crash of the host
    /// ends them).
    pub(crate) recovering_per: [u32; 32],
    /// Only one host recovers: a live one that is not the lock manager's
    /// (otherwise every live host tries, and any of them suffices).
    pub(crate) single_recovery: bool,
    /// Channel messages by request id.
    pub(crate) msgs: BTreeMap<u64, ChanMsg>,
    /// Last message id given out.
    pub(crate) next_msg: u64,
    /// Node 0 finished streaming to node 1 at the end.
    pub(crate) stream_done: bool,
    /// Attaches of each node id so far (the harness's count of incarnations).
    pub(crate) node_epoch: BTreeMap<u32, u64>,
    /// The SSD tier's directory records.
    pub(crate) tier: TierModel,
    /// Each host's reader of the change log.
    pub(crate) feeds: Vec<Feed>,
    /// The highest change count memory has shown for each stripe.
    pub(crate) changes_seen: Vec<u64>,
}

/// A message a node sent (or tried to: a send that failed half way may or
/// may not have landed).
pub(crate) struct ChanMsg {
    pub(crate) from: u32,
    pub(crate) to: u32,
    pub(crate) keys: usize,
    /// The send returned Ok.
    pub(crate) acked: bool,
    pub(crate) received: bool,
    /// The receiver's incarnation (harness count) when no attach of the
    /// receiver's slot happened during the send: the message is for it.
    pub(crate) epoch: Option<u64>,
}

thread_local! {
    pub(crate) static ACTOR: Cell<usize> = const { Cell::new(usize::MAX) };
    /// The actor is inside `Node::acquire`.
    pub(crate) static IN_ACQUIRE: Cell<bool> = const { Cell::new(false) };
    /// This run's [`RunConfig::mixed`] (set in every thread of the run).
    pub(crate) static MIXED: Cell<bool> = const { Cell::new(false) };
    /// Runs with a tenant (see [`crate::harness::params::tenants_of`]): the hosts' keys are of a namespace of
    /// tenant `sim`, whose hard quota and share bind (see
    /// [`crate::harness::params::TENANT_QUOTA`]).
    pub(crate) static TENANTS: Cell<bool> = const { Cell::new(false) };
    /// The lifetime of tenant `sim`'s blocks in simulated milliseconds
    /// (scheduler steps; 0: none), in runs with a tenant (see
    /// [`crate::harness::params::ttl_of`]).
    pub(crate) static TTL: Cell<u64> = const { Cell::new(0) };
    /// The namespace id of the hosts' keys, as this actor's host registered
    /// it ([`crate::harness::params::NS`] in runs without a tenant).
    pub(crate) static NS_ID: Cell<u32> = const { Cell::new(crate::harness::params::NS) };
    /// Waits (lock polls) after which `NodeEnv::wait` reports a timeout.
    pub(crate) static WAIT_LIMIT: Cell<u32> = const { Cell::new(200_000) };
}

pub(crate) fn payload(k: Key, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for (i, c) in v.chunks_mut(8).enumerate() {
        let w = mix64(k.lo ^ (i as u64).wrapping_mul(0x100_0000_01b3)).to_le_bytes();
        c.copy_from_slice(&w[..c.len()]);
    }
    v
}

/// The namespace id of the hosts' keys (see [`NS_ID`]).
pub(crate) fn ns() -> u32 {
    NS_ID.with(|c| c.get())
}

pub(crate) fn key(i: u64) -> Key {
    Key { lo: mix64(i + 77), hi: i }
}

pub(crate) fn len_of(k: Key) -> u64 {
    if MIXED.with(|m| m.get()) {
        64 + mix64(k.hi) % (2 << sim_caps(2).chunk_shift)
    } else {
        64 + mix64(k.hi) % 3000
    }
}

pub(crate) struct Pin {
    pub(crate) h: Handle,
    pub(crate) until: u32,
    /// Its id in the model's `pinned`.
    pub(crate) id: u64,
}

pub(crate) fn raw_pattern(off: u64, len: u64) -> Vec<u8> {
    payload(Key { lo: off, hi: off ^ 0x7a }, len as usize)
}

/// What the model knows of one named root.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RootModel {
    /// `Some(Some(size))` present, `Some(None)` absent, `None` unknown (after
    /// racing puts and destroys, until an operation alone on it settles it).
    pub(crate) state: Option<Option<u64>>,
    /// Puts and destroys under way.
    pub(crate) inflight: u32,
    /// Puts and destroys begun so far.
    pub(crate) begun: u64,
}

/// Owner of a raw block in `Model::raw` that a named root keeps.
pub(crate) const ROOTED: usize = usize::MAX;

/// Owner of a rooted block whose `root_free` began and may have been cut
/// off (a crash, a revocation): freed or not, nobody knows; an allocation
/// over it later means it was freed.
pub(crate) const IN_FREE: usize = usize::MAX - 1;

/// Channel messages: the keys of message `id`.
pub(crate) fn msg_keys(id: u64, n: usize) -> Vec<Key> {
    (0..n as u64).map(|j| Key { lo: mix64(id << 8 | j), hi: id << 8 | j }).collect()
}

/// Channel messages: the fields of message `id` with `n` keys, as sent.
pub(crate) fn msg_of(id: u64, n: usize) -> Message {
    Message {
        kind: 1 + (id % 3) as u32,
        request_id: id,
        ns: (id % 7) as u32,
        status: n as u32,
        stamp: id.wrapping_mul(31),
        ..Message::default()
    }
}

/// One host's reader of the change log.
#[derive(Clone, Default)]
pub(crate) struct Feed {
    /// Per stripe: the last change applied.
    pub(crate) cursors: Vec<u64>,
    /// Per stripe: a rescan is owed (the last one met a changing entry).
    pub(crate) rescan: Vec<bool>,
    /// Per stripe: the (namespace, key)s stored, as the log says.
    pub(crate) live: Vec<HashSet<(u32, Key)>>,
    /// Changes applied, gaps met (for the run's report).
    pub(crate) applied: u64,
    pub(crate) gaps: u64,
}

/// One record the tier wrote: when its write began and ended, and when its
/// removal (or the directory's next claim) began and ended.
#[derive(Clone, Copy)]
pub(crate) struct TierRec {
    pub(crate) key: Key,
    pub(crate) put: (u64, Option<u64>),
    pub(crate) gone: Option<(u64, Option<u64>)>,
}

/// What the model knows of the tier.
#[derive(Default)]
pub(crate) struct TierModel {
    pub(crate) recs: Vec<TierRec>,
    /// Record writes (begin, end): one may rewrite the directory without
    /// its tombstones, when lookups meanwhile may miss.
    pub(crate) puts: Vec<(u64, Option<u64>)>,
    /// The directory was let go (begin): nothing is found after.
    pub(crate) released: Option<(u64, Option<u64>)>,
}
