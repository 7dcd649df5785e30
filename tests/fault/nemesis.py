"""Faults on real node processes: kill -9 and restart, SIGSTOP and SIGCONT, a lost disk,
and (for nodes in network namespaces) partitions; `run` draws them at random, `round` draws
each of a set once, `rounds` is the replicated acceptance schedule (a kill -9 every period, a
SIGSTOP every third round).

Works on a `zdmq.local.LocalCluster` (loopback nodes, or nodes in network namespaces, see
netns.py): it signals only the node processes that cluster started, by their PID, and
records every fault in the history (process `nemesis`) so the checker's report shows them.
The blocking parts (waiting for a restarted node's READY line) run in a thread, so the
workload keeps running meanwhile.
"""

from __future__ import annotations

import asyncio
import random
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tests.fault.history import History
from zdmq.local import LocalCluster

if TYPE_CHECKING:
    from tests.fault.netns import NetnsCluster

FAULTS = ("kill", "pause", "lose_disk", "partition")


class Nemesis:
    def __init__(
        self,
        cluster: LocalCluster,
        history: History,
        *,
        seed: int | None = None,
        network: NetnsCluster | None = None,
    ) -> None:
        """`network`: the namespaces `cluster` runs in, for the `partition` fault."""
        self.cluster = cluster
        self.history = history
        self.rng = random.Random(seed)
        self.network = network

    def _note(self, fault: str, node: str, **extra: object) -> None:
        pid = self.cluster.nodes[node].pid
        self.history.note("nemesis", "nemesis", {"fault": fault, "node": node, "pid": pid, **extra})

    async def kill(self, node: str, down_s: float = 1.0) -> None:
        """SIGKILL (no shutdown code runs), `down_s` dead, then a restart on the same disk."""
        self._note("kill", node)
        await asyncio.to_thread(self.cluster.kill, node)
        await asyncio.sleep(down_s)
        await asyncio.to_thread(self.cluster.start_node, node)
        self._note("restarted", node)

    async def pause(self, node: str, paused_s: float = 2.0) -> None:
        """SIGSTOP for `paused_s`, then SIGCONT: a node that hangs, sockets open."""
        self._note("pause", node, seconds=paused_s)
        self.cluster.pause(node)
        try:
            await asyncio.sleep(paused_s)
        finally:
            self.cluster.resume(node)
            self._note("resumed", node)

    async def lose_disk(self, node: str, down_s: float = 1.0) -> None:
        """SIGKILL, delete the node's data directory, restart it empty."""
        self._note("lose_disk", node)
        await asyncio.to_thread(self.cluster.kill, node)
        shutil.rmtree(self.cluster.config.node_data_dir(node), ignore_errors=True)
        await asyncio.sleep(down_s)
        await asyncio.to_thread(self.cluster.start_node, node)
        self._note("restarted empty", node)

    async def partition(
        self, hold_s: float = 2.0, node: str | None = None, *, halves: bool | None = None
    ) -> None:
        """Cuts the network for `hold_s`, then heals it: `node` alone, or random halves
        (`halves`), or without either a random node alone or random halves, even odds.
        The partition's note comes once every rule is in place, the heal's before any is
        taken away, so the window between them is one the cut held throughout."""
        net = self.network
        if net is None:
            raise ValueError("partitions need a NetnsCluster")
        if halves is None:
            halves = node is None and self.rng.random() < 0.5
        if halves:
            groups = net.random_halves(self.rng)
        else:
            groups = net.isolate(node or self.rng.choice(net.node_ids))
        self.history.note("nemesis", "nemesis", {"fault": "partition", "groups": groups})
        try:
            await asyncio.sleep(hold_s)
        finally:
            self.history.note("nemesis", "nemesis", {"fault": "heal"})
            net.heal()

    async def rounds(
        self,
        duration_s: float,
        *,
        period_s: float = 6.0,
        down_s: float = 3.0,
        paused_s: float = 6.0,
        pause_every: int = 3,
        first_s: float = 1.0,
        nodes: Sequence[str] | None = None,
    ) -> None:
        """A fault on a random node every `period_s` (the first after `first_s`): kill -9
        and a restart on its disk `down_s` later, and in every `pause_every`-th round a
        SIGSTOP for `paused_s` instead, while a round can end within `duration_s` (a
        restart takes up to about a second more). A round starts once the one before has
        ended, so one node at most is down at a time: with replication 3 every group keeps
        a majority throughout."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        candidates = list(nodes or self.cluster.nodes)
        k = 0
        while True:
            at = first_s + k * period_s  # the round's start, from the run's
            pause = (k + 1) % pause_every == 0
            if at + (paused_s if pause else down_s + 1.0) > duration_s:
                return
            await asyncio.sleep(max(0.0, started + at - loop.time()))
            node = self.rng.choice(candidates)
            k += 1
            if pause:
                await self.pause(node, paused_s)
            else:
                await self.kill(node, down_s)

    async def run(
        self,
        duration_s: float,
        *,
        faults: Sequence[str] = ("kill", "pause"),
        nodes: Sequence[str] | None = None,
        interval_s: tuple[float, float] = (1.0, 2.0),
    ) -> None:
        """Random faults from `faults` on random `nodes`, one at a time, a random quiet gap
        (`interval_s`) before each, until `duration_s` has passed; every node runs at the end."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + duration_s
        candidates = list(nodes or self.cluster.nodes)
        while True:
            await asyncio.sleep(self.rng.uniform(*interval_s))
            if loop.time() >= deadline:
                return
            await self._random(self.rng.choice(list(faults)), self.rng.choice(candidates))

    async def round(
        self,
        faults: Sequence[str],
        *,
        nodes: Sequence[str] | None = None,
        interval_s: tuple[float, float] = (1.0, 2.0),
    ) -> None:
        """Each of `faults` once, in a random order, on random `nodes`, drawn as `run`
        draws them, a random quiet gap (`interval_s`) before each: a short run that still
        has every kind of fault."""
        candidates = list(nodes or self.cluster.nodes)
        for fault in self.rng.sample(list(faults), len(faults)):
            await asyncio.sleep(self.rng.uniform(*interval_s))
            await self._random(fault, self.rng.choice(candidates))

    async def _random(self, fault: str, node: str) -> None:
        """`fault` on `node` (a partition draws its own sides), lasting a random while."""
        if fault == "kill":
            await self.kill(node, self.rng.uniform(0.2, 1.0))
        elif fault == "pause":
            await self.pause(node, self.rng.uniform(1.0, 3.0))
        elif fault == "lose_disk":
            await self.lose_disk(node, self.rng.uniform(0.2, 1.0))
        elif fault == "partition":
            await self.partition(self.rng.uniform(1.0, 3.0))
        else:
            raise ValueError(f"unknown fault {fault!r}; known: {FAULTS}")
