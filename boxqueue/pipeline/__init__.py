"""boxqueue's PySpark data source: read spaces and write tuples or tube tasks over iproto.

Everything here talks to the server through the ``tarantool`` connector, like any other client;
``pipeline.spark.register(spark)`` makes the source available as ``format("boxqueue")``.
"""
