"""One HTTP call with zdmq's error mapping, shared by the client and node-to-node calls.

A connection failure or timeout becomes `NodeUnavailable` (retriable); a non-2xx reply
becomes the typed error its JSON body names. JSON goes through orjson.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDictProxy

from zdmq.errors import NodeUnavailable, from_wire

__all__ = ["JSON_HEADERS", "Reply", "call", "dumps", "loads"]

dumps = orjson.dumps
loads = orjson.loads
JSON_HEADERS = {"Content-Type": "application/json"}


class Reply:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: CIMultiDictProxy[str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return loads(self.body) if self.body else None


async def call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    json: Any = None,
    data: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    params: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> Reply:
    if json is not None:
        data = dumps(json)
        headers = {**JSON_HEADERS, **(headers or {})}
    # Only override the session's timeout when asked: aiohttp reads `timeout=None` as
    # "no timeout at all", which would let a call to a paused node wait forever.
    extra: dict[str, Any] = {}
    if timeout_s is not None:
        extra["timeout"] = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with session.request(
            method, url, data=data, headers=headers, params=params, **extra
        ) as resp:
            body = await resp.read()
            status, resp_headers = resp.status, resp.headers
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        raise NodeUnavailable(f"{method} {url}: {type(e).__name__}: {e}") from None
    if status >= 400:
        try:
            payload = loads(body) if body else None
        except orjson.JSONDecodeError:
            payload = None
        raise from_wire(status, payload)
    return Reply(status, resp_headers, body)
