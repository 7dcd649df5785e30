"""HTTP/1.1 calls for the client and for node-to-node traffic: a lean keep-alive pool.

Why not aiohttp's client: on this 2-core machine a sequential call through
`aiohttp.ClientSession` costs about 120 µs of client CPU more than the same call on a
plain asyncio protocol (docs/design.md §13), and one-at-a-time pushes
are what RDSQ's workload measures. This module speaks just the HTTP/1.1 a client
needs: keep-alive connections per host (at most `limit_per_host` at once), requests
with a Content-Length body, and replies framed by Content-Length, chunked encoding
or the end of the connection. Reply heads are read strictly (RFC 9112): framing that
could be read two ways, bare CR or LF, a header name that is not a token and the like
fail the call. It is not llhttp (which the node's server uses) because llhttp copies a
large reply's body once more (docs/design.md §13).

A connection failure, a reset or a timeout becomes `NodeUnavailable` (retriable); a
non-2xx reply becomes the typed error its JSON body names. A connection is reused
only after a complete reply that did not say `Connection: close`; one whose call
timed out or was cancelled is closed, since its reply may still arrive. Idle
connections are dropped after `idle_s`, well before a node's own keep-alive limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import orjson

from zdmq.errors import NodeUnavailable, ZdmqError, from_wire

__all__ = [
    "JSON_HEADERS",
    "ChunkError",
    "Dechunker",
    "Headers",
    "HttpPool",
    "Reply",
    "call",
    "dumps",
    "error_of",
    "loads",
    "reply_epoch",
    "send",
    "take",
]

dumps = orjson.dumps
loads = orjson.loads
JSON_HEADERS = {"Content-Type": "application/json"}
_MAX_HEAD = 64 * 1024
_HEX = frozenset(b"0123456789abcdefABCDEF")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# A request body at least this long is written after its head rather than copied into
# one buffer with it: a second write costs less than copying a large body.
_JOIN_MAX_BYTES = 64 * 1024
# What `quote(path, safe=_PATH_SAFE)` leaves as it is: such a path goes on the wire unquoted.
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_PLAIN_PATH = re.compile(r"[A-Za-z0-9/%:@!$&'()*+,;=\-._~]*")
_monotonic = time.monotonic
_VERSIONS = frozenset({"HTTP/1.1", "HTTP/1.0"})
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_TOKENS: set[str] = set()  # header names seen to be tokens (a peer sends the same few)
_SINGLE = frozenset({"content-length", "transfer-encoding"})  # a repeat that differs: refused


class Headers(Mapping[str, str]):
    """HTTP headers (a reply's here, a request's in the node's server), looked up without
    regard to case; the last of repeats wins."""

    __slots__ = ("_d",)

    def __init__(self, items: dict[str, str] | None = None) -> None:
        self._d = items if items is not None else {}

    def __getitem__(self, name: str) -> str:
        return self._d[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._d

    def get(self, name: str, default: Any = None) -> Any:
        return self._d.get(name.lower(), default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


class Reply:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: Headers, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return loads(self.body) if self.body else None


class _ProtocolError(Exception):
    pass


class _Conn(asyncio.Protocol):
    """One keep-alive connection; one request at a time.

    A call's deadline is kept by a timer armed lazily: each call sets `deadline`, and
    re-arms the timer only if that is earlier than the time the timer is set for; the
    timer, when it fires, fails the call in flight if it is past its deadline, re-arms
    itself for that call's deadline if not, and lapses if the connection is idle. So a
    run of calls that each take far less than the timeout costs one timer per timeout
    period, not a timer (and asyncio.timeout's task bookkeeping) per call.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.tls = False
        self.closed = False
        self.idle_since = 0.0
        self._buf = bytearray()
        self._waiter: asyncio.Future[Reply] | None = None
        self._head: tuple[int, Headers, bool] | None = None  # status, headers, keep-alive
        self._want = -1  # body bytes still expected; -1: until close; -2: chunked
        self._chunks: Dechunker | None = None
        # A Content-Length body longer than the bytes at hand: its pieces as they came,
        # joined once when the last arrives (`_body_part`), so a large reply is copied
        # once on its way from the socket reads to the caller. None: not collecting.
        self._parts: list[bytes | memoryview | bytearray] | None = None
        self._got = 0  # bytes in `_parts`
        self._head_request = False
        self.keep_alive = True
        self.deadline = 0.0  # time.monotonic() by which the current call must be answered
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.tls = transport.get_extra_info("ssl_object") is not None
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            # Bytes nobody asked for: they would be read as the next call's reply.
            self._buf += data
            self.keep_alive = False
            self._fail(ConnectionResetError("unexpected bytes on an idle connection"))
            return
        try:
            if self._parts is not None:
                reply = self._body_part(data)
            elif self._buf or self._head is not None:
                self._buf += data
                reply = self._parse()
            else:
                reply = self._parse_read(data)
        except _ProtocolError as e:
            self._fail(ConnectionResetError(f"bad reply: {e}"))
            return
        if reply is not None:
            waiter.set_result(reply)

    def eof_received(self) -> bool | None:
        waiting = self._waiter is not None and not self._waiter.done()
        if waiting and self._head is not None and self._want == -1:
            # A body framed by the end of the connection.
            assert self._waiter is not None
            status, headers, _ = self._head
            self.keep_alive = False
            self._waiter.set_result(Reply(status, headers, bytes(self._buf)))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(exc or ConnectionResetError("the server closed the connection"))
        # The transport refers back to this connection: dropped here, a closed connection
        # is freed at once rather than by the cycle collector (with TLS, its buffers too).
        self.transport = None

    def _fail(self, exc: BaseException) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()

    # -- one exchange
    def send(
        self, data: bytes, head_request: bool, deadline: float, body: bytes = b""
    ) -> asyncio.Future[Reply]:
        """Writes a request (`data`, then `body` if any); the future resolves to its
        reply, or fails with TimeoutError once `deadline` (time.monotonic()) passes."""
        assert self.transport is not None and self._loop is not None
        loop = self._loop
        self._waiter = waiter = loop.create_future()
        self._head = None
        self._chunks = None
        self._parts = None
        self._head_request = head_request
        self.deadline = deadline
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(deadline, self._on_timer)
            self._timer_at = deadline
        self.transport.write(data)
        if self.tls and len(body) > TLS_WRITE_PIECE:
            write_pieces(self.transport, body)
        elif body:
            self.transport.write(body)
        return waiter

    def _on_timer(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done() or self.closed:
            return  # idle: the next call arms a new timer
        # A timer may fire a little early (uvloop counts in whole milliseconds): a call
        # fails only once time.monotonic() is past its deadline.
        if _monotonic() >= self.deadline:
            waiter.set_exception(TimeoutError("no reply within the call's timeout"))
        else:
            self._timer = asyncio.get_running_loop().call_at(self.deadline, self._on_timer)
            self._timer_at = self.deadline

    def _parse_read(self, data: bytes) -> Reply | None:
        """The reply at the start of `data` (a read, with nothing buffered): taken from
        `data` itself when all of it is there (the common case: a small reply in one
        read), or the start of its body collected when it is framed by Content-Length;
        else buffered and parsed from the buffer."""
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            status, headers, keep, want = _reply_head(
                data[:end].decode("latin-1"), self._head_request
            )
            start = end + 4
            have = len(data) - start
            # Not: 1xx first, framed otherwise, or more than this reply.
            if not (100 <= status < 200 or want < 0 or have > want):
                if have == want:
                    self.keep_alive = keep
                    return Reply(status, Headers(headers), data[start:] if want else b"")
                self._head = (status, Headers(headers), keep)
                self._want = want
                self._collect(memoryview(data)[start:] if have else None)
                return None
        self._buf += data
        return self._parse()

    def _parse(self) -> Reply | None:
        buf = self._buf
        while self._head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise _ProtocolError("reply head too large")
                return None
            text = buf[:end].decode("latin-1")
            del buf[: end + 4]
            status, headers, keep, want = _reply_head(text, self._head_request)
            if 100 <= status < 200:  # 100 Continue and friends: the real reply follows
                continue
            self._head = (status, Headers(headers), keep)
            self._want = want
        status, hdrs, keep = self._head
        want = self._want
        if want >= 0:
            if len(buf) < want:
                self._buf = bytearray()
                self._collect(buf or None)
                return None
            body = take(buf, want)
        elif want == -2:
            if self._chunks is None:
                self._chunks = Dechunker(None)
            try:
                parsed = self._chunks.feed(buf)
            except ChunkError as e:
                raise _ProtocolError(str(e)) from None
            if parsed is None:
                return None
            self._chunks = None
            body = parsed
        else:
            return None  # until the connection ends
        self.keep_alive = keep and not buf
        return Reply(status, hdrs, body)

    def _collect(self, first: bytes | memoryview | bytearray | None) -> None:
        """Starts collecting a body whose first bytes (if any) are `first`."""
        self._parts = [first] if first else []
        self._got = len(first) if first else 0

    def _body_part(self, data: bytes) -> Reply | None:
        """The next read of a body being collected: kept as it came; once the body is
        whole, joined (the one copy) into the reply."""
        parts = self._parts
        assert parts is not None and self._head is not None
        parts.append(data)
        self._got += len(data)
        over = self._got - self._want
        if over < 0:
            return None
        if over:  # bytes beyond the reply: kept, and the connection not reused
            view = memoryview(data)
            parts[-1] = view[: len(data) - over]
            self._buf += view[len(data) - over :]
        self._parts = None
        status, hdrs, keep = self._head
        self.keep_alive = keep and not over
        return Reply(status, hdrs, b"".join(parts))


def _reply_head(text: str, head_request: bool) -> tuple[int, dict[str, str], bool, int]:
    """A reply head's (status, headers, keep-alive, body bytes expected: -1 until the
    connection ends, -2 chunked). Strict RFC 9112: a head whose framing could be read two
    ways (Content-Length with Transfer-Encoding, a coding other than chunked, differing
    lengths), a bare CR or LF, a header name that is not a token or a value with NUL, an
    obsolete line fold, or a version other than HTTP/1.0 and 1.1 is a `_ProtocolError`."""
    crlf = text.count("\r\n")
    if text.count("\r") != crlf or text.count("\n") != crlf:
        raise _ProtocolError("a bare CR or LF in the reply head")
    first, _, rest = text.partition("\r\n")
    parts = first.split(" ", 2)
    if (
        len(parts) < 2
        or parts[0] not in _VERSIONS
        or not (len(parts[1]) == 3 and parts[1].isascii() and parts[1].isdigit())
    ):
        raise _ProtocolError(f"bad status line {first[:100]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    if rest:
        for line in rest.split("\r\n"):
            name, sep, value = line.partition(":")
            if not sep or "\x00" in value or not _is_token(name):
                raise _ProtocolError(f"bad header line {line[:100]!r}")
            name = name.lower()
            value = value.strip(" \t")
            if name in headers and name in _SINGLE and headers[name] != value:
                raise _ProtocolError(f"more than one {name} header")
            headers[name] = value
    conn = headers.get("connection")
    if parts[0] == "HTTP/1.1":
        keep = conn is None or conn.lower() != "close"
    else:
        keep = conn is not None and conn.lower() == "keep-alive"
    te = headers.get("transfer-encoding")
    cl = headers.get("content-length")
    if te is not None:
        if cl is not None:
            raise _ProtocolError("Content-Length together with Transfer-Encoding")
        if te.lower() != "chunked" or parts[0] != "HTTP/1.1":
            raise _ProtocolError(f"unsupported Transfer-Encoding {te[:40]!r}")
    if cl is not None and not (cl.isascii() and cl.isdigit() and len(cl) <= 18):
        raise _ProtocolError(f"bad Content-Length {cl[:40]!r}")
    if head_request or status == 204 or status == 304 or 100 <= status < 200:
        want = 0
    elif te is not None:
        want = -2
    elif cl is not None:
        want = int(cl)
    else:
        want = -1
    return status, headers, keep, want


def _is_token(name: str) -> bool:
    if name in _TOKENS:
        return True
    if _TOKEN.fullmatch(name) is None:
        return False
    if len(_TOKENS) < 256:
        _TOKENS.add(name)
    return True


class ChunkError(ValueError):
    """A malformed or oversized chunked body; `status` is the HTTP status a server
    answers it with (400, 413 or 431)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Dechunker:
    """Decodes a chunked body (request or reply) as it arrives, consuming `buf` as it
    goes, so a body in many small reads is parsed once, not from the start at every
    read. Sizes are hex digits only; size lines, extensions and trailers are bounded;
    `limit` (None: none) bounds the decoded body."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.out = bytearray()
        self.left = 0  # bytes of the current chunk still to come
        self.crlf = False  # the CRLF after a chunk's data is due
        self.trailers = False
        self.trailer_bytes = 0

    def feed(self, buf: bytearray) -> bytes | None:
        """The whole body once its last chunk and trailers are in, else None."""
        while True:
            if self.trailers:
                eol = buf.find(b"\r\n")
                if eol < 0:
                    self._bound_line(buf)
                    return None
                self.trailer_bytes += eol + 2
                if self.trailer_bytes > _MAX_HEAD:
                    raise ChunkError("chunked trailers too large", 431)
                del buf[: eol + 2]
                if eol == 0:
                    return bytes(self.out)
                continue
            if self.left:
                n = min(self.left, len(buf))
                if not n:
                    return None
                with memoryview(buf) as view:
                    self.out += view[:n]
                del buf[:n]
                self.left -= n
                if self.left:
                    return None
                self.crlf = True
            if self.crlf:
                if len(buf) < 2:
                    return None
                if buf[:2] != b"\r\n":
                    raise ChunkError("chunk data not followed by CRLF")
                del buf[:2]
                self.crlf = False
                continue
            eol = buf.find(b"\r\n")
            if eol < 0:
                self._bound_line(buf)
                return None
            size_text = bytes(buf[:eol]).split(b";", 1)[0].strip()
            if eol > 1024 or not size_text or not _HEX.issuperset(size_text) or len(size_text) > 8:
                raise ChunkError("bad chunk size line")
            size = int(size_text, 16)
            del buf[: eol + 2]
            if size == 0:
                self.trailers = True
                continue
            if self.limit is not None and len(self.out) + size > self.limit:
                raise ChunkError(f"request body is over the {self.limit}-byte limit", 413)
            self.left = size

    @staticmethod
    def _bound_line(buf: bytearray) -> None:
        if len(buf) > 1024:
            raise ChunkError("chunk size or trailer line too long")


def take(buf: bytearray, n: int) -> bytes:
    """The first `n` bytes of `buf` as bytes, removed from it: copied once (where
    `bytes(buf[:n])` copies twice)."""
    if not n:
        return b""
    if n == len(buf):
        out = bytes(buf)
        buf.clear()
    else:
        with memoryview(buf) as view:
            out = bytes(view[:n])
        del buf[:n]
    return out


class _Host:
    __slots__ = ("busy", "host", "host_line", "idle", "port", "starts", "tls", "waiters")

    def __init__(self, host: str, port: int, tls: bool = False) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # Host header
        self.host_line = f" HTTP/1.1\r\nHost: {hostport}\r\n".encode("latin-1")
        # (method, path) -> b"METHOD target": a client calls the same few paths again and
        # again (a queue's), so each is checked and quoted once. Bounded.
        self.starts: dict[tuple[str, str], bytes] = {}
        self.idle: deque[_Conn] = deque()
        self.busy = 0
        self.waiters: deque[asyncio.Future[None]] = deque()


class HttpPool:
    """Keep-alive connections to any number of hosts, shared by concurrent calls."""

    def __init__(
        self,
        *,
        timeout_s: float = 10.0,
        limit_per_host: int = 256,
        idle_s: float = 30.0,
        headers: Mapping[str, str] | None = None,
        sign: Callable[[bytes, bytes], bytes] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """`headers` go with every request (a client's token); `sign(b"METHOD target",
        body)` returns a header line added to every request (a node's credential);
        `ssl_context` verifies https:// origins (default: the system's trust store)."""
        self.timeout_s = timeout_s
        self.limit_per_host = limit_per_host
        self.idle_s = idle_s
        self._fields = b"".join(
            f"{k}: {v}\r\n".encode("latin-1") for k, v in (headers or {}).items()
        )
        self._sign = sign
        self._ssl = ssl_context
        self._hosts: dict[str, _Host] = {}
        self._closed = False

    def _host(self, origin: str) -> _Host:
        h = self._hosts.get(origin)
        if h is None:
            tls = origin.startswith("https://")
            if not tls and not origin.startswith("http://"):
                raise ValueError(f"only http:// and https:// urls are supported, not {origin!r}")
            hostport = origin[8:] if tls else origin[7:]
            host, sep, port = hostport.rpartition(":")
            if not sep or not port.isdigit() or "]" in port:
                host, port = hostport, "443" if tls else "80"
            h = self._hosts[origin] = _Host(host.strip("[]"), int(port), tls)
        return h

    def _idle(self, h: _Host, now: float | None = None) -> _Conn | None:
        """A kept-alive connection to reuse, taking a slot, or None."""
        if h.idle:
            if now is None:
                now = _monotonic()
            while h.idle:
                conn = h.idle.pop()
                if not conn.closed and now - conn.idle_since < self.idle_s:
                    h.busy += 1
                    return conn
                _close(conn)
        return None

    async def _acquire(self, h: _Host) -> _Conn:
        conn = self._idle(h)
        if conn is not None:
            return conn
        while h.busy >= self.limit_per_host:
            fut = asyncio.get_running_loop().create_future()
            h.waiters.append(fut)
            try:
                await fut
            except BaseException:
                if fut in h.waiters:
                    h.waiters.remove(fut)
                raise
            if h.idle:
                return await self._acquire(h)
        h.busy += 1
        try:
            tls = None
            if h.tls:
                if self._ssl is None:
                    self._ssl = ssl.create_default_context()
                tls = self._ssl
            _, conn = await asyncio.get_running_loop().create_connection(
                _Conn, h.host, h.port, ssl=tls
            )
        except BaseException:
            self._release(h, None)
            raise
        return conn

    def _release(self, h: _Host, conn: _Conn | None) -> None:
        h.busy -= 1
        if conn is not None:
            if conn.keep_alive and not conn.closed and not self._closed:
                conn.idle_since = _monotonic()
                h.idle.append(conn)
            else:
                _close(conn)
        if h.waiters:
            self._release_waiter(h)

    async def request(
        self,
        method: str,
        origin: str,
        path: str,
        *,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Reply:
        if self._closed:
            raise RuntimeError("the HTTP pool is closed")
        h = self._hosts.get(origin) or self._host(origin)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        now = _monotonic()
        deadline = now + timeout
        start = h.starts.get((method, path))
        if start is None:
            start = _request_start(h, method, path)
        if params:
            start += b"?" + urlencode(params).encode("latin-1")
        body = data or b""
        fields = (
            "".join([f"{k}: {v}\r\n" for k, v in headers.items()]).encode("latin-1")
            if headers
            else b""
        )
        if self._fields:
            fields = self._fields + fields
        if self._sign is not None:
            fields += self._sign(start, body)
        length = b"Content-Length: %d\r\n" % len(body) if body or method in _BODY_METHODS else b""
        if len(body) < _JOIN_MAX_BYTES:
            wire = b"".join((start, h.host_line, fields, length, b"\r\n", body))
            tail = b""
        else:
            # Not `writelines`: asyncio's (before 3.12) joins its buffers into one.
            wire = b"".join((start, h.host_line, fields, length, b"\r\n"))
            tail = body
        conn = self._idle(h, now)
        if conn is None:
            try:
                async with asyncio.timeout(timeout):
                    conn = await self._acquire(h)
            except BaseException:
                # A waiter woken for a slot and then timed out or cancelled passes the
                # wake-up on, so the slot is not lost.
                if h.waiters:
                    self._release_waiter(h)
                raise
        ok = False
        try:
            reply = await conn.send(wire, method == "HEAD", deadline, tail)
            ok = True
            return reply
        finally:
            self._release(h, conn if ok else _closed(conn))

    def _release_waiter(self, h: _Host) -> None:
        while h.waiters:
            fut = h.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                break

    async def close(self) -> None:
        self._closed = True
        for h in self._hosts.values():
            while h.idle:
                _close(h.idle.pop())


_STARTS_MAX = 1024  # remembered request lines per host


def _request_start(h: _Host, method: str, path: str) -> bytes:
    """b"METHOD target" for `path`, quoted unless it is plain already, remembered."""
    target = path if _PLAIN_PATH.fullmatch(path) else quote(path, safe=_PATH_SAFE)
    start = f"{method} {target}".encode("latin-1")
    if len(h.starts) >= _STARTS_MAX:
        h.starts.clear()
    h.starts[(method, path)] = start
    return start


def _close(conn: _Conn) -> None:
    conn.closed = True
    if conn._timer is not None:
        conn._timer.cancel()
        conn._timer = None
    if conn.transport is not None:
        conn.transport.close()


# A TLS connection encrypts each write whole into a buffer that stays as large as the
# largest write until the connection closes (the loop's SSL transport and OpenSSL's memory
# BIO): a large body goes out in pieces of this size, so an idle keep-alive connection keeps
# a piece's worth, not the largest body it ever carried.
TLS_WRITE_PIECE = 256 * 1024


def write_pieces(transport: asyncio.Transport, body: bytes) -> None:
    """Writes `body` as writes of at most `TLS_WRITE_PIECE` bytes (for a TLS transport)."""
    view = memoryview(body)
    for start in range(0, len(body), TLS_WRITE_PIECE):
        transport.write(view[start : start + TLS_WRITE_PIECE])


_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


def _closed(conn: _Conn) -> _Conn:
    """Closes the connection of a call that did not get its reply (it timed out, was
    cancelled or failed) with a reset rather than a FIN: a node cannot tell a FIN from
    a caller that only stopped sending and still waits for its reply, so it would run
    the call and answer nobody; a reset tells it the caller is gone, and a pop or
    receive it has not begun takes nothing."""
    t = conn.transport
    if t is not None and not conn.closed:
        sock = t.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    _close(conn)
    return conn


async def call(
    pool: HttpPool,
    method: str,
    url: str,
    *,
    json: Any = None,
    data: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    params: Mapping[str, Any] | None = None,
    timeout_s: float | None = None,
) -> Reply:
    """One call, by absolute url; errors mapped to zdmq's typed exceptions."""
    if json is not None:
        data = dumps(json)
        headers = {**JSON_HEADERS, **(headers or {})}
    # url = "http://host:port" + path (or https://)
    slash = url.find("/", 8 if url.startswith("https://") else 7)
    origin, path = (url, "/") if slash < 0 else (url[:slash], url[slash:])
    path, _, query = path.partition("?")
    if query:
        params = {**dict(_split_query(query)), **(params or {})}
    reply = await send(
        pool,
        method,
        origin,
        path,
        what=f"{method} {url}",
        data=data,
        headers=headers,
        params=params,
        timeout_s=timeout_s,
    )
    if reply.status >= 400:
        raise error_of(reply)
    return reply


async def send(
    pool: HttpPool, method: str, origin: str, path: str, *, what: str, **kw: Any
) -> Reply:
    """`pool.request`, its transport failures mapped to NodeUnavailable (`unsent` when
    nothing listened), named by `what`; any reply, whatever its status."""
    try:
        return await pool.request(method, origin, path, **kw)
    except (ConnectionRefusedError, socket.gaierror, UnicodeError) as e:
        # Nobody listens there, or the host has no address: the request was not sent, so
        # any call may be tried again.
        err = NodeUnavailable(f"{what}: {type(e).__name__}: {e}")
        err.unsent = True
        raise err from None
    except (TimeoutError, OSError, ConnectionError) as e:
        raise NodeUnavailable(f"{what}: {type(e).__name__}: {e}") from None


def error_of(reply: Reply) -> ZdmqError:
    """The typed error a non-2xx reply's JSON body names (by its status if it names none)."""
    try:
        payload = loads(reply.body) if reply.body else None
    except orjson.JSONDecodeError:
        payload = None
    err = from_wire(reply.status, payload)
    err.epoch = reply_epoch(reply)
    return err


def reply_epoch(reply: Reply) -> int | None:
    """The cluster map epoch a node's reply names (`zdmq-epoch`), if any."""
    value = reply.headers.get("zdmq-epoch")
    return int(value) if value is not None and value.isdigit() else None


def _split_query(query: str) -> Iterator[tuple[str, str]]:
    from urllib.parse import parse_qsl

    yield from parse_qsl(query, keep_blank_values=True)
