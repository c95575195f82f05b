//! `cxlkv stats` and `cxlkv serve-metrics`: the region's metrics
//! (platform's [`RegionMetrics`]) printed for people, as JSON, in the
//! OpenMetrics text format, or served over HTTP for Prometheus to scrape.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
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
fn answer(observed: &Observed, head: &str) -> (&'static str, &'static str, String) {
    let mut words = head.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
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

/// Reads a request's head (up to 8 KiB, two seconds) and answers it.
fn serve_one(observed: &Observed, mut s: TcpStream) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let first = String::from_utf8_lossy(&head).lines().next().unwrap_or("").to_string();
    let (status, ctype, body) = answer(observed, &first);
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
/// a free one).
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
    let start = Instant::now();
    loop {
        if seconds.is_some_and(|s| start.elapsed().as_secs() >= s) || stop(Duration::from_millis(50)) {
            return Ok(());
        }
        loop {
            match listener.accept() {
                Ok((s, peer)) => {
                    if let Err(e) = serve_one(observed, s) {
                        eprintln!("cxlkv serve-metrics: {peer}: {e}");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    eprintln!("cxlkv serve-metrics: accept: {e}");
                    break;
                }
            }
        }
    }
}
