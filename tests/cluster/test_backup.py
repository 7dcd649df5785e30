"""Backups of a running cluster (`zdmq backup`, `GET /v1/backup/<group>`), and a restore of
the whole cluster into new data directories (`zdmq restore`), on real node processes.

A running node holds its SQLite files exclusively: another reader is refused, so the
backup is made by the nodes (a consistent copy of each replica group's state from its
leader). After every data directory is lost, the restored cluster holds every message that
was stored at backup time (leases and all), none pushed after it, and keeps working.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import aiohttp
import pytest

from tests.helpers import unique
from zdmq import Client, ReceivedMessage
from zdmq.local import LocalCluster

# Its clusters are its own, with the replication each test gives and never TLS: the TLS,
# replication 3 pass of tests/cluster would run them exactly as the first pass did.
pytestmark = pytest.mark.main_pass_only

ADMIN = "admin-token-0123456789abcdef"
ORDERS_ADMIN = "orders-admin-0123456789abcdef"  # admin on orders-* only
TOKENS = [
    {"name": "admin", "token": ADMIN, "rights": {"": ["admin"]}},
    {"name": "orders", "token": ORDERS_ADMIN, "rights": {"orders-": ["admin"]}},
]


def cli(config: Path, *args: str, token: str | None = ADMIN) -> subprocess.CompletedProcess[str]:
    """`zdmq --config <config> <args>`, with `token` in $ZDMQ_TOKEN."""
    env = {k: v for k, v in os.environ.items() if k != "ZDMQ_TOKEN"}
    if token is not None:
        env["ZDMQ_TOKEN"] = token
    argv = [sys.executable, "-m", "zdmq.cli", "--config", str(config), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def zdmq(cluster: LocalCluster, *args: str, token: str | None = ADMIN) -> str:
    done = cli(cluster.config_path, *args, token=token)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def drain(c: Client, queue: str, want: int, timeout_s: float = 20) -> dict[str, bytes]:
    """Receives and acks every message of `queue` (id -> body); stops once `want` are in
    and the queue's stats show none left."""
    got: dict[str, bytes] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msgs = await c.receive(queue, 100, wait_s=0.2)
        if msgs:
            for m in msgs:
                got[m.id] = m.body
            await c.ack(queue, [m.receipt for m in msgs])
            continue
        if len(got) >= want and (await c.stats(queue)).messages == 0:
            return got
    raise AssertionError(f"{queue}: {len(got)} of {want} drained in {timeout_s}s")


@pytest.mark.parametrize("replication", [3, 1])
async def test_a_backup_of_a_running_cluster_restores_every_message_it_held(
    tmp_path: Path, replication: int
) -> None:
    cluster = LocalCluster.ephemeral(
        tmp_path / "c",
        nodes=4,
        replication=replication,
        durability="fsync",
        auth={"client_tokens": TOKENS},
    )
    backup = tmp_path / "backup"
    q, q2 = unique("orders-"), unique("billing-")
    try:
        cluster.start()
        # A running node's state file cannot be read by another process.
        name = "group-n1.sqlite3" if replication > 1 else "zdmq.sqlite3"
        path = cluster.config.node_data_dir("n1") / name
        with (
            closing(sqlite3.connect(path, timeout=0.2)) as db,
            pytest.raises(sqlite3.OperationalError, match="locked"),
        ):
            db.execute("SELECT count(*) FROM messages").fetchone()

        async with Client.from_config(cluster.config_path, token=ADMIN) as c:
            await c.create_queue(q, visibility_timeout_s=2.0)
            await c.create_queue(q2)
            ids = [await c.push(q, f"m{i}") for i in range(200)]
            ids2 = [await c.push(q2, f"b{i}") for i in range(40)]
            acked: set[str] = set()
            while len(acked) < 50:  # acked before the backup: gone for good
                msgs = await c.receive(q, 50 - len(acked))
                await c.ack(q, [m.receipt for m in msgs])
                acked |= {m.id for m in msgs}
            leased: list[ReceivedMessage] = []  # in flight at backup time
            while len(leased) < 20:  # a receive takes from one node: it may hold fewer
                leased += await c.receive(q, 20 - len(leased), visibility_s=2.0)

            out = zdmq(cluster, "backup", str(backup))
            manifest = json.loads((backup / "backup.json").read_text())
            assert sorted(manifest["groups"]) == ["n1", "n2", "n3", "n4"]
            assert manifest["replication"] == replication
            if replication > 1:
                assert all(g["index"] > 0 for g in manifest["groups"].values()), manifest
            assert "wrote" in out
            assert sorted(p.name for p in backup.iterdir()) == [
                "backup.json",
                *(f"group-n{i}.sqlite3" for i in range(1, 5)),
            ]

            # Only a token with admin on every queue may back up.
            url = cluster.urls[0]
            async with aiohttp.ClientSession() as http:
                for headers, status in (
                    ({}, 401),
                    ({"Authorization": f"Bearer {ORDERS_ADMIN}"}, 403),
                    ({"Authorization": f"Bearer {ADMIN}"}, 404),
                ):
                    async with http.get(f"{url}/v1/backup/nope", headers=headers) as r:
                        assert r.status == status, await r.text()
                        assert "error" in await r.json()
                async with http.get(
                    f"{url}/v1/backup/n1?copy=0123456789abcdef&offset=5",
                    headers={"Authorization": f"Bearer {ADMIN}"},
                ) as r:
                    assert r.status in (404, 421), await r.text()

            # After the backup: pushed and acked, neither in the backup.
            later = [await c.push(q, f"late{i}") for i in range(30)]
            for m in await c.receive(q, 10):
                await c.ack(q, [m.receipt])
        cluster.stop()

        # Every copy of every group is gone: restore each node into a new data directory.
        for n in cluster.config.node_ids:
            shutil.rmtree(cluster.config.node_data_dir(n))
        for n in cluster.config.node_ids:
            assert "wrote" in zdmq(cluster, "restore", str(backup), "--node", n, token=None)
        cluster.start()
        if replication > 1:
            # Each group's new log goes on at a term no lower than the backup's.
            async with aiohttp.ClientSession() as http:
                for n in cluster.config.node_ids:
                    async with http.get(cluster.config.node(n).url + "/v1/health") as r:
                        groups = (await r.json())["groups"]
                    for g, seen in groups.items():
                        assert seen["term"] > manifest["groups"][g]["term"], (n, g, seen)
                        assert seen["applied"] >= manifest["groups"][g]["index"], (n, g, seen)

        async with Client.from_config(cluster.config_path, token=ADMIN) as c:
            stored = set(ids) - acked
            got = await drain(c, q, len(stored))
            assert set(got) == stored, (len(got), len(stored))
            assert not set(later) & set(got)
            assert {got[m.id] for m in leased} == {m.body for m in leased}
            got2 = await drain(c, q2, len(ids2))
            assert set(got2) == set(ids2)
            # The restored cluster keeps working.
            fresh = await c.push(q, "after restore")
            popped = await c.pop(q, wait_s=2.0)
            assert popped is not None and popped.id == fresh
            assert (await c.stats(q)).messages == 0
    finally:
        cluster.close()


async def test_a_restore_refuses_a_used_data_directory_or_another_layout(tmp_path: Path) -> None:
    cluster = LocalCluster.ephemeral(
        tmp_path / "c", nodes=4, replication=3, auth={"client_tokens": TOKENS}
    )
    backup = tmp_path / "backup"
    try:
        cluster.start()
        async with Client.from_config(cluster.config_path, token=ADMIN) as c:
            await c.backup(backup)
        cluster.stop()
        done = cli(cluster.config_path, "restore", str(backup), "--node", "n1")
        assert done.returncode == 2 and "not empty" in done.stderr, done.stderr
        other = LocalCluster.ephemeral(tmp_path / "o", nodes=3, replication=3)
        done = cli(other.config_path, "restore", str(backup), "--node", "n1")
        other.close()
        assert done.returncode == 2 and "layout" in done.stderr, done.stderr
        # A damaged copy is refused.
        shutil.rmtree(cluster.config.node_data_dir("n1"))
        damaged = bytearray((backup / "group-n1.sqlite3").read_bytes())
        damaged[-100] ^= 0xFF
        (backup / "group-n1.sqlite3").write_bytes(bytes(damaged))
        done = cli(cluster.config_path, "restore", str(backup), "--node", "n1")
        assert done.returncode == 2 and "SHA-256" in done.stderr, done.stderr
        assert not (cluster.config.node_data_dir("n1") / "group-n1.sqlite3").exists()
    finally:
        cluster.close()
