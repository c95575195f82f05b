//! The op actor's operations beyond the KV cache: raw allocations, named
//! roots, and inbox messages.

use cxlkv_core::channel::Message;
use cxlkv_core::coherence::{Coherence, Site};
use cxlkv_core::hash::Key;
use cxlkv_core::index::Handle;
use cxlkv_core::node::Node;
use cxlkv_core::Error;

use crate::harness::model::{msg_keys, msg_of, raw_pattern, ChanMsg, IN_FREE, ROOTED};
use crate::harness::stalls::barrier;
use crate::harness::world::{log, World};

/// Raw allocations, large ones spanning several chunks included: a block
/// never overlaps another live one, and keeps the bytes its owner wrote
/// until freed.
pub(crate) fn raw_op<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, r: u64) {
    let mine: Vec<u64> = w.model.lock().unwrap().raw.iter().filter(|b| b.2 == h).map(|b| b.0).collect();
    if mine.len() >= 2 || (r >> 30).is_multiple_of(3) {
        if let Some(&off) = mine.first() {
            return raw_free(w, node, h, off);
        }
    }
    let len = 64 + (r >> 8) % 12_000;
    let off = match node.alloc(len) {
        Ok(off) => off,
        Err(Error::OutOfSpace | Error::Recovering) => return,
        Err(e) if revoked_ok(w, h, e) => return,
        Err(e) => return w.violation(format!("host {h} alloc {len}: {e:?}")),
    };
    if !track_raw(w, h, off, len) {
        return;
    }
    log(w, off, format!("host {h} alloc raw {off}+{len}"));
    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
        eprintln!("step {}: host {h} alloc raw {off}+{len}", w.now());
    }
    fill_raw(w, node, h, off, len);
}

/// Stores a raw block's pattern, flushed and fenced.
pub(crate) fn fill_raw<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, off: u64, len: u64) {
    let st = node.store;
    w.model.lock().unwrap().raw_filling[h] = true;
    let r =
        st.view.copy_in(off, &raw_pattern(off, len)).and_then(|_| st.co.flush(&st.view, off, len, Site("harness.raw")));
    w.model.lock().unwrap().raw_filling[h] = false;
    st.co.store_fence(Site("harness.raw.fence"));
    if let Err(e) = r {
        w.violation(format!("host {h} raw write: {e:?}"));
    }
}

/// Enters a new raw block of host `h` in the model: it must not overlap any
/// live block. False (a violation) when it does.
pub(crate) fn track_raw(w: &World, h: usize, off: u64, len: u64) -> bool {
    let crashed = w.crashed();
    let mut m = w.model.lock().unwrap();
    // A cut-off root_free whose block is handed out again did free it.
    m.raw.retain(|b| !(b.2 == IN_FREE && b.0 < off + len && off < b.0 + b.1));
    let stalled = m.stall.filter(|_| m.stalled);
    if let Some(b) =
        m.raw.iter().find(|b| Some(b.2) != crashed && Some(b.2) != stalled && b.0 < off + len && off < b.0 + b.1)
    {
        let b = *b;
        let hist: String = m
            .log
            .iter()
            .filter(|x| x.0 == b.0 || x.0 == off)
            .map(|x| format!("\n      step {}: {}", x.1, x.2))
            .collect();
        drop(m);
        w.violation(format!(
            "step {}: host {h} alloc {off}+{len} overlaps host {}'s block {}+{}{hist}",
            w.now(),
            b.2,
            b.0,
            b.1
        ));
        return false;
    }
    m.raw.push((off, len, h));
    true
}

/// A raw block still holds the pattern it was filled with (read fresh).
pub(crate) fn check_raw_bytes<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, off: u64, len: u64) {
    let st = node.store;
    let mut buf = vec![0u8; len as usize];
    let r =
        st.co.invalidate(&st.view, off, len, Site("harness.raw.read")).and_then(|_| st.view.copy_out(off, &mut buf));
    if r.is_err() || buf != raw_pattern(off, len) {
        w.violation(format!("host {h} raw block {off}+{len} changed while allocated ({r:?})"));
    }
}

pub(crate) fn raw_free<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, off: u64) {
    let len = {
        let mut m = w.model.lock().unwrap();
        let Some(i) = m.raw.iter().position(|b| b.0 == off && b.2 == h) else { return };
        m.raw.swap_remove(i).1
    };
    check_raw_bytes(w, node, h, off, len);
    log(w, off, format!("host {h} free raw {off}+{len}"));
    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
        eprintln!("step {}: host {h} free raw {off}+{len}", w.now());
    }
    // Recovering: the allocator lock awaits repair; nothing was freed, so
    // retry once it is repaired (a raw block is not recovery's to reclaim
    // while its owner lives).
    let mut r = node.free(off);
    while r == Err(Error::Recovering) {
        w.yield_now(3 * h, "free-retry");
        r = node.free(off);
    }
    match r {
        Ok(()) => {}
        Err(e) if revoked_ok(w, h, e) => {}
        Err(e) => w.violation(format!("host {h} free {off}: {e:?}")),
    }
}

/// Named roots `r0`..: any host puts, destroys or reads any of them. An
/// operation that ran alone on its name (no other put or destroy of it began
/// or was under way meanwhile) must agree with what the model knows: put
/// fails with Exists exactly when present, destroy with NotFound exactly when
/// absent, and a read returns exactly the state.
pub(crate) fn roots_op<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, r: u64) {
    let g = (r >> 50) as usize % w.hosts;
    let name = format!("r{g}");
    if !(r >> 40).is_multiple_of(2) {
        root_read(w, node, h, g, &name);
    } else {
        root_change(w, node, h, g, &name, r);
    }
}

/// Whether this run's root table can be full: it holds a root per host,
/// the counter's, an application lock record each (two at most) and, in a
/// run with a tenant, the tenant's namespace. With five hosts and a tenant
/// that is one more than the eight records of
/// [`crate::harness::params::sim_caps`] (seed 174048):
/// a put may then find the table full.
fn roots_can_fill<C: Coherence>(w: &World, node: &Node<'_, C>) -> bool {
    let caps = &node.store.layout.caps;
    let records = w.hosts as u32 + 1 + caps.app_locks + u32::from(crate::harness::model::TENANTS.with(|t| t.get()));
    records > caps.n_roots
}

/// Reads root `name` (host `g`'s) and the block it names: both must be as
/// the model says while no put or destroy of it runs.
fn root_read<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, g: usize, name: &str) {
    let before = w.model.lock().unwrap().roots[g];
    let got = cxlkv_core::roots::get(node.store, name.as_bytes());
    // The block it names, read while no put or destroy of it runs.
    let mut bytes = Vec::new();
    if let Ok(root) = got {
        let st = node.store;
        bytes = vec![0u8; root.size as usize];
        let r = st
            .co
            .invalidate(&st.view, root.offset, root.size, Site("harness.root.read"))
            .and_then(|_| st.view.copy_out(root.offset, &mut bytes));
        if r.is_err() {
            bytes.clear();
        }
    }
    let after = w.model.lock().unwrap().roots[g];
    let alone = before.inflight == 0 && after.inflight == 0 && before.begun == after.begun;
    if let (Ok(root), true) = (got, alone) {
        if bytes != raw_pattern(root.offset, root.size) {
            w.violation(format!("host {h} root {name} names block {}+{} whose bytes changed", root.offset, root.size));
        }
    }
    let got = match got {
        Ok(root) => Some(root.size),
        Err(Error::NotFound) => None,
        Err(e) => return w.violation(format!("host {h} get root {name}: {e:?}")),
    };
    if let (Some(want), true) = (before.state, alone) {
        if got != want {
            w.violation(format!("host {h} read root {name} as {got:?}; it is {want:?}"));
        }
    }
}

/// Puts root `name` (host `g`'s) naming a fresh block, or destroys it and
/// frees its block (`root_free`); the result must agree with the model
/// when nothing else touched the root meanwhile.
fn root_change<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, g: usize, name: &str, r: u64) {
    let begin = || {
        let mut m = w.model.lock().unwrap();
        let x = m.roots[g];
        m.roots[g].inflight += 1;
        m.roots[g].begun += 1;
        x
    };
    let put = (r >> 20).is_multiple_of(2);
    let size = 64 + r % 1000;
    let before = begin();
    // A put names a raw block of its own, which the root then keeps alive
    // (its allocator may die: recovery must not reclaim it); a destroy
    // frees the block its root named, in the same step (`root_free`).
    let block = if put { rooted_alloc(w, node, h, size) } else { None };
    if put && block.is_none() {
        w.model.lock().unwrap().roots[g].inflight -= 1;
        return;
    }
    let res = if let Some(off) = block {
        node.root_put(name.as_bytes(), cxlkv_core::roots::Root { offset: off, size, tag: h as u32 })
    } else {
        root_free(w, node, h, name)
    };
    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
        eprintln!(
            "step {}: host {h} root {} {name} block {block:?}: {res:?}",
            w.now(),
            if put { "put" } else { "destroy" }
        );
    }
    // A full table refused the put: the root is not there, its block is
    // the caller's to free.
    let full = put && res == Err(Error::RootsFull) && roots_can_fill(w, node);
    if let Some(off) = block {
        match res {
            Ok(()) => {
                let mut m = w.model.lock().unwrap();
                if let Some(b) = m.raw.iter_mut().find(|b| b.0 == off && b.2 == h) {
                    b.2 = ROOTED;
                }
            }
            Err(Error::Exists) => raw_free(w, node, h, off),
            Err(Error::RootsFull) if full => raw_free(w, node, h, off),
            // Revoked: the root may or may not name it; the block stays.
            Err(_) => {}
        }
    }
    let mut m = w.model.lock().unwrap();
    m.roots[g].inflight -= 1;
    let alone = before.inflight == 0 && m.roots[g].inflight == 0 && m.roots[g].begun == before.begun + 1;
    let next = match (put, res) {
        (true, Ok(())) => Some(Some(size)),
        (false, Ok(())) | (false, Err(Error::NotFound)) => Some(None),
        (true, Err(Error::RootsFull)) if full => Some(None),
        (true, Err(Error::Exists)) => None,
        (_, Err(e)) => {
            // Revoked after the change was made: the state is unknown.
            m.roots[g].state = None;
            drop(m);
            if !revoked_ok(w, h, e) {
                w.violation(format!("host {h} {} root {name}: {e:?}", if put { "put" } else { "destroy" }));
            }
            return;
        }
    };
    if !alone {
        m.roots[g].state = None;
        return;
    }
    if let Some(was) = before.state {
        let agrees = match (put, res) {
            (true, Ok(())) | (false, Err(Error::NotFound)) | (true, Err(Error::RootsFull)) => was.is_none(),
            _ => was.is_some(),
        };
        if !agrees {
            drop(m);
            return w.violation(format!(
                "host {h} {} root {name} gave {res:?}; it was {was:?}",
                if put { "put" } else { "destroy" }
            ));
        }
    }
    // An Exists leaves the size unknown unless the model knew it.
    m.roots[g].state = next.or(before.state);
}

/// Allocates and fills a raw block for a root to name (tracked as host
/// `h`'s until the root names it). None when there is no room now.
pub(crate) fn rooted_alloc<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, size: u64) -> Option<u64> {
    let off = match node.alloc(size) {
        Ok(off) => off,
        Err(Error::OutOfSpace | Error::Recovering) => return None,
        Err(e) if revoked_ok(w, h, e) => return None,
        Err(e) => {
            w.violation(format!("host {h} alloc {size} for a root: {e:?}"));
            return None;
        }
    };
    if !track_raw(w, h, off, size) {
        return None;
    }
    if std::env::var("CXLKV_SIM_DEBUG").is_ok() {
        eprintln!("step {}: host {h} alloc rooted {off}+{size}", w.now());
    }
    fill_raw(w, node, h, off, size);
    Some(off)
}

/// Once, when every operation is done: blocks the model still takes for
/// rooted that no root names any more are freed by host `h`. A put or a
/// root_free whose unlock was interrupted by a stall past the lease returns
/// Revoked after it changed the roots, so its caller never learnt the
/// block's fate; a live process cleaning up frees it, as an application
/// would.
pub(crate) fn adopt_unrooted<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize) {
    {
        let mut m = w.model.lock().unwrap();
        if m.adopted {
            return;
        }
        m.adopted = true;
    }
    let named: Vec<u64> = (0..w.hosts)
        .filter_map(|g| cxlkv_core::roots::get(node.store, format!("r{g}").as_bytes()).ok())
        .map(|r| r.offset)
        .collect();
    let (lost, cut): (Vec<u64>, Vec<u64>) = {
        let mut m = w.model.lock().unwrap();
        let counter = m.counter_root;
        let lost = m
            .raw
            .iter_mut()
            .filter(|b| b.2 == ROOTED && b.0 != counter && !named.contains(&b.0))
            .map(|b| {
                b.2 = h;
                b.0
            })
            .collect();
        let cut = m.raw.iter().filter(|b| b.2 == IN_FREE && !named.contains(&b.0)).map(|b| b.0).collect();
        m.raw.retain(|b| b.2 != IN_FREE || named.contains(&b.0));
        (lost, cut)
    };
    for off in lost {
        raw_free(w, node, h, off);
    }
    // A root_free cut off after it freed leaves nothing to free (refused);
    // cut off before, the block is still allocated: freed now.
    for off in cut {
        let mut r = node.free(off);
        while r == Err(Error::Recovering) {
            w.yield_now(3 * h, "free-retry");
            r = node.free(off);
        }
        match r {
            Ok(()) | Err(Error::InvalidArgument) => {}
            Err(e) if revoked_ok(w, h, e) => {}
            Err(e) => w.violation(format!("host {h} free of a cut-off root_free's block {off}: {e:?}")),
        }
    }
}

/// Destroys root `name` and frees the block it names in one step
/// (`Node::root_free`), retried while that block's heap awaits repair. The
/// block, checked for its bytes first, is in the model as being freed until
/// the call returns: cut off by a crash or a revocation, it stays so
/// (freed or not; see [`IN_FREE`]).
pub(crate) fn root_free<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, name: &str) -> Result<(), Error> {
    if let Ok(root) = cxlkv_core::roots::get(node.store, name.as_bytes()) {
        let mine = {
            let mut m = w.model.lock().unwrap();
            m.raw.iter_mut().find(|b| b.0 == root.offset && b.2 == ROOTED).map(|b| b.2 = IN_FREE).is_some()
        };
        if mine {
            check_raw_bytes(w, node, h, root.offset, root.size);
        }
    }
    let mut r = node.root_free(name.as_bytes());
    while r == Err(Error::Recovering) {
        w.yield_now(3 * h, "free-retry");
        r = node.root_free(name.as_bytes());
    }
    let root = r?;
    let mut m = w.model.lock().unwrap();
    m.raw.retain(|b| !(b.0 == root.offset && (b.2 == ROOTED || b.2 == IN_FREE)));
    drop(m);
    log(w, root.offset, format!("host {h} root_free {name} {}+{}", root.offset, root.size));
    Ok(())
}

/// Node `id`'s slot is about to be attached: a send from now until
/// [`chan_attached`] may address either incarnation (the model's epoch is
/// odd meanwhile, and a message sent across it is for neither).
pub(crate) fn chan_attaching(w: &World, id: u32) {
    *w.model.lock().unwrap().node_epoch.entry(id).or_default() += 1;
}

/// Node `id`'s slot was attached: messages sent from now on are for it.
pub(crate) fn chan_attached(w: &World, id: u32) {
    *w.model.lock().unwrap().node_epoch.entry(id).or_default() += 1;
}

pub(crate) fn chan_err(w: &World, h: usize, what: &str, e: Error, ok: &[Error]) {
    if !ok.contains(&e) && !revoked_ok(w, h, e) {
        w.violation(format!("host {h} {what}: unexpected {e:?}"));
    }
}

/// Sends message `n` keys long to node `to`, recorded in the model. Returns
/// whether the send returned Ok, and the error otherwise.
pub(crate) fn chan_send<C: Coherence>(w: &World, node: &Node<'_, C>, to: u32, n: usize) -> Result<(), Error> {
    let (id, epoch0) = {
        let mut m = w.model.lock().unwrap();
        m.next_msg += 1;
        let id = m.next_msg;
        let epoch0 = m.node_epoch.get(&to).copied().unwrap_or(0);
        m.msgs.insert(id, ChanMsg { from: node.id, to, keys: n, acked: false, received: false, epoch: None });
        (id, epoch0)
    };
    let r = node.send(to, &msg_of(id, n), &msg_keys(id, n));
    let mut m = w.model.lock().unwrap();
    let epoch1 = m.node_epoch.get(&to).copied().unwrap_or(0);
    match r {
        Ok(()) => {
            if let Some(c) = m.msgs.get_mut(&id) {
                c.acked = true;
                c.epoch = (epoch0 == epoch1 && epoch1 % 2 == 0).then_some(epoch1);
            }
        }
        // Refused before anything was written.
        Err(Error::BadNode | Error::InboxFull | Error::TooLarge) => {
            m.msgs.remove(&id);
        }
        // May or may not have landed.
        Err(_) => {}
    }
    r
}

/// Takes every message waiting in this node's inbox and checks each against
/// the model: sent to this node, once, whole, and none of the same sender's
/// acknowledged earlier ones skipped.
pub(crate) fn chan_drain<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize) {
    let mut buf = vec![Key::default(); 64];
    loop {
        match node.try_recv(&mut buf) {
            Ok(None) => return,
            Ok(Some(msg)) => chan_verify(w, node.id, h, &msg, &buf[..(msg.n_keys as usize).min(buf.len())]),
            Err(e) => return chan_err(w, h, "try_recv", e, &[]),
        }
    }
}

pub(crate) fn chan_verify(w: &World, me: u32, h: usize, msg: &Message, keys: &[Key]) {
    let id = msg.request_id;
    let mut m = w.model.lock().unwrap();
    let epoch = m.node_epoch.get(&me).copied().unwrap_or(0);
    let bad = match m.msgs.get(&id) {
        None => Some(format!("host {h} received message {id}, never sent")),
        Some(c) if c.to != me => Some(format!("host {h} node {me} received message {id} sent to node {}", c.to)),
        Some(c) if c.received => Some(format!("host {h} received message {id} twice")),
        Some(c) if c.epoch.is_some_and(|e| e != epoch) => Some(format!(
            "host {h} node {me} (incarnation {epoch}) received message {id}, sent to its incarnation {:?}",
            c.epoch
        )),
        Some(c)
            if *msg != Message { from: c.from, n_keys: c.keys as u32, ..msg_of(id, c.keys) }
                || keys != &msg_keys(id, c.keys)[..] =>
        {
            Some(format!("host {h} received message {id} altered: {msg:?}"))
        }
        Some(c) => {
            let from = c.from;
            m.msgs
                .range(..id)
                .find(|(_, o)| o.from == from && o.to == me && o.acked && !o.received && o.epoch == Some(epoch))
                .map(|(oid, _)| format!("host {h} received message {id} from node {from} but not its earlier {oid}"))
        }
    };
    if let Some(c) = m.msgs.get_mut(&id) {
        c.received = true;
    }
    drop(m);
    if let Some(v) = bad {
        w.violation(v);
    }
}

/// A channel operation: drain this node's inbox, then (mostly) send a
/// message of 0 to 39 keys to a random node (itself included).
pub(crate) fn channel_op<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, r: u64) {
    chan_drain(w, node, h);
    if (r >> 8).is_multiple_of(4) {
        return;
    }
    let to = ((r >> 12) % w.hosts as u64) as u32;
    let n = ((r >> 16) % 40) as usize;
    if let Err(e) = chan_send(w, node, to, n) {
        chan_err(w, h, "send", e, &[Error::BadNode, Error::InboxFull, Error::Recovering]);
    }
}

/// Every acknowledged message for this incarnation of the node was received.
pub(crate) fn chan_complete(w: &World, me: u32, h: usize, when: &str) {
    let m = w.model.lock().unwrap();
    let epoch = m.node_epoch.get(&me).copied().unwrap_or(0);
    let lost: Vec<u64> = m
        .msgs
        .iter()
        .filter(|(_, c)| c.to == me && c.acked && !c.received && c.epoch == Some(epoch))
        .map(|(id, _)| *id)
        .collect();
    drop(m);
    if !lost.is_empty() {
        w.violation(format!("host {h} node {me} {when}: acknowledged messages never delivered: {lost:?}"));
    }
}

/// At the end, quiescent: every node drains its inbox (nothing acknowledged
/// may be missing), then fills its neighbour's emptied ring (exactly as many
/// one-slot messages as it has slots must fit: a stale head refuses sooner),
/// then drains again.
pub(crate) fn channel_end<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, me: usize) {
    chan_drain(w, node, h);
    chan_complete(w, node.id, h, "at the end");
    barrier(w, me, 4);
    let to = (node.id + 1) % w.hosts as u32;
    let cap = node.store.layout.caps.inbox_slots as usize;
    let mut sent = 0;
    let mut refused = None;
    for i in 0..=cap {
        match chan_send(w, node, to, i % 12 + 1) {
            Ok(()) => sent += 1,
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    match refused {
        Some(Error::InboxFull) if sent == cap => {}
        // Its host crashed or stalled: no node there.
        Some(Error::BadNode) if sent == 0 => {}
        Some(Error::InboxFull) => {
            w.violation(format!("host {h}: node {to}'s empty inbox of {cap} slots took {sent} one-slot messages"))
        }
        Some(e) => chan_err(w, h, "send at the end", e, &[Error::Recovering]),
        None => w.violation(format!("host {h}: node {to}'s inbox of {cap} slots took {sent} one-slot messages")),
    }
    barrier(w, me, 5);
    chan_drain(w, node, h);
    chan_complete(w, node.id, h, "after the fill");
    channel_stream(w, node, h, me);
}

/// Node 0 streams multi-slot messages to node 1, which polls all along:
/// a first header that lands before the rest of its message is caught.
pub(crate) fn channel_stream<C: Coherence>(w: &World, node: &Node<'_, C>, h: usize, me: usize) {
    const MSGS: usize = 6;
    if node.id == 0 {
        'msgs: for i in 0..MSGS {
            loop {
                match chan_send(w, node, 1, 25 + 4 * i) {
                    Ok(()) => break,
                    Err(Error::InboxFull) => w.yield_now(me, "stream-full"),
                    Err(Error::BadNode) => break 'msgs,
                    Err(e) => {
                        chan_err(w, h, "stream send", e, &[Error::Recovering]);
                        break 'msgs;
                    }
                }
            }
        }
        w.model.lock().unwrap().stream_done = true;
    } else if node.id == 1 {
        // (Bounded all the same.) A crashed host 0 streams nothing: with 5
        // hosts, 20,000 polls took seed 121036 of crash-lazy-5x300 past the
        // step limit.
        for _ in 0..20_000 {
            chan_drain(w, node, h);
            if w.model.lock().unwrap().stream_done || w.crashed() == Some(0) {
                chan_drain(w, node, h);
                chan_complete(w, node.id, h, "after the stream");
                return;
            }
            w.yield_now(me, "stream-poll");
        }
    }
}

/// Stalls host `h` once, at an operation boundary with nothing pinned or
/// being written: the op actor asks, and its manager actor (the heartbeat
/// thread) parks all three of the host's actors between two steps, when it
/// is not the active manager and no recovery is pending (a manager or a
/// recovery stalled half way is outside what the protocol can fence).
/// Returns true after the stall.
/// A Revoked error is the right answer for the stalled host once it woke
/// (its node was freed meanwhile); counted.
pub(crate) fn revoked_ok(w: &World, h: usize, e: Error) -> bool {
    let mut m = w.model.lock().unwrap();
    let ok = e == Error::Revoked && m.stall == Some(h) && m.stalled;
    m.revoked_ops += ok as u64;
    ok
}

/// Writes payload bytes into a reserved block: through `Node::write` (which
/// flushes), or by plain stores through the mapping as a user holding a
/// pointer would (published later by `publish`, which flushes).
pub(crate) fn write_payload<C: Coherence>(
    w: &World,
    node: &Node<'_, C>,
    h: usize,
    hd: &Handle,
    at: usize,
    data: &[u8],
    raw: bool,
) {
    let r = if raw { node.store.view.copy_in(hd.off + at as u64, data) } else { node.write(hd, at as u64, data) };
    if let Err(e) = r {
        w.violation(format!("host {h} write (raw {raw}): {e:?}"));
    }
}
