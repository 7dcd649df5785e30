"""The `memory` and `os` durability modes serve the same protocol as `fsync`."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from tests.helpers import unique
from zdmq import Client
from zdmq.local import LocalCluster


@pytest.mark.parametrize("durability", ["memory", "os"])
async def test_a_cluster_in_each_durability_mode_round_trips_pushes_and_pops(
    make_cluster: Callable[..., LocalCluster], durability: str
) -> None:
    cluster = make_cluster(nodes=4, durability=durability)
    assert cluster.config.durability == durability
    q = unique(durability)
    async with Client.from_config(cluster.config_path) as c:
        await c.create_queue(q)
        sent = {await c.push(q, body): body for body in (os.urandom(100) for _ in range(20))}
        bodies = [os.urandom(100) for _ in range(300)]
        sent.update(zip(await c.push_many(q, bodies), bodies, strict=True))
        assert len(sent) == 320
        assert (await c.stats(q)).messages == len(sent)

        got: dict[str, bytes] = {}
        while batch := await c.pop_many(q, 50):
            for m in batch:
                assert m.id not in got
                got[m.id] = m.body
        assert await c.pop(q) is None
    assert got == sent
