"""The pure parts of zdmq.spark: options, shares of max_messages, packed receipts."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from zdmq.spark._options import (
    ReadOptions,
    WriteOptions,
    node_shares,
    pack_receipts,
    unpack_receipts,
    write_dedup_id,
)


def test_read_options_take_strings_as_spark_hands_them_and_check_bounds() -> None:
    o = ReadOptions.parse({"Queue": "q", "batch_size": "50", "visibility_s": "12.5"})
    assert (o.queue, o.batch_size, o.visibility_s, o.decode) == ("q", 50, 12.5, "bytes")
    for bad, name in [
        ({"batch_size": "101"}, "batch_size"),
        ({"batch_size": "ten"}, "batch_size"),
        ({"wait_s": "21"}, "wait_s"),
        ({"decode": "xml"}, "decode"),
        ({"decode": "json"}, "json_schema"),
        ({"json_schema": "a long"}, "json_schema"),
        ({"max_messages": "0"}, "max_messages"),
    ]:
        with pytest.raises(ValueError, match=f"option {name}"):
            ReadOptions.parse({"queue": "q", **bad})
    with pytest.raises(ValueError, match="option queue"):
        ReadOptions.parse({})


def test_write_options_default_and_bounds() -> None:
    o = WriteOptions.parse({"queue": "q"})
    assert (o.batch_size, o.write_id, o.body_column) == (500, None, None)
    with pytest.raises(ValueError, match="option write_id"):
        WriteOptions.parse({"queue": "q", "write_id": "x" * 129})


@pytest.mark.parametrize("total", [None, 1, 3, 4, 10, 100_001])
def test_node_shares_split_max_messages_evenly_and_add_up(total: int | None) -> None:
    shares = node_shares(total, ["n1", "n2", "n3", "n4"])
    if total is None:
        assert set(shares.values()) == {None}
    else:
        values = [v for v in shares.values() if v is not None]
        assert sum(values) == total and max(values) - min(values) <= 1


def test_receipts_round_trip_packed_and_pack_smaller_than_joined() -> None:
    receipts = [f"{i:08x}-0000-4000-8000-{i:012x}.{i * 7919:016x}" for i in range(1000)]
    packed = pack_receipts(receipts)
    assert unpack_receipts(packed) == receipts and unpack_receipts(pack_receipts([])) == []
    assert len(packed) < len("\n".join(receipts))


def test_write_dedup_ids_depend_only_on_write_partition_and_row() -> None:
    assert write_dedup_id("w1", 3, 17) == write_dedup_id("w1", 3, 17) == "w1/3/17"
    assert len({write_dedup_id("w1", p, r) for p in range(3) for r in range(3)}) == 9
