"""A node closed and started again on its data directory serves exactly what it had.

Closing the TestClient runs the app's cleanup (storage closed); a new app on the same
config is the restarted node.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import pytest

from tests.helpers import wait_until
from tests.node.conftest import NodeHttp
from zdmq.config import ClusterConfig

Http = NodeHttp
Serve = Callable[[ClusterConfig], AbstractAsyncContextManager[Http]]


async def _pop_ids(http: Http, queue: str) -> list[str]:
    """Pops one at a time until the queue is empty; returns the ids in pop order."""
    ids: list[str] = []
    while True:
        resp = await http.post(f"/v1/queues/{queue}/pop")
        if resp.status == 204:
            return ids
        assert resp.status == 200, await resp.text()
        ids.append(resp.headers["zdmq-id"])


async def test_after_a_restart_the_unpopped_messages_pop_in_order_and_popped_ones_never(
    node_config: ClusterConfig, serve_node: Serve
) -> None:
    async with serve_node(node_config) as http:
        assert (await http.put("/v1/queues/jobs")).status == 201
        ids = []
        for i in range(20):
            resp = await http.post(
                "/v1/queues/jobs/messages", data=b"body %d" % i, headers={"Content-Type": "a/b"}
            )
            ids.append((await resp.json())["id"])
        popped = []
        for _ in range(7):
            popped.append((await http.post("/v1/queues/jobs/pop")).headers["zdmq-id"])
        assert popped == ids[:7]

    async with serve_node(node_config) as http:
        resp = await http.get("/v1/queues/jobs")
        assert resp.status == 200
        assert (await resp.json())["messages"] == 13
        first = await http.post("/v1/queues/jobs/pop")
        assert first.headers["zdmq-id"] == ids[7]
        assert await first.read() == b"body 7"
        assert first.headers["Content-Type"] == "a/b"
        assert await _pop_ids(http, "jobs") == ids[8:]


async def test_queues_and_deletions_survive_a_restart(
    node_config: ClusterConfig, serve_node: Serve
) -> None:
    async with serve_node(node_config) as http:
        for q in ("kept", "empty", "dropped"):
            assert (await http.put(f"/v1/queues/{q}")).status == 201
        await http.post("/v1/queues/dropped/messages", data=b"x")
        assert (await http.delete("/v1/queues/dropped")).status == 204

    async with serve_node(node_config) as http:
        assert await (await http.get("/v1/queues")).json() == {"queues": ["empty", "kept"]}
        assert (await http.put("/v1/queues/kept")).status == 409
        assert (await http.post("/v1/queues/empty/pop")).status == 204
        assert (await http.post("/v1/queues/dropped/pop")).status == 404


async def test_pushes_after_a_restart_queue_behind_the_recovered_messages(
    node_config: ClusterConfig, serve_node: Serve
) -> None:
    async with serve_node(node_config) as http:
        assert (await http.put("/v1/queues/jobs")).status == 201
        resp = await http.post(
            "/v1/queues/jobs/batch", json={"messages": [{"body": f"a{i}"} for i in range(5)]}
        )
        before = (await resp.json())["ids"]

    async with serve_node(node_config) as http:
        resp = await http.post(
            "/v1/queues/jobs/batch", json={"messages": [{"body": f"b{i}"} for i in range(5)]}
        )
        after = (await resp.json())["ids"]
        assert await _pop_ids(http, "jobs") == before + after


@pytest.mark.parametrize("grace_s", [0.0, 0.5])
async def test_a_queue_drained_after_a_restart_drops_the_node_from_its_metadata_list(
    node_config: ClusterConfig, serve_node: Serve, grace_s: float
) -> None:
    config = dataclasses.replace(node_config, unregister_grace_s=grace_s)
    async with serve_node(config) as http:
        assert (await http.put("/v1/queues/jobs")).status == 201
        await http.post("/v1/queues/jobs/messages", data=b"x")

    async with serve_node(config) as http:

        async def listed() -> list[str]:
            meta = await (await http.get("/v1/queues/jobs/metadata")).json()
            return [e["node"] for e in meta["nodes"]]

        async def unlisted() -> bool:
            return await listed() == []

        assert await listed() == ["n1"]
        assert (await http.post("/v1/queues/jobs/pop")).status == 200
        # ZDMQ's empty step: the pop that finds the UUID queue empty unlists the node, at
        # once with no grace, else once the grace has passed with the queue still empty.
        started = time.monotonic()
        assert (await http.post("/v1/queues/jobs/pop")).status == 204
        if grace_s:
            assert await listed() == ["n1"]
            await wait_until(unlisted, what="the node to leave the list")
            assert time.monotonic() - started >= grace_s
        assert await listed() == []


async def test_a_queue_that_refills_within_the_grace_keeps_its_registration(
    node_config: ClusterConfig, serve_node: Serve
) -> None:
    config = dataclasses.replace(node_config, unregister_grace_s=0.5)
    async with serve_node(config) as http:

        async def counter(name: str) -> int:
            health = await (await http.get("/v1/health")).json()
            return int(health["counters"].get(name, 0))

        async def listed() -> list[str]:
            meta = await (await http.get("/v1/queues/jobs/metadata")).json()
            return [e["node"] for e in meta["nodes"]]

        async def unlisted() -> bool:
            return await listed() == []

        assert (await http.put("/v1/queues/jobs")).status == 201
        for body in (b"a", b"b"):
            assert (await http.post("/v1/queues/jobs/messages", data=body)).status == 201
            assert (await http.post("/v1/queues/jobs/pop")).status == 200
            assert (await http.post("/v1/queues/jobs/pop")).status == 204  # empty: grace starts
        # Emptied and refilled inside the grace: registered once, never unregistered.
        assert await counter("registrations") == 1
        assert await counter("unregistrations") == 0
        assert await listed() == ["n1"]

        # Left empty past the grace, it unregisters; the next push registers again.
        await wait_until(unlisted, what="the node to leave the list")
        assert await counter("unregistrations") == 1
        assert (await http.post("/v1/queues/jobs/messages", data=b"c")).status == 201
        assert await counter("registrations") == 2
        assert await listed() == ["n1"]
