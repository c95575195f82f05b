"""Fixtures: a small anonymous region, formatted, and nodes attached to it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

import cxlkv


@pytest.fixture
def local_dir() -> Iterator[str]:
    """A private directory for the host-local lock files of a test's regions."""
    with tempfile.TemporaryDirectory(prefix="cxlkv-py-") as d:
        yield d


@pytest.fixture
def region() -> Iterator[cxlkv.Region]:
    with cxlkv.Region.memfd(32 << 20) as r:
        r.format(chunk_shift=16, max_nodes=4, n_stripes=4, entries_per_stripe=256, app_locks=2)
        yield r


@pytest.fixture
def node(region: cxlkv.Region, local_dir: str) -> Iterator[cxlkv.Node]:
    with region.attach(lock_timeout_ms=5000, local_dir=local_dir) as n:
        yield n
        assert n.check() == []


@pytest.fixture
def ns() -> cxlkv.Namespace:
    return cxlkv.Namespace("test-model", dtype=1, tp_size=1, block_tokens=16)


@pytest.fixture
def shm_path() -> Iterator[str]:
    path = f"/dev/shm/cxlkv-pytest-{os.getpid()}-{os.urandom(4).hex()}"
    yield path
    if os.path.exists(path):
        os.unlink(path)
