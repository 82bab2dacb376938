"""Runnable Spark jobs using the boxqueue data source (see the README's pipeline section)."""
