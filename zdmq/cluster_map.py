"""The cluster map: the nodes, where they listen, and the members of every replica group.

    partition(key) = mmh3(key) % partitions            fixed (zdmq/hashing.py)
    group(p)       = groups[p % len(groups)]            fixed
    members(g)     = (preferred leader, other voters)   changes, one member at a time
    address(node)  = "host:port"                        changes (a replaced host)

docs/design.md §19 says why keys never move between groups and only a group's members
move. A map is an immutable value: every change returns a new map whose epoch is one
higher per change, so of two maps of one cluster the higher epoch is the newer, and a
caller holding an older one knows to refetch it.

A map is whole or it is not built: `ClusterMap(...)` and `from_dict` check everything
(every group has exactly `replication` distinct voters, all of them known nodes, ...), and
each change checks what it changes, raising `MapError`. A change to a group is a `Step`:
a move (one voter takes another's place) or a leader change (which voter comes first);
`apply_step` and `apply_plan` apply them. Deciding which steps to take is
zdmq/cluster_plan.py's job.

Pure: no I/O, no awaits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn

from zdmq.errors import ZdmqError
from zdmq.hashing import partition_of

if TYPE_CHECKING:
    from zdmq.config import ClusterConfig

__all__ = [
    "ADDRESS",
    "NODE_ID",
    "ClusterMap",
    "MapError",
    "Step",
    "apply_plan",
    "apply_step",
    "check_address",
    "initial_map",
]

# Node and group ids: the names cluster.yaml takes for node ids (zdmq/config.py).
NODE_ID = _ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# A node's "host:port": a host name (dot-separated labels of ASCII letters, digits, "-"
# and "_"), an IPv4 address or an IPv6 address in brackets, and a port in 1..65535 without
# leading zeros. openapi.yaml's NodeEntry gives the same pattern.
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
ADDRESS = re.compile(rf"^(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\]):{_PORT}$")
_FIELDS = ("epoch", "partitions", "replication", "nodes", "groups")
_OPTIONAL = ("leaving",)


class MapError(ZdmqError, ValueError):
    """A map, or a change to one, that does not hold together: an unknown node among a
    group's members, a node twice in one group, a group without `replication` voters, a
    node removed while it still holds a replica. Never sent on the wire: whoever built the
    map or asked for the change is at fault, and the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class Step:
    """One change to one group, by one member.

    A *move* (`add` and `remove`): `add` takes `remove`'s place among the voters, in the
    same position, so a move of the preferred leader makes `add` the preferred leader (what
    a replace wants). The group carries it out through its log as add learner `add`,
    promote it once caught up, remove `remove` (§19), never holding two copies on a node;
    when `remove` leads, it hands the leadership to `add` before its removal, so the group
    has no election to hold.
    A *leader change* (`leader` alone): that voter becomes the first, the preferred
    leader; the others keep their order.
    """

    group: str
    add: str | None = None
    remove: str | None = None
    leader: str | None = None

    def __post_init__(self) -> None:
        move = self.add is not None and self.remove is not None and self.leader is None
        lead = self.add is None and self.remove is None and self.leader is not None
        if not (move or lead):
            raise MapError(f"{self}: a step is a move (add and remove) or a leader change")
        if move and self.add == self.remove:
            raise MapError(f"{self}: a move adds another node than it removes")

    @property
    def is_move(self) -> bool:
        return self.add is not None


class ClusterMap:
    """One epoch of the cluster's layout. `nodes` maps node id to "host:port" in the
    cluster's order; `groups` are the group ids in partition-table order; `members(g)` are
    g's voters, the preferred leader first; `learners(g)` are members catching up that do
    not vote (empty but while a move is under way); `leaving` are nodes being drained
    (their replicas move off, then they leave the map)."""

    __slots__ = (
        "_learners",
        "_members",
        "epoch",
        "groups",
        "leaving",
        "nodes",
        "partitions",
        "replication",
    )
    epoch: int
    partitions: int
    replication: int
    nodes: Mapping[str, str]
    groups: tuple[str, ...]
    leaving: tuple[str, ...]
    _members: dict[str, tuple[str, ...]]
    _learners: dict[str, tuple[str, ...]]  # only the groups that have some

    def __init__(
        self,
        *,
        epoch: int,
        partitions: int,
        replication: int,
        nodes: Mapping[str, str],
        members: Mapping[str, Sequence[str]],
        learners: Mapping[str, Sequence[str]] | None = None,
        leaving: Sequence[str] = (),
    ) -> None:
        _check_int("epoch", epoch, 1)
        _check_int("partitions", partitions, 1)
        _check_int("replication", replication, 1)
        if not nodes:
            raise MapError("nodes: a map needs at least one node")
        for node_id, address in nodes.items():
            _check_id(f"nodes[{node_id!r}]", node_id)
            check_address(f"nodes[{node_id!r}].address", address)
        _check_distinct_addresses(nodes)
        if replication > len(nodes):
            raise MapError(
                f"replication: {replication} voters per group need at least {replication} "
                f"nodes, the map has {len(nodes)}"
            )
        if not members:
            raise MapError("groups: a map needs at least one group")
        if len(members) > partitions:
            raise MapError(
                f"groups: {len(members)} groups but {partitions} partitions: "
                f"{len(members) - partitions} groups would hold no key"
            )
        learners = learners or {}
        for g in learners:
            if g not in members:
                raise MapError(f"learners: no group {g!r}")
        for g, voters in members.items():
            _check_id(f"group {g!r}", g)
            _check_group(g, tuple(voters), tuple(learners.get(g, ())), nodes, replication)
        for node in leaving:
            if node not in nodes:
                raise MapError(f"leaving: {node!r} is not a node of the map")
        if len(set(leaving)) != len(leaving):
            raise MapError("leaving: a node is named twice")
        self._init(
            epoch,
            partitions,
            replication,
            dict(nodes),
            {g: tuple(v) for g, v in members.items()},
            {g: tuple(v) for g, v in learners.items() if v},
            tuple(leaving),
        )

    def _init(
        self,
        epoch: int,
        partitions: int,
        replication: int,
        nodes: dict[str, str],
        members: dict[str, tuple[str, ...]],
        learners: dict[str, tuple[str, ...]],
        leaving: tuple[str, ...] = (),
    ) -> None:
        set_ = object.__setattr__
        set_(self, "epoch", epoch)
        set_(self, "partitions", partitions)
        set_(self, "replication", replication)
        set_(self, "nodes", MappingProxyType(nodes))
        set_(self, "groups", tuple(members))
        set_(self, "_members", members)
        set_(self, "_learners", learners)
        set_(self, "leaving", leaving)

    def _derive(
        self,
        *,
        changes: int = 1,
        nodes: dict[str, str] | None = None,
        members: dict[str, tuple[str, ...]] | None = None,
        learners: dict[str, tuple[str, ...]] | None = None,
        leaving: tuple[str, ...] | None = None,
    ) -> ClusterMap:
        """A map `changes` epochs on, from parts its caller has already checked (the
        rest of this map is whole, so only what changed needs checking)."""
        new = object.__new__(ClusterMap)
        new._init(
            self.epoch + changes,
            self.partitions,
            self.replication,
            dict(self.nodes) if nodes is None else nodes,
            self._members if members is None else members,
            self._learners if learners is None else learners,
            self.leaving if leaving is None else leaving,
        )
        return new

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"ClusterMap is immutable: {name} cannot be set")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"ClusterMap is immutable: {name} cannot be deleted")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClusterMap):
            return NotImplemented
        return (
            self.epoch == other.epoch
            and self.partitions == other.partitions
            and self.replication == other.replication
            and list(self.nodes.items()) == list(other.nodes.items())
            and list(self._members.items()) == list(other._members.items())
            and self._learners == other._learners
            and self.leaving == other.leaving
        )

    __hash__ = None  # type: ignore[assignment]  # equal by value, but large: not a key

    def __repr__(self) -> str:
        return (
            f"ClusterMap(epoch={self.epoch}, nodes={len(self.nodes)}, "
            f"groups={len(self.groups)}, replication={self.replication}, "
            f"partitions={self.partitions})"
        )

    # ---- the map a cluster starts with ------------------------------------------------
    @classmethod
    def initial(
        cls,
        nodes: Mapping[str, str] | Iterable[tuple[str, str]],
        partitions: int,
        replication: int,
        groups: int | None = None,
    ) -> ClusterMap:
        """The map of a new cluster, at epoch 1.

        `groups=None` is the layout of §15: one group per node, with the node's id, on the
        ring window of `replication` nodes that starts at it (`routing.group_members`), so a
        cluster that never changes routes exactly as before. `groups=G` makes groups
        `g0`..`g{G-1}`, group i on the window that starts at node i % N: each node comes
        first in G / N groups, give or take one, and holds G x R / N replicas when N
        divides G (else the last, partial round's windows overlap, and a node may hold up
        to min(G % N, R) more than another, which the first plan evens out)."""
        addresses = dict(nodes)
        node_ids = list(addresses)
        n = len(node_ids)
        if n == 0:
            raise MapError("nodes: a map needs at least one node")
        _check_int("replication", replication, 1)
        if replication > n:
            raise MapError(
                f"replication: {replication} voters per group need at least {replication} "
                f"nodes, the map has {n}"
            )
        if groups is None:
            ids = node_ids
        else:
            _check_int("groups", groups, 1)
            ids = [f"g{i}" for i in range(groups)]
        members = {
            g: tuple(node_ids[(i + k) % n] for k in range(replication)) for i, g in enumerate(ids)
        }
        return cls(
            epoch=1,
            partitions=partitions,
            replication=replication,
            nodes=addresses,
            members=members,
        )

    # ---- where a key lives -------------------------------------------------------------
    def group_of_partition(self, partition: int) -> str:
        if not 0 <= partition < self.partitions:
            raise MapError(f"partition {partition} is not in 0..{self.partitions - 1}")
        return self.groups[partition % len(self.groups)]

    def group_of(self, key: str) -> str:
        """The group that keeps `key`: the same partition as §1's placement, so a key's
        group never changes while the map's members do."""
        return self.groups[partition_of(key, self.partitions) % len(self.groups)]

    def members(self, group: str) -> tuple[str, ...]:
        """`group`'s voters, the preferred leader first."""
        try:
            return self._members[group]
        except KeyError:
            raise MapError(f"no group {group!r} in the map") from None

    def learners(self, group: str) -> tuple[str, ...]:
        if group not in self._members:
            raise MapError(f"no group {group!r} in the map")
        return self._learners.get(group, ())

    def moving(self) -> tuple[str, ...]:
        """The groups with learners: a move under way in each."""
        return tuple(self._learners)

    def preferred_leader(self, group: str) -> str:
        return self.members(group)[0]

    def groups_of_node(self, node: str) -> tuple[str, ...]:
        """The groups `node` is a voter of, in group order."""
        return tuple(g for g, voters in self._members.items() if node in voters)

    def holds(self, node: str) -> bool:
        """Whether `node` is a member (voter or learner) of any group."""
        return any(node in v for v in self._members.values()) or any(
            node in v for v in self._learners.values()
        )

    def replica_counts(self) -> dict[str, int]:
        """How many groups each node is a voter of (every node, in map order)."""
        counts = dict.fromkeys(self.nodes, 0)
        for voters in self._members.values():
            for node in voters:
                counts[node] += 1
        return counts

    def leader_counts(self) -> dict[str, int]:
        """How many groups each node is the preferred leader of (every node, in map order)."""
        counts = dict.fromkeys(self.nodes, 0)
        for voters in self._members.values():
            counts[voters[0]] += 1
        return counts

    # ---- changes: each returns a new map, one epoch on -----------------------------------
    def with_node(self, node: str, address: str) -> ClusterMap:
        """The map with a new node that holds nothing yet (a plan then moves replicas to it)."""
        _check_id("node", node)
        check_address(f"node {node!r}: address", address)
        if node in self.nodes:
            raise MapError(f"node {node!r} is already in the map")
        nodes = {**self.nodes, node: address}
        _check_distinct_addresses(nodes)
        return self._derive(nodes=nodes)

    def without_node(self, node: str) -> ClusterMap:
        """The map without `node`, which must hold no replica: a plan moves them first.
        (Enough nodes remain: the groups' voters are `replication` distinct other nodes.)"""
        self._known(node)
        if self.holds(node):
            held = [g for g in self.groups if node in self._members[g]][:5]
            raise MapError(
                f"node {node!r} still holds replicas (of {', '.join(held) or 'learners'}...): "
                "move them before removing it"
            )
        return self._derive(
            nodes={n: a for n, a in self.nodes.items() if n != node},
            leaving=tuple(n for n in self.leaving if n != node),
        )

    def with_leaving(self, node: str) -> ClusterMap:
        """The map with `node` marked leaving: plans move its replicas off (`staying`)."""
        self._known(node)
        if node in self.leaving:
            raise MapError(f"node {node!r} is already leaving")
        return self._derive(leaving=(*self.leaving, node))

    def staying(self) -> list[str]:
        """The nodes that are not leaving, in map order: where replicas belong."""
        return [n for n in self.nodes if n not in self.leaving]

    def with_address(self, node: str, address: str) -> ClusterMap:
        """The map with `node` listening on a new address (the same host, moved)."""
        self._known(node)
        check_address(f"node {node!r}: address", address)
        nodes = {**self.nodes, node: address}
        _check_distinct_addresses(nodes)
        return self._derive(nodes=nodes)

    def with_group(
        self, group: str, members: Sequence[str], learners: Sequence[str] = ()
    ) -> ClusterMap:
        """The map with `group`'s voters and learners set, as its log decided them."""
        if group not in self._members:
            raise MapError(f"no group {group!r} in the map")
        voters, learning = tuple(members), tuple(learners)
        _check_group(group, voters, learning, self.nodes, self.replication)
        all_learners = dict(self._learners)
        if learning:
            all_learners[group] = learning
        else:
            all_learners.pop(group, None)
        return self._derive(members={**self._members, group: voters}, learners=all_learners)

    def _known(self, node: str) -> None:
        if node not in self.nodes:
            raise MapError(f"node {node!r} is not in the map")

    # ---- the wire form -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`GET /v1/cluster`); lists keep the nodes' and groups' order."""
        return {
            "epoch": self.epoch,
            "partitions": self.partitions,
            "replication": self.replication,
            "nodes": [{"id": n, "address": a} for n, a in self.nodes.items()],
            "groups": [
                {"id": g, "members": list(v)}
                | ({"learners": list(self._learners[g])} if g in self._learners else {})
                for g, v in self._members.items()
            ],
        } | ({"leaving": list(self.leaving)} if self.leaving else {})

    @classmethod
    def from_dict(cls, raw: Any) -> ClusterMap:
        """A map from its JSON form, checked whole: a map that reaches a caller is one it
        can route by."""
        if not isinstance(raw, Mapping):
            raise MapError("map: expected a mapping")
        for key in raw:
            if key not in _FIELDS + _OPTIONAL:
                raise MapError(f"{key}: unknown field (known: {', '.join(_FIELDS + _OPTIONAL)})")
        for key in _FIELDS:
            if key not in raw:
                raise MapError(f"{key}: missing")
        nodes_raw = raw["nodes"]
        if not isinstance(nodes_raw, list) or not nodes_raw:
            raise MapError("nodes: expected a non-empty list of {id, address}")
        nodes: dict[str, str] = {}
        for i, item in enumerate(nodes_raw):
            where = f"nodes[{i}]"
            _check_keys(where, item, required=("id", "address"), optional=())
            _check_id(f"{where}.id", item["id"])
            if item["id"] in nodes:
                raise MapError(f"{where}.id: duplicate node {item['id']!r}")
            check_address(f"{where}.address", item["address"])
            nodes[item["id"]] = item["address"]
        groups_raw = raw["groups"]
        if not isinstance(groups_raw, list):
            raise MapError("groups: expected a list of {id, members, learners}")
        members: dict[str, list[str]] = {}
        learners: dict[str, list[str]] = {}
        for i, item in enumerate(groups_raw):
            where = f"groups[{i}]"
            _check_keys(where, item, required=("id", "members"), optional=("learners",))
            _check_id(f"{where}.id", item["id"])
            if item["id"] in members:
                raise MapError(f"{where}.id: duplicate group {item['id']!r}")
            members[item["id"]] = _node_list(f"{where}.members", item["members"])
            if "learners" in item:
                learners[item["id"]] = _node_list(f"{where}.learners", item["learners"])
        return cls(
            epoch=raw["epoch"],
            partitions=raw["partitions"],
            replication=raw["replication"],
            nodes=nodes,
            members=members,
            learners=learners,
            leaving=_node_list("leaving", raw.get("leaving", [])),
        )


def initial_map(config: ClusterConfig) -> ClusterMap:
    """The map a cluster starts with: cluster.yaml's nodes in its order, its groups."""
    return ClusterMap.initial(
        [(n.id, f"{n.host}:{n.port}") for n in config.nodes],
        config.partitions,
        min(config.replication, len(config.nodes)),
        config.groups,
    )


# ---- steps ------------------------------------------------------------------------------
def apply_step(m: ClusterMap, step: Step) -> ClusterMap:
    """The map after `step`, one epoch on."""
    return apply_plan(m, (step,))


def apply_plan(m: ClusterMap, steps: Iterable[Step]) -> ClusterMap:
    """The map after every step in order, one epoch on per step. Each step is checked
    against the map as the steps before it left it, so a plan for another map fails at
    its first step that does not fit."""
    members = dict(m._members)
    learners = dict(m._learners)
    changes = 0
    for step in steps:
        voters = members.get(step.group)
        if voters is None:
            raise MapError(f"{step}: no group {step.group!r} in the map")
        if step.add is not None and step.remove is not None:
            if step.add not in m.nodes:
                raise MapError(f"{step}: node {step.add!r} is not in the map")
            if step.add in voters:
                raise MapError(f"{step}: {step.add!r} is already a voter of {step.group!r}")
            if step.remove not in voters:
                raise MapError(f"{step}: {step.remove!r} is not a voter of {step.group!r}")
            members[step.group] = tuple(step.add if v == step.remove else v for v in voters)
            # The learner the move went through, if its executor recorded one, is a voter now.
            learning = tuple(n for n in learners.get(step.group, ()) if n != step.add)
            if learning:
                learners[step.group] = learning
            else:
                learners.pop(step.group, None)
        else:
            leader = step.leader
            assert leader is not None  # Step allows no third shape
            if leader not in voters:
                raise MapError(f"{step}: {leader!r} is not a voter of {step.group!r}")
            members[step.group] = (leader, *(v for v in voters if v != leader))
        changes += 1
    if changes == 0:
        return m
    return m._derive(changes=changes, members=members, learners=learners)


# ---- checks -----------------------------------------------------------------------------
def _check_group(
    group: str,
    voters: tuple[str, ...],
    learners: tuple[str, ...],
    nodes: Mapping[str, str],
    replication: int,
) -> None:
    if len(voters) != replication:
        raise MapError(
            f"group {group!r}: {len(voters)} voters {list(voters)}, "
            f"the map's replication is {replication}"
        )
    for kind, names in (("members", voters), ("learners", learners)):
        seen: set[str] = set()
        for node in names:
            if node not in nodes:
                raise MapError(f"group {group!r}: unknown node {node!r} in {kind}")
            if node in seen:
                raise MapError(f"group {group!r}: node {node!r} twice in {kind}")
            seen.add(node)
    both = set(voters) & set(learners)
    if both:
        raise MapError(f"group {group!r}: {sorted(both)} both a voter and a learner")


def _check_int(where: str, value: Any, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise MapError(f"{where}: expected an integer of at least {lo}, got {value!r}")


def _check_id(where: str, value: Any) -> None:
    if not isinstance(value, str) or not _ID.match(value):
        raise MapError(f"{where}: expected a name matching [A-Za-z0-9_.-]{{1,64}}, got {value!r}")


def check_address(where: str, value: Any) -> None:
    """A "host:port": ADDRESS (an IPv6 host in brackets: "[::1]:7701")."""
    if not isinstance(value, str) or not ADDRESS.fullmatch(value):
        raise MapError(
            f"{where}: expected 'host:port' (a host name, an IPv4 address or an IPv6 "
            f"address in brackets; a port in 1..65535), got {value!r}"
        )


def _check_distinct_addresses(nodes: Mapping[str, str]) -> None:
    seen: dict[str, str] = {}
    for node, address in nodes.items():
        if address in seen:
            raise MapError(f"nodes {seen[address]!r} and {node!r} both have address {address}")
        seen[address] = node


def _check_keys(where: str, item: Any, required: Sequence[str], optional: Sequence[str]) -> None:
    if not isinstance(item, Mapping):
        raise MapError(f"{where}: expected a mapping with {', '.join(required)}")
    for key in item:
        if key not in required and key not in optional:
            known = ", ".join(sorted([*required, *optional]))
            raise MapError(f"{where}.{key}: unknown field (known: {known})")
    for key in required:
        if key not in item:
            raise MapError(f"{where}.{key}: missing")


def _node_list(where: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise MapError(f"{where}: expected a list of node ids, got {value!r}")
    return value
