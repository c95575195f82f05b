"""The GPU path from Python: device memory through the CUDA driver (ctypes,
no torch needed). Without a driver or device every GPU call must raise
`CudaError` with code CUDA_UNAVAILABLE; with one, blocks make round trips
region -> device -> region and gather/scatter match a CPU reference."""

from __future__ import annotations

import ctypes
import os
from typing import Any, Optional

import pytest

import cxlkv
from cxlkv import Result


def driver() -> Optional[Any]:
    """libcuda with a context on device 0, or None."""
    if os.environ.get("CXLKV_CUDA", "").lower() in ("off", "0"):
        return None
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    dev = ctypes.c_int()
    if cu.cuInit(0) != 0 or cu.cuDeviceGet(ctypes.byref(dev), 0) != 0:
        return None
    ctx = ctypes.c_void_p()
    if cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0 or cu.cuCtxSetCurrent(ctx) != 0:
        return None
    return cu


def alloc(cu: Any, n: int) -> int:
    p = ctypes.c_uint64()
    assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)) == 0
    return p.value


def to_host(cu: Any, dptr: int, n: int) -> bytes:
    buf = ctypes.create_string_buffer(n)
    assert cu.cuMemcpyDtoH_v2(buf, ctypes.c_uint64(dptr), ctypes.c_size_t(n)) == 0
    return buf.raw


def from_host(cu: Any, dptr: int, data: bytes) -> None:
    assert cu.cuMemcpyHtoD_v2(ctypes.c_uint64(dptr), data, ctypes.c_size_t(len(data))) == 0


def test_gpu_calls_without_cuda_raise_cuda_unavailable(node: cxlkv.Node, ns: cxlkv.Namespace) -> None:
    if driver() is not None:
        pytest.skip("a CUDA device is present: test_gpu_round_trips covers it")
    with pytest.raises(cxlkv.CudaError) as e:
        node.cuda_register(0)
    assert e.value.code == Result.CUDA_UNAVAILABLE
    node.put(ns, [(1, b"x" * 64)])
    with node.acquire(ns, [1]) as p:
        with pytest.raises(cxlkv.CudaError):
            p.to_device(0, 1 << 20)
    with pytest.raises(cxlkv.CudaError):
        node.cuda_gather([(0, 1 << 20, 64)])


def test_gpu_round_trips(node: cxlkv.Node, ns: cxlkv.Namespace) -> None:
    cu = driver()
    if cu is None:
        pytest.skip("no CUDA driver or device here")
    node.cuda_register(0)
    node.cuda_register(0)  # again: nothing
    size = 256 * 1024 + 3
    body = bytes((i * 7 + 1) % 251 for i in range(size))
    dev_a, dev_b = alloc(cu, size), alloc(cu, size)
    from_host(cu, dev_a, body)
    # device -> reserved block -> published
    r = node.reserve(ns, [10], size)
    r.from_device(0, dev_a)
    assert r.publish_after() == [Result.OK]
    buf = bytearray(size)
    assert node.get(ns, [(10, buf)]) == [(Result.OK, size)] and bytes(buf) == body
    # pinned block -> device
    with node.acquire(ns, [10]) as p:
        p.to_device(0, dev_b)
        node.cuda_synchronize()
        assert to_host(cu, dev_b, size) == body
        off = p.offsets[0]
        assert off is not None
    # gather 128 pieces of 1 KiB into device memory, scatter them back
    node.put(ns, [(11, body[: 128 * 1024])])
    with node.acquire(ns, [11]) as p:
        base = p.offsets[0]
        assert base is not None
        segs = [(base + i * 1024, dev_a + (127 - i) * 1024, 1024) for i in range(128)]
        node.cuda_gather(segs)
        node.cuda_synchronize()
    got = to_host(cu, dev_a, 128 * 1024)
    want = b"".join(body[(127 - i) * 1024 : (128 - i) * 1024] for i in range(128))
    assert got == want
    with node.reserve(ns, [12], 128 * 1024) as r:
        base = r.offsets[0]
        assert base is not None
        node.cuda_scatter([(base + i * 1024, dev_a + (127 - i) * 1024, 1024) for i in range(128)])
        node.cuda_synchronize()
    out = bytearray(128 * 1024)
    assert node.get(ns, [(12, out)]) == [(Result.OK, 128 * 1024)] and bytes(out) == body[: 128 * 1024]
    # refusals: outside the payload area, never a DMA over metadata
    with pytest.raises(cxlkv.RegionError):
        node.cuda_gather([(0, dev_a, 64)])
    stats = node.cuda_stats()
    assert stats["registered_bytes"] == 32 << 20 and stats["launches"] >= 2
    assert cu.cuMemFree_v2(ctypes.c_uint64(dev_a)) == 0 and cu.cuMemFree_v2(ctypes.c_uint64(dev_b)) == 0
