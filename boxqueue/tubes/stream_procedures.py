"""The procedures of the Spark streaming source and sink, under ``boxqueue.`` (docs/spark.md):

=============================================================  =====================================
``boxqueue.stream_claim(space, tube, claim, limit, ttl[, after, upto])``  the claim's task count (made now unless it exists)
``boxqueue.stream_read(space, tube, claim, after, limit)``   ``data_at, kind, {tuples}``: its tasks created after ``after``
``boxqueue.stream_renew(space, tube, {claims}, ttl)``        how many live (renewed where half their ttl is gone)
``boxqueue.stream_ack(space, tube, {claims})``               how many tasks were deleted with the claims
``boxqueue.put_many(space, tube, {rows}[, mark])``           rows ``{delay, ttl, ttr, pri, data...}`` as box.queue.put
``boxqueue.replace_many(space, {tuples}[, mark])``           REPLACE of every tuple
``boxqueue.forget_marks(writer, below_batch)``               how many marks were deleted
=============================================================  =====================================

``space`` is a queue space's id (``replace_many``: any space, by id or name), times are seconds
(``after``, ``upto``: a task's ``created``, microseconds), ``mark`` is ``{writer, batch,
partition, digest, chunk}``. ``put_many`` and ``replace_many`` write everything in one write, with
the mark; with a mark written already they write nothing and return nil. Every one of them is a
write as far as a replica set is concerned: a follower refuses it with ER_READONLY (7), which sends
a client to the leader, whose engine holds the claims.
"""

from __future__ import annotations

from typing import Any

import cython

from boxqueue.errcodes import ER, BoxError
from boxqueue.spaces.catalog import Catalog
from boxqueue.spaces.msgpack_values import Raw, array_header
from boxqueue.spaces.procedures import CallContext, Procedures
from boxqueue.spaces.sysviews import SystemView
from boxqueue.tubes.box_queue import _stored_pri
from boxqueue.tubes.engine import QueueEngine
from boxqueue.tubes.kinds import BOX_QUEUE
from boxqueue.tubes.numbers import tonumber
from boxqueue.tubes.transitions import MAX_TIME_US

US = 1_000_000
MAX_BATCH = 100_000  # tasks a claim, rows a put_many or replace_many
# Seconds below this are whole microseconds far from MAX_TIME_US (about 292,000 years): put_many's
# rows of such seconds need no clamping.
_WHOLE_SECONDS = cython.declare(cython.longlong, 1 << 32)


def _illegal(text: str) -> BoxError:
    return BoxError(ER.ILLEGAL_PARAMS, text)


def _count(value: Any, name: str, fn: str, maximum: int = MAX_BATCH) -> int:
    if type(value) is not int or not 0 <= value <= maximum:
        raise _illegal(f"{fn}: '{name}' must be an integer from 0 to {maximum}")
    return value


def _seconds(value: Any, name: str, fn: str) -> int:
    number = tonumber(value)
    if number is None or number < 0:
        raise _illegal(f"{fn}: '{name}' must be a number of seconds, at least 0")
    return min(int(number * US), MAX_TIME_US)


def _time(value: Any, name: str, fn: str, default: int) -> int:
    if value is None:
        return default
    if type(value) is not int or value < 0:
        raise _illegal(f"{fn}: '{name}' must be a time in microseconds since the epoch")
    return value


def _text(value: Any, name: str, fn: str) -> str:
    if not isinstance(value, str) or not value:
        raise _illegal(f"{fn}: '{name}' must be a non-empty string")
    return value


def _names(value: Any, name: str, fn: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _illegal(f"{fn}: '{name}' must be an array of claim ids")
    return value


def _mark(value: Any, fn: str) -> list[Any] | None:
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) != 5 or not isinstance(value[0], str) or not value[0]
            or not all(type(v) is int and 0 <= v < 2**64 for v in value[1:])):
        raise _illegal(f"{fn}: 'mark' must be {{writer, batch, partition, digest, chunk}}")
    return value


@cython.locals(row=list, number=cython.Py_ssize_t, delay=object, ttl=object, ttr=object, pri=object)
def _put_items(rows: list[Any], fn: str) -> list[tuple[int, int | None, int | None, int, list[Any]]]:
    """``put_many``'s rows ``{delay, ttl, ttr, pri, data...}`` checked, as the engine's puts
    ``(delay, ttl, ttr, pri, data)`` (microseconds, None for the default; box.queue's stored
    priority). Rows of whole seconds and a priority from -127 to 128 (a Spark job's, mostly zeros)
    are taken in C; any other goes through the general checks."""
    items = []
    for number in range(len(rows)):
        value = rows[number]
        if type(value) is not list or len(value) < 4:
            items.append(_put_item(value, f"{fn}: row {number}"))
            continue
        row = value
        delay, ttl, ttr, pri = row[0], row[1], row[2], row[3]
        if (type(delay) is int and type(ttl) is int and type(ttr) is int and type(pri) is int
                and 0 <= delay < _WHOLE_SECONDS and 0 <= ttl < _WHOLE_SECONDS and 0 <= ttr < _WHOLE_SECONDS
                and -127 <= pri <= 128):
            # (_stored_pri of such a pri: 255 - (pri + 127))
            items.append((delay * US, ttl * US if ttl else None, ttr * US if ttr else None, 128 - pri, row[4:]))
        else:
            items.append(_put_item(row, f"{fn}: row {number}"))
    return items


def _put_item(row: Any, where: str) -> tuple[int, int | None, int | None, int, list[Any]]:
    """One row of ``put_many`` checked as :func:`_put_items` checks it, by the general rules."""
    if not isinstance(row, list) or len(row) < 4:
        raise _illegal(f"{where}: a row is {{delay, ttl, ttr, pri, data...}}")
    delay, ttl, ttr = (_seconds(v or 0, what, where) for v, what in zip(row[:3], ("delay", "ttl", "ttr"), strict=True))
    pri = tonumber(row[3] or 0)
    if pri is None:
        raise _illegal(f"{where}: 'pri' must be a number")
    return delay, ttl or None, ttr or None, _stored_pri(pri), row[4:]


class StreamProcedures:
    """The procedures, bound to one engine and catalogue."""

    def __init__(self, engine: QueueEngine, catalog: Catalog) -> None:
        self.engine = engine
        self.catalog = catalog
        self.kind = engine.kind_named(BOX_QUEUE)  # a tube put_many creates is box.queue's

    def register(self, procedures: Procedures) -> None:
        for name in ("stream_claim", "stream_read", "stream_renew", "stream_ack", "put_many", "replace_many",
                     "forget_marks"):
            procedures.register("boxqueue." + name, getattr(self, name), writes=True)

    def _queue_space(self, value: Any) -> int:
        if type(value) is not int:
            raise BoxError(ER.NO_SUCH_SPACE, value)
        self.engine.queue_space(value)  # ER_NO_SUCH_SPACE unless a queue space
        return value

    # -- the source ----------------------------------------------------------------------------

    async def stream_claim(self, ctx: CallContext, space: Any = None, tube: Any = None, claim: Any = None,
                           limit: Any = None, ttl: Any = None, after: Any = None, upto: Any = None) -> list[Any]:
        fn = "boxqueue.stream_claim"
        space_id, name = self._queue_space(space), _text(tube, "tube", fn)
        created = (_time(after, "after", fn, 0), _time(upto, "upto", fn, MAX_TIME_US))
        count = await self.engine.claim_batch(
            space_id, name, _text(claim, "claim", fn), limit=_count(limit, "limit", fn),
            ttl=max(_seconds(ttl, "ttl", fn), 1), created=created)
        return [count]

    def stream_read(self, ctx: CallContext, space: Any = None, tube: Any = None, claim: Any = None,
                    after: Any = None, limit: Any = None) -> list[Any]:
        fn = "boxqueue.stream_read"
        space_id, name = self._queue_space(space), _text(tube, "tube", fn)
        tuples = self.engine.claim_tasks(space_id, name, _text(claim, "claim", fn), _time(after, "after", fn, 0),
                                         _count(limit, "limit", fn))
        existing = self.engine.existing_tube(space_id, name)
        kind = existing.kind.name if existing is not None else self.engine.queue_space(space_id).kind.name
        # The tuples as one array already msgpack (one piece, not one a tuple: a streamed task's
        # answer was copied four times).
        return [self.engine.queue_space(space_id).layout.data_at, kind, Raw(b"".join([array_header(len(tuples)), *tuples]))]

    async def stream_renew(self, ctx: CallContext, space: Any = None, tube: Any = None, claims: Any = None,
                           ttl: Any = None) -> list[Any]:
        fn = "boxqueue.stream_renew"
        space_id, name = self._queue_space(space), _text(tube, "tube", fn)
        live = await self.engine.renew_batch(space_id, name, _names(claims, "claims", fn),
                                             max(_seconds(ttl, "ttl", fn), 1))
        return [live]

    async def stream_ack(self, ctx: CallContext, space: Any = None, tube: Any = None,
                         claims: Any = None) -> list[Any]:
        fn = "boxqueue.stream_ack"
        space_id, name = self._queue_space(space), _text(tube, "tube", fn)
        return [await self.engine.ack_batch(space_id, name, _names(claims, "claims", fn))]

    # -- the sink ------------------------------------------------------------------------------

    async def put_many(self, ctx: CallContext, space: Any = None, tube: Any = None, rows: Any = None,
                       mark: Any = None) -> list[Any]:
        fn = "boxqueue.put_many"
        space_id, name = self._queue_space(space), _text(tube, "tube", fn)
        if not isinstance(rows, list) or len(rows) > MAX_BATCH:
            raise _illegal(f"{fn}: 'rows' must be an array of at most {MAX_BATCH} rows")
        written = await self.engine.put_marked(space_id, name, _put_items(rows, fn), _mark(mark, fn), kind=self.kind)
        return [written]

    async def replace_many(self, ctx: CallContext, space: Any = None, tuples: Any = None,
                           mark: Any = None) -> list[Any]:
        fn = "boxqueue.replace_many"
        if not isinstance(space, int | str):
            raise BoxError(ER.NO_SUCH_SPACE, space)
        target = self.catalog.lookup(space)
        if isinstance(target, SystemView):
            raise BoxError(ER.VIEW_IS_RO, target.name)
        self.catalog.writes.check_space_write(ctx.user, target, ctx.read_only)
        if not isinstance(tuples, list) or len(tuples) > MAX_BATCH or not all(type(t) is list for t in tuples):
            raise _illegal(f"{fn}: 'tuples' must be an array of at most {MAX_BATCH} tuples")
        return [await self.engine.replace_marked(target, tuples, _mark(mark, fn))]

    async def forget_marks(self, ctx: CallContext, writer: Any = None, below_batch: Any = None) -> list[Any]:
        fn = "boxqueue.forget_marks"
        if type(below_batch) is not int or below_batch < 0:
            raise _illegal(f"{fn}: 'below_batch' must be a batch id")
        return [await self.engine.forget_marks(_text(writer, "writer", fn), below_batch)]


def register(procedures: Procedures, engine: QueueEngine, catalog: Catalog) -> StreamProcedures:
    stream = StreamProcedures(engine, catalog)
    stream.register(procedures)
    return stream
