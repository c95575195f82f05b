"""A Python peer for the Node tests: attaches to a region, prints its node
id, the namespace id it registers, its digest and the chain keys it computes, then serves one request
(answering status+1 with the request's stamp as a key) and makes one call
to the Node node named on stdin, printing the answer.

    python peer.py REGION LOCAL_DIR
"""

import sys

import cxlkv


def main() -> None:
    path, local = sys.argv[1:3]
    with cxlkv.Region.open(path) as region, region.attach(local_dir=local) as node:
        keys = cxlkv.chain_keys(list(range(64)), 16)
        ns = cxlkv.Namespace("llama", kv_layout=1, dtype=2, tp_rank=1, tp_size=2, block_tokens=16, extra=7, salt="tenant-a")
        print(f"ready {node.id} {node.namespace(ns)} {ns.digest.hex()} {' '.join(k.hex() for k in keys)}", flush=True)
        req = node.recv(30_000)
        node.reply(req, req.status + 1, [req.stamp, *req.keys])
        to = int(sys.stdin.readline())
        ans = node.call(to, 21, [b"\x05" * 16], status=8, stamp=77, timeout_ms=30_000)
        print(f"answer {ans.status} {ans.kind} {ans.sender} {' '.join(k.hex() for k in ans.keys)}", flush=True)


if __name__ == "__main__":
    main()
