//! Channels (DESIGN.md "Channels", Beluga §6.2): each node's inbox in the
//! region, so a prefill worker hands a decode worker "request R: these
//! block keys are ready" with no network hop.
//!
//! A node's inbox is one ring per sender node: every line of a ring has one
//! writer (its sender writes the slots, the inbox's owner the head), so a
//! send takes no lock — stores, a flush, a fence — and a sender stopped,
//! declared dead and woken (a zombie) can land late lines only in its own
//! rings, which nobody else writes until it is quiet and its slot is free.
//!
//! A ring has `inbox_slots` slots of four lines: a [`MsgHeader`] and twelve
//! keys. A message spans `ceil(keys / 12)` consecutive slots (at least one).
//! Ring positions count up forever; position `p` uses slot `p % slots` and a
//! slot written for position `p` carries `seq = p + 1`.
//!
//! - **The owner** alone consumes and alone writes the rings' [`InboxHead`]s:
//!   the position of the next unread message of each. It reads the header
//!   at that position fresh, state word first; `seq == head + 1` means a
//!   whole message is there (its first header is written last). It reads
//!   the other slots fresh, checks their `seq` and the checksum, then
//!   publishes the new head. It looks at the rings in turn, from the one
//!   after the last it took a message from, so no sender starves another.
//! - **The sender** (the threads of one node take turns, in the node's
//!   host-local state) reads its ring's head fresh and walks the pending
//!   messages (each first header read fresh) to the first position without
//!   one, then writes there: every later slot and the keys, flushed, a
//!   store fence, the first header last. A sender that died mid-send left
//!   either a whole message (its first header landed: it is delivered) or
//!   none (its successor in the slot overwrites it), so a dead sender needs
//!   no repair.
//! - A stale head only makes a sender walk further or refuse with
//!   `InboxFull` sooner; it never makes it overwrite an unread message.
//! - **The cursor.** Being its rings' one writer, a sender process keeps
//!   where it writes next in each ring and the head it last read there
//!   ([`Cursors`]): a send that fits before that head writes at once,
//!   reading neither the head nor the slot. Only a ring that looks full has
//!   its head read fresh; a head that is not at most a ring behind the
//!   cursor (an owner's successor that went on from an older copy of it)
//!   drops the cursor for a walk from that head, as above. A new process in
//!   the node's slot starts without cursors: its first send to a ring walks.
//! - Each message names the incarnation of its receiver; the owner drops
//!   messages for an earlier incarnation of its slot.

use crate::coherence::{Coherence, Site};
use crate::hash::{mix64, Key};
use crate::layout::{InboxHead, MsgHeader, NodeInfo, KEYS_PER_SLOT, MAX_NODES, NODE_ALIVE};
use crate::mem::LINE;
use crate::mutant::mutant;
use crate::node::Node;
use crate::{Error, Result};

/// A message's fields; its keys travel beside it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Message {
    /// Application-defined kind (e.g. handoff, request, response).
    pub kind: u32,
    /// Application-defined request id.
    pub request_id: u64,
    /// Namespace of the keys.
    pub ns: u32,
    /// Application-defined status (e.g. of a response).
    pub status: u32,
    /// Application-defined stamp (e.g. a send time).
    pub stamp: u64,
    /// Sender node (set by `send`).
    pub from: u32,
    /// Keys the message carries (set by `send` and `try_recv`).
    pub n_keys: u32,
}

/// Where a sender process writes next in each of its rings (see the
/// module's "The cursor"), by receiver node.
pub(crate) struct Cursors(pub(crate) [Option<Cursor>; MAX_NODES as usize]);

impl Default for Cursors {
    fn default() -> Cursors {
        Cursors([None; MAX_NODES as usize])
    }
}

/// The owner's side of an inbox, per process: the ring the next receive
/// looks at first, and each ring's head once read.
pub(crate) struct Heads {
    next: u32,
    at: [Option<u64>; MAX_NODES as usize],
}

impl Default for Heads {
    fn default() -> Heads {
        Heads { next: 0, at: [None; MAX_NODES as usize] }
    }
}

/// A sender's next position in one ring, and the owner's head it last read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cursor {
    pos: u64,
    head: u64,
}

/// Slots a message of `n_keys` keys spans.
pub fn slots_for(n_keys: usize) -> u64 {
    n_keys.div_ceil(KEYS_PER_SLOT).max(1) as u64
}

fn checksum_seed(h: &MsgHeader) -> u64 {
    let mut x = mix64(h.request_id ^ 0x6368_616e_6e65_6c31);
    for w in [
        h.stamp,
        h.kind as u64 | (h.n_keys as u64) << 32,
        h.ns as u64 | (h.from as u64) << 32,
        h.to_incarnation as u64 | (h.slots as u64) << 32,
        h.status as u64,
    ] {
        x = mix64(x ^ w);
    }
    x
}

fn fold_keys(mut x: u64, keys: &[Key]) -> u64 {
    for k in keys {
        x = mix64(mix64(x ^ k.lo) ^ k.hi);
    }
    x
}

/// True when `h`, read at ring position `pos`, starts a message: its first
/// header landed for this position. Continuation slots (a dead producer's
/// leftovers among them) never do.
fn starts_message(h: &MsgHeader, pos: u64) -> bool {
    h.seq == pos.wrapping_add(1) && h.index == 0
}

/// Slots a starting header claims: its own count when plausible, else 1 (a
/// corrupt header is skipped alone, by producers and owner alike).
fn claimed_slots(h: &MsgHeader, cap: u64) -> u64 {
    let n = h.slots as u64;
    if n >= slots_for(h.n_keys as usize) && n <= cap {
        n
    } else {
        1
    }
}

/// Keys in one key line of a slot.
const KEYS_PER_LINE: usize = (LINE / 16) as usize;

/// The `j`-th key line of the slot at `off` (its header is the first line).
fn key_line(off: u64, j: usize) -> u64 {
    off.wrapping_add(LINE).wrapping_add((j as u64).wrapping_mul(LINE))
}

impl<C: Coherence> Node<'_, C> {
    /// Sends `msg` with `keys` to node `to`'s inbox. `BadNode` when `to` is
    /// not attached, `InboxFull` when this node's ring there has no room now
    /// (retry later), `TooLarge` when the keys would not fit in an empty
    /// ring, `Revoked` when this node was declared dead. Sets nothing in
    /// `msg`; the receiver sees `from` = this node.
    pub fn send(&self, to: u32, msg: &Message, keys: &[Key]) -> Result<()> {
        self.not_revoked()?;
        let l = &self.store.layout;
        if to >= l.caps.max_nodes {
            return Err(Error::BadNode);
        }
        let cap = l.caps.inbox_slots as u64;
        let k = slots_for(keys.len());
        if k > cap || keys.len() > u32::MAX as usize {
            return Err(Error::TooLarge);
        }
        // The ring's one writer: this node's threads take turns.
        let mut cursors = self.local.sending.lock();
        // A node declared dead writes nothing more: its slot (and so its
        // rings) may be recovered and taken by another process.
        self.owns_slot()?;
        let cursor = cursors.0.get_mut(to as usize).ok_or(Error::BadNode)?;
        // Dropped while the send runs: one that fails half-way walks again.
        let known = cursor.take();
        let (pos, head) = self.send_turn(to, msg, keys, k, known)?;
        *cursor = Some(Cursor { pos: pos.wrapping_add(k), head });
        Ok(())
    }

    /// Writes the message at the ring's next free position, from `known`
    /// when it is there; that position and the head it counted from.
    fn send_turn(&self, to: u32, msg: &Message, keys: &[Key], k: u64, known: Option<Cursor>) -> Result<(u64, u64)> {
        let st = self.store;
        let l = &st.layout;
        let cap = l.caps.inbox_slots as u64;
        let info: NodeInfo = st.fresh_state_first(l.node_info(to), Site("inbox.send.info"))?;
        if info.state != NODE_ALIVE {
            return Err(Error::BadNode);
        }
        let me = self.id;
        // SYNC: fresh head (writer: the inbox's owner, as it consumes).
        let read_head = || st.fresh::<InboxHead>(l.inbox_head(to, me), Site("inbox.send.head")).map(|h| h.head);
        let (mut pos, mut head) = match known {
            Some(c) => (c.pos, c.head),
            _ => {
                let head = read_head()?;
                (self.walk(to, head)?, head)
            }
        };
        // Positions are sequence numbers: differences wrap as a ring's.
        if pos.wrapping_add(k).wrapping_sub(head) > cap && known.is_some() && !mutant!("inbox.cursor_head_kept") {
            // Full as last seen: what the owner consumed since.
            head = read_head()?;
            if pos.wrapping_sub(head) > cap {
                // More than a ring behind (or ahead of) this sender's
                // writes: not a head this ring's owner could have written
                // after them. As without a cursor: walk from it.
                pos = self.walk(to, head)?;
            }
        }
        if pos.wrapping_add(k).wrapping_sub(head) > cap {
            return Err(Error::InboxFull);
        }
        let mut first = MsgHeader {
            seq: pos.wrapping_add(1),
            request_id: msg.request_id,
            stamp: msg.stamp,
            checksum: 0,
            kind: msg.kind,
            n_keys: keys.len() as u32,
            ns: msg.ns,
            from: self.id,
            to_incarnation: info.incarnation as u32,
            slots: k as u32,
            status: msg.status,
            index: 0,
        };
        first.checksum = fold_keys(checksum_seed(&first), keys);
        let early = mutant!("inbox.first_header_early");
        if early {
            // The first header stored first, and flushed with the body.
            st.write_state_last(l.inbox_slot(to, me, pos), &first)?;
        }
        for i in 0..k {
            let off = l.inbox_slot(to, me, pos.wrapping_add(i));
            let slot_keys = keys.chunks(KEYS_PER_SLOT).nth(i as usize).unwrap_or_default();
            // Only the key lines that hold keys are written (and read by the
            // owner): a message without keys is its header alone.
            for (j, line_keys) in slot_keys.chunks(KEYS_PER_LINE).enumerate() {
                let mut words = [0u64; 8];
                for (pair, key) in words.chunks_exact_mut(2).zip(line_keys) {
                    pair.copy_from_slice(&[key.lo, key.hi]);
                }
                // A slot's lines lie inside the inbox area (the layout's
                // offsets); the view checks every access.
                st.view.write(key_line(off, j), &words)?;
            }
            if i > 0 {
                let cont = MsgHeader { seq: pos.wrapping_add(i).wrapping_add(1), index: i as u32, ..first };
                st.view.write(off, &cont)?;
            }
            // SYNC: every line but the first header lands before it (reader:
            // the owner, which trusts the others once that header is seen).
            let from = if i == 0 && !early { off.wrapping_add(LINE) } else { off };
            let end = key_line(off, slot_keys.len().div_ceil(KEYS_PER_LINE));
            if end > from {
                st.co.flush(&st.view, from, end.wrapping_sub(from), Site("inbox.send.body"))?;
            }
        }
        st.co.store_fence(Site("inbox.send.fence"));
        // SYNC: the first header, state word last, makes the message whole
        // (reader: the owner's `try_recv`, and this sender's next walk).
        st.publish_state_last(l.inbox_slot(to, me, pos), &first, Site("inbox.send.publish"))?;
        // The message is in memory when the send returns.
        st.co.store_fence(Site("inbox.send.done"));
        Ok((pos, head))
    }

    /// Walks the pending messages of this node's ring in `to`'s inbox from
    /// `head` to the first free position; `InboxFull` when a whole ring of
    /// them is pending.
    fn walk(&self, to: u32, head: u64) -> Result<u64> {
        let st = self.store;
        let l = &st.layout;
        let cap = l.caps.inbox_slots as u64;
        let mut pos = head;
        loop {
            if pos.wrapping_sub(head) >= cap {
                return Err(Error::InboxFull);
            }
            let h: MsgHeader = st.fresh_state_first(l.inbox_slot(to, self.id, pos), Site("inbox.send.probe"))?;
            if !starts_message(&h, pos) {
                return Ok(pos);
            }
            pos = pos.wrapping_add(claimed_slots(&h, cap));
        }
    }

    /// Takes the next message of this node's inbox, copying its keys into
    /// `keys`; `None` when the inbox is empty. `TooLarge` (the message stays)
    /// when `keys` is shorter than the message's key list; `Corrupt` (the
    /// message is skipped) when it fails its checksum. Messages of one
    /// sender come in the order sent; the senders' rings take turns.
    pub fn try_recv(&self, keys: &mut [Key]) -> Result<Option<Message>> {
        self.not_revoked()?;
        let st = self.store;
        let nn = st.layout.caps.max_nodes;
        // The heads' one writer: this node's threads take turns.
        let mut heads = self.local.receiving.lock();
        let me: NodeInfo = st.view.read(st.layout.node_info(self.id))?;
        for i in 0..nn {
            let from = heads.next.wrapping_add(i).checked_rem(nn).unwrap_or(0);
            let head = heads.at.get_mut(from as usize).ok_or(Error::BadNode)?;
            if let Some(m) = self.recv_from(from, me.incarnation as u32, keys, head)? {
                heads.next = from.wrapping_add(1).checked_rem(nn).unwrap_or(0);
                return Ok(Some(m));
            }
        }
        Ok(None)
    }

    /// Takes the next message of sender `from`'s ring in this node's inbox
    /// (see [`Node::try_recv`]); `incarnation` is this node's, `known` the
    /// ring's head as this process last wrote it.
    fn recv_from(
        &self,
        from: u32,
        incarnation: u32,
        keys: &mut [Key],
        known: &mut Option<u64>,
    ) -> Result<Option<Message>> {
        let st = self.store;
        let l = &st.layout;
        let cap = l.caps.inbox_slots as u64;
        let head_at = l.inbox_head(self.id, from);
        let start = match *known {
            // The owner is the head's only writer: after its first read, this
            // process knows it.
            Some(h) => h,
            _ => {
                // SYNC: fresh head, once a process (writer: this slot's
                // earlier owners). A copy in this host's cache may be older
                // than memory by more than a ring (another host's process
                // owned the inbox since): read from there, a whole ring of
                // messages overwritten since would stop this owner for good.
                let h = st.fresh::<InboxHead>(head_at, Site("inbox.recv.head.first"))?.head;
                *known = Some(h);
                h
            }
        };
        let mut head = start;
        let mut out = None;
        let mut err = None;
        for _ in 0..cap {
            let h: MsgHeader = st.fresh_state_first(l.inbox_slot(self.id, from, head), Site("inbox.recv.header"))?;
            if !starts_message(&h, head) {
                break;
            }
            let n = claimed_slots(&h, cap);
            let mine = h.to_incarnation == incarnation || mutant!("inbox.ignore_incarnation");
            if n != h.slots as u64 {
                head = head.wrapping_add(1);
                err = Some(Error::Corrupt);
                break;
            }
            if mine && keys.len() < h.n_keys as usize {
                return Err(Error::TooLarge);
            }
            // A header naming another sender was not written by this ring's.
            let whole = h.from == from && self.read_message(from, head, &h, if mine { &mut *keys } else { &mut [] })?;
            head = head.wrapping_add(n);
            if !whole {
                err = Some(Error::Corrupt);
                break;
            }
            if mine {
                out = Some(Message {
                    kind: h.kind,
                    request_id: h.request_id,
                    ns: h.ns,
                    status: h.status,
                    stamp: h.stamp,
                    from: h.from,
                    n_keys: h.n_keys,
                });
                break;
            }
            // A message for an earlier incarnation of this slot: dropped.
        }
        if head != start {
            *known = Some(head);
            // SYNC: the sender reads the head fresh to see the room it frees.
            st.publish(head_at, &InboxHead { head, reserved: [0; 7] }, Site("inbox.recv.head"))?;
            st.co.store_fence(Site("inbox.recv.head.fence"));
        }
        match (out, err) {
            (Some(m), _) => Ok(Some(m)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(None),
        }
    }

    /// Reads the keys of the message whose first header `h` sits at ring
    /// position `pos` into `keys` (as many as fit); false when a later slot
    /// or the checksum does not match.
    fn read_message(&self, from: u32, pos: u64, h: &MsgHeader, keys: &mut [Key]) -> Result<bool> {
        let st = self.store;
        let l = &st.layout;
        let n = h.n_keys as usize;
        let mut buf = [Key::default(); KEYS_PER_SLOT];
        let mut sum = checksum_seed(h);
        let mut got = 0usize;
        for i in 0..h.slots as u64 {
            let off = l.inbox_slot(self.id, from, pos.wrapping_add(i));
            if i > 0 {
                let c: MsgHeader = st.fresh(off, Site("inbox.recv.cont"))?;
                if c.seq != pos.wrapping_add(i).wrapping_add(1) || c.index != i as u32 {
                    return Ok(false);
                }
            }
            let take = n.saturating_sub(got).min(KEYS_PER_SLOT);
            // The key lines that hold this slot's keys, and no more (see
            // `send_turn`).
            let lines = take.div_ceil(KEYS_PER_LINE);
            if lines > 0 {
                st.co.invalidate(
                    &st.view,
                    off.wrapping_add(LINE),
                    (lines as u64).wrapping_mul(LINE),
                    Site("inbox.recv.keys"),
                )?;
            }
            let mine = buf.get_mut(..take).unwrap_or_default();
            for (j, line_keys) in mine.chunks_mut(KEYS_PER_LINE).enumerate() {
                let w: [u64; 8] = st.view.read(key_line(off, j))?;
                for (k, pair) in line_keys.iter_mut().zip(w.chunks_exact(2)) {
                    if let &[lo, hi] = pair {
                        *k = Key { lo, hi };
                    }
                }
            }
            for (dst, k) in keys.iter_mut().skip(got).zip(mine.iter()) {
                *dst = *k;
            }
            sum = fold_keys(sum, buf.get(..take).unwrap_or_default());
            got = got.saturating_add(take);
        }
        Ok(got == n && sum == h.checksum)
    }
}

impl<C: Coherence> crate::store::Store<C> {
    /// Messages waiting in node `n`'s inbox and the slots they take, read
    /// fresh without a lock (a snapshot for metrics: senders and the owner
    /// move on meanwhile).
    pub fn inbox_depth(&self, n: u32) -> Result<(u64, u64)> {
        let l = &self.layout;
        if n >= l.caps.max_nodes {
            return Err(Error::BadNode);
        }
        let cap = l.caps.inbox_slots as u64;
        let (mut msgs, mut slots) = (0u64, 0u64);
        for from in 0..l.caps.max_nodes {
            // SYNC: fresh reads that feed only a report (metrics), as below.
            let head = self.fresh::<InboxHead>(l.inbox_head(n, from), Site("inbox.depth.head.report"))?.head;
            let mut pos = head;
            while pos.wrapping_sub(head) < cap {
                let h: MsgHeader =
                    self.fresh_state_first(l.inbox_slot(n, from, pos), Site("inbox.depth.probe.report"))?;
                if !starts_message(&h, pos) {
                    break;
                }
                msgs = msgs.saturating_add(1);
                pos = pos.wrapping_add(claimed_slots(&h, cap));
            }
            slots = slots.saturating_add(pos.wrapping_sub(head).min(cap));
        }
        Ok((msgs, slots))
    }
}

#[cfg(test)]
mod tests {
    use std::vec::Vec;

    use super::*;
    use crate::coherence::Coherent;
    use crate::layout::KEYS_PER_SLOT;
    use crate::node::{Identity, NodeLocal};
    use crate::testutil::{node, small_caps, with_two_nodes, Fixture, InlineEnv};

    fn keys(base: u64, n: usize) -> Vec<Key> {
        (0..n as u64).map(|i| Key { lo: base + i, hi: !(base + i) }).collect()
    }

    /// Runs `body` with nodes 0 and 1 attached to a fresh region.
    fn with_two(body: impl FnOnce(&Fixture, Node<'_, Coherent>, Node<'_, Coherent>)) {
        with_two_nodes(|f, _, a, b| body(f, a, b));
    }

    fn msg(id: u64) -> Message {
        Message { kind: 7, request_id: id, ns: 3, status: 9, stamp: id * 10, ..Message::default() }
    }

    #[test]
    fn messages_arrive_whole_in_order_and_wrap_the_ring() {
        with_two(|_, a, b| {
            let mut buf = std::vec![Key::default(); 100];
            assert_eq!(b.try_recv(&mut buf), Ok(None));
            // 8 slots; sizes 0, 1, 6, 12, 13, 25, 96 keys span 1, 1, 1, 1,
            // 2, 3, 8 slots (and 0, 1, 2, 3, 4, 7, 24 key lines).
            for round in 0..5u64 {
                for (i, n) in [0usize, 1, 6, 12, 13, 25, 96].into_iter().enumerate() {
                    let id = round * 100 + i as u64;
                    a.send(1, &msg(id), &keys(id * 1000, n)).unwrap();
                    let m = b.try_recv(&mut buf).unwrap().unwrap();
                    assert_eq!(m, Message { from: 0, n_keys: n as u32, ..msg(id) });
                    assert_eq!(&buf[..n], &keys(id * 1000, n)[..]);
                    assert_eq!(b.try_recv(&mut buf), Ok(None));
                }
            }
        });
    }

    #[test]
    fn inbox_depth_counts_waiting_messages_and_their_slots() {
        with_two(|f, a, b| {
            let mut buf = std::vec![Key::default(); 100];
            assert_eq!(f.store.inbox_depth(1), Ok((0, 0)));
            a.send(1, &msg(1), &keys(0, 1)).unwrap();
            a.send(1, &msg(2), &keys(0, KEYS_PER_SLOT + 1)).unwrap();
            assert_eq!(f.store.inbox_depth(1), Ok((2, 3)));
            assert_eq!(f.store.inbox_depth(0), Ok((0, 0)));
            b.try_recv(&mut buf).unwrap().unwrap();
            assert_eq!(f.store.inbox_depth(1), Ok((1, 2)));
            assert_eq!(f.store.inbox_depth(99), Err(Error::BadNode));
        });
    }

    #[test]
    fn a_full_ring_refuses_until_its_owner_reads() {
        with_two(|_, a, b| {
            let two = KEYS_PER_SLOT + 1;
            for id in 0..4 {
                a.send(1, &msg(id), &keys(id, two)).unwrap();
            }
            assert_eq!(a.send(1, &msg(9), &[]), Err(Error::InboxFull));
            assert_eq!(a.send(1, &msg(9), &keys(0, 8 * KEYS_PER_SLOT + 1)), Err(Error::TooLarge));
            assert_eq!(a.send(2, &msg(9), &[]), Err(Error::BadNode), "node 2 is not attached");
            assert_eq!(a.send(99, &msg(9), &[]), Err(Error::BadNode));
            let mut short = [Key::default(); 4];
            assert_eq!(b.try_recv(&mut short), Err(Error::TooLarge));
            let mut buf = [Key::default(); 16];
            assert_eq!(b.try_recv(&mut buf).unwrap().unwrap().request_id, 0, "the refused message stayed");
            a.send(1, &msg(4), &keys(4, two)).unwrap();
            for id in 1..5 {
                assert_eq!(b.try_recv(&mut buf).unwrap().unwrap().request_id, id);
                assert_eq!(&buf[..two], &keys(id, two)[..]);
            }
            assert_eq!(b.try_recv(&mut buf), Ok(None));
        });
    }

    #[test]
    fn each_sender_has_its_own_ring_and_the_rings_take_turns() {
        let f = Fixture::new(8 << 20, small_caps());
        for n in 0..3 {
            f.attach(n);
        }
        let env = InlineEnv::new(&f.store);
        let (l0, l1, l2) = (NodeLocal::default(), NodeLocal::default(), NodeLocal::default());
        let (a, b, r) = (node(&f, &env, &l0, 0), node(&f, &env, &l1, 1), node(&f, &env, &l2, 2));
        let cap = f.store.layout.caps.inbox_slots as u64;
        // Sender a fills its ring; b's ring is untouched by it.
        for id in 0..cap {
            a.send(2, &msg(id), &keys(id, 1)).unwrap();
        }
        assert_eq!(a.send(2, &msg(99), &[]), Err(Error::InboxFull));
        for id in 0..3 {
            b.send(2, &msg(100 + id), &keys(100 + id, 2)).unwrap();
        }
        assert_eq!(f.store.inbox_depth(2), Ok((cap + 3, cap + 3)));
        // Turns: a, b, a, b, a, b, then a's rest, each sender's in order.
        let mut buf = [Key::default(); 4];
        let mut got = Vec::new();
        while let Some(m) = r.try_recv(&mut buf).unwrap() {
            assert_eq!(&buf[..m.n_keys as usize], &keys(m.request_id, m.n_keys as usize)[..]);
            got.push((m.from, m.request_id));
        }
        let mut want = std::vec![(0, 0), (1, 100), (0, 1), (1, 101), (0, 2), (1, 102)];
        want.extend((3..cap).map(|id| (0, id)));
        assert_eq!(got, want);
        assert_eq!(f.store.inbox_depth(2), Ok((0, 0)));
        // Room again for a.
        a.send(2, &msg(7), &[]).unwrap();
        assert_eq!(r.try_recv(&mut buf).unwrap().unwrap().request_id, 7);
    }

    #[test]
    fn a_header_naming_another_sender_is_corrupt() {
        with_two(|f, a, b| {
            a.send(1, &msg(1), &keys(1, 1)).unwrap();
            let l = &f.store.layout;
            let at = l.inbox_slot(1, 0, 0);
            let mut h: MsgHeader = f.store.view.read(at).unwrap();
            h.from = 1;
            f.store.view.write(at, &h).unwrap();
            a.send(1, &msg(2), &[]).unwrap();
            let mut buf = [Key::default(); 4];
            assert_eq!(b.try_recv(&mut buf), Err(Error::Corrupt));
            assert_eq!(b.try_recv(&mut buf).unwrap().unwrap().request_id, 2);
        });
    }

    #[test]
    fn a_corrupt_message_is_reported_once_and_skipped() {
        with_two(|f, a, b| {
            a.send(1, &msg(1), &keys(1, 20)).unwrap();
            a.send(1, &msg(2), &keys(2, 3)).unwrap();
            // A hostile peer flips a key of the first message.
            let l = &f.store.layout;
            let off = l.inbox_slot(1, 0, 0) + LINE + 8;
            let w = f.store.view.load_u64(off).unwrap();
            f.store.view.store_u64(off, w ^ 1).unwrap();
            let mut buf = [Key::default(); 32];
            assert_eq!(b.try_recv(&mut buf), Err(Error::Corrupt));
            assert_eq!(b.try_recv(&mut buf).unwrap().unwrap().request_id, 2);
            // A first header claiming more slots than the ring has.
            a.send(1, &msg(3), &keys(3, 1)).unwrap();
            let head_at = l.inbox_slot(1, 0, 3);
            let mut h: MsgHeader = f.store.view.read(head_at).unwrap();
            h.slots = 1000;
            f.store.view.write(head_at, &h).unwrap();
            a.send(1, &msg(4), &keys(4, 1)).unwrap();
            assert_eq!(b.try_recv(&mut buf), Err(Error::Corrupt));
            assert_eq!(b.try_recv(&mut buf).unwrap().unwrap().request_id, 4, "both sides skipped one slot");
        });
    }

    #[test]
    fn a_new_incarnation_drops_what_was_sent_to_the_old_one() {
        let f = Fixture::new(8 << 20, small_caps());
        f.attach(0);
        f.attach(1);
        let env = InlineEnv::new(&f.store);
        let (l0, l1) = (NodeLocal::default(), NodeLocal::default());
        let a = node(&f, &env, &l0, 0);
        a.send(1, &msg(1), &keys(1, 2)).unwrap();
        {
            let b = node(&f, &env, &l1, 1);
            b.detach().unwrap();
        }
        assert_eq!(a.send(1, &msg(2), &[]), Err(Error::BadNode));
        let who = Identity { pid: 5, host_id: 1, nonce: 5, now: 0, pid_ns: 0 };
        crate::node::attach_node(&f.store, Some(1), who).unwrap();
        let l1b = NodeLocal::default();
        let b = node(&f, &env, &l1b, 1);
        a.send(1, &msg(3), &keys(3, 2)).unwrap();
        let mut buf = [Key::default(); 4];
        assert_eq!(b.try_recv(&mut buf).unwrap().unwrap().request_id, 3);
        assert_eq!(b.try_recv(&mut buf), Ok(None));
    }

    #[test]
    fn a_producer_that_died_after_its_header_landed_is_delivered_not_overwritten() {
        with_two(|f, a, b| {
            // A whole message, then the leftovers of a producer that died before
            // its first header: continuation slots only.
            a.send(1, &msg(1), &keys(1, 30)).unwrap();
            let l = &f.store.layout;
            let junk = MsgHeader { seq: 5, index: 1, slots: 0, ..MsgHeader::default() };
            f.store.view.write(l.inbox_slot(1, 0, 4), &junk).unwrap();
            a.send(1, &msg(2), &keys(2, 1)).unwrap();
            let mut buf = [Key::default(); 32];
            assert_eq!(b.try_recv(&mut buf).unwrap().unwrap().request_id, 1);
            assert_eq!(b.try_recv(&mut buf).unwrap().unwrap().request_id, 2);
            assert_eq!(b.try_recv(&mut buf), Ok(None), "the leftover continuation is no message");
            a.send(1, &msg(3), &[]).unwrap();
            assert_eq!(b.try_recv(&mut buf).unwrap().unwrap().request_id, 3);
        });
    }
}
