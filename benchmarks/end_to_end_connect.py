"""end_to_end_connect: end_to_end as a Spark Connect client of a local Connect server.

``end_to_end.py``'s two sides, the same data and goal, with the session a Spark Connect
client (``SparkSession.builder.remote``) of a server started from the pyspark install on
127.0.0.1 (``local[2]``, as the tests start it). A: the write into staging by the product's
writer (``mapInArrow``) and ``Publisher.publish`` in a Spark task through ``SparkRunner``,
both run by the server's executors. B: Spark's default write straight into the output,
through the same server. Goal: A/B <= 0.55.

    python benchmarks/end_to_end_connect.py [--quick] [--rounds R]
"""

from __future__ import annotations

import os

import _common
from connect_helpers import connect_server
from end_to_end import measure

from jobs.spark import SPARK_DEFAULTS


def main() -> None:
    args = _common.parse_args(__doc__ or "")
    from pyspark.sql import SparkSession

    os.environ.pop("SPARK_REMOTE", None)
    with _common.workdir("end-to-end-connect") as base:
        (base / "server").mkdir()
        with connect_server(base / "server") as server:
            builder = SparkSession.builder.remote(server.url)
            for key, value in SPARK_DEFAULTS.items():
                if key.startswith("spark.sql."):  # the rest is the server's own
                    builder = builder.config(key, value)
            spark = builder.getOrCreate()
            try:
                measure(
                    spark,
                    base,
                    args,
                    name="end_to_end_connect",
                    title="On Spark Connect: Spark write to staging + publish vs Spark's "
                    "default write",
                    a_name="write to staging + Publisher.publish (SparkRunner on a Connect "
                    "session)",
                    b_name="Spark write to the output (v1 commit), through the same server",
                    setting=", Spark Connect",
                )
            finally:
                spark.stop()


if __name__ == "__main__":
    main()
