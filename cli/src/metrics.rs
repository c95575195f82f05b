//! `cxlkv stats` and `cxlkv serve-metrics`: the region's metrics
//! (platform's [`RegionMetrics`]) printed for people, as JSON, in the
//! OpenMetrics text format, or served over HTTP for Prometheus to scrape.

use std::io::Write;
use std::net::SocketAddr;
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

/// One HTTP request's answer: (status code, content type, body).
fn answer(observed: &Observed, method: &tiny_http::Method, url: &str) -> (u16, &'static str, String) {
    let path = url.split('?').next().unwrap_or("");
    match (method, path) {
        (tiny_http::Method::Get, "/metrics") => match observed.metrics() {
            Ok(m) => (200, OPENMETRICS_CONTENT_TYPE, m.to_openmetrics()),
            Err(e) => (503, "text/plain; charset=utf-8", format!("cannot read the region: {e}\n")),
        },
        (tiny_http::Method::Get, "/") => (200, "text/plain; charset=utf-8", "cxlkv metrics: GET /metrics\n".into()),
        (tiny_http::Method::Get, _) => (404, "text/plain; charset=utf-8", "not found\n".into()),
        _ => (405, "text/plain; charset=utf-8", "only GET\n".into()),
    }
}

/// Serves `GET /metrics` on `addr` until `stop` says so (checked every
/// 50 ms) or `seconds` pass; prints the bound address first (port 0 picks
/// a free one). Connections are read by the HTTP server's own threads
/// (`tiny_http`), so a client that connects and stays silent, or sends half
/// a request, holds only its own connection: every other scrape is
/// answered as soon as its request is in.
pub fn serve(
    observed: &Observed,
    addr: SocketAddr,
    seconds: Option<u64>,
    stop: &dyn Fn(Duration) -> bool,
) -> Result<(), String> {
    let server = tiny_http::Server::http(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    let bound = server.server_addr().to_ip().map_or_else(|| addr.to_string(), |a| a.to_string());
    println!("serving metrics on http://{bound}/metrics");
    let _ = std::io::stdout().flush();
    let start = Instant::now();
    loop {
        if seconds.is_some_and(|s| start.elapsed().as_secs() >= s) || stop(Duration::ZERO) {
            return Ok(());
        }
        let request = match server.recv_timeout(Duration::from_millis(50)) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                eprintln!("cxlkv serve-metrics: {e}");
                continue;
            }
        };
        let (code, ctype, body) = answer(observed, request.method(), request.url());
        let peer = request.remote_addr().map_or_else(|| "?".to_string(), |a| a.to_string());
        let mut reply = tiny_http::Response::from_string(body).with_status_code(code);
        if let Ok(h) = tiny_http::Header::from_bytes(&b"Content-Type"[..], ctype.as_bytes()) {
            reply = reply.with_header(h);
        }
        if let Err(e) = request.respond(reply) {
            eprintln!("cxlkv serve-metrics: {peer}: {e}");
        }
    }
}
