"""A node that answers 200 with a reply the client cannot read: the client raises
InternalError naming the node and the call, never a bare ValueError or a BadRequest (which
would blame the caller's request), and never returns as if the call had worked.

The misbehaving node is a tiny asyncio HTTP server on 127.0.0.1:0 that answers every
request with the same scripted reply; the client reaches it through a one-node
ClusterConfig, so every call goes to it.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from zdmq import Client
from zdmq.config import ClusterConfig
from zdmq.errors import InternalError
from zdmq.models import (
    BATCH_CONTENT_TYPE,
    BATCH_IDS,
    BATCH_RECEIVE_COUNTS,
    encode_batch,
    new_message_id,
)

NODE = "bad-node"
WAIT_S = 5.0  # bound on every call; a healthy test is far below it
RECEIPT = "024d9791-571f-4f6c-993c-c0962ed79ac1.27f635b99415ccbe"


@dataclass
class BadNode:
    """A loopback HTTP/1.1 server that answers every request with `status`, `ctype` and
    `body`, keeping the connection open; it records each request's line and headers."""

    body: bytes
    ctype: str = BATCH_CONTENT_TYPE
    status: str = "200 OK"
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    conns: set[asyncio.Task[None]] = field(default_factory=set)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.conns.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                line, *rest = head.decode("latin-1").split("\r\n")
                headers = {}
                for h in rest:
                    if h:
                        name, _, value = h.partition(":")
                        headers[name.strip().lower()] = value.strip()
                await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((line, headers))
                writer.write(
                    f"HTTP/1.1 {self.status}\r\nContent-Type: {self.ctype}\r\n"
                    f"Content-Length: {len(self.body)}\r\n\r\n".encode()
                    + self.body
                )
                await writer.drain()
        finally:
            writer.close()
            self.conns.discard(task)


@asynccontextmanager
async def serving(node: BadNode) -> AsyncIterator[int]:
    """Serves `node` on a loopback port (yielded) until the block ends."""
    server = await asyncio.start_server(node.serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for conn in list(node.conns):
            conn.cancel()
        await asyncio.gather(*node.conns, return_exceptions=True)
        await server.wait_closed()


@asynccontextmanager
async def client_of(node: BadNode) -> AsyncIterator[Client]:
    async with serving(node) as port:
        config = ClusterConfig.from_dict(
            {"nodes": [{"id": NODE, "host": "127.0.0.1", "port": port}], "replication": 1}
        )
        async with Client(config=config, timeout_s=WAIT_S) as c:
            yield c


def _frame(count: int, fields: int, columns: bytes = b"") -> bytes:
    return b"ZQB1" + struct.pack("<II", count, fields) + columns


MID = new_message_id()
# Replies no pop or receive can read, each with the Content-Type it came with.
BAD_TAKE_REPLIES = [
    pytest.param(b"garbage, not a frame", BATCH_CONTENT_TYPE, id="not-a-frame"),
    pytest.param(b"", BATCH_CONTENT_TYPE, id="empty-body"),
    pytest.param(_frame(3, BATCH_IDS, MID.encode()), BATCH_CONTENT_TYPE, id="ids-cut-short"),
    pytest.param(_frame(1, 1 << 9), BATCH_CONTENT_TYPE, id="unknown-field-bit"),
    pytest.param(
        encode_batch(ids=[MID], bodies=[b"x"]) + b"tail", BATCH_CONTENT_TYPE, id="trailing-bytes"
    ),
    pytest.param(
        _frame(1, BATCH_RECEIVE_COUNTS, struct.pack("<I", 1)),
        BATCH_CONTENT_TYPE,
        id="no-ids-or-bodies",
    ),
    pytest.param(encode_batch(ids=[None], bodies=[b"x"]), BATCH_CONTENT_TYPE, id="absent-id"),
    pytest.param(b'{"messages": [{"id": 1}', "application/json", id="json-cut-short"),
    pytest.param(b'{"messages": [{"id": 7}]}', "application/json", id="json-wrong-shape"),
    pytest.param(b"[]", "application/json", id="json-not-an-object"),
]

Call = Callable[[Client], Awaitable[object]]
TAKES: dict[str, tuple[Call, str]] = {
    "pop": (lambda c: c.pop("q"), "/v1/queues/q/pop"),
    "pop_many": (lambda c: c.pop_many("q", 10), "/v1/queues/q/pop"),
    "receive": (lambda c: c.receive("q", 10), "/v1/queues/q/receive"),
}


async def _raises_internal(node: BadNode, op: str, call: Call) -> InternalError:
    async with client_of(node) as c:
        with pytest.raises(InternalError) as caught:
            async with asyncio.timeout(WAIT_S):
                await call(c)
    e = caught.value
    assert type(e) is InternalError
    assert e.retriable is False
    assert f"{op}: node {NODE} sent a reply zdmq cannot read" in str(e)
    return e


@pytest.mark.parametrize("op", sorted(TAKES))
@pytest.mark.parametrize(("body", "ctype"), BAD_TAKE_REPLIES)
async def test_a_pop_or_receive_reply_that_cannot_be_read_raises_internal_error(
    op: str, body: bytes, ctype: str
) -> None:
    node = BadNode(body, ctype)
    call, path = TAKES[op]
    await _raises_internal(node, op, call)
    # One call, to the bad node's own queue: the error came from reading its reply.
    assert len(node.requests) == 1
    line, headers = node.requests[0]
    assert line.startswith(f"POST {path}?")
    assert headers["accept"] == BATCH_CONTENT_TYPE


async def test_a_receive_frame_without_receipts_raises_internal_error() -> None:
    # A well-formed pop reply is not a receive reply.
    node = BadNode(encode_batch(ids=[MID], bodies=[b"x"]))
    await _raises_internal(node, "receive", TAKES["receive"][0])


async def test_a_receive_frame_with_an_absent_receipt_raises_internal_error() -> None:
    frame = encode_batch(
        ids=[MID, new_message_id()],
        bodies=[b"x", b"y"],
        receipts=[f"{MID}.0123456789abcdef", None],
        receive_counts=[1, 1],
    )
    await _raises_internal(BadNode(frame), "receive", TAKES["receive"][0])


async def test_well_formed_replies_from_the_same_server_are_read() -> None:
    # The harness itself is sound: a good frame through the same path is read as usual.
    frame = encode_batch(
        ids=[MID], bodies=[b"x"], receipts=[f"{MID}.0123456789abcdef"], receive_counts=[2]
    )
    async with client_of(BadNode(frame)) as c:
        [m] = await c.receive("q", 10)
        assert (m.id, m.body, m.receive_count) == (MID, b"x", 2)
    async with client_of(BadNode(encode_batch(ids=[MID], bodies=[b"y"]))) as c:
        assert [(m.id, m.body) for m in await c.pop_many("q", 10)] == [(MID, b"y")]
    async with client_of(BadNode(b'{"ids": ["a", "b"], "duplicates": 0}', "application/json")) as c:
        assert len(await c.push_many("q", [b"1", b"2"])) == 2
    async with client_of(BadNode(b'{"acked": 1, "failed": []}', "application/json")) as c:
        assert (await c.ack("q", RECEIPT)).done == 1


@pytest.mark.parametrize(
    ("body", "ctype"),
    [
        pytest.param(b"garbage, not a frame", BATCH_CONTENT_TYPE, id="a-frame-content-type"),
        pytest.param(b'{"ids": ["a"', "application/json", id="json-cut-short"),
        pytest.param(b'{"duplicates": 0}', "application/json", id="no-ids"),
        pytest.param(b'{"ids": ["a"], "duplicates": 0}', "application/json", id="too-few-ids"),
    ],
)
async def test_a_batch_push_reply_that_cannot_be_read_raises_internal_error(
    body: bytes, ctype: str
) -> None:
    node = BadNode(body, ctype, status="201 Created")
    await _raises_internal(node, "push_many", lambda c: c.push_many("q", [b"1", b"2"]))
    [(line, headers)] = node.requests
    assert line.startswith("POST /v1/queues/q/batch ")
    assert headers["content-type"] == BATCH_CONTENT_TYPE


SETTLES: dict[str, Call] = {
    "ack": lambda c: c.ack("q", RECEIPT),
    "nack": lambda c: c.nack("q", RECEIPT, delay_s=1.0),
    "extend": lambda c: c.extend("q", RECEIPT, 30.0),
}


@pytest.mark.parametrize("op", sorted(SETTLES))
@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"garbage, not JSON", id="not-json"),
        pytest.param(b'{"failed": []}', id="no-count"),
        pytest.param(b'{"acked": 1, "nacked": 1, "extended": 1, "failed": [7]}', id="bad-failed"),
    ],
)
async def test_an_ack_nack_or_extend_reply_that_cannot_be_read_raises_internal_error(
    op: str, body: bytes
) -> None:
    node = BadNode(body, BATCH_CONTENT_TYPE)
    await _raises_internal(node, op, SETTLES[op])
    [(line, _)] = node.requests
    assert line.startswith(f"POST /v1/queues/q/{op}")


LOOKUPS: dict[str, tuple[Call, str]] = {
    "stats": (lambda c: c.stats("q"), "GET /v1/queues/q "),
    "queue_settings": (lambda c: c.queue_settings("q"), "GET /v1/queues/q/metadata "),
    "metadata": (lambda c: c.metadata("q"), "GET /v1/queues/q/metadata "),
}


@pytest.mark.parametrize("op", sorted(LOOKUPS))
@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"garbage, not JSON", id="not-json"),
        pytest.param(b"{}", id="empty-object"),
        pytest.param(b'{"nodes": [7], "settings": [], "queue": "q"}', id="wrong-shapes"),
        pytest.param(b"[]", id="a-list"),
    ],
)
async def test_a_stats_or_metadata_reply_that_cannot_be_read_raises_internal_error(
    op: str, body: bytes
) -> None:
    call, line = LOOKUPS[op]
    node = BadNode(body, "application/json")
    await _raises_internal(node, op, call)
    assert [r[0][: len(line)] for r in node.requests] == [line]


async def test_a_cluster_reply_that_cannot_be_read_raises_internal_error() -> None:
    node = BadNode(b'{"nodes": "n1"}', "application/json")
    async with serving(node) as port:
        url = f"http://127.0.0.1:{port}"
        with pytest.raises(InternalError, match=rf"^discover: node {url} sent a reply"):
            async with asyncio.timeout(WAIT_S), Client(url, timeout_s=WAIT_S):
                pass
    assert [r[0] for r in node.requests] == ["GET /v1/cluster HTTP/1.1"]
