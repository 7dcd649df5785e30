"""Wire models: queue names, body encodings, message ids, queue settings, dedup ids and
receipts, checked without sockets."""

from __future__ import annotations

import base64
import math
import uuid
from collections import Counter
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zdmq.errors import BadRequest, InvalidMessage, InvalidQueueName, MessageTooLarge
from zdmq.hashing import Placement
from zdmq.models import (
    Message,
    QueueSettings,
    decode_body,
    dedup_message_id,
    encode_body,
    make_receipt,
    message_from_wire,
    message_to_wire,
    new_message_id,
    new_message_ids,
    parse_receipt,
    validate_content_type,
    validate_message_id,
    validate_queue_name,
)

GOOD_NAMES = [
    "q",
    "jobs",
    "Jobs_2024-01.retry",
    "...",
    "-",
    "_",
    "0123456789",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-",
    "x" * 128,
]
BAD_NAMES = [
    "",
    " ",
    "bad name",
    "a/b",
    "/",
    "x" * 129,
    "ünïcode",
    "jobs\n",
    "tab\there",
    "a:b",
    "a%20b",
    "q?x=1",
    "q#x",
    "jöbs",
]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_validate_queue_name_accepts_names_of_1_to_128_allowed_characters(name: str) -> None:
    assert validate_queue_name(name) == name


@pytest.mark.parametrize("name", BAD_NAMES)
def test_validate_queue_name_rejects_any_other_name(name: str) -> None:
    with pytest.raises(InvalidQueueName, match="must match"):
        validate_queue_name(name)


@pytest.mark.parametrize("name", [".", ".."])
def test_validate_queue_name_rejects_dot_names_that_urls_normalise_away(name: str) -> None:
    with pytest.raises(InvalidQueueName, match="reserved"):
        validate_queue_name(name)


@pytest.mark.parametrize("name", [None, 5, b"jobs"])
def test_validate_queue_name_rejects_non_strings(name: object) -> None:
    with pytest.raises(InvalidQueueName):
        validate_queue_name(name)  # type: ignore[arg-type]


@pytest.mark.parametrize("body", [b"", b"hello", "h\u00e9llo \u2603".encode(), b"\x00\x01 nul"])
def test_utf8_bodies_encode_as_text_and_decode_back(body: bytes) -> None:
    text, encoding = encode_body(body)
    assert encoding == "utf-8"
    assert text == body.decode("utf-8")
    assert decode_body(text, encoding, 1 << 20) == body


@pytest.mark.parametrize("body", [b"\xff", b"\x80\x81\x82", bytes(range(256)), b"ok\xc3"])
def test_non_utf8_bodies_encode_as_base64_and_decode_back(body: bytes) -> None:
    text, encoding = encode_body(body)
    assert encoding == "base64"
    assert base64.b64decode(text) == body
    assert decode_body(text, encoding, 1 << 20) == body


@pytest.mark.parametrize("text", ["not base64!", "abc", "YWJj\n", "YW=Jj"])
def test_decode_body_rejects_invalid_base64(text: str) -> None:
    with pytest.raises(InvalidMessage, match="not valid base64"):
        decode_body(text, "base64", 1 << 20)


@pytest.mark.parametrize("encoding", ["latin-1", "utf8", "", None, "BASE64"])
def test_decode_body_rejects_unknown_encodings(encoding: object) -> None:
    with pytest.raises(InvalidMessage, match="encoding"):
        decode_body("abc", encoding, 1 << 20)


@pytest.mark.parametrize("text", [None, 5, b"abc", ["a"]])
def test_decode_body_rejects_a_body_that_is_not_a_string(text: object) -> None:
    with pytest.raises(InvalidMessage, match="body: expected a string"):
        decode_body(text, "utf-8", 1 << 20)


def test_decode_body_allows_exactly_the_limit_and_refuses_one_byte_more() -> None:
    assert decode_body("x" * 10, "utf-8", 10) == b"x" * 10
    with pytest.raises(MessageTooLarge, match="11 bytes is over the 10-byte limit"):
        decode_body("x" * 11, "utf-8", 10)
    # The limit counts decoded bytes, not the characters of the text.
    assert decode_body("\u00e9" * 5, "utf-8", 10) == "\u00e9".encode() * 5
    with pytest.raises(MessageTooLarge):
        decode_body("\u00e9" * 6, "utf-8", 10)
    with pytest.raises(MessageTooLarge):
        decode_body(base64.b64encode(b"\xff" * 11).decode(), "base64", 10)
    assert decode_body(base64.b64encode(b"\xff" * 10).decode(), "base64", 10) == b"\xff" * 10


def test_new_message_ids_are_canonical_uuid4s() -> None:
    ids = {new_message_id() for _ in range(100)}
    assert len(ids) == 100
    for i in ids:
        assert validate_message_id(i) == i
        assert uuid.UUID(i).version == 4


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 100, 250])
def test_ids_drawn_for_a_batch_are_distinct_canonical_uuid4s_with_one_owner(n: int) -> None:
    placement = Placement(["n1", "n2", "n3", "n4"], 256, 2)
    ids = new_message_ids(n, placement.owner)
    assert len(ids) == n == len(set(ids))
    for i in ids:
        assert validate_message_id(i) == i
        assert uuid.UUID(i).version == 4
    assert len({placement.owner(i) for i in ids}) == 1


def test_batches_of_drawn_ids_spread_over_the_nodes_as_single_ids_do() -> None:
    # Each node owns 64 of the 256 partitions: 800 batches give each about 200 (a
    # standard deviation of 12); a batch's node that were not random would show.
    placement = Placement(["n1", "n2", "n3", "n4"], 256, 2)
    nodes = Counter(placement.owner(new_message_ids(3, placement.owner)[0]) for _ in range(800))
    assert set(nodes) == {"n1", "n2", "n3", "n4"}
    assert all(140 <= c <= 260 for c in nodes.values()), nodes


def test_ids_drawn_for_an_owner_no_other_id_has_stop_at_the_draw_budget() -> None:
    # Every id its own owner: no second id ever matches the first, so after its budget
    # of draws new_message_ids hands out plain fresh ids rather than drawing forever.
    ids = new_message_ids(50, lambda mid: mid)
    assert len(ids) == 50 == len(set(ids))
    assert all(uuid.UUID(i).version == 4 for i in ids)


def test_no_ids_drawn_for_an_empty_batch() -> None:
    assert new_message_ids(0, Placement(["n1", "n2"], 256, 1).owner) == []


@pytest.mark.parametrize(
    "value",
    [
        "0B1E3F6C-8A0E-4D3C-9A57-2F1C6D0E7B42",
        "0b1e3f6c8a0e4d3c9a572f1c6d0e7b42",
        "{0b1e3f6c-8a0e-4d3c-9a57-2f1c6d0e7b42}",
        "urn:uuid:0b1e3f6c-8a0e-4d3c-9a57-2f1c6d0e7b42",
        "0b1e3f6c-8a0e-4d3c-9a57-2f1c6d0e7b4",
        "not-a-uuid",
        "",
        None,
        5,
    ],
)
def test_validate_message_id_rejects_anything_but_a_canonical_uuid(value: object) -> None:
    with pytest.raises(InvalidMessage, match="message id"):
        validate_message_id(value)  # type: ignore[arg-type]


def test_validate_message_id_accepts_a_canonical_uuid() -> None:
    value = "0b1e3f6c-8a0e-4d3c-9a57-2f1c6d0e7b42"
    assert validate_message_id(value) == value


@pytest.mark.parametrize("body", [b"text", b"\xff\xfe binary"])
def test_a_message_round_trips_through_its_wire_form(body: bytes) -> None:
    wire = message_to_wire("id-1", body)
    assert set(wire) == {"id", "body", "encoding"}
    assert message_from_wire(wire) == Message("id-1", body)
    assert message_from_wire({**wire, "content_type": "a/b"}) == Message("id-1", body, "a/b")


@pytest.mark.parametrize("item", [None, [], {"body": "x"}, {"id": 5, "body": "x"}])
def test_message_from_wire_rejects_a_malformed_item(item: object) -> None:
    with pytest.raises(InvalidMessage):
        message_from_wire(item)


def test_message_text_decodes_the_body() -> None:
    assert Message("i", "h\u00e9".encode()).text() == "h\u00e9"
    assert Message("i", b"\xe9").text("latin-1") == "\u00e9"


# ---- queue settings --------------------------------------------------------------------
CLUSTER_MAX_BYTES = 1024 * 1024
FULL_SETTINGS = {
    "visibility_timeout_s": 12.5,
    "max_receives": 4,
    "dead_letter_queue": "jobs-dlq",
    "retention_s": 3600,
    "dedup_window_s": 60,
    "max_message_bytes": 4096,
    "fifo": True,
    "content_based_dedup": True,
}


@pytest.mark.parametrize("payload", [None, {}], ids=["no_body", "empty_object"])
def test_settings_from_an_empty_create_are_the_documented_defaults(payload: object) -> None:
    settings = QueueSettings.from_wire(payload, max_message_bytes=CLUSTER_MAX_BYTES)
    assert settings == QueueSettings()
    assert settings.to_wire() == {
        "visibility_timeout_s": 30.0,
        "max_receives": None,
        "dead_letter_queue": None,
        "retention_s": 345600.0,
        "dedup_window_s": 300.0,
        "max_message_bytes": None,
        "fifo": False,
        "content_based_dedup": False,
    }


def test_settings_from_wire_take_every_field() -> None:
    settings = QueueSettings.from_wire(FULL_SETTINGS, max_message_bytes=CLUSTER_MAX_BYTES)
    assert settings == QueueSettings(
        visibility_timeout_s=12.5,
        max_receives=4,
        dead_letter_queue="jobs-dlq",
        retention_s=3600.0,
        dedup_window_s=60.0,
        max_message_bytes=4096,
        fifo=True,
        content_based_dedup=True,
    )
    assert isinstance(settings.max_receives, int)
    assert isinstance(settings.max_message_bytes, int)


def test_explicit_nulls_for_optional_settings_mean_the_default() -> None:
    payload = {"max_receives": None, "dead_letter_queue": None, "max_message_bytes": None}
    assert QueueSettings.from_wire(payload) == QueueSettings()


# (field, lowest accepted, highest accepted, just below, just above); the cluster's
# max_message_bytes is the upper bound of a queue's own.
BOUNDS = [
    ("visibility_timeout_s", 0, 43_200, -0.001, 43_200.001),
    ("retention_s", 1, 14 * 86_400, 0.999, 14 * 86_400 + 0.001),
    ("dedup_window_s", 0, 86_400, -0.001, 86_400.001),
    ("max_receives", 1, 1000, 0, 1001),
    ("max_message_bytes", 1, CLUSTER_MAX_BYTES, 0, CLUSTER_MAX_BYTES + 1),
]
# max_receives is only valid with a dead-letter queue.
_WITH = {"max_receives": {"dead_letter_queue": "dlq"}}


@pytest.mark.parametrize(
    ("field", "lo", "hi", "below", "above"), BOUNDS, ids=[b[0] for b in BOUNDS]
)
def test_each_numeric_setting_accepts_its_bounds_and_names_itself_outside_them(
    field: str, lo: float, hi: float, below: float, above: float
) -> None:
    extra = _WITH.get(field, {})
    for ok in (lo, hi):
        settings = QueueSettings.from_wire(
            {field: ok, **extra}, max_message_bytes=CLUSTER_MAX_BYTES
        )
        assert getattr(settings, field) == ok
    for bad in (below, above):
        with pytest.raises(BadRequest, match=f"^{field}: expected") as e:
            QueueSettings.from_wire({field: bad, **extra}, max_message_bytes=CLUSTER_MAX_BYTES)
        assert e.value.status == 400


@pytest.mark.parametrize("field", [b[0] for b in BOUNDS])
@pytest.mark.parametrize(
    "value",
    [True, False, "10", [10], {"s": 10}, math.nan, math.inf],
    ids=["true", "false", "string", "list", "object", "nan", "inf"],
)
def test_each_numeric_setting_rejects_bools_strings_and_non_finite_values(
    field: str, value: object
) -> None:
    with pytest.raises(BadRequest, match=f"^{field}: expected"):
        QueueSettings.from_wire(
            {field: value, **_WITH.get(field, {})}, max_message_bytes=CLUSTER_MAX_BYTES
        )


@pytest.mark.parametrize("field", ["max_receives", "max_message_bytes"])
def test_integer_settings_reject_fractions(field: str) -> None:
    with pytest.raises(BadRequest, match=f"^{field}: expected an integer"):
        QueueSettings.from_wire({field: 2.5, **_WITH.get(field, {})})


def test_max_message_bytes_above_the_cluster_limit_is_refused() -> None:
    with pytest.raises(BadRequest, match=r"^max_message_bytes: expected an integer"):
        QueueSettings.from_wire(
            {"max_message_bytes": CLUSTER_MAX_BYTES + 1}, max_message_bytes=CLUSTER_MAX_BYTES
        )
    # Without a cluster limit to hold it to, any positive size is a queue's own limit.
    assert QueueSettings.from_wire({"max_message_bytes": 1 << 40}).max_message_bytes == 1 << 40


@pytest.mark.parametrize(
    ("field", "limit"),
    [("max_message_bytes", "1048576"), ("retention_s", "1209600"), ("max_receives", "1000")],
)
def test_a_setting_out_of_bounds_is_told_the_exact_limit(field: str, limit: str) -> None:
    # A caller over the limit must learn the limit itself, not a rounded form of it
    # (1.04858e+06 is not 1048576).
    with pytest.raises(BadRequest) as e:
        QueueSettings.from_wire(
            {field: 10**9, **_WITH.get(field, {})}, max_message_bytes=CLUSTER_MAX_BYTES
        )
    assert e.value.message.startswith(f"{field}: ")
    assert limit in e.value.message


def test_an_unknown_setting_is_refused_by_name() -> None:
    with pytest.raises(BadRequest, match=r"unknown field.*visibility_timeout") as e:
        QueueSettings.from_wire({"visibility_timeout": 30})
    # The reply lists the known fields, so a typo is easy to fix.
    assert "visibility_timeout_s" in e.value.message


def test_max_receives_without_a_dead_letter_queue_is_refused() -> None:
    with pytest.raises(BadRequest, match="max_receives needs a dead_letter_queue"):
        QueueSettings.from_wire({"max_receives": 3})
    # A dead-letter queue alone is fine: it only receives when max_receives says so.
    assert QueueSettings.from_wire({"dead_letter_queue": "dlq"}).dead_letter_queue == "dlq"


@pytest.mark.parametrize("dlq", [5, ["dlq"], "", "bad name", "x" * 129, ".."])
def test_a_dead_letter_queue_that_is_not_a_valid_queue_name_is_refused(dlq: object) -> None:
    with pytest.raises(BadRequest, match=r"^dead_letter_queue: "):
        QueueSettings.from_wire({"dead_letter_queue": dlq})


@pytest.mark.parametrize("payload", [[], "x", 5, True], ids=["list", "string", "int", "bool"])
def test_settings_that_are_not_a_json_object_are_refused(payload: object) -> None:
    with pytest.raises(BadRequest, match="expected a JSON object"):
        QueueSettings.from_wire(payload)


@pytest.mark.parametrize(
    "payload", [{"fifo": 1}, {"fifo": "yes"}, {"content_based_dedup": True}], ids=str
)
def test_fifo_flags_are_booleans_and_content_based_dedup_needs_a_fifo_queue(
    payload: object,
) -> None:
    with pytest.raises(BadRequest, match=r"^(fifo|content_based_dedup)"):
        QueueSettings.from_wire(payload)


@pytest.mark.parametrize("settings", [QueueSettings(), QueueSettings.from_wire(FULL_SETTINGS)])
def test_settings_round_trip_through_their_json_wire_form(settings: QueueSettings) -> None:
    wire = orjson.loads(orjson.dumps(settings.to_wire()))
    assert set(wire) == set(FULL_SETTINGS)
    assert QueueSettings.from_wire(wire, max_message_bytes=CLUSTER_MAX_BYTES) == settings
    # Storage and peers rebuild settings from the same dict.
    assert QueueSettings(**wire) == settings


# ---- dedup ids -------------------------------------------------------------------------
def test_a_dedup_id_maps_to_the_same_canonical_uuid5_every_time() -> None:
    mid = dedup_message_id("jobs", "order-1")
    assert mid == dedup_message_id("jobs", "order-1")
    assert validate_message_id(mid) == mid
    assert uuid.UUID(mid).version == 5
    # Pinned: ids already stored and dedup records on disk depend on it never changing.
    assert mid == "1f6696f7-f600-5cb1-a6dc-66c7627864f7"


def test_a_dedup_id_maps_to_different_ids_in_different_queues() -> None:
    ids = {
        dedup_message_id("jobs", "order-1"),
        dedup_message_id("other", "order-1"),
        dedup_message_id("jobs", "order-2"),
        # The queue and the dedup id cannot run into each other.
        dedup_message_id("jobs-", "1"),
        dedup_message_id("jobs", "-1"),
    }
    assert len(ids) == 5


@pytest.mark.parametrize("dedup_id", ["x", "d" * 256, "any text, even \u00e9 or spaces"])
def test_dedup_ids_of_1_to_256_characters_are_accepted(dedup_id: str) -> None:
    assert validate_message_id(dedup_message_id("jobs", dedup_id))


@pytest.mark.parametrize("dedup_id", ["", "d" * 257, None, 5, b"bytes"])
def test_other_dedup_ids_are_refused(dedup_id: Any) -> None:
    with pytest.raises(InvalidMessage, match="dedup_id"):
        dedup_message_id("jobs", dedup_id)


# ---- receipts --------------------------------------------------------------------------
MID = "0b1e3f6c-8a0e-4d3c-9a57-2f1c6d0e7b42"


@pytest.mark.parametrize("token", ["a", "0f1e2d3c4b5a6978", "Z" * 64])
def test_a_receipt_names_its_message_first_and_parses_back(token: str) -> None:
    receipt = make_receipt(MID, token)
    assert receipt.startswith(MID)
    assert parse_receipt(receipt) == (MID, token)


@pytest.mark.parametrize(
    "receipt",
    [
        None,
        5,
        b"0b1e3f6c-8a0e-4d3c-9a57-2f1c6d0e7b42.abc",
        "",
        MID,
        f"{MID}.",
        f".{MID}",
        "abc",
        f"{MID}.abc.def",
        f"{MID.upper()}.abc",
        "not-a-uuid.abc",
        f"{MID}.{'a' * 65}",
        f"{MID}.ab-c",
        f"{MID}.ab_c",
        f"{MID}.ab c",
    ],
    ids=[
        "none",
        "int",
        "bytes",
        "empty",
        "no_token",
        "empty_token",
        "empty_id",
        "no_dot",
        "two_dots",
        "upper_case_id",
        "bad_id",
        "token_too_long",
        "token_dash",
        "token_underscore",
        "token_space",
    ],
)
def test_parse_receipt_refuses_anything_but_a_receipt(receipt: object) -> None:
    with pytest.raises(InvalidMessage, match="is not a zdmq receipt"):
        parse_receipt(receipt)


@pytest.mark.parametrize(
    "token", ["t\u00e9", "\uff11\uff12\uff13", "\u0661\u0662"], ids=["latin", "fullwidth", "arabic"]
)
def test_parse_receipt_refuses_a_token_with_non_ascii_letters_or_digits(token: str) -> None:
    # zdmq's tokens are hex; a receipt it never issued is invalid_receipt, not lease_expired.
    with pytest.raises(InvalidMessage, match="is not a zdmq receipt"):
        parse_receipt(f"{MID}.{token}")


@pytest.mark.parametrize(
    "ctype",
    [
        "text/plain",
        "a/b",
        "text/plain; charset=utf-8",
        "text/plain;charset=UTF-8",
        'application/vnd.example+json; note="a; b \\"c\\""',
        "multipart/form-data; boundary=x-1_2",
    ],
)
def test_a_media_type_is_a_valid_content_type(ctype: str) -> None:
    assert validate_content_type(ctype) == ctype


@pytest.mark.parametrize(
    "ctype",
    [
        "",
        "text",
        "text/",
        "/plain",
        "text/plain; charset",
        "text/plain;",
        "text/plain ",
        "text/plain\tx",
        "text/plain\r\nX-Forged: 1",
        "text/plain\nX: 1",
        "text/plain\x00",
        "text/pl\u00e9in",
        "text/plain; charset=\u20ac",
        'text/plain; a="unterminated',
        "a/" + "b" * 300,
        None,
        7,
        b"text/plain",
    ],
)
def test_anything_else_is_refused_as_an_invalid_message(ctype: Any) -> None:
    with pytest.raises(InvalidMessage, match="content_type"):
        validate_content_type(ctype)


@given(st.text(max_size=40))
def test_every_accepted_content_type_is_printable_ascii(ctype: str) -> None:
    try:
        validate_content_type(ctype)
    except InvalidMessage:
        return
    assert ctype.isascii() and ctype.isprintable() and "/" in ctype
