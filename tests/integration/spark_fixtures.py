"""A boxqueue server and one local Spark session for the pipeline tests (shared by a module)."""

from __future__ import annotations

import os
import shutil
import sys

PIPELINE_SPACES = """
[guest]
grants = [{ privileges = ["read", "write", "execute"], object_type = "universe" }]

[[users]]
name = "loader"
password = "s3cret"
grants = [{ privileges = ["read", "write", "execute"], object_type = "universe" }]

[[space]]
id = 0
name = "queue"
format = [
  { name = "id", type = "string" }, { name = "tube", type = "string" },
  { name = "status", type = "string" }, { name = "event", type = "unsigned" },
  { name = "ipri", type = "unsigned" }, { name = "pri", type = "unsigned" },
  { name = "cid", type = "unsigned" }, { name = "created", type = "unsigned" },
  { name = "ttl", type = "unsigned" }, { name = "ttr", type = "unsigned" },
  { name = "cbury", type = "unsigned" }, { name = "ctaken", type = "unsigned" },
]
indexes = [
  { name = "task_id", type = "TREE", unique = true, parts = [[0, "string"]] },
  { name = "tube_status", type = "TREE", unique = false, parts = [
    [1, "string"], [2, "string"], [4, "unsigned"], [5, "unsigned"],
  ] },
  { name = "tube_event", type = "TREE", unique = false, parts = [[1, "string"], [3, "unsigned"]] },
  { name = "put_unique", type = "TREE", unique = false, parts = [
    [1, "string"], [2, "string"], { field = 12, type = "scalar", is_nullable = true },
  ] },
]

[[space]]
id = 600
name = "every_type"
format = [
  {name = "id", type = "unsigned"}, {name = "i", type = "integer"}, {name = "n", type = "number"},
  {name = "d", type = "double"}, {name = "s", type = "string"}, {name = "b", type = "boolean"},
  {name = "v", type = "varbinary"}, {name = "u", type = "uuid"}, {name = "dec", type = "decimal"},
  {name = "dt", type = "datetime"}, {name = "opt", type = "string", is_nullable = true},
]
indexes = [{name = "primary", type = "TREE", unique = true, parts = [{field = 0, type = "unsigned"}]}]

[[space]]
id = 601
name = "by_name"
format = [{name = "name", type = "string"}, {name = "n", type = "unsigned"}]
indexes = [{name = "primary", type = "TREE", unique = true, parts = [{field = 0, type = "string"}]}]

[[space]]
id = 602
name = "pairs"
format = [{name = "a", type = "unsigned"}, {name = "b", type = "string"}, {name = "n", type = "unsigned"}]
indexes = [{name = "primary", type = "TREE", unique = true, parts = [
  {field = 0, type = "unsigned"}, {field = 1, type = "string"},
]}]

[[space]]
id = 603
name = "archive"
format = [{name = "id", type = "unsigned"}, {name = "name", type = "string"}]
indexes = [{name = "primary", type = "TREE", unique = true, parts = [{field = 0, type = "unsigned"}]}]

[[space]]
id = 604
name = "documents"
format = [
  {name = "id", type = "unsigned"}, {name = "tags", type = "array"}, {name = "attrs", type = "map"},
  {name = "anything", type = "any"},
]
indexes = [{name = "primary", type = "TREE", unique = true, parts = [{field = 0, type = "unsigned"}]}]

[[space]]
id = 605
name = "documents_copy"
format = [
  {name = "id", type = "unsigned"}, {name = "tags", type = "array"}, {name = "attrs", type = "map"},
  {name = "anything", type = "any"},
]
indexes = [{name = "primary", type = "TREE", unique = true, parts = [{field = 0, type = "unsigned"}]}]

[[space]]
id = 606
name = "hashed"
format = [{name = "k", type = "string"}, {name = "n", type = "unsigned"}]
indexes = [{name = "primary", type = "HASH", unique = true, parts = [{field = 0, type = "string"}]}]

[[space]]
id = 607
name = "bare"
indexes = [{name = "primary", type = "TREE", unique = true, parts = [{field = 0, type = "unsigned"}]}]
"""


def java_missing() -> bool:
    """Spark runs on a JVM: without one the Spark tests are skipped (with this reason)."""
    return shutil.which("java") is None and not os.environ.get("JAVA_HOME")


def spark_session():
    """A local session of two threads for tests: loopback only, this interpreter on the executors.

    ``local[2,2]`` is ``local[2]`` that retries a failed task once, as a cluster would (plain
    ``local[2]`` never retries), so a test can see a Spark task retry.
    """
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2,2]")
        .appName("boxqueue-pipeline-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
