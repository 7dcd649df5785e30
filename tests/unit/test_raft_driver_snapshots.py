"""RaftHost's compaction and snapshots, with hosts over the in-process transport of
test_raft_driver.py and a state machine (the entries each node applied) whose snapshot is
a copy of that list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.unit.test_raft_driver import Cluster, propose_on_leader, until
from zdmq.raft.driver import PulledSnapshot, RaftHost
from zdmq.raft.storage import Entry

KEEP = 5


class Hooks:
    """`SnapshotHooks` over `Cluster.applied`: durable as applied; a pulled snapshot is
    the source's list of applied entries, kept aside until installed."""

    def __init__(self, c: SnapCluster, node: str) -> None:
        self.c, self.node = c, node

    def checkpoint(self, group: str) -> int:
        self.c.checkpoints += 1
        return len(self.c.applied[self.node].get(group, []))

    async def pull(self, group: str, src: str) -> PulledSnapshot:
        if src not in self.c.hosts:
            raise ConnectionRefusedError(f"{src} is down")
        entries = list(self.c.applied[src][group])
        path = self.c.tmp / f"{self.node}-{group}-{len(entries)}.snap"
        self.c.pulled[path] = entries
        return PulledSnapshot(group, src, len(entries), entries[-1].term, path)

    async def install(self, snap: PulledSnapshot) -> None:
        self.c.applied[self.node][snap.group] = self.c.pulled.pop(snap.path)
        self.c.installs.append((self.node, snap.group, snap.index))

    def discard(self, snap: PulledSnapshot) -> None:
        self.c.pulled.pop(snap.path, None)


class SnapCluster(Cluster):
    def __init__(self, tmp: Path, n: int, **kw: Any) -> None:
        super().__init__(tmp, n, **kw)
        self.pulled: dict[Path, list[Entry]] = {}
        self.installs: list[tuple[str, str, int]] = []
        self.checkpoints = 0

    def start(self, node: str) -> RaftHost:
        self.host_kw = {**self.host_kw, "snapshots": Hooks(self, node), "compact_entries": KEEP}
        return super().start(node)


async def test_a_member_behind_the_compacted_logs_catches_up_from_snapshots(
    tmp_path: Path,
) -> None:
    c = SnapCluster(tmp_path, 3)
    try:
        for node in c.ids:
            c.start(node)
        await c.preferred_leaders()
        await c.stop("n2")
        for k in range(30):
            await propose_on_leader(c, "n0", b"a%d" % k)
            await propose_on_leader(c, "n1", b"b%d" % k)
        for g in ("n0", "n1"):
            start, last = c.hosts["n0"].log_bounds(g)
            assert start > len(c.applied["n2"][g]) and last - start <= 2 * KEEP + 2
        assert c.checkpoints > 0
        c.start("n2")
        await until(lambda: c.converged("n0", 30) and c.converged("n1", 30), "n2 caught up")
        # n2 got the groups it had missed as snapshots (group n2 too: a new leader's).
        assert {g for n, g, _ in c.installs if n == "n2"} >= {"n0", "n1"}
        assert c.hosts["n2"].counters["snapshots_installed"] == len(c.installs)
        assert not c.pulled  # every pull installed or discarded
        # Each applied every entry once, in the leader's order.
        for g in ("n0", "n1"):
            assert [e.index for e in c.applied["n2"][g]] == list(
                range(1, len(c.applied["n2"][g]) + 1)
            )
        # And the group goes on, n2 acknowledging from its log after the snapshot.
        await c.stop("n1")
        await until(lambda: c.leader_of("n0") is not None, "a leader of n0 without n1")
        assert await propose_on_leader(c, "n0", b"after") is not None
    finally:
        await c.close()
