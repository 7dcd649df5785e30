"""The binary batch format (application/x-zdmq-batch): round trips and refusals, without
sockets; and the faster message ids and receipt parsing that share the batch hot path."""

from __future__ import annotations

import re
import struct
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zdmq.errors import BadRequest, BatchTooLarge, InvalidMessage
from zdmq.models import (
    BATCH_BODIES,
    BATCH_IDS,
    BATCH_RECEIPTS,
    decode_batch,
    encode_batch,
    new_message_id,
    parse_receipt,
)

ids_st = st.uuids().map(str)
optional_text = st.none() | st.text(max_size=20)
tokens = st.text(alphabet="0123456789abcdef", min_size=16, max_size=16)
receipts = st.builds(lambda i, t: f"{i}.{t}", ids_st, tokens)


@st.composite
def batches(draw: st.DrawFn) -> dict[str, list[object]]:
    n = draw(st.integers(min_value=0, max_value=8))
    columns: dict[str, list[object]] = {}
    if draw(st.booleans()):
        columns["ids"] = draw(st.lists(st.none() | ids_st, min_size=n, max_size=n))
    if draw(st.booleans()):
        columns["bodies"] = draw(st.lists(st.binary(max_size=64), min_size=n, max_size=n))
    for name in ("content_types", "dedup_ids", "groups"):
        if draw(st.booleans()):
            columns[name] = draw(st.lists(optional_text, min_size=n, max_size=n))
    if draw(st.booleans()):
        columns["receipts"] = draw(st.lists(st.none() | receipts, min_size=n, max_size=n))
    if draw(st.booleans()):
        counts = st.integers(min_value=0, max_value=2**32 - 1)
        columns["receive_counts"] = draw(st.lists(counts, min_size=n, max_size=n))
    return columns


@given(batches())
def test_every_batch_decodes_to_the_columns_it_was_encoded_from(
    columns: dict[str, list[object]],
) -> None:
    frame = encode_batch(**columns)  # type: ignore[arg-type]
    batch = decode_batch(frame)
    names = ("ids", "bodies", "content_types", "dedup_ids", "receipts", "receive_counts", "groups")
    for name in names:
        given_column = columns.get(name)
        got = getattr(batch, name)
        if given_column is None or (
            name in ("content_types", "dedup_ids", "receipts", "groups")
            and set(given_column) <= {None}
        ):
            # A column of nothing but None is left out: a reader takes it as all None.
            assert got is None
        else:
            assert got == given_column


def test_a_batch_frame_of_two_messages_has_the_documented_layout() -> None:
    mid = "0d7a1a0e-1111-4222-8333-444455556666"
    frame = encode_batch(ids=[mid, None], bodies=[b"ab", b""])
    expected = (
        b"ZQB1"
        + struct.pack("<II", 2, BATCH_IDS | BATCH_BODIES)
        + mid.encode()
        + b"\x00" * 36
        + struct.pack("<II", 2, 0)
        + b"ab"
    )
    assert frame == expected


def test_columns_of_different_lengths_are_a_programmer_error() -> None:
    with pytest.raises(ValueError):
        encode_batch(ids=[new_message_id()], bodies=[b"a", b"b"])


GOOD = encode_batch(
    ids=[new_message_id(), None],
    bodies=[b"hello", b"\x00\xff"],
    content_types=["text/plain", None],
    dedup_ids=[None, "order-7"],
)


@pytest.mark.parametrize("cut", range(len(GOOD)))
def test_a_frame_cut_short_anywhere_is_refused(cut: int) -> None:
    with pytest.raises(BadRequest):
        decode_batch(GOOD[:cut])


def test_bytes_after_the_last_column_are_refused() -> None:
    with pytest.raises(BadRequest, match="after its last column"):
        decode_batch(GOOD + b"x")


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (b"ZQB2" + GOOD[4:], "starts with"),
        (b'{"messages": []}', "starts with"),
        (b"ZQB1" + struct.pack("<II", 0, 1 << 12), "unknown field"),
        (
            b"ZQB1" + struct.pack("<II", 1, BATCH_IDS) + b"0D7A1A0E-1111-4222-8333-444455556666",
            r"ids\[0\]",
        ),
        (b"ZQB1" + struct.pack("<II", 1, BATCH_IDS) + b"x" * 36, r"ids\[0\]"),
        (b"ZQB1" + struct.pack("<II", 1, BATCH_BODIES) + struct.pack("<I", 0xFFFFFFFF), "no body"),
        (
            b"ZQB1" + struct.pack("<II", 1, BATCH_RECEIPTS) + struct.pack("<I", 2) + b"\xff\xfe",
            "not UTF-8",
        ),
        (b"ZQB1" + struct.pack("<II", 1000, BATCH_BODIES) + b"\x00" * 16, "cut short"),
    ],
)
def test_malformed_frames_are_refused_naming_the_problem(frame: bytes, match: str) -> None:
    with pytest.raises(BadRequest, match=match):
        decode_batch(frame)


def test_a_frame_over_the_batch_limit_is_refused_before_it_is_read() -> None:
    frame = b"ZQB1" + struct.pack("<II", 10**9, BATCH_BODIES)
    with pytest.raises(BatchTooLarge):
        decode_batch(frame, max_count=1000)


def test_new_message_ids_are_canonical_random_uuid4s() -> None:
    ids = [new_message_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for mid in ids:
        u = uuid.UUID(mid)
        assert str(u) == mid
        assert u.version == 4
        assert u.variant == uuid.RFC_4122
    # Every variant nibble and every other hex digit shows up: the random bits are random.
    assert {mid[19] for mid in ids} == set("89ab")
    assert set("".join(ids).replace("-", "")) == set("0123456789abcdef")


def _old_parse_receipt(receipt: object) -> tuple[str, str] | None:
    """The receipt rule as first written: one dot, a canonical UUID, 1..64 alphanumerics."""
    if not isinstance(receipt, str) or receipt.count(".") != 1:
        return None
    mid, token = receipt.split(".")
    try:
        if str(uuid.UUID(mid)) != mid:
            return None
    except ValueError:
        return None
    if not 1 <= len(token) <= 64 or not (token.isascii() and token.isalnum()):
        return None
    return mid, token


receipt_like = st.one_of(
    st.text(max_size=80),
    st.builds(lambda i, t: f"{i}.{t}", ids_st, st.text(max_size=70)),
    st.builds(
        lambda i, t: f"{i}.{t}",
        ids_st.map(str.upper),
        st.from_regex(r"[A-Za-z0-9]{1,70}", fullmatch=True),
    ),
    st.builds(lambda i, t: f"{i}.{t}", ids_st, st.from_regex(r"[A-Za-z0-9]{1,70}", fullmatch=True)),
    st.builds(lambda i: f"{i}.abc\n", ids_st),
)


@given(receipt_like)
def test_parse_receipt_accepts_exactly_what_the_receipt_rule_accepts(receipt: str) -> None:
    want = _old_parse_receipt(receipt)
    if want is None:
        with pytest.raises(InvalidMessage):
            parse_receipt(receipt)
    else:
        assert parse_receipt(receipt) == want
        assert re.fullmatch(r"[0-9a-f-]{36}", want[0])
