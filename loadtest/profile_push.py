"""One push at a time against one node, timed and optionally profiled: issue 4's target 1.

    .venv/bin/python loadtest/profile_push.py [--durability fsync|os|memory] [--n 5000]
        [--warmup 500] [--runs 3] [--profile node|client|both] [--mode cpu|wall]
        [--rate 2000] [--top 30] [--out DIR]

Starts a fresh one-node cluster (`LocalCluster.ephemeral`, in a temporary folder), then
runs a client in this process on uvloop: `Client.push` of a 100-byte body, each push
waiting for its reply, as workload (a) does. Prints pushes/s (1 / mean latency, as
`zdmq bench` does), p50/p99, the node's user+system CPU per push (from /proc) and this
client's. `durability: memory` shows what the HTTP round trip and the handler cost
without the commit.

With `--profile`, py-spy samples the node and/or this client process during the timed
pushes of the last run, and the script prints each process's heaviest functions, by own
time and including callees. `--mode cpu` (the default) keeps the samples that hold the
GIL: busy Python time, uvloop's C code under `Runner.run`, but neither the fsync (sqlite3
lets the GIL go) nor waiting. `--mode wall` keeps every sample of the main thread: where
the event loop's time goes, fsync and idle included. Beware that a `transport.write`
looks heavy in both: the sender is often preempted inside it by the peer it woke.
The raw collapsed stacks are kept in `--out` for flame graphs.

Runs against whichever zdmq is first on the import path, so `PYTHONPATH=/other/tree`
measures another checkout with the same script (the node processes inherit it).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zdmq.bench.workloads import cpu_seconds, percentile, run_uvloop
from zdmq.client import Client
from zdmq.local import LocalCluster

BODY = b"x" * 100


def _py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def _start_spy(pid: int, out: Path, rate: int, mode: str) -> subprocess.Popen[bytes]:
    spy = _py_spy()
    if spy is None:
        raise SystemExit("py-spy is not installed (pip install py-spy)")
    argv = [spy, "record", "-r", str(rate), "--format", "raw", "-o", str(out)]
    # --nonblocking: the process is not paused at each sample.
    argv += ["--nonblocking", "--pid", str(pid)]
    if mode == "cpu":
        # Only samples that hold the GIL: uvloop waiting in epoll, idle threads, and
        # sqlite3 (fsync included) let it go, so this is Python's busy time.
        argv.append("--gil")
    else:
        # Every sample, idle ones too (see summarize); --idle keeps those py-spy
        # itself would call idle.
        argv.append("--idle")
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _stop_spy(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def summarize(raw: Path, top: int, mode: str = "cpu") -> str:
    """The heaviest functions in py-spy's collapsed stacks, by own and by inclusive share.

    In "wall" mode only the main thread counts (the event loop's), and a sample whose
    innermost Python frame is the loop's `run` is the loop waiting or in uvloop's C code.
    """
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = [_short(f) for f in stack.split(";")]
        if mode == "wall" and not frames[0].startswith(("<module> ", "_run_module_as_main ")):
            continue  # a thread other than the main one
        n = int(count)
        total += n
        leaf = frames[-1]
        if mode == "wall" and leaf.startswith(("Runner.run ", "run (uvloop")):
            leaf = "(in the event loop: waiting, or uvloop's C code)"
        own[leaf] += n
        for f in set(frames):
            incl[f] += n
    if not total:
        return f"{raw.name}: no samples\n"
    kind = "GIL-holding" if mode == "cpu" else "main-thread wall-clock"
    lines = [f"{raw.name}: {total} {kind} samples", "  own %  function"]
    lines += [f"  {100 * n / total:5.1f}  {f}" for f, n in own.most_common(top)]
    lines += ["  incl % function"]
    lines += [f"  {100 * n / total:5.1f}  {f}" for f, n in incl.most_common(top)]
    return "\n".join(lines) + "\n"


def _short(frame: str) -> str:
    # "name (path/to/file.py:123)" -> "name (file.py)": lines apart, one function.
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = path.split("/")
    return f"{name} ({'/'.join(parts[-2:])})" if path else name


async def _pushes(
    config: Path, n: int, warmup: int, on_timed: Callable[[], None]
) -> tuple[list[float], float, float]:
    async with Client.from_config(config) as c:
        queue = "profile-push"
        await c.create_queue(queue)
        for _ in range(warmup):
            await c.push(queue, BODY)
        on_timed()
        ready = time.perf_counter()
        c0 = time.process_time()
        lat: list[float] = []
        for _ in range(n):
            t = time.perf_counter()
            await c.push(queue, BODY)
            lat.append(time.perf_counter() - t)
        return lat, time.perf_counter() - ready, time.process_time() - c0


def run_once(args: argparse.Namespace, profile: str | None, out: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="zdmq-profile-") as tmp:
        cluster = LocalCluster.ephemeral(tmp, nodes=1, durability=args.durability)
        with cluster:
            node = next(iter(cluster.nodes.values()))
            assert node.pid is not None
            spies: list[subprocess.Popen[bytes]] = []
            cpu0: list[float] = []

            def timed() -> None:
                if profile in ("node", "both"):
                    spies.append(_start_spy(node.pid, out / "node.raw", args.rate, args.mode))
                if profile in ("client", "both"):
                    spies.append(_start_spy(os.getpid(), out / "client.raw", args.rate, args.mode))
                if spies:
                    time.sleep(0.5)  # py-spy attaches before the timed pushes start
                cpu0.append(cpu_seconds([node.pid]))

            try:
                lat, wall, client_cpu = run_uvloop(
                    _pushes(cluster.config_path, args.n, args.warmup, timed)
                )
            finally:
                for s in spies:
                    _stop_spy(s)
            cpu = cpu_seconds([node.pid]) - cpu0[0]
    return {**latency_row(lat, cpu, client_cpu), "wall_s": wall}


def latency_row(lat: list[float], srv_s: float, cli_s: float) -> dict[str, float]:
    """One-at-a-time calls' rate (1 / mean latency), p50 and p99 in ms, and the server's
    and client's CPU per call in µs."""
    timed = sorted(lat)
    return {
        "rate": len(timed) / sum(timed),
        "p50_ms": percentile(timed, 0.5) * 1e3,
        "p99_ms": percentile(timed, 0.99) * 1e3,
        "srv_us": srv_s / len(timed) * 1e6,
        "cli_us": cli_s / len(timed) * 1e6,
    }


def run_and_tabulate(
    runs: int,
    profiled: bool,
    run: Callable[[Any], dict[str, float]],
    cells: Callable[[dict[str, float]], str],
    profile: Any = True,
) -> list[dict[str, float]]:
    """Runs `runs` times (the last one profiled when `profiled`, with `profile` handed to
    `run`), prints a table row per run, then the median of the runs not profiled."""
    rows = []
    for i in range(runs):
        last = profiled and i == runs - 1
        rows.append(run(profile if last else None))
        print(f"| {i + 1}{' (profiled)' if last else ''} | {cells(rows[-1])}", flush=True)
    plain = [r for i, r in enumerate(rows) if not (profiled and i == runs - 1)] or rows
    med = {k: sorted(r[k] for r in plain)[len(plain) // 2] for k in plain[0]}
    print(f"| median of {len(plain)} | {cells(med)}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--durability", choices=("fsync", "os", "memory"), default="fsync")
    ap.add_argument("--n", type=int, default=5000, help="timed pushes per run")
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", choices=("node", "client", "both"), default=None)
    ap.add_argument("--rate", type=int, default=2000, help="py-spy samples per second")
    ap.add_argument(
        "--mode",
        choices=("cpu", "wall"),
        default="cpu",
        help="cpu: samples holding the GIL (busy Python); wall: every main-thread sample, "
        "so time blocked in fsync or waiting on the loop shows too",
    )
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/profile_push"))
    args = ap.parse_args()
    if not 1 <= args.n <= 1_000_000 or not 1 <= args.runs <= 50:
        raise SystemExit("--n must be in 1..1,000,000 and --runs in 1..50")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"zdmq from {Path(sys.modules['zdmq'].__file__ or '').parent}")
    print(f"durability {args.durability}, {args.n} pushes of {len(BODY)} B per run")
    print("| run | push/s | p50 ms | p99 ms | node CPU µs/push | client CPU µs/push |")
    print("|---|---|---|---|---|---|")

    def cells(r: dict[str, float]) -> str:
        return (
            f"{r['rate']:,.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} "
            f"| {r['srv_us']:.0f} | {r['cli_us']:.0f} |"
        )

    run_and_tabulate(
        args.runs,
        bool(args.profile),
        lambda p: run_once(args, p, args.out),
        cells,
        profile=args.profile,
    )
    if args.profile:
        for name in ("node.raw", "client.raw"):
            path = args.out / name
            if path.exists() and args.profile in ("both", name.split(".")[0]):
                print()
                print(summarize(path, args.top, args.mode), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
