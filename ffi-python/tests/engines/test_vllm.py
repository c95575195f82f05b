"""cxlkv's vLLM secondary tier, driven through vLLM 0.33's own classes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from vllm.v1.kv_offload.base import LookupResult, Medium, OffloadingEvent, ReqContext, ScheduleEndContext

import cxlkv
from cxlkv.vllm import CxlkvTier

from conftest import add_tenants, usage
from vllm_support import CHUNK_BYTES, WATCHDOG_S, fill, job, key, lookup, make_tier, wait_job

HERE = Path(__file__).parent


@pytest.fixture
def region(tmp_path: Path) -> Iterator[str]:
    path = f"/dev/shm/cxlkv-vllm-{os.getpid()}-{os.urandom(4).hex()}"
    with cxlkv.Region.create(path, 64 << 20) as r:
        r.format(chunk_shift=16, max_nodes=8, n_stripes=8, entries_per_stripe=512)
    yield path
    os.unlink(path)


@pytest.fixture
def tier_config(region: str, tmp_path: Path) -> dict[str, object]:
    return {
        "type": "CxlkvTier",
        "module_path": "cxlkv.vllm",
        "region": region,
        "local_dir": str(tmp_path),
        "enable_kv_events": True,
    }


def test_store_lookup_load_and_events_through_vllms_factory(tier_config: dict[str, object]) -> None:
    tier, rows = make_tier(tier_config)
    try:
        assert isinstance(tier, CxlkvTier) and tier.tier_type == "CxlkvTier"
        keys = [key(i) for i in range(8)]
        for c in range(8):
            fill(rows, c, seed=c)
        tier.submit_store(job(1, keys, list(range(8)), promotion=False))
        r = wait_job(tier, 1)
        assert r.success and r.transfer_bytes == 8 * CHUNK_BYTES
        assert lookup(tier, keys) == [LookupResult.HIT] * 8
        assert lookup(tier, [key(100), key(101)], req="miss") == [LookupResult.MISS] * 2
        # Load into other chunks of the primary tier: byte-equal.
        tier.submit_load(job(2, keys[2:6], [20, 21, 22, 23], promotion=True))
        r = wait_job(tier, 2)
        assert r.success and r.successful_keys is None
        for i, c in enumerate(range(20, 24)):
            assert np.array_equal(rows[c], rows[i + 2])
        # Events: vLLM's own event class, medium CPU, what was stored.
        events = list(tier.take_events())
        assert len(events) == 1 and isinstance(events[0], OffloadingEvent)
        assert events[0].medium is Medium.CPU and not events[0].removed
        assert sorted(events[0].keys) == sorted(keys)
        assert list(tier.take_events()) == []
        # Storing the same chunks again is a success (they are there).
        tier.submit_store(job(3, keys[:2], [0, 1], promotion=False))
        assert wait_job(tier, 3).success
        tier.drain_jobs()
        assert not tier.has_pending_work()
    finally:
        tier.shutdown()


def test_a_missing_chunk_fails_its_load_and_is_reported_removed(tier_config: dict[str, object]) -> None:
    tier, rows = make_tier(tier_config)
    try:
        keys = [key(i) for i in range(3)]
        for c in range(3):
            fill(rows, c, seed=10 + c)
        tier.submit_store(job(1, keys, [0, 1, 2], promotion=False))
        assert wait_job(tier, 1).success
        list(tier.take_events())
        # Another node evicts everything (as a full region would).
        with cxlkv.Region.open(str(tier_config["region"])) as r, r.attach(local_dir=str(tier_config["local_dir"])) as n:
            assert n.evict(1 << 40)[0] == 3
        tier.submit_load(job(2, [keys[0], key(50)], [30, 31], promotion=True))
        r = wait_job(tier, 2)
        assert not r.success and r.successful_keys is None
        removed = [e for e in tier.take_events() if e.removed]
        assert removed and keys[0] in removed[0].keys
    finally:
        tier.shutdown()


def test_a_chunk_evicted_between_lookup_and_load_becomes_a_miss_not_a_retry_loop(
    tier_config: dict[str, object],
) -> None:
    tier, rows = make_tier(tier_config)
    try:
        k = key(7)
        fill(rows, 0, seed=7)
        tier.submit_store(job(1, [k], [0], promotion=False))
        assert wait_job(tier, 1).success
        # A live request's lookup resolves to HIT (and stays cached for it).
        ctx = ReqContext(req_id="live")
        deadline = time.monotonic() + WATCHDOG_S
        while (r := tier.lookup(k, ctx)) is LookupResult.RETRY:
            assert time.monotonic() < deadline, "lookup never resolved"
            tier.on_schedule_end(ScheduleEndContext(new_req_ids=["live"], preempted_req_ids=[]))
            time.sleep(0.001)
        assert r is LookupResult.HIT
        # Another node evicts the chunk before the promotion runs.
        with cxlkv.Region.open(str(tier_config["region"])) as reg, reg.attach(local_dir=str(tier_config["local_dir"])) as n:
            assert n.evict(1 << 40)[0] == 1
        tier.submit_load(job(2, [k], [5], promotion=True))
        assert not wait_job(tier, 2).success
        # The scheduler asks again for the same request: a miss (recompute),
        # not a HIT that would promote, fail and ask again at every step.
        for _ in range(3):
            assert tier.lookup(k, ctx) is LookupResult.MISS
            tier.on_schedule_end(ScheduleEndContext(new_req_ids=[], preempted_req_ids=[]))
        tier.on_request_finished(ctx)
    finally:
        tier.shutdown()


def test_without_events_the_tier_keeps_nothing_per_chunk(tier_config: dict[str, object]) -> None:
    tier, rows = make_tier({**tier_config, "enable_kv_events": False})
    try:
        keys = [key(i) for i in range(20)]
        for c in range(20):
            fill(rows, c, seed=c)
        for round in range(3):
            tier.submit_store(job(10 * round + 1, keys, list(range(20)), promotion=False))
            assert wait_job(tier, 10 * round + 1).success
            with cxlkv.Region.open(str(tier_config["region"])) as reg, reg.attach(local_dir=str(tier_config["local_dir"])) as n:
                n.evict(1 << 40)
            tier.submit_load(job(10 * round + 2, keys, list(range(20, 40)), promotion=True))
            assert not wait_job(tier, 10 * round + 2).success
            assert lookup(tier, keys, req=f"r{round}") == [LookupResult.MISS] * 20
        # Nothing per chunk grew: the region knows what it holds.
        assert tier._cursor is None and tier._prefixes == {} and list(tier.take_events()) == []
    finally:
        tier.shutdown()


def test_another_process_with_its_own_tier_finds_and_loads_the_chunks(tier_config: dict[str, object]) -> None:
    tier, rows = make_tier(tier_config)
    try:
        keys = [key(i) for i in range(6)]
        for c in range(6):
            fill(rows, c, seed=100 + c)
        tier.submit_store(job(1, keys, list(range(6)), promotion=False))
        assert wait_job(tier, 1).success
        script = textwrap.dedent(
            f"""
            import sys, numpy as np
            sys.path.insert(0, {str(HERE)!r})
            from vllm_support import fill, job, key, lookup, make_tier, wait_job
            from vllm.v1.kv_offload.base import LookupResult
            tier, rows = make_tier({dict(tier_config)!r})
            keys = [key(i) for i in range(6)]
            assert lookup(tier, keys) == [LookupResult.HIT] * 6, "not found"
            tier.submit_load(job(7, keys, list(range(10, 16)), promotion=True))
            assert wait_job(tier, 7).success, "load failed"
            want = np.zeros_like(rows)
            for c in range(6):
                fill(want, c, seed=100 + c)
            for c in range(6):
                assert np.array_equal(rows[10 + c], want[c]), c
            tier.shutdown()
            print("loaded", 6)
            """
        )
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "loaded 6" in out.stdout
    finally:
        tier.shutdown()


def test_instances_with_other_models_or_layouts_do_not_share(tier_config: dict[str, object]) -> None:
    a, rows = make_tier(tier_config)
    b, _ = make_tier(tier_config, model="cxlkv/other-model")
    c, _ = make_tier(tier_config, tp_size=2)
    # The attention backend's KV layout (NHD here, HND there): the same bytes
    # in another order.
    d, _ = make_tier(tier_config, kv_cache_layout="HND")
    try:
        fill(rows, 0, seed=1)
        a.submit_store(job(1, [key(1)], [0], promotion=False))
        assert wait_job(a, 1).success
        assert lookup(a, [key(1)]) == [LookupResult.HIT]
        assert lookup(b, [key(1)]) == [LookupResult.MISS]
        assert lookup(c, [key(1)]) == [LookupResult.MISS]
        assert lookup(d, [key(1)]) == [LookupResult.MISS]
        # A different KV cache group of the same block hash is another chunk.
        assert lookup(a, [key(1, group=1)]) == [LookupResult.MISS]
    finally:
        for t in (a, b, c, d):
            t.shutdown()


def test_a_full_region_evicts_and_never_fails_the_engine(small_region: str, tmp_path: Path) -> None:
    path = small_region
    cfg = {"type": "CxlkvTier", "module_path": "cxlkv.vllm", "region": path, "local_dir": str(tmp_path)}
    tier, rows = make_tier(cfg)
    try:
        for c in range(64):
            fill(rows, c, seed=c)
        stored = 0
        # 24 x 64 chunks of 8 KiB: 12 MiB and 1536 entries, more than the
        # region's payload space and index (1024 entries) hold.
        for j in range(24):
            keys = [key(j * 64 + c) for c in range(64)]
            tier.submit_store(job(j, keys, list(range(64)), promotion=False))
            r = wait_job(tier, j)
            stored += r.transfer_bytes or 0
        assert stored == 24 * 64 * CHUNK_BYTES  # every store found room by evicting
        first = lookup(tier, [key(c) for c in range(64)], req="old")
        last = lookup(tier, [key(23 * 64 + c) for c in range(64)], req="new")
        assert LookupResult.MISS in first and last == [LookupResult.HIT] * 64
    finally:
        tier.shutdown()


def test_bad_configurations_fail_at_start_up_and_lose_nothing(tier_config: dict[str, object], tmp_path: Path) -> None:
    tier, rows = make_tier(tier_config)
    fill(rows, 0, seed=5)
    tier.submit_store(job(1, [key(1)], [0], promotion=False))
    assert wait_job(tier, 1).success
    tier.shutdown()
    with pytest.raises(ValueError, match="'region' is required"):
        make_tier({"type": "CxlkvTier", "module_path": "cxlkv.vllm"})
    with pytest.raises(RuntimeError, match="cannot use region"):
        make_tier({**tier_config, "region": str(tmp_path / "missing")})
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x5a" * (1 << 20))
    with pytest.raises(RuntimeError, match="cannot use region"):
        make_tier({**tier_config, "region": str(junk)})
    with pytest.raises(TypeError, match="regoin"):
        make_tier({**tier_config, "regoin": "x"})
    with pytest.raises(ValueError, match="n_threads"):
        make_tier({**tier_config, "n_threads": 0})
    with pytest.raises(RuntimeError, match="cannot use region"):
        make_tier({**tier_config, "flush_mode": "sometimes"})
    again, _ = make_tier(tier_config)
    try:
        assert lookup(again, [key(1)]) == [LookupResult.HIT]
    finally:
        again.shutdown()


def test_removals_by_any_node_come_from_the_change_log_and_nothing_is_kept_after(
    tier_config: dict[str, object],
) -> None:
    """Each chunk removed by another node is reported once, at the next
    `take_events`, with no lookup or load asking for it; once reported, the
    tier keeps nothing of it (only the hash bytes the key lacks, while the
    chunk is in the region)."""
    tier, rows = make_tier(tier_config)
    try:
        keys = [key(i) for i in range(12)] + [key(i, group=1) for i in range(4)]
        for c in range(16):
            fill(rows, c, seed=40 + c)
        tier.submit_store(job(1, keys, list(range(16)), promotion=False))
        assert wait_job(tier, 1).success
        assert [e.removed for e in tier.take_events()] == [False]
        assert len(tier._prefixes) == 16, "16 bytes of each sha256 hash: what the region does not hold"
        gone = keys[:5] + keys[12:14]
        with cxlkv.Region.open(str(tier_config["region"])) as r, r.attach(local_dir=str(tier_config["local_dir"])) as n:
            for g, ks in ((0, gone[:5]), (1, gone[5:])):
                assert n.remove(tier.namespace(g), [k[-20:-4] for k in ks]) == [True] * len(ks)
        events = list(tier.take_events())
        assert len(events) == 1 and events[0].removed and events[0].medium is Medium.CPU
        assert sorted(events[0].keys) == sorted(gone), "every removal, whole OffloadKeys, groups included"
        assert list(tier.take_events()) == [], "once"
        assert len(tier._prefixes) == 16 - len(gone)
        with cxlkv.Region.open(str(tier_config["region"])) as r, r.attach(local_dir=str(tier_config["local_dir"])) as n:
            n.evict(1 << 40)
        removed = [k for e in tier.take_events() for k in e.keys if e.removed]
        assert sorted(removed) == sorted(set(keys) - set(gone))
        assert tier._prefixes == {}, "nothing kept of chunks the region no longer holds"
    finally:
        tier.shutdown()


def test_removals_lost_to_a_gap_in_the_change_log_are_found_by_presence(tmp_path: Path) -> None:
    path = f"/dev/shm/cxlkv-vllm-gap-{os.getpid()}-{os.urandom(4).hex()}"
    with cxlkv.Region.create(path, 64 << 20) as r:
        r.format(chunk_shift=16, max_nodes=8, n_stripes=2, entries_per_stripe=512, change_records=4)
    tier, rows = make_tier(
        {"type": "CxlkvTier", "module_path": "cxlkv.vllm", "region": path, "local_dir": str(tmp_path), "enable_kv_events": True}
    )
    try:
        keys = [key(i) for i in range(24)]
        for c in range(24):
            fill(rows, c, seed=c)
        tier.submit_store(job(1, keys, list(range(24)), promotion=False))
        assert wait_job(tier, 1).success
        list(tier.take_events())
        with cxlkv.Region.open(path) as r, r.attach(local_dir=str(tmp_path)) as n:
            assert n.remove(tier.namespace(0), [k[-20:-4] for k in keys[:20]]) == [True] * 20
        removed = [k for e in tier.take_events() for k in e.keys if e.removed]
        assert sorted(removed) == sorted(keys[:20]), "more removals than the log holds: found by presence"
        assert len(tier._prefixes) == 4
    finally:
        tier.shutdown()
        os.unlink(path)


def test_a_tenant_per_instance_counts_its_chunks_and_keeps_instances_apart(tier_config: dict[str, object]) -> None:
    region, local = str(tier_config["region"]), str(tier_config["local_dir"])
    add_tenants(region, local, "team-a", "team-b")
    a, rows = make_tier({**tier_config, "tenant": "team-a"})
    b, _ = make_tier({**tier_config, "tenant": "team-b"})
    try:
        keys = [key(i) for i in range(4)]
        for c in range(4):
            fill(rows, c, seed=c)
        a.submit_store(job(1, keys, list(range(4)), promotion=False))
        assert wait_job(a, 1).success
        assert lookup(a, keys) == [LookupResult.HIT] * 4
        # The same model and chunks in another tenant: another namespace.
        assert lookup(b, keys, req="other") == [LookupResult.MISS] * 4
        u = usage(region, local)
        assert u["team-a"] == (4 * CHUNK_BYTES, 4) and u["team-b"] == (0, 0)
    finally:
        a.shutdown()
        b.shutdown()
    with pytest.raises(RuntimeError, match="cxlkv tenant add"):
        make_tier({**tier_config, "tenant": "nobody"})
