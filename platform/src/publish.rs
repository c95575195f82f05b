//! The region's block events for KV-aware routers, in vLLM's wire format:
//! a thread tails the change log (through an [`events::Feed`]) and publishes
//! each poll's events as one `KVEventBatch` — msgpack `[ts, [events…],
//! dp_rank]` with tagged `BlockStored` / `BlockRemoved` / `AllBlocksCleared`
//! maps — on a ZMQ PUB socket as `(topic, seq as 8 bytes big-endian,
//! payload)`, the frames vLLM's `ZmqEventPublisher` sends. The optional
//! replay socket answers vLLM's replay request (`[b"", start seq]` from a
//! DEALER or REQ) with every buffered batch from that sequence on, each as
//! `[b"", topic, seq, payload]`, then `[b"", b"", -1, b""]`.
//!
//! A subscriber sees a gap as a jump in the sequence. When it asks for
//! batches the buffer no longer holds, the reply is one batch carrying the
//! latest sequence, `AllBlocksCleared` and every block stored as of that
//! sequence (a snapshot), so replay always ends in the region's state.
//!
//! The block hash in an event is the key's: with [`HashForm::Int`] (vLLM's
//! default, `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`) the key's last 8 bytes
//! read big-endian, which is the integer vLLM publishes for a block whose
//! hash's last 16 bytes are the key (`cxlkv.engines.block_key`); with
//! [`HashForm::Bytes`], the key's 16 bytes.
//!
//! A publisher started on an attached node ([`Publisher::attached`]) fills
//! a stored block's `token_ids`, `block_size`, `parent_block_hash` and
//! `lora_id` from its route record (see [`crate::route`]), when the engine
//! stored one; otherwise, and always for an observer's publisher
//! ([`Publisher::start`]), a stored event carries the hash alone
//! (`token_ids = []`, `block_size = 0`), as vLLM's own offloading connector
//! publishes its tiers' blocks. Route records themselves are not published.
//!
//! [`events::Feed`]: crate::events::Feed

use crate::sync::Flag;
use std::collections::{HashSet, VecDeque};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cxlkv_core::hash::Key;

use crate::error::{Error, Result};
use crate::events::Event;
use crate::flush::FlushMode;
use crate::node::Node;
use crate::region::Region;
use crate::route::{Route, ROUTE_NS};
use crate::zmtp::{endpoint_of, PubSocket, ReplySocket, Request};

/// How a block hash is written in an event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HashForm {
    /// The key's last 8 bytes as a big-endian unsigned integer (vLLM's
    /// default external block hash).
    #[default]
    Int,
    /// The key's last 8 bytes as a big-endian signed integer: SGLang's
    /// event hash (`hash_str_to_int64`, the page hash's first 8 bytes as a
    /// signed 64-bit integer), which its adapter stores there.
    Int64,
    /// The key's 16 bytes.
    Bytes,
}

/// What a publisher binds and writes.
#[derive(Clone, Debug)]
pub struct PublisherOptions {
    /// PUB endpoint to bind (`tcp://HOST:PORT`; port 0 takes a free one).
    pub endpoint: String,
    /// Replay endpoint to bind, if any.
    pub replay: Option<String>,
    /// First frame of every message (subscribers filter on its prefix).
    pub topic: String,
    /// The events' `medium`.
    pub medium: String,
    /// How block hashes are written.
    pub hash: HashForm,
    /// Publish only these namespaces' blocks (empty: every namespace).
    pub namespaces: Vec<u32>,
    /// The batches' `data_parallel_rank` (`None`: left out).
    pub dp_rank: Option<i64>,
    /// Batches kept for replay.
    pub buffer: usize,
    /// Messages queued per subscriber before it loses some.
    pub hwm: usize,
    /// Pause between polls that found nothing new.
    pub interval: Duration,
    /// Events per batch at most (a poll's events beyond go in more batches).
    pub max_events: usize,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        PublisherOptions {
            endpoint: "tcp://127.0.0.1:5557".into(),
            replay: None,
            topic: String::new(),
            medium: "CXL".into(),
            hash: HashForm::Int,
            namespaces: Vec::new(),
            dp_rank: None,
            buffer: 10_000,
            hwm: 100_000,
            interval: Duration::from_millis(5),
            max_events: 1024,
        }
    }
}

/// What a publisher has done so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Batches published (the next batch's sequence number).
    pub batches: u64,
    /// Events in them.
    pub events: u64,
    /// Changes read from the region's change log.
    pub feed_changes: u64,
    /// Gaps in the change log the feed repaired by a rescan.
    pub feed_gaps: u64,
    /// Replay requests answered.
    pub replays: u64,
    /// Replays answered with a snapshot (the buffer had moved on).
    pub snapshots: u64,
    /// Subscribers connected now.
    pub subscribers: u64,
    /// Messages subscribers lost to a full queue.
    pub dropped: u64,
    /// The last error the feed met (it keeps polling).
    pub last_error: Option<String>,
}

/// A running publisher (see the module documentation). Stops when dropped.
pub struct Publisher {
    endpoint: String,
    replay: Option<String>,
    stop: Arc<Flag>,
    stats: Arc<Mutex<PublisherStats>>,
    thread: Option<JoinHandle<()>>,
}

impl Publisher {
    /// Binds the sockets and starts the publishing thread over `region`,
    /// read as an observer with cache maintenance `mode`. Fails at once on
    /// an endpoint it cannot bind or a region it cannot observe.
    pub fn start(region: &Region, mode: FlushMode, opts: PublisherOptions) -> Result<Publisher> {
        Publisher::run(region, mode, None, opts)
    }

    /// As [`Publisher::start`], over the region `node` is attached to; stored
    /// events carry what the blocks' route records say. The node stays
    /// attached while the publisher runs: stop it before detaching.
    pub fn attached(node: Arc<Node>, opts: PublisherOptions) -> Result<Publisher> {
        let region = node.region();
        let mode = node.store().co.mode();
        Publisher::run(&region, mode, Some(node), opts)
    }

    fn run(region: &Region, mode: FlushMode, routes: Option<Arc<Node>>, opts: PublisherOptions) -> Result<Publisher> {
        if opts.buffer == 0 || opts.max_events == 0 {
            return Err(Error::Unsupported("a publisher keeps at least one batch of at least one event"));
        }
        let io = |what: &'static str| move |err| Error::Io { what, err };
        let pubs = PubSocket::bind(&opts.endpoint, opts.hwm).map_err(io("binding the event endpoint"))?;
        let replay = match &opts.replay {
            Some(ep) => Some(ReplySocket::bind(ep).map_err(io("binding the replay endpoint"))?),
            None => None,
        };
        let endpoint = endpoint_of(pubs.local_addr());
        let replay_ep = replay.as_ref().map(|r| endpoint_of(r.local_addr()));
        let stop = Arc::new(Flag::new(false));
        let stats = Arc::new(Mutex::new(PublisherStats::default()));
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<()>>(1);
        let region = region.clone();
        let thread = std::thread::Builder::new()
            .name("cxlkv-events".into())
            .spawn({
                let (stop, stats) = (stop.clone(), stats.clone());
                move || {
                    let obs = match region.observe(mode) {
                        Ok(o) => o,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    let feed = obs.feed();
                    let mut run = Run {
                        opts,
                        pubs,
                        replay,
                        feed,
                        routes,
                        pending: Vec::new(),
                        out_stored: HashSet::new(),
                        buffer: VecDeque::new(),
                        seq: 0,
                    };
                    run.go(&stop, &stats);
                }
            })
            .map_err(|err| Error::Io { what: "starting the event thread", err })?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(Error::Unsupported("the event thread ended before it started"));
            }
        }
        Ok(Publisher { endpoint, replay: replay_ep, stop, stats, thread: Some(thread) })
    }

    /// The PUB endpoint bound (with the port taken when 0 was asked).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The replay endpoint bound, if any.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay.as_deref()
    }

    /// What the publisher has done so far.
    pub fn stats(&self) -> PublisherStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Stops publishing and closes the sockets; returns the final counts.
    pub fn stop(mut self) -> PublisherStats {
        self.halt();
        self.stats()
    }

    fn halt(&mut self) {
        self.stop.set(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The publishing thread's state.
struct Run<'a> {
    opts: PublisherOptions,
    pubs: PubSocket,
    replay: Option<ReplySocket>,
    feed: crate::events::Feed<'a>,
    /// Where route records are read, if anywhere.
    routes: Option<Arc<Node>>,
    /// Stored blocks held back until their parent is published.
    pending: Vec<(Routed, Instant)>,
    /// The blocks published stored (and not removed since).
    out_stored: HashSet<(u32, Key)>,
    /// Recent batches: (sequence, payload).
    buffer: VecDeque<(u64, Arc<Vec<u8>>)>,
    /// The next batch's sequence number.
    seq: u64,
}

impl Run<'_> {
    fn go(&mut self, stop: &Flag, stats: &Mutex<PublisherStats>) {
        let mut events = Vec::new();
        let mut replays = 0u64;
        let mut snapshots = 0u64;
        while !stop.get() {
            events.clear();
            let (busy, error) = match self.feed.poll(&mut events) {
                Ok(()) => (!events.is_empty(), None),
                Err(e) => (false, Some(e.to_string())),
            };
            let now = Instant::now();
            let mut cand = std::mem::take(&mut self.pending);
            for e in events.iter().copied().filter(|e| self.wanted(e)) {
                cand.push(((e, self.route(&e)), now));
            }
            let (kept, pending) = order(cand, &mut self.out_stored, now, PARENT_WAIT);
            self.pending = pending;
            for chunk in kept.chunks(self.opts.max_events) {
                self.publish(chunk);
            }
            while let Some(req) = self.replay.as_ref().and_then(|r| r.poll()) {
                replays += 1;
                let snapshot = self.snapshot_needed(&req);
                snapshots += u64::from(snapshot);
                {
                    // Counted before the answer goes: whoever has the
                    // answer sees it in the stats.
                    let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
                    s.replays = replays;
                    s.snapshots = snapshots;
                }
                self.answer(req, snapshot);
            }
            {
                let f = self.feed.stats();
                let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
                s.batches = self.seq;
                s.events += kept.len() as u64;
                s.feed_changes = f.changes;
                s.feed_gaps = f.gaps;
                s.subscribers = self.pubs.subscribers() as u64;
                s.dropped = self.pubs.dropped();
                s.last_error = error;
            }
            if !busy {
                std::thread::sleep(self.opts.interval);
            }
        }
    }

    fn wanted(&self, e: &Event) -> bool {
        let ns = match *e {
            Event::Cleared => return true,
            Event::Stored { ns, .. } | Event::Removed { ns, .. } => ns,
        };
        ns != ROUTE_NS && (self.opts.namespaces.is_empty() || self.opts.namespaces.contains(&ns))
    }

    /// The route record of a stored block, when there is a node to read it
    /// with and the engine stored one.
    fn route(&self, e: &Event) -> Option<Route> {
        match (e, &self.routes) {
            (Event::Stored { ns, key, .. }, Some(node)) => node.route(*ns, *key).ok().flatten(),
            _ => None,
        }
    }

    /// Publishes `events` as the next batch and keeps it for replay.
    fn publish(&mut self, events: &[Routed]) {
        let payload = Arc::new(self.batch(events));
        let seq = self.seq;
        self.seq += 1;
        self.pubs.send(vec![self.opts.topic.as_bytes().to_vec(), seq.to_be_bytes().to_vec(), payload.to_vec()]);
        if self.buffer.len() >= self.opts.buffer {
            self.buffer.pop_front();
        }
        self.buffer.push_back((seq, payload));
    }

    /// Answers a replay request; true when it took a snapshot.
    /// The first sequence a replay request asks for (its last frame, 8
    /// bytes big-endian), if it is well formed.
    fn replay_start(req: &Request) -> Option<u64> {
        let last = req.frames.last()?;
        <[u8; 8]>::try_from(last.as_slice()).ok().map(u64::from_be_bytes)
    }

    /// Whether `req` asks for batches the buffer no longer holds, so that
    /// its answer is a snapshot (the state as of the last batch).
    fn snapshot_needed(&self, req: &Request) -> bool {
        let oldest = self.buffer.front().map_or(self.seq, |&(s, _)| s);
        Run::replay_start(req).is_some_and(|start| start < oldest && self.seq > 0)
    }

    /// Answers a replay request: the buffered batches from its start on,
    /// or (`snapshot`, from [`Run::snapshot_needed`]) the state as of the
    /// last batch; then the end marker.
    fn answer(&self, req: Request, snapshot: bool) {
        // The reply's envelope is whatever came before the sequence (a
        // DEALER's or REQ's empty delimiter).
        let Some((_, envelope)) = req.frames.split_last() else { return };
        let envelope = envelope.to_vec();
        let msg = |frames: [&[u8]; 3]| {
            let mut m = envelope.clone();
            m.extend(frames.iter().map(|f| f.to_vec()));
            m
        };
        let topic = self.opts.topic.as_bytes();
        if let Some(start) = Run::replay_start(&req) {
            if snapshot {
                // Those batches are gone: the state as of the last one.
                let now = Instant::now();
                let mut events = vec![((Event::Cleared, None), now)];
                self.feed.for_each_stored(|ns, key, len, tokens| {
                    let e = Event::Stored { ns, key, len, tokens, node: None };
                    if self.wanted(&e) {
                        events.push(((e, self.route(&e)), now));
                    }
                });
                let (events, _) = order(events, &mut HashSet::new(), now, Duration::ZERO);
                let payload = self.batch(&events);
                let last = self.seq - 1;
                if !req.reply(msg([topic, &last.to_be_bytes(), &payload])) {
                    return;
                }
            } else {
                for (seq, payload) in self.buffer.iter().filter(|(s, _)| *s >= start) {
                    if !req.reply(msg([topic, &seq.to_be_bytes(), payload])) {
                        return;
                    }
                }
            }
        }
        req.reply(msg([b"", &(-1i64).to_be_bytes(), b""]));
    }

    /// One `KVEventBatch`, msgpack-encoded, stamped now.
    fn batch(&self, events: &[Routed]) -> Vec<u8> {
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        encode_batch(&self.opts, ts, events)
    }
}

/// One `KVEventBatch` of `events` stamped `ts`, msgpack-encoded as vLLM's
/// msgspec decoder reads it.
fn encode_batch(opts: &PublisherOptions, ts: f64, events: &[Routed]) -> Vec<u8> {
    let hash = |key: Key| block_hash(opts.hash, key);
    let medium = opts.medium.as_str();
    // Consecutive removals go in one event.
    let mut out: Vec<KvEvent<'_>> = Vec::new();
    for (e, route) in events {
        match e {
            Event::Cleared => out.push(KvEvent::AllBlocksCleared {}),
            Event::Stored { key, .. } => {
                let r = route.clone().unwrap_or_default();
                out.push(KvEvent::BlockStored {
                    block_hashes: vec![hash(*key)],
                    parent_block_hash: r.parent.map(hash),
                    token_ids: r.tokens,
                    block_size: r.block_size,
                    lora_id: r.lora_id,
                    medium,
                    lora_name: None,
                });
            }
            Event::Removed { key, .. } => match out.last_mut() {
                Some(KvEvent::BlockRemoved { block_hashes, .. }) => block_hashes.push(hash(*key)),
                _ => out.push(KvEvent::BlockRemoved { block_hashes: vec![hash(*key)], medium }),
            },
        }
    }
    // vLLM's `KVEventBatch` is array-like: `[ts, events]`, then the
    // data-parallel rank when there is one. Encoding plain data into a
    // vector cannot fail; an empty batch would be dropped by readers.
    let packed = match opts.dp_rank {
        Some(r) => rmp_serde::to_vec_named(&(ts, &out, r)),
        None => rmp_serde::to_vec_named(&(ts, &out)),
    };
    packed.unwrap_or_default()
}

/// Block `key`'s hash in form `form`.
fn block_hash(form: HashForm, key: Key) -> Hash {
    let b = key.to_bytes();
    let mut low = [0u8; 8];
    low.copy_from_slice(&b[8..]);
    match form {
        HashForm::Int => Hash::Int(u64::from_be_bytes(low)),
        HashForm::Int64 => Hash::Int64(i64::from_be_bytes(low)),
        HashForm::Bytes => Hash::Bytes(serde_bytes::ByteBuf::from(b.to_vec())),
    }
}

/// A block hash as vLLM's events carry it: an integer (its
/// `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES` form, or SGLang's signed one), or
/// bytes.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Hash {
    Int(u64),
    Int64(i64),
    Bytes(serde_bytes::ByteBuf),
}

/// vLLM's KV events (`vllm.distributed.kv_events`), tagged by `type` as
/// its msgspec structs are.
#[derive(serde::Serialize)]
#[serde(tag = "type")]
enum KvEvent<'a> {
    AllBlocksCleared {},
    BlockStored {
        block_hashes: Vec<Hash>,
        parent_block_hash: Option<Hash>,
        token_ids: Vec<u32>,
        block_size: u32,
        lora_id: Option<i64>,
        medium: &'a str,
        lora_name: Option<&'a str>,
    },
    BlockRemoved {
        block_hashes: Vec<Hash>,
        medium: &'a str,
    },
}

/// The block hash an event carries for `key` in form `form`, as a subscriber
/// decodes it (for tests and tools): an integer, or the 16 bytes.
pub fn event_hash(key: Key, form: HashForm) -> Result<u64> {
    match form {
        // The same 64 bits (as a signed integer for `Int64`).
        HashForm::Int | HashForm::Int64 => {
            let b = key.to_bytes();
            let mut low = [0u8; 8];
            low.copy_from_slice(&b[8..]);
            Ok(u64::from_be_bytes(low))
        }
        HashForm::Bytes => Err(Error::Unsupported("a 16-byte hash is not an integer")),
    }
}

/// An event and the route record of its block (stored events only).
type Routed = (Event, Option<Route>);

/// How long a stored block whose parent (its route record names one) is
/// not published yet waits for it: a router's index (Dynamo's, say) takes
/// a block only after its parent. An engine stores a prefix's blocks
/// together, but they are logged stripe by stripe.
const PARENT_WAIT: Duration = Duration::from_millis(200);

/// Orders events `cand` (each with when it was first seen) for publishing:
/// a stored block after its parent, when the parent is published already
/// (`known`, which this updates) or among `cand`; one whose parent is
/// neither waits, at most `wait`. A removal follows its block's store.
/// Returns what to publish now, and what waits.
fn order(
    cand: Vec<(Routed, Instant)>,
    known: &mut HashSet<(u32, Key)>,
    now: Instant,
    wait: Duration,
) -> (Vec<Routed>, Vec<(Routed, Instant)>) {
    let mut out = Vec::with_capacity(cand.len());
    let mut left = cand;
    loop {
        let before = out.len();
        let mut next: Vec<(Routed, Instant)> = Vec::new();
        for (r, t) in left {
            match r.0 {
                Event::Cleared => {
                    known.clear();
                    out.push(r);
                }
                Event::Stored { ns, key, .. } => {
                    let parent = r.1.as_ref().and_then(|x| x.parent);
                    if parent.is_none_or(|p| known.contains(&(ns, p))) {
                        known.insert((ns, key));
                        out.push(r);
                    } else {
                        next.push((r, t));
                    }
                }
                Event::Removed { ns, key, .. } => {
                    // Its store, if held back, goes first.
                    if let Some(i) = next.iter().position(
                        |((e, _), _)| matches!(*e, Event::Stored { ns: n, key: k, .. } if n == ns && k == key),
                    ) {
                        out.push(next.remove(i).0);
                    }
                    known.remove(&(ns, key));
                    out.push(r);
                }
            }
        }
        left = next;
        if out.len() == before || left.is_empty() {
            break;
        }
    }
    let mut pending = Vec::new();
    for (r, t) in left {
        if now.duration_since(t) >= wait {
            if let Event::Stored { ns, key, .. } = r.0 {
                known.insert((ns, key));
            }
            out.push(r);
        } else {
            pending.push((r, t));
        }
    }
    (out, pending)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_vllms_array_like_kv_event_batch_with_tagged_events() {
        let k = |i: u64| {
            let mut b = [0u8; 16];
            b[8..].copy_from_slice(&i.to_be_bytes());
            Key::from_bytes(b)
        };
        let stored = Event::Stored { ns: 1, key: k(7), len: 1, tokens: 2, node: None };
        let route = Route { parent: Some(k(6)), block_size: 2, tokens: vec![5, 300], lora_id: None };
        let removed = |i| (Event::Removed { ns: 1, key: k(i), node: None }, None);
        let events = vec![(Event::Cleared, None), (stored, Some(route)), removed(8), removed(9)];
        let opts = PublisherOptions { dp_rank: Some(3), ..PublisherOptions::default() };
        let v: serde_json::Value = rmp_serde::from_slice(&encode_batch(&opts, 1.5, &events)).unwrap();
        let medium = opts.medium.as_str();
        let want = serde_json::json!([1.5, [
            {"type": "AllBlocksCleared"},
            {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": 6, "token_ids": [5, 300],
             "block_size": 2, "lora_id": null, "medium": medium, "lora_name": null},
            {"type": "BlockRemoved", "block_hashes": [8, 9], "medium": medium},
        ], 3]);
        assert_eq!(v, want);
        // Signed: SGLang's hashes.
        let opts = PublisherOptions { hash: HashForm::Int64, ..PublisherOptions::default() };
        let v: serde_json::Value = rmp_serde::from_slice(&encode_batch(&opts, 0.0, &[removed(u64::MAX)])).unwrap();
        assert_eq!(v[1][0]["block_hashes"][0], -1);
    }

    #[test]
    fn a_stored_block_follows_its_parent_and_a_removal_its_store() {
        let k = |i: u128| Key::from_u128(i);
        let stored = |i: u128, parent: Option<u128>| {
            let e = Event::Stored { ns: 1, key: k(i), len: 1, tokens: 1, node: None };
            (e, Some(Route { parent: parent.map(k), ..Route::default() }))
        };
        let t0 = Instant::now();
        let keys = |v: &[Routed]| -> Vec<u128> {
            v.iter()
                .map(|(e, _)| match *e {
                    Event::Stored { key, .. } => key.as_u128(),
                    Event::Removed { key, .. } => 1000 + key.as_u128(),
                    Event::Cleared => 0,
                })
                .collect()
        };
        let mut known = HashSet::new();
        // Logged child first (another stripe): published parent first.
        let (out, wait) = order(
            vec![(stored(3, Some(2)), t0), (stored(2, Some(1)), t0), (stored(1, None), t0)],
            &mut known,
            t0,
            PARENT_WAIT,
        );
        assert_eq!((keys(&out), wait.len()), (vec![1, 2, 3], 0));
        // A parent not seen yet: the child waits, then goes alone.
        let (out, wait) = order(vec![(stored(5, Some(4)), t0)], &mut known, t0, PARENT_WAIT);
        assert!(out.is_empty() && wait.len() == 1);
        let removed = (Event::Removed { ns: 1, key: k(5), node: None }, None);
        let (out, wait) = order(vec![wait[0].clone(), (removed, t0)], &mut known, t0, PARENT_WAIT);
        assert_eq!((keys(&out), wait.len()), (vec![5, 1005], 0), "a removal brings its store out first");
        let (_, wait) = order(vec![(stored(7, Some(6)), t0)], &mut known, t0, PARENT_WAIT);
        let (out, wait) = order(wait, &mut known, t0 + PARENT_WAIT, PARENT_WAIT);
        assert_eq!((keys(&out), wait.len()), (vec![7], 0));
    }

    #[test]
    fn the_integer_hash_is_the_keys_last_eight_bytes_big_endian() {
        let mut b = [0u8; 16];
        b[8..].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        assert_eq!(event_hash(Key::from_bytes(b), HashForm::Int).unwrap(), 0x0102_0304_0506_0708);
    }
}
