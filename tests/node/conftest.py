"""One node in-process behind its real HTTP server on 127.0.0.1:0.

`serve_node` starts the app of a one-node `durability: fsync` cluster on a data
directory, serves it with zdmq's own HTTP server on a loopback port the kernel picks,
and yields an `aiohttp` client bound to it (an independent HTTP implementation, so
these tests also check the server's HTTP). Leaving the block stops the server and runs
the app's cleanup (storage closed), so a second `serve_node` on the same config is a
restart.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from zdmq.config import ClusterConfig
from zdmq.server.app import make_app
from zdmq.server.http import serve_app


class NodeHttp:
    """`await http.post("/v1/...", data=...)` -> an aiohttp ClientResponse."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def request(self, method: str, path: str | URL, **kw: Any) -> aiohttp.ClientResponse:
        url = URL(self.base + str(path), encoded=isinstance(path, URL))
        return await self.session.request(method, url, **kw)

    async def get(self, path: str | URL, **kw: Any) -> aiohttp.ClientResponse:
        return await self.request("GET", path, **kw)

    async def post(self, path: str | URL, **kw: Any) -> aiohttp.ClientResponse:
        return await self.request("POST", path, **kw)

    async def put(self, path: str | URL, **kw: Any) -> aiohttp.ClientResponse:
        return await self.request("PUT", path, **kw)

    async def delete(self, path: str | URL, **kw: Any) -> aiohttp.ClientResponse:
        return await self.request("DELETE", path, **kw)


async def expect_error(resp: aiohttp.ClientResponse, status: int, code: str) -> str:
    """Asserts an error reply of exactly the documented shape; returns its message."""
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    payload = await resp.json()
    assert list(payload) == ["error"]
    assert sorted(payload["error"]) == ["code", "message"]
    assert payload["error"]["code"] == code
    message = payload["error"]["message"]
    assert isinstance(message, str) and message
    return message


Serve = Callable[[ClusterConfig], AbstractAsyncContextManager[NodeHttp]]


@pytest.fixture
def node_config(tmp_path: Path) -> ClusterConfig:
    return ClusterConfig.from_dict(
        {
            "nodes": [{"id": "n1", "host": "127.0.0.1", "port": 1}],
            "replication": 1,
            "partitions": 16,
            "data_dir": str(tmp_path),
            "durability": "fsync",
            "repair_interval_s": 0.2,
        }
    )


@asynccontextmanager
async def _serve(config: ClusterConfig) -> AsyncIterator[NodeHttp]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    stop = asyncio.Event()
    up = asyncio.Event()
    server = asyncio.create_task(serve_app(make_app(config, "n1"), sock, stop, ready=up.set))
    waiter = asyncio.create_task(up.wait())
    await asyncio.wait([server, waiter], return_when=asyncio.FIRST_COMPLETED)
    if server.done():
        waiter.cancel()
        server.result()  # raises what stopped it
    try:
        async with aiohttp.ClientSession() as session:
            yield NodeHttp(session, f"http://127.0.0.1:{sock.getsockname()[1]}")
    finally:
        stop.set()
        await server
        sock.close()


@pytest.fixture
def serve_node() -> Serve:
    return _serve


@pytest.fixture
async def http(node_config: ClusterConfig) -> AsyncIterator[NodeHttp]:
    async with _serve(node_config) as client:
        yield client
