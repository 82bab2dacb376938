"""Spark Structured Streaming on tubes (boxqueue/pipeline/stream_source.py, stream_sink.py) with a
real local Spark against real servers: a query moves 100,000 tasks from one tube to another

* in a driver of its own (tests/integration/stream_driver.py) killed with kill -9 twice mid-stream
  and started again from its checkpoint: every task arrives exactly once, the source ends empty;
* while the server is killed (kill -9) and started again mid-stream: nothing lost, nothing twice;
* while a replica set's leader is killed and another takes over: nothing lost (at least once).

The last two run in the Spark session the other Spark tests share."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

import tarantool

from boxqueue.pipeline.spark import register
from tests.integration.replica_fixtures import Cluster
from tests.integration.spark_fixtures import PIPELINE_SPACES, java_missing, spark_session
from tests.serverproc import ServerProcess

pytestmark = pytest.mark.skipif(java_missing(), reason="Spark needs Java 17 (java on PATH or JAVA_HOME)")

ROOT = Path(__file__).resolve().parents[2]
TASKS = 100_000


@pytest.fixture
def server(tmp_path):
    proc = ServerProcess(tmp_path / "server", extra_config=PIPELINE_SPACES, wal_mode="write")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def spark():
    session = spark_session()  # the Spark tests' shared session (getOrCreate)
    register(session)
    return session


def put_tasks(conn: tarantool.Connection, tube: str, count: int) -> None:
    # 2,000 a call: a call's tasks are made in one turn of the event loop, and the replica set's
    # leader (a lease of 2 s in these tests) must renew its lease between them on a busy machine
    for first in range(0, count, 2_000):
        rows = [[0, 0, 0, 0, f"task-{i}"] for i in range(first, min(count, first + 2_000))]
        conn.call("boxqueue.put_many", [0, tube, rows])


def count(conn: tarantool.Connection, tube: str) -> int:
    """Tasks of the tube in any state."""
    return conn.call("box.space.queue.index.tube_status:count", [[tube]]).data[0]


def count_in_set(conn: tarantool.Connection, tube: str) -> int | None:
    """``count``, or None when a role change broke the connection (the next call connects again)."""
    try:
        return count(conn, tube)
    except tarantool.error.NetworkError:
        return None


def payloads(conn: tarantool.Connection, tube: str) -> Counter:
    """The tube's payloads, read by task id a page at a time: one select of 100,000 tasks would hold
    the server's loop for a whole 5 MB answer (a replica set's leader, for longer than its lease on
    a busy machine)."""
    found: Counter = Counter()
    after: list = []
    while True:
        page = conn.select(0, after, index=0, iterator=tarantool.const.ITERATOR_GT, limit=10_000).data
        if not page:
            return found
        found.update(task[12] for task in page if task[1] == tube)
        after = [page[-1][0]]


def payloads_in_set(cluster: Cluster, tube: str) -> Counter:
    """``payloads`` from whichever node leads. A node whose role changes serves its next incarnation
    on new connections (process.py), so a read broken by a change starts again on the leader then;
    a node that died instead fails the test with its log."""
    for _attempt in range(3):
        leader = cluster.wait_for_leader(timeout=60)
        conn = cluster.connect(leader)
        try:
            return payloads(conn, tube)
        except tarantool.error.NetworkError as exc:
            node = cluster.nodes[leader]
            assert node.proc is not None and node.proc.poll() is None, f"{leader} died: {exc}\n{node.log()[-3000:]}"
            print(f"reading {tube} from {leader} broke ({exc}); reading again from the leader")
        finally:
            conn.close()
    raise AssertionError(f"{tube} could not be read from a leader three times")


def wait_for(check, timeout: float, what: str, alive=lambda: True, why=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        assert alive(), f"stopped while waiting for {what}: {why()}"
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout} s")


def assert_every_task_once(arrived: Counter) -> None:
    expected = {f"task-{i}" for i in range(TASKS)}
    assert not expected - set(arrived), f"{len(expected - set(arrived))} tasks lost"
    twice = {value: n for value, n in arrived.items() if n > 1}
    assert not twice, f"{len(twice)} tasks arrived more than once, e.g. {list(twice.items())[:5]}"
    assert set(arrived) == expected


def start_driver(uri: str, checkpoint: Path, log: Path, *extra: str) -> subprocess.Popen:
    """The query in a process group of its own (the driver's JVM and Python workers with it)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.integration.stream_driver", "--uri", uri, "--source", "src",
             "--target", "dst", "--checkpoint", str(checkpoint), *extra],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def test_a_driver_killed_twice_mid_stream_moves_every_task_exactly_once(server, tmp_path):
    conn = tarantool.Connection("127.0.0.1", server.port)
    put_tasks(conn, "src", TASKS)
    uri, checkpoint, log = f"127.0.0.1:{server.port}", tmp_path / "checkpoint", tmp_path / "driver.log"
    for moved in (15_000, 45_000):
        driver = start_driver(uri, checkpoint, log)
        try:
            wait_for(lambda moved=moved: count(conn, "dst") >= moved, 300, f"{moved} tasks moved",
                     alive=lambda driver=driver: driver.poll() is None)
        finally:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        at_kill = count(conn, "dst")
        assert moved <= at_kill < TASKS, f"killed at {at_kill}: not mid-stream\n{log.read_text()[-3000:]}"
    last = start_driver(uri, checkpoint, log, "--available-now")
    try:
        assert last.wait(600) == 0, log.read_text()[-5000:]
    finally:
        if last.poll() is None:
            os.killpg(last.pid, signal.SIGKILL)
    assert_every_task_once(payloads(conn, "dst"))
    assert count(conn, "src") == 0
    assert conn.select("tube_claims", [], limit=10).data == []  # no claim left behind
    conn.close()


def run_query(spark, uri: str, checkpoint: Path, **options: str):
    reader = spark.readStream.format("boxqueue").option("uri", uri).option("tube", "src").option("queue_space", "0")
    for key, value in {"maxTasksPerTrigger": "10000", "tasksPerPartition": "5000", **options}.items():
        reader = reader.option(key, value)
    return (reader.load().selectExpr("value").writeStream.format("boxqueue").option("uri", uri)
            .option("tube", "dst").option("queue_space", "0").option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="0 seconds").start())


def test_a_server_killed_mid_stream_loses_nothing_and_duplicates_nothing(server, spark, tmp_path):
    conn = tarantool.Connection("127.0.0.1", server.port)
    put_tasks(conn, "src", TASKS)
    conn.close()
    query = run_query(spark, f"127.0.0.1:{server.port}", tmp_path / "checkpoint")
    try:
        probe = tarantool.Connection("127.0.0.1", server.port)
        wait_for(lambda: count(probe, "dst") >= 30_000, 300, "30,000 tasks moved", alive=lambda: query.isActive, why=query.exception)
        probe.close()
        server.kill()
        time.sleep(1)
        server.start()
        conn = tarantool.Connection("127.0.0.1", server.port)
        wait_for(lambda: count(conn, "src") == 0, 300, "the source emptied", alive=lambda: query.isActive, why=query.exception)
    finally:
        query.stop()
    assert query.exception() is None
    assert_every_task_once(payloads(conn, "dst"))
    conn.close()


def test_a_query_stopped_and_started_again_reads_what_it_claimed_ahead(server, spark, tmp_path):
    """A running query claims the batch after the one its executors read (stream_source.py). A
    query stopped holds its last planned batch and the one claimed ahead; started again from its
    checkpoint, it reads both: every task arrives once and no claim is left."""
    conn = tarantool.Connection("127.0.0.1", server.port)
    put_tasks(conn, "src", 20_000)
    uri, checkpoint = f"127.0.0.1:{server.port}", tmp_path / "checkpoint"
    query = run_query(spark, uri, checkpoint, maxTasksPerTrigger="4000", tasksPerPartition="2000")
    try:
        wait_for(lambda: count(conn, "dst") >= 4_000, 300, "a batch moved", alive=lambda: query.isActive,
                 why=query.exception)
    finally:
        query.stop()
    assert query.exception() is None
    held = sum(len(claim[7]) for claim in conn.select("tube_claims", [], limit=100).data)  # the tasks listed
    assert 0 < held <= 8_000 and count(conn, "dst") < 20_000, f"{held} tasks held: not stopped mid-stream"
    again = (spark.readStream.format("boxqueue").option("uri", uri).option("tube", "src").option("queue_space", "0")
             .option("maxTasksPerTrigger", "4000").option("tasksPerPartition", "2000").load().selectExpr("value")
             .writeStream.format("boxqueue").option("uri", uri).option("tube", "dst").option("queue_space", "0")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    again.awaitTermination(300)
    assert not again.isActive and again.exception() is None
    arrived = payloads(conn, "dst")
    assert sorted(arrived) == sorted(f"task-{i}" for i in range(20_000)) and set(arrived.values()) == {1}
    assert count(conn, "src") == 0 and conn.select("tube_claims", [], limit=10).data == []
    conn.close()


def test_a_failover_mid_stream_loses_nothing(spark, tmp_path):
    cluster = Cluster(tmp_path / "cluster")
    cluster.start()
    try:
        leader = cluster.wait_for_leader()
        conn = cluster.connect(leader)
        put_tasks(conn, "src", TASKS)
        conn.close()
        uri = ",".join(f"127.0.0.1:{cluster.ports[name]}" for name in cluster.names)
        query = run_query(spark, uri, tmp_path / "checkpoint", failover_timeout="120")
        try:
            probe = cluster.connect(leader)
            wait_for(lambda: count(probe, "dst") >= 30_000, 300, "30,000 tasks moved", alive=lambda: query.isActive, why=query.exception)
            probe.close()
            cluster.nodes[leader].kill()
            successor = cluster.wait_for_leader(timeout=60, other_than=leader)
            conn = cluster.connect(successor)
            wait_for(lambda: count_in_set(conn, "src") == 0, 300, "the source emptied on the new leader",
                     alive=lambda: query.isActive, why=query.exception)
        finally:
            query.stop()
        assert query.exception() is None
        conn.close()
        arrived = payloads_in_set(cluster, "dst")
        lost = {f"task-{i}" for i in range(TASKS)} - set(arrived)
        assert not lost, f"{len(lost)} tasks lost"
        twice = sum(n - 1 for n in arrived.values())
        print(f"failover: {TASKS} tasks arrived, {twice} of them more than once")
    finally:
        cluster.stop()


# -- what a stream shows and takes (the shared session, Trigger.AvailableNow) ----------------------


def drain(spark, uri: str, tube: str, checkpoint: Path, queue_space: str = "0", **options: str) -> list:
    """Every task the tube has now, read as a stream (from ``checkpoint``); the rows, in creation order."""
    reader = spark.readStream.format("boxqueue").option("uri", uri).option("tube", tube).option("queue_space",
                                                                                                queue_space)
    for key, value in options.items():
        reader = reader.option(key, value)
    rows: list = []
    query = (reader.load().writeStream.foreachBatch(lambda frame, _batch: rows.extend(frame.collect()))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert not query.isActive and query.exception() is None
    return sorted(rows, key=lambda row: row.created)


def test_a_stream_shows_each_task_once_with_its_fields_and_acks_it(server, spark, tmp_path):
    conn = tarantool.Connection("127.0.0.1", server.port)
    first = conn.call("box.queue.put", [0, "shown", 0, 3600, 0, 5, "hello", 42]).data[0]
    conn.call("box.queue.put", [0, "shown", 0, 0, 0, 0, "second", {"k": [1, 2]}])
    conn.call("box.queue.put", [0, "shown", 3600, 0, 0, 0, "delayed"])  # not ready: not delivered
    uri = f"127.0.0.1:{server.port}"
    before = time.time()
    rows = drain(spark, uri, "shown", tmp_path / "shown", tasksPerPartition="1")
    assert [row.value for row in rows] == ["hello", "second"]
    assert [row.data for row in rows] == ['["hello",42]', '["second",{"k":[1,2]}]']
    assert rows[0].id == first[0] and {row.tube for row in rows} == {"shown"}
    assert [row.priority for row in rows] == [5.0, 0.0]  # box.queue's pri, as put
    assert [row.deliveries for row in rows] == [1, 1]
    assert 3599 <= (rows[0].expires - rows[0].created).total_seconds() <= 3600  # its ttl
    assert rows[0].created.timestamp() <= before + 1
    # Acked: gone from the tube; only the delayed task is left.
    assert [task[2] for task in conn.select(0, ["shown"], index=1).data] == ["d"]
    assert drain(spark, uri, "shown", tmp_path / "again") == []
    conn.close()


def test_starting_offsets_latest_leaves_the_tasks_before_it(server, spark, tmp_path):
    conn = tarantool.Connection("127.0.0.1", server.port)
    conn.call("box.queue.put", [0, "late", 0, 0, 0, 0, "before"])
    uri, checkpoint = f"127.0.0.1:{server.port}", tmp_path / "late"
    assert drain(spark, uri, "late", checkpoint, startingOffsets="latest") == []
    conn.call("box.queue.put", [0, "late", 0, 0, 0, 0, "after"])
    assert [row.value for row in drain(spark, uri, "late", checkpoint)] == ["after"]
    assert [task[12] for task in conn.select(0, ["late"], index=1).data] == ["before"]
    conn.close()


def test_a_stream_into_a_space_replaces_each_row(server, spark, tmp_path):
    conn = tarantool.Connection("127.0.0.1", server.port)
    put_tasks(conn, "rows", 2000)
    uri = f"127.0.0.1:{server.port}"
    query = (spark.readStream.format("boxqueue").option("uri", uri).option("tube", "rows").load()
             .selectExpr("cast(substr(value, 6) as bigint) as id", "value as name")
             .writeStream.format("boxqueue").option("uri", uri).option("space", "archive")
             .option("checkpointLocation", str(tmp_path / "rows")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    assert sorted(map(list, conn.select("archive", [], limit=5000).data)) == [[i, f"task-{i}"] for i in range(2000)]
    assert count(conn, "rows") == 0
    conn.close()


def test_tubes_of_zaqar_and_tarantool_queue_are_streams_too(spark, tmp_path):
    from tests.integration.test_cross_api import Servers

    servers = Servers(tmp_path / "srv")
    servers.start()
    try:
        with servers.zaqar("proj") as z:
            posted = z.post("/v1.1/queues/inbox/messages", json={"messages": [{"ttl": 300, "body": {"n": i}}
                                                                               for i in range(3)]})
            assert posted.status_code == 201
        conn = servers.iproto()
        conn.eval("queue.create_tube(..., 'fifo')", ["jobs"])
        for i in range(3):
            conn.call("queue.tube.jobs:put", [f"job-{i}"])
        uri = f"127.0.0.1:{servers.proc.port}"
        zaqar = drain(spark, uri, "proj/inbox", tmp_path / "zaqar", queue_space="zaqar")
        assert [row.value for row in zaqar] == ['{"n":0}', '{"n":1}', '{"n":2}']
        jobs = drain(spark, uri, "jobs", tmp_path / "jobs", queue_space="jobs")
        assert [(row.value, row.id) for row in jobs] == [("job-0", "0"), ("job-1", "1"), ("job-2", "2")]
        with servers.zaqar("proj") as z:
            assert z.get("/v1.1/queues/inbox/stats").json()["messages"]["total"] == 0
        assert conn.call("queue.tube.jobs:take", [0]).data == []
        conn.close()
    finally:
        servers.stop()


def test_the_example_counts_events_in_windows_into_a_tube(server, tmp_path):
    """docs/spark.md's command: the example job through spark-submit (a JVM and a session of its own)."""
    conn = tarantool.Connection("127.0.0.1", server.port)
    events = ["click"] * 30 + ["view"] * 12
    conn.call("boxqueue.put_many", [0, "events", [[0, 0, 0, 0, event] for event in events]])
    time.sleep(2.5)  # the next event is in a later two-second window, so it closes the first ones
    conn.call("box.queue.put", [0, "events", 0, 0, 0, 0, "tick"])
    uri = f"127.0.0.1:{server.port}"
    args = ["--uri", uri, "--source", "events", "--target", "event_counts", "--checkpoint",
            str(tmp_path / "windows"), "--window", "2 seconds", "--watermark", "0 seconds", "--max-tasks", "10",
            "--available-now"]
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    job = subprocess.run([str(submit), "--master", "local[2]", str(ROOT / "boxqueue/pipeline/examples/event_windows.py"),
                          *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stderr[-3000:]
    per_event: Counter = Counter()
    for task in conn.select(0, ["event_counts"], index=1).data:
        start, end, event, total = task[12:16]
        assert end > start
        per_event[event] += total
    assert per_event == Counter(events)  # each window's count once; the tick's window is not over
    assert count(conn, "events") == 0
    conn.close()


def test_options_and_modes_the_stream_cannot_take_are_refused_by_name(server, spark, tmp_path):
    uri = f"127.0.0.1:{server.port}"
    with pytest.raises(Exception, match="option 'startingOffsets' must be earliest or latest"):
        spark.readStream.format("boxqueue").option("uri", uri).option("tube", "t").option(
            "startingOffsets", "yesterday").load().writeStream.format("noop").start().awaitTermination(30)
    with pytest.raises(Exception, match="a tube cannot be read as a batch"):
        spark.read.format("boxqueue").option("uri", uri).option("tube", "t").load().count()
    counts = (spark.readStream.format("boxqueue").option("uri", uri).option("tube", "t").load()
              .groupBy("value").count())
    query = (counts.writeStream.format("boxqueue").option("uri", uri).option("tube", "out").outputMode("complete")
             .option("checkpointLocation", str(tmp_path / "complete")).trigger(availableNow=True).start())
    conn = tarantool.Connection("127.0.0.1", server.port)
    conn.call("box.queue.put", [0, "t", 0, 0, 0, 0, "x"])
    with pytest.raises(Exception, match="the boxqueue stream sink appends"):
        query.awaitTermination(60)
    conn.close()
