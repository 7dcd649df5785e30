"""Seeded data survives hostile input: every message comes back exactly once, intact.

On a live 4-node cluster, a seeded set of messages (random sizes, bytes and content types;
a JSON content type with a JSON body, as a node requires) is pushed into one queue three
ways: JSON batches, binary batch frames and single raw pushes, to every node in turn. Then,
for a bounded time (8 s by default, a minute in the slow run), the cluster is attacked:

- schemathesis (tests/edge/fuzzing.py), valid and invalid calls of every operation, on any
  queue but the seeded one;
- raw-socket garbage at every node: truncated heads, bodies shorter than their
  Content-Length, oversized lengths, random bytes, a valid request with junk pipelined
  behind it, bad chunked framing;
- half-closed pops of the seeded queue (the caller sends its pops, shuts its sending side
  and reads): the node must answer every pop it read, and what they return counts as
  delivered.

Then the seeded queue is drained, and the checker's verdict: every seeded message came
back exactly once (half-closed pops and drain together), with its body and content type;
no reply was a 5xx; every node is still healthy.

The seed (ZDMQ_FUZZ_SEED, default fuzzing.SEED) is printed; it fixes the messages, the
garbage and schemathesis's cases.
"""

from __future__ import annotations

import base64
import json
import random
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest
import requests
import schemathesis

from tests.edge.fuzzing import SEED, LiveFuzz, fuzz_config, run_operations
from tests.edge.raw import Reply, parse_replies
from zdmq.local import LocalCluster
from zdmq.models import BATCH_CONTENT_TYPE, encode_batch

SEEDED = 2000
CONTENT_TYPES = (
    None,
    "application/json",
    "text/plain; charset=utf-8",
    "application/octet-stream",
    "image/png",
    BATCH_CONTENT_TYPE,  # a message may be labelled as anything, a frame included
    'multipart/mixed; boundary="x y"',
)
POOL = ("jobs", "fuzz-a")
OCTET = "application/octet-stream"


@dataclass(frozen=True)
class Sent:
    body: bytes
    content_type: str | None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.ephemeral(tmp_path_factory.mktemp("integrity"), nodes=4)
    try:
        yield c.start()
    finally:
        c.close()


def _addr(url: str) -> tuple[str, int]:
    u = urlsplit(url)
    assert u.hostname is not None and u.port is not None
    return u.hostname, u.port


def _body(rnd: random.Random) -> bytes:
    """Mostly small bodies, some empty, a few large; text or random bytes."""
    size = rnd.choice((0, rnd.randint(1, 64), rnd.randint(1, 2048), rnd.randint(1, 40_000)))
    if rnd.random() < 0.5:
        return "".join(rnd.choice("abcé€ \n{}\"'") for _ in range(size)).encode()[:size]
    return rnd.randbytes(size)


def _sent(rnd: random.Random) -> Sent:
    body, ctype = _body(rnd), rnd.choice(CONTENT_TYPES)
    if ctype == "application/json":  # a node refuses a JSON-typed body that is not JSON
        body = json.dumps(body.decode("utf-8", "replace")).encode()
    return Sent(body, ctype)


def _fresh_id(rnd: random.Random) -> str:
    return str(uuid.UUID(int=rnd.getrandbits(128), version=4))


# ---- seeding ----------------------------------------------------------------------------
def _seed_queue(urls: list[str], queue: str, rnd: random.Random) -> dict[str, Sent]:
    """Pushes SEEDED messages into `queue`: a third each as JSON batches, binary frames and
    single raw pushes, every node in turn; some with ids of their own, the others with ids
    the node picks. Returns id -> what was sent."""
    sent: dict[str, Sent] = {}
    msgs = [_sent(rnd) for _ in range(SEEDED)]
    own = [_fresh_id(rnd) if rnd.random() < 0.5 else None for _ in msgs]
    with requests.Session() as s:
        assert s.put(f"{urls[0]}/v1/queues/{queue}").status_code == 201
        i, calls = 0, 0
        while i < len(msgs):
            url = f"{urls[calls % len(urls)]}/v1/queues/{queue}"
            way = calls % 3
            calls += 1
            if way == 0:  # a JSON batch
                part = range(i, min(i + rnd.randint(1, 60), len(msgs)))
                items = []
                for k in part:
                    text, enc = _wire_body(msgs[k].body)
                    item = {"body": text, "encoding": enc}
                    if own[k]:
                        item["id"] = own[k]
                    if msgs[k].content_type is not None:
                        item["content_type"] = msgs[k].content_type
                    items.append(item)
                r = s.post(f"{url}/batch", json={"messages": items}, timeout=30)
                assert r.status_code == 201, r.text
                ids = r.json()["ids"]
            elif way == 1:  # a binary batch frame
                part = range(i, min(i + rnd.randint(1, 60), len(msgs)))
                frame = encode_batch(
                    ids=[own[k] for k in part],
                    bodies=[msgs[k].body for k in part],
                    content_types=[msgs[k].content_type for k in part],
                )
                r = s.post(
                    f"{url}/batch",
                    data=frame,
                    headers={"Content-Type": BATCH_CONTENT_TYPE},
                    timeout=30,
                )
                assert r.status_code == 201, r.text
                ids = r.json()["ids"]
            else:  # single raw pushes
                part = range(i, min(i + rnd.randint(1, 10), len(msgs)))
                ids = []
                for k in part:
                    headers = {}
                    if msgs[k].content_type is not None:
                        headers["Content-Type"] = msgs[k].content_type
                    if own[k]:
                        headers["zdmq-id"] = own[k]
                    r = s.post(f"{url}/messages", data=msgs[k].body, headers=headers, timeout=30)
                    assert r.status_code == 201, r.text
                    ids.append(r.json()["id"])
            for k, mid in zip(part, ids, strict=True):
                assert own[k] in (None, mid)
                assert mid not in sent, f"id {mid} given twice"
                sent[mid] = msgs[k]
            i = part[-1] + 1
    assert len(sent) == SEEDED
    return sent


def _wire_body(body: bytes) -> tuple[str, str]:
    try:
        return body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(body).decode(), "base64"


# ---- raw sockets ----------------------------------------------------------------------------
def _exchange(addr: tuple[str, int], raw: bytes, *, half_close: bool) -> list[Reply]:
    """Sends `raw`, then half-closes and reads until the node closes; or, without a
    half-close, reads for a moment and hangs up (a caller gone mid-request). Returns the
    whole replies read."""
    got = bytearray()
    with socket.create_connection(addr, timeout=10) as s:
        try:
            s.sendall(raw)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            else:
                s.settimeout(0.1)
            while chunk := s.recv(65536):
                got += chunk
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            # The node closes a connection it refused, maybe before it read everything;
            # or the caller stopped waiting.
            pass
    return parse_replies(bytes(got), partial=True)


def _request(method: str, path: str, body: bytes = b"", **headers: str) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: edge\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    return head.encode("latin-1") + b"\r\n" + body


def _garbage(rnd: random.Random, queue: str) -> bytes:
    """One piece of hostile input, never addressed to `queue`'s messages."""
    q = rnd.choice(POOL)
    valid = _request("POST", f"/v1/queues/{q}/messages", b"ok")
    kind = rnd.randrange(8)
    if kind == 0:  # a head cut short
        return valid[: rnd.randint(1, len(valid) - 3)]
    if kind == 1:  # a body shorter than its Content-Length
        return _request("POST", f"/v1/queues/{q}/messages", b"x" * 10).replace(
            b"Content-Length: 10", b"Content-Length: 5000"
        )
    if kind == 2:  # an oversized length
        return valid.replace(b"Content-Length: 2", b"Content-Length: " + b"9" * rnd.randint(9, 40))
    if kind == 3:  # random bytes
        return rnd.randbytes(rnd.randint(1, 4096))
    if kind == 4:  # a valid request with junk pipelined behind it
        return valid + rnd.randbytes(rnd.randint(1, 512))
    if kind == 5:  # bad chunked framing
        return (
            f"POST /v1/queues/{q}/batch HTTP/1.1\r\nHost: edge\r\n"
            "Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
        ).encode() + rnd.choice((b"zz\r\n", b"5\r\nab\r\n", b"ffffffffffff\r\n", b"1\r\nx"))
    if kind == 6:  # a head with a broken header line, or a bare LF
        return rnd.choice(
            (
                b"POST /v1/queues/" + q.encode() + b"/pop HTTP/1.1\r\nbad header\r\n\r\n",
                b"GET /v1/health HTTP/1.1\nHost: x\n\n",
                b"GET /v1/health HTTP/9.9\r\n\r\n",
                b"\x00\x01 / HTTP/1.1\r\n\r\n",
            )
        )
    # a request line with a queue path that is not one
    return _request(rnd.choice(("GET", "POST", "PUT")), "/v1/queues/%2F..%2F" + queue + "/pop")


def _half_closed_pops(addr: tuple[str, int], queue: str, rnd: random.Random) -> list[Reply]:
    """One to three pops of `queue` (single form or with `max`), then a half-close."""
    raw = b""
    n = rnd.randint(1, 3)
    for i in range(n):
        target = f"/v1/queues/{queue}/pop" + ("" if rnd.random() < 0.5 else "?max=3")
        headers = {"Connection": "close"} if i == n - 1 and rnd.random() < 0.3 else {}
        raw += _request("POST", target, **headers)
    replies = _exchange(addr, raw, half_close=True)
    assert len(replies) == n, f"{n} pops sent, {len(replies)} answered: {replies}"
    return replies


@dataclass
class Attack:
    """What the raw-socket attackers saw: statuses and the seeded messages they popped."""

    statuses: Counter[int]
    delivered: list[tuple[str, bytes, str | None, bool]]  # id, body, content type, raw form
    sent: int = 0


def _attack_raw(urls: list[str], queue: str, seed: int, until: float, out: Attack) -> None:
    rnd = random.Random(seed)
    while time.monotonic() < until:
        addr = _addr(urls[out.sent % len(urls)])
        out.sent += 1
        if rnd.random() < 0.15:
            for status, headers, body in _half_closed_pops(addr, queue, rnd):
                out.statuses[status] += 1
                out.delivered.extend(_popped(status, headers, body))
            continue
        for status, _, _ in _exchange(addr, _garbage(rnd, queue), half_close=rnd.random() < 0.5):
            out.statuses[status] += 1


def _popped(
    status: int, headers: dict[str, str], body: bytes
) -> list[tuple[str, bytes, str | None, bool]]:
    if status == 204:
        return []
    assert status == 200, (status, body[:300])
    if "zdmq-id" not in headers:  # a pop with `max` (a single-form pop names its message)
        assert headers.get("content-type") == "application/json", headers
        return [_from_wire(m) for m in json.loads(body)["messages"]]
    return [(headers["zdmq-id"], body, headers.get("content-type"), True)]


def _from_wire(m: dict[str, str]) -> tuple[str, bytes, str | None, bool]:
    raw = base64.b64decode(m["body"]) if m["encoding"] == "base64" else m["body"].encode()
    return m["id"], raw, m.get("content_type"), False


# ---- draining ---------------------------------------------------------------------------
def _drain(urls: list[str], queue: str) -> list[tuple[str, bytes, str | None, bool]]:
    got: list[tuple[str, bytes, str | None, bool]] = []
    with requests.Session() as s:
        empty_in_a_row = 0
        n = 0
        while empty_in_a_row < len(urls):
            url = urls[n % len(urls)]
            n += 1
            r = s.post(f"{url}/v1/queues/{queue}/pop", params={"max": "1000"}, timeout=30)
            assert r.status_code == 200, r.text
            msgs = r.json()["messages"]
            got.extend(_from_wire(m) for m in msgs)
            empty_in_a_row = 0 if msgs else empty_in_a_row + 1
        stats = s.get(f"{urls[0]}/v1/queues/{queue}", timeout=30).json()
        assert stats["messages"] == 0 and not stats["unavailable"], stats
    return got


@pytest.mark.parametrize(
    "attack_s", [pytest.param(8.0, id="8s"), pytest.param(60.0, marks=pytest.mark.slow, id="60s")]
)
def test_seeded_messages_come_back_exactly_once_and_intact_after_hostile_input(
    cluster: LocalCluster, attack_s: float
) -> None:
    print(f"\nintegrity seed {SEED} (ZDMQ_FUZZ_SEED)")
    urls = cluster.urls
    queue = f"seeded-{SEED}-{attack_s:g}s"  # each run its own queue and messages
    started = time.monotonic()
    sent = _seed_queue(urls, queue, random.Random(queue))
    seeded_s = time.monotonic() - started

    with requests.Session() as s:
        for q in POOL:
            assert s.put(f"{urls[1]}/v1/queues/{q}").status_code in (201, 409)
    schema = schemathesis.openapi.from_url(
        f"{urls[0]}/v1/openapi.yaml", config=fuzz_config(max_examples=8)
    )
    fuzz = LiveFuzz(urls, pool=POOL, avoid={queue})
    until = time.monotonic() + attack_s
    raw = Attack(Counter(), [])
    attacker = threading.Thread(target=_attack_raw, args=(urls, queue, SEED, until, raw))
    attacker.start()
    failures: dict[str, str] = {}
    rounds = 0
    try:
        while time.monotonic() < until:
            found = run_operations(schema, fuzz, max_examples=8, seed=SEED + rounds, deadline=until)
            rounds += 1
            for label, why in found.items():
                failures.setdefault(label, why)
    finally:
        attacker.join()
        fuzz.close()
    attacked_s = time.monotonic() - started - seeded_s

    drained = _drain(urls, queue)
    print(
        f"seeded {len(sent)} in {seeded_s:.1f}s; attack {attacked_s:.1f}s: schemathesis "
        f"{fuzz.total} requests ({rounds} rounds), raw {raw.sent} exchanges, statuses "
        f"{dict(sorted((fuzz.statuses + raw.statuses).items()))}; half-closed pops took "
        f"{len(raw.delivered)}, drain {len(drained)}"
    )
    assert not failures, "\n\n".join(f"{label}: {why}" for label, why in failures.items())
    # 505 is the framing's answer to random bytes where the version goes; any other 5xx is
    # a server error.
    assert not [st for st in raw.statuses if st >= 500 and st != 505], raw.statuses

    # The verdict: every seeded message exactly once, body and content type intact.
    seen = Counter(mid for mid, _, _, _ in raw.delivered + drained)
    duplicated = sorted(mid for mid, k in seen.items() if k > 1)
    lost = sorted(set(sent) - set(seen))
    strangers = sorted(set(seen) - set(sent))
    assert not duplicated and not lost and not strangers, (
        f"{len(duplicated)} duplicated {duplicated[:5]}, {len(lost)} lost {lost[:5]}, "
        f"{len(strangers)} not seeded {strangers[:5]}"
    )
    for mid, body, ctype, raw_form in raw.delivered + drained:
        want = sent[mid]
        assert body == want.body, f"{mid}: body changed"
        if raw_form:  # a single-form pop answers octet-stream for no content type
            assert ctype == (want.content_type or OCTET), (mid, ctype, want.content_type)
        else:
            assert ctype == want.content_type, (mid, ctype, want.content_type)
    for url in urls:
        assert requests.get(f"{url}/v1/health", timeout=10).json()["status"] == "ok"
