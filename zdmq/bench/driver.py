"""The one interface every system under test implements, zdmq and its peers alike.

A workload never talks to a broker directly: it asks a `Driver` to push, receive and
ack. Each client process opens its own driver from a `SystemSpec`, which is plain
data so that it pickles into a spawned process. A driver module may live outside the
package (the peers live in `loadtest/peers/`): `SystemSpec.sys_path` names the
folders to import it from.

Semantics every driver keeps, so that the rows of one table compare like with like:
- `push` returns only once the system has confirmed the message with the durability
  the spec names (`fsync`: flushed to disk before the confirm; `os`: handed to the OS).
- `push_batch` is the system's fastest way to push many with the same durability
  (batches, pipelining, publisher confirms in bulk); it returns once all are confirmed.
- `receive(n)` takes up to n messages with at-least-once semantics (each needs an
  `ack`, and comes back if the consumer dies); `[]` when nothing is there within a
  short wait (a driver may block up to `wait_s` for a message).
- `ack(tokens)` settles what `receive` returned. zdmq's ack returns once the ack is
  committed with the queue's durability; not every peer can promise that (RabbitMQ's
  basic.ack is never confirmed by the broker, nor flushed), so each peer driver's
  docstring says what its ack means, and docs/benchmarks.md says it beside the rows.
  A driver whose `ack` returns before the ack is sent (zdmq's consumer mode) waits for
  them all in `settle`, which a phase calls before it stops its clock.
"""

from __future__ import annotations

import abc
import importlib
import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Driver", "Received", "SystemSpec", "open_driver"]

# (body, token): the token is whatever the driver needs to ack that message.
Received = tuple[bytes, Any]


@dataclass(frozen=True)
class SystemSpec:
    """One row of a benchmark table: a system, in one mode, at one address."""

    name: str  # row label, e.g. "zdmq fsync", "redis list always"
    driver: str  # "package.module:Class"
    durability: str  # "fsync" (flushed before confirm) or "os" (not flushed)
    options: dict[str, Any] = field(default_factory=dict)  # what the driver needs to connect
    server_pids: tuple[int, ...] = ()  # whose CPU time counts as "server CPU"
    sys_path: tuple[str, ...] = ()  # folders to import `driver` from
    note: str = ""  # one line for the table's legend
    workloads: tuple[str, ...] | None = None  # the workloads this row takes part in (None: all)


class Driver(abc.ABC):
    """One connection to one system, used by one client process."""

    def __init__(self, spec: SystemSpec, queue: str) -> None:
        self.spec = spec
        self.queue = queue

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def reset(self) -> None:
        """Creates the queue empty (deleting what a previous run left). Called once per
        workload, by one process, before any client opens."""

    @abc.abstractmethod
    async def push(self, body: bytes) -> None: ...

    @abc.abstractmethod
    async def push_batch(self, bodies: list[bytes]) -> None: ...

    @abc.abstractmethod
    async def receive(self, max_messages: int, wait_s: float = 0.0) -> list[Received]: ...

    @abc.abstractmethod
    async def ack(self, tokens: list[Any]) -> None: ...

    async def settle(self) -> None:
        """Returns once every ack handed to `ack` has taken effect, and gives back what
        was received ahead but not handed out (a phase calls it when its client is done)."""
        return None


def open_driver(spec: SystemSpec, queue: str) -> Driver:
    """Imports the spec's driver class and builds one (not yet opened)."""
    for p in spec.sys_path:
        if p not in sys.path:
            sys.path.insert(0, p)
    module_name, _, cls_name = spec.driver.partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    if not (isinstance(cls, type) and issubclass(cls, Driver)):
        raise TypeError(f"{spec.driver} is not a zdmq.bench.driver.Driver")
    return cls(spec, queue)
