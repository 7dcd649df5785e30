"""Schemathesis against live nodes: its configuration, and one caller that sends its cases.

`fuzz_config` is the schemathesis configuration of zdmq's runs (the checks, the seed, how
many examples per operation). `LiveFuzz` sends each generated case to a live cluster and
validates the reply against the document the node serves (zdmq/server/openapi.yaml):

- every reply: no 5xx; a status code, content type, headers and body the document gives
  for that call; a schema-violating request refused (`negative_data_rejection`);
- calls go to every node in turn, so forwarding between nodes is exercised;
- a share of the calls on a queue name go to a few queues that exist and hold messages
  (`pool`), so pops, receives and settles reach real messages rather than only 404s;
- long polls are cut to `WAIT_CAP_S`: a run is many calls, not a few waits;
- queues in `avoid` are never named (a run that must leave some data alone).

A single-form pop (no `max`) replies with a message's body as pushed and the content type
it was pushed with (`application/json` included): the document's schemas for that reply
take any JSON and any bytes, and its `zdmq-id` header must be a message id.

Requests are counted on the wire (a `requests` response hook), per operation.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import hypothesis
import requests
import schemathesis
from hypothesis import HealthCheck, Phase

SEED = int(os.environ.get("ZDMQ_FUZZ_SEED", "20261125"))
WAIT_CAP_S = 0.05
POOL_SHARE = 0.35
REQUEST_TIMEOUT_S = 15.0
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
)
SINGLE_POP = "POST /v1/queues/{queue}/pop"
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def fuzz_config(*, max_examples: int, seed: int = SEED) -> schemathesis.Config:
    """zdmq's schemathesis settings, as a schemathesis.toml would hold them: the checks
    above and no others, positive and negative cases, a fixed seed, no example database
    (a run depends on its seed alone), no shrinking (a failure is reported as found)."""
    checks: dict[str, Any] = {"enabled": False}
    checks.update({name: {"enabled": True} for name in CHECKS})
    return schemathesis.Config.from_dict(
        {
            "seed": seed,
            "request-timeout": REQUEST_TIMEOUT_S,
            "checks": checks,
            "generation": {
                "mode": "all",
                "max-examples": max_examples,
                "database": "none",
                "no-shrink": True,
            },
        }
    )


class LiveFuzz:
    """Sends schemathesis cases to a live cluster and validates each reply."""

    def __init__(
        self,
        urls: list[str],
        *,
        pool: Iterable[str] = (),
        avoid: Iterable[str] = (),
        seed: int = SEED,
    ) -> None:
        self.urls = urls
        self.pool = list(pool)
        self.avoid = set(avoid)
        self.seed = seed
        self.cases = 0
        self.requests: Counter[str] = Counter()  # operation label -> requests on the wire
        self.statuses: Counter[int] = Counter()
        self._lock = threading.Lock()
        self.session = requests.Session()
        self.session.hooks["response"].append(self._count)

    def _count(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            self.statuses[response.status_code] += 1

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    def close(self) -> None:
        self.session.close()

    def _steer(self, case: schemathesis.Case, rnd: random.Random) -> None:
        """Points a share of the calls at the pool, none at `avoid`; cuts long polls."""
        params = case.path_parameters
        if params and "queue" in params:
            if self.pool and (rnd.random() < POOL_SHARE or params["queue"] in self.avoid):
                params["queue"] = rnd.choice(self.pool)
            elif params["queue"] in self.avoid:
                params["queue"] = f"{params['queue']}-not"
        query = case.query
        if query and "wait_s" in query:
            wait = query["wait_s"]
            if isinstance(wait, int | float) and not isinstance(wait, bool) and 0 < wait <= 20:
                query["wait_s"] = min(wait, WAIT_CAP_S)

    def call(self, case: schemathesis.Case) -> schemathesis.Response:
        """Sends one case to the next node and validates the reply (raises on a failure)."""
        with self._lock:
            n = self.cases
            self.cases += 1
        rnd = random.Random(self.seed * 1_000_003 + n)
        self._steer(case, rnd)
        base_url = self.urls[n % len(self.urls)]
        single_pop = case.operation.label == SINGLE_POP and "max" not in (case.query or {})
        before = sum(self.statuses.values())
        try:
            response = case.call(base_url=base_url, session=self.session, timeout=REQUEST_TIMEOUT_S)
        finally:
            with self._lock:
                self.requests[case.operation.label] += sum(self.statuses.values()) - before
        case.validate_response(response)
        if single_pop and response.status_code == 200:
            mid = ",".join(response.headers.get("zdmq-id", []))
            assert _UUID.match(mid), f"a single-form pop's zdmq-id is not a message id: {mid!r}"
        return response


def run_operations(
    schema: schemathesis.BaseSchema,
    fuzz: LiveFuzz,
    *,
    max_examples: int,
    seed: int = SEED,
    keep: Callable[[str], bool] = lambda label: True,
    deadline: float | None = None,
) -> dict[str, str]:
    """Runs every operation `keep` selects with Hypothesis, `max_examples` valid and as
    many invalid cases each (fewer where the inputs run out), through `fuzz.call`, until
    `deadline` (time.monotonic()) if given. Returns operation label -> the failure it
    found; an operation stops at its first."""
    failures: dict[str, str] = {}
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    for result in schema.get_all_operations():
        operation = result.ok()
        if not keep(operation.label):
            continue
        for mode in modes:
            if deadline is not None and time.monotonic() > deadline:
                return failures

            @hypothesis.seed(seed)
            @hypothesis.settings(
                max_examples=max_examples,
                database=None,
                deadline=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
                verbosity=hypothesis.Verbosity.quiet,
            )
            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            def run(case: schemathesis.Case) -> None:
                if deadline is None or time.monotonic() < deadline:
                    fuzz.call(case)

            try:
                run()
            except hypothesis.errors.Unsatisfiable:
                continue  # nothing of this operation can be made invalid
            except (Exception, BaseExceptionGroup) as e:  # a failed check (schemathesis
                # reports several as a group): keep it, go on with the next operation
                failures.setdefault(operation.label, f"{mode.value}: {e}")
    return failures
