"""Several requests in flight on one connector connection.

The ``tarantool`` connector is synchronous: each call sends one request and waits for its answer,
so a write would cost a network round trip and a server commit per row. Here the connector still
builds every request, frames every answer and parses every error, but a sender writes requests as
fast as the window allows while a reader thread takes the answers off the socket, matched by their
sync numbers (see ``PipelinedConnection``). The window (``pipeline_depth``) bounds the requests in flight, which keeps
the server's per-connection limit and both sides' memory bounded; the reader always drains the
socket, so a full send buffer can never deadlock against a full receive buffer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import msgpack
from tarantool.const import IPROTO_REQUEST_TYPE as _IPROTO_REQUEST_TYPE
from tarantool.const import IPROTO_SYNC as _IPROTO_SYNC
from tarantool.const import REQUEST_TYPE_ERROR as _REQUEST_TYPE_ERROR
from tarantool.error import DatabaseError, SchemaReloadException
from tarantool.request import Request
from tarantool.response import Response

from boxqueue.pipeline.errors import BoxqueueSourceError

_FLUSH_BYTES = 64 * 1024


class PipelinedRequests:
    """Send requests without waiting for each answer; :meth:`finish` waits for all of them.

    ``describe(context, message, code)`` turns the first error answer into the exception raised
    (``context`` is what the caller gave with the request, e.g. the row number).
    """

    def __init__(self, conn: Any, depth: int, describe: Callable[[Any, str, int], Exception]) -> None:
        self._conn = conn
        self._describe = describe
        self._depth = depth
        self._state = threading.Condition()
        self._pending: dict[int, Any] = {}
        self._failure: Exception | None = None
        self._closing = False
        self._buffer = bytearray()
        self._buffered: list[tuple[int, Any]] = []
        self.sent = 0
        self.answered = 0
        self._reader = threading.Thread(target=self._read_answers, name="boxqueue-answers", daemon=True)
        self._reader.start()

    def send(self, request: Request, context: Any) -> None:
        """Queue one request; it goes out with the next flush (at 64 KiB or a quarter of the window)."""
        if self._failure is not None:
            raise self._failure
        data = bytes(request)  # assigns the sync
        self._buffer += data
        self._buffered.append((request.sync, context))
        if len(self._buffer) >= _FLUSH_BYTES or len(self._buffered) >= max(1, self._depth // 4):
            self.flush()

    def flush(self) -> None:
        """Send what is buffered, first waiting until the window has room for it."""
        if not self._buffered:
            return
        with self._state:
            while len(self._pending) + len(self._buffered) > self._depth and self._failure is None:
                if not self._reader.is_alive():
                    break
                self._state.wait(1.0)
            if self._failure is not None:
                raise self._failure
            for sync, context in self._buffered:
                self._pending[sync] = context
            self._state.notify_all()
        self._conn._sendall(bytes(self._buffer))
        self.sent += len(self._buffered)
        self._buffer.clear()
        self._buffered.clear()

    def finish(self) -> int:
        """Send the rest, wait for every answer, stop the reader; raise the first error answer."""
        try:
            self.flush()
            with self._state:
                while self._pending and self._failure is None and self._reader.is_alive():
                    self._state.wait(1.0)
        finally:
            with self._state:
                self._closing = True
                self._state.notify_all()
        if self._failure is not None:
            raise self._failure
        if self._pending:
            raise BoxqueueSourceError(f"the server stopped answering with {len(self._pending)} requests unanswered")
        self._reader.join(5.0)
        return self.answered

    def _read_answers(self) -> None:
        while True:
            with self._state:
                while not self._pending and not self._closing:
                    self._state.wait()
                if not self._pending:
                    return
            try:
                sync, _code, answer = self._read_answer()
            except SchemaReloadException:
                self._fail(BoxqueueSourceError("the schema changed on the server during the write; run it again"))
                return
            except DatabaseError as exc:
                self._fail(BoxqueueSourceError(f"lost the connection to the server: {exc}"))
                return
            with self._state:
                context = self._pending.pop(sync, None)
                self.answered += 1
                if answer is not None and self._failure is None:
                    self._failure = self._describe(context, answer.return_message, answer.return_code)
                self._state.notify_all()

    def _read_answer(self) -> tuple[int, int, Response | None]:
        """Sync and code of the next answer; the connector's full Response only for an error.

        A successful REPLACE or put answers with the whole tuple; decoding it (uuid, decimal and
        datetime values become Python objects) cost more than everything else, measured at a
        quarter of the throughput of these writes, and nothing here needs it.
        """
        data = self._conn._read_response()
        header = msgpack.Unpacker(raw=False, strict_map_key=False)
        header.feed(data)
        fields = header.unpack()
        code = fields.get(_IPROTO_REQUEST_TYPE, 0)
        if code < _REQUEST_TYPE_ERROR:
            return fields.get(_IPROTO_SYNC, 0), code, None
        return fields.get(_IPROTO_SYNC, 0), code, Response(self._conn, data)

    def _fail(self, failure: Exception) -> None:
        with self._state:
            if self._failure is None:
                self._failure = failure
            self._state.notify_all()
