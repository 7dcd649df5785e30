"""The Locust file on a cluster that lists client tokens: with the token every call of the
mix succeeds; without it every call fails (401)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zdmq.local import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
LOCUST = Path(sys.executable).parent / "locust"
TOKEN = "locust-token-0123456789abcdef"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("locust") is None or not LOCUST.exists(),
    reason="locust is not installed (pip install -e '.[load]')",
)


def _locust(config: Path, token: str | None) -> dict[str, tuple[int, int]]:
    """name -> (requests, failures) of a 3 s run of 2 users."""
    env = {k: v for k, v in os.environ.items() if k != "ZDMQ_TOKEN"}
    if token is not None:
        env["ZDMQ_TOKEN"] = token
    args = [str(LOCUST), "-f", str(ROOT / "loadtest" / "locustfile.py"), "--headless"]
    args += ["-u", "2", "-r", "2", "-t", "3s", "--json", "--only-summary", "--loglevel", "ERROR"]
    args += ["--zdmq-config", str(config), "--mix", "push=1,recv_ack=1", "--routing", "any"]
    run = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    stats = json.loads(run.stdout)
    return {s["name"]: (s["num_requests"], s["num_failures"]) for s in stats}


def test_the_locust_file_sends_the_token_from_the_environment(tmp_path: Path) -> None:
    with LocalCluster.ephemeral(
        tmp_path,
        nodes=2,
        partitions=64,
        auth={"client_tokens": [{"token": TOKEN, "rights": {"lq-": ["admin"]}}]},
    ) as cluster:
        with_token = _locust(cluster.config_path, TOKEN)
        assert with_token["push"][0] > 0 and with_token["receive"][0] > 0
        assert all(failures == 0 for _, failures in with_token.values()), with_token
        without = _locust(cluster.config_path, None)
        assert without["push"][0] > 0
        assert all(failures == requests for requests, failures in without.values()), without
