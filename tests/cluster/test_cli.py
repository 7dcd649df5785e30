"""The `zdmq` command against real node processes: the demo, queue, push, pop, status, up."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import unique
from zdmq.local import LocalCluster


def zdmq(
    *args: str, timeout_s: float = 120, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zdmq.cli", *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_queue_create_takes_delivery_settings_and_push_takes_a_dedup_id(
    cluster4: LocalCluster,
) -> None:
    cfg = str(cluster4.config_path)
    dlq, q = unique("cli-dlq"), unique("cli")
    assert zdmq("queue", "create", dlq, "--config", cfg).returncode == 0
    made = zdmq(
        "queue",
        "create",
        q,
        "--visibility-timeout",
        "5",
        "--max-receives",
        "2",
        "--dead-letter-queue",
        dlq,
        "--config",
        cfg,
    )
    assert made.returncode == 0, made.stderr
    assert "visibility_timeout_s=5.0" in made.stdout and f"dead_letter_queue={dlq}" in made.stdout
    bad = zdmq("queue", "create", unique("cli"), "--max-receives", "2", "--config", cfg)
    assert bad.returncode == 1 and "dead_letter_queue" in bad.stderr
    ids = {zdmq("push", q, "once", "--dedup-id", "k1", "--config", cfg).stdout for _ in range(3)}
    assert len(ids) == 1
    stats = zdmq("queue", "stats", q, "--config", cfg)
    assert f"{q}: 1 messages" in stats.stdout and "0 in flight" in stats.stdout


def test_demo_on_a_running_cluster_pushes_and_pops_every_message_once(
    cluster4: LocalCluster,
) -> None:
    r = zdmq("--config", str(cluster4.config_path), "demo", "--messages", "600", "--no-spark")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "using the running cluster" in r.stdout
    assert "lost=0 duplicates=0 corrupted=0 -> OK" in r.stdout
    assert "out to 2 subscriptions, each got every one once" in r.stdout
    assert "FAILED" not in r.stdout
    # It reports where the messages lived, a row per node, the shares adding up to 100%.
    rows = [line.split() for line in r.stdout.splitlines()]
    rows = [row for row in rows if row and row[0] in cluster4.config.node_ids]
    assert sorted(row[0] for row in rows) == sorted(cluster4.config.node_ids)
    assert sum(int(row[1]) for row in rows) == 600
    assert abs(sum(float(row[-1]) for row in rows) - 100) < 0.5


def test_queue_push_pop_and_status_commands_round_trip(cluster4: LocalCluster) -> None:
    cfg = str(cluster4.config_path)
    q = unique("cli")
    assert zdmq("queue", "create", q, "--config", cfg).returncode == 0
    again = zdmq("queue", "create", q, "--config", cfg)
    assert again.returncode == 1 and "queue_exists" in again.stderr
    pushed = zdmq("push", q, "hello from the cli", "--config", cfg)
    assert pushed.returncode == 0, pushed.stderr
    msg_id = pushed.stdout.strip()
    from_stdin = zdmq("push", q, "--config", cfg, stdin=b"from stdin")
    assert from_stdin.returncode == 0, from_stdin.stderr
    stats = zdmq("queue", "stats", q, "--config", cfg)
    assert stats.returncode == 0 and f"{q}: 2 messages" in stats.stdout
    # A row per node: its count, a bar, its share.
    rows = [line.split() for line in stats.stdout.splitlines()]
    rows = [row for row in rows if row and row[0] in cluster4.config.node_ids]
    assert sorted(row[0] for row in rows) == sorted(cluster4.config.node_ids)
    assert sum(int(row[1]) for row in rows) == 2
    as_json = json.loads(zdmq("queue", "stats", q, "--json", "--config", cfg).stdout)
    assert as_json["messages"] == 2 and sum(as_json["depth"].values()) == 2
    assert q in zdmq("queue", "list", "--config", cfg).stdout.split()
    assert q in json.loads(zdmq("queue", "list", "--json", "--config", cfg).stdout)
    popped = zdmq("pop", q, "-n", "3", "--json", "--config", cfg)
    assert popped.returncode == 0, popped.stderr
    bodies = sorted(line for line in popped.stdout.splitlines())
    assert len(bodies) == 2 and any(msg_id in b for b in bodies)
    assert "(empty)" in popped.stderr
    status = zdmq("status", "--config", cfg)
    assert status.returncode == 0 and status.stdout.count(" OK ") == 4
    assert zdmq("queue", "delete", q, "--config", cfg).returncode == 0
    gone = zdmq("pop", q, "--config", cfg)
    assert gone.returncode == 1 and "queue_not_found" in gone.stderr


def test_push_takes_delivery_options_and_pop_a_minimum_priority(cluster4: LocalCluster) -> None:
    cfg = str(cluster4.config_path)
    q = unique("cli-opts")
    assert zdmq("queue", "create", q, "--config", cfg).returncode == 0
    pushed = zdmq(
        "push", q, "urgent", "--priority", "8", "--ttl", "600", "--attr", "k=v", "--config", cfg
    )
    assert pushed.returncode == 0, pushed.stderr
    assert zdmq("push", q, "later", "--delay", "30", "--config", cfg).returncode == 0
    bad = zdmq("push", q, "x", "--attr", "novalue", "--config", cfg)
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr
    popped = zdmq("pop", q, "-n", "2", "--json", "--min-priority", "5", "--config", cfg)
    assert popped.returncode == 0, popped.stderr
    [line] = popped.stdout.splitlines()
    assert '"priority": 8' in line and '"attributes": {"k": "v"}' in line
    stats = zdmq("queue", "stats", q, "--config", cfg)
    assert f"{q}: 1 messages" in stats.stdout, stats.stdout


def test_a_bad_config_file_names_the_field_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("nodes:\n  - {id: n1, host: 127.0.0.1, port: nope}\n")
    r = zdmq("--config", str(bad), "status")
    assert r.returncode == 2 and "nodes[0].port" in r.stderr


def test_a_node_refuses_an_address_for_an_id_the_file_lists(tmp_path: Path) -> None:
    """--address is for a node that joins a running cluster, not one the file lists."""
    cfg = tmp_path / "cluster.yaml"
    nodes = "".join(f"  - {{id: n{i}, host: 127.0.0.1, port: {7790 + i}}}\n" for i in (1, 2, 3))
    cfg.write_text(f"nodes:\n{nodes}replication: 3\ngroups: 24\ndata_dir: {tmp_path}\n")
    argv = [sys.executable, "-m", "zdmq.server", "--config", str(cfg), "--node", "n1"]
    r = subprocess.run(
        [*argv, "--address", "127.0.0.1:7799"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode != 0 and "needs no --address" in r.stderr, r.stderr
    bad = subprocess.run(
        [*argv[:-1], "n9", "--address", "nowhere"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode != 0 and "expected host:port" in bad.stderr, bad.stderr


def _free_ports(n: int) -> list[int]:
    # `zdmq up` binds the ports its file names, so this test has to name free ones: the
    # kernel picks them, they are released, and `up` binds them. Another process could take
    # one in between; the test then retries with new ports rather than flake.
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_up_starts_every_node_and_stops_them_all_on_sigterm(
    tmp_path: Path, log_format: str
) -> None:
    for attempt in range(3):
        cfg = tmp_path / f"up{attempt}.yaml"
        nodes = [
            {"id": f"n{i + 1}", "host": "127.0.0.1", "port": p}
            for i, p in enumerate(_free_ports(3))
        ]
        cfg.write_text(yaml.safe_dump({"nodes": nodes, "data_dir": str(tmp_path / "data")}))
        proc = subprocess.Popen(
            [sys.executable, "-m", "zdmq.cli", "up", "--config", str(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # The nodes' log format: `up` waits for either form of their readiness line.
            env={**os.environ, "PYTHONUNBUFFERED": "1", "ZDMQ_LOG_FORMAT": log_format},
        )
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        if "nodes ready" not in lines[1]:
            proc.wait(30)
            assert proc.stderr is not None
            err = proc.stderr.read()
            if "cannot listen" in err:
                continue  # a port was taken between choosing and binding: try new ones
            pytest.fail(f"zdmq up did not get ready: {lines} {err}")
        assert "3 nodes ready" in lines[1]
        status = zdmq("status", "--config", str(cfg))
        assert status.returncode == 0 and status.stdout.count(" OK ") == 3
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert "all nodes stopped" in out
        down = zdmq("status", "--config", str(cfg))
        assert down.returncode == 1 and down.stdout.count("DOWN") == 3
        return
    pytest.fail("could not find free ports for zdmq up in 3 attempts")


def test_topic_commands_subscribe_publish_show_and_unsubscribe(cluster4: LocalCluster) -> None:
    cfg = str(cluster4.config_path)
    t, a, b = unique("cli-t"), unique("cli-a"), unique("cli-b")

    def ok(*args: str) -> str:
        done = zdmq("topic", *args, "--config", cfg)
        assert done.returncode == 0, done.stderr
        return done.stdout

    ok("create", t)
    assert zdmq("topic", "create", t, "--config", cfg).returncode == 1  # topic_exists
    assert t in ok("list").split()
    assert json.loads(ok("list", "--json")).count(t) == 1
    ok("subscribe", t, a)
    ok("subscribe", t, b)
    published = ok("publish", t, "hello", "--dedup-id", "k1")
    assert {line.split()[0] for line in published.splitlines()} == {a, b}
    assert "(duplicate)" in ok("publish", t, "hello", "--dedup-id", "k1")
    # A table row per subscription, with its counts: one message each.
    shown = ok("show", t)
    assert f"{t}: 2 subscription(s)" in shown
    rows = {line.split()[0]: line.split()[1:] for line in shown.splitlines() if line.strip()}
    assert rows[a] == rows[b] == ["1", "0", "0", "0"], shown
    subs = json.loads(ok("show", t, "--json"))["subscriptions"]
    assert sorted(subs) == sorted([a, b]) and subs[a]["messages"] == 1
    assert "1 pending message(s) purged" in ok("unsubscribe", t, b)
    assert zdmq("pop", a, "--config", cfg).stdout.strip() == "hello"
    ok("delete", t)
    assert t not in ok("list").split()
