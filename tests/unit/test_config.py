"""ClusterConfig: the repo's cluster.yaml loads; every bad file names the field at fault."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from zdmq.config import ClusterConfig, Limits, NodeConfig
from zdmq.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _good() -> dict[str, Any]:
    return {
        "nodes": [
            {"id": "n1", "host": "127.0.0.1", "port": 7701},
            {"id": "n2", "host": "127.0.0.1", "port": 7702},
            {"id": "n3", "host": "127.0.0.1", "port": 7703},
        ],
        "replication": 2,
        "partitions": 64,
        "data_dir": "data",
        "durability": "fsync",
    }


def _write(tmp_path: Path, raw: Any) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw), encoding="utf-8")
    return path


def _with(**changes: Any) -> dict[str, Any]:
    raw = _good()
    raw.update(changes)
    return raw


def _with_node(i: int, **changes: Any) -> dict[str, Any]:
    raw = _good()
    raw["nodes"][i] = {**raw["nodes"][i], **changes}
    return raw


def test_the_repos_cluster_yaml_loads_with_four_nodes_replication_3_and_256_partitions() -> None:
    config = ClusterConfig.load(REPO / "cluster.yaml")
    assert config.node_ids == ("n1", "n2", "n3", "n4")
    assert [n.port for n in config.nodes] == [7701, 7702, 7703, 7704]
    assert config.replication == 3
    assert config.partitions == 256
    assert config.durability == "fsync"
    assert config.limits == Limits(max_message_bytes=1048576, max_batch_messages=1000)
    # A relative data_dir is relative to the file, not to the working directory.
    assert config.data_dir == REPO / "data"
    assert config.node_data_dir("n2") == REPO / "data" / "n2"
    assert config.source == (REPO / "cluster.yaml").resolve()


def test_defaults_fill_every_optional_field(tmp_path: Path) -> None:
    nodes = [{"id": "a", "port": 9000}, {"id": "b", "port": 9001}]
    config = ClusterConfig.load(_write(tmp_path, {"nodes": nodes}))
    assert config.nodes == (NodeConfig("a", "127.0.0.1", 9000), NodeConfig("b", "127.0.0.1", 9001))
    assert config.replication == 1
    assert config.partitions == 256
    assert config.durability == "fsync"
    assert config.limits == Limits()
    assert config.data_dir == tmp_path.resolve() / "data"


def test_to_dict_reads_back_as_the_same_config(tmp_path: Path) -> None:
    config = ClusterConfig.load(_write(tmp_path, _good()))
    again = ClusterConfig.load(_write(tmp_path, config.to_dict()))
    assert again == config


def test_node_lookup_of_an_unknown_id_is_a_config_error(tmp_path: Path) -> None:
    config = ClusterConfig.load(_write(tmp_path, _good()))
    assert config.node("n2") == NodeConfig("n2", "127.0.0.1", 7702)
    with pytest.raises(ConfigError, match="'n9'"):
        config.node("n9")


def test_node_urls_bracket_ipv6_hosts_and_know_loopback() -> None:
    assert NodeConfig("a", "127.0.0.1", 1).url == "http://127.0.0.1:1"
    assert NodeConfig("a", "::1", 2).url == "http://[::1]:2"
    assert NodeConfig("a", "::1", 2).is_loopback
    assert NodeConfig("a", "localhost", 2).is_loopback
    assert not NodeConfig("a", "10.0.0.1", 2).is_loopback
    assert not NodeConfig("a", "example.com", 2).is_loopback


BAD_FILES: dict[str, tuple[Any, str]] = {
    "port_not_an_int": (_with_node(2, port="x"), r"^nodes\[2\]\.port: "),
    "port_zero": (_with_node(1, port=0), r"^nodes\[1\]\.port: "),
    "port_too_high": (_with_node(0, port=65536), r"^nodes\[0\]\.port: "),
    "port_a_bool": (_with_node(2, port=True), r"^nodes\[2\]\.port: "),
    "port_missing": (
        {**_good(), "nodes": [{"id": "n1"}]},
        r"^nodes\[0\]\.port: ",
    ),
    "address_used_twice": (_with_node(1, port=7701), r"^nodes\[1\]\.port: .*already used"),
    "duplicate_ids": (_with_node(2, id="n1"), r"^nodes\[2\]\.id: duplicate node id 'n1'"),
    "bad_node_id": (_with_node(0, id="n 1"), r"^nodes\[0\]\.id: "),
    "empty_host": (_with_node(1, host=""), r"^nodes\[1\]\.host: "),
    "unknown_node_field": (_with_node(0, colour="red"), r"^nodes\[0\]\.colour: unknown field"),
    "node_not_a_mapping": ({**_good(), "nodes": ["n1"]}, r"^nodes\[0\]: "),
    "no_nodes": (_with(nodes=[]), r"^nodes: "),
    "nodes_missing": ({"replication": 1}, r"^nodes: "),
    "replication_over_nodes": (_with(replication=4), r"^replication: 4 copies need"),
    "replication_zero": (_with(replication=0), r"^replication: "),
    "replication_a_string": (_with(replication="2"), r"^replication: "),
    "partitions_fewer_than_nodes": (_with(partitions=2), r"^partitions: "),
    "unknown_field": (_with(colour="red"), r"^colour: unknown field"),
    "groups_zero": (_with(groups=0), r"^groups: expected an integer in 1\.\.64, got 0"),
    "groups_over_partitions": (_with(groups=65), r"^groups: expected an integer in 1\.\.64"),
    "groups_a_string": (_with(groups="24"), r"^groups: "),
    "groups_a_bool": (_with(groups=True), r"^groups: "),
    "groups_with_one_copy": (
        _with(groups=8, replication=1),
        r"^groups: needs replication 2 or more .* replication 1$",
    ),
    "bad_durability": (_with(durability="sometimes"), r"^durability: .*'sometimes'"),
    "empty_data_dir": (_with(data_dir=""), r"^data_dir: "),
    "limits_not_a_mapping": (_with(limits=5), r"^limits: "),
    "unknown_limit": (_with(limits={"max_bytes": 5}), r"^limits\.max_bytes: unknown field"),
    "limit_out_of_range": (
        _with(limits={"max_message_bytes": 0}),
        r"^limits\.max_message_bytes: ",
    ),
    "head_timeout_zero": (_with(limits={"head_timeout_s": 0}), r"^limits\.head_timeout_s: "),
    "body_timeout_a_string": (
        _with(limits={"body_timeout_s": "30s"}),
        r"^limits\.body_timeout_s: ",
    ),
    "idle_timeout_negative": (_with(limits={"idle_timeout_s": -1}), r"^limits\.idle_timeout_s: "),
    "max_connections_zero": (_with(limits={"max_connections": 0}), r"^limits\.max_connections: "),
    "max_connections_a_float": (
        _with(limits={"max_connections": 10.5}),
        r"^limits\.max_connections: ",
    ),
    "repair_interval_too_small": (_with(repair_interval_s=0), r"^repair_interval_s: "),
    "request_timeout_a_string": (_with(request_timeout_s="1s"), r"^request_timeout_s: "),
    "unregister_grace_negative": (_with(unregister_grace_s=-1), r"^unregister_grace_s: "),
    "top_level_a_list": ("- n1\n- n2\n", r"^top level: expected a mapping"),
    "empty_file": ("", r"^top level: expected a mapping"),
    "bad_yaml": ("nodes: [\n  - {id: n1\n", r"not valid YAML"),
}


@pytest.mark.parametrize(("raw", "pattern"), BAD_FILES.values(), ids=BAD_FILES.keys())
def test_a_bad_file_raises_a_config_error_naming_the_field(
    tmp_path: Path, raw: Any, pattern: str
) -> None:
    with pytest.raises(ConfigError, match=pattern):
        ClusterConfig.load(_write(tmp_path, raw))


def test_a_missing_file_raises_a_config_error_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read"):
        ClusterConfig.load(path)


def test_config_error_is_also_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_replication_3_needs_three_nodes(tmp_path: Path) -> None:
    nodes = [{"id": "a", "port": 9000}, {"id": "b", "port": 9001}]
    with pytest.raises(ConfigError, match=r"^replication: 3 copies need at least 3 nodes"):
        ClusterConfig.load(_write(tmp_path, {"nodes": nodes, "replication": 3}))


def test_groups_is_absent_by_default_and_round_trips_when_set(tmp_path: Path) -> None:
    config = ClusterConfig.from_dict(_good())
    assert config.groups is None
    assert "groups" not in config.to_dict()
    grouped = ClusterConfig.load(_write(tmp_path, _with(groups=24)))
    assert grouped.groups == 24
    assert grouped.to_dict()["groups"] == 24
    assert ClusterConfig.load(_write(tmp_path, grouped.to_dict())) == grouped


def test_groups_may_be_as_many_as_the_partitions_and_fewer_than_the_nodes() -> None:
    assert ClusterConfig.from_dict(_with(groups=64)).groups == 64
    assert ClusterConfig.from_dict(_with(groups=1)).groups == 1


def test_the_http_edge_limits_have_defaults_and_round_trip(tmp_path: Path) -> None:
    limits = ClusterConfig.from_dict(_good()).limits
    assert (limits.head_timeout_s, limits.body_timeout_s, limits.idle_timeout_s) == (10, 30, 75)
    assert limits.max_connections == 10_000
    raw = _with(limits={"head_timeout_s": 1.5, "body_timeout_s": 2, "max_connections": 7})
    config = ClusterConfig.from_dict(raw)
    assert (config.limits.head_timeout_s, config.limits.body_timeout_s) == (1.5, 2.0)
    assert config.limits.max_connections == 7
    assert ClusterConfig.from_dict(config.to_dict()).limits == config.limits


def test_configs_are_frozen() -> None:
    config = ClusterConfig.from_dict(_good())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.replication = 3  # type: ignore[misc]


def test_a_tls_block_makes_every_node_url_https_and_names_its_paths(tmp_path: Path) -> None:
    path = _write(tmp_path, _with(tls={"cert": "node.pem", "key": "/etc/zdmq/node.key"}))
    config = ClusterConfig.load(path)
    assert config.tls is not None
    assert config.tls.cert == tmp_path / "node.pem" and config.tls.ca is None
    assert {n.url.split(":")[0] for n in config.nodes} == {"https"}
    assert config.nodes[0].url == "https://127.0.0.1:7701"
    assert ClusterConfig.from_dict(config.to_dict()).tls == config.tls
    assert ClusterConfig.from_dict(_good()).nodes[0].url == "http://127.0.0.1:7701"
    for bad, message in (({"cert": "a"}, "tls.key"), ({"cert": "a", "key": "b", "x": 1}, "tls.x")):
        with pytest.raises(ConfigError, match=message):
            ClusterConfig.from_dict(_with(tls=bad))
    with pytest.raises(ConfigError, match="cannot load cert"):
        config.tls.server_context()
