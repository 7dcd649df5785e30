"""Locust's zero-hop user against replica groups: 4 real nodes with `replication: 3`, one
of them killed. Calls for the dead node's group move to its new leader (a refused
connection, then a 421's hint) and nothing fails.

Skipped when locust is not installed (it is in the `load` extra).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import zdmq
from tests.helpers import wait_until
from zdmq import _http
from zdmq.cli_status import moves_active
from zdmq.errors import ZdmqError
from zdmq.local import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
LOCUST = Path(sys.executable).parent / "locust"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("locust") is None or not LOCUST.exists(),
    reason="locust is not installed (pip install -e '.[load]')",
)


async def leaders(cluster: LocalCluster, group: str, skip: str | None = None) -> list[str | None]:
    """The leader of `group` as each of its members (but `skip`) knows it."""
    pool = _http.HttpPool(timeout_s=2.0, ssl_context=cluster.config.client_ssl())
    try:
        known: list[str | None] = []
        for node in cluster.config.node_ids:
            if node == skip:
                continue
            try:
                h = await _http.call(pool, "GET", cluster.config.node(node).url + "/v1/health")
            except ZdmqError:
                return [None]
            if group in h.json()["groups"]:
                known.append(h.json()["groups"][group]["leader"])
        return known
    finally:
        await pool.close()


def rebalance_lines(log: Path, keep: int = 20) -> list[str]:
    """The last lines of a node's log that speak of moves, groups or failures."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    words = ("rebalance", "move", "WARNING", "ERROR", "Traceback")
    return [line for line in lines if any(w in line for w in words)][-keep:]


async def zerohop_users(
    cluster: LocalCluster, tmp_path: Path
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """4 zero-hop Locust users for 5 s against `cluster`, started from its cluster.yaml:
    the run, and its final statistics per call name."""
    out = tmp_path / "locust"
    cmd = [str(LOCUST), "-f", str(ROOT / "loadtest" / "locustfile.py"), "--headless"]
    cmd += ["--only-summary", "-u", "4", "-r", "4", "-t", "5s", "--json-file", str(out)]
    cmd += ["--zdmq-config", str(cluster.config_path), "--routing", "zerohop"]
    cmd += ["--mix", "push=2,pop=1,recv_ack=1,push_batch=1", "--batch-size", "20"]
    run = await asyncio.to_thread(
        subprocess.run, cmd, capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    final = json.loads(await asyncio.to_thread(Path(f"{out}.json").read_text))
    return run, final


async def test_zerohop_users_follow_a_dead_nodes_group_to_its_new_leader_without_failures(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(nodes=4, replication=3)
    victim = cluster.config.node_ids[2]

    async def settled() -> bool:
        return set(await leaders(cluster, victim)) == {victim}

    async def moved() -> bool:
        return all(x not in (None, victim) for x in await leaders(cluster, victim, skip=victim))

    await wait_until(settled, timeout_s=30, what="the group's first leader")
    cluster.kill(victim)
    cluster.release_port(victim)  # refused, as a crashed host's port would be
    await wait_until(moved, timeout_s=30, what="a new leader")
    run, final = await zerohop_users(cluster, tmp_path)
    counts = {e["name"]: e["num_requests"] for e in final}
    failures = {e["name"]: e["num_failures"] for e in final if e["num_failures"]}
    assert not failures, f"{failures}\n{run.stderr[-3000:]}"
    assert run.returncode == 0, run.stderr[-3000:]
    # Every user's first call for the dead node's group was refused and moved on.
    assert counts.get("push (moved)", 0) + counts.get("push_batch (moved)", 0) > 0, counts
    assert counts["push"] > 0 and counts["ack"] > 0, counts


async def test_zerohop_users_started_from_cluster_yaml_follow_a_grown_clusters_map(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """A groups layout grown from 4 nodes to 6: the new nodes lead groups cluster.yaml
    does not place on them. Users that start from cluster.yaml take the newer map at
    the first reply that names its epoch, and reach those leaders without failures."""
    cluster = make_cluster(nodes=4, replication=3, groups=8)
    async with zdmq.Client.from_config(cluster.config_path) as c:
        for node in ("n5", "n6"):
            address = cluster.joining(node)
            cluster.start_node(node)
            await c.add_node(node, address)

        seen: list[Any] = []

        async def idle() -> bool:
            seen[:] = [await c.moves()]
            return not moves_active(seen[0])

        try:
            await wait_until(idle, timeout_s=120, what="the moves to n5 and n6")
        except AssertionError as e:
            logs = {n: rebalance_lines(p.log_path) for n, p in cluster.nodes.items()}
            raise AssertionError(f"{e}; the moves: {seen}; the nodes' logs: {logs}") from None
        m = await c.cluster_map()
    assert {g["members"][0] for g in m["groups"]} >= {"n5", "n6"}  # they lead some

    async def handed_over() -> bool:
        # Leadership follows the moves: each group's first member leads it, as every
        # member sees it (the users' 5 s do not go into waiting out a hand-over).
        for g in m["groups"]:
            if set(await leaders(cluster, g["id"])) != {g["members"][0]}:
                return False
        return True

    await wait_until(handed_over, timeout_s=60, what="each group led by its first member")
    run, final = await zerohop_users(cluster, tmp_path)
    assert sum(e["num_requests"] for e in final) > 0, run.stderr[-3000:]
    failures = {e["name"]: e["num_failures"] for e in final if e["num_failures"]}
    assert not failures, f"{failures}\n{run.stderr[-3000:]}"
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"routing by the cluster map of epoch {m['epoch']}" in run.stderr, run.stderr[-3000:]
