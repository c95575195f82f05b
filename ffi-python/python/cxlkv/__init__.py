"""cxlkv: a KV-cache object store in shared (CXL) memory, for LLM serving.

Many processes on many hosts map one region and hand KV blocks from prefill
to decode, and reuse prompt prefixes, through it: no server, no copy on the
read path.

>>> import cxlkv
>>> with cxlkv.Region.memfd(64 << 20) as region:
...     region.format(chunk_shift=16)
...     with region.attach() as node:
...         ns = cxlkv.Namespace("llama-3-8b", block_tokens=16)
...         keys = cxlkv.chain_keys(range(32), 16)
...         node.put(ns, [(keys[0], b"K and V of block 0")])
...         with node.acquire(ns, keys) as pinned:
...             bytes(pinned[0])
[<Result.OK: 1000>]
b'K and V of block 0'

Errors are typed: one `CxlkvError` family per kind of failure, each with
`.code` (the C API's result code). Operating-system failures (a missing
region file, no permission) are Python's own `OSError` subclasses, as
`open()` raises them (`FileNotFoundError`, `PermissionError`, ...), with
`.code` set to `Result.IO`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional, Union

from ._cxlkv import (
    AppLock,
    BusyError,
    CapacityError,
    ChangeCursor,
    CudaError,
    CxlkvError,
    EventPublisher,
    ExistsError,
    InvalidArgumentError,
    Message,
    Node,
    NotFoundError,
    Payload,
    Pinned,
    PlatformError,
    Region,
    RegionError,
    Reservation,
    Result,
    RevokedError,
    StaleHandleError,
    Tier,
    TimedOutError,
    __version__,
    chain_keys,
    namespace_digest,
)

Key = Union[bytes, int]
"""A block key: 16 bytes (as `chain_keys` returns) or an int below 2**128."""


@dataclass(frozen=True)
class Namespace:
    """What tells KV caches apart, as fields: blocks of two namespaces never
    mix. Fill what the engine has. Pass a Namespace wherever a call takes a
    namespace: the node registers it in its region on first use
    (`Node.namespace` gives the id), so two namespaces that differ in any
    field, `salt` included, never share an id or a block."""

    model: Union[str, bytes]
    kv_layout: int = 0
    dtype: int = 0
    tp_rank: int = 0
    tp_size: int = 0
    pp_rank: int = 0
    block_tokens: int = 0
    extra: int = 0
    #: Anything else that must separate caches, of any length (an engine's
    #: description of its blocks, a salt, a LoRA name).
    salt: Union[str, bytes] = b""
    #: The tenant the namespace belongs to (None: the default tenant): its
    #: blocks count to that tenant's quota and share. Not part of the
    #: digest: the same fields in two tenants are two namespaces all the
    #: same (the region binds each to its tenant).
    tenant: Optional[str] = None

    @cached_property
    def digest(self) -> bytes:
        """The namespace's 128-bit identity, 16 bytes (`namespace_digest`)."""
        return namespace_digest(
            self.model,
            self.kv_layout,
            self.dtype,
            self.tp_rank,
            self.tp_size,
            self.pp_rank,
            self.block_tokens,
            self.extra,
            self.salt,
        )


__all__ = [
    "AppLock",
    "BusyError",
    "CapacityError",
    "CudaError",
    "CxlkvError",
    "ChangeCursor",
    "EventPublisher",
    "ExistsError",
    "InvalidArgumentError",
    "Key",
    "Message",
    "Namespace",
    "Node",
    "NotFoundError",
    "Payload",
    "Pinned",
    "PlatformError",
    "Region",
    "RegionError",
    "Reservation",
    "Result",
    "RevokedError",
    "StaleHandleError",
    "Tier",
    "TimedOutError",
    "__version__",
    "chain_keys",
    "namespace_digest",
]
