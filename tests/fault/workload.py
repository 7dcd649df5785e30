"""Producers and consumers over REST, each call to a node drawn at random, every operation
recorded in a History for the checker.

- A producer pushes known payloads one at a time with a dedup id (`<process>-<n>`), so the
  message id is known before the call (uuid5 of queue and dedup id). A push whose outcome is
  unknown is retried with the same dedup id, up to `retries` more times.
- Consumers start `consumers_after_s` after the producers (to let a backlog build up).
- A receive consumer leases up to 10 messages, records each delivery, then acks them all.
- A pop consumer pops up to 10 (at-most-once; a pop of unknown outcome may take messages
  no one sees, which the checker bounds with `unknown_pop_capacity`).
- With a `client` (a factory of `zdmq.Client`), `client_producers` and `client_consumers`
  push (with dedup ids, retried alike), receive and ack through the Python client instead,
  which picks the node itself (the leader of the message's replica group); their
  deliveries and acks name the node `client`.
- `drain()` runs after the faults are healed: it receives and acks until the queue is empty
  and every node says so.

Outcomes: 2xx is ok (recorded with the node that answered); 4xx is fail (it certainly did
nothing); a timeout, a lost connection or a 5xx is info (unknown: a node may have done it
before the reply was lost). A plain REST caller is never answered 421 (a node that leads no
group relays the call to a leader): one is counted (`seen["421"]`, which the runs assert is
0) and is info.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from tests.fault.history import History
from zdmq.client import Client
from zdmq.errors import ZdmqError
from zdmq.local import LocalCluster
from zdmq.models import dedup_message_id

RECEIVE_MAX = 10
# A drain's leases: a drain receive whose reply was lost (a node may have forwarded it on and
# leased messages after the caller gave up) holds its messages this long, well inside a
# drain's timeout.
DRAIN_VISIBILITY_S = 10.0


class Outcome(Exception):
    """A call that did not answer 2xx: `definite` when it certainly did nothing (4xx)."""

    def __init__(self, definite: bool, what: str) -> None:
        super().__init__(what)
        self.definite = definite


# A node that did not answer (a timeout, a refused or lost connection) is not drawn again
# for this long, unless every node is in that state.
SUSPECT_S = 5.0


def node_urls(cluster: LocalCluster) -> dict[str, str]:
    """Every node of `cluster` by id, with its URL."""
    return {n: cluster.config.node(n).url for n in cluster.nodes}


@dataclass
class Rest:
    """Calls to a node drawn at random for each call, with a timeout of its own.

    A node that did not answer is left out of the draw for SUSPECT_S, as a client would
    (calls do not wait out a dead node's timeout one after another)."""

    session: aiohttp.ClientSession
    nodes: Mapping[str, str]  # node id -> URL
    rng: random.Random
    timeout_s: float = 3.0
    suspect: dict[str, float] = field(default_factory=dict)  # node -> left out until
    # Replies 421 (a broken promise: plain callers never get one) and calls that got no
    # reply (`no reply`).
    seen: Counter[str] = field(default_factory=Counter)

    def _draw(self) -> str:
        now = time.monotonic()
        live = [n for n in self.nodes if self.suspect.get(n, 0.0) <= now]
        return self.rng.choice(live or list(self.nodes))

    async def call(
        self, method: str, path: str, *, extra_s: float = 0.0, **kw: Any
    ) -> tuple[str, Any]:
        """The node that answered 2xx, and its reply's JSON (None without a body)."""
        node = self._draw()
        try:
            async with self.session.request(
                method,
                self.nodes[node] + path,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s + extra_s),
                **kw,
            ) as resp:
                body = await resp.read()
                status = resp.status
                json = resp.content_type.endswith("json") and body
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as e:
            self.suspect[node] = time.monotonic() + SUSPECT_S
            self.seen["no reply"] += 1
            raise Outcome(False, f"{node}: {type(e).__name__}: {e}") from e
        reply = orjson.loads(body) if json else None
        if status < 400:
            return node, reply
        if status == 421:
            self.seen["421"] += 1
        raise Outcome(status < 500 and status != 421, f"{node}: {status} {body[:200]!r}")


class Workload:
    def __init__(
        self,
        nodes: Mapping[str, str],
        queue: str,
        history: History,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        producers: int = 2,
        consumers: int = 2,
        pop_consumers: int = 0,
        visibility_s: float = 3.0,
        timeout_s: float = 3.0,
        retries: int = 2,
        consumers_after_s: float = 0.0,
        seed: int | None = None,
        client: Callable[[], Client] | None = None,
        client_producers: int = 0,
        client_consumers: int = 0,
    ) -> None:
        """`client` makes a `zdmq.Client` for the `client_producers` and
        `client_consumers`, which do what the REST ones do through the Python client (it
        picks the node: a message's group's leader, following 421s itself)."""
        self.nodes = dict(nodes)
        self.queue = queue
        self.history = history
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.ssl_context = ssl_context  # for https:// nodes
        self.producers = producers
        self.consumers = consumers
        self.pop_consumers = pop_consumers
        self.visibility_s = visibility_s
        self.timeout_s = timeout_s
        self.retries = retries
        self.consumers_after_s = consumers_after_s
        self.client = client
        self.client_producers = client_producers
        self.client_consumers = client_consumers
        self._pushed: Counter[str] = Counter()
        self.seen: Counter[str] = Counter()  # shared by every Rest of this workload
        self.rng = random.Random(seed)
        self.salt = f"{self.rng.getrandbits(32):08x}"

    def _rest(self, session: aiohttp.ClientSession, nodes: Sequence[str] | None = None) -> Rest:
        """Calls to random nodes (of `nodes` if given)."""
        pick = {n: self.nodes[n] for n in nodes} if nodes is not None else self.nodes
        return Rest(session, pick, random.Random(self.rng.random()), self.timeout_s, seen=self.seen)

    def session(self) -> aiohttp.ClientSession:
        if self.ssl_context is None:
            return aiohttp.ClientSession(headers=self.headers)
        connector = aiohttp.TCPConnector(ssl=self.ssl_context)
        return aiohttp.ClientSession(headers=self.headers, connector=connector)

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
            if self.client is None or not (self.client_producers or self.client_consumers):
                await asyncio.gather(*tasks)
                return
            async with self.client() as c:
                tasks += [
                    self._client_produce(c, f"cp{i}", deadline)
                    for i in range(self.client_producers)
                ]
                tasks += [
                    self._client_consume(c, f"cc{i}", deadline)
                    for i in range(self.client_consumers)
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
            node, reply = await rest.call(
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
        h.ok(process, "push", {**value, "got": (reply or {}).get("id"), "node": node})
        return True

    async def probe(
        self,
        node: str,
        process: str,
        group_of: Callable[[str], str],
        group: str,
        timeout_s: float = 1.0,
    ) -> None:
        """One push of a fresh message that `group` keeps, sent to `node` alone (nothing is
        retried), recorded like a producer's: a partition test sends it
        to a node cut off from a majority of `group`, which must not acknowledge it."""
        self._pushed[process] += 1
        while True:  # a dedup id whose message `group` keeps
            dedup_id = f"{process}-{self._pushed[process]}"
            msg_id = dedup_message_id(self.queue, dedup_id)
            if group_of(msg_id) == group:
                break
            self._pushed[process] += 1
        value = {"id": msg_id, "payload": f"{self.salt}:{dedup_id}"}
        async with self.session() as s:
            rest = Rest(s, {node: self.nodes[node]}, self.rng, timeout_s)
            await self._push(rest, process, dedup_id, value)

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
            node, reply = await rest.call(
                "POST",
                f"/v1/queues/{self.queue}/receive",
                params={"max": RECEIVE_MAX, "visibility_s": visibility_s, "wait_s": wait_s},
                extra_s=wait_s,
            )
        except Outcome as e:
            (h.fail if e.definite else h.info)(process, f, {"error": str(e)})
            await asyncio.sleep(0.05)
            return []
        got = [_delivery(m, node) for m in reply["messages"]]
        h.ok(process, f, got)
        return got

    async def ack(self, rest: Rest, process: str, got: list[dict[str, Any]]) -> None:
        h = self.history
        ids = [d["id"] for d in got]
        h.invoke(process, "ack", {"ids": ids})
        try:
            node, reply = await rest.call(
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
            {"acked": [i for i in ids if i not in failed], "failed": sorted(failed), "node": node},
        )

    async def _pop(self, rest: Rest, process: str, deadline: float) -> None:
        h = self.history
        await asyncio.sleep(self.consumers_after_s)
        while time.monotonic() < deadline:
            h.invoke(process, "pop", {"max": RECEIVE_MAX})
            try:
                node, reply = await rest.call(
                    "POST",
                    f"/v1/queues/{self.queue}/pop",
                    params={"max": RECEIVE_MAX, "wait_s": 0.5},
                    extra_s=0.5,
                )
            except Outcome as e:
                (h.fail if e.definite else h.info)(process, "pop", {"error": str(e)})
                await asyncio.sleep(0.05)
                continue
            h.ok(process, "pop", [_delivery(m, node) for m in reply["messages"]])

    # ---- through the Python client --------------------------------------------------
    async def _client_produce(self, c: Client, process: str, deadline: float) -> None:
        h = self.history
        while time.monotonic() < deadline:
            self._pushed[process] += 1
            dedup_id = f"{process}-{self._pushed[process]}"
            msg_id = dedup_message_id(self.queue, dedup_id)
            value = {"id": msg_id, "payload": f"{self.salt}:{dedup_id}"}
            for _ in range(1 + self.retries):
                h.invoke(process, "push", value)
                try:
                    got = await c.push(
                        self.queue, value["payload"], content_type="text/plain", dedup_id=dedup_id
                    )
                except Exception as e:
                    if _definite(e):
                        h.fail(process, "push", {**value, "error": repr(e)})
                        break
                    h.info(process, "push", {**value, "error": repr(e)})
                    self.seen["client unknown"] += 1
                    await asyncio.sleep(0.05)
                    if time.monotonic() >= deadline:
                        break
                    continue
                h.ok(process, "push", {**value, "got": got, "node": "client"})
                break

    async def _client_consume(self, c: Client, process: str, deadline: float) -> None:
        h = self.history
        await asyncio.sleep(self.consumers_after_s)
        while time.monotonic() < deadline:
            h.invoke(process, "receive", {"max": RECEIVE_MAX})
            try:
                msgs = await c.receive(
                    self.queue, RECEIVE_MAX, visibility_s=self.visibility_s, wait_s=0.5
                )
            except Exception as e:
                (h.fail if _definite(e) else h.info)(process, "receive", {"error": repr(e)})
                await asyncio.sleep(0.05)
                continue
            got = [
                {"id": m.id, "payload": m.text(), "node": "client", "receipt": m.receipt}
                for m in msgs
            ]
            h.ok(process, "receive", got)
            if not got:
                continue
            ids = [d["id"] for d in got]
            h.invoke(process, "ack", {"ids": ids})
            try:
                result = await c.ack(self.queue, [d["receipt"] for d in got])
            except Exception as e:
                (h.fail if _definite(e) else h.info)(process, "ack", {"ids": ids, "error": repr(e)})
                continue
            failed = {r.split(".", 1)[0] for r in result.failed}
            h.ok(
                process,
                "ack",
                {
                    "acked": [i for i in ids if i not in failed],
                    "failed": sorted(failed),
                    "node": "client",
                },
            )

    # ---- the end ---------------------------------------------------------------------
    async def drain(
        self,
        timeout_s: float = 30.0,
        *,
        nodes: Sequence[str] | None = None,
        process: str = "drain",
        visibility_s: float = DRAIN_VISIBILITY_S,
    ) -> None:
        """Receives and acks until the queue's stats show no message on any node (leases of
        unknown receives must run out first) and a receive finds nothing. Calls go to
        `nodes` only, if given (the others may be down)."""
        deadline = time.monotonic() + timeout_s
        stats: Any = None
        async with self.session() as s:
            rest = self._rest(s, nodes)
            while True:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"queue {self.queue} not drained in {timeout_s}s; last stats {stats}"
                    )
                got = await self.receive(rest, process, "drain", visibility_s, wait_s=0.2)
                if got:
                    await self.ack(rest, process, got)
                    continue
                try:
                    _, stats = await rest.call("GET", f"/v1/queues/{self.queue}")
                except Outcome as e:
                    if e.definite:
                        raise AssertionError(f"queue {self.queue}: {e}") from e
                    await asyncio.sleep(0.2)
                    continue
                if stats["messages"] == 0 and not stats["unavailable"]:
                    return
                await asyncio.sleep(0.2)


def _definite(e: Exception) -> bool:
    """A client call that certainly did nothing: a 4xx other than 421 (which a node that
    forwarded the call may have sent after trying it elsewhere)."""
    if isinstance(e, ZdmqError):
        return 400 <= e.status < 500 and e.status != 421
    if isinstance(e, (OSError, TimeoutError, asyncio.TimeoutError)):
        return False
    raise e


def _delivery(m: dict[str, Any], node: str) -> dict[str, Any]:
    d = {"id": m["id"], "payload": m["body"], "node": node}
    if "receipt" in m:
        d["receipt"] = m["receipt"]
    return d


# ---- FIFO groups -----------------------------------------------------------------------------
class FifoWorkload:
    """Producers and consumers of a FIFO queue over REST, each call to a random node.

    - One producer per group pushes its messages in order, `batch` at a time (a JSON batch
      whose messages carry the group and a dedup id `<group>-<n>`, body `<group>:<n>`), and
      retries a batch whose outcome is unknown until it is ok: a group's push order is n.
    - `consumers` consumers receive up to 10, wait a small random while (the processing),
      then ack them all; every receive and ack is in the history (deliveries carry their
      group), for `check_fifo`.
    """

    def __init__(
        self,
        nodes: Mapping[str, str],
        queue: str,
        history: History,
        *,
        groups: int,
        per_group: int,
        consumers: int,
        visibility_s: float = 3.0,
        timeout_s: float = 1.5,
        batch: int = 10,
        seed: int | None = None,
    ) -> None:
        self.nodes = dict(nodes)
        self.queue = queue
        self.history = history
        self.groups = [f"g{i:02d}" for i in range(groups)]
        self.per_group = per_group
        self.consumers = consumers
        self.visibility_s = visibility_s
        self.timeout_s = timeout_s
        self.batch = batch
        self.rng = random.Random(seed)
        self.seen: Counter[str] = Counter()  # shared by every Rest of this workload
        self.acked: set[str] = set()  # payloads whose ack was ok
        self.settled: set[str] = set()  # and those whose ack's outcome is unknown
        self.pushed = 0  # messages whose push was ok

    @property
    def total(self) -> int:
        return len(self.groups) * self.per_group

    def _rest(self, session: aiohttp.ClientSession) -> Rest:
        rng = random.Random(self.rng.random())
        return Rest(session, self.nodes, rng, self.timeout_s, seen=self.seen)

    async def create_queue(self) -> None:
        async with aiohttp.ClientSession() as s:
            await self._rest(s).call(
                "PUT",
                f"/v1/queues/{self.queue}",
                json={"fifo": True, "visibility_timeout_s": self.visibility_s},
            )

    async def run(self, until_s: float) -> None:
        """Runs producers and consumers until every message was acked (or its ack's
        outcome is unknown), then receives and acks until the queue is empty (an ack of
        unknown outcome may not have taken effect); AssertionError past `until_s`."""
        deadline = time.monotonic() + until_s
        async with aiohttp.ClientSession() as s:
            tasks = [self._produce(self._rest(s), g, deadline) for g in self.groups]
            tasks += [
                self._consume(self._rest(s), f"c{i}", deadline) for i in range(self.consumers)
            ]
            await asyncio.gather(*tasks)
            rest = self._rest(s)
            while time.monotonic() < deadline:
                if await self._receive_and_ack(rest, "drain"):
                    continue
                try:
                    _, stats = await rest.call("GET", f"/v1/queues/{self.queue}")
                except Outcome:
                    await asyncio.sleep(0.2)
                    continue
                if stats["messages"] == 0 and not stats["unavailable"]:
                    return
                await asyncio.sleep(0.2)
        raise AssertionError(f"queue {self.queue} not drained in {until_s}s")

    async def _produce(self, rest: Rest, group: str, deadline: float) -> None:
        h, process = self.history, f"p{group}"
        for start in range(0, self.per_group, self.batch):
            ns = range(start, min(start + self.batch, self.per_group))
            messages = [
                {"body": f"{group}:{n}", "group": group, "dedup_id": f"{group}-{n}"} for n in ns
            ]
            while time.monotonic() < deadline:
                value = {"payloads": [m["body"] for m in messages]}
                h.invoke(process, "push", value)
                try:
                    node, reply = await rest.call(
                        "POST", f"/v1/queues/{self.queue}/batch", json={"messages": messages}
                    )
                except Outcome as e:
                    if e.definite:
                        h.fail(process, "push", {**value, "error": str(e)})
                        raise AssertionError(f"a FIFO push was refused: {e}") from e
                    h.info(process, "push", {**value, "error": str(e)})
                    await asyncio.sleep(0.05)
                    continue
                h.ok(process, "push", {**value, "ids": reply["ids"], "node": node})
                self.pushed += len(messages)
                break

    async def _consume(self, rest: Rest, process: str, deadline: float) -> None:
        while time.monotonic() < deadline and len(self.settled) < self.total:
            await self._receive_and_ack(rest, process)

    async def _receive_and_ack(self, rest: Rest, process: str) -> bool:
        """One receive, the processing, and the ack of what it got; whether it got any."""
        h = self.history
        h.invoke(process, "receive", {"max": RECEIVE_MAX})
        try:
            node, reply = await rest.call(
                "POST",
                f"/v1/queues/{self.queue}/receive",
                params={"max": RECEIVE_MAX, "wait_s": 0.2},
                extra_s=0.2,
            )
        except Outcome as e:
            (h.fail if e.definite else h.info)(process, "receive", {"error": str(e)})
            await asyncio.sleep(0.05)
            return False
        got = [{**_delivery(m, node), "group": m.get("group")} for m in reply["messages"]]
        h.ok(process, "receive", got)
        if not got:
            return False
        await asyncio.sleep(self.rng.uniform(0.0, 0.02))  # the processing
        ids = [d["id"] for d in got]
        h.invoke(process, "ack", {"ids": ids})
        try:
            node, reply = await rest.call(
                "POST",
                f"/v1/queues/{self.queue}/ack",
                json={"receipts": [d["receipt"] for d in got]},
            )
        except Outcome as e:
            (h.fail if e.definite else h.info)(process, "ack", {"ids": ids, "error": str(e)})
            if not e.definite:
                self.settled.update(d["payload"] for d in got)
            return True
        failed = {f["receipt"].split(".", 1)[0] for f in reply["failed"]}
        acked = [i for i in ids if i not in failed]
        h.ok(process, "ack", {"acked": acked, "failed": sorted(failed), "node": node})
        done = [d["payload"] for d in got if d["id"] not in failed]
        self.acked.update(done)
        self.settled.update(done)
        return True
