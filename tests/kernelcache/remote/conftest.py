"""Fixtures of the remote tiers' tests: a real redis-server, and moto's S3-compatible server."""

from __future__ import annotations

import pytest
from object_store import MotoS3, s3_env
from redis_server import RedisServer


@pytest.fixture
def server(tmp_path):
    """A redis-server of the test's own."""
    with RedisServer(tmp_path / "redis") as srv:
        yield srv


@pytest.fixture(scope="module")
def s3():
    """moto's S3-compatible server, one per test module (with the test credentials set)."""
    with s3_env(), MotoS3() as server:
        yield server
