"""The stream a consumer holds to a node: what goes over it, both ends' shared part.

`GET /v1/queues/{queue}/stream` upgrades to a WebSocket (RFC 6455). Every WebSocket
message is binary: one byte saying what it is, then its payload.

From the consumer:
- `C` credit: msgpack int, how many more messages the node may lease to it. The node
  leases and sends as long as the stream holds credit; each message sent spends one.
- `A` ack, `N` nack, `E` extend: msgpack `[seq, [receipt, ...], number]` (number: a
  nack's delay_s, an extend's visibility_s, 0 for an ack). Receipts may be of messages
  any node stores; the node settles them where they live.
- `D` drain: msgpack `seq`. The node gives back the credit it holds and is not spending
  (a lease under way keeps what it set aside: what it does not spend stays with the
  stream), so the consumer can grant it to a stream that has messages to send.

From the node:
- `M` messages: a batch frame (`application/vnd.zdmq.batch`) of leased messages, with
  ids, bodies, receipts and receive counts, as a receive's reply frame.
- `S` settled: msgpack `[seq, done, {receipt: code}]`, the result of the consumer's
  `seq`-th ack, nack or extend (the failed receipts with the code of why, as REST's).
- `R` returned: msgpack `[seq, n]`, the credit the drain `seq` took back.

The node closes a stream with a code of 4000 + the HTTP status of why (4404: the queue
was deleted, 4400: a bad frame, 4503: the node is stopping) and `code: message` as the
reason; the consumer then reopens it (or stops, for a 4404). Messages sent on a stream
and not settled come back after their lease, as with any receive.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import msgpack
from wsproto.connection import ConnectionState
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage

__all__ = [
    "ACK",
    "CREDIT",
    "DRAIN",
    "EXTEND",
    "MAX_CREDIT",
    "MAX_SETTLE",
    "MESSAGES",
    "NACK",
    "RETURNED",
    "SETTLED",
    "SETTLE_KINDS",
    "close_code",
    "credit_frame",
    "drain_frame",
    "parse_credit",
    "parse_drain",
    "parse_settle",
    "read_frames",
    "returned_frame",
    "settle_frame",
    "settled_frame",
    "unpack",
]

CREDIT = 0x43  # C
ACK = 0x41  # A
NACK = 0x4E  # N
EXTEND = 0x45  # E
MESSAGES = 0x4D  # M
SETTLED = 0x53  # S
DRAIN = 0x44  # D
RETURNED = 0x52  # R
SETTLE_KINDS = {ACK: "ack", NACK: "nack", EXTEND: "extend"}
KIND_OF_ACTION = {v: k for k, v in SETTLE_KINDS.items()}

# The most credit a stream holds at once (what a node may have leased to it, unsettled).
MAX_CREDIT = 10_000
# The most receipts one settle frame carries.
MAX_SETTLE = 1_000


def close_code(status: int) -> int:
    """The WebSocket close code a node ends a stream with for an error of HTTP `status`."""
    return 4000 + status


def credit_frame(n: int) -> bytes:
    return bytes((CREDIT,)) + msgpack.packb(n)


def drain_frame(seq: int) -> bytes:
    return bytes((DRAIN,)) + msgpack.packb(seq)


def returned_frame(seq: int, n: int) -> bytes:
    return bytes((RETURNED,)) + msgpack.packb([seq, n])


def settle_frame(action: str, seq: int, receipts: list[str], number: float = 0.0) -> bytes:
    return bytes((KIND_OF_ACTION[action],)) + msgpack.packb([seq, receipts, number])


def settled_frame(seq: int, done: int, failed: dict[str, str]) -> bytes:
    return bytes((SETTLED,)) + msgpack.packb([seq, done, failed])


def unpack(payload: bytes | memoryview) -> Any:
    """A frame's msgpack payload; ValueError for one that is not."""
    try:
        return msgpack.unpackb(payload, strict_map_key=True)
    except Exception as e:  # msgpack raises several types for bad input
        raise ValueError(f"not msgpack: {e}") from None


def parse_credit(payload: bytes | memoryview) -> int:
    n = unpack(payload)
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_CREDIT:
        raise ValueError(f"credit is an integer in 0..{MAX_CREDIT}")
    return n


def parse_drain(payload: bytes | memoryview) -> int:
    seq = unpack(payload)
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise ValueError("a drain's seq is an integer of 0 or more")
    return seq


def parse_settle(payload: bytes | memoryview) -> tuple[int, list[str], float]:
    """(seq, receipts, number) of an ack, nack or extend frame; ValueError if malformed."""
    v = unpack(payload)
    if not isinstance(v, list) or len(v) != 3:
        raise ValueError("a settle frame is [seq, receipts, number]")
    seq, receipts, number = v
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise ValueError("seq is an integer of 0 or more")
    if not isinstance(receipts, list) or not all(isinstance(r, str) for r in receipts):
        raise ValueError("receipts is a list of strings")
    if len(receipts) > MAX_SETTLE:
        raise ValueError(f"at most {MAX_SETTLE} receipts a frame")
    if not isinstance(number, int | float) or isinstance(number, bool):
        raise ValueError("number is a number")
    return seq, receipts, float(number)


def read_frames(
    ws: Any, data: bytes, partial: bytearray, write: Callable[[bytes], None]
) -> Iterator[bytes | CloseConnection]:
    """Feeds what was read to a wsproto connection; yields each whole binary message
    (`partial` keeps one that is still arriving in fragments) and the peer's close
    (answered already). Pings are answered with `write`; a text message is ValueError."""
    ws.receive_data(data)
    for event in ws.events():
        if isinstance(event, BytesMessage):
            partial += event.data
            if event.message_finished:
                frame = bytes(partial)
                partial.clear()
                yield frame
        elif isinstance(event, Ping):
            write(ws.send(event.response()))
        elif isinstance(event, CloseConnection):
            if ws.state is ConnectionState.REMOTE_CLOSING:
                write(ws.send(event.response()))
            yield event
        elif isinstance(event, TextMessage):
            raise ValueError("a stream's frames are binary")
