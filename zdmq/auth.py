"""Who may call a node: other nodes by the cluster's node secret, clients by bearer token.

Node to node. Every call a node makes to another (`Node.peer_call`: forwarded calls and
the `/v1/internal/` protocol) carries

    zdmq-node-auth: <node id>:<unix time, s>:<hex HMAC-SHA256>

where the MAC, keyed by the cluster's node secret, covers the calling node's id, the
time, the request line (`METHOD target`, as sent) and the SHA-256 of the body. A node
accepts it when the node id is in cluster.yaml, the time is within `MAX_SKEW_S` of its
own clock and the MAC matches (`hmac.compare_digest`). One HMAC and one body hash per
call: about 2 µs on a small call.

The secret comes from `$ZDMQ_NODE_SECRET`, else `auth.node_secret_file`, else (only on a
cluster whose nodes all listen on loopback) `<data_dir>/node.secret`, made with mode 0600
by the first node to start and read by the others.

Clients. With `auth.client_tokens` set, every route but `/v1/health` and
`/v1/openapi.yaml` needs `Authorization: Bearer <token>`, and the token's rights on the
queue's name (`read`, `write`, `admin` per name prefix; docs/api.md has the table). With
it unset, clients need no token: allowed only when every node listens on loopback.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable, Container, Mapping
from pathlib import Path

from zdmq.config import ClientToken, ClusterConfig
from zdmq.errors import ConfigError, Forbidden, Unauthorized

__all__ = [
    "MAX_SKEW_S",
    "NODE_AUTH_HEADER",
    "SECRET_ENV",
    "SECRET_FILE",
    "TOKEN_ENV",
    "ClientGuard",
    "NodeSigner",
    "NodeVerifier",
    "bearer_headers",
    "check_serving",
    "node_secret",
]

NODE_AUTH_HEADER = "zdmq-node-auth"
SECRET_ENV = "ZDMQ_NODE_SECRET"
SECRET_FILE = "node.secret"  # in data_dir, on a loopback-only cluster with no secret named
TOKEN_ENV = "ZDMQ_TOKEN"  # the client's and the CLI's token when none is given
MAX_SKEW_S = 60
_MIN_SECRET_BYTES = 16
_EMPTY_DIGEST = hashlib.sha256(b"").digest()


# ---- the node secret -------------------------------------------------------------------------
def node_secret(config: ClusterConfig, *, create: bool = True) -> bytes:
    """The cluster's node secret; ConfigError when there is none this node may use.

    `create`: on a loopback-only cluster with no secret named, make the data_dir's
    secret file if no node has yet (race-safe: written aside, then linked into place,
    so a reader never sees a half-written file)."""
    env = os.environ.get(SECRET_ENV)
    if env:
        return _checked(env.strip().encode(), f"${SECRET_ENV}")
    path = config.auth.node_secret_file
    if path is not None:
        return _read_secret(path)
    if not config.all_loopback:
        raise ConfigError(
            "auth: the nodes do not all listen on loopback, so the cluster must name its "
            f"node secret: set ${SECRET_ENV} or auth.node_secret_file (the same secret on "
            "every node; see docs/operations.md)"
        )
    path = config.data_dir / SECRET_FILE
    if create and not path.exists():
        _create_secret(path)
    return _read_secret(path)


def _create_secret(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        # Fails if another node's file got there first: that one is the secret.
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _read_secret(path: Path) -> bytes:
    try:
        mode = path.stat().st_mode
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"auth: cannot read the node secret {path}: {e.strerror or e}") from None
    if mode & 0o077:
        raise ConfigError(
            f"auth: the node secret {path} is readable by others (mode {mode & 0o777:o}); "
            f"chmod 600 it"
        )
    return _checked(raw.strip(), str(path))


def _checked(secret: bytes, where: str) -> bytes:
    if len(secret) < _MIN_SECRET_BYTES:
        raise ConfigError(f"auth: the node secret in {where} is shorter than 16 bytes")
    return secret


def check_serving(config: ClusterConfig) -> None:
    """Refuses to serve a cluster open to clients on a network: with nodes off loopback,
    `auth.client_tokens` must be set (and each token_env must be set too)."""
    if config.auth.client_tokens is None and not config.all_loopback:
        off = [n.id for n in config.nodes if not n.is_loopback]
        raise ConfigError(
            f"auth.client_tokens: nodes {', '.join(off)} listen off loopback, so clients "
            "must use tokens: set auth.client_tokens (docs/operations.md)"
        )


# ---- node to node ----------------------------------------------------------------------------
def _mac(key: bytes, node_id: bytes, ts: bytes, start: bytes, body: bytes) -> str:
    digest = hashlib.sha256(body).digest() if body else _EMPTY_DIGEST
    msg = b"\n".join((node_id, ts, start, digest))
    return hmac.digest(key, msg, "sha256").hex()


class NodeSigner:
    """Signs this node's calls: `sign(b"METHOD target", body)` -> the header line."""

    __slots__ = ("_id", "_key", "_prefix")

    def __init__(self, secret: bytes, node_id: str) -> None:
        self._key = secret
        self._id = node_id.encode()
        self._prefix = f"{NODE_AUTH_HEADER}: {node_id}:".encode()

    def value(self, start: bytes, body: bytes, now: float | None = None) -> str:
        ts = b"%d" % int(time.time() if now is None else now)
        return f"{self._id.decode()}:{ts.decode()}:{_mac(self._key, self._id, ts, start, body)}"

    def __call__(self, start: bytes, body: bytes) -> bytes:
        ts = b"%d" % int(time.time())
        mac = _mac(self._key, self._id, ts, start, body)
        return b"%s%s:%s\r\n" % (self._prefix, ts, mac.encode())


class NodeVerifier:
    """Checks a `zdmq-node-auth` value; returns the calling node's id."""

    __slots__ = ("_key", "_nodes", "_unknown")

    def __init__(
        self,
        secret: bytes,
        node_ids: Container[str],
        on_unknown: Callable[[str], None] | None = None,
    ) -> None:
        """`node_ids`: the nodes whose calls it takes (a container the caller may change
        as nodes join). `on_unknown(node)`: told of a call signed with the cluster's
        secret by a node `node_ids` does not hold (yet): one added to the cluster after
        this node last learned its map, which it may then learn."""
        self._key = secret
        self._nodes = node_ids
        self._unknown = on_unknown

    def verify(
        self, value: str, method: str, target: str, body: bytes, *, any_node: bool = False
    ) -> str:
        """`any_node`: also a node this one does not know yet (one that joins the
        cluster asks for its map before any other node knows it)."""
        node_id, _, rest = value.partition(":")
        ts, _, mac = rest.partition(":")
        known = node_id in self._nodes or (any_node and bool(node_id))
        if not known and self._unknown is None:
            raise Unauthorized("node credential: not a node of this cluster")
        if not (ts.isascii() and ts.isdigit()) or abs(time.time() - int(ts)) > MAX_SKEW_S:
            raise Unauthorized(
                f"node credential: its time is not within {MAX_SKEW_S} s of this node's clock"
            )
        start = f"{method} {target}".encode("latin-1", "replace")
        want = _mac(self._key, node_id.encode(), ts.encode(), start, body)
        if not hmac.compare_digest(want, mac):
            raise Unauthorized("node credential: the signature does not match")
        if not known:
            assert self._unknown is not None
            self._unknown(node_id)
            raise Unauthorized("node credential: not a node of this cluster (as far as it knows)")
        return node_id


# ---- clients ---------------------------------------------------------------------------------
def bearer_headers(token: str | None) -> dict[str, str]:
    """The header a client sends its token in ({} for no token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


class ClientGuard:
    """The client tokens a node accepts, resolved (token_env read) when it starts."""

    __slots__ = ("_by_secret",)

    def __init__(self, tokens: tuple[ClientToken, ...], env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        self._by_secret: dict[bytes, ClientToken] = {}
        for t in tokens:
            secret = t.token if t.token is not None else env.get(t.token_env or "")
            if not secret:
                raise ConfigError(
                    f"auth.client_tokens: token {t.name!r} reads ${t.token_env}, which is not set"
                )
            self._by_secret[hashlib.sha256(secret.encode()).digest()] = t

    def token(self, authorization: str | None) -> ClientToken:
        """The token of an `Authorization` header; Unauthorized for none or an unknown one."""
        if authorization is None:
            raise Unauthorized("this call needs a client token: Authorization: Bearer <token>")
        scheme, _, secret = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not secret:
            raise Unauthorized("expected Authorization: Bearer <token>")
        # Looked up by its hash: the dict compares digests, never the secret itself.
        token = self._by_secret.get(hashlib.sha256(secret.strip().encode()).digest())
        if token is None:
            raise Unauthorized("the client token is not valid")
        return token


def rights_on(token: ClientToken, queue: str) -> frozenset[str]:
    """The rights `token` has on `queue`: those of every prefix of its name it lists
    (admin includes read and write)."""
    got: set[str] = set()
    for prefix, rights in token.rights:
        if queue.startswith(prefix):
            got |= rights
    if "admin" in got:
        got |= {"read", "write"}
    return frozenset(got)


def require(token: ClientToken, queue: str, right: str) -> None:
    if right not in rights_on(token, queue):
        raise Forbidden(f"token {token.name!r} has no {right} right on queue {queue!r}")
