"""Helpers the cluster tests share: placement-aware ids and raw REST replies."""

from __future__ import annotations

import uuid
from typing import Any

import aiohttp

from zdmq.hashing import Placement
from zdmq.local import LocalCluster

MiB = 1024 * 1024


def placement_of(cluster: LocalCluster) -> Placement:
    c = cluster.config
    return Placement(c.node_ids, c.partitions, c.replication)


def id_owned_by(placement: Placement, node_id: str) -> str:
    """A fresh message id whose partition's primary is `node_id` (so it is stored there)."""
    while True:
        mid = str(uuid.uuid4())
        if placement.owner(mid) == node_id:
            return mid


def ids_owned_by(placement: Placement, node_ids: list[str], n: int) -> list[str]:
    """`n` fresh ids stored on the given nodes, round-robin."""
    return [id_owned_by(placement, node_ids[i % len(node_ids)]) for i in range(n)]


def queue_owned_by(placement: Placement, node_id: str, prefix: str = "q") -> str:
    """A fresh queue name whose metadata list lives on `node_id`."""
    while True:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        if placement.owner(name) == node_id:
            return name


async def error_code(resp: aiohttp.ClientResponse) -> str:
    """The `error.code` of a JSON error reply (fails the test if the body is not one)."""
    assert resp.content_type == "application/json", await resp.text()
    payload: Any = await resp.json()
    return str(payload["error"]["code"])
