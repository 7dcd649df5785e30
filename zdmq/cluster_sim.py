"""A seeded simulation of an elastic cluster's map: grow to 1,000 nodes and back.

    python -m zdmq.cluster_sim --seed 7            # 8 -> 1,000 -> 8 nodes, 16,384 groups, R=3
    python -m zdmq.cluster_sim --seed 7 --nodes 60 --groups 1024 --partitions 4096

Nothing runs but the map and the planner (zdmq/cluster_map.py, zdmq/cluster_plan.py):
no processes, no sockets. The cluster grows from `--start` nodes to `--nodes` and shrinks
back, one change at a time, each a join, a leave or a replace drawn from the seed (mostly
joins while it grows, mostly leaves while it shrinks). For every change the plan is
applied, and the run measures what docs/design.md §19 claims:

- **moved**: replicas moved, against the ideal: a joining node's share (G x R / N), or
  the replicas of the node that leaves or is replaced.
- **balance**: max / mean over the nodes of replicas and of preferred leaderships.
- **stale maps**: clients holding the map of one to three changes before, while the
  cluster is part way through the change's steps, look up random keys. A client calls
  the preferred leader its map names for the key's group; a node that does not lead the
  group (or no longer hosts it, or is gone) answers with the current epoch, and the
  client refetches the map (one call) and tries again. Each lookup counts its calls
  (steady state: a group is led by its preferred leader). Every lookup also checks that
  the key's group is the same in both maps: keys never move between groups.

`check` turns a run into the bounds it must meet; a failing run prints its seed and the
command that replays it.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from zdmq.cluster_map import ClusterMap, apply_plan
from zdmq.cluster_plan import plan_add, plan_remove, plan_replace, spread

__all__ = ["Change", "Run", "check", "main", "run", "stale_calls"]

# The bounds a run must meet (`check`).
MOVED_MAX_RATIO = 1.5  # replicas moved / the ideal
LEADER_MAX_MEAN = 1.1  # where G / N >= 10 (fewer groups per node cannot be that even)
STALE_CALLS_MAX = 3  # the stale leader, the map, the leader
STALE_MAPS = 3  # clients hold a map up to this many changes old


@dataclass(frozen=True, slots=True)
class Change:
    """What one change cost and left."""

    kind: str  # "join", "leave" or "replace"
    nodes: int  # after the change
    moves: int
    ideal_moves: float
    leader_changes: int
    replica_max_mean: float
    leader_max_mean: float
    replicas_in_range: bool  # every node holds floor or ceil of G x R / N
    leaders_in_range: bool  # every node prefers floor or ceil of G / N groups
    calls: tuple[int, ...]  # per stale-map lookup

    @property
    def moved_ratio(self) -> float:
        return self.moves / self.ideal_moves if self.ideal_moves else 0.0


@dataclass(slots=True)
class Run:
    seed: int
    start: int
    peak: int
    groups: int
    partitions: int
    replication: int
    probes: int
    changes: list[Change] = field(default_factory=list)
    seconds: float = 0.0

    def command(self) -> str:
        return (
            f"python -m zdmq.cluster_sim --seed {self.seed} --start {self.start} "
            f"--nodes {self.peak} --groups {self.groups} --partitions {self.partitions} "
            f"--replication {self.replication} --probes {self.probes}"
        )

    def summary(self) -> list[str]:
        ch = self.changes
        kinds = {k: [c for c in ch if c.kind == k] for k in ("join", "leave", "replace")}
        even = [c for c in ch if self.groups / c.nodes >= 10]
        calls = [n for c in ch for n in c.calls]
        refetched = sum(n > 1 for n in calls)
        total = self.groups * self.replication

        def worst(cs: Sequence[Change]) -> str:
            return f"{max(c.moved_ratio for c in cs):.3f}" if cs else "-"

        return [
            f"seed {self.seed}: {self.start} -> {self.peak} -> {self.start} nodes, "
            f"{self.groups} groups, {self.partitions} partitions, replication {self.replication}",
            f"changes: {len(ch)} (join {len(kinds['join'])}, leave {len(kinds['leave'])}, "
            f"replace {len(kinds['replace'])}) in {self.seconds:.1f} s",
            f"replicas moved / ideal: mean {_mean([c.moved_ratio for c in ch]):.3f}, "
            f"worst join {worst(kinds['join'])}, leave {worst(kinds['leave'])}, "
            f"replace {worst(kinds['replace'])}",
            f"replicas moved per change: mean {_mean([c.moves / total for c in ch]):.3%} of all, "
            f"ideal {_mean([c.ideal_moves / total for c in ch]):.3%}",
            f"leader changes per change (besides moves): mean "
            f"{_mean([c.leader_changes for c in ch]):.1f}, max "
            f"{max((c.leader_changes for c in ch), default=0)}",
            f"replicas max/mean: worst {max((c.replica_max_mean for c in ch), default=0):.3f}; "
            f"outside floor..ceil after {sum(not c.replicas_in_range for c in ch)} changes",
            f"leaders max/mean: worst {max((c.leader_max_mean for c in ch), default=0):.3f} "
            f"(where G/N >= 10: {max((c.leader_max_mean for c in even), default=0):.3f}); "
            f"outside floor..ceil after {sum(not c.leaders_in_range for c in ch)} changes",
            f"stale-map lookups: {len(calls)}, calls max {max(calls, default=0)}, "
            f"mean {_mean(calls):.3f}; {refetched} ({refetched / max(1, len(calls)):.2%}) "
            "refetched the map",
        ]


def run(
    seed: int,
    *,
    start: int = 8,
    peak: int = 1000,
    groups: int = 16_384,
    partitions: int = 65_536,
    replication: int = 3,
    probes: int = 100,
) -> Run:
    """Grows a cluster of `start` nodes to `peak` and shrinks it back, recording each change."""
    assert replication <= start <= peak
    rng = random.Random(seed)
    out = Run(seed, start, peak, groups, partitions, replication, probes)
    began = time.perf_counter()
    names = iter(range(1 << 30))

    def fresh() -> tuple[str, str]:
        i = next(names)
        return f"n{i}", f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:7700"

    m = ClusterMap.initial([fresh() for _ in range(start)], partitions, replication, groups=groups)
    history: deque[ClusterMap] = deque([m], maxlen=STALE_MAPS)
    growing = True
    while growing or len(m.nodes) > start:
        n = len(m.nodes)
        if growing and n >= peak:
            growing = False
            continue
        r = rng.random()
        if n > replication and (r < 0.1 if growing else r < 0.8):
            kind = "leave"
        elif r < 0.9:
            kind = "join"
        else:
            kind = "replace"
        m, change = _change(m, kind, fresh, history, rng, probes)
        out.changes.append(change)
        history.append(m)
    out.seconds = time.perf_counter() - began
    return out


def _change(
    m: ClusterMap,
    kind: str,
    fresh: Callable[[], tuple[str, str]],
    history: Sequence[ClusterMap],
    rng: random.Random,
    probes: int,
) -> tuple[ClusterMap, Change]:
    total = len(m.groups) * m.replication
    if kind == "join":
        node, address = fresh()
        base = m.with_node(node, address)
        steps = plan_add(base, node)
        ideal = total / len(base.nodes)
        after = apply_plan(base, steps)
    elif kind == "leave":
        node = rng.choice(list(m.nodes))
        base = m
        steps = plan_remove(base, node)
        ideal = m.replica_counts()[node]
        after = apply_plan(base, steps).without_node(node)
    else:
        old = rng.choice(list(m.nodes))
        node, address = fresh()
        base = m.with_node(node, address)
        steps = plan_replace(base, old, node)
        ideal = m.replica_counts()[old]
        after = apply_plan(base, steps).without_node(old)
    # Clients look keys up while the cluster is part way through the steps.
    during = apply_plan(base, steps[: rng.randint(0, len(steps))])
    calls = tuple(
        stale_calls(rng.choice(history), during, f"key-{rng.getrandbits(64):016x}")
        for _ in range(probes)
    )
    replicas = after.replica_counts()
    leaders = after.leader_counts()
    nodes = len(after.nodes)
    r_lo, r_hi = spread(total, nodes)
    l_lo, l_hi = spread(len(after.groups), nodes)
    moves = sum(s.is_move for s in steps)
    return after, Change(
        kind=kind,
        nodes=nodes,
        moves=moves,
        ideal_moves=ideal,
        leader_changes=len(steps) - moves,
        replica_max_mean=max(replicas.values()) * nodes / total,
        leader_max_mean=max(leaders.values()) * nodes / len(after.groups),
        replicas_in_range=all(r_lo <= c <= r_hi for c in replicas.values()),
        leaders_in_range=all(l_lo <= c <= l_hi for c in leaders.values()),
        calls=calls,
    )


def stale_calls(held: ClusterMap, current: ClusterMap, key: str) -> int:
    """The calls a client holding `held` makes to reach the leader of `key`'s group in
    `current`: it calls the preferred leader its map names; a node that does not lead
    the group, no longer hosts it, or is gone answers with the current epoch (or not at
    all), and the client refetches the map (a call) and tries again."""
    group = current.group_of(key)
    assert held.group_of(key) == group, f"{key!r} changed group"
    leader = current.preferred_leader(group)
    calls = 0
    while True:
        calls += 1
        if held.preferred_leader(group) == leader:
            return calls
        assert held.epoch < current.epoch, "the current map names the leader"
        calls += 1
        held = current


def check(r: Run) -> list[str]:
    """The bounds a run broke (none: it passed)."""
    failed = []
    for i, c in enumerate(r.changes):
        where = f"change {i} ({c.kind}, {c.nodes} nodes)"
        if c.moved_ratio > MOVED_MAX_RATIO:
            failed.append(f"{where}: moved {c.moves} replicas, {c.moved_ratio:.2f} x ideal")
        if not c.replicas_in_range:
            failed.append(f"{where}: replicas outside floor..ceil")
        if not c.leaders_in_range:
            failed.append(f"{where}: preferred leaders outside floor..ceil")
        if r.groups / c.nodes >= 10 and c.leader_max_mean > LEADER_MAX_MEAN:
            failed.append(f"{where}: leaders max/mean {c.leader_max_mean:.3f}")
        if c.calls and max(c.calls) > STALE_CALLS_MAX:
            failed.append(f"{where}: a stale-map lookup took {max(c.calls)} calls")
    return failed


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zdmq.cluster_sim", description=__doc__)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--start", type=int, default=8, help="nodes at the start and end")
    parser.add_argument("--nodes", type=int, default=1000, help="nodes at the peak")
    parser.add_argument("--groups", type=int, default=16_384)
    parser.add_argument("--partitions", type=int, default=65_536)
    parser.add_argument("--replication", type=int, default=3)
    parser.add_argument("--probes", type=int, default=100, help="stale-map lookups per change")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    print(f"seed {seed}", flush=True)
    r = run(
        seed,
        start=args.start,
        peak=args.nodes,
        groups=args.groups,
        partitions=args.partitions,
        replication=args.replication,
        probes=args.probes,
    )
    for line in r.summary():
        print(line)
    failed = check(r)
    for line in failed[:20]:
        print(f"FAILED {line}")
    if failed:
        print(f"{len(failed)} bounds broken; replay: {r.command()}")
        return 1
    print("all bounds hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
