"""zdmq.auth in-process: the node credential, the node secret file, client token rights."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from zdmq.auth import (
    MAX_SKEW_S,
    SECRET_ENV,
    SECRET_FILE,
    ClientGuard,
    NodeSigner,
    NodeVerifier,
    node_secret,
    require,
    rights_on,
)
from zdmq.config import ClusterConfig
from zdmq.errors import ConfigError, Forbidden, Unauthorized

SECRET = b"k" * 32


def _config(tmp_path: Path, host: str = "127.0.0.1", **extra: Any) -> ClusterConfig:
    return ClusterConfig.from_dict(
        {
            "nodes": [{"id": "n1", "host": host, "port": 7701}, {"id": "n2", "port": 7702}],
            "replication": 1,
            "data_dir": str(tmp_path / "data"),
            **extra,
        }
    )


@pytest.fixture(autouse=True)
def _no_secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)


def test_a_signed_call_verifies_and_any_change_to_it_does_not() -> None:
    signer, verifier = NodeSigner(SECRET, "n1"), NodeVerifier(SECRET, ("n1", "n2"))
    line = signer(b"POST /v1/queues/q/batch?x=1", b"body")
    name, _, value = line.decode().rstrip("\r\n").partition(": ")
    assert name == "zdmq-node-auth"
    assert verifier.verify(value, "POST", "/v1/queues/q/batch?x=1", b"body") == "n1"
    for method, target, body in (
        ("PUT", "/v1/queues/q/batch?x=1", b"body"),
        ("POST", "/v1/queues/q/batch?x=2", b"body"),
        ("POST", "/v1/queues/q/batch?x=1", b"bodx"),
    ):
        with pytest.raises(Unauthorized):
            verifier.verify(value, method, target, body)
    _, ts, mac = value.split(":")
    with pytest.raises(Unauthorized):  # another node's name on n1's MAC
        verifier.verify(f"n2:{ts}:{mac}", "POST", "/v1/queues/q/batch?x=1", b"body")
    with pytest.raises(Unauthorized):
        NodeVerifier(b"j" * 32, ("n1",)).verify(value, "POST", "/v1/queues/q/batch?x=1", b"body")


def test_a_node_not_in_the_map_is_refused_and_reported_only_when_its_signature_holds() -> None:
    known: set[str] = {"n1"}
    told: list[str] = []
    verifier = NodeVerifier(SECRET, known, told.append)
    value = NodeSigner(SECRET, "n6").value(b"POST /v1/internal/raft", b"x")
    with pytest.raises(Unauthorized, match="not a node of this cluster"):
        verifier.verify(value, "POST", "/v1/internal/raft", b"x")
    assert told == ["n6"]  # the node may have joined since this one learned the map
    forged = NodeSigner(b"z" * 32, "n7").value(b"POST /v1/internal/raft", b"x")
    with pytest.raises(Unauthorized, match="signature"):
        verifier.verify(forged, "POST", "/v1/internal/raft", b"x")
    assert told == ["n6"]
    known.add("n6")  # the map that names it came
    assert verifier.verify(value, "POST", "/v1/internal/raft", b"x") == "n6"
    # A node that joins asks for the map before anyone knows it.
    ask = NodeSigner(SECRET, "n8").value(b"GET /v1/cluster", b"")
    assert verifier.verify(ask, "GET", "/v1/cluster", b"", any_node=True) == "n8"


def test_a_credential_is_good_for_max_skew_either_way() -> None:
    signer, verifier = NodeSigner(SECRET, "n1"), NodeVerifier(SECRET, ("n1",))
    now = time.time()
    for skew, ok in ((-MAX_SKEW_S + 2, True), (MAX_SKEW_S - 2, True), (-MAX_SKEW_S - 2, False)):
        value = signer.value(b"GET /v1/cluster", b"", now=now + skew)
        if ok:
            assert verifier.verify(value, "GET", "/v1/cluster", b"") == "n1"
        else:
            with pytest.raises(Unauthorized):
                verifier.verify(value, "GET", "/v1/cluster", b"")


def test_nodes_starting_at_once_on_one_host_make_and_share_one_secret(tmp_path: Path) -> None:
    config = _config(tmp_path)
    got: list[bytes] = []
    threads = [threading.Thread(target=lambda: got.append(node_secret(config))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len(set(got)) == 1 and len(got[0]) == 64
    path = config.data_dir / SECRET_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == [SECRET_FILE]


def test_the_secret_comes_from_the_environment_then_the_file_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = tmp_path / "secret"
    named.write_text("f" * 40 + "\n")
    named.chmod(0o600)
    config = _config(tmp_path, host="10.1.2.3", auth={"node_secret_file": str(named)})
    assert node_secret(config) == b"f" * 40
    monkeypatch.setenv(SECRET_ENV, "e" * 20)
    assert node_secret(config) == b"e" * 20
    monkeypatch.setenv(SECRET_ENV, "short")
    with pytest.raises(ConfigError, match="shorter than 16"):
        node_secret(config)
    monkeypatch.delenv(SECRET_ENV)
    named.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        node_secret(config)
    with pytest.raises(ConfigError, match="ZDMQ_NODE_SECRET"):
        node_secret(_config(tmp_path, host="10.1.2.3"))


def test_rights_are_the_union_of_every_matching_prefix_and_admin_includes_the_others(
    tmp_path: Path,
) -> None:
    config = _config(
        tmp_path,
        auth={
            "client_tokens": [
                {"token": "t" * 20, "rights": {"orders-": ["write"], "orders-eu": ["read"]}},
                {"name": "ops", "token": "o" * 20, "rights": {"": ["admin"]}},
            ]
        },
    )
    tokens = config.auth.client_tokens
    assert tokens is not None
    t, ops = tokens
    assert rights_on(t, "orders-eu-1") == {"read", "write"}
    assert rights_on(t, "orders-us") == {"write"}
    assert rights_on(t, "billing") == frozenset()
    assert rights_on(ops, "anything") == {"read", "write", "admin"}
    with pytest.raises(Forbidden):
        require(t, "orders-us", "read")
    guard = ClientGuard(tokens)
    assert guard.token(f"Bearer {'o' * 20}") is ops
    for header in (None, "", "Bearer", f"Basic {'o' * 20}", "Bearer nope"):
        with pytest.raises(Unauthorized):
            guard.token(header)


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ({"client_tokens": [{"rights": {"": ["read"]}}]}, "token or token_env"),
        ({"client_tokens": [{"token": "short", "rights": {"": ["read"]}}]}, "16 characters"),
        ({"client_tokens": [{"token": "t" * 20, "rights": {"": ["root"]}}]}, "read, write"),
        ({"client_tokens": [{"token": "t" * 20}]}, "rights"),
        ({"client_tokens": {"token": "t" * 20}}, "expected a list"),
        ({"tokens": []}, "unknown field"),
        ({"node_secret_file": 5}, "path string"),
    ],
)
def test_a_bad_auth_block_names_the_field(
    tmp_path: Path, auth: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, auth=auth)


def test_a_token_from_the_environment_is_read_when_the_node_starts(tmp_path: Path) -> None:
    config = _config(
        tmp_path, auth={"client_tokens": [{"token_env": "ZDMQ_T1", "rights": {"": ["read"]}}]}
    )
    assert config.auth.client_tokens is not None
    with pytest.raises(ConfigError, match=r"\$ZDMQ_T1"):
        ClientGuard(config.auth.client_tokens, env={})
    guard = ClientGuard(config.auth.client_tokens, env={"ZDMQ_T1": "x" * 20})
    assert guard.token("Bearer " + "x" * 20).name == "ZDMQ_T1"
    assert ClusterConfig.from_dict(config.to_dict()).auth == config.auth
    assert os.environ.get("ZDMQ_T1") is None
