"""A node's background tasks (ready notices, deferred unregisters): one that fails with
an error it did not expect is logged, not left as an unretrieved task exception."""

from __future__ import annotations

import asyncio
import logging

import pytest

from zdmq.config import ClusterConfig
from zdmq.server.node import Node
from zdmq.server.storage import MemoryStorage


def _node() -> Node:
    config = ClusterConfig.from_dict(
        {
            "nodes": [{"id": "n1", "host": "127.0.0.1", "port": 1}],
            "replication": 1,
            "durability": "memory",
        }
    )
    return Node(config, "n1", MemoryStorage())


async def test_a_failed_background_task_is_logged_and_forgotten(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = _node()

    async def fails() -> None:
        raise RuntimeError("a bug in a background task")

    async def works() -> None:
        await asyncio.sleep(0)

    with caplog.at_level(logging.ERROR, logger="zdmq.node"):
        node._spawn(fails())
        node._spawn(works())
        await asyncio.gather(*node._background, return_exceptions=True)
        await asyncio.sleep(0)  # done callbacks run on the next loop pass
    assert not node._background
    [record] = [r for r in caplog.records if r.name == "zdmq.node"]
    assert record.exc_info is not None
    assert "a bug in a background task" in str(record.exc_info[1])
