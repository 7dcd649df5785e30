"""Zero-hop placement: which nodes own a key, computed locally by everyone.

    partition(key) = mmh3.hash(key, seed 0, unsigned) % partitions
    replicas(p)    = nodes[(p + i) % N] for i < replication   (the first is the primary)

Golden-value tests pin this function: changing it silently moves every message.
Pure: no I/O, no awaits.
"""

from __future__ import annotations

from collections.abc import Sequence

import mmh3

__all__ = ["Placement", "partition_of", "replica_set"]


def partition_of(key: str, partitions: int) -> int:
    return mmh3.hash(key, 0, signed=False) % partitions


def replica_set(partition: int, nodes: Sequence[str], replication: int) -> tuple[str, ...]:
    n = len(nodes)
    return tuple(nodes[(partition + i) % n] for i in range(min(replication, n)))


class Placement:
    """Placement for one cluster layout, with the replica sets precomputed."""

    __slots__ = ("_owners", "_sets", "nodes", "partitions", "replication")

    def __init__(self, nodes: Sequence[str], partitions: int, replication: int) -> None:
        assert nodes and partitions >= 1 and replication >= 1
        self.nodes = tuple(nodes)
        self.partitions = partitions
        self.replication = replication
        self._sets = tuple(replica_set(p, self.nodes, replication) for p in range(partitions))
        self._owners = tuple(s[0] for s in self._sets)

    def partition(self, key: str) -> int:
        return mmh3.hash(key, 0, signed=False) % self.partitions

    def owner(self, key: str) -> str:
        """The primary node of `key`'s partition."""
        return self._owners[mmh3.hash(key, 0, signed=False) % self.partitions]

    def replicas(self, key: str) -> tuple[str, ...]:
        return self._sets[mmh3.hash(key, 0, signed=False) % self.partitions]
