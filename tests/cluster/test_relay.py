"""Plain HTTP calls through any node of a replicated cluster, whatever it leads.

A caller that names no replica group (curl, a script, Locust's HTTP users) is never
answered 421: a node that leads none of its groups (restarted, before its group is handed
back; an election; its group's leader paused) relays the call to a leader, and the reply
says which node served it (`zdmq-served-by`). Each test records every plain call's status
and checks afterwards, through the client, that every acknowledged push is there.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.helpers import unique, wait_until
from zdmq import Client
from zdmq.local import LocalCluster
from zdmq.server.relay import SERVED_BY_HEADER


@dataclass
class Plain:
    """Plain calls (no `zdmq-group`) to one node, as curl makes them, with what came back."""

    http: aiohttp.ClientSession
    url: str
    queue: str
    statuses: Counter[int] = field(default_factory=Counter)
    served_by: Counter[str] = field(default_factory=Counter)
    pushed: set[str] = field(default_factory=set)
    popped: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        async with self.http.request(method, self.url + path, **kw) as r:
            body = await r.read()
            self.statuses[r.status] += 1
            if SERVED_BY_HEADER in r.headers:
                self.served_by[r.headers[SERVED_BY_HEADER]] += 1
            if r.status >= 300:
                self.failures.append(f"{method} {path}: {r.status} {body[:200]!r}")
                return None
            return await r.json() if body else None

    async def push(self, n: int) -> None:
        got = await self._call(
            "POST",
            f"/v1/queues/{self.queue}/messages",
            data=b"m%d" % n,
            headers={"Content-Type": "text/plain"},
        )
        if got is not None:
            self.pushed.add(got["id"])

    async def pop(self) -> None:
        got = await self._call("POST", f"/v1/queues/{self.queue}/pop?max=2")
        if got is not None:
            self.popped += [m["id"] for m in got["messages"]]

    async def create(self) -> None:
        await self._call("PUT", f"/v1/queues/{unique('relay')}")

    async def round(self, n: int) -> None:
        await self.push(n)
        if n % 3 == 0:
            await self.pop()
        if n % 10 == 0:
            await self.create()


async def health(http: aiohttp.ClientSession, cluster: LocalCluster, node: str) -> dict[str, Any]:
    async with http.get(cluster.config.node(node).url + "/v1/health") as r:
        return dict(await r.json())


async def leads(http: aiohttp.ClientSession, cluster: LocalCluster, node: str, group: str) -> bool:
    try:
        return bool((await health(http, cluster, node))["groups"][group]["role"] == "leader")
    except (aiohttp.ClientError, KeyError):
        return False


async def leader_seen(
    http: aiohttp.ClientSession, cluster: LocalCluster, by: str, group: str
) -> str | None:
    try:
        leader = (await health(http, cluster, by))["groups"][group]["leader"]
    except (aiohttp.ClientError, KeyError):
        return None
    return str(leader) if leader else None


async def replicated(make_cluster: Callable[..., LocalCluster], http: Any) -> LocalCluster:
    cluster = make_cluster(nodes=4, replication=3)
    for n in cluster.nodes:
        await wait_until(lambda n=n: leads(http, cluster, n, n), timeout_s=30, what=f"{n} leads")
    return cluster


async def restart_leading_nothing(
    cluster: LocalCluster, http: aiohttp.ClientSession, node: str
) -> str:
    """kill -9 of `node`, its group led elsewhere, then `node` started again and ready:
    it leads none of its groups until its own is handed back to it. Returns the node
    that took `node`'s group over."""
    cluster.kill(node)
    other = next(n for n in cluster.nodes if n != node)
    took: list[str] = []

    async def moved() -> bool:
        leader = await leader_seen(http, cluster, other, node)
        took[:] = [leader] if leader not in (None, node) else []
        return bool(took)

    await wait_until(moved, timeout_s=30, what=f"group {node} led elsewhere")
    proc = cluster.nodes[node]
    proc.start()
    proc.wait_ready(60)
    return took[0]


async def drained(cluster: LocalCluster, queue: str) -> list[str]:
    got: list[str] = []
    async with Client.from_config(cluster.config_path) as c:
        while batch := await c.pop_many(queue, 100):
            got += [m.id for m in batch]
    return got


async def test_a_restarted_node_serves_plain_calls_before_and_during_the_hand_back(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession
) -> None:
    cluster = await replicated(make_cluster, http)
    queue = unique("relay")
    async with http.put(cluster.config.node("n1").url + f"/v1/queues/{queue}") as r:
        assert r.status == 201
    await restart_leading_nothing(cluster, http, "n1")
    plain = Plain(http, cluster.config.node("n1").url, queue)
    # Calls from the moment n1 is ready until a while after its group came back to it.
    n = 0
    handed_back_at: float | None = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        await plain.round(n)
        n += 1
        if handed_back_at is None and await leads(http, cluster, "n1", "n1"):
            handed_back_at = time.monotonic()
        if handed_back_at is not None and time.monotonic() - handed_back_at > 1.0 and n >= 50:
            break
    assert handed_back_at is not None, "n1 never led its group again"
    assert plain.failures == [], plain.failures[:5]
    assert 421 not in plain.statuses
    # The window was real: calls went through n1 while it led nothing.
    assert sum(c for node, c in plain.served_by.items() if node != "n1") > 0, plain.served_by
    left = await drained(cluster, queue)
    assert len(plain.popped) == len(set(plain.popped))
    assert plain.pushed <= set(plain.popped) | set(left)  # nothing acknowledged lost


async def test_plain_calls_through_a_node_leading_nothing_survive_an_election(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession
) -> None:
    cluster = await replicated(make_cluster, http)
    queue = unique("relay")
    async with http.put(cluster.config.node("n3").url + f"/v1/queues/{queue}") as r:
        assert r.status == 201
    # Group n1 = {n1, n2, n3} is led by n2 or n3 now: kill that leader too (its port
    # closed, so calls to it are refused at once), and the group elects while n1 leads
    # nothing.
    dead = await restart_leading_nothing(cluster, http, "n1")
    cluster.kill(dead)
    cluster.release_port(dead)
    plain = Plain(http, cluster.config.node("n1").url, queue)
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < 4.0 or n < 30:
        await asyncio.wait_for(plain.round(n), 40)
        n += 1
    assert plain.failures == [], plain.failures[:5]
    assert 421 not in plain.statuses
    assert dead not in plain.served_by
    left = await drained(cluster, queue)
    assert len(plain.popped) == len(set(plain.popped))
    assert plain.pushed <= set(plain.popped) | set(left)


async def test_a_node_leading_nothing_passes_over_a_paused_leader(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession
) -> None:
    cluster = await replicated(make_cluster, http)
    queue = unique("relay")
    async with http.put(cluster.config.node("n4").url + f"/v1/queues/{queue}") as r:
        assert r.status == 201
    await restart_leading_nothing(cluster, http, "n1")
    # n1's groups are n1 = {n1, n2, n3}, n3 = {n3, n4, n1} and n4 = {n4, n1, n2}. Pause
    # n3: once its silence shows (its group elects another leader), n1 relays elsewhere.
    cluster.pause("n3")
    try:

        async def n3_replaced() -> bool:
            return (await leader_seen(http, cluster, "n1", "n3")) not in (None, "n3")

        await wait_until(n3_replaced, timeout_s=30, what="group n3 led by another")
        plain = Plain(http, cluster.config.node("n1").url, queue)
        for n in range(40):
            await asyncio.wait_for(plain.round(n), 40)
    finally:
        cluster.resume("n3")
    assert plain.failures == [], plain.failures[:5]
    assert 421 not in plain.statuses
    assert "n3" not in plain.served_by
    left = await drained(cluster, queue)
    assert len(plain.popped) == len(set(plain.popped))
    assert plain.pushed <= set(plain.popped) | set(left)


async def test_a_relayed_call_is_checked_against_the_callers_own_token(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession
) -> None:
    admin, writer = "admin-token-0123456789abcdef", "writer-token-0123456789abcdef"
    tokens = [
        {"name": "admin", "token": admin, "rights": {"": ["admin"]}},
        {"name": "writer", "token": writer, "rights": {"jobs-": ["read", "write"]}},
    ]
    cluster = make_cluster(nodes=4, replication=3, auth={"client_tokens": tokens})
    for n in cluster.nodes:
        await wait_until(lambda n=n: leads(http, cluster, n, n), timeout_s=30, what=f"{n} leads")
    url = cluster.config.node("n1").url
    as_admin = {"Authorization": f"Bearer {admin}"}
    as_writer = {"Authorization": f"Bearer {writer}"}
    for q in ("jobs-a", "other-a"):
        async with http.put(f"{url}/v1/queues/{q}", headers=as_admin) as r:
            assert r.status == 201
    await restart_leading_nothing(cluster, http, "n1")
    served: Counter[str] = Counter()
    deadline = time.monotonic() + 60
    while not await leads(http, cluster, "n1", "n1") and time.monotonic() < deadline:
        async with http.post(f"{url}/v1/queues/jobs-a/messages", data=b"x", headers=as_writer) as r:
            assert r.status == 201, await r.text()
            served[r.headers.get(SERVED_BY_HEADER, "n1")] += 1
        async with http.post(
            f"{url}/v1/queues/other-a/messages", data=b"x", headers=as_writer
        ) as r:
            assert r.status == 403, await r.text()  # no right there, relayed or not
        async with http.get(f"{url}/v1/queues", headers=as_writer) as r:
            assert r.status == 200
            assert (await r.json())["queues"] == ["jobs-a"]  # the leader filtered by the token
            served[r.headers.get(SERVED_BY_HEADER, "n1")] += 1
        async with http.post(f"{url}/v1/queues/jobs-a/messages", data=b"x") as r:
            assert r.status == 401
    assert sum(c for n, c in served.items() if n != "n1") > 0, served


async def test_a_node_stopped_with_sigterm_hands_its_group_over_and_no_plain_call_fails(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession
) -> None:
    cluster = await replicated(make_cluster, http)
    queue = unique("relay")
    async with http.put(cluster.config.node("n2").url + f"/v1/queues/{queue}") as r:
        assert r.status == 201
    others = [Plain(http, cluster.config.node(n).url, queue) for n in ("n2", "n3", "n4")]
    stop = asyncio.Event()

    async def load(plain: Plain) -> None:
        n = 0
        while not stop.is_set():
            await plain.round(n)
            n += 1

    loads = [asyncio.create_task(load(p)) for p in others]
    try:
        await asyncio.to_thread(cluster.stop_node, "n1")  # SIGTERM: a graceful stop
        assert "hands group n1 to" in cluster.nodes["n1"].log_path.read_text()
        proc = cluster.nodes["n1"]
        proc.start()
        await asyncio.to_thread(proc.wait_ready, 60)
        await wait_until(lambda: leads(http, cluster, "n1", "n1"), timeout_s=30, what="n1 leads")
    finally:
        stop.set()
        await asyncio.gather(*loads)
    for plain in others:
        assert plain.failures == [], plain.failures[:5]
    pushed = set().union(*(p.pushed for p in others))
    popped = [m for p in others for m in p.popped]
    left = await drained(cluster, queue)
    assert len(popped) == len(set(popped))
    assert pushed <= set(popped) | set(left)
