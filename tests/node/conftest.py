"""One node in-process behind a real HTTP server on 127.0.0.1:0 (aiohttp's TestServer).

`serve_node` starts the app of a one-node `durability: fsync` cluster on a data
directory and yields an aiohttp `TestClient` for it; leaving the block runs the app's
cleanup (storage closed), so a second `serve_node` on the same config is a restart.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import test_utils

from zdmq.config import ClusterConfig
from zdmq.server.app import make_app

Serve = Callable[[ClusterConfig], AbstractAsyncContextManager[test_utils.TestClient]]


@pytest.fixture
def node_config(tmp_path: Path) -> ClusterConfig:
    return ClusterConfig.from_dict(
        {
            "nodes": [{"id": "n1", "host": "127.0.0.1", "port": 1}],
            "replication": 1,
            "partitions": 16,
            "data_dir": str(tmp_path),
            "durability": "fsync",
            "repair_interval_s": 0.2,
        }
    )


@asynccontextmanager
async def _serve(config: ClusterConfig) -> AsyncIterator[test_utils.TestClient]:
    server = test_utils.TestServer(make_app(config, "n1"), host="127.0.0.1")
    async with test_utils.TestClient(server) as client:
        yield client


@pytest.fixture
def serve_node() -> Serve:
    return _serve


@pytest.fixture
async def http(node_config: ClusterConfig) -> AsyncIterator[test_utils.TestClient]:
    async with _serve(node_config) as client:
        yield client
