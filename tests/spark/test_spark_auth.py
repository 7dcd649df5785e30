"""The Spark source, sink and drain job on a cluster that lists client tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import zdmq.spark
from tests.helpers import unique
from zdmq import Client
from zdmq.local import LocalCluster

TOKEN = "spark-token-0123456789abcdef"


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.ephemeral(
        tmp_path_factory.mktemp("spark-tokens"),
        nodes=2,
        partitions=64,
        auth={"client_tokens": [{"token": TOKEN, "rights": {"": ["admin"]}}]},
    )
    try:
        yield c.start()
    finally:
        c.close()


def test_read_write_and_drain_take_a_token_and_fail_without_one(
    spark: Any, tokens: LocalCluster, tmp_path: Path
) -> None:
    q, cfg = unique("spark-auth"), str(tokens.config_path)

    async def create() -> None:
        async with Client.from_config(cfg, token=TOKEN) as c:
            await c.create_queue(q)

    asyncio.run(create())
    rows = spark.createDataFrame([(f"m{i}",) for i in range(50)], "body string")
    rows.write.format("zdmq").option("config", cfg).option("queue", q).option("token", TOKEN).mode(
        "append"
    ).save()
    with pytest.raises(Exception, match="Unauthorized"):
        spark.read.format("zdmq").option("config", cfg).option("queue", q).load().collect()
    got = (
        spark.read.format("zdmq")
        .option("config", cfg)
        .option("queue", q)
        .option("token", TOKEN)
        .option("decode", "utf-8")
        .load()
        .collect()
    )
    assert sorted(r.body for r in got) == sorted(f"m{i}" for i in range(50))
    result = zdmq.spark.ack_receipts(q, [r.receipt for r in got], config=cfg, token=TOKEN)
    assert result.ok and result.done == 50
    rows.write.format("zdmq").option("config", cfg).option("queue", q).option("token", TOKEN).mode(
        "append"
    ).save()
    drained = zdmq.spark.drain(spark, q, tmp_path / "out", config=cfg, token=TOKEN)
    assert drained.ok and drained.messages == 50 and drained.acked == 50
