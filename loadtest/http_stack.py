"""What one small HTTP call costs, by stack: aiohttp, bare asyncio protocols and zdmq's own.

    .venv/bin/python loadtest/http_stack.py [--n 5000] [--runs 1]
        [--servers aiohttp bare zdmq] [--clients aiohttp bare zdmq]

A server process (uvloop) answers `POST /v1/queues/q/messages` with a small JSON body
(201); a client (uvloop, one keep-alive connection, in this process) sends 100-byte POSTs
one at a time, each waiting for its reply. Every pairing of the chosen servers and
clients runs; each row gives calls/s, p50, and the CPU per call of each end (the
server's from /proc, the client's from `time.process_time`).

- `aiohttp`: aiohttp's server and `ClientSession`;
- `bare`: an asyncio protocol that frames by Content-Length and nothing else, the floor;
- `zdmq`: zdmq's own stack, `zdmq.server.http.serve_app` with one route whose handler
  reads `request.match_info` and a header, and the `zdmq._http.call` the client uses,
  with the same headers `Client.push` sends. No storage, no node state.

This is the measurement behind zdmq's own HTTP layer (docs/design.md §13). Runs against
whichever zdmq is first on the import path (`PYTHONPATH=/other/tree` compares a checkout).
Needs aiohttp (the dev extra).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import socket
import time
from typing import Any

import aiohttp
import uvloop
from aiohttp import web

from zdmq import _http
from zdmq.bench.workloads import cpu_seconds
from zdmq.server.http import App, Request, Response, json_response, serve_app

BODY = b"x" * 100
REPLY = b'{"id":"0b8d6a5e-4b1f-4a29-9a57-1c2f3e4d5a6b","duplicate":false}'
PATH = "/v1/queues/q/messages"
KINDS = ("aiohttp", "bare", "zdmq")
# What Client.push sends besides the body.
PUSH_HEADERS = {
    "Content-Type": "application/octet-stream",
    "zdmq-id": "0b8d6a5e-4b1f-4a29-9a57-1c2f3e4d5a6b",
}


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


class _BareServer(asyncio.Protocol):
    """Frames requests by Content-Length and answers each 201 with REPLY."""

    def connection_made(self, transport: Any) -> None:
        self.t = transport
        self.buf = bytearray()

    def handle(self, body: bytes) -> None:
        """What the server does with a request's body before it replies: nothing here."""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            n = _content_length(bytes(self.buf[:end]))
            if len(self.buf) < end + 4 + n:
                return
            body = bytes(self.buf[end + 4 : end + 4 + n])
            del self.buf[: end + 4 + n]
            self.handle(body)
            self.t.write(
                b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(REPLY) + REPLY
            )


class _BareClient(asyncio.Protocol):
    """Frames replies by Content-Length; one call at a time, whose waiter gets the body."""

    def connection_made(self, transport: Any) -> None:
        self.t = transport
        self.buf = bytearray()
        self.waiter: asyncio.Future[bytes] | None = None

    def check(self, head: bytes) -> None:
        """Looks at a reply's head before its waiter gets the body: nothing here."""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        head = bytes(self.buf[:end])
        n = _content_length(head)
        if len(self.buf) >= end + 4 + n:
            self.check(head)
            body = bytes(self.buf[end + 4 : end + 4 + n])
            del self.buf[: end + 4 + n]
            self.waiter.set_result(body)

    async def post(self, body: bytes) -> bytes:
        self.waiter = asyncio.get_running_loop().create_future()
        self.t.write(
            b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
            % (PATH.encode(), len(body))
            + body
        )
        return await self.waiter


async def _aiohttp_handler(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(status=201, body=REPLY, content_type="application/json")


async def _zdmq_handler(request: Request) -> Response:
    body = await request.read()
    request.headers.get("zdmq-id")
    return json_response({"id": request.match_info["queue"], "size": len(body)}, 201)


def _serve(kind: str, sock: socket.socket) -> None:
    async def main() -> None:
        if kind == "aiohttp":
            app = web.Application()
            app.router.add_post(PATH, _aiohttp_handler)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.SockSite(runner, sock).start()
        elif kind == "zdmq":
            zapp = App(max_body=1 << 20)
            zapp.route("POST", "/v1/queues/{queue}/messages", _zdmq_handler)
            sock.setblocking(False)
            await serve_app(zapp, sock, asyncio.Event())
        else:
            await asyncio.get_running_loop().create_server(_BareServer, sock=sock)
        await asyncio.Event().wait()

    uvloop.run(main())


async def _client(kind: str, port: int, n: int) -> list[float]:
    lat = []
    url = f"http://127.0.0.1:{port}{PATH}"
    if kind == "aiohttp":
        async with aiohttp.ClientSession() as s:
            for _ in range(n):
                t = time.perf_counter()
                async with s.post(url, data=BODY, headers=PUSH_HEADERS) as r:
                    await r.read()
                lat.append(time.perf_counter() - t)
    elif kind == "zdmq":
        pool = _http.HttpPool()
        try:
            for _ in range(n):
                t = time.perf_counter()
                await _http.call(pool, "POST", url, data=BODY, headers=PUSH_HEADERS)
                lat.append(time.perf_counter() - t)
        finally:
            await pool.close()
    else:
        transport, proto = await asyncio.get_running_loop().create_connection(
            _BareClient, "127.0.0.1", port
        )
        for _ in range(n):
            t = time.perf_counter()
            await proto.post(BODY)
            lat.append(time.perf_counter() - t)
        transport.close()
    return lat


def _measure(client_kind: str, port: int, pid: int, n: int) -> tuple[float, float, float, float]:
    uvloop.run(_client(client_kind, port, min(n, 500)))  # warm up
    c0, s0 = time.process_time(), cpu_seconds([pid])
    lat = uvloop.run(_client(client_kind, port, n))
    c1, s1 = time.process_time(), cpu_seconds([pid])
    lat.sort()
    return n / sum(lat), lat[len(lat) // 2] * 1e6, (s1 - s0) / n * 1e6, (c1 - c0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=1, help="rows per pairing (interleaved)")
    ap.add_argument("--servers", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--clients", nargs="+", choices=KINDS, default=list(KINDS))
    args = ap.parse_args()
    if not 1 <= args.n <= 1_000_000 or not 1 <= args.runs <= 50:
        raise SystemExit("--n must be in 1..1,000,000 and --runs in 1..50")
    ctx = mp.get_context("spawn")
    print("| server | client | calls/s | p50 µs | server CPU µs/call | client CPU µs/call |")
    print("|---|---|---|---|---|---|")
    servers = []
    try:
        for server_kind in args.servers:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(128)
            port = sock.getsockname()[1]
            proc = ctx.Process(target=_serve, args=(server_kind, sock), daemon=True)
            proc.start()
            servers.append((server_kind, port, proc, sock))
            # Wait until it answers; each pairing also warms up before it is timed.
            for _ in range(200):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                    break
                except OSError:
                    time.sleep(0.05)
        for _ in range(args.runs):
            for server_kind, port, proc, _sock in servers:
                assert proc.pid is not None
                for client_kind in args.clients:
                    rate, p50, srv, cli = _measure(client_kind, port, proc.pid, args.n)
                    print(
                        f"| {server_kind} | {client_kind} | {rate:,.0f} | {p50:.0f} "
                        f"| {srv:.1f} | {cli:.1f} |",
                        flush=True,
                    )
    finally:
        for _, _, proc, sock in servers:
            proc.kill()
            proc.join()
            sock.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
