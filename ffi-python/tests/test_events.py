"""`cxlkv events`: the block events of the region's change log, from two
processes (one stores, another evicts), each once and in order.

The `cxlkv` command-line binary is named by the CXLKV_CLI environment
variable (tests/run.sh builds it through cargo and sets it)."""

from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import time
from typing import Any

import pytest

import cxlkv
from test_metrics import cli, reap

NS = cxlkv.Namespace("events-model", block_tokens=16)


def keys(n: int) -> list[bytes]:
    return [bytes([7, i]) * 8 for i in range(n)]


def store(path: str, local_dir: str) -> None:
    with cxlkv.Region.open(path) as region, region.attach(local_dir=local_dir) as node:
        assert node.put(NS, [(k, k * 32) for k in keys(5)], tokens=16) == [cxlkv.Result.OK] * 5


def evict(path: str, local_dir: str) -> None:
    with cxlkv.Region.open(path) as region, region.attach(local_dir=local_dir) as node:
        assert node.remove(NS, keys(5)[:3]) == [True, True, True]


def run_in_process(target: Any, *args: str) -> None:
    p = mp.get_context("spawn").Process(target=target, args=args)
    p.start()
    p.join(60)
    assert p.exitcode == 0, p.exitcode


def test_events_from_two_processes_arrive_once_each_in_order(shm_path: str, local_dir: str) -> None:
    with cxlkv.Region.create(shm_path, 32 << 20) as region:
        region.format(chunk_shift=16, max_nodes=4)
    proc = subprocess.Popen(
        [cli(), "events", shm_path, "--seconds", "60", "--interval-ms", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == {"event": "cleared"}
        run_in_process(store, shm_path, local_dir)
        run_in_process(evict, shm_path, local_dir)
        want = 5 + 3
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while len(got) < want:
            assert time.monotonic() < deadline, f"only {got} arrived"
            got.append(json.loads(proc.stdout.readline()))
        stored = [e for e in got if e["event"] == "stored"]
        removed = [e for e in got if e["event"] == "removed"]
        # The key as `cxlkv events` prints it: its high, then low 64-bit word.
        hexes = [f"{int.from_bytes(k[8:], 'little'):016x}{int.from_bytes(k[:8], 'little'):016x}" for k in keys(5)]
        assert sorted(e["key"] for e in stored) == sorted(hexes), got
        assert sorted(e["key"] for e in removed) == sorted(hexes[:3]), got
        assert len({e["node"] for e in stored}) == 1 and all(e["tokens"] == 16 for e in stored)
        assert {e["node"] for e in removed} != {None}
        for k in hexes[:3]:
            first = next(i for i, e in enumerate(got) if e["key"] == k)
            assert got[first]["event"] == "stored", "a key's store comes before its removal"
        proc.terminate()
        assert proc.wait(timeout=10) in (0, -15)
    finally:
        reap(proc)


def test_a_change_cursor_reports_every_nodes_changes_from_its_start(region: cxlkv.Region, local_dir: str) -> None:
    other = cxlkv.Namespace("events-other-model", block_tokens=16)
    with region.attach(local_dir=local_dir) as a, region.attach(local_dir=local_dir) as b:
        assert a.put(NS, [(keys(1)[0], b"before")]) == [cxlkv.Result.OK]
        cursor = a.change_cursor()
        assert cursor.poll() == ([], []), "what came before the cursor is not reported"
        assert b.put(NS, [(k, k * 4) for k in keys(3)[1:]], tokens=16) == [cxlkv.Result.OK] * 2
        assert b.put(other, [(keys(1)[0], b"other")]) == [cxlkv.Result.OK]
        assert b.remove(NS, keys(2)) == [True, True]
        changes, gaps = cursor.poll([NS])
        assert gaps == []
        ns = a.namespace(NS)
        by_key = sorted((k, stored) for stored, n, k, _, _, _ in changes if n == ns)
        assert len(changes) == len(by_key) == 4, changes
        assert by_key == sorted([(keys(3)[1], True), (keys(3)[2], True), (keys(3)[0], False), (keys(3)[1], False)])
        assert all(node == b.id for *_, node in changes), "each change names the node that made it"
        stored = [c for c in changes if c[0] and c[2] == keys(3)[2]]
        assert stored and stored[0][3] == 64 and stored[0][4] == 16, "length and tokens"
        assert cursor.poll() == ([], []), "each change once"
        assert b.remove(other, [keys(1)[0]]) == [True]
        assert cursor.poll([NS]) == ([], []), "another namespace's change is left out"
        changes, _ = cursor.poll()
        assert changes == [], "and not kept for later"
    # The cursor does not keep its node attached.
    with pytest.raises(cxlkv.StaleHandleError):
        cursor.poll()
