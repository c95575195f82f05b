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


def add_tenants(region: str, local_dir: str, *names: str) -> None:
    """Adds tenants `names` to the region (as `cxlkv tenant add` does)."""
    with cxlkv.Region.open(region) as r:
        n = r.attach(local_dir=local_dir)
        try:
            for name in names:
                n.tenant_add(name, quota=32 << 20)
        finally:
            n.detach()


def usage(region: str, local_dir: str) -> dict[str, tuple[int, int]]:
    """Each tenant's (bytes, blocks)."""
    with cxlkv.Region.open(region) as r:
        n = r.attach(local_dir=local_dir)
        try:
            return {t["name"]: (t["bytes"], t["blocks"]) for t in n.tenants()}
        finally:
            n.detach()
