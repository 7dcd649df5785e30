"""Locust load test of zdmq's REST API: push, pop, receive + ack, batches.

    locust -f loadtest/locustfile.py --headless -u 50 -r 50 -t 15s \\
        --zdmq-config cluster.yaml --mix push=1,pop=1,recv_ack=1 --routing zerohop

`loadtest/run_locust.sh` starts a local cluster, runs this file and reports CPU beside
the rates. Options (each also read from the environment variable named beside it):

    --zdmq-config   ZDMQ_CONFIG        cluster.yaml: the nodes, partitions, replication
    --mix           ZDMQ_MIX           task weights, e.g. push=1,pop=1,recv_ack=1
                                       tasks: push, pop, recv_ack, push_batch, pop_batch
    --message-size  ZDMQ_MESSAGE_SIZE  body bytes (100)
    --batch-size    ZDMQ_BATCH_SIZE    messages per push_batch / pop_batch (100)
    --queues        ZDMQ_QUEUES        queues lq-0 .. lq-<n-1> (1), created once at test
                                       start (409 if they exist is fine); each user takes
                                       them round-robin from a random first one
    --routing       ZDMQ_ROUTING       any: every call to a random node, which forwards;
                                       zerohop: each call to the node that serves it
    --zdmq-token    ZDMQ_TOKEN         client token, for a cluster with auth.client_tokens
                                       (it needs admin on lq- to create the queues)

Zero-hop routing does what `zdmq.Client` does: a push carries a fresh UUID (`zdmq-id`,
canonical form: the nodes refuse others) and goes to the node that id hashes to; a pop
or receive goes, with `zdmq-route: local`, to a node taken from the queue's metadata
list (cached per user for 2 s, pruned when a node turns out empty, fetched again from
the metadata owner when it is empty or stale); an ack goes to the node its message id
hashes to; a batch push draws fresh ids that share one node (as the client does) and
goes there in one call. Under `any` routing a node does all of that on the caller's behalf.
With `replication` above 1, zero-hop calls name their replica group (`zdmq-group`, the node
the id hashes to) and go to the leader the user last found for it: a 421 `not_leader` sends
the call on to the leader it names, a refused connection to the group's next member (both
reported as `<operation> (moved)`, not as failures); a timeout is a failure, and the next
call for that group tries the next member.

The statistics have one row per operation, not per URL: push, push_batch, pop,
pop_batch, receive, ack, metadata. A pop or receive that got nothing is a success
reported in its own row, `pop (empty)` / `receive (empty)` / `pop_batch (empty)`, so
the latency of real deliveries is not mixed with that of misses; under zero-hop routing
such a row counts calls to one node that was empty, not an empty queue. Any other status
than the operation's documented one (a 5xx, a 4xx, a connection error) or an ack that
did not settle its receipt is a failure.
"""

from __future__ import annotations

import logging
import random
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import orjson
from locust import FastHttpUser, constant, events, task
from locust.env import Environment
from locust.runners import WorkerRunner

from zdmq.auth import bearer_headers
from zdmq.cluster_map import initial_map
from zdmq.config import ClusterConfig
from zdmq.hashing import Placement
from zdmq.models import new_message_ids
from zdmq.routing import GROUP_HEADER, members_of_view

log = logging.getLogger("zdmq.locust")

TASKS = ("push", "pop", "recv_ack", "push_batch", "pop_batch")
ROUTINGS = ("any", "zerohop")
QUEUE_PREFIX = "lq-"
VISIBILITY_S = 30.0
METADATA_TTL_S = 2.0
JSON = {"Content-Type": "application/json"}
OCTET = "application/octet-stream"


def parse_mix(text: str) -> dict[str, float]:
    """`push=1,pop=2` -> {"push": 1.0, "pop": 2.0}; unknown tasks and bad weights raise."""
    mix: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, sep, weight = part.partition("=")
        name = name.strip()
        if name not in TASKS:
            raise ValueError(f"--mix: unknown task {name!r} (tasks: {', '.join(TASKS)})")
        try:
            w = float(weight) if sep else 1.0
        except ValueError:
            raise ValueError(f"--mix: {name}: weight {weight!r} is not a number") from None
        if w < 0:
            raise ValueError(f"--mix: {name}: weight {w:g} is negative")
        mix[name] = w
    if not any(mix.values()):
        raise ValueError(f"--mix {text!r}: no task has a positive weight")
    return {k: v for k, v in mix.items() if v > 0}


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    group = parser.add_argument_group("zdmq")
    group.add_argument(
        "--zdmq-config", env_var="ZDMQ_CONFIG", default="", help="the cluster.yaml to load"
    )
    group.add_argument(
        "--mix",
        env_var="ZDMQ_MIX",
        default="push=1,pop=1,recv_ack=1",
        help=f"task weights, name=weight,... (tasks: {', '.join(TASKS)})",
    )
    group.add_argument("--message-size", env_var="ZDMQ_MESSAGE_SIZE", type=int, default=100)
    group.add_argument("--batch-size", env_var="ZDMQ_BATCH_SIZE", type=int, default=100)
    group.add_argument("--queues", env_var="ZDMQ_QUEUES", type=int, default=1)
    group.add_argument(
        "--routing", env_var="ZDMQ_ROUTING", choices=ROUTINGS, default="any", help="any|zerohop"
    )
    group.add_argument("--zdmq-token", env_var="ZDMQ_TOKEN", default="", help="client token")


class Settings:
    """The parsed options and the cluster layout, once per Locust process."""

    def __init__(self, options: Any) -> None:
        if not options.zdmq_config:
            raise ValueError("--zdmq-config (or ZDMQ_CONFIG) is required: the cluster.yaml")
        self.config = ClusterConfig.load(options.zdmq_config)
        self.urls = {n.id: n.url for n in self.config.nodes}
        # The replica groups keys are placed on (fixed when the cluster is made; with one
        # copy, the nodes) and, with replication above 1, their members (zdmq/routing.py).
        initial = initial_map(self.config)
        self.node_ids = list(initial.groups)
        self.placement = Placement(self.node_ids, self.config.partitions, self.config.replication)
        self.groups = (
            {g: initial.members(g) for g in initial.groups} if self.config.replication > 1 else None
        )
        self.mix = parse_mix(options.mix)
        if not 0 <= options.message_size <= self.config.limits.max_message_bytes:
            raise ValueError(f"--message-size {options.message_size}: out of range")
        if not 1 <= options.batch_size <= self.config.limits.max_batch_messages:
            raise ValueError(
                f"--batch-size {options.batch_size}: expected "
                f"1..{self.config.limits.max_batch_messages}"
            )
        if options.queues < 1:
            raise ValueError(f"--queues {options.queues}: expected at least 1")
        # The cluster map's epoch these routes follow: a reply that names a newer one has
        # the map fetched again (`follow`), so a grown or shrunk cluster is routed right.
        self.epoch = 1
        self.message_size = options.message_size
        self.batch_size = options.batch_size
        self.queues = [f"{QUEUE_PREFIX}{i}" for i in range(options.queues)]
        self.routing = options.routing
        self.auth = bearer_headers(options.zdmq_token or None)  # sent on every call
        self.body = b"x" * self.message_size
        self.batch_item = {"body": self.body.decode(), "encoding": "utf-8"}

    def follow(self, epoch_header: str | None, url: str) -> None:
        """A reply from `url` named the map of epoch `epoch_header`: if newer, takes
        that node's map (its nodes' URLs and its groups' members)."""
        if not epoch_header or not epoch_header.isdigit() or int(epoch_header) <= self.epoch:
            return
        req = urllib.request.Request(url + "/v1/cluster", headers=dict(self.auth))
        try:
            with urllib.request.urlopen(req, timeout=5) as reply:
                view = orjson.loads(reply.read())
        except (OSError, ValueError) as e:
            log.warning("zdmq: no cluster map from %s: %s", url, e)
            return
        self.urls.update({n["id"]: n["url"] for n in view["nodes"]})
        if self.groups is not None:
            self.groups = members_of_view(view["groups"])
        self.epoch = int(view["epoch"])
        log.info("zdmq: routing by the cluster map of epoch %d", self.epoch)


SETTINGS: Settings | None = None


@events.init.add_listener
def _init(environment: Environment, **_: Any) -> None:
    global SETTINGS
    options = environment.parsed_options
    if options is None:  # imported by a tool, not run by locust
        return
    try:
        SETTINGS = Settings(options)
    except (ValueError, OSError) as e:
        log.error("zdmq locustfile: %s", e)
        raise SystemExit(2) from e
    # FastHttpUser insists on a base host; every call here uses an absolute URL anyway.
    ZdmqUser.host = environment.host or next(iter(SETTINGS.urls.values()))


@events.test_start.add_listener
def _create_queues(environment: Environment, **_: Any) -> None:
    """Creates the queues once per test: on the master or the local runner, not on workers."""
    if isinstance(environment.runner, WorkerRunner) or SETTINGS is None:
        return
    s = SETTINGS
    for queue in s.queues:
        owner = s.placement.owner(queue)  # a replica group: its preferred leader's URL
        node = s.groups[owner][0] if s.groups is not None else owner
        url = f"{s.urls[node]}/v1/queues/{queue}"
        req = urllib.request.Request(url, data=b"{}", method="PUT", headers={**JSON, **s.auth})
        try:
            with urllib.request.urlopen(req, timeout=10) as reply:
                status = reply.status
        except urllib.error.HTTPError as e:
            status = e.code
        if status not in (201, 409):
            raise RuntimeError(f"PUT {url}: HTTP {status}")
    log.info("zdmq: queues %s ready (%s routing, mix %s)", s.queues, s.routing, s.mix)


class ZdmqUser(FastHttpUser):
    """A connection per node (absolute URLs: FastHttpSession keeps a client per host);
    every call names its operation in the statistics."""

    wait_time = constant(0)
    network_timeout = 10.0
    connection_timeout = 10.0
    max_retries = 0

    def on_start(self) -> None:
        assert SETTINGS is not None, "run through locust with --zdmq-config"
        self.s = SETTINGS
        self.ops = [getattr(self, f"do_{name}") for name in self.s.mix]
        self.weights = list(self.s.mix.values())
        self.next_queue = random.randrange(len(self.s.queues))
        # queue -> (fetched at, nodes the metadata list names, pruned as they turn out empty)
        self.meta: dict[str, tuple[float, list[str]]] = {}
        # Replica group -> the member this user last found leading it.
        self.leaders: dict[str, str] = {}

    @task
    def step(self) -> None:
        random.choices(self.ops, self.weights)[0]()

    # ---- helpers -------------------------------------------------------------------
    def queue(self) -> str:
        q = self.s.queues[self.next_queue]
        self.next_queue = (self.next_queue + 1) % len(self.s.queues)
        return q

    def any_node(self) -> str:
        return random.choice(self.s.node_ids)

    def call(
        self,
        name: str,
        node: str,
        method: str,
        path: str,
        expect: int,
        *,
        empty_name: str | None = None,
        check: Callable[[Any], str | None] | None = None,
        **kw: Any,
    ) -> Any | None:
        """One HTTP call, reported as `name`; its JSON reply, or None when it failed.

        With `empty_name`, a reply with no messages is reported under that name; `check`
        returns why a reply with the right status is still wrong, or None."""
        if self.s.auth:
            kw["headers"] = {**kw.get("headers", {}), **self.s.auth}
        if self.s.groups is None:
            return self.send(name, node, method, path, expect, empty_name, check, kw)
        # Replica groups: `node` names a group; the call goes to the leader this user last
        # heard of, follows a 421's hint, and moves on to the next member when one refuses
        # the connection (the call surely did not run there).
        kw["headers"] = {**kw.get("headers", {}), GROUP_HEADER: node}
        members = self.s.groups[node]
        # A 421 (with the leader it names, if any) or a refused connection: reported under
        # `<name> (moved)` as the routing they are, not as failures.
        moved: list[str] = []

        def redirect(r: Any) -> bool:
            if r.status_code == 421:
                moved.append(_leader_hint(r.content) or "")
            elif r.status_code == 0 and isinstance(r.error, ConnectionRefusedError):
                moved.append("")
            else:
                return False
            r.request_meta["name"] = f"{name} (moved)"
            r.success()
            return True

        for _ in range(2 * len(members) + 2):
            target = self.leaders.get(node) or members[0]
            moved.clear()
            result = self.send(name, target, method, path, expect, empty_name, check, kw, redirect)
            if not moved:
                return result
            members = self.s.groups[node]  # a reply may have brought a newer map
            self.leaders[node] = moved[0] if moved[0] in members else _next(members, target)
        self.environment.events.request.fire(
            request_type=method,
            name=name,
            response_time=0,
            response_length=0,
            exception=RuntimeError(f"{name}: no member of group {node} leads it"),
            context={},
        )
        return None

    def send(
        self,
        name: str,
        node: str,
        method: str,
        path: str,
        expect: int,
        empty_name: str | None,
        check: Callable[[Any], str | None] | None,
        kw: dict[str, Any],
        redirect: Callable[[Any], bool] | None = None,
    ) -> Any | None:
        base = self.s.urls[node]
        with self.client.request(method, base + path, name=name, catch_response=True, **kw) as r:
            self.s.follow(r.headers.get("zdmq-epoch") if r.headers else None, base)
            if redirect is not None and redirect(r):
                return None
            if r.status_code == 0:  # connection error: already recorded as the failure
                if self.s.groups is not None:  # try the group's next member next time
                    group = kw["headers"][GROUP_HEADER]
                    self.leaders[group] = _next(self.s.groups[group], node)
                return None
            if r.status_code != expect:
                text = (r.text or "")[:300]
                r.failure(f"{name}: HTTP {r.status_code} (expected {expect}): {text}")
                return None
            body: Any = None
            try:
                if r.content:
                    body = orjson.loads(r.content)
            except orjson.JSONDecodeError:
                r.failure(f"{name}: reply is not JSON: {r.content[:100]!r}")
                return None
            problem = check(body) if check is not None else None
            if problem is not None:
                r.failure(f"{name}: {problem}")
                return None
            if empty_name is not None:
                if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                    r.failure(f"{name}: no messages list in the reply: {body!r:.200}")
                    return None
                if not body["messages"]:
                    r.request_meta["name"] = empty_name
            r.success()
            return body

    # ---- zero-hop take: the metadata list, as zdmq.Client keeps it -----------------------
    def metadata(self, queue: str) -> list[str]:
        owner = self.s.placement.owner(queue)
        j = self.call("metadata", owner, "GET", f"/v1/queues/{queue}/metadata", 200)
        nodes = [e["node"] for e in j["nodes"] if e["node"] in self.s.node_ids] if j else []
        self.meta[queue] = (time.monotonic(), list(nodes))
        return nodes

    def take(self, op: str, queue: str, query: str) -> list[dict[str, Any]]:
        """Pops or receives (`op` names the path) under the chosen routing."""
        path = f"/v1/queues/{queue}/{'receive' if op == 'receive' else 'pop'}?{query}"
        empty = f"{op} (empty)"
        if self.s.routing == "any":
            j = self.call(op, self.any_node(), "POST", path, 200, empty_name=empty)
            return j["messages"] if j else []
        cached = self.meta.get(queue)
        fresh = cached is not None and time.monotonic() - cached[0] < METADATA_TTL_S
        tried: set[str] = set()
        if fresh and cached is not None and cached[1]:
            node = random.choice(cached[1])
            got = self.take_at(op, empty, node, queue, path)
            if got:
                return got
            tried.add(node)
        # The guess was empty (or nothing cached): ask the metadata owner, then try the
        # nodes it lists, each once.
        listed = self.metadata(queue)
        for node in random.sample(listed, len(listed)):
            if node in tried:
                continue
            got = self.take_at(op, empty, node, queue, path)
            if got:
                return got
        return []

    def take_at(self, op: str, empty: str, node: str, queue: str, path: str) -> list[Any]:
        headers = {"zdmq-route": "local", "zdmq-listed": "1"}
        j = self.call(op, node, "POST", path, 200, empty_name=empty, headers=headers)
        got: list[Any] = j["messages"] if j else []
        if not got:
            cached = self.meta.get(queue)
            if cached is not None and node in cached[1]:
                cached[1].remove(node)
        return got

    # ---- tasks ---------------------------------------------------------------------
    def do_push(self) -> None:
        queue = self.queue()
        headers = {"Content-Type": OCTET}
        if self.s.routing == "zerohop":
            msg_id = str(uuid.uuid4())
            node = self.s.placement.owner(msg_id)
            headers.update({"zdmq-id": msg_id, "zdmq-route": "local"})
        else:
            node = self.any_node()
        path = f"/v1/queues/{queue}/messages"
        self.call("push", node, "POST", path, 201, data=self.s.body, headers=headers)

    def do_push_batch(self) -> None:
        queue = self.queue()
        path = f"/v1/queues/{queue}/batch"
        n = self.s.batch_size
        if self.s.routing == "any":
            payload = orjson.dumps({"messages": [self.s.batch_item] * n})
            self.call("push_batch", self.any_node(), "POST", path, 201, data=payload, headers=JSON)
            return
        # Like Client.push_many: fresh ids that share one node, drawn at random, so the
        # batch is one call to the node that owns them (one per owner on huge clusters).
        by_owner: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
        for msg_id in new_message_ids(n, self.s.placement.owner):
            by_owner[self.s.placement.owner(msg_id)].append({**self.s.batch_item, "id": msg_id})
        for owner, items in by_owner.items():
            payload = orjson.dumps({"messages": items})
            self.call("push_batch", owner, "POST", path, 201, data=payload, headers=JSON)

    def do_pop(self) -> None:
        self.take("pop", self.queue(), "max=1")

    def do_pop_batch(self) -> None:
        # Reported as pop_batch: the same path as pop, a different operation to the reader.
        self.take("pop_batch", self.queue(), f"max={self.s.batch_size}")

    def do_recv_ack(self) -> None:
        queue = self.queue()
        got = self.take("receive", queue, f"max=1&visibility_s={VISIBILITY_S:g}")
        if not got:
            return
        m = got[0]
        node = self.s.placement.owner(m["id"]) if self.s.routing == "zerohop" else self.any_node()
        payload = orjson.dumps({"receipts": [m["receipt"]]})
        path = f"/v1/queues/{queue}/ack"
        self.call("ack", node, "POST", path, 200, check=_acked_one, data=payload, headers=JSON)


def _leader_hint(content: bytes | None) -> str | None:
    """The leader a 421 `not_leader` reply names, if any."""
    try:
        err = orjson.loads(content or b"{}").get("error", {})
    except (orjson.JSONDecodeError, AttributeError):
        return None
    leader = err.get("leader") if isinstance(err, dict) else None
    return leader if isinstance(leader, str) else None


def _next(members: tuple[str, ...], node: str) -> str:
    """The member after `node` in its group's ring order."""
    return members[(members.index(node) + 1) % len(members)] if node in members else members[0]


def _acked_one(reply: Any) -> str | None:
    if not isinstance(reply, dict) or reply.get("acked") != 1 or reply.get("failed"):
        return f"the receipt was not settled: {reply}"
    return None
