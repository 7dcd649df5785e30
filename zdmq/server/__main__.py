"""`python -m zdmq.server --config cluster.yaml --node n1`: run one node."""

from __future__ import annotations

import argparse

from zdmq.logs import LOG_FORMAT_HELP, LOG_FORMATS
from zdmq.server.run import node_main


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m zdmq.server", description="Run one zdmq node.")
    ap.add_argument("--config", default="cluster.yaml", help="cluster file (default cluster.yaml)")
    ap.add_argument("--node", required=True, help="this node's id in the cluster file")
    ap.add_argument("--listen-fd", type=int, help="serve on this inherited listening socket")
    ap.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="a node the cluster file does not list: listen here and join the running cluster",
    )
    ap.add_argument("--log-format", choices=LOG_FORMATS, help=LOG_FORMAT_HELP)
    args = ap.parse_args(argv)
    node_main(
        args.config,
        args.node,
        listen_fd=args.listen_fd,
        log_format=args.log_format,
        address=args.address,
    )


if __name__ == "__main__":
    main()
