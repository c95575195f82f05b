"""The region's KV events as routers receive them: the bytes on the ZMQ
sockets decoded by vLLM's own event classes (msgspec's `KVEventBatch`
decoder), block hashes checked against vLLM's, fed to Dynamo's router index
(`dynamo._core.RadixTree`, the way Dynamo's bridge converts vLLM events) to
find a request's prefix; events from two processes (one stores, another
evicts) once each and in order; a subscriber that falls behind sees the gap
in the sequence and resyncs through the replay socket. Loopback only; every
wait is bounded."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

import cxlkv
from cxlkv.engines import block_key

BLOCK = 16
NS = cxlkv.Namespace("kv-events-model", block_tokens=BLOCK)
END = -1
WAIT_MS = 10_000


def engine_hash(parent: bytes, tokens: list[int]) -> bytes:
    """A vLLM-style block hash: 32 bytes of sha256 over the parent's hash and
    the block's tokens."""
    return hashlib.sha256(parent + b"".join(t.to_bytes(4, "little") for t in tokens)).digest()


def prompt_blocks(tokens: list[int]) -> list[tuple[bytes, list[int], bytes | None]]:
    """Per full block of `tokens`: (engine hash, its tokens, parent hash)."""
    out: list[tuple[bytes, list[int], bytes | None]] = []
    parent: bytes | None = None
    for i in range(0, len(tokens) - len(tokens) % BLOCK, BLOCK):
        h = engine_hash(parent or b"", tokens[i : i + BLOCK])
        out.append((h, tokens[i : i + BLOCK], parent))
        parent = h
    return out


def store_prompt(node: cxlkv.Node, tokens: list[int]) -> list[bytes]:
    """What an engine does with a prompt's blocks: their route records
    first, then the blocks; returns the engine hashes."""
    blocks = prompt_blocks(tokens)
    routes = [(block_key(h), t, block_key(p) if p else None) for h, t, p in blocks]
    assert all(r in (cxlkv.Result.OK, cxlkv.Result.EXISTS) for r in node.put_routes(NS, routes, BLOCK))
    puts = node.put(NS, [(block_key(h), h * 8) for h, _, _ in blocks], tokens=BLOCK)
    assert all(r in (cxlkv.Result.OK, cxlkv.Result.EXISTS) for r in puts)
    return [h for h, _, _ in blocks]


class Router:
    """A subscriber as a router runs one: SUB for live batches, the replay
    socket for what it missed (at its start, and at every gap in the
    sequence). Keeps the decoded batches in order and the blocks stored."""

    def __init__(self, endpoint: str, replay: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(endpoint)
        self.replay = self.ctx.socket(zmq.DEALER)
        self.replay.setsockopt(zmq.LINGER, 0)
        self.replay.connect(replay)
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.next = 0
        self.batches: list[tuple[int, KVEventBatch]] = []
        self.gaps = 0
        self.stored: set[int | bytes] = set()
        self.events: list[Any] = []

    def close(self) -> None:
        self.ctx.destroy(linger=0)

    def apply(self, seq: int, payload: bytes) -> None:
        batch = self.decoder.decode(payload)
        self.batches.append((seq, batch))
        for e in batch.events:
            self.events.append(e)
            if isinstance(e, AllBlocksCleared):
                self.stored.clear()
            elif isinstance(e, BlockStored):
                self.stored.update(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                self.stored.difference_update(e.block_hashes)
        self.next = seq + 1

    def catch_up(self) -> None:
        """Asks the replay socket for every batch from `next` on."""
        self.replay.send_multipart([b"", self.next.to_bytes(8, "big")])
        while True:
            assert self.replay.poll(WAIT_MS), "no replay answer"
            frames = self.replay.recv_multipart()
            assert frames[0] == b"" and len(frames) == 4, frames
            seq = int.from_bytes(frames[2], "big", signed=True)
            if seq == END:
                return
            if seq >= self.next or isinstance(self.decoder.decode(frames[3]).events[0], AllBlocksCleared):
                self.apply(seq, frames[3])

    def poll(self, timeout_ms: int = 100) -> bool:
        """Takes one live batch if one comes; a jump in the sequence is a
        gap, filled from the replay socket."""
        if not self.sub.poll(timeout_ms):
            return False
        topic, seq_b, payload = self.sub.recv_multipart()
        seq = int.from_bytes(seq_b, "big")
        if seq < self.next:
            return True
        if seq > self.next:
            self.gaps += 1
            self.catch_up()
            if seq < self.next:
                return True
        self.apply(seq, payload)
        return True

    def until(self, done: Any, what: str) -> None:
        """Polls until `done()`. A SUB socket's subscription reaches the
        publisher some time after it connects (ZeroMQ's slow joiner), and a
        batch it missed shows as a gap only when a later one arrives: after
        a quiet half second it asks the replay socket, as a router does."""
        deadline = time.monotonic() + WAIT_MS / 1000
        quiet_since = time.monotonic()
        while not done():
            assert time.monotonic() < deadline, f"{what}: not seen; events {self.events}"
            if self.poll():
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > 0.5:
                self.catch_up()
                quiet_since = time.monotonic()


def int_hash(h: bytes) -> int:
    """The integer vLLM publishes for engine hash `h` (its default)."""
    v = maybe_convert_block_hash(h)
    assert isinstance(v, int)
    return v


@pytest.fixture
def region() -> Iterator[str]:
    path = f"/dev/shm/cxlkv-kv-events-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        with cxlkv.Region.create(path, 32 << 20) as r:
            r.format(chunk_shift=16, max_nodes=4)
        yield path
    finally:
        if os.path.exists(path):
            os.unlink(path)


def attach(path: str) -> tuple[cxlkv.Region, cxlkv.Node]:
    r = cxlkv.Region.open(path)
    return r, r.attach(local_dir=tempfile.mkdtemp(prefix="cxlkv-ev-"))


def test_batches_decode_with_vllms_classes_and_hash_as_vllm_does(region: str) -> None:
    r, node = attach(region)
    with r, node, node.publish_events("tcp://127.0.0.1:0", replay="tcp://127.0.0.1:0", dp_rank=0) as pub:
        assert pub.replay_endpoint is not None
        router = Router(pub.endpoint, pub.replay_endpoint)
        try:
            tokens = list(range(1000, 1000 + 3 * BLOCK + 5))
            hashes = store_prompt(node, tokens)
            router.catch_up()
            router.until(lambda: {int_hash(h) for h in hashes} <= router.stored, "the prompt's blocks")
            # The first batch starts from nothing: cleared, then what is stored.
            assert isinstance(router.batches[0][1].events[0], AllBlocksCleared)
            assert all(b.data_parallel_rank == 0 for _, b in router.batches)
            stored = {e.block_hashes[0]: e for e in router.events if isinstance(e, BlockStored)}
            for (h, toks, parent), _ in zip(prompt_blocks(tokens), hashes):
                e = stored[int_hash(h)]
                # What vLLM itself would say of this block.
                assert e.block_hashes == [maybe_convert_block_hash(h)]
                assert e.parent_block_hash == (maybe_convert_block_hash(parent) if parent else None)
                assert e.token_ids == toks and e.block_size == BLOCK and e.medium == "CXL"
            # Seen live too, and removals name the same hashes.
            assert node.remove(NS, [block_key(hashes[-1])]) == [True]
            router.until(lambda: int_hash(hashes[-1]) not in router.stored, "the removal")
            removed = [e for e in router.events if isinstance(e, BlockRemoved)]
            assert removed[-1].block_hashes == [int_hash(hashes[-1])] and removed[-1].medium == "CXL"
            stats = pub.stats()
            assert stats["batches"] >= 2 and stats["subscribers"] == 1 and stats["last_error"] is None
        finally:
            router.close()


def dynamo_event(event_id: int, e: Any) -> bytes | None:
    """A vLLM event as Dynamo's ZMQ bridge turns it into its router's
    `KvCacheEvent`: each stored block keyed by the engine's hash, with the
    local hash Dynamo computes from its tokens."""
    from dynamo._core import compute_block_hash_for_seq

    if isinstance(e, BlockStored):
        local = compute_block_hash_for_seq(list(e.token_ids), e.block_size)
        assert len(local) == len(e.block_hashes), "a block's tokens are its block size"
        blocks = [{"block_hash": h, "tokens_hash": t} for h, t in zip(e.block_hashes, local)]
        data: Any = {"stored": {"parent_hash": e.parent_block_hash, "blocks": blocks}}
    elif isinstance(e, BlockRemoved):
        data = {"removed": {"block_hashes": list(e.block_hashes)}}
    elif isinstance(e, AllBlocksCleared):
        data = "cleared"
    else:
        return None
    return json.dumps({"event_id": event_id, "data": data}).encode()


def test_dynamos_router_index_finds_a_requests_prefix(region: str) -> None:
    dynamo = pytest.importorskip("dynamo._core", reason="ai-dynamo-runtime is installed by run.sh")
    from dynamo._core import compute_block_hash_for_seq

    r, node = attach(region)
    with r, node, node.publish_events("tcp://127.0.0.1:0", replay="tcp://127.0.0.1:0") as pub:
        assert pub.replay_endpoint is not None
        router = Router(pub.endpoint, pub.replay_endpoint)
        try:
            system = list(range(7, 7 + 4 * BLOCK))
            hashes = store_prompt(node, system + list(range(500, 500 + BLOCK)))
            router.catch_up()
            router.until(lambda: {int_hash(h) for h in hashes} <= router.stored, "the stored prompt")
            tree = dynamo.RadixTree()
            worker = 3
            for i, e in enumerate(router.events):
                ev = dynamo_event(i, e)
                if ev is not None:
                    tree.apply_event(worker, ev)
            # Another request with the same system prompt and its own tail:
            # the index finds the 4 shared blocks on the region's worker.
            request = system + list(range(900, 900 + 2 * BLOCK))
            scores = tree.find_matches(compute_block_hash_for_seq(request, BLOCK)).scores
            assert {w: s for (w, _), s in scores.items()} == {worker: 4}
            # Once a shared block is evicted, the prefix found stops before it.
            assert node.remove(NS, [block_key(hashes[2])]) == [True]
            seen = len(router.events)
            router.until(lambda: int_hash(hashes[2]) not in router.stored, "the removal")
            for i, e in enumerate(router.events[seen:], start=seen):
                ev = dynamo_event(i, e)
                if ev is not None:
                    tree.apply_event(worker, ev)
            scores = tree.find_matches(compute_block_hash_for_seq(request, BLOCK)).scores
            assert {w: s for (w, _), s in scores.items()} == {worker: 2}
        finally:
            router.close()


def _store(path: str, tokens: list[int]) -> None:
    r, node = attach(path)
    with r, node:
        store_prompt(node, tokens)


def _evict(path: str, keys: list[bytes]) -> None:
    r, node = attach(path)
    with r, node:
        assert node.remove(NS, keys) == [True] * len(keys)


def _in_process(target: Any, *args: Any) -> None:
    p = mp.get_context("spawn").Process(target=target, args=args)
    p.start()
    p.join(60)
    assert p.exitcode == 0, p.exitcode


def test_events_of_two_processes_arrive_once_each_in_order_from_the_cli(region: str, tmp_path: Any) -> None:
    cli = os.environ.get("CXLKV_CLI")
    if not cli:
        pytest.skip("CXLKV_CLI names the cxlkv binary (run.sh sets it)")
    proc = subprocess.Popen(
        [cli, "events", region, "--zmq", "tcp://127.0.0.1:0", "--replay", "tcp://127.0.0.1:0", "--seconds", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    router = None
    try:
        assert proc.stdout is not None
        eps = json.loads(proc.stdout.readline())
        router = Router(eps["endpoint"], eps["replay"])
        router.catch_up()
        tokens = list(range(40, 40 + 5 * BLOCK))
        _in_process(_store, region, tokens)
        hashes = [h for h, _, _ in prompt_blocks(tokens)]
        _in_process(_evict, region, [block_key(h) for h in hashes[:3]])
        want = [int_hash(h) for h in hashes]
        router.until(lambda: set(want[3:]) == router.stored, "stores of one process, removals of another")
        stored = [h for e in router.events if isinstance(e, BlockStored) for h in e.block_hashes]
        removed = [h for e in router.events if isinstance(e, BlockRemoved) for h in e.block_hashes]
        assert sorted(stored) == sorted(want), "each store once"
        assert sorted(removed) == sorted(want[:3]), "each removal once"
        order = [(type(e).__name__, h) for e in router.events if not isinstance(e, AllBlocksCleared) for h in e.block_hashes]
        for h in want[:3]:
            assert order.index(("BlockStored", h)) < order.index(("BlockRemoved", h))
        # Through the CLI's node, stored events carry the route records.
        assert all(len(e.token_ids) == BLOCK for e in router.events if isinstance(e, BlockStored))
        proc.terminate()
        assert proc.wait(timeout=20) in (0, -15)
    finally:
        if router is not None:
            router.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=20)


def test_a_lagging_subscriber_sees_the_gap_and_resyncs(region: str) -> None:
    r, node = attach(region)
    # Two batches kept: a subscriber that joins late finds the start gone.
    with r, node, node.publish_events("tcp://127.0.0.1:0", replay="tcp://127.0.0.1:0", buffer=2) as pub:
        assert pub.replay_endpoint is not None
        early: list[bytes] = []
        for i in range(6):
            early += store_prompt(node, list(range(3000 + 100 * i, 3000 + 100 * i + BLOCK)))
            deadline = time.monotonic() + 10
            while pub.stats()["events"] < i + 2:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        assert node.remove(NS, [block_key(early[0])]) == [True]
        router = Router(pub.endpoint, pub.replay_endpoint)
        try:
            # Live batches from now on; the first one it gets is far ahead.
            deadline = time.monotonic() + 10
            late: list[bytes] = []
            i = 0
            while router.gaps == 0:
                assert time.monotonic() < deadline, "no gap seen"
                late += store_prompt(node, list(range(9000 + 100 * i, 9000 + 100 * i + BLOCK)))
                i += 1
                router.poll(100)
            # Resynced: a snapshot (the buffer had moved on) and the batches
            # after it give exactly what the region stores.
            want = {int_hash(h) for h in early[1:] + late}
            router.until(lambda: router.stored == want, "the region's blocks after the resync")
            assert pub.stats()["snapshots"] >= 1
            assert any(isinstance(b.events[0], AllBlocksCleared) for s, b in router.batches if s > 0)
        finally:
            router.close()


def test_sglang_pages_are_published_with_sglangs_own_event_hash(region: str, tmp_path: Any) -> None:
    """SGLang's router matches the hashes SGLang itself puts in its events
    (`hash_str_to_int64` of the page hash): a publisher with hash="int64"
    over the SGLang adapter's namespace sends exactly those, negative ones
    included."""
    from sglang.srt.mem_cache.utils import hash_str_to_int64
    from sglang_support import HostPool, make_backend

    extra = {
        "backend_name": "cxlkv",
        "module_path": "cxlkv.sglang",
        "class_name": "CxlkvStorage",
        "interface_v1": 1,
        "region": region,
        "local_dir": str(tmp_path),
    }
    pool = HostPool(8)
    backend = make_backend(extra, pool)
    r, node = attach(region)
    try:
        ns = backend.namespace  # type: ignore[attr-defined]
        with r, node, node.publish_events(
            "tcp://127.0.0.1:0", replay="tcp://127.0.0.1:0", hash="int64", namespaces=[ns]
        ) as pub:
            assert pub.replay_endpoint is not None
            router = Router(pub.endpoint, pub.replay_endpoint)
            try:
                keys = [bytes([0x80 | i]).hex() + os.urandom(31).hex() for i in range(4)]
                keys += [bytes([i]).hex() + os.urandom(31).hex() for i in range(4)]
                for p in range(8):
                    pool.fill(p, seed=p)
                assert backend.batch_set_v1(keys, pool.page_indices(list(range(8)))) == [True] * 8
                want = {hash_str_to_int64(k) for k in keys}
                assert any(v < 0 for v in want) and any(v > 0 for v in want)
                router.catch_up()
                router.until(lambda: want <= router.stored, "SGLang's own event hashes")
            finally:
                router.close()
    finally:
        backend.close()
