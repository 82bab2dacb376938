"""``boxqueue.put_many``'s rows, checked in C where they are whole seconds and a small priority:
the fast path must give what the general checks give, errors included (pure code)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boxqueue.errcodes import BoxError
from boxqueue.tubes.stream_procedures import _put_item, _put_items

FN = "boxqueue.put_many"

# Values around every bound the fast path tests: negative, zero, 2**32 seconds, priorities past
# -127 and 128, floats, numeric strings, nil and booleans (which Lua's tonumber refuses).
option = st.one_of(
    st.integers(min_value=-3, max_value=3),
    st.integers(min_value=2**32 - 2, max_value=2**32 + 2),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([-128, -127, -126, 127, 128, 129, 255, 256]),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6),
    st.sampled_from(["5", " 7 ", "0x10", "1.5", "x", "", None, True, False]),
)
row = st.one_of(
    st.lists(option, min_size=4, max_size=4).map(lambda o: [*o, "data", 1]),
    st.lists(option, min_size=0, max_size=3),
    st.just("not a row"),
)


def _general(rows: list, fn: str = FN) -> list | str:
    try:
        return [_put_item(r, f"{fn}: row {n}") for n, r in enumerate(rows)]
    except BoxError as exc:
        return f"{exc.code}: {exc.message}"


def _fast(rows: list) -> list | str:
    try:
        return _put_items(rows, FN)
    except BoxError as exc:
        return f"{exc.code}: {exc.message}"


@settings(max_examples=400)
@given(st.lists(row, max_size=6))
def test_the_fast_path_gives_what_the_general_checks_give(rows):
    assert _fast(rows) == _general(rows)


def test_a_spark_row_is_taken_as_box_queue_put_takes_it():
    assert _put_items([[0, 0, 0, 0, "a"], [2, 30, 5, -3, "b", 7]], FN) == [
        (0, None, None, 128, ["a"]),
        (2_000_000, 30_000_000, 5_000_000, 131, ["b", 7]),
    ]


@pytest.mark.parametrize(("bad", "message"), [
    ([[0, 0, 0]], "row 0: a row is {delay, ttl, ttr, pri, data...}"),
    ([[0, 0, 0, 0], "x"], "row 1: a row is {delay, ttl, ttr, pri, data...}"),
    ([[-1, 0, 0, 0]], "row 0: 'delay' must be a number of seconds, at least 0"),
    ([[0, 0, 0, "high"]], "row 0: 'pri' must be a number"),
])
def test_a_bad_row_is_named_in_the_error(bad, message):
    with pytest.raises(BoxError) as caught:
        _put_items(bad, FN)
    assert caught.value.message == f"Illegal parameters, {FN}: {message}"
