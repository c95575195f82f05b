"""Puts and gets as a Python user makes them, one in flight (QD1).

Puts: `Node.put` of one block a call, fresh keys filling a working set, in
each mode of `--put-modes`; beside the same puts into Redis over a unix
socket (redis-py with the hiredis parser: `SET key value`), in the same
run, when a `redis-server` is on PATH and the `redis` module imports
(`apt-get install redis-server`, `pip install redis hiredis`); otherwise the
table says Redis was not measured.

Gets: one process puts blocks filling a working set, a second process reads
every block once in a random order right after attaching (its page tables
still filling) and once more, each through `Node.get` into a preallocated
buffer; beside a same-run copy of equally large blocks picked at random
from a private pool as large, in the reader process (`memoryview` slice
assignment: one memcpy plus Python's call cost).

    python ffi-python/bench.py [--mode clflush] [--put-modes coherent,clflush]
                               [--sizes 16K,256K,2M] [--ws-mib 1920] [--no-redis]

Prints tables; numbers, not pass/fail.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import shutil
import subprocess
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
    try:
        with region_for(path, mode, size, n) as region:
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


def region_for(path: str, mode: str, size: int, n: int) -> "cxlkv.Region":
    region_bytes = n * size + n * 256 + (64 << 20)
    region = cxlkv.Region.create(path, region_bytes + region_bytes // 8, overwrite=True)
    entries = 1 << max(10, (2 * n - 1).bit_length())
    region.format(flush_mode=mode, n_stripes=64, entries_per_stripe=entries // 64)
    return region


def put_pass(mode: str, size: int, ws: int, tmp: str) -> list[int]:
    """Latencies of `n` puts of fresh keys, one block a call, into a region
    in use: a first pass of as many keys (not timed) touched its pages and
    was cleared, as a running cache's memory is resident."""
    n = max(16, ws // size)
    path = os.path.join("/dev/shm", f"cxlkv-pybench-put-{os.getpid()}")
    block = b"\x5a" * size
    lat = []
    try:
        with region_for(path, mode, size, n) as region, region.attach(flush_mode=mode, local_dir=tmp) as node:
            for timed in (False, True):
                for i in range(n * timed, n * timed + n):
                    t = time.perf_counter_ns()
                    rs = node.put(NS, [(key(i), block)])
                    if timed:
                        lat.append(time.perf_counter_ns() - t)
                    if rs != [cxlkv.Result.OK]:
                        raise SystemExit(f"put {i}: {rs}")
                if not timed:
                    node.clear_namespaces([NS])
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return lat


def redis_pass(size: int, ws: int, tmp: str) -> list[int] | str:
    """Latencies of the same puts into a Redis of its own over a unix
    socket (persistence off), or why Redis was not measured."""
    exe = shutil.which("redis-server")
    if exe is None:
        return "no redis-server on PATH"
    try:
        import redis
    except ImportError:
        return "no redis module (pip install redis hiredis)"
    if not getattr(redis.utils, "HIREDIS_AVAILABLE", False):
        return "redis-py without hiredis (pip install hiredis)"
    sock = os.path.join(tmp, "redis.sock")
    args = [exe, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(args + ["--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        r = redis.Redis(unix_socket_path=sock)
        while True:
            try:
                r.ping()
                break
            except (redis.ConnectionError, FileNotFoundError):
                if time.monotonic() > deadline or proc.poll() is not None:
                    return "redis-server did not start"
                time.sleep(0.05)
        n = max(16, ws // size)
        block = b"\x5a" * size
        lat = []
        # As for cxlkv: a first pass (not timed), emptied, then the timed one.
        for timed in (False, True):
            for i in range(n * timed, n * timed + n):
                t = time.perf_counter_ns()
                r.set(key(i), block)
                if timed:
                    lat.append(time.perf_counter_ns() - t)
            if not timed:
                r.flushall()
        r.close()
        return lat
    finally:
        proc.terminate()
        proc.wait(30)


def puts(modes: list[str], sizes: list[int], ws: int, tmp: str, with_redis: bool) -> None:
    cols = [f"cxlkv {m}" for m in modes] + ["Redis unix socket"]
    print(f"Python put, one block a call, QD1, fresh keys over {ws >> 20} MiB, memory in use: p50 us (GB/s at the p50)")
    print(f"{'block':>8} " + " ".join(f"{c:>20}" for c in cols))
    notes = []
    for size in sizes:
        cells = []
        res: dict[str, tuple[float, float]] = {}
        for m in modes:
            lat = put_pass(m, size, ws, tmp)
            p50 = quantile(lat, 0.5)
            res[m] = (p50 / 1e3, size / max(1, p50))
        rlat = redis_pass(size, ws, tmp) if with_redis else "--no-redis"
        for m in modes:
            cells.append(f"{res[m][0]:.1f} ({res[m][1]:.2f})")
        if isinstance(rlat, str):
            cells.append("not measured")
            note = f"Redis not measured: {rlat}"
            if note not in notes:
                notes.append(note)
        else:
            rp50 = quantile(rlat, 0.5) / 1e3
            cells.append(f"{rp50:.1f} ({size / max(1e-9, rp50 * 1e3):.2f})")
            for m in modes:
                notes.append(f"{size >> 10} KiB: cxlkv {m} p50 {rp50 / max(res[m][0], 1e-9):.1f}x faster than Redis")
        if "coherent" in res:
            for m in modes:
                if m != "coherent":
                    pct = 100 * res[m][1] / max(res["coherent"][1], 1e-9)
                    notes.append(f"{size >> 10} KiB: cxlkv {m} at {pct:.0f} % of coherent's GB/s")
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        print(f"{label:>8} " + " ".join(f"{c:>20}" for c in cells))
    for note in notes:
        print(f"  {note}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="clflush")
    ap.add_argument("--sizes", default="16K,256K,2M")
    ap.add_argument("--ws-mib", type=int, default=1920)
    ap.add_argument("--put-modes", default=None, help="modes of the put table (default: coherent and --mode)")
    ap.add_argument("--no-redis", action="store_true", help="leave Redis out of the put table")
    a = ap.parse_args()
    mult = {"K": 1 << 10, "M": 1 << 20}
    sizes = [int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s) for s in a.sizes.split(",")]
    put_modes = a.put_modes.split(",") if a.put_modes else list(dict.fromkeys(["coherent", a.mode]))
    with tempfile.TemporaryDirectory() as tmp:
        puts(put_modes, sizes, a.ws_mib << 20, tmp, not a.no_redis)
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
