"""The `zdmq` command: run nodes, inspect the cluster, push and pop, and the demo.

zdmq up      start every node of cluster.yaml on this host; Ctrl-C stops them
zdmq node    run one node (for a real multi-host deployment; --address: a node that joins)
zdmq status  the cluster's status: nodes, replica groups, moves, queues, rates (--watch, --json)
zdmq cluster add-node | remove-node | replace-node | moves | show: change the nodes online
zdmq queue   create | delete | list | stats
zdmq push    push a message (argument, file or stdin)
zdmq pop     pop messages and print them
zdmq backup  copy every replica group's state from its leader into a directory
zdmq restore write a node's state from a backup into a new data directory (whole cluster)
zdmq demo    the README's main job: a local cluster, pushes and pops, then the Spark pipeline
zdmq spark   Spark jobs: `zdmq spark drain --queue Q --out PATH` (needs the [spark] extra)
zdmq bench   the benchmark workloads on zdmq and, if started, RabbitMQ, Redis, NATS
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

from rich import box
from rich.bar import Bar
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from zdmq import _http
from zdmq.auth import TOKEN_ENV
from zdmq.client import Client
from zdmq.config import ClusterConfig
from zdmq.errors import ConfigError, NodeUnavailable, ZdmqError
from zdmq.local import LocalCluster
from zdmq.logs import LOG_FORMAT_HELP, LOG_FORMATS
from zdmq.models import QueueStats

__all__ = ["main"]

T = TypeVar("T")


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["bench"]:  # its own parser: `zdmq bench --help`
        from zdmq.bench.runner import main as bench_main

        return bench_main(args_list[1:])
    ap = argparse.ArgumentParser(prog="zdmq", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="cluster.yaml", help="cluster file (default: %(default)s)")
    # `--config` is accepted after the command too: `zdmq up --config x.yaml`.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, help="cluster file")
    token_help = "client token for a cluster with auth.client_tokens (default: $ZDMQ_TOKEN)"
    ap.add_argument("--token", default=None, help=token_help)
    common.add_argument("--token", default=argparse.SUPPRESS, help=token_help)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add = sub.add_parser

    def add_parser(name: str, **kw: Any) -> argparse.ArgumentParser:
        return _add(name, parents=[common], **kw)

    sub.add_parser = add_parser  # type: ignore[method-assign]

    sub.add_parser("up", help="start every node of the cluster file on this host")
    p = sub.add_parser("node", help="run one node")
    p.add_argument(
        "--node", required=True, help="the node id in the cluster file (a new one with --address)"
    )
    p.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--log-format", choices=LOG_FORMATS, help=LOG_FORMAT_HELP)
    p.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="a node the cluster file does not list: listen here and join the running "
        "cluster (then add it with `zdmq cluster add-node`)",
    )
    p = sub.add_parser("status", help="nodes, replica groups, moves, queues and rates")
    p.add_argument("--watch", action="store_true", help="redraw every second until Ctrl-C")
    p.add_argument("--json", action="store_true", help="print GET /v1/status's JSON")

    p = sub.add_parser(
        "cluster",
        help="add, remove or replace nodes online; follow the moves; show the cluster map",
        description="Changes the cluster's nodes while it runs (an admin token: --token or "
        "$ZDMQ_TOKEN). A change is recorded in the cluster map, in its home group's log; the "
        "rebalancer on that group's leader then moves replicas one at a time until the "
        "groups are balanced. Each change is idempotent: run it again to see where it stands, "
        "or to go on after a crash. Needs replication 2 or more. Exit codes: 0 done, 1 the "
        "cluster refused or could not take the call, 2 bad usage.",
    )
    csub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    wait_help = (
        "follow the moves until the rebalancer is idle: a progress bar, the move under way, "
        "the time left (Ctrl-C stops following; the moves go on)"
    )
    c = csub.add_parser(
        "add-node",
        parents=[common],
        help="add a running node (started with `zdmq node --address`); replicas move to it",
    )
    c.add_argument("id", metavar="ID", help="the new node's id")
    c.add_argument("address", metavar="HOST:PORT", help="where the new node listens")
    c.add_argument("--wait", action="store_true", help=wait_help)
    c = csub.add_parser(
        "remove-node",
        parents=[common],
        help="drain a node: its replicas move to the others, then it leaves the map",
    )
    c.add_argument("id", metavar="ID", help="the node to remove")
    c.add_argument("--wait", action="store_true", help=wait_help)
    c = csub.add_parser(
        "replace-node",
        parents=[common],
        help="a new node takes a (dead) node's place; its replicas are rebuilt there",
    )
    c.add_argument("old", metavar="OLD", help="the node replaced (it may be dead)")
    c.add_argument("new", metavar="NEW", help="the new node's id")
    c.add_argument("address", metavar="HOST:PORT", help="where the new node listens")
    c.add_argument("--wait", action="store_true", help=wait_help)
    c = csub.add_parser(
        "moves", parents=[common], help="the rebalancer's progress: the move under way, those done"
    )
    c.add_argument("--json", action="store_true", help="print GET /v1/cluster/moves's JSON")
    c.add_argument("--watch", action="store_true", help="redraw every second until Ctrl-C")
    c = csub.add_parser(
        "show",
        parents=[common],
        help="the cluster map: its nodes with their replica and preferred-leader counts, groups",
    )
    c.add_argument("--json", action="store_true", help="print the map as JSON, with the counts")

    p = sub.add_parser("queue", help="create, delete, list or inspect queues")
    qsub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = qsub.add_parser("create", parents=[common])
    create.add_argument("queue")
    add = create.add_argument
    _passed_on(  # to Client.create_queue
        create,
        add(
            "--visibility-timeout",
            dest="visibility_timeout_s",
            type=float,
            help="seconds a lease lasts (30)",
        ),
        add("--max-receives", type=int, help="deliveries before dead-lettering"),
        add("--dead-letter-queue", help="where messages past --max-receives go"),
        add("--retention", dest="retention_s", type=float, help="seconds kept (4 days)"),
        add(
            "--dedup-window", dest="dedup_window_s", type=float, help="seconds dedup ids last (300)"
        ),
        add("--max-message-bytes", type=int, help="the queue's body size limit"),
    )
    qsub.add_parser("delete", parents=[common]).add_argument("queue")
    q = qsub.add_parser("stats", parents=[common], help="the queue's counts, node by node")
    q.add_argument("queue")
    q.add_argument("--json", action="store_true", help="print the stats as JSON")
    q = qsub.add_parser("list", parents=[common])
    q.add_argument("--json", action="store_true", help="print a JSON list")

    p = sub.add_parser("topic", help="topics: create, delete, list, subscribe, publish")
    tsub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action in ("create", "delete"):
        tsub.add_parser(action, parents=[common]).add_argument("topic")
    t = tsub.add_parser("show", parents=[common], help="the subscribed queues and their counts")
    t.add_argument("topic")
    t.add_argument("--json", action="store_true", help="print the subscriptions as JSON")
    t = tsub.add_parser("list", parents=[common])
    t.add_argument("--json", action="store_true", help="print a JSON list")
    for action in ("subscribe", "unsubscribe"):
        t = tsub.add_parser(action, parents=[common])
        t.add_argument("topic")
        t.add_argument("queue", help="subscribe creates it if it does not exist")
    t = tsub.add_parser("publish", parents=[common], help="a copy to every subscribed queue")
    t.add_argument("topic")
    t.add_argument("body", nargs="?", help="the body (default: read stdin)")
    t.add_argument("--content-type", help="the body's content type")
    t.add_argument("--dedup-id", help="retries with the same dedup id store each copy once")

    p = sub.add_parser("push", help="push one message")
    p.add_argument("queue")
    p.add_argument("body", nargs="?", help="the body (default: read stdin)")
    p.add_argument("--file", type=Path, help="read the body from this file")
    p.add_argument("--content-type", help="the body's content type")
    p.add_argument("--dedup-id", help="retries with the same dedup id store the message once")
    p.add_argument("--priority", type=int, default=0, help="0..9, higher delivered first")
    p.add_argument("--ttl", type=float, help="seconds until the message expires undelivered")
    p.add_argument("--delay", type=float, help="seconds (0..900) the message stays invisible")
    p.add_argument(
        "--attr", action="append", default=[], metavar="KEY=VALUE", help="an attribute (repeat)"
    )

    p = sub.add_parser("pop", help="pop messages and print their bodies")
    p.add_argument("queue")
    p.add_argument("-n", "--count", type=int, default=1, help="how many (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object a message")
    p.add_argument("--wait", type=float, default=0.0, help="seconds to wait for a message (0-20)")
    p.add_argument("--min-priority", type=int, default=0, help="only this priority or more")

    p = sub.add_parser(
        "backup", help="copy every replica group's state from its leader into a directory"
    )
    p.add_argument("directory", type=Path, help="where to write the copies and backup.json")
    p = sub.add_parser(
        "restore", help="write a node's state from a backup into its new, empty data directory"
    )
    p.add_argument("directory", type=Path, help="the backup (as `zdmq backup` wrote it)")
    p.add_argument("--node", required=True, help="the node id in the cluster file")

    p = sub.add_parser("demo", help="start the local cluster, push and pop, then Spark; report")
    p.add_argument("--messages", type=int, default=5000, help="how many (default %(default)s)")
    p.add_argument("--concurrency", type=int, default=32, help="calls in flight (default 32)")
    p.add_argument(
        "--spark",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the Spark part (default: when pyspark and Java are installed)",
    )
    p.add_argument("--master", default="local[*]", help="Spark master (default %(default)s)")
    p.add_argument("--out", help="where the Spark part writes Parquet (default: a temp dir)")

    p = sub.add_parser("spark", help="Spark jobs (needs the [spark] extra)")
    ssub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    d = ssub.add_parser("drain", parents=[common], help="drain a queue into files with Spark")
    d.add_argument("--queue", required=True)
    d.add_argument("--out", required=True, help="output path (a directory of files)")
    d.add_argument("--master", default="local[*]", help="Spark master (default %(default)s)")
    _passed_on(  # to zdmq.spark.drain
        d,
        d.add_argument("--max-messages", type=int, help="drain at most this many"),
        d.add_argument(
            "--format",
            dest="fmt",
            metavar="FORMAT",
            default="parquet",
            help="Spark writer format (default parquet)",
        ),
        d.add_argument("--mode", default="append", help="save mode (default append)"),
        d.add_argument("--decode", default="bytes", choices=["bytes", "utf-8", "json"]),
        d.add_argument("--json-schema", help='DDL for --decode json, e.g. "user string, n long"'),
        d.add_argument(
            "--visibility",
            dest="visibility_s",
            type=float,
            default=300.0,
            help="lease seconds (300)",
        ),
        d.add_argument("--batch-size", type=int, default=100, help="messages per receive (100)"),
        d.add_argument(
            "--min-priority", type=int, default=0, help="only messages of this priority or more"
        ),
    )

    sub.add_parser("bench", help="the benchmark workloads on zdmq and its peers (see --help)")

    args = ap.parse_args(args_list)
    if getattr(args, "token", None):
        # Every client this command makes takes it (the demo's, Spark's tasks').
        os.environ[TOKEN_ENV] = args.token
    try:
        if args.command == "node":
            from zdmq.server.run import node_main

            node_main(
                args.config,
                args.node,
                listen_fd=args.listen_fd,
                log_format=args.log_format,
                address=args.address,
            )
            return 0
        config = ClusterConfig.load(args.config)
        if args.command == "up":
            return _up(args.config)
        if args.command == "restore":
            from zdmq.backup import restore_node

            for path in restore_node(args.directory, config, args.node):
                print(f"wrote {path}")
            return 0
        if args.command == "demo":
            spark = _spark_wanted(args.spark)
            if spark is None:
                return 2
            spark_run = (args.master, args.out) if spark else None
            return asyncio.run(
                _demo(args.config, config, args.messages, args.concurrency, spark_run)
            )
        if args.command == "spark":
            if _spark_wanted(True) is None:
                return 2
            from zdmq.spark.cli import drain_command

            return drain_command(args.config, args.queue, args.out, args.master, **_kwargs(args))
        return asyncio.run(_COMMANDS[args.command](config, args))
    except ConfigError as e:
        print(f"zdmq: {e}", file=sys.stderr)
        return 2
    except ZdmqError as e:
        print(f"zdmq: {e.code}: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _passed_on(p: argparse.ArgumentParser, *actions: argparse.Action) -> None:
    """Marks `p`'s optional arguments that a command passes on as keyword arguments: each
    one's dest is the name of the called function's parameter (see `_kwargs`)."""
    p.set_defaults(passed_on=tuple(a.dest for a in actions))


def _kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments `_passed_on` marked, as keyword arguments."""
    return {name: getattr(args, name) for name in args.passed_on}


# ---- up -----------------------------------------------------------------------------------
def _up(config_path: str) -> int:
    cluster = LocalCluster(config_path)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"zdmq: starting {len(cluster.nodes)} nodes from {cluster.config_path}", flush=True)
    try:
        cluster.start()
    except (RuntimeError, TimeoutError) as e:
        print(f"zdmq: {e}", file=sys.stderr)
        cluster.stop()
        return 1
    listing = ", ".join(f"{n.node_id} {n.url}" for n in cluster.nodes.values())
    print(f"zdmq: {len(cluster.nodes)} nodes ready: {listing} (Ctrl-C stops them)", flush=True)
    status = 0
    while not stop.wait(0.5):
        dead = [n.node_id for n in cluster.nodes.values() if not n.running]
        if dead:
            print(f"zdmq: node(s) {', '.join(dead)} exited; stopping the rest", file=sys.stderr)
            status = 1
            break
    cluster.stop()
    print("zdmq: all nodes stopped", flush=True)
    return status


# ---- small commands -----------------------------------------------------------------------
async def _healths(config: ClusterConfig, timeout_s: float) -> list[dict[str, Any] | ZdmqError]:
    """Every node's /v1/health reply, or the error that stood in for it, in file order."""
    pool = _http.HttpPool(timeout_s=timeout_s, ssl_context=config.client_ssl())

    async def one(url: str) -> dict[str, Any] | ZdmqError:
        try:
            return dict((await _http.call(pool, "GET", url + "/v1/health")).json())
        except ZdmqError as e:
            return e

    try:
        return list(await asyncio.gather(*(one(n.url) for n in config.nodes)))
    finally:
        await pool.close()


async def _status(config: ClusterConfig, args: argparse.Namespace) -> int:
    from zdmq.cli_status import status_command

    token = args.token or os.environ.get(TOKEN_ENV) or None
    return await status_command(config, token, as_json=args.json, watch=args.watch)


async def _queue(config: ClusterConfig, args: argparse.Namespace) -> int:
    async with Client(config=config, token=args.token) as c:
        if args.action == "create":
            settings = await c.create_queue(args.queue, **_kwargs(args))
            given = ", ".join(f"{k}={v}" for k, v in settings.to_wire().items() if v is not None)
            print(f"created {args.queue} ({given})")
        elif args.action == "delete":
            await c.delete_queue(args.queue)
            print(f"deleted {args.queue}")
        elif args.action == "list":
            queues = await c.list_queues()
            if args.json or queues:
                print(json.dumps(queues) if args.json else "\n".join(queues))
        else:
            s = await c.stats(args.queue)
            if args.json:
                print(json.dumps(dataclasses.asdict(s)))
                return 0
            console = _console()
            console.print(
                f"{s.queue}: {s.messages} messages; {s.in_flight} in flight, {s.delayed} delayed, "
                f"{s.dead_lettered} dead-lettered, {s.expired} expired",
                highlight=False,
            )
            if s.messages:
                console.print(_depth_table(s.depth, c.nodes, s.messages))
    return 0


def _depth_table(depth: dict[str, int], nodes: Sequence[str], total: int) -> Table:
    """Where a queue's messages are: a row per node, with its count, a bar and its share."""
    table = Table(box=box.SIMPLE, show_header=True, pad_edge=True)
    table.add_column("node")
    table.add_column("messages", justify="right")
    table.add_column("share", min_width=40)
    table.add_column("%", justify="right")
    for node_id in nodes:
        d = depth.get(node_id, 0)
        bar = Bar(size=max(total, 1), begin=0, end=d, width=40)
        table.add_row(node_id, f"{d:,}", bar, f"{100 * d / max(total, 1):.1f}")
    return table


async def _topic(config: ClusterConfig, args: argparse.Namespace) -> int:
    async with Client(config=config, token=args.token) as c:
        if args.action == "create":
            await c.create_topic(args.topic)
            print(f"created topic {args.topic}")
        elif args.action == "delete":
            await c.delete_topic(args.topic)
            print(f"deleted topic {args.topic} (its queues stay)")
        elif args.action == "list":
            topics = await c.list_topics()
            if args.json or topics:
                print(json.dumps(topics) if args.json else "\n".join(topics))
        elif args.action == "show":
            subs = await c.subscriptions(args.topic)
            stats = await asyncio.gather(*(c.stats(q) for q in subs), return_exceptions=True)
            for st in stats:
                if isinstance(st, BaseException) and not isinstance(st, ZdmqError):
                    raise st
            if args.json:
                # A subscribed queue whose stats could not be read: its error's code.
                out = {
                    q: dataclasses.asdict(st) if isinstance(st, QueueStats) else {"error": st.code}
                    for q, st in zip(subs, stats, strict=True)
                    if isinstance(st, QueueStats | ZdmqError)
                }
                print(json.dumps({"topic": args.topic, "subscriptions": out}))
                return 0
            table = Table(
                title=f"{args.topic}: {len(subs)} subscription(s)",
                title_justify="left",
                box=box.SIMPLE,
            )
            for col in ("queue", "messages", "in flight", "delayed", "dead-lettered"):
                table.add_column(col, justify="left" if col == "queue" else "right")
            for q, st in zip(subs, stats, strict=True):
                if isinstance(st, BaseException):
                    code = st.code if isinstance(st, ZdmqError) else type(st).__name__
                    table.add_row(q, Text(code, style="red"), "", "", "")
                else:
                    counts = (st.messages, st.in_flight, st.delayed, st.dead_lettered)
                    table.add_row(q, *(f"{n:,}" for n in counts))
            _console().print(table)
        elif args.action == "subscribe":
            new = await c.subscribe(args.topic, args.queue)
            did = "subscribed to" if new else "was already subscribed to"
            print(f"{args.queue} {did} {args.topic}")
        elif args.action == "unsubscribe":
            purged = await c.unsubscribe(args.topic, args.queue)
            print(
                f"{args.queue} unsubscribed from {args.topic}; {purged} pending message(s) purged"
            )
        else:
            body = args.body.encode() if args.body is not None else sys.stdin.buffer.read()
            got = await c.publish(
                args.topic, body, content_type=args.content_type, dedup_id=args.dedup_id
            )
            for q, ids in got.ids.items():
                print(f"{q} {ids[0]}{' (duplicate)' if got.duplicates[q] else ''}")
            if not got.count:
                print("no subscriptions: nothing stored", file=sys.stderr)
    return 0


async def _push(config: ClusterConfig, args: argparse.Namespace) -> int:
    if args.file is not None:
        body: bytes = args.file.read_bytes()
    elif args.body is not None:
        body = args.body.encode("utf-8")
    else:
        body = sys.stdin.buffer.read()
    attributes: dict[str, str] = {}
    for pair in args.attr:
        key, sep, value = pair.partition("=")
        if not sep:
            print(f"zdmq push: --attr {pair!r}: expected KEY=VALUE", file=sys.stderr)
            return 2
        attributes[key] = value
    async with Client(config=config, token=args.token) as c:
        msg_id = await c.push(
            args.queue,
            body,
            content_type=args.content_type,
            dedup_id=args.dedup_id,
            priority=args.priority,
            ttl_s=args.ttl,
            delay_s=args.delay,
            attributes=attributes or None,
        )
        print(msg_id)
    return 0


async def _pop(config: ClusterConfig, args: argparse.Namespace) -> int:
    async with Client(config=config, token=args.token) as c:
        for _ in range(args.count):
            m = await c.pop(args.queue, wait_s=args.wait, min_priority=args.min_priority)
            if m is None:
                print("(empty)", file=sys.stderr)
                return 0
            if args.json:
                text = m.body.decode("utf-8", "replace")
                out: dict[str, Any] = {"id": m.id, "body": text, "content_type": m.content_type}
                if m.priority:
                    out["priority"] = m.priority
                if m.attributes:
                    out["attributes"] = m.attributes
                print(json.dumps(out))
            else:
                sys.stdout.buffer.write(m.body + b"\n")
                sys.stdout.flush()
    return 0


async def _backup(config: ClusterConfig, args: argparse.Namespace) -> int:
    async with Client(config=config, token=args.token, timeout_s=60.0) as c:
        done = await c.backup(args.directory)
    for b in done:
        print(f"group {b.group}: index {b.index}, {b.bytes} bytes -> {args.directory / b.file}")
    print(f"wrote {args.directory / 'backup.json'}")
    return 0


# ---- cluster ------------------------------------------------------------------------------
MOVES_POLL_S = 0.5
#: How long `--wait` rides out calls that fail because the home group's leader changes.
MOVES_UNAVAILABLE_S = 30.0


def _map_counts(m: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per node of the map: the groups it holds a voting replica of, those it is the
    preferred leader of (its group's first member), those it is catching up in."""
    counts = {n["id"]: {"replicas": 0, "preferred_leader": 0, "learning": 0} for n in m["nodes"]}
    for g in m["groups"]:
        for i, node in enumerate(g["members"]):
            c = counts.setdefault(node, {"replicas": 0, "preferred_leader": 0, "learning": 0})
            c["replicas"] += 1
            if i == 0:
                c["preferred_leader"] += 1
        for node in g.get("learners") or ():
            counts.setdefault(node, {"replicas": 0, "preferred_leader": 0, "learning": 0})
            counts[node]["learning"] += 1
    return counts


def _show_map(m: dict[str, Any], as_json: bool) -> None:
    counts = _map_counts(m)
    leaving = set(m.get("leaving") or ())
    if as_json:
        nodes = [{**n, **counts[n["id"]], "leaving": n["id"] in leaving} for n in m["nodes"]]
        print(json.dumps({**m, "nodes": nodes}, indent=2))
        return
    console = _console()
    console.print(
        Text.assemble(
            ("cluster map ", "bold"),
            f"epoch {m['epoch']}: {len(m['nodes'])} nodes, {len(m['groups'])} replica groups "
            f"of {m['replication']} copies, {m['partitions']} partitions",
        )
    )
    node_table = Table(title="Nodes", title_justify="left", box=box.SIMPLE)
    for col in ("node", "address", "replicas", "preferred leader of", "state"):
        node_table.add_column(
            col, justify="right" if col in ("replicas", "preferred leader of") else "left"
        )
    for n in m["nodes"]:
        c = counts[n["id"]]
        state = Text("leaving", style="yellow") if n["id"] in leaving else Text("")
        if c["learning"]:
            state.append(f"{' ' if state else ''}catching up in {c['learning']}", style="cyan")
        node_table.add_row(
            n["id"], n["address"], str(c["replicas"]), str(c["preferred_leader"]), state
        )
    console.print(node_table)
    groups = Table(title="Replica groups", title_justify="left", box=box.SIMPLE)
    for col in ("group", "members (preferred leader first)", "learners"):
        groups.add_column(col)
    for g in m["groups"]:
        groups.add_row(g["id"], " ".join(g["members"]), " ".join(g.get("learners") or ()))
    console.print(groups)


def _moves_idle(moves: dict[str, Any]) -> bool:
    from zdmq.cli_status import moves_active

    return not moves_active(moves)


def _moves_view(moves: dict[str, Any], base: int = 0, rate: float | None = None) -> Any:
    """The moves as rich renderables: the progress, and the moves done lately."""
    from rich.console import Group

    from zdmq.cli_status import moves_progress, render_moves

    progress = moves_progress(moves, base=base, rate=rate)
    state = "moving replicas" if not _moves_idle(moves) else "idle"
    parts: list[Any] = [
        render_moves(progress, title=f"map epoch {moves.get('epoch')}; rebalancer {state}")
    ]
    done = moves.get("done") or []
    if done:
        count = int(moves.get("moves_done") or len(done))
        parts.append(
            Text(f"{count} move(s) done since this leader of the home group began; the last:")
        )
        table = Table(box=box.SIMPLE)
        for col in ("group", "from", "to", "entries", "took"):
            table.add_column(col, justify="right" if col in ("entries", "took") else "left")
        for p in done:
            table.add_row(
                p["group"],
                p.get("remove") or "",
                p.get("add") or "",
                f"{int(p.get('commit_index') or 0):,}",
                f"{float(p.get('elapsed_s') or 0.0):.1f}s",
            )
        parts.append(table)
    return Group(*parts)


async def _moves_command(c: Client, args: argparse.Namespace) -> int:
    from rich.live import Live

    from zdmq.cli_status import moves_line, moves_progress

    moves = await c.moves()
    if args.json:
        print(json.dumps(moves, indent=2))
        return 0
    console = _console()
    if not args.watch:
        console.print(_moves_view(moves))
        return 0
    if not sys.stdout.isatty():  # a line each time the progress changes
        last = None
        while True:
            line = moves_line(moves_progress(moves))
            if line != last:
                print(line, flush=True)
                last = line
            await asyncio.sleep(1.0)
            moves = await c.moves()
    with Live(_moves_view(moves), console=console, refresh_per_second=4) as live:
        while True:
            await asyncio.sleep(1.0)
            live.update(_moves_view(await c.moves()))


async def _follow_moves(c: Client, base: int, out: TextIO = sys.stderr) -> dict[str, Any]:
    """`--wait`: polls the moves until the rebalancer is idle (seen twice in a row, so
    that a change it has not planned yet is not taken for one done), drawing the progress
    of the moves done since `base` on `out` (rich's live bar on a terminal, else a line
    each time it changes). The time left is reckoned from the rate of the moves done while
    it waits. Returns the last view."""
    from rich.live import Live

    from zdmq.cli_status import moves_line, moves_progress, render_moves

    started = time.monotonic()
    live: Live | None = None
    if out.isatty():
        live = Live(console=Console(file=out), refresh_per_second=4, transient=False)
        live.start()
    last_line = None
    unavailable_since: float | None = None
    idle_seen = 0
    try:
        while True:
            try:
                moves = await c.moves()
                unavailable_since = None
            except NodeUnavailable:  # the home group is electing: wait for its leader
                now = time.monotonic()
                unavailable_since = unavailable_since or now
                if now - unavailable_since > MOVES_UNAVAILABLE_S:
                    raise
                await asyncio.sleep(MOVES_POLL_S)
                continue
            if int(moves.get("moves_done") or 0) < base:
                base = 0  # a new leader of the home group counts its moves from 0
            done = int(moves.get("moves_done") or 0) - base
            rate = done / (time.monotonic() - started) if done else None
            progress = moves_progress(moves, base=base, rate=rate)
            if live is not None:
                live.update(render_moves(progress, title="Moving replicas"))
            else:
                line = moves_line(progress)
                if line != last_line:
                    out.write(line + "\n")
                    out.flush()
                    last_line = line
            idle_seen = idle_seen + 1 if _moves_idle(moves) else 0
            if idle_seen >= 2:
                return moves
            await asyncio.sleep(MOVES_POLL_S)
    finally:
        if live is not None:
            live.stop()


def _change_said(action: str, args: argparse.Namespace, result: dict[str, Any]) -> str:
    """What a change did, in words."""
    epoch, m = result["epoch"], result["map"]
    in_map = {n["id"]: n["address"] for n in m["nodes"]}
    leaving = set(m.get("leaving") or ())
    if action == "add-node":
        if result["changed"]:
            return (
                f"added {args.id} at {args.address}: map epoch {epoch}; replicas move to it "
                "one at a time"
            )
        return f"nothing changed: {args.id} is in the cluster at {in_map[args.id]} (epoch {epoch})"
    if action == "remove-node":
        if result["changed"]:
            return (
                f"{args.id} is leaving: map epoch {epoch}; its replicas move to the other "
                "nodes one at a time, then it leaves the map"
            )
        where = "is leaving already" if args.id in leaving else "is not in the cluster"
        return f"nothing changed: {args.id} {where} (epoch {epoch})"
    if result["changed"]:
        return (
            f"{args.new} at {args.address} takes {args.old}'s place: map epoch {epoch}; "
            f"{args.old}'s replicas are rebuilt on {args.new} one at a time, then {args.old} "
            "leaves the map"
        )
    if args.old not in in_map:
        return f"nothing changed: {args.old} has left, {args.new} took its place (epoch {epoch})"
    return f"nothing changed: {args.new} is taking {args.old}'s place already (epoch {epoch})"


async def _cluster(config: ClusterConfig, args: argparse.Namespace) -> int:
    async with Client(config=config, token=args.token) as c:
        if args.action == "show":
            _show_map(await c.cluster_map(), args.json)
            return 0
        if args.action == "moves":
            return await _moves_command(c, args)
        base = int((await c.moves()).get("moves_done") or 0) if args.wait else 0
        if args.action == "add-node":
            result = await c.add_node(args.id, args.address)
        elif args.action == "remove-node":
            result = await c.remove_node(args.id)
        else:
            result = await c.replace_node(args.old, args.new, args.address)
        print(_change_said(args.action, args, result), flush=True)
        if not args.wait:
            return 0
        started = time.monotonic()
        moves = await _follow_moves(c, base)
        done = max(int(moves.get("moves_done") or 0) - base, 0)
        print(
            f"the rebalancer is idle: {done} move(s) in {time.monotonic() - started:.1f}s; "
            f"map epoch {moves.get('epoch')}"
        )
        if args.action != "add-node":
            gone = args.id if args.action == "remove-node" else args.old
            print(f"{gone} has left the map: it holds no replica and may be stopped")
    return 0


_COMMANDS: dict[str, Callable[[ClusterConfig, argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "status": _status,
    "cluster": _cluster,
    "backup": _backup,
    "topic": _topic,
    "queue": _queue,
    "push": _push,
    "pop": _pop,
}


# ---- demo ---------------------------------------------------------------------------------
class _Progress:
    """A progress bar on stderr (rich's, live on a terminal); when it is not a terminal,
    only a final line."""

    def __init__(self, label: str, total: int, out: TextIO = sys.stderr) -> None:
        self.label, self.total, self.out = label, total, out
        self.done = 0
        self.started = time.perf_counter()
        self._bar: Progress | None = None
        if out.isatty():
            self._bar = Progress(
                TextColumn(f"{label:<6}"),
                BarColumn(bar_width=30),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:>10} msg/s"),
                TimeElapsedColumn(),
                console=Console(file=out),
            )
            self._task = self._bar.add_task(label, total=total, rate="")
            self._bar.start()

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            rate = self.done / max(time.perf_counter() - self.started, 1e-9)
            self._bar.update(self._task, advance=n, rate=f"{rate:,.0f}")

    def _line(self, now: float) -> str:
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(frac * 30)
        rate = self.done / max(now - self.started, 1e-9)
        return f"{self.label:<6} [{bar:<30}] {self.done:>6}/{self.total} {rate:>8,.0f} msg/s"

    def finish(self) -> float:
        now = time.perf_counter()
        if self._bar is not None:
            self._bar.stop()
        else:
            self.out.write(self._line(now) + "\n")
            self.out.flush()
        return now - self.started


def _console() -> Console:
    """Standard output for rich: as wide as the terminal, or 120 columns, plain, when it
    is not one."""
    return Console() if sys.stdout.isatty() else Console(width=120, color_system=None)


async def _bounded(n: int, concurrency: int, job: Callable[[int], Awaitable[T]]) -> list[T]:
    """Runs job(0..n-1) with at most `concurrency` in flight; results in order."""
    results: list[Any] = [None] * n
    next_i = 0

    async def worker() -> None:
        nonlocal next_i
        while next_i < n:
            i = next_i
            next_i += 1
            results[i] = await job(i)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, n))))
    return results


def _spark_wanted(asked: bool | None) -> bool | None:
    """Whether the Spark part runs: asked for (None if it cannot), or by default when pyspark
    and Java are both there (else the demo says how to get them and runs without it)."""
    import importlib.util
    import os
    import shutil

    missing = []
    if importlib.util.find_spec("pyspark") is None:
        missing.append("pyspark: pip install -e '.[spark]' (or pip install 'zdmq[spark]')")
    if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
        missing.append("Java 17 (Spark runs on the JVM): e.g. apt-get install openjdk-17-jre")
    if not missing:
        return asked is not False
    if asked:
        print("zdmq: Spark needs " + "; and ".join(missing), file=sys.stderr)
        return None
    if asked is None:
        print("demo: the Spark part is skipped; to run it install " + "; and ".join(missing))
    return False


async def _demo(
    config_path: str,
    config: ClusterConfig,
    n: int,
    concurrency: int,
    spark: tuple[str, str | None] | None = None,  # (master, output dir) of the Spark part
) -> int:
    if n < 1:
        print("zdmq demo: --messages must be at least 1", file=sys.stderr)
        return 2
    healths = await _healths(config, 2.0)
    for h in healths:
        if isinstance(h, ZdmqError) and not isinstance(h, NodeUnavailable):
            raise h  # a node answers but is unhealthy: say so rather than run beside it
    up = [not isinstance(h, NodeUnavailable) for h in healths]
    cluster: LocalCluster | None = None
    if all(up):
        print(f"demo: using the running cluster of {len(up)} nodes from {config_path}")
    elif any(up):
        print("zdmq demo: some nodes of the cluster answer and some do not:", file=sys.stderr)
        print("  stop them or start the rest (`zdmq up`), then run the demo again", file=sys.stderr)
        return 1
    else:
        cluster = LocalCluster(config_path)
        print(f"demo: starting {len(cluster.nodes)} nodes from {cluster.config_path} ...")
        t0 = time.perf_counter()
        await asyncio.to_thread(cluster.start)
        print(f"demo: cluster ready in {time.perf_counter() - t0:.1f}s: {', '.join(cluster.urls)}")
    try:
        status = await _demo_run(config, n, concurrency)
        if spark is not None:
            from zdmq.spark.cli import demo_part

            ok = await asyncio.to_thread(demo_part, config, n, *spark)
            status = status or (0 if ok else 1)
        return status
    finally:
        if cluster is not None:
            await asyncio.to_thread(cluster.stop)
            print("demo: cluster stopped")


async def _demo_run(config: ClusterConfig, n: int, concurrency: int) -> int:
    queue = f"demo-{uuid.uuid4().hex[:8]}"
    async with Client(config=config) as c:
        await c.create_queue(queue)
        copies = f", {config.replication} copies" if config.replication > 1 else ""
        print(f"demo: created queue {queue} (durability: {config.durability}{copies})")
        bodies = [json.dumps({"event": i, "user": f"u{i % 97}"}).encode() for i in range(n)]
        bar = _Progress("push", n)

        async def push(i: int) -> str:
            msg_id = await c.push(queue, bodies[i], content_type="application/json")
            bar.advance()
            return msg_id

        ids = await _bounded(n, concurrency, push)
        push_s = bar.finish()
        expected = dict(zip(ids, bodies, strict=True))

        stats = await c.stats(queue)
        print(f"demo: {stats.messages} messages stored; where they live:", flush=True)
        _console().print(_depth_table(stats.depth, c.nodes, n))

        bar = _Progress("pop", n)
        seen: Counter[str] = Counter()
        wrong = 0

        async def popper() -> None:
            nonlocal wrong
            while True:
                m = await c.pop(queue)
                if m is None:
                    return
                seen[m.id] += 1
                if expected.get(m.id) != m.body:
                    wrong += 1
                bar.advance()

        await asyncio.gather(*(popper() for _ in range(min(concurrency, 8))))
        pop_s = bar.finish()
        pops = c.calls["pop"]
        await c.delete_queue(queue)

    dup = sum(v - 1 for v in seen.values() if v > 1)
    lost = sum(1 for i in ids if i not in seen)
    print(
        f"demo: pushed {n} in {push_s:.2f}s ({n / push_s:,.0f}/s), 1 call each; "
        f"popped {sum(seen.values())} in {pop_s:.2f}s ({n / pop_s:,.0f}/s)"
    )
    print(
        f"demo: pops made {pops.calls} calls for {pops.ops} pops "
        f"({pops.calls_per_op:.3f} per pop; the last pops on emptying nodes cost more)"
    )
    ok = lost == 0 and dup == 0 and wrong == 0
    print(f"demo: lost={lost} duplicates={dup} corrupted={wrong} -> {'OK' if ok else 'FAILED'}")
    ok = await _demo_topic(config, queue) and ok
    return 0 if ok else 1


async def _demo_topic(config: ClusterConfig, name: str, n: int = 100) -> bool:
    """A topic with two subscriptions: `n` published messages reach each once."""
    topic, subs = f"{name}-events", [f"{name}-audit", f"{name}-mail"]
    async with Client(config=config) as c:
        await c.create_topic(topic)
        for q in subs:
            await c.subscribe(topic, q)
        bodies = [json.dumps({"event": i}).encode() for i in range(n)]
        published = await c.publish_many(topic, bodies)
        got: dict[str, Counter[bytes]] = {}
        for q in subs:
            got[q] = Counter()
            while batch := await c.pop_many(q, 100):
                got[q].update(m.body for m in batch)
        await c.delete_topic(topic)
        for q in subs:
            await c.delete_queue(q)
    want = Counter(bodies)
    ok = published.count == len(subs) and all(g == want for g in got.values())
    each = ", ".join(f"{q} {sum(g.values())}" for q, g in got.items())
    print(
        f"demo: topic {topic} fanned {n} published messages out to {published.count} "
        f"subscriptions, each got every one once ({each}) -> {'OK' if ok else 'FAILED'}"
    )
    return ok


if __name__ == "__main__":
    sys.exit(main())
