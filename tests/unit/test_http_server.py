"""zdmq's HTTP/1.1 server (zdmq/server/http.py) against real clients on 127.0.0.1.

Raw sockets write exact bytes (pipelining, split writes, chunked bodies, malformed
heads); aiohttp's client and curl check that independent HTTP implementations get
along with it. A tiny App stands in for the node: echo, slow, failing and `{name}`
routes. Every wait is bounded by `asyncio.timeout`; nothing waits on a fixed sleep.
"""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import logging
import random
import shutil
import socket
import struct
import sys
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import orjson
import pytest
from yarl import URL

from tests.helpers import wait_until
from zdmq._http import Headers
from zdmq.errors import MethodNotAllowed, QueueNotFound, RouteNotFound
from zdmq.server.http import (
    _ROUTE_CACHE_MAX,
    App,
    Request,
    Response,
    json_response,
    serve_app,
)

MAX_BODY = 64 * 1024
MAX_HEAD = 64 * 1024  # the server's limit on a request head
WAIT_S = 5.0  # bound on any single wait; a healthy test never comes close

needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")


# ---- the app under test ----------------------------------------------------------------
@dataclass
class Seen:
    """What the handlers and hooks observed, for the tests to check."""

    started: asyncio.Event = field(default_factory=asyncio.Event)  # a slow handler began
    release: asyncio.Event = field(default_factory=asyncio.Event)  # lets /wait finish
    done: asyncio.Event = field(default_factory=asyncio.Event)  # a slow handler ended
    finished: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    closing_after_hangup: list[bool] = field(default_factory=list)
    started_up: bool = False
    cleaned_up: bool = False


def _reply(req: Request, body: bytes, status: int = 200) -> Response:
    # X-Conn names the connection, so a test can count the connections its calls used.
    return Response(
        status=status,
        body=body,
        content_type="application/octet-stream",
        headers={"X-Conn": str(id(req.transport)), "X-Query": req.query_string},
    )


def make_app(seen: Seen, *, max_body: int = MAX_BODY) -> App:
    app = App(max_body=max_body)

    async def echo(req: Request) -> Response:
        resp = _reply(req, req.body)
        resp.headers["X-Body-Type"] = type(req.body).__name__  # handlers get bytes
        return resp

    async def hello(req: Request) -> Response:
        return _reply(req, b"hi")

    async def named(req: Request) -> Response:
        return json_response({"route": "named", **req.match_info})

    async def named_sub(req: Request) -> Response:
        return json_response({"route": "sub", **req.match_info})

    async def boom(req: Request) -> Response:
        raise RuntimeError("kaboom")

    async def typed(req: Request) -> Response:
        raise QueueNotFound("no queue called x")

    async def empty(req: Request) -> Response:
        return Response(status=204, body=b"must never reach the wire")

    async def sleep(req: Request) -> Response:
        # A handler whose work takes `ms` milliseconds.
        seen.started.set()
        try:
            await asyncio.sleep(int(req.query["ms"]) / 1000)
        except asyncio.CancelledError:
            seen.cancelled.append("sleep")
            raise
        seen.finished.append("sleep")
        seen.done.set()
        return _reply(req, b"slept")

    async def wait(req: Request) -> Response:
        # A handler that runs until the test releases it.
        seen.started.set()
        try:
            await seen.release.wait()
        except asyncio.CancelledError:
            seen.cancelled.append("wait")
            raise
        seen.finished.append("wait")
        return _reply(req, b"released")

    async def hangup(req: Request) -> Response:
        # Runs on after its caller hangs up and reports whether it could tell.
        seen.started.set()
        # No event marks a transport closing, so poll it (bounded).
        deadline = time.monotonic() + WAIT_S
        while not req.transport.is_closing() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        seen.closing_after_hangup.append(req.transport.is_closing())
        seen.finished.append("hangup")
        seen.done.set()
        return _reply(req, b"nobody is listening")

    async def nodelay(req: Request) -> Response:
        sock = req.transport.get_extra_info("socket")
        return json_response({"nodelay": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)})

    async def on_startup(app: App) -> None:
        seen.started_up = True

    async def on_cleanup(app: App) -> None:
        seen.cleaned_up = True

    app.route("POST", "/echo", echo)
    app.route("GET", "/hello", hello)
    app.route("GET", "/q/{name}", named)
    app.route("GET", "/q/{name}/sub", named_sub)
    app.route("GET", "/boom", boom)
    app.route("GET", "/typed", typed)
    app.route("DELETE", "/empty", empty)
    app.route("GET", "/sleep", sleep)
    app.route("GET", "/wait", wait)
    app.route("GET", "/hangup", hangup)
    app.route("GET", "/nodelay", nodelay)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


@dataclass
class Served:
    port: int
    stop: asyncio.Event
    task: asyncio.Task[None]
    seen: Seen
    writers: list[asyncio.StreamWriter] = field(default_factory=list)  # closed at the end

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@asynccontextmanager
async def serving(*, max_body: int = MAX_BODY, **serve_kw: float) -> AsyncIterator[Served]:
    """The app served on a kernel-picked loopback port, until the block ends."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    seen = Seen()
    stop = asyncio.Event()
    up = asyncio.Event()
    app = make_app(seen, max_body=max_body)
    task = asyncio.create_task(serve_app(app, sock, stop, ready=up.set, **serve_kw))
    waiter = asyncio.create_task(up.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        task.result()
    served = Served(port, stop, task, seen)
    try:
        yield served
    finally:
        seen.release.set()
        stop.set()
        async with asyncio.timeout(WAIT_S):
            await task
        sock.close()
        for writer in served.writers:
            writer.close()


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with serving() as s:
        yield s


# ---- raw HTTP on a socket --------------------------------------------------------------
@dataclass
class RawReply:
    version: str
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return orjson.loads(self.body)


def request(
    method: str,
    target: str,
    body: bytes | None = None,
    headers: Iterable[tuple[str, str]] = (),
    version: str = "HTTP/1.1",
) -> bytes:
    head = f"{method} {target} {version}\r\nHost: test\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers)
    if body is not None:
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode("latin-1") + b"\r\n" + (body or b"")


async def connect(s: Served) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
    s.writers.append(writer)
    return reader, writer


async def read_head(reader: asyncio.StreamReader) -> tuple[str, int, dict[str, str]]:
    async with asyncio.timeout(WAIT_S):
        raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    version, status, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.lower()] = value.strip()
    return version, int(status), headers


async def read_reply(reader: asyncio.StreamReader) -> RawReply:
    """One reply framed by Content-Length (every reply this server sends)."""
    version, status, headers = await read_head(reader)
    async with asyncio.timeout(WAIT_S):
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return RawReply(version, status, headers, body)


async def assert_closed(reader: asyncio.StreamReader) -> None:
    """The server closes the connection and sends nothing more."""
    async with asyncio.timeout(WAIT_S):
        try:
            rest = await reader.read()
        except ConnectionResetError:
            rest = b""
    assert rest == b""


async def write_slowly(writer: asyncio.StreamWriter, data: bytes, piece: int = 1) -> None:
    """Writes `data` a few bytes at a time, yielding to the loop between pieces so the
    server sees each piece in its own read."""
    for i in range(0, len(data), piece):
        writer.write(data[i : i + piece])
        await writer.drain()
        await asyncio.sleep(0)


def assert_error_body(reply_body: bytes, code: str) -> None:
    payload = orjson.loads(reply_body)
    assert list(payload) == ["error"]
    assert sorted(payload["error"]) == ["code", "message"]
    assert payload["error"]["code"] == code
    assert isinstance(payload["error"]["message"], str) and payload["error"]["message"]


async def curl(*args: str, stdin: bytes = b"") -> tuple[int, str, str]:
    """curl's exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        "curl",
        "-sS",
        "--http1.1",
        "--max-time",
        str(WAIT_S),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(WAIT_S * 2):
        out, err = await proc.communicate(stdin)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


# ---- keep-alive and pipelining ---------------------------------------------------------
async def test_keep_alive_answers_several_requests_on_one_connection(served: Served) -> None:
    reader, writer = await connect(served)
    conns = set()
    for i in range(3):
        writer.write(request("POST", "/echo", f"body {i}".encode()))
        reply = await read_reply(reader)
        assert (reply.status, reply.body) == (200, f"body {i}".encode())
        assert "connection" not in reply.headers
        conns.add(reply.headers["x-conn"])
    assert len(conns) == 1
    writer.close()


async def test_aiohttp_reuses_one_connection_for_sequential_calls(served: Served) -> None:
    async with aiohttp.ClientSession() as session:
        conns = set()
        for i in range(5):
            async with session.post(served.url + "/echo", data=b"x" * i) as resp:
                assert resp.status == 200
                assert await resp.read() == b"x" * i
                conns.add(resp.headers["X-Conn"])
    assert len(conns) == 1


@needs_curl
async def test_curl_reuses_the_connection_across_urls(served: Served) -> None:
    url = served.url + "/hello"
    code, out, err = await curl(
        "-o", "/dev/null", "-o", "/dev/null", "-w", "%{http_code} %{num_connects}\n", url, url
    )
    assert code == 0, err
    assert out.split("\n")[:2] == ["200 1", "200 0"]  # the second transfer opened nothing


async def test_pipelined_requests_are_answered_in_order(served: Served) -> None:
    reader, writer = await connect(served)
    # The first is slow, so the later ones wait in the buffer while it runs.
    writer.write(
        request("GET", "/sleep?ms=50")
        + request("POST", "/echo", b"second")
        + request("GET", "/hello")
        + request("POST", "/echo", b"")
    )
    bodies = [(await read_reply(reader)).body for _ in range(4)]
    assert bodies == [b"slept", b"second", b"hi", b""]
    writer.close()


async def test_pipelined_bodies_beyond_the_read_buffer_are_all_answered(served: Served) -> None:
    # Three full-size bodies behind a slow request overflow the server's buffer, so it
    # pauses reading; it must resume and answer them all, in order.
    bodies = [bytes([65 + i]) * MAX_BODY for i in range(3)]
    data = request("GET", "/sleep?ms=30") + b"".join(request("POST", "/echo", b) for b in bodies)
    reader, writer = await connect(served)

    async def send() -> None:
        writer.write(data)
        await writer.drain()

    sender = asyncio.create_task(send())
    assert (await read_reply(reader)).body == b"slept"
    for b in bodies:
        reply = await read_reply(reader)
        assert reply.status == 200
        assert reply.body == b
    await sender
    writer.close()


async def test_a_half_closed_caller_gets_its_reply_and_then_the_connection_closes(
    served: Served,
) -> None:
    # A caller that shut down only its sending side (as `nc -N` does) is still waiting
    # for its reply: the request runs to its end, is answered, and only then does the
    # server close. (Losing the reply would lose a pop that had already committed.)
    reader, writer = await connect(served)
    writer.write(request("GET", "/sleep?ms=20"))
    writer.write_eof()
    reply = await read_reply(reader)
    assert reply.status == 200
    assert served.seen.finished == ["sleep"]
    await assert_closed(reader)


async def test_requests_pipelined_before_a_half_close_are_all_answered_in_order(
    served: Served,
) -> None:
    reader, writer = await connect(served)
    writer.write(request("GET", "/sleep?ms=20") + request("GET", "/sleep?ms=1"))
    writer.write_eof()
    assert [(await read_reply(reader)).status for _ in range(2)] == [200, 200]
    assert served.seen.finished == ["sleep", "sleep"]
    await assert_closed(reader)


async def test_a_half_close_with_a_request_cut_short_closes_without_a_reply(
    served: Served,
) -> None:
    reader, writer = await connect(served)
    writer.write(request("POST", "/echo", b"0123456789")[:-4])  # its body 4 bytes short
    writer.write_eof()
    await assert_closed(reader)
    assert served.seen.finished == []


# ---- large bodies ----------------------------------------------------------------------
LARGE = 1 << 20  # a 1 MiB body, as large messages are


async def write_pieces(writer: asyncio.StreamWriter, pieces: Iterable[bytes]) -> None:
    """Writes each piece on its own, letting the loop turn in between, so the server
    reads the data in (about) these pieces."""
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(0)
        await asyncio.sleep(0)


def random_pieces(data: bytes, rng: random.Random, most: int) -> list[bytes]:
    pieces = []
    i = 0
    while i < len(data):
        n = rng.randint(1, rng.choice((16, 4096, most)))  # tiny, small and large reads
        pieces.append(data[i : i + n])
        i += n
    return pieces


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_large_body_in_random_reads_arrives_whole_and_the_next_request_after_it(
    seed: int,
) -> None:
    rng = random.Random(seed)
    body = rng.randbytes(LARGE)
    wire = request("POST", "/echo?n=1", body) + request("POST", "/echo?n=2", b"next")
    async with serving(max_body=LARGE) as s:
        reader, writer = await connect(s)
        # Sizes from one byte up, so every boundary (in the head, at its end, across the
        # body's end into the next head) falls inside some read or between two.
        sender = asyncio.create_task(write_pieces(writer, random_pieces(wire, rng, 96 * 1024)))
        first = await read_reply(reader)
        assert first.status == 200
        assert first.body == body
        assert first.headers["x-query"] == "n=1"
        assert first.headers["x-body-type"] == "bytes"
        second = await read_reply(reader)
        assert (second.body, second.headers["x-query"]) == (b"next", "n=2")
        await sender
        writer.close()


def _cuts(head_len: int, body_len: int) -> list[tuple[int, ...]]:
    """Places to split a request + the next one: around the head's end and the body's."""
    end = head_len + body_len
    return [
        (head_len - 1,),
        (head_len,),
        (head_len + 1,),
        (end - 1,),
        (end,),
        (end + 1,),
        (head_len, end - 1),
        (head_len - 2, head_len + 1, end - 3, end + 2),
        (10, head_len + 1000, head_len + 500_000, end - 1),
    ]


@pytest.mark.parametrize("which", range(9))
async def test_a_large_body_split_at_each_boundary_then_a_pipelined_request(which: int) -> None:
    body = random.Random(which).randbytes(LARGE)
    first = request("POST", "/echo", body)
    head_len = len(first) - len(body)
    wire = first + request("POST", "/echo", b"after")
    cuts = (0, *_cuts(head_len, len(body))[which], len(wire))
    async with serving(max_body=LARGE) as s:
        reader, writer = await connect(s)
        pieces = [wire[a:b] for a, b in itertools.pairwise(cuts)]
        sender = asyncio.create_task(write_pieces(writer, pieces))
        reply = await read_reply(reader)
        assert (reply.status, len(reply.body)) == (200, len(body))
        assert reply.body == body
        assert (await read_reply(reader)).body == b"after"
        await sender
        writer.close()


async def test_a_body_ending_in_the_read_that_carries_the_next_heads() -> None:
    # The body's last bytes, a whole small request and the start of a large one arrive
    # together; the large one then completes in later reads.
    big = random.Random(7).randbytes(LARGE)
    second = random.Random(8).randbytes(LARGE - 1)
    one = request("POST", "/echo?n=1", big)
    two = request("POST", "/echo?n=2", b"small")
    three = request("POST", "/echo?n=3", second)
    async with serving(max_body=LARGE) as s:
        reader, writer = await connect(s)
        cut = len(one) - 5
        pieces = [one[:cut], one[cut:] + two + three[:1000], three[1000:]]
        sender = asyncio.create_task(write_pieces(writer, pieces))
        assert (await read_reply(reader)).body == big
        assert (await read_reply(reader)).body == b"small"
        assert (await read_reply(reader)).body == second
        await sender
        writer.close()


async def test_large_bodies_behind_a_slow_request_are_answered_in_order() -> None:
    # Pipelined while a handler runs: the bodies wait in the buffer, not in reads.
    bodies = [bytes([65 + i]) * (LARGE // 2 + i) for i in range(3)]
    data = request("GET", "/sleep?ms=30") + b"".join(request("POST", "/echo", b) for b in bodies)
    async with serving(max_body=LARGE) as s:
        reader, writer = await connect(s)
        writer.write(data)
        assert (await read_reply(reader)).body == b"slept"
        for b in bodies:
            assert (await read_reply(reader)).body == b
        writer.close()


async def test_a_large_chunked_body_in_random_reads_is_decoded() -> None:
    rng = random.Random(5)
    body = rng.randbytes(LARGE - 100)
    chunked = b""
    i = 0
    while i < len(body):
        n = rng.randint(1, 200_000)
        chunked += b"%x\r\n" % len(body[i : i + n]) + body[i : i + n] + b"\r\n"
        i += n
    head = request("POST", "/echo", headers=[("Transfer-Encoding", "chunked")])
    wire = head + chunked + b"0\r\n\r\n" + request("GET", "/hello")
    async with serving(max_body=LARGE) as s:
        reader, writer = await connect(s)
        sender = asyncio.create_task(write_pieces(writer, random_pieces(wire, rng, 64 * 1024)))
        reply = await read_reply(reader)
        assert reply.body == body
        assert reply.headers["x-body-type"] == "bytes"
        assert (await read_reply(reader)).body == b"hi"
        await sender
        writer.close()


async def test_a_large_body_after_100_continue_arrives_whole() -> None:
    body = random.Random(9).randbytes(LARGE)
    head = request("POST", "/echo", headers=[("Expect", "100-continue")])[:-2]
    head += b"Content-Length: %d\r\n\r\n" % len(body)
    async with serving(max_body=LARGE) as s:
        reader, writer = await connect(s)
        writer.write(head)
        async with asyncio.timeout(WAIT_S):
            interim = await reader.readuntil(b"\r\n\r\n")
        assert interim.startswith(b"HTTP/1.1 100 ")
        sender = asyncio.create_task(write_pieces(writer, [body[:300_000], body[300_000:]]))
        assert (await read_reply(reader)).body == body
        await sender
        writer.close()


async def test_a_body_one_byte_over_the_limit_is_refused_before_it_is_read() -> None:
    async with serving(max_body=LARGE) as s:
        reader, writer = await connect(s)
        writer.write(request("POST", "/echo", b"x" * (LARGE + 1))[:2000])
        reply = await read_reply(reader)
        assert reply.status == 413
        await assert_closed(reader)


# ---- connection close ------------------------------------------------------------------
async def test_http10_without_keep_alive_gets_one_reply_then_close(served: Served) -> None:
    reader, writer = await connect(served)
    writer.write(request("GET", "/hello", version="HTTP/1.0"))
    reply = await read_reply(reader)
    assert (reply.status, reply.body) == (200, b"hi")
    assert reply.headers["connection"].lower() == "close"
    await assert_closed(reader)


async def test_http10_with_keep_alive_keeps_the_connection(served: Served) -> None:
    reader, writer = await connect(served)
    keep = [("Connection", "keep-alive")]
    for _ in range(2):
        writer.write(request("GET", "/hello", headers=keep, version="HTTP/1.0"))
        reply = await read_reply(reader)
        assert (reply.status, reply.body) == (200, b"hi")
        # HTTP/1.0 closes by default, so the reply says it keeps the connection.
        assert reply.headers["connection"] == "keep-alive"
    writer.close()


async def test_connection_close_gets_one_reply_then_close(served: Served) -> None:
    reader, writer = await connect(served)
    # The request pipelined behind the `Connection: close` one must not be answered.
    writer.write(
        request("POST", "/echo", b"last", headers=[("Connection", "close")])
        + request("GET", "/hello")
    )
    reply = await read_reply(reader)
    assert (reply.status, reply.body) == (200, b"last")
    assert reply.headers["connection"].lower() == "close"
    await assert_closed(reader)


# ---- request bodies --------------------------------------------------------------------
async def test_content_length_body_split_into_one_byte_writes_arrives_whole(
    served: Served,
) -> None:
    reader, writer = await connect(served)
    await write_slowly(writer, request("POST", "/echo?a=1", b"split\r\n\r\nbody"))
    reply = await read_reply(reader)
    assert reply.body == b"split\r\n\r\nbody"
    assert reply.headers["x-query"] == "a=1"
    # A second, ordinary request on the same connection is framed correctly.
    writer.write(request("GET", "/hello"))
    assert (await read_reply(reader)).body == b"hi"
    writer.close()


CHUNKED = (
    b"5;name=value\r\nhello\r\n"  # a chunk extension
    b"1\r\n \r\n"
    b"A;x\r\n0123456789\r\n"
    b"0\r\n"
    b"X-Trailer: one\r\n"  # trailers, then the empty line
    b"X-Other: two\r\n"
    b"\r\n"
)


@pytest.mark.parametrize("piece", [len(CHUNKED) + 100, 1, 3], ids=["whole", "bytes", "triples"])
async def test_chunked_body_with_extensions_and_trailers_is_decoded(
    served: Served, piece: int
) -> None:
    reader, writer = await connect(served)
    head = request("POST", "/echo", headers=[("Transfer-Encoding", "chunked")])
    await write_slowly(writer, head + CHUNKED + request("GET", "/hello"), piece)
    assert (await read_reply(reader)).body == b"hello 0123456789"
    # The trailers were consumed exactly: the pipelined request that follows is intact.
    assert (await read_reply(reader)).body == b"hi"
    writer.close()


async def test_aiohttp_chunked_upload_is_decoded(served: Served) -> None:
    async def pieces() -> AsyncIterator[bytes]:
        for part in (b"streamed ", b"in ", b"chunks"):
            yield part

    async with (
        aiohttp.ClientSession() as session,
        session.post(served.url + "/echo", data=pieces()) as resp,
    ):
        assert resp.status == 200
        assert await resp.read() == b"streamed in chunks"


@needs_curl
async def test_curl_chunked_upload_is_decoded(served: Served) -> None:
    code, out, err = await curl(
        "-H", "Transfer-Encoding: chunked", "--data-binary", "@-", served.url + "/echo",
        stdin=b"from curl's stdin",
    )  # fmt: skip
    assert code == 0, err
    assert out == "from curl's stdin"


async def test_expect_100_continue_gets_continue_then_the_reply(served: Served) -> None:
    reader, writer = await connect(served)
    head = request("POST", "/echo", headers=[("Expect", "100-continue"), ("Content-Length", "4")])
    writer.write(head)
    async with asyncio.timeout(WAIT_S):
        interim = await reader.readuntil(b"\r\n\r\n")
    assert interim.startswith(b"HTTP/1.1 100 ")
    writer.write(b"body")
    reply = await read_reply(reader)
    assert (reply.status, reply.body) == (200, b"body")
    writer.close()


@needs_curl
async def test_curl_with_expect_100_continue_gets_continue(served: Served) -> None:
    code, out, err = await curl(
        "-v", "-H", "Expect: 100-continue", "--data-binary", "payload", served.url + "/echo"
    )
    assert code == 0, err
    assert "HTTP/1.1 100 Continue" in err
    assert out == "payload"


@pytest.mark.parametrize("expect", [True, False], ids=["expect-100", "plain"])
async def test_oversized_content_length_gets_413_before_the_body_is_sent(
    served: Served, expect: bool
) -> None:
    reader, writer = await connect(served)
    headers = [("Content-Length", str(MAX_BODY + 1))]
    if expect:
        headers.append(("Expect", "100-continue"))
    writer.write(request("POST", "/echo", headers=headers))  # and no body, ever
    reply = await read_reply(reader)  # the first thing back: no 100 Continue before it
    assert reply.status == 413
    assert_error_body(reply.body, "message_too_large")
    assert reply.headers["connection"].lower() == "close"
    await assert_closed(reader)


@pytest.mark.parametrize(
    "chunks",
    [
        # One chunk declared too large: refused once its data crosses the limit.
        b"%x\r\n" % (MAX_BODY + 1) + b"z" * (MAX_BODY + 1),
        b"400\r\n" + b"z" * 0x400 + b"\r\n",  # many chunks that add up to too much
    ],
    ids=["one-big-chunk", "many-chunks"],
)
async def test_chunked_body_over_max_body_gets_413(served: Served, chunks: bytes) -> None:
    reader, writer = await connect(served)
    writer.write(request("POST", "/echo", headers=[("Transfer-Encoding", "chunked")]))
    if len(chunks) < 0x400 + 10:
        # Within the limit so far; the byte that crosses it is the last thing sent, so
        # the server has read everything when it refuses.
        for _ in range(MAX_BODY // 0x400):
            writer.write(chunks)
        writer.write(b"1\r\nz")
    else:
        writer.write(chunks)
    reply = await read_reply(reader)
    assert reply.status == 413
    assert_error_body(reply.body, "message_too_large")
    await assert_closed(reader)


async def test_endless_chunked_trailers_are_refused(served: Served) -> None:
    reader, writer = await connect(served)
    writer.write(request("POST", "/echo", headers=[("Transfer-Encoding", "chunked")]))
    writer.write(b"1\r\nx\r\n0\r\n")
    trailer = b"X-Pad: " + b"p" * 8000 + b"\r\n"

    async def send() -> None:
        # Twice max_body + max head of trailers, and never the empty line that ends them.
        try:
            for _ in range(2 * (MAX_BODY + MAX_HEAD) // len(trailer) + 1):
                writer.write(trailer)
                await writer.drain()
        except OSError:
            pass  # refused part way: fine

    sender = asyncio.create_task(send())
    try:
        async with asyncio.timeout(1.0):
            try:
                first = await reader.read(64)
            except ConnectionResetError:
                first = b""
        assert first == b"" or first.startswith(b"HTTP/1.1 4")  # a close or a 4xx
    finally:
        sender.cancel()
        writer.close()


async def test_transfer_encoding_with_content_length_gets_400_and_close(served: Served) -> None:
    reader, writer = await connect(served)
    headers = [("Transfer-Encoding", "chunked"), ("Content-Length", "3")]
    writer.write(request("POST", "/echo", headers=headers) + b"2\r\nok\r\n0\r\n\r\n")
    writer.write(request("GET", "/hello"))  # never read: the framing above is ambiguous
    reply = await read_reply(reader)
    assert reply.status == 400
    assert_error_body(reply.body, "bad_request")
    await assert_closed(reader)


async def test_conflicting_content_lengths_get_400(served: Served) -> None:
    reader, writer = await connect(served)
    headers = [("Content-Length", "5"), ("Content-Length", "0")]
    writer.write(request("POST", "/echo", headers=headers) + b"GET /hello HTTP/1.1\r\n\r\n")
    reply = await read_reply(reader)
    assert reply.status == 400


# ---- malformed requests ----------------------------------------------------------------
BAD_REQUESTS = {
    "garbage-line": b"GARBAGE\r\n\r\n",
    "no-version": b"GET /hello\r\n\r\n",
    "double-space": b"GET  /hello HTTP/1.1\r\n\r\n",
    "relative-target": b"GET hello HTTP/1.1\r\n\r\n",
    "header-without-colon": b"GET /hello HTTP/1.1\r\nNoColonHere\r\n\r\n",
    "space-before-colon": b"GET /hello HTTP/1.1\r\nHost : x\r\n\r\n",
    "obs-fold": b"GET /hello HTTP/1.1\r\nX-A: 1\r\n continued\r\n\r\n",
    "empty-header-name": b"GET /hello HTTP/1.1\r\n: value\r\n\r\n",
    "cl-letters": b"POST /echo HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
    "cl-negative": b"POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    "cl-fraction": b"POST /echo HTTP/1.1\r\nContent-Length: 1.5\r\n\r\n",
    "cl-empty": b"POST /echo HTTP/1.1\r\nContent-Length:\r\n\r\n",
    "cl-plus": b"POST /echo HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
    "cl-hex": b"POST /echo HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n",
    "cl-two-numbers": b"POST /echo HTTP/1.1\r\nContent-Length: 1 2\r\n\r\n",
    "chunk-size-letters": b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
}


@pytest.mark.parametrize("raw", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
async def test_malformed_request_gets_400_and_close(served: Served, raw: bytes) -> None:
    reader, writer = await connect(served)
    writer.write(raw + request("GET", "/hello"))  # nothing after a bad request is read
    reply = await read_reply(reader)
    assert reply.status == 400
    assert_error_body(reply.body, "bad_request")
    await assert_closed(reader)


async def test_http2_on_the_wire_gets_505_and_close(served: Served) -> None:
    reader, writer = await connect(served)
    writer.write(b"GET /hello HTTP/2.0\r\nHost: test\r\n\r\n" + request("GET", "/hello"))
    reply = await read_reply(reader)
    assert reply.status == 505
    assert_error_body(reply.body, "bad_request")
    await assert_closed(reader)


async def test_content_length_with_a_superscript_digit_gets_400(served: Served) -> None:
    reader, writer = await connect(served)
    writer.write(b"POST /echo HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n")
    reply = await read_reply(reader)
    assert reply.status == 400


async def test_head_over_64_kib_without_its_end_gets_431(served: Served) -> None:
    reader, writer = await connect(served)
    start = b"GET /hello HTTP/1.1\r\nX-Big: "
    writer.write(start + b"a" * (MAX_HEAD + 1 - len(start)))  # one byte over, no end
    reply = await read_reply(reader)
    assert reply.status == 431
    await assert_closed(reader)


async def test_head_over_64_kib_arriving_with_its_end_gets_431(served: Served) -> None:
    reader, writer = await connect(served)
    start = b"GET /hello HTTP/1.1\r\nX-Big: "
    writer.write(start + b"a" * (60 * 1024))  # under the limit, no end yet
    await writer.drain()
    writer.write(b"b" * (10 * 1024) + b"\r\n\r\n")  # 70 KiB in all, with its end
    reply = await read_reply(reader)
    assert reply.status == 431


# ---- routing and errors ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/nowhere", 404, "not_found"),
        ("GET", "/hello/", 404, "not_found"),
        ("GET", "/q/a/b/c", 404, "not_found"),
        ("POST", "/hello", 405, "method_not_allowed"),
        ("PUT", "/q/name", 405, "method_not_allowed"),
        ("GET", "/typed", 404, "queue_not_found"),
        ("GET", "/boom", 500, "internal"),
    ],
)
async def test_errors_are_zdmq_json_bodies_with_their_status(
    served: Served, method: str, path: str, status: int, code: str
) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.request(method, served.url + path) as resp:
            assert resp.status == status
            assert resp.content_type == "application/json"
            assert_error_body(await resp.read(), code)
        # The connection survives an error reply: the next call on it works.
        async with session.get(served.url + "/hello") as resp:
            assert await resp.read() == b"hi"


async def test_a_raising_handler_is_logged_and_the_connection_kept(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    reader, writer = await connect(served)
    with caplog.at_level(logging.ERROR, logger="zdmq.http"):
        writer.write(request("GET", "/boom") + request("GET", "/hello"))
        reply = await read_reply(reader)
        assert reply.status == 500
        assert b"kaboom" in reply.body
        assert (await read_reply(reader)).body == b"hi"
    assert any("kaboom" in r.getMessage() or r.exc_info for r in caplog.records)
    writer.close()


@pytest.mark.parametrize(
    ("target", "route", "name"),
    [
        ("/q/a%2Fsub", "named", "a/sub"),  # not the /q/{name}/sub route with name "a"
        ("/q/a%2Fsub/sub", "sub", "a/sub"),
        ("/q/sp%20ace%C3%A9", "named", "sp aceé"),
        ("/q/%25", "named", "%"),
    ],
)
async def test_percent_encoding_inside_a_segment_is_decoded_in_match_info(
    served: Served, target: str, route: str, name: str
) -> None:
    reader, writer = await connect(served)
    writer.write(request("GET", target))
    assert (await read_reply(reader)).json() == {"route": route, "name": name}
    writer.close()
    # aiohttp with a pre-encoded URL sends the same target.
    async with (
        aiohttp.ClientSession() as session,
        session.get(URL(served.url + target, encoded=True)) as resp,
    ):
        assert await resp.json() == {"route": route, "name": name}


@needs_curl
async def test_curl_encoded_slash_stays_inside_its_segment(served: Served) -> None:
    code, out, err = await curl("--path-as-is", served.url + "/q/x%2Fsub")
    assert code == 0, err
    assert orjson.loads(out) == {"route": "named", "name": "x/sub"}


def _bare_request(app: App, method: str, path: str) -> Request:
    return Request(app, method, path, "", Headers({}), b"", None)  # type: ignore[arg-type]


def test_a_remembered_route_match_is_never_shared_between_requests() -> None:
    app = make_app(Seen())
    first = _bare_request(app, "GET", "/q/a%2Fb")
    app.resolve(first)
    first.match_info["name"] = "changed by a handler"
    again = _bare_request(app, "GET", "/q/a%2Fb")
    app.resolve(again)  # answered from what the first call matched
    assert again.match_info == {"name": "a/b"}
    with pytest.raises(MethodNotAllowed):
        app.resolve(_bare_request(app, "PUT", "/q/a%2Fb"))


def test_remembered_route_matches_are_bounded() -> None:
    app = make_app(Seen())
    for i in range(_ROUTE_CACHE_MAX + 10):
        req = _bare_request(app, "GET", f"/q/n{i}/sub")
        app.resolve(req)
        assert req.match_info == {"name": f"n{i}"}
        assert len(app._matched) <= _ROUTE_CACHE_MAX
    with pytest.raises(RouteNotFound):
        app.resolve(_bare_request(app, "GET", "/q/n1/other"))


async def test_accepted_connections_have_nagle_turned_off(served: Served) -> None:
    # TCP_NODELAY on every accepted connection, whatever the event loop: a reply is
    # never held back waiting for the ack of an earlier one.
    reader, writer = await connect(served)
    writer.write(request("GET", "/nodelay"))
    assert (await read_reply(reader)).json() == {"nodelay": 1}
    writer.close()


async def test_replies_have_a_date_and_known_or_unknown_status_lines() -> None:
    app = App(max_body=MAX_BODY)

    async def teapot(req: Request) -> Response:
        return Response(status=int(req.query["status"]), body=b"x")

    app.route("GET", "/status", teapot)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    stop = asyncio.Event()
    task = asyncio.create_task(serve_app(app, sock, stop))
    try:
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        for status, line in [(418, b"HTTP/1.1 418 I'm a Teapot"), (299, b"HTTP/1.1 299 Unknown")]:
            writer.write(request("GET", f"/status?status={status}"))
            async with asyncio.timeout(WAIT_S):
                head = await reader.readuntil(b"\r\n\r\n")
                assert await reader.readexactly(1) == b"x"
            first, *rest = head.split(b"\r\n")
            assert first == line
            date = next(v for v in rest if v.lower().startswith(b"date: "))[6:]
            assert date.endswith(b" GMT") and email.utils.parsedate_to_datetime(date.decode())
        writer.close()
    finally:
        stop.set()
        async with asyncio.timeout(WAIT_S):
            await task
        sock.close()


async def test_204_reply_carries_no_body(served: Served) -> None:
    reader, writer = await connect(served)
    writer.write(request("DELETE", "/empty") + request("GET", "/hello"))
    _, status, headers = await read_head(reader)
    assert status == 204
    assert "content-length" not in headers
    # Had a body followed the 204, it would be read here as the next reply's status line.
    reply = await read_reply(reader)
    assert (reply.status, reply.body) == (200, b"hi")
    writer.close()
    async with (
        aiohttp.ClientSession() as session,
        session.delete(served.url + "/empty") as resp,
    ):
        assert resp.status == 204
        assert await resp.read() == b""


async def test_head_reply_carries_no_body(served: Served) -> None:
    reader, writer = await connect(served)
    writer.write(request("HEAD", "/hello") + request("GET", "/hello"))
    await read_head(reader)  # whatever the status, a HEAD reply has no body
    async with asyncio.timeout(WAIT_S):
        next_head = await reader.readuntil(b"\r\n\r\n")
    assert next_head.startswith(b"HTTP/1.1 200 ")


# ---- hang-ups, shutdown, idle connections ----------------------------------------------
async def test_a_client_hanging_up_during_a_slow_handler_does_not_break_the_server(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    reader, writer = await connect(served)
    writer.write(request("GET", "/hangup"))
    async with asyncio.timeout(WAIT_S):
        await served.seen.started.wait()
    # Gone for good: a reset (a FIN alone could be a caller still waiting for its reply).
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()
    await writer.wait_closed()
    async with asyncio.timeout(WAIT_S):
        await served.seen.done.wait()
    # The handler ran to its end (not cancelled) and could tell its caller had gone.
    assert served.seen.finished == ["hangup"]
    assert served.seen.closing_after_hangup == [True]
    reader, writer = await connect(served)
    writer.write(request("GET", "/hello"))
    assert (await read_reply(reader)).body == b"hi"
    writer.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_stop_lets_a_running_handler_finish_then_closes_and_cleans_up() -> None:
    async with serving(shutdown_timeout_s=WAIT_S) as s:
        assert s.seen.started_up
        reader, writer = await connect(s)
        idle_reader, idle_writer = await connect(s)  # an idle keep-alive connection
        writer.write(request("GET", "/sleep?ms=150"))
        async with asyncio.timeout(WAIT_S):
            await s.seen.started.wait()
        s.stop.set()
        reply = await read_reply(reader)
        assert (reply.status, reply.body) == (200, b"slept")
        assert reply.headers["connection"].lower() == "close"
        await assert_closed(reader)
        await assert_closed(idle_reader)
        async with asyncio.timeout(WAIT_S):
            await s.task
        assert s.seen.finished == ["sleep"]
        assert s.seen.cleaned_up
        with pytest.raises(OSError):
            await connect(s)  # no longer listening
        writer.close()
        idle_writer.close()


async def test_a_request_arriving_during_shutdown_is_not_cancelled_half_way() -> None:
    async with serving(shutdown_timeout_s=WAIT_S) as s:
        early_reader, early_writer = await connect(s)
        late_reader, late_writer = await connect(s)  # kept alive, idle so far
        early_writer.write(request("GET", "/sleep?ms=100"))
        async with asyncio.timeout(WAIT_S):
            await s.seen.started.wait()
        s.stop.set()

        async def not_listening() -> bool:
            try:
                _, w = await connect(s)
            except OSError:
                return True
            w.close()
            return False

        await wait_until(not_listening, timeout_s=WAIT_S, what="the server to stop listening")
        # Longer than the running handler, well within the shutdown timeout.
        late_writer.write(request("GET", "/sleep?ms=300"))
        assert (await read_reply(early_reader)).body == b"slept"
        async with asyncio.timeout(WAIT_S):
            late = await late_reader.read()
        async with asyncio.timeout(WAIT_S):
            await s.task
        # Refused (503 or a bare close) before it starts, or allowed to finish: not both.
        assert s.seen.cancelled == []
        assert late == b"" or late.startswith((b"HTTP/1.1 200 ", b"HTTP/1.1 503 "))
        early_writer.close()
        late_writer.close()


async def test_stop_cancels_a_handler_that_outlives_the_shutdown_timeout() -> None:
    async with serving(shutdown_timeout_s=0.1) as s:
        reader, writer = await connect(s)
        writer.write(request("GET", "/wait"))
        async with asyncio.timeout(WAIT_S):
            await s.seen.started.wait()
        t0 = time.monotonic()
        s.stop.set()
        async with asyncio.timeout(WAIT_S):
            await s.task
        assert time.monotonic() - t0 < 1.0
        assert s.seen.cancelled == ["wait"]
        assert s.seen.cleaned_up
        # The caller learns it either from a 500 or from the connection closing.
        async with asyncio.timeout(WAIT_S):
            rest = await reader.read()
        if rest:
            assert rest.startswith(b"HTTP/1.1 500 ")
            assert b"Connection: close" in rest
        writer.close()


async def test_idle_connections_are_closed_after_idle_s() -> None:
    async with serving(idle_s=0.2) as s:
        used_reader, used_writer = await connect(s)
        silent_reader, silent_writer = await connect(s)  # never sends a byte
        t0 = time.monotonic()
        used_writer.write(request("GET", "/hello"))
        assert (await read_reply(used_reader)).body == b"hi"
        await assert_closed(used_reader)
        await assert_closed(silent_reader)
        assert time.monotonic() - t0 >= 0.2
        used_writer.close()
        silent_writer.close()


async def test_a_handler_running_longer_than_idle_s_still_gets_its_reply() -> None:
    async with serving(idle_s=0.1) as s:
        reader, writer = await connect(s)
        writer.write(request("GET", "/sleep?ms=400"))
        reply = await read_reply(reader)
        assert (reply.status, reply.body) == (200, b"slept")
        writer.close()


# ---- a server in its own process, for bugs that freeze its event loop ------------------
SERVER_SCRIPT = """
import asyncio, socket
from zdmq.server.http import App, Response, serve_app

async def main():
    app = App(max_body=1024)
    async def echo(req):
        return Response(body=req.body)
    app.route("POST", "/echo", echo)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    ready = lambda: print(sock.getsockname()[1], flush=True)
    await serve_app(app, sock, asyncio.Event(), ready=ready)

asyncio.run(main())
"""


@asynccontextmanager
async def server_process() -> AsyncIterator[int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVER_SCRIPT, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(WAIT_S * 2):
            port = int(await proc.stdout.readline())  # the readiness line
        yield port
    finally:
        proc.kill()
        await proc.wait()


async def test_a_negative_chunk_size_is_refused_without_freezing_the_server() -> None:
    async with server_process() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        second_reader, second_writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-6\r\n")
            async with asyncio.timeout(1.0):
                reply = await read_reply(reader)
            assert reply.status == 400
            # And the server still answers others.
            second_writer.write(request("POST", "/echo", b"alive"))
            async with asyncio.timeout(1.0):
                assert (await read_reply(second_reader)).body == b"alive"
        finally:
            writer.close()
            second_writer.close()
