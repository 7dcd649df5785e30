"""A node closed and started again on its data directory serves exactly what it had.

Closing the TestClient runs the app's cleanup (storage closed); a new app on the same
config is the restarted node.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

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


async def test_a_queue_drained_after_a_restart_drops_the_node_from_its_metadata_list(
    node_config: ClusterConfig, serve_node: Serve
) -> None:
    async with serve_node(node_config) as http:
        assert (await http.put("/v1/queues/jobs")).status == 201
        await http.post("/v1/queues/jobs/messages", data=b"x")

    async with serve_node(node_config) as http:
        meta = await (await http.get("/v1/queues/jobs/metadata")).json()
        assert [e["node"] for e in meta["nodes"]] == ["n1"]
        assert (await http.post("/v1/queues/jobs/pop")).status == 200
        # ZDMQ's empty step: the pop that finds the UUID queue empty unlists the node.
        assert (await http.post("/v1/queues/jobs/pop")).status == 204
        meta = await (await http.get("/v1/queues/jobs/metadata")).json()
        assert meta["nodes"] == []
