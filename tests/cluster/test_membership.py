"""A replica group's members change while it serves (docs/design.md §19): real node
processes on loopback, the node-to-node membership routes driven step by step as a move
drives them (a learner added, caught up, promoted, the member it replaces removed)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from tests.helpers import json_bytes, node_signed, unique, wait_until
from zdmq import Client
from zdmq.errors import from_wire
from zdmq.local import LocalCluster
from zdmq.raft.core import Conf
from zdmq.server.moves import Call, MoveProgress, run_move

pytestmark = pytest.mark.main_pass_only  # it sets its own layout: 4 nodes, three copies


async def internal(
    http: aiohttp.ClientSession,
    cluster: LocalCluster,
    node: str,
    method: str,
    path: str,
    body: Any = None,
) -> tuple[int, Any]:
    """A node-signed call (as n1's process would make it) to `node`."""
    data = json_bytes(body) if body is not None else b""
    headers = node_signed(cluster.config, "n1", method, path, data)
    headers["Content-Type"] = "application/json"
    async with http.request(
        method, cluster.config.node(node).url + path, data=data, headers=headers
    ) as r:
        return r.status, (await r.json() if r.content_type == "application/json" else None)


async def change(
    http: aiohttp.ClientSession, cluster: LocalCluster, group: str, kind: str, node: str
) -> dict[str, Any]:
    status, body = await internal(
        http,
        cluster,
        group,  # the group's preferred leader leads it here
        "POST",
        f"/v1/internal/groups/{group}/changes",
        {"change": kind, "node": node},
    )
    assert status == 200, body
    assert body["committed"] is True
    return dict(body["conf"])


async def test_a_replica_moves_to_another_node_under_pushes_and_nothing_is_lost(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession
) -> None:
    cluster = make_cluster(nodes=4, replication=3)
    queue = unique("move")
    pushed: list[str] = []
    stop = asyncio.Event()
    async with Client.from_config(cluster.config_path) as client:
        await client.create_queue(queue)
        pushed += await client.push_many(queue, [b"before"] * 300)

        async def pushing() -> None:
            while not stop.is_set():
                pushed.extend(await client.push_many(queue, [b"during"] * 20))

        load = asyncio.create_task(pushing())
        try:
            # n4 starts keeping group n1 as a learner, caught up by n1.
            conf = {"voters": ["n1", "n2", "n3"], "learners": ["n4"]}
            status, _ = await internal(
                http, cluster, "n4", "PUT", "/v1/internal/groups/n1", {"conf": conf}
            )
            assert status == 201
            assert await change(http, cluster, "n1", "add_learner", "n4") == conf

            # The leader promotes n4 once n4's log reaches the commit index, which the
            # pushes keep moving: until then it refuses, saying so.
            promoted: dict[str, Any] = {}

            async def promote() -> bool:
                status, body = await internal(
                    http,
                    cluster,
                    "n1",
                    "POST",
                    "/v1/internal/groups/n1/changes",
                    {"change": "promote", "node": "n4"},
                )
                if status == 400:
                    assert "not caught up" in body["error"]["message"], body
                    return False
                assert status == 200 and body["committed"] is True, body
                promoted.update(body["conf"])
                return True

            await wait_until(promote, timeout_s=30, what="n4 caught up and promoted in group n1")
            assert promoted == {"voters": ["n1", "n2", "n3", "n4"], "learners": []}
            # Another change while none is under way is taken; a wrong one is refused.
            status, body = await internal(
                http,
                cluster,
                "n1",
                "POST",
                "/v1/internal/groups/n1/changes",
                {"change": "promote", "node": "n4"},
            )
            assert status == 400 and "not a learner" in body["error"]["message"]
            assert await change(http, cluster, "n1", "remove", "n3") == {
                "voters": ["n1", "n2", "n4"],
                "learners": [],
            }
            status, _ = await internal(http, cluster, "n3", "DELETE", "/v1/internal/groups/n1")
            assert status == 204
        finally:
            stop.set()
            await load
        status, _ = await internal(http, cluster, "n3", "GET", "/v1/internal/groups/n1")
        assert status == 421  # n3 keeps group n1 no more: not its leader
        assert not (cluster.config.node_data_dir("n3") / "group-n1.sqlite3").exists()

        async def settled_on_n4() -> bool:
            status, view = await internal(http, cluster, "n4", "GET", "/v1/internal/groups/n1")
            assert status == 200 and view["conf"]["voters"] == ["n1", "n2", "n4"]
            return bool(view["committed"])  # once it hears the commit index

        await wait_until(settled_on_n4, timeout_s=10, what="n4 saw the change committed")
        # n4 now votes: with n1 killed, n2 and n4 elect a leader of group n1 and commit.
        cluster.kill("n1")
        cluster.release_port("n1")  # calls to it are refused: they surely did not run

        async def led_without_n1() -> bool:
            _, view = await internal(http, cluster, "n4", "GET", "/v1/internal/groups/n1")
            return view["leader"] in ("n2", "n4")

        await wait_until(led_without_n1, timeout_s=30, what="group n1 led by n2 or n4")
        pushed += await client.push_many(queue, [b"after"] * 100)
        got: list[str] = []
        while batch := await client.pop_many(queue, 100):
            got += [m.id for m in batch]
    assert len(got) == len(set(got))
    assert set(got) == set(pushed), (len(pushed), len(got))


def signed_calls(http: aiohttp.ClientSession, cluster: LocalCluster) -> Call:
    """`moves.Call` over node-signed HTTP from the test: a group's leader is found by
    trying its nodes, following 421s."""

    async def once(node: str, method: str, path: str, body: Any) -> tuple[int, Any]:
        return await internal(http, cluster, node, method, path, body)

    async def call(target: str | tuple[str, str], method: str, path: str, body: Any) -> Any:
        if isinstance(target, str):
            status, reply = await once(target, method, path, body)
        else:
            order = list(cluster.nodes)
            status, reply = 0, None
            for node in order * 3:
                if not cluster.nodes[node].running:
                    continue
                status, reply = await once(node, method, path, body)
                if status == 421:
                    continue  # not its leader, or not a member
                if status == 200 and method == "GET" and reply["leader"] not in (None, node):
                    status, reply = await once(reply["leader"], method, path, body)
                break
        if status >= 400:
            raise from_wire(status, reply)
        return reply

    return call


async def test_a_move_cut_short_is_finished_by_running_it_again_and_a_leader_hands_over(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession
) -> None:
    cluster = make_cluster(nodes=4, replication=3)
    call = signed_calls(http, cluster)
    queue = unique("move")
    async with Client.from_config(cluster.config_path) as client:
        await client.create_queue(queue)
        pushed = await client.push_many(queue, [b"x"] * 400)
        # Group n3 is on n3, n4, n1 and led by n3: its replica moves from n3 to n2.
        progress = MoveProgress("n3", "n2", "n3")
        cut = asyncio.create_task(run_move(call, "n3", "n2", "n3", progress=progress))
        await wait_until(
            lambda: asyncio.sleep(0, progress.step != "starting" and "n2" in progress.step),
            timeout_s=30,
            what="the move under way",
        )
        cut.cancel()  # its runner dies mid-way
        with contextlib.suppress(asyncio.CancelledError):
            await cut
        pushed += await client.push_many(queue, [b"y"] * 100)
        conf = await run_move(call, "n3", "n2", "n3")  # run again: it goes on
        assert conf == Conf(frozenset({"n2", "n4", "n1"}))
        status, _ = await internal(http, cluster, "n3", "GET", "/v1/internal/groups/n3")
        assert status == 421
        # The group's lead was handed over before n3 left it.
        status, view = await internal(http, cluster, "n2", "GET", "/v1/internal/groups/n3")
        assert status == 200 and view["leader"] in ("n1", "n2", "n4")
        # Running a finished move again changes nothing.
        assert await run_move(call, "n3", "n2", "n3") == conf
        pushed += await client.push_many(queue, [b"z"] * 100)
        got: list[str] = []
        while batch := await client.pop_many(queue, 100):
            got += [m.id for m in batch]
    assert len(got) == len(set(got)) and set(got) == set(pushed)
