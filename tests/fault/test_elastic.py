"""The cluster grows from 4 nodes to 6 and shrinks back to 4 while producers and consumers
run over REST, with faults in the middle of the moves (docs/design.md §19): a kill -9 of
the node that drives the moves (the leader of the map's home group), a node paused while
a replica moves off it, and a replace of a node whose disk is gone by a new host. The
history checker then finds nothing acknowledged lost and nothing acked come back.

Every run prints its seed and the command that replays it.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import urllib.request
from pathlib import Path
from typing import Any

from tests.fault.checker import check
from tests.fault.history import History
from tests.fault.nemesis import Nemesis
from tests.fault.test_replicated import CLIENT_TIMEOUT_S, assert_clean
from tests.fault.workload import Workload, node_urls
from tests.helpers import unique, wait_until
from zdmq import Client
from zdmq.cluster_map import Step
from zdmq.cluster_plan import plan
from zdmq.local import LocalCluster
from zdmq.server.topology import map_of_view

MOVES_TIMEOUT_S = 120.0


def replica_counts(m: dict[str, Any]) -> dict[str, int]:
    return map_of_view(m).replica_counts()


def first_move(m: dict[str, Any], node: str, address: str) -> Step:
    """The first step the rebalancer takes once `node` is added to `m` (plans are pure
    functions of the map: the test computes the same one)."""
    grown = map_of_view(m).with_node(node, address)
    return plan(grown, grown.staying())[0]


async def idle(client: Client, h: History, what: str) -> dict[str, Any]:
    """Waits until the rebalancer has nothing left to do; returns the map."""

    async def done() -> bool:
        try:
            moves = await client.moves()
        except Exception:
            return False
        return moves["current"] is None and moves["pending_steps"] == 0 and not moves["leaving"]

    await wait_until(done, timeout_s=MOVES_TIMEOUT_S, what=what)
    m = await client.cluster_map()
    h.note("nemesis", "nemesis", {"fault": "settled", "epoch": m["epoch"], "what": what})
    print(f"{what}: epoch {m['epoch']}, replicas {replica_counts(m)}")
    return m


async def home_leader(client: Client, cluster: LocalCluster) -> str:
    """The node that leads the map's home group (and so drives the moves)."""
    m = await client.cluster_map()
    home = m["groups"][0]["id"]
    for node in m["groups"][0]["members"]:
        groups = await asyncio.to_thread(health_groups, cluster, node)
        if groups.get(home, {}).get("role") == "leader":
            return str(node)
    raise AssertionError(f"no member of {home} leads it")


def health_groups(cluster: LocalCluster, node: str) -> dict[str, Any]:
    with urllib.request.urlopen(cluster.url(node) + "/v1/health", timeout=5) as r:
        return dict(json.loads(r.read())["groups"])


async def grow_and_shrink(cluster: LocalCluster, tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    h = History()
    nemesis = Nemesis(cluster, h, seed=seed)
    original = list(cluster.nodes)
    w = Workload(
        node_urls(cluster),
        unique("elastic"),
        h,
        producers=3,
        consumers=2,
        consumers_after_s=1.0,
        timeout_s=CLIENT_TIMEOUT_S,
        seed=seed,
    )
    await w.create_queue()
    stop = asyncio.Event()

    async def workload() -> None:
        while not stop.is_set():  # in rounds, until the scenario ends
            await w.run(3.0)

    async def scenario(client: Client) -> None:
        try:
            await asyncio.sleep(2.0)
            # Grow: n5 joins; mid-move, the node driving the moves is killed (-9).
            addresses = {n: cluster.joining(n) for n in ("n5", "n6")}
            for n in addresses:
                await asyncio.to_thread(cluster.start_node, n)
            driver = await home_leader(client, cluster)
            await client.add_node("n5", addresses["n5"])  # the first move starts at once
            await nemesis.kill(driver, down_s=2.0)
            await idle(client, h, "grown to 5 nodes")
            # n6 joins; mid-move, the node the first replica leaves is paused.
            step = first_move(await client.cluster_map(), "n6", addresses["n6"])
            assert step.remove is not None
            await client.add_node("n6", addresses["n6"])
            await nemesis.pause(step.remove, paused_s=3.0)
            grown = await idle(client, h, "grown to 6 nodes")
            counts = replica_counts(grown)
            assert len(counts) == 6 and sorted(counts.values()) == [2] * 6, counts
            # Shrink back to 4: the two new nodes drain and leave.
            await client.remove_node("n5")
            await client.remove_node("n6")
            shrunk = await idle(client, h, "shrunk to 4 nodes")
            counts = replica_counts(shrunk)
            assert sorted(counts) == sorted(original) and set(counts.values()) == {3}, counts
            # A node loses its disk for good; a new host takes its place.
            victim = rng.choice(original[1:])
            h.note("nemesis", "nemesis", {"fault": "lose_disk", "node": victim})
            await asyncio.to_thread(cluster.kill, victim)
            shutil.rmtree(cluster.config.node_data_dir(victim), ignore_errors=True)
            address = cluster.joining("n7")
            await asyncio.to_thread(cluster.start_node, "n7")
            await client.replace_node(victim, "n7", address)
            replaced = await idle(client, h, f"{victim} replaced by n7")
            ids = {n["id"] for n in replaced["nodes"]}
            assert victim not in ids and "n7" in ids, ids
        finally:
            stop.set()

    async with Client.from_config(cluster.config_path) as client:
        results = await asyncio.gather(workload(), scenario(client), return_exceptions=True)
    h.dump(tmp_path / "history.jsonl")
    for r in results:
        if isinstance(r, BaseException):
            raise r
    gone = [n for n in original if not cluster.nodes[n].running]
    await w.drain(60.0, nodes=[n for n in original if n not in gone])
    h.dump(tmp_path / "history.jsonl")
    report = check(h)
    print(report.text())
    print(f"replies: {dict(w.seen)}")
    assert w.seen["421"] == 0, "a plain REST call was answered 421"
    assert len(report.acknowledged) > 200, "the workload pushed too little to prove anything"
    assert_clean(report)


async def test_four_nodes_grow_to_six_and_shrink_to_four_under_faults_losing_nothing(
    cluster: LocalCluster, tmp_path: Path, seed: int
) -> None:
    await grow_and_shrink(cluster, tmp_path, seed)
