"""The elastic-cluster simulation: a cluster grown and shrunk by random joins, leaves and
replaces moves about the ideal share of replicas per change, stays balanced, and a client
with a stale map reaches a group's leader within three calls."""

from __future__ import annotations

import pytest

from zdmq import cluster_sim
from zdmq.cluster_map import ClusterMap, Step, apply_step
from zdmq.cluster_sim import check, run, stale_calls


def _assert_within_bounds(r: cluster_sim.Run) -> None:
    failed = check(r)
    assert not failed, f"{failed[:5]}; replay: {r.command()}"
    assert r.changes[-1].nodes == r.start
    assert max(c.nodes for c in r.changes) == r.peak
    assert {c.kind for c in r.changes} == {"join", "leave", "replace"}
    assert all(max(c.calls) <= 3 for c in r.changes)


@pytest.mark.parametrize("seed", [1, 2])
def test_growing_to_100_nodes_and_back_keeps_every_bound(seed: int) -> None:
    r = run(seed, start=4, peak=100, groups=2048, partitions=8192, probes=50)
    _assert_within_bounds(r)
    joins = [c for c in r.changes if c.kind == "join"]
    assert max(c.moved_ratio for c in joins) <= 1 + 100 / (2048 * 3)  # ceil of the share


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1])
def test_growing_to_1000_nodes_and_back_keeps_every_bound(seed: int) -> None:
    r = run(seed, start=8, peak=1000, groups=16_384, partitions=65_536, probes=100)
    _assert_within_bounds(r)


def test_a_client_with_the_current_map_calls_the_leader_once() -> None:
    m = ClusterMap.initial({f"n{i}": f"h{i}:1" for i in range(4)}, 64, 3, 8)
    assert all(stale_calls(m, m, f"k{i}") == 1 for i in range(50))


def test_a_client_whose_map_names_an_old_leader_refetches_the_map_and_calls_again() -> None:
    m = ClusterMap.initial({f"n{i}": f"h{i}:1" for i in range(4)}, 64, 3, 8)
    key = "k1"
    g = m.group_of(key)
    second = m.members(g)[1]
    newer = apply_step(m, Step(g, leader=second))
    assert stale_calls(m, newer, key) == 3  # the old leader, the map, the new leader
    other = next(k for k in (f"k{i}" for i in range(100)) if m.group_of(k) != g)
    assert stale_calls(m, newer, other) == 1  # its group's leader did not change


def test_the_command_line_prints_its_seed_and_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--seed", "5", "--start", "4", "--nodes", "12", "--groups", "64", "--partitions", "256"]
    assert cluster_sim.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("seed 5\n")
    assert "replicas moved / ideal" in out and "stale-map lookups" in out
    assert out.rstrip().endswith("all bounds hold")
