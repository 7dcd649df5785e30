"""Shared test helpers: waiting on conditions (never fixed sleeps), unique names, a node's
resident memory, and the certificates of a TLS test cluster."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from zdmq.auth import NODE_AUTH_HEADER, NodeSigner, node_secret
from zdmq.config import ClusterConfig
from zdmq.server.node import FORWARDED_HEADER

# `ZDMQ_TEST_TLS=1`: the shared cluster fixtures start their clusters with `tls` (HTTPS for
# clients and between nodes) and the test clients trust the session's CA.
TEST_TLS = os.environ.get("ZDMQ_TEST_TLS", "") not in ("", "0")
# `ZDMQ_TEST_REPLICATION=3`: the shared cluster fixtures keep that many copies (Raft
# replica groups) instead of the default one.
TEST_REPLICATION = int(os.environ.get("ZDMQ_TEST_REPLICATION", "1"))

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def make_ca_and_cert(d: Path, hosts: Sequence[str] = ("127.0.0.1",)) -> dict[str, str]:
    """A CA, and a node certificate it signed for the IP addresses `hosts` (in its
    subjectAltName), made in `d` by the openssl command; paths as cluster.yaml's `tls`
    block takes them."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    openssl("req", "-x509", *EC, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=zdmq test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    openssl("req", *EC, "-keyout", "node.key", "-out", "node.csr", "-subj", f"/CN={hosts[0]}")
    names = ",".join(f"IP:{h}" for h in hosts)
    (d / "ext.cnf").write_text(f"subjectAltName={names}\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "node.pem", "-days", "2", "-extfile", "ext.cnf")  # fmt: skip
    return {"cert": str(d / "node.pem"), "key": str(d / "node.key"), "ca": str(d / "ca.pem")}


def rss_kib(pid: int) -> int:
    """The process's resident set (VmRSS), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS line for pid {pid}")


def unique(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def wait_until(
    pred: Callable[[], Awaitable[bool]], *, timeout_s: float = 10.0, what: str = "condition"
) -> None:
    """Polls an async predicate until it holds; fails the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if await pred():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)


def node_signed(
    config: ClusterConfig, node_id: str, method: str, target: str, body: bytes = b""
) -> dict[str, str]:
    """The headers of a node-to-node call from `node_id`: marked forwarded and signed
    with the cluster's node secret (what `Node.peer_call` sends)."""
    signer = NodeSigner(node_secret(config, create=False), node_id)
    return {
        FORWARDED_HEADER: node_id,
        NODE_AUTH_HEADER: signer.value(f"{method} {target}".encode(), body),
    }


def json_bytes(payload: Any) -> bytes:
    return orjson.dumps(payload)
