"""Recovery's reading of stored task tuples (``tubes.task.load_tasks``): only the header decoded,
the tasks grouped by tube, equal names and times shared, a header that is not a task's refused."""

import msgpack
import pytest

from boxqueue.tubes.task import QUEUE15, TUBE_LAYOUT, load_tasks, sort_by_created


def stored(task_id: str, tube: str, created: int, *data, event: object = None) -> bytes:
    header = [task_id, tube, "r", created + 10 if event is None else event, 0, 0, 0, created, 10**12, 60 * 10**6, 0, 0]
    return msgpack.packb([*header, *data], use_bin_type=True)


def test_tasks_are_grouped_by_tube_and_share_names_and_times():
    chunk = [stored("a", "t1", 30, "x" * 100), stored("b", "t2", 10, {"k": [1]}), stored("c", "t1", 20)]
    loaded: dict = {}
    made = load_tasks(chunk, QUEUE15, loaded)
    assert [t.id for t in made] == ["a", "b", "c"]
    assert {name: [t.id for t in tasks] for name, tasks in loaded.items()} == {"t1": ["a", "c"], "t2": ["b"]}
    a, b, c = made
    assert (a.event, a.created, a.ttl, a.ttr, a.attrs) == (40, 30, 10**12, 60 * 10**6, None)
    assert a.tube is c.tube and a.ttl is c.ttl and a.ttr is b.ttr  # one object each, not one per task
    sort_by_created(loaded["t1"])
    assert [t.id for t in loaded["t1"]] == ["c", "a"]


def test_the_tube_layout_keeps_its_attrs():
    (task,) = load_tasks([stored("a", "t", 1, {"utube": "u"}, {}, "data")], TUBE_LAYOUT, {})
    assert task.attrs == {"utube": "u"}


@pytest.mark.parametrize("event", ["soon", 2**64 - 1, None])
def test_a_header_that_is_not_a_tasks_is_refused(event):
    raw = stored("a", "t", 1) if event is None else stored("a", "t", 1, event=event)
    if event is None:
        raw = raw[:-3]  # cut short: malformed
    with pytest.raises(ValueError):
        load_tasks([raw], QUEUE15, {})
