"""Topics under kill -9 and SIGSTOP, checked per subscription by the fault suite's checker.

4 nodes, `replication: 3`, fsync. Publishers publish known payloads with dedup ids over
REST through random nodes; a publish is acknowledged only once every subscription holds
its copy, so each publish is recorded in every subscription's history as a push of the
copy's id (derived from the topic, the queue and the dedup id), with the publish's
outcome. A consumer per subscription receives and acks. Faults run meanwhile, then the
cluster heals, every subscription is drained, and each history is checked: lost,
unexpected and resurrected must be 0 in each.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import aiohttp
import pytest

from tests.fault.checker import check
from tests.fault.history import History
from tests.fault.nemesis import Nemesis
from tests.fault.test_replicated import CLIENT_TIMEOUT_S, assert_clean, heal, settled
from tests.fault.workload import Outcome, Rest, Workload, node_urls
from tests.helpers import unique
from zdmq.local import LocalCluster
from zdmq.models import copy_message_id


class Publishers:
    """Publishers of known payloads with dedup ids; every publish is a push of its copy in
    each subscription's history (retried, as a push, while its outcome is unknown)."""

    def __init__(
        self, nodes: dict[str, str], topic: str, histories: dict[str, History], seed: int
    ) -> None:
        self.nodes, self.topic, self.histories = nodes, topic, histories
        self.rng = random.Random(seed)
        self.salt = f"{self.rng.getrandbits(32):08x}"

    async def run(
        self, session: aiohttp.ClientSession, duration_s: float, publishers: int = 3
    ) -> int:
        deadline = time.monotonic() + duration_s
        acked = 0

        async def publisher(process: str) -> None:
            nonlocal acked
            rng = random.Random(self.rng.random())
            rest = Rest(session, self.nodes, rng, CLIENT_TIMEOUT_S)
            n = 0
            while time.monotonic() < deadline:
                n += 1
                dedup_id = f"{process}-{n}"
                for _ in range(3):
                    if await self.publish(rest, process, dedup_id):
                        acked += 1
                        break
                    if time.monotonic() >= deadline:
                        break

        await asyncio.gather(*(publisher(f"p{i}") for i in range(publishers)))
        return acked

    async def publish(self, rest: Rest, process: str, dedup_id: str) -> bool:
        """One publish; True when it was acknowledged."""
        payload = f"{self.salt}:{dedup_id}"
        values = {
            q: {"id": copy_message_id(self.topic, q, dedup_id), "payload": payload}
            for q in self.histories
        }
        for q, h in self.histories.items():
            h.invoke(process, "push", values[q])
        try:
            node, _ = await rest.call(
                "POST",
                f"/v1/topics/{self.topic}/messages",
                data=payload.encode(),
                headers={"zdmq-dedup-id": dedup_id, "Content-Type": "text/plain"},
            )
        except Outcome as e:
            for q, h in self.histories.items():
                (h.fail if e.definite else h.info)(process, "push", {**values[q], "error": str(e)})
            await asyncio.sleep(0.05)
            return False
        for q, h in self.histories.items():
            h.ok(process, "push", {**values[q], "node": node})
        return True


async def topic_under_faults(
    cluster: LocalCluster, tmp_path: Path, seed: int, *, duration_s: float, period_s: float
) -> None:
    await settled(cluster)
    nodes = node_urls(cluster)
    topic, subs = unique("ft"), [unique("fs") for _ in range(3)]
    histories = {q: History() for q in subs}
    consumers = {
        q: Workload(
            nodes, q, histories[q], producers=0, consumers=1, timeout_s=CLIENT_TIMEOUT_S, seed=seed
        )
        for q in subs
    }
    async with consumers[subs[0]].session() as s:
        rest = Rest(s, nodes, random.Random(seed), 5.0)
        await rest.call("PUT", f"/v1/topics/{topic}")
        for q in subs:
            await rest.call("POST", f"/v1/topics/{topic}/subscriptions", json={"queue": q})
        nemesis = Nemesis(cluster, histories[subs[0]], seed=seed)
        publishers = Publishers(nodes, topic, histories, seed)
        try:
            results = await asyncio.gather(
                publishers.run(s, duration_s),
                *(w.run(duration_s) for w in consumers.values()),
                nemesis.rounds(
                    duration_s, period_s=period_s, down_s=period_s / 2, paused_s=period_s
                ),
            )
        finally:
            await heal(cluster)
    acked = results[0]
    assert acked is not None
    for q, w in consumers.items():
        try:
            await w.drain(60.0)
        finally:
            histories[q].dump(tmp_path / f"history-{q}.jsonl")
    assert acked > 50, "the publishers got too little through to prove anything"
    for q, h in histories.items():
        report = check(h)
        print(f"subscription {q}: {report.text()}")
        assert_clean(report)
        assert len(report.acknowledged) == acked


async def test_each_subscription_loses_nothing_across_kills_and_a_pause(
    cluster: LocalCluster, tmp_path: Path, seed: int
) -> None:
    """Short: three rounds of 4 s (kill -9, kill -9, a 4 s SIGSTOP) on random nodes."""
    await topic_under_faults(cluster, tmp_path, seed, duration_s=13.0, period_s=4.0)


@pytest.mark.slow
async def test_45s_of_kills_and_pauses_lose_nothing_in_any_subscription(
    cluster: LocalCluster, tmp_path: Path, seed: int
) -> None:
    await topic_under_faults(cluster, tmp_path, seed, duration_s=45.0, period_s=6.0)
