"""The pure parts of zdmq.spark: options, shares of max_messages, packed receipts."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")

from zdmq.spark import _options as options


def test_read_options_take_strings_as_spark_hands_them_and_check_bounds() -> None:
    o = options.ReadOptions.parse({"Queue": "q", "BATCH_SIZE": "50", "visibility_s": " 12.5 "})
    assert (o.queue, o.batch_size, o.visibility_s, o.decode) == ("q", 50, 12.5, "bytes")
    for bad, name in [
        ({"batch_size": "101"}, "batch_size"),
        ({"batch_size": "ten"}, "batch_size"),
        ({"batch_size": "2.5"}, "batch_size"),
        ({"inflight": "0"}, "inflight"),
        ({"visibility_s": "nan"}, "visibility_s"),
        ({"visibility_s": "0.5"}, "visibility_s"),
        ({"wait_s": "21"}, "wait_s"),
        ({"decode": "xml"}, "decode"),
        ({"decode": "json"}, "json_schema"),
        ({"json_schema": "a long"}, "json_schema"),
        ({"max_messages": "0"}, "max_messages"),
        ({"max_messages_per_batch": "100001"}, "max_messages_per_batch"),
    ]:
        with pytest.raises(ValueError, match=rf"^option {name}: "):
            options.ReadOptions.parse({"queue": "q", **bad})
    for missing in [{}, {"queue": ""}]:
        with pytest.raises(ValueError, match=r"^option queue: required"):
            options.ReadOptions.parse(missing)


def test_keyword_values_take_the_same_path_as_strings_and_defaults_are_the_fields() -> None:
    given: dict[str, Any] = {"queue": "q", "batch_size": 50, "visibility_s": 12.5, "wait_s": 1}
    assert options.ReadOptions.parse(given) == options.ReadOptions.parse(
        {k: str(v) for k, v in given.items()}
    )
    assert options.ReadOptions.parse({"queue": "q", "max_messages": None}) == (
        options.ReadOptions("q")
    )
    assert options.WriteOptions.parse({"queue": "q"}) == options.WriteOptions("q")
    with pytest.raises(ValueError, match=r"^option batch_size: expected an integer, got True"):
        options.ReadOptions.parse({"queue": "q", "batch_size": True})


def test_unknown_option_names_are_refused_by_name_and_paths_pass() -> None:
    with pytest.raises(ValueError, match=r"^unknown option 'visibility' "):
        options.ReadOptions.parse({"queue": "q", "visibility": "3"})
    with pytest.raises(ValueError, match=r"^unknown option 'write_id' "):
        options.ReadOptions.parse({"queue": "q", "write_id": "w"})  # a write option
    with pytest.raises(ValueError, match=r"^unknown option 'decode' "):
        options.WriteOptions.parse({"queue": "q", "decode": "json"})  # a read option
    passed = {"queue": "q", "config": "c.yaml", "urls": "http://a:1", "path": "p"}
    assert options.ReadOptions.parse(passed) == options.ReadOptions("q")
    assert options.WriteOptions.parse(passed) == options.WriteOptions("q")


def test_write_options_default_and_bounds() -> None:
    o = options.WriteOptions.parse({"queue": "q", "write_id": "w1", "body_column": "b"})
    assert (o.batch_size, o.inflight, o.write_id, o.body_column) == (500, 4, "w1", "b")
    assert (o.priority, o.ttl_s, o.delay_s) == (0, None, None)
    o = options.WriteOptions.parse({"queue": "q", "priority": "7", "ttl_s": "60", "delay_s": "2"})
    assert (o.priority, o.ttl_s, o.delay_s) == (7, 60.0, 2.0)
    for bad, name in [
        ({"write_id": "x" * 129}, "write_id"),
        ({"write_id": ""}, "write_id"),
        ({"batch_size": "0"}, "batch_size"),
        ({"inflight": "33"}, "inflight"),
        ({"priority": "10"}, "priority"),
        ({"ttl_s": "0"}, "ttl_s"),
        ({"delay_s": "901"}, "delay_s"),
    ]:
        with pytest.raises(ValueError, match=rf"^option {name}: "):
            options.WriteOptions.parse({"queue": "q", **bad})


@pytest.mark.parametrize("total", [None, 1, 3, 4, 10, 100_001])
def test_node_shares_split_max_messages_evenly_and_add_up(total: int | None) -> None:
    shares = options.node_shares(total, ["n1", "n2", "n3", "n4"])
    assert list(shares) == ["n1", "n2", "n3", "n4"]
    if total is None:
        assert set(shares.values()) == {None}
    else:
        values = [v for v in shares.values() if v is not None]
        assert len(values) == 4 and sum(values) == total and max(values) - min(values) <= 1


def test_receipts_round_trip_packed_and_pack_smaller_than_joined() -> None:
    receipts = [f"{i:08x}-0000-4000-8000-{i:012x}.{i * 7919:016x}" for i in range(1000)]
    packed = options.pack_receipts(receipts)
    assert options.unpack_receipts(packed) == receipts
    assert options.unpack_receipts(options.pack_receipts([])) == []
    assert len(packed) < len("\n".join(receipts))


def test_write_dedup_ids_depend_only_on_write_partition_and_row() -> None:
    assert options.write_dedup_id("w1", 3, 17) == "w1/3/17"
    ids = {options.write_dedup_id("w1", p, r) for p in range(12) for r in range(12)}
    assert len(ids) == 144  # "1/11" and "11/1" stay apart
