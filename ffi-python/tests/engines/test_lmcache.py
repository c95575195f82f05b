"""cxlkv's connector for LMCache 0.5.6's `native_plugin` L2 adapter, made
by LMCache's own factory and driven through `NativeConnectorL2Adapter`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import NativeConnectorL2Adapter

import cxlkv

from conftest import add_tenants, usage
from lmcache_support import key, load, lookup, make_adapter, obj, store

HERE = Path(__file__).parent


@pytest.fixture
def params(tmp_path: Path) -> Iterator[dict[str, object]]:
    path = f"/dev/shm/cxlkv-lmcache-{os.getpid()}-{os.urandom(4).hex()}"
    with cxlkv.Region.create(path, 64 << 20) as r:
        r.format(chunk_shift=16, max_nodes=8, n_stripes=8, entries_per_stripe=512)
    yield {"region": path, "local_dir": str(tmp_path)}
    os.unlink(path)


def body(i: int, n: int = 4096) -> bytes:
    return bytes((i * 31 + j) % 251 for j in range(n))


def test_store_lookup_load_delete_through_the_native_connector_adapter(params: dict[str, object]) -> None:
    a = make_adapter(params)
    try:
        assert isinstance(a, NativeConnectorL2Adapter)
        keys = [key(i) for i in range(6)]
        result = store(a, keys, [obj(body(i)) for i in range(6)])
        assert result.is_successful()
        # The lookup bitmap: found keys set, in the order asked.
        assert lookup(a, keys[:3] + [key(99)] + keys[3:]) == [True, True, True, False, True, True, True]
        dst = [obj(bytes(4096)) for _ in range(4)]
        assert load(a, keys[1:4] + [key(98)], dst) == [True, True, True, False]
        for i, o in enumerate(dst[:3]):
            assert bytes(o.byte_array) == body(i + 1)
        # A buffer of another size is not the object: a miss, not partial bytes.
        assert load(a, [keys[0]], [obj(bytes(100))]) == [False]
        a.delete(keys[:2])
        assert lookup(a, keys) == [False, False, True, True, True, True]
        # Storing again what is stored is a success.
        assert store(a, keys[2:4], [obj(body(2)), obj(body(3))]).is_successful()
    finally:
        a.close()


def test_namespaces_model_rank_and_salt_keep_objects_apart(params: dict[str, object]) -> None:
    a = make_adapter(params)
    try:
        assert store(a, [key(1)], [obj(body(1))]).is_successful()
        assert lookup(a, [key(1), key(1, model="other/model"), key(1, rank=1), key(1, salt="user-b")]) == [
            True,
            False,
            False,
            False,
        ]
    finally:
        a.close()


def test_two_salts_whose_32_bit_ids_collided_never_share_an_object(params: dict[str, object]) -> None:
    """For this model, rank and group, the salts `user-121425` and
    `user-148113` folded to one 32-bit namespace id (373215777) when the id
    was a hash of the fields, so one tenant loaded the other's object.
    Namespaces are now registered in the region by their 128-bit digest:
    each salt has its own."""
    a = make_adapter(params)
    try:
        mine, theirs = key(7, salt="user-121425"), key(7, salt="user-148113")
        assert store(a, [mine], [obj(body(1))]).is_successful()
        assert lookup(a, [mine, theirs]) == [True, False]
        dst = obj(bytes(4096))
        assert load(a, [theirs], [dst]) == [False]
        assert bytes(dst.byte_array) == bytes(4096), "not one byte of the other tenant's object"
        assert store(a, [theirs], [obj(body(2))]).is_successful()
        for k, i in ((mine, 1), (theirs, 2)):
            out = obj(bytes(4096))
            assert load(a, [k], [out]) == [True] and bytes(out.byte_array) == body(i)
    finally:
        a.close()


def test_another_process_with_its_own_adapter_loads_the_objects(params: dict[str, object]) -> None:
    a = make_adapter(params)
    try:
        assert store(a, [key(i) for i in range(5)], [obj(body(i)) for i in range(5)]).is_successful()
        script = textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(HERE)!r})
            from lmcache_support import key, load, lookup, make_adapter, obj
            a = make_adapter({dict(params)!r})
            keys = [key(i) for i in range(5)]
            assert lookup(a, keys) == [True] * 5
            dst = [obj(bytes(4096)) for _ in keys]
            assert load(a, keys, dst) == [True] * 5
            for i, o in enumerate(dst):
                assert bytes(o.byte_array) == bytes((i * 31 + j) % 251 for j in range(4096)), i
            a.close()
            print("loaded", 5)
            """
        )
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "loaded 5" in out.stdout
    finally:
        a.close()


def test_an_engine_stalled_past_its_lease_attaches_again_and_carries_on(params: dict[str, object]) -> None:
    """An engine process stopped past its lease (SIGSTOP, as a frozen
    container or an overloaded host) is declared dead, its node recovered
    and freed; woken, its adapter's next requests find the node revoked,
    attach a fresh one and are answered: the engine sees no error."""
    lease = {**params, "lease_ms": 300}
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from lmcache_support import key, load, make_adapter, obj, store
        a = make_adapter({lease!r})
        body = lambda i: bytes((i * 31 + j) % 251 for j in range(4096))
        assert store(a, [key(1)], [obj(body(1))]).is_successful()
        print("stored", flush=True)
        sys.stdin.readline()
        ok = store(a, [key(2)], [obj(body(2))]).is_successful()
        dst = [obj(bytes(4096)) for _ in range(2)]
        got = load(a, [key(1), key(2)], dst)
        same = [bytes(o.byte_array) == body(i + 1) for i, o in enumerate(dst)]
        print("after", ok, got, same, flush=True)
        a.close()
        """
    )
    watcher = cxlkv.Region.open(str(params["region"]))
    node = watcher.attach(lease_ms=300, local_dir=str(params["local_dir"]))
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "stored"
        os.kill(child.pid, signal.SIGSTOP)
        # Declared dead by its silence and recovered (the watcher's node
        # recovers automatically; the stopped node is fenced until it wakes
        # and closes): only the watcher is alive.
        deadline = time.monotonic() + 30
        while node.stats()["alive_mask"] != 1 << node.id and time.monotonic() < deadline:
            time.sleep(0.05)
        assert node.stats()["alive_mask"] == 1 << node.id, node.stats()
        os.kill(child.pid, signal.SIGCONT)
        child.stdin.write("go\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err[-3000:]
        # The store after waking went through a fresh node; the object the
        # revoked node stored is still there (recovery frees pins, not
        # published blocks).
        assert out.startswith("after True [True, True] [True, True]"), (out, err[-2000:])
        assert "attaching again" in err, err[-2000:]
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.wait()
        node.detach()
        watcher.close()


def test_a_full_region_evicts_and_never_fails_a_store(small_region: str, tmp_path: Path) -> None:
    path = small_region
    a = make_adapter({"region": path, "local_dir": str(tmp_path)})
    try:
        data = bytes(64 << 10)
        for j in range(4):  # 4 x 64 objects of 64 KiB: 16 MiB into an 8 MiB region
            assert store(a, [key(64 * j + i) for i in range(64)], [obj(data) for _ in range(64)]).is_successful()
        assert not all(lookup(a, [key(i) for i in range(64)]))
        assert all(lookup(a, [key(192 + i) for i in range(64)]))
    finally:
        a.close()


def test_bad_configurations_fail_at_start_up_and_lose_nothing(params: dict[str, object], tmp_path: Path) -> None:
    a = make_adapter(params)
    assert store(a, [key(1)], [obj(body(1))]).is_successful()
    a.close()
    with pytest.raises(ValueError, match="'region' is required"):
        make_adapter({"local_dir": str(tmp_path)})
    with pytest.raises(TypeError, match="regoin"):
        make_adapter({**params, "regoin": "x"})
    with pytest.raises(RuntimeError, match="cannot use region"):
        make_adapter({**params, "region": str(tmp_path / "missing")})
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x5a" * (1 << 20))
    with pytest.raises(RuntimeError, match="cannot use region"):
        make_adapter({**params, "region": str(junk)})
    again = make_adapter(params)
    try:
        assert lookup(again, [key(1)]) == [True]
    finally:
        again.close()


def test_a_tenant_counts_the_engines_objects_and_keeps_engines_apart(params: dict[str, object]) -> None:
    region, local = str(params["region"]), str(params["local_dir"])
    add_tenants(region, local, "team-a", "team-b")
    a = make_adapter({**params, "tenant": "team-a"})
    b = make_adapter({**params, "tenant": "team-b"})
    try:
        keys = [key(i) for i in range(3)]
        assert store(a, keys, [obj(body(i)) for i in range(3)]).is_successful()
        assert lookup(a, keys) == [True] * 3
        assert lookup(b, keys) == [False] * 3, "another tenant: another namespace"
        u = usage(region, local)
        assert u["team-a"] == (3 * 4096, 3) and u["team-b"] == (0, 0)
    finally:
        a.close()
        b.close()
    with pytest.raises(RuntimeError, match="cxlkv tenant add"):
        make_adapter({**params, "tenant": "nobody"})
