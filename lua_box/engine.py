"""The embedded Lua (LuaJIT 2.1 through lupa) and the driver that runs jobs on it.

One runtime serves the whole server, like Tarantool's one Lua state: globals and functions
defined from the console or EVAL are visible to every later chunk and to CALL.

A job (a console statement, an EVAL chunk, a CALL of a Lua function) is a Lua coroutine. The
driver resumes it in the Lua thread (one thread, as the runtime is one Lua state; lupa releases
the GIL while Lua runs, so the event loop keeps serving other connections even while a chunk
computes). Whenever the chunk calls into ``box``, the coroutine yields the request; the driver
runs it on the event loop, awaiting it if it waits (a commit, a queue take), and resumes the
coroutine with the answer. So nothing blocks the loop, and Python objects (LMDB read
transactions above all) are only touched on the loop. The Lua thread lives inside
:meth:`LuaEngine.run`, a task of the server's root nursery; steps reach it through a queue and
their results come back through the trio token.

Limits: a job may run Lua for ``time_limit_s`` seconds in all (time spent waiting for ``box``
operations does not count), checked by a count hook every 10,000 VM instructions; the JIT is
off because count hooks do not fire inside compiled traces. The whole runtime may allocate
``memory_limit_bytes`` (lupa's allocator limit); a job that hits it fails, and garbage is
collected with the limit lifted for a moment so the next job has room again. User code cannot
catch either error (``pcall`` passes them on).
"""

from __future__ import annotations

import inspect
import itertools
import logging
import queue
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from importlib import resources
from typing import Any

import outcome
import trio
from lupa import luajit21

from errcodes import ER, BoxError
from lua_box.operations import Job, Operations
from lua_box.persisted_functions import PersistedFunctions
from lua_box.persisted_users import PersistedUsers
from lua_box.usage import LuaUsage
from lua_box.values import LuaValues
from spaces.catalog import Catalog
from spaces.procedures import CallContext, ProcedureEntry, Procedures, make_entry
from spaces.space import StorageError

log = logging.getLogger(__name__)

SWITCH_INTERVAL_S = 0.0005


@dataclass(frozen=True)
class LuaLimits:
    time_limit_s: float = 5.0
    memory_limit_bytes: int = 256 * 1024 * 1024


@dataclass
class Outcome:
    """A finished job: its return values, or the error it raised."""

    ok: bool
    values: list[Any]
    error: BoxError | None = None


class LuaEngine:
    """The runtime, the ``box`` bindings and the job driver."""

    def __init__(self, catalog: Catalog, procedures: Procedures, limits: LuaLimits,
                 cfg: dict[str, Any] | None = None, stats: Any = None) -> None:
        self.limits = limits
        self._catalog = catalog
        self.procedures = procedures
        self.functions = PersistedFunctions(catalog.storage, catalog.committer)
        self.users = PersistedUsers(catalog.storage, catalog.committer)
        self.users.load_into(catalog.access)  # at start, before anyone can log in
        self.operations = Operations(catalog, procedures, stats, self.functions, self.users)
        self._lua = luajit21.LuaRuntime(
            encoding=None,
            unpack_returned_tuples=True,
            register_eval=False,
            register_builtins=False,
            max_memory=limits.memory_limit_bytes,
        )
        printed = logging.getLogger("lua_box.print")
        values_for_init = {
            b"clock": time.monotonic,
            b"log": lambda text: printed.info("%s", text.decode("utf-8", "replace")),
            b"limit_message": f"Lua time limit exceeded ({limits.time_limit_s:g} s)".encode(),
            b"memory_message": f"Lua memory limit exceeded ({limits.memory_limit_bytes} bytes)".encode(),
        }
        prelude = resources.files("lua_box").joinpath("box.lua").read_bytes()
        init = self._lua.table_from(values_for_init)
        self._internal = self._lua.execute(prelude, init)
        self.values = LuaValues(self._lua, self._internal)
        init[b"cfg"] = self.values.to_lua(cfg or {})  # read lazily by box.cfg
        self._start = self._internal[b"start"]
        self._resume = self._internal[b"resume"]
        self._forget = self._internal[b"forget"]
        self._compile = self._internal[b"compile"]
        self._global_function = self._internal[b"global_function"]
        self._user_functions = self._internal[b"user_functions"]
        self._collect = self._internal[b"collect"]
        self._ids = itertools.count(1)
        self.usage = LuaUsage()
        self._limit_text = f"Lua time limit exceeded ({limits.time_limit_s:g} s)"
        self._steps: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._token: trio.lowlevel.TrioToken | None = None
        self._lua_procedures: set[str] = set()
        self._lua_tables: frozenset[str] = frozenset()
        procedures.add_resolver(self._resolve_in_table)
        self._define_persisted()

    def _define_persisted(self) -> None:
        """The functions of box.schema.func.create, defined again (at start, before any job)."""
        define = self._internal[b"define"]
        for name, body in self.functions.load().items():
            if body is None:
                continue
            ok, why = define(name.encode(), body.encode())
            if not ok:
                log.warning("persisted Lua function %s is not defined: %s", name, self.values.from_lua(why, False))
        self._sync_functions(self._function_names())

    # -- entry points ------------------------------------------------------------------------

    async def eval(self, ctx: CallContext, code: str, args: list[Any]) -> list[Any]:
        """IPROTO_EVAL: the chunk's return values; its error as a BoxError."""

        def prepare() -> tuple[Any, list[Any]] | BoxError:
            fn, err = self._compile(code.encode(), b"=eval")
            if fn is None:
                return BoxError(ER.PROC_LUA, message=self.values.from_lua(err, False))
            return fn, list(args)

        outcome = await self._run(Job(ctx), prepare, tuples_as_raw=False)
        if outcome.error is not None:
            raise outcome.error
        return outcome.values

    async def console(self, ctx: CallContext, line: str,
                      set_delimiter: Callable[[str], None] | None = None) -> Outcome:
        """A console statement: tried as ``return <line>`` first, as Tarantool's console does."""

        def prepare() -> tuple[Any, list[Any]] | BoxError:
            code = line.encode("utf-8", "surrogateescape")
            fn, err = self._compile(b"return " + code, b"return " + code)  # Tarantool's chunk names
            if fn is None:
                fn, err = self._compile(code, code)
            if fn is None:
                error = BoxError(ER.PROC_LUA, message=self.values.from_lua(err, False))
                error.console_value = error.message  # type: ignore[attr-defined]
                return error
            return fn, []

        return await self._run(Job(ctx, set_delimiter), prepare, tuples_as_raw=True)

    async def call_function(self, ctx: CallContext, name: str, args: tuple[Any, ...]) -> list[Any]:
        """CALL of a global Lua function defined from the console or EVAL."""

        def prepare() -> tuple[Any, list[Any]] | BoxError:
            fn, obj = self._global_function(name.encode())
            if fn is None:
                return BoxError(ER.NO_SUCH_PROC, name)
            return fn, [obj, *args] if obj is not None else list(args)

        outcome = await self._run(Job(ctx), prepare, tuples_as_raw=False)
        if outcome.error is not None:
            raise outcome.error
        return outcome.values

    # -- the Lua thread ----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the Lua thread until cancelled (owned by the caller's nursery)."""
        self._token = trio.lowlevel.current_trio_token()
        # The Lua thread and the event loop hand the GIL to each other at every step; with the
        # default 5 ms switch interval a busy loop would keep the Lua thread waiting that long.
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(trio.to_thread.run_sync, self._thread_main))
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._steps.put(None)  # the thread ends after the steps queued before this

    def _thread_main(self) -> None:
        """Run queued steps one after the other; each result goes back to the event loop."""
        while (step := self._steps.get()) is not None:
            step()

    async def _in_lua_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the Lua thread, without blocking the event loop meanwhile."""
        token = self._token
        if token is None:
            raise BoxError(ER.PROC_LUA, message="the Lua engine is not running")
        finished = trio.Event()
        results: list[outcome.Outcome] = []

        def deliver(result: outcome.Outcome) -> None:
            results.append(result)
            finished.set()

        def step() -> None:
            token.run_sync_soon(deliver, outcome.capture(fn, *args))

        self._steps.put(step)
        await finished.wait()
        return results[0].unwrap()

    # -- the driver --------------------------------------------------------------------------

    async def _run(self, job: Job, prepare: Callable[[], Any], *, tuples_as_raw: bool) -> Outcome:
        job_id = next(self._ids)
        spent = 0.0
        step: tuple[str, Any] = ("start", prepare)
        finished = False
        try:
            while True:
                budget = max(self.limits.time_limit_s - spent, 0.0)
                out, elapsed = await self._in_lua_thread(
                    self._slice, job_id, budget, step, tuples_as_raw, self._catalog.schema_version
                )
                spent += elapsed
                if out[0] == "done":
                    finished = True
                    result: Outcome = out[1]
                    self.usage.record(spent, None if result.ok else result.error, self._limit_text,
                                      self._memory_message())
                    self._sync_functions(out[2])
                    return result
                _, name, args = out
                step = await self._operate(job, name, args)
        finally:
            if not finished:
                with trio.CancelScope(shield=True):
                    await self._in_lua_thread(self._forget, job_id)

    async def _operate(self, job: Job, name: str, args: list[Any]) -> tuple[str, Any]:
        try:
            result = self.operations.get(name)(job, *args)
            if inspect.isawaitable(result):
                result = await result
            return ("ok", list(result) if result is not None else [])
        except BoxError as exc:
            return ("error", exc)
        except StorageError as exc:
            log.error("storage failure in a box operation from Lua: %s", exc)
            return ("error", BoxError(ER.WAL_IO))
        except Exception as exc:  # a bug on our side: the chunk sees an error, the server goes on
            log.exception("box operation %s failed", name)
            return ("error", BoxError(ER.PROC_LUA, message=f"{type(exc).__name__}: {exc}"))

    def _slice(self, job_id: int, budget: float, step: tuple[str, Any], tuples_as_raw: bool,
               version: int) -> tuple[Any, float]:
        """Run the job until it asks for an operation or ends (in the Lua thread); also returns
        how long that took, which counts against the job's time limit."""
        began = time.monotonic()
        out = self._slice_untimed(job_id, budget, step, tuples_as_raw, version)
        return out, time.monotonic() - began

    def _slice_untimed(self, job_id: int, budget: float, step: tuple[str, Any], tuples_as_raw: bool,
                       version: int) -> tuple[Any, ...]:
        values = self.values
        try:
            kind, payload = step
            if kind == "start":
                prepared = payload()
                if isinstance(prepared, BoxError):
                    return ("done", Outcome(False, [], prepared), None)
                fn, args = prepared
                out = self._start(job_id, budget, version, fn, values.results(args))
            elif kind == "ok":
                out = self._resume(job_id, budget, version, True, values.results(payload))
            else:
                error = payload
                lua_error = self._internal[b"new_error"](error.code, error.message.encode(),
                                                         error.error_type.encode())
                out = self._resume(job_id, budget, version, False, lua_error)
            if out[0] == b"op":
                name = values.from_lua(out[1], False)
                args = values.from_results(out[2], False)
                return ("op", name, args)
            ok, result = out[1], out[2]
            if ok:
                outcome = Outcome(True, values.from_results(result, tuples_as_raw))
            else:
                outcome = Outcome(False, [], values.error(result))
                if outcome.error is not None and outcome.error.message == self._memory_message():
                    self._collect_garbage()
            return ("done", outcome, self._function_names())
        except (luajit21.LuaMemoryError, MemoryError):
            self._collect_garbage(job_id)
            error = BoxError(ER.PROC_LUA, message=self._memory_message())
            error.console_value = error.message  # type: ignore[attr-defined]
            return ("done", Outcome(False, [], error), None)
        except BoxError as exc:
            self._forget(job_id)
            exc.console_value = exc.message  # type: ignore[attr-defined]
            return ("done", Outcome(False, [], exc), None)
        except Exception as exc:  # a bug on our side: this job fails, the engine goes on
            log.exception("Lua job %d failed in the driver", job_id)
            self._forget(job_id)
            error = BoxError(ER.PROC_LUA, message=f"internal error: {type(exc).__name__}")
            error.console_value = error.message  # type: ignore[attr-defined]
            return ("done", Outcome(False, [], error), None)

    def memory_used(self) -> int:
        """Bytes the Lua runtime has allocated (for the metrics; read from any thread)."""
        return self._lua.get_memory_used()

    def _memory_message(self) -> str:
        return f"Lua memory limit exceeded ({self.limits.memory_limit_bytes} bytes)"

    def _collect_garbage(self, job_id: int | None = None) -> None:
        self._lua.set_max_memory(0)
        try:
            if job_id is not None:
                self._forget(job_id)
            self._collect()
        finally:
            self._lua.set_max_memory(self.limits.memory_limit_bytes)

    def _function_names(self) -> tuple[list[str], list[str]]:
        functions, tables = self._user_functions()
        return (
            [functions[i].decode() for i in range(1, len(functions) + 1)],
            [tables[i].decode() for i in range(1, len(tables) + 1)],
        )

    # -- Lua functions as procedures ---------------------------------------------------------

    def _sync_functions(self, names: tuple[list[str], list[str]] | None) -> None:
        """Make the global Lua functions callable over CALL (on the event loop)."""
        if names is None:
            return
        functions, tables = names
        self._lua_tables = frozenset(tables)
        current = set(functions)
        for name in self._lua_procedures - current:
            self.procedures.unregister(name)
        ours = set()
        for name in current:
            if name in self._lua_procedures:
                ours.add(name)
            elif self.procedures.resolve(name) is None:  # never shadow a built-in procedure
                # Not a "writes" procedure: the box operations it makes check the port themselves.
                self.procedures.register(name, self._procedure(name))
                ours.add(name)
        self._lua_procedures = ours

    def _resolve_in_table(self, name: str) -> ProcedureEntry | None:
        """``app.handler`` and ``app:method`` where ``app`` is a global table user code made."""
        head = name.split(".", 1)[0].split(":", 1)[0]
        if head == name or head not in self._lua_tables:
            return None
        return make_entry(name, self._procedure(name))

    def _procedure(self, name: str) -> Callable[..., Awaitable[list[Any]]]:
        async def call(ctx: CallContext, *args: Any) -> list[Any]:
            return await self.call_function(ctx, name, args)

        return call
