"""What SGLang hands a HiCache storage backend, with SGLang's own classes:
its `HiCacheStorageConfig`, the backend made by its `StorageBackendFactory`
from the extra-config JSON, and a CPU host pool with `get_page_buffer_meta`
(a small one, as SGLang's CPU storage tests build one: the real host pools
need a device pool to mirror)."""

from __future__ import annotations

import json
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory


class HostPool:
    """A host KV pool in SGLang's MHA layer-first layout: buffer
    [K/V, layer, token, head, dim]; a page's segments are its K and V rows of
    each layer, as `MHATokenToKVPoolHost.get_page_buffer_meta` returns them."""

    def __init__(self, n_pages: int, page_size: int = 16, layer_num: int = 4, head_num: int = 2, head_dim: int = 8) -> None:
        self.page_size = page_size
        self.layer_num = layer_num
        self.head_num = head_num
        self.head_dim = head_dim
        self.dtype = torch.float16
        self.layout = "layer_first"
        self.size = n_pages * page_size
        self.kv_buffer = torch.zeros((2, layer_num, self.size, head_num, head_dim), dtype=self.dtype)

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        assert len(indices) % self.page_size == 0
        item = self.dtype.itemsize
        base = self.kv_buffer.data_ptr()
        v_offset = self.layer_num * self.size * self.head_num * self.head_dim * item
        ptrs = []
        idx = indices.tolist()
        for i in range(0, len(idx), self.page_size):
            for layer in range(self.layer_num):
                k = base + idx[i] * self.head_num * self.head_dim * item + layer * self.size * self.head_num * self.head_dim * item
                ptrs += [k, k + v_offset]
        size = item * self.page_size * self.head_num * self.head_dim
        return ptrs, [size] * len(ptrs)

    def page_indices(self, pages: list[int]) -> torch.Tensor:
        """The token indices of host pages `pages`, as the controller passes
        them."""
        return torch.cat([torch.arange(p * self.page_size, (p + 1) * self.page_size) for p in pages])

    def fill(self, page: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        sl = slice(page * self.page_size, (page + 1) * self.page_size)
        self.kv_buffer[:, :, sl] = torch.randn(self.kv_buffer[:, :, sl].shape, generator=g).to(self.dtype)

    def page(self, page: int) -> torch.Tensor:
        return self.kv_buffer[:, :, page * self.page_size : (page + 1) * self.page_size].clone()


def storage_config(extra: dict[str, Any], *, tp_rank: int = 0, tp_size: int = 1, mla: bool = False, model: str = "cxlkv/test") -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=False,
        is_page_first_layout=False,
        model_name=model,
        # SGLang parses --hicache-storage-backend-extra-config as JSON.
        extra_config=json.loads(json.dumps(extra)),
    )


def make_backend(extra: dict[str, Any], pool: HostPool, **kw: Any) -> HiCacheStorage:
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(extra, **kw), pool)
    backend.register_mem_pool_host(pool)
    return backend


def page_keys(n: int, start: int = 0) -> list[str]:
    """SGLang page keys: 64-hex page hashes."""
    return [(i + start).to_bytes(4, "little").hex() * 8 for i in range(n)]
