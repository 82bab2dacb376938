"""Splitting a space into primary-key ranges, and narrowing them by pushed-down filters.

Ranges are on the first part of the primary key. A numeric first part is split by interpolating
between its smallest and largest stored values (two selects); a string or varbinary first part is
split at keys sampled with offset selects (the server walks the index up to each offset, so this
costs one pass over the space at most). Other types (and HASH primary keys) are read as one range.
The first range is open below and the last open above, so rows added after planning are still
read, each by exactly one range: the ranges are adjacent and half-open.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

NUMERIC_KEYS = ("unsigned", "integer", "number", "double")
INTEGER_KEYS = ("unsigned", "integer")
SAMPLED_KEYS = ("string", "varbinary")
ITERATOR_EQ, ITERATOR_ALL, ITERATOR_LE, ITERATOR_GE, ITERATOR_GT = 0, 2, 4, 5, 6


@dataclass(frozen=True)
class Bound:
    """One end of a range of first-key-part values."""

    value: Any
    inclusive: bool


@dataclass(frozen=True)
class KeyRange(InputPartition):
    """A range of the first primary-key part, ``None`` ends being unbounded; a Spark partition."""

    lower: Bound | None = None
    upper: Bound | None = None
    empty: bool = False

    def above_upper(self, value: Any) -> bool:
        """Whether ``value`` lies past the upper end (the reader stops there: the index is sorted)."""
        if self.upper is None:
            return False
        return value > self.upper.value or (value == self.upper.value and not self.upper.inclusive)

    def start(self) -> tuple[list[Any], int]:
        """The key and iterator of the first select of this range."""
        if self.lower is None:
            return [], ITERATOR_ALL
        return [self.lower.value], ITERATOR_GE if self.lower.inclusive else ITERATOR_GT


def _tighter_lower(a: Bound | None, b: Bound) -> Bound:
    if a is None or b.value > a.value or (b.value == a.value and not b.inclusive):
        return b
    return a


def _tighter_upper(a: Bound | None, b: Bound) -> Bound:
    if a is None or b.value < a.value or (b.value == a.value and not b.inclusive):
        return b
    return a


def _comparable(value: Any, key_type: str) -> bool:
    if key_type in NUMERIC_KEYS:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if key_type == "string":
        return isinstance(value, str)
    if key_type == "varbinary":
        return isinstance(value, (bytes, bytearray))
    return False


def narrow(filters: list[Filter], column: str, key_type: str) -> tuple[KeyRange, list[Filter]]:
    """The range the filters on the first key column allow, and the filters still for Spark.

    Comparisons and equality on that column are applied exactly by the reader (the select starts
    at the lower end and stops past the upper one), so they are not handed back.
    """
    lower: Bound | None = None
    upper: Bound | None = None
    rest: list[Filter] = []
    for item in filters:
        value = getattr(item, "value", None)
        if getattr(item, "attribute", None) != (column,) or not _comparable(value, key_type):
            rest.append(item)
            continue
        if isinstance(item, EqualTo):
            lower, upper = _tighter_lower(lower, Bound(value, True)), _tighter_upper(upper, Bound(value, True))
        elif isinstance(item, GreaterThan):
            lower = _tighter_lower(lower, Bound(value, False))
        elif isinstance(item, GreaterThanOrEqual):
            lower = _tighter_lower(lower, Bound(value, True))
        elif isinstance(item, LessThan):
            upper = _tighter_upper(upper, Bound(value, False))
        elif isinstance(item, LessThanOrEqual):
            upper = _tighter_upper(upper, Bound(value, True))
        else:
            rest.append(item)
    empty = False
    if lower is not None and upper is not None:
        empty = lower.value > upper.value or (
            lower.value == upper.value and not (lower.inclusive and upper.inclusive)
        )
    return KeyRange(lower, upper, empty), rest


def _interpolate(low: Any, high: Any, count: int, integer: bool) -> list[Any]:
    """``count - 1`` increasing split points strictly inside (low, high]."""
    points: list[Any] = []
    for i in range(1, count):
        point = low + (high - low + 1) * i // count if integer else low + (high - low) * i / count
        if point > low and (not points or point > points[-1]) and point <= high:
            points.append(point)
    return points


def split(whole: KeyRange, points: list[Any]) -> list[KeyRange]:
    """Adjacent half-open ranges: ``[lower, p1) [p1, p2) ... [pn, upper]``."""
    inside = [p for p in points if not whole.above_upper(p)
              and (whole.lower is None or p > whole.lower.value)]
    if not inside:
        return [whole]
    ranges = [KeyRange(whole.lower, Bound(inside[0], False))]
    for a, b in itertools.pairwise(inside):
        ranges.append(KeyRange(Bound(a, True), Bound(b, False)))
    ranges.append(KeyRange(Bound(inside[-1], True), whole.upper))
    return ranges


def partition_count(rows: int, wanted: int | None, rows_per_partition: int) -> int:
    """How many ranges: the user's number, else one per ``rows_per_partition`` rows."""
    if wanted is not None:
        return max(1, wanted)
    return max(1, math.ceil(rows / rows_per_partition))


def interpolated_points(low: Any, high: Any, count: int, key_type: str) -> list[Any]:
    """Split points for a numeric first key part between its stored extremes."""
    if count <= 1 or low is None or high is None or high <= low:
        return []
    if key_type in INTEGER_KEYS and isinstance(low, int) and isinstance(high, int):
        return _interpolate(low, high, count, integer=True)
    return _interpolate(float(low), float(high), count, integer=False)
