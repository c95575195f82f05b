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
