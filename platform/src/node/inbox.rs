//! A node's inbox and messages: send, receive (its own thread's turn at the
//! ring, with a stash for answers that arrive while a call waits), calls
//! and replies.

use std::time::{Duration, Instant};

use cxlkv_core::channel::Message;
use cxlkv_core::hash::Key;

use crate::error::{Error, Result};
use crate::tier::wire::KIND_TIER_PROMOTE;

use super::{InboxLocal, Node, KIND_RESPONSE};

impl Node {
    /// Sends `msg` with `keys` to node `to`'s inbox, waiting (up to the lock
    /// timeout) while the inbox is full. `BadNode` when `to` is not attached.
    pub fn send(&self, to: u32, msg: &Message, keys: &[Key]) -> Result<()> {
        let start = Instant::now();
        let mut i = 0u32;
        loop {
            match self.core().send(to, msg, keys) {
                Err(cxlkv_core::Error::InboxFull) if start.elapsed() < self.inner.opts.lock_timeout => {
                    backoff(i);
                    i = i.saturating_add(1);
                }
                r => return Ok(r?),
            }
        }
    }

    /// Takes the next message of this node's inbox, if one is there.
    /// Thread-safe: the node's threads take turns.
    ///
    /// Answers to this node's own internal requests (an SSD tier's answer
    /// to a promotion) never come out here: one that arrives after its
    /// caller stopped waiting is dropped.
    pub fn try_recv(&self) -> Result<Option<(Message, Vec<Key>)>> {
        let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
        let InboxLocal { stash, keys, awaited } = &mut *inbox;
        // Stashed: the first application message; internal answers stay
        // for their callers.
        if let Some(at) = stash.iter().position(|(m, _)| !internal_answer(m)) {
            return Ok(stash.remove(at));
        }
        while let Some((m, k)) = self.recv_core(keys)? {
            if !internal_answer(&m) {
                return Ok(Some((m, k)));
            }
            if awaited.contains(&m.request_id) {
                stash.push_back((m, k));
            }
            // Else a late answer: its caller gave up; dropped.
        }
        Ok(None)
    }

    /// One receive from the ring into `buf` (sized on first use); only a
    /// message that came allocates its key list.
    fn recv_core(&self, buf: &mut Vec<Key>) -> Result<Option<(Message, Vec<Key>)>> {
        let cap = self.store().layout.caps.inbox_slots as usize * cxlkv_core::layout::KEYS_PER_SLOT;
        buf.resize(cap, Key::default());
        Ok(self.core().try_recv(buf)?.map(|m| (m, buf[..m.n_keys as usize].to_vec())))
    }

    /// Waits up to `timeout` for the next message; `Timeout` when none came.
    /// The owner polls its inbox: spinning, then yielding the CPU between
    /// polls for a few milliseconds, then sleeping 50 µs between polls.
    pub fn recv(&self, timeout: Duration) -> Result<(Message, Vec<Key>)> {
        let start = Instant::now();
        let mut i = 0u32;
        loop {
            if let Some(m) = self.try_recv()? {
                return Ok(m);
            }
            if start.elapsed() >= timeout {
                return Err(Error::Core(cxlkv_core::Error::Timeout));
            }
            backoff(i);
            i = i.saturating_add(1);
        }
    }

    /// A request/response round trip: sends `msg` (its `request_id` is set
    /// to a fresh one) to node `to` and waits up to `timeout` for the answer
    /// made by [`Node::reply`]. Messages arriving meanwhile stay queued for
    /// `recv`.
    pub fn call(&self, to: u32, msg: &Message, keys: &[Key], timeout: Duration) -> Result<(Message, Vec<Key>)> {
        if msg.kind & KIND_RESPONSE != 0 {
            return Err(Error::Core(cxlkv_core::Error::InvalidArgument));
        }
        let id = {
            let mut n = self.next_call.lock().unwrap_or_else(|e| e.into_inner());
            *n = n.wrapping_add(1);
            *n
        };
        let internal = internal_answer(&Message { kind: msg.kind | KIND_RESPONSE, ..*msg });
        if internal {
            self.inbox.lock().unwrap_or_else(|e| e.into_inner()).awaited.insert(id);
        }
        let r = self.call_wait(to, id, msg, keys, timeout);
        if internal {
            let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
            inbox.awaited.remove(&id);
            // An answer another receive stashed for it after all: gone too.
            inbox.stash.retain(|(m, _)| !(internal_answer(m) && m.request_id == id));
        }
        r
    }

    /// [`Node::call`] after the request id was chosen: sends, then waits.
    fn call_wait(
        &self,
        to: u32,
        id: u64,
        msg: &Message,
        keys: &[Key],
        timeout: Duration,
    ) -> Result<(Message, Vec<Key>)> {
        self.send(to, &Message { request_id: id, ..*msg }, keys)?;
        let start = Instant::now();
        let mut i = 0u32;
        loop {
            {
                let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
                let InboxLocal { stash, keys, .. } = &mut *inbox;
                let answer = |m: &Message| m.kind & KIND_RESPONSE != 0 && m.request_id == id && m.from == to;
                if let Some(at) = stash.iter().position(|(m, _)| answer(m)) {
                    if let Some(r) = stash.remove(at) {
                        return Ok(r);
                    }
                }
                while let Some((m, k)) = self.recv_core(keys)? {
                    if answer(&m) {
                        return Ok((m, k));
                    }
                    stash.push_back((m, k));
                }
            }
            if start.elapsed() >= timeout {
                return Err(Error::Core(cxlkv_core::Error::Timeout));
            }
            backoff(i);
            i = i.saturating_add(1);
        }
    }

    /// Answers request `req` (received by `recv`) with `status` and `keys`.
    pub fn reply(&self, req: &Message, status: u32, keys: &[Key]) -> Result<()> {
        let m = Message { kind: req.kind | KIND_RESPONSE, status, ..*req };
        self.send(req.from, &m, keys)
    }
}

/// True for an answer to one of platform's own requests (a tier promotion):
/// only the call that made the request takes it; none reaches an
/// application's receive.
fn internal_answer(m: &Message) -> bool {
    m.kind == KIND_TIER_PROMOTE | KIND_RESPONSE
}

/// One poll back-off step: spin, then yield (a few milliseconds of polling
/// in all, for handoff latency in microseconds), then sleep 50 µs at a time.
fn backoff(i: u32) {
    if i < 128 {
        core::hint::spin_loop();
    } else if i < 8192 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
}
