"""`GET /v1/queues/{queue}/stream`: a consumer's stream to this node (zdmq/streaming.py).

A stream delivers the messages of the replica groups this node leads (with one copy:
the node's own UUID queue), as soon as they are ready and while the consumer has granted
credit. A push that comes while a stream waits on its queue leases for the stream in the
push's own command (`PushTake`), so its messages go out once that one command commits;
otherwise a push wakes the streams, which lease up to their credit in one command per
group and write them in one frame. A consumer holds a stream to every node, so every
group's leader delivers its own messages with no ready notice, no metadata list and no
second call in between. Leadership that moves is
followed: a stream delivers from the groups its node leads at each look.

Acks, nacks and extensions come back on the same stream, batched by the consumer, and
are settled where their messages live (here, or with one call to their group's leader).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection
from wsproto.utilities import generate_accept_token

from zdmq.errors import BadRequest, NotLeader, QueueNotFound, UpgradeRequired, ZdmqError
from zdmq.models import (
    MAX_DELAY_S,
    MAX_PRIORITY,
    MAX_RECEIVE,
    MAX_VISIBILITY_S,
    encode_batch,
    group_receipts,
)
from zdmq.server.http import Request, Response, Upgrade
from zdmq.server.node import Delivery, Node
from zdmq.server.replicas import Member
from zdmq.server.routes.common import MEMBER, NODE, _float_param, _int_param, _queue
from zdmq.server.routes.queues import _settle_receipts
from zdmq.streaming import (
    CREDIT,
    DRAIN,
    EXTEND,
    MAX_CREDIT,
    MESSAGES,
    NACK,
    SETTLE_KINDS,
    close_code,
    parse_credit,
    parse_drain,
    parse_settle,
    read_frames,
    returned_frame,
    settled_frame,
)

__all__ = ["STREAMS", "close_streams", "stream"]

log = logging.getLogger("zdmq.stream")

# The app key of the open streams (closed when the node stops).
STREAMS = "streams"
# How often a stream with credit and nothing to send looks again at which groups this
# node leads (a wake-up on a push comes at once; this bounds a leadership change's).
_LOOK_S = 0.5
_WS_VERSION = "13"


def _leading(request: Request) -> Callable[[], list[Node]]:
    member: Member | None = request.app[MEMBER]
    if member is None:
        node: Node = request.app[NODE]
        return lambda: [node]
    return lambda: [n for n in member.nodes.values() if n.leading]


def _any_node(request: Request) -> Node:
    member: Member | None = request.app[MEMBER]
    if member is None:
        node: Node = request.app[NODE]
        return node
    own = member.nodes.get(member.id)
    return own if own is not None else next(iter(member.nodes.values()))


async def stream(request: Request) -> Response:
    queue = _queue(request)
    # The parameters first: a call the document refuses is a 400, upgrade or not.
    credit = _int_param(request, "credit", 0, 0, MAX_CREDIT)
    lease_s = _float_param(request, "visibility_s", 0.0, MAX_VISIBILITY_S)
    min_priority = _int_param(request, "min_priority", 0, 0, MAX_PRIORITY)
    headers = request.headers
    key = headers.get("sec-websocket-key")
    if (
        headers.get("upgrade", "").lower() != "websocket"
        or "upgrade" not in headers.get("connection", "").lower()
        or key is None
    ):
        raise UpgradeRequired(
            "a stream is a WebSocket: send Connection: Upgrade, Upgrade: websocket, "
            "Sec-WebSocket-Key and Sec-WebSocket-Version: 13"
        )
    if headers.get("sec-websocket-version") != _WS_VERSION:
        raise BadRequest(f"Sec-WebSocket-Version: only {_WS_VERSION} is spoken")
    anchor = _any_node(request)
    await anchor.queue_settings(queue)  # QueueNotFound (404) before the upgrade
    streams: set[StreamSession] = request.app[STREAMS]

    def take_over(transport: asyncio.Transport) -> asyncio.Protocol:
        session = StreamSession(
            queue, _leading(request), anchor, credit, lease_s, min_priority, streams
        )
        streams.add(session)
        return session

    accept = generate_accept_token(key.encode("latin-1")).decode("ascii")
    return Upgrade(
        take_over,
        {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Accept": accept},
    )


async def close_streams(streams: set[StreamSession]) -> None:
    """Ends every open stream (the node is stopping): their consumers reopen elsewhere."""
    for s in list(streams):
        s.close(close_code(503), "node_unavailable: the node is stopping")
    await asyncio.gather(*(s.finished() for s in list(streams)), return_exceptions=True)


class StreamSession(asyncio.Protocol):
    """One consumer's stream: the WebSocket framing (wsproto), the credit it holds, the
    task that leases and sends, and the settles it runs."""

    def __init__(
        self,
        queue: str,
        leading: Callable[[], list[Node]],
        anchor: Node,
        credit: int,
        lease_s: float | None,
        min_priority: int,
        streams: set[StreamSession],
    ) -> None:
        self.queue = queue
        self._leading = leading
        self._anchor = anchor  # settles receipts of groups this node does not lead
        self.credit = credit
        self.lease_s = lease_s
        self.min_priority = min_priority
        self._streams = streams
        self._ws = Connection(ConnectionType.SERVER)
        self._transport: asyncio.Transport | None = None
        self._partial = bytearray()  # a binary message still arriving in fragments
        self._wake = asyncio.Event()  # credit came, or the stream ends
        self._task: asyncio.Task[None] | None = None
        self._settles: set[asyncio.Task[None]] = set()
        self.closed = False
        self.sent = 0
        # Clear while the consumer does not read what was written (the transport's buffer
        # is over its high mark): nothing more is leased until it drains.
        self._writable = asyncio.Event()
        self._writable.set()

    # ---- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self._task = asyncio.get_running_loop().create_task(self._deliver())

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._end()

    def data_received(self, data: bytes) -> None:
        try:
            for item in read_frames(self._ws, data, self._partial, self._write):
                if isinstance(item, CloseConnection):
                    self._hang_up()
                    return
                self._on_frame(item)
        except BadRequest as e:
            self.close(close_code(400), f"{e.code}: {e}")
        except Exception as e:  # wsproto's protocol errors, a text frame: a bad WebSocket
            self.close(close_code(400), f"bad_request: {e}")

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def eof_received(self) -> bool | None:
        self._end()
        return None

    # ---- frames from the consumer
    def _on_frame(self, frame: bytes) -> None:
        if not frame:
            raise BadRequest("an empty frame")
        kind, payload = frame[0], memoryview(frame)[1:]
        try:
            if kind == CREDIT:
                self.credit = min(MAX_CREDIT, self.credit + parse_credit(payload))
                self._wake.set()
                return
            if kind == DRAIN:
                seq = parse_drain(payload)
                returned, self.credit = self.credit, 0
                self._send(returned_frame(seq, returned))
                return
            action = SETTLE_KINDS.get(kind)
            if action is None:
                raise BadRequest(f"unknown frame kind {kind:#x}")
            seq, receipts, number = parse_settle(payload)
        except ValueError as e:
            raise BadRequest(f"bad frame: {e}") from None
        if kind == NACK and not 0 <= number <= MAX_DELAY_S:
            raise BadRequest(f"a nack's delay_s is in 0..{MAX_DELAY_S:g}")
        if kind == EXTEND and not 0 < number <= MAX_VISIBILITY_S:
            raise BadRequest(f"an extend's visibility_s is in (0, {MAX_VISIBILITY_S:g}]")
        task = asyncio.get_running_loop().create_task(self._settle(seq, action, receipts, number))
        self._settles.add(task)
        task.add_done_callback(self._settles.discard)

    async def _settle(self, seq: int, action: str, receipts: list[str], number: float) -> None:
        try:
            done, failed = await self.settle(action, receipts, number)
        except Exception:  # every settle is answered, whatever happened
            log.exception("a stream's %s of %d receipt(s) failed", action, len(receipts))
            done, failed = 0, dict.fromkeys(receipts, "internal")
        self._send(settled_frame(seq, done, failed))

    async def settle(
        self, action: str, receipts: list[str], number: float = 0.0
    ) -> tuple[int, dict[str, str]]:
        """Settles receipts where their messages live: with the group's node here when
        this node leads it, else through one call to its leader."""
        anchor = self._anchor
        by_owner, failed = group_receipts(receipts, anchor.placement.owner)
        led = {n.id: n for n in self._leading()}
        delay_s = number if action == "nack" else 0.0
        visibility_s = number if action == "extend" else 0.0

        async def on(owner: str, part: list[str]) -> int:
            try:
                done, why = await _settle_receipts(
                    led.get(owner, anchor),
                    self.queue,
                    action,
                    part,
                    delay_s=delay_s,
                    visibility_s=visibility_s,
                )
            except ZdmqError as e:
                failed.update((r, e.code) for r in part)
                return 0
            failed.update(why)
            return done

        parts = [(o, [r for r, _, _ in refs]) for o, refs in by_owner.items()]
        done = await asyncio.gather(*(on(o, p) for o, p in parts))
        return sum(done), failed

    # ---- delivery
    async def _deliver(self) -> None:
        queue = self.queue
        try:
            while not self.closed:
                if self.credit <= 0:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if not self._writable.is_set():
                    await self._writable.wait()
                    continue
                nodes = self._leading()
                seen = [n.local_version[queue] for n in nodes]
                got: list[Delivery] = []
                for node in nodes:
                    # Set aside while the take runs (a drain leaves it alone), and what
                    # the take does not spend goes back.
                    want = self.reserve(MAX_RECEIVE)
                    if want <= 0:
                        break
                    part: list[Delivery] = []
                    try:
                        part = await node.take_local(
                            queue,
                            want,
                            lease_s=self.lease_s,
                            receive=True,
                            min_priority=self.min_priority,
                        )
                    except NotLeader:
                        continue
                    finally:
                        self.credit += want - len(part)
                    got += part
                if got:
                    if self.closed:  # the consumer left while they were leased
                        await self._release(got)
                        return
                    self.sent += len(got)
                    self._send(bytes((MESSAGES,)) + _frame(got))
                    continue
                if any(n.local_version[queue] != v for n, v in zip(nodes, seen, strict=True)):
                    continue  # pushed while it looked: look again
                self._wake.clear()
                waits = [asyncio.ensure_future(n.local_event(queue).wait()) for n in nodes]
                waits.append(asyncio.ensure_future(self._wake.wait()))
                for n in nodes:  # a push here leases for this stream in its own command
                    n.takers[queue].append(self)
                try:
                    await asyncio.wait(waits, timeout=_LOOK_S, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
                    for n in nodes:
                        with contextlib.suppress(ValueError):
                            n.takers[queue].remove(self)
        except QueueNotFound as e:
            self.close(close_code(e.status), f"{e.code}: {e}")
        except ZdmqError as e:
            self.close(close_code(e.status), f"{e.code}: {e}")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # never leave a consumer waiting on a dead stream
            log.exception("stream of %s failed", queue)
            self.close(close_code(500), f"internal_error: {e!r}")

    # ---- a push's lease for this stream (Node.push_local: the Taker protocol)
    def reserve(self, most: int) -> int:
        if self.closed or not self._writable.is_set():
            return 0
        n = max(0, min(most, self.credit))
        self.credit -= n
        return n

    def hand(self, got: list[Delivery], reserved: int) -> None:
        self.credit += reserved - len(got)
        if not got:
            return
        if self.closed:  # the consumer left while they were leased
            task = asyncio.get_running_loop().create_task(self._release(got))
            self._settles.add(task)
            task.add_done_callback(self._settles.discard)
            return
        self.sent += len(got)
        self._send(bytes((MESSAGES,)) + _frame(got))

    async def _release(self, got: list[Delivery]) -> None:
        receipts = [d.receipt for d in got if d.receipt is not None]
        with contextlib.suppress(ZdmqError):
            await self.settle("nack", receipts)

    # ---- the connection
    def _send(self, frame: bytes) -> None:
        if self._ws.state is ConnectionState.OPEN:
            self._write(self._ws.send(BytesMessage(data=frame)))

    def _write(self, data: bytes) -> None:
        t = self._transport
        if t is not None and not t.is_closing():
            t.write(data)

    def close(self, code: int, reason: str) -> None:
        """Ends the stream with a close frame of `code` and `reason` (cut to 123 bytes)."""
        if self._ws.state is ConnectionState.OPEN:
            reason_bytes = reason.encode("utf-8")[:123]
            text = reason_bytes.decode("utf-8", "ignore")
            self._write(self._ws.send(CloseConnection(code=code, reason=text)))
        self._hang_up()

    def _hang_up(self) -> None:
        t = self._transport
        if t is not None and not t.is_closing():
            t.close()
        self._end()

    def _end(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._wake.set()
        self._writable.set()
        self._streams.discard(self)

    async def finished(self) -> None:
        """Returns once the delivery task has ended (a lease in flight released)."""
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(self._task), 5.0)


def _frame(got: list[Delivery]) -> bytes:
    ids, bodies, ctypes, receipts, counts, attrs, prios, groups = zip(*got, strict=True)
    return encode_batch(
        ids=ids,
        bodies=bodies,
        content_types=ctypes,
        receipts=receipts,
        receive_counts=counts,
        attributes=attrs,
        priorities=prios,
        groups=groups,
    )
