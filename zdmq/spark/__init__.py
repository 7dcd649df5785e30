"""zdmq on Spark (the `[spark]` extra): a drain job and the `zdmq` Python data source.

    pip install 'zdmq[spark]'

    import zdmq.spark
    spark = zdmq.spark.session("local[*]")              # registers format("zdmq")
    zdmq.spark.drain(spark, "events", "out/events")      # queue -> Parquet, acked after commit
    df = spark.read.format("zdmq").option("queue", "events").load()
    df.write.format("zdmq").option("queue", "copy").mode("append").save()

This package is the only part of zdmq that imports pyspark. docs/spark.md says what each
path guarantees and how to run it on a real cluster.
"""

from zdmq.spark.datasource import ZdmqDataSource
from zdmq.spark.drain import DrainResult, ack_receipts, drain, register, session

__all__ = ["DrainResult", "ZdmqDataSource", "ack_receipts", "drain", "register", "session"]
