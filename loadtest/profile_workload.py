"""Profile one `zdmq bench` workload on a fresh local cluster, and count what it cost.

    .venv/bin/python loadtest/profile_workload.py WORKLOAD [--nodes 1]
        [--durability fsync|os|memory] [--replication 1] [--profiler py-spy|pyinstrument|none]
        [--target node|client] [--mode cpu|wall] [--rate 500] [--quick] [--top 25]
        [--out DIR] [knob overrides: --messages N ...]

    # one-at-a-time pushes (then receive+ack), 1 client: where a node's push goes
    .venv/bin/python loadtest/profile_workload.py sequential --seq-clients 1 --seq-n 5000
    # 4 producers + 4 consumers, batches of 100 (the node's batch path)
    .venv/bin/python loadtest/profile_workload.py throughput
    # 1 MiB messages
    .venv/bin/python loadtest/profile_workload.py sizes --sizes 1048576
    # a 4-node cluster (node n1 is profiled; CPU and system calls count all four)
    .venv/bin/python loadtest/profile_workload.py throughput --nodes 4
    # the client processes instead of the node; wall clock, fsync left out
    .venv/bin/python loadtest/profile_workload.py throughput --target client --mode wall \
        --durability memory

(Not `profile.py`: a script's folder comes first on sys.path, and a `profile` there
would shadow the standard library's, which cProfile and PySpark import.)

WORKLOAD is a name of `zdmq.bench.suite.WORKLOADS`; it runs once, with `Knobs()` (or
`Knobs.quick()` with --quick) and any knob given on the command line (every field of
`Knobs`, e.g. --seq-n, --messages, --sizes). The cluster comes from
`zdmq.bench.runner.zdmq_systems`, as `zdmq bench` starts it, in a temporary folder.

Always printed, over the whole run (phases, queue resets and the gaps between phases):
messages moved (the nodes' /v1/health counters, summed: `pushed` is the count every
per-message figure divides by), the nodes' user+system CPU per message (/proc/PID/stat,
every node), their read- and write-family system calls per message (/proc/PID/io
syscr/syscw, every node: read/readv/write/writev on sockets and files alike, which is
what uvloop uses; not fsync, epoll or sendmsg), then the workload's own table.

Profilers (raw output kept in --out):
- py-spy, --target node (the default): samples node n1 (`--pid`, `--nonblocking`, so the
  node is never paused). OUT/node.txt.
- py-spy, --target client: samples the benchmark's client processes (`--subprocesses` of
  this process; the nodes and this coordinator are sampled too but left out of the
  summary, as are the samples of a client importing modules). OUT/client.txt.
  `--mode cpu` keeps the samples that hold the GIL: busy Python, and uvloop's C code
  under its `run` (shown as one line), not fsync (sqlite3 lets the GIL go) nor waiting.
  `--mode wall` keeps every main-thread sample (`--idle`): waiting and fsync show too.
- pyinstrument, --target client only (it samples the process it runs in, and the nodes
  are started by `LocalCluster`): each client process runs its phase under pyinstrument,
  wall clock, main thread (this swaps `zdmq.bench.workloads._client_main` for a wrapper,
  and stops with a message if that name goes); OUT/client-pyinstrument.txt is the call
  tree of all clients.
- none: only the counts and the table.
The summary lists the heaviest functions by own time and by time including callees.
py-spy shares the cores with the workload: at 500 samples/s on one node its effect on
throughput was within run-to-run noise on 2 cores, but --target client samples every
process, and pyinstrument slows the clients it runs in.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from locust_report import message_counters

from zdmq.bench import workloads
from zdmq.bench.driver import SystemSpec
from zdmq.bench.report import format_tables
from zdmq.bench.runner import zdmq_systems
from zdmq.bench.suite import WORKLOADS, Knobs
from zdmq.config import ClusterConfig

PYI_ENV = "ZDMQ_PROFILE_PYINSTRUMENT_DIR"  # tells the client processes where to save
LOOP = "(event loop: waiting, or uvloop's C code)"


# ---- counts ---------------------------------------------------------------------------------
def _health(spec: SystemSpec) -> collections.Counter[str]:
    """The nodes' message counters, summed (only 127.0.0.1 urls: the cluster is local)."""
    nodes = ClusterConfig.load(spec.options["config"]).nodes
    for node in nodes:
        if node.host != "127.0.0.1":
            raise SystemExit(f"not a local cluster: {node.url}")
    counted = message_counters({node.id: node.url for node in nodes})
    if counted is None:
        raise SystemExit("a node did not answer GET /v1/health")
    return collections.Counter(counted)


def _io(pids: Iterable[int]) -> tuple[int, int]:
    """Read and write system calls so far, summed over these processes."""
    r = w = 0
    for pid in pids:
        with open(f"/proc/{pid}/io") as f:
            io = dict(line.split(": ") for line in f)
        r, w = r + int(io["syscr"]), w + int(io["syscw"])
    return r, w


# ---- py-spy ---------------------------------------------------------------------------------
def _start_spy(
    pid: int, out: Path, rate: int, mode: str, subprocesses: bool
) -> subprocess.Popen[bytes]:
    exe = Path(sys.executable).with_name("py-spy")
    spy = str(exe) if exe.exists() else shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not installed (pip install py-spy)")
    argv = [spy, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw"]
    argv += ["--output", str(out), "--nonblocking", "--gil" if mode == "cpu" else "--idle"]
    if subprocesses:
        argv.append("--subprocesses")
    log = out.with_suffix(".py-spy.log")
    with open(log, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
    for _ in range(100):  # attached once it says it samples; 10 s at most
        if "Sampling process" in log.read_text(errors="replace"):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    _stop_spy(proc)
    raise SystemExit(f"py-spy did not attach to pid {pid}:\n{log.read_text(errors='replace')}")


def _stop_spy(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


_START_UP = ("_find_and_load ", "_fixup_main_from_path ")
_PROCESS = re.compile(r'process (\d+):"([^"]*)";')


def _spy_stacks(raw: Path, target: str, mode: str) -> Iterator[tuple[list[str], float]]:
    """(frames, samples) of py-spy's collapsed stacks: the node's, or (--subprocesses)
    only those of the spawned client processes after their start-up; in wall mode the
    main thread's only."""
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        procs = _PROCESS.findall(stack)
        stack = _PROCESS.sub("", stack)
        if target == "client" and not (procs and "spawn_main" in procs[-1][1]):
            continue  # a node, this coordinator, the resource tracker
        frames = [_short(f) for f in stack.split(";")]
        if target == "client" and any(f.startswith(_START_UP) for f in frames):
            continue  # a client starting: importing, or re-running this file as __mp_main__
        if mode == "wall" and not frames[0].startswith(("<module> ", "_run_module_as_main ")):
            continue  # not the main thread (its stack starts at the script or the -m module)
        yield frames, float(count)


def _short(frame: str) -> str:
    """ "name (path/to/file.py:123)" -> "name (to/file.py)": one line per function."""
    name, _, where = frame.partition(" (")
    parts = where.rstrip(")").rsplit(":", 1)[0].split("/")
    return f"{name} ({'/'.join(parts[-2:])})" if where else name


# ---- pyinstrument, in each client process ---------------------------------------------------
def _client_main_under_pyinstrument(*args: Any) -> None:
    """`workloads._client_main` with its phase function run under pyinstrument (runs in a
    spawned client process: this module is its `__mp_main__`)."""
    from pyinstrument import Profiler

    out = Path(os.environ[PYI_ENV])

    def profiled(fn: Any) -> Any:
        async def phase(*a: Any, **kw: Any) -> Any:
            profiler = Profiler(interval=0.0005, async_mode="disabled")
            profiler.start()
            try:
                return await fn(*a, **kw)
            finally:
                profiler.stop().save(str(out / f"client-{os.getpid()}-{fn.__name__}.json"))

        return phase

    workloads.PHASES.update({k: profiled(f) for k, f in list(workloads.PHASES.items())})
    workloads._client_main(*args)


def _pyi_stacks(folder: Path) -> tuple[list[tuple[list[str], float]], Any]:
    """(frames, seconds of own time) of every saved client session, and all combined."""
    from pyinstrument.session import Session

    stacks: list[tuple[list[str], float]] = []
    combined = None
    for path in sorted(folder.glob("client-*.json"))[:1000]:
        session = Session.load(str(path))
        combined = session if combined is None else Session.combine(combined, session)
        todo: list[tuple[Any, list[str]]] = [(session.root_frame(), [])]
        while todo:  # bounded by the tree's size
            frame, above = todo.pop()
            if frame is None or frame.is_synthetic:
                continue
            where = "/".join(Path(frame.file_path or "").parts[-2:])
            name = f"{frame.class_name}.{frame.function}" if frame.class_name else frame.function
            frames = [*above, f"{name} ({where})"]
            stacks.append((frames, frame.total_self_time))
            todo += [(c, frames) for c in frame.children]
    return stacks, combined


# ---- the summary ----------------------------------------------------------------------------
def summarize(stacks: Iterable[tuple[list[str], float]], top: int, unit: str) -> str:
    """The heaviest functions by own share and by share including callees. Functions on
    exactly the same stacks (a chain of callers: runpy, main, the event loop's run) share
    one line, named after the innermost."""
    own: dict[str, float] = collections.defaultdict(float)
    incl: dict[str, float] = collections.defaultdict(float)
    on: dict[str, list[int]] = collections.defaultdict(list)  # the stacks a function is on
    depth: dict[str, int] = {}
    total = 0.0
    for i, (frames, n) in enumerate(stacks):
        if not frames or n <= 0:
            continue
        total += n
        leaf = frames[-1]
        own[LOOP if leaf.startswith(("Runner.run ", "run (uvloop", "run_forever ")) else leaf] += n
        for d, f in enumerate(frames):
            if f not in depth or depth[f] < d:
                depth[f] = d
            if not on[f] or on[f][-1] != i:
                on[f].append(i)
                incl[f] += n
    if not total:
        return "heaviest functions: no samples\n"
    chains: dict[tuple[int, ...], list[str]] = collections.defaultdict(list)
    for f, ids in on.items():
        chains[tuple(ids)].append(f)
    grouped = {}
    for fs in chains.values():
        inner = max(fs, key=lambda f: depth[f])
        more = f"  (+{len(fs) - 1} on exactly its stacks)" if len(fs) > 1 else ""
        grouped[inner + more] = incl[inner]
    lines = [f"heaviest functions by own time ({total:,.0f} {unit}):", "  own %  function"]
    lines += [f"  {100 * n / total:5.1f}  {f}" for f, n in _heaviest(own, top)]
    lines += ["heaviest functions including callees:", "  incl % function"]
    lines += [f"  {100 * n / total:5.1f}  {f}" for f, n in _heaviest(grouped, top)]
    return "\n".join(lines) + "\n"


def _heaviest(weights: dict[str, float], top: int) -> list[tuple[str, float]]:
    return sorted(weights.items(), key=lambda kv: -kv[1])[:top]


# ---- main -----------------------------------------------------------------------------------
def _knob_args(ap: argparse.ArgumentParser) -> None:
    for f in dataclasses.fields(Knobs):
        default = getattr(Knobs(), f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(default, tuple):
            ap.add_argument(flag, type=int, nargs="+", help=f"knob (default {default})")
        else:
            ap.add_argument(flag, type=type(default), help=f"knob (default {default})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("workload", choices=list(WORKLOADS))
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--durability", choices=("fsync", "os", "memory"), default="fsync")
    ap.add_argument("--profiler", choices=("py-spy", "pyinstrument", "none"), default="py-spy")
    ap.add_argument("--target", choices=("node", "client"), default=None)
    ap.add_argument("--mode", choices=("cpu", "wall"), default="cpu", help="py-spy only")
    ap.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    ap.add_argument("--replication", type=int, default=1, help="copies of each message")
    ap.add_argument("--quick", action="store_true", help="Knobs.quick(): a smoke run")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results" / "profile"
    )
    _knob_args(ap)
    args = ap.parse_args(argv)
    target = args.target or ("client" if args.profiler == "pyinstrument" else "node")
    if args.profiler == "pyinstrument" and target != "client":
        ap.error(
            "pyinstrument profiles the client processes only (--target client); "
            "use py-spy for the nodes"
        )
    if not (1 <= args.nodes <= 16 and 1 <= args.rate <= 10_000 and 1 <= args.top <= 1000):
        ap.error("--nodes must be in 1..16, --rate in 1..10,000, --top in 1..1,000")
    knobs = Knobs.quick() if args.quick else Knobs()
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(Knobs):
        value = getattr(args, f.name)
        if value is not None:
            changes[f.name] = tuple(value) if isinstance(value, list) else value
    knobs = dataclasses.replace(knobs, **changes)
    args.out.mkdir(parents=True, exist_ok=True)
    pyi_dir = args.out / "pyinstrument"
    if args.profiler == "pyinstrument":
        pyi_dir.mkdir(exist_ok=True)
        for old in list(pyi_dir.glob("client-*.json"))[:10_000]:
            old.unlink()
        if not (hasattr(workloads, "_client_main") and hasattr(workloads, "PHASES")):
            raise SystemExit("zdmq.bench.workloads has no _client_main/PHASES to profile")
        os.environ[PYI_ENV] = str(pyi_dir)  # the spawned clients inherit it
        workloads._client_main = _client_main_under_pyinstrument  # type: ignore[assignment]
    raw = args.out / f"{target}.txt"

    print(
        f"profile: {args.workload}, {args.nodes} node(s), durability {args.durability}, "
        f"replication {args.replication}, "
        f"{args.profiler}" + ("" if args.profiler == "none" else f" on the {target}")
    )
    with zdmq_systems([args.nodes], [args.durability], args.replication) as specs:
        spec = next(s for s in specs if "prefetch" not in s.options)
        pids = spec.server_pids
        h0, io0, cpu0 = _health(spec), _io(pids), workloads.cpu_seconds(pids)
        spy = None
        try:
            if args.profiler == "py-spy":
                spy_pid = pids[0] if target == "node" else os.getpid()
                spy = _start_spy(spy_pid, raw, args.rate, args.mode, target == "client")
            t0 = time.monotonic()
            rows = WORKLOADS[args.workload](spec, knobs)
            wall = time.monotonic() - t0
        finally:
            if spy is not None:
                _stop_spy(spy)
        cpu = workloads.cpu_seconds(pids) - cpu0
        io1, moved = _io(pids), _health(spec) - h0

    n = moved["pushed"]
    per = 1 / n if n else float("nan")
    print(
        f"\nmessages moved: {n:,} in {wall:.1f} s (pushed {n:,}, received {moved['received']:,}, "
        f"acked {moved['acked']:,}, popped {moved['popped']:,}: /v1/health, all nodes)"
    )
    print(
        f"node CPU per message: {cpu * per * 1e6:.1f} µs "
        f"(user+system, {len(pids)} node process(es), {cpu:.2f} s in all)"
    )
    print(
        f"node system calls per message: {(io1[0] - io0[0]) * per:.2f} read, "
        f"{(io1[1] - io0[1]) * per:.2f} write (/proc/PID/io syscr, syscw, all nodes)"
    )
    print()
    print(format_tables(rows))
    if args.profiler == "py-spy":
        kind = "GIL-holding" if args.mode == "cpu" else "main-thread"
        print(f"\npy-spy {args.mode} profile of the {target} ({raw})")
        print(summarize(_spy_stacks(raw, target, args.mode), args.top, f"{kind} samples"), end="")
    elif args.profiler == "pyinstrument":
        stacks, combined = _pyi_stacks(pyi_dir)
        text = args.out / "client-pyinstrument.txt"
        if combined is not None:
            from pyinstrument.renderers import ConsoleRenderer

            text.write_text(ConsoleRenderer(unicode=True, color=False).render(combined))
        print(f"\npyinstrument wall-clock profile of the client phases ({text})")
        print(summarize(((f, s * 1e3) for f, s in stacks), args.top, "ms"), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
