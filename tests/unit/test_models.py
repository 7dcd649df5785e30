"""Wire models: queue names, body encodings and message ids, checked without sockets."""

from __future__ import annotations

import base64
import uuid

import pytest

from zdmq.errors import InvalidMessage, InvalidQueueName, MessageTooLarge
from zdmq.models import (
    Message,
    decode_body,
    encode_body,
    message_from_wire,
    message_to_wire,
    new_message_id,
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
