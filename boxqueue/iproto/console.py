"""The admin console listener: Tarantool's text Lua console over TCP.

Each connection gets the 128-byte console greeting, a session (its own id, disconnect callbacks
that release its queue takes) and runs its statements one after the other, as Tarantool's
console fiber does. The Lua itself is not run here: ``run_statement`` (the embedded Lua engine,
wired by ``boxqueue/process.py``) is called with the session's context and the statement.

Login: while users are configured, nothing runs before ``\\login <user> <password>`` succeeds
(or ``require('console').login('<user>', '<password>')``, since Tarantool's own console client
refuses to send backslash commands it does not know). Tarantool's text console has no login of
its own, and ``tarantoolctl connect user:pass@...`` does not send the credentials over it; only the console's framing commands (``\\set output``,
``\\set delimiter`` and the ``require('console').delimiter(...)`` statement ``tarantoolctl``
sends) are accepted before. Without users the console runs as ``admin``.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from boxqueue.errcodes import BoxError
from boxqueue.iproto import console_codec as cc
from boxqueue.iproto.greeting import console_greeting
from boxqueue.iproto.listening import serve_tcp
from boxqueue.iproto.session import Session
from boxqueue.measures import RequestMeter
from boxqueue.spaces import access as acl
from boxqueue.spaces.catalog import Catalog
from boxqueue.spaces.procedures import CallContext

log = logging.getLogger(__name__)

# (context, statement, set_delimiter) -> an answer with .ok, .values and .error
RunStatement = Callable[[CallContext, str, Callable[[str], None]], Awaitable[Any]]

HELP = (
    "boxqueue admin console: type Lua statements or expressions; answers are YAML. "
    "Commands: \\set delimiter <d>, \\set output yaml, \\login <user> <password>, \\quit"
)


class ConsoleServer:
    """Serves the console protocol; connections live in the caller's nursery."""

    def __init__(self, catalog: Catalog, run_statement: RunStatement, *, require_login: bool,
                 max_statement_bytes: int = 16 * 1024 * 1024, ssl_context: ssl.SSLContext | None = None,
                 max_connections: int | None = None, meter: RequestMeter | None = None) -> None:
        self.catalog = catalog
        self.run_statement = run_statement
        self.require_login = require_login
        self.max_statement_bytes = max_statement_bytes
        self.ssl_context = ssl_context
        self.max_connections = max_connections
        self.meter = meter  # counts the connections (the statements are counted by run_statement)

    async def listen(self, host: str, port: int, connection_nursery: trio.Nursery, *,
                     task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        await serve_tcp(host, port, self._serve, connection_nursery, name="admin console",
                        ssl_context=self.ssl_context, max_connections=self.max_connections,
                        task_status=task_status)

    async def _serve(self, stream: trio.abc.Stream, peer_text: str) -> None:
        access = self.catalog.access
        user = access.guest if self.require_login else access.by_id[acl.ADMIN_ID]
        session = Session(await self.catalog.next_session_id(), user, peer_text)
        connection = _ConsoleConnection(self, stream, session)
        if self.meter is not None:
            self.meter.opened()
        try:
            await connection.serve()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except cc.StatementTooLong as exc:
            log.warning("console %s: %s, closing", peer_text, exc)
        finally:
            if self.meter is not None:
                self.meter.closed()
            with trio.CancelScope(shield=True):
                await session.close()
                await stream.aclose()


class _ConsoleConnection:
    def __init__(self, server: ConsoleServer, stream: trio.abc.Stream, session: Session) -> None:
        self.server = server
        self.stream = stream
        self.session = session
        self.decoder = cc.ConsoleDecoder(server.max_statement_bytes)
        self.logged_in = not server.require_login
        self.running = True

    def set_delimiter(self, delimiter: str) -> None:
        self.decoder.delimiter = delimiter

    async def serve(self) -> None:
        await self.stream.send_all(console_greeting())
        while self.running:
            event = self.decoder.next_event()
            if event is None:
                data = await self.stream.receive_some(65536)
                if not data:
                    return
                self.decoder.feed(data)
                continue
            if isinstance(event, cc.Close):
                return
            if isinstance(event, cc.Command):
                answer = self._command(event.words)
            else:
                answer = await self._statement(event.text)
            if answer:
                await self.stream.send_all(answer)

    async def _statement(self, text: str) -> bytes:
        login = cc.LOGIN_STATEMENT.match(text)
        if login is not None:
            return self._login((login.group(3), login.group(5) or ""))
        if not self.logged_in:
            match = cc.DELIMITER_STATEMENT.match(text)
            if match is not None:
                self.set_delimiter(match.group(3))
                return cc.values_document([])
            return cc.error_document(
                "Authentication required: \\login <user> <password> "
                "or require('console').login('<user>', '<password>') first"
            )
        outcome = await self.server.run_statement(self.session.context, text, self.set_delimiter)
        if outcome.ok:
            return cc.values_document(outcome.values)
        return cc.error_document(getattr(outcome.error, "console_value", outcome.error.message))

    def _command(self, words: tuple[str, ...]) -> bytes:
        if not words or words[0] in ("help", "h"):
            return cc.values_document([HELP])
        verb = words[0]
        if verb in ("quit", "q"):
            self.running = False
            return b""
        if verb in ("set", "s"):
            return self._set(words[1:])
        if verb == "login":
            return self._login(words[1:])
        return cc.error_document(f"Invalid command \\{' '.join(words)}. Type \\help for help.")

    def _set(self, args: tuple[str, ...]) -> bytes:
        if not args:
            return cc.error_document("Invalid set syntax, type \\help for help")
        param, value = args[0], (args[1] if len(args) > 1 else None)
        if param in ("delimiter", "delim", "d"):
            self.set_delimiter(value or "")
            return cc.values_document([])
        if param in ("output", "o"):
            if value is None or value.split(",")[0] != "yaml":
                return cc.error_document("boxqueue's console prints YAML only (\\set output yaml)")
            return cc.values_document([True])
        if param in ("language", "lang", "l"):
            if value is None:
                return cc.values_document([{"language": "lua"}])
            if value != "lua":
                return cc.error_document(f'Invalid language "{value}", boxqueue supports lua only.')
            return cc.values_document([True])
        return cc.error_document(f"Unknown parameter: {param}")

    def _login(self, args: tuple[str, ...]) -> bytes:
        if len(args) not in (1, 2):
            return cc.error_document("Usage: \\login <user> <password>")
        name, password = args[0], (args[1] if len(args) > 1 else "")
        access = self.server.catalog.access
        salt = os.urandom(20)
        try:
            user = access.authenticate(name, salt, "chap-sha1", acl.chap_sha1_scramble(password, salt))
        except BoxError as exc:
            return cc.error_document(exc.message)
        self.session.set_user(user)
        self.logged_in = True
        return cc.values_document([True])
