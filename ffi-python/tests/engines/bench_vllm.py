"""Per-chunk cost of cxlkv's vLLM tier against a raw cxlkv batch call moving
the same bytes: a store job of N chunks (submit_store until
get_finished_jobs reports it, polled as tightly as a scheduler could) beside
one `Node.put` of the same N chunk views under other keys, and a load job
beside one `Node.get` into the same chunks. Prints a table; numbers, not
pass or fail.

    python bench_vllm.py [--quick]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import cxlkv
from cxlkv.engines import block_key

from vllm_support import fill, job, key, make_tier, wait_job


def median(v: list[float]) -> float:
    return sorted(v)[len(v) // 2]


def main() -> None:
    quick = "--quick" in sys.argv
    rounds = 4 if quick else 20
    cases = [(64, 256 << 10), (64, 2 << 20)] if not quick else [(64, 64 << 10)]
    path = f"/dev/shm/cxlkv-vllm-bench-{os.getpid()}"
    local = tempfile.mkdtemp(prefix="cxlkv-vllm-bench-")
    print("vLLM tier vs raw cxlkv batch call, same bytes, medians (us)")
    print(f"{'chunks':>7} {'chunk':>8} {'store job':>10} {'raw put':>9} {'x':>5} {'load job':>9} {'raw get':>9} {'x':>5}")
    try:
        for n, size in cases:
            with cxlkv.Region.create(path, 3 * n * size + (256 << 20), overwrite=True) as r:
                r.format(n_stripes=64, entries_per_stripe=4096)
            cfg = {"type": "CxlkvTier", "module_path": "cxlkv.vllm", "region": path, "local_dir": local}
            tier, rows = make_tier(cfg, n_chunks=2 * n, chunk_bytes=size)
            node = tier._node  # the tier's own node: the same process and mapping
            ns = tier.namespace(0)
            for c in range(n):
                fill(rows, c, seed=c)
            store, put, load, get = [], [], [], []
            views = [tier._row(c) for c in range(n)]
            for rnd in range(rounds):
                node.evict(1 << 62)  # room for this round's chunks, untimed
                keys = [key(rnd * n + c) for c in range(n)]
                # Keys the tier's never are: a key is the hash's last 16
                # bytes, and the tier's hashes repeat their index there.
                raw = [(block_key(b"raw" + bytes([rnd % 256]) + c.to_bytes(4, "little") * 3), v) for c, v in enumerate(views)]
                into = [(k, tier._row(n + c)) for c, (k, _) in enumerate(raw)]

                def tier_store() -> None:
                    t = time.perf_counter()
                    tier.submit_store(job(2 * rnd, keys, list(range(n)), promotion=False))
                    assert wait_job(tier, 2 * rnd, poll_s=0.0005).success
                    store.append(time.perf_counter() - t)

                def raw_put() -> None:
                    t = time.perf_counter()
                    assert all(x == cxlkv.Result.OK for x in node.put(ns, raw))
                    put.append(time.perf_counter() - t)

                def tier_load() -> None:
                    t = time.perf_counter()
                    tier.submit_load(job(2 * rnd + 1, keys, list(range(n, 2 * n)), promotion=True))
                    assert wait_job(tier, 2 * rnd + 1, poll_s=0.0005).success
                    load.append(time.perf_counter() - t)

                def raw_get() -> None:
                    t = time.perf_counter()
                    assert all(x == cxlkv.Result.OK for x, _ in node.get(ns, into))
                    get.append(time.perf_counter() - t)

                # Whichever goes second finds caches the first warmed: take
                # turns.
                for f in (tier_store, raw_put) if rnd % 2 == 0 else (raw_put, tier_store):
                    f()
                for f in (tier_load, raw_get) if rnd % 2 == 0 else (raw_get, tier_load):
                    f()
            tier.shutdown()
            s, p, lo, g = (median(x) * 1e6 for x in (store, put, load, get))
            label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
            print(f"{n:>7} {label:>8} {s:>10.0f} {p:>9.0f} {s / p:>5.2f} {lo:>9.0f} {g:>9.0f} {lo / g:>5.2f}")
    finally:
        if os.path.exists(path):
            os.unlink(path)


if __name__ == "__main__":
    main()
