"""Time limits, the connection cap and back-pressure at a real node, on raw sockets.

Every limit comes from the test's cluster.yaml (`limits:`): a head trickled past
`head_timeout_s` and a body stalled for `body_timeout_s` get 408; over
`max_connections` a connection gets 503 and is closed; a thousand slow heads do not keep
another client waiting; a caller that pipelines thousands of requests and reads no reply
costs the node bounded memory, and the node serves others meanwhile.
"""

from __future__ import annotations

import contextlib
import resource
import selectors
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.edge.raw import (
    Addr,
    Reply,
    call,
    exchange,
    new_queue,
    parse_replies,
    request,
    start_node,
)
from tests.helpers import rss_kib
from zdmq.local import LocalCluster

HEAD_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 20
SLACK_S = 1.0  # the node checks its limits every quarter of the shortest, plus scheduling


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Addr]:
    """A node with short head and body limits and few connections allowed."""
    limits = {
        "head_timeout_s": HEAD_TIMEOUT_S,
        "body_timeout_s": BODY_TIMEOUT_S,
        "max_connections": MAX_CONNECTIONS,
    }
    with start_node(tmp_path_factory.mktemp("timed"), limits=limits) as (_, addr):
        yield addr


@pytest.fixture(scope="module")
def roomy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Addr]]:
    """A node with the default limits (10 s head timeout, 10,000 connections)."""
    with start_node(tmp_path_factory.mktemp("roomy")) as (cluster, addr):
        yield cluster, addr


def _read_until_closed(s: socket.socket, wait_s: float) -> tuple[list[Reply], float]:
    """Reads until the node closes; the replies, and when the close came."""
    got = bytearray()
    deadline = time.monotonic() + wait_s
    while True:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return parse_replies(bytes(got)), time.monotonic()
        got += chunk


def test_a_trickled_head_gets_408_within_the_head_timeout(timed: Addr) -> None:
    head = b"GET /v1/health HTTP/1.1\r\nHost: edge\r\nX-Slow: " + b"a" * 200
    with socket.create_connection(timed) as s:
        t0 = time.monotonic()
        s.setblocking(False)
        sent = 0
        # One byte every 50 ms: the connection is never idle, the head never whole.
        while time.monotonic() - t0 < HEAD_TIMEOUT_S + SLACK_S and sent < len(head):
            try:
                s.send(head[sent : sent + 1])
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 1
            time.sleep(0.05)
        s.setblocking(True)
        replies, closed_at = _read_until_closed(s, SLACK_S)
    assert [r.status for r in replies] == [408], replies
    assert replies[0].error_code() == "request_timeout"
    assert HEAD_TIMEOUT_S * 0.9 <= closed_at - t0 <= HEAD_TIMEOUT_S + SLACK_S


def test_a_body_stalled_midway_gets_408(timed: Addr) -> None:
    q = new_queue(timed, "stalled-body")
    with socket.create_connection(timed) as s:
        s.sendall(request("POST", f"/v1/queues/{q}/messages", b"x" * 100)[:-90])  # 10 of 100
        t0 = time.monotonic()
        replies, closed_at = _read_until_closed(s, BODY_TIMEOUT_S + SLACK_S + 1)
    assert [r.status for r in replies] == [408], replies
    assert replies[0].error_code() == "request_timeout"
    assert BODY_TIMEOUT_S * 0.9 <= closed_at - t0 <= BODY_TIMEOUT_S + SLACK_S
    assert call(timed, "POST", f"/v1/queues/{q}/pop").status == 204  # nothing was stored


def test_a_body_that_keeps_coming_is_not_cut(timed: Addr) -> None:
    q = new_queue(timed, "slow-body")
    body = b"y" * 40
    raw = request("POST", f"/v1/queues/{q}/messages", body, {"Connection": "close"})
    head_len = len(raw) - len(body)
    with socket.create_connection(timed) as s:
        s.sendall(raw[:head_len])
        for i in range(len(body)):  # 40 bytes, 50 ms apart: 2 s in all, never 1 s silent
            s.sendall(raw[head_len + i : head_len + i + 1])
            time.sleep(0.05)
        replies, _ = _read_until_closed(s, 5)
    assert [r.status for r in replies] == [201], replies


def test_connections_over_max_connections_get_503_and_close(timed: Addr) -> None:
    held: list[socket.socket] = []
    try:
        # Each held connection is answered once, so the node has surely counted it.
        for _ in range(MAX_CONNECTIONS):
            s = socket.create_connection(timed, timeout=5)
            held.append(s)
            s.sendall(request("GET", "/v1/health"))
            assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
        ex = exchange(timed, request("GET", "/v1/health"))
        assert ex.closed and [r.status for r in ex.replies] == [503], ex
        assert ex.replies[0].error_code() == "node_unavailable"
        assert ex.replies[0].headers.get("connection") == "close"
        # One connection fewer: a new one is served again.
        held.pop().close()
        deadline = time.monotonic() + 5
        while True:
            ex = exchange(timed, request("GET", "/v1/health", headers={"Connection": "close"}))
            if [r.status for r in ex.replies] == [200] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert [r.status for r in ex.replies] == [200], ex
    finally:
        for s in held:
            s.close()


def _fd_soft_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files line")


def test_the_node_raises_its_open_file_limit_for_its_connections(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 10_000 + 1024  # the default max_connections and the node's own files
    expected = want if hard == resource.RLIM_INFINITY else min(hard, want)
    if expected <= 1024:
        pytest.skip(f"the hard open-file limit {hard} leaves nothing to raise")
    # The node starts with a low soft limit (inherited from this process) ...
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        with start_node(tmp_path) as (cluster, _):
            pid = cluster.nodes["n1"].pid
            assert pid is not None
            # ... and raises it for its connections.
            assert _fd_soft_limit(pid) >= expected
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def many_fds() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 1500
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the hard open-file limit {hard} is below {need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_thousand_slow_heads_do_not_keep_another_client_waiting(
    roomy: tuple[LocalCluster, Addr], many_fds: None
) -> None:
    _, addr = roomy
    slow: list[socket.socket] = []
    try:
        for _ in range(1000):
            s = socket.create_connection(addr, timeout=5)
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: ed")  # and never the rest
            slow.append(s)
        t0 = time.monotonic()
        reply = call(addr, "GET", "/v1/health")
        assert reply.status == 200
        assert time.monotonic() - t0 < 1.0
    finally:
        for s in slow:
            s.close()


def test_pipelined_requests_whose_replies_are_not_read_cost_bounded_memory(
    roomy: tuple[LocalCluster, Addr],
) -> None:
    """3,000 pipelined requests for the 39 KB OpenAPI document (about 115 MB of replies)
    on a socket that reads none: the node stops reading and handling them while its
    replies do not drain, so it holds a bounded part of them, not all."""
    cluster, addr = roomy
    pid = cluster.nodes["n1"].pid
    assert pid is not None
    n = 3000
    one = request("GET", "/v1/openapi.yaml")
    before = rss_kib(pid)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(addr)
        s.setblocking(False)
        pending = memoryview(one * n)
        peak = before
        deadline = time.monotonic() + 8
        # Send what the node reads, never reading a reply; watch its memory meanwhile.
        while time.monotonic() < deadline:
            try:
                sent = s.send(pending[:65536])
                pending = pending[sent:]
            except BlockingIOError:
                time.sleep(0.01)
            peak = max(peak, rss_kib(pid))
            if not pending:
                break
        time.sleep(0.5)  # let the node take what it will
        peak = max(peak, rss_kib(pid))
        assert (peak - before) < 100 * 1024, f"RSS grew by {(peak - before) // 1024} MiB"
        # Another client is served meanwhile.
        assert call(addr, "GET", "/v1/health").status == 200
        # And every reply comes, in order, once this caller reads (and sends the rest).
        size = len(call(addr, "GET", "/v1/openapi.yaml").body)
        got = 0
        buf = bytearray()
        sel = selectors.DefaultSelector()
        sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
        deadline = time.monotonic() + 20
        while got < n and time.monotonic() < deadline:
            for _, events in sel.select(timeout=1):
                if events & selectors.EVENT_WRITE and pending:
                    with contextlib.suppress(BlockingIOError):
                        pending = pending[s.send(pending[:65536]) :]
                    if not pending:
                        sel.modify(s, selectors.EVENT_READ)
                if events & selectors.EVENT_READ:
                    chunk = s.recv(1 << 20)
                    assert chunk, f"closed after {got} replies"
                    buf += chunk
            while True:
                end = buf.find(b"\r\n\r\n")
                if end < 0 or len(buf) < end + 4 + size:
                    break
                assert buf.startswith(b"HTTP/1.1 200 ")
                del buf[: end + 4 + size]
                got += 1
            peak = max(peak, rss_kib(pid))
        sel.close()
    assert got == n
    print(f"node RSS grew by {(peak - before) / 1024:.1f} MiB at most")
    assert (peak - before) < 100 * 1024, f"RSS grew by {(peak - before) // 1024} MiB"
