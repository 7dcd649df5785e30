"""Every REST call behaves as documented through every node of a real 4-node cluster.

Any node accepts any call and forwards it to the node that owns it; these tests use a
plain HTTP session (no zdmq client, so no client-side routing) and loop over all nodes.
"""

from __future__ import annotations

import base64
import os
import uuid

import aiohttp

from tests.cluster.support import MiB, error_code, id_owned_by, placement_of, queue_owned_by
from tests.helpers import unique
from zdmq import Client
from zdmq.local import LocalCluster
from zdmq.models import (
    BATCH_CONTENT_TYPE,
    QueueSettings,
    decode_batch,
    dedup_message_id,
    encode_batch,
)


def _node_urls(cluster: LocalCluster) -> list[tuple[str, str]]:
    return [(node_id, cluster.config.node(node_id).url) for node_id in cluster.nodes]


async def _create(http: aiohttp.ClientSession, url: str, queue: str) -> None:
    async with http.put(f"{url}/v1/queues/{queue}") as r:
        assert r.status == 201, await r.text()


async def test_queue_calls_create_list_get_delete_behave_as_listed_through_every_node(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    urls = _node_urls(cluster4)
    placement = placement_of(cluster4)
    for node_id, url in urls:
        # A queue whose metadata lives elsewhere, so the create is forwarded.
        other = next(n for n, _ in urls if n != node_id)
        q = queue_owned_by(placement, other)

        async with http.put(f"{url}/v1/queues/{q}") as r:
            assert r.status == 201
            assert await r.json() == {"queue": q, "settings": QueueSettings().to_wire()}
        for _, any_url in urls:
            async with http.put(f"{any_url}/v1/queues/{q}") as r:
                assert r.status == 409
                assert await error_code(r) == "queue_exists"

        for _, any_url in urls:
            async with http.get(f"{any_url}/v1/queues") as r:
                assert r.status == 200
                listed = (await r.json())["queues"]
                assert q in listed
            async with http.get(f"{any_url}/v1/queues/{q}") as r:
                assert r.status == 200
                info = await r.json()
                assert info == {
                    "queue": q,
                    "messages": 0,
                    "in_flight": 0,
                    "delayed": 0,
                    "dead_lettered": 0,
                    "expired": 0,
                    "nodes": [],
                    "depth": {},
                    "registered": [],
                    "settings": QueueSettings().to_wire(),
                    "unavailable": [],
                }

        async with http.delete(f"{url}/v1/queues/{q}") as r:
            assert r.status == 204
            assert await r.read() == b""
        for _, any_url in urls:
            async with http.delete(f"{any_url}/v1/queues/{q}") as r:
                assert r.status == 404
                assert await error_code(r) == "queue_not_found"
            async with http.get(f"{any_url}/v1/queues/{q}") as r:
                assert r.status == 404
                assert await error_code(r) == "queue_not_found"
            async with http.get(f"{any_url}/v1/queues") as r:
                assert q not in (await r.json())["queues"]


async def test_push_batch_and_pop_calls_behave_as_listed_through_every_node(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    for _, url in _node_urls(cluster4):
        q = unique("rest")
        await _create(http, url, q)
        sent: dict[str, tuple[bytes, str]] = {}  # id -> (body, content type on pop)

        # Single pushes take a raw body of any content type, or none at all.
        raw_pushes: list[tuple[bytes, str | None]] = [
            (b'{"k": [1, 2]}', "application/json"),
            ("héllo wörld".encode(), "text/plain; charset=utf-8"),
            (os.urandom(64), "image/png"),
            (os.urandom(32), None),
        ]
        for body, ctype in raw_pushes:
            headers = {"Content-Type": ctype} if ctype is not None else {}
            async with http.post(f"{url}/v1/queues/{q}/messages", data=body, headers=headers) as r:
                assert r.status == 201, await r.text()
                reply = await r.json()
                assert reply == {"id": reply["id"], "duplicate": False}
                assert str(uuid.UUID(reply["id"])) == reply["id"]
                sent[reply["id"]] = (body, ctype or "application/octet-stream")

        binary = os.urandom(48)
        batch = {
            "messages": [
                {"body": "batch text", "encoding": "utf-8"},
                {"body": base64.b64encode(binary).decode(), "encoding": "base64"},
                {"body": "<a/>", "encoding": "utf-8", "content_type": "application/xml"},
            ]
        }
        async with http.post(f"{url}/v1/queues/{q}/batch", json=batch) as r:
            assert r.status == 201, await r.text()
            reply = await r.json()
            assert set(reply) == {"ids", "duplicates"}
            assert reply["duplicates"] == 0
            assert len(reply["ids"]) == 3 == len(set(reply["ids"]))
            ids = reply["ids"]
        sent[ids[0]] = (b"batch text", "application/octet-stream")
        sent[ids[1]] = (binary, "application/octet-stream")
        sent[ids[2]] = (b"<a/>", "application/xml")

        got: dict[str, tuple[bytes, str]] = {}
        # A single pop returns the raw body with its Content-Type and the zdmq-id header.
        for _ in range(3):
            async with http.post(f"{url}/v1/queues/{q}/pop") as r:
                assert r.status == 200, await r.text()
                mid = r.headers["zdmq-id"]
                assert mid not in got
                got[mid] = (await r.read(), r.headers["Content-Type"])
        # ?max=N returns a JSON list.
        async with http.post(f"{url}/v1/queues/{q}/pop", params={"max": "100"}) as r:
            assert r.status == 200
            msgs = (await r.json())["messages"]
        # One pop drains one node; keep popping until the cluster has no more.
        while msgs:
            for m in msgs:
                assert m["id"] not in got
                if m["encoding"] == "base64":
                    body = base64.b64decode(m["body"])
                else:
                    assert m["encoding"] == "utf-8"
                    body = m["body"].encode()
                got[m["id"]] = (body, m.get("content_type") or "application/octet-stream")
            async with http.post(f"{url}/v1/queues/{q}/pop", params={"max": "100"}) as r:
                assert r.status == 200
                msgs = (await r.json())["messages"]
        assert got == sent

        async with http.post(f"{url}/v1/queues/{q}/pop") as r:
            assert r.status == 204
            assert await r.read() == b""
        async with http.post(f"{url}/v1/queues/{q}/pop", params={"max": "5"}) as r:
            assert r.status == 200
            assert await r.json() == {"messages": []}


async def test_health_answers_ok_on_every_node(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    for node_id, url in _node_urls(cluster4):
        async with http.get(f"{url}/v1/health") as r:
            assert r.status == 200
            health = await r.json()
            assert health["node"] == node_id
            assert health["status"] == "ok"


async def test_empty_and_one_mebibyte_bodies_round_trip_through_non_owner_nodes(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    urls = _node_urls(cluster4)
    placement = placement_of(cluster4)
    for i, (node_id, url) in enumerate(urls):
        q = unique("big")
        await _create(http, url, q)
        # Ids owned by the next node: the node we call must forward the push.
        owner = urls[(i + 1) % len(urls)][0]
        assert owner != node_id
        bodies = {
            id_owned_by(placement, owner): b"",
            id_owned_by(placement, owner): os.urandom(MiB),
        }
        for mid, body in bodies.items():
            async with http.post(
                f"{url}/v1/queues/{q}/messages",
                data=body,
                headers={"zdmq-id": mid, "Content-Type": "application/octet-stream"},
            ) as r:
                assert r.status == 201, await r.text()
                assert await r.json() == {"id": mid, "duplicate": False}

        # Popped through a third node, which holds none of them: a routed pop.
        pop_url = urls[(i + 2) % len(urls)][1]
        got: dict[str, bytes] = {}
        for _ in bodies:
            async with http.post(f"{pop_url}/v1/queues/{q}/pop") as r:
                assert r.status == 200, await r.text()
                got[r.headers["zdmq-id"]] = await r.read()
        assert got == bodies
        async with http.post(f"{pop_url}/v1/queues/{q}/pop") as r:
            assert r.status == 204


async def test_a_body_one_byte_over_a_mebibyte_is_refused_with_413_on_every_node(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    urls = _node_urls(cluster4)
    q = unique("toolarge")
    await _create(http, urls[0][1], q)
    too_big = os.urandom(MiB + 1)
    for _, url in urls:
        async with http.post(
            f"{url}/v1/queues/{q}/messages",
            data=too_big,
            headers={"Content-Type": "application/octet-stream"},
        ) as r:
            assert r.status == 413
            assert await error_code(r) == "message_too_large"
        batch = {"messages": [{"body": base64.b64encode(too_big).decode(), "encoding": "base64"}]}
        async with http.post(f"{url}/v1/queues/{q}/batch", json=batch) as r:
            assert r.status == 413
            assert await error_code(r) == "message_too_large"
    async with http.get(f"{urls[0][1]}/v1/queues/{q}") as r:
        assert (await r.json())["messages"] == 0


async def test_invalid_queue_names_are_refused_with_400_on_every_node(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    bad_names = ["has space", "x" * 129, "semi;colon", "ümlaut", "star*"]
    calls = [
        ("PUT", ""),
        ("GET", ""),
        ("DELETE", ""),
        ("GET", "/metadata"),
        ("POST", "/messages"),
        ("POST", "/batch"),
        ("POST", "/pop"),
    ]
    for _, url in _node_urls(cluster4):
        for name in bad_names:
            for method, suffix in calls:
                json = {"messages": [{"body": "x"}]} if suffix == "/batch" else None
                async with http.request(
                    method,
                    f"{url}/v1/queues/{name}{suffix}",
                    data=b"x" if json is None else None,
                    json=json,
                ) as r:
                    assert r.status == 400, (method, suffix, name, await r.text())
                    assert await error_code(r) == "invalid_queue_name"


async def test_pops_and_pushes_on_a_deleted_queue_give_404_on_every_node(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    urls = _node_urls(cluster4)
    q = unique("deleted")
    await _create(http, urls[0][1], q)
    for _, url in urls:
        async with http.post(f"{url}/v1/queues/{q}/messages", data=b"gone soon") as r:
            assert r.status == 201
    async with http.delete(f"{urls[1][1]}/v1/queues/{q}") as r:
        assert r.status == 204
    for _, url in urls:
        for params in ({}, {"max": "10"}):
            async with http.post(f"{url}/v1/queues/{q}/pop", params=params) as r:
                assert r.status == 404, await r.text()
                assert await error_code(r) == "queue_not_found"
        async with http.post(f"{url}/v1/queues/{q}/messages", data=b"late") as r:
            assert r.status == 404, await r.text()
            assert await error_code(r) == "queue_not_found"
        async with http.post(
            f"{url}/v1/queues/{q}/batch", json={"messages": [{"body": "late"}]}
        ) as r:
            assert r.status == 404, await r.text()
            assert await error_code(r) == "queue_not_found"


async def test_a_message_stored_on_one_node_is_popped_through_any_other_node(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    urls = _node_urls(cluster4)
    placement = placement_of(cluster4)
    for a_id, a_url in urls:
        for b_id, b_url in urls:
            if a_id == b_id:
                continue
            q = unique("route")
            await _create(http, b_url, q)
            # Pushed through A and stored on A; B holds nothing of this queue.
            mid, body = id_owned_by(placement, a_id), os.urandom(100)
            async with http.post(
                f"{a_url}/v1/queues/{q}/messages", data=body, headers={"zdmq-id": mid}
            ) as r:
                assert r.status == 201
            async with http.get(f"{b_url}/v1/queues/{q}") as r:
                assert (await r.json())["depth"] == {a_id: 1}
            async with http.post(f"{b_url}/v1/queues/{q}/pop") as r:
                assert r.status == 200, await r.text()
                assert r.headers["zdmq-id"] == mid
                assert await r.read() == body
            async with http.post(f"{b_url}/v1/queues/{q}/pop") as r:
                assert r.status == 204


async def test_a_repeated_id_or_dedup_id_through_any_node_is_stored_once_and_replies_200(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    urls = _node_urls(cluster4)
    placement = placement_of(cluster4)
    q = unique("dup")
    await _create(http, urls[0][1], q)
    owner = urls[0][0]
    mid = id_owned_by(placement, owner)
    # The first push goes through the owner; every repeat is forwarded to it.
    for i, (_, url) in enumerate(urls):
        async with http.post(
            f"{url}/v1/queues/{q}/messages",
            data=b"first" if i == 0 else b"again",
            headers={"zdmq-id": mid},
        ) as r:
            assert (r.status, await r.json()) == (
                (201, {"id": mid, "duplicate": False})
                if i == 0
                else (200, {"id": mid, "duplicate": True})
            )
    # A dedup id maps to one id whichever node takes it.
    dedup_ids: set[str] = set()
    for i, (_, url) in enumerate(urls):
        async with http.post(
            f"{url}/v1/queues/{q}/messages", data=b"once", headers={"zdmq-dedup-id": "order-7"}
        ) as r:
            reply = await r.json()
            assert (r.status, reply["duplicate"]) == ((201, False) if i == 0 else (200, True))
            dedup_ids.add(reply["id"])
    assert dedup_ids == {dedup_message_id(q, "order-7")}
    # With both headers the message keeps zdmq-id, still stored here: a repeat too.
    async with http.post(
        f"{urls[1][1]}/v1/queues/{q}/messages",
        data=b"x",
        headers={"zdmq-id": mid, "zdmq-dedup-id": "order-7"},
    ) as r:
        assert (r.status, await r.json()) == (200, {"id": mid, "duplicate": True})

    got: dict[str, bytes] = {}
    for _ in range(3):  # two messages, then the empty reply
        async with http.post(f"{urls[2][1]}/v1/queues/{q}/pop") as r:
            if r.status == 204:
                break
            assert r.status == 200, await r.text()
            assert r.headers["zdmq-id"] not in got
            got[r.headers["zdmq-id"]] = await r.read()
    assert got == {mid: b"first", dedup_message_id(q, "order-7"): b"once"}


async def test_frame_batches_through_non_owner_nodes_and_json_callers_share_one_queue(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    """A binary push batch sent to any node is split by owner (forwarded as JSON); a
    binary receive through any node gathers from the listed nodes; the Python client
    (frames) and plain JSON callers see each other's messages, bodies byte for byte."""
    q = unique("frames")
    urls = _node_urls(cluster4)
    await _create(http, urls[0][1], q)
    bodies = [os.urandom(n) for n in (0, 1, 100, 5000)] + [b"text", "ünï".encode()]
    frame_ids = [str(uuid.uuid4()) for _ in bodies]
    async with http.post(
        f"{urls[1][1]}/v1/queues/{q}/batch",
        data=encode_batch(ids=frame_ids, bodies=bodies),
        headers={"Content-Type": BATCH_CONTENT_TYPE},
    ) as r:
        assert r.status == 201, await r.text()
        assert await r.json() == {"ids": frame_ids, "duplicates": 0}
    json_batch = {"messages": [{"body": "from json", "content_type": "text/x"}]}
    async with http.post(f"{urls[2][1]}/v1/queues/{q}/batch", json=json_batch) as r:
        [json_id] = (await r.json())["ids"]
    async with Client.from_config(cluster4.config_path) as c:
        client_ids = await c.push_many(q, [b"from the client", "text body"])

        want = {
            **dict(zip(frame_ids, bodies, strict=True)),
            json_id: b"from json",
            client_ids[0]: b"from the client",
            client_ids[1]: b"text body",
        }
        got: dict[str, bytes] = {}
        receipts: list[str] = []
        for _ in range(20):
            # Binary receives through every node in turn (routed: the node gathers).
            for _, url in urls:
                async with http.post(
                    f"{url}/v1/queues/{q}/receive",
                    params={"max": "3"},
                    headers={"Accept": BATCH_CONTENT_TYPE},
                ) as r:
                    assert r.status == 200, await r.text()
                    assert r.headers["Content-Type"] == BATCH_CONTENT_TYPE
                    batch = decode_batch(await r.read())
                for mid, body, receipt, ctype in zip(
                    batch.ids or [],
                    batch.bodies or [],
                    batch.receipts or [],
                    batch.content_types or [None] * batch.count,
                    strict=True,
                ):
                    assert mid is not None and receipt is not None and mid not in got
                    got[mid] = body
                    receipts.append(receipt)
                    if mid == json_id:
                        assert ctype == "text/x"
                    if mid == client_ids[1]:
                        assert ctype == "text/plain; charset=utf-8"
            if len(got) == len(want):
                break
        assert got == want
        # The client's binary ack settles leases that JSON callers took, and vice versa.
        half = len(receipts) // 2
        result = await c.ack(q, receipts[:half])
        assert (result.done, result.failed) == (half, {})
        for _, url in urls[:1]:
            async with http.post(
                f"{url}/v1/queues/{q}/ack",
                json={"receipts": receipts[half:] + receipts[:1]},
            ) as r:
                reply = await r.json()
        assert reply["acked"] == len(receipts) - half
        assert reply["failed"] == [{"receipt": receipts[0], "code": "lease_expired"}]
        assert (await c.stats(q)).messages == 0
