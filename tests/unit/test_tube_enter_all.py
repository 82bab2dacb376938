"""A recovery's ``Tube.enter_all`` against ``Tube.enter`` one task at a time: the same tasks, the
same orderings (take, kick, events, expiries) and counts, whether the keys come in order (the usual
case, kept without sorting) or not (priorities and events that go down from one task to the next)."""

from hypothesis import given
from hypothesis import strategies as st

from boxqueue.tubes.engine_base import default_kind
from boxqueue.tubes.ordering import EVENT_ORDER, EXPIRY_ORDER, READY_ORDER, Ordering, task_key
from boxqueue.tubes.task import BURIED, DELAYED, READY, TAKEN, Task, sort_by_created
from boxqueue.tubes.tube import Tube

task_fields = st.tuples(
    st.sampled_from([READY, READY, DELAYED, TAKEN, BURIED]),
    st.integers(0, 3),  # ipri
    st.integers(0, 3),  # pri
    st.integers(0, 50),  # event offset
    st.integers(0, 5),  # created (ties happen: the id breaks them)
    st.integers(0, 50),  # ttl
)


def tasks_of(rows: list[tuple]) -> list[Task]:
    tasks = [Task(f"id{n:03d}", "t", status, 1000 + event, ipri, pri, 0, created, ttl, 0)
             for n, (status, ipri, pri, event, created, ttl) in enumerate(rows)]
    sort_by_created(tasks)  # as recovery hands them over: by created, ties in key order
    return tasks


def tube_of(limited: bool) -> Tube:
    tube = Tube(0, "t", default_kind("t"))
    if limited:
        tube.by_expiry = Ordering(kind=EXPIRY_ORDER)
    return tube


@given(st.lists(task_fields, min_size=1, max_size=60), st.booleans())
def test_enter_all_is_enter_of_each(rows, limited):
    one_by_one, at_once = tube_of(limited), tube_of(limited)
    tasks = tasks_of(rows)
    for task in tasks:
        one_by_one.tasks[task.id] = task
        one_by_one.enter(task)
    first_event = at_once.enter_all(tasks_of(rows))
    assert first_event == min(t.event for t in tasks)
    assert list(at_once.tasks) == list(one_by_one.tasks)
    assert dict(at_once.counts) == dict(one_by_one.counts)
    for name, kind in (("ready", READY_ORDER), ("buried", READY_ORDER), ("timeline", EVENT_ORDER),
                       ("by_expiry", EXPIRY_ORDER)):
        expected = getattr(one_by_one, name)
        got = getattr(at_once, name)
        assert (got is None) == (expected is None)
        if expected is not None:
            assert [task_key(kind, t) for t in got] == [task_key(kind, t) for t in expected], name
            assert len(got) == len(expected)


def test_keys_in_order_and_out_of_order():
    rows_in_order = [(READY, 0, 0, n, n, 10) for n in range(5)]
    rows_out = [(READY, 0, 3 - n % 3, 50 - n, n, 10) for n in range(5)]  # pri and event go down
    for rows in (rows_in_order, rows_out):
        tube = tube_of(True)
        tube.enter_all(tasks_of(rows))
        ready = [task_key(READY_ORDER, t) for t in tube.ready]
        timeline = [task_key(EVENT_ORDER, t) for t in tube.timeline]
        assert ready == sorted(ready) and timeline == sorted(timeline)
