"""A cluster spread over four hosts: each node in a network namespace of its own, with its
own address, the way docs/operations.md runs one node per host.

The cluster (netns.py) has one cluster.yaml naming the four addresses, `replication: 3`,
`durability: fsync`, TLS (a CA made for the run), a node secret file and a client token. The
test process sits in the root namespace, a client host: producers and consumers through the
Python client and over REST, with the token, push, receive and ack, and pop; everything is
recorded in a History and checked (checker.py). What the runs assert:

- a backup (`zdmq backup`) made from the client host while the workload runs: every group's
  leader serves a copy of its state;
- kill -9 of one host's node mid-run, restarted on its disk: nothing acknowledged is lost,
  nothing unpushed, corrupt or resurrected is delivered, a popped message is handed out
  once, and pushes of the killed node's replica group (the group it led) are acknowledged
  again within 5 s of the kill;
- a rolling restart, as an upgrade goes (docs/operations.md "Upgrading"): each node in turn
  stopped, started again, and waited for until `zdmq status --json` shows it up and leading
  its own group with its followers caught up, while the workload runs: nothing lost.

The default runs are short (about 12 s of workload each); the `slow` one is 45 s of kill -9
rounds (nemesis.py's acceptance schedule, kills only). Every run prints its seed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fault.checker import Report, acked_during, check, fault_windows, pair
from tests.fault.history import History
from tests.fault.nemesis import Nemesis
from tests.fault.netns import NetnsCluster, started_or_skip
from tests.fault.test_replicated import CLIENT_TIMEOUT_S, group_of
from tests.fault.workload import Workload, node_urls
from tests.helpers import unique, wait_until
from zdmq import Client

# A push of a killed leader's group is acknowledged again within this long of the kill.
FAILOVER_S = 5.0


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[NetnsCluster]:
    # A node gives up on a peer that does not answer within 1 s, inside the workload's
    # timeout.
    yield from started_or_skip(
        tmp_path / "hosts",
        nodes=4,
        replication=3,
        durability="fsync",
        tls=True,
        request_timeout_s=1.0,
    )


def workload(c: NetnsCluster, h: History, seed: int, queue: str) -> Workload:
    """2 producers and 2 consumers over REST, 1 consumer popping, 2 producers and 1
    consumer through the Python client; every call carries the cluster's client token."""
    cluster = c.cluster
    assert cluster is not None

    def client() -> Client:
        return Client.from_config(cluster.config_path, token=c.token, timeout_s=CLIENT_TIMEOUT_S)

    return Workload(
        node_urls(cluster),
        queue,
        h,
        token=c.token,
        ssl_context=c.ssl_context(),
        producers=2,
        consumers=2,
        pop_consumers=1,
        timeout_s=CLIENT_TIMEOUT_S,
        seed=seed,
        client=client,
        client_producers=2,
        client_consumers=1,
    )


def zdmq_status(c: NetnsCluster) -> dict[str, Any]:
    """`zdmq status --json`, run as an operator runs it on a client host."""
    assert c.cluster is not None
    argv = [sys.executable, "-m", "zdmq.cli", "--config", str(c.cluster.config_path)]
    done = subprocess.run(
        [*argv, "status", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "ZDMQ_TOKEN": c.token},
    )
    if not done.stdout.strip():
        raise AssertionError(f"zdmq status printed nothing: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout))


def zdmq_backup(c: NetnsCluster, directory: Path) -> dict[str, Any]:
    """`zdmq backup <directory>` from the client host; its backup.json."""
    assert c.cluster is not None
    argv = [sys.executable, "-m", "zdmq.cli", "--config", str(c.cluster.config_path)]
    done = subprocess.run(
        [*argv, "backup", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "ZDMQ_TOKEN": c.token},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads((directory / "backup.json").read_text()))


def caught_up(status: dict[str, Any], node: str, max_lag: int = 0) -> str | None:
    """Why `node` is not yet back in service by `zdmq status`, or None when it is: it is
    up and leads its own group, and that group's followers lag at most `max_lag` entries."""
    rows = {n["id"]: n for n in status["nodes"]}
    row = rows[node]
    if not row.get("up"):
        return f"{node} is {row.get('status')}: {row.get('detail')}"
    own = (row.get("groups") or {}).get(node) or {}
    if own.get("role") != "leader":
        return f"{node} is {own.get('role')} of its group (leader {own.get('leader')})"
    lag = own.get("lag") or {}
    if any(v > max_lag for v in lag.values()):
        return f"its group's followers lag {lag}"
    down = [n for n, r in rows.items() if not r.get("up")]
    if down:
        return f"nodes down: {down}"
    return None


def assert_clean(report: Report, h: History) -> None:
    assert report.problems() == []
    assert report.unexpected == set(), report.text()
    assert report.corrupt == set(), report.text()
    assert report.resurrected == set(), report.text()
    # A pop whose reply was lost may have taken messages no one saw: those are the only
    # acknowledged messages allowed to be missing.
    assert len(report.lost) <= report.unknown_pop_capacity, report.text()
    again = popped_again(h)
    assert again == [], f"popped messages handed out again: {again[:10]}\n{report.text()}"


def popped_again(h: History) -> list[tuple[str, str]]:
    """(id, by what) for each message handed out again after a pop of it completed, or
    popped twice. (A message received, its ack lost, and popped once its lease expired is
    at-least-once delivery working: not counted.)"""
    ops, _ = pair(h)
    pops: dict[str, float] = {}  # id -> when the first pop of it completed
    again = []
    for op in sorted((op for op in ops if op.type == "ok" and op.f == "pop"), key=lambda o: o.end):
        for d in op.value:
            if d["id"] in pops:
                again.append((d["id"], f"{op.process}:pop"))
            pops.setdefault(d["id"], op.end)
    for op in ops:
        if op.type != "ok" or op.f not in ("receive", "drain", "pop"):
            continue
        for d in op.value or ():
            if op.f != "pop" and d["id"] in pops and op.start >= pops[d["id"]]:
                again.append((d["id"], f"{op.process}:{op.f}"))
    return again


def first_ack_after(h: History, group_of_id: Any, group: str, at: float) -> float | None:
    """Seconds from `at` to the end of the first push of a message `group` keeps that
    was acknowledged after `at` and began after it."""
    ops, _ = pair(h)
    ends = [
        op.end
        for op in ops
        if op.f == "push"
        and op.type == "ok"
        and op.start >= at
        and group_of_id(op.invoke_value["id"]) == group
    ]
    return min(ends) - at if ends else None


async def run_checked(
    c: NetnsCluster, tmp_path: Path, w: Workload, h: History, faults: Any, duration_s: float | None
) -> Report:
    """The workload for `duration_s` (None: until `faults()` is done) with `faults()`;
    then every node running, a drain, and the checker's report."""
    cluster = c.cluster
    assert cluster is not None
    await w.create_queue()
    done = asyncio.Event()

    async def load() -> None:
        if duration_s is not None:
            await w.run(duration_s)
            return
        while not done.is_set():
            await w.run(1.0)

    async def nemesis() -> None:
        try:
            await faults()
        finally:
            done.set()

    try:
        await asyncio.gather(load(), nemesis())
    finally:
        for node_id, n in cluster.nodes.items():
            if not n.running:
                await asyncio.to_thread(cluster.start_node, node_id)
        h.dump(tmp_path / "history.jsonl")
    try:
        await w.drain(60.0)
    finally:
        h.dump(tmp_path / "history.jsonl")
    report = check(h)
    print(report.text())
    print(f"replies: {dict(w.seen)}")
    assert w.seen["421"] == 0, "a plain REST call was answered 421"
    return report


async def settled(c: NetnsCluster, timeout_s: float = 30) -> None:
    """Every node up, leading its own group, its followers caught up (`zdmq status`)."""
    assert c.cluster is not None

    async def ok() -> bool:
        status = await asyncio.to_thread(zdmq_status, c)
        return all(caught_up(status, n, max_lag=5) is None for n in c.node_ids)

    await wait_until(ok, timeout_s=timeout_s, what="every node leading its own group")


# ---- kill -9 of one host's node --------------------------------------------------------


async def kills(
    c: NetnsCluster, tmp_path: Path, seed: int, *, duration_s: float, rounds: bool
) -> None:
    cluster = c.cluster
    assert cluster is not None
    await settled(c)
    placement = group_of(cluster)
    h = History()
    w = workload(c, h, seed, unique("hosts"))
    nemesis = Nemesis(cluster, h, seed=seed)
    victim = random.Random(seed).choice(c.node_ids)

    manifest: dict[str, Any] = {}

    async def backup() -> None:
        await asyncio.sleep(1.0)
        manifest.update(await asyncio.to_thread(zdmq_backup, c, tmp_path / "backup"))

    async def faults() -> None:
        if rounds:
            await asyncio.gather(
                backup(),
                nemesis.rounds(duration_s, period_s=6.0, down_s=3.0, pause_every=1 << 30),
            )
        else:
            await asyncio.gather(backup(), asyncio.sleep(3.0))
            await nemesis.kill(victim, down_s=3.0)

    report = await run_checked(c, tmp_path, w, h, faults, duration_s)
    # A backup made under load, over TLS, from the client host: every group's leader
    # copied its state.
    groups = manifest["groups"]
    print(f"backup under load: { ({g: (b['index'], b['bytes']) for g, b in groups.items()}) }")
    assert sorted(groups) == c.node_ids and all(b["index"] > 0 for b in groups.values())
    assert_clean(report, h)
    assert len(report.acknowledged) > 100, "the workload pushed too little to prove anything"
    clients = [op for op in pair(h)[0] if op.process.startswith("cp") and op.type == "ok"]
    assert len(clients) > 20, "the Python client's producers pushed too little"
    windows = [win for win in fault_windows(h) if win.fault == "kill"]
    assert windows, "no node was killed"
    for win in windows:
        assert win.node is not None
        failover = first_ack_after(h, placement.owner, win.node, win.start)
        acks = acked_during(h, win)
        print(
            f"kill -9 of {win.node} ({win.end - win.start:.1f}s down): {len(acks)} pushes "
            f"acknowledged meanwhile; its group's first push acknowledged "
            f"{failover if failover is None else round(failover, 2)}s after the kill"
        )
        assert failover is not None and failover <= FAILOVER_S, (
            f"no push of group {win.node} acknowledged within {FAILOVER_S}s of its kill"
        )
    # Every node back in service: the killed ones lead their groups again, caught up.
    await settled(c, timeout_s=60)


async def test_kill_9_of_a_host_loses_nothing_and_its_group_fails_over_within_5s(
    hosts: NetnsCluster, tmp_path: Path, seed: int
) -> None:
    """Short: 12 s of workload; 3 s in, one host's node is killed -9, restarted 3 s later."""
    await kills(hosts, tmp_path, seed, duration_s=12.0, rounds=False)


@pytest.mark.slow
async def test_45s_of_kill_9_across_hosts_lose_nothing(
    hosts: NetnsCluster, tmp_path: Path, seed: int
) -> None:
    """45 s: a random host's node killed -9 every 6 s, restarted 3 s later."""
    await kills(hosts, tmp_path, seed, duration_s=45.0, rounds=True)


# ---- a rolling restart (an upgrade) ----------------------------------------------------


async def rolling_restart(c: NetnsCluster, h: History, timeout_s: float = 30) -> list[float]:
    """The upgrade procedure: each node in turn stopped (SIGTERM), started, and waited for
    until `zdmq status` shows it back in service; returns the seconds each took."""
    cluster = c.cluster
    assert cluster is not None
    took = []
    for node in c.node_ids:
        started = time.monotonic()
        h.note("nemesis", "nemesis", {"fault": "kill", "node": node, "how": "stop"})
        await asyncio.to_thread(cluster.stop_node, node)
        n = cluster.nodes[node]
        await asyncio.to_thread(n.start)
        await asyncio.to_thread(n.wait_ready, 60.0)
        h.note("nemesis", "nemesis", {"fault": "restarted", "node": node})
        why: dict[str, str | None] = {}

        async def back(node: str = node, why: dict[str, str | None] = why) -> bool:
            why[node] = caught_up(await asyncio.to_thread(zdmq_status, c), node, max_lag=50)
            return why[node] is None

        try:
            await wait_until(back, timeout_s=timeout_s, what=f"{node} back in service")
        except AssertionError as e:
            raise AssertionError(f"{e}: {why.get(node)}") from None
        took.append(time.monotonic() - started)
    return took


async def test_a_rolling_restart_under_load_loses_nothing(
    hosts: NetnsCluster, tmp_path: Path, seed: int
) -> None:
    """Each of the 4 nodes restarted in turn, the next only once `zdmq status` shows the
    last back (up, leading its group, followers caught up), while the workload runs."""
    c = hosts
    await settled(c)
    h = History()
    w = workload(c, h, seed, unique("roll"))
    took: list[float] = []

    async def faults() -> None:
        await asyncio.sleep(1.0)
        took.extend(await rolling_restart(c, h))

    report = await run_checked(c, tmp_path, w, h, faults, None)
    print(f"each node back in service after: {[round(t, 1) for t in took]} s")
    assert len(took) == 4
    assert_clean(report, h)
    assert len(report.acknowledged) > 100, "the workload pushed too little to prove anything"
