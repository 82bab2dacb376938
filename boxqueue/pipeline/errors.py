"""The one exception type of the data source, so Spark's error output names the real cause."""

from __future__ import annotations


class BoxqueueSourceError(Exception):
    """A problem the user can act on: a missing space, a column that does not fit, no server..."""
