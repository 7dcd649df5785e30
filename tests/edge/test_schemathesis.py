"""Schemathesis against a live 4-node cluster, from the document a node serves.

Every operation of /v1/openapi.yaml is called with generated requests, valid and invalid
(schemathesis's examples, coverage and fuzzing phases), each sent to the next of the four
nodes in turn; every reply must be one the document gives (no 5xx; status code, content
type, headers and body as documented; an invalid request refused; a method a path does not
take answered 405 with `Allow`). See tests/edge/fuzzing.py for how cases are sent and
checked.

Schemathesis leaves out the operation that serves the document it was loaded from
(GET /v1/openapi.yaml); tests/node/test_openapi.py checks that reply. A method a path does
not take is probed on every documented path: 405, with `Allow` listing exactly the
documented methods.

The run is seeded (ZDMQ_FUZZ_SEED, default in fuzzing.SEED; printed): the same seed
generates the same requests. The default run makes at least 1,000 requests; the slow one
(`-m slow`) over 16,000.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests
import schemathesis

from tests.edge.fuzzing import SEED, LiveFuzz, fuzz_config, run_operations
from zdmq.local import LocalCluster

SHORT_EXAMPLES = 30  # per operation and mode (valid, invalid): >= 1,000 calls in all
SHORT_MIN_REQUESTS = 1000
SLOW_EXAMPLES = 1000  # about 24,000 requests, 4-6 minutes
POOL = ("jobs", "fuzz-a", "fuzz-b")  # "jobs" is the document's example queue name


@pytest.fixture(scope="module")
def fuzz_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.ephemeral(tmp_path_factory.mktemp("fuzz"), nodes=4)
    try:
        yield c.start()
    finally:
        c.close()


def _fill_pool(url: str) -> None:
    """The pool's queues, holding messages of several content types (valid bodies for
    each, so a pop with `max` has something to return)."""
    with requests.Session() as s:
        for q in POOL:
            assert s.put(f"{url}/v1/queues/{q}").status_code in (201, 409)
            for body, ctype in (
                (b'{"n": 1}', "application/json"),
                (b"plain", "text/plain; charset=utf-8"),
                (b"\x00\xff", None),
            ):
                headers = {"Content-Type": ctype} if ctype else {}
                r = s.post(f"{url}/v1/queues/{q}/messages", data=body, headers=headers)
                assert r.status_code == 201, r.text


@pytest.fixture(scope="module")
def live_schema(fuzz_cluster: LocalCluster) -> schemathesis.BaseSchema:
    """The document as the first node serves it, the pool filled."""
    url = fuzz_cluster.urls[0]
    _fill_pool(url)
    return schemathesis.openapi.from_url(
        f"{url}/v1/openapi.yaml", config=fuzz_config(max_examples=SHORT_EXAMPLES)
    )


def _labels(schema: schemathesis.BaseSchema) -> set[str]:
    return {result.ok().label for result in schema.get_all_operations()}


def _fuzz(cluster: LocalCluster, schema: schemathesis.BaseSchema, max_examples: int) -> LiveFuzz:
    print(f"\nschemathesis seed {SEED} (ZDMQ_FUZZ_SEED); {max_examples} examples per operation")
    fuzz = LiveFuzz(cluster.urls, pool=POOL)
    started = time.monotonic()
    try:
        failures = run_operations(schema, fuzz, max_examples=max_examples)
    finally:
        fuzz.close()
    took = time.monotonic() - started
    print(f"{fuzz.total} requests in {took:.1f}s; statuses {dict(sorted(fuzz.statuses.items()))}")
    print(dict(sorted(fuzz.requests.items())))
    assert not failures, "\n\n".join(f"{label}: {why}" for label, why in failures.items())
    assert set(fuzz.requests) == _labels(schema), "an operation was never called"
    return fuzz


def test_every_operation_answers_generated_requests_as_the_document_says(
    fuzz_cluster: LocalCluster, live_schema: schemathesis.BaseSchema
) -> None:
    fuzz = _fuzz(fuzz_cluster, live_schema, SHORT_EXAMPLES)
    assert fuzz.total >= SHORT_MIN_REQUESTS


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_operation_answers_many_generated_requests_as_the_document_says(
    fuzz_cluster: LocalCluster, live_schema: schemathesis.BaseSchema
) -> None:
    fuzz = _fuzz(fuzz_cluster, live_schema, SLOW_EXAMPLES)
    assert fuzz.total >= 16_000


METHODS = ("GET", "PUT", "POST", "DELETE", "PATCH", "OPTIONS", "TRACE")


def test_every_method_a_documented_path_does_not_take_is_405_with_the_documented_allow(
    fuzz_cluster: LocalCluster, live_schema: schemathesis.BaseSchema
) -> None:
    """The document's methods per path are exactly the ones a node's `Allow` lists."""
    documented: dict[str, set[str]] = {}
    for result in live_schema.get_all_operations():
        op = result.ok()
        documented.setdefault(op.path, set()).add(op.method.upper())
    documented.setdefault("/v1/openapi.yaml", {"GET"})  # the document's own path
    probes = 0
    with requests.Session() as s:
        for i, (path, methods) in enumerate(sorted(documented.items())):
            url = fuzz_cluster.urls[i % len(fuzz_cluster.urls)] + path.replace("{queue}", "jobs")
            for method in sorted(set(METHODS) - methods):
                r = s.request(method, url, timeout=10)
                probes += 1
                assert r.status_code == 405, (method, path, r.status_code, r.text)
                assert r.json()["error"]["code"] == "method_not_allowed"
                assert set(r.headers["Allow"].split(", ")) == methods, (method, path)
    assert probes >= 50
