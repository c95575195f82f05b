"""cxlkv from Python: a region, a node, blocks written in place, found by
prefix, read zero-copy, and a copying put and get.

    pip install ./ffi-python numpy
    python ffi-python/examples/quickstart.py
"""

import os

import numpy as np

import cxlkv

path = f"/dev/shm/cxlkv-quickstart-{os.getpid()}"
region = cxlkv.Region.create(path, 64 << 20)  # or Region.open("/dev/dax0.0")
region.format()  # once per region, before any node attaches
try:
    with region.attach() as node:  # heartbeat + lock manager; detaches on exit
        ns = cxlkv.Namespace("llama-3-8b", dtype=1, tp_rank=0, tp_size=2, block_tokens=16)
        tokens = list(range(1000, 1048))  # a 48-token prompt: 3 blocks of 16
        keys = cxlkv.chain_keys(tokens, 16)  # chained 128-bit block hashes
        with node.reserve(ns, keys, 4096, tokens=16) as blocks:  # writable views
            for i in range(len(blocks)):
                np.frombuffer(blocks[i], dtype=np.uint8)[:] = i + 1
        # published on a normal exit, aborted on an exception
        hit = node.lookup(ns, keys)  # longest cached prefix
        with node.acquire(ns, keys[:hit]) as pinned:  # zero-copy, read-only views
            kv = np.frombuffer(pinned[0], dtype=np.float16)
            print(f"cached prefix: {hit} of {len(keys)} blocks; block 0 holds {kv.size} fp16 values")
            del kv  # arrays over a pinned block go before the pin does
        key = cxlkv.chain_keys(tokens + list(range(16)), 16)[3]
        print(node.put(ns, [(key, [b"K" * 512, b"V" * 512])]))  # copying: [Result.OK]
        out = bytearray(1024)
        print(node.get(ns, [(key, out)]))  # [(Result.OK, 1024)]
        assert out == b"K" * 512 + b"V" * 512
finally:
    region.close()
    os.unlink(path)
