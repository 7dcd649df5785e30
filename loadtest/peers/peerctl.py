"""Small stdlib-only helpers for peers.sh: protocol-level readiness probes and peers.json.

    python peerctl.py probe redis|amqp|nats HOST PORT    exit 0 when the server answers
    python peerctl.py probe-replicas nats HOST PORT N    exit 0 once an RN stream can be made
    python peerctl.py write-json PEERS_DIR                peers.json from the live <peer>.info.json
    python peerctl.py status PEERS_DIR PEER...            one line per peer: running or stopped

A probe speaks just enough of each protocol to tell "the port is open" from "the server
serves": Redis must answer PING with +PONG, RabbitMQ must answer the AMQP 0-9-1 header with
a Connection.Start method frame, NATS must send its INFO line with JetStream on. A NATS
cluster is ready when it can place a stream on N servers: probe-replicas creates a small
in-memory stream with N replicas through the JetStream API and deletes it again.
It never installs, starts or kills anything: peers.sh does that.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

PROBE_TIMEOUT_S = 2.0


def _recv_some(sock: socket.socket, want: int) -> bytes:
    data = b""
    while len(data) < want:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def probe(kind: str, host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S) as sock:
            if kind == "redis":
                sock.sendall(b"PING\r\n")
                return _recv_some(sock, 7).startswith(b"+PONG")
            if kind == "amqp":
                sock.sendall(b"AMQP\x00\x00\x09\x01")
                # method frame (type 1) on channel 0, class 10 (connection) method 10 (start)
                head = _recv_some(sock, 11)
                return len(head) >= 11 and head[0] == 1 and head[7:11] == b"\x00\x0a\x00\x0a"
            if kind == "nats":
                line = _recv_some(sock, 5)
                while b"\r\n" not in line:
                    chunk = sock.recv(4096)
                    if not chunk:
                        return False
                    line += chunk
                first = line.split(b"\r\n", 1)[0]
                if not first.startswith(b"INFO "):
                    return False
                return bool(json.loads(first[5:]).get("jetstream"))
    except (OSError, ValueError):
        return False
    raise SystemExit(f"unknown probe kind {kind!r}")


PROBE_STREAM = "ZDMQ_PEERS_PROBE"


class _NatsConn:
    """Just enough of the NATS client protocol for JetStream API requests."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S)
        self.buf = b""
        if not self._line().startswith(b"INFO "):
            raise OSError("no INFO from the server")
        connect = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True}
        self.sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\n")
        self.sock.sendall(b"SUB _INBOX.zdmqprobe 1\r\n")

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise OSError("connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _bytes(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise OSError("connection closed")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2 :]
        return data

    def request(self, subject: str, payload: dict) -> dict | None:
        """The JSON reply, or None when nothing answers (503 no responders)."""
        body = json.dumps(payload).encode()
        self.sock.sendall(
            f"PUB {subject} _INBOX.zdmqprobe {len(body)}\r\n".encode() + body + b"\r\n"
        )
        while True:
            parts = self._line().split()
            if not parts:
                continue
            if parts[0] == b"PING":
                self.sock.sendall(b"PONG\r\n")
            elif parts[0] == b"-ERR":
                raise OSError(b" ".join(parts).decode())
            elif parts[0] == b"MSG":
                return json.loads(self._bytes(int(parts[-1])))
            elif parts[0] == b"HMSG":
                data = self._bytes(int(parts[-1]))
                head_len = int(parts[-2])
                if b" 503" in data[:head_len].split(b"\r\n", 1)[0]:
                    return None
                return json.loads(data[head_len:]) if data[head_len:] else None

    def close(self) -> None:
        self.sock.close()


def probe_replicas(host: str, port: int, replicas: int) -> bool:
    """Whether the cluster behind host:port can make a stream with `replicas` replicas now."""
    try:
        conn = _NatsConn(host, port)
    except OSError:
        return False
    try:
        config = {
            "name": PROBE_STREAM,
            "subjects": ["zdmq-peers-probe"],
            "storage": "memory",
            "num_replicas": replicas,
        }
        made = conn.request(f"$JS.API.STREAM.CREATE.{PROBE_STREAM}", config)
        if not made:
            return False
        conn.request(f"$JS.API.STREAM.DELETE.{PROBE_STREAM}", {})
        if "error" in made:
            return False
        return len(made.get("cluster", {}).get("replicas", [])) == replicas - 1
    except (OSError, ValueError):
        return False
    finally:
        conn.close()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill(0): it is not running
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def live_peers(peers_dir: Path) -> list[dict]:
    peers = []
    for info_path in sorted(peers_dir.glob("*.info.json")):
        info = json.loads(info_path.read_text())
        if info.get("pids") and all(pid_alive(p) for p in info["pids"]):
            peers.append(info)
    return peers


def write_json(peers_dir: Path) -> None:
    out = peers_dir / "peers.json"
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"peers": live_peers(peers_dir)}, indent=2) + "\n")
    tmp.replace(out)


def status(peers_dir: Path, names: list[str]) -> int:
    running = {p["name"]: p for p in live_peers(peers_dir)}
    for name in names:
        if name in running:
            p = running[name]
            pids = ",".join(map(str, p["pids"]))
            ports = ",".join(map(str, p.get("ports", [p["port"]])))
            print(
                f"{name:16} running  {p['host']}:{ports}  pid {pids}  "
                f"durability={p['durability']}  {p['version']}"
            )
        else:
            print(f"{name:16} not running")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "probe":
        return 0 if probe(argv[1], argv[2], int(argv[3])) else 1
    if len(argv) == 5 and argv[0] == "probe-replicas" and argv[1] == "nats":
        return 0 if probe_replicas(argv[2], int(argv[3]), int(argv[4])) else 1
    if len(argv) == 2 and argv[0] == "write-json":
        write_json(Path(argv[1]))
        return 0
    if len(argv) >= 2 and argv[0] == "status":
        return status(Path(argv[1]), argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
