"""The cluster status: `GET /v1/status` through every node and `zdmq status` (plain,
`--json`, and `--watch` in a real terminal under tmux), against real node processes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers import unique, wait_until
from zdmq import Client
from zdmq.local import LocalCluster


async def _status(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/v1/status") as r:
        assert r.status == 200, await r.text()
        assert r.content_type == "application/json"
        payload: dict[str, Any] = await r.json()
        return payload


async def _push(client: Client, queue: str, n: int) -> None:
    await asyncio.gather(*(client.push(queue, f"m{i}".encode()) for i in range(n)))


def _row(status: dict[str, Any], queue: str) -> dict[str, Any] | None:
    return next((q for q in status["queues"] if q["queue"] == queue), None)


async def test_status_through_every_node_matches_the_queue_stats_and_counts_the_pushes(
    cluster4: LocalCluster, client: Client, http: aiohttp.ClientSession
) -> None:
    q = unique("status")
    await client.create_queue(q)
    await _push(client, q, 120)
    [m] = await client.receive(q, 1)
    stats = await client.stats(q)
    for url in cluster4.urls:
        status = await _status(http, url)
        assert [n["id"] for n in status["nodes"]] == list(cluster4.config.node_ids)
        assert all(n["up"] and n["status"] == "ok" for n in status["nodes"])
        row = _row(status, q)
        assert row is not None
        assert row["messages"] == stats.messages == 120
        assert row["depth"] == stats.depth and len(row["depth"]) >= 3
        assert row["in_flight"] == stats.in_flight == 1
        assert row["delayed"] == 0
        if status["replication"] > 1:
            # Every group has one leader, which sees each follower's lag.
            leaders = [
                (n["id"], g, s)
                for n in status["nodes"]
                for g, s in n["groups"].items()
                if s["role"] == "leader"
            ]
            assert sorted(g for _, g, _ in leaders) == list(cluster4.config.node_ids)
            for _, _, s in leaders:
                assert len(s["lag"]) == status["replication"] - 1
                assert all(v >= 0 for v in s["lag"].values())
                assert s["applied"] <= s["commit"] <= s["last"]
    await client.ack(q, m.receipt)

    async def pushes_counted() -> bool:
        rates = (await _status(http, cluster4.urls[0]))["rates"]
        assert len(rates["push"]) == rates["end"] - rates["start"] + 1
        # The per-second rates add up to the pushes (the module's first test: its cluster
        # has seen only these 120 pushes and 1 ack; a replica group's followers apply the
        # pushes too, but count none of them).
        assert sum(rates["push"]) <= 120 * 1.1
        return sum(rates["push"]) >= 120 * 0.9 and sum(rates["ack"]) >= 0.9

    await wait_until(pushes_counted, timeout_s=5, what="the pushes in the rates")
    await client.delete_queue(q)


async def test_a_killed_node_is_reported_down_within_two_seconds(
    make_cluster: Any, http: aiohttp.ClientSession
) -> None:
    cluster: LocalCluster = make_cluster(nodes=3, partitions=64)
    cluster.kill("n2")
    started = time.monotonic()
    status = await _status(http, cluster.urls[0])
    took = time.monotonic() - started
    assert took < 2.0, took
    up = {n["id"]: n["up"] for n in status["nodes"]}
    assert up == {"n1": True, "n2": False, "n3": True}
    down = status["nodes"][1]
    assert down["status"] == "down" and down["detail"]


async def test_the_page_and_its_files_are_served_by_every_node(
    cluster4: LocalCluster, http: aiohttp.ClientSession
) -> None:
    for url in cluster4.urls:
        async with http.get(url + "/") as r:
            assert r.status == 200 and r.content_type == "text/html"
            page = await r.text()
        assert '<script src="/ui/status.js">' in page
        for path, ctype in (("/ui/status.js", "text/javascript"), ("/ui/status.css", "text/css")):
            async with http.get(url + path) as r:
                assert r.status == 200 and r.content_type == ctype
                assert len(await r.read()) > 500
    # No other file is served from there.
    async with http.get(cluster4.urls[0] + "/ui/../cluster.yaml") as r:
        assert r.status == 404


# ---- zdmq status ------------------------------------------------------------------------
def _zdmq(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zdmq.cli", *args], capture_output=True, text=True, timeout=timeout_s
    )


async def test_zdmq_status_json_is_the_endpoints_and_matches_the_queue_stats(
    cluster4: LocalCluster, client: Client
) -> None:
    q = unique("status-cli")
    await client.create_queue(q)
    await _push(client, q, 40)
    stats = await client.stats(q)
    r = await asyncio.to_thread(_zdmq, "status", "--json", "--config", str(cluster4.config_path))
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    row = _row(status, q)
    assert row is not None and row["messages"] == 40 and row["depth"] == stats.depth
    # The cluster map's epoch: the one the client routes by (the map has not changed).
    assert status["epoch"] == client.epoch == 1
    # No rebalancer with one copy; with replication, the home group leader's, idle.
    moves = status["moves"]
    if status["replication"] == 1:
        assert moves is None
    else:
        assert moves["current"] is None and moves["pending_steps"] == 0
    # The tables: every node OK, and the queue with its depth on each node.
    r = await asyncio.to_thread(_zdmq, "status", "--config", str(cluster4.config_path))
    assert r.returncode == 0 and r.stdout.count(" OK ") == 4, r.stdout
    assert ", map epoch 1," in r.stdout and "Moves" not in r.stdout
    [line] = [ln for ln in r.stdout.splitlines() if q in ln]
    cells = [c.strip() for c in line.strip("│ ").split("│")]
    ids = cluster4.config.node_ids
    assert cells[1] == "40"
    assert {n: int(c) for n, c in zip(ids, cells[4:], strict=True) if c != "0"} == stats.depth
    await client.delete_queue(q)


def _tmux(socket: Path, *args: str) -> list[str]:
    """A tmux command on a server of the test's own (`-S`): a tmux server already running,
    another test run's say, would start the command with that server's environment."""
    return ["tmux", "-S", str(socket), *args]


def _pane(socket: Path, session: str) -> str:
    return subprocess.run(
        _tmux(socket, "capture-pane", "-p", "-t", session),
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def _shown_depth(screen: str, queue: str) -> int | None:
    for line in screen.splitlines():
        if queue in line:
            return int(line.split("│")[2].strip().replace(",", ""))
    return None


async def test_zdmq_status_watch_redraws_in_a_terminal(
    cluster4: LocalCluster, client: Client, tmp_path: Path
) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install tmux)")
    q = unique("watch")
    await client.create_queue(q)
    await _push(client, q, 5)
    session, socket = unique("zdmq-watch"), tmp_path / "tmux.sock"
    command = " ".join(
        [
            sys.executable,
            "-m",
            "zdmq.cli",
            "status",
            "--watch",
            "--config",
            str(cluster4.config_path),
        ]
    )
    await asyncio.to_thread(
        subprocess.run,
        _tmux(socket, "new-session", "-d", "-s", session, "-x", "160", "-y", "60", command),
        check=True,
        # The terminal gives the watch its size: COLUMNS and LINES (pytest-xdist's workers
        # set 80 and 24) would override it, and a short screen cuts the queue table.
        env={k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        | {"TERM": "xterm-256color"},
    )
    try:

        async def shows(n: int) -> bool:
            return _shown_depth(await asyncio.to_thread(_pane, socket, session), q) == n

        await wait_until(lambda: shows(5), timeout_s=15, what="the watch to show the queue")
        await _push(client, q, 7)
        await wait_until(lambda: shows(12), timeout_s=5, what="the watch to redraw the push")
    finally:
        await asyncio.to_thread(subprocess.run, _tmux(socket, "kill-server"))
    await client.delete_queue(q)
