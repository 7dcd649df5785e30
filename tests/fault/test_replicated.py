"""Fault runs on replicated clusters: 4 real nodes, `replication: 3`, `durability: fsync`.

Each node leads one replica group (its own id) and follows two; any node takes any REST call
and forwards it to the leader of the group it is for, and a node that leads no group relays
it to a leader: no plain REST call is ever answered 421 (asserted by every run). What
replication guarantees (design.md §15), and what these runs assert:

- kill -9 of any node (restarted on its disk) or SIGSTOP of any node, one at a time: pushes
  keep being acknowledged in every fault window (each group keeps a majority), nothing
  acknowledged is lost, nothing unpushed and nothing acknowledged-then-acked comes back.
- then one node killed and its data directory deleted: the other three deliver every
  acknowledged message; the node rejoins with an empty disk, catches up, leads its group
  again, and nothing acked comes back from it.
- partitions in network namespaces (a leader alone, random halves): nothing acknowledged is
  lost, and a side without a majority of a group acknowledges nothing for it: no call that
  began and ended while the cut held got a 2xx reporting a change of a message kept by a
  group whose majority its answering node could not reach, and pushes sent on purpose to
  such nodes (probes, sent once) get no 2xx.
- pop (at-most-once) across kill -9 of a group's leader: no message is handed out twice,
  and the messages missing are at most what the pops of unknown outcome could have taken.

The default runs are short (about 10 s of faults each); the `slow` ones are the 45 s
acceptance runs. Every run prints its seed and the command that replays it.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import sqlite3
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fault.checker import (
    Report,
    Window,
    acked_during,
    check,
    cut_changes,
    fault_windows,
    pair,
)
from tests.fault.history import History
from tests.fault.nemesis import Nemesis
from tests.fault.netns import NetnsCluster, started_or_skip
from tests.fault.workload import Workload, node_urls
from tests.helpers import unique, wait_until
from zdmq.hashing import Placement
from zdmq.local import LocalCluster
from zdmq.routing import group_members

# The workload's calls give up after this (their outcome unknown) and leave the node out
# for a while: a killed or paused node holds every call sent to it until then, so a longer
# timeout would stall every producer for most of a short fault window.
CLIENT_TIMEOUT_S = 1.5


@pytest.fixture
def netns_cluster(tmp_path: Path) -> Iterator[NetnsCluster]:
    yield from started_or_skip(
        tmp_path / "ns", nodes=4, replication=3, durability="fsync", request_timeout_s=1.0
    )


def group_of(cluster: LocalCluster) -> Placement:
    cfg = cluster.config
    return Placement(cfg.node_ids, cfg.partitions, cfg.replication)


async def groups_seen(
    cluster: LocalCluster, node: str, token: str | None = None
) -> dict[str, dict[str, Any]]:
    """The replica groups `node` is in, as its health reports them (role, leader, term)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = cluster.config.node(node).url + "/v1/health"
    async with (
        aiohttp.ClientSession(headers=headers) as s,
        s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r,
    ):
        return dict((await r.json())["groups"])


async def settled(cluster: LocalCluster, token: str | None = None, timeout_s: float = 30) -> None:
    """Waits until every running node sees every group it is in led by the group's own
    node (the preferred leader: a node leads its group again only once caught up)."""

    async def ok() -> bool:
        for n, proc in cluster.nodes.items():
            if not proc.running:
                continue
            try:
                groups = await groups_seen(cluster, n, token)
            except (aiohttp.ClientError, TimeoutError, KeyError):
                return False
            if any(g["leader"] != gid for gid, g in groups.items()):
                return False
        return True

    await wait_until(ok, timeout_s=timeout_s, what="every group led by its own node")


async def copies_left(cluster: LocalCluster) -> dict[str, dict[str, int]]:
    """The messages each running node's copy of each of its groups still stores (only
    the run's queue exists), nodes and groups with none left out."""
    left: dict[str, dict[str, int]] = {}
    for n, proc in cluster.nodes.items():
        if proc.running:
            groups = await groups_seen(cluster, n)
            held = {g: s["messages"] for g, s in groups.items() if s["messages"]}
            if held:
                left[n] = held
    return left


def ids_held(cluster: LocalCluster, node: str, group: str) -> list[tuple[str, str | None]]:
    """(id, lease) of each message `node`'s copy of `group` stores, read from its state
    file. A running node holds that file's lock: this kills it -9 first (what it
    committed stays in the file), so it is only for a run that has failed."""
    cluster.kill(node)
    path = cluster.config.node_data_dir(node) / f"group-{group}.sqlite3"
    with closing(sqlite3.connect(path, timeout=5)) as db:
        return [(i, lease) for i, lease in db.execute("SELECT id, lease FROM messages")]


def what_history_says(h: History, ids: set[str]) -> dict[str, list[str]]:
    """For each id: every operation of the history that names it, as `f:type`."""
    said: dict[str, list[str]] = {i: [] for i in ids}
    ops, _ = pair(h)
    for op in ops:
        if op.f == "push" and op.invoke_value["id"] in said:
            said[op.invoke_value["id"]].append(f"push:{op.type}")
        elif op.f == "ack" and op.type == "ok":
            for i in set(op.value["acked"]) & ids:
                said[i].append("ack:ok")
            for i in set(op.value["failed"]) & ids:
                said[i].append("ack:failed")
        elif op.f == "ack":
            for i in set(op.invoke_value["ids"]) & ids:
                said[i].append(f"ack:{op.type}")
        elif op.f in ("receive", "pop", "drain") and op.type == "ok":
            for d in op.value or ():
                if d["id"] in said:
                    said[d["id"]].append(f"{op.process}:{op.f}")
    return said


async def no_copies_left(cluster: LocalCluster, h: History | None = None) -> None:
    """Waits until no copy of any group on any running node stores a message: followers
    apply what their leader committed (the drain's acks) shortly after it."""

    async def empty() -> bool:
        return await copies_left(cluster) == {}

    try:
        await wait_until(empty, timeout_s=15, what="every copy empty")
    except AssertionError as e:
        left = await copies_left(cluster)
        # Every running member's view of the groups with messages left: role, leader,
        # term, applied index and log bounds, to tell a lagging copy from a diverged one.
        views = {
            n: {g: v for g, v in (await groups_seen(cluster, n)).items() if g in groups}
            for groups in [{g for held in left.values() for g in held}]
            for n, proc in cluster.nodes.items()
            if proc.running
        }
        held = {(n, g): ids_held(cluster, n, g) for n, groups in left.items() for g in groups}
        said = what_history_says(h, {i for rows in held.values() for i, _ in rows}) if h else {}
        stored = {
            f"{n}/{g}": [(i, lease, said.get(i)) for i, lease in rows[:10]]
            for (n, g), rows in held.items()
        }
        raise AssertionError(
            f"{e}: copies still storing messages {left}; the groups as members see them "
            f"{views}; what they store (id, lease, the history's operations on it) {stored}"
        ) from None


async def heal(cluster: LocalCluster) -> None:
    """Every node running again: SIGCONT to each, and a start for any that is down."""
    for node_id, n in cluster.nodes.items():
        cluster.resume(node_id)
        if not n.running:
            await asyncio.to_thread(cluster.start_node, node_id)


def assert_clean(report: Report) -> None:
    assert report.problems() == []
    assert report.lost == set(), f"acknowledged pushes lost:\n{report.text()}"
    assert report.unexpected == set(), report.text()
    assert report.corrupt == set(), report.text()
    assert report.resurrected == set(), report.text()


def window_acks(h: History, placement: Placement) -> list[tuple[Window, int, int]]:
    """Each fault window, with the pushes acknowledged in it, and in its second half (once
    the groups the fault hit have elected a leader)."""
    out = []
    for w in fault_windows(h):
        acks = acked_during(h, w)
        late = [op for op in acks if op.end >= (w.start + w.end) / 2]
        per_group = Counter(placement.owner(op.invoke_value["id"]) for op in acks)
        out.append((w, len(acks), len(late)))
        what = w.node or [list(s) for s in w.sides]
        print(
            f"window {w.fault} {what} {w.end - w.start:.1f}s: acked {len(acks)} "
            f"(second half {len(late)}) by group {dict(sorted(per_group.items()))}"
        )
    return out


# ---- kill -9 and SIGSTOP, then a lost disk -------------------------------------------------


async def kills_pauses_and_a_lost_disk(
    cluster: LocalCluster,
    tmp_path: Path,
    seed: int,
    *,
    duration_s: float,
    period_s: float,
    down_s: float,
    paused_s: float,
) -> None:
    await settled(cluster)
    placement = group_of(cluster)
    h = History()
    w = Workload(
        node_urls(cluster),
        unique("rfault"),
        h,
        producers=4,
        consumers=2,
        timeout_s=CLIENT_TIMEOUT_S,
        seed=seed,
    )
    nemesis = Nemesis(cluster, h, seed=seed)
    await w.create_queue()
    try:
        await asyncio.gather(
            w.run(duration_s),
            nemesis.rounds(duration_s, period_s=period_s, down_s=down_s, paused_s=paused_s),
        )
    finally:
        await heal(cluster)
        h.dump(tmp_path / "history.jsonl")
    windows = window_acks(h, placement)
    assert sum(1 for win, _, _ in windows if win.fault == "kill") >= 2
    assert sum(1 for win, _, _ in windows if win.fault == "pause") >= 1
    # A group whose UUID queue emptied registers again with the queue's metadata owner
    # before it stores a push: while the owner's group elects a leader, those pushes wait.
    owner = placement.owner(w.queue)
    for win, _, late in windows:
        assert late > 0, (
            f"no push acknowledged late in {win.fault} of {win.node} "
            f"(the queue's metadata is in group {owner})"
        )

    # A node loses its disk: the other three hold a copy of every acknowledged message.
    victim = random.Random(seed).choice(list(cluster.nodes))
    h.note("nemesis", "nemesis", {"fault": "lose_disk", "node": victim})
    await asyncio.to_thread(cluster.kill, victim)
    shutil.rmtree(cluster.config.node_data_dir(victim))
    others = [n for n in cluster.nodes if n != victim]
    try:
        await w.drain(60.0, nodes=others)
    finally:
        h.dump(tmp_path / "history.jsonl")
    report = check(h)
    print(report.text())
    print(f"replies: {dict(w.seen)}")
    assert w.seen["421"] == 0, "a plain REST call was answered 421"
    print(f"{victim} lost its disk; {len(report.acknowledged)} acknowledged, all delivered")
    assert len(report.acknowledged) > 100, "the workload pushed too little to prove anything"
    assert_clean(report)
    await no_copies_left(cluster, h)

    # It rejoins empty, catches up (it leads its group again only then): nothing comes back.
    await asyncio.to_thread(cluster.start_node, victim)
    h.note("nemesis", "nemesis", {"fault": "restarted empty", "node": victim})
    await settled(cluster, timeout_s=60)
    try:
        await w.drain(30.0, process="redrain")
    finally:
        h.dump(tmp_path / "history.jsonl")
    again = check(h)
    ops, _ = pair(h)
    redelivered = [d["id"] for op in ops if op.process == "redrain" for d in op.value or ()]
    print(f"after {victim} rejoined empty: delivered again {len(redelivered)}")
    assert redelivered == [], again.text()
    assert_clean(again)
    # The groups it only follows keep nothing either: its copies match its leaders'.
    await no_copies_left(cluster, h)


async def test_kills_and_pauses_lose_nothing_and_a_lost_disk_brings_nothing_back(
    cluster: LocalCluster, tmp_path: Path, seed: int
) -> None:
    """Short: three rounds of 5 s (kill -9, kill -9, a 5 s SIGSTOP) on random nodes."""
    await kills_pauses_and_a_lost_disk(
        cluster, tmp_path, seed, duration_s=16.0, period_s=5.0, down_s=3.0, paused_s=5.0
    )


@pytest.mark.slow
async def test_45s_of_kills_and_pauses_lose_nothing_and_a_lost_disk_brings_nothing_back(
    cluster: LocalCluster, tmp_path: Path, seed: int
) -> None:
    """Acceptance: for 45 s a kill -9 every 6 s (restart 3 s later), a 6 s SIGSTOP every
    third round, 4 producers and 2 consumers through random nodes."""
    await kills_pauses_and_a_lost_disk(
        cluster, tmp_path, seed, duration_s=45.0, period_s=6.0, down_s=3.0, paused_s=6.0
    )


# ---- pop across kill -9 of a group's leader ------------------------------------------------


async def pops(
    cluster: LocalCluster, tmp_path: Path, seed: int, *, duration_s: float, rounds: bool
) -> None:
    """Pop consumers under kill -9 of group leaders (one kill, or `rounds` of kills and
    pauses), then a drain: no popped message is handed out again, by a pop or the drain,
    and the missing ones are at most what pops of unknown outcome could have taken."""
    await settled(cluster)
    placement = group_of(cluster)
    h = History()
    w = Workload(
        node_urls(cluster),
        unique("rpop"),
        h,
        producers=2,
        consumers=0,
        pop_consumers=2,
        consumers_after_s=1.5,
        timeout_s=CLIENT_TIMEOUT_S,
        seed=seed,
    )
    nemesis = Nemesis(cluster, h, seed=seed)
    # The leader of the group that keeps the queue's metadata list: a pop that finds
    # nothing at hand asks it where messages are, and waits there.
    victim = placement.owner(w.queue)

    async def faults() -> None:
        if rounds:
            await nemesis.rounds(duration_s, first_s=2.5)
        else:
            await asyncio.sleep(2.5)
            await nemesis.kill(victim, down_s=2.0)

    await w.create_queue()
    try:
        await asyncio.gather(w.run(duration_s), faults())
    finally:
        await heal(cluster)
    try:
        await w.drain(30.0)
    finally:
        h.dump(tmp_path / "history.jsonl")
    report = check(h)
    print(report.text())
    print(f"replies: {dict(w.seen)}")
    assert w.seen["421"] == 0, "a plain REST call was answered 421"
    ops, _ = pair(h)
    kills = [win for win in fault_windows(h) if win.fault == "kill"]
    popped_after_kill = sum(
        1
        for win in kills
        for op in ops
        if op.f == "pop" and op.type == "ok" and win.start <= op.start
        for d in op.value
        if placement.owner(d["id"]) == win.node
    )
    print(f"messages of a killed leader's group popped after its kill: {popped_after_kill}")
    assert report.problems() == []
    assert kills, "no leader was killed"
    assert popped_after_kill > 0, "no pop reached a killed leader's group after the kill"
    # A pop hands a message out at most once: no message popped is delivered again, by
    # another pop or by the drain (the drain's own receives are at-least-once).
    popped = Counter(d["id"] for op in ops if op.f == "pop" and op.type == "ok" for d in op.value)
    twice = {i: n for i, n in report.duplicated.items() if popped[i]}
    assert twice == {}, f"a popped message was handed out again:\n{report.text()}"
    assert len(report.lost) <= report.unknown_pop_capacity, report.text()
    assert report.unexpected == set()
    assert report.corrupt == set()


async def test_pop_hands_nothing_out_twice_across_a_leader_kill(
    cluster: LocalCluster, tmp_path: Path, seed: int
) -> None:
    """Short: one kill -9 of the leader of the group that keeps the queue's metadata,
    down 2 s, while two consumers pop."""
    await pops(cluster, tmp_path, seed, duration_s=7.0, rounds=False)


@pytest.mark.slow
async def test_45s_of_kills_and_pauses_under_pop_hand_nothing_out_twice(
    cluster: LocalCluster, tmp_path: Path, seed: int
) -> None:
    """45 s of the acceptance rounds (kill -9 every 6 s, a 6 s SIGSTOP every third) while
    two consumers pop."""
    await pops(cluster, tmp_path, seed, duration_s=45.0, rounds=True)


# ---- partitions ----------------------------------------------------------------------------


async def partitions(
    c: NetnsCluster, tmp_path: Path, seed: int, *, cuts: int, hold_s: float, gap_s: float
) -> None:
    """`cuts` partitions of `hold_s`, `gap_s` apart, alternately a random leader alone and
    random halves, under 4 producers and 2 consumers; during each, probes push to every
    node messages of the groups whose majority it cannot reach."""
    cluster = c.cluster
    assert cluster is not None
    await settled(cluster, c.token)
    placement = group_of(cluster)
    members = group_members(cluster.config.node_ids, cluster.config.replication)
    rng = random.Random(seed)
    h = History()
    w = Workload(
        node_urls(cluster),
        unique("rcut"),
        h,
        token=c.token,
        producers=4,
        consumers=2,
        timeout_s=CLIENT_TIMEOUT_S,
        seed=seed,
    )
    probes = Counter[str]()

    async def probe(node: str, groups: list[str], until: float) -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < until:
            for g in groups:
                if loop.time() >= until:
                    return
                probes[node] += 1
                await w.probe(node, f"probe-{node}", placement.owner, g, timeout_s=1.0)

    async def leader() -> str:
        """A random node that leads a group now (nodes hand leadership back to the
        group's own node once healed, but a run may cut before that)."""
        for node in rng.sample(c.node_ids, len(c.node_ids)):
            try:
                groups = await groups_seen(cluster, node, c.token)
            except (aiohttp.ClientError, TimeoutError):
                continue
            if any(g["role"] == "leader" for g in groups.values()):
                return node
        raise AssertionError("no node leads a group")

    async def cut(k: int) -> None:
        loop = asyncio.get_running_loop()
        sides = c.isolate(await leader()) if k % 2 == 0 else c.random_halves(rng)
        h.note("nemesis", "nemesis", {"fault": "partition", "groups": sides})
        until = loop.time() + hold_s - 1.0  # a probe's timeout is 1 s
        try:
            tasks = []
            for side in sides:
                for node in side:
                    cut_off = [
                        g for g, ms in members.items() if 2 * sum(m in side for m in ms) <= len(ms)
                    ]
                    if cut_off:
                        tasks.append(probe(node, cut_off, until))
            await asyncio.gather(asyncio.sleep(hold_s), *tasks)
        finally:
            h.note("nemesis", "nemesis", {"fault": "heal"})
            c.heal()

    async def faults() -> None:
        for k in range(cuts):
            await asyncio.sleep(gap_s)
            await cut(k)

    await w.create_queue()
    try:
        await asyncio.gather(w.run(cuts * (hold_s + gap_s) + 1.0), faults())
    finally:
        c.heal()
    try:
        await w.drain(60.0)
    finally:
        h.dump(tmp_path / "history.jsonl")
    report = check(h)
    print(report.text())
    print(f"replies: {dict(w.seen)}")
    assert w.seen["421"] == 0, "a plain REST call was answered 421"
    windows = window_acks(h, placement)
    changes = cut_changes(h, members, placement.owner)
    minority = [ch for ch in changes if not ch.majority]
    ops, _ = pair(h)
    probes_done = Counter(op.type for op in ops if op.process.startswith("probe-"))
    print(
        f"changes reported during cuts: {len(changes)}, from a side without the group's "
        f"majority: {len(minority)}; probes sent {sum(probes.values())}: {dict(probes_done)}"
    )
    assert report.problems() == []
    assert len([win for win, _, _ in windows if win.fault == "partition"]) == cuts
    assert minority == [], "a side without a majority acknowledged:\n" + "\n".join(
        map(str, minority[:10])
    )
    assert probes_done.get("ok", 0) == 0, "a probe of a cut-off node was acknowledged"
    assert sum(probes_done.values()) >= cuts, "too few probes to prove anything"
    for win, _, late in windows:
        # A leader alone: the other three hold a majority of every group, and serve them
        # all once the cut-off leader's group has elected another. (With halves each side
        # holds a majority of two groups, and a call that lands on a node whose side lacks
        # its group's waits out that node's forwarding timeouts: a few acks, or none.)
        if min(map(len, win.sides)) == 1:
            assert late > 0, f"no push acknowledged late in the cut {win.sides}"
    assert len(report.acknowledged) > 50, "the workload pushed too little to prove anything"
    assert report.lost == set(), report.text()
    assert report.unexpected == set(), report.text()
    assert report.corrupt == set(), report.text()
    assert report.resurrected == set(), report.text()


async def test_partitions_lose_nothing_and_no_minority_acknowledges(
    netns_cluster: NetnsCluster, tmp_path: Path, seed: int
) -> None:
    """Short: a node alone for 3 s, then random halves for 3 s."""
    await partitions(netns_cluster, tmp_path, seed, cuts=2, hold_s=3.0, gap_s=1.0)


@pytest.mark.slow
async def test_45s_of_partitions_lose_nothing_and_no_minority_acknowledges(
    netns_cluster: NetnsCluster, tmp_path: Path, seed: int
) -> None:
    """Acceptance: 45 s, a cut every 6 s held for 4 s, a node alone and random halves in
    turn."""
    await partitions(netns_cluster, tmp_path, seed, cuts=7, hold_s=4.0, gap_s=2.0)
