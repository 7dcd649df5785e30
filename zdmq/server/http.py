"""The node's HTTP/1.1 server: an asyncio protocol, a router, requests and replies.

Why not aiohttp's server: a node answers small requests one at a time for most of its
life, and on this machine aiohttp's request pipeline costs about 75 µs of CPU per call
more than this module (docs/design.md §13). What a zdmq node needs of
HTTP is small and fixed:

- keep-alive connections (HTTP/1.1 by default, HTTP/1.0 when asked), requests handled
  one at a time per connection in arrival order (pipelined requests wait their turn);
- bodies framed by Content-Length or chunked encoding, bounded by `max_body` (a larger
  one gets 413 and the connection closes), `Expect: 100-continue` answered;
- every reply framed by Content-Length; errors as zdmq's JSON error body.

A handler is `async def handler(request) -> Response`. A handler still running when
its client hangs up is not cancelled (a half-done pop or push must finish and commit);
`request.transport.is_closing()` tells it the caller is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, unquote

import orjson

from zdmq._http import ChunkError, Dechunker, Headers, take
from zdmq.errors import (
    BadRequest,
    InternalError,
    MessageTooLarge,
    MethodNotAllowed,
    NodeUnavailable,
    RouteNotFound,
    ZdmqError,
)

__all__ = ["App", "Request", "Response", "json_response", "serve_app"]

log = logging.getLogger("zdmq.http")

_MAX_HEAD = 64 * 1024
_REASONS = {s.value: s.phrase for s in HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_STATUS_LINES = {code: b"HTTP/1.1 %d %s\r\n" % (code, r.encode()) for code, r in _REASONS.items()}
_ROUTE_CACHE_MAX = 4096  # bound on remembered `{name}` route matches (a path per queue)
_monotonic = time.monotonic


class Request:
    __slots__ = (
        "_query",
        "app",
        "body",
        "headers",
        "match_info",
        "method",
        "path",
        "query_string",
        "transport",
    )

    def __init__(
        self,
        app: App,
        method: str,
        path: str,
        query_string: str,
        headers: Headers,
        body: bytes,
        transport: asyncio.Transport,
    ) -> None:
        self.app = app
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers
        self.body = body
        self.transport = transport
        self.match_info: dict[str, str] = {}
        self._query: dict[str, str] | None = None

    @property
    def query(self) -> dict[str, str]:
        """The query string's parameters (the first of repeats wins)."""
        if self._query is None:
            q: dict[str, str] = {}
            for k, v in parse_qsl(self.query_string, keep_blank_values=True):
                q.setdefault(k, v)
            self._query = q
        return self._query

    @property
    def path_qs(self) -> str:
        return f"{self.path}?{self.query_string}" if self.query_string else self.path

    @property
    def content_length(self) -> int:
        return len(self.body)

    async def read(self) -> bytes:
        return self.body


class Response:
    __slots__ = ("body", "headers", "status")

    def __init__(
        self,
        *,
        status: int = 200,
        body: bytes | None = None,
        content_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.status = status
        self.body = body or b""
        self.headers = dict(headers) if headers else {}
        if content_type is not None:
            self.headers["Content-Type"] = content_type


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(status=status, body=orjson.dumps(payload), content_type="application/json")


def error_response(err: ZdmqError) -> Response:
    resp = json_response(err.to_wire(), status=err.status)
    if isinstance(err, MethodNotAllowed) and err.allow:
        resp.headers["Allow"] = ", ".join(err.allow)  # RFC 9110: a 405 lists what the path takes
    return resp


Handler = Callable[[Request], Awaitable[Response]]


class App:
    """Routes, shared state (`app[key]`), and startup/cleanup hooks."""

    def __init__(self, *, max_body: int) -> None:
        self.max_body = max_body
        self._state: dict[str, Any] = {}
        self._routes: list[tuple[re.Pattern[str], dict[str, Handler]]] = []
        self._exact: dict[str, dict[str, Handler]] = {}
        # path -> (its methods, its match_info): a queue's paths come back call after
        # call, and a dict lookup beats trying each pattern in turn. Bounded.
        self._matched: dict[str, tuple[dict[str, Handler], dict[str, str]]] = {}
        self.on_startup: list[Callable[[App], Awaitable[None]]] = []
        self.on_cleanup: list[Callable[[App], Awaitable[None]]] = []

    def __getitem__(self, key: str) -> Any:
        return self._state[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._state[key] = value

    def route(self, method: str, pattern: str, handler: Handler) -> None:
        """`pattern` like "/v1/queues/{queue}/messages": a `{name}` matches one path
        segment, handed to the handler in `request.match_info`."""
        self._matched.clear()
        if "{" not in pattern:
            self._exact.setdefault(pattern, {})[method] = handler
            return
        regex = "^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern) + "$"
        for compiled, methods in self._routes:
            if compiled.pattern == regex:
                methods[method] = handler
                return
        self._routes.append((re.compile(regex), {method: handler}))

    def resolve(self, request: Request) -> Handler:
        path = request.path
        methods = self._exact.get(path)
        if methods is None:
            hit = self._matched.get(path)
            if hit is None:
                hit = self._match(path)
            if hit is not None:
                methods, match_info = hit
                request.match_info = dict(match_info)
        if methods is None:
            raise RouteNotFound(f"no route {request.method} {path}")
        handler = methods.get(request.method)
        if handler is None:
            raise MethodNotAllowed(f"{request.method} is not allowed on {path}", sorted(methods))
        return handler

    def _match(self, path: str) -> tuple[dict[str, Handler], dict[str, str]] | None:
        for compiled, methods in self._routes:
            m = compiled.match(path)
            if m is not None:
                match_info = {k: unquote(v) for k, v in m.groupdict().items()}
                if len(self._matched) >= _ROUTE_CACHE_MAX:
                    self._matched.clear()
                self._matched[path] = (methods, match_info)
                return methods, match_info
        return None


def _internal_error(request: Request, e: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.path)
    return error_response(InternalError(f"{type(e).__name__}: {e}"))


class _Date:
    """The Date header line, formatted once a second."""

    second = -1
    line = b""

    @classmethod
    def get(cls) -> bytes:
        now = int(time.time())
        if now != cls.second:
            cls.second = now
            cls.line = b"Date: %s\r\n" % email.utils.formatdate(now, usegmt=True).encode()
        return cls.line


class _HttpProtocol(asyncio.Protocol):
    def __init__(self, server: _Server) -> None:
        self.server = server
        self.app = server.app
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.busy = False  # a handler is running
        self.closing = False
        self.eof = False  # the caller half-closed: finish what it sent, then close
        self.paused = False
        self.last_active = _monotonic()
        self.task: asyncio.Task[None] | None = None
        # The request being read: (method, path, query, version, headers, keep_alive).
        self.head: tuple[str, str, str, str, dict[str, str], bool] | None = None
        self.want = 0  # body bytes expected (Content-Length), or -2: chunked
        self.chunks: Dechunker | None = None
        # A Content-Length body longer than the bytes at hand: its pieces as they came,
        # joined once when the last arrives (`_body_part`), so a large body is copied
        # once on its way from the socket reads to the handler. None: not collecting.
        self.parts: list[bytes | memoryview | bytearray] | None = None
        self.got = 0  # bytes in `parts`

    # ---- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.server.connections.add(self)
        _nodelay(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.discard(self)

    def eof_received(self) -> bool | None:
        # The caller has only stopped sending (a half-close): a request it sent may be
        # running, perhaps a pop that has already committed, and its reply must still
        # go out. True keeps the transport open for writing; `_run` closes it once the
        # requests already read are answered.
        self.eof = True
        if not self.busy and self.transport is not None:
            self.closing = True
            self.transport.close()
        return True

    def data_received(self, data: bytes) -> None:
        self.last_active = _monotonic()
        if self.parts is not None:
            self._body_part(data)
        elif self.busy:
            self.buf += data
            if len(self.buf) > self.app.max_body + _MAX_HEAD and self.transport is not None:
                # Pipelined requests beyond one full body wait in the kernel, not here.
                self.transport.pause_reading()
                self.paused = True
        elif self.buf or self.head is not None:
            self.buf += data
            self._next()
        else:
            self._next(data)  # the common case: a read that starts a request

    # ---- parsing
    def _next(self, data: bytes | None = None) -> None:
        """Parses and starts the next complete request: the one `data` (a read, with
        nothing buffered) starts, else the next in the buffer."""
        while not self.busy and not self.closing:
            try:
                if data is None:
                    body = self._parse()
                else:
                    body = self._parse_read(data)
                    data = None
            except _Refuse as r:
                self._refuse(r.err, r.status)
                return
            if body is None:
                return
            self._start(body)

    def _parse_read(self, data: bytes) -> bytes | None:
        """`_parse` for a request at the start of a read, nothing buffered: the head and
        the body are taken from `data` itself, without going through the buffer."""
        end = data.find(b"\r\n\r\n")
        if end < 0 or end > _MAX_HEAD:
            self.buf += data
            return self._parse()
        start = end + 4
        self._head(data[:end].decode("latin-1"), more=len(data) > start)
        want = self.want
        if want < 0:  # chunked: decoded from the buffer
            self.buf += memoryview(data)[start:]
            return self._parse()
        stop = start + want
        if len(data) < stop:
            self._collect(memoryview(data)[start:] if len(data) > start else None)
            return None
        if len(data) > stop:  # pipelined requests behind this one
            self.buf += memoryview(data)[stop:]
        return data[start:stop] if want else b""

    def _parse(self) -> bytes | None:
        """The body of the next whole request in the buffer (its head in `self.head`),
        or None until more bytes arrive; `_Refuse` for one that must be refused."""
        buf = self.buf
        if self.head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0 or end > _MAX_HEAD:
                if len(buf) > _MAX_HEAD:
                    raise _Refuse(BadRequest("request head too large"), 431)
                if buf[:2] == b"\r\n":  # stray CRLFs between requests are allowed
                    del buf[:2]
                return None
            text = buf[:end].decode("latin-1")
            del buf[: end + 4]
            self._head(text, more=bool(buf))
        want = self.want
        if want >= 0:
            if len(buf) < want:
                self.buf = bytearray()
                self._collect(buf or None)
                return None
            return take(buf, want)
        if self.chunks is None:
            self.chunks = Dechunker(self.app.max_body)
        try:
            got = self.chunks.feed(buf)
        except ChunkError as e:
            err = MessageTooLarge(str(e)) if e.status == 413 else BadRequest(str(e))
            raise _Refuse(err, e.status) from None
        if got is not None:
            self.chunks = None
        return got

    def _head(self, text: str, *, more: bool) -> None:
        """Parses a request head (`more`: body bytes came with it) into `self.head` and
        `self.want`; `_Refuse` for one that must be refused."""
        lines = text.lstrip("\r\n").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _Refuse(BadRequest(f"bad request line {lines[0][:100]!r}"))
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise _Refuse(BadRequest(f"bad header line {line[:100]!r}"))
            key = name.lower()
            value = value.strip()
            if key == "content-length" and key in headers and headers[key] != value:
                raise _Refuse(BadRequest("conflicting Content-Length headers"))
            headers[key] = value
        conn = headers.get("connection")
        if version == "HTTP/1.1":
            keep = conn is None or conn.lower() != "close"
        else:
            keep = conn is not None and conn.lower() == "keep-alive"
        te = headers.get("transfer-encoding")
        if te is not None and "chunked" in te.lower():
            want = -2
        else:
            raw = headers.get("content-length", "0")
            if not (raw.isascii() and raw.isdigit()):
                raise _Refuse(BadRequest(f"bad Content-Length {raw[:40]!r}"))
            want = int(raw)
            if want > self.app.max_body:
                raise _Refuse(
                    MessageTooLarge(
                        f"request body of {want} bytes is over the {self.app.max_body}-byte limit"
                    ),
                    413,
                )
        path, _, query = target.partition("?")
        if not path.startswith("/"):
            raise _Refuse(BadRequest(f"bad request target {target[:100]!r}"))
        self.want = want
        self.head = (method, path, query, version, headers, keep)
        expect = headers.get("expect")
        if (
            expect is not None
            and expect.lower() == "100-continue"
            and want != 0
            and not more
            and self.transport is not None
        ):
            self.transport.write(_CONTINUE)

    def _collect(self, first: bytes | memoryview | bytearray | None) -> None:
        """Starts collecting a body whose first bytes (if any) are `first`."""
        self.parts = [first] if first else []
        self.got = len(first) if first else 0

    def _body_part(self, data: bytes) -> None:
        """The next read of a body being collected: kept as it came; once the body is
        whole, it is joined (the one copy) and its request started."""
        parts = self.parts
        assert parts is not None
        parts.append(data)
        self.got += len(data)
        over = self.got - self.want
        if over < 0:
            return
        if over:  # the next request(s) began in this read
            view = memoryview(data)
            parts[-1] = view[: len(data) - over]
            self.buf += view[len(data) - over :]
        self.parts = None
        self._start(b"".join(parts))

    def _start(self, body: bytes) -> None:
        """Runs the handler of the request whose head was parsed and whose body is `body`."""
        assert self.head is not None and self.transport is not None
        method, path, query, version, headers, keep = self.head
        self.head = None
        # Routes match the path as sent: "%2F" in a queue name stays inside its segment.
        req = Request(self.app, method, path, query, Headers(headers), body, self.transport)
        self.busy = True
        self.task = asyncio.get_running_loop().create_task(
            self._run(req, keep, version == "HTTP/1.0")
        )

    # ---- replies
    async def _run(self, req: Request, keep: bool, http10: bool) -> None:
        server = self.server
        if server.stopping:  # no new work once the node is stopping
            resp = error_response(NodeUnavailable("the node is stopping"))
        else:
            try:
                resp = await self.app.resolve(req)(req)
            except ZdmqError as e:
                resp = error_response(e)
            except asyncio.CancelledError:
                resp = error_response(InternalError("the node is stopping"))
                keep = False
            except Exception as e:
                resp = _internal_error(req, e)
        keep = keep and not server.stopping
        self._write(resp, keep, head_only=req.method == "HEAD", http10=http10)
        self.busy = False
        self.task = None
        self.last_active = _monotonic()
        if not keep:
            self._close()
            return
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        if self.closing:
            if self.transport is not None:
                self.transport.close()
            return
        if self.buf:
            self._next()
        if self.eof and not self.busy:  # nothing more will come: the rest is not a request
            self._close()

    def _write(
        self, resp: Response, keep: bool, *, head_only: bool = False, http10: bool = False
    ) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        status = resp.status
        line = _STATUS_LINES.get(status)
        if line is None:
            line = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, "Unknown").encode())
        head = line + _Date.get()
        if resp.headers:
            head += _header_lines(resp.headers)
        body = resp.body
        if status != 204 and status >= 200:
            head += b"Content-Length: %d\r\n" % len(body)
        else:
            body = b""
        if not keep:
            head += b"Connection: close\r\n\r\n"
        elif http10:
            head += b"Connection: keep-alive\r\n\r\n"
        else:
            head += b"\r\n"
        if head_only or not body:
            t.write(head)
        elif len(body) > 64 * 1024:
            t.writelines([head, body])
        else:
            t.write(head + body)  # one write, one segment for a small reply

    def _refuse(self, err: ZdmqError, status: int | None = None) -> None:
        resp = error_response(err)
        if status is not None:
            resp.status = status
        self._write(resp, keep=False)
        self._close()

    def _close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()


def _header_lines(headers: dict[str, str]) -> bytes:
    """The reply's header lines. A reply is written after its handler committed, so it
    must not fail here, nor carry a line break into the head: a header whose name or
    value is not printable ASCII is left out (and logged), never sent or raised."""
    kept = {k: v for k, v in headers.items() if _printable(k) and _printable(v)}
    if len(kept) < len(headers):
        log.error(
            "reply headers left out (not printable ASCII): %s", sorted(set(headers) - set(kept))
        )
    return "".join([f"{k}: {v}\r\n" for k, v in kept.items()]).encode("ascii")


def _printable(field: str) -> bool:
    return field.isascii() and field.isprintable()


def _nodelay(transport: asyncio.BaseTransport) -> None:
    """Replies go out at once, whatever the loop. uvloop sets TCP_NODELAY on accepted
    sockets; asyncio's loop skips it when the listening socket was made with protocol 0
    (`socket.socket()`, as the node's is), so an accepted one would keep Nagle on."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Refuse(Exception):
    def __init__(self, err: ZdmqError, status: int | None = None) -> None:
        self.err = err
        self.status = status


class _Server:
    def __init__(self, app: App, idle_s: float) -> None:
        self.app = app
        self.idle_s = idle_s
        self.connections: set[_HttpProtocol] = set()
        self.stopping = False

    def reap_idle(self) -> None:
        now = time.monotonic()
        for c in list(self.connections):
            if not c.busy and now - c.last_active > self.idle_s:
                c._close()


async def serve_app(
    app: App,
    sock: Any,
    stop: asyncio.Event,
    *,
    ready: Callable[[], None] | None = None,
    idle_s: float = 75.0,
    shutdown_timeout_s: float = 2.0,
    ssl: Any = None,
) -> None:
    """Runs `app` on the listening socket `sock` until `stop` is set: startup hooks,
    serve, then stop accepting, let running handlers finish (up to
    `shutdown_timeout_s`), close every connection, cleanup hooks. `ssl`: an
    `ssl.SSLContext` to serve HTTPS with."""
    for hook in app.on_startup:
        await hook(app)
    server_state = _Server(app, idle_s)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _HttpProtocol(server_state), sock=sock, backlog=1024, ssl=ssl
    )
    reaper = loop.create_task(_reap(server_state))
    try:
        if ready is not None:
            ready()
        await stop.wait()
    finally:
        server_state.stopping = True
        server.close()
        reaper.cancel()
        running = [c.task for c in server_state.connections if c.task is not None]
        if running:
            await asyncio.wait(running, timeout=shutdown_timeout_s)
        for c in list(server_state.connections):
            if c.task is not None:
                c.task.cancel()
        await asyncio.sleep(0)
        for c in list(server_state.connections):
            c._close()
        with contextlib.suppress(Exception):
            await server.wait_closed()
        for hook in reversed(app.on_cleanup):
            await hook(app)


async def _reap(server: _Server) -> None:
    while True:
        await asyncio.sleep(min(10.0, server.idle_s / 2))
        server.reap_idle()
