"""The metadata list stays a tight superset of the nodes holding messages."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

import aiohttp
import pytest

from tests.cluster.support import id_owned_by, placement_of, queue_owned_by
from tests.helpers import json_bytes, node_signed, unique
from zdmq import Client, NodeUnavailable
from zdmq.local import LocalCluster


async def test_a_listed_node_that_holds_nothing_leaves_the_list_at_the_first_pop_there(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    # A crash between registering and storing leaves a node listed with no UUID queue.
    # Reproduce that state through the real internal endpoint, then pop.
    owner, ghost = "n1", "n3"
    q = queue_owned_by(placement_of(cluster4), owner)
    owner_url = cluster4.config.node(owner).url
    async with Client.from_config(cluster4.config_path) as c:
        await c.create_queue(q)
        body = json_bytes({"node": ghost, "queues": {q: "00000000-0000-4000-8000-000000000000"}})
        async with http.post(
            f"{owner_url}/v1/internal/register",
            data=body,
            headers={
                "Content-Type": "application/json",
                **node_signed(cluster4.config, ghost, "POST", "/v1/internal/register", body),
            },
        ) as r:
            assert r.status == 200, await r.text()
        assert await c.metadata(q) == [ghost]
        assert await c.pop(q) is None
        assert await c.metadata(q) == []
    async with Client.from_config(cluster4.config_path) as fresh:
        assert await fresh.pop(q) is None
        assert fresh.calls["pop"].calls <= 2  # the guess, then an empty metadata list


@pytest.mark.parametrize(
    ("node", "first_uuid"),
    [
        ("n9", "00000000-0000-4000-8000-000000000000"),  # not a node of the cluster
        ("n1", "not-a-message-id"),
    ],
)
async def test_a_registration_of_an_unknown_node_or_a_bad_first_uuid_is_refused_and_not_stored(
    cluster4: LocalCluster, http: aiohttp.ClientSession, node: str, first_uuid: str
) -> None:
    owner = "n2"
    q = queue_owned_by(placement_of(cluster4), owner)
    owner_url = cluster4.config.node(owner).url
    async with Client.from_config(cluster4.config_path) as c:
        await c.create_queue(q)
        ids = [await c.push(q, f"m{i}") for i in range(8)]
        listed = await c.metadata(q)
        for path in ("/v1/internal/register", "/v1/internal/sweep"):
            body = json_bytes({"node": node, "queues": {q: first_uuid}})
            # Signed by a real node (the caller of record is the body's node when it is one).
            signer = node if node in cluster4.config.node_ids else "n1"
            async with http.post(
                f"{owner_url}{path}",
                data=body,
                headers={
                    "Content-Type": "application/json",
                    **node_signed(cluster4.config, signer, "POST", path, body),
                },
            ) as r:
                assert r.status == 400, await r.text()
                assert (await r.json())["error"]["code"] == "bad_request"
        assert await c.metadata(q) == listed
        got = []
        while (m := await c.pop(q)) is not None:
            got.append(m.id)
    assert sorted(got) == sorted(ids)
    cluster4.restart(owner)  # nothing of it was stored either
    async with Client.from_config(cluster4.config_path) as c:
        assert set(await c.metadata(q)) <= set(cluster4.config.node_ids)
        assert await c.pop(q) is None


async def test_push_many_keeps_text_content_types_and_splits_by_request_bytes(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    limit = 64 * 1024
    cluster = make_cluster(
        nodes=2,
        durability="os",
        limits={"max_message_bytes": 8 * 1024, "max_request_bytes": limit},
    )
    q = unique()
    bodies = [f"{i:06d}" + "y" * 4090 for i in range(200)]  # ~800 KiB in all
    async with Client.from_config(cluster.config_path) as c:
        await c.create_queue(q)
        ids = await c.push_many(q, bodies)
        # Each node's part travels in several requests, each under the byte limit.
        assert c.calls["push_many"].calls >= 800 * 1024 // limit
        got = []
        while batch := await c.pop_many(q, 50):
            got.extend(batch)
    assert sorted(m.id for m in got) == sorted(ids)
    assert sorted(m.body.decode() for m in got) == sorted(bodies)
    assert {m.content_type for m in got} == {"text/plain; charset=utf-8"}


async def test_a_client_given_only_one_url_learns_the_layout_and_routes_zero_hop(
    cluster4: LocalCluster, client_ssl: ssl.SSLContext | None
) -> None:
    q = unique()
    async with Client([cluster4.urls[2]], ssl_context=client_ssl) as c:
        assert c.nodes == cluster4.config.node_ids
        await c.create_queue(q)
        ids = [await c.push(q, f"m{i}") for i in range(40)]
        assert c.calls["push"].calls == 40  # one call each, straight to the owner
        depth = (await c.stats(q)).depth
        assert len(depth) > 1  # spread over nodes, not funnelled through the seed url
        got = []
        while (m := await c.pop(q)) is not None:
            got.append(m.id)
    assert sorted(got) == sorted(ids)


async def test_a_client_whose_urls_all_fail_raises_node_unavailable() -> None:
    # Port 9 (discard) on loopback: nothing of ours listens there.
    with pytest.raises(NodeUnavailable):
        async with Client(["http://127.0.0.1:9"], timeout_s=1):
            pass


async def test_registrations_made_while_one_is_in_flight_go_to_their_owner_together(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    # 48 queues whose metadata lists live on n2 get their first message on n1 at once:
    # n1 must register for each before storing it, and does so in fewer calls than 48.
    placement = placement_of(cluster4)
    n1 = cluster4.config.node("n1").url
    queues = [queue_owned_by(placement, "n2") for _ in range(48)]

    async with Client.from_config(cluster4.config_path) as c:
        await asyncio.gather(*(c.create_queue(q) for q in queues))
        before = await _counters(http, n1)

        pushed = await asyncio.gather(*(_push_stored_on_n1(http, cluster4, q) for q in queues))
        assert [status for status, _ in pushed] == [201] * 48
        ids = [mid for _, mid in pushed]
        after = await _counters(http, n1)
        made = after["registrations"] - before.get("registrations", 0)
        calls = after["registration_calls"] - before.get("registration_calls", 0)
        assert made == 48
        assert 1 <= calls < 48
        for q, mid in zip(queues, ids, strict=True):
            assert await c.metadata(q) == ["n1"]
            m = await c.pop(q)
            assert m is not None and (m.id, m.body) == (mid, q.encode())


async def test_a_batched_registration_for_a_deleted_queue_fails_that_push_alone(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    placement = placement_of(cluster4)
    live = [queue_owned_by(placement, "n2") for _ in range(8)]
    gone = queue_owned_by(placement, "n2")
    async with Client.from_config(cluster4.config_path) as c:
        await asyncio.gather(*(c.create_queue(q) for q in [*live, gone]))
        await c.delete_queue(gone)

        pushed = await asyncio.gather(
            *(_push_stored_on_n1(http, cluster4, q) for q in [*live, gone])
        )
        assert [status for status, _ in pushed] == [201] * 8 + [404]
        for q in live:
            assert await c.pop(q) is not None


async def _push_stored_on_n1(
    http: aiohttp.ClientSession, cluster: LocalCluster, q: str
) -> tuple[int, str]:
    """Pushes one message (its body the queue's name) through n1 with an id n1 owns, so
    n1 stores it; (the reply's status, the id)."""
    mid = id_owned_by(placement_of(cluster), "n1")
    async with http.post(
        f"{cluster.config.node('n1').url}/v1/queues/{q}/messages",
        data=q.encode(),
        headers={"zdmq-id": mid},
    ) as r:
        return r.status, mid


async def test_ready_notices_to_one_owner_go_together_and_wake_every_long_poll(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    # 16 long polls wait on queues whose metadata lists live on n2; their messages are
    # stored on n1 at once, so n1 owes n2 16 ready notices, and sends them in fewer calls.
    placement = placement_of(cluster4)
    queues = [queue_owned_by(placement, "n2") for _ in range(16)]
    n1 = cluster4.config.node("n1").url
    async with Client.from_config(cluster4.config_path) as c:
        await asyncio.gather(*(c.create_queue(q) for q in queues))
        before = await _counters(http, n1)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        waits = [asyncio.ensure_future(c.receive(q, 1, wait_s=20)) for q in queues]
        await asyncio.sleep(0.5)  # the polls are waiting on n2
        pushed = await asyncio.gather(*(_push_stored_on_n1(http, cluster4, q) for q in queues))
        assert [status for status, _ in pushed] == [201] * 16
        got = await asyncio.wait_for(asyncio.gather(*waits), timeout=15)
        assert loop.time() - t0 < 10  # woken by the notices, not by the end of the wait
        assert [[m.id for m in batch] for batch in got] == [[mid] for _, mid in pushed]
        after = await _counters(http, n1)
        calls = after["ready_calls"] - before.get("ready_calls", 0)
        assert 1 <= calls < 16
        assert after["ready_notices"] - before.get("ready_notices", 0) == 16


async def test_unregistrations_made_while_one_is_in_flight_go_to_their_owner_together(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession
) -> None:
    # n1 empties 48 UUID queues whose metadata lists live on n2, all at once, with no
    # grace: it leaves every list, in fewer calls than 48.
    cluster = make_cluster(nodes=4, durability="os", unregister_grace_s=0)
    placement = placement_of(cluster)
    queues = [queue_owned_by(placement, "n2") for _ in range(48)]
    n1 = cluster.config.node("n1").url

    async def pop_on_n1(q: str) -> int:
        async with http.post(f"{n1}/v1/queues/{q}/pop", headers={"zdmq-route": "local"}) as r:
            return r.status

    async with Client.from_config(cluster.config_path) as c:
        await asyncio.gather(*(c.create_queue(q) for q in queues))
        pushed = await asyncio.gather(*(_push_stored_on_n1(http, cluster, q) for q in queues))
        assert [status for status, _ in pushed] == [201] * 48
        assert all([await c.metadata(q) == ["n1"] for q in queues])
        before = await _counters(http, n1)
        # The first pop takes each message; the second finds the UUID queue empty and
        # unregisters it before it replies.
        assert await asyncio.gather(*(pop_on_n1(q) for q in queues)) == [200] * 48
        assert await asyncio.gather(*(pop_on_n1(q) for q in queues)) == [204] * 48
        after = await _counters(http, n1)
        made = after["unregistrations"] - before.get("unregistrations", 0)
        calls = after["unregistration_calls"] - before.get("unregistration_calls", 0)
        assert made == 48
        assert 1 <= calls < 48
        assert all([await c.metadata(q) == [] for q in queues])


async def _counters(http: aiohttp.ClientSession, url: str) -> dict[str, int]:
    async with http.get(f"{url}/v1/health") as r:
        return dict((await r.json())["counters"])
