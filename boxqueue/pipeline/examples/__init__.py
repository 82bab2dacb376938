"""Runnable Spark jobs using the boxqueue data source (see docs/spark.md, "Examples")."""
