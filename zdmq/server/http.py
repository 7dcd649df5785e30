"""The node's HTTP/1.1 server: an asyncio protocol, a router, requests and replies.

Requests are parsed by llhttp (Node.js's parser, fuzzed and strict) through `httptools`,
under this module's own lean asyncio protocol rather than aiohttp's server: a node answers
small requests one at a time for most of its life, and aiohttp's request pipeline costs
about 75 µs of CPU per call more (docs/design.md §13). What a zdmq node needs of HTTP is
small and fixed:

- keep-alive connections (HTTP/1.1 by default, HTTP/1.0 when asked), requests handled
  one at a time per connection in arrival order; the next pipelined request is handled
  only once the reply before it has been handed to the socket, and a connection is not
  read while its replies are not drained (memory per connection stays bounded);
- strict RFC 9112 framing: bodies framed by Content-Length or chunked encoding alone
  (both at once, any other transfer coding, a bad length: refused and the connection
  closed), one Host on HTTP/1.1, HTTP/1.0 and 1.1 only; a body over `max_body` gets 413;
  `Expect: 100-continue` answered;
- time limits: a head must be whole within `head_timeout_s`, a body must not stall for
  `body_timeout_s` (408 and close), an idle keep-alive connection closes after `idle_s`;
  above `max_connections` open connections a new one gets 503 and is closed;
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
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, unquote

import httptools
import orjson

from zdmq._http import TLS_WRITE_PIECE, Headers, write_pieces
from zdmq.errors import (
    BadRequest,
    InternalError,
    MessageTooLarge,
    MethodNotAllowed,
    NodeUnavailable,
    RequestTimeout,
    RouteNotFound,
    UpgradeRequired,
    ZdmqError,
)
from zdmq.logs import REQUEST_ID_HEADER, new_request_id, request_id, valid_request_id

__all__ = ["App", "Request", "Response", "Upgrade", "json_response", "serve_app"]

log = logging.getLogger("zdmq.http")

_MAX_HEAD = 64 * 1024  # a request head (and a chunked body's trailers), in bytes
# Unparsed bytes kept while a request is handled; beyond them the connection is not read.
_READ_AHEAD = 256 * 1024
# What a chunked body may carry beyond its data: framing per chunk (a size line and its
# CRLFs, extensions included) and its trailers (bounded by _MAX_HEAD themselves).
_CHUNK_FRAMING = 64
_LINGER_S = 2.0  # how long a refused connection is drained before it is closed
_REASONS = {s.value: s.phrase for s in HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_STATUS_LINES = {code: b"HTTP/1.1 %d %s\r\n" % (code, r.encode()) for code, r in _REASONS.items()}
_ROUTE_CACHE_MAX = 4096  # bound on remembered `{name}` route matches (a path per queue)
_monotonic = time.monotonic
_perf_counter = time.perf_counter


class Request:
    __slots__ = (
        "_query",
        "_query_names",
        "app",
        "body",
        "headers",
        "match_info",
        "method",
        "path",
        "query_string",
        "route",
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
        self.route = ""  # the pattern of the route that matched ("": none did)
        self._query: dict[str, str] | None = None
        self._query_names: list[str] = []

    @property
    def query(self) -> dict[str, str]:
        """The query string's parameters (the first of repeats wins)."""
        if self._query is None:
            q: dict[str, str] = {}
            names = self._query_names
            for k, v in parse_qsl(self.query_string, keep_blank_values=True):
                names.append(k)
                q.setdefault(k, v)
            self._query = q
        return self._query

    @property
    def query_names(self) -> list[str]:
        """Every parameter name in the query string, repeats included, in order."""
        _ = self.query  # parsed once, for both
        return self._query_names

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


class Upgrade(Response):
    """A `101 Switching Protocols` reply: once it is written, the connection belongs to
    the protocol `take_over(transport)` returns (the HTTP protocol reads no more of it).
    Only the reply to a request that asked to upgrade; any other request gets 400."""

    __slots__ = ("take_over",)

    def __init__(
        self,
        take_over: Callable[[asyncio.Transport], asyncio.Protocol],
        headers: Mapping[str, str],
    ) -> None:
        super().__init__(status=101, headers=headers)
        self.take_over = take_over


# What a 503 asks its caller to wait, in seconds, before it calls again.
RETRY_AFTER_S = "1"


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(status=status, body=orjson.dumps(payload), content_type="application/json")


def error_response(err: ZdmqError) -> Response:
    resp = json_response(err.to_wire(), status=err.status)
    if isinstance(err, MethodNotAllowed) and err.allow:
        resp.headers["Allow"] = ", ".join(err.allow)  # RFC 9110: a 405 lists what the path takes
    elif isinstance(err, UpgradeRequired):
        resp.headers["Upgrade"] = "websocket"  # RFC 9110: a 426 names the protocol to take
    elif err.retriable and err.status == 503:
        resp.headers["Retry-After"] = RETRY_AFTER_S  # a leader, or the node, soon back
    return resp


Handler = Callable[[Request], Awaitable[Response]]


class App:
    """Routes, shared state (`app[key]`), and startup/cleanup hooks."""

    def __init__(self, *, max_body: int) -> None:
        self.max_body = max_body
        # Paths whose bodies may be larger than max_body (exact paths only).
        self.max_body_of: dict[str, int] = {}
        self._state: dict[str, Any] = {}
        self._routes: list[tuple[re.Pattern[str], dict[str, Handler], str]] = []
        self._exact: dict[str, dict[str, Handler]] = {}
        # path -> (its methods, its match_info, its pattern): a queue's paths come back
        # call after call, and a dict lookup beats trying each pattern in turn. Bounded.
        self._matched: dict[str, tuple[dict[str, Handler], dict[str, str], str]] = {}
        self.on_startup: list[Callable[[App], Awaitable[None]]] = []
        self.on_cleanup: list[Callable[[App], Awaitable[None]]] = []
        # Run once a stop is asked for, while the node still serves (a graceful hand-over).
        self.on_shutdown: list[Callable[[App], Awaitable[None]]] = []
        #: Called after each reply is written: (route pattern, method, status, seconds).
        self.observe: Callable[[str, str, int, float], None] | None = None
        #: Called as the server starts, with a function that counts its open connections.
        self.on_serving: Callable[[Callable[[], int]], None] | None = None
        #: Header lines (encoded, each ending in CRLF) every reply carries.
        self.reply_head = b""

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
        for compiled, methods, _ in self._routes:
            if compiled.pattern == regex:
                methods[method] = handler
                return
        self._routes.append((re.compile(regex), {method: handler}, pattern))

    def resolve(self, request: Request) -> Handler:
        path = request.path
        methods = self._exact.get(path)
        if methods is None:
            hit = self._matched.get(path)
            if hit is None:
                hit = self._match(path)
            if hit is not None:
                methods, match_info, request.route = hit
                request.match_info = dict(match_info)
        else:
            request.route = path
        if methods is None:
            raise RouteNotFound(f"no route {request.method} {path}")
        handler = methods.get(request.method)
        if handler is None:
            raise MethodNotAllowed(f"{request.method} is not allowed on {path}", sorted(methods))
        return handler

    def _match(self, path: str) -> tuple[dict[str, Handler], dict[str, str], str] | None:
        for compiled, methods, pattern in self._routes:
            m = compiled.match(path)
            if m is not None:
                match_info = {k: unquote(v) for k, v in m.groupdict().items()}
                if len(self._matched) >= _ROUTE_CACHE_MAX:
                    self._matched.clear()
                hit = self._matched[path] = (methods, match_info, pattern)
                return hit
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


_IDLE, _HEAD, _BODY = 0, 1, 2  # where the parser is: between requests, in a head, in a body
_METHODS: dict[bytes, str] = {}  # llhttp's method names, decoded once each
_EOL = (b"\n", b"\r")
_NO_VERSION = ("0.0", "0.9")  # llhttp's version of a request line that has none


class _HttpProtocol(asyncio.Protocol):
    """One connection. llhttp parses what is read and calls the `on_*` methods; a whole
    request goes to `queue` and its handler runs once the one before it has replied.
    While a handler runs, or replies wait to drain, what is read is kept unparsed in
    `buf` (at most `_READ_AHEAD` bytes, then reading stops), so at most one read's worth
    of pipelined requests is ever parsed ahead."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.app = server.app
        self.transport: asyncio.Transport | None = None
        self.tls = False
        self.parser = httptools.HttpRequestParser(self)
        self.state = _IDLE
        self.last_active = _monotonic()
        self.head_started = 0.0
        # The request being parsed.
        self.url = b""
        self.headers: dict[str, str] = {}
        self.head_bytes = 0  # its head's bytes seen in callbacks (url, headers, trailers)
        self.fed = 0  # bytes of reads that carried only this request
        self.parts: list[bytes] = []
        self.got = 0  # body bytes in `parts`
        self.limit = server.app.max_body  # the body limit of the request being parsed
        self.chunks = 0
        self.expect = False  # it asked for 100 Continue
        self.method = ""
        self.path = ""
        self.query = ""
        self.keep = True
        self.http10 = False
        self.completed = False  # a request ended in the read being parsed
        # Parsed requests waiting their turn, (request, keep-alive, HTTP/1.0), and the
        # refusal of a bad one (nothing after it is read).
        self.queue: deque[tuple[Request, bool, bool] | _Refuse] = deque()
        self.buf = bytearray()  # read, not yet parsed
        self.busy = False  # a handler is running
        self.task: asyncio.Task[None] | None = None
        self.done = False  # nothing more is parsed: a refusal, Connection: close, an upgrade
        self.closing = False
        self.eof = False  # the caller half-closed: finish what it sent, then close
        self.read_paused = False
        self.write_paused = False
        self.refused = False  # over max_connections: answered 503, drained, closed

    # ---- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.tls = transport.get_extra_info("ssl_object") is not None
        _nodelay(transport)
        server = self.server
        if len(server.connections) >= server.max_connections:
            self._refuse_connection()
            return
        server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.discard(self)
        # The transport refers back to this protocol, and so do the requests queued here:
        # dropped, a closed connection is freed at once rather than by the cycle collector
        # (with TLS, its buffers too). A running handler keeps its request's transport.
        self.transport = None
        self.queue.clear()

    def pause_writing(self) -> None:
        # The caller does not read its replies: stop reading and handling its requests
        # until what was written drains.
        self.write_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._continue()

    def eof_received(self) -> bool | None:
        # The caller has only stopped sending (a half-close): a request it sent may be
        # running, perhaps a pop that has already committed, and its reply must still
        # go out. True keeps the transport open for writing; `_continue` closes it once
        # the requests already read are answered.
        self.eof = True
        if self.refused:
            return None
        if not (self.busy or self.queue or self.buf) and self.transport is not None:
            self._close()
        return True

    def data_received(self, data: bytes) -> None:
        self.last_active = _monotonic()
        if self.done:
            return  # a refused or last request: the rest is not read
        if self.busy or self.queue or self.write_paused:
            self.buf += data
            if len(self.buf) > _READ_AHEAD:
                self._pause_reading()
            return
        self._feed(data)

    # ---- parsing
    def _feed(self, data: bytes | bytearray) -> None:
        """Parses `data`; queues the requests it completes (or the refusal of a bad one)
        and starts the first."""
        self.completed = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # A request asking to switch protocols was read whole: it is answered as
            # any other, and the connection closes after it.
            self._last_request()
        except httptools.HttpParserError as e:
            if not self.done:
                cause = e.__context__
                if isinstance(cause, _Refuse):
                    self._queue_refusal(cause)
                else:
                    text = str(e)
                    status = 505 if "HTTP version" in text else None
                    self._queue_refusal(_Refuse(BadRequest(f"bad request: {text}"), status))
        else:
            if self.state != _IDLE:
                self._check_partial(data)
        if self.queue and not self.busy:
            self._next()

    def _check_partial(self, data: bytes | bytearray) -> None:
        """Bounds on a request still being read after a read was parsed."""
        if not self.completed:
            # A read that carried only this request (a read that ended another one
            # counts from the start of its next read on).
            self.fed += len(data)
        if self.state == _HEAD:
            if self.fed > _MAX_HEAD or self.head_bytes > _MAX_HEAD:
                self._queue_refusal(_Refuse(BadRequest("request head too large"), 431))
            elif self.url and data[-1:] in _EOL and self.parser.get_http_version() in _NO_VERSION:
                # A request line that ended without a version (HTTP/0.9): refused now,
                # not once the head timeout runs out.
                self._queue_refusal(_Refuse(BadRequest("request line without an HTTP version")))
            return
        if self.fed - self.got - self.head_bytes > 2 * _MAX_HEAD + _CHUNK_FRAMING * self.chunks:
            self._queue_refusal(_Refuse(BadRequest("chunked framing or trailers too large"), 431))
        elif self.expect and not self.got and self.transport is not None:
            self.expect = False
            self.transport.write(_CONTINUE)

    def on_message_begin(self) -> None:
        self.state = _HEAD
        self.head_started = self.last_active
        self.url = b""
        self.headers = {}
        self.head_bytes = 0
        self.fed = 0
        self.got = 0
        self.chunks = 0

    def on_url(self, url: bytes) -> None:
        self.url += url  # llhttp hands a target split across reads over in pieces
        self.head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value) + 4
        if self.head_bytes > _MAX_HEAD:
            raise _Refuse(BadRequest("request head too large"), 431)
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1").strip()
        headers = self.headers
        if key in headers:
            if key == "host":
                raise _Refuse(BadRequest("more than one Host header"))
            if key == "transfer-encoding":
                text = f"{headers[key]}, {text}"
        headers[key] = text

    def on_headers_complete(self) -> None:
        self.state = _BODY
        parser = self.parser
        version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            if version == "0.9":
                raise _Refuse(BadRequest("request line without an HTTP version"))
            raise _Refuse(BadRequest(f"HTTP/{version} is not supported"), 505)
        headers = self.headers
        if version == "1.1" and "host" not in headers:
            raise _Refuse(BadRequest("an HTTP/1.1 request needs a Host header"))
        te = headers.get("transfer-encoding")
        if te is not None:
            if version == "1.0":
                raise _Refuse(BadRequest("Transfer-Encoding in an HTTP/1.0 request"))
            codings = [c.strip().lower() for c in te.split(",")]
            if codings != ["chunked"]:
                if all(c == "chunked" for c in codings):
                    raise _Refuse(BadRequest(f"bad Transfer-Encoding {te[:100]!r}"))
                raise _Refuse(BadRequest(f"transfer coding {te[:100]!r} is not supported"), 501)
        url = self.url
        if url[:1] != b"/":
            if url[:7].lower() != b"http://" and url[:8].lower() != b"https://":
                raise _Refuse(BadRequest(f"bad request target {url[:100]!r}"))
            try:  # absolute form: the path and query are what count
                parsed = httptools.parse_url(url)
            except httptools.HttpParserInvalidURLError:
                raise _Refuse(BadRequest(f"bad request target {url[:100]!r}")) from None
            url = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
        path, _, query = url.partition(b"?")
        self.path = path.decode("latin-1")
        self.query = query.decode("latin-1")
        app = self.app
        self.limit = (
            app.max_body_of.get(self.path, app.max_body) if app.max_body_of else app.max_body
        )
        if te is None:
            cl = headers.get("content-length")
            if cl is not None:
                if not (cl.isascii() and cl.isdigit()):
                    raise _Refuse(BadRequest(f"bad Content-Length {cl[:40]!r}"))
                if int(cl) > self.limit:
                    raise _Refuse(
                        MessageTooLarge(
                            f"request body of {cl} bytes is over the {self.limit}-byte limit"
                        ),
                        413,
                    )
        raw_method = parser.get_method()
        method = _METHODS.get(raw_method)
        if method is None:
            method = _METHODS[raw_method] = raw_method.decode("ascii")
        self.method = method
        self.keep = parser.should_keep_alive()
        self.http10 = version == "1.0"
        self.parts = []
        expect = headers.get("expect")
        self.expect = expect is not None and expect.lower() == "100-continue"

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)
        self.got += len(body)
        if self.got > self.limit:
            raise _Refuse(MessageTooLarge(f"request body is over the {self.limit}-byte limit"), 413)

    def on_chunk_header(self) -> None:
        self.chunks += 1

    def on_message_complete(self) -> None:
        self.state = _IDLE
        self.completed = True
        parts = self.parts
        body = (parts[0] if len(parts) == 1 else b"".join(parts)) if parts else b""
        self.parts = []
        assert self.transport is not None
        req = Request(
            self.app,
            self.method,
            self.path,
            self.query,
            Headers(self.headers),
            body,
            self.transport,
        )
        self.queue.append((req, self.keep, self.http10))
        if not self.keep:
            self.done = True  # nothing after a Connection: close request is read

    def _last_request(self) -> None:
        self.done = True
        if self.queue:
            last = self.queue[-1]
            if not isinstance(last, _Refuse):
                self.queue[-1] = (last[0], False, last[2])

    def _queue_refusal(self, refusal: _Refuse) -> None:
        self.done = True
        self.buf = bytearray()
        self.queue.append(refusal)

    # ---- handling, in order
    def _next(self) -> None:
        """Starts the next queued request's handler (or writes its refusal)."""
        if self.busy or self.closing or not self.queue:
            return
        item = self.queue.popleft()
        if isinstance(item, _Refuse):
            self._refuse(item.err, item.status)
            return
        req, keep, http10 = item
        self.busy = True
        self.task = asyncio.get_running_loop().create_task(self._run(req, keep, http10))

    def _continue(self) -> None:
        """After a reply, or once replies drained: the next request, from the queue or
        from what was read meanwhile; reading resumes once nothing waits."""
        if self.closing or self.busy or self.write_paused:
            return
        if self.queue:
            self._next()
            return
        if self.buf:
            buf, self.buf = self.buf, bytearray()
            self.last_active = _monotonic()  # its timers start now, not when it was read
            self._feed(buf)
            if self.busy or self.queue or self.closing:
                return
        if self.state == _HEAD:
            self.head_started = self.last_active
        if self.read_paused and self.transport is not None:
            self.read_paused = False
            self.transport.resume_reading()
        if self.eof or self.done:  # nothing more will come or be read
            self._close()

    def _pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None and not self.closing:
            self.read_paused = True
            self.transport.pause_reading()

    # ---- replies
    async def _run(self, req: Request, keep: bool, http10: bool) -> None:
        started = _perf_counter()
        server = self.server
        # This task's request id: the caller's, when valid, else a fresh one; log lines
        # and node-to-node calls made while serving the request carry it.
        rid = req.headers.get(REQUEST_ID_HEADER)
        if rid is None or not valid_request_id(rid):
            rid = new_request_id()
        request_id.set(rid)
        if server.stopping:  # no new work once the node is stopping
            stopping = NodeUnavailable("the node is stopping: nothing was done")
            stopping.unsent = True  # a router sends it to another member, even a pop
            resp = error_response(stopping)
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
        if isinstance(resp, Upgrade):
            if self._upgrade(req, resp):
                return
            resp = error_response(BadRequest("this call switches protocols: send Upgrade"))
        keep = keep and not server.stopping
        resp.headers[REQUEST_ID_HEADER] = rid
        self._write(resp, keep, head_only=req.method == "HEAD", http10=http10)
        observe = self.app.observe
        if observe is not None:
            observe(req.route, req.method, resp.status, _perf_counter() - started)
        self.busy = False
        self.task = None
        self.last_active = _monotonic()
        if not keep:
            self._close()
            return
        self._continue()

    def _upgrade(self, req: Request, resp: Upgrade) -> bool:
        """Writes the 101 and hands the connection to the protocol `resp` makes; False
        (nothing written) when the request did not ask to upgrade. What the caller sent
        after its request, before the 101, is not read (RFC 6455 has it wait)."""
        t = self.transport
        if "upgrade" not in req.headers.get("connection", "").lower() or not self.done:
            return False
        self.busy = False
        self.task = None
        self.closing = True  # this protocol is done with the connection, not closing it
        self.server.connections.discard(self)
        if t is None or t.is_closing():
            return True
        t.write(b"HTTP/1.1 101 Switching Protocols\r\n" + _header_lines(resp.headers) + b"\r\n")
        protocol = resp.take_over(t)
        t.set_protocol(protocol)
        protocol.connection_made(t)
        if self.read_paused:
            self.read_paused = False
            t.resume_reading()
        return True

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
        head = line + _Date.get() + self.app.reply_head
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
        elif self.tls and len(body) > TLS_WRITE_PIECE:
            t.write(head)
            write_pieces(t, body)
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

    def _timeout(self, message: str) -> None:
        """A head or body that did not arrive in time: 408, and the connection closes."""
        self.done = True
        self._refuse(RequestTimeout(message))

    def _refuse_connection(self) -> None:
        """Over `max_connections`: 503 at once, then the caller's request is drained
        (up to `_LINGER_S`) so that closing does not reset the reply away."""
        self.refused = self.done = True
        limit = self.server.max_connections
        err = NodeUnavailable(f"the node serves its limit of {limit} connections; retry later")
        self._write(error_response(err), keep=False)
        t = self.transport
        if t is None:
            return
        if t.can_write_eof():
            t.write_eof()
        asyncio.get_running_loop().call_later(_LINGER_S, self._close)

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
    def __init__(
        self,
        app: App,
        *,
        idle_s: float,
        head_timeout_s: float,
        body_timeout_s: float,
        max_connections: int,
    ) -> None:
        self.app = app
        self.idle_s = idle_s
        self.head_timeout_s = head_timeout_s
        self.body_timeout_s = body_timeout_s
        self.max_connections = max_connections
        self.connections: set[_HttpProtocol] = set()
        self.stopping = False

    @property
    def sweep_s(self) -> float:
        """How often `sweep` runs: each time limit is kept to within a quarter of itself."""
        return max(
            0.01, min(10.0, self.idle_s / 2, self.head_timeout_s / 4, self.body_timeout_s / 4)
        )

    def sweep(self) -> None:
        """Enforces the time limits: a head not whole within `head_timeout_s` and a body
        that received nothing for `body_timeout_s` get 408; a connection idle (or whose
        caller reads no replies) for `idle_s` is closed. One pass over the connections
        every `sweep_s`, rather than a timer per request."""
        now = _monotonic()
        for c in list(self.connections):
            if c.closing or c.busy or c.queue:
                continue  # a request is being handled: no limit runs against its caller
            if c.write_paused or c.state == _IDLE:
                if now - c.last_active > self.idle_s:
                    c._close()
            elif c.state == _HEAD:
                if now - c.head_started > self.head_timeout_s:
                    c._timeout(f"request head not complete within {self.head_timeout_s:g} s")
            elif now - c.last_active > self.body_timeout_s:
                c._timeout(f"no byte of the request body for {self.body_timeout_s:g} s")


async def serve_app(
    app: App,
    sock: Any,
    stop: asyncio.Event,
    *,
    ready: Callable[[], None] | None = None,
    idle_s: float = 75.0,
    head_timeout_s: float = 10.0,
    body_timeout_s: float = 30.0,
    max_connections: int = 10_000,
    shutdown_timeout_s: float = 2.0,
    ssl: Any = None,
) -> None:
    """Runs `app` on the listening socket `sock` until `stop` is set: startup hooks,
    serve, then shutdown hooks (still serving), stop accepting, let running handlers
    finish (up to
    `shutdown_timeout_s`), close every connection, cleanup hooks. `ssl`: an
    `ssl.SSLContext` to serve HTTPS with."""
    for hook in app.on_startup:
        await hook(app)
    server_state = _Server(
        app,
        idle_s=idle_s,
        head_timeout_s=head_timeout_s,
        body_timeout_s=body_timeout_s,
        max_connections=max_connections,
    )
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _HttpProtocol(server_state), sock=sock, backlog=1024, ssl=ssl
    )
    if app.on_serving is not None:
        app.on_serving(lambda: len(server_state.connections))
    sweeper = loop.create_task(_sweep(server_state))
    try:
        if ready is not None:
            ready()
        await stop.wait()
        for hook in app.on_shutdown:
            await hook(app)
    finally:
        server_state.stopping = True
        server.close()
        sweeper.cancel()
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


async def _sweep(server: _Server) -> None:
    while True:
        await asyncio.sleep(server.sweep_s)
        server.sweep()
