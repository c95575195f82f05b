"""Per-object cost of cxlkv's LMCache connector, driven through LMCache's
`NativeConnectorL2Adapter`, against a raw cxlkv batch call moving the same
bytes: a store task of N objects (submit until its eventfd result) beside
one `Node.put` of the same buffers, and a load task beside one `Node.get`;
and the connector's own load (its submit, eventfd and drain, without
LMCache's adapter thread). Prints a table; numbers, not pass or fail.

    python bench_lmcache.py [--quick]
"""

from __future__ import annotations

import os
import select
import sys
import tempfile
import threading
import time

import cxlkv
from cxlkv.lmcache import parse_key
from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import _object_key_to_string

from lmcache_support import key, load, make_adapter, obj, store


def median(v: list[float]) -> float:
    return sorted(v)[len(v) // 2]


def main() -> None:
    quick = "--quick" in sys.argv
    rounds = 4 if quick else 20
    cases = [(64, 256 << 10), (64, 2 << 20)] if not quick else [(64, 64 << 10)]
    path = f"/dev/shm/cxlkv-lmcache-bench-{os.getpid()}"
    local = tempfile.mkdtemp(prefix="cxlkv-lmcache-bench-")
    print("LMCache connector vs raw cxlkv batch call, same bytes, medians (us)")
    print(
        f"{'objects':>8} {'object':>8} {'store':>9} {'raw put':>9} {'x':>5} {'load':>9} {'raw get':>9} {'x':>5}"
        f" {'conn. load':>10} {'x':>5}"
    )
    try:
        for n, size in cases:
            with cxlkv.Region.create(path, 3 * n * size + (256 << 20), overwrite=True) as r:
                r.format(n_stripes=64, entries_per_stripe=4096)
            a = make_adapter({"region": path, "local_dir": local})
            node = a._client._node  # the connector's own node
            srcs = [obj(bytes([i % 251]) * size) for i in range(n)]
            dsts = [obj(bytes(size)) for _ in range(n)]
            st, pt, lt, gt, ct = [], [], [], [], []
            conn = a._client
            p = select.poll()
            p.register(conn.event_fd(), select.POLLIN)
            for rnd in range(rounds):
                node.evict(1 << 62)  # room for this round's objects, untimed
                keys = [key(rnd * n + i) for i in range(n)]
                ns_fields, _ = parse_key(_object_key_to_string(keys[0]))
                ns = a._client._namespace(ns_fields)
                raw = [(bytes([2, rnd % 256]) + i.to_bytes(4, "little") * 3 + b"rw", s.byte_array) for i, s in enumerate(srcs)]
                into = [(k, d.byte_array) for (k, _), d in zip(raw, dsts)]

                def do_store() -> None:
                    t = time.perf_counter()
                    assert store(a, keys, srcs).is_successful()
                    st.append(time.perf_counter() - t)

                def raw_put() -> None:
                    t = time.perf_counter()
                    assert all(x == cxlkv.Result.OK for x in node.put(ns, raw))
                    pt.append(time.perf_counter() - t)

                def do_load() -> None:
                    t = time.perf_counter()
                    assert all(load(a, keys, dsts))
                    lt.append(time.perf_counter() - t)

                def raw_get() -> None:
                    t = time.perf_counter()
                    assert all(x == cxlkv.Result.OK for x, _ in node.get(ns, into))
                    gt.append(time.perf_counter() - t)

                def conn_load() -> None:
                    # The connector alone: LMCache's adapter paused (its
                    # demux thread would take the completion).
                    names = [_object_key_to_string(k) for k in keys]
                    views = [d.byte_array for d in dsts]
                    t = time.perf_counter()
                    fid = conn.submit_batch_get(names, views)
                    while not (done := [d for d in conn.drain_completions() if d[0] == fid]):
                        p.poll(50)
                    ct.append(time.perf_counter() - t)
                    assert done[0][3] is not None and all(done[0][3])

                # Whichever goes second finds caches the first warmed: take turns.
                for f in (do_store, raw_put) if rnd % 2 == 0 else (raw_put, do_store):
                    f()
                for f in (do_load, raw_get) if rnd % 2 == 0 else (raw_get, do_load):
                    f()
                a._stop.set()
                a._demux_thread.join()
                conn_load()
                a._stop.clear()
                a._demux_thread = threading.Thread(target=a._demux_loop, daemon=True, name="l2-adapter-demux")
                a._demux_thread.start()
            a.close()
            s_, pu, lo, g, c = (median(x) * 1e6 for x in (st, pt, lt, gt, ct))
            label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
            print(
                f"{n:>8} {label:>8} {s_:>9.0f} {pu:>9.0f} {s_ / pu:>5.2f} {lo:>9.0f} {g:>9.0f} {lo / g:>5.2f}"
                f" {c:>10.0f} {c / g:>5.2f}"
            )
    finally:
        if os.path.exists(path):
            os.unlink(path)


if __name__ == "__main__":
    main()
