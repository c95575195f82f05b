"""cxlkv as SGLang's HiCache storage backend (L3 under its host memory pool).

SGLang 0.5.23 loads it as a dynamic backend::

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "cxlkv",
        "module_path": "cxlkv.sglang", "class_name": "CxlkvStorage",
        "interface_v1": 1, "region": "/dev/shm/kv"}'

Extra-config keys beside those SGLang reads: `region` (required: the path of
a formatted cxlkv region), `flush_mode`, `local_dir`, `node_id`, `lease_ms`,
`lock_timeout_ms`, `tenant` (the region tenant whose quota and share this
server's pages count to; it must exist: `cxlkv tenant add REGION NAME`).

A page's key is the first 16 bytes of SGLang's page hash (placed so that
an event publisher with `hash="int64"` sends SGLang's own event hash, see
`page_key`); its namespace holds
the model, the host pool's layout, dtype, page size and segment sizes, and the
ranks SGLang's own file backend scopes by: the TP rank and size for MHA models
(MLA pages are the same on every TP rank: shared, and written only by
`is_storage_writer` ranks), the pipeline stage, the attention context-parallel
rank and the decode context-parallel shard. The zero-copy calls (`batch_get_v1`
/ `batch_set_v1`) move each page as one key whose payload is the page's
segments (the host pool's `get_page_buffer_meta` pointers) in order, one cxlkv
batch call per engine call.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
from typing import Any, List, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from . import Namespace, Result
from .engines import EngineNamespace, EngineNode, block_key, check_tenant, put_stored

logger = logging.getLogger(__name__)

#: Extra-config keys SGLang itself reads.
_SGLANG_KEYS = {"backend_name", "module_path", "class_name", "interface_v1", "interface_v2"}
_OPTIONS = {"region", "flush_mode", "local_dir", "node_id", "lease_ms", "lock_timeout_ms", "tenant"}


def page_key(key: str) -> bytes:
    """The cxlkv key of SGLang page key `key` (a hex page hash): the hash's
    first 16 bytes, its bytes 8-15 then 0-7, so that the key's last 8 bytes
    are the hash's first 8 — what SGLang puts in its own KV events
    (`hash_str_to_int64`), and what an event publisher with `hash="int64"`
    sends for the page. A key that is not hex, as the legacy calls may pass,
    is hashed first."""
    try:
        raw = bytes.fromhex(key)
    except ValueError:
        raw = b""
    if len(raw) < 8:
        raw = hashlib.blake2b(key.encode(), digest_size=16).digest()
    if len(raw) >= 16:
        return raw[8:16] + raw[:8]
    return block_key(raw)


def _view(ptr: int, size: int) -> memoryview:
    """`size` bytes at address `ptr` of the host pool, without a copy."""
    return memoryview((ctypes.c_char * size).from_address(ptr)).cast("B")


class CxlkvStorage(HiCacheStorage):
    """SGLang HiCache storage in a cxlkv region (see the module docs)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict[str, Any]] = None) -> None:
        extra = dict(storage_config.extra_config or {})
        unknown = set(extra) - _SGLANG_KEYS - _OPTIONS
        if unknown:
            raise ValueError(f"cxlkv storage: unknown extra-config keys {sorted(unknown)} (known: {sorted(_OPTIONS)})")
        self.config = storage_config
        self.is_writer: bool = bool(storage_config.is_storage_writer)
        self._node = EngineNode(
            "cxlkv storage",
            extra.get("region"),
            flush_mode=str(extra.get("flush_mode", "auto")),
            local_dir=extra.get("local_dir"),
            node_id=extra.get("node_id"),
            lease_ms=int(extra.get("lease_ms", 2000)),
            lock_timeout_ms=int(extra.get("lock_timeout_ms", 60000)),
        )
        self._tenant = check_tenant("cxlkv storage", self._node, extra.get("tenant"))
        self._ns: Optional[Namespace] = None
        self._pool_ns: dict[str, Namespace] = {}
        self._ns_legacy = self._namespace(layout="tensor", dtype="bytes", segments=(), pool="legacy")
        self.stats = {"stored_pages": 0, "loaded_pages": 0, "missed_pages": 0}
        # Blocks this node evicted before this backend used it: evicted_pages
        # counts from here (every eviction its stores or clears made room by).
        self._evictions_at_start = int(self._node.stats()["node_evictions"])
        logger.info("cxlkv storage: node %d of region %s (writer: %s)", self._node.id, extra["region"], self.is_writer)

    # -- namespaces -------------------------------------------------------

    def _namespace(self, layout: str, dtype: str, segments: tuple[int, ...], page_size: int = 0, pool: str = "kv") -> Namespace:
        c = self.config
        # MLA pages are the same on every TP rank (shared); Mamba states are
        # TP-sharded even then (as SGLang's own file backend keys them).
        shared = c.is_mla_model and pool != PoolName.MAMBA.value
        return EngineNamespace(
            engine="sglang",
            model=str(c.model_name or ""),
            dtype=dtype,
            kv_layout=layout,
            block_tokens=page_size,
            tp_rank=0 if shared else c.tp_rank,
            tp_size=1 if shared else c.tp_size,
            pp_rank=c.pp_rank if c.pp_size > 1 else 0,
            extra={
                "mla": c.is_mla_model,
                "pool": pool,
                "pp_size": c.pp_size,
                "attn_cp": [c.attn_cp_rank, c.attn_cp_size] if c.attn_cp_size > 1 else None,
                "dcp": [c.dcp_rank, c.dcp_size] if c.dcp_size > 1 else None,
                "segments": list(segments),
            },
            tenant=self._tenant,
        ).namespace

    def _pool_ns_of(self, name: str) -> Namespace:
        if name == PoolName.KV.value:
            return self.namespace
        ns = self._pool_ns.get(name)
        if ns is None:
            ns = self._pool_ns[name] = self._pool_namespace(self._pool(name), name)
        return ns

    def _pool(self, name: str) -> Any:
        pools = getattr(self, "registered_pools", {})
        if name in pools:
            return pools[name]
        if name == PoolName.KV.value and getattr(self, "mem_pool_host", None) is not None:
            return self.mem_pool_host
        raise ValueError(f"cxlkv storage: no host pool {name!r} registered")

    def _pool_namespace(self, pool: Any, name: str) -> Namespace:
        page_size = int(getattr(pool, "page_size", 1) or 1)
        meta = pool.get_page_buffer_meta(torch.arange(page_size))
        if meta is not None:
            segments = tuple(int(x) for x in meta[1])
        else:
            flat = pool.get_data_page(0, flat=True)
            segments = (int(flat.numel() * flat.element_size()),)
        return self._namespace(
            layout=str(getattr(pool, "layout", "")),
            dtype=str(getattr(pool, "dtype", "")),
            segments=segments,
            page_size=page_size,
            pool=name,
        )

    @property
    def namespace(self) -> Namespace:
        """The namespace of this rank's KV pages (known once the host pool
        is registered)."""
        if self._ns is None:
            pool = getattr(self, "mem_pool_host", None)
            if pool is None:
                raise RuntimeError("cxlkv storage: no host pool registered yet")
            self._ns = self._pool_namespace(pool, PoolName.KV.value)
        return self._ns

    def _writes(self, pool: str) -> bool:
        """Whether this rank stores pages of `pool` (MLA: only the writer
        rank stores the shared pages)."""
        return self.is_writer or (bool(self.config.is_mla_model) and pool == PoolName.MAMBA.value)

    # -- zero-copy v1 ----------------------------------------------------

    def _pages(self, keys: List[str], host_indices: torch.Tensor, pool: Any = None) -> list[tuple[bytes, Any]]:
        pool = self.mem_pool_host if pool is None else pool
        meta = pool.get_page_buffer_meta(host_indices)
        if meta is None:
            # A pool without page pointers: its pages as flat tensors (read
            # and written in place).
            page_size = int(getattr(pool, "page_size", 1) or 1)
            return [
                (page_key(k), [self._bytes_of(pool.get_data_page(int(host_indices[i * page_size]), flat=True))])
                for i, k in enumerate(keys)
            ]
        ptrs, sizes = meta
        if not keys or len(ptrs) % len(keys):
            raise ValueError(f"cxlkv storage: {len(ptrs)} buffers for {len(keys)} pages")
        per = len(ptrs) // len(keys)
        return [
            (page_key(k), [_view(int(ptrs[i * per + j]), int(sizes[i * per + j])) for j in range(per)])
            for i, k in enumerate(keys)
        ]

    def _put(self, ns: Namespace, items: list[tuple[bytes, Any]]) -> list[bool]:
        ok = put_stored(self._node, ns, items)
        self.stats["stored_pages"] += sum(ok)
        return ok

    def batch_set_v1(
        self, keys: List[str], host_indices: torch.Tensor, extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> List[bool]:
        if not keys:
            return []
        if not self._writes(PoolName.KV.value):
            # MLA: one writer rank stores the pages every rank shares.
            return [True] * len(keys)
        return self._put(self.namespace, self._pages(keys, host_indices))

    def batch_get_v1(
        self, keys: List[str], host_indices: torch.Tensor, extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> List[bool]:
        if not keys:
            return []
        items = self._pages(keys, host_indices)
        ok = [
            r == Result.OK and n == sum(len(p) for p in parts)
            for (r, n), (_, parts) in zip(self._node.get(self.namespace, items), items)
        ]
        self.stats["loaded_pages"] += sum(ok)
        self.stats["missed_pages"] += len(ok) - sum(ok)
        return ok

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        if not keys:
            return 0
        return int(self._node.lookup(self.namespace, [page_key(k) for k in keys]))

    # -- v2: hybrid pools -------------------------------------------------

    def batch_exists_v2(
        self,
        keys: List[str],
        pool_transfers: Optional[List[PoolTransfer]] = None,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> PoolTransferResult:
        """The usable prefix of `keys`: KV pages present from the start, cut
        to what every extra pool's hit policy allows (one presence call per
        pool)."""
        if not keys:
            return PoolTransferResult(0, {}, [])
        ck = [page_key(k) for k in keys]
        kv_pages, _ = self._node.presence(self.namespace, ck)
        hit_count: dict[str, int] = {PoolName.KV.value: kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        for t in pool_transfers or []:
            if not restorable:
                break
            name = str(t.name)
            _, here = self._node.presence(self._pool_ns_of(name), ck[:kv_pages])
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                boundary = next((i for i in range(kv_pages) if not here[i]), kv_pages)
                allowed = set(range(1, boundary + 1))
            elif t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                trailing = max(1, len(t.keys) if t.keys else 1)
                allowed = {n for n in range(1, kv_pages + 1) if all(here[max(0, n - trailing) : n])}
                boundary = max(allowed, default=0)
            else:
                raise ValueError(f"cxlkv storage: unsupported pool hit policy {t.hit_policy}")
            if boundary:
                hit_count[name] = boundary
            restorable = [p for p in restorable if p in allowed]
        return PoolTransferResult(restorable[-1] if restorable else 0, hit_count, restorable)

    def _io_v2(self, transfers: List[PoolTransfer], store: bool) -> dict[str, List[bool]]:
        out: dict[str, List[bool]] = {}
        for t in transfers:
            name = str(t.name)
            keys = list(t.keys or [])
            pool = self._pool(name)
            page_size = int(getattr(pool, "page_size", 1) or 1)
            if not keys:
                out[name] = []
            elif t.host_indices is None or t.host_indices.numel() != len(keys) * page_size:
                logger.error("cxlkv storage: %s: %d keys but host indices for other pages", name, len(keys))
                out[name] = [False] * len(keys)
            elif store:
                if not self._writes(name):
                    out[name] = [True] * len(keys)
                else:
                    out[name] = self._put(self._pool_ns_of(name), self._pages(keys, t.host_indices, pool))
            else:
                items = self._pages(keys, t.host_indices, pool)
                got = self._node.get(self._pool_ns_of(name), items)
                out[name] = [r == Result.OK and n == sum(len(p) for p in parts) for (r, n), (_, parts) in zip(got, items)]
        return out

    def batch_get_v2(
        self, transfers: List[PoolTransfer], extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> dict[str, List[bool]]:
        """Reads each pool's pages into its host pool (one batch call per
        pool)."""
        return self._io_v2(transfers, store=False)

    def batch_set_v2(
        self, transfers: List[PoolTransfer], extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> dict[str, List[bool]]:
        """Writes each pool's pages from its host pool (one batch call per
        pool)."""
        return self._io_v2(transfers, store=True)

    # -- legacy calls (tensors) ------------------------------------------

    @staticmethod
    def _bytes_of(t: torch.Tensor) -> memoryview:
        return memoryview(t.contiguous().view(torch.uint8).numpy())

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None) -> torch.Tensor | None:
        if target_location is None:
            return None
        out = target_location if target_location.is_contiguous() else target_location.contiguous()
        [(r, n)] = self._node.get(self._ns_legacy, [(page_key(key), self._bytes_of(out))])
        if r != Result.OK or n != out.numel() * out.element_size():
            return None
        if out is not target_location:
            target_location.copy_(out)
        return target_location

    def batch_get(
        self, keys: List[str], target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None
    ) -> List[torch.Tensor | None]:
        return [self.get(k, t) for k, t in zip(keys, target_locations or [None] * len(keys))]

    def set(
        self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None
    ) -> bool:
        if value is None:
            return False
        if not self.is_writer:
            return True
        return self._put(self._ns_legacy, [(page_key(key), self._bytes_of(value))])[0]

    def batch_set(
        self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None
    ) -> bool:
        if values is None:
            return False
        if not self.is_writer:
            return True
        return all(self._put(self._ns_legacy, [(page_key(k), self._bytes_of(v)) for k, v in zip(keys, values)]))

    def exists(self, key: str) -> bool:
        return bool(self._node.exists(self._ns_legacy, page_key(key))) or (
            self._ns is not None and bool(self._node.exists(self._ns, page_key(key)))
        )

    def clear(self) -> None:
        """Removes this backend's pages that nothing pins: its KV pages, its
        extra pools' pages and its legacy tensor pages (this model, layout,
        rank and page size). Other engines' blocks in the region stay."""
        mine = [self._ns_legacy, *self._pool_ns.values()]
        if self._ns is not None:
            mine.append(self._ns)
        self._node.clear_namespaces(mine)

    def get_stats(self) -> dict[str, int]:
        """This backend's page counts and the region's occupancy."""
        s = self._node.stats()
        return {
            **self.stats,
            "evicted_pages": int(s["node_evictions"]) - self._evictions_at_start,
            "region_live_blocks": int(s["live_blocks"]),
            "region_live_bytes": int(s["live_bytes"]),
            "region_capacity_bytes": int(s["capacity_bytes"]),
        }

    def close(self) -> None:
        """Detaches from the region."""
        self._node.detach()
