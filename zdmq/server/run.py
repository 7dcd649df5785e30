"""Runs one node process: open storage, serve HTTP, print READY, stop on a signal.

The readiness line on stdout (`READY <node> <url>`, or a JSON object with `event` "ready"
under JSON logs: `zdmq.logs.ready_line`) is the signal the CLI and the test harness wait
for; nothing else is printed on stdout. Logs go to stderr.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import resource
import signal
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from zdmq.config import ClusterConfig
from zdmq.errors import ConfigError
from zdmq.logs import exit_error, ready_line, setup_logging
from zdmq.server.app import HAND_OVER, make_app
from zdmq.server.heap import Heap
from zdmq.server.http import serve_app

__all__ = ["node_main", "run_loop", "run_node", "serve"]

log = logging.getLogger("zdmq.node")


async def serve(config: ClusterConfig, node_id: str, *, listen_fd: int | None = None) -> None:
    me = config.node(node_id)
    app = make_app(config, node_id)
    tls = config.tls.server_context() if config.tls is not None else None
    if listen_fd is not None:
        # The harness bound this socket on port 0 and passed it down: no port race.
        sock = socket.socket(fileno=listen_fd)
    else:
        sock = socket.socket(socket.AF_INET6 if ":" in me.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((me.host, me.port))
            sock.listen(1024)
        except OSError as e:
            sock.close()
            raise exit_error(
                f"zdmq node {node_id}: cannot listen on {me.host}:{me.port}: {e}"
            ) from e
    sock.setblocking(False)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # SIGTERM (a service manager, a rolling restart) stops gracefully: the replica groups
    # this node leads are handed over first. SIGINT (Ctrl-C, `zdmq up` stopping every
    # node at once, where nobody would take them) stops at once.

    def graceful() -> None:
        app[HAND_OVER] = True
        stop.set()

    loop.add_signal_handler(signal.SIGTERM, graceful)
    loop.add_signal_handler(signal.SIGINT, stop.set)

    def ready() -> None:
        _tune_gc()
        Heap().keep_freed()  # the node gives freed memory back when idle
        log.info(
            "node %s serving %s (durability %s)",
            node_id,
            me.url,
            config.durability,
            extra={"event": "ready", "url": me.url},
        )
        print(ready_line(node_id, me.url), flush=True)

    limits = config.limits
    _raise_fd_limit(limits.max_connections)
    try:
        await serve_app(
            app,
            sock,
            stop,
            ready=ready,
            idle_s=limits.idle_timeout_s,
            head_timeout_s=limits.head_timeout_s,
            body_timeout_s=limits.body_timeout_s,
            max_connections=limits.max_connections,
            ssl=tls,
        )
    finally:
        log.info("node %s stopped", node_id, extra={"event": "stopped"})


# File descriptors a node needs beyond its client connections: storage, node-to-node
# connections, logs.
FD_RESERVE = 1024


def _raise_fd_limit(max_connections: int) -> None:
    """Raises the soft RLIMIT_NOFILE toward the hard limit, so that `max_connections`
    client connections (and the node's own files) fit; warns if they cannot."""
    want = max_connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(hard, max(soft, want))
    if soft != resource.RLIM_INFINITY and target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open-file limit to %d: %s", target, e)
    if soft != resource.RLIM_INFINITY and soft < want:
        log.warning(
            "open-file limit %d is below limits.max_connections %d + %d: connections past "
            "it are refused by the kernel, not answered 503",
            soft,
            max_connections,
            FD_RESERVE,
        )


# The cyclic collector's first-generation threshold while serving (CPython's default is
# 700 allocations). A busy node allocates a few small objects per message and keeps few
# of them, so it ran a collection every few hundred messages.
GC_GEN0_THRESHOLD = 10_000


def _tune_gc() -> None:
    """After startup: what is loaded so far (modules, the restored state) moves out of
    the collector's sight, and young collections run less often. In-process, on workload
    (b)'s calls, this halved the collector's time (about 0.5 -> 0.25 µs per message)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def run_loop(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Runs `main` on uvloop when it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())


def run_node(
    config: ClusterConfig,
    node_id: str,
    *,
    listen_fd: int | None = None,
    log_format: str | None = None,
) -> None:
    setup_logging(node_id, log_format)
    me = config.node(node_id)
    log.info(
        "node %s starting: %s, replication %d, durability %s",
        node_id,
        me.url,
        config.replication,
        config.durability,
        extra={
            "event": "start",
            "url": me.url,
            "replication": config.replication,
            "durability": config.durability,
            "pid": os.getpid(),
        },
    )
    run_loop(lambda: serve(config, node_id, listen_fd=listen_fd))


def node_main(
    config_path: str,
    node_id: str,
    *,
    listen_fd: int | None = None,
    log_format: str | None = None,
    address: str | None = None,
) -> None:
    """`python -m zdmq.server` and `zdmq node`: loads the cluster file and runs node
    `node_id` (with `address`, "host:port": a node the file does not list, that joins the
    running cluster; an admin then adds it with `zdmq cluster add-node`). A bad file, or
    no node secret or client tokens where they are needed, stops it with a message, which
    is a JSON line under JSON logs like every line the node writes (logging is set up
    before the file is read for that)."""
    setup_logging(node_id, log_format)
    try:
        config = ClusterConfig.load(config_path)
        if address is not None:
            config = config.with_joining(node_id, address)
        config.node(node_id)
        run_node(config, node_id, listen_fd=listen_fd, log_format=log_format)
    except ConfigError as e:
        raise exit_error(f"zdmq node: {e}") from None
