//! Channels (DESIGN.md "Channels", Beluga §6.2): one inbox ring per node in
//! the region, so a prefill worker hands a decode worker "request R: these
//! block keys are ready" with no network hop.
//!
//! A ring has `inbox_slots` slots of four lines: a [`MsgHeader`] and twelve
//! keys. A message spans `ceil(keys / 12)` consecutive slots (at least one).
//! Ring positions count up forever; position `p` uses slot `p % slots` and a
//! slot written for position `p` carries `seq = p + 1`.
//!
//! - **The owner** alone consumes and alone writes its [`InboxHead`]: the
//!   position of the next unread message. It reads the header at that
//!   position fresh, state word first; `seq == head + 1` means a whole message
//!   is there (its first header is written last). It reads the other slots
//!   fresh, checks their `seq` and the checksum, then publishes the new head.
//! - **Producers** serialise on the inbox lock. There is no tail: a producer
//!   reads the head fresh and walks the pending messages (each first header
//!   read fresh) to the first position without one, then writes there: every
//!   later slot and the keys, flushed, a store fence, the first header last.
//!   A producer that died mid-send left either a whole message (its first
//!   header landed: it is delivered) or none (the next producer overwrites
//!   it); so a dead producer needs no repair, and the inbox lock needs none
//!   beyond the lock's own revocation.
//! - A stale head only makes a producer walk further or refuse with
//!   `InboxFull` sooner; it never makes it overwrite an unread message.
//! - Each message names the incarnation of its receiver; the owner drops
//!   messages for an earlier incarnation of its slot.

use crate::coherence::{Coherence, Site};
use crate::hash::{mix64, Key};
use crate::layout::{InboxHead, MsgHeader, MsgKeys, NodeInfo, KEYS_PER_SLOT, NODE_ALIVE, SLOT_LINES};
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

fn key_at(k: &MsgKeys, i: usize) -> Key {
    let mut w = k.words.chunks_exact(2).nth(i).unwrap_or(&[0, 0]).iter().copied();
    Key { lo: w.next().unwrap_or(0), hi: w.next().unwrap_or(0) }
}

impl<C: Coherence> Node<'_, C> {
    /// Sends `msg` with `keys` to node `to`'s inbox. `BadNode` when `to` is
    /// not attached, `InboxFull` when its ring has no room now (retry
    /// later), `TooLarge` when the keys would not fit in an empty ring.
    /// Sets nothing in `msg`; the receiver sees `from` = this node.
    pub fn send(&self, to: u32, msg: &Message, keys: &[Key]) -> Result<()> {
        let l = &self.store.layout;
        if to >= l.caps.max_nodes {
            return Err(Error::BadNode);
        }
        let cap = l.caps.inbox_slots as u64;
        let k = slots_for(keys.len());
        if k > cap || keys.len() > u32::MAX as usize {
            return Err(Error::TooLarge);
        }
        self.with_lock(l.locks().inbox(to), || self.send_locked(to, msg, keys, k))
    }

    fn send_locked(&self, to: u32, msg: &Message, keys: &[Key], k: u64) -> Result<()> {
        let st = self.store;
        let l = &st.layout;
        let cap = l.caps.inbox_slots as u64;
        let info: NodeInfo = st.fresh_state_first(l.node_info(to), Site("inbox.send.info"))?;
        if info.state != NODE_ALIVE {
            return Err(Error::BadNode);
        }
        let head = st.fresh::<InboxHead>(l.inbox_head(to), Site("inbox.send.head"))?.head;
        // Walk the pending messages to the first free position.
        let mut pos = head;
        loop {
            // Positions are sequence numbers: differences wrap as a ring's.
            if pos.wrapping_sub(head) >= cap {
                return Err(Error::InboxFull);
            }
            let h: MsgHeader = st.fresh_state_first(l.inbox_slot(to, pos), Site("inbox.send.probe"))?;
            if !starts_message(&h, pos) {
                break;
            }
            pos = pos.wrapping_add(claimed_slots(&h, cap));
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
            st.write_state_last(l.inbox_slot(to, pos), &first)?;
        }
        for i in 0..k {
            let off = l.inbox_slot(to, pos.wrapping_add(i));
            let mut words = MsgKeys::default();
            let slot_keys = keys.iter().skip((i as usize).saturating_mul(KEYS_PER_SLOT)).take(KEYS_PER_SLOT);
            for (pair, key) in words.words.chunks_exact_mut(2).zip(slot_keys) {
                pair.copy_from_slice(&[key.lo, key.hi]);
            }
            // A slot's lines lie inside the inbox area (the layout's offsets);
            // the view checks every access.
            st.view.write(off.wrapping_add(LINE), &words)?;
            if i > 0 {
                let cont = MsgHeader { seq: pos.wrapping_add(i).wrapping_add(1), index: i as u32, ..first };
                st.view.write(off, &cont)?;
            }
            // SYNC: every line but the first header lands before it (reader:
            // the owner, which trusts the others once that header is seen).
            let from = if i == 0 && !early { off.wrapping_add(LINE) } else { off };
            let end = off.wrapping_add(SLOT_LINES * LINE);
            st.co.flush(&st.view, from, end.wrapping_sub(from), Site("inbox.send.body"))?;
        }
        st.co.store_fence(Site("inbox.send.fence"));
        // SYNC: the first header, state word last, makes the message whole
        // (reader: the owner's `try_recv`, and later producers' walk).
        st.publish_state_last(l.inbox_slot(to, pos), &first, Site("inbox.send.publish"))
    }

    /// Takes the next message of this node's inbox, copying its keys into
    /// `keys`; `None` when the inbox is empty. `TooLarge` (the message stays)
    /// when `keys` is shorter than the message's key list; `Corrupt` (the
    /// message is skipped) when it fails its checksum.
    pub fn try_recv(&self, keys: &mut [Key]) -> Result<Option<Message>> {
        let st = self.store;
        let l = &st.layout;
        let cap = l.caps.inbox_slots as u64;
        // SYNC: the owner is the head's only writer; its own cache holds its
        // last write. A successor on another host may hold an older copy: it
        // then re-reads consumed messages, which name an earlier incarnation
        // and are dropped below.
        let start = st.view.read::<InboxHead>(l.inbox_head(self.id))?.head;
        let mut head = start;
        let me: NodeInfo = st.view.read(l.node_info(self.id))?;
        let mut out = None;
        let mut err = None;
        for _ in 0..cap {
            let h: MsgHeader = st.fresh_state_first(l.inbox_slot(self.id, head), Site("inbox.recv.header"))?;
            if !starts_message(&h, head) {
                break;
            }
            let n = claimed_slots(&h, cap);
            let mine = h.to_incarnation == me.incarnation as u32 || mutant!("inbox.ignore_incarnation");
            if n != h.slots as u64 {
                head = head.wrapping_add(1);
                err = Some(Error::Corrupt);
                break;
            }
            if mine && keys.len() < h.n_keys as usize {
                return Err(Error::TooLarge);
            }
            let whole = self.read_message(head, &h, if mine { &mut *keys } else { &mut [] })?;
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
            // SYNC: producers read the head fresh to see the room it frees.
            st.publish(l.inbox_head(self.id), &InboxHead { head, reserved: [0; 7] }, Site("inbox.recv.head"))?;
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
    fn read_message(&self, pos: u64, h: &MsgHeader, keys: &mut [Key]) -> Result<bool> {
        let st = self.store;
        let l = &st.layout;
        let n = h.n_keys as usize;
        let mut buf = [Key::default(); KEYS_PER_SLOT];
        let mut sum = checksum_seed(h);
        let mut got = 0usize;
        for i in 0..h.slots as u64 {
            let off = l.inbox_slot(self.id, pos.wrapping_add(i));
            if i > 0 {
                let c: MsgHeader = st.fresh(off, Site("inbox.recv.cont"))?;
                if c.seq != pos.wrapping_add(i).wrapping_add(1) || c.index != i as u32 {
                    return Ok(false);
                }
            }
            let w: MsgKeys = st.fresh(off.wrapping_add(LINE), Site("inbox.recv.keys"))?;
            let take = n.saturating_sub(got).min(KEYS_PER_SLOT);
            for (j, k) in buf.iter_mut().enumerate().take(take) {
                *k = key_at(&w, j);
                if let Some(dst) = keys.get_mut(got.saturating_add(j)) {
                    *dst = *k;
                }
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
        // SYNC: fresh reads that feed only a report (metrics), as below.
        let head = self.fresh::<InboxHead>(l.inbox_head(n), Site("inbox.depth.head.report"))?.head;
        let (mut pos, mut msgs) = (head, 0u64);
        while pos.wrapping_sub(head) < cap {
            let h: MsgHeader = self.fresh_state_first(l.inbox_slot(n, pos), Site("inbox.depth.probe.report"))?;
            if !starts_message(&h, pos) {
                break;
            }
            msgs = msgs.saturating_add(1);
            pos = pos.wrapping_add(claimed_slots(&h, cap));
        }
        Ok((msgs, pos.wrapping_sub(head).min(cap)))
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
            // 8 slots; sizes 0, 1, 12, 13, 25, 96 keys span 1, 1, 1, 2, 3, 8 slots.
            for round in 0..5u64 {
                for (i, n) in [0usize, 1, 12, 13, 25, 96].into_iter().enumerate() {
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
    fn a_corrupt_message_is_reported_once_and_skipped() {
        with_two(|f, a, b| {
            a.send(1, &msg(1), &keys(1, 20)).unwrap();
            a.send(1, &msg(2), &keys(2, 3)).unwrap();
            // A hostile peer flips a key of the first message.
            let l = &f.store.layout;
            let off = l.inbox_slot(1, 0) + LINE + 8;
            let w = f.store.view.load_u64(off).unwrap();
            f.store.view.store_u64(off, w ^ 1).unwrap();
            let mut buf = [Key::default(); 32];
            assert_eq!(b.try_recv(&mut buf), Err(Error::Corrupt));
            assert_eq!(b.try_recv(&mut buf).unwrap().unwrap().request_id, 2);
            // A first header claiming more slots than the ring has.
            a.send(1, &msg(3), &keys(3, 1)).unwrap();
            let head_at = l.inbox_slot(1, 3);
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
            f.store.view.write(l.inbox_slot(1, 4), &junk).unwrap();
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
