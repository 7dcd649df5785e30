"""Tied messages through a kill -9: 4 real nodes, `replication: 3`, `durability: fsync`.

300 messages, each tied across 3 queues, are consumed by one consumer per queue (receive,
ack) while a node (drawn from the seed) is killed -9 half way and restarted. A claim in
flight at the kill has an unknown outcome; its copy comes back and claims again. What must
hold: of each tie, exactly one copy is ever delivered (the winning copy may be delivered
more than once: at-least-once), and every tie's message is delivered.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict

from tests.fault.test_replicated import settled
from tests.helpers import unique
from zdmq import Client, ZdmqError
from zdmq.local import LocalCluster


async def test_one_copy_of_each_tie_is_delivered_through_a_kill(
    cluster: LocalCluster, seed: int
) -> None:
    await settled(cluster)
    ties = 300
    queues = [unique("tied") for _ in range(3)]
    victim = random.Random(seed).choice(sorted(cluster.nodes))
    copies_of: dict[str, set[str]] = defaultdict(set)  # body -> copy ids delivered
    async with Client.from_config(cluster.config_path, timeout_s=3.0) as c:
        for q in queues:
            await c.create_queue(q, visibility_timeout_s=2.0)
        sem = asyncio.Semaphore(16)

        async def tie(n: int) -> None:
            async with sem:
                await c.push_tied(queues, f"job {n}", token=f"job-{n}")

        await asyncio.gather(*(tie(n) for n in range(ties)))
        done = asyncio.Event()

        async def consume(q: str) -> None:
            while not done.is_set():
                try:
                    got = await c.receive(q, max_messages=2, wait_s=0.2)
                    if got:
                        for m in got:
                            copies_of[m.text()].add(m.id)
                        await asyncio.sleep(random.uniform(0.02, 0.05))  # the processing
                        await c.ack(q, [m.receipt for m in got])
                except ZdmqError:  # a call through the kill: its outcome is unknown
                    await asyncio.sleep(0.1)
                if len(copies_of) >= ties:
                    done.set()

        async def kill_half_way() -> None:
            while len(copies_of) < ties // 2 and not done.is_set():  # noqa: ASYNC110 - a count
                await asyncio.sleep(0.02)
            killed_at.append(len(copies_of))
            await asyncio.to_thread(cluster.kill, victim)
            await asyncio.sleep(2.0)
            await asyncio.to_thread(cluster.start_node, victim)

        killed_at: list[int] = []
        consumers = [asyncio.create_task(consume(q)) for q in queues]
        try:
            await asyncio.wait_for(asyncio.gather(kill_half_way(), done.wait()), 120)
        finally:
            done.set()
            await asyncio.gather(*consumers)
    twice = {body: ids for body, ids in copies_of.items() if len(ids) > 1}
    print(
        f"tied: {ties} ties through a kill of {victim} at {killed_at[0]} delivered; "
        f"{len(copies_of)} delivered in the end"
    )
    assert not twice, f"two copies of one tie delivered: {list(twice.items())[:5]}"
    assert len(copies_of) == ties
