"""The client's batch splitting: every push_many request stays within both limits."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from zdmq.client.client import _batches


@given(
    sizes=st.lists(st.integers(min_value=1, max_value=500), max_size=60),
    max_count=st.integers(min_value=1, max_value=10),
    max_bytes=st.integers(min_value=600, max_value=3000),
)
def test_batches_keep_every_item_in_order_within_count_and_byte_limits(
    sizes: list[int], max_count: int, max_bytes: int
) -> None:
    items = [json.dumps({"id": str(i), "body": "x" * n}).encode() for i, n in enumerate(sizes)]
    out = list(_batches(items, max_count, max_bytes))
    seen = []
    for body in out:
        msgs = json.loads(body)["messages"]
        assert 1 <= len(msgs) <= max_count
        # Only a single item larger than the budget may exceed it (it cannot be split).
        assert len(body) <= max_bytes or len(msgs) == 1
        seen.extend(m["id"] for m in msgs)
    assert seen == [str(i) for i in range(len(sizes))]


def test_no_items_make_no_batches() -> None:
    assert list(_batches([], 10, 1000)) == []
