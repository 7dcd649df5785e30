"""A history of operations, as the workload's clients saw them (after Jepsen's histories).

Every operation is two events by one process: an `invoke`, then its completion, `ok`
(it happened), `fail` (it certainly did not happen) or `info` (unknown: a timeout, a lost
connection, a 5xx). A process runs one operation at a time, so an invoke pairs with the
next completion of the same process. Times are `time.monotonic()` of the one test process.

The functions (`f`) and their values:

- `push`: invoke and completion value `{"id", "payload"}` (the id the producer expects, the
  body it sent); an `ok` may carry the id the node answered and the node that answered as
  `{"id", "payload", "got", "node"}`.
- `receive`, `pop`, `drain`: invoke value `None` (or `{"max": n}`); `ok` value a list of
  deliveries `[{"id", "payload", "node"}]` (a receive's also carry `"receipt"`). `drain` is
  the final receive after the faults are healed.
- `ack`: invoke value `{"ids": [...]}`; `ok` value `{"acked": [...], "failed": [...],
  "node"}` (the ids whose ack took effect, those refused, and the node that answered).
- `nemesis`: what the fault injector did (`{"fault", "node", ...}`), for the report only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
TYPES = (INVOKE, OK, FAIL, INFO)


@dataclass(frozen=True, slots=True)
class Event:
    index: int
    process: str
    type: str
    f: str
    value: Any
    time: float


class History:
    """An append-only list of events; safe to append to from several threads and tasks."""

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self._events: list[Event] = list(events)
        self._lock = threading.Lock()

    def _add(self, process: str, type_: str, f: str, value: Any) -> Event:
        with self._lock:
            e = Event(len(self._events), process, type_, f, value, time.monotonic())
            self._events.append(e)
            return e

    def invoke(self, process: str, f: str, value: Any = None) -> Event:
        return self._add(process, INVOKE, f, value)

    def ok(self, process: str, f: str, value: Any = None) -> Event:
        return self._add(process, OK, f, value)

    def fail(self, process: str, f: str, value: Any = None) -> Event:
        return self._add(process, FAIL, f, value)

    def info(self, process: str, f: str, value: Any = None) -> Event:
        return self._add(process, INFO, f, value)

    def note(self, process: str, f: str, value: Any) -> Event:
        """A one-event record (a nemesis action): an `info` with no invoke."""
        return self._add(process, INFO, f, value)

    def __iter__(self) -> Iterator[Event]:
        with self._lock:
            return iter(list(self._events))

    def __len__(self) -> int:
        return len(self._events)

    def dump(self, path: Path) -> None:
        """Writes the history as JSON lines (one event a line)."""
        with open(path, "wb") as f:
            for e in self:
                f.write(orjson.dumps(asdict(e)) + b"\n")

    @classmethod
    def load(cls, path: Path) -> History:
        events = []
        for line in Path(path).read_bytes().splitlines():
            if line.strip():
                events.append(Event(**orjson.loads(line)))
        return cls(events)
