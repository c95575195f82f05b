"""Two processes: a prefill process publishes blocks into a region file,
a decode process finds them by key and verifies them by content, through
numpy arrays over the pinned payloads (no copy)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable

import numpy as np
import pytest

import cxlkv

BLOCK = 64 * 1024
TOKENS = list(range(16 * 32))


def payload(key: bytes) -> np.ndarray:
    seed = int.from_bytes(key[:8], "little")
    return (np.arange(BLOCK, dtype=np.uint64) * 2654435761 + seed).astype(np.uint8)


def prefill(path: str, local_dir: str, zero_copy: bool) -> None:
    ns = cxlkv.Namespace("proc-test", block_tokens=16)
    keys = cxlkv.chain_keys(TOKENS, 16)
    with cxlkv.Region.open(path) as region, region.attach(local_dir=local_dir) as node:
        if zero_copy:
            with node.reserve(ns, keys, BLOCK, tokens=16) as r:
                for i, k in enumerate(keys):
                    view = r[i]
                    assert view is not None
                    np.frombuffer(view, dtype=np.uint8)[:] = payload(k)
                    del view
        else:
            assert node.put(ns, [(k, payload(k)) for k in keys], tokens=16) == [cxlkv.Result.OK] * len(keys)


def decode(path: str, local_dir: str, done: mp.Queue) -> None:  # type: ignore[type-arg]
    ns = cxlkv.Namespace("proc-test", block_tokens=16)
    keys = cxlkv.chain_keys(TOKENS, 16)
    with cxlkv.Region.open(path) as region, region.attach(local_dir=local_dir) as node:
        deadline = time.monotonic() + 60
        while node.lookup(ns, keys) < len(keys):
            assert time.monotonic() < deadline, "the blocks never appeared"
            time.sleep(0.001)
        bad = 0
        with node.acquire(ns, keys) as pinned:
            for i, k in enumerate(keys):
                arr = np.frombuffer(pinned[i], dtype=np.uint8)  # type: ignore[arg-type]
                bad += int(np.count_nonzero(arr != payload(k)))
                del arr
        done.put(bad)


def run_pair(path: str, local_dir: str, zero_copy: bool) -> None:
    with cxlkv.Region.create(path, 64 << 20) as region:
        region.format(chunk_shift=20)
    ctx = mp.get_context("spawn")
    done = ctx.Queue()
    d = ctx.Process(target=decode, args=(path, local_dir, done))
    p = ctx.Process(target=prefill, args=(path, local_dir, zero_copy))
    d.start()
    p.start()
    p.join(90)
    d.join(90)
    assert p.exitcode == 0 and d.exitcode == 0, (p.exitcode, d.exitcode)
    assert done.get(timeout=5) == 0, "every byte matches"
    with cxlkv.Region.open(path) as region, region.attach(local_dir=local_dir) as node:
        stats = node.stats()
        assert stats["live_blocks"] == len(cxlkv.chain_keys(TOKENS, 16))
        assert node.check() == []


def test_prefill_process_publishes_and_decode_process_verifies_zero_copy(shm_path: str, local_dir: str) -> None:
    run_pair(shm_path, local_dir, zero_copy=True)


def test_blocks_put_by_another_process_read_through_numpy(shm_path: str, local_dir: str) -> None:
    run_pair(shm_path, local_dir, zero_copy=False)


def stopped_writer(path: str, local_dir: str, ready: mp.Queue) -> None:  # type: ignore[type-arg]
    """Attaches, reserves a block and waits, its reservation open."""
    ns = cxlkv.Namespace("quiet-test", block_tokens=16)
    keys = cxlkv.chain_keys(list(range(16)), 16)
    region = cxlkv.Region.open(path)
    node = region.attach(local_dir=local_dir, lease_ms=LEASE_MS)
    reservation = node.reserve(ns, keys, 4096, tokens=16)
    ready.put(node.id)
    time.sleep(300)
    del reservation


LEASE_MS = 1000


def wait_until(what: str, check: Callable[[], bool], limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_stopped_node_stays_fenced_until_an_operator_declares_it_quiet(shm_path: str, local_dir: str) -> None:
    with cxlkv.Region.create(shm_path, 32 << 20) as region:
        region.format(chunk_shift=16, max_nodes=4)
        # Recovery runs only when called here, so each report says all.
        with region.attach(local_dir=local_dir, lease_ms=LEASE_MS, auto_recover=False) as node:
            ctx = mp.get_context("spawn")
            ready = ctx.Queue()
            p = ctx.Process(target=stopped_writer, args=(shm_path, local_dir, ready))
            p.start()
            try:
                child = ready.get(timeout=60)
                assert node.declare_quiet(child) is False, "a live node is not dead: nothing to say"
                with pytest.raises(cxlkv.CxlkvError):
                    node.declare_quiet(4)
                assert p.pid is not None
                os.kill(p.pid, signal.SIGSTOP)
                # Declared dead by its silence; its process still exists, so
                # recovery fences the slot (its reservation kept), again and
                # again, and never frees it on its own.
                wait_until("the stopped node is declared dead", lambda: node.stats()["dead_mask"] >> child & 1 == 1)
                for _ in range(2):
                    r = node.recover()
                    assert r["nodes_fenced"] >> child & 1 == 1 and r["nodes_freed"] == 0, r
                    assert r["writes_quarantined"] == 1, r
                # The operator's word: its host is down for good.
                assert node.declare_quiet(child) is True
                assert node.declare_quiet(child) is False, "said once already"
                r = node.recover()
                assert r["nodes_freed"] >> child & 1 == 1 and r["writes_aborted"] == 1, r
                assert node.stats()["dead_mask"] == 0
                assert node.check() == []
            finally:
                if p.pid is not None:
                    os.kill(p.pid, signal.SIGKILL)
                p.join(30)
