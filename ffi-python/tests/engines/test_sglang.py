"""cxlkv's SGLang HiCache storage backend, made by SGLang 0.5.23's own
factory from the extra-config JSON."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import cxlkv
from cxlkv.sglang import CxlkvStorage

from conftest import add_tenants, usage
from sglang_support import HostPool, make_backend, page_keys

HERE = Path(__file__).parent


@pytest.fixture
def extra(tmp_path: Path) -> Iterator[dict[str, object]]:
    path = f"/dev/shm/cxlkv-sglang-{os.getpid()}-{os.urandom(4).hex()}"
    with cxlkv.Region.create(path, 64 << 20) as r:
        r.format(chunk_shift=16, max_nodes=8, n_stripes=8, entries_per_stripe=512)
    yield {
        "backend_name": "cxlkv",
        "module_path": "cxlkv.sglang",
        "class_name": "CxlkvStorage",
        "interface_v1": 1,
        "region": path,
        "local_dir": str(tmp_path),
    }
    os.unlink(path)


def test_set_v1_then_get_v1_into_another_pool_and_exists(extra: dict[str, object]) -> None:
    src, dst = HostPool(16), HostPool(16)
    a = make_backend(extra, src)
    try:
        assert isinstance(a, CxlkvStorage)
        for p in range(8):
            src.fill(p, seed=p)
        keys = page_keys(8)
        assert a.batch_set_v1(keys, src.page_indices(list(range(8)))) == [True] * 8
        # Stored already: still a success, nothing rewritten.
        assert a.batch_set_v1(keys[:2], src.page_indices([0, 1])) == [True, True]
        assert a.batch_exists(keys) == 8
        assert a.batch_exists(keys[:3] + page_keys(1, start=99) + keys[4:]) == 3
        assert a.batch_exists([]) == 0
        # A second backend (another engine) with its own host pool loads them.
        b = make_backend(extra, dst)
        try:
            got = b.batch_get_v1(keys[2:6], dst.page_indices([10, 11, 12, 13]))
            assert got == [True] * 4
            for i, p in enumerate(range(2, 6)):
                assert torch.equal(dst.page(10 + i), src.page(p))
            assert b.batch_get_v1(page_keys(2, start=50), dst.page_indices([0, 1])) == [False, False]
            stats = b.get_stats()
            assert stats["loaded_pages"] == 4 and stats["missed_pages"] == 2
            assert stats["region_live_blocks"] == 8
        finally:
            b.close()
        assert a.get_stats()["stored_pages"] == 10
    finally:
        a.close()


def test_tp_ranks_of_an_mha_model_do_not_see_each_others_pages(extra: dict[str, object]) -> None:
    pool = HostPool(4)
    r0 = make_backend(extra, pool, tp_rank=0, tp_size=2)
    r1 = make_backend(extra, HostPool(4), tp_rank=1, tp_size=2)
    try:
        pool.fill(0, seed=1)
        keys = page_keys(1)
        assert r0.batch_set_v1(keys, pool.page_indices([0])) == [True]
        assert r0.batch_exists(keys) == 1
        assert r1.batch_exists(keys) == 0
    finally:
        r0.close()
        r1.close()


def test_mla_pages_are_shared_by_tp_ranks_and_written_by_the_writer_only(extra: dict[str, object]) -> None:
    p0, p1 = HostPool(4), HostPool(4)
    w = make_backend(extra, p0, tp_rank=0, tp_size=2, mla=True)
    r = make_backend(extra, p1, tp_rank=1, tp_size=2, mla=True)
    try:
        assert w.is_writer and not r.is_writer
        p1.fill(0, seed=7)
        # The non-writer's set writes nothing (the writer stores the page).
        assert r.batch_set_v1(page_keys(1), p1.page_indices([0])) == [True]
        assert r.batch_exists(page_keys(1)) == 0
        p0.fill(0, seed=8)
        assert w.batch_set_v1(page_keys(1), p0.page_indices([0])) == [True]
        assert r.batch_exists(page_keys(1)) == 1
        assert r.batch_get_v1(page_keys(1), p1.page_indices([1])) == [True]
        assert torch.equal(p1.page(1), p0.page(0))
    finally:
        w.close()
        r.close()


def test_legacy_tensor_calls_stats_and_a_clear_of_this_backends_pages_only(extra: dict[str, object]) -> None:
    b = make_backend(extra, HostPool(4))
    try:
        t = torch.arange(64, dtype=torch.float32)
        assert b.set("legacy-key-1", t)
        assert b.exists("legacy-key-1") and not b.exists("legacy-key-2")
        out = torch.zeros(64, dtype=torch.float32)
        assert b.get("legacy-key-1", out) is out and torch.equal(out, t)
        assert b.get("legacy-key-2", torch.zeros(64)) is None
        assert b.get("legacy-key-1", torch.zeros(63)) is None  # a size that is not the page's
        assert b.batch_set(["k-a", "k-b"], [t + 1, t + 2])
        outs = [torch.zeros(64), torch.zeros(64), torch.zeros(64)]
        got = b.batch_get(["k-a", "k-b", "k-c"], outs)
        assert got[0] is outs[0] and torch.equal(outs[1], t + 2) and got[2] is None
        before = b.get_stats()["region_live_blocks"]
        assert before == 3
        # Another engine's pages (another TP rank) share the region.
        other_pool = HostPool(4)
        other = make_backend(extra, other_pool, tp_rank=1, tp_size=2)
        try:
            other_pool.fill(0, seed=3)
            assert other.batch_set_v1(page_keys(2), other_pool.page_indices([0, 1])) == [True, True]
            assert b.batch_set_v1(page_keys(1, start=9), HostPool(4).page_indices([0])) == [True]
            b.clear()
            # Only this backend's pages went (legacy and v1 alike).
            assert not b.exists("legacy-key-1") and b.batch_exists(page_keys(1, start=9)) == 0
            assert other.batch_exists(page_keys(2)) == 2
            assert b.get_stats()["region_live_blocks"] == 2
        finally:
            other.close()
    finally:
        b.close()


def test_another_process_finds_and_loads_the_pages(extra: dict[str, object]) -> None:
    pool = HostPool(8)
    a = make_backend(extra, pool)
    try:
        for p in range(4):
            pool.fill(p, seed=40 + p)
        assert a.batch_set_v1(page_keys(4), pool.page_indices([0, 1, 2, 3])) == [True] * 4
        script = textwrap.dedent(
            f"""
            import sys, torch
            sys.path.insert(0, {str(HERE)!r})
            from sglang_support import HostPool, make_backend, page_keys
            want, pool = HostPool(8), HostPool(8)
            for p in range(4):
                want.fill(p, seed=40 + p)
            b = make_backend({dict(extra)!r}, pool)
            assert b.batch_exists(page_keys(4)) == 4
            assert b.batch_get_v1(page_keys(4), pool.page_indices([4, 5, 6, 7])) == [True] * 4
            for p in range(4):
                assert torch.equal(pool.page(4 + p), want.page(p)), p
            b.close()
            print("loaded", 4)
            """
        )
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "loaded 4" in out.stdout
    finally:
        a.close()


def test_a_full_region_evicts_and_never_fails_a_request(small_region: str, tmp_path: Path) -> None:
    path = small_region
    extra = {"backend_name": "cxlkv", "module_path": "cxlkv.sglang", "class_name": "CxlkvStorage",
             "interface_v1": 1, "region": path, "local_dir": str(tmp_path)}
    pool = HostPool(64, page_size=16, layer_num=8, head_num=4, head_dim=32)  # 64 KiB pages
    b = make_backend(extra, pool)
    try:
        for j in range(4):  # 4 x 64 pages of 64 KiB: 16 MiB into an 8 MiB region
            keys = page_keys(64, start=64 * j)
            assert b.batch_set_v1(keys, pool.page_indices(list(range(64)))) == [True] * 64
        assert b.batch_exists(page_keys(64, start=0)) < 64
        assert b.batch_exists(page_keys(64, start=192)) == 64
        # Every page that made room counts, automatic evictions included.
        stats = b.get_stats()
        assert stats["stored_pages"] == 256
        assert stats["evicted_pages"] == 256 - stats["region_live_blocks"] > 0
    finally:
        b.close()


def test_bad_configurations_fail_at_start_up_and_lose_nothing(extra: dict[str, object], tmp_path: Path) -> None:
    pool = HostPool(4)
    a = make_backend(extra, pool)
    pool.fill(0, seed=3)
    assert a.batch_set_v1(page_keys(1), pool.page_indices([0])) == [True]
    a.close()
    with pytest.raises(ValueError, match="'region' is required"):
        make_backend({k: v for k, v in extra.items() if k != "region"}, pool)
    with pytest.raises(ValueError, match="unknown extra-config keys"):
        make_backend({**extra, "regoin": "x"}, pool)
    with pytest.raises(RuntimeError, match="cannot use region"):
        make_backend({**extra, "region": str(tmp_path / "missing")}, pool)
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x5a" * (1 << 20))
    with pytest.raises(RuntimeError, match="cannot use region"):
        make_backend({**extra, "region": str(junk)}, pool)
    again = make_backend(extra, HostPool(4))
    try:
        assert again.batch_exists(page_keys(1)) == 1
    finally:
        again.close()


def test_v2_hybrid_pools_set_exists_and_get(extra: dict[str, object]) -> None:
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    kv, state = HostPool(8), HostPool(8, layer_num=1, head_num=1, head_dim=4)
    a = make_backend(extra, kv)
    a.register_mem_host_pool_v2(kv, PoolName.KV)
    a.register_mem_host_pool_v2(state, PoolName.MAMBA)
    kv2, state2 = HostPool(8), HostPool(8, layer_num=1, head_num=1, head_dim=4)
    b = make_backend(extra, kv2)
    b.register_mem_host_pool_v2(kv2, PoolName.KV)
    b.register_mem_host_pool_v2(state2, PoolName.MAMBA)
    try:
        keys = page_keys(4)
        for p in range(4):
            kv.fill(p, seed=p)
            state.fill(p, seed=100 + p)
        # KV for all 4 pages, the state only for the last 2 (a trailing window).
        res = a.batch_set_v2(
            [
                PoolTransfer(name=PoolName.KV, host_indices=kv.page_indices([0, 1, 2, 3]), keys=keys),
                PoolTransfer(name=PoolName.MAMBA, host_indices=state.page_indices([2, 3]), keys=keys[2:]),
            ]
        )
        assert res == {"kv": [True] * 4, "mamba": [True, True]}
        trailing = PoolTransfer(name=PoolName.MAMBA, keys=keys[2:3], hit_policy=PoolHitPolicy.TRAILING_PAGES)
        r = b.batch_exists_v2(keys, [trailing])
        # Prefixes ending on a page whose state is stored: 3 and 4 pages.
        assert r.kv_hit_pages == 4 and r.restorable_prefix_pages == [3, 4]
        every = PoolTransfer(name=PoolName.MAMBA, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)
        r = b.batch_exists_v2(keys, [every])
        assert r.kv_hit_pages == 0 and r.restorable_prefix_pages == []
        assert b.batch_exists_v2(keys).kv_hit_pages == 4
        got = b.batch_get_v2(
            [
                PoolTransfer(name=PoolName.KV, host_indices=kv2.page_indices([4, 5, 6, 7]), keys=keys),
                PoolTransfer(name=PoolName.MAMBA, host_indices=state2.page_indices([0, 1]), keys=keys[2:]),
            ]
        )
        assert got == {"kv": [True] * 4, "mamba": [True, True]}
        for p in range(4):
            assert torch.equal(kv2.page(4 + p), kv.page(p))
        assert torch.equal(state2.page(0), state.page(2)) and torch.equal(state2.page(1), state.page(3))
        # v1 and v2 share the KV pages.
        assert b.batch_exists(keys) == 4
        # Indices that do not match the keys fail the pool, nothing else.
        bad = b.batch_get_v2([PoolTransfer(name=PoolName.KV, host_indices=kv2.page_indices([0]), keys=keys)])
        assert bad == {"kv": [False] * 4}
    finally:
        a.close()
        b.close()


def test_a_tenant_counts_the_servers_pages_and_keeps_servers_apart(extra: dict[str, object]) -> None:
    region, local = str(extra["region"]), str(extra["local_dir"])
    add_tenants(region, local, "team-a", "team-b")
    src = HostPool(4)
    a = make_backend({**extra, "tenant": "team-a"}, src)
    b = make_backend({**extra, "tenant": "team-b"}, HostPool(4))
    try:
        for p in range(4):
            src.fill(p, seed=p)
        keys = page_keys(4)
        assert a.batch_set_v1(keys, src.page_indices(list(range(4)))) == [True] * 4
        assert a.batch_exists(keys) == 4
        assert b.batch_exists(keys) == 0, "another tenant: another namespace"
        u = usage(region, local)
        assert u["team-a"][1] == 4 and u["team-a"][0] > 0 and u["team-b"] == (0, 0)
    finally:
        a.close()
        b.close()
    with pytest.raises(RuntimeError, match="cxlkv tenant add"):
        make_backend({**extra, "tenant": "nobody"}, HostPool(1))
