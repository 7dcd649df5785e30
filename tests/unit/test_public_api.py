"""The package's public names: `zdmq.__all__` lists exactly them and each resolves."""

from __future__ import annotations

import subprocess
import sys

import zdmq
from zdmq import errors

PUBLIC = {
    "AckResult",
    "BadRequest",
    "BatchTooLarge",
    "CallStats",
    "Client",
    "ClusterConfig",
    "ConfigError",
    "Consumer",
    "FifoConflict",
    "Forbidden",
    "InternalError",
    "InvalidAttributes",
    "InvalidMessage",
    "InvalidQueueName",
    "MapConflict",
    "Limits",
    "Message",
    "MessageIdConflict",
    "MessageLeased",
    "MessageNotFound",
    "MessageTooLarge",
    "MethodNotAllowed",
    "Misrouted",
    "NodeConflict",
    "NodeNotFound",
    "NotLeader",
    "NodeConfig",
    "NodeUnavailable",
    "Outcome",
    "PublishIncomplete",
    "Published",
    "QueueExists",
    "QueueLimitReached",
    "QueueNotFound",
    "RequestTimeout",
    "QueueSettings",
    "QueueStats",
    "ReceivedMessage",
    "RouteNotFound",
    "SubscriptionNotFound",
    "TieNotFound",
    "TopicExists",
    "TopicNotFound",
    "StorageFailed",
    "Unauthorized",
    "UpgradeRequired",
    "ZdmqError",
    "__version__",
}


def test_all_lists_exactly_the_public_names_once_each() -> None:
    assert len(zdmq.__all__) == len(set(zdmq.__all__))
    assert set(zdmq.__all__) == PUBLIC


def test_every_public_name_resolves() -> None:
    for name in zdmq.__all__:
        assert getattr(zdmq, name) is not None, name


def test_star_import_gives_exactly_the_public_names() -> None:
    namespace: dict[str, object] = {}
    exec("from zdmq import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == PUBLIC


def test_every_error_class_is_exported_at_the_top_level() -> None:
    for cls in errors.error_classes().values():
        assert getattr(zdmq, cls.__name__) is cls
    assert zdmq.ZdmqError is errors.ZdmqError


def test_the_version_is_a_string() -> None:
    assert isinstance(zdmq.__version__, str)
    assert zdmq.__version__.count(".") == 2


def test_importing_the_package_loads_no_server_code() -> None:
    # The client side must stay importable without the server (and its storage).
    code = "import sys, zdmq; print(sorted(m for m in sys.modules if m.startswith('zdmq.server')))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
