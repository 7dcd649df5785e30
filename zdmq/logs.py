"""A node's log lines, and the request id they carry.

A node logs to stderr in one of two formats (`--log-format`, or `$ZDMQ_LOG_FORMAT`):
`text` (the default: one readable line per record) or `json` (one JSON object per line,
with `time`, `level`, `logger`, `message`, `node` and, where known, `group`,
`request_id` and the record's own structured fields). docs/operations.md, "Logs", lists
the fields and the events. In `json` every line the node writes is one JSON object: the
readiness line on stdout (`ready_line`; `parse_ready_line` reads either form), Python
warnings, and the message of a fatal error (`exit_error`) too.

The request id of the call a node is serving lives in a context variable: the node's
HTTP server sets it for each request's task (from the `zdmq-request-id` header when it
is valid, else a fresh one), every log line written while serving it carries it, and
node-to-node calls made while serving it pass it on in the same header. It is never
part of what a state-machine command does.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import os
import secrets
import sys
import time
from datetime import UTC, datetime
from typing import Any

import orjson

__all__ = [
    "LOG_FORMATS",
    "LOG_FORMAT_HELP",
    "REQUEST_ID_HEADER",
    "JsonFormatter",
    "RateLimitedLog",
    "TextFormatter",
    "exit_error",
    "json_logging",
    "new_request_id",
    "parse_ready_line",
    "ready_line",
    "request_id",
    "setup_logging",
    "valid_request_id",
]

REQUEST_ID_HEADER = "zdmq-request-id"
REQUEST_ID_MAX = 128  # characters of a caller's request id; a longer one is replaced
LOG_FORMATS = ("text", "json")
LOG_FORMAT_HELP = '"text" (default) or "json" (one object a line); default: $ZDMQ_LOG_FORMAT'

#: The id of the request being served in this context (None outside a request).
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "zdmq_request_id", default=None
)

# A fresh id: this process's random prefix and a counter (cheaper than random bytes per
# request, and unique across the cluster's processes for all practical purposes).
_PREFIX = secrets.token_hex(4)
_counter = itertools.count(1)


def new_request_id() -> str:
    return f"{_PREFIX}-{next(_counter):x}"


def valid_request_id(value: str) -> bool:
    """A caller's id is taken when it is 1 to REQUEST_ID_MAX visible ASCII characters
    (no spaces or controls: it goes into log lines and reply headers as it is)."""
    return (
        0 < len(value) <= REQUEST_ID_MAX
        and value.isascii()
        and value.isprintable()
        and (" " not in value)
    )


# LogRecord attributes that are not a record's own structured fields.
_STANDARD = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "taskName"}
)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """What the caller gave in `extra=`: the record's structured fields."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "node": self.node_id,
        }
        rid = request_id.get()
        if rid is not None:
            out["request_id"] = rid
        for k, v in _fields(record).items():
            out.setdefault(k, v)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """`time LEVEL node=<id> logger: message [key=value ...]`: the record's structured
    fields and the request id, when there are any, at the end of the line."""

    def __init__(self, node_id: str) -> None:
        super().__init__(f"%(asctime)s %(levelname)s node={node_id} %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        rid = request_id.get()
        if rid is not None:
            fields.setdefault("request_id", rid)
        if not fields:
            return line
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        head, sep, tail = line.partition("\n")  # an exception's traceback stays below
        return f"{head} [{extra}]{sep}{tail}"


def setup_logging(node_id: str, log_format: str | None = None) -> str:
    """Logs INFO and up to stderr in `log_format` (default: `$ZDMQ_LOG_FORMAT`, else
    text), Python's warnings included; returns the format chosen."""
    fmt = log_format or os.environ.get("ZDMQ_LOG_FORMAT") or "text"
    if fmt not in LOG_FORMATS:
        raise SystemExit(f"zdmq node: log format {fmt!r}: expected one of {LOG_FORMATS}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(node_id) if fmt == "json" else TextFormatter(node_id))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)  # else `warnings` writes plain text to stderr
    return fmt


def json_logging() -> bool:
    """Whether this process logs JSON lines (`setup_logging` chose `json`)."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)


READY = "READY"


def ready_line(node_id: str, url: str) -> str:
    """The line a node prints on stdout once it serves, which launchers wait for:
    `READY <node> <url>`, or, when the node logs JSON, one JSON object shaped like its
    log lines, with `event` "ready", `node` and `url`."""
    if not json_logging():
        return f"{READY} {node_id} {url}"
    record = logging.LogRecord(
        "zdmq.node", logging.INFO, __file__, 0, "%s %s %s", (READY, node_id, url), None
    )
    record.event = "ready"
    record.url = url
    return JsonFormatter(node_id).format(record)


def parse_ready_line(line: str) -> tuple[str, str] | None:
    """The node id and URL of a readiness line in either form (`ready_line`), or None
    for any other line."""
    line = line.strip()
    if line.startswith(READY + " "):
        parts = line.split()
        return (parts[1], parts[2]) if len(parts) == 3 else None
    if not line.startswith("{"):
        return None
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get("event") != "ready":
        return None
    node, url = obj.get("node"), obj.get("url")
    return (node, url) if isinstance(node, str) and isinstance(url, str) else None


def exit_error(message: str) -> SystemExit:
    """What a node raises to stop on a fatal error: under JSON logs the message is logged
    as one CRITICAL object (`event` "exit") and the process exits with status 1; else
    Python prints the message to stderr as it is and exits with status 1."""
    if not json_logging():
        return SystemExit(message)
    logging.getLogger("zdmq.node").critical("%s", message, extra={"event": "exit"})
    return SystemExit(1)


class RateLimitedLog:
    """Logs at most `burst` records per `period_s` through `logger`; the rest are
    counted and reported in the next record let through (`suppressed`), so that a flood
    of refused calls cannot flood the log."""

    def __init__(self, logger: logging.Logger, *, burst: int = 10, period_s: float = 10.0) -> None:
        self.logger = logger
        self.burst = burst
        self.period_s = period_s
        self._window = 0.0
        self._in_window = 0
        self.suppressed = 0

    def warning(self, msg: str, *args: Any, **fields: Any) -> None:
        now = time.monotonic()
        if now - self._window >= self.period_s:
            self._window = now
            self._in_window = 0
        if self._in_window >= self.burst:
            self.suppressed += 1
            return
        self._in_window += 1
        if self.suppressed:
            fields["suppressed"] = self.suppressed
            self.suppressed = 0
        self.logger.warning(msg, *args, extra=fields)
