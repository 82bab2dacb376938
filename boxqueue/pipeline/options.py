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
    host, port = parse_uri(str(options.get("uri") or DEFAULT_URI))
    space = options.get("space")
    tube = options.get("tube")
    if space and tube:
        raise BoxqueueSourceError("give either option 'space' or option 'tube', not both")
    partitions = options.get("partitions")
    try:
        timeout = float(options.get("connect_timeout") or 10.0)
    except ValueError:
        raise BoxqueueSourceError("option 'connect_timeout' must be a number of seconds") from None
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
    )
