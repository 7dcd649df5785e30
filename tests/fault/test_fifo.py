"""FIFO groups through a kill -9: 4 real nodes, `replication: 3`, `durability: fsync`.

Producers push 20 groups' messages in order through random nodes, 8 consumers receive,
process a little while and ack; half way through, one node (drawn from the seed) is
killed -9 and restarted on its disk. `check_fifo` then requires, from what the clients
saw: each group's messages delivered in push order (a later one never before an earlier
one was acked; the message in flight at the kill may come again), never two messages of a
group held at once, nothing acked delivered again, and every message delivered and acked
in the end (the queue drains empty).
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from tests.fault.checker import check_fifo
from tests.fault.history import History
from tests.fault.test_replicated import CLIENT_TIMEOUT_S, settled
from tests.fault.workload import FifoWorkload, node_urls
from tests.helpers import unique
from zdmq.local import LocalCluster

VISIBILITY_S = 3.0


async def fifo_through_a_kill(
    cluster: LocalCluster, tmp_path: Path, seed: int, *, per_group: int, until_s: float
) -> None:
    await settled(cluster)
    h = History()
    w = FifoWorkload(
        node_urls(cluster),
        unique("fifo"),
        h,
        groups=20,
        per_group=per_group,
        consumers=8,
        visibility_s=VISIBILITY_S,
        timeout_s=CLIENT_TIMEOUT_S,
        seed=seed,
    )
    await w.create_queue()
    victim = random.Random(seed).choice(sorted(cluster.nodes))

    async def kill_half_way() -> None:
        while len(w.acked) < w.total // 2:  # noqa: ASYNC110 - a count, polled
            await asyncio.sleep(0.05)
        h.note("nemesis", "nemesis", {"fault": "kill", "node": victim})
        await asyncio.to_thread(cluster.kill, victim)
        await asyncio.sleep(2.0)
        await asyncio.to_thread(cluster.start_node, victim)
        h.note("nemesis", "nemesis", {"fault": "restart", "node": victim})

    started = time.monotonic()
    try:
        await asyncio.gather(w.run(until_s), asyncio.wait_for(kill_half_way(), until_s))
    finally:
        h.dump(tmp_path / "history.json")
    took = time.monotonic() - started
    report = check_fifo(h, VISIBILITY_S)
    print(
        f"fifo: {w.total} messages in {len(w.groups)} groups, {took:.1f}s, killed {victim}; "
        f"{report.deliveries} deliveries ({report.redeliveries} again), "
        f"{len(report.acked)} acked for sure; calls answered 421 or with no reply "
        f"{dict(w.seen)}"
    )
    assert w.seen["421"] == 0, "a plain REST call was answered 421"
    assert report.problems() == [], report.problems()
    # run() drained the queue: every message was acked, and each was delivered.
    missing = {f"{g}:{n}" for g in w.groups for n in range(per_group)} - report.delivered
    assert not missing, f"{len(missing)} messages never delivered, e.g. {sorted(missing)[:5]}"


async def test_fifo_groups_keep_their_order_through_a_kill(
    cluster: LocalCluster, tmp_path: Path, seed: int
) -> None:
    """20 groups x 150 messages (about 10 s)."""
    await fifo_through_a_kill(cluster, tmp_path, seed, per_group=150, until_s=120)


@pytest.mark.slow
async def test_fifo_groups_of_500_keep_their_order_through_a_kill(
    cluster: LocalCluster, tmp_path: Path, seed: int
) -> None:
    """20 groups x 500 messages (about 30 s)."""
    await fifo_through_a_kill(cluster, tmp_path, seed, per_group=500, until_s=300)
