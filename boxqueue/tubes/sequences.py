"""Durable state of the broadcast tubes: queues, per-(queue, id) counters and stored versions.

Three spaces, created through the catalogue on first start and written only through the group
committer, so an acknowledged send survives kill -9. Their names share the prefix ``sonya_``
(system-managed: do not write them from clients):

* ``sonya_queues``   ``[queue]``                               the queues that exist;
* ``sonya_counters`` ``[queue, id, last]``                     the last automatic sequence per key,
  kept through delete, close and restart, so a number is never handed out twice (S2);
* ``sonya_versions`` ``[queue, id, sequence, payload_json]``   the history, primary key
  (queue, id, sequence), so the key order is exactly (id, sequence) inside a queue: no prefix
  collisions between ids such as ``1`` and ``10``.

Every function here that takes a write transaction is meant to run inside a committer write;
the readers run on the event loop against the shared read snapshot and never across an await.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterator
from typing import Any

import lmdb

from boxqueue.spaces import iterators as it
from boxqueue.spaces.catalog import Catalog
from boxqueue.spaces.definitions import FieldDef
from boxqueue.spaces.msgpack_values import pack
from boxqueue.spaces.ownership import Owner
from boxqueue.spaces.space import REPLACE, Space, decode_tuple

QUEUES = "sonya_queues"
COUNTERS = "sonya_counters"
VERSIONS = "sonya_versions"
PREFIX = "sonya_"  # reserved: every space named so is the broadcast tubes' (spaces.ownership)
SONYA_OWNER = Owner("Sonya's broadcast tubes")


def space_owner(space: Space) -> Owner | None:
    """The rule for :mod:`boxqueue.spaces.ownership`: the ``sonya_`` spaces are changed only by sends."""
    return SONYA_OWNER if space.name.startswith(PREFIX) else None

_LAYOUTS: dict[str, tuple[tuple[FieldDef, ...], list[list[Any]]]] = {
    QUEUES: ((FieldDef("queue", "string"),), [[0, "string"]]),
    COUNTERS: (
        (FieldDef("queue", "string"), FieldDef("id", "string"), FieldDef("last", "unsigned")),
        [[0, "string"], [1, "string"]],
    ),
    VERSIONS: (
        (
            FieldDef("queue", "string"),
            FieldDef("id", "string"),
            FieldDef("sequence", "unsigned"),
            FieldDef("payload", "string"),
        ),
        [[0, "string"], [1, "string"], [2, "unsigned"]],
    ),
}

MAX_SEQUENCE = 2**64 - 1


class Message:
    """One version of a key, with its wire form (``{"id":..,"sequence":..,"payload":..}``).

    A live message is one object handed to every listener, so ``encoded`` is where a transport
    keeps what it derived from ``json`` (a WebSocket frame per negotiated extension, a long-poll
    body): made by the first listener that needs it, reused by the other thousand."""

    __slots__ = ("id", "sequence", "json", "encoded")

    def __init__(self, id: str, sequence: int, json: str) -> None:
        self.id = id
        self.sequence = sequence
        self.json = json
        self.encoded: dict[Hashable, bytes] = {}

    def __repr__(self) -> str:
        return f"Message({self.id!r}, {self.sequence}, {self.json!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (self.id, self.sequence, self.json) == (other.id, other.sequence, other.json)

    def __hash__(self) -> int:
        return hash((self.id, self.sequence, self.json))


def message(key: str, sequence: int, payload_json: str) -> Message:
    wire = f'{{"id":{json.dumps(key, ensure_ascii=False)},"sequence":{sequence},"payload":{payload_json}}}'
    return Message(key, sequence, wire)


async def open_spaces(catalog: Catalog) -> tuple[Space, Space, Space]:
    """The three spaces, created with their primary index when missing (idempotent)."""
    found = []
    for name in (QUEUES, COUNTERS, VERSIONS):
        fmt, parts = _LAYOUTS[name]
        space, _ = await catalog.create_space(name, format=fmt, if_not_exists=True)
        if space.primary is None:
            await catalog.create_index(space, "primary", parts=parts, if_not_exists=True)
        got = tuple(space.primary.fieldnos) if space.primary is not None else ()
        if got != tuple(p[0] for p in parts):
            raise RuntimeError(f"space '{name}' exists with another primary key; it is reserved for Sonya")
        found.append(space)
    return found[0], found[1], found[2]


class SequenceStore:
    """Reads and transaction-level writes of the three spaces."""

    def __init__(self, queues: Space, counters: Space, versions: Space) -> None:
        self.queues = queues
        self.counters = counters
        self.versions = versions

    # -- reads (event loop, one snapshot, no await) ---------------------------------------------

    def queue_names(self) -> list[str]:
        return [decode_tuple(raw)[0] for raw in self.queues.pairs(0, it.ALL, [])]

    def history(self, queue: str, key: str | None, start: int | str) -> list[Message]:
        """Stored versions a subscription preloads (spec 3.6): ``start`` is a sequence, ``first``
        or ``last``; ``key`` None means the whole queue, ordered by (id, sequence)."""
        if key is None:
            rows = self._rows(queue, [queue])
            if start == "last":
                newest: dict[str, Message] = {}
                for m in rows:
                    newest[m.id] = m
                return list(newest.values())
            if start == "first":
                return list(rows)
            if not isinstance(start, int):
                raise ValueError(f"start is a sequence, first or last, not {start!r}")
            return [m for m in rows if m.sequence >= start]
        if start == "first":
            return list(self._rows(queue, [queue, key]))
        if start == "last":
            newest_one = None
            for raw in self.versions.pairs(0, it.LE, [queue, key, MAX_SEQUENCE]):
                fields = decode_tuple(raw)
                if fields[0] == queue and fields[1] == key:
                    newest_one = message(fields[1], fields[2], fields[3])
                break
            return [] if newest_one is None else [newest_one]
        out = []
        for raw in self.versions.pairs(0, it.GE, [queue, key, start]):
            fields = decode_tuple(raw)
            if fields[0] != queue or fields[1] != key:
                break
            out.append(message(fields[1], fields[2], fields[3]))
        return out

    def _rows(self, queue: str, prefix: list[Any], txn: lmdb.Transaction | None = None) -> Iterator[Message]:
        for raw in self.versions.pairs(0, it.EQ, prefix, txn):
            fields = decode_tuple(raw)
            yield message(fields[1], fields[2], fields[3])

    # -- writes (inside a committer transaction) ------------------------------------------------

    def add_queue(self, txn: lmdb.Transaction, queue: str) -> None:
        self.queues.prepare_put(pack([queue]), [queue], REPLACE)(txn)

    def drop_queue(self, txn: lmdb.Transaction, queue: str) -> None:
        """The queue and all its history; the counters stay (S2)."""
        self.queues.prepare_delete(0, [queue])(txn)
        self._delete_rows(txn, [queue])

    def delete_key(self, txn: lmdb.Transaction, queue: str, key: str) -> None:
        self._delete_rows(txn, [queue, key])

    def _delete_rows(self, txn: lmdb.Transaction, prefix: list[Any]) -> None:
        doomed = [decode_tuple(raw)[:3] for raw in self.versions.pairs(0, it.EQ, prefix, txn)]
        for queue, key, seq in doomed:
            self.versions.prepare_delete(0, [queue, key, seq])(txn)

    def next_sequence(self, txn: lmdb.Transaction, queue: str, key: str) -> int:
        """Increment and store the key's counter; the first number is 1."""
        raw = self.counters.get(0, [queue, key], txn)
        last = 0 if raw is None else decode_tuple(raw)[2]
        seq = last + 1 if last < MAX_SEQUENCE else 1
        fields = [queue, key, seq]
        self.counters.prepare_put(pack(fields), fields, REPLACE)(txn)
        return seq

    def store(self, txn: lmdb.Transaction, queue: str, key: str, seq: int, payload_json: str, keep: int | None) -> None:
        """Store one version (overwriting an equal sequence) and keep only the newest ``keep``
        versions of the key, by sequence (S3: None keeps all, 0 stores nothing)."""
        if keep == 0:
            return
        fields = [queue, key, seq, payload_json]
        self.versions.prepare_put(pack(fields), fields, REPLACE)(txn)
        if keep is None:
            return
        seqs = [decode_tuple(raw)[2] for raw in self.versions.pairs(0, it.EQ, [queue, key], txn)]
        for old in seqs[: max(0, len(seqs) - keep)]:
            self.versions.prepare_delete(0, [queue, key, old])(txn)
