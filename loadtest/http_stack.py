"""What one small HTTP call costs, by stack: aiohttp vs plain asyncio protocols, both ends.

    .venv/bin/python loadtest/http_stack.py [--n 5000]

A server process (uvloop) answers `POST /q` with a small JSON body; a client (uvloop,
one keep-alive connection) sends 100-byte POSTs one at a time, each waiting for its
reply. Four pairings: aiohttp or a bare asyncio protocol, on each side. This is the
measurement behind zdmq's own HTTP layer (docs/design.md §13): no zdmq code runs here.
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

BODY = b"x" * 100
REPLY = b'{"id":"abc"}'


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


class _BareServer(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.t = transport
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            n = _content_length(bytes(self.buf[:end]))
            if len(self.buf) < end + 4 + n:
                return
            del self.buf[: end + 4 + n]
            self.t.write(
                b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(REPLY) + REPLY
            )


class _BareClient(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.t = transport
        self.buf = bytearray()
        self.waiter: asyncio.Future[bytes] | None = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        n = _content_length(bytes(self.buf[:end]))
        if len(self.buf) >= end + 4 + n:
            body = bytes(self.buf[end + 4 : end + 4 + n])
            del self.buf[: end + 4 + n]
            self.waiter.set_result(body)

    async def post(self, body: bytes) -> bytes:
        self.waiter = asyncio.get_running_loop().create_future()
        self.t.write(
            b"POST /q HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        return await self.waiter


async def _aiohttp_handler(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(status=201, body=REPLY, content_type="application/json")


def _serve(kind: str, sock: socket.socket) -> None:
    async def main() -> None:
        if kind == "aiohttp":
            app = web.Application()
            app.router.add_post("/q", _aiohttp_handler)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.SockSite(runner, sock).start()
        else:
            await asyncio.get_running_loop().create_server(_BareServer, sock=sock)
        await asyncio.Event().wait()

    uvloop.run(main())


async def _client(kind: str, port: int, n: int) -> tuple[float, float]:
    lat = []
    if kind == "aiohttp":
        async with aiohttp.ClientSession() as s:
            for _ in range(n):
                t = time.perf_counter()
                async with s.post(f"http://127.0.0.1:{port}/q", data=BODY) as r:
                    await r.read()
                lat.append(time.perf_counter() - t)
    else:
        transport, proto = await asyncio.get_running_loop().create_connection(
            _BareClient, "127.0.0.1", port
        )
        for _ in range(n):
            t = time.perf_counter()
            await proto.post(BODY)
            lat.append(time.perf_counter() - t)
        transport.close()
    lat.sort()
    return n / sum(lat), lat[len(lat) // 2] * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=5000)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    print("| server | client | calls/s | p50 µs |\n|---|---|---|---|")
    for server_kind in ("aiohttp", "asyncio protocol"):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        port = sock.getsockname()[1]
        proc = ctx.Process(target=_serve, args=(server_kind, sock), daemon=True)
        proc.start()
        try:
            # Wait until it answers (the first call of each pairing also warms up).
            for _ in range(200):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            for client_kind in ("aiohttp", "asyncio protocol"):
                rate, p50 = uvloop.run(_client(client_kind, port, args.n))
                print(f"| {server_kind} | {client_kind} | {rate:,.0f} | {p50:.0f} |")
        finally:
            proc.kill()
            proc.join()
            sock.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
