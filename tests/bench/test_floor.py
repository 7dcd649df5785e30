"""The `floor` workload: its three rows from a real (tiny) run, its server child process,
and the Content-Length framing both of its ends use.

Checks the rows' shape and signs, not their numbers (a shared 2-core machine gives no
stable ones), and that the server process never outlives the workload.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from zdmq.bench.floor import parse_head, split_message, workload_floor
from zdmq.bench.suite import Knobs


def _children() -> set[int]:
    """PIDs of the live processes whose parent is this one."""
    me = os.getpid()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != b"Z":  # state, ppid
            found.add(int(entry))
    return found


# ---- framing, without sockets ----------------------------------------------------------------


def test_parse_head_finds_the_first_line_and_content_length_in_any_case() -> None:
    head = b"POST /sqlite HTTP/1.1\r\nHost: x\r\ncontent-LENGTH:  100 \r\nX-A: b:c"
    assert parse_head(head) == (b"POST /sqlite HTTP/1.1", 100)
    assert parse_head(b"HTTP/1.1 201 Created\r\nContent-Type: a") == (b"HTTP/1.1 201 Created", 0)
    assert parse_head(b"GET / HTTP/1.1") == (b"GET / HTTP/1.1", 0)
    for bad in (b"-1", b"", b"1e3", b"12 34"):
        with pytest.raises(ValueError):
            parse_head(b"POST / HTTP/1.1\r\nContent-Length: " + bad)


def test_split_message_waits_for_the_whole_body_and_leaves_the_next_message() -> None:
    one = b"POST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
    two = b"POST /b HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
    whole = one + two
    # Every cut short of the first message's end gives nothing and keeps the bytes.
    for cut in range(len(one)):
        buf = bytearray(whole[:cut])
        assert split_message(buf) is None
        assert buf == whole[:cut]
    buf = bytearray(whole + b"POST /c")
    assert split_message(buf) == (b"POST /a HTTP/1.1\r\nContent-Length: 5", b"hello")
    assert split_message(buf) == (b"POST /b HTTP/1.1\r\nContent-Length: 0", b"")
    assert split_message(buf) is None
    assert buf == b"POST /c"


def test_split_message_refuses_an_endless_head_and_a_bad_length() -> None:
    with pytest.raises(ValueError):
        split_message(bytearray(b"POST / HTTP/1.1\r\nX: " + b"a" * 20_000))
    with pytest.raises(ValueError):
        split_message(bytearray(b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n"))


# ---- the server, alone ------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_server_answers_201_refuses_a_bad_length_and_exits_when_stdin_closes(
    tmp_path: Path,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "zdmq.bench.floor", "serve", "--db", str(tmp_path / "s.sqlite3")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        word, port = proc.stdout.readline().split()
        assert word == b"ready"
        with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as s:
            s.sendall(b"POST /sqlite HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
            assert s.recv(4096).startswith(b"HTTP/1.1 201 ")
            s.sendall(b"POST /sqlite HTTP/1.1\r\nContent-Length: nope\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 400 ")
        proc.stdin.close()  # as when the bench process dies
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


# ---- the workload -----------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_quick_floor_gives_three_rows_and_leaves_no_server_running() -> None:
    before = _children()
    lines: list[str] = []
    k = Knobs.quick()
    rows = workload_floor(k, "os", log=lines.append)

    assert [r["system"] for r in rows] == [
        "floor: sqlite commit",
        "floor: bare http",
        "floor: bare http + sqlite commit",
    ]
    for r in rows:
        assert r["workload"] == "floor" and r["durability"] == "os", r
        assert r["variant"] == "1 client", r
        assert r["push_rate"] > 0, r
        assert 0 < r["push_p50_ms"] <= r["push_p99_ms"] < 10_000, r
        # The child's CPU comes from /proc in 10 ms ticks: k.floor_n tiny calls may be 0.
        assert r["push_cpu_us"] >= 0, r
    # The in-process commits are timed by this process's CPU clock (not in ticks):
    # floor_n INSERT + COMMITs cost something, and less than 10 ms each.
    assert k.floor_n >= 200
    assert 0 < rows[0]["push_cpu_us"] < 10_000, rows[0]

    (pid_line,) = [line for line in lines if "server pid" in line]
    pid = int(pid_line.split("server pid ")[1].split()[0])
    assert not os.path.exists(f"/proc/{pid}"), pid_line  # stopped and reaped
    assert _children() <= before


def test_floor_refuses_an_unknown_durability() -> None:
    with pytest.raises(ValueError):
        workload_floor(Knobs.quick(), "fast", log=lambda _: None)
