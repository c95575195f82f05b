"""`cxlkv stats --prometheus` and `cxlkv serve-metrics`, read by the
`prometheus_client` package's own OpenMetrics parser.

The `cxlkv` command-line binary is named by the CXLKV_CLI environment
variable (tests/run.sh builds it through cargo and sets it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families

import cxlkv


def cli() -> str:
    path = os.environ.get("CXLKV_CLI", "")
    assert path and os.access(path, os.X_OK), "CXLKV_CLI must name the cxlkv binary (ffi-python/tests/run.sh sets it)"
    return path


def reap(proc: subprocess.Popen[str]) -> None:
    """Kills `proc` if it still runs, waits for it, closes its pipes."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
    for f in (proc.stdout, proc.stderr):
        if f is not None:
            f.close()


def families(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams: dict[str, Metric], family: str, suffix: str = "", **labels: str) -> float:
    """The value of the one sample of `family` (name plus `suffix`) whose
    labels include `labels`."""
    found = [
        s.value
        for s in fams[family].samples
        if s.name == family + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (family, labels, fams[family].samples)
    return float(found[0])


@pytest.fixture
def busy_region(shm_path: str, local_dir: str) -> Iterator[tuple[str, cxlkv.Node]]:
    """A region where one node stored 6 blocks, read 4 and missed 2."""
    with cxlkv.Region.create(shm_path, 32 << 20) as region:
        region.format(chunk_shift=16, max_nodes=4)
    with cxlkv.Region.open(shm_path) as region, region.attach(local_dir=local_dir) as node:
        ns = cxlkv.Namespace("metrics-model", block_tokens=16)
        keys = [bytes([i]) * 16 for i in range(6)]
        assert node.put(ns, [(k, k * 64) for k in keys], tokens=16) == [cxlkv.Result.OK] * 6
        bufs = [bytearray(1024) for _ in range(4)]
        got = node.get(ns, list(zip(keys[:4], bufs)))
        assert [r for r, _ in got] == [cxlkv.Result.OK] * 4
        assert node.lookup(ns, [bytes([99]) * 16, bytes([98]) * 16]) == 0
        yield shm_path, node


def wait_for_lock_grants(path: str, node: int) -> dict[str, Metric]:
    """The metrics once the node's heartbeat has published its lock
    counters (a beat every few milliseconds; bounded wait)."""
    deadline = time.monotonic() + 20
    while True:
        out = subprocess.run([cli(), "stats", path, "--prometheus"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        fams = families(out.stdout)
        if sample(fams, "cxlkv_lock_grants", "_total", node=str(node)) > 0:
            return fams
        assert time.monotonic() < deadline, "no heartbeat published the lock counters"
        time.sleep(0.05)


def test_stats_prometheus_parses_and_counts_what_the_node_did(busy_region: tuple[str, cxlkv.Node]) -> None:
    path, node = busy_region
    fams = wait_for_lock_grants(path, node.id)
    me = {"node": str(node.id), "pid": str(os.getpid())}
    assert sample(fams, "cxlkv_inserts", "_total", **me) == 6
    assert sample(fams, "cxlkv_hits", "_total", **me) == 4
    assert sample(fams, "cxlkv_misses", "_total", **me) == 2
    assert sample(fams, "cxlkv_written_bytes", "_total", **me) == 6 * 1024
    assert sample(fams, "cxlkv_read_bytes", "_total", **me) == 4 * 1024
    assert sample(fams, "cxlkv_lock_wait_seconds", "_total", **me) >= 0
    assert sample(fams, "cxlkv_node_state", state="alive", **me) == 1
    assert sample(fams, "cxlkv_inbox_messages", **me) == 0
    assert sample(fams, "cxlkv_live_blocks") == 6
    assert sample(fams, "cxlkv_live_bytes") == 6 * 1024
    assert sample(fams, "cxlkv_capacity_bytes") > 6 * 1024
    assert fams["cxlkv_hits"].type == "counter" and fams["cxlkv_live_blocks"].type == "gauge"
    # What people and scripts read says the same.
    human = subprocess.run([cli(), "stats", path], capture_output=True, text=True, timeout=30)
    assert human.returncode == 0 and "6 live blocks" in human.stdout, human.stdout


def serve_metrics(path: str) -> subprocess.Popen[str]:
    """`cxlkv serve-metrics` on a free loopback port (at most 2 minutes)."""
    return subprocess.Popen(
        [cli(), "serve-metrics", path, "--listen", "127.0.0.1:0", "--seconds", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_serve_metrics_answers_scrapes_on_loopback_and_stops_on_sigterm(
    busy_region: tuple[str, cxlkv.Node],
) -> None:
    path, node = busy_region
    proc = serve_metrics(path)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serving metrics on http://127.0.0.1:"), line
        url = line.split()[-1]
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
            fams = families(r.read().decode())
        assert sample(fams, "cxlkv_inserts", "_total", node=str(node.id)) == 6
        assert sample(fams, "cxlkv_live_blocks") == 6
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url.replace("/metrics", "/nothing"), timeout=10)
        assert e.value.code == 404
        e.value.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        reap(proc)


def test_a_scrape_is_answered_while_other_clients_stay_silent(
    busy_region: tuple[str, cxlkv.Node],
) -> None:
    """Idle connections (a port scanner, a load balancer's health check)
    and half-sent requests hold only their own connection: a scrape made
    meanwhile is answered (a server that reads one connection at a time,
    two seconds each, would take 50 s here)."""
    path, _ = busy_region
    proc = serve_metrics(path)
    silent: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[-1]
        host, port = url.split("/")[2].split(":")
        for i in range(25):
            c = socket.create_connection((host, int(port)), timeout=10)
            if i % 5 == 0:
                c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
            silent.append(c)
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200
            assert sample(families(r.read().decode()), "cxlkv_live_blocks") == 6
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        for c in silent:
            c.close()
        reap(proc)
