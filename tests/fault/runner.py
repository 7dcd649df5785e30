"""One fault run: the workload and a nemesis together for a bounded time, then heal, drain
and check."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from tests.fault.checker import Report, check
from tests.fault.workload import Workload


async def run(
    workload: Workload,
    nemesis: Callable[[], Awaitable[None]],
    *,
    duration_s: float,
    heal: Callable[[], Awaitable[None]],
    drain_timeout_s: float = 30.0,
    history_path: Path | None = None,
) -> Report:
    """Creates the queue, runs `nemesis()` while the workload runs for `duration_s`, then
    `heal()`s, drains and checks. The history is written to `history_path` if given."""
    h = workload.history
    await workload.create_queue()
    started = time.monotonic()
    try:
        await asyncio.gather(workload.run(duration_s), nemesis())
    finally:
        await heal()
    h.note(
        "nemesis", "nemesis", {"fault": "healed", "after_s": round(time.monotonic() - started, 1)}
    )
    try:
        await workload.drain(drain_timeout_s)
    finally:
        if history_path is not None:
            h.dump(history_path)
    return check(h)
