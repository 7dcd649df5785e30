"""Producers and consumers over REST, each call to a node drawn at random, every operation
recorded in a History for the checker.

- A producer pushes known payloads one at a time with a dedup id (`<process>-<n>`), so the
  message id is known before the call (uuid5 of queue and dedup id). A push whose outcome is
  unknown is retried with the same dedup id, up to `retries` more times.
- Consumers start `consumers_after_s` after the producers (to let a backlog build up).
- A receive consumer leases up to 10 messages, records each delivery, then acks them all.
- A pop consumer pops up to 10 (at-most-once; a pop of unknown outcome may take messages
  no one sees, which the checker bounds with `unknown_pop_capacity`).
- `drain()` runs after the faults are healed: it receives and acks until the queue is empty
  and every node says so.

Outcomes: 2xx is ok; 4xx is fail (it certainly did nothing); a timeout, a lost connection
or a 5xx is info (unknown: a node may have done it before the reply was lost).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp

from tests.fault.history import History
from zdmq.models import dedup_message_id

RECEIVE_MAX = 10


class Outcome(Exception):
    """A call that did not answer 2xx: `definite` when it certainly did nothing (4xx)."""

    def __init__(self, definite: bool, what: str) -> None:
        super().__init__(what)
        self.definite = definite


@dataclass
class Rest:
    """Calls to a node drawn at random for each call, with a timeout of its own."""

    session: aiohttp.ClientSession
    urls: list[str]
    rng: random.Random
    timeout_s: float = 3.0

    async def call(self, method: str, path: str, *, extra_s: float = 0.0, **kw: Any) -> Any:
        url = self.rng.choice(self.urls) + path
        try:
            async with self.session.request(
                method, url, timeout=aiohttp.ClientTimeout(total=self.timeout_s + extra_s), **kw
            ) as resp:
                body = await resp.read()
                if resp.status >= 400:
                    raise Outcome(resp.status < 500, f"{resp.status} {body[:200]!r}")
                return await resp.json() if body and resp.content_type.endswith("json") else None
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as e:
            raise Outcome(False, f"{type(e).__name__}: {e}") from e


class Workload:
    def __init__(
        self,
        urls: list[str],
        queue: str,
        history: History,
        *,
        token: str | None = None,
        producers: int = 2,
        consumers: int = 2,
        pop_consumers: int = 0,
        visibility_s: float = 3.0,
        timeout_s: float = 3.0,
        retries: int = 2,
        consumers_after_s: float = 0.0,
        seed: int | None = None,
    ) -> None:
        self.urls = urls
        self.queue = queue
        self.history = history
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.producers = producers
        self.consumers = consumers
        self.pop_consumers = pop_consumers
        self.visibility_s = visibility_s
        self.timeout_s = timeout_s
        self.retries = retries
        self.consumers_after_s = consumers_after_s
        self._pushed: Counter[str] = Counter()
        self.rng = random.Random(seed)
        self.salt = f"{self.rng.getrandbits(32):08x}"

    def _rest(self, session: aiohttp.ClientSession) -> Rest:
        return Rest(session, self.urls, random.Random(self.rng.random()), self.timeout_s)

    def session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(headers=self.headers)

    async def create_queue(self) -> None:
        async with self.session() as s:
            await self._rest(s).call(
                "PUT",
                f"/v1/queues/{self.queue}",
                json={"visibility_timeout_s": self.visibility_s},
            )

    async def run(self, duration_s: float) -> None:
        """Runs every producer and consumer until `duration_s` has passed."""
        deadline = time.monotonic() + duration_s
        async with self.session() as s:
            tasks = [self._produce(self._rest(s), f"p{i}", deadline) for i in range(self.producers)]
            tasks += [
                self._consume(self._rest(s), f"c{i}", deadline) for i in range(self.consumers)
            ]
            tasks += [
                self._pop(self._rest(s), f"o{i}", deadline) for i in range(self.pop_consumers)
            ]
            await asyncio.gather(*tasks)

    # ---- producers -------------------------------------------------------------------
    async def _produce(self, rest: Rest, process: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._pushed[process] += 1  # a later run() goes on numbering: ids stay fresh
            dedup_id = f"{process}-{self._pushed[process]}"
            value = {
                "id": dedup_message_id(self.queue, dedup_id),
                "payload": f"{self.salt}:{dedup_id}",
            }
            for _ in range(1 + self.retries):
                if await self._push(rest, process, dedup_id, value):
                    break
                if time.monotonic() >= deadline:
                    break

    async def _push(self, rest: Rest, process: str, dedup_id: str, value: dict[str, str]) -> bool:
        """One push; True when its outcome is known (ok or fail)."""
        h = self.history
        h.invoke(process, "push", value)
        try:
            reply = await rest.call(
                "POST",
                f"/v1/queues/{self.queue}/messages",
                data=value["payload"].encode(),
                headers={"zdmq-dedup-id": dedup_id, "Content-Type": "text/plain"},
            )
        except Outcome as e:
            if e.definite:
                h.fail(process, "push", {**value, "error": str(e)})
                return True
            h.info(process, "push", {**value, "error": str(e)})
            await asyncio.sleep(0.05)
            return False
        h.ok(process, "push", {**value, "got": (reply or {}).get("id")})
        return True

    # ---- consumers -------------------------------------------------------------------
    async def _consume(self, rest: Rest, process: str, deadline: float) -> None:
        await asyncio.sleep(self.consumers_after_s)
        while time.monotonic() < deadline:
            got = await self.receive(rest, process, "receive", self.visibility_s, wait_s=0.5)
            if got:
                await self.ack(rest, process, got)

    async def receive(
        self, rest: Rest, process: str, f: str, visibility_s: float, wait_s: float
    ) -> list[dict[str, Any]]:
        h = self.history
        h.invoke(process, f, {"max": RECEIVE_MAX})
        try:
            reply = await rest.call(
                "POST",
                f"/v1/queues/{self.queue}/receive",
                params={"max": RECEIVE_MAX, "visibility_s": visibility_s, "wait_s": wait_s},
                extra_s=wait_s,
            )
        except Outcome as e:
            (h.fail if e.definite else h.info)(process, f, {"error": str(e)})
            await asyncio.sleep(0.05)
            return []
        got = [_delivery(m) for m in reply["messages"]]
        h.ok(process, f, got)
        return got

    async def ack(self, rest: Rest, process: str, got: list[dict[str, Any]]) -> None:
        h = self.history
        ids = [d["id"] for d in got]
        h.invoke(process, "ack", {"ids": ids})
        try:
            reply = await rest.call(
                "POST",
                f"/v1/queues/{self.queue}/ack",
                json={"receipts": [d["receipt"] for d in got]},
            )
        except Outcome as e:
            (h.fail if e.definite else h.info)(process, "ack", {"ids": ids, "error": str(e)})
            return
        failed = {f["receipt"].split(".", 1)[0] for f in reply["failed"]}
        h.ok(
            process,
            "ack",
            {"acked": [i for i in ids if i not in failed], "failed": sorted(failed)},
        )

    async def _pop(self, rest: Rest, process: str, deadline: float) -> None:
        h = self.history
        await asyncio.sleep(self.consumers_after_s)
        while time.monotonic() < deadline:
            h.invoke(process, "pop", {"max": RECEIVE_MAX})
            try:
                reply = await rest.call(
                    "POST",
                    f"/v1/queues/{self.queue}/pop",
                    params={"max": RECEIVE_MAX, "wait_s": 0.5},
                    extra_s=0.5,
                )
            except Outcome as e:
                (h.fail if e.definite else h.info)(process, "pop", {"error": str(e)})
                await asyncio.sleep(0.05)
                continue
            h.ok(process, "pop", [_delivery(m) for m in reply["messages"]])

    # ---- the end ---------------------------------------------------------------------
    async def drain(self, timeout_s: float = 30.0) -> None:
        """Receives and acks until the queue's stats show no message on any node (leases of
        unknown receives must run out first) and a receive finds nothing."""
        deadline = time.monotonic() + timeout_s
        async with self.session() as s:
            rest = self._rest(s)
            while True:
                if time.monotonic() > deadline:
                    raise AssertionError(f"queue {self.queue} not drained in {timeout_s}s")
                got = await self.receive(rest, "drain", "drain", 60.0, wait_s=0.2)
                if got:
                    await self.ack(rest, "drain", got)
                    continue
                try:
                    stats = await rest.call("GET", f"/v1/queues/{self.queue}")
                except Outcome as e:
                    if e.definite:
                        raise AssertionError(f"queue {self.queue}: {e}") from e
                    await asyncio.sleep(0.2)
                    continue
                if stats["messages"] == 0 and not stats["unavailable"]:
                    return
                await asyncio.sleep(0.2)


def _delivery(m: dict[str, Any]) -> dict[str, Any]:
    d = {"id": m["id"], "payload": m["body"]}
    if "receipt" in m:
        d["receipt"] = m["receipt"]
    return d
