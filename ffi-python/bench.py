"""QD1 get latency as a Python user sees it: one process puts blocks filling a
working set, a second process reads every block once in a random order right
after attaching (its page tables still filling) and once more, each through
`Node.get` into a preallocated buffer; beside a same-run copy of equally
large blocks picked at random from a private pool as large, in the reader
process (`memoryview` slice assignment: one memcpy plus Python's call cost).

    python ffi-python/bench.py [--mode clflush] [--sizes 16K,256K,2M] [--ws-mib 1920]

Prints a table; numbers, not pass/fail.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import tempfile
import time

import cxlkv

NS = 7


def key(i: int) -> bytes:
    return i.to_bytes(8, "little") + b"bench-py"


def quantile(v: list[int], q: float) -> int:
    v = sorted(v)
    return v[max(1, min(len(v), int(len(v) * q + 0.999999))) - 1]


def reader(path: str, local: str, mode: str, size: int, n: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    rng = random.Random(size)
    buf = bytearray(size)
    order = list(range(n))
    with cxlkv.Region.open(path) as region, region.attach(flush_mode=mode, local_dir=local) as node:

        def one_pass() -> list[int]:
            rng.shuffle(order)
            lat = []
            for i in order:
                t = time.perf_counter_ns()
                [(r, got)] = node.get(NS, [(key(i), buf)])
                lat.append(time.perf_counter_ns() - t)
                if r != cxlkv.Result.OK or got != size:
                    raise SystemExit(f"get {i}: {r} {got}")
            if buf[0] != 0x3C or buf[-1] != 0x3C:
                raise SystemExit("wrong bytes")
            return lat

        first = one_pass()
        again = one_pass()
    pool = memoryview(bytearray(size * n))
    dst = memoryview(buf)
    rng.shuffle(order)
    copy = []
    for i in order:
        t = time.perf_counter_ns()
        dst[:] = pool[i * size : (i + 1) * size]
        copy.append(time.perf_counter_ns() - t)
    out.put({"first": first, "again": again, "copy": copy})


def one_size(mode: str, size: int, ws: int, tmp: str) -> dict[str, list[int]]:
    n = max(16, ws // size)
    path = os.path.join("/dev/shm", f"cxlkv-pybench-{os.getpid()}")
    region_bytes = n * size + n * 256 + (64 << 20)
    try:
        with cxlkv.Region.create(path, region_bytes + region_bytes // 8, overwrite=True) as region:
            entries = 1 << max(10, (2 * n - 1).bit_length())
            region.format(flush_mode=mode, n_stripes=64, entries_per_stripe=entries // 64)
            with region.attach(flush_mode=mode, local_dir=tmp) as node:
                block = b"\x3c" * size
                for s in range(0, n, 64):
                    rs = node.put(NS, [(key(i), block) for i in range(s, min(n, s + 64))])
                    if any(r != cxlkv.Result.OK for r in rs):
                        raise SystemExit(f"put: {rs}")
                ctx = mp.get_context("spawn")
                out = ctx.Queue()
                p = ctx.Process(target=reader, args=(path, tmp, mode, size, n, out))
                p.start()
                res = out.get(timeout=600)
                p.join(60)
                return res  # type: ignore[no-any-return]
    finally:
        if os.path.exists(path):
            os.unlink(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="clflush")
    ap.add_argument("--sizes", default="16K,256K,2M")
    ap.add_argument("--ws-mib", type=int, default=1920)
    a = ap.parse_args()
    mult = {"K": 1 << 10, "M": 1 << 20}
    sizes = [int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s) for s in a.sizes.split(",")]
    print(f"Python Node.get, other process, QD1, random keys over {a.ws_mib} MiB, mode {a.mode}")
    print(f"{'block':>8} {'first p50':>10} {'first p99':>10} {'again p50':>10} {'again p99':>10} {'copy p50':>10}  (us)")
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            r = one_size(a.mode, size, a.ws_mib << 20, tmp)
            f = [quantile(r[k], q) / 1e3 for k, q in (("first", 0.5), ("first", 0.99), ("again", 0.5), ("again", 0.99), ("copy", 0.5))]
            label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
            print(f"{label:>8} " + " ".join(f"{x:>10.1f}" for x in f))


if __name__ == "__main__":
    main()
