"""Golden values that pin placement: changing them silently moves every stored message.

The numbers below were computed once with `mmh3.hash(key, 0, signed=False)` directly,
not with zdmq, and are written here as literals on purpose: if a refactor changes the
hash, the seed, the signedness or the replica walk, these tests fail.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter

import pytest

from zdmq.hashing import Placement, partition_of, replica_set

FIXED_UUID = "0b1e3f6c-8a0e-4d3c-9a57-2f1c6d0e7b42"
NODES4 = ("n1", "n2", "n3", "n4")
NODES8 = ("n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8")

# key -> (unsigned 32-bit murmur3 hash with seed 0, partition of 256)
GOLDEN_HASHES = {
    "jobs": (3905396282, 58),
    "a": (1009084850, 178),
    "": (0, 0),
    FIXED_UUID: (1104497089, 193),
    "orders.eu-west_1": (3537000190, 254),
    "ünïcode": (2947451484, 92),
}

# key -> (replica set on 4 nodes, replica set on 8 nodes), 256 partitions, replication 2
GOLDEN_REPLICAS = {
    "jobs": (("n3", "n4"), ("n3", "n4")),
    "a": (("n3", "n4"), ("n3", "n4")),
    "": (("n1", "n2"), ("n1", "n2")),
    FIXED_UUID: (("n2", "n3"), ("n2", "n3")),
    "orders.eu-west_1": (("n3", "n4"), ("n7", "n8")),
    "ünïcode": (("n1", "n2"), ("n5", "n6")),
}


@pytest.mark.parametrize(("key", "golden"), GOLDEN_HASHES.items())
def test_partition_of_matches_the_pinned_murmur3_values(key: str, golden: tuple[int, int]) -> None:
    hash_value, partition = golden
    assert hash_value % 256 == partition
    assert partition_of(key, 256) == partition
    assert partition_of(key, 16) == hash_value % 16
    assert partition_of(key, 1) == 0


@pytest.mark.parametrize(("key", "golden"), GOLDEN_REPLICAS.items())
def test_replica_sets_match_the_pinned_layouts(
    key: str, golden: tuple[tuple[str, ...], tuple[str, ...]]
) -> None:
    on4, on8 = golden
    p = GOLDEN_HASHES[key][1]
    assert replica_set(p, NODES4, 2) == on4
    assert replica_set(p, NODES8, 2) == on8


def test_replica_set_walks_the_node_ring_from_the_partition() -> None:
    assert replica_set(0, NODES4, 1) == ("n1",)
    assert replica_set(1, NODES4, 3) == ("n2", "n3", "n4")
    assert replica_set(255, NODES4, 2) == ("n4", "n1")
    assert replica_set(7, NODES8, 4) == ("n8", "n1", "n2", "n3")


def test_replica_set_never_names_a_node_twice_when_replication_exceeds_nodes() -> None:
    assert replica_set(3, ("a", "b"), 3) == ("b", "a")


@pytest.mark.parametrize("nodes", [NODES4, NODES8])
def test_placement_owner_and_replicas_agree_with_the_functions(nodes: tuple[str, ...]) -> None:
    placement = Placement(nodes, 256, 2)
    keys = [*GOLDEN_HASHES, *(str(uuid.UUID(int=i, version=4)) for i in range(500))]
    for key in keys:
        p = partition_of(key, 256)
        assert placement.partition(key) == p
        assert placement.replicas(key) == replica_set(p, nodes, 2)
        assert placement.owner(key) == replica_set(p, nodes, 2)[0]


def test_placement_owners_of_the_golden_keys_are_pinned() -> None:
    placement = Placement(NODES4, 256, 2)
    assert {k: placement.owner(k) for k in GOLDEN_REPLICAS} == {
        "jobs": "n3",
        "a": "n3",
        "": "n1",
        FIXED_UUID: "n2",
        "orders.eu-west_1": "n3",
        "ünïcode": "n1",
    }


def test_uuid4_ids_spread_evenly_over_four_nodes() -> None:
    # Seeded version-4 UUIDs: the same ids every run, shaped like uuid.uuid4()'s.
    rng = random.Random(20240601)
    placement = Placement(NODES4, 256, 2)
    ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(10_000)]
    counts = Counter(placement.owner(i) for i in ids)
    assert set(counts) == set(NODES4)
    for node, n in counts.items():
        assert 0.20 <= n / len(ids) <= 0.30, f"{node} owns {n} of {len(ids)}"
