"""Shared test helpers: waiting on conditions (never fixed sleeps) and unique names."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from zdmq.auth import NODE_AUTH_HEADER, NodeSigner, node_secret
from zdmq.config import ClusterConfig
from zdmq.server.node import FORWARDED_HEADER


def unique(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def wait_until(
    pred: Callable[[], Awaitable[bool]], *, timeout_s: float = 10.0, what: str = "condition"
) -> None:
    """Polls an async predicate until it holds; fails the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if await pred():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)


def node_signed(
    config: ClusterConfig, node_id: str, method: str, target: str, body: bytes = b""
) -> dict[str, str]:
    """The headers of a node-to-node call from `node_id`: marked forwarded and signed
    with the cluster's node secret (what `Node.peer_call` sends)."""
    signer = NodeSigner(node_secret(config, create=False), node_id)
    return {
        FORWARDED_HEADER: node_id,
        NODE_AUTH_HEADER: signer.value(f"{method} {target}".encode(), body),
    }


def json_bytes(payload: Any) -> bytes:
    return orjson.dumps(payload)
