"""Builds what vLLM hands a secondary tier, with vLLM's own classes: a
`TieringOffloadingSpec` from an `OffloadingConfig`, a primary-tier view
shaped as vLLM's shared offload region makes it (chunks x bytes, int8), and
the tier through vLLM's `SecondaryTierFactory` from a config dict."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from vllm.v1.kv_offload.base import ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

CHUNK_BYTES = 8192
WATCHDOG_S = 60.0


def spec(
    tier: dict[str, Any],
    *,
    model: str = "cxlkv/test-model",
    tp_size: int = 1,
    events: bool = True,
    chunk_bytes: int = CHUNK_BYTES,
    kv_cache_layout: str | None = "NHD",
) -> TieringOffloadingSpec:
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layer.0", "layer.1"), group_id=0),),
        worker_kv_bytes_per_block=chunk_bytes,
        enable_kv_cache_events=events,
        extra_config={"cpu_bytes_to_use": 64 * chunk_bytes, "secondary_tiers": [tier]},
        engine_id="engine-0",
        kv_cache_layout=kv_cache_layout,
        model=OffloadingModelConfig(name=model, dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=tp_size,
            tp_size=tp_size,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )
    return TieringOffloadingSpec(config)


def primary(n_chunks: int = 64, chunk_bytes: int = CHUNK_BYTES) -> tuple[np.ndarray, memoryview]:
    """A primary tier's KV buffer and the view vLLM hands its tiers."""
    rows = np.zeros((n_chunks, chunk_bytes), dtype=np.int8)
    return rows, memoryview(rows)


def make_tier(
    tier: dict[str, Any], *, n_chunks: int = 64, chunk_bytes: int = CHUNK_BYTES, **kw: Any
) -> tuple[SecondaryTierManager, np.ndarray]:
    s = spec(tier, chunk_bytes=chunk_bytes, **kw)
    rows, view = primary(n_chunks, chunk_bytes)
    return SecondaryTierFactory.create_secondary_tier(dict(tier), view, s), rows


def key(i: int, group: int = 0) -> bytes:
    """An OffloadKey: a 32-byte block hash (as vLLM's sha256) and its group."""
    return make_offload_key(i.to_bytes(4, "little") * 8, group)


def fill(rows: np.ndarray, chunk: int, seed: int) -> None:
    rows[chunk] = np.random.default_rng(seed).integers(-128, 128, rows.shape[1], dtype=np.int8)


def wait_job(tier: SecondaryTierManager, job_id: int, poll_s: float = 0.001) -> JobResult:
    """Polls the tier as vLLM's scheduler does until `job_id` finished."""
    deadline = time.monotonic() + WATCHDOG_S
    while time.monotonic() < deadline:
        for r in tier.get_finished_jobs():
            if r.job_id == job_id:
                return r
        time.sleep(poll_s)
    raise TimeoutError(f"job {job_id} did not finish in {WATCHDOG_S} s")


def lookup(tier: SecondaryTierManager, keys: list[bytes], req: str = "req") -> list[Any]:
    """Looks keys up as vLLM does: RETRY until the step's batch was flushed
    (on_schedule_end) and answered."""
    ctx = ReqContext(req_id=req)
    deadline = time.monotonic() + WATCHDOG_S
    while True:
        res = [tier.lookup(k, ctx) for k in keys]
        if all(r.name != "RETRY" for r in res):
            tier.on_request_finished(ctx)
            return res
        if time.monotonic() > deadline:
            raise TimeoutError("lookup never resolved")
        tier.on_schedule_end(ScheduleEndContext(new_req_ids=[req], preempted_req_ids=[]))
        time.sleep(0.001)


def job(job_id: int, keys: list[bytes], chunks: list[int], promotion: bool) -> TransferJob:
    return TransferJob(
        job_id=job_id,
        keys=keys,
        chunk_ids=np.array(chunks, dtype=np.int64),
        is_promotion=promotion,
        req_context=ReqContext(req_id=f"job-{job_id}"),
    )
