"""The client's checks before it sends: push_many's batch splitting keeps every request
within both limits, and push refuses a content type that is not a media type."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zdmq import Client, ClusterConfig
from zdmq.client.client import _PLAIN, _batches, _item_bytes, _push_frame
from zdmq.errors import InvalidMessage
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
        (f"{i:08d}-0000-4000-8000-000000000000", b"x" * n, None, None, *_PLAIN)
        for i, n in enumerate(sizes)
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


def test_the_size_bound_of_an_item_covers_its_content_type_dedup_id_and_options() -> None:
    options = (9, 1e10, 30.0, 900.0, '{"ké":"vü"}')
    items = [(None, b"x" * 10, "text/plain; charset=utf-8", "dédup-ü" * 3, *options)] * 5
    frame = _push_frame(items)
    assert len(frame) <= 12 + sum(_item_bytes(it) for it in items)


def test_no_items_make_no_batches() -> None:
    assert list(_batches([], 10, 1000)) == []


async def test_push_refuses_a_content_type_that_is_not_a_media_type_before_sending() -> None:
    # Nothing listens on port 9 (discard): a request sent would fail as NodeUnavailable.
    config = ClusterConfig.from_dict(
        {"nodes": [{"id": "n1", "host": "127.0.0.1", "port": 9}], "replication": 1}
    )
    async with Client(config=config) as c:
        with pytest.raises(InvalidMessage, match="content_type"):
            await c.push("q", b"x", content_type="text/plain\r\nX-Forged: 1")
