"""The cluster map as a node holds it (zdmq/server/topology.py) and the operator's changes
of it (zdmq/server/rebalance.py's `map_change`): pure, no processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zdmq.cluster_map import ClusterMap, MapError, initial_map
from zdmq.cluster_plan import plan
from zdmq.config import ClusterConfig
from zdmq.errors import BadRequest, NodeConflict, NodeNotFound
from zdmq.server.rebalance import map_change
from zdmq.server.topology import MAP_FILE, MAP_PREFIX, MapEntry, Topology, map_of_view


def config(tmp_path: Path, **extra: object) -> ClusterConfig:
    nodes = [{"id": f"n{i}", "host": "127.0.0.1", "port": 7700 + i} for i in range(1, 5)]
    return ClusterConfig.from_dict(
        {"nodes": nodes, "replication": 3, "data_dir": str(tmp_path), **extra}
    )


def test_the_initial_map_is_cluster_yamls_ring_and_a_groups_layout_names_its_groups(
    tmp_path: Path,
) -> None:
    m = initial_map(config(tmp_path))
    assert m.epoch == 1 and m.groups == ("n1", "n2", "n3", "n4")
    assert m.members("n4") == ("n4", "n1", "n2")
    g = initial_map(config(tmp_path, groups=8))
    assert g.groups == tuple(f"g{i}" for i in range(8))
    assert sorted(g.leader_counts().values()) == [2, 2, 2, 2]


def test_a_map_entry_round_trips_and_other_entries_are_not_one(tmp_path: Path) -> None:
    m = initial_map(config(tmp_path)).with_node("n5", "127.0.0.1:7705")
    data = MapEntry(1, m).encode()
    assert data.startswith(MAP_PREFIX)
    back = MapEntry.decode(data)
    assert back is not None and back.expect == 1 and back.new == m
    assert MapEntry.decode(b"\xc1raft-conf:{}") is None
    assert MapEntry.decode(b"\x93\x01\x02\x03") is None


def test_a_node_takes_only_a_newer_map_keeps_it_and_starts_from_it(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    t = Topology(cfg, tmp_path / "n1")
    seen: list[int] = []
    t.on_change(lambda m: seen.append(m.epoch))
    grown = t.map.with_node("n5", "127.0.0.1:7705")
    assert t.adopt(grown) and t.epoch == 2 and seen == [2]
    assert t.urls["n5"] == "http://127.0.0.1:7705"
    assert not t.adopt(grown) and not t.adopt(initial_map(cfg))  # not newer: kept
    # A map of another cluster's layout (other groups) is refused, whatever its epoch.
    other = initial_map(config(tmp_path, groups=8))
    for _ in range(5):
        other = other.with_node(f"x{other.epoch}", f"127.0.0.2:{other.epoch}")
    assert not t.adopt(other) and t.epoch == 2
    # A restart starts from the newest map it kept; a damaged file from cluster.yaml's.
    assert Topology(cfg, tmp_path / "n1").map == grown
    (tmp_path / "n1" / MAP_FILE).write_text("{not json")
    assert Topology(cfg, tmp_path / "n1").epoch == 1


def test_the_view_a_node_serves_reads_back_as_the_map(tmp_path: Path) -> None:
    t = Topology(config(tmp_path), None)
    view = {**t.view(), "limits": {"max_message_bytes": 1}}
    assert view["nodes"][0]["url"] == "http://127.0.0.1:7701"
    assert map_of_view(json.loads(json.dumps(view))) == t.map


def test_operator_changes_are_idempotent_and_refuse_what_cannot_apply(tmp_path: Path) -> None:
    m = initial_map(config(tmp_path))
    added = map_change(m, "add", "n5", "127.0.0.1:7705", None)
    assert added.epoch == 2 and "n5" in added.nodes and not added.holds("n5")
    assert map_change(added, "add", "n5", "127.0.0.1:7705", None) is added
    with pytest.raises(NodeConflict, match="in the cluster at"):
        map_change(added, "add", "n5", "127.0.0.1:9999", None)
    with pytest.raises(NodeConflict, match="address"):
        map_change(added, "add", "n6", "127.0.0.1:7705", None)  # n5's address
    leaving = map_change(added, "remove", "n5", None, None)
    assert leaving.leaving == ("n5",)
    assert map_change(leaving, "remove", "n5", None, None) is leaving
    assert map_change(m, "remove", "n9", None, None) is m  # gone already
    # 4 nodes, three copies: two may not leave.
    one_left = map_change(m, "remove", "n1", None, None)
    with pytest.raises(NodeConflict, match="would leave 2 nodes"):
        map_change(one_left, "remove", "n2", None, None)
    replacing = map_change(m, "replace", "n2", "127.0.0.1:7706", "n6")
    assert replacing.leaving == ("n2",) and "n6" in replacing.nodes
    assert map_change(replacing, "replace", "n2", "127.0.0.1:7706", "n6") is replacing
    # The plan from it rebuilds every replica of n2 on n6, n6 in n2's place.
    steps = plan(replacing, replacing.staying())
    moves = [s for s in steps if s.is_move]
    assert {s.remove for s in moves} == {"n2"} and {s.add for s in moves} == {"n6"}
    assert len(moves) == 3
    with pytest.raises(NodeNotFound, match="not in the cluster"):
        map_change(m, "replace", "n9", "127.0.0.1:7709", "n7")
    # Only a new node takes another's place: a node of the cluster (itself included) does
    # not, or a replace could mark every node leaving.
    with pytest.raises(NodeConflict, match="cannot take its own place"):
        map_change(m, "replace", "n2", "127.0.0.1:7702", "n2")
    with pytest.raises(NodeConflict, match="in the cluster already"):
        map_change(m, "replace", "n2", "127.0.0.1:7703", "n3")
    with pytest.raises(NodeConflict, match="in the cluster already"):
        map_change(replacing, "replace", "n1", "127.0.0.1:7706", "n6")
    with pytest.raises(BadRequest, match="unknown change"):
        map_change(m, "grow", "n1", None, None)


def test_a_leaving_node_is_part_of_the_maps_wire_form(tmp_path: Path) -> None:
    m = initial_map(config(tmp_path)).with_leaving("n3")
    assert m.to_dict()["leaving"] == ["n3"] and ClusterMap.from_dict(m.to_dict()) == m
    assert m.staying() == ["n1", "n2", "n4"]
    with pytest.raises(MapError, match="already leaving"):
        m.with_leaving("n3")
    bad = {**m.to_dict(), "leaving": ["n9"]}
    with pytest.raises(MapError, match="not a node"):
        ClusterMap.from_dict(bad)
