"""Key-range planning of the Spark data source: adjacency, narrowing by filters."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

from boxqueue.pipeline.key_ranges import (
    ITERATOR_ALL,
    ITERATOR_GE,
    ITERATOR_GT,
    Bound,
    KeyRange,
    interpolated_points,
    narrow,
    partition_count,
    split,
)


def owner(ranges: list[KeyRange], value) -> list[int]:
    """Which ranges a first-key value belongs to (by the reader's rules)."""
    found = []
    for number, r in enumerate(ranges):
        above_lower = r.lower is None or value > r.lower.value or (value == r.lower.value and r.lower.inclusive)
        if above_lower and not r.above_upper(value):
            found.append(number)
    return found


@pytest.mark.parametrize("whole", [KeyRange(), KeyRange(Bound(-5, False), Bound(10_000, True))])
def test_split_ranges_are_adjacent_and_cover_every_value_once(whole):
    points = interpolated_points(0, 999, 7, "unsigned")
    assert points == sorted(set(points)) and len(points) == 6
    ranges = split(whole, points)
    assert len(ranges) == 7
    for value in range(-4, 1200):
        assert owner(ranges, value) == [owner(ranges, value)[0]]
    assert owner(ranges, -5) == ([0] if whole.lower is None else [])
    assert owner(ranges, 10**9) == ([6] if whole.upper is None else [])


def test_interpolation_of_a_narrow_or_float_key_space():
    assert interpolated_points(5, 7, 10, "unsigned") == [6, 7]  # fewer ranges than asked, never empty ones
    assert interpolated_points(3, 3, 4, "integer") == []
    assert interpolated_points(0.0, 1.0, 4, "double") == [0.25, 0.5, 0.75]


def test_points_outside_a_narrowed_range_are_dropped():
    whole = KeyRange(Bound(100, True), Bound(200, False))
    ranges = split(whole, [50, 150, 200, 250])
    assert ranges == [KeyRange(Bound(100, True), Bound(150, False)), KeyRange(Bound(150, True), Bound(200, False))]


def test_narrow_keeps_the_tightest_bounds_and_hands_back_the_rest():
    other = EqualTo(("name",), "x")
    within = In(("id",), (1, 2))
    whole, rest = narrow(
        [GreaterThan(("id",), 10), GreaterThanOrEqual(("id",), 10), LessThanOrEqual(("id",), 50),
         LessThan(("id",), 50), other, within, EqualTo(("id",), "not a number")],
        "id", "unsigned",
    )
    assert whole == KeyRange(Bound(10, False), Bound(50, False))
    assert rest == [other, within, EqualTo(("id",), "not a number")]
    assert whole.start() == ([10], ITERATOR_GT)
    assert KeyRange(Bound(3, True)).start() == ([3], ITERATOR_GE)
    assert KeyRange().start() == ([], ITERATOR_ALL)


def test_contradicting_filters_give_an_empty_range():
    whole, _ = narrow([EqualTo(("k",), "b"), LessThan(("k",), "b")], "k", "string")
    assert whole.empty
    whole, _ = narrow([EqualTo(("k",), "b")], "k", "string")
    assert not whole.empty and whole.lower == whole.upper == Bound("b", True)


def test_partition_count():
    assert partition_count(0, None, 1000) == 1
    assert partition_count(2500, None, 1000) == 3
    assert partition_count(10, 4, 1000) == 4
