"""Smoke tests of loadtest/profile_workload.py: a quick workload on a fresh one-node cluster, with
py-spy on the node, with pyinstrument in the clients, and with no profiler."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zdmq.bench.suite import Knobs

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "loadtest" / "profile_workload.py"
PY_SPY = Path(sys.executable).with_name("py-spy")


def _ptrace_blocked() -> str | None:
    """Why py-spy cannot read a node here, if it cannot: the node is its sibling, not its
    child, so Yama's ptrace_scope 1 or 2 allows it only with CAP_SYS_PTRACE (root)."""
    try:
        scope = int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        return None  # no Yama: same-user processes can be read
    if scope >= 3 or (scope >= 1 and os.geteuid() != 0):
        return (
            f"kernel.yama.ptrace_scope={scope}: py-spy cannot read a sibling process as "
            "non-root (sudo sysctl -w kernel.yama.ptrace_scope=0)"
        )
    return None


def _run(tmp_path: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _moved_cpu_syscalls(out: str) -> tuple[int, float, float, float]:
    moved = re.search(r"^messages moved: ([\d,]+) ", out, re.M)
    cpu = re.search(r"^node CPU per message: ([\d.]+) µs", out, re.M)
    calls = re.search(r"^node system calls per message: ([\d.]+) read, ([\d.]+) write", out, re.M)
    assert moved and cpu and calls, out
    return (
        int(moved[1].replace(",", "")),
        float(cpu[1]),
        float(calls[1]),
        float(calls[2]),
    )


def _heaviest(out: str) -> list[str]:
    """The rows of the "by own time" list."""
    section = out.split("heaviest functions by own time", 1)[1].split("\n")[2:]
    rows = []
    for line in section:
        if not re.match(r"^\s+\d+\.\d\s+\S", line):
            break
        rows.append(line)
    return rows


@pytest.mark.skipif(
    not PY_SPY.exists() and shutil.which("py-spy") is None,
    reason="py-spy is not installed (pip install -e '.[dev]')",
)
def test_py_spy_profile_of_the_node_under_the_sequential_workload(tmp_path: Path) -> None:
    blocked = _ptrace_blocked()
    if blocked:
        pytest.skip(blocked)
    out = _run(tmp_path, "sequential", "--profiler", "py-spy")
    k = Knobs.quick()
    moved, cpu_us, reads, writes = _moved_cpu_syscalls(out)
    assert moved == k.seq_n * sum(k.seq_clients)
    assert cpu_us > 0 and reads > 0 and writes > 0
    assert "push/s" in out and "recv+ack/s" in out  # the workload's own table
    rows = _heaviest(out)
    assert rows, out
    assert any("(server/" in r for r in rows), rows  # the node's own code shows up
    raw = tmp_path / "node.txt"
    assert raw.exists() and raw.stat().st_size > 0


def test_no_profiler_still_counts_the_throughput_workload(tmp_path: Path) -> None:
    out = _run(tmp_path, "throughput", "--profiler", "none")
    k = Knobs.quick()
    moved, cpu_us, _, writes = _moved_cpu_syscalls(out)
    assert moved == k.messages // k.producers * k.producers
    assert cpu_us > 0 and writes > 0
    assert "msgs/s through" in out
    assert "heaviest functions" not in out


def test_pyinstrument_profiles_the_client_processes(tmp_path: Path) -> None:
    pytest.importorskip("pyinstrument")
    out = _run(tmp_path, "throughput", "--profiler", "pyinstrument")
    assert _heaviest(out), out
    # Every busy moment of a client is under its phase function's workers.
    including = out.split("heaviest functions including callees:", 1)[1]
    assert "worker (bench/workloads.py)" in including, out
    # The call tree pyinstrument drew (it hides short branches, so only its trunk here).
    tree = (tmp_path / "client-pyinstrument.txt").read_text()
    assert "Samples:" in tree and "_client_main" in tree, tree[:2000]
