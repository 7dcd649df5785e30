"""One consumer stream to one node (the protocol: zdmq/streaming.py).

`NodeStream.open` connects, upgrades to a WebSocket (wsproto on a plain asyncio
connection, TLS as the client's other calls) and grants the first credit; deliveries
arrive in `deliveries` as lists of `ReceivedMessage`; `grant` gives more credit and
`drain` takes back what the node holds unspent (`credit` is what it holds, as far as
this end knows); `settle` acks, nacks or extends on the same connection and returns
the node's verdict.
A stream that ends (the node stopped, died, or went silent past `silent_s` while it
was pinged) puts None in `deliveries` and fails the settles in flight with
NodeUnavailable: the consumer reopens it, and what was sent on it and not settled comes
back after its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Mapping
from urllib.parse import urlencode, urlsplit

import orjson
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
)

from zdmq.errors import NodeUnavailable, ZdmqError, from_wire
from zdmq.models import ReceivedMessage, decode_batch, received_of_batch
from zdmq.streaming import (
    MESSAGES,
    RETURNED,
    SETTLED,
    credit_frame,
    drain_frame,
    read_frames,
    settle_frame,
    unpack,
)

__all__ = ["NodeStream"]

# A stream pings its node this often, and takes it for gone after this long without a
# byte from it (a node paused or cut off shows no error of its own).
PING_S = 2.0
SILENT_S = 6.0
_READ = 256 * 1024


class NodeStream:
    def __init__(self, node_id: str, queue: str, timeout_s: float = 10.0) -> None:
        self.node_id = node_id
        self.queue = queue
        self.timeout_s = timeout_s  # a settle's wait for its answer
        self.deliveries: asyncio.Queue[list[ReceivedMessage] | None] = asyncio.Queue()
        self.closed = False
        self.close_reason: ZdmqError | None = None  # why the node ended it, if it said
        self._ws = WSConnection(ConnectionType.CLIENT)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._seq = 0
        self._settles: dict[int, asyncio.Future[tuple[int, dict[str, str]]]] = {}
        self._drains: dict[int, asyncio.Future[int]] = {}
        # Credit granted, messages delivered and credit drained back, since the start.
        self.granted = 0
        self.delivered = 0
        self.returned = 0
        self.last_delivery = time.monotonic()  # (or the start)
        self._tasks: list[asyncio.Task[None]] = []
        self._heard = time.monotonic()
        self._partial = bytearray()

    @classmethod
    async def open(
        cls,
        node_id: str,
        url: str,
        queue: str,
        *,
        credit: int,
        visibility_s: float | None = None,
        min_priority: int = 0,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timeout_s: float = 10.0,
    ) -> NodeStream:
        """A stream to the node at `url`, open, holding `credit`. The node's refusal
        raises its typed error (QueueNotFound, Forbidden, ...); no answer, NodeUnavailable."""
        self = cls(node_id, queue, timeout_s)
        try:
            await asyncio.wait_for(
                self._connect(url, credit, visibility_s, min_priority, headers, ssl_context),
                timeout_s,
            )
        except ZdmqError:
            self._abort()
            raise
        except (OSError, TimeoutError, ssl.SSLError) as e:
            self._abort()
            raise NodeUnavailable(f"{node_id}: stream not opened: {e!r}") from None
        self.granted = credit
        self._tasks = [
            asyncio.create_task(self._read_loop(), name=f"zdmq-stream-{node_id}"),
            asyncio.create_task(self._ping_loop(), name=f"zdmq-stream-ping-{node_id}"),
        ]
        return self

    async def _connect(
        self,
        url: str,
        credit: int,
        visibility_s: float | None,
        min_priority: int,
        headers: Mapping[str, str] | None,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if tls else 80)
        if tls and ssl_context is None:
            ssl_context = ssl.create_default_context()
        self._reader, self._writer = await asyncio.open_connection(
            host, port, ssl=ssl_context if tls else None, limit=_READ
        )
        query: dict[str, str | int | float] = {"credit": credit}
        if visibility_s is not None:
            query["visibility_s"] = repr(float(visibility_s))
        if min_priority:
            query["min_priority"] = min_priority
        target = f"/v1/queues/{self.queue}/stream?{urlencode(query)}"
        extra = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
        ]
        self._writer.write(
            self._ws.send(Request(host=parts.netloc, target=target, extra_headers=extra))
        )
        status = 0
        body = bytearray()
        while True:
            data = await self._reader.read(_READ)
            if not data:
                raise NodeUnavailable(f"{self.node_id}: the node closed the stream at its start")
            self._ws.receive_data(data)
            for event in self._ws.events():
                if isinstance(event, AcceptConnection):
                    self._heard = time.monotonic()
                    return
                if isinstance(event, RejectConnection):
                    status = event.status_code
                    if not event.has_body:
                        raise from_wire(status, None)
                elif isinstance(event, RejectData):
                    body += event.data
                    if event.body_finished:
                        try:
                            payload = orjson.loads(body) if body else None
                        except orjson.JSONDecodeError:
                            payload = None
                        raise from_wire(status, payload)

    # ---- use
    @property
    def credit(self) -> int:
        """What the node may still lease to this stream: granted, less what it sent and
        what drains took back (a grant or a batch on the way aside)."""
        return self.granted - self.delivered - self.returned

    def grant(self, n: int) -> None:
        """Lets the node lease `n` more messages to this stream."""
        if n > 0 and not self.closed:
            self.granted += n
            self._send(credit_frame(n))

    async def drain(self) -> int:
        """Takes back the credit the node holds unspent; returns how much. What arrives
        meanwhile was sent with credit the drain did not find. NodeUnavailable if the
        stream ends first."""
        if self.closed:
            raise NodeUnavailable(f"{self.node_id}: the stream is closed")
        self._seq += 1
        seq = self._seq
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._drains[seq] = fut
        try:
            self._send(drain_frame(seq))
            async with asyncio.timeout(self.timeout_s):
                n = await fut
        except TimeoutError:
            raise NodeUnavailable(
                f"{self.node_id}: no answer to a drain on the stream in {self.timeout_s:g} s"
            ) from None
        finally:
            self._drains.pop(seq, None)
        return n

    async def settle(
        self, action: str, receipts: list[str], number: float = 0.0
    ) -> tuple[int, dict[str, str]]:
        """Acks, nacks or extends `receipts` on this stream: (done, failed receipt ->
        code). NodeUnavailable if the stream ends first (the settle may have landed)."""
        if self.closed:
            raise NodeUnavailable(f"{self.node_id}: the stream is closed")
        self._seq += 1
        seq = self._seq
        fut: asyncio.Future[tuple[int, dict[str, str]]] = asyncio.get_running_loop().create_future()
        self._settles[seq] = fut
        try:
            self._send(settle_frame(action, seq, receipts, number))
            async with asyncio.timeout(self.timeout_s):
                return await fut
        except TimeoutError:
            raise NodeUnavailable(
                f"{self.node_id}: no answer to a {action} on the stream in {self.timeout_s:g} s"
            ) from None
        finally:
            self._settles.pop(seq, None)

    async def close(self) -> None:
        """Ends the stream (a close frame, then the connection)."""
        if not self.closed and self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.write(self._ws.send(CloseConnection(code=1000)))
        self._end(None)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- the connection
    def _send(self, frame: bytes) -> None:
        if self.closed or self._writer is None:
            return
        try:
            self._writer.write(self._ws.send(BytesMessage(data=frame)))
        except Exception as e:
            self._end(NodeUnavailable(f"{self.node_id}: stream write failed: {e!r}"))

    async def _read_loop(self) -> None:
        assert self._reader is not None
        reason: ZdmqError | None = None
        try:
            while not self.closed:
                data = await self._reader.read(_READ)
                if not data:
                    break
                self._heard = time.monotonic()
                for item in read_frames(self._ws, data, self._partial, self._writer_write):
                    if isinstance(item, CloseConnection):
                        reason = _close_error(self.node_id, item.code, item.reason)
                        return
                    self._on_frame(item)
        except (OSError, ssl.SSLError) as e:
            reason = NodeUnavailable(f"{self.node_id}: stream read failed: {e!r}")
        except Exception as e:  # a frame that is not the protocol: the stream is useless
            reason = NodeUnavailable(f"{self.node_id}: bad stream frame: {e!r}")
        finally:
            self._end(reason)

    async def _ping_loop(self) -> None:
        while not self.closed:
            await asyncio.sleep(PING_S)
            if time.monotonic() - self._heard > SILENT_S:
                self._end(NodeUnavailable(f"{self.node_id}: silent for {SILENT_S:g} s"))
                return
            with contextlib.suppress(Exception):
                self._writer_write(self._ws.send(Ping()))

    def _writer_write(self, data: bytes) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(data)

    def _on_frame(self, frame: bytes) -> None:
        kind, payload = frame[0], memoryview(frame)[1:]
        if kind == MESSAGES:
            batch = received_of_batch(decode_batch(bytes(payload)))
            self.delivered += len(batch)
            self.last_delivery = time.monotonic()
            self.deliveries.put_nowait(batch)
        elif kind == RETURNED:
            seq, n = unpack(payload)
            self.returned += int(n)
            drained = self._drains.get(seq)
            if drained is not None and not drained.done():
                drained.set_result(int(n))
        elif kind == SETTLED:
            seq, done, failed = unpack(payload)
            fut = self._settles.get(seq)
            if fut is not None and not fut.done():
                fut.set_result((int(done), dict(failed)))
        else:
            raise ValueError(f"unknown frame kind {kind:#x}")

    def _end(self, reason: ZdmqError | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        err = reason or NodeUnavailable(f"{self.node_id}: the stream is closed")
        for fut in self._settles.values():
            if not fut.done():
                fut.set_exception(err)
        for drained in self._drains.values():
            if not drained.done():
                drained.set_exception(err)
        self.deliveries.put_nowait(None)
        self._abort()

    def _abort(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()


def _close_error(node_id: str, code: int | None, reason: str | None) -> ZdmqError | None:
    """The error a node's close frame names (4000 + an HTTP status, `code: message`)."""
    if code is None or code < 4000:
        return None if code in (None, 1000) else NodeUnavailable(f"{node_id}: {reason or code}")
    wire_code, _, message = (reason or "").partition(": ")
    return from_wire(code - 4000, {"error": {"code": wire_code, "message": message or reason}})
