"""The tubes' compiled ordering against a plain sorted list: every operation the engine uses, over
random sequences of adds and removes (small sublists, so that splits and emptied sublists occur);
task orderings against a list sorted by their keys."""

import contextlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boxqueue.tubes import ordering
from boxqueue.tubes.ordering import EVENT_ORDER, EXPIRY_ORDER, READY_ORDER, Ordering, task_key
from boxqueue.tubes.task import Task

keys = st.tuples(st.integers(0, 40), st.integers(0, 40))
steps = st.lists(st.tuples(st.booleans(), keys), max_size=300)


def check_same(order: Ordering, model: list) -> None:
    assert len(order) == len(model)
    assert bool(order) == bool(model)
    assert list(order) == model
    if model:
        assert order[0] == model[0]
        assert order[-1] == model[-1]
        assert order[len(model) // 2] == model[len(model) // 2]
        assert order[-2 if len(model) > 1 else -1] == model[-2 if len(model) > 1 else -1]
    assert order[:5] == model[:5]
    assert order[:0] == []


@contextlib.contextmanager
def small_sublists():
    """Sublists of at most 4 keys, so that a few hundred steps split and empty many of them (the
    module reads ``LOAD`` at each split, compiled or not)."""
    load = ordering.LOAD
    ordering.LOAD = 2
    try:
        yield
    finally:
        ordering.LOAD = load


@settings(max_examples=150, deadline=None)
@given(initial=st.lists(keys, unique=True, max_size=50), steps=steps)
def test_adds_and_removes_keep_the_order_of_a_sorted_list(initial, steps):
    with small_sublists():
        order = Ordering(initial)
        model = sorted(initial)
        check_same(order, model)
        run_steps(order, model, steps)


def run_steps(order: Ordering, model: list, steps) -> None:
    for add, key in steps:
        if add:
            if key in model:
                continue  # the engine's keys are distinct (they end with the task's id)
            order.add(key)
            model.append(key)
            model.sort()
        elif key in model:
            order.remove(key)
            model.remove(key)
        else:
            with pytest.raises(ValueError):
                order.remove(key)
        check_same(order, model)


@settings(max_examples=150, deadline=None)
@given(present=st.lists(keys, unique=True, max_size=120), low=keys, high=keys)
def test_irange_gives_the_keys_between_its_bounds_included(present, low, high):
    with small_sublists():
        order = Ordering()
        for key in present:
            order.add(key)
    model = sorted(present)
    assert list(order.irange(low, high)) == [k for k in model if low <= k <= high]
    assert list(order.irange(maximum=high)) == [k for k in model if k <= high]
    assert list(order.irange(minimum=low)) == [k for k in model if k >= low]
    assert list(order.irange()) == model


def test_bounds_shorter_than_the_keys_compare_as_the_engine_uses_them():
    """The monitor asks for every event up to now with ``(now, inf)``; a Deckard pull for a
    score range with ``(MED_PRI, low)`` .. ``(MED_PRI, high, inf)``."""
    timeline = Ordering([(5.0, 1, "a"), (7.0, 2, "b"), (9.0, 3, "c")])
    assert list(timeline.irange(maximum=(7.0, math.inf))) == [(5.0, 1, "a"), (7.0, 2, "b")]
    ready = Ordering([(127, 1.0, 1, "a"), (127, 2.0, 2, "b"), (127, 3.0, 3, "c"), (0, 9.0, 4, "d")])
    assert [k[3] for k in ready.irange((127, 2.0), (127, 3.0, math.inf))] == ["b", "c"]


def test_index_errors_and_a_stepped_slice_are_refused():
    order = Ordering()
    with pytest.raises(IndexError):
        order[0]
    order.add((1,))
    with pytest.raises(IndexError):
        order[1]
    with pytest.raises(ValueError):
        order[::2]


def test_many_keys_split_into_sublists_and_come_back_in_order():
    order = Ordering()
    n = 5 * ordering.LOAD + 3
    for i in reversed(range(n)):
        order.add((i % 7, i))
    assert list(order) == sorted((i % 7, i) for i in range(n))
    for i in range(0, n, 2):
        order.remove((i % 7, i))
    assert list(order) == sorted((i % 7, i) for i in range(1, n, 2))
    assert len(order) == n // 2


# Task orderings: the tasks themselves, compared in C by the fields their kind names, against a
# model sorted by task_key.
task_keys = st.tuples(st.integers(0, 3), st.floats(0, 3, allow_nan=False), st.integers(0, 30),
                      st.integers(0, 20), st.integers(0, 40))  # ipri, pri, event, created, ttl


def make_task(n: int, fields: tuple) -> Task:
    ipri, pri, event, created, ttl = fields
    return Task(f"t{n:04d}", "tube", "r", event, ipri, pri, 0, created, ttl, 0)


@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from([READY_ORDER, EVENT_ORDER, EXPIRY_ORDER]),
       initial=st.lists(task_keys, max_size=40), steps=st.lists(st.tuples(st.booleans(), task_keys), max_size=200),
       low=st.tuples(st.integers(0, 40), st.integers(0, 3)), high=st.tuples(st.integers(0, 40), st.integers(0, 3)))
def test_task_orderings_keep_the_order_of_their_keys(kind, initial, steps, low, high):
    def key(task: Task) -> tuple:
        return task_key(kind, task)

    tasks = [make_task(n, f) for n, f in enumerate(initial)]
    with small_sublists():
        order = Ordering(tasks, kind=kind)
        model = sorted(tasks, key=key)
        assert list(order) == model
        for n, (add, fields) in enumerate(steps, start=len(tasks)):
            if add or not model:
                task = make_task(n, fields)
                order.add(task)
                model.append(task)
            else:
                task = model[fields[4] % len(model)]
                order.remove(task)
                model.remove(task)
                with pytest.raises(ValueError):
                    order.remove(task)
            model.sort(key=key)
            assert list(order) == model and len(order) == len(model)
            if model:
                assert order[0] is model[0] and order[-1] is model[-1]
    # Bounds are key tuples, compared with the tasks' keys (a two-field lower bound; an upper one
    # ending in inf, as the monitor's (now, inf)).
    bounds = (low, (high[0], math.inf))
    assert list(order.irange(*bounds)) == [t for t in model if bounds[0] <= key(t) <= bounds[1]]
    assert list(order.irange(maximum=bounds[1])) == [t for t in model if key(t) <= bounds[1]]


@settings(max_examples=200, deadline=None)
@given(initial=st.lists(keys, unique=True, max_size=60), batches=st.lists(
    st.tuples(st.lists(keys, unique=True, max_size=40), st.booleans()), max_size=6))
def test_extend_gives_what_adding_each_key_gives(initial, batches):
    """A batch (a sorted one, as puts in creation order, or not) goes in as its adds one by one
    would put it: runs after every key held on the end in one step, the others where they go."""
    with small_sublists():
        order = Ordering(initial)
        model = sorted(initial)
        for batch, in_order in batches:
            fresh = [k for k in (sorted(batch) if in_order else batch) if k not in model]
            order.extend(fresh)
            model = sorted(model + fresh)
            check_same(order, model)
            for key in model[::3]:  # the sublists it made work for removals too
                order.remove(key)
            model = [k for k in model if k not in model[::3]]
            check_same(order, model)


@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from([READY_ORDER, EVENT_ORDER, EXPIRY_ORDER]), initial=st.lists(task_keys, max_size=30),
       batch=st.lists(task_keys, max_size=60))
def test_a_task_ordering_extended_keeps_the_order_of_its_keys(kind, initial, batch):
    tasks = [make_task(n, f) for n, f in enumerate(initial)]
    new = [make_task(n, f) for n, f in enumerate(batch, start=len(tasks))]
    with small_sublists():
        order = Ordering(tasks, kind=kind)
        half = len(new) // 2  # a sorted run, then tasks in any order
        order.extend(sorted(new[:half], key=lambda t: task_key(kind, t)) + new[half:])
    model = sorted(tasks + new, key=lambda t: task_key(kind, t))
    assert list(order) == model and len(order) == len(model)


@settings(max_examples=200, deadline=None)
@given(initial=st.lists(keys, unique=True, min_size=1, max_size=80), picks=st.lists(st.integers(0, 79), max_size=40),
       runs=st.booleans(), missing=keys)
def test_remove_many_gives_what_removing_each_key_gives(initial, picks, runs, missing):
    """Keys removed in a batch (a run that lies together, as a claim's tasks do, or any of them
    in any order) leave what removing each would leave; a key that is not there is refused."""
    with small_sublists():
        order = Ordering(initial)
        model = sorted(initial)
        if runs and picks:
            start = picks[0] % len(model)
            doomed = model[start : start + len(picks)]
        else:
            doomed = list(dict.fromkeys(model[p % len(model)] for p in picks))
        order.remove_many(doomed)
        model = [k for k in model if k not in doomed]
        check_same(order, model)
        if missing not in model:
            with pytest.raises(ValueError):
                order.remove_many([*model[:1], missing])


@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from([READY_ORDER, EVENT_ORDER, EXPIRY_ORDER]), initial=st.lists(task_keys, min_size=1,
       max_size=60), start=st.integers(0, 59), count=st.integers(0, 60), event=st.integers(0, 30))
def test_a_claims_tasks_move_through_a_task_ordering_as_one_run(kind, initial, start, count, event):
    """A claim takes a run of tasks out of an ordering and puts them back with one event: the
    orderings hold what the tasks' keys say, as with a key at a time."""
    tasks = [make_task(n, f) for n, f in enumerate(initial)]
    with small_sublists():
        order = Ordering(tasks, kind=kind)
        model = sorted(tasks, key=lambda t: task_key(kind, t))
        run = model[start % len(model):][:count]
        order.remove_many(run)
        for task in run:
            task.event = event
        order.extend(sorted(run, key=lambda t: task_key(kind, t)))
    assert list(order) == sorted(tasks, key=lambda t: task_key(kind, t)) and len(order) == len(tasks)
