"""Every call of the Python API, and every error it raises."""

from __future__ import annotations

import gc
import os
import stat
import tempfile
import time

import numpy as np
import pytest

import cxlkv
from cxlkv import Result


def test_version_and_results_mirror_the_c_api() -> None:
    assert cxlkv.__version__.count(".") == 2
    assert Result.OK == 1000 and Result.EXISTS == 1012 and Result.NULL_PARAMETER == 1200
    assert issubclass(cxlkv.ExistsError, cxlkv.CxlkvError)


def test_keys_are_bytes_or_ints_and_chains_share_prefixes() -> None:
    a = cxlkv.chain_keys(list(range(40)), 16)
    b = cxlkv.chain_keys([*range(20), 7, *range(21, 40)], 16)
    assert len(a) == 2 and all(isinstance(k, bytes) and len(k) == 16 for k in a)
    assert a[0] == b[0] and a[1] != b[1]
    assert cxlkv.chain_keys(range(16), 16, parent=a[0]) != cxlkv.chain_keys(range(16), 16)
    assert cxlkv.chain_keys(range(16), 16, parent=0) == cxlkv.chain_keys(range(16), 16)
    with pytest.raises(cxlkv.InvalidArgumentError) as e:
        cxlkv.chain_keys([1, 2], 0)
    assert e.value.code == Result.INVALID_ARGUMENT
    with pytest.raises(cxlkv.InvalidArgumentError):
        cxlkv.chain_keys([1], 1, parent=b"short")


def test_chain_keys_are_the_specified_xxh3_chain() -> None:
    """A router computes the same keys with the `xxhash` package alone."""
    import random

    import xxhash

    def reference(tokens: list[int], block: int, parent: bytes) -> list[bytes]:
        keys, prev = [], parent
        for i in range(len(tokens) // block):
            data = prev + b"".join(t.to_bytes(4, "little") for t in tokens[i * block : (i + 1) * block])
            prev = xxhash.xxh3_128_intdigest(data).to_bytes(16, "little")
            keys.append(prev)
        return keys

    rng = random.Random(7)
    for block in (1, 16, 64, 100, 256, 1000):
        tokens = [rng.randrange(2**32) for _ in range(rng.randrange(3 * block))]
        parent = rng.randbytes(16)
        assert cxlkv.chain_keys(tokens, block) == reference(tokens, block, bytes(16))
        assert cxlkv.chain_keys(tokens, block, parent=parent) == reference(tokens, block, parent)


def test_namespace_digests_differ_by_every_field() -> None:
    base = cxlkv.Namespace("m", tp_size=2, block_tokens=16)
    digests = {base.digest, cxlkv.Namespace("m2", tp_size=2, block_tokens=16).digest}
    for field in ("kv_layout", "dtype", "tp_rank", "pp_rank", "extra"):
        digests.add(cxlkv.Namespace("m", tp_size=2, block_tokens=16, **{field: 1}).digest)
    digests.add(cxlkv.Namespace("m", tp_size=2, block_tokens=16, salt="user-17144").digest)
    assert len(digests) == 8 and all(len(d) == 16 for d in digests)
    assert base.digest == cxlkv.namespace_digest("m", tp_size=2, block_tokens=16)
    assert base.digest == cxlkv.namespace_digest(b"m", 0, 0, 0, 2, 0, 16, 0, b"")
    # The specified encoding (core's test vector).
    d = cxlkv.namespace_digest("m", 1, 2, 3, 4, 5, 6, 7, "s")
    assert d.hex() == "3943895f2f6c5b42c40fa54ba142c483"


def test_namespaces_differing_in_any_field_never_share_a_block(region: cxlkv.Region, local_dir: str) -> None:
    """Ids come from the region (each namespace's 128-bit digest is kept
    there): equal fields get one id on every node, and the two salts whose
    32-bit ids once collided get two ids and two blocks."""
    base = cxlkv.Namespace("llama", tp_size=2, block_tokens=16, salt="user-100840")
    variants = [
        cxlkv.Namespace("llamb", tp_size=2, block_tokens=16, salt="user-100840"),
        cxlkv.Namespace("llama", tp_size=2, block_tokens=16, salt="user-17144"),
        *(
            cxlkv.Namespace("llama", tp_size=2, block_tokens=16, salt="user-100840", **{field: 1})
            for field in ("kv_layout", "dtype", "tp_rank", "pp_rank", "extra")
        ),
        cxlkv.Namespace("llama", tp_size=4, block_tokens=16, salt="user-100840"),
        cxlkv.Namespace("llama", tp_size=2, block_tokens=32, salt="user-100840"),
    ]
    with region.attach(local_dir=local_dir) as a, region.attach(local_dir=local_dir) as b:
        assert a.put(base, [(1, b"tenant one")]) == [Result.OK]
        ia = a.namespace(base)
        assert ia >= 2**31 and b.namespace(base) == ia
        assert b.namespace(ia) == ia, "an int is an id as is"
        ids = {ia}
        for v in variants:
            ids.add(b.namespace(v))
            assert not b.exists(v, 1), v
            assert b.get(v, [(1, bytearray(16))]) == [(Result.NOT_FOUND, 0)]
        assert len(ids) == len(variants) + 1
        assert b.exists(base, 1) and b.exists(ia, 1)
        with pytest.raises(cxlkv.InvalidArgumentError):
            a.namespace("not a namespace")
        with pytest.raises(cxlkv.InvalidArgumentError):
            a.namespace(2**32)


def test_region_errors_are_typed(shm_path: str, local_dir: str) -> None:
    with pytest.raises(FileNotFoundError) as e:
        cxlkv.Region.open("/nonexistent/cxlkv")
    assert getattr(e.value, "code") == Result.IO
    with cxlkv.Region.memfd(4096) as tiny:
        with pytest.raises(cxlkv.RegionError) as r:
            tiny.attach(local_dir=local_dir)
        assert r.value.code == Result.NOT_INITIALIZED
        with pytest.raises(cxlkv.RegionError):
            tiny.format()
    with cxlkv.Region.memfd(16 << 20) as r2:
        with pytest.raises(cxlkv.InvalidArgumentError):
            r2.format(n_stripes=3)
        with pytest.raises(cxlkv.InvalidArgumentError):
            r2.format(flush_mode="no-such-mode")
        with pytest.raises(cxlkv.InvalidArgumentError, match="no capacity is called n_stripe"):
            r2.format(n_stripe=4)  # type: ignore[call-arg]
        with pytest.raises(cxlkv.InvalidArgumentError):
            r2.format(n_stripes=-1)
        # Every capacity of the table is a keyword (None: its default).
        r2.format(max_nodes=4, n_stripes=4, entries_per_stripe=64, chunk_shift=16, change_records=8, tier_records=None)
    created = cxlkv.Region.create(shm_path, 16 << 20)
    assert created.size == 16 << 20
    with pytest.raises(FileExistsError):
        cxlkv.Region.create(shm_path, 16 << 20)
    created.close()
    assert created.closed
    # The file's mode is the one asked, whatever the umask; the owner must
    # read and write.
    old_mask = os.umask(0o077)
    try:
        shared = cxlkv.Region.create(shm_path, 16 << 20, overwrite=True, mode=0o660)
    finally:
        os.umask(old_mask)
    assert stat.S_IMODE(os.stat(shm_path).st_mode) == 0o660
    shared.close()
    with pytest.raises(cxlkv.InvalidArgumentError):
        cxlkv.Region.create(shm_path, 16 << 20, overwrite=True, mode=0o400)
    with pytest.raises(cxlkv.StaleHandleError):
        created.attach()
    created.close()  # closing twice does nothing


def test_nodes_attach_detach_and_refuse_bad_options(region: cxlkv.Region, local_dir: str) -> None:
    a = region.attach(local_dir=local_dir)
    b = region.attach(local_dir=local_dir)
    assert a.id != b.id
    with pytest.raises(cxlkv.BusyError) as e:
        region.attach(node_id=a.id, local_dir=local_dir)
    assert e.value.code == Result.NODE_BUSY
    with pytest.raises(cxlkv.InvalidArgumentError):
        region.attach(node_id=99, local_dir=local_dir)
    with pytest.raises(cxlkv.InvalidArgumentError):
        region.attach(lease_ms=0, local_dir=local_dir)
    with pytest.raises(cxlkv.BusyError):
        region.format()  # nodes of this process are attached
    b.detach()
    assert b.closed
    b.detach()  # twice: nothing
    with pytest.raises(cxlkv.StaleHandleError):
        b.lookup(0, [1])
    stats = a.stats()
    assert stats["alive_mask"] == 1 << a.id and stats["dead_mask"] == 0
    a.detach()


def test_put_get_lookup_exists_and_per_key_results(node: cxlkv.Node, ns: cxlkv.Namespace) -> None:
    keys = cxlkv.chain_keys(range(16 * 4), 16)
    assert node.lookup(ns, keys) == 0
    res = node.put(ns, [(keys[0], [b"K" * 300, b"V" * 200]), (keys[1], bytearray(b"x" * 100)), (keys[1], b"dup")])
    assert res == [Result.OK, Result.OK, Result.EXISTS]
    assert node.put(ns, [(keys[0], b"again")]) == [Result.EXISTS]
    assert node.lookup(ns, keys) == 2
    assert node.presence(ns, keys) == (2, [True, True, False, False])
    assert node.exists(ns, keys[1]) and not node.exists(ns, keys[2])
    assert not node.exists(node.namespace(ns) + 1, keys[1])  # namespaces are separate
    a, b = bytearray(250), bytearray(250)
    small = bytearray(3)
    out = node.get(ns, [(keys[0], [a, b]), (keys[1], small), (keys[3], bytearray(10))])
    assert out == [(Result.OK, 500), (Result.TOO_LARGE, 100), (Result.NOT_FOUND, 0)]
    assert bytes(a) == b"K" * 250 and bytes(b[:50]) == b"K" * 50 and bytes(b[50:]) == b"V" * 200
    arr = np.zeros(100, dtype=np.uint8)
    assert node.get(ns, [(keys[1], arr)]) == [(Result.OK, 100)]
    assert bytes(arr) == b"x" * 100
    assert node.get(ns, [(int.from_bytes(keys[1], "little"), arr)])[0][0] == Result.OK  # int keys
    shared = bytearray(64)
    with pytest.raises(cxlkv.InvalidArgumentError):
        node.get(ns, [(keys[0], shared), (keys[1], memoryview(shared)[10:])])
    with pytest.raises(BufferError):
        node.get(ns, [(keys[0], b"read-only bytes")])
    with pytest.raises(cxlkv.InvalidArgumentError):
        node.put(ns, [(b"not sixteen", b"x")])
    with pytest.raises(cxlkv.InvalidArgumentError):
        node.lookup(ns, [2**128])
    with pytest.raises(TypeError):
        node.put(ns, [(keys[2], 12345)])
    assert node.put(ns, [(keys[2], b"")]) == [Result.INVALID_ARGUMENT]  # a block is never empty
    stats = node.stats()
    assert stats["live_blocks"] == 2 and stats["node_hits"] >= 3 and stats["total_hits"] == stats["node_hits"]


def test_acquire_gives_read_only_views_that_die_with_the_pin(node: cxlkv.Node, ns: cxlkv.Namespace) -> None:
    keys = cxlkv.chain_keys(range(48), 16)
    node.put(ns, [(keys[0], b"a" * 4096), (keys[2], bytes(range(256)) * 4)])
    with node.acquire(ns, keys) as p:
        assert len(p) == 3 and p.found == 2 and p[1] is None
        assert p.keys == [keys[0], None, keys[2]]
        view = p[0]
        assert view is not None and view.readonly and bytes(view[:3]) == b"aaa"
        with pytest.raises(TypeError):
            view[0] = 1  # type: ignore[index]
        arr = np.frombuffer(p[2], dtype=np.uint8)  # type: ignore[arg-type]
        assert arr[255] == 255 and not arr.flags.writeable
        with pytest.raises(BufferError):
            p.release()  # the array still reads the block
        assert not p.released
        assert node.evict(1 << 30) == (0, 0)  # pinned: never evicted
        del arr
        gc.collect()
    assert p.released
    with pytest.raises(ValueError):
        bytes(view)  # released with the pin
    with pytest.raises(cxlkv.StaleHandleError):
        p[0]
    with pytest.raises(cxlkv.StaleHandleError):
        p.release()
    with pytest.raises(IndexError):
        node.acquire(ns, keys)[5]
    assert node.evict(1 << 30)[0] == 2


def test_reserve_publish_abort_and_context_manager(node: cxlkv.Node, ns: cxlkv.Namespace) -> None:
    keys = cxlkv.chain_keys(range(64), 16)
    with node.reserve(ns, keys[:2], [100, 200], tokens=16) as r:
        w = r[0]
        assert w is not None and not w.readonly and len(w) == 100
        w[:] = b"w" * 100
        r[1][:] = b"z" * 200  # type: ignore[index]
        assert node.lookup(ns, keys) == 0  # invisible until published
    assert r.done and node.lookup(ns, keys) == 2
    with pytest.raises(ValueError):
        w[0] = 1
    with pytest.raises(cxlkv.ExistsError) as e:
        node.reserve(ns, [keys[2], keys[1]], 10)
    assert e.value.code == Result.EXISTS and "key 1" in str(e.value)
    assert not node.exists(ns, keys[2])  # all or none
    with pytest.raises(RuntimeError), node.reserve(ns, [keys[2]], 10):
        raise RuntimeError("the producer failed")
    assert not node.exists(ns, keys[2])  # aborted
    r2 = node.reserve(ns, [keys[2]], 10)
    assert r2.publish() == [Result.OK]
    with pytest.raises(cxlkv.StaleHandleError):
        r2.abort()
    r3 = node.reserve(ns, [keys[3]], 10)
    r3.abort()
    assert not node.exists(ns, keys[3])
    with pytest.raises(cxlkv.InvalidArgumentError):
        node.reserve(ns, keys[:2], [1, 2, 3])
    with pytest.raises(cxlkv.CapacityError) as big:
        node.reserve(ns, [keys[3]], 1 << 40)
    assert big.value.code == Result.TOO_LARGE


def test_detach_waits_for_pins_and_reservations(region: cxlkv.Region, local_dir: str, ns: cxlkv.Namespace) -> None:
    node = region.attach(local_dir=local_dir)
    node.put(ns, [(1, b"one")])
    p = node.acquire(ns, [1])
    with pytest.raises(cxlkv.BusyError):
        node.detach()
    p.release()
    node.detach()
    assert node.closed


def test_evict_recover_check(node: cxlkv.Node, ns: cxlkv.Namespace) -> None:
    node.put(ns, [(k, b"x" * 1000) for k in range(10)])
    blocks, nbytes = node.evict(1)
    assert blocks >= 1 and nbytes >= 1000
    report = node.recover()
    assert report["nodes_freed"] == 0 and set(report) >= {"pins_dropped", "locks_repaired"}
    assert node.check() == []


def test_threads_share_a_node_with_the_gil_released(node: cxlkv.Node, ns: cxlkv.Namespace) -> None:
    import threading

    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(50):
                k = t * 1000 + i
                body = bytes([t, i % 256]) * 512
                assert node.put(ns, [(k, body)]) == [Result.OK]
                buf = bytearray(len(body))
                assert node.get(ns, [(k, buf)]) == [(Result.OK, len(body))] and bytes(buf) == body
                with node.acquire(ns, [k]) as p:
                    assert bytes(p[0]) == body  # type: ignore[arg-type]
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors and not any(th.is_alive() for th in threads)
    assert node.stats()["live_blocks"] == 200


def test_inbox_send_recv_call_reply(region: cxlkv.Region, local_dir: str, ns: cxlkv.Namespace) -> None:
    import threading

    with region.attach(local_dir=local_dir) as a, region.attach(local_dir=local_dir) as b:
        assert b.try_recv() is None
        a.send(b.id, 7, [1, b"\x02" * 16], ns=ns, status=3, stamp=99)
        m = b.recv(5000)
        assert (m.kind, m.ns, m.status, m.stamp, m.sender) == (7, a.namespace(ns), 3, 99, a.id)
        assert m.keys == [(1).to_bytes(16, "little"), b"\x02" * 16]
        assert "kind=0x7" in repr(m)
        with pytest.raises(cxlkv.TimedOutError) as e:
            b.recv(10)
        assert e.value.code == Result.TIMEOUT
        with pytest.raises(cxlkv.InvalidArgumentError):
            a.send(b.id, 1 << 31)
        with pytest.raises(cxlkv.CxlkvError) as e:
            a.send(63, 1)
        assert e.value.code == Result.BAD_NODE

        def server() -> None:
            req = b.recv(10_000)
            b.reply(req, req.status + 1, [req.stamp])

        t = threading.Thread(target=server)
        t.start()
        ans = a.call(b.id, 5, [9], status=41, stamp=1234, timeout_ms=10_000)
        t.join(30)
        assert not t.is_alive()
        assert ans.status == 42 and ans.kind == 5 | (1 << 31) and ans.sender == b.id
        assert ans.keys == [(1234).to_bytes(16, "little")] and ans.request_id != 0


def test_remove_takes_the_blocks_of_given_keys_only(node: cxlkv.Node, ns: cxlkv.Namespace) -> None:
    node.put(ns, [(k, b"r" * 100) for k in range(6)])
    node.put(cxlkv.Namespace("other-model"), [(1, b"other")])
    with node.acquire(ns, [5]):
        assert node.remove(ns, [1, 3, 5, 42]) == [True, True, False, False]
    assert [node.exists(ns, k) for k in range(6)] == [True, False, True, False, True, True]
    assert node.exists(cxlkv.Namespace("other-model"), 1)
    assert node.remove(ns, []) == []
    assert node.remove(ns, [5]) == [True]


def test_an_ssd_tier_started_from_python_brings_evicted_blocks_back(region: cxlkv.Region, local_dir: str) -> None:
    # On a disk file system: tmpfs would not enforce O_DIRECT's alignment.
    with tempfile.TemporaryDirectory(prefix="cxlkv-py-tier-", dir="/var/tmp") as drive:
        owner = region.attach(local_dir=local_dir)
        user = region.attach(local_dir=local_dir)
        with pytest.raises(cxlkv.InvalidArgumentError):
            owner.start_tier([])
        # Every option of the tier's table is a keyword; others, and values
        # an option cannot take, are refused before anything starts.
        with pytest.raises(cxlkv.InvalidArgumentError, match="no tier option is called batches"):
            owner.start_tier([drive], batches=4)
        with pytest.raises(cxlkv.InvalidArgumentError):
            owner.start_tier([drive], batch=-1)
        with owner.start_tier([drive], slot_bytes=64 << 10, capacity=8 << 20, high_water=1.0, batch=4) as tier:
            keys = cxlkv.chain_keys(range(16 * 12), 16)
            blocks = [bytes([i]) * 30_000 for i in range(len(keys))]
            user.put(7, list(zip(keys, blocks)))
            assert tier.spill_all() == len(keys)
            user.evict(1 << 40)
            assert user.lookup(7, keys) == 0
            out = [bytearray(30_000) for _ in keys]
            got = user.get(7, list(zip(keys, out)))
            assert [r for r, _ in got] == [Result.OK] * len(keys)
            assert [bytes(b) for b in out] == blocks
            stats = tier.stats()
            assert stats["promotions"] == len(keys) and stats["held"] == len(keys)
            assert stats["engine"] is not None
            # Every counter the platform keeps, as in C and Node.
            assert stats["bytes_read"] > 0 and stats["bytes_written"] > 0
            assert stats["memory_dirs"] in (0, 1) and stats["registered_bytes"] >= 0
            assert isinstance(stats["io_priority"], bool) and isinstance(stats["cpu_priority"], bool)
        with pytest.raises(cxlkv.StaleHandleError):
            tier.spill_all()
        tier.stop()  # stopping twice does nothing
        owner.detach()
        user.detach()


def test_the_shared_memory_library(region: cxlkv.Region, local_dir: str) -> None:
    """Allocations named by roots, found and read from another node, guarded
    by an application lock: what C's cxlkv_alloc, cxlkv_root_* and
    cxlkv_lock_* offer."""
    import threading

    with region.attach(local_dir=local_dir) as a, region.attach(local_dir=local_dir) as b:
        off = a.alloc(256)
        a.write_range(off, b"config v1" + bytes(247))
        a.root_put("model-config", off, 256, tag=7)
        with pytest.raises(cxlkv.ExistsError):
            a.root_put("model-config", off, 256)
        o, size, tag = b.root_get("model-config")
        assert (o, size, tag) == (off, 256, 7)
        assert b.read_range(o, 9) == b"config v1"
        lock = a.lock_alloc()
        with b.lock(lock) as held:
            assert held.number == lock and not held.released
            b.write_range(o, b"config v2")
        assert held.released
        assert a.read_range(off, 9) == b"config v2"
        # Held by the thread that took it: another thread cannot release it.
        held = a.lock(lock)
        errors: list[BaseException] = []

        def other() -> None:
            try:
                held.release()
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=other)
        t.start()
        t.join(30)
        assert errors and isinstance(errors[0], cxlkv.InvalidArgumentError)
        held.release()
        held.release()  # twice: nothing
        a.lock_free(lock)
        with pytest.raises(cxlkv.NotFoundError):
            a.lock_free(lock)
        # Bounds and names are checked.
        with pytest.raises(cxlkv.CxlkvError):
            a.read_range(0, 16)  # the header, not the payload area
        with pytest.raises(cxlkv.InvalidArgumentError):
            a.root_get("")
        with pytest.raises(cxlkv.InvalidArgumentError):
            a.root_get("x" * 33)
        assert b.root_free("model-config") == (off, 256, 7)
        with pytest.raises(cxlkv.NotFoundError):
            a.root_get("model-config")
        spare = a.alloc(64)
        a.root_put("spare", spare, 64)
        assert a.root_destroy("spare") == (spare, 64, 0)
        a.free(spare)
        assert a.check() == []


def test_tenants_keep_quotas_and_shares_and_drop_whole(region: cxlkv.Region, local_dir: str) -> None:
    a = region.attach(local_dir=local_dir)
    b = region.attach(local_dir=local_dir)
    try:
        a.tenant_add("busy", quota=64 * 1024, priority=2)
        b.tenant_add("quiet", share=8 * 1024)
        with pytest.raises(cxlkv.ExistsError):
            b.tenant_add("busy")
        with pytest.raises(cxlkv.InvalidArgumentError):
            b.tenant_add("a-name-longer-than-twenty")
        model = cxlkv.Namespace("tenant-model")
        nb = a.namespace(model, tenant="busy")
        nq = b.namespace(model, tenant="quiet")
        assert len({nb, nq, b.namespace(model)}) == 3  # one model, three namespaces
        with pytest.raises(cxlkv.NotFoundError):
            a.namespace(model, tenant="nobody")
        for i in range(20):
            (a if i % 2 else b).put(nb, [(1000 + i, b"t" * 10_000)])
        b.put(nq, [(1000, b"q" * 10_000)])
        by_name = {t["name"]: t for t in a.tenants()}
        assert list(by_name) == ["default", "busy", "quiet"]
        busy = by_name["busy"]
        assert busy["quota"] == 64 * 1024 and busy["priority"] == 2
        assert busy["bytes"] <= 64 * 1024 and busy["bytes"] == busy["blocks"] * 10_000 and busy["evictions"] > 0
        assert by_name["quiet"]["bytes"] == 10_000 and not by_name["quiet"]["dropping"]
        buf = bytearray(10_000)
        assert b.get(nq, [(1000, buf)]) == [(Result.OK, 10_000)]
        assert buf == b"q" * 10_000  # the same key in another tenant: its own block
        b.tenant_set("busy", quota=20_000)
        a.put(nb, [(2000, b"t" * 10_000)])
        assert {t["name"]: t for t in a.tenants()}["busy"]["bytes"] <= 20_000
        blocks, nbytes = a.tenant_drop("busy")
        assert blocks >= 1 and nbytes == blocks * 10_000
        assert [t["name"] for t in b.tenants()] == ["default", "quiet"]
        with pytest.raises(cxlkv.NotFoundError):
            a.put(nb, [(3000, b"x")])  # a dropped tenant takes no block
        assert b.exists(nq, 1000)
        assert a.check() == []
        # A lifetime: once it has passed, the block is missing to every
        # reader and a put replaces it (only what must hold after the wait
        # is checked).
        a.tenant_add("brief", ttl_ms=30, scrub=True)
        ns = a.namespace(model, tenant="brief")
        a.put(ns, [(5000, b"b" * 100)])
        time.sleep(0.06)
        assert not b.exists(ns, 5000) and b.lookup(ns, [5000]) == 0
        assert b.get(ns, [(5000, bytearray(100))])[0][0] == Result.NOT_FOUND
        assert b.put(ns, [(5000, b"c" * 100)]) == [Result.OK]
        brief = {t["name"]: t for t in a.tenants()}["brief"]
        assert brief["ttl_ms"] == 30 and brief["scrub"] and brief["expired"] == 1 and brief["blocks"] == 1
        with pytest.raises(cxlkv.InvalidArgumentError):
            a.tenant_set("brief", ttl_ms=(1 << 40) + 1)
    finally:
        a.detach()
        b.detach()
