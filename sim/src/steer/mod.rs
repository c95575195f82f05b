//! Steered scenarios: short, deterministic runs that put the protocol into
//! one named interleaving on purpose — a process stopped between two
//! instructions, a sibling's store seen through the shared cache before it
//! lands, a host declared dead that wakes up — instead of hoping a seed
//! reaches it. Each scenario drives core's real code over [`SimMemory`]
//! with lazy caches (nothing moves unless the protocol moves it) and a yield
//! hook that acts at a named coherence call; it reports violations of the
//! invariants it checks, so a disabled site (`--disable`) or a logic mutant
//! it covers makes it fail. `cxlkv-sim scenario` runs them; the mutant
//! checks run them before any seed.

use std::sync::{mpsc, Arc, Mutex};

use cxlkv_core::check::{check, scratch_words, FindingKind};
use cxlkv_core::coherence::{Coherence, Coherent, Site};
use cxlkv_core::format::format;
use cxlkv_core::layout::NodeInfo;
use cxlkv_core::lock::{LeaseConfig, Manager};
use cxlkv_core::mem::View;
use cxlkv_core::node::{attach_node, Identity};
use cxlkv_core::store::{attach, NodeEnv, Store};
use cxlkv_core::{Error, Result};

use crate::harness::{sim_caps, SIM_BYTES};
use crate::memory::{SimCoherence, SimConfig, SimMemory};

/// The rig most zombie scenarios start from, bound in the caller's scope:
/// three hosts (`rig`), node n attached on host n with its store `sn`, a
/// step environment on host 0 (`env`), and each node's local state and
/// node (`ln`, `nn`).
macro_rules! three_node_rig {
    ($disable:expr => $rig:ident, ($s0:ident, $s1:ident, $s2:ident), $env:ident,
     ($l0:ident, $l1:ident, $l2:ident), ($n0:ident, $n1:ident, $n2:ident)) => {
        let $rig = Rig::new(3, 3, $disable)?;
        let ($s0, $s1, $s2) = $rig.three_hosts_one_node_each()?;
        let $env = StepEnv::new(&$s0, 0);
        let ($l0, $l1, $l2) = (NodeLocal::default(), NodeLocal::default(), NodeLocal::default());
        let ($n0, $n1, $n2) =
            (Node::new(&$s0, 0, &$env, &$l0)?, Node::new(&$s1, 1, &$env, &$l1)?, Node::new(&$s2, 2, &$env, &$l2)?);
    };
}

/// The two-host rig most scenarios go on from (after `Rig::new`): node n
/// attached on host n, each with its process's state, host 0's manager
/// stepped inline.
macro_rules! two_nodes {
    ($rig:ident => ($s0:ident, $s1:ident), $env:ident, ($l0:ident, $l1:ident), ($n0:ident, $n1:ident)) => {
        let ($s0, $s1) = $rig.two_hosts_one_node_each()?;
        let $env = StepEnv::new(&$s0, 0);
        let ($l0, $l1) = (NodeLocal::default(), NodeLocal::default());
        let ($n0, $n1) = (Node::new(&$s0, 0, &$env, &$l0)?, Node::new(&$s1, 1, &$env, &$l1)?);
    };
}

mod blocks;
mod locks;
mod managers;
mod tenants;
mod zombies;

/// One named scenario.
pub struct Scenario {
    /// Its name (`cxlkv-sim scenario NAME`).
    pub name: &'static str,
    /// The interleaving it steers into, in a line.
    pub what: &'static str,
    run: fn(Option<&'static str>) -> Result<Vec<String>>,
}

impl Scenario {
    /// Runs the scenario with coherence site `disable` switched off (a
    /// mutant; logic mutants are switched globally). Returns the violations
    /// found; an error of the run itself is one.
    ///
    /// A scenario that gives no verdict within [`SCENARIO_DEADLINE`] is a
    /// violation too (a wait that never ends); its thread is left behind.
    pub fn run(&self, disable: Option<&'static str>) -> Vec<String> {
        let (tx, rx) = std::sync::mpsc::channel();
        let (f, name) = (self.run, self.name);
        let spawned = std::thread::Builder::new().name(format!("scenario {name}")).spawn(move || {
            let _ = tx.send(f(disable));
        });
        if let Err(e) = spawned {
            return vec![format!("{name}: could not start: {e}")];
        }
        match rx.recv_timeout(SCENARIO_DEADLINE) {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => vec![format!("{name}: the run failed: {e}")],
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                vec![format!("{name}: no verdict within {}s: a wait that never ends", SCENARIO_DEADLINE.as_secs())]
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => vec![format!("{name}: the run panicked")],
        }
    }
}

/// How long a scenario may run (each takes milliseconds).
pub const SCENARIO_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// Every steered scenario.
pub fn scenarios() -> &'static [Scenario] {
    &[
        Scenario {
            name: "release-seen-early",
            what: "a holder's IDLE sits in its host's cache, unwritten, when that host's manager reads it and grants \
                   the lock to another host",
            run: locks::release_seen_early,
        },
        Scenario {
            name: "fenced-withdrawal",
            what: "a node gives up waiting for a lock, is declared dead and freed while it withdraws, and no live \
                   node runs a manager to answer its withdrawal",
            run: locks::fenced_withdrawal,
        },
        Scenario {
            name: "withdrawal-finds-a-grant",
            what: "a node gives up waiting for a lock just after the manager granted it: its withdrawal must give \
                   the grant back, or the lock stays with a node that no longer asks for it",
            run: locks::withdrawal_finds_a_grant,
        },
        Scenario {
            name: "fenced-request",
            what: "a node waiting for a lock is declared dead and freed; no manager step drops its request",
            run: locks::fenced_request,
        },
        Scenario {
            name: "waiter-attached-mid-step",
            what: "a node attaches and asks for a lock after a full manager step read it FREE, before that step \
                   reads its request",
            run: locks::waiter_attached_mid_step,
        },
        Scenario {
            name: "kept-grant-of-a-zombie",
            what: "a node keeps a grant past its release and is declared dead; the grant is revoked, recovery \
                   repairs the lock and another node takes it; the node wakes and asks for the lock again",
            run: locks::kept_grant_of_a_zombie,
        },
        Scenario {
            name: "kept-grant-released-over-a-successor",
            what: "a node declared dead keeps a grant; its slot is freed and a successor takes the lock; the old \
                   node's background thread gives the kept grant back from its stale cache",
            run: locks::kept_grant_released_over_a_successor,
        },
        Scenario {
            name: "late-grant-on-a-free-slot",
            what: "a grant a cut-off manager step left in its host's cache lands in a node's slot after the node \
                   released the lock and detached; a node attaches to the slot again and another asks for the lock",
            run: locks::late_grant_on_a_free_slot,
        },
        Scenario {
            name: "grant-seen-before-its-line",
            what: "a grant to recovery lands before the lock line it rewrote, recovery repairs the line meanwhile, \
                   and the manager's line lands after",
            run: locks::grant_seen_before_its_line,
        },
        Scenario {
            name: "free-cut-after-its-map",
            what: "a process freeing another live node's raw block dies after the chunk's map reached memory, \
                   before its record did; recovery must take the map's word",
            run: blocks::free_cut_after_its_map,
        },
        Scenario {
            name: "eviction-cut-before-its-record",
            what: "an evictor dies after removing a block from the index and before logging the removal; a \
                   reader of the change log must learn of it after recovery",
            run: blocks::eviction_cut_before_its_record,
        },
        Scenario {
            name: "evictor-dies-claiming-a-pinned-block",
            what: "an evictor dies with a block another node pins CLAIMED (looking for pins); recovery must put \
                   it back, and the pin, its bytes and the index keep it",
            run: blocks::evictor_dies_claiming_a_pinned_block,
        },
        Scenario {
            name: "lookup-after-a-publish-elsewhere",
            what: "a host looks a key up while another writes it (its cache keeps the WRITING entry); after the \
                   publish, with the block pinned, its next lookup must find it",
            run: blocks::lookup_after_a_publish_elsewhere,
        },
        Scenario {
            name: "buried-writer-payload-lands-late",
            what: "a process dies with payload stored, unflushed, into a block it was writing; its sibling buries \
                   it, recovery frees the block and another host reuses it; the dead process's lines must not land \
                   over it later",
            run: blocks::buried_writer_payload_lands_late,
        },
        Scenario {
            name: "new-incarnation-old-beat",
            what: "a node detaches and its successor attaches between two liveness scans of a manager, whose next \
                   scan reads the new ALIVE beside the predecessor's last heartbeat, not yet overwritten",
            run: managers::new_incarnation_old_beat,
        },
        Scenario {
            name: "detach-while-recovery-holds",
            what: "a process detaches its node while another of its threads (an automatic recovery) holds a \
                   stripe lock in the node's name",
            run: managers::detach_while_recovery_holds,
        },
        Scenario {
            name: "root-put-elsewhere",
            what: "a host that read a root missing frees it after another host put it",
            run: blocks::root_put_elsewhere,
        },
        Scenario {
            name: "successor-sends-from-the-receivers-host",
            what: "a sender exits and its successor attaches on the receiver's host, whose cache shows the \
                   sender's ring empty: the successor's send must not overwrite the message waiting there",
            run: blocks::successor_sends_from_the_receivers_host,
        },
        Scenario {
            name: "owner-returns-to-a-host-with-an-old-head",
            what: "an inbox's owner comes back to a host whose cache holds a head more than a ring old: its \
                   first receive reads the head from memory and gets the next message",
            run: blocks::owner_returns_to_a_host_with_an_old_head,
        },
        Scenario {
            name: "a-drained-ring-takes-messages-again",
            what: "a sender whose cursor finds its ring full as last seen reads the head again and sends into \
                   the room the owner made",
            run: blocks::a_drained_ring_takes_messages_again,
        },
        Scenario {
            name: "late-line-over-a-newer-claim",
            what: "a stalled manager's renewal lands over a newer claimant's line: only the newer claim grants",
            run: managers::late_line_over_a_newer_claim,
        },
        Scenario {
            name: "zombie-manager-grants-late",
            what: "a manager stops in the middle of a grant, a newer claimant takes the role over and grants the \
                   lock elsewhere, and the stopped manager wakes and writes its grant",
            run: managers::zombie_manager_grants_late,
        },
        Scenario {
            name: "floor-outlives-a-late-line",
            what: "a recovery raises a lock's floor; its node asks for the lock again, a replaced manager's line \
                   from before the recovery lands, and a new manager with no copy of the line grants the lock",
            run: managers::floor_outlives_a_late_line,
        },
        Scenario {
            name: "late-grant-does-not-hold-a-detach",
            what: "a replaced manager's grant lands late in the slot of a node that holds nothing: its detach \
                   goes through",
            run: managers::late_grant_does_not_hold_a_detach,
        },
        Scenario {
            name: "late-grant-below-the-floor",
            what: "a grant of the current manager, released and then below a recovery's floor, lands again in \
                   the slot of a node that holds nothing: its detach goes through",
            run: managers::late_grant_below_the_floor,
        },
        Scenario {
            name: "successor-reads-a-revoked-grant",
            what: "a process dies holding a lock; a manager on another host revokes it and recovery frees the \
                   node; a successor on the same host attaches as that node, its host's cache still holding the \
                   old grant",
            run: managers::successor_reads_a_revoked_grant,
        },
        Scenario {
            name: "publish-meets-a-void-entry",
            what: "a publish links its block behind an entry line a revoked holder wrote back after the repair: \
                   the stripe is repaired and the block published, not refused",
            run: zombies::publish_meets_a_void_entry,
        },
        Scenario {
            name: "zombie-entry-lands-over-a-reservation",
            what: "a revoked holder's entry line lands over another node's reservation: the repair loses the \
                   entry but keeps the block the writer's journal names, and the writer's abort lets it go, its \
                   payload lines written back first",
            run: zombies::zombie_entry_lands_over_a_reservation,
        },
        Scenario {
            name: "app-lock-repair-read-fresh",
            what: "an application lock's holder is declared dead and its grant revoked while a recovering host \
                   still caches the lock's line from before: the recovery must repair the lock",
            run: managers::app_lock_repair_read_fresh,
        },
        Scenario {
            name: "stray-grant-is-given-back",
            what: "a replaced manager's grant lands in the slot of a node that neither holds nor waits for the \
                   lock: the node's background pass gives it back, and no lock a thread of it holds",
            run: managers::stray_grant_is_given_back,
        },
        Scenario {
            name: "zombie-entry-lands-over-a-pin",
            what: "a revoked holder's entry line lands over a block two nodes pin: the repair loses the entry but \
                   keeps the block, and the last node to let go frees it",
            run: zombies::zombie_entry_lands_over_a_pin,
        },
        Scenario {
            name: "zombie-entry-over-a-reservation-repaired-elsewhere",
            what: "as zombie-entry-lands-over-a-reservation, the void line dropped by another host's recovery, \
                   which reads the writer's journal from memory",
            run: zombies::zombie_entry_over_a_reservation_repaired_elsewhere,
        },
        Scenario {
            name: "zombie-tier-keeps-its-directory",
            what: "a tier's node is declared dead while stopped; another host's tier claims a directory, and the \
                   woken node records a block in its own",
            run: zombies::zombie_tier_keeps_its_directory,
        },
        Scenario {
            name: "zombie-abort-lands-late",
            what: "a node stops freeing the block of a reservation it aborted; declared dead and recovered, it \
                   wakes after another node took the block",
            run: zombies::zombie_abort_lands_late,
        },
        Scenario {
            name: "zombie-stripe-holder-lands-late",
            what: "a node stopped inside the stripe lock is declared dead and recovered, then wakes: its change \
                   record lands over a newer one and its header over the stripe's; readers and the next holder \
                   must take both as void and repair",
            run: zombies::zombie_stripe_holder_lands_late,
        },
        Scenario {
            name: "zombie-entry-lands-over-a-reused-one",
            what: "a node stopped inside the stripe lock, its entry line unflushed, is recovered; the entry and \
                   its block are reused; the line lands late: the next holder must have it repaired, and the \
                   repair must drop it, never bring back the block it names",
            run: zombies::zombie_entry_lands_over_a_reused_one,
        },
        Scenario {
            name: "zombie-entry-lands-under-a-live-key",
            what: "a zombie evictor's READY line for a key lands after the key was published again in the same \
                   entry, its old block now another's: readers without the lock (their cache holding the floor \
                   from before) must take it for missing, never read the other block as the key's",
            run: zombies::zombie_entry_lands_under_a_live_key,
        },
        Scenario {
            name: "replaced-manager-line-lands-late",
            what: "a replaced manager's lock line (count back, no repair) and grant land late: the lock still \
                   awaits its repair, no ticket is handed out twice, and a stale grant to a free node is dropped",
            run: zombies::replaced_manager_line_lands_late,
        },
        Scenario {
            name: "void-grant-lands-in-a-live-slot",
            what: "a grant from before a lock's repair lands late in the slot of a live node that is not \
                   waiting: nobody holds by it, the lock is granted to others and the node detaches",
            run: zombies::void_grant_lands_in_a_live_slot,
        },
        Scenario {
            name: "old-grant-lands-over-a-held-one",
            what: "a grant from before a lock's repair lands late in the slot of a live node that holds the lock \
                   again: its grant stands, its release succeeds and the lock goes on to others",
            run: zombies::old_grant_lands_over_a_held_one,
        },
        Scenario {
            name: "zombie-release-lands-late",
            what: "a node releasing a chunk stops past its check, is declared dead and recovered; another node \
                   publishes, then the stopped node's free record lands and it wakes: the chunk must have been \
                   held out of use, and no published block lose its bytes",
            run: zombies::zombie_release_lands_late,
        },
        Scenario {
            name: "zombie-wakes-to-release",
            what: "a node stops as it journals a chunk release, is declared dead and recovered (the chunk freed \
                   and taken by another node), then wakes: it must find its grant revoked before it writes the \
                   chunk free",
            run: zombies::zombie_wakes_to_release,
        },
        Scenario {
            name: "zombie-bitmap-lands-late",
            what: "a node releasing a chunk stops with the bitmap word stored; after its recovery another node \
                   takes a fresh chunk, the stopped node's bitmap line lands with that chunk's bit clear, and a \
                   third node takes a fresh chunk: never the one taken",
            run: zombies::zombie_bitmap_lands_late,
        },
        Scenario {
            name: "attach-scans-a-stale-slot",
            what: "a host whose cache shows a node slot free, taken since on another host, attaches to the first \
                   free slot: never that one",
            run: managers::attach_scans_a_stale_slot,
        },
        Scenario {
            name: "zombie-wakes-to-take-a-chunk",
            what: "a node takes a fresh chunk and stops before it places its block there; after its recovery \
                   another node allocates, then the stopped node wakes and places its block: never in the other \
                   node's chunk",
            run: zombies::zombie_wakes_to_take_a_chunk,
        },
        Scenario {
            name: "freed-chunk-seen-elsewhere",
            what: "a host whose cache holds the chunk bitmap full asks for a chunk after another host gave one \
                   back: it must get it",
            run: blocks::freed_chunk_seen_elsewhere,
        },
        Scenario {
            name: "tier-claimed-elsewhere",
            what: "a host whose cache holds every tier directory head as free claims a directory after another \
                   host claimed one: it must take another, never the one owned",
            run: blocks::tier_claimed_elsewhere,
        },
        Scenario {
            name: "tenant-added-elsewhere",
            what: "a host whose cache holds the tenant table empty adds a tenant another host added: refused, and \
                   it finds the one added",
            run: tenants::tenant_added_elsewhere,
        },
        Scenario {
            name: "namespace-bound-elsewhere",
            what: "a host whose cache holds the root table empty puts a block in a namespace another host bound to \
                   a tenant: the block counts to that tenant",
            run: tenants::namespace_bound_elsewhere,
        },
        Scenario {
            name: "quota-held-across-hosts",
            what: "two hosts take turns putting a tenant's blocks far beyond its hard quota: after every put it holds \
                   at most its quota, and a block larger than the quota is refused",
            run: tenants::quota_held_across_hosts,
        },
        Scenario {
            name: "share-held-against-others",
            what: "another tenant's blocks fill the region many times over: evictions take a tenant's blocks above \
                   its guaranteed share, never below it",
            run: tenants::share_held_against_others,
        },
        Scenario {
            name: "zombie-tenant-usage-lands-late",
            what: "a node holding a tenant's lock stops, is declared dead and recovered; the tenant's blocks change, \
                   then the stopped node's old usage line lands: the next holder takes it as void, never as the count",
            run: tenants::zombie_tenant_usage_lands_late,
        },
        Scenario {
            name: "expired-never-read",
            what: "a host reads a tenant's block, which expires; another host puts the key again (the expired block \
                   replaced, likely in the same entry) and the new block expires too: the first host, its cache \
                   holding the old stamp, must find it missing by every read",
            run: tenants::expired_never_read,
        },
        Scenario {
            name: "tenant-drop-cut-by-a-crash",
            what: "a node dropping a tenant dies at its first eviction's claim; recovered, the tenant stays \
                   dropping (its reserves refused, its usage its blocks), and a drop by another node finishes: \
                   every block gone, the slot free",
            run: tenants::tenant_drop_cut_by_a_crash,
        },
        Scenario {
            name: "scrubbed-block-read-elsewhere",
            what: "a block of the default tenant is written and evicted; a scrubbing tenant's reserve on another \
                   host gets its space, writes half and publishes: the first host reads the rest as zeros, never \
                   the evicted block's bytes",
            run: tenants::scrubbed_block_read_elsewhere,
        },
        Scenario {
            name: "zombie-expiry-lands-late",
            what: "a node holding a stripe lock stops with an expiry line in its cache; declared dead and recovered, \
                   its old line lands after a block of the line was stamped: past the block's lifetime, no reader \
                   takes the void line's word for it",
            run: tenants::zombie_expiry_lands_late,
        },
        Scenario {
            name: "tier-record-changed-elsewhere",
            what: "a host finds a key in another node's tier directory; the owner removes it and records it again \
                   with another length, then removes it: the host must see each change, never a record that is gone",
            run: blocks::tier_record_changed_elsewhere,
        },
        Scenario {
            name: "zombie-map-lands-late",
            what: "a node holding another's heap lock stops, is declared dead and fenced; blocks are placed in \
                   that chunk, then the stopped node's old map line lands over the chunk's map: the next placement \
                   must find the chunk void and have it repaired, never take a live block's granules",
            run: zombies::zombie_map_lands_late,
        },
        Scenario {
            name: "zombie-map-brings-back-freed-raw-blocks",
            what: "a node holding another's heap lock stops, is declared dead and fenced; raw blocks of that \
                   chunk are freed, one through its root; then the stopped node's map line, from before the frees, \
                   lands: the freed blocks must be free once it is quiet, never lost",
            run: zombies::zombie_map_brings_back_freed_raw_blocks,
        },
        Scenario {
            name: "zombie-map-lands-over-raw-blocks",
            what: "a node holding another's heap lock stops, is declared dead and fenced; that node's chunk \
                   empties and goes back, and raw blocks are allocated; then the stopped node's map line lands: \
                   the raw blocks must not be in that chunk, and keep their bytes, room and frees",
            run: zombies::zombie_map_lands_over_raw_blocks,
        },
        Scenario {
            name: "zombie-buckets-land-late",
            what: "a node holding a stripe lock stops, is declared dead and fenced; a key is published there, \
                   then the stopped node's bucket lines land and hide it: publishing it again must find it (never \
                   a second entry), evicting must evict it",
            run: zombies::zombie_buckets_land_late,
        },
        Scenario {
            name: "zombie-chunk-release-clear-lands-first",
            what: "a node giving a chunk back stops with its journal's clear written back first, is declared \
                   dead and fenced; the chunk is taken again, then the stopped node wakes: its free record was in \
                   memory before the clear, and no block is given out twice",
            run: zombies::zombie_chunk_release_clear_lands_first,
        },
        Scenario {
            name: "zombie-root-lands-late",
            what: "a node putting a root stops with the record stored, is declared dead and fenced; another \
                   node puts a root, then the stopped one wakes: its record lands only on the slot it journaled",
            run: zombies::zombie_root_lands_late,
        },
        Scenario {
            name: "zombie-root-put-checks-its-grant",
            what: "a node putting a root stops before its journal is in memory, is declared dead and fenced; \
                   another node puts a root, then the stopped one wakes: it finds its grant revoked and writes \
                   nothing",
            run: zombies::zombie_root_put_checks_its_grant,
        },
        Scenario {
            name: "zombie-root-clear-lands-first",
            what: "a node putting a root stops with its journal's clear written back first, is declared dead \
                   and fenced; another node puts a root, then the stopped one wakes: its record was in memory \
                   before the clear, and the other root keeps its slot",
            run: zombies::zombie_root_clear_lands_first,
        },
        Scenario {
            name: "reservation-entry-lands-late",
            what: "a node stops with a reservation's entry stored, not landed; fenced, it loses the block, which \
                   another node's publish takes; the late entry lands and recovery runs again: the other block \
                   keeps its entry and its bytes",
            run: zombies::reservation_entry_lands_late,
        },
        Scenario {
            name: "batched-reservation-entry-lands-late",
            what: "as reservation-entry-lands-late, the node stopped at the second block of a batch, reserved \
                   under the heap lock it kept from the first: its journal record is in memory all the same",
            run: zombies::batched_reservation_entry_lands_late,
        },
        Scenario {
            name: "woken-node-pins-after-its-recovery",
            what: "a node declared dead and recovered while stopped wakes and pins a block, its own cache still \
                   showing its slot ALIVE: the pins fail with Revoked",
            run: zombies::woken_node_pins_after_its_recovery,
        },
        Scenario {
            name: "zombie-payload-lands-late",
            what: "a node stores payload into its reservation and stops; declared dead and recovered, its cache \
                   writes the payload back after others published: their blocks keep their bytes (its block stays \
                   allocated until it says it is quiet), and the recovery after it did frees it",
            run: zombies::zombie_payload_lands_late,
        },
        Scenario {
            name: "quiet-word-lands-before-the-payload",
            what: "a woken node's word that it is quiet completes its write-back before its payload's: a \
                   recovery then frees its block and another node reuses it, and nothing of the payload may \
                   land over that",
            run: zombies::quiet_word_lands_before_the_payload,
        },
        Scenario {
            name: "late-burial-meets-a-successor",
            what: "a burial stops after its write-backs; another completes, recovery frees the node and a \
                   successor attaches: the late burial must leave the successor alone",
            run: zombies::late_burial_meets_a_successor,
        },
        Scenario {
            name: "fenced-waiter-is-not-granted",
            what: "a node stops while it waits for a lock, is declared dead and fenced; the lock is given back: \
                   woken, the node must learn it was fenced, never find the lock granted",
            run: zombies::fenced_waiter_is_not_granted,
        },
        Scenario {
            name: "fenced-node-detaches",
            what: "a node declared dead and recovered before its heartbeat noticed closes, its cache showing its \
                   slot ALIVE: the detach must be refused with Revoked and write nothing over the fenced slot",
            run: zombies::fenced_node_detaches,
        },
        Scenario {
            name: "operator-says-a-dead-host-is-down",
            what: "a node declared dead by its silence is fenced, its block kept; an operator on a third host, \
                   its cache holding the slot as ALIVE, says the node's host is down: the next recovery frees both",
            run: zombies::operator_says_a_dead_host_is_down,
        },
        Scenario {
            name: "pin-races-an-eviction",
            what: "a reader stops between journaling a pin and its fence; an evictor (seeing no pin) evicts the \
                   block and another is published in its place: the pin must not be handed out",
            run: blocks::pin_races_an_eviction,
        },
        Scenario {
            name: "buried-metadata-written-back",
            what: "a process dies after storing an index entry, before its flush; its sibling buries it: no \
                   metadata line the dead process stored may stay dirty in the host's cache",
            run: blocks::buried_metadata_written_back,
        },
        Scenario {
            name: "put-with-payload-before-ready",
            what: "a block put under one hold of its stripe lock turns READY; the writer stops there and \
                   everything but its payload lands: a reader getting it without a lock must copy the key's bytes",
            run: blocks::put_with_payload_before_ready,
        },
        Scenario {
            name: "manager-step-cut",
            what: "a manager step is cut off at its grant (the process stepping it for its node was killed; the \
                   host lives on): the node goes on from a fresh state, which must first write back what the cut \
                   step stored",
            run: managers::manager_step_cut,
        },
        Scenario {
            name: "named-without-a-claim",
            what: "the manager line names two nodes in turn, neither holding a claim: each claims and settles first",
            run: managers::named_without_a_claim,
        },
    ]
}

/// What an action at a coherence call gets: the call's host and site.
type Action = Box<dyn FnMut(usize, &'static str) -> bool + Send>;

/// A simulated memory with `hosts` hosts and lazy caches, its region formatted
/// by host 0 with room for `nodes` nodes, and a hook that runs the current
/// action (if any) at every coherence call until the action returns true.
pub(super) struct Rig {
    mem: Arc<SimMemory>,
    action: Arc<Mutex<Option<(usize, Action)>>>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        // An action may hold the memory (whose hook holds the action).
        *self.action.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

impl Rig {
    fn new(hosts: usize, nodes: usize, disable: Option<&'static str>) -> Result<Rig> {
        let mem = Arc::new(SimMemory::new(SIM_BYTES, hosts, 1, SimConfig::lazy()));
        format(mem.view(0), mem.host(0), sim_caps(nodes), 1)?;
        mem.drain(0);
        mem.disable(disable);
        let action: Arc<Mutex<Option<(usize, Action)>>> = Arc::new(Mutex::new(None));
        let a = action.clone();
        mem.set_yield_hook(Box::new(move |h, site| {
            // Only its host's calls see the action (another host's thread
            // taking it out would hide it from its own host's call meanwhile).
            // Taken out while it runs: what it calls makes coherence calls
            // of its own, which pass by it.
            let taken = {
                let mut slot = a.lock().unwrap_or_else(|p| p.into_inner());
                if slot.as_ref().is_some_and(|(ah, _)| *ah == h) {
                    slot.take()
                } else {
                    None
                }
            };
            if let Some((ah, mut f)) = taken {
                if !f(h, site) {
                    let mut slot = a.lock().unwrap_or_else(|p| p.into_inner());
                    if slot.is_none() {
                        *slot = Some((ah, f));
                    }
                }
            }
        }));
        Ok(Rig { mem, action })
    }

    fn store(&self, h: usize) -> Result<Store<SimCoherence<'_>>> {
        attach(self.mem.view(h), self.mem.host(h))
    }

    /// Host 0's and host 1's stores, with node 0 attached on host 0 and
    /// node 1 on host 1.
    fn two_hosts_one_node_each(&self) -> Result<(Store<SimCoherence<'_>>, Store<SimCoherence<'_>>)> {
        let (s0, s1) = (self.store(0)?, self.store(1)?);
        attach_as(&s0, 0, 0)?;
        attach_as(&s1, 1, 1)?;
        Ok((s0, s1))
    }

    /// Hosts 0 to 2's stores, with node n attached on host n.
    fn three_hosts_one_node_each(
        &self,
    ) -> Result<(Store<SimCoherence<'_>>, Store<SimCoherence<'_>>, Store<SimCoherence<'_>>)> {
        let (s0, s1) = self.two_hosts_one_node_each()?;
        let s2 = self.store(2)?;
        attach_as(&s2, 2, 2)?;
        Ok((s0, s1, s2))
    }

    /// Host `h`'s cache as a view (stores there are that host's stores).
    fn cache(&self, h: usize) -> View {
        self.mem.view(h)
    }

    /// Runs `f` at host `h`'s coherence calls from now on, until it returns
    /// true.
    fn at_calls(&self, h: usize, f: impl FnMut(usize, &'static str) -> bool + Send + 'static) {
        *self.action.lock().unwrap_or_else(|p| p.into_inner()) = Some((h, Box::new(f)));
    }

    /// Parks host `h`'s thread at its coherence call `site`, once: the
    /// receiver hears when it stopped there; it goes on when the sender
    /// sends (or is dropped).
    fn parks_at(&self, h: usize, site: &'static str) -> (mpsc::Receiver<()>, mpsc::Sender<()>) {
        self.parks_at_nth(h, site, 1)
    }

    /// [`Rig::parks_at`] at the `nth` call of `site` (from 1), once.
    fn parks_at_nth(&self, h: usize, site: &'static str, nth: u32) -> (mpsc::Receiver<()>, mpsc::Sender<()>) {
        let (stopped_tx, stopped_rx) = mpsc::channel::<()>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let parked = Mutex::new((stopped_tx, go_rx));
        let seen = Mutex::new(0u32);
        self.at_calls(h, move |host, at| {
            if (host, at) != (h, site) {
                return false;
            }
            let mut calls = seen.lock().unwrap_or_else(|p| p.into_inner());
            *calls = calls.saturating_add(1);
            if *calls != nth {
                return false;
            }
            drop(calls);
            let p = parked.lock().unwrap_or_else(|p| p.into_inner());
            let _ = p.0.send(());
            let _ = p.1.recv();
            true
        });
        (stopped_rx, go_tx)
    }

    /// Runs `f` as host `h`'s process, which dies at its coherence call
    /// `site`: what the host queued for write-back lands first, what it
    /// stored since stays in its cache. True when it died there.
    fn dies_at<T>(&self, h: usize, site: &'static str, f: impl FnOnce() -> T) -> bool {
        let mem = self.mem.clone();
        self.at_calls(h, move |host, at| {
            if (host, at) != (h, site) {
                return false;
            }
            mem.drain(h);
            std::panic::resume_unwind(Box::new(Died));
        });
        let cut = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        matches!(cut, Err(ref p) if p.is::<Died>())
    }

    /// Adds to `out` what `check` finds in memory itself, named for
    /// scenario `name`: a scenario's region must check clean at its end.
    fn expect_clean(&self, name: &str, out: &mut Vec<String>) -> Result<()> {
        let found = self.memory_findings()?;
        if !found.is_empty() {
            out.push(format!("{name}: the region has findings {found:?}"));
        }
        Ok(())
    }

    /// Findings of `check` on memory itself (what a host reads after
    /// invalidating everything; what a crash of every host would leave).
    fn memory_findings(&self) -> Result<Vec<FindingKind>> {
        let st = attach(self.mem.shared_region(), Coherent)?;
        let mut scratch = vec![0u64; scratch_words(&st)];
        let mut out = Vec::new();
        check(&st, &mut scratch, &mut |f| out.push(f.kind))?;
        Ok(out)
    }
}

/// Attaches node `id` through `store` (a host's view), as a process of host
/// `host` would.
pub(super) fn attach_as<C: Coherence>(store: &Store<C>, id: u32, host: u64) -> Result<u32> {
    attach_node(store, Some(id), Identity { pid: 100 + id, host_id: host + 1, pid_ns: 0, nonce: 1 + id as u64, now: 0 })
}

/// Declares node `n` dead through `store` (its info DEAD, as the manager's
/// liveness scan writes it); the manager's next step revokes its locks.
pub(super) fn declare_dead(store: &Store<SimCoherence<'_>>, n: u32) -> Result<()> {
    let off = store.layout.node_info(n);
    let mut info: NodeInfo = store.fresh_state_first(off, Site("steer.info"))?;
    info.state = cxlkv_core::layout::NODE_DEAD;
    store.publish_state_last(off, &info, Site("steer.dead"))?;
    store.co.store_fence(Site("steer.dead.fence"));
    Ok(())
}

/// A node environment whose waits step one lock manager inline (running on
/// its own host's view), so one thread plays every process; nobody is ever
/// declared dead unless a scenario says so.
pub(super) struct StepEnv<'a> {
    store: &'a Store<SimCoherence<'a>>,
    mgr: spin::Mutex<Manager>,
    now: spin::Mutex<u64>,
    cfg: LeaseConfig,
    /// Whether releases may keep grants (`NodeEnv::keeps_grants`); the
    /// scenario gives them back itself.
    keeps: bool,
    /// The wall clock every node reads (tenants' lifetimes), in
    /// milliseconds; the scenario moves it ([`StepEnv::pass_ms`]).
    wall: spin::Mutex<u64>,
}

impl<'a> StepEnv<'a> {
    fn new(store: &'a Store<SimCoherence<'a>>, me: u32) -> StepEnv<'a> {
        StepEnv::with_lease(store, me, LeaseConfig { lease: u64::MAX / 4, settle: 0, quarantine: 0 })
    }

    /// Steps node `me`'s manager with this lease and settle, one tick a
    /// step (a manager whose lease stands still for `lease` steps takes
    /// the role over).
    fn with_lease(store: &'a Store<SimCoherence<'a>>, me: u32, cfg: LeaseConfig) -> StepEnv<'a> {
        StepEnv {
            store,
            mgr: spin::Mutex::new(Manager::new(me)),
            now: spin::Mutex::new(0),
            cfg,
            keeps: false,
            wall: spin::Mutex::new(1_000_000),
        }
    }

    /// Moves the wall clock `ms` milliseconds on.
    pub(super) fn pass_ms(&self, ms: u64) {
        *self.wall.lock() += ms;
    }

    /// [`StepEnv::new`] whose releases may keep grants past their release
    /// (see core's `lock.rs`, "Parked grants").
    fn keeping(store: &'a Store<SimCoherence<'a>>, me: u32) -> StepEnv<'a> {
        StepEnv { keeps: true, ..StepEnv::new(store, me) }
    }

    fn step(&self) -> Result<()> {
        let now = {
            let mut t = self.now.lock();
            *t += 1;
            *t
        };
        let probe = |_: u32, _: &NodeInfo| None;
        self.mgr.lock().step(self.store, now, self.cfg, &probe).map(|_| ())
    }
}

impl NodeEnv for StepEnv<'_> {
    fn local_lock(&self, _lock: u32) -> Result<()> {
        Ok(())
    }
    fn try_local_lock(&self, _lock: u32) -> bool {
        true
    }
    fn local_unlock(&self, _lock: u32) {}
    fn wait(&self, iteration: u32) -> Result<()> {
        if iteration > 10_000 {
            return Err(Error::Timeout);
        }
        self.step()
    }
    fn withdrawal_expired(&self, iteration: u32) -> bool {
        iteration > 10_000
    }
    fn keeps_grants(&self) -> bool {
        self.keeps
    }
    fn wall_ms(&self) -> u64 {
        *self.wall.lock()
    }
}

/// Unwinds a process stopped for good inside a call (a crash).
pub(super) struct Died;
