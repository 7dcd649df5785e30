"""The cluster grows, shrinks and replaces a dead host while producers and consumers run
(docs/design.md §19): real node processes, the admin calls an operator makes (`zdmq
cluster add-node` and the rest), the rebalancer on the home group's leader moving
replicas, and the client following the map's epoch."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from tests.helpers import unique, wait_until
from zdmq import Client, NodeConflict
from zdmq.cli_status import moves_active
from zdmq.local import LocalCluster
from zdmq.server.topology import map_of_view

pytestmark = pytest.mark.main_pass_only  # it sets its own layout: 4 nodes, three copies


async def settled(client: Client) -> dict[str, Any]:
    """Waits until the rebalancer has nothing left to do; returns the map."""

    async def idle() -> bool:
        moves = await client.moves()
        return not moves_active(moves)

    await wait_until(idle, timeout_s=120, what="the moves to finish")
    return await client.cluster_map()


def replicas(m: dict[str, Any]) -> dict[str, int]:
    """How many groups each node of the map `m` (`GET /v1/cluster`'s form) is a voter of."""
    return map_of_view(m).replica_counts()


async def health_groups(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/v1/health") as r:
        return dict((await r.json())["groups"])


async def test_a_node_joins_and_leaves_under_load_and_nothing_is_lost(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession
) -> None:
    cluster = make_cluster(nodes=4, replication=3)
    queue = unique("grow")
    pushed: list[str] = []
    popped: list[str] = []
    stop = asyncio.Event()
    address = cluster.joining("n5")
    cluster.start_node("n5")
    async with Client.from_config(cluster.config_path) as client:
        await client.create_queue(queue)
        pushed += await client.push_many(queue, [b"before"] * 500)
        epoch = client.epoch
        # n5 keeps no group yet: it relays a plain call (curl's) to a group's leader.
        async with http.post(f"http://{address}/v1/queues/{queue}/messages", data=b"plain") as r:
            assert r.status == 201, await r.text()
            pushed.append((await r.json())["id"])

        async def producing() -> None:
            while not stop.is_set():
                pushed.extend(await client.push_many(queue, [b"during"] * 20))
                await asyncio.sleep(0.01)

        async def consuming() -> None:
            while not stop.is_set():
                popped.extend(m.id for m in await client.pop_many(queue, 10))
                await asyncio.sleep(0.02)

        load = [asyncio.create_task(producing()), asyncio.create_task(consuming())]
        try:
            added = await client.add_node("n5", address)
            assert added["changed"] is True and added["epoch"] > epoch
            again = await client.add_node("n5", address)  # idempotent
            assert again["changed"] is False
            with pytest.raises(NodeConflict, match="in the cluster at"):
                await client.add_node("n5", "127.0.0.1:1")
            grown = await settled(client)
            # n5 holds its share of the 4 x 3 replicas: 12 / 5 rounded down or up.
            counts = replicas(grown)
            assert sorted(counts.values()) in ([2, 2, 2, 3, 3], [2, 2, 3, 3, 2]), counts
            assert counts["n5"] in (2, 3)
            assert client.epoch == grown["epoch"]  # the client follows the map
            n5_groups = await health_groups(http, f"http://{address}")
            assert len(n5_groups) == counts["n5"]

            removed = await client.remove_node("n5")
            assert removed["changed"] is True
            shrunk = await settled(client)
            assert "n5" not in {n["id"] for n in shrunk["nodes"]}
            assert sorted(replicas(shrunk).values()) == [3, 3, 3, 3]

            # n5, gone from the map, is told so: a caller that still calls it is relayed
            # by the map the others hold.
            async def n5_knows() -> bool:
                async with http.get(f"http://{address}/v1/cluster") as r:
                    return bool((await r.json())["epoch"] == shrunk["epoch"])

            await wait_until(n5_knows, timeout_s=10, what="n5 holding the map without it")
            async with http.post(
                f"http://{address}/v1/queues/{queue}/messages", data=b"via n5"
            ) as r:
                assert r.status == 201, await r.text()
                pushed.append((await r.json())["id"])
        finally:
            stop.set()
            await asyncio.gather(*load)
        while batch := await client.pop_many(queue, 100):
            popped += [m.id for m in batch]
    assert len(popped) == len(set(popped)), "a message came back twice"
    assert set(popped) == set(pushed), (len(pushed), len(popped))


async def test_a_dead_node_is_replaced_by_a_new_host_and_its_data_rebuilt(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession
) -> None:
    cluster = make_cluster(nodes=4, replication=3, repair_interval_s=1.0)
    queue = unique("replace")
    async with Client.from_config(cluster.config_path) as client:
        await client.create_queue(queue)
        pushed = await client.push_many(queue, [b"x"] * 400)
        cluster.kill("n2")  # its host is gone for good, disk and all
        cluster.release_port("n2")
        address = cluster.joining("n6")
        cluster.start_node("n6")
        result = await client.replace_node("n2", "n6", address)
        assert result["changed"] is True
        m = await settled(client)
        ids = {n["id"] for n in m["nodes"]}
        assert "n2" not in ids and "n6" in ids
        assert sorted(replicas(m).values()) == [3, 3, 3, 3]
        # n6 took n2's place in each group's order: it prefers to lead group n2.
        assert next(g for g in m["groups"] if g["id"] == "n2")["members"][0] == "n6"

        async def n6_leads_n2() -> bool:
            groups = await health_groups(http, f"http://{address}")
            return groups.get("n2", {}).get("role") == "leader"

        await wait_until(n6_leads_n2, timeout_s=30, what="n6 leading group n2")
        # n2's old address is never called again: a listener there hears nothing while
        # the cluster serves pushes and pops through every node.
        old = cluster.config.node("n2")
        calls: list[int] = []

        async def heard(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            calls.append(1)
            writer.close()

        server = await asyncio.start_server(heard, old.host, old.port)
        try:
            more = await client.push_many(queue, [b"y"] * 100)
            for node in ("n1", "n3", "n4"):
                url = cluster.url(node) + f"/v1/queues/{queue}/messages"
                async with http.post(url, data=b"plain") as r:
                    assert r.status == 201
                    more.append((await r.json())["id"])
            got: list[str] = []
            while batch := await client.pop_many(queue, 100):
                got += [m.id for m in batch]
            await asyncio.sleep(2.5)  # heartbeats, repair sweeps (each second here)
        finally:
            server.close()
        assert calls == [], "a node or the client called the replaced node's address"
    assert len(got) == len(set(got))
    assert set(got) == set(pushed) | set(more)


async def test_a_groups_layout_spreads_replicas_and_leaderships_evenly_as_nodes_join(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession
) -> None:
    """With `groups: 12` the keys live in 12 groups whatever the nodes: grown from 4 nodes
    to 6, each node holds 12 x 3 / 6 = 6 replicas and leads 12 / 6 = 2 groups."""
    cluster = make_cluster(nodes=4, replication=3, groups=12)
    queue = unique("groups")
    async with Client.from_config(cluster.config_path) as client:
        m = await client.cluster_map()
        assert [g["id"] for g in m["groups"]] == [f"g{i}" for i in range(12)]
        await client.create_queue(queue)
        pushed = await client.push_many(queue, [b"x"] * 600)
        addresses = {n: cluster.joining(n) for n in ("n5", "n6")}
        for node in addresses:
            cluster.start_node(node)
        # Two admins at once: each change is made from the map it read, the home group
        # commits them one after the other (a change made from a replaced map is made
        # again from the new one).
        before = m["epoch"]
        results = await asyncio.gather(
            *(client.add_node(node, address) for node, address in addresses.items())
        )
        assert sorted(r["epoch"] for r in results) == [before + 1, before + 2]
        grown = await settled(client)
        assert set(replicas(grown).values()) == {6}, replicas(grown)
        preferred = [g["members"][0] for g in grown["groups"]]
        assert sorted(preferred.count(n) for n in cluster.nodes) == [2] * 6, preferred

        async def leaders_balanced() -> bool:
            led: dict[str, int] = {}
            for node in cluster.nodes:
                for g in (await health_groups(http, cluster.url(node))).values():
                    if g["role"] == "leader":
                        led[node] = led.get(node, 0) + 1
            return sorted(led.values()) == [2] * 6

        await wait_until(leaders_balanced, timeout_s=30, what="each node leading 2 groups")
        # The groups the new nodes lead run their timers there: leases that run out
        # are handed out again.
        leased: list[str] = []
        while batch := await client.receive(queue, max_messages=100, visibility_s=1.0):
            leased += [m.id for m in batch]
        assert sorted(leased) == sorted(pushed)
        await asyncio.sleep(2.5)
        got: list[str] = []
        while batch := await client.pop_many(queue, 100):
            got += [m.id for m in batch]
    assert sorted(got) == sorted(pushed)


async def test_leases_delays_dedup_fifo_order_ties_and_subscriptions_move_with_their_groups(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    """A dead node replaced by a new host: each of its groups is rebuilt from the others,
    whole. A lease taken before is acked after, a delayed message comes out when due, a
    dedup id still deduplicates, FIFO groups keep their order, a tie still cancels, a
    topic still reaches its subscribed queue."""
    cluster = make_cluster(nodes=4, replication=3)
    q, fifo, topic, sub = unique("mv"), unique("mvf"), unique("mvt"), unique("mvs")
    async with Client.from_config(cluster.config_path) as client:
        await client.create_queue(q, visibility_timeout_s=60)
        await client.create_queue(fifo, fifo=True)
        await client.create_topic(topic)
        await client.subscribe(topic, sub)
        await client.push_many(q, [b"leased"] * 20)
        leased = await client.receive(q, max_messages=20)
        assert len(leased) == 20
        delayed = await client.push(q, b"later", delay_s=6)
        deduped = await client.push(q, b"once", dedup_id="the-one")
        for i in range(30):
            await client.push(fifo, f"{i % 3}:{i}".encode(), group=f"g{i % 3}")
        token, copies = await client.push_tied([q, sub], b"tied")

        cluster.kill("n2")  # its host is gone for good
        cluster.release_port("n2")
        address = cluster.joining("n6")
        cluster.start_node("n6")
        await client.replace_node("n2", "n6", address)
        await settled(client)

        acked = await client.ack(q, [m.receipt for m in leased])
        assert acked.done == 20 and acked.ok, acked
        assert await client.push(q, b"once", dedup_id="the-one") == deduped  # a duplicate
        assert await client.cancel_tied(token) is None  # no copy delivered yet: cancelled
        await client.publish(topic, b"published")
        assert [m.body for m in await client.pop_many(sub, 10)] == [b"published"]
        seen: dict[str, list[int]] = {}
        while batch := await client.receive(fifo, max_messages=10):
            for m in batch:
                g, i = m.body.decode().split(":")
                seen.setdefault(g, []).append(int(i))
            await client.ack(fifo, [m.receipt for m in batch])
        assert seen == {f"{g}": list(range(g, 30, 3)) for g in range(3)}, seen
        got: dict[str, bytes] = {}

        async def all_out() -> bool:
            for m in await client.pop_many(q, 10):
                got[m.id] = m.body
            return delayed in got

        await wait_until(all_out, timeout_s=20, what="the delayed message")
        assert got == {deduped: b"once", delayed: b"later"}, got
        assert copies[q] not in got
