"""Raw HTTP/1.1 on a socket, for tests that send exact bytes to a real node: what came
back (every reply, framed by Content-Length as a node frames every reply) and whether
the node closed the connection."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from zdmq.local import LocalCluster

Addr = tuple[str, int]


class Reply(NamedTuple):
    status: int
    headers: dict[str, str]
    body: bytes

    def error_code(self) -> str:
        """The code of zdmq's JSON error body (which must have exactly its shape)."""
        assert self.headers.get("content-type") == "application/json", self
        payload: Any = json.loads(self.body)
        assert list(payload) == ["error"] and sorted(payload["error"]) == ["code", "message"]
        code: str = payload["error"]["code"]
        return code


@dataclass
class Exchange:
    replies: list[Reply]
    closed: bool  # the node closed the connection
    seconds: float  # from the first byte sent to the close (or to giving up)


def node_addr(cluster: LocalCluster) -> Addr:
    url = urlsplit(cluster.urls[0])
    assert url.hostname is not None and url.port is not None
    return url.hostname, url.port


@contextmanager
def start_node(directory: Any, **extra: Any) -> Iterator[tuple[LocalCluster, Addr]]:
    """A one-node cluster (a real node process) for a module's tests."""
    c = LocalCluster.ephemeral(directory, nodes=1, **extra)
    try:
        c.start()
        yield c, node_addr(c)
    finally:
        c.close()


def request(
    method: str, target: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> bytes:
    head = f"{method} {target} HTTP/1.1\r\nHost: edge\r\n"
    if body is not None:
        head += f"Content-Length: {len(body)}\r\n"
    for name, value in (headers or {}).items():
        head += f"{name}: {value}\r\n"
    return head.encode("latin-1") + b"\r\n" + (body or b"")


def parse_replies(data: bytes, *, partial: bool = False) -> list[Reply]:
    """Every reply in `data`. `partial`: bytes that are not a whole reply end the list
    (a connection cut mid-reply); otherwise they fail the test."""
    out: list[Reply] = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if partial and not sep:
            break
        assert sep, f"a reply head without its end: {data[:200]!r}"
        status_line, *lines = head.decode("latin-1" if partial else "ascii").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        if partial and len(rest) < length:
            break
        assert len(rest) >= length, f"a reply cut short: {data[:200]!r}"
        out.append(Reply(int(status_line.split()[1]), headers, rest[:length]))
        data = rest[length:]
    return out


def exchange(addr: Addr, raw: bytes, *, wait_s: float = 5.0) -> Exchange:
    """Sends `raw` and reads until the node closes the connection or `wait_s` passes."""
    t0 = time.monotonic()
    got = bytearray()
    closed = False
    with socket.create_connection(addr, timeout=wait_s) as s:
        s.sendall(raw)
        deadline = t0 + wait_s
        while (left := deadline - time.monotonic()) > 0:
            s.settimeout(left)
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            got += chunk
    return Exchange(parse_replies(bytes(got)), closed, time.monotonic() - t0)


def call(addr: Addr, method: str, target: str, body: bytes | None = None) -> Reply:
    """One request on its own connection (`Connection: close`)."""
    ex = exchange(addr, request(method, target, body, {"Connection": "close"}))
    assert ex.closed and len(ex.replies) == 1, ex
    return ex.replies[0]


def new_queue(addr: Addr, name: str) -> str:
    reply = call(addr, "PUT", f"/v1/queues/{name}")
    assert reply.status == 201, reply
    return name


def queue_exists(addr: Addr, name: str) -> bool:
    reply = call(addr, "GET", f"/v1/queues/{name}")
    assert reply.status in (200, 404), reply
    return reply.status == 200
