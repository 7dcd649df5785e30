"""`zdmq cluster` against real node processes: a node added, shown, drained and removed
with the real `zdmq` command (add-node, remove-node, moves, show, --wait), and the moves
`zdmq status` shows while the rebalancer has work."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from zdmq.local import LocalCluster

pytestmark = pytest.mark.main_pass_only  # it sets its own layout: 4 nodes, three copies


def zdmq(
    cluster: LocalCluster, *args: str, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zdmq.cli", *args, "--config", str(cluster.config_path)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def ok(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    done = zdmq(cluster, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def shown(cluster: LocalCluster) -> dict[str, Any]:
    """`zdmq cluster show --json`: the map, each node with its counts."""
    m: dict[str, Any] = json.loads(ok(cluster, "cluster", "show", "--json").stdout)
    return m


def replicas(m: dict[str, Any]) -> dict[str, int]:
    return {n["id"]: n["replicas"] for n in m["nodes"]}


def test_add_node_wait_moves_replicas_to_it_and_remove_node_wait_drains_it(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(nodes=4, replication=3)
    before = shown(cluster)
    assert replicas(before) == {"n1": 3, "n2": 3, "n3": 3, "n4": 3}
    assert sum(n["preferred_leader"] for n in before["nodes"]) == 4
    address = cluster.joining("n5")
    cluster.start_node("n5")

    added = ok(cluster, "cluster", "add-node", "n5", address, "--wait")
    assert f"added n5 at {address}" in added.stdout
    assert "the rebalancer is idle" in added.stdout
    # The progress went to stderr, a line each time it moved, the last one full.
    progress = [line for line in added.stderr.splitlines() if line.startswith("moves [")]
    grown = shown(cluster)
    counts = replicas(grown)
    full = re.match(r"moves \[#{30}\] (\d+)/(\d+)$", progress[-1]) if progress else None
    assert full and int(full[1]) == int(full[2]) >= counts["n5"], added.stderr
    assert counts["n5"] in (2, 3) and sum(counts.values()) == 12, counts
    assert grown["epoch"] > before["epoch"]
    assert all(not g.get("learners") for g in grown["groups"])

    # Idempotent: the same change again changes nothing; another address for it is refused.
    again = ok(cluster, "cluster", "add-node", "n5", address, "--wait")
    assert "nothing changed: n5 is in the cluster" in again.stdout
    bad = zdmq(cluster, "cluster", "add-node", "n5", "127.0.0.1:1")
    assert (
        bad.returncode == 1 and "node_conflict" in bad.stderr and "in the cluster at" in bad.stderr
    )
    bad = zdmq(cluster, "cluster", "add-node", "n6", "no-port")
    assert bad.returncode == 1 and "bad_request" in bad.stderr
    # A node is added only once it answers at its address as itself: a node that does
    # not run, or a mistyped address, would hold every move up.
    unstarted = _free_address()
    bad = zdmq(cluster, "cluster", "add-node", "n6", unstarted)
    assert bad.returncode == 1 and "node_conflict" in bad.stderr
    assert f"n6 does not answer at {unstarted}" in bad.stderr, bad.stderr
    n1 = f"127.0.0.1:{cluster.config.node('n1').port}"
    bad = zdmq(cluster, "cluster", "add-node", "n6", n1)
    assert bad.returncode == 1 and f"{n1} is node 'n1', not n6" in bad.stderr, bad.stderr
    bad = zdmq(cluster, "cluster", "replace-node", "n4", "n6", unstarted)
    assert bad.returncode == 1 and "n6 does not answer" in bad.stderr, bad.stderr
    assert [n["id"] for n in shown(cluster)["nodes"]] == ["n1", "n2", "n3", "n4", "n5"]
    usage = zdmq(cluster, "cluster", "add-node", "n6")
    assert usage.returncode == 2 and "HOST:PORT" in usage.stderr

    moves = json.loads(ok(cluster, "cluster", "moves", "--json").stdout)
    assert moves["epoch"] == grown["epoch"] and moves["current"] is None
    assert moves["pending_steps"] == 0 and moves["leaving"] == []
    assert {(p["group"], p["add"]) for p in moves["done"]} >= {
        (g["id"], "n5") for g in grown["groups"] if "n5" in g["members"]
    }
    assert "rebalancer idle" in ok(cluster, "cluster", "moves").stdout
    status = json.loads(ok(cluster, "status", "--json").stdout)
    assert status["epoch"] == grown["epoch"]
    assert [n["id"] for n in status["nodes"]] == ["n1", "n2", "n3", "n4", "n5"]
    assert all(n["up"] for n in status["nodes"])
    assert f"map epoch {grown['epoch']}" in ok(cluster, "status").stdout

    removed = ok(cluster, "cluster", "remove-node", "n5", "--wait")
    assert "n5 is leaving" in removed.stdout and "n5 has left the map" in removed.stdout
    shrunk = shown(cluster)
    assert replicas(shrunk) == {"n1": 3, "n2": 3, "n3": 3, "n4": 3}
    gone = ok(cluster, "cluster", "remove-node", "n5")
    assert "nothing changed: n5 is not in the cluster" in gone.stdout


def _free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_status_shows_the_moves_while_the_rebalancer_has_work(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(nodes=4, replication=3)
    # n4 removed while n3 is down too: the groups both are in (n2 = {n2, n3, n4} and
    # n3 = {n3, n4, n1}) have no majority, so their moves cannot run, and the rebalancer
    # keeps them planned, retrying, until n3 is back.
    cluster.kill("n3")
    cluster.kill("n4")
    ok(cluster, "cluster", "remove-node", "n4")
    status: dict[str, Any] = {}
    for _ in range(40):
        status = json.loads(zdmq(cluster, "status", "--json").stdout)
        moves = status["moves"]
        current = (moves or {}).get("current") or {}
        if moves["pending_steps"] > 0 and current.get("elapsed_s", 0) > 3:
            break  # a move held up
    else:
        pytest.fail(f"the status did not show the planned moves: {status.get('moves')}")
    shown_map = shown(cluster)
    assert status["epoch"] == shown_map["epoch"] == moves["epoch"]
    down = {n["id"]: n["up"] for n in status["nodes"]}
    assert down == {"n1": True, "n2": True, "n3": False, "n4": False}
    table = zdmq(cluster, "status").stdout
    assert "Moves" in table and re.search(r"\d+/\d+ steps", table), table
    assert f"group {current['group']}:" in table, table
    watched = ok(cluster, "cluster", "moves").stdout
    assert "moving replicas" in watched and f"group {current['group']}" in watched, watched

    cluster.start_node("n3")
    removed = ok(cluster, "cluster", "remove-node", "n4", "--wait")
    assert "n4 has left the map" in removed.stdout
    status = json.loads(ok(cluster, "status", "--json").stdout)
    assert [n["id"] for n in status["nodes"]] == ["n1", "n2", "n3"]
    assert status["moves"]["pending_steps"] == 0 and not status["moves"]["leaving"]
    assert "Moves" not in ok(cluster, "status").stdout
