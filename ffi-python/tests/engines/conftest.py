"""Fixtures shared by the engine adapters' tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import cxlkv


@pytest.fixture
def small_region() -> Iterator[str]:
    """An 8 MiB region (1024 index entries) that a test fills past its
    capacity; removed whatever the test does."""
    path = f"/dev/shm/cxlkv-engines-full-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        with cxlkv.Region.create(path, 8 << 20) as r:
            r.format(chunk_shift=16, max_nodes=4, n_stripes=4, entries_per_stripe=256)
        yield path
    finally:
        if os.path.exists(path):
            os.unlink(path)
