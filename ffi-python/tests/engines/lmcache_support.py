"""What LMCache drives an L2 connector with, using LMCache's own classes: the
`native_plugin` config parsed from its JSON, the adapter its factory makes
(`NativeConnectorL2Adapter` over the connector), object keys and memory
objects; and waits on the adapter's eventfds as LMCache's storage manager
does."""

from __future__ import annotations

import select
import time
from typing import Any

import torch
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface
from lmcache.v1.distributed.l2_adapters.config import get_l2_adapter_config_class
from lmcache.v1.distributed.l2_adapters.factory import create_l2_adapter_from_registry
from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj
from lmcache.v1.platform.event_notifier import consume_fd

WATCHDOG_S = 60.0


def make_adapter(params: dict[str, Any]) -> L2AdapterInterface:
    config = get_l2_adapter_config_class("native_plugin").from_dict(
        {"type": "native_plugin", "module_path": "cxlkv.lmcache", "class_name": "CxlkvConnector", "adapter_params": params}
    )
    return create_l2_adapter_from_registry(config)


def key(i: int, model: str = "cxlkv/test-model", rank: int = 0, salt: str = "") -> ObjectKey:
    return ObjectKey(chunk_hash=i.to_bytes(4, "little") * 8, model_name=model, kv_rank=rank, cache_salt=salt)


def obj(data: bytes) -> TensorMemoryObj:
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    meta = MemoryObjMetadata(shape=torch.Size([len(data)]), dtype=torch.uint8, address=0, phy_size=len(data), ref_count=1)
    return TensorMemoryObj(raw_data=raw, metadata=meta, parent_allocator=None)


def wait(fd: int, take: Any) -> Any:
    """Waits on `fd` until `take()` returns a result (not None), consuming
    each signal as LMCache's storage manager does."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    deadline = time.monotonic() + WATCHDOG_S
    while time.monotonic() < deadline:
        got = take()
        if got is not None:
            return got
        if p.poll(50):
            consume_fd(fd)
    raise TimeoutError("no completion")


def store(adapter: L2AdapterInterface, keys: list[ObjectKey], objs: list[TensorMemoryObj]) -> Any:
    task = adapter.submit_store_task(keys, objs)
    return wait(adapter.get_store_event_fd(), lambda: adapter.pop_completed_store_tasks().get(task))


def lookup(adapter: L2AdapterInterface, keys: list[ObjectKey]) -> list[bool]:
    task = adapter.submit_lookup_and_lock_task(keys, {})
    bitmap = wait(adapter.get_lookup_and_lock_event_fd(), lambda: adapter.query_lookup_and_lock_result(task))
    adapter.submit_unlock([k for i, k in enumerate(keys) if bitmap.test(i)])
    return [bitmap.test(i) for i in range(len(keys))]


def load(adapter: L2AdapterInterface, keys: list[ObjectKey], objs: list[TensorMemoryObj]) -> list[bool]:
    task = adapter.submit_load_task(keys, objs)
    bitmap = wait(adapter.get_load_event_fd(), lambda: adapter.query_load_result(task))
    return [bitmap.test(i) for i in range(len(keys))]
