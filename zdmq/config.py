"""The one typed cluster configuration, loaded and validated once.

Server, client, CLI, Locust and Spark all read the same `cluster.yaml` through
`ClusterConfig.load`. Validation names the field that is wrong
(`nodes[2].port: expected an integer in 1..65535, got 'x'`) so that a bad file never
gets as far as a running node. This module does no I/O beyond reading that file.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from zdmq.errors import ConfigError

__all__ = ["ClusterConfig", "Durability", "Limits", "NodeConfig"]

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

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

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
    replication: int = 2
    partitions: int = 256
    data_dir: Path = Path("data")
    durability: Durability = "fsync"
    limits: Limits = field(default_factory=Limits)
    # How often a node re-registers its non-empty queues with their metadata owners.
    repair_interval_s: float = 5.0
    # How long a node keeps an emptied UUID queue listed before it unregisters it (0: at
    # once, as ZDMQ does), so a queue that empties and refills does not re-register each time.
    unregister_grace_s: float = 1.0
    # Bound on one node-to-node or client-to-node call.
    request_timeout_s: float = 10.0
    source: Path | None = None

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
            "partitions",
            "data_dir",
            "durability",
            "limits",
            "repair_interval_s",
            "request_timeout_s",
            "unregister_grace_s",
        }
        for key in raw:
            if key not in known:
                raise ConfigError(f"{key}: unknown field (known: {', '.join(sorted(known))})")

        nodes = _nodes(raw.get("nodes"))
        replication = _int(raw, "replication", 2, 1, 16)
        if replication > len(nodes):
            raise ConfigError(
                f"replication: {replication} copies need at least {replication} nodes, "
                f"the file lists {len(nodes)}"
            )
        partitions = _int(raw, "partitions", 256, 1, 1 << 20)
        if partitions < len(nodes):
            raise ConfigError(f"partitions: {partitions} is fewer than the {len(nodes)} nodes")
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
        return cls(
            nodes=nodes,
            replication=replication,
            partitions=partitions,
            data_dir=data_dir,
            durability=durability,
            limits=_limits(raw.get("limits", {})),
            repair_interval_s=_float(raw, "repair_interval_s", 5.0, 0.05, 3600.0),
            request_timeout_s=_float(raw, "request_timeout_s", 10.0, 0.1, 600.0),
            unregister_grace_s=_float(raw, "unregister_grace_s", 1.0, 0.0, 60.0),
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
        raise ConfigError(f"node {node_id!r} is not in the cluster (nodes: {self.node_ids})")

    def node_data_dir(self, node_id: str) -> Path:
        return self.data_dir / node_id

    def to_dict(self) -> dict[str, Any]:
        """The file form (what `load` reads back), for writing per-test configs."""
        return {
            "nodes": [{"id": n.id, "host": n.host, "port": n.port} for n in self.nodes],
            "replication": self.replication,
            "partitions": self.partitions,
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
