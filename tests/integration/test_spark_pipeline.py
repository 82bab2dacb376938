"""The PySpark data source (boxqueue/pipeline/) against the real server, in one local[2] Spark session."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid

import pytest

pytest.importorskip("pyspark")

import tarantool
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, LessThan

from boxqueue.pipeline.spark import PUSHDOWN_CONF, BoxqueueDataSource, register
from tests.integration.spark_fixtures import PIPELINE_SPACES, java_missing, spark_session
from tests.serverproc import ServerProcess, free_port

pytestmark = pytest.mark.skipif(java_missing(), reason="Spark needs Java 17 (java on PATH or JAVA_HOME)")

ROUND_TRIP_ROWS = 100_000


@pytest.fixture(scope="module")
def pipeline_server(tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("pipeline"), extra_config=PIPELINE_SPACES, wal_mode="write")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def spark():
    """The suite's one local session (test_doc_examples.py and test_spark_streaming.py share it);
    it ends with the process."""
    session = spark_session()
    register(session)
    return session


@pytest.fixture
def uri(pipeline_server) -> str:
    return f"127.0.0.1:{pipeline_server.port}"


@pytest.fixture
def conn(pipeline_server):
    c = tarantool.connect("127.0.0.1", pipeline_server.port)
    yield c
    c.close()


def read(spark, uri: str, space: str, **options: str):
    reader = spark.read.format("boxqueue").option("uri", uri).option("space", space)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def write(frame, uri: str, mode: str = "append", **options: str) -> None:
    writer = frame.write.format("boxqueue").option("uri", uri).mode(mode)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def take_all(conn, tube: str) -> list[list]:
    """Take and ack every ready task of a tube; the tasks as box.queue returns them."""
    tasks = []
    while True:
        answer = conn.call("box.queue.take", [0, tube, 0.2]).data
        if not answer:
            return tasks
        tasks.append(answer[0])
        conn.call("box.queue.ack", [0, answer[0][0]])


def every_type_frame(spark, rows: int):
    return spark.range(rows, numPartitions=2).selectExpr(
        "id",
        "id * 7 - 350000 as i",
        "cast(id as double) / 3 as n",
        "cast(id as double) * 0.25 - 100 as d",
        "concat('s', id, '-ю') as s",
        "id % 2 = 0 as b",
        "unhex(lpad(hex(id), 8, '0')) as v",
        "lower(concat(lpad(hex(id), 8, '0'), '-0000-4000-8000-', lpad(hex(id * 31), 12, '0'))) as u",
        "cast(concat(case when id % 2 = 0 then '' else '-' end, id, '.', lpad(id % 1000, 3, '0'))"
        " as decimal(38,18)) as dec",
        "timestamp_micros(1700000000000000 + id * 1001) as dt",
        "case when id % 5 = 0 then null else concat('o', id) end as opt",
    )


def test_round_trip_of_every_supported_type(spark, uri, conn):
    source = every_type_frame(spark, ROUND_TRIP_ROWS)
    write(source, uri, mode="overwrite", space="every_type")
    assert conn.call("box.space.every_type:len").data[0] == ROUND_TRIP_ROWS

    # Stored as the server's own types (uuid, decimal, datetime extensions), not as text.
    stored = conn.select("every_type", [12345]).data[0]
    assert stored[:7] == [12345, 12345 * 7 - 350000, 12345 / 3, 12345 * 0.25 - 100, "s12345-ю", False,
                          bytes.fromhex("00003039")]
    assert stored[7] == uuid.UUID(f"{12345:08x}-0000-4000-8000-{12345 * 31:012x}")
    assert stored[8] == decimal.Decimal("-12345.345")
    assert isinstance(stored[9], tarantool.Datetime)
    assert stored[9].value == (1700000000000000 + 12345 * 1001) * 1000
    assert stored[10] is None  # 12345 % 5 == 0

    back = read(spark, uri, "every_type", partitions="4").cache()  # read once for the checks below
    assert back.rdd.getNumPartitions() == 4
    assert [(f.name, f.dataType.simpleString()) for f in back.schema.fields] == [
        ("id", "bigint"), ("i", "bigint"), ("n", "double"), ("d", "double"), ("s", "string"),
        ("b", "boolean"), ("v", "binary"), ("u", "string"), ("dec", "decimal(38,18)"),
        ("dt", "timestamp"), ("opt", "string"), ("_tail", "string"),
    ]
    values = back.drop("_tail")
    assert values.count() == ROUND_TRIP_ROWS
    assert values.exceptAll(source).count() == 0
    assert source.exceptAll(values).count() == 0
    assert back.filter("_tail is not null").count() == 0
    back.unpersist()


@pytest.mark.parametrize(
    ("space", "frame_sql", "key"),
    [
        ("archive", ["id", "concat('n', id) as name"], ["id"]),
        ("by_name", ["concat('k', lpad(id, 6, '0'), '-', id % 7) as name", "id as n"], ["name"]),
        ("pairs", ["id % 50 as a", "concat('b', id) as b", "id as n"], ["a", "b"]),
    ],
)
def test_partitioned_read_returns_each_row_once(spark, uri, space, frame_sql, key):
    rows = 20_000
    source = spark.range(rows, numPartitions=2).selectExpr(*frame_sql)
    write(source, uri, mode="overwrite", space=space)
    frame = read(spark, uri, space, partitions="5", batch_size="700")
    assert frame.rdd.getNumPartitions() == 5
    keys = [tuple(row) for row in frame.select(*key).collect()]
    assert len(keys) == rows
    assert set(keys) == {tuple(row) for row in source.select(*key).collect()}
    per_partition = frame.rdd.glom().map(len).collect()
    assert sum(per_partition) == rows
    assert min(per_partition) > 0  # the ranges split the space, none is empty


def test_hash_primary_key_is_read_as_one_range(spark, uri):
    source = spark.range(3000).selectExpr("concat('h', id) as k", "id as n")
    write(source, uri, mode="overwrite", space="hashed")
    frame = read(spark, uri, "hashed", partitions="4", batch_size="250")
    assert frame.rdd.getNumPartitions() == 1
    names = [row.k for row in frame.select("k").collect()]
    assert sorted(names) == sorted(f"h{i}" for i in range(3000))


def test_pushed_filters_narrow_the_key_ranges(spark, uri):
    write(spark.range(2000).selectExpr("id", "concat('n', id) as name"), uri, mode="overwrite", space="archive")
    source = BoxqueueDataSource({"uri": uri, "space": "archive", "pushdown": "true", "partitions": "3"})
    reader = source.reader(source.schema())
    other = EqualTo(("name",), "n1200")
    left = reader.pushFilters([GreaterThanOrEqual(("id",), 1000), LessThan(("id",), 1500), other])
    assert list(left) == [other]  # the key comparisons are applied by the reader itself
    partitions = reader.partitions()
    assert len(partitions) == 3
    ids = [i for p in partitions for batch in reader.read(p) for i in batch.column(0).to_pylist()]
    assert sorted(ids) == list(range(1000, 1500))

    spark.conf.set(PUSHDOWN_CONF, "true")
    try:
        fresh = read(spark, uri, "archive", pushdown="true")
        assert fresh.filter("id >= 1000 and id < 1500").count() == 500
    finally:
        spark.conf.unset(PUSHDOWN_CONF)


def test_a_reused_frame_reads_everything_without_pushdown(spark, uri):
    write(spark.range(2000).selectExpr("id", "concat('n', id) as name"), uri, mode="overwrite", space="archive")
    frame = read(spark, uri, "archive")
    assert frame.filter("id < 10").count() == 10
    assert frame.count() == 2000


def test_tube_write_is_consumed_by_take(spark, uri, conn):
    frame = spark.range(300, numPartitions=2).selectExpr(
        "concat('mail-', id) as payload",
        "id as n",
        "case when id >= 100 and id < 110 then 50 else 0 end as pri",
        "30 as ttr",
        "case when id >= 290 then 3600 else 0 end as delay",
    )
    write(frame, uri, tube="emails", queue_space="0")
    tasks = take_all(conn, "emails")
    assert len(tasks) == 290  # the ten delayed by an hour are not ready
    assert all(task[1] == "emails" and task[2] == "taken" for task in tasks)
    assert sorted(task[3] for task in tasks) == sorted(f"mail-{i}" for i in range(290))
    assert {task[4] for task in tasks[:10]} == set(range(100, 110))  # pri 50 goes first
    delayed = conn.call("box.queue.statistics", [0, "emails"]).data[0]
    stats = dict(zip(delayed[::2], delayed[1::2], strict=True))
    assert int(stats["space0.emails.tasks.delayed"]) == 10


def test_retried_space_write_does_not_duplicate(spark, uri, conn):
    conn.replace("archive", [99_999, "stale"])
    bad = spark.range(5000, numPartitions=1).selectExpr(
        "id", "case when id = 2000 then null else concat('first-', id) end as name"
    )
    with pytest.raises(Exception) as failure:
        write(bad, uri, mode="overwrite", space="archive")
    assert "replace into space 'archive' failed at row 2000 of this task" in str(failure.value)
    partial = conn.call("box.space.archive:len").data[0]
    assert 2000 <= partial < 5000  # the rows before the bad one stayed; the stale row is gone
    assert conn.select("archive", [99_999]).data == []

    good = spark.range(5000, numPartitions=2).selectExpr("id", "concat('second-', id) as name")
    write(good, uri, space="archive")
    write(good, uri, space="archive")  # and once more, as a retried job would
    assert conn.call("box.space.archive:len").data[0] == 5000
    names = read(spark, uri, "archive").select("name").collect()
    assert sorted(row.name for row in names) == sorted(f"second-{i}" for i in range(5000))


def test_retried_tube_write_with_unique_does_not_enqueue_twice(spark, uri, conn):
    jobs = spark.range(400, numPartitions=2)
    first_attempt = jobs.filter("id % 3 = 0").selectExpr("concat('job-', id) as payload")
    write(first_attempt, uri, tube="reports", queue_space="queue", unique="true")
    everything = jobs.selectExpr("concat('job-', id) as payload")
    write(everything, uri, tube="reports", queue_space="queue", unique="true")
    tasks = take_all(conn, "reports")
    assert sorted(task[3] for task in tasks) == sorted(f"job-{i}" for i in range(400))

    # Without unique the same retry enqueues twice: what the option prevents.
    write(first_attempt, uri, tube="plain", queue_space="queue")
    write(everything, uri, tube="plain", queue_space="queue")
    assert len(take_all(conn, "plain")) == 400 + len(range(0, 400, 3))


def test_a_spark_task_retried_after_a_failure_does_not_enqueue_twice(spark, uri, conn, tmp_path):
    marker = tmp_path / "first-attempt-failed"
    rows, fail_at = 6000, 5900

    def payload(i):
        from pyspark import TaskContext

        if i == fail_at and TaskContext.get().attemptNumber() == 0:
            marker.write_text("failed")
            raise RuntimeError("injected failure of the first attempt")
        return f"task-{i}"

    from pyspark.sql.functions import col, udf

    make_payload = udf(payload, "string")
    frame = spark.range(rows, numPartitions=1).select(make_payload(col("id")).alias("payload"))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")  # rows reach the writer early
    try:
        write(frame, uri, tube="retried", queue_space="0", unique="true")
        assert marker.read_text() == "failed"  # the first attempt really failed; the job still succeeded
        marker.unlink()
        write(frame, uri, tube="retried_plain", queue_space="0")  # the same, without unique
        assert marker.read_text() == "failed"
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    ready = conn.select("queue", ["retried", "r"], index="tube_status").data  # every ready task
    payloads = [task[12] for task in ready]
    assert len(payloads) == rows
    assert set(payloads) == {f"task-{i}" for i in range(rows)}
    # Plain puts enqueue again what the failed attempt had put before it failed.
    assert len(conn.select("queue", ["retried_plain", "r"], index="tube_status").data) > rows


def test_overwrite_of_a_tube_truncates_it(spark, uri, conn):
    write(spark.range(5).selectExpr("concat('old-', id) as payload"), uri, tube="nightly", queue_space="0")
    write(spark.range(3).selectExpr("concat('new-', id) as payload"), uri, mode="overwrite", tube="nightly",
          queue_space="0")
    assert sorted(task[3] for task in take_all(conn, "nightly")) == ["new-0", "new-1", "new-2"]


def test_array_map_and_extra_fields_travel_as_json(spark, uri, conn):
    conn.call("box.space.documents:truncate")
    conn.call("box.space.documents_copy:truncate")
    conn.replace("documents", [1, ["a", 2], {"k": "v"}, {"x": [1]}, "extra", 3])
    conn.replace("documents", [2, [], {}, "plain"])
    rows = {row.id: row for row in read(spark, uri, "documents").collect()}
    assert (rows[1].tags, rows[1].attrs, rows[1].anything, rows[1]._tail) == (
        '["a",2]', '{"k":"v"}', '{"x":[1]}', '["extra",3]')
    assert (rows[2].tags, rows[2].attrs, rows[2].anything, rows[2]._tail) == ("[]", "{}", "plain", None)

    write(read(spark, uri, "documents"), uri, space="documents_copy")
    copied = {t[0]: t for t in conn.select("documents_copy", []).data}
    # arrays, maps and the extra fields come back as they were; `any` keeps the text it was read as
    assert copied[1] == [1, ["a", 2], {"k": "v"}, '{"x":[1]}', "extra", 3]
    assert copied[2] == [2, [], {}, "plain"]


def test_a_space_without_format_is_read_and_written_by_position(spark, uri, conn):
    conn.call("box.space.bare:truncate")
    conn.replace("bare", [1, "one", 1.5])
    conn.replace("bare", [2, "two", 2.5, "extra"])
    with pytest.raises(Exception, match=r"space 'bare' has no format: give the columns with \.schema"):
        read(spark, uri, "bare")
    frame = (spark.read.format("boxqueue").schema("k long, label string, x double")
             .option("uri", uri).option("space", "bare").load())
    assert sorted(tuple(row) for row in frame.collect()) == [(1, "one", 1.5), (2, "two", 2.5)]
    write(frame.selectExpr("k + 10 as k", "label", "x"), uri, space="bare")
    assert conn.select("bare", [11]).data == [[11, "one", 1.5]]
    assert conn.select("bare", [12]).data == [[12, "two", 2.5]]
    # With _tail in the schema, the fields past the given columns travel too.
    with_tail = (spark.read.format("boxqueue").schema("_tail string, k long, label string")
                 .option("uri", uri).option("space", "bare").load().filter("k < 10"))
    assert sorted(tuple(row) for row in with_tail.collect()) == [("[1.5]", 1, "one"), ('[2.5,"extra"]', 2, "two")]
    write(with_tail.selectExpr("k + 20 as k", "label", "_tail"), uri, space="bare")
    assert conn.select("bare", [22]).data == [[22, "two", 2.5, "extra"]]


def test_login_with_user_and_password(spark, uri):
    frame = read(spark, uri, "archive", user="loader", password="s3cret")
    assert frame.count() == frame.count()  # readable with the user's grants
    with pytest.raises(Exception, match="authentication failed for user 'loader'"):
        read(spark, uri, "archive", user="loader", password="wrong").count()


def test_clear_errors(spark, uri):
    with pytest.raises(Exception, match="space 'missing' does not exist at"):
        read(spark, uri, "missing")
    with pytest.raises(Exception, match="space 'missing' does not exist at"):
        write(spark.range(1), uri, space="missing")
    nowhere = f"127.0.0.1:{free_port()}"
    with pytest.raises(Exception, match=f"cannot connect to boxqueue at {nowhere}"):
        read(spark, nowhere, "archive")
    with pytest.raises(Exception, match=r"column 'id' \(string\) cannot be written to field 'id' of space 'archive' of type unsigned"):
        write(spark.range(1).selectExpr("cast(id as string) as id", "'x' as name"), uri, space="archive")
    with pytest.raises(Exception, match="column 'colour' is not a field of space 'archive'"):
        write(spark.range(1).selectExpr("id", "'x' as name", "'red' as colour"), uri, space="archive")
    with pytest.raises(Exception, match="space 'archive' needs a column for field 'name'"):
        write(spark.range(1), uri, space="archive")
    with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):  # Spark's rule: append/overwrite
        spark.range(1).selectExpr("'x' as payload").write.format("boxqueue").option("uri", uri).option(
            "tube", "t").save()
    with pytest.raises(Exception, match="space 'archive' is not a queue space"):
        write(spark.range(1).selectExpr("'x' as payload"), uri, tube="t", queue_space="archive")
    with pytest.raises(Exception, match=r"column 'ttl' .* must be numeric"):
        write(spark.range(1).selectExpr("'soon' as ttl", "'x' as payload"), uri, tube="t", queue_space="0")


def test_values_a_column_cannot_take_fail_the_read_by_name(spark, uri, conn):
    conn.call("box.space.every_type:truncate")
    conn.replace("every_type", [18_446_744_073_709_551_615, 0, 0, 0.0, "", True, b"", uuid.uuid4(),
                                decimal.Decimal(0), tarantool.Datetime(timestamp=0), None])
    try:
        frame = read(spark, uri, "every_type").filter("b")
        with pytest.raises(Exception, match="field 'id' of space 'every_type' holds 18446744073709551615"):
            frame.count()
    finally:
        conn.delete("every_type", [18_446_744_073_709_551_615])


def test_datetime_is_read_as_the_utc_instant(spark, uri, conn):
    conn.call("box.space.every_type:truncate")
    moment = tarantool.Datetime(year=2024, month=3, day=1, hour=12, minute=30, sec=5, nsec=123456789, tzoffset=180)
    conn.replace("every_type", [1, 0, 0, 0.0, "", True, b"", uuid.uuid4(), decimal.Decimal(0), moment, None])
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    row = read(spark, uri, "every_type").selectExpr("unix_micros(dt) as micros").first()
    expected = dt.datetime(2024, 3, 1, 9, 30, 5, 123456, tzinfo=dt.UTC)
    assert row.micros == (expected - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)


def test_examples_load_files_export_a_space_and_report_per_tube(spark, uri, conn, tmp_path):
    from boxqueue.pipeline.examples import export_space, load_tube, tube_report

    parquet = str(tmp_path / "tasks.parquet")
    csv = str(tmp_path / "tasks.csv")
    spark.range(100).selectExpr("concat('p-', id) as payload", "id as n", "5 as pri").write.parquet(parquet)
    spark.range(50).selectExpr("concat('c-', id) as payload").coalesce(1).write.option("header", "true").csv(csv)
    assert load_tube.main(["--uri", uri, "--input", parquet, "--tube", "imports", "--unique"]) == 0
    assert load_tube.main(["--uri", uri, "--input", parquet, "--tube", "imports", "--unique"]) == 0  # a rerun
    assert load_tube.main(["--uri", uri, "--input", csv, "--format", "csv", "--tube", "csv_in"]) == 0
    for _ in range(5):  # five tasks stay taken by this connection
        assert conn.call("box.queue.take", [0, "imports", 1]).data

    out = str(tmp_path / "queue_export")
    assert export_space.main(["--uri", uri, "--space", "queue", "--output", out, "--partitions", "3"]) == 0
    exported = spark.read.parquet(out).filter("tube in ('imports', 'csv_in')")
    assert exported.count() == 150
    payloads = {row.tube: row for row in exported.groupBy("tube").agg({"_tail": "max"}).collect()}
    assert set(payloads) == {"imports", "csv_in"}
    assert payloads["imports"]["max(_tail)"].startswith('["p-')

    args = tube_report.parse(["--uri", uri, "--space", "queue"])
    rows = {row.tube: row for row in tube_report.report(spark, args).collect()}
    assert (rows["imports"].tasks, rows["imports"].ready, rows["imports"].taken) == (100, 95, 5)
    assert (rows["csv_in"].tasks, rows["csv_in"].ready, rows["csv_in"].done) == (50, 50, 0)
    assert 0 <= rows["imports"].age_p50_s <= rows["imports"].age_p99_s < 600


def test_reads_go_to_read_from_and_leave_uri_alone(spark, uri):
    """``read_from`` names the members to read from (a replica set's followers): describing,
    planning and every partition's read go there; ``uri`` (the leader) is not even reachable here."""
    from tests.serverproc import free_port

    write(spark.range(3000).selectExpr("id", "concat('n', id) as name"), uri, mode="overwrite", space="archive")
    unreachable = f"127.0.0.1:{free_port()}"
    frame = read(spark, unreachable, "archive", read_from=f"{uri},{uri}", partitions="3", batch_size="500")
    assert frame.rdd.getNumPartitions() == 3
    assert sorted(row.id for row in frame.select("id").collect()) == list(range(3000))
