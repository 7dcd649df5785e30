"""Workloads: client processes that drive a `Driver`, timed and measured from outside.

Every client is its own process (spawned, so each runs its own uvloop event loop and
the clients spread over the cores as a real deployment's would). A phase runs like this:

    coordinator                         each client process
    spawn N clients        ------->     open the driver, say "ready"
    snapshot server CPU    <-------
    "go"                   ------->     run the phase function, report its numbers
    snapshot server CPU    <-------     close

so a phase's rate counts only the work itself, and the server CPU beside it counts
only what the servers did while the phase ran (their /proc utime + stime).

Bodies are unique and carry their send time: 8 bytes of CLOCK_MONOTONIC (shared by all
processes on this host), then the client's number and a counter, padded to the size.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import statistics
import struct
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as MpEvent
from typing import Any, TypeVar

from zdmq.bench.driver import Driver, SystemSpec, open_driver

__all__ = [
    "PhaseResult",
    "cpu_seconds",
    "make_body",
    "percentile",
    "reset_queue",
    "run_phase",
    "run_uvloop",
    "sent_at",
]

_HEAD = struct.Struct("<qII")  # send time (ns), client number, counter
T = TypeVar("T")
_CTX = mp.get_context("spawn")
_CLK = os.sysconf("SC_CLK_TCK")


def make_body(size: int, client: int, counter: int) -> bytes:
    head = _HEAD.pack(time.monotonic_ns(), client, counter)
    return head + b"x" * (size - len(head)) if size > len(head) else head


def sent_at(body: bytes) -> float:
    """The CLOCK_MONOTONIC second at which `make_body` made this body."""
    return _HEAD.unpack_from(body)[0] / 1e9


def body_key(body: bytes) -> tuple[int, int]:
    _, client, counter = _HEAD.unpack_from(body)
    return client, counter


def cpu_seconds(pids: tuple[int, ...] | list[int]) -> float:
    """User + system CPU seconds used so far by these processes and their reaped children
    (0 for a pid that is gone)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # after the ")" : state is field 0; utime, stime, cutime, cstime are 11..14
        total += sum(int(x) for x in fields[11:15])
    return total / _CLK


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


# ---- the phase functions, run inside a client process --------------------------------------
# Each takes (driver, client_number, shared, **params) and returns a dict of numbers;
# "t0"/"t1" (monotonic seconds) bound its own work, "lat" holds latencies in seconds.


async def push_seq(d: Driver, me: int, shared: Any, *, n: int, size: int) -> dict[str, Any]:
    lat: list[float] = []
    t0 = time.monotonic()
    for i in range(n):
        t = time.perf_counter()
        await d.push(make_body(size, me, i))
        lat.append(time.perf_counter() - t)
    return {"t0": t0, "t1": time.monotonic(), "msgs": n, "lat": lat}


async def recv_ack_seq(
    d: Driver, me: int, shared: Any, *, n: int, timeout_s: float
) -> dict[str, Any]:
    """Receives one and acks it, n times (each pair timed), sharing the queue with peers."""
    lat: list[float] = []
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    while len(lat) < n and time.monotonic() < deadline:
        t = time.perf_counter()
        got = await d.receive(1, wait_s=0.5)
        if not got:
            continue
        await d.ack([tok for _, tok in got])
        lat.append(time.perf_counter() - t)
    await d.settle()
    return {"t0": t0, "t1": time.monotonic(), "msgs": len(lat), "lat": lat}


async def produce_batched(
    d: Driver, me: int, shared: Any, *, n: int, size: int, batch: int, inflight: int
) -> dict[str, Any]:
    """Pushes n messages in batches, `inflight` batches at a time."""
    counter = iter(range(0, n, batch))

    async def worker() -> None:
        for start in counter:
            k = min(batch, n - start)
            await d.push_batch([make_body(size, me, start + j) for j in range(k)])

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    return {"t0": t0, "t1": time.monotonic(), "msgs": n}


async def consume_batched(
    d: Driver, me: int, shared: Any, *, total: int, batch: int, inflight: int, timeout_s: float
) -> dict[str, Any]:
    """Receives + acks in batches until all consumers together have taken `total`."""
    taken = shared["taken"]
    mine = 0
    last = time.monotonic()
    lat: list[float] = []
    t0 = time.monotonic()
    deadline = t0 + timeout_s

    async def worker() -> None:
        nonlocal mine, last
        while taken.value < total and time.monotonic() < deadline:
            got = await d.receive(batch, wait_s=0.2)
            if not got:
                continue
            await d.ack([tok for _, tok in got])
            now = time.monotonic()
            lat.extend(now - sent_at(b) for b, _ in got)
            with taken.get_lock():
                taken.value += len(got)
            mine += len(got)
            last = now

    await asyncio.gather(*(worker() for _ in range(inflight)))
    return {"t0": t0, "t1": last, "msgs": mine, "lat": lat}


async def produce_paced(
    d: Driver, me: int, shared: Any, *, rate: float, n: int, size: int
) -> dict[str, Any]:
    """Pushes n messages at a fixed rate, one push per tick (a slow confirm does not
    hold back the next tick: each push runs as its own task)."""
    loop = asyncio.get_running_loop()
    tasks = []
    t0 = time.monotonic()
    for i in range(n):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(loop.create_task(d.push(make_body(size, me, i))))
    await asyncio.gather(*tasks)
    return {"t0": t0, "t1": time.monotonic(), "msgs": n}


async def consume_latency(
    d: Driver, me: int, shared: Any, *, total: int, batch: int, timeout_s: float
) -> dict[str, Any]:
    """Push-to-delivery latency: the moment a message is in the consumer's hands minus
    the moment its producer made it."""
    lat: list[float] = []
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    while len(lat) < total and time.monotonic() < deadline:
        got = await d.receive(batch, wait_s=1.0)
        now = time.monotonic()
        lat.extend(now - sent_at(b) for b, _ in got)
        if got:
            await d.ack([tok for _, tok in got])
    return {"t0": t0, "t1": time.monotonic(), "msgs": len(lat), "lat": lat}


PHASES: dict[str, Callable[..., Awaitable[dict[str, Any]]]] = {
    f.__name__: f
    for f in (
        push_seq,
        recv_ack_seq,
        produce_batched,
        consume_batched,
        produce_paced,
        consume_latency,
    )
}


# ---- the client process ---------------------------------------------------------------------


def _client_main(
    spec: SystemSpec,
    queue: str,
    role: str,
    me: int,
    params: dict[str, Any],
    shared: dict[str, Any],
    ready: Any,
    go: MpEvent,
    results: Any,
) -> None:
    async def main() -> None:
        d = open_driver(spec, queue)
        await d.open()
        try:
            ready.put(me)
            go.wait()  # every client starts at once; nothing else runs in this loop yet
            c0 = time.process_time()
            out = await PHASES[role](d, me, shared, **params)
            out["client_cpu_s"] = time.process_time() - c0
            results.put((me, role, out))
        except BaseException as e:
            results.put((me, role, {"error": f"{type(e).__name__}: {e}"}))
            raise
        finally:
            with contextlib.suppress(Exception):
                await d.close()

    run_uvloop(main())


def run_uvloop(coro: Coroutine[Any, Any, T]) -> T:
    """Runs a coroutine on uvloop (asyncio's loop where uvloop is missing), as every
    benchmark client and coordinator does."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.run(coro)
    return uvloop.run(coro)


# ---- the coordinator --------------------------------------------------------------------------


@dataclass
class PhaseResult:
    """What one phase measured: per role, the merged numbers of its clients."""

    wall_s: float
    server_cpu_s: float
    roles: dict[str, dict[str, Any]] = field(default_factory=dict)

    def role(self, name: str) -> dict[str, Any]:
        return self.roles[name]


def run_phase(
    spec: SystemSpec,
    queue: str,
    roles: list[tuple[str, int, dict[str, Any]]],
    *,
    timeout_s: float = 600.0,
) -> PhaseResult:
    """Runs every (role, client count, params) at once and merges each role's results:
    msgs (sum), rate (msgs over the span from the first start to the last finish),
    latency percentiles, client CPU."""
    ready = _CTX.Queue()
    results = _CTX.Queue()
    go = _CTX.Event()
    shared = {"taken": _CTX.Value("q", 0)}
    procs = []
    me = 0
    for role, count, params in roles:
        for _ in range(count):
            p = _CTX.Process(
                target=_client_main,
                args=(spec, queue, role, me, params, shared, ready, go, results),
                daemon=True,
            )
            p.start()
            procs.append(p)
            me += 1
    try:
        deadline = time.monotonic() + 120
        for _ in procs:
            left = deadline - time.monotonic()
            try:
                ready.get(timeout=max(0.1, left))
            except Exception:
                raise RuntimeError(f"{spec.name}: a client did not open in time") from None
        cpu0 = cpu_seconds(spec.server_pids)
        w0 = time.monotonic()
        go.set()
        outs: list[tuple[int, str, dict[str, Any]]] = []
        for _ in procs:
            outs.append(results.get(timeout=timeout_s))
        wall = time.monotonic() - w0
        cpu = cpu_seconds(spec.server_pids) - cpu0
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    errors = [o["error"] for _, _, o in outs if "error" in o]
    if errors:
        raise RuntimeError(f"{spec.name}: {errors[0]}")
    merged: dict[str, dict[str, Any]] = {}
    for role, _, _ in roles:
        mine = [o for _, r, o in outs if r == role]
        msgs = sum(o["msgs"] for o in mine)
        span = max(o["t1"] for o in mine) - min(o["t0"] for o in mine)
        lat = sorted(x for o in mine for x in o.get("lat", ()))
        entry: dict[str, Any] = {
            "clients": len(mine),
            "msgs": msgs,
            "rate": msgs / span if span > 0 else 0.0,
            "client_cpu_s": sum(o["client_cpu_s"] for o in mine),
        }
        if lat:
            entry["p50_ms"] = percentile(lat, 0.50) * 1e3
            entry["p99_ms"] = percentile(lat, 0.99) * 1e3
            entry["mean_ms"] = statistics.fmean(lat) * 1e3
        merged[role] = entry
    return PhaseResult(wall_s=wall, server_cpu_s=cpu, roles=merged)


def reset_queue(spec: SystemSpec, queue: str) -> None:
    """Creates `queue` empty on the system (in a short-lived process of its own)."""
    p = _CTX.Process(target=_run_loop_reset, args=(spec, queue), daemon=True)
    p.start()
    p.join(120)
    if p.exitcode != 0:
        raise RuntimeError(f"{spec.name}: resetting queue {queue} failed (exit {p.exitcode})")


def _run_loop_reset(spec: SystemSpec, queue: str) -> None:
    async def main() -> None:
        d = open_driver(spec, queue)
        await d.open()
        try:
            await d.reset()
        finally:
            await d.close()

    run_uvloop(main())
