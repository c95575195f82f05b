//! `cxlkv stats` and `cxlkv serve-metrics`: the region's metrics
//! (platform's [`RegionMetrics`]) printed for people, as JSON, in the
//! OpenMetrics text format, or served over HTTP for Prometheus to scrape.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cxlkv_platform::inspect::Observed;
use cxlkv_platform::metrics::{RegionMetrics, OPENMETRICS_CONTENT_TYPE};
use cxlkv_platform::size::human;

/// Prints the metrics for people.
pub fn print_human(m: &RegionMetrics) {
    println!(
        "region   {} live blocks, {} of {} payload, {} of {} chunks, {} evictions",
        m.live_blocks,
        human(m.live_bytes),
        human(m.capacity_bytes),
        m.chunks_used,
        m.chunks,
        m.evictions
    );
    for &(node, n) in &m.tier_blocks {
        println!("tier     node {node}'s SSD tier records {n} blocks");
    }
    println!(
        "{:>4} {:>8} {:<6} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10} {:>8} {:>6} {:>5}",
        "node", "pid", "state", "hits", "misses", "read", "written", "evicted", "locks", "wait s", "inbox", "pins"
    );
    for n in &m.nodes {
        println!(
            "{:>4} {:>8} {:<6} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10} {:>8.3} {:>6} {:>5}",
            n.id,
            n.pid,
            n.state,
            n.counters.hits,
            n.counters.misses,
            human(n.counters.bytes_read),
            human(n.counters.bytes_written),
            n.counters.evictions,
            n.lock_grants,
            n.lock_wait_seconds,
            n.inbox_messages,
            n.pins
        );
    }
}

/// One HTTP request's answer: (status line, content type, body).
fn answer(observed: &Observed, method: &str, target: &str) -> (&'static str, &'static str, String) {
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => match observed.metrics() {
            Ok(m) => ("200 OK", OPENMETRICS_CONTENT_TYPE, m.to_openmetrics()),
            Err(e) => {
                ("503 Service Unavailable", "text/plain; charset=utf-8", format!("cannot read the region: {e}\n"))
            }
        },
        ("GET", "/") => ("200 OK", "text/plain; charset=utf-8", "cxlkv metrics: GET /metrics\n".into()),
        ("GET", _) => ("404 Not Found", "text/plain; charset=utf-8", "not found\n".into()),
        _ => ("405 Method Not Allowed", "text/plain; charset=utf-8", "only GET\n".into()),
    }
}

/// A request whose head a connection's thread read: method, target, and
/// the connection to answer on.
type Asked = (String, String, TcpStream);

/// Connections whose request heads are being read at once; more wait in
/// the listener's backlog.
const READERS: usize = 256;

/// Reads a request head (up to 8 KiB, parsed by `httparse`, two seconds)
/// on the connection's own thread; a malformed one is answered 400 here.
fn read_head(mut s: TcpStream) -> Option<Asked> {
    s.set_nonblocking(false).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&head) {
            Ok(httparse::Status::Complete(_)) => {
                return Some((req.method?.to_string(), req.path?.to_string(), s));
            }
            Ok(httparse::Status::Partial) if head.len() < 8192 => {}
            _ => {
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                return None;
            }
        }
    }
}

/// Answers one request on the serving thread (the region is read there).
fn respond(observed: &Observed, (method, target, mut s): Asked) -> std::io::Result<()> {
    let (status, ctype, body) = answer(observed, &method, &target);
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(reply.as_bytes())?;
    s.write_all(body.as_bytes())?;
    s.flush()
}

/// Serves `GET /metrics` on `addr` until `stop` says so (checked every
/// 50 ms) or `seconds` pass; prints the bound address first (port 0 picks
/// a free one). Each connection's request head is read on a thread of its
/// own (up to [`READERS`] at once), so a client that connects and stays
/// silent, or sends half a request, holds only its own connection; the
/// heads read are answered here, where the region is read. (`tiny_http`
/// was tried and dropped: its task pool can queue a connection behind
/// threads blocked on silent ones, and 1 scrape in 5 then timed out with
/// 25 idle connections open.)
pub fn serve(
    observed: &Observed,
    addr: SocketAddr,
    seconds: Option<u64>,
    stop: &dyn Fn(Duration) -> bool,
) -> Result<(), String> {
    let listener = TcpListener::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    println!("serving metrics on http://{bound}/metrics");
    let _ = std::io::stdout().flush();
    let (asked, heads) = mpsc::channel::<Option<Asked>>();
    let mut reading = 0usize;
    let start = Instant::now();
    loop {
        if seconds.is_some_and(|s| start.elapsed().as_secs() >= s) || stop(Duration::ZERO) {
            return Ok(());
        }
        while reading < READERS {
            match listener.accept() {
                Ok((s, _)) => {
                    let tx = asked.clone();
                    let spawned = std::thread::Builder::new().name("cxlkv-http".into()).spawn(move || {
                        let _ = tx.send(read_head(s));
                    });
                    match spawned {
                        Ok(_) => reading += 1,
                        Err(e) => eprintln!("cxlkv serve-metrics: cannot start a reader: {e}"),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    eprintln!("cxlkv serve-metrics: accept: {e}");
                    break;
                }
            }
        }
        let mut next = heads.recv_timeout(Duration::from_millis(50)).ok();
        while let Some(done) = next {
            reading = reading.saturating_sub(1);
            if let Some(a) = done {
                let peer = a.2.peer_addr().map_or_else(|_| "?".to_string(), |p| p.to_string());
                if let Err(e) = respond(observed, a) {
                    eprintln!("cxlkv serve-metrics: {peer}: {e}");
                }
            }
            next = heads.try_recv().ok();
        }
    }
}
