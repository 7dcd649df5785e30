"""Shared test helpers: waiting on conditions (never fixed sleeps) and unique names."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable


def unique(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def wait_until(
    pred: Callable[[], Awaitable[bool]], *, timeout_s: float = 10.0, what: str = "condition"
) -> None:
    """Polls an async predicate until it holds; fails the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if await pred():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)
