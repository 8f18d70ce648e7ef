"""RocketQ for Apache Spark: a PySpark Python data source named ``rocketq`` (DESIGN.md §10).

    from rocketq.spark import register
    register(spark)
    df = (spark.readStream.format("rocketq").option("nameserver", "127.0.0.1:9876")
          .option("topic", "orders").load())

Needs the ``spark`` extra (pyspark 4.2+, pyarrow) and Java 17. Reading: :mod:`rocketq.spark.reader`;
writing, exactly once: :mod:`rocketq.spark.sink`; options: :mod:`rocketq.spark.options`.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource

from rocketq.spark.options import OptionError
from rocketq.spark.reader import SCHEMA, batch_reader, stream_reader
from rocketq.spark.sink import batch_writer, stream_writer

__all__ = ["SCHEMA", "OptionError", "RocketQDataSource", "register"]


class RocketQDataSource(DataSource):
    """``format("rocketq")``: streaming and batch reads, streaming and batch writes."""

    @classmethod
    def name(cls) -> str:
        return "rocketq"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> Any:
        return stream_reader(self.options, schema)

    def reader(self, schema: Any) -> Any:
        return batch_reader(self.options, schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        return stream_writer(self.options, schema)

    def writer(self, schema: Any, overwrite: bool) -> Any:
        return batch_writer(self.options, schema)


def register(spark: Any) -> None:
    """Make ``format("rocketq")`` known to ``spark`` (a SparkSession)."""
    spark.dataSource.register(RocketQDataSource)
