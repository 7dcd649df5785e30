"""What a node's first commits cost with its WAL laid out first, and with a WAL that grows.

    .venv/bin/python loadtest/wal_presize.py [--n 3000] [--window 500] [--rounds 3]

Opens a fresh `SqliteStorage` (durability fsync) in a temporary folder and pushes one
100-byte message at a time, each committed before the next (`NodeState.push`, then
`submit`), as a node does for one-at-a-time pushes, without HTTP. Two ways, alternated
for `--rounds` rounds:

- `laid out`: as `SqliteStorage.load` opens it: the WAL is filled to its working size
  (`_presize_wal`) before the first commit;
- `grown`: the same with `_presize_wal` skipped: the WAL starts empty and each commit
  makes it longer, until the first checkpoint (about 1,000 commits) starts it over.

Prints the p50 commit time of each window of `--window` commits, then the medians over
the rounds. The first windows show the difference; once the WAL has been written over
from its start the two are the same file layout.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from zdmq.models import QueueSettings, new_message_id
from zdmq.server.state import CreateQueue
from zdmq.server.storage import SqliteStorage

BODY = b"x" * 100


async def _commits(n: int, presize: bool) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="zdmq-wal-") as tmp:
        storage = SqliteStorage(Path(tmp) / "zdmq.sqlite3", fsync=True)
        if not presize:
            storage._presize_wal = lambda: None  # type: ignore[method-assign]
        state = storage.load()
        op = CreateQueue("q", "i", time.time(), QueueSettings())
        state.apply(op)
        await storage.submit([op])
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            push = state.push("q", new_message_id(), BODY, None, now=time.time())
            await storage.submit([push])
            lat.append(time.perf_counter() - t)
        await storage.close()
    return lat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000, help="commits per run")
    ap.add_argument("--window", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not 1 <= args.window <= args.n <= 100_000 or not 1 <= args.rounds <= 20:
        raise SystemExit("need 1 <= --window <= --n <= 100,000 and --rounds in 1..20")
    starts = list(range(0, args.n - args.window + 1, args.window))
    head = " | ".join(f"{s}-{s + args.window - 1}" for s in starts)
    print("p50 µs of one-row fsynced commits, by window of commits since the node opened")
    print(f"| round | WAL | {head} |")
    print("|---|---|" + "---|" * len(starts))
    rows: dict[str, list[list[float]]] = {"laid out": [], "grown": []}
    for r in range(args.rounds):
        for kind in rows:
            lat = asyncio.run(_commits(args.n, presize=kind == "laid out"))
            p50s = [statistics.median(lat[s : s + args.window]) * 1e6 for s in starts]
            rows[kind].append(p50s)
            print(f"| {r + 1} | {kind} | " + " | ".join(f"{p:.0f}" for p in p50s) + " |")
    for kind, runs in rows.items():
        med = [statistics.median(col) for col in zip(*runs, strict=True)]
        print(f"| median | {kind} | " + " | ".join(f"{p:.0f}" for p in med) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
