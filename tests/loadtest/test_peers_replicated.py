"""The replicated peers (nats-r3, rabbitmq-quorum3 from loadtest/peers/peers.sh): their rows
in peers.json, and, when they are running here, a round trip through their drivers that checks
every message comes back once and the queue is held by three servers in sync.

The tests that need the peers running are marked `bench`, which the default run (and CI,
which installs no peers) leaves out. To run them, start the peers, then select the marker:

    sudo loadtest/peers/peers.sh install && loadtest/peers/peers.sh install-nats-pypi
    loadtest/peers/peers.sh start nats-r3 rabbitmq-quorum3
    .venv/bin/pytest tests/loadtest/test_peers_replicated.py -m bench

Asked for while a peer is not running, each skips, saying how to start it. The full
contract check is loadtest/peers/check_drivers.py (one of the bench tests runs it).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from zdmq.bench.runner import peer_systems

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "loadtest" / "peers"
sys.path.insert(0, str(PEERS))

import check_drivers  # noqa: E402

from zdmq.bench.driver import SystemSpec, open_driver  # noqa: E402

PEERS_JSON = Path(os.environ.get("PEERS_DIR", "/tmp/zdmq-peers")) / "peers.json"
# peer in peers.json -> (its row, the Python client it needs)
REPLICATED = {
    "nats-r3": ("nats r3 sync always", "nats"),
    "rabbitmq-quorum3": ("rabbitmq quorum r3", "aio_pika"),
}


def _cluster_entry(name: str, ports: list[int], pids: list[int]) -> dict[str, object]:
    return {
        "name": name,
        "host": "127.0.0.1",
        "port": ports[0],
        "ports": ports,
        "pids": pids,
        "durability": "fsync",
        "version": "v",
        "dir": "/nowhere",
    }


@pytest.fixture
def three_pids() -> Iterator[list[int]]:
    """Three live processes of this user (the bench skips a peer with a dead pid)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield [os.getpid(), os.getppid(), child.pid]
    child.kill()
    child.wait()


def test_a_cluster_peer_gives_one_row_with_every_port_and_every_server_pid(
    tmp_path: Path, three_pids: list[int]
) -> None:
    alive = three_pids
    path = tmp_path / "peers.json"
    path.write_text(
        json.dumps(
            {
                "peers": [
                    _cluster_entry("nats-r3", [14231, 14232, 14233], alive),
                    _cluster_entry("rabbitmq-quorum3", [16691, 16692, 16693], alive),
                ]
            }
        )
    )
    specs, notes = peer_systems(path)
    assert notes == []
    by_name = {s.name: s for s in specs}
    assert set(by_name) == {"nats r3 sync always", "rabbitmq quorum r3"}
    nats, rabbit = by_name["nats r3 sync always"], by_name["rabbitmq quorum r3"]
    # the bench sums server CPU over server_pids: all three servers of each
    assert nats.server_pids == rabbit.server_pids == tuple(alive)
    assert nats.options["ports"] == [14231, 14232, 14233] and nats.options["replicas"] == 3
    assert rabbit.options["ports"] == [16691, 16692, 16693]
    assert rabbit.options["queue_type"] == "quorum" and rabbit.options["quorum_size"] == 3
    assert nats.durability == rabbit.durability == "fsync"


def test_a_cluster_peer_with_one_server_gone_is_skipped_by_the_bench(tmp_path: Path) -> None:
    gone = 2**22 + 4321
    path = tmp_path / "peers.json"
    path.write_text(
        json.dumps({"peers": [_cluster_entry("nats-r3", [1, 2, 3], [os.getpid(), gone])]})
    )
    specs, notes = peer_systems(path)
    assert specs == [] and notes == ["skipped nats r3 sync always: its server is not running"]


def _running_row(peer: str) -> SystemSpec:
    row, client = REPLICATED[peer]
    pytest.importorskip(client, reason=f"{client} not installed: loadtest/peers/peers.sh install")
    how = f"loadtest/peers/peers.sh start {peer}"
    if not PEERS_JSON.exists():
        pytest.skip(f"no {PEERS_JSON}: {peer} not running; {how}")
    specs, _ = peer_systems(PEERS_JSON)
    found = [s for s in specs if s.name == row]
    if not found:
        pytest.skip(f"{peer} not running (not in {PEERS_JSON}); {how}")
    return found[0]


async def _round_trip(
    spec: SystemSpec,
) -> tuple[collections.Counter[bytes], list[bytes], list[str], dict[str, int]]:
    queue = f"smoke-{uuid.uuid4().hex[:8]}"
    admin = open_driver(spec, queue)
    await admin.open()
    await admin.reset()
    bodies = [f"{queue}-{i}".encode() for i in range(100)]
    for b in bodies[:20]:
        await admin.push(b)
    await admin.push_batch(bodies[20:])
    problems = await check_drivers.check_replicas(admin, spec, PEERS_JSON.parent)
    consumers = [open_driver(spec, queue) for _ in range(2)]
    seen: collections.Counter[bytes] = collections.Counter()

    async def consume(d: check_drivers.Driver) -> None:
        await d.open()
        for _ in range(200):
            if sum(seen.values()) >= len(bodies):
                break
            got = await d.receive(25, wait_s=0.2)
            seen.update(b for b, _ in got)
            await d.ack([t for _, t in got])

    await asyncio.wait_for(asyncio.gather(*(consume(d) for d in consumers)), 60)
    for d in consumers:
        await d.close()
    left = await check_drivers.settled_depth(admin)
    await check_drivers.drop(admin)
    await admin.close()
    return seen, bodies, problems, left


@pytest.mark.bench
@pytest.mark.parametrize("peer", sorted(REPLICATED))
def test_a_running_replicated_peer_delivers_each_message_once_from_three_servers(
    peer: str,
) -> None:
    spec = _running_row(peer)
    assert len(spec.server_pids) == 3 and len(spec.options["ports"]) == 3
    seen, bodies, problems, left = asyncio.run(_round_trip(spec))
    assert problems == []
    assert sorted(seen) == sorted(bodies) and max(seen.values()) == 1
    assert not any(left.values()), left


async def _replica_problems(spec: SystemSpec, copies: int) -> list[str]:
    """What the replica check says of a queue made with `copies` replicas, not 3."""
    fewer = "replicas" if "replicas" in spec.options else "quorum_size"
    small = replace(spec, options={**spec.options, fewer: copies})
    d = open_driver(small, f"smoke-{uuid.uuid4().hex[:8]}")
    await d.open()
    await d.reset()
    await d.push(b"one")
    problems = await check_drivers.check_replicas(d, spec, PEERS_JSON.parent, limit_s=1.0)
    await check_drivers.drop(d)
    await d.close()
    return problems


@pytest.mark.bench
@pytest.mark.parametrize("peer", sorted(REPLICATED))
def test_the_replica_check_fails_on_a_queue_with_two_copies(peer: str) -> None:
    spec = _running_row(peer)
    problems = asyncio.run(_replica_problems(spec, 2))
    assert problems and all("should be on 3 servers" in p for p in problems), problems


@pytest.mark.bench
@pytest.mark.parametrize("peer", sorted(REPLICATED))
def test_check_drivers_passes_on_a_running_replicated_peer(peer: str) -> None:
    row = _running_row(peer).name
    proc = subprocess.run(
        [
            sys.executable,
            str(PEERS / "check_drivers.py"),
            "--peers-json",
            str(PEERS_JSON),
            "--only",
            row,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 0 failed" in proc.stdout
