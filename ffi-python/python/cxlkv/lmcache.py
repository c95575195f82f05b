"""cxlkv as an L2 tier of LMCache: a connector for its `native_plugin` L2
adapter (`NativeConnectorL2Adapter`).

LMCache 0.5.6 loads it from its L2 adapter configuration::

    --l2-adapter '{"type": "native_plugin", "module_path": "cxlkv.lmcache",
                   "class_name": "CxlkvConnector",
                   "adapter_params": {"region": "/dev/shm/kv"}}'

`adapter_params`: `region` (required: the path of a formatted cxlkv region),
`flush_mode`, `local_dir`, `node_id`, `lease_ms`, `lock_timeout_ms`,
`tenant` (the region tenant whose quota and share this engine's objects
count to; it must exist: `cxlkv tenant add REGION NAME`).

Requests (batch get, set, exists, delete) are queued to a worker thread of
the connector, which makes one cxlkv batch call per namespace of the batch
with the GIL released, then signals the connector's eventfd; the adapter
drains the completions. An LMCache key (`model@rank@group@chunk_hash[@salt]`)
becomes namespace (model, KV rank, object group, cache salt) and key (the
chunk hash's last 16 bytes).
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Optional

from . import CxlkvError, Namespace, Result
from .engines import EngineNamespace, EngineNode, block_key, check_tenant, put_stored

logger = logging.getLogger(__name__)

#: A finished request: its id, whether it succeeded as a whole, an error
#: message, and a result per key (None when the request failed as a whole).
Completion = tuple[int, bool, str, Optional[list[bool]]]



def parse_key(key: str) -> tuple[tuple[str, int, int, str], bytes]:
    """An LMCache key string's namespace fields (model, KV rank, object
    group, cache salt) and its cxlkv key."""
    parts = key.split("@")
    if len(parts) not in (4, 5):
        raise ValueError(f"not an LMCache object key: {key!r}")
    model, rank, group, chunk = parts[:4]
    salt = parts[4] if len(parts) == 5 else ""
    return (model, int(rank, 16), int(group, 16), salt), block_key(bytes.fromhex(chunk))


class CxlkvConnector:
    """A native connector of LMCache's `native_plugin` L2 adapter, over a
    cxlkv region (see the module docs)."""

    def __init__(
        self,
        region: Optional[str] = None,
        flush_mode: str = "auto",
        local_dir: Optional[str] = None,
        node_id: Optional[int] = None,
        lease_ms: int = 2000,
        lock_timeout_ms: int = 60000,
        tenant: Optional[str] = None,
    ) -> None:
        self._node = EngineNode(
            "cxlkv connector",
            region,
            flush_mode=flush_mode,
            local_dir=local_dir,
            node_id=node_id,
            lease_ms=lease_ms,
            lock_timeout_ms=lock_timeout_ms,
        )
        self._tenant = check_tenant("cxlkv connector", self._node, tenant)
        self._namespaces: dict[tuple[str, int, int, str], Namespace] = {}
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._ids = itertools.count(1)
        self._requests: queue.SimpleQueue[Optional[tuple[int, Callable[[], list[bool]], bool]]] = queue.SimpleQueue()
        self._done: list[Completion] = []
        self._lock = threading.Lock()
        self._closed = False
        self._worker = threading.Thread(target=self._work, name="cxlkv-lmcache", daemon=True)
        self._worker.start()
        logger.info("cxlkv connector: node %d of region %s", self._node.id, region)

    # -- keys ------------------------------------------------------------

    def _namespace(self, fields: tuple[str, int, int, str]) -> Namespace:
        ns = self._namespaces.get(fields)
        if ns is None:
            model, rank, group, salt = fields
            ns = EngineNamespace(
                engine="lmcache",
                model=model,
                dtype="",
                extra={"kv_rank": rank, "group": group, "salt": salt},
                tenant=self._tenant,
            ).namespace
            self._namespaces[fields] = ns
        return ns

    def _by_namespace(self, keys: Sequence[str]) -> dict[Namespace, list[tuple[int, bytes]]]:
        out: dict[Namespace, list[tuple[int, bytes]]] = {}
        for i, k in enumerate(keys):
            fields, key = parse_key(k)
            out.setdefault(self._namespace(fields), []).append((i, key))
        return out

    # -- the worker --------------------------------------------------------

    def _work(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            fid, run, all_or_none = item
            try:
                results = run()
                # A store succeeds when every object is stored; a lookup,
                # load or delete succeeds as a request, its per-key results
                # saying the rest.
                done: Completion = (fid, all(results) if all_or_none else True, "", results)
            except Exception as e:  # reported to LMCache as a failed request
                logger.exception("cxlkv connector: request %d failed", fid)
                done = (fid, False, str(e), None)
            with self._lock:
                self._done.append(done)
            os.eventfd_write(self._efd, 1)

    def _submit(self, run: Callable[[], list[bool]], all_or_none: bool = False) -> int:
        if self._closed:
            raise RuntimeError("cxlkv connector: closed")
        fid = next(self._ids)
        self._requests.put((fid, run, all_or_none))
        return fid

    def _set(self, keys: Sequence[str], views: Sequence[Any]) -> list[bool]:
        out = [False] * len(keys)
        for ns, items in self._by_namespace(keys).items():
            stored = put_stored(self._node, ns, [(key, views[i]) for i, key in items])
            for (i, _), s in zip(items, stored):
                out[i] = s
        return out

    def _get(self, keys: Sequence[str], views: Sequence[Any]) -> list[bool]:
        out = [False] * len(keys)
        for ns, items in self._by_namespace(keys).items():
            got = self._node.get(ns, [(key, views[i]) for i, key in items])
            for (i, _), (r, n) in zip(items, got):
                out[i] = r == Result.OK and n == len(memoryview(views[i]))
        return out

    def _exists(self, keys: Sequence[str]) -> list[bool]:
        out = [False] * len(keys)
        for ns, items in self._by_namespace(keys).items():
            _, here = self._node.presence(ns, [key for _, key in items])
            for (i, _), h in zip(items, here):
                out[i] = h
        return out

    def _delete(self, keys: Sequence[str]) -> list[bool]:
        out = [False] * len(keys)
        for ns, items in self._by_namespace(keys).items():
            for (i, _), r in zip(items, self._node.remove(ns, [key for _, key in items])):
                out[i] = r
        return out

    # -- the native connector interface -------------------------------------

    def event_fd(self) -> int:
        """The eventfd signalled when completions are ready."""
        return self._efd

    def submit_batch_get(self, keys: list[str], memoryviews: list[Any]) -> int:
        """Reads the objects of `keys` into `memoryviews`; a result per key."""
        if len(keys) != len(memoryviews):
            raise ValueError(f"{len(keys)} keys but {len(memoryviews)} buffers")
        return self._submit(lambda: self._get(keys, memoryviews))

    def submit_batch_set(self, keys: list[str], memoryviews: list[Any]) -> int:
        """Stores `memoryviews` as the objects of `keys`; a result per key
        (stored already counts as stored)."""
        if len(keys) != len(memoryviews):
            raise ValueError(f"{len(keys)} keys but {len(memoryviews)} buffers")
        return self._submit(lambda: self._set(keys, memoryviews), all_or_none=True)

    def submit_batch_exists(self, keys: list[str]) -> int:
        """Whether each key is stored (one presence call per namespace)."""
        return self._submit(lambda: self._exists(keys))

    def submit_batch_delete(self, keys: list[str]) -> int:
        """Removes the objects of `keys`; whether each was removed."""
        return self._submit(lambda: self._delete(keys))

    def drain_completions(self) -> list[Completion]:
        """The requests finished since the last call."""
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass
        with self._lock:
            done, self._done = self._done, []
        return done

    def close(self) -> None:
        """Finishes the queued requests, stops the worker and detaches."""
        if self._closed:
            return
        self._closed = True
        self._requests.put(None)
        self._worker.join()
        try:
            self._node.detach()
        except CxlkvError as e:
            logger.warning("cxlkv connector: detach: %s", e)
        os.close(self._efd)
