"""Type stubs of the native module `cxlkv._cxlkv` (checked by mypy.stubtest)."""

import enum
import os
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Optional, Union, final

from typing_extensions import Buffer, Self

_Key = Union[bytes, int]
_Ns = Union[int, Any]
_Path = Union[str, os.PathLike[str]]

__version__: str
__all__ = [
    "BusyError",
    "CapacityError",
    "ChangeCursor",
    "CudaError",
    "CxlkvError",
    "EventPublisher",
    "ExistsError",
    "InvalidArgumentError",
    "Message",
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

class Result(enum.IntEnum):
    """The result codes of cxlkv, as in the C API (OK is 1000)."""

    OK = 1000
    INVALID_ARGUMENT = 1001
    NOT_INITIALIZED = 1002
    BAD_MAGIC = 1003
    WRONG_VERSION = 1004
    WRONG_LAYOUT = 1005
    TOO_SMALL = 1006
    CORRUPT_HEADER = 1007
    CORRUPT = 1008
    OUT_OF_BOUNDS = 1009
    OUT_OF_SPACE = 1010
    TABLE_FULL = 1011
    EXISTS = 1012
    NOT_FOUND = 1013
    STALE_HANDLE = 1014
    JOURNAL_FULL = 1015
    NO_FREE_NODE = 1016
    NODE_BUSY = 1017
    BAD_NODE = 1018
    TIMEOUT = 1019
    REVOKED = 1020
    ROOTS_FULL = 1021
    BUSY = 1022
    CHANGED = 1023
    TOO_LARGE = 1024
    RECOVERING = 1025
    INBOX_FULL = 1026
    NOT_PINNED = 1027
    IO = 1100
    UNSUPPORTED = 1101
    CUDA_UNAVAILABLE = 1102
    CUDA = 1103
    NULL_PARAMETER = 1200
    INVALID_HANDLE = 1201
    PANIC = 1202
    INVALID_STRING = 1203
    INTERNAL = 1204

class CxlkvError(Exception):
    code: int

class InvalidArgumentError(CxlkvError): ...
class RegionError(CxlkvError): ...
class CapacityError(CxlkvError): ...
class ExistsError(CxlkvError): ...
class NotFoundError(CxlkvError): ...
class StaleHandleError(CxlkvError): ...
class BusyError(CxlkvError): ...
class TimedOutError(CxlkvError): ...
class RevokedError(CxlkvError): ...
class PlatformError(CxlkvError): ...
class CudaError(CxlkvError): ...

def chain_keys(tokens: Sequence[int], block_tokens: int, parent: Optional[_Key] = None) -> list[bytes]: ...
def namespace_digest(
    model: Union[str, bytes],
    kv_layout: int = 0,
    dtype: int = 0,
    tp_rank: int = 0,
    tp_size: int = 0,
    pp_rank: int = 0,
    block_tokens: int = 0,
    extra: int = 0,
    salt: Union[str, bytes, None] = None,
) -> bytes: ...
@final
class Region:
    @staticmethod
    def create(path: _Path, size: int, overwrite: bool = False) -> Region: ...
    @staticmethod
    def open(path: _Path) -> Region: ...
    @staticmethod
    def memfd(size: int, hugetlb: bool = False) -> Region: ...
    def format(
        self,
        *,
        flush_mode: str = "auto",
        max_nodes: Optional[int] = None,
        n_stripes: Optional[int] = None,
        entries_per_stripe: Optional[int] = None,
        n_roots: Optional[int] = None,
        pin_slots: Optional[int] = None,
        chunk_shift: Optional[int] = None,
        inbox_slots: Optional[int] = None,
        app_locks: Optional[int] = None,
        tier_slots: Optional[int] = None,
        tier_records: Optional[int] = None,
        change_records: Optional[int] = None,
    ) -> None: ...
    @property
    def size(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def attach(
        self,
        *,
        node_id: Optional[int] = None,
        flush_mode: str = "auto",
        lease_ms: int = 2000,
        lock_timeout_ms: int = 60000,
        settle_ms: int = 50,
        auto_recover: bool = True,
        local_dir: Optional[_Path] = None,
    ) -> Node: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        *_exc: Union[type[BaseException], BaseException, TracebackType, None],
    ) -> bool: ...

@final
class Tier:
    def stats(self) -> dict[str, Any]: ...
    def spill_all(self) -> int: ...
    def stop(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        *_exc: Union[type[BaseException], BaseException, TracebackType, None],
    ) -> bool: ...

@final
class EventPublisher:
    @property
    def endpoint(self) -> str: ...
    @property
    def replay_endpoint(self) -> Optional[str]: ...
    def stats(self) -> dict[str, Any]: ...
    def stop(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        *_exc: Union[type[BaseException], BaseException, TracebackType, None],
    ) -> bool: ...

@final
class ChangeCursor:
    def poll(
        self, namespaces: Optional[Sequence[_Ns]] = None
    ) -> tuple[list[tuple[bool, int, bytes, int, int, int]], list[int]]: ...

@final
class Node:
    def change_cursor(self) -> ChangeCursor: ...
    def publish_events(
        self,
        endpoint: str = ...,
        *,
        replay: Optional[str] = None,
        topic: str = ...,
        medium: str = ...,
        hash: str = ...,
        namespaces: Optional[Sequence[_Ns]] = None,
        dp_rank: Optional[int] = None,
        buffer: int = ...,
    ) -> EventPublisher: ...
    def start_tier(
        self,
        dirs: Sequence[_Path],
        *,
        slot_bytes: int = ...,
        capacity: int = ...,
        high_water: float = ...,
    ) -> Tier: ...
    @property
    def id(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def namespace(self, ns: _Ns) -> int: ...
    def lookup(self, ns: _Ns, keys: Iterable[_Key]) -> int: ...
    def presence(self, ns: _Ns, keys: Iterable[_Key]) -> tuple[int, list[bool]]: ...
    def exists(self, ns: _Ns, key: _Key) -> bool: ...
    def acquire(self, ns: _Ns, keys: Iterable[_Key]) -> Pinned: ...
    def reserve(self, ns: _Ns, keys: Iterable[_Key], sizes: Union[int, Sequence[int]], tokens: int = 0) -> Reservation: ...
    def put_routes(
        self,
        ns: _Ns,
        items: Iterable[tuple[_Key, Sequence[int], Optional[_Key]]],
        block_size: int,
        *,
        lora_id: Optional[int] = None,
    ) -> list[Result]: ...
    def route(self, ns: _Ns, key: _Key) -> Optional[tuple[list[int], Optional[bytes], int, Optional[int]]]: ...
    def put(
        self, ns: _Ns, items: Iterable[tuple[_Key, Union[Buffer, Sequence[Buffer]]]], tokens: int = 0
    ) -> list[Result]: ...
    def get(self, ns: _Ns, items: Iterable[tuple[_Key, Union[Buffer, Sequence[Buffer]]]]) -> list[tuple[Result, int]]: ...
    def remove(self, ns: _Ns, keys: Iterable[_Key]) -> list[bool]: ...
    def clear_namespaces(self, namespaces: Iterable[_Ns]) -> tuple[int, int]: ...
    def evict(self, nbytes: int) -> tuple[int, int]: ...
    def stats(self) -> dict[str, int]: ...
    def recover(self) -> dict[str, int]: ...
    def check(self) -> list[str]: ...
    def send(
        self, to: int, kind: int, keys: Optional[Iterable[_Key]] = None, *, ns: Optional[_Ns] = None, status: int = 0, stamp: int = 0
    ) -> None: ...
    def try_recv(self) -> Optional[Message]: ...
    def recv(self, timeout_ms: int) -> Message: ...
    def call(
        self,
        to: int,
        kind: int,
        keys: Optional[Iterable[_Key]] = None,
        *,
        ns: Optional[_Ns] = None,
        status: int = 0,
        stamp: int = 0,
        timeout_ms: int = 1000,
    ) -> Message: ...
    def reply(self, request: Message, status: int, keys: Optional[Iterable[_Key]] = None) -> None: ...
    def cuda_register(self, device: int = 0) -> None: ...
    def cuda_stats(self) -> dict[str, Union[int, str]]: ...
    def cuda_gather(self, segments: Sequence[tuple[int, int, int]], stream: int = 0) -> None: ...
    def cuda_scatter(self, segments: Sequence[tuple[int, int, int]], stream: int = 0) -> None: ...
    def cuda_synchronize(self, stream: int = 0) -> None: ...
    def detach(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        *_exc: Union[type[BaseException], BaseException, TracebackType, None],
    ) -> bool: ...

@final
class Message:
    @property
    def kind(self) -> int: ...
    @property
    def ns(self) -> int: ...
    @property
    def status(self) -> int: ...
    @property
    def request_id(self) -> int: ...
    @property
    def stamp(self) -> int: ...
    @property
    def sender(self) -> int: ...
    @property
    def keys(self) -> list[bytes]: ...

@final
class Payload:
    def __len__(self) -> int: ...

@final
class Pinned:
    def __len__(self) -> int: ...
    def __getitem__(self, key: int, /) -> Optional[memoryview]: ...
    @property
    def found(self) -> int: ...
    @property
    def keys(self) -> list[Optional[bytes]]: ...
    @property
    def released(self) -> bool: ...
    def release(self) -> None: ...
    @property
    def offsets(self) -> list[Optional[int]]: ...
    def to_device(self, i: int, device_ptr: int, stream: int = 0) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        *_exc: Union[type[BaseException], BaseException, TracebackType, None],
    ) -> bool: ...

@final
class Reservation:
    def __len__(self) -> int: ...
    def __getitem__(self, key: int, /) -> Optional[memoryview]: ...
    @property
    def keys(self) -> list[Optional[bytes]]: ...
    @property
    def done(self) -> bool: ...
    def publish(self) -> list[Result]: ...
    def abort(self) -> None: ...
    @property
    def offsets(self) -> list[Optional[int]]: ...
    def from_device(self, i: int, device_ptr: int, stream: int = 0) -> None: ...
    def publish_after(self, stream: int = 0) -> list[Result]: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        *exc: Union[type[BaseException], BaseException, TracebackType, None],
    ) -> bool: ...
