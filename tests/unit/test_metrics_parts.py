"""Pure parts of the metrics: histograms, tallies, the basic-auth check, tube selection, the
oldest ready task, recovery progress, and the [metrics] configuration."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest

from boxqueue.config import Address, ConfigError, MetricsConfig, load_config
from boxqueue.measures import BATCH_BOUNDS, Histogram, RequestMeter
from boxqueue.metrics.auth import credentials, verify
from boxqueue.metrics.dashboard_data import select_tubes
from boxqueue.metrics.tube_rows import oldest_ready_created
from boxqueue.spaces import access as acl
from boxqueue.tubes import recovery
from boxqueue.tubes.kinds import BOX_QUEUE_KIND
from boxqueue.tubes.task import BURIED, DONE, READY, TAKEN, Task
from boxqueue.tubes.tube import (
    ACKS,
    BURIES,
    DELETES,
    EXPIRIES,
    KICKS,
    PUTS,
    RELEASES,
    TAKES,
    Tube,
    tally_of,
)


def test_histogram_buckets_are_le_and_cumulative():
    h = Histogram((1, 2, 4))
    h.observe(1)  # on a bound: counted in that bucket (le)
    h.observe(1.5, times=3)
    h.observe(100)
    assert h.counts == [1, 3, 0, 1]
    assert h.cumulative() == [(1, 1), (2, 4), (4, 4), (float("inf"), 5)]
    assert h.count == 5 and h.sum == 1 + 4.5 + 100
    assert Histogram(BATCH_BOUNDS).bounds[-1] == 4096


def test_request_meter_counts_outcomes_codes_and_recent_errors():
    meter = RequestMeter("zaqar")
    started = meter.begin()
    assert meter.in_progress == 1
    meter.record("post_messages", started)
    meter.record("get_message", meter.begin(), "404", "GET /x")
    assert meter.in_progress == 0
    assert meter.requests == {("post_messages", "ok"): 1, ("get_message", "error"): 1}
    assert meter.errors == {"404": 1}
    assert [(e.api, e.operation, e.code, e.message) for e in meter.recent] == [("zaqar", "get_message", "404", "GET /x")]
    assert meter.latency.count == 2


@pytest.mark.parametrize(("old", "new", "expired", "tally"), [
    (None, READY, False, PUTS),
    (READY, TAKEN, False, TAKES),
    (TAKEN, TAKEN, False, -1),  # a touch, a renewed claim
    (TAKEN, None, False, ACKS),
    (TAKEN, DONE, False, ACKS),
    (TAKEN, READY, False, RELEASES),
    (TAKEN, "d", False, RELEASES),
    (TAKEN, BURIED, False, BURIES),
    (BURIED, READY, False, KICKS),
    (READY, None, False, DELETES),
    (READY, None, True, EXPIRIES),
    (TAKEN, None, True, EXPIRIES),
    ("d", READY, False, -1),  # a delay ending
])
def test_tally_of_each_change(old, new, expired, tally):
    assert tally_of(old, new, expired) == tally


def test_basic_credentials_and_the_chap_sha1_check():
    header = "Basic " + base64.b64encode(b"alice:s3:cret").decode()
    assert credentials(header) == ("alice", "s3:cret")
    assert credentials("Bearer abc") is None
    assert credentials("Basic !!") is None
    assert credentials("Basic " + base64.b64encode(b"no-colon").decode()) is None
    assert credentials(None) is None
    access = acl.AccessControl()
    alice = access.add_user("alice", "s3:cret")
    assert verify(access, "alice", "s3:cret") is alice
    assert verify(access, "alice", "wrong") is None
    assert verify(access, "nobody", "s3:cret") is None
    assert verify(access, "admin", "") is None  # no password set: never by basic auth
    assert verify(access, "public", "") is None  # a role


def _entry(space: str, name: str, ready: int, created: int) -> tuple[str, str, Tube]:
    tube = Tube(0, name, BOX_QUEUE_KIND)
    for n in range(ready):
        task = Task(f"{name}{n:028d}", name, READY, 0, 127, 128, 0, created + n, 10**9, 10**9, 0, 0)
        tube.tasks[task.id] = task
        tube.enter(task)
    return space, name, tube


def test_select_tubes_searches_sorts_and_pages():
    entries = [_entry("queue", f"t{i:02d}", ready=i % 7, created=1000 - i) for i in range(30)]
    matching, page = select_tubes(list(entries), "", "name", 1, 10)
    assert matching == 30 and [e[1] for e in page] == [f"t{i:02d}" for i in range(10, 20)]
    matching, page = select_tubes(list(entries), "QUEUE/T2", "name", 0, 50)
    assert matching == 10 and page[0][1] == "t20"
    _matching, page = select_tubes(list(entries), "", "ready", 0, 3)
    assert [e[2].counts[READY] for e in page] == [6, 6, 6]
    _matching, page = select_tubes(list(entries), "", "depth", 0, 1)
    assert page[0][1] == "t06"
    _matching, page = select_tubes(list(entries), "", "oldest", 0, 2)
    assert [e[1] for e in page] == ["t29", "t27"]  # t28 holds no ready task (28 % 7 == 0)
    assert select_tubes(list(entries), "", "name", 9, 10) == (30, [])


def test_oldest_ready_task_by_creation_not_take_order():
    tube = Tube(0, "t", BOX_QUEUE_KIND)
    assert oldest_ready_created(tube) is None

    def task(n: int, status: str, pri: int) -> Task:
        return Task(f"{n:032x}", "t", status, 0, 127, pri, 0, 1000 + n, 10**9, 10**9, 0, 0)

    for n, status, pri in [(1, TAKEN, 0), (2, READY, 200), (3, READY, 5), (4, BURIED, 0)]:
        t = task(n, status, pri)
        tube.tasks[t.id] = t
        tube.enter(t)
    assert tube.first_ready().created == 1003  # take order puts the later task first
    assert oldest_ready_created(tube) == 1002
    # Many non-ready tasks before the ready ones: the walk gives up and scans the ready list.
    old = Tube(0, "u", BOX_QUEUE_KIND)
    for n in range(10):
        t = task(n, TAKEN, 0)
        old.tasks[t.id] = t
        old.enter(t)
    late = task(50, READY, 1)
    old.tasks[late.id] = late
    old.enter(late)
    assert oldest_ready_created(old) == 1050


def test_recovery_progress_logs_counts_and_an_estimate(monkeypatch, caplog):
    monkeypatch.setattr(recovery, "LOG_EVERY_S", 0.0)
    progress = recovery.RecoveryProgress()
    assert progress.state == "waiting" and progress.fraction() == 0.0
    with caplog.at_level(logging.INFO, logger="boxqueue.tubes.recovery"):
        progress.begin(1000)
        progress.advance(250)
        assert progress.state == "recovering"
        assert progress.fraction() == 0.25
        assert progress.seconds_left() is not None
        progress.advance(750)
        progress.finish()
    text = caplog.text
    assert "recovering tubes: 1,000 tasks to load" in text
    assert "recovering tubes: 250 of 1,000 tasks (25%), about" in text
    assert "recovered 1,000 tasks in" in text
    assert progress.state == "done" and progress.fraction() == 1.0 and progress.seconds is not None


def test_metrics_section(tmp_path: Path):
    path = tmp_path / "m.toml"
    path.write_text('[metrics]\nlisten = "127.0.0.1:9200"\npublic = true\n')
    assert load_config(path).metrics == MetricsConfig(listen=Address("127.0.0.1", 9200), public=True)
    path.write_text("[metrics]\n")
    assert load_config(path).metrics == MetricsConfig(listen=Address("127.0.0.1", 9100), public=False)
    path.write_text("[iproto]\n")
    assert load_config(path).metrics is None
    path.write_text('[metrics]\nlisten = "127.0.0.1:9200"\npublik = true\n')
    with pytest.raises(ConfigError, match=r"m.toml:3: unknown key 'publik' in \[metrics\]"):
        load_config(path)
    path.write_text('[iproto]\nlisten = "127.0.0.1:9200"\n[metrics]\nlisten = "127.0.0.1:9200"\n')
    with pytest.raises(ConfigError, match=r"metrics\.listen and iproto\.listen are both"):
        load_config(path)
    path.write_text('[metrics]\npublic = "yes"\n')
    with pytest.raises(ConfigError, match=r"metrics\.public must be true or false"):
        load_config(path)


def test_shipped_config_serves_metrics_on_loopback():
    shipped = load_config(Path(__file__).resolve().parents[2] / "conf" / "boxqueue.toml")
    assert shipped.metrics is not None and shipped.metrics.listen.host == "127.0.0.1"


def test_rate_limit_allows_a_burst_per_window_and_counts_the_rest(monkeypatch):
    from boxqueue import measures

    clock = [1000.0]
    monkeypatch.setattr(measures.time, "monotonic", lambda: clock[0])
    limit = measures.RateLimit(burst=3, window_s=60.0)
    assert [limit.allow() for _ in range(5)] == [True, True, True, False, False]
    assert limit.held == 2
    clock[0] += 59.9
    assert not limit.allow()
    clock[0] += 0.2  # a new window
    assert limit.allow()
    assert limit.take_held() == 3 and limit.held == 0
