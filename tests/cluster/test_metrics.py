"""`GET /metrics` and the JSON logs of real node processes: a replicated cluster under a
short workload, a killed leader, and request ids from the caller's header to the log."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.helpers import unique, wait_until
from tests.scrape import ELECTION_TIMEOUT_S, scrape, total, value
from zdmq import Client
from zdmq.local import LocalCluster
from zdmq.logs import REQUEST_ID_HEADER, parse_ready_line


@pytest.mark.main_pass_only  # replication 3 of its own
async def test_metrics_count_a_replicated_workload_and_show_a_killed_leader_replaced(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession
) -> None:
    cluster = make_cluster(nodes=4, replication=3)
    nodes = list(cluster.config.node_ids)
    q = unique("metrics")
    async with Client.from_config(cluster.config_path, timeout_s=5) as c:
        await c.create_queue(q)
        before = {n: await scrape(http, cluster, n) for n in nodes}
        pushed = await c.push_many(q, [b"m%d" % i for i in range(120)])
        # Single pushes through every node (the ones that do not own an id forward it).
        for i, n in enumerate(nodes * 5):
            url = f"{cluster.config.node(n).url}/v1/queues/{q}/messages"
            async with http.post(url, data=b"one %d" % i) as r:
                assert r.status == 201, await r.text()
        stored = len(pushed) + 5 * len(nodes)
        stats = await c.stats(q)
        assert stats.messages == stored
        after_push = {n: await scrape(http, cluster, n) for n in nodes}
        # Each node counts the pushes of the group it leads (its own), and nothing else.
        for n in nodes:
            grew = value(after_push[n], "zdmq_messages_pushed_total", queue=q) - value(
                before[n], "zdmq_messages_pushed_total", queue=q
            )
            assert grew == stats.depth.get(n, 0), (n, grew, stats.depth)
        assert sum(value(after_push[n], "zdmq_messages_pushed_total", queue=q) for n in nodes) == (
            stored
        )

        received = await c.receive(q, 50, visibility_s=60)
        while len(received) < 50:
            received += await c.receive(q, 50 - len(received), visibility_s=60)
        acked = await c.ack(q, [m.receipt for m in received[:30]])
        assert (acked.done, acked.failed) == (30, {})
        stats = await c.stats(q)
        after = {n: await scrape(http, cluster, n) for n in nodes}
        assert sum(total(after[n], "zdmq_messages_received_total", queue=q) for n in nodes) == (
            len(received)
        )
        assert sum(total(after[n], "zdmq_messages_acked_total", queue=q) for n in nodes) == 30
        # Depth and in-flight gauges: what the queue's stats say, node by node.
        for n in nodes:
            assert value(after[n], "zdmq_queue_messages", queue=q) == stats.depth.get(n, 0), n
        in_flight = sum(value(after[n], "zdmq_queue_in_flight", queue=q) for n in nodes)
        assert in_flight == stats.in_flight == len(received) - 30
        for n in nodes:
            s = after[n]
            # Every request of the workload is counted under its route pattern.
            assert (
                value(
                    s,
                    "zdmq_http_requests_total",
                    route="/v1/queues/{queue}/messages",
                    method="POST",
                    code="201",
                )
                >= 5
            )
            assert total(s, "zdmq_http_request_duration_seconds_count") > 0
            assert total(s, "zdmq_commit_batch_size_count", store="state") > 0
            assert total(s, "zdmq_commit_batch_size_count", store="raft") > 0
            assert value(s, "zdmq_http_open_connections") >= 1
            assert value(s, "process_resident_memory_bytes") > 0
            assert value(s, "zdmq_raft_leader", group=n) == 1
            assert value(s, "zdmq_raft_role", group=n, role="leader") == 1
            assert value(s, "zdmq_raft_applied_index", group=n) > 0

        # Kill the leader of group n1: its other members (n2, n3) see a leader change,
        # and one of them started an election, within the election timeout.
        members = ("n2", "n3")
        was = {n: await scrape(http, cluster, n) for n in members}
        cluster.kill("n1")
        killed_at = time.monotonic()

        async def replaced() -> bool:
            now = {n: await scrape(http, cluster, n) for n in members}
            changed = all(
                value(now[n], "zdmq_raft_leader_changes_total", group="n1")
                > value(was[n], "zdmq_raft_leader_changes_total", group="n1")
                for n in members
            )
            elections = sum(
                value(now[n], "zdmq_raft_elections_total", group="n1")
                - value(was[n], "zdmq_raft_elections_total", group="n1")
                for n in members
            )
            leads = sum(value(now[n], "zdmq_raft_leader", group="n1") for n in members)
            return changed and elections >= 1 and leads == 1

        await wait_until(replaced, timeout_s=ELECTION_TIMEOUT_S + 2, what="a new leader of n1")
        print(f"group n1 led again {time.monotonic() - killed_at:.2f} s after the kill")
        await asyncio.to_thread(cluster.start_node, "n1")


async def test_a_deleted_queue_loses_its_series(
    make_cluster: Callable[..., LocalCluster], http: aiohttp.ClientSession
) -> None:
    cluster = make_cluster(nodes=2)
    q = unique("gone")
    async with Client.from_config(cluster.config_path, timeout_s=5) as c:
        await c.create_queue(q)
        await c.push_many(q, [b"x"] * 20)
        series = [await scrape(http, cluster, n) for n in cluster.config.node_ids]
        assert sum(value(s, "zdmq_messages_pushed_total", queue=q) for s in series) == 20
        await c.delete_queue(q)
        for n in cluster.config.node_ids:
            s = await scrape(http, cluster, n)
            assert not [k for k in s if ("queue", q) in k[1]], n


def _json_lines(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines()
    assert lines
    return [json.loads(line) for line in lines]  # every line: one JSON object


async def test_json_logs_are_json_on_every_line_and_carry_request_ids_and_raft_events(
    tmp_path: Path, tls: dict[str, str], client_ssl: Any
) -> None:
    token = "metrics-test-token-0123456789"
    cluster = LocalCluster.ephemeral(
        tmp_path,
        nodes=4,
        replication=3,
        auth={"client_tokens": [{"name": "ops", "token": token, "rights": {"": ["admin"]}}]},
        **({"tls": tls} if tls else {}),
    )
    for n in cluster.nodes.values():
        n.argv += ["--log-format", "json"]
    try:
        cluster.start()
        conn = aiohttp.TCPConnector(ssl=client_ssl if client_ssl is not None else True)
        async with aiohttp.ClientSession(connector=conn) as http:
            n1 = cluster.config.node("n1").url
            # Refused: no token. The caller's id comes back, and goes into the log line.
            async with http.get(
                f"{n1}/v1/queues", headers={REQUEST_ID_HEADER: "rid-refused-1"}
            ) as r:
                assert r.status == 401
                assert r.headers[REQUEST_ID_HEADER] == "rid-refused-1"
            # No id given: the node makes one up and says which.
            auth = {"Authorization": f"Bearer {token}"}
            async with http.get(f"{n1}/v1/queues", headers=auth) as r:
                assert r.status == 200
                assert r.headers[REQUEST_ID_HEADER]
            # An id that is not printable ASCII, or too long, is replaced.
            async with http.get(
                f"{n1}/v1/queues", headers={**auth, REQUEST_ID_HEADER: "x" * 200}
            ) as r:
                assert r.status == 200
                assert r.headers[REQUEST_ID_HEADER] != "x" * 200
            # A create sent to a node that does not own the queue's metadata is forwarded:
            # the owner logs the create under the caller's id.
            q = next(
                f"logq-{i}"
                for i in range(1000)
                if cluster.config.node_ids[0] != _owner(cluster, f"logq-{i}")
            )
            owner = _owner(cluster, q)
            headers = {
                **auth,
                REQUEST_ID_HEADER: "rid-forwarded-1",
                "Content-Type": "application/json",
            }
            async with http.put(f"{n1}/v1/queues/{q}", data=b"{}", headers=headers) as r:
                assert r.status == 201, await r.text()
                assert r.headers[REQUEST_ID_HEADER] == "rid-forwarded-1"
        # What n2 and n3 logged before the kill (group n1 may have changed leaders at
        # start, before its preferred leader took it back): only what follows counts.
        before = {n: len(_json_lines(cluster.nodes[n].log_path)) for n in ("n2", "n3")}
        cluster.kill("n1")

        async def elected() -> bool:
            # A new leader of group n1, and both of its other members have heard of it
            # (the one that lost hears at the winner's first append, a moment later).
            logs = {n: _json_lines(cluster.nodes[n].log_path)[before[n] :] for n in ("n2", "n3")}
            won = any(
                e.get("event") == "became_leader" and e.get("group") == "n1"
                for entries in logs.values()
                for e in entries
            )
            return won and all(
                any(
                    e.get("event") == "leader_changed"
                    and e.get("group") == "n1"
                    and e.get("leader") in ("n2", "n3")
                    for e in entries
                )
                for entries in logs.values()
            )

        await wait_until(elected, timeout_s=ELECTION_TIMEOUT_S + 3, what="n1's group re-elected")
        logs = {n: _json_lines(cluster.nodes[n].log_path) for n in cluster.config.node_ids}
    finally:
        cluster.close()
    # Everything each node wrote, on stderr (its log) and on stdout (its readiness line),
    # from start to stop: every line one JSON object.
    whole = {n: _json_lines(cluster.nodes[n].log_path) for n in cluster.config.node_ids}
    for n, node in cluster.nodes.items():
        events = {e.get("event") for e in whole[n]}
        assert ("stopped" in events) == (n != "n1"), (n, events)  # n1 was killed -9
        stdout = [json.loads(line) for line in node.stdout_lines]
        assert [(e["event"], e["node"], e["url"]) for e in stdout] == [
            ("ready", n, cluster.config.node(n).url)
        ]
        assert parse_ready_line(node.stdout_lines[0]) == (n, cluster.config.node(n).url)
    for n, entries in logs.items():
        for e in entries:
            assert {"time", "level", "logger", "message", "node"} <= e.keys(), e
            assert e["node"] == n
        events = {e.get("event") for e in entries}
        assert {"start", "ready", "leader_changed"} <= events, (n, events)
    refused = [e for e in logs["n1"] if e.get("event") == "auth_refused"]
    assert [e["request_id"] for e in refused] == ["rid-refused-1"], refused
    created = [e for e in logs[owner] if e.get("event") == "queue_created"]
    assert [(e["queue"], e["request_id"]) for e in created] == [(q, "rid-forwarded-1")]
    # After the kill: a campaign in group n1, a new leader, and the others saw it change.
    after = [e for n in ("n2", "n3") for e in logs[n] if e.get("group") == "n1"]
    assert any(e["event"] == "campaign" for e in after)
    assert any(e["event"] == "became_leader" for e in after)
    for n in ("n2", "n3"):
        changes = [e for e in logs[n] if e.get("event") == "leader_changed" and e["group"] == "n1"]
        assert changes[-1]["leader"] in ("n2", "n3"), changes
        assert changes[-1]["previous"] == "n1", changes


def test_a_node_that_cannot_start_under_json_logs_says_why_in_a_json_line(
    tmp_path: Path,
) -> None:
    # 192.0.2.0/24 is reserved for documentation: no host here has it.
    raw: dict[str, Any] = {
        "nodes": [{"id": "n1", "host": "192.0.2.1", "port": 7701}],
        "replication": 1,
        "data_dir": str(tmp_path / "data"),
        "auth": {"client_tokens": [{"token": "t" * 32, "rights": {"": ["admin"]}}]},
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "ZDMQ_NODE_SECRET": "s" * 32}
    why = {"n1": "cannot listen on 192.0.2.1", "n9": "zdmq node: "}  # n9: not in the file
    for node, message in why.items():
        argv = [sys.executable, "-m", "zdmq.server", "--config", str(path), "--node", node]
        proc = subprocess.run(
            [*argv, "--log-format", "json"], capture_output=True, text=True, timeout=60, env=env
        )
        assert proc.returncode == 1, proc.stderr
        assert proc.stdout == ""
        lines = [json.loads(line) for line in proc.stderr.splitlines()]
        last = lines[-1]
        assert (last["level"], last["event"], last["node"]) == ("CRITICAL", "exit", node), last
        assert message in last["message"], last


def _owner(cluster: LocalCluster, queue: str) -> str:
    from zdmq.hashing import Placement

    config = cluster.config
    return Placement(config.node_ids, config.partitions, config.replication).owner(queue)
