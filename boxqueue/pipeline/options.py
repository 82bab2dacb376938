"""The data source's options, parsed and checked once on the driver.

Spark passes options as a case-insensitive mapping of strings; everything numeric is parsed here
so a typo fails at planning time with the option's name rather than inside an executor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from boxqueue.pipeline.errors import BoxqueueSourceError

DEFAULT_URI = "127.0.0.1:33020"


def _int(options: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise BoxqueueSourceError(f"option '{name}' must be an integer, got {raw!r}") from None
    if value < minimum:
        raise BoxqueueSourceError(f"option '{name}' must be at least {minimum}, got {value}")
    return value


def _seconds(options: Mapping[str, str], name: str, default: float) -> float:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise BoxqueueSourceError(f"option '{name}' must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise BoxqueueSourceError(f"option '{name}' must be more than 0 seconds, got {raw!r}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise BoxqueueSourceError(f"option '{name}' must be true or false, got {raw!r}")


@dataclass(frozen=True)
class SourceOptions:
    """What one read or write is about and how it talks to the server (picklable, sent to executors)."""

    host: str
    port: int
    user: str | None
    password: str | None
    space: str | None
    tube: str | None
    queue_space: str
    unique: bool
    batch_size: int
    pipeline_depth: int
    partitions: int | None
    rows_per_partition: int
    connect_timeout: float
    # ``read_from``: members to read from instead of ``uri`` (a replica set's followers, so that
    # bulk reads leave the leader alone); writes always go to ``uri``.
    read_from: tuple[tuple[str, int], ...] = ()
    # Every member ``uri`` names (``host:port,host:port``; host and port are the first): streams
    # look for the leader among them (boxqueue/pipeline/leader.py), for up to ``failover_timeout`` s.
    members: tuple[tuple[str, int], ...] = ()
    failover_timeout: float = 120.0

    @property
    def uri(self) -> str:
        return f"{self.host}:{self.port}"

    def reading(self, choice: int = 0) -> SourceOptions:
        """The options a read connects with: one of ``read_from`` (by ``choice``), else these."""
        if not self.read_from:
            return self
        host, port = self.read_from[choice % len(self.read_from)]
        return replace(self, host=host, port=port)


def parse_uri(uri: str) -> tuple[str, int]:
    """``host:port`` (IPv6 as ``[addr]:port``) into its parts."""
    text = uri.strip()
    if "://" in text:
        text = text.split("://", 1)[1]
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise BoxqueueSourceError(f"option 'uri' must be host:port, got {uri!r}")
    host = host.strip("[]")
    try:
        number = int(port)
    except ValueError:
        raise BoxqueueSourceError(f"option 'uri' must be host:port, got {uri!r}") from None
    if not 0 < number < 65536:
        raise BoxqueueSourceError(f"option 'uri' has a bad port: {uri!r}")
    return host, number


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Check and parse the user's options (keys are case-insensitive in Spark already)."""
    members = tuple(parse_uri(part) for part in str(options.get("uri") or DEFAULT_URI).split(",") if part.strip())
    if not members:
        raise BoxqueueSourceError(f"option 'uri' must be host:port, got {options.get('uri')!r}")
    host, port = members[0]
    space = options.get("space")
    tube = options.get("tube")
    if space and tube:
        raise BoxqueueSourceError("give either option 'space' or option 'tube', not both")
    partitions = options.get("partitions")
    timeout = _seconds(options, "connect_timeout", 10.0)
    return SourceOptions(
        host=host,
        port=port,
        user=options.get("user") or None,
        password=options.get("password"),
        space=space or None,
        tube=tube or None,
        queue_space=str(options.get("queue_space") or "0"),
        unique=_bool(options, "unique", False),
        batch_size=_int(options, "batch_size", 1000),
        pipeline_depth=_int(options, "pipeline_depth", 512),
        partitions=_int(options, "partitions", 1) if partitions not in (None, "") else None,
        rows_per_partition=_int(options, "rows_per_partition", 250_000),
        connect_timeout=timeout,
        read_from=tuple(parse_uri(part) for part in str(options.get("read_from") or "").split(",") if part.strip()),
        members=members,
        failover_timeout=_seconds(options, "failover_timeout", 120.0),
    )


@dataclass(frozen=True)
class StreamOptions:
    """The options of a streaming read or write of a tube (Kafka's source names them so)."""

    max_tasks_per_trigger: int  # tasks a micro-batch claims at most (Spark's ReadMaxRows)
    tasks_per_partition: int  # tasks a claim holds at most: one Spark partition each
    claim_ttl: float  # seconds a batch's claims hold its tasks (renewed when the batch runs)
    latest: bool  # startingOffsets=latest: only tasks created after the query's first batch
    chunk_rows: int  # the sink: rows a marked write carries at most
    writer_id: str | None  # the sink: whose marks these are (default: Spark's query id)


MAX_CHUNK = 100_000  # rows or tasks in one call (the server's limit)


def parse_stream_options(options: Mapping[str, str]) -> StreamOptions:
    starting = str(options.get("startingOffsets") or "earliest").strip().lower()
    if starting not in ("earliest", "latest"):
        raise BoxqueueSourceError(f"option 'startingOffsets' must be earliest or latest, got {starting!r}")
    per_partition = _int(options, "tasksPerPartition", 10_000)
    chunk = _int(options, "chunkRows", 10_000)
    if per_partition > MAX_CHUNK or chunk > MAX_CHUNK:
        raise BoxqueueSourceError(f"options 'tasksPerPartition' and 'chunkRows' must be at most {MAX_CHUNK}")
    return StreamOptions(
        max_tasks_per_trigger=_int(options, "maxTasksPerTrigger", 100_000),
        tasks_per_partition=per_partition,
        claim_ttl=_seconds(options, "claimTtl", 300.0),
        latest=starting == "latest",
        chunk_rows=chunk,
        writer_id=str(options.get("writerId") or "").strip() or None,
    )
