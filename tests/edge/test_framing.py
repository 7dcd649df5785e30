"""Strict RFC 9112 framing at a real node, on raw sockets.

A request whose framing two parsers could read differently (Content-Length with
Transfer-Encoding, a coding other than chunked) is refused and its connection closed, so
no request hidden after it ever runs: each smuggling case carries a DELETE of a queue,
and the queue must still be there. Bad header names and values, a missing or doubled
Host, unknown versions, an endless Content-Length, bare LFs and HTTP/0.9 lines get their
error reply at once (not a wait for a timeout); absolute-form targets are served; a 405
names the allowed methods; numeric query values take ASCII digits only.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest

from tests.edge.raw import Addr, call, exchange, new_queue, queue_exists, request, start_node

HEAD_TIMEOUT_S = 2.0  # the node's; a refusal that waited for it would come too late


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Addr]:
    limits = {"head_timeout_s": HEAD_TIMEOUT_S, "body_timeout_s": HEAD_TIMEOUT_S}
    with start_node(tmp_path_factory.mktemp("framing"), limits=limits) as (_, addr):
        yield addr


def _refused(addr: Addr, raw: bytes, statuses: tuple[int, ...] = (400,)) -> str:
    """Sends `raw`: exactly one reply, an error in `statuses`, then the connection closes,
    all well before the node's head timeout. Returns the error code."""
    ex = exchange(addr, raw)
    assert ex.closed, ex
    assert ex.seconds < HEAD_TIMEOUT_S / 2, ex  # refused at once, not timed out
    assert len(ex.replies) == 1, ex
    reply = ex.replies[0]
    assert reply.status in statuses, reply
    assert reply.headers.get("connection") == "close"
    return reply.error_code()


# ---- smuggling: a hidden DELETE after the body never runs -------------------------------
def _smuggle(queue: str, te_lines: str, *, cl_first: bool, with_cl: bool = True) -> bytes:
    hidden = f"DELETE /v1/queues/{queue} HTTP/1.1\r\nHost: edge\r\n\r\n"
    body = "0\r\n\r\n" + hidden  # a chunked end, then the hidden request
    cl = f"Content-Length: {len(body)}\r\n" if with_cl else ""
    fields = (cl + te_lines) if cl_first else (te_lines + cl)
    head = f"POST /v1/queues/{queue}/messages HTTP/1.1\r\nHost: edge\r\n{fields}\r\n"
    return (head + body).encode("latin-1")


TE_WITH_CL = {
    "chunked": "Transfer-Encoding: chunked\r\n",
    "xchunked": "Transfer-Encoding: xchunked\r\n",
    "chunked-identity": "Transfer-Encoding: chunked, identity\r\n",
    "upper-case": "Transfer-Encoding: CHUNKED\r\n",
    "tab-before": "Transfer-Encoding:\tchunked\r\n",
    "two-te-headers": "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
    "identity-then-chunked": "Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n",
}


@pytest.mark.parametrize("cl_first", [True, False], ids=["cl-first", "te-first"])
@pytest.mark.parametrize("te", TE_WITH_CL.values(), ids=TE_WITH_CL.keys())
def test_content_length_with_transfer_encoding_is_refused_and_nothing_after_it_runs(
    node: Addr, te: str, cl_first: bool
) -> None:
    q = new_queue(node, f"smuggle-cl-{abs(hash((te, cl_first)))}")
    assert _refused(node, _smuggle(q, te, cl_first=cl_first)) == "bad_request"
    assert queue_exists(node, q)
    assert call(node, "POST", f"/v1/queues/{q}/pop").status == 204  # nothing was pushed


TE_NOT_CHUNKED = {
    "xchunked": "Transfer-Encoding: xchunked\r\n",
    "chunked-identity": "Transfer-Encoding: chunked, identity\r\n",
    "identity": "Transfer-Encoding: identity\r\n",
    "gzip-chunked": "Transfer-Encoding: gzip, chunked\r\n",
    "chunked-twice": "Transfer-Encoding: chunked, chunked\r\n",
    "chunked-then-gzip-headers": "Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n",
}


@pytest.mark.parametrize("te", TE_NOT_CHUNKED.values(), ids=TE_NOT_CHUNKED.keys())
def test_transfer_encoding_other_than_chunked_alone_is_refused(node: Addr, te: str) -> None:
    q = new_queue(node, f"smuggle-te-{abs(hash(te))}")
    raw = _smuggle(q, te, cl_first=True, with_cl=False)
    assert _refused(node, raw, (400, 501)) == "bad_request"
    assert queue_exists(node, q)


def test_chunked_on_http10_is_refused(node: Addr) -> None:
    q = new_queue(node, "smuggle-http10")
    raw = _smuggle(q, "Transfer-Encoding: chunked\r\n", cl_first=True, with_cl=False)
    raw = raw.replace(b"HTTP/1.1\r\n", b"HTTP/1.0\r\n", 1)
    assert _refused(node, raw) == "bad_request"
    assert queue_exists(node, q)


def test_a_plain_chunked_push_is_still_served(node: Addr) -> None:
    q = new_queue(node, "chunked-ok")
    raw = (
        f"POST /v1/queues/{q}/messages HTTP/1.1\r\nHost: edge\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    ).encode()
    ex = exchange(node, raw)
    assert [r.status for r in ex.replies] == [201], ex
    assert call(node, "POST", f"/v1/queues/{q}/pop").body == b"ok"


# ---- heads ------------------------------------------------------------------------------
BAD_HEADS = {
    "nul-in-name": b"GET /v1/health HTTP/1.1\r\nHost: edge\r\nX-A\x00b: 1\r\n\r\n",
    "space-in-name": b"GET /v1/health HTTP/1.1\r\nHost: edge\r\nX A: 1\r\n\r\n",
    "space-before-colon": b"GET /v1/health HTTP/1.1\r\nHost : edge\r\n\r\n",
    "8bit-name": b"GET /v1/health HTTP/1.1\r\nHost: edge\r\nX-\xe9: 1\r\n\r\n",
    "cr-in-value": b"GET /v1/health HTTP/1.1\r\nHost: edge\r\nX-A: a\rb\r\n\r\n",
    "lf-in-value": b"GET /v1/health HTTP/1.1\r\nHost: edge\r\nX-A: a\nb\r\n\r\n",
    "nul-in-value": b"GET /v1/health HTTP/1.1\r\nHost: edge\r\nX-A: a\x00b\r\n\r\n",
    "no-host": b"GET /v1/health HTTP/1.1\r\n\r\n",
    "two-hosts": b"GET /v1/health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "content-length-5000-digits": (
        b"POST /v1/health HTTP/1.1\r\nHost: edge\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n"
    ),
    "bare-lf-request": b"GET /v1/health HTTP/1.1\nHost: edge\n\n",
    "bare-lf-after-headers": b"GET /v1/health HTTP/1.1\r\nHost: edge\n\n",
    "http09-line": b"GET /v1/health\r\n",
    "http09-line-lf": b"GET /v1/health\n",
    "http09-with-blank-line": b"GET /v1/health\r\n\r\n",
}


@pytest.mark.parametrize("raw", BAD_HEADS.values(), ids=BAD_HEADS.keys())
def test_a_bad_head_gets_400_at_once_and_close(node: Addr, raw: bytes) -> None:
    # A valid request right behind it must not be answered.
    assert _refused(node, raw + request("GET", "/v1/health")) == "bad_request"


@pytest.mark.parametrize("version", [b"HTTP/1.9", b"HTTP/2.0", b"HTTP/3.0", b"HTTP/0.9"])
def test_an_unknown_version_is_refused_and_closed(node: Addr, version: bytes) -> None:
    raw = b"GET /v1/health " + version + b"\r\nHost: edge\r\n\r\n"
    assert _refused(node, raw, (400, 505)) == "bad_request"


def test_http10_without_host_is_served(node: Addr) -> None:
    ex = exchange(node, b"GET /v1/health HTTP/1.0\r\n\r\n")
    assert ex.closed and [r.status for r in ex.replies] == [200], ex


@pytest.mark.parametrize("scheme", ["http", "HTTP"])
def test_an_absolute_form_target_is_served(node: Addr, scheme: str) -> None:
    host, port = node
    q = new_queue(node, f"absolute-{scheme}")
    target = f"{scheme}://{host}:{port}/v1/queues/{q}/messages"
    ex = exchange(node, request("POST", target, b"abs", {"Connection": "close"}))
    assert [r.status for r in ex.replies] == [201], ex
    target = f"{scheme}://{host}:{port}/v1/queues/{q}/pop?max=5"
    ex = exchange(node, request("POST", target, b"", {"Connection": "close"}))
    assert [r.status for r in ex.replies] == [200], ex
    assert b"abs" in ex.replies[0].body or b"YWJz" in ex.replies[0].body  # raw or base64


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PATCH", "/v1/queues/some-queue", "DELETE, GET, PUT"),
        ("POST", "/v1/health", "GET"),
        ("GET", "/v1/queues/some-queue/pop", "POST"),
    ],
)
def test_405_names_the_allowed_methods(node: Addr, method: str, path: str, allow: str) -> None:
    reply = call(node, method, path, b"" if method != "GET" else None)
    assert reply.status == 405, reply
    assert reply.headers.get("allow") == allow
    assert reply.error_code() == "method_not_allowed"


# ---- numbers in the query ---------------------------------------------------------------
NOT_ASCII_DIGITS = ["1_0", "+5", " 5", "-1", "0x10", "\u0665", "\uff15", "5\u0660"]
# An exponent is how a float is written (the client sends repr(float)); a count takes a whole
# number only, however written (JSON has one number type: 5.0 and 1e2 are whole, 1.5 is not).
NUMBER_PARAMS = [
    ("pop", "max"),
    ("receive", "max"),
    ("pop", "wait_s"),
    ("receive", "wait_s"),
    ("receive", "visibility_s"),
]
CASES = [(p, k, v) for p, k in NUMBER_PARAMS for v in NOT_ASCII_DIGITS] + [
    (p, k, v) for p, k in NUMBER_PARAMS if k == "max" for v in ("1.5", "2e-1", "1e4")
]


@pytest.mark.parametrize(("path", "param", "value"), CASES)
def test_numeric_query_values_take_ascii_digits_only(
    node: Addr, path: str, param: str, value: str
) -> None:
    q = new_queue(node, f"digits-{path}-{param}-{abs(hash(value))}")
    assert call(node, "POST", f"/v1/queues/{q}/messages", b"kept").status == 201
    reply = call(node, "POST", f"/v1/queues/{q}/{path}?{param}={quote(value)}", b"")
    assert reply.status == 400, reply
    assert reply.error_code() == "bad_request"
    # Nothing was taken by the refused call.
    assert call(node, "POST", f"/v1/queues/{q}/pop").body == b"kept"


def test_numeric_query_values_in_ascii_digits_are_served(node: Addr) -> None:
    q = new_queue(node, "digits-ok")
    assert call(node, "POST", f"/v1/queues/{q}/messages", b"one").status == 201
    reply = call(node, "POST", f"/v1/queues/{q}/receive?max=10&visibility_s=1.5&wait_s=0", b"")
    assert reply.status == 200, reply
    reply = call(node, "POST", f"/v1/queues/{q}/pop?max=1e1&min_priority=0.0", b"")
    assert reply.status == 200, reply


def test_requests_before_a_bad_one_are_answered_then_it_is_refused(node: Addr) -> None:
    q = new_queue(node, "before-bad")
    raw = (
        request("POST", f"/v1/queues/{q}/messages", b"first")
        + b"POST /v1/queues/x/messages HTTP/1.1\r\nHost: edge\r\nContent-Length: 1\r\n"
        + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        + request("DELETE", f"/v1/queues/{q}")
    )
    ex = exchange(node, raw)
    assert ex.closed and [r.status for r in ex.replies] == [201, 400], ex
    assert queue_exists(node, q)


def test_a_request_asking_to_switch_protocols_is_answered_then_closed(node: Addr) -> None:
    q = new_queue(node, "upgrade")
    headers = {"Connection": "Upgrade", "Upgrade": "websocket"}
    raw = request("GET", "/v1/health", None, headers) + request("DELETE", f"/v1/queues/{q}")
    ex = exchange(node, raw)
    assert ex.closed and [r.status for r in ex.replies] == [200], ex
    assert queue_exists(node, q)
