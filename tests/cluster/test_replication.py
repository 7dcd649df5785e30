"""Replica groups under faults: 4 real nodes, `replication: 3`, kill -9, SIGSTOP, a lost disk.

Every test records what the cluster acknowledged and checks, after healing and draining,
that nothing acknowledged is lost, nothing unpushed appears, and (pop mode) nothing is
handed out twice.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from tests.cluster.support import placement_of
from tests.helpers import node_signed, unique, wait_until
from zdmq import Client, NotLeader, ZdmqError
from zdmq.local import LocalCluster
from zdmq.models import dedup_message_id

_SSL: ssl.SSLContext | None = None


@pytest.fixture(autouse=True)
def _trust_the_session_ca(client_ssl: ssl.SSLContext | None) -> None:
    """Raw HTTP calls below trust the session's CA when the suite runs over TLS."""
    global _SSL
    _SSL = client_ssl


def session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=_SSL or True))


async def replicated(
    make_cluster: Callable[..., LocalCluster], seen_by: str, **kw: Any
) -> LocalCluster:
    """A 4-node cluster with replication 3 (and `kw` in its cluster.yaml), once `seen_by`
    sees every group led by its own node."""
    cluster = make_cluster(nodes=4, replication=3, **kw)
    await wait_until(lambda: leaders_settled(cluster, [seen_by]), timeout_s=15, what="leaders")
    return cluster


async def health(cluster: LocalCluster, node: str) -> dict[str, Any]:
    url = cluster.config.node(node).url + "/v1/health"
    async with session() as s, s.get(url) as r:
        return dict(await r.json())


async def leaders_settled(cluster: LocalCluster, nodes: list[str]) -> bool:
    """Every group is led by its own node (the preferred leader), as `nodes` see it."""
    for n in nodes:
        try:
            groups = (await health(cluster, n))["groups"]
        except aiohttp.ClientError:
            return False
        if any(g["leader"] != gid for gid, g in groups.items()):
            return False
    return True


async def drain(c: Client, queue: str) -> list[str]:
    got: list[str] = []
    while batch := await c.pop_many(queue, 100):
        got += [m.id for m in batch]
    return got


async def drain_acking(c: Client, queue: str, expect: int, within_s: float = 30) -> set[str]:
    """Receives and acks until `expect` distinct messages came or `within_s` passed; a
    failed call is tried again (a receive's leases run out, so nothing is lost by it)."""
    got: set[str] = set()
    deadline = time.monotonic() + within_s
    while len(got) < expect and time.monotonic() < deadline:
        try:
            batch = await c.receive(queue, 100, visibility_s=30)
            if batch:
                await c.ack(queue, [m.receipt for m in batch])
        except ZdmqError:
            await asyncio.sleep(0.1)
            continue
        got |= {m.id for m in batch}
    return got


class Producers:
    """`n` producers pushing one message at a time until stopped; every acknowledged id
    is recorded with the time of its acknowledgement."""

    def __init__(self, client: Client, queue: str, n: int) -> None:
        self.client, self.queue = client, queue
        self.acked: dict[str, float] = {}
        self.failed = 0
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._run(k)) for k in range(n)]

    async def _run(self, k: int) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            try:
                mid = await self.client.push(self.queue, f"{k}/{i}".encode())
            except ZdmqError:
                self.failed += 1
                await asyncio.sleep(0.05)
                continue
            self.acked[mid] = time.monotonic()

    def acked_between(self, t0: float, t1: float) -> int:
        return sum(1 for t in self.acked.values() if t0 <= t < t1)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


@pytest.mark.main_pass_only
async def test_pushes_keep_being_acknowledged_while_a_node_is_killed_and_none_is_lost(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = await replicated(make_cluster, "n1")
    q = unique("kill")
    async with Client.from_config(cluster.config_path, timeout_s=3) as c:
        await c.create_queue(q)
        producers = Producers(c, q, 4)
        await asyncio.sleep(1.0)
        killed_at = time.monotonic()
        cluster.kill("n2")  # the leader of group n2, and a follower of n1 and n4
        await asyncio.sleep(4.0)
        down_until = time.monotonic()
        await asyncio.to_thread(cluster.start_node, "n2")
        await asyncio.sleep(1.0)
        await producers.stop()
        # While n2 was down, pushes went on: every id's group had a majority left.
        assert producers.acked_between(killed_at + 2.5, down_until) > 20
        group_n2 = [m for m in producers.acked if placement_of(cluster).owner(m) == "n2"]
        assert group_n2, "no push landed on the killed node's group"
        got = await drain(c, q)
    assert len(got) == len(set(got)), "a message was handed out twice"
    assert set(got) == set(producers.acked)  # nothing lost, nothing unexpected


async def test_a_paused_leader_is_replaced_and_its_group_takes_writes_within_seconds(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = await replicated(make_cluster, "n2")
    q = unique("pause")
    placement = placement_of(cluster)
    dedup = next(
        d for i in range(1000) if placement.owner(dedup_message_id(q, d := f"d{i}")) == "n1"
    )
    async with Client.from_config(cluster.config_path, timeout_s=2) as c:
        await c.create_queue(q)
        cluster.pause("n1")  # leads group n1 (and the metadata of some queues)
        try:
            t0 = time.monotonic()
            mid = await c.push(q, b"while n1 sleeps", dedup_id=dedup)
            took = time.monotonic() - t0
        finally:
            cluster.resume("n1")
        assert took < 6.0
        # n1 comes back as a follower of its group, catches up, and leads it again.
        await wait_until(lambda: leaders_settled(cluster, ["n1", "n3"]), timeout_s=20, what="n1")
        got = await c.pop_many(q, 10)
    assert [m.id for m in got] == [mid]


@pytest.mark.main_pass_only
async def test_a_node_that_lost_its_disk_rejoins_with_every_message_it_should_hold(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = await replicated(make_cluster, "n1")
    q = unique("disk")
    async with Client.from_config(cluster.config_path, timeout_s=3) as c:
        await c.create_queue(q)
        acked: list[str] = []
        for _ in range(12):
            acked += await c.push_many(q, [os.urandom(64) for _ in range(50)])
        cluster.kill("n3")
        shutil.rmtree(cluster.config.node_data_dir("n3"))
        await asyncio.to_thread(cluster.start_node, "n3")
        await wait_until(lambda: leaders_settled(cluster, ["n3"]), timeout_s=30, what="n3 back")

        # n3 holds copies again: with n1 down too, groups n1 and n4 (and n2) have their
        # majority only with n3 in it.
        cluster.kill("n1")
        got = await drain_acking(c, q, len(acked))
        await asyncio.to_thread(cluster.start_node, "n1")
    assert got == set(acked)


@pytest.mark.main_pass_only
async def test_pop_hands_no_message_out_twice_across_a_leader_kill(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = await replicated(make_cluster, "n1")
    q = unique("popkill")
    async with Client.from_config(cluster.config_path, timeout_s=3) as c:
        await c.create_queue(q)
        acked: list[str] = []
        for _ in range(8):
            acked += await c.push_many(q, [os.urandom(32) for _ in range(100)])
        popped: list[str] = []
        failed_pops = 0
        poppers, per_pop = 2, 5
        kill_at = len(acked) // 4  # popped when n2, a group's leader, is killed
        reached = asyncio.Event()
        popped_at_kill = -1

        async def popper() -> None:
            nonlocal failed_pops
            while True:
                try:
                    batch = await c.pop_many(q, per_pop)
                except ZdmqError:
                    failed_pops += 1
                    continue
                if not batch:
                    return
                popped.extend(m.id for m in batch)
                if len(popped) >= kill_at:
                    reached.set()

        async def kill_when_a_quarter_is_popped() -> None:
            nonlocal popped_at_kill
            await asyncio.wait_for(reached.wait(), timeout=30)
            popped_at_kill = len(popped)  # and killed with no await between: no pop lands
            cluster.kill("n2")

        await asyncio.gather(*(popper() for _ in range(poppers)), kill_when_a_quarter_is_popped())
        # The kill landed while pops ran: more completed after it than the pops that
        # were in flight at it could hold.
        assert popped_at_kill >= kill_at
        assert len(popped) - popped_at_kill > poppers * per_pop, (popped_at_kill, len(popped))
        await asyncio.to_thread(cluster.start_node, "n2")
        popped += await drain(c, q)
    assert len(popped) == len(set(popped)), "a message was handed out twice"
    assert set(popped) <= set(acked)
    # Only a pop that failed may have taken messages nobody got.
    missing = set(acked) - set(popped)
    assert len(missing) <= 5 * failed_pops


async def test_a_member_that_does_not_lead_a_group_answers_421_naming_its_leader(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = await replicated(make_cluster, "n2")
    target = "/v1/internal/owned-queues"
    headers = {**node_signed(cluster.config, "n1", "GET", target), "zdmq-group": "n1"}
    url = cluster.config.node("n2").url + target
    async with session() as s, s.get(url, headers=headers) as r:
        assert r.status == 421
        error = (await r.json())["error"]
    assert (error["code"], error["group"], error["leader"]) == ("not_leader", "n1", "n1")
    # The client takes it as a typed, retriable error naming the leader.
    err = NotLeader("x", group="n1", leader="n1")
    assert err.retriable and err.to_wire()["error"]["leader"] == "n1"


@pytest.mark.parametrize("group", ["n9", "../n1"])
async def test_a_call_for_a_group_that_does_not_exist_is_refused(
    make_cluster: Callable[..., LocalCluster], group: str
) -> None:
    cluster = await replicated(make_cluster, "n1")
    async with session() as s:
        url = cluster.config.node("n1").url + "/v1/queues"
        async with s.get(url, headers={"zdmq-group": group}) as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] == "bad_request"


# -- compaction and snapshots ------------------------------------------------------------------
# Groups n1 = {n1, n2, n3}, n2 = {n2, n3, n4}, n3 = {n3, n4, n1}, n4 = {n4, n1, n2}.
LOG_ENTRIES = 20  # each member compacts at 40 applied entries past the last compaction


async def caught_up(cluster: LocalCluster, node: str) -> bool:
    """`node` holds, in every group it is in, what that group's leader applied."""
    try:
        mine = (await health(cluster, node))["groups"]
        for gid, g in mine.items():
            lead = (await health(cluster, gid))["groups"][gid]
            if g["applied"] < lead["applied"] or lead["role"] != "leader":
                return False
    except (aiohttp.ClientError, KeyError):
        return False
    return True


async def push_some(c: Client, q: str, n: int, size: int) -> list[str]:
    """`n` messages pushed in one call with dedup ids, so a call that failed (a group
    changing leader: the outcome may be unknown) is sent again and stores them once."""
    dedup = [unique("d") for _ in range(n)]
    bodies = [os.urandom(size) for _ in range(n)]
    for _ in range(10):
        try:
            return await c.push_many(q, bodies, dedup_ids=dedup)
        except ZdmqError:
            await asyncio.sleep(0.2)
    raise AssertionError("no leader took the push for 2 s")


async def counts(cluster: LocalCluster, node: str, group: str, peer: str) -> bool:
    """`node` counts `peer`'s votes and acknowledgements in `group` (not on probation)."""
    try:
        return peer not in (await health(cluster, node))["groups"][group]["on_probation"]
    except (aiohttp.ClientError, KeyError):
        return False


@pytest.mark.parametrize("lose_disk", [False, True], ids=["restart", "new-disk"])
async def test_a_member_behind_the_compacted_log_catches_up_from_a_snapshot(
    make_cluster: Callable[..., LocalCluster], lose_disk: bool
) -> None:
    cluster = await replicated(make_cluster, "n1", replication_log_entries=LOG_ENTRIES)
    q = unique("snap")
    async with Client.from_config(cluster.config_path, timeout_s=3) as c:
        await c.create_queue(q)
        acked: list[str] = []
        acked += await c.push_many(q, [os.urandom(64) for _ in range(20)])
        held = {g: v["log_last"] for g, v in (await health(cluster, "n3"))["groups"].items()}
        # kill -9: a graceful stop would hand n3's group over first, and n3 could take
        # the new leader's first entry on its way out, past what `held` says it holds.
        cluster.kill("n3")
        cluster.release_port("n3")
        if lose_disk:
            shutil.rmtree(cluster.config.node_data_dir("n3"))

        async def compacted() -> bool:
            """Every group n3 is in compacted past what n3 holds (as n1 and n4 see them)."""
            starts = {
                g: v["log_start"]
                for n in ("n1", "n4")
                for g, v in (await health(cluster, n))["groups"].items()
                if g in held
            }
            return all(starts[g] > held[g] for g in held)

        for _ in range(50):
            for _ in range(20):
                acked += await push_some(c, q, 5, 64)
            if await compacted():
                break
        assert await compacted()
        await asyncio.to_thread(cluster.start_node, "n3")
        await wait_until(lambda: caught_up(cluster, "n3"), timeout_s=30, what="n3 caught up")
        await wait_until(lambda: leaders_settled(cluster, ["n3"]), timeout_s=30, what="n3 leads")
        # n2 counts n3 in group n1 again (its leader n1 lifted n3's probation and told n2).
        await wait_until(
            lambda: counts(cluster, "n2", "n1", "n3"), timeout_s=30, what="n2 counts n3"
        )
        raft = (await health(cluster, "n3"))["raft"]
        # A new leader of group n3 took over while n3 was down: n3 cannot catch up on its
        # log from what that leader kept. A new disk needs a snapshot in each group.
        assert raft["snapshots_installed"] >= (3 if lose_disk else 1), raft
        # With n1 down, groups n1 and n3 have a majority only with n3 in it.
        cluster.kill("n1")
        got = await drain_acking(c, q, len(acked))
        await asyncio.to_thread(cluster.start_node, "n1")
    assert got == set(acked)


@pytest.mark.parametrize(
    ("knobs", "most"),
    [
        # At most 2 * LOG_ENTRIES applied entries past the compaction, and a few in flight.
        ({"replication_log_entries": LOG_ENTRIES}, 2 * LOG_ENTRIES + 10),
        # Entries of about 1 KB: the byte bound compacts every 64 entries, keeping 8 KB.
        ({"replication_log_entries": 100_000, "replication_log_bytes": 8_000}, 64 + 10 + 10),
    ],
    ids=["entries", "bytes"],
)
@pytest.mark.main_pass_only
async def test_the_raft_log_stays_bounded_under_a_long_run(
    make_cluster: Callable[..., LocalCluster], knobs: dict[str, int], most: int
) -> None:
    cluster = await replicated(make_cluster, "n1", **knobs)
    q = unique("bounded")
    log_file = cluster.config.node_data_dir("n2") / "raft.sqlite3"
    sizes: list[int] = []
    async with Client.from_config(cluster.config_path, timeout_s=3) as c:
        await c.create_queue(q)
        for _ in range(4):
            for _ in range(150):
                await push_some(c, q, 4, 200)
            sizes.append(log_file.stat().st_size)
        for node in cluster.config.node_ids:
            for gid, g in (await health(cluster, node))["groups"].items():
                assert g["log_last"] - g["log_start"] <= most, (node, gid, g)
                assert g["log_start"] >= 60, (node, gid, g)  # compacted again and again
        assert len(await drain(c, q)) == 4 * 150 * 4
    # The file stops growing: deleted entries free pages the next ones reuse.
    assert sizes[-1] <= sizes[1] * 1.2, sizes


async def test_the_snapshot_route_takes_only_nodes_and_refuses_what_it_cannot_serve(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = await replicated(make_cluster, "n1")
    url = cluster.config.node("n1").url
    async with session() as s:
        target = "/v1/internal/snapshots/n1"
        async with s.get(url + target) as r:  # no node credential
            assert r.status == 401
            assert (await r.json())["error"]["code"] == "unauthorized"
        async with s.get(
            url + target, headers=node_signed(cluster.config, "n2", "GET", target)
        ) as r:
            assert r.status == 200
            index = int(r.headers["zdmq-snapshot-index"])
            size = int(r.headers["zdmq-snapshot-size"])
            body = await r.read()
        assert index > 0 and int(r.headers["zdmq-snapshot-term"]) > 0
        assert body[:16] == b"SQLite format 3\x00" and len(body) == size
        for target, status in [
            ("/v1/internal/snapshots/n2", 404),  # n1 is not in group n2
            (f"/v1/internal/snapshots/n1?offset=0&index={index + 1}", 404),  # no such copy
            (f"/v1/internal/snapshots/n1?offset={size + 1}&index={index}", 400),
            ("/v1/internal/snapshots/n1?offset=-1", 400),
        ]:
            headers = node_signed(cluster.config, "n2", "GET", target)
            async with s.get(url + target, headers=headers) as r:
                assert r.status == status, target
                assert "message" in (await r.json())["error"]
