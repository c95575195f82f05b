"""cxlkv as a secondary tier of vLLM's tiered KV offloading.

vLLM's `TieringOffloadingSpec` keeps offloaded KV chunks in a CPU primary
tier and cascades them to secondary tiers it loads by `type` and
`module_path`. This tier keeps them in a cxlkv region, where every vLLM
instance of the rack that maps the same region finds them::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector",
      "kv_role": "kv_both",
      "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 8000000000,
        "secondary_tiers": [{"type": "CxlkvTier", "module_path": "cxlkv.vllm",
                             "region": "/dev/shm/kv"}]}}'

Options of the tier's entry: `region` (required: the path of a formatted
cxlkv region: a file, /dev/shm, or /dev/daxX.Y), `flush_mode` (default:
this machine's), `local_dir` (the host-local lock directory, default
/dev/shm), `node_id`, `lease_ms`, `lock_timeout_ms`, `n_threads` (copy
threads, default 4), `enable_kv_events` (report what the tier stored, and
every removal of a chunk of its namespaces by any node, read from the
region's change log, when vLLM's KV events are on), `locality`, `tenant`
(the region tenant whose quota and share this instance's chunks count to;
it must exist: `cxlkv tenant add REGION NAME`).

Requests with different `cache_salt`s never share a chunk: vLLM folds the
salt into the hash of a request's first block, and every later block's hash
chains from it, so their chunk keys differ. Instances of different models
(or LoRA adapters, which vLLM also folds into block hashes) are apart the
same way and, with a `tenant` each, count to their own quota.

A chunk's key is the last 16 bytes of its block hash; its namespace holds
what vLLM itself says makes chunks interchangeable (`FileMapper`'s fields:
model, dtype, tokens per hash, blocks per chunk, parallel layout, KV cache
groups, the canonical format) plus the attention backend's KV layout (NHD,
HND) when there is no canonical format, the chunk's size and KV cache
group. Lookups are batched per
scheduler step (vLLM's `AsyncLookupManager`, one cxlkv presence call per
group); stores and loads run on the tier's threads, one cxlkv batch call per
job and group, never on the scheduler thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from . import ChangeCursor, CxlkvError, Namespace, Result
from .engines import EngineNamespace, EngineNode, block_key, check_tenant, put_stored

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

logger = logging.getLogger(__name__)

#: Bytes of a block hash the cxlkv key holds (its last 16).
_KEY_BYTES = 16


class _Lookups(AsyncLookupManager):
    """vLLM's per-step lookup batching, answered by one presence call per
    KV cache group."""

    def __init__(self, tier: CxlkvTier) -> None:
        super().__init__(tier_type=tier.tier_type)
        self._tier = tier

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return self._tier._present(keys)


class CxlkvTier(SecondaryTierManager):
    """A vLLM secondary tier in a cxlkv region (see the module docs)."""

    medium: ClassVar[Medium] = Medium.CPU

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        region: str | None = None,
        flush_mode: str = "auto",
        local_dir: str | None = None,
        node_id: int | None = None,
        lease_ms: int = 2000,
        lock_timeout_ms: int = 60000,
        n_threads: int = 4,
        enable_kv_events: bool = False,
        locality: str | None = None,
        backpressure_detector: BackpressureDetector | None = None,
        tenant: str | None = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        if n_threads < 1:
            raise ValueError(f"cxlkv tier {tier_type!r}: n_threads must be at least 1, got {n_threads}")
        self.locality = Locality(locality) if locality is not None else None
        self._node = EngineNode(
            f"cxlkv tier {tier_type!r}",
            region,
            flush_mode=flush_mode,
            local_dir=local_dir,
            node_id=node_id,
            lease_ms=lease_ms,
            lock_timeout_ms=lock_timeout_ms,
        )
        self._tenant = check_tenant(f"cxlkv tier {tier_type!r}", self._node, tenant)
        # The primary tier's chunks, as bytes: chunk c is [c*size, (c+1)*size).
        self._bytes = primary_kv_view.cast("B")
        # vLLM's own description of what makes chunks interchangeable, plus
        # this tier's chunk size and the chunk's group.
        self._fields = FileMapper.from_offloading_spec(
            root_dir="", offloading_spec=offloading_spec, blocks_per_file=offloading_spec.blocks_per_chunk
        ).get_run_config()
        self._kv_cache_layout = offloading_spec.config.kv_cache_layout
        self._namespaces: dict[int, Namespace] = {}
        self.events: list[OffloadingEvent] | None = None
        if enable_kv_events:
            if offloading_spec.kv_events_config.enable_kv_cache_events:
                self.events = []
            else:
                logger.warning("cxlkv tier %r: enable_kv_events is set but vLLM's KV events are off", tier_type)
        # Removal events come from the region's change log (any node's
        # eviction or removal of a chunk of this tier's namespaces). The
        # tier keeps only what the region does not know: the part of a block
        # hash longer than the key (vLLM's sha256 hashes are 32 bytes, keys
        # 16), for the chunks it stored and the region still holds.
        self._cursor: ChangeCursor | None = self._node.change_cursor() if self.events is not None else None
        self._hash_len: int | None = None
        self._prefixes: dict[tuple[int, bytes], bytes] = {}
        self._prefix_cap = int(self._node.stats()["capacity_bytes"]) // max(self.block_size_bytes, 1) + 1024
        self._done: list[JobResult] = []
        # Keys whose load failed (evicted since the lookup said HIT), for
        # the scheduler thread to mark as misses.
        self._missed: list[OffloadKey] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._in_flight = 0
        self._pool = ThreadPoolExecutor(max_workers=n_threads, thread_name_prefix=f"cxlkv_{tier_type}")
        self._lookups = _Lookups(self)
        logger.info(
            "cxlkv tier %r: node %d of region %s, chunks of %d bytes",
            tier_type,
            self._node.id,
            region,
            self.block_size_bytes,
        )

    # -- keys ------------------------------------------------------------

    def namespace(self, group: int) -> Namespace:
        """The cxlkv namespace of this instance's chunks of KV cache group
        `group`."""
        ns = self._namespaces.get(group)
        if ns is None:
            f = self._fields
            ns = EngineNamespace(
                engine="vllm",
                model=str(f.get("model_name", "")),
                dtype=str(f.get("dtype", "")),
                # The canonical format when vLLM writes one (the same on
                # every backend), else the attention backend's layout.
                kv_layout=str(f.get("canonical_format") or self._kv_cache_layout or ""),
                block_tokens=int(f.get("tokens_per_hash", 0)),
                tp_rank=0,
                tp_size=int(f.get("tp_size", 1)),
                extra={"fields": f, "group": group, "chunk_bytes": self.block_size_bytes},
                tenant=self._tenant,
            ).namespace
            self._namespaces[group] = ns
        return ns

    def _by_group(self, keys: Collection[OffloadKey]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for i, k in enumerate(keys):
            groups.setdefault(get_offload_group_idx(k), []).append(i)
        return groups

    def _present(self, keys: list[OffloadKey]) -> list[bool]:
        out = [False] * len(keys)
        for group, idx in self._by_group(keys).items():
            _, here = self._node.presence(self.namespace(group), [block_key(get_offload_block_hash(keys[i])) for i in idx])
            for i, h in zip(idx, here):
                out[i] = h
        return out

    def _remember(self, keys: Iterable[OffloadKey]) -> None:
        """Keeps what the region does not know of stored chunks: the hash
        bytes before the key's 16 (none when hashes are 16 bytes or fewer)."""
        if self.events is None:
            return
        with self._lock:
            for k in keys:
                h = get_offload_block_hash(k)
                self._hash_len = len(h)
                if len(h) > _KEY_BYTES:
                    self._prefixes[(get_offload_group_idx(k), block_key(h))] = h[:-_KEY_BYTES]
            # Never reached while removals are read (each stored chunk takes
            # a chunk's bytes of the region): a bound all the same.
            while len(self._prefixes) > self._prefix_cap:
                del self._prefixes[next(iter(self._prefixes))]

    def _removed_keys(self) -> list[OffloadKey]:
        """The chunks of this tier's namespaces removed since the last call,
        by any node, from the region's change log; after a gap in the log,
        the stored chunks the region no longer holds."""
        if self._cursor is None or self._hash_len is None:
            return []
        groups = dict(self._namespaces)
        ids = {self._node.namespace(ns): g for g, ns in groups.items()}
        try:
            changes, gaps = self._cursor.poll(list(groups.values()))
        except CxlkvError:
            # The node was attached again (or the region formatted anew):
            # read on from a fresh cursor, and check what is known.
            self._cursor = self._node.change_cursor()
            changes, gaps = [], [-1]
        removed: list[OffloadKey] = []
        with self._lock:
            for stored, ns, key16, *_ in changes:
                group = ids.get(ns)
                if stored or group is None:
                    continue
                k = self._offload_key(group, key16)
                if k is not None:
                    removed.append(k)
            if gaps and self._prefixes:
                known = list(self._prefixes.items())
            else:
                known = []
        if gaps and self._hash_len <= _KEY_BYTES:
            logger.warning("cxlkv tier %r: the region's change log ran ahead: removal events were lost", self.tier_type)
        if known:
            by_group: dict[int, list[bytes]] = {}
            for (g, key16), _ in known:
                by_group.setdefault(g, []).append(key16)
            for g, key16s in by_group.items():
                if g not in groups:
                    continue
                _, here = self._node.presence(groups[g], key16s)
                with self._lock:
                    for key16, h in zip(key16s, here):
                        k = None if h else self._offload_key(g, key16)
                        if k is not None:
                            removed.append(k)
        return removed

    def _offload_key(self, group: int, key16: bytes) -> OffloadKey | None:
        """The OffloadKey of a removed chunk (forgetting its hash prefix), or
        None when this tier cannot name it (a chunk it did not store, with
        hashes longer than keys). The caller holds the lock."""
        assert self._hash_len is not None
        if self._hash_len <= _KEY_BYTES:
            return make_offload_key(key16[_KEY_BYTES - self._hash_len :], group)
        prefix = self._prefixes.pop((group, key16), None)
        return None if prefix is None else make_offload_key(prefix + key16, group)

    # -- jobs ------------------------------------------------------------

    def _row(self, chunk_id: int) -> memoryview:
        start = int(chunk_id) * self.block_size_bytes
        return self._bytes[start : start + self.block_size_bytes]

    def _store(self, job: TransferJob) -> JobResult:
        keys = list(job.keys)
        ok: list[OffloadKey] = []
        for group, idx in self._by_group(keys).items():
            ns = self.namespace(group)
            items = [(block_key(get_offload_block_hash(keys[i])), self._row(job.chunk_ids[i])) for i in idx]
            stored = put_stored(self._node, ns, items)
            ok.extend(keys[i] for i, s in zip(idx, stored) if s)
        self._remember(ok)
        if self.events is not None and ok:
            with self._lock:
                self.events.append(OffloadingEvent(keys=ok, medium=self.medium, removed=False, locality=self.locality))
        return JobResult(
            job_id=job.job_id,
            success=len(ok) == len(keys),
            transfer_bytes=len(ok) * self.block_size_bytes,
        )

    def _load(self, job: TransferJob) -> JobResult:
        keys = list(job.keys)
        loaded = [False] * len(keys)
        for group, idx in self._by_group(keys).items():
            items = [(block_key(get_offload_block_hash(keys[i])), self._row(job.chunk_ids[i])) for i in idx]
            for i, (r, n) in zip(idx, self._node.get(self.namespace(group), items)):
                loaded[i] = r == Result.OK and n == self.block_size_bytes
        missing = [k for k, ok in zip(keys, loaded) if not ok]
        if missing:
            with self._lock:
                self._missed.extend(missing)
        n_ok = len(keys) - len(missing)
        return JobResult(
            job_id=job.job_id,
            success=not missing,
            successful_keys=None if not missing else tuple(k for k, ok in zip(keys, loaded) if ok) or None,
            transfer_bytes=n_ok * self.block_size_bytes,
        )

    def _run(self, job: TransferJob, work: Any) -> None:
        try:
            result = work(job)
        except Exception:  # reported as a failed job, never raised into vLLM
            logger.exception("cxlkv tier %r: job %d failed", self.tier_type, job.job_id)
            result = JobResult(job_id=job.job_id, success=False)
        with self._lock:
            self._done.append(result)
            self._in_flight -= 1
            self._idle.notify_all()

    def _submit(self, job: TransferJob, work: Any) -> None:
        if len(job.keys) != len(job.chunk_ids):
            raise ValueError(f"job {job.job_id}: {len(job.keys)} keys but {len(job.chunk_ids)} chunk ids")
        with self._lock:
            self._in_flight += 1
        self._pool.submit(self._run, job, work)

    # -- SecondaryTierManager ----------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookups.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, self._store)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, self._load)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        with self._lock:
            done, self._done = self._done, []
            missed, self._missed = self._missed, []
        if missed:
            # A chunk evicted between lookup and load: the lookup's cached
            # HIT turns into a MISS (on the scheduler thread, as vLLM's own
            # tiers do it), so the request recomputes it instead of asking
            # for the same doomed promotion at every step.
            self._lookups.mark_miss(missed)
        return done

    def has_pending_work(self) -> bool:
        with self._lock:
            return self._in_flight > 0 or bool(self._done)

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events is None:
            return []
        removed = self._removed_keys()
        with self._lock:
            events, self.events = self.events, []
        if removed:
            events.append(OffloadingEvent(keys=removed, medium=self.medium, removed=True, locality=self.locality))
        return events

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()

    def drain_jobs(self) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight == 0)

    def shutdown(self) -> None:
        self._lookups.shutdown()
        self._pool.shutdown(wait=True)
        try:
            self._node.detach()
        except CxlkvError as e:
            logger.warning("cxlkv tier %r: detach: %s", self.tier_type, e)

    @property
    def node_id(self) -> int:
        """The cxlkv node this tier is attached as (a fresh one after its node
        was revoked)."""
        return self._node.node.id

