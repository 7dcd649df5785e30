"""The metrics registry and the log formats, in process: per-queue series capped and
removed, the exposition parsed back, request ids checked, JSON log lines."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client.parser import text_string_to_metric_families

from zdmq.logs import (
    JsonFormatter,
    RateLimitedLog,
    TextFormatter,
    exit_error,
    new_request_id,
    parse_ready_line,
    ready_line,
    request_id,
    valid_request_id,
)
from zdmq.server.metrics import OTHER_QUEUE, NodeMetrics


def pushed(m: NodeMetrics) -> dict[str, float]:
    return {
        s.labels["queue"]: s.value
        for f in text_string_to_metric_families(m.exposition().decode())
        for s in f.samples
        if s.name == "zdmq_messages_pushed_total"
    }


def test_queues_past_the_cap_share_the_other_series_and_a_deleted_queue_frees_its_place() -> None:
    m = NodeMetrics("n1", max_queues=3)
    for i in range(5):
        m.count("pushed", f"q{i}", 2)
    assert pushed(m) == {"q0": 2, "q1": 2, "q2": 2, OTHER_QUEUE: 4}
    m.forget_queue("q1")
    m.count("pushed", "q9", 1)
    assert pushed(m) == {"q0": 2, "q2": 2, "q9": 1, OTHER_QUEUE: 4}


def test_requests_are_counted_by_route_pattern_and_unmatched_paths_share_one_series() -> None:
    m = NodeMetrics("n1")
    m.request("/v1/queues/{queue}", "GET", 200, 0.001)
    m.request("/v1/queues/{queue}", "GET", 200, 0.002)
    m.request("", "GET", 404, 0.0001)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(m.exposition().decode())
        for s in f.samples
    }
    key = (("code", "200"), ("method", "GET"), ("route", "/v1/queues/{queue}"))
    assert samples[("zdmq_http_requests_total", key)] == 2
    unmatched = (("code", "404"), ("method", "GET"), ("route", "_unmatched"))
    assert samples[("zdmq_http_requests_total", unmatched)] == 1
    count = ("zdmq_http_request_duration_seconds_count",)
    assert samples[(*count, (("method", "GET"), ("route", "/v1/queues/{queue}")))] == 2


def test_request_ids_are_bounded_printable_ascii_without_spaces() -> None:
    assert valid_request_id("abc-123_X.y")
    assert valid_request_id(new_request_id())
    assert new_request_id() != new_request_id()
    for bad in ("", "a b", "x" * 129, "é", "a\tb", "a\x00"):
        assert not valid_request_id(bad), bad


def _record(msg: str, **extra: object) -> logging.LogRecord:
    r = logging.LogRecord("zdmq.test", logging.INFO, __file__, 1, msg, (), None)
    r.__dict__.update(extra)
    return r


def test_json_lines_hold_the_node_the_request_id_and_the_record_fields() -> None:
    token = request_id.set("rid-7")
    try:
        line = JsonFormatter("n2").format(_record("hello\nworld", event="campaign", group="n3"))
    finally:
        request_id.reset(token)
    assert "\n" not in line
    got = json.loads(line)
    assert got["message"] == "hello\nworld"
    assert (got["node"], got["level"], got["logger"]) == ("n2", "INFO", "zdmq.test")
    assert (got["request_id"], got["event"], got["group"]) == ("rid-7", "campaign", "n3")
    assert got["time"].endswith("+00:00")
    text = TextFormatter("n2").format(_record("hello", event="campaign"))
    assert text.endswith("node=n2 zdmq.test: hello [event=campaign]")


@contextmanager
def _json_root_logger(node_id: str) -> Iterator[io.StringIO]:
    """The root logger writes JSON lines (as `setup_logging("json")` makes it) into the
    yielded buffer."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter(node_id))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield out
    finally:
        root.removeHandler(handler)


def test_the_readiness_line_is_text_or_a_json_object_and_either_reads_back() -> None:
    url = "http://127.0.0.1:7001"
    assert ready_line("n1", url) == f"READY n1 {url}"
    assert parse_ready_line(f"READY n1 {url}\n") == ("n1", url)
    with _json_root_logger("n1"):
        line = ready_line("n1", url)
    got = json.loads(line)
    assert (got["event"], got["node"], got["url"], got["level"]) == ("ready", "n1", url, "INFO")
    assert got["message"] == f"READY n1 {url}"
    assert parse_ready_line(line) == ("n1", url)
    not_ready = [
        "",
        "READY",
        "READY n1",
        "READYn1 x",
        '{"event": "start", "node": "n1", "url": "x"}',
        '{"event": "ready", "node": "n1"}',
        '{"event": "ready", "node": 1, "url": "x"}',
        "{not json",
        '["ready"]',
    ]
    for other in not_ready:
        assert parse_ready_line(other) is None, other


def test_a_fatal_error_is_a_plain_message_or_under_json_logs_a_json_line() -> None:
    assert exit_error("zdmq node n1: cannot listen").code == "zdmq node n1: cannot listen"
    with _json_root_logger("n1") as out:
        e = exit_error("zdmq node n1: cannot listen")
    assert e.code == 1
    (line,) = out.getvalue().splitlines()
    got = json.loads(line)
    assert (got["level"], got["event"], got["message"]) == (
        "CRITICAL",
        "exit",
        "zdmq node n1: cannot listen",
    )


def test_a_flood_of_warnings_is_cut_to_a_burst_and_the_next_line_counts_those_left_out() -> None:
    logger = logging.getLogger("zdmq.test.flood")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger.addHandler(Keep())
    try:
        flood = RateLimitedLog(logger, burst=3, period_s=3600)
        for i in range(10):
            flood.warning("refused %d", i, event="auth_refused")
        assert [r.getMessage() for r in records] == ["refused 0", "refused 1", "refused 2"]
        assert flood.suppressed == 7
        flood._window -= 3600  # the next period
        flood.warning("refused again")
        assert records[-1].__dict__["suppressed"] == 7
    finally:
        logger.handlers.clear()
