"""Raw-socket cases at a real node: no request loses a message, and nothing a caller
stored reaches a reply's head.

A caller that half-closes its side (`shutdown(SHUT_WR)`) after sending a pop is still
waiting for the reply: the node answers every request it read before it closes. A
message's content type goes back out as the `Content-Type` of a single-form pop, so a
push whose content type is not a media type in visible ASCII (RFC 9110) is refused with
400 `invalid_message` and stores nothing, on every path: the raw push's header, a JSON
batch, a binary batch frame.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.edge.raw import Reply, parse_replies, request
from zdmq.local import LocalCluster
from zdmq.models import encode_batch
from zdmq.server.http import _header_lines


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    c = LocalCluster.ephemeral(tmp_path_factory.mktemp("edge"), nodes=1)
    try:
        c.start()
        url = urlsplit(c.urls[0])
        assert url.hostname is not None and url.port is not None
        yield url.hostname, url.port
    finally:
        c.close()


def _exchange(addr: tuple[str, int], raw: bytes, *, half_close: bool = False) -> list[Reply]:
    """Sends `raw`, half-closes if asked, and reads until the node closes. Without a
    half-close the last request must say `Connection: close`."""
    with socket.create_connection(addr, timeout=15) as s:
        s.sendall(raw)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        got = bytearray()
        while chunk := s.recv(65536):
            got += chunk
    return parse_replies(bytes(got))


def _call(
    addr: tuple[str, int], method: str, path: str, body: bytes = b"", **headers: str
) -> Reply:
    [reply] = _exchange(addr, request(method, path, body, {**headers, "Connection": "close"}))
    return reply


def _depth(addr: tuple[str, int], queue: str) -> int:
    status, _, body = _call(addr, "GET", f"/v1/queues/{queue}")
    assert status == 200, body
    depth: int = json.loads(body)["messages"]
    return depth


def _new_queue(addr: tuple[str, int], name: str) -> str:
    status, _, body = _call(addr, "PUT", f"/v1/queues/{name}")
    assert status == 201, body
    return name


def test_a_pop_whose_caller_half_closes_after_sending_still_gets_its_message(
    node: tuple[str, int],
) -> None:
    q = _new_queue(node, "edge-half-close")
    sent = {f"m{i}".encode() for i in range(30)}
    for body in sent:
        assert _call(node, "POST", f"/v1/queues/{q}/messages", body)[0] == 201
    got = []
    for _ in sent:
        replies = _exchange(node, request("POST", f"/v1/queues/{q}/pop"), half_close=True)
        assert [r[0] for r in replies] == [200], replies
        got.append(replies[0][2])
    assert sorted(got) == sorted(sent)  # each one, once
    assert _depth(node, q) == 0


def test_every_request_read_before_a_half_close_is_answered_in_order(
    node: tuple[str, int],
) -> None:
    q = _new_queue(node, "edge-pipelined")
    raw = b"".join(
        [
            request("POST", f"/v1/queues/{q}/messages", b"first"),
            request("POST", f"/v1/queues/{q}/messages", b"second"),
            request("POST", f"/v1/queues/{q}/pop"),
            request("POST", f"/v1/queues/{q}/pop"),
        ]
    )
    replies = _exchange(node, raw, half_close=True)
    assert [r[0] for r in replies] == [201, 201, 200, 200]
    assert sorted(r[2] for r in replies[2:]) == [b"first", b"second"]
    assert _depth(node, q) == 0


BAD_CONTENT_TYPES = [
    "text/plain\r\nX-Forged: 1",  # a forged header in the pop reply
    "text/plain\r\n\r\nHTTP/1.1 200 OK",  # a forged second reply
    "text/plain\nX-Forged: 1",
    "text/plain; charset=\u20ac",  # not Latin-1: the reply head cannot be encoded
    "text/\u00e9",
    "text",
    "text/plain; charset",
    "a/" + "b" * 300,
]


@pytest.mark.parametrize("ctype", BAD_CONTENT_TYPES)
def test_a_batch_whose_content_type_is_not_a_media_type_is_refused_and_stores_nothing(
    node: tuple[str, int], ctype: str
) -> None:
    q = _new_queue(node, f"edge-ctype-{BAD_CONTENT_TYPES.index(ctype)}")
    good = {"body": "ok", "content_type": "text/plain; charset=utf-8"}
    batch = json.dumps({"messages": [good, {"body": "x", "content_type": ctype}]}).encode()
    status, _, body = _call(
        node, "POST", f"/v1/queues/{q}/batch", batch, **{"Content-Type": "application/json"}
    )
    assert status == 400, body
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_message" and error["message"].startswith("messages[1].")
    frame = encode_batch(bodies=[b"ok", b"x"], content_types=["text/plain", ctype])
    status, _, body = _call(
        node, "POST", f"/v1/queues/{q}/batch", frame, **{"Content-Type": "application/x-zdmq-batch"}
    )
    assert status == 400, body
    assert json.loads(body)["error"]["code"] == "invalid_message"
    assert _depth(node, q) == 0


@pytest.mark.parametrize(
    "ctype", ["text/plain\nX-Forged: 1", "text/plain; charset=\u00e9", "text", "a/b;"]
)
def test_a_raw_push_whose_content_type_header_is_not_a_media_type_is_refused(
    node: tuple[str, int], ctype: str
) -> None:
    q = _new_queue(node, f"edge-raw-{abs(hash(ctype))}")
    status, _, body = _call(
        node, "POST", f"/v1/queues/{q}/messages", b"x", **{"Content-Type": ctype}
    )
    assert status == 400, body
    # A line break inside a header is refused by the HTTP framing before any handler.
    code = "bad_request" if "\n" in ctype else "invalid_message"
    assert json.loads(body)["error"]["code"] == code
    assert _depth(node, q) == 0


def test_a_stored_media_type_comes_back_as_the_pop_reply_content_type_and_nothing_more(
    node: tuple[str, int],
) -> None:
    q = _new_queue(node, "edge-ctype-kept")
    ctype = 'application/vnd.example+json; charset=utf-8; note="a; b \\"c\\""'
    batch = json.dumps({"messages": [{"body": "{}", "content_type": ctype}]}).encode()
    status, _, body = _call(
        node, "POST", f"/v1/queues/{q}/batch", batch, **{"Content-Type": "application/json"}
    )
    assert status == 201, body
    status, headers, body = _call(node, "POST", f"/v1/queues/{q}/pop")
    assert (status, headers["content-type"], body) == (200, ctype, b"{}")


def test_a_reply_header_that_is_not_printable_ascii_is_left_out_rather_than_sent_or_raised() -> (
    None
):
    lines = _header_lines(
        {"zdmq-id": "abc", "Content-Type": "text/plain\r\nX-Forged: 1", "X-Other": "\u20ac"}
    )
    assert lines == b"zdmq-id: abc\r\n"
