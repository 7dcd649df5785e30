"""Fixtures for the cluster suite: an HTTP session for REST calls to any node (HTTPS that
trusts the session's CA when the suite runs over TLS)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

import aiohttp
import pytest


@pytest.fixture
async def http(client_ssl: ssl.SSLContext | None) -> AsyncIterator[aiohttp.ClientSession]:
    # No automatic Content-Type: tests say exactly which one each body carries.
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=client_ssl if client_ssl is not None else True),
        timeout=aiohttp.ClientTimeout(total=30),
        skip_auto_headers=("Content-Type",),
    ) as s:
        yield s
