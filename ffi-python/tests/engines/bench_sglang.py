"""Per-page cost of cxlkv's SGLang backend against a raw cxlkv batch call
moving the same bytes: `batch_set_v1` / `batch_get_v1` of N pages of a host
pool (layer-first: K and V segments of every layer per page) beside one
`Node.put` / `Node.get` of the same segments, prepared beforehand. Prints a
table; numbers, not pass or fail.

    python bench_sglang.py [--quick]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import cxlkv
from cxlkv.sglang import _view, page_key

from sglang_support import HostPool, make_backend, page_keys


def median(v: list[float]) -> float:
    return sorted(v)[len(v) // 2]


def main() -> None:
    quick = "--quick" in sys.argv
    rounds = 4 if quick else 20
    # (pages, tokens per page, layers, heads, head dim): fp16 pages.
    cases = [(64, 16, 8, 8, 128), (64, 64, 16, 4, 128)] if not quick else [(64, 16, 4, 4, 64)]
    path = f"/dev/shm/cxlkv-sglang-bench-{os.getpid()}"
    local = tempfile.mkdtemp(prefix="cxlkv-sglang-bench-")
    print("SGLang backend vs raw cxlkv batch call, same bytes, medians (us)")
    print(f"{'pages':>6} {'page':>8} {'segs':>5} {'set_v1':>9} {'raw put':>9} {'x':>5} {'get_v1':>9} {'raw get':>9} {'x':>5}")
    try:
        for n, tokens, layers, heads, dim in cases:
            pool = HostPool(2 * n, page_size=tokens, layer_num=layers, head_num=heads, head_dim=dim)
            page_bytes = 2 * layers * tokens * heads * dim * 2
            with cxlkv.Region.create(path, 3 * n * page_bytes + (256 << 20), overwrite=True) as r:
                r.format(n_stripes=64, entries_per_stripe=4096)
            extra = {"backend_name": "cxlkv", "module_path": "cxlkv.sglang", "class_name": "CxlkvStorage",
                     "interface_v1": 1, "region": path, "local_dir": local}
            b = make_backend(extra, pool)
            node, ns = b._node, b.namespace
            for p in range(n):
                pool.fill(p, seed=p)
            src_idx, dst_idx = pool.page_indices(list(range(n))), pool.page_indices(list(range(n, 2 * n)))
            ptrs, sizes = pool.get_page_buffer_meta(src_idx)
            per = len(ptrs) // n
            segs = [[_view(ptrs[i * per + j], sizes[i * per + j]) for j in range(per)] for i in range(n)]
            dptrs, dsizes = pool.get_page_buffer_meta(dst_idx)
            dsegs = [[_view(dptrs[i * per + j], dsizes[i * per + j]) for j in range(per)] for i in range(n)]
            st, pt, gt, rt = [], [], [], []
            for rnd in range(rounds):
                node.evict(1 << 62)  # room for this round's pages, untimed
                keys = page_keys(n, start=rnd * n)
                raw = [(page_key(k)[:8] + b"raw-page", s) for k, s in zip(keys, segs)]
                into = [(k, d) for (k, _), d in zip(raw, dsegs)]

                def set_v1() -> None:
                    t = time.perf_counter()
                    assert all(b.batch_set_v1(keys, src_idx))
                    st.append(time.perf_counter() - t)

                def raw_put() -> None:
                    t = time.perf_counter()
                    assert all(x == cxlkv.Result.OK for x in node.put(ns, raw))
                    pt.append(time.perf_counter() - t)

                def get_v1() -> None:
                    t = time.perf_counter()
                    assert all(b.batch_get_v1(keys, dst_idx))
                    gt.append(time.perf_counter() - t)

                def raw_get() -> None:
                    t = time.perf_counter()
                    assert all(x == cxlkv.Result.OK for x, _ in node.get(ns, into))
                    rt.append(time.perf_counter() - t)

                # Whichever goes second finds caches the first warmed: take turns.
                for f in (set_v1, raw_put) if rnd % 2 == 0 else (raw_put, set_v1):
                    f()
                for f in (get_v1, raw_get) if rnd % 2 == 0 else (raw_get, get_v1):
                    f()
            b.close()
            s, p, g, r = (median(x) * 1e6 for x in (st, pt, gt, rt))
            label = f"{page_bytes >> 20} MiB" if page_bytes >= 1 << 20 else f"{page_bytes >> 10} KiB"
            print(f"{n:>6} {label:>8} {per:>5} {s:>9.0f} {p:>9.0f} {s / p:>5.2f} {g:>9.0f} {r:>9.0f} {g / r:>5.2f}")
    finally:
        if os.path.exists(path):
            os.unlink(path)


if __name__ == "__main__":
    main()
