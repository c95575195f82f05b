// Bytes from drives and the network are parsed here: no indexing, slicing or
// arithmetic that can panic, no unwrap (as in core; relaxed in tests).
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::arithmetic_side_effects, clippy::unwrap_used, clippy::expect_used)
)]
//! The ZeroMQ wire protocol (ZMTP 3.1, NULL security) for the two sockets
//! the event publisher serves: a PUB socket (subscribers connect and get
//! every message whose first frame starts with one of their subscriptions)
//! and a ROUTER-style replay socket (a peer sends a request and gets the
//! replies on its own connection). Both bind; peers are libzmq sockets (SUB,
//! DEALER, REQ) or anything else that speaks ZMTP 3.x.
//!
//! PUB semantics are libzmq's: a subscriber that does not keep up loses
//! messages (its queue holds at most the high-water mark), it never slows
//! the publisher down, and a subscriber that leaves is forgotten.

use crate::sync::{Counter, Flag};
use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A message: its frames.
pub type Message = Vec<Vec<u8>>;

/// Largest frame a peer may send (subscriptions and replay requests are
/// small); a larger one ends its connection.
const MAX_FRAME: u64 = 64 * 1024;
/// Frames of one incoming message at most.
const MAX_FRAMES: usize = 16;
/// A peer must finish its handshake within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the accept loops look at the stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(10);

/// Parses a ZeroMQ TCP endpoint (`tcp://HOST:PORT`; `*` binds every
/// interface, as libzmq's `tcp://*:5557`; port 0 takes a free one).
pub fn parse_endpoint(ep: &str) -> io::Result<SocketAddr> {
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("endpoint {ep:?}: {why}"));
    let rest = ep.strip_prefix("tcp://").ok_or_else(|| bad("only tcp://HOST:PORT is served"))?;
    let rest = match rest.strip_prefix("*:") {
        Some(port) => format!("0.0.0.0:{port}"),
        None => rest.to_string(),
    };
    rest.to_socket_addrs().map_err(|e| bad(&e.to_string()))?.next().ok_or_else(|| bad("names no address"))
}

/// The endpoint string of a bound address.
pub fn endpoint_of(addr: SocketAddr) -> String {
    format!("tcp://{addr}")
}

/// Our greeting: signature, version 3.1, mechanism NULL, not as-server.
fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3;
    g[11] = 1;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// One frame as read.
struct Frame {
    more: bool,
    command: bool,
    body: Vec<u8>,
}

fn invalid(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

fn read_frame(r: &mut impl Read) -> io::Result<Frame> {
    let mut flags = [0u8; 1];
    r.read_exact(&mut flags)?;
    let f = flags[0];
    if f & !0x07 != 0 {
        return Err(invalid(format!("frame flags {f:#x}")));
    }
    let len = if f & 0x02 != 0 {
        let mut b = [0u8; 8];
        r.read_exact(&mut b)?;
        u64::from_be_bytes(b)
    } else {
        let mut b = [0u8; 1];
        r.read_exact(&mut b)?;
        b[0] as u64
    };
    if len > MAX_FRAME {
        return Err(invalid(format!("a frame of {len} bytes")));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    Ok(Frame { more: f & 0x01 != 0, command: f & 0x04 != 0, body })
}

fn write_frame(w: &mut impl Write, body: &[u8], more: bool, command: bool) -> io::Result<()> {
    let mut f = if more { 0x01 } else { 0 } | if command { 0x04 } else { 0 };
    if body.len() > 255 {
        f |= 0x02;
        w.write_all(&[f])?;
        w.write_all(&(body.len() as u64).to_be_bytes())?;
    } else {
        w.write_all(&[f, body.len() as u8])?;
    }
    w.write_all(body)
}

/// Writes a message (every frame but the last has MORE).
pub fn write_message<B: AsRef<[u8]>>(w: &mut impl Write, frames: &[B]) -> io::Result<()> {
    let n = frames.len();
    for (i, f) in frames.iter().enumerate() {
        write_frame(w, f.as_ref(), i.saturating_add(1) < n, false)?;
    }
    Ok(())
}

/// A command's name and body.
fn command(body: &[u8]) -> io::Result<(&[u8], &[u8])> {
    let (&n, rest) = body.split_first().ok_or_else(|| invalid("an empty command"))?;
    rest.split_at_checked(n as usize).ok_or_else(|| invalid("a command shorter than its name"))
}

/// A READY command with our socket type.
fn ready(socket_type: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(32);
    b.push(5);
    b.extend_from_slice(b"READY");
    b.push(11);
    b.extend_from_slice(b"Socket-Type");
    b.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    b.extend_from_slice(socket_type.as_bytes());
    b
}

/// The peer's Socket-Type from its READY properties.
fn peer_type(mut props: &[u8]) -> io::Result<String> {
    let mut found = None;
    // Each property: a name length (1 byte), the name, a value length (4
    // bytes, big-endian), the value; every cut is checked.
    while let Some((&n, rest)) = props.split_first() {
        let (name, rest) =
            rest.split_at_checked(n as usize).ok_or_else(|| invalid("a READY property name runs past the command"))?;
        let (vlen, rest) =
            rest.split_first_chunk::<4>().ok_or_else(|| invalid("a READY property without a value length"))?;
        let (value, rest) = rest
            .split_at_checked(u32::from_be_bytes(*vlen) as usize)
            .ok_or_else(|| invalid("a READY property value runs past the command"))?;
        if name.eq_ignore_ascii_case(b"Socket-Type") {
            found = Some(String::from_utf8_lossy(value).into_owned());
        }
        props = rest;
    }
    found.ok_or_else(|| invalid("READY names no Socket-Type"))
}

/// Greets a peer and exchanges READY: the peer must be ZMTP 3.x with NULL
/// security and one of `accept`'s socket types. Returns the peer's type.
fn handshake(s: &mut TcpStream, me: &str, accept: &[&str]) -> io::Result<String> {
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    s.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    s.write_all(&greeting())?;
    let mut g = [0u8; 64];
    s.read_exact(&mut g)?;
    if g[0] != 0xff || g[9] != 0x7f {
        return Err(invalid("not a ZMTP peer (greeting signature)"));
    }
    if g[10] < 3 {
        return Err(invalid(format!("ZMTP {}.x peer (3.x is served)", g[10])));
    }
    if &g[12..16] != b"NULL" || g[16..32].iter().any(|&b| b != 0) {
        return Err(invalid("only the NULL security mechanism is served"));
    }
    let mut w = Vec::new();
    write_frame(&mut w, &ready(me), false, true)?;
    s.write_all(&w)?;
    let f = read_frame(s)?;
    if !f.command {
        return Err(invalid("the peer sent a message before READY"));
    }
    let (name, props) = command(&f.body)?;
    if name != b"READY" {
        return Err(invalid(format!("the peer sent {} before READY", String::from_utf8_lossy(name))));
    }
    let ty = peer_type(props)?;
    if !accept.iter().any(|a| a.eq_ignore_ascii_case(&ty)) {
        return Err(invalid(format!("a {ty} socket cannot talk to a {me} socket")));
    }
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    Ok(ty)
}

/// What goes out on a connection: a message, or a command (PONG).
enum Out {
    Message(Arc<Message>),
    Command(Vec<u8>),
}

/// The PONG answer to a PING command's body (TTL, then context).
fn pong(ping: &[u8]) -> Vec<u8> {
    let mut b = vec![4];
    b.extend_from_slice(b"PONG");
    b.extend_from_slice(ping.get(2..).unwrap_or(&[]));
    b
}

/// Writes what `rx` yields to `s` until the channel closes or a write fails.
fn writer(s: TcpStream, rx: Receiver<Out>) {
    let mut w = BufWriter::new(s);
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(o) = next.take() {
            let r = match o {
                Out::Message(m) => write_message(&mut w, &m),
                Out::Command(c) => write_frame(&mut w, &c, false, true),
            };
            if r.is_err() {
                return;
            }
            // Batch what is queued already into one write.
            next = rx.try_recv().ok();
        }
        if w.flush().is_err() {
            return;
        }
    }
}

/// A listener's accept loop: each connection is handed to `serve` on a
/// thread of its own; the loop ends when `stop` is set.
fn accept_loop(l: TcpListener, stop: Arc<Flag>, conns: Arc<Conns>, serve: impl Fn(TcpStream) + Send + Sync + 'static) {
    let serve = Arc::new(serve);
    while !stop.get() {
        match l.accept() {
            Ok((s, _)) => {
                if s.set_nonblocking(false).is_err() {
                    continue;
                }
                let _ = s.set_nodelay(true);
                let Ok(c) = s.try_clone() else { continue };
                let id = conns.add(c);
                let serve = serve.clone();
                let conns2 = conns.clone();
                let _ = std::thread::Builder::new().name("cxlkv-zmtp".into()).spawn(move || {
                    serve(s);
                    conns2.remove(id);
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(_) => std::thread::sleep(ACCEPT_POLL),
        }
    }
}

/// Open connections, so stopping can shut them down (their threads then
/// end at once).
#[derive(Default)]
struct Conns {
    next: Counter,
    open: Mutex<HashMap<u64, TcpStream>>,
    closed: Flag,
}

impl Conns {
    fn add(&self, s: TcpStream) -> u64 {
        let id = self.next.add(1);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if self.closed.get() {
            let _ = s.shutdown(Shutdown::Both);
        }
        open.insert(id, s);
        id
    }
    fn remove(&self, id: u64) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = open.remove(&id) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
    fn close_all(&self) {
        self.closed.set(true);
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        for s in open.values() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// One subscriber of a PUB socket.
struct Subscriber {
    /// Its subscriptions (a prefix may be subscribed more than once).
    topics: Mutex<Vec<Vec<u8>>>,
    tx: SyncSender<Out>,
    gone: Flag,
}

/// A bound PUB socket.
pub struct PubSocket {
    subs: Arc<Mutex<Vec<Arc<Subscriber>>>>,
    dropped: Counter,
    bound: Bound,
}

/// A bound listener, its accept thread and its connections; dropping it
/// stops accepting and closes every connection.
struct Bound {
    addr: SocketAddr,
    stop: Arc<Flag>,
    conns: Arc<Conns>,
    accept: Option<JoinHandle<()>>,
}

impl Bound {
    /// Binds `ep` and hands each connection to `serve` on a thread of its own.
    fn listen(ep: &str, name: &str, serve: impl Fn(TcpStream) + Send + Sync + 'static) -> io::Result<Bound> {
        let l = TcpListener::bind(parse_endpoint(ep)?)?;
        l.set_nonblocking(true)?;
        let addr = l.local_addr()?;
        let stop = Arc::new(Flag::new(false));
        let conns = Arc::new(Conns::default());
        let accept = std::thread::Builder::new().name(name.into()).spawn({
            let (stop, conns) = (stop.clone(), conns.clone());
            move || accept_loop(l, stop, conns, serve)
        })?;
        Ok(Bound { addr, stop, conns, accept: Some(accept) })
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        self.stop.set(true);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        self.conns.close_all();
    }
}

impl PubSocket {
    /// Binds `ep`; a subscriber's queue holds at most `hwm` messages.
    pub fn bind(ep: &str, hwm: usize) -> io::Result<PubSocket> {
        let subs: Arc<Mutex<Vec<Arc<Subscriber>>>> = Arc::default();
        let s2 = subs.clone();
        let hwm = hwm.max(1);
        let bound = Bound::listen(ep, "cxlkv-zmtp-pub", move |s| serve_subscriber(s, &s2, hwm))?;
        Ok(PubSocket { subs, dropped: Counter::default(), bound })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.bound.addr
    }

    /// Subscribers connected now.
    pub fn subscribers(&self) -> usize {
        self.subs.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Messages dropped because a subscriber's queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    /// Sends `msg` to every subscriber whose subscriptions match its first
    /// frame; returns to how many.
    pub fn send(&self, msg: Message) -> usize {
        let msg = Arc::new(msg);
        let first: &[u8] = msg.first().map_or(&[], |f| f.as_slice());
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        subs.retain(|s| !s.gone.get());
        let mut n = 0usize;
        for s in subs.iter() {
            let wants = s.topics.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|t| first.starts_with(t));
            if !wants {
                continue;
            }
            match s.tx.try_send(Out::Message(msg.clone())) {
                Ok(()) => n = n.saturating_add(1),
                Err(TrySendError::Full(_)) => {
                    self.dropped.add(1);
                }
                Err(TrySendError::Disconnected(_)) => s.gone.set(true),
            }
        }
        n
    }
}

/// A subscriber's connection: handshake, then its subscriptions (ZMTP 3.1
/// SUBSCRIBE/CANCEL commands, or 3.0's messages starting with 1 or 0) until
/// it leaves; its writer thread sends what the socket queues for it.
fn serve_subscriber(mut s: TcpStream, subs: &Mutex<Vec<Arc<Subscriber>>>, hwm: usize) {
    if handshake(&mut s, "PUB", &["SUB", "XSUB"]).is_err() {
        return;
    }
    let Ok(w) = s.try_clone() else { return };
    let (tx, rx) = mpsc::sync_channel(hwm);
    let me = Arc::new(Subscriber { topics: Mutex::new(Vec::new()), tx, gone: Flag::new(false) });
    subs.lock().unwrap_or_else(|p| p.into_inner()).push(me.clone());
    let writer = std::thread::Builder::new().name("cxlkv-zmtp-out".into()).spawn(move || writer(w, rx));
    let mut r = BufReader::new(s);
    while let Ok(f) = read_frame(&mut r) {
        let (subscribe, topic) = if f.command {
            match command(&f.body) {
                Ok((b"SUBSCRIBE", t)) => (true, t.to_vec()),
                Ok((b"CANCEL", t)) => (false, t.to_vec()),
                Ok((b"PING", ctx)) => {
                    let _ = me.tx.try_send(Out::Command(pong(ctx)));
                    continue;
                }
                Ok(_) => continue,
                Err(_) => break,
            }
        } else {
            if f.more {
                // Not a subscription: a PUB socket ignores messages.
                continue;
            }
            match f.body.split_first() {
                Some((1, t)) => (true, t.to_vec()),
                Some((0, t)) => (false, t.to_vec()),
                _ => continue,
            }
        };
        let mut topics = me.topics.lock().unwrap_or_else(|p| p.into_inner());
        if subscribe {
            topics.push(topic);
        } else if let Some(i) = topics.iter().position(|t| *t == topic) {
            topics.swap_remove(i);
        }
    }
    me.gone.set(true);
    subs.lock().unwrap_or_else(|p| p.into_inner()).retain(|x| !Arc::ptr_eq(x, &me));
    drop(me);
    if let Ok(h) = writer {
        let _ = h.join();
    }
}

/// A request that arrived on a replay socket, and where its replies go.
pub struct Request {
    /// The request's frames (a DEALER's `[b"", start]`; a REQ socket's
    /// envelope delimiter is the empty first frame).
    pub frames: Message,
    replies: SyncSender<Option<Message>>,
}

impl Request {
    /// Sends one reply message; false when the peer has gone.
    pub fn reply(&self, m: Message) -> bool {
        self.replies.send(Some(m)).is_ok()
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        // The end of the replies: the connection reads the next request.
        let _ = self.replies.send(None);
    }
}

/// A bound replay socket: each peer's requests reach [`ReplySocket::poll`].
pub struct ReplySocket {
    rx: Receiver<Request>,
    bound: Bound,
}

impl ReplySocket {
    /// Binds `ep`.
    pub fn bind(ep: &str) -> io::Result<ReplySocket> {
        let (tx, rx) = mpsc::sync_channel::<Request>(64);
        let tx = Mutex::new(tx);
        let bound = Bound::listen(ep, "cxlkv-zmtp-replay", move |s| {
            let tx = tx.lock().unwrap_or_else(|p| p.into_inner()).clone();
            serve_requester(s, tx)
        })?;
        // Dropped after `rx` (fields drop in order): a request still queued
        // is dropped with it, which ends its connection's wait.
        Ok(ReplySocket { rx, bound })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.bound.addr
    }

    /// The next request waiting, if any.
    pub fn poll(&self) -> Option<Request> {
        self.rx.try_recv().ok()
    }
}

/// A requester's connection: handshake, then each request is handed over
/// and its replies written back before the next is read.
fn serve_requester(mut s: TcpStream, tx: SyncSender<Request>) {
    if handshake(&mut s, "ROUTER", &["DEALER", "REQ", "ROUTER"]).is_err() {
        return;
    }
    let Ok(w) = s.try_clone() else { return };
    let mut w = BufWriter::new(w);
    let mut r = BufReader::new(s);
    'conn: loop {
        let mut frames = Vec::new();
        loop {
            let Ok(f) = read_frame(&mut r) else { break 'conn };
            if f.command {
                if let Ok((b"PING", ctx)) = command(&f.body) {
                    if write_frame(&mut w, &pong(ctx), false, true).and_then(|_| w.flush()).is_err() {
                        break 'conn;
                    }
                }
                continue;
            }
            frames.push(f.body);
            if frames.len() > MAX_FRAMES {
                break 'conn;
            }
            if !f.more {
                break;
            }
        }
        let (rtx, rrx) = mpsc::sync_channel(1024);
        if tx.send(Request { frames, replies: rtx }).is_err() {
            break;
        }
        while let Ok(Some(m)) = rrx.recv() {
            if write_message(&mut w, &m).is_err() {
                break 'conn;
            }
        }
        if w.flush().is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_as_libzmq_writes_them() {
        assert_eq!(parse_endpoint("tcp://127.0.0.1:5557").unwrap().port(), 5557);
        assert!(parse_endpoint("tcp://*:5557").unwrap().ip().is_unspecified());
        assert!(parse_endpoint("ipc:///tmp/x").is_err());
        assert!(parse_endpoint("tcp://127.0.0.1").is_err());
    }

    #[test]
    fn frames_round_trip_short_and_long() {
        let mut b = Vec::new();
        write_message(&mut b, &[vec![1u8; 3], vec![2u8; 300]]).unwrap();
        let mut r = &b[..];
        let a = read_frame(&mut r).unwrap();
        assert!(a.more && !a.command && a.body == vec![1u8; 3]);
        let c = read_frame(&mut r).unwrap();
        assert!(!c.more && c.body.len() == 300);
        assert!(r.is_empty());
        // A frame claiming more than the limit ends the connection.
        let mut big = vec![0x02];
        big.extend_from_slice(&(MAX_FRAME + 1).to_be_bytes());
        assert!(read_frame(&mut &big[..]).is_err());
        assert!(read_frame(&mut &[0x80u8, 0][..]).is_err());
    }

    #[test]
    fn ready_properties_name_the_socket_type() {
        let r = ready("PUB");
        let (name, props) = command(&r).unwrap();
        assert_eq!(name, b"READY");
        assert_eq!(peer_type(props).unwrap(), "PUB");
        assert!(peer_type(&props[..props.len() - 1]).is_err());
        assert!(peer_type(&[]).is_err());
    }

    /// A SUB peer written here against the protocol: greets, subscribes
    /// with a 3.0-style message, and receives only the matching topic.
    #[test]
    fn a_subscriber_gets_the_topics_it_asked_for() {
        let p = PubSocket::bind("tcp://127.0.0.1:0", 16).unwrap();
        let mut s = TcpStream::connect(p.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&greeting()).unwrap();
        let mut g = [0u8; 64];
        s.read_exact(&mut g).unwrap();
        assert_eq!((g[0], g[9], g[10]), (0xff, 0x7f, 3));
        let mut w = Vec::new();
        write_frame(&mut w, &ready("SUB"), false, true).unwrap();
        write_message(&mut w, &[b"\x01kv".to_vec()]).unwrap();
        s.write_all(&w).unwrap();
        let f = read_frame(&mut s).unwrap();
        assert!(f.command && command(&f.body).unwrap().0 == b"READY");
        // The subscription lands asynchronously: publish until it matches.
        let mut sent = 0;
        for _ in 0..1000 {
            p.send(vec![b"other".to_vec(), b"x".to_vec()]);
            sent = p.send(vec![b"kv@1".to_vec(), b"payload".to_vec()]);
            if sent == 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(sent, 1);
        let a = read_frame(&mut s).unwrap();
        let b = read_frame(&mut s).unwrap();
        assert_eq!((a.body.as_slice(), a.more), (&b"kv@1"[..], true));
        assert_eq!((b.body.as_slice(), b.more), (&b"payload"[..], false));
        drop(s);
        for _ in 0..1000 {
            p.send(vec![b"kv".to_vec()]);
            if p.subscribers() == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(p.subscribers(), 0);
    }

    #[test]
    fn a_peer_of_the_wrong_type_is_refused() {
        let p = PubSocket::bind("tcp://127.0.0.1:0", 16).unwrap();
        let mut s = TcpStream::connect(p.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&greeting()).unwrap();
        let mut w = Vec::new();
        write_frame(&mut w, &ready("PUB"), false, true).unwrap();
        s.write_all(&w).unwrap();
        let mut g = [0u8; 64];
        s.read_exact(&mut g).unwrap();
        let _ready = read_frame(&mut s).unwrap();
        // The publisher closes the connection: the next read ends.
        let mut b = [0u8; 1];
        assert!(matches!(s.read(&mut b), Ok(0) | Err(_)));
        assert_eq!(p.subscribers(), 0);
    }
}
