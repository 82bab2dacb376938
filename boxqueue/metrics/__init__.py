"""What an operator sees: Prometheus ``/metrics`` and a live dashboard at ``/``.

The room at the top of the map beside ``boxqueue/``: it reads every other room and nothing reads
it. The request path only increments plain integers (``measures``, ``boxqueue.iproto.request_stats``,
the engine's tallies); :mod:`boxqueue.metrics.collector` turns them into Prometheus families when scraped,
:mod:`boxqueue.metrics.dashboard_data` into the dashboard's JSON, and :mod:`boxqueue.metrics.app` serves both (and
the page's own files from ``boxqueue/metrics/dashboard/``) through the one HTTP stack of the facades.
"""
