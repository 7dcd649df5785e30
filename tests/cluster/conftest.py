"""Fixtures for the cluster suite: a plain HTTP session for REST calls to any node."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    # No automatic Content-Type: tests say exactly which one each body carries.
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=30), skip_auto_headers=("Content-Type",)
    ) as s:
        yield s
