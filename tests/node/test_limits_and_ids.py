"""Limits and caller-chosen ids on one node: clear errors, stored data untouched."""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.node.conftest import NodeHttp, Serve
from zdmq.config import ClusterConfig

Http = NodeHttp


async def test_an_id_in_use_by_another_queue_is_refused_with_409_and_the_first_copy_kept(
    http: Http,
) -> None:
    for q in ("qa", "qb"):
        assert (await http.put(f"/v1/queues/{q}")).status == 201
    mid = str(uuid.uuid4())
    r = await http.post("/v1/queues/qa/messages", data=b"first", headers={"zdmq-id": mid})
    assert r.status == 201
    r = await http.post("/v1/queues/qb/messages", data=b"second", headers={"zdmq-id": mid})
    assert r.status == 409
    assert (await r.json())["error"]["code"] == "message_id_conflict"
    assert (await http.post("/v1/queues/qb/pop")).status == 204
    r = await http.post("/v1/queues/qa/pop")
    assert r.status == 200 and await r.read() == b"first" and r.headers["zdmq-id"] == mid


async def test_creating_more_queues_than_the_limit_is_refused_with_409(
    tmp_path: Path, serve_node: Serve
) -> None:
    config = ClusterConfig.from_dict(
        {
            "nodes": [{"id": "n1", "host": "127.0.0.1", "port": 1}],
            "replication": 1,
            "partitions": 16,
            "data_dir": str(tmp_path),
            "limits": {"max_queues": 2},
        }
    )
    async with serve_node(config) as http:
        assert (await http.put("/v1/queues/a")).status == 201
        assert (await http.put("/v1/queues/b")).status == 201
        r = await http.put("/v1/queues/c")
        assert r.status == 409
        assert (await r.json())["error"]["code"] == "queue_limit_reached"
        assert (await (await http.get("/v1/queues")).json())["queues"] == ["a", "b"]


async def test_the_cluster_endpoint_reports_the_request_limit(http: Http) -> None:
    info = await (await http.get("/v1/cluster")).json()
    assert info["limits"]["max_request_bytes"] == 16 * 1024 * 1024


async def test_a_batch_holding_an_id_of_another_queue_stores_none_of_its_messages(
    http: Http,
) -> None:
    for q in ("qa", "qb"):
        assert (await http.put(f"/v1/queues/{q}")).status == 201
    taken = str(uuid.uuid4())
    r = await http.post("/v1/queues/qa/messages", data=b"a", headers={"zdmq-id": taken})
    assert r.status == 201
    fresh = str(uuid.uuid4())
    batch = {"messages": [{"id": fresh, "body": "new"}, {"id": taken, "body": "clash"}]}
    r = await http.post("/v1/queues/qb/batch", json=batch)
    assert r.status == 409
    assert (await r.json())["error"]["code"] == "message_id_conflict"
    assert (await (await http.post("/v1/queues/qb/pop?max=10")).json())["messages"] == []
    # The refused id is free: it can be pushed to qb on its own now.
    r = await http.post("/v1/queues/qb/messages", data=b"new", headers={"zdmq-id": fresh})
    assert r.status == 201
