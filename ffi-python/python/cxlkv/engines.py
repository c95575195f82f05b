"""Keys and namespaces for the engine adapters (`cxlkv.vllm`, ...): one
definition of how an engine's block hash becomes a cxlkv key and of what
goes into the namespace, shared by every adapter.

- A block's key is the last 16 bytes of the engine's hash of the block
  (vLLM's block hash, SGLang's page key, LMCache's chunk hash), zero-padded
  when the hash is shorter.
- Everything that makes two blocks with equal hashes not interchangeable
  goes into the namespace: the model, the KV layout and dtype, tokens per
  block, tensor- and pipeline-parallel rank and size, and whatever else the
  engine says describes its blocks (KV cache groups, a salt, a LoRA). All
  of it, as canonical JSON, is the namespace's salt: the region keeps the
  128-bit digest of every registered namespace, so two engine namespaces
  that differ in any field never share a block.
- An adapter configured with a `tenant` (the name of a tenant of the
  region, made with `cxlkv tenant add`) registers its namespaces in that
  tenant: its blocks count to the tenant's quota and share, and the same
  model in another tenant is another namespace. Without one, the default
  tenant.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from . import Namespace
from ._cxlkv import CxlkvError, Node, Region, Result, RevokedError

logger = logging.getLogger(__name__)

#: Results of a store that leave the block in the region.
STORED = (Result.OK, Result.EXISTS)


def attach(
    who: str,
    region: Optional[str],
    *,
    flush_mode: str = "auto",
    local_dir: Optional[str] = None,
    node_id: Optional[int] = None,
    lease_ms: int = 2000,
    lock_timeout_ms: int = 60000,
) -> tuple[Region, Node]:
    """An adapter's region and node; a missing, unreadable or non-cxlkv
    region is a clear error at start-up."""
    if not region:
        raise ValueError(
            f"{who}: 'region' is required: the path of a formatted cxlkv region "
            "(a file, /dev/shm/NAME or /dev/daxX.Y; make one with `cxlkv format`)"
        )
    try:
        r = Region.open(str(region))
        return r, r.attach(
            node_id=node_id,
            flush_mode=flush_mode,
            lease_ms=lease_ms,
            lock_timeout_ms=lock_timeout_ms,
            local_dir=local_dir,
        )
    except (CxlkvError, OSError) as e:
        raise RuntimeError(f"{who}: cannot use region {region!r}: {e}") from e


class EngineNode:
    """An adapter's node, attached again when it was revoked.

    A node is revoked when the rack declared it dead: its process stalled
    past the lease (a long pause, an overloaded host, a frozen container),
    and recovery freed its slot. Every call of a revoked node fails with
    `RevokedError`. An engine must not see that: each call made through
    this object that finds its node revoked attaches a fresh node (same
    region and options) and runs again there once, so the engine's request
    is answered (a block recovery dropped, or another node evicted
    meanwhile, is a miss). Attributes other than calls read the current
    node's (`id`); `reattached` counts the fresh nodes."""

    def __init__(self, who: str, region: Optional[str], **options: Any) -> None:
        self._who, self._path, self._options = who, region, options
        self.region, self._node = attach(who, region, **options)
        self.reattached = 0
        self._lock = threading.Lock()

    @property
    def node(self) -> Node:
        """The node attached now."""
        return self._node

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            # Our own attributes, missing only while __init__ failed: never
            # looked up on the node (that would recurse).
            raise AttributeError(name)
        attr = getattr(self._node, name)
        if not callable(attr) or name in ("detach", "close"):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            node = self._node
            try:
                return getattr(node, name)(*args, **kwargs)
            except RevokedError:
                self._reattach(node)
                return getattr(self._node, name)(*args, **kwargs)

        return call

    def _reattach(self, revoked: Node) -> None:
        with self._lock:
            if self._node is not revoked:
                return  # another thread attached a fresh one already
            logger.warning(
                "%s: node %d was declared dead (a stall past its lease?) and revoked: attaching again",
                self._who,
                revoked.id,
            )
            try:
                revoked.detach()  # refused (revoked): frees nothing of anyone's
            except CxlkvError:
                pass
            old = self.region
            self.region, self._node = attach(self._who, self._path, **self._options)
            self.reattached += 1
            old.close()

    def detach(self) -> None:
        """Detaches the current node and closes the region."""
        try:
            self._node.detach()
        finally:
            self.region.close()


def put_stored(node: Union[Node, EngineNode], ns: Union[int, Namespace], items: Sequence[tuple[bytes, Any]]) -> list[bool]:
    """Stores `items` (key, buffer or buffers) in one batch call and says
    whether each is stored (stored already counts). A full region makes room
    itself (each reserve evicts least recently used blocks until the block
    fits or only pinned blocks are left), so what is not stored here could
    not be: a miss later, never an error of the engine's request."""
    return [r in STORED for r in node.put(ns, items)]


def block_key(engine_hash: bytes) -> bytes:
    """The cxlkv key of a block whose engine hash is `engine_hash`: the
    hash's last 16 bytes (a shorter hash is padded in front with zeros).

    The key's last 8 bytes are then the hash's, and those, read big-endian,
    are the integer vLLM puts in its KV events for the block (its default,
    `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`): the region's event publisher
    (`cxlkv events --zmq`, `Node.publish_events`) sends that same integer,
    so a router matches the region's blocks with the engines' own."""
    if not engine_hash:
        raise ValueError("an engine block hash is not empty")
    return bytes(engine_hash[-16:]).rjust(16, b"\0")


@dataclass(frozen=True)
class EngineNamespace:
    """What makes an engine's blocks interchangeable, and its cxlkv id."""

    engine: str
    model: str
    dtype: str
    kv_layout: str = ""
    block_tokens: int = 0
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: The region tenant its namespace belongs to (None: the default one).
    tenant: Optional[str] = None

    def describe(self) -> str:
        """Every field, as canonical JSON."""
        return json.dumps(
            {
                "engine": self.engine,
                "model": self.model,
                "dtype": self.dtype,
                "kv_layout": self.kv_layout,
                "block_tokens": self.block_tokens,
                "tp_rank": self.tp_rank,
                "tp_size": self.tp_size,
                "pp_rank": self.pp_rank,
                "extra": dict(self.extra),
            },
            sort_keys=True,
            separators=(",", ":"),
            default=str,
        )

    @property
    def namespace(self) -> Namespace:
        """The cxlkv namespace: the model, ranks and tokens per block as
        fields, and every field (these too, strings exactly) as the salt.
        Pass it to any call; the node registers it in its region."""
        return Namespace(
            self.model,
            tp_rank=self.tp_rank,
            tp_size=self.tp_size,
            pp_rank=self.pp_rank,
            block_tokens=self.block_tokens,
            salt=self.describe(),
            tenant=self.tenant,
        )


def check_tenant(who: str, node: Union[Node, EngineNode], tenant: Optional[str]) -> Optional[str]:
    """`tenant` (an adapter's configured tenant), once the region is known
    to have it: a missing one is a clear error at start-up, not a failure
    of every store later."""
    if tenant is None:
        return None
    if not isinstance(tenant, str) or not tenant:
        raise ValueError(f"{who}: 'tenant' is the name of a tenant of the region, got {tenant!r}")
    names = [t["name"] for t in node.tenants()]
    if tenant not in names:
        raise RuntimeError(
            f"{who}: the region has no tenant {tenant!r} (it has {names}); "
            f"add it with `cxlkv tenant add REGION {tenant} [--quota SIZE] [--share SIZE]`"
        )
    return tenant
