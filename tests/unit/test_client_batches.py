"""The client's batch splitting: every push_many request stays within both limits."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from zdmq.client.client import _batches, _item_bytes, _push_frame
from zdmq.models import decode_batch


@given(
    sizes=st.lists(st.integers(min_value=1, max_value=500), max_size=60),
    max_count=st.integers(min_value=1, max_value=10),
    max_bytes=st.integers(min_value=600, max_value=3000),
)
def test_batches_keep_every_item_in_order_within_count_and_byte_limits(
    sizes: list[int], max_count: int, max_bytes: int
) -> None:
    items = [
        (f"{i:08d}-0000-4000-8000-000000000000", b"x" * n, None, None) for i, n in enumerate(sizes)
    ]
    seen: list[str | None] = []
    for start, end in _batches([_item_bytes(it) for it in items], max_count, max_bytes):
        frame = _push_frame(items[start:end])
        batch = decode_batch(frame)
        assert 1 <= batch.count <= max_count
        # Only a single item larger than the budget may exceed it (it cannot be split).
        assert len(frame) <= max_bytes or batch.count == 1
        assert batch.ids is not None
        seen.extend(batch.ids)
    assert seen == [it[0] for it in items]


def test_the_size_bound_of_an_item_covers_its_content_type_and_dedup_id() -> None:
    items = [(None, b"x" * 10, "text/plain; charset=utf-8", "dédup-ü" * 3)] * 5
    frame = _push_frame(items)
    assert len(frame) <= 12 + sum(_item_bytes(it) for it in items)


def test_no_items_make_no_batches() -> None:
    assert list(_batches([], 10, 1000)) == []
