"""The one typed cluster configuration, loaded and validated once.

Server, client, CLI, Locust and Spark all read the same `cluster.yaml` through
`ClusterConfig.load`. Validation names the field that is wrong
(`nodes[2].port: expected an integer in 1..65535, got 'x'`) so that a bad file never
gets as far as a running node. This module does no I/O beyond reading that file.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from zdmq.errors import ConfigError

__all__ = [
    "AuthConfig",
    "ClientToken",
    "ClusterConfig",
    "Durability",
    "Limits",
    "NodeConfig",
    "TlsConfig",
]

Durability = Literal["fsync", "os", "memory"]
_DURABILITIES: tuple[str, ...] = ("fsync", "os", "memory")
_LIMIT_FIELDS = (
    "body_timeout_s",
    "head_timeout_s",
    "idle_timeout_s",
    "max_batch_messages",
    "max_connections",
    "max_message_bytes",
    "max_queues",
    "max_request_bytes",
)
_NODE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True, slots=True)
class NodeConfig:
    id: str
    host: str
    port: int
    tls: bool = False  # the cluster has a `tls` block: the node speaks HTTPS

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


@dataclass(frozen=True, slots=True)
class Limits:
    """A bound on every size and count a request can carry."""

    max_message_bytes: int = 1024 * 1024
    max_batch_messages: int = 1000
    # Per metadata owner: the queues whose metadata lists one node keeps.
    max_queues: int = 100_000
    # One request body (a batch travels as JSON, base64 bodies grow by 4/3).
    max_request_bytes: int = 16 * 1024 * 1024
    # The HTTP edge: a request head must be whole this long after its first byte; a body
    # must not go this long without a byte (both: 408 and close); a keep-alive
    # connection with no request is closed after idle_timeout_s.
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 75.0
    # Open client connections one node serves; one more gets 503 and is closed.
    max_connections: int = 10_000


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    nodes: tuple[NodeConfig, ...]
    replication: int = 1
    # With replication: the applied entries each member keeps in a group's Raft log
    # behind its durable state; it compacts the log once it holds twice as many (0: never).
    replication_log_entries: int = 10_000
    # ... and at most this many bytes of entries' data (the bound that matters for large
    # messages; 0: none).
    replication_log_bytes: int = 256 << 20
    partitions: int = 256
    # Replica groups `g0`..`g{groups-1}` over the partitions, whose members move when nodes
    # join or leave (docs/design.md §19); None: one group per node, on its ring window (§15).
    groups: int | None = None
    data_dir: Path = Path("data")
    durability: Durability = "fsync"
    limits: Limits = field(default_factory=Limits)
    # How often a node re-registers its non-empty queues with their metadata owners.
    repair_interval_s: float = 5.0
    # How long a node keeps an emptied UUID queue listed before it unregisters it (0: at
    # once, as ZDMQ does), so a queue that empties and refills does not re-register each time.
    unregister_grace_s: float = 1.0
    # The rate a node copies a group's state at when a replica moves to it (a snapshot
    # pulled from the group's leader), in bytes per second (0: as fast as it goes).
    move_bytes_per_s: int = 64 << 20
    # Bound on one node-to-node or client-to-node call.
    request_timeout_s: float = 10.0
    auth: AuthConfig = field(default_factory=lambda: AuthConfig())
    tls: TlsConfig | None = None
    source: Path | None = None
    # A node this process runs that the file does not list: it joins the running
    # cluster (`zdmq node --address`), which it learns from the listed nodes.
    joining: NodeConfig | None = None

    # ---- construction -------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> ClusterConfig:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"{p}: cannot read: {e.strerror or e}") from None
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}") from None
        return cls.from_dict(raw, base_dir=p.resolve().parent, source=p.resolve())

    @classmethod
    def from_dict(
        cls, raw: Any, *, base_dir: Path | None = None, source: Path | None = None
    ) -> ClusterConfig:
        if not isinstance(raw, Mapping):
            raise ConfigError("top level: expected a mapping")
        known = {
            "nodes",
            "replication",
            "replication_log_entries",
            "replication_log_bytes",
            "partitions",
            "groups",
            "data_dir",
            "durability",
            "limits",
            "repair_interval_s",
            "request_timeout_s",
            "unregister_grace_s",
            "move_bytes_per_s",
            "auth",
            "tls",
        }
        for key in raw:
            if key not in known:
                raise ConfigError(f"{key}: unknown field (known: {', '.join(sorted(known))})")

        nodes = _nodes(raw.get("nodes"))
        replication = _int(raw, "replication", 1, 1, 16)
        if replication > len(nodes):
            raise ConfigError(
                f"replication: {replication} copies need at least {replication} nodes, "
                f"the file lists {len(nodes)}"
            )
        partitions = _int(raw, "partitions", 256, 1, 1 << 20)
        if partitions < len(nodes):
            raise ConfigError(f"partitions: {partitions} is fewer than the {len(nodes)} nodes")
        groups = _groups(raw, replication, partitions)
        data_dir_raw = raw.get("data_dir", "data")
        if not isinstance(data_dir_raw, str) or not data_dir_raw:
            raise ConfigError(f"data_dir: expected a path string, got {data_dir_raw!r}")
        data_dir = Path(data_dir_raw).expanduser()
        if not data_dir.is_absolute() and base_dir is not None:
            data_dir = (base_dir / data_dir).resolve()
        durability = raw.get("durability", "fsync")
        if durability not in _DURABILITIES:
            raise ConfigError(
                f"durability: expected one of {', '.join(_DURABILITIES)}, got {durability!r}"
            )
        tls = _tls(raw["tls"], base_dir) if raw.get("tls") is not None else None
        if tls is not None:
            nodes = tuple(NodeConfig(n.id, n.host, n.port, tls=True) for n in nodes)
        return cls(
            nodes=nodes,
            replication=replication,
            replication_log_entries=_int(raw, "replication_log_entries", 10_000, 0, 1 << 40),
            replication_log_bytes=_int(raw, "replication_log_bytes", 256 << 20, 0, 1 << 50),
            partitions=partitions,
            groups=groups,
            data_dir=data_dir,
            durability=durability,
            limits=_limits(raw.get("limits", {})),
            repair_interval_s=_float(raw, "repair_interval_s", 5.0, 0.05, 3600.0),
            request_timeout_s=_float(raw, "request_timeout_s", 10.0, 0.1, 600.0),
            unregister_grace_s=_float(raw, "unregister_grace_s", 1.0, 0.0, 60.0),
            move_bytes_per_s=_int(raw, "move_bytes_per_s", 64 << 20, 0, 1 << 40),
            auth=_auth(raw.get("auth", {}), base_dir),
            tls=tls,
            source=source,
        )

    # ---- lookups ------------------------------------------------------------------
    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.nodes)

    def node(self, node_id: str) -> NodeConfig:
        for n in self.nodes:
            if n.id == node_id:
                return n
        if self.joining is not None and self.joining.id == node_id:
            return self.joining
        raise ConfigError(f"node {node_id!r} is not in the cluster (nodes: {self.node_ids})")

    def with_joining(self, node_id: str, address: str) -> ClusterConfig:
        """This file's cluster, run by node `node_id` listening on `address` ("host:port")
        that the file does not list (a node that joins it)."""
        if node_id in self.node_ids:
            raise ConfigError(f"node {node_id!r} is in the cluster file: it needs no --address")
        if not _NODE_ID.match(node_id):
            raise ConfigError(f"node id {node_id!r}: expected [A-Za-z0-9_.-], 1 to 64 characters")
        host, sep, port = address.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--address {address!r}: expected host:port")
        me = NodeConfig(node_id, host, int(port), tls=self.tls is not None)
        return dataclasses.replace(self, joining=me)

    @property
    def all_loopback(self) -> bool:
        """Whether every node listens on a loopback address (one host, nobody else)."""
        return all(n.is_loopback for n in self.nodes)

    def client_ssl(self) -> ssl.SSLContext | None:
        """How clients and nodes verify the nodes' certificates (None: plain HTTP)."""
        return self.tls.client_context() if self.tls is not None else None

    def node_data_dir(self, node_id: str) -> Path:
        return self.data_dir / node_id

    def to_dict(self) -> dict[str, Any]:
        """The file form (what `load` reads back), for writing per-test configs."""
        return {
            "nodes": [{"id": n.id, "host": n.host, "port": n.port} for n in self.nodes],
            "replication": self.replication,
            "replication_log_entries": self.replication_log_entries,
            "replication_log_bytes": self.replication_log_bytes,
            "partitions": self.partitions,
            **({"groups": self.groups} if self.groups is not None else {}),
            "data_dir": str(self.data_dir),
            "durability": self.durability,
            "limits": {
                "max_message_bytes": self.limits.max_message_bytes,
                "max_batch_messages": self.limits.max_batch_messages,
                "max_queues": self.limits.max_queues,
                "max_request_bytes": self.limits.max_request_bytes,
                "head_timeout_s": self.limits.head_timeout_s,
                "body_timeout_s": self.limits.body_timeout_s,
                "idle_timeout_s": self.limits.idle_timeout_s,
                "max_connections": self.limits.max_connections,
            },
            "repair_interval_s": self.repair_interval_s,
            "request_timeout_s": self.request_timeout_s,
            "unregister_grace_s": self.unregister_grace_s,
            "move_bytes_per_s": self.move_bytes_per_s,
            **({"auth": self.auth.to_dict()} if self.auth != AuthConfig() else {}),
            **({"tls": self.tls.to_dict()} if self.tls is not None else {}),
        }


def _nodes(raw: Any) -> tuple[NodeConfig, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError("nodes: expected a non-empty list of {id, host, port}")
    out: list[NodeConfig] = []
    seen_ids: set[str] = set()
    seen_addrs: set[tuple[str, int]] = set()
    for i, item in enumerate(raw):
        where = f"nodes[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where}: expected a mapping with id, host, port")
        for key in item:
            if key not in ("id", "host", "port"):
                raise ConfigError(f"{where}.{key}: unknown field (known: host, id, port)")
        node_id = item.get("id")
        if not isinstance(node_id, str) or not _NODE_ID.match(node_id):
            raise ConfigError(f"{where}.id: expected a name matching [A-Za-z0-9_.-]{{1,64}}")
        if node_id in seen_ids:
            raise ConfigError(f"{where}.id: duplicate node id {node_id!r}")
        host = item.get("host", "127.0.0.1")
        if not isinstance(host, str) or not host:
            raise ConfigError(f"{where}.host: expected a host name or address, got {host!r}")
        port = item.get("port")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ConfigError(f"{where}.port: expected an integer in 1..65535, got {port!r}")
        if (host, port) in seen_addrs:
            raise ConfigError(f"{where}.port: {host}:{port} is already used by another node")
        seen_ids.add(node_id)
        seen_addrs.add((host, port))
        out.append(NodeConfig(node_id, host, port))
    return tuple(out)


def _groups(raw: Mapping[str, Any], replication: int, partitions: int) -> int | None:
    """`groups`, when given: the groups are Raft groups whose members move, so there must
    be copies to move (replication 2 or more), and each group must keep some partition."""
    if raw.get("groups") is None:
        return None
    groups = _int(raw, "groups", 0, 1, partitions)
    if replication < 2:
        raise ConfigError(
            f"groups: needs replication 2 or more (the groups are Raft groups whose members "
            f"move between nodes), the file has replication {replication}"
        )
    return groups


def _limits(raw: Any) -> Limits:
    if not isinstance(raw, Mapping):
        raise ConfigError("limits: expected a mapping")
    for key in raw:
        if key not in _LIMIT_FIELDS:
            raise ConfigError(f"limits.{key}: unknown field (known: {', '.join(_LIMIT_FIELDS)})")
    limits = Limits(
        max_message_bytes=_int(raw, "max_message_bytes", 1 << 20, 1, 64 << 20, "limits."),
        max_batch_messages=_int(raw, "max_batch_messages", 1000, 1, 100_000, "limits."),
        max_queues=_int(raw, "max_queues", 100_000, 1, 10_000_000, "limits."),
        max_request_bytes=_int(raw, "max_request_bytes", 16 << 20, 1024, 1 << 30, "limits."),
        head_timeout_s=_float(raw, "head_timeout_s", 10.0, 0.05, 3600.0, "limits."),
        body_timeout_s=_float(raw, "body_timeout_s", 30.0, 0.05, 3600.0, "limits."),
        idle_timeout_s=_float(raw, "idle_timeout_s", 75.0, 0.05, 86400.0, "limits."),
        max_connections=_int(raw, "max_connections", 10_000, 1, 1_000_000, "limits."),
    )
    if limits.max_request_bytes < 2 * limits.max_message_bytes:
        raise ConfigError(
            "limits.max_request_bytes: must be at least twice max_message_bytes "
            f"({2 * limits.max_message_bytes}) so that one message fits in a JSON batch"
        )
    return limits


def _int(raw: Mapping[str, Any], key: str, default: int, lo: int, hi: int, prefix: str = "") -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{prefix}{key}: expected an integer in {lo}..{hi}, got {value!r}")
    return value


def _float(
    raw: Mapping[str, Any], key: str, default: float, lo: float, hi: float, prefix: str = ""
) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ConfigError(f"{prefix}{key}: expected a number in {lo}..{hi}, got {value!r}")
    return float(value)


# ---- auth: the node secret and the client tokens (docs/operations.md) ----------------------
RIGHTS: tuple[str, ...] = ("read", "write", "admin")


@dataclass(frozen=True, slots=True)
class ClientToken:
    """A bearer token and its rights: queue-name prefix -> rights ("" is every queue).

    `token` is the secret itself, or None when it comes from the environment variable
    `token_env` (read by the node when it starts, so a client can load the same file)."""

    name: str
    token: str | None
    token_env: str | None
    rights: tuple[tuple[str, frozenset[str]], ...]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.token is not None:
            out["token"] = self.token
        else:
            out["token_env"] = self.token_env
        out["rights"] = {prefix: sorted(r) for prefix, r in self.rights}
        return out


@dataclass(frozen=True, slots=True)
class AuthConfig:
    # A file holding the cluster's node secret (else $ZDMQ_NODE_SECRET, else, on a
    # loopback-only cluster, <data_dir>/node.secret made at first start).
    node_secret_file: Path | None = None
    # None: client auth is off (allowed only when every node listens on loopback).
    client_tokens: tuple[ClientToken, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.node_secret_file is not None:
            out["node_secret_file"] = str(self.node_secret_file)
        if self.client_tokens is not None:
            out["client_tokens"] = [t.to_dict() for t in self.client_tokens]
        return out


def _auth(raw: Any, base_dir: Path | None) -> AuthConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError("auth: expected a mapping")
    for key in raw:
        if key not in ("node_secret_file", "client_tokens"):
            raise ConfigError(f"auth.{key}: unknown field (known: client_tokens, node_secret_file)")
    secret_file = None
    if "node_secret_file" in raw:
        value = raw["node_secret_file"]
        if not isinstance(value, str) or not value:
            raise ConfigError(f"auth.node_secret_file: expected a path string, got {value!r}")
        secret_file = Path(value).expanduser()
        if not secret_file.is_absolute() and base_dir is not None:
            secret_file = (base_dir / secret_file).resolve()
    tokens = None
    if raw.get("client_tokens") is not None:
        tokens = _client_tokens(raw["client_tokens"])
    return AuthConfig(node_secret_file=secret_file, client_tokens=tokens)


def _client_tokens(raw: Any) -> tuple[ClientToken, ...]:
    if not isinstance(raw, list):
        raise ConfigError("auth.client_tokens: expected a list of {token or token_env, rights}")
    out: list[ClientToken] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"auth.client_tokens[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where}: expected a mapping with token or token_env, and rights")
        for key in item:
            if key not in ("name", "token", "token_env", "rights"):
                raise ConfigError(
                    f"{where}.{key}: unknown field (known: name, rights, token, token_env)"
                )
        token, env = item.get("token"), item.get("token_env")
        if (token is None) == (env is None):
            raise ConfigError(f"{where}: give token or token_env, exactly one")
        if token is not None and (not isinstance(token, str) or len(token) < 16):
            raise ConfigError(f"{where}.token: expected a string of at least 16 characters")
        if token is not None and (not token.isascii() or not token.isprintable() or " " in token):
            raise ConfigError(f"{where}.token: expected printable ASCII without spaces")
        if env is not None and (not isinstance(env, str) or not env):
            raise ConfigError(f"{where}.token_env: expected an environment variable name")
        name = item.get("name", env if env is not None else f"token{i}")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}.name: expected a string")
        if name in seen:
            raise ConfigError(f"{where}.name: duplicate token name {name!r}")
        seen.add(name)
        rights_raw = item.get("rights")
        if not isinstance(rights_raw, Mapping) or not rights_raw:
            raise ConfigError(
                f"{where}.rights: expected a mapping of queue-name prefix -> "
                '[read, write, admin], e.g. {"orders-": [read, write]}'
            )
        rights: list[tuple[str, frozenset[str]]] = []
        for prefix, granted in rights_raw.items():
            if not isinstance(prefix, str):
                raise ConfigError(f"{where}.rights: a prefix must be a string, got {prefix!r}")
            if not isinstance(granted, list) or not all(r in RIGHTS for r in granted):
                raise ConfigError(
                    f"{where}.rights[{prefix!r}]: expected a list of read, write, admin, "
                    f"got {granted!r}"
                )
            rights.append((prefix, frozenset(granted)))
        out.append(ClientToken(name, token, env, tuple(rights)))
    return tuple(out)


# ---- tls: HTTPS for clients and between nodes (docs/operations.md) -----------------------
@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Every node serves HTTPS with `cert` and `key`; clients and nodes verify the nodes'
    certificates against `ca` (else the system's trust store)."""

    cert: Path
    key: Path
    ca: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"cert": str(self.cert), "key": str(self.key)}
        if self.ca is not None:
            out["ca"] = str(self.ca)
        return out

    def client_context(self) -> ssl.SSLContext:
        """What a client or a node calling another verifies the nodes with."""
        return ssl.create_default_context(cafile=str(self.ca) if self.ca is not None else None)

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(str(self.cert), str(self.key))
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"tls: cannot load cert {self.cert} / key {self.key}: {e}") from None
        return ctx


def _tls(raw: Any, base_dir: Path | None) -> TlsConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError("tls: expected a mapping with cert, key and optionally ca")
    for key in raw:
        if key not in ("cert", "key", "ca"):
            raise ConfigError(f"tls.{key}: unknown field (known: ca, cert, key)")

    def path(name: str) -> Path:
        value = raw.get(name)
        if not isinstance(value, str) or not value:
            raise ConfigError(f"tls.{name}: expected a path string, got {value!r}")
        p = Path(value).expanduser()
        return (base_dir / p).resolve() if not p.is_absolute() and base_dir is not None else p

    return TlsConfig(
        cert=path("cert"), key=path("key"), ca=path("ca") if raw.get("ca") is not None else None
    )
