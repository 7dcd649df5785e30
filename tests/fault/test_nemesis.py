"""Fault runs on real node processes: the workload under a nemesis, then the checker.

These runs use `replication: 1` (the default): one copy of each message, on the node its id
hashes to, written with `durability: fsync`. What that guarantees, and what they assert
(test_replicated.py runs the replicated clusters):

- kill -9 and restart on the same disk, SIGSTOP/SIGCONT: no acknowledged push is lost and
  nothing unexpected is delivered (duplicates are allowed: delivery is at-least-once).
- a node's disk lost (the queue's metadata owner, or another node): its acknowledged
  messages are gone, and no other node's; the run prints how many.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.fault.history import History
from tests.fault.nemesis import Nemesis
from tests.fault.netns import NetnsCluster, NetnsUnavailable, started_or_skip, unavailable_reason
from tests.fault.runner import run
from tests.fault.workload import Outcome, Workload, node_urls
from tests.helpers import unique, wait_until
from zdmq.hashing import Placement
from zdmq.local import LocalCluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    # A node answers for a peer that does not reply within 1 s (503), so the workload's
    # calls through a healthy node to a stopped one end well inside the client's timeout.
    c = LocalCluster.ephemeral(tmp_path / "c", nodes=4, durability="fsync", request_timeout_s=1.0)
    try:
        yield c.start()
    finally:
        c.close()


def healer(cluster: LocalCluster) -> Callable[[], Awaitable[None]]:
    """Every node running again: SIGCONT to each, and a start for any that is down."""

    async def heal() -> None:
        for node_id, n in cluster.nodes.items():
            cluster.resume(node_id)
            if not n.running:
                await asyncio.to_thread(cluster.start_node, node_id)

    return heal


async def test_kill_and_pause_lose_no_acknowledged_push(
    cluster: LocalCluster, tmp_path: Path, seed: int
) -> None:
    h = History()
    w = Workload(node_urls(cluster), unique("fault"), h, producers=3, consumers=2, seed=seed)
    nemesis = Nemesis(cluster, h, seed=seed)
    victims = random.Random(seed).sample(list(cluster.nodes), 3)

    async def faults() -> None:
        await asyncio.sleep(1.0)
        await nemesis.kill(victims[0], down_s=0.5)
        await asyncio.sleep(1.0)
        await nemesis.pause(victims[1], paused_s=2.0)
        await asyncio.sleep(1.0)
        await nemesis.kill(victims[2], down_s=0.5)

    report = await run(
        w, faults, duration_s=10.0, heal=healer(cluster), history_path=tmp_path / "history.jsonl"
    )
    print(report.text())
    assert report.problems() == []
    assert sum(1 for n in report.nemesis if n["fault"] in ("kill", "pause")) == 3
    assert len(report.acknowledged) > 50, "the workload pushed too little to prove anything"
    assert report.lost == set(), f"acknowledged pushes lost across kill -9:\n{report.text()}"
    assert report.unexpected == set()
    assert report.corrupt == set()
    assert report.resurrected == set()


async def test_random_kills_and_pauses_with_pop_consumers(
    cluster: LocalCluster, tmp_path: Path, seed: int
) -> None:
    """Pops too: a pop whose reply was lost may have taken messages no one recorded, so the
    losses must stay within what the unknown pops could have taken."""
    h = History()
    w = Workload(
        node_urls(cluster), unique("fault"), h, producers=2, consumers=1, pop_consumers=1, seed=seed
    )
    nemesis = Nemesis(cluster, h, seed=seed)
    report = await run(
        w,
        lambda: nemesis.run(6.0, faults=("kill", "pause"), interval_s=(0.5, 1.5)),
        duration_s=6.0,
        heal=healer(cluster),
        history_path=tmp_path / "history.jsonl",
    )
    print(report.text())
    assert report.problems() == []
    assert report.nemesis, "the nemesis did nothing"
    assert len(report.acknowledged) > 50
    assert len(report.lost) <= report.unknown_pop_capacity, report.text()
    assert report.unexpected == set()
    assert report.corrupt == set()
    assert report.resurrected == set()


@pytest.mark.parametrize(
    ("victim_is_owner", "duration_s"),
    [
        pytest.param(False, 6.0, id="other-node-short"),
        pytest.param(True, 12.0, id="metadata-owner", marks=pytest.mark.slow),
        pytest.param(False, 12.0, id="other-node", marks=pytest.mark.slow),
    ],
)
async def test_disk_loss_loses_the_lost_nodes_messages(
    cluster: LocalCluster, tmp_path: Path, victim_is_owner: bool, duration_s: float, seed: int
) -> None:
    """One copy per message: a node that loses its disk loses its messages, and only those.
    When the victim is the queue's metadata owner the queue's metadata goes too: the other
    nodes keep their messages of it (the owner recorded no delete, so they do not purge),
    and once the queue is created again, as an operator would, they rejoin it.

    The default run is the short one (another node, 6 s); the owner's case waits for the
    other nodes' repair sweeps, so it runs in the slow suite, and tests/cluster/
    test_recovery.py checks an owner's lost disk on its own."""
    queue = unique("fault")
    cfg = cluster.config
    placement = Placement(cfg.node_ids, cfg.partitions, cfg.replication)
    owner = placement.owner(queue)
    others = [n for n in cluster.nodes if n != owner]
    victim = owner if victim_is_owner else random.Random(seed).choice(others)
    h = History()
    w = Workload(
        node_urls(cluster),
        queue,
        h,
        producers=2,
        consumers=2,
        consumers_after_s=duration_s / 2,
        seed=seed,
    )
    nemesis = Nemesis(cluster, h, seed=seed)

    async def orphaned() -> int:
        """How many of the other nodes hold messages of the queue their sweep found unknown."""
        n = 0
        async with aiohttp.ClientSession() as s:
            for node in others:
                async with s.get(f"{cfg.node(node).url}/v1/health") as r:
                    n += (await r.json())["counters"].get("orphaned_queues", 0)
        return n

    async def recreate() -> None:
        # First the other nodes' sweeps find the queue unknown, and keep their messages.
        await wait_until(
            lambda: _positive(orphaned()), timeout_s=3 * cfg.repair_interval_s, what="a sweep"
        )
        await asyncio.sleep(cfg.repair_interval_s + 0.5)  # every other node has swept
        print(f"other nodes keeping the queue's messages: {await orphaned()}")
        for _ in range(10):
            try:
                await w.create_queue()
                h.note("nemesis", "nemesis", {"fault": "queue created again"})
                return
            except Outcome as e:
                if e.definite:
                    raise
                await asyncio.sleep(0.2)
        raise AssertionError(f"queue {queue} could not be created again")

    async def faults() -> None:
        await asyncio.sleep(duration_s / 3)  # a backlog builds up: the consumers start later
        await nemesis.lose_disk(victim, down_s=0.5)
        if victim == owner:
            await recreate()
        await asyncio.sleep(duration_s / 6)
        await nemesis.kill(victim, down_s=0.5)

    report = await run(
        w,
        faults,
        duration_s=duration_s,
        heal=healer(cluster),
        history_path=tmp_path / "history.jsonl",
    )
    print(report.text())
    print(f"lost after {victim}'s disk was lost: {len(report.lost)}")
    assert report.problems() == []
    done = [n["fault"] for n in report.nemesis]
    assert done.count("lose_disk") == done.count("kill") == 1, done
    assert len(report.acknowledged) > 50, "the workload pushed too little to prove anything"
    assert report.unexpected == set()
    assert report.corrupt == set()
    assert report.acknowledged - report.lost <= report.delivered
    # Only the messages stored on the node that lost its disk can be lost.
    assert {placement.owner(i) for i in report.lost} <= {victim}


async def _positive(n: Awaitable[int]) -> bool:
    return await n > 0


# ---- partitions, nodes in network namespaces ------------------------------------------------


@pytest.fixture
def netns_cluster(tmp_path: Path) -> Iterator[NetnsCluster]:
    yield from started_or_skip(tmp_path / "ns", nodes=4, durability="fsync", request_timeout_s=1.0)


async def test_partitions_deliver_nothing_unexpected(
    netns_cluster: NetnsCluster, tmp_path: Path, seed: int
) -> None:
    """An isolated node, then random halves, each healed: nothing unexpected is delivered,
    and (no disk lost, no process killed) no acknowledged push is lost."""
    c = netns_cluster
    rng = random.Random(seed)
    h = History()
    assert c.cluster is not None
    w = Workload(
        node_urls(c.cluster), unique("fault"), h, token=c.token, producers=2, consumers=2, seed=seed
    )

    async def faults() -> None:
        await asyncio.sleep(1.0)
        node = rng.choice(c.node_ids)
        h.note("nemesis", "nemesis", {"fault": "partition", "groups": c.isolate(node)})
        await asyncio.sleep(2.5)
        c.heal()
        h.note("nemesis", "nemesis", {"fault": "heal"})
        await asyncio.sleep(1.0)
        h.note("nemesis", "nemesis", {"fault": "partition", "groups": c.random_halves(rng)})
        await asyncio.sleep(2.5)
        c.heal()
        h.note("nemesis", "nemesis", {"fault": "heal"})

    async def heal() -> None:
        c.heal()

    report = await run(
        w, faults, duration_s=8.0, heal=heal, history_path=tmp_path / "history.jsonl"
    )
    print(report.text())
    assert report.problems() == []
    assert sum(1 for n in report.nemesis if n["fault"] == "partition") == 2
    # Each call that touches a node across the cut waits out request_timeout_s: few pushes.
    assert len(report.acknowledged) > 20
    assert report.unexpected == set()
    assert report.corrupt == set()
    assert report.lost == set(), report.text()


def test_netns_cluster_partitions_and_cleans_up(tmp_path: Path) -> None:
    """The rules a partition writes, and that nothing of the cluster is left after close."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"partition tests need network namespaces: {reason}")
    c = NetnsCluster(tmp_path / "ns", nodes=2, partitions=8)
    try:
        c.__enter__()
    except NetnsUnavailable as e:
        pytest.skip(f"partition tests need network namespaces: {e}")
    try:
        assert set(c.leftovers()) >= {c.bridge, *c.namespaces.values()}
        c.isolate("n1")
        assert f"ip saddr {c.addresses['n2']} drop" in c.rules("n1")
        assert f"ip saddr {c.addresses['n1']} drop" in c.rules("n2")
        c.heal()
        assert "drop" not in c.rules("n1") + c.rules("n2")
    finally:
        c.close()
    assert c.leftovers() == []


@pytest.mark.parametrize(
    "long",
    [pytest.param(False, id="one-round"), pytest.param(True, id="30s", marks=pytest.mark.slow)],
)
async def test_random_partitions_kills_and_pauses(
    netns_cluster: NetnsCluster, tmp_path: Path, seed: int, long: bool
) -> None:
    """Random faults in namespaces (partitions, kill -9, SIGSTOP) with receive and pop
    consumers: nothing unexpected or resurrected, losses only what unknown pops took. The
    default run is one round of 12 s (a partition, a kill -9 and a SIGSTOP, in a random
    order on random nodes); the slow one 30 s of faults drawn at random."""
    c = netns_cluster
    cluster = c.cluster
    assert cluster is not None
    h = History()
    w = Workload(
        node_urls(cluster), unique("fault"), h, token=c.token, producers=3, consumers=2,
        pop_consumers=1, seed=seed,
    )  # fmt: skip
    nemesis = Nemesis(cluster, h, seed=seed, network=c)

    async def heal() -> None:
        c.heal()
        await healer(cluster)()

    async def faults() -> None:
        if long:
            await nemesis.run(30.0, faults=("partition", "partition", "kill", "pause"))
        else:  # at most about 11.5 s: gaps, a 3 s cut, a restart and a 3 s pause
            await nemesis.round(("partition", "kill", "pause"), interval_s=(0.5, 1.0))

    report = await run(
        w,
        faults,
        duration_s=30.0 if long else 12.0,
        heal=heal,
        history_path=tmp_path / "history.jsonl",
    )
    print(report.text())
    assert report.problems() == []
    kinds = {n["fault"] for n in report.nemesis} & {"partition", "kill", "pause"}
    assert kinds if long else kinds == {"partition", "kill", "pause"}, kinds
    assert len(report.acknowledged) > 20, "the workload pushed too little to prove anything"
    assert report.unexpected == set()
    assert report.corrupt == set()
    assert report.resurrected == set()
    assert len(report.lost) <= report.unknown_pop_capacity, report.text()
