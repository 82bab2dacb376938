"""The embedded Lua (LuaJIT 2.1 through lupa) and the driver that runs jobs on it.

One runtime serves the whole server, like Tarantool's one Lua state: globals and functions
defined from the console or EVAL are visible to every later chunk and to CALL.

A job (a console statement, an EVAL chunk, a CALL of a Lua function) is a Lua coroutine. Whenever
it calls into ``box`` it yields the request; the driver runs it on the event loop, awaiting it if
it waits (a commit, a queue take), and resumes the coroutine with the answer. Python objects
(LMDB read transactions above all) are only touched on the loop.

Where the Lua runs:

* **On the event loop first.** A job starts right in the request's handler, and an EVAL or CALL
  that finishes without waiting is answered at once, with no task and no thread. A count hook
  that yields (LuaJIT's own ``lua_yield`` as the hook, see box.lua) hands control back every
  ``HOOK_INTERVAL`` VM instructions, so the driver can check the job's time limit and how long it
  has held the loop: after ``LOOP_SLICE_S`` of Lua it goes on in the Lua thread.
* **In the Lua thread** for what would hold the loop: long computations, and C functions that call
  back into Lua (a ``table.sort`` comparator...), which cannot yield. The thread lives inside
  :meth:`LuaEngine.run`, a task of the server's root nursery; lupa releases the GIL while Lua
  runs there, so the loop serves everyone meanwhile. Jobs in the thread take turns: one that ran
  ``THREAD_SLICE_S`` gives way when others wait.

One Lua state cannot be used by two threads at once: ``_lock`` guards it. The loop only ever
tries it (a job starts in the thread when the thread holds it); the thread waits for it.

Limits: a job may run Lua for ``time_limit_s`` seconds in all (time spent waiting for ``box``
operations does not count); the JIT is off because count hooks do not fire inside compiled
traces. The whole runtime may allocate ``memory_limit_bytes`` (lupa's allocator limit); a job that
hits it fails, and garbage is collected with the limit lifted for a moment so the next job has
room again. User code cannot catch either error (``pcall`` passes them on).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import queue
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from importlib import resources
from typing import Any

import trio
from lupa import luajit21

from boxqueue.errcodes import ER, FORMATS, BoxError
from boxqueue.lua_box.chunk_cache import ChunkCache
from boxqueue.lua_box.count_hook import CountHook
from boxqueue.lua_box.global_functions import GlobalFunctions
from boxqueue.lua_box.operations import Job, Operations
from boxqueue.lua_box.persisted_functions import PersistedFunctions
from boxqueue.lua_box.persisted_users import PersistedUsers
from boxqueue.lua_box.usage import LuaUsage
from boxqueue.lua_box.values import (
    ANSWER_TUPLE,
    ANSWER_TUPLES,
    MAX_DEPTH,
    MAX_RESULT_VALUES,
    LuaValues,
)
from boxqueue.spaces.catalog import Catalog
from boxqueue.spaces.procedures import CallContext, Procedures
from boxqueue.spaces.space import StorageError

log = logging.getLogger(__name__)

SWITCH_INTERVAL_S = 0.0005
HOOK_INTERVAL = 10_000  # VM instructions between two looks at a job's time (20-60 us of Lua)
LOOP_SLICE_S = 0.001  # Lua a job may run on the event loop before it moves to the Lua thread
THREAD_SLICE_S = 0.005  # Lua a job runs in the thread before it lets waiting jobs in
IDLE_WORKERS = 16  # job coroutines kept for reuse

_now = time.monotonic


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


_NO_ANSWER: tuple[bool, list[Any]] = (True, [])


class _Run:
    """A job on its way: its coroutine and where the driver stands with it."""

    co: Any = None
    spent = 0.0  # Lua run time so far
    answer: tuple[bool, Any] | None = None  # what to resume the coroutine with
    pending: Awaitable[Any] | None = None  # an operation being awaited
    operation: tuple[bytes, list[Any]] | None = None  # one to run on the loop
    to_thread = False
    outcome: Outcome | None = None
    names: tuple[list[str], list[str], list[str]] | None = None  # user globals, when they changed
    cancelled = False

    def __init__(self, ctx: CallContext, set_delimiter: Callable[[str], None] | None, raw: bool,
                 prepare: Callable[[Any, Any], Any], a: Any, b: Any) -> None:
        self.ctx = ctx
        self.set_delimiter = set_delimiter
        self.raw = raw  # tuples come back as Raw (the console prints them in flow style)
        self.prepare = prepare  # prepare(a, b): the function and its arguments, or a BoxError
        self.a = a
        self.b = b
        self._job: Job | None = None

    @property
    def job(self) -> Job:
        if self._job is None:
            self._job = Job(self.ctx, self.set_delimiter)
        return self._job


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
        self._operations = {name.encode(): fn for name, fn in self.operations.by_name().items()}
        self._lua = luajit21.LuaRuntime(
            encoding=None,
            unpack_returned_tuples=True,
            register_eval=False,
            register_builtins=False,
            max_memory=limits.memory_limit_bytes,
        )
        printed = logging.getLogger("boxqueue.lua_box.print")
        self._limit_message = f"Lua time limit exceeded ({limits.time_limit_s:g} s)"
        self.usage = LuaUsage()  # jobs, their Lua time and limit hits, for the metrics
        self.quick_jobs = 0  # jobs that finished in their first stretch on the loop (see usage)
        self._memory_message = f"Lua memory limit exceeded ({limits.memory_limit_bytes} bytes)"
        values_for_init = {
            b"clock": time.monotonic,
            b"log": lambda text: printed.info("%s", text.decode("utf-8", "replace")),
            b"limit_message": self._limit_message.encode(),
            b"memory_message": self._memory_message.encode(),
            b"lupa_library": luajit21.__file__.encode(),
            b"hook_interval": HOOK_INTERVAL,
            b"max_values": MAX_RESULT_VALUES,
            b"max_depth": MAX_DEPTH,
            b"no_such_proc_code": int(ER.NO_SUCH_PROC),
            b"no_such_proc_format": FORMATS[ER.NO_SUCH_PROC].encode(),
            b"answer_tuple": ANSWER_TUPLE,
            b"answer_tuples": ANSWER_TUPLES,
        }
        prelude = resources.files("boxqueue.lua_box").joinpath("box.lua").read_bytes()
        init = self._lua.table_from(values_for_init)
        self._internal = self._lua.execute(prelude, init)
        self.values = LuaValues(self._lua, self._internal)
        init[b"cfg"] = self.values.to_lua(cfg or {})  # read lazily by box.cfg
        self._hook = CountHook(int(self._internal[b"state_address"]), HOOK_INTERVAL)
        self._state = self._internal[b"state"]
        self._worker = self._internal[b"worker"]
        self._idle: list[Any] = []  # worker coroutines waiting for a job (see worker in box.lua)
        self._started: Any = None  # the worker _start resumed last
        self._call_global = self._internal[b"call_global"]
        self._sandbox = self._internal[b"G"]
        self._user_functions = self._internal[b"user_functions"]
        lua_globals = self._lua.globals()  # C functions: they run no VM instruction (see box.lua)
        self._loadstring = lua_globals[b"loadstring"]
        self._setfenv = lua_globals[b"setfenv"]
        self._collectgarbage = lua_globals[b"collectgarbage"]
        self.eval_chunks = ChunkCache()
        self.statement_chunks = ChunkCache()
        self._lock = threading.Lock()  # who may use the Lua state (see the module's docstring)
        self._schema_version: int | None = None  # as box.lua last saw it
        self._globals_seen = 0
        self._steps: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._token: trio.lowlevel.TrioToken | None = None
        self.global_functions = GlobalFunctions(procedures, self.call_function)
        self._define_persisted()
        self._hook.yielding()  # from now on, for good (see box.lua, Count hooks)

    def _define_persisted(self) -> None:
        """The functions of box.schema.func.create, defined again (at start, before any job)."""
        self.global_functions.sync(*self._define_stored())

    def _define_stored(self) -> tuple[list[str], list[str], list[str]]:
        """Define every stored function with a body; the user's globals afterwards. Uses the Lua
        state: at start, or holding ``_lock``."""
        define = self._internal[b"define"]
        for name, body in self.functions.load().items():
            if body is None:
                continue
            ok, why = define(name.encode(), body.encode())
            if not ok:
                log.warning("persisted Lua function %s is not defined: %s", name, self.values.from_lua(why, False))
        return self._user_globals()

    async def define_persisted_again(self) -> None:
        """A follower applied records that changed the stored functions: define them again, in
        the Lua thread (between jobs), so that CALL finds them as on the leader."""
        token = self._token
        if token is None:
            return
        done = trio.Event()
        found: list[tuple[list[str], list[str], list[str]]] = []

        def step() -> None:
            with self._lock:
                found.append(self._define_stored())
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)

        self._steps.put(step)
        await done.wait()
        self.global_functions.sync(*found[0])

    # -- entry points ------------------------------------------------------------------------

    def eval(self, ctx: CallContext, code: str, args: list[Any]) -> list[Any] | Coroutine[Any, Any, list[Any]]:
        """IPROTO_EVAL: the chunk's return values at once when it finished on the event loop,
        else a coroutine that produces them; its error raised as a BoxError either way."""
        result = self._submit(ctx, None, self._prepare_eval, code, args, False)
        return result if isinstance(result, list) else self._values(result)

    async def console(self, ctx: CallContext, line: str,
                      set_delimiter: Callable[[str], None] | None = None) -> Outcome:
        """A console statement: tried as ``return <line>`` first, as Tarantool's console does."""
        result = self._submit(ctx, set_delimiter, self._prepare_statement, line, None, True)
        if isinstance(result, list):
            return Outcome(True, result)
        if isinstance(result, Outcome):
            return result
        return await result

    def call_function(self, ctx: CallContext, name: str, args: tuple[Any, ...]) -> list[Any] | Coroutine[Any, Any, list[Any]]:
        """CALL of a global Lua function defined from the console or EVAL (as :meth:`eval`)."""
        result = self._submit(ctx, None, self._prepare_call, name, args, False)
        return result if isinstance(result, list) else self._values(result)

    def _values(self, result: Outcome | Coroutine[Any, Any, Outcome]) -> list[Any] | Coroutine[Any, Any, list[Any]]:
        """A job's values (its error raised), or a coroutine that gives them once it finishes."""
        if type(result) is Outcome:
            if result.error is not None:
                raise result.error
            return result.values
        return self._values_of(result)  # type: ignore[arg-type]

    @staticmethod
    async def _values_of(running: Awaitable[Outcome]) -> list[Any]:
        outcome = await running
        if outcome.error is not None:
            raise outcome.error
        return outcome.values

    # -- what a job runs (called with the Lua state held) -------------------------------------

    def _compile(self, code: bytes, chunkname: bytes) -> tuple[Any, Any]:
        """A chunk compiled in the sandbox; None and the message when it does not compile."""
        if code[:1] == b"\x1b":
            return None, b"bytecode is not accepted"  # crafted bytecode can crash the VM
        compiled = self._loadstring(code, chunkname)
        if type(compiled) is tuple:  # nil, message
            return compiled
        return self._setfenv(compiled, self._sandbox), None

    def _prepare_eval(self, code: str, args: list[Any]) -> tuple[Any, list[Any]] | BoxError:
        fn = self.eval_chunks.get(code)
        if fn is None:
            fn, err = self._compile(code.encode(), b"=eval")
            if fn is None:
                return BoxError(ER.PROC_LUA, message=self.values.from_lua(err, False))
            self.eval_chunks.put(code, fn)
        else:
            self.eval_chunks.used(code)
        return fn, self.values.args(args)

    def _prepare_statement(self, line: str, _: Any) -> tuple[Any, list[Any]] | BoxError:
        fn = self.statement_chunks.get(line)
        if fn is None:
            code = line.encode("utf-8", "surrogateescape")
            fn, err = self._compile(b"return " + code, b"return " + code)  # Tarantool's chunk names
            if fn is None:
                fn, err = self._compile(code, code)
            if fn is None:
                error = BoxError(ER.PROC_LUA, message=self.values.from_lua(err, False))
                error.console_value = error.message  # type: ignore[attr-defined]
                return error
            self.statement_chunks.put(line, fn)
        else:
            self.statement_chunks.used(line)
        return fn, []

    def _prepare_call(self, name: str, args: tuple[Any, ...]) -> tuple[Any, list[Any]]:
        return self._call_global, [name.encode(), *self.values.args(args)]

    # -- the driver ----------------------------------------------------------------------------

    def _submit(self, ctx: CallContext, set_delimiter: Callable[[str], None] | None,
                prepare: Callable[[Any, Any], Any], a: Any, b: Any,
                raw: bool) -> list[Any] | Outcome | Coroutine[Any, Any, Outcome]:
        """Run the job on the event loop as far as it goes: its values (or its Outcome, when it
        failed) if it finished there, else a coroutine that finishes it."""
        if not self._lock.acquire(False):
            return self._finish(_Run(ctx, set_delimiter, raw, prepare, a, b))
        run = None
        try:
            began = _now()
            out = self._start(prepare(a, b))
            if out is not None and out[0] == b"done" and out[2] is True and out[1] == self._globals_seen and not raw:
                if len(self._idle) < IDLE_WORKERS:
                    self._idle.append(self._started)
                self.quick_jobs += 1  # not timed: a clock read would cost ~4% of an EVAL
                return self.values.from_results(out, 3, raw)  # the common case
            run = _Run(ctx, set_delimiter, raw, prepare, a, b)
            run.co = self._started
            run.spent = _now() - began
            self._took(run, out, True)
            if run.outcome is None:
                self._on_loop(run, began)
        except Exception as exc:
            if run is None:
                run = _Run(ctx, set_delimiter, raw, prepare, a, b)
            self._crashed(run, exc)
        finally:
            self._started = None
            self._lock.release()
        if run.outcome is None:
            return self._finish(run)
        self._used(run)
        if run.names is not None:
            self.global_functions.sync(*run.names)
        return run.outcome

    def _used(self, run: _Run) -> None:
        """Count a finished job (its Lua time, whether a limit stopped it) in ``usage``."""
        outcome = run.outcome
        error = outcome.error if outcome is not None and not outcome.ok else None
        self.usage.record(run.spent, error, self._limit_message, self._memory_message)

    def _start(self, prepared: Any) -> Any:
        """A job's first resume, on an idle worker coroutine if there is one (``_started``)."""
        if type(prepared) is BoxError:
            raise prepared
        version = self._catalog.schema_version
        if version != self._schema_version:
            self._state[b"schema_version"] = version
            self._schema_version = version
        fn, args = prepared
        if self._idle:
            co = self._started = self._idle.pop()
            return co.send((fn, *args))
        co = self._started = self._worker.coroutine(fn, *args)
        return co.send(None)

    async def _finish(self, run: _Run) -> Outcome:
        """The rest of a job that could not finish on the loop at once."""
        try:
            while run.outcome is None:
                if run.operation is not None:
                    name, args = run.operation
                    run.operation = None
                    answer = self._operate(run.job, name, args)
                    if isinstance(answer, tuple):
                        run.answer = answer
                    else:
                        run.pending = answer
                if run.pending is not None:
                    pending, run.pending = run.pending, None
                    run.answer = await self._answer_of(pending)
                    run.to_thread = False  # the next stretch may well be short
                elif run.answer is not None and not run.to_thread:
                    # a quick operation, and the job had its share of the loop: let others in
                    await trio.lowlevel.checkpoint()
                if not run.to_thread and self._lock.acquire(False):
                    try:
                        self._on_loop(run, _now())
                    finally:
                        self._lock.release()
                else:
                    await self._in_lua_thread(run)
        finally:
            if run.outcome is None:  # cancelled: the job is dropped where it stands
                run.cancelled = True
        self._used(run)
        if run.names is not None:
            self.global_functions.sync(*run.names)
        return run.outcome

    def _on_loop(self, run: _Run, began: float) -> None:
        """Run the job on the event loop (holding the state) until it finishes, waits for an
        operation, or has had LOOP_SLICE_S since ``began``; quick operations are answered on
        the way."""
        while True:
            if run.operation is not None:
                name, args = run.operation
                run.operation = None
                answer = self._operate(run.job, name, args)
                if not isinstance(answer, tuple):
                    run.pending = answer
                    return
                run.answer = answer
                if _now() - began > LOOP_SLICE_S:
                    return
            elif run.answer is None and _now() - began > LOOP_SLICE_S:
                run.to_thread = True  # the hook fired and the loop's share is spent
                return
            if run.to_thread or run.pending is not None:
                return
            self._resume(run, True)
            if run.outcome is not None:
                return

    def _thread_slice(self, run: _Run) -> bool:
        """Run the job in the Lua thread (holding the state) until it finishes or asks for an
        operation; True when it had THREAD_SLICE_S and steps others queued should go first."""
        if run.cancelled:
            return False
        self._state[b"on_loop"] = False
        self._state[b"deadline"] = _now() + max(self.limits.time_limit_s - run.spent, 0.0)
        began = _now()
        try:
            while True:
                self._resume(run, False)
                if run.outcome is not None or run.operation is not None:
                    run.to_thread = False
                    return False
                if run.answer is None:  # the yielding hook fired
                    if run.cancelled:
                        return False
                    if _now() - began > THREAD_SLICE_S and not self._steps.empty():
                        return True
        finally:
            self._state[b"on_loop"] = True

    def _resume(self, run: _Run, on_loop: bool) -> None:
        """One resume of the job's coroutine, and what came of it."""
        try:
            self._took(run, self._send(run), on_loop)
        except Exception as exc:
            self._crashed(run, exc)

    def _send(self, run: _Run) -> Any:
        """Start the job or resume it with its answer; what it yields or returns (see job_body
        in box.lua), or None for the yielding hook."""
        began = _now()
        try:
            co = run.co
            if co is None:
                try:
                    return self._start(run.prepare(run.a, run.b))
                finally:
                    run.co = self._started
                    self._started = None
            version = self._catalog.schema_version
            if version != self._schema_version:
                self._state[b"schema_version"] = version
                self._schema_version = version
            answer = run.answer
            run.answer = None
            if answer is None:
                return co.send(None)
            if answer[0]:
                return co.send(self.values.answer(answer[1]))
            return co.send((False, self.values.new_error(answer[1])))
        finally:
            run.spent += _now() - began

    def _took(self, run: _Run, out: Any, on_loop: bool) -> None:
        """What a resume gave: the job's outcome, an operation, or (the hook) nothing yet."""
        if out is None:  # the yielding hook: the time limit is checked here
            if run.spent > self.limits.time_limit_s:
                run.outcome = self._failure(self._limit_message)
            return
        values = self.values
        tag = out[0]
        if tag == b"op":
            name = out[1]
            if name == b"to_thread":
                run.answer = _NO_ANSWER
                if on_loop:
                    run.to_thread = True
                return
            run.operation = (name, values.from_results(out, 2, False))
            return
        if tag != b"done":
            run.outcome = self._failure("unexpected yield from a coroutine outside any coroutine.wrap")
            return
        if len(self._idle) < IDLE_WORKERS:
            self._idle.append(run.co)  # back at its yield, ready for the next job
        globals_made = out[1]
        # New global names mean new functions, maybe; a console statement may also have
        # dropped one (`f = nil`), which makes no new name: the console is not a hot path.
        if globals_made != self._globals_seen or globals_made < 0 or run.raw:
            self._globals_seen = globals_made
            run.names = self._user_globals()
        if out[2]:
            run.outcome = Outcome(True, values.from_results(out, 3, run.raw))
            return
        error = values.error(out[3], out[4], out[5], out[6])
        run.outcome = Outcome(False, [], error)
        if error.message == self._memory_message:
            self._collect_garbage()

    def _crashed(self, run: _Run, exc: Exception) -> None:
        """An error out of the driver's own calls: the job fails with it, the engine goes on."""
        if isinstance(exc, BoxError):  # a chunk that does not compile, a refused value
            exc.console_value = exc.message  # type: ignore[attr-defined]
            run.outcome = Outcome(False, [], exc)
            return
        self._hook.yielding()  # the error may have left the job under the checking hook
        if isinstance(exc, luajit21.LuaMemoryError | MemoryError):
            self._collect_garbage()
            run.outcome = self._failure(self._memory_message)
            return
        log.error("a Lua job failed in the driver", exc_info=exc)
        run.outcome = self._failure(f"internal error: {type(exc).__name__}")

    @staticmethod
    def _failure(message: str) -> Outcome:
        error = BoxError(ER.PROC_LUA, message=message)
        error.console_value = message  # type: ignore[attr-defined]
        return Outcome(False, [], error)

    def _operate(self, job: Job, name: bytes, args: list[Any]) -> tuple[bool, Any] | Awaitable[Any]:
        """A box operation on the event loop: its answer, or what to await for it."""
        try:
            operation = self._operations.get(name)
            if operation is None:
                operation = self.operations.get(name.decode(errors="replace"))  # raises
            result = operation(job, *args)
            if type(result) is list:
                return (True, result)
            if inspect.isawaitable(result):
                return result
            return (True, list(result) if result is not None else [])
        except Exception as exc:
            return (False, self._operation_error(name, exc))

    async def _answer_of(self, pending: Awaitable[Any]) -> tuple[bool, Any]:
        try:
            result = await pending
        except Exception as exc:
            return (False, self._operation_error(b"", exc))
        return (True, list(result) if result is not None else [])

    @staticmethod
    def _operation_error(name: bytes, exc: Exception) -> BoxError:
        if isinstance(exc, BoxError):
            return exc
        if isinstance(exc, StorageError):
            log.error("storage failure in a box operation from Lua: %s", exc)
            return BoxError(ER.WAL_IO)
        # a bug on our side: the chunk sees an error, the server goes on
        log.error("box operation %s failed", name.decode(errors="replace"), exc_info=exc)
        return BoxError(ER.PROC_LUA, message=f"{type(exc).__name__}: {exc}")

    def memory_used(self) -> int:
        """Bytes the Lua runtime has allocated (for the metrics; read from any thread)."""
        return self._lua.get_memory_used()

    def _collect_garbage(self) -> None:
        self._lua.set_max_memory(0)
        try:
            self._collectgarbage(b"collect")
        finally:
            self._lua.set_max_memory(self.limits.memory_limit_bytes)

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
        """Run queued steps one after the other."""
        while (step := self._steps.get()) is not None:
            step()

    async def _in_lua_thread(self, run: _Run) -> None:
        """Run the job in the Lua thread until it finishes or asks for an operation."""
        token = self._token
        if token is None:
            raise BoxError(ER.PROC_LUA, message="the Lua engine is not running")
        finished = trio.Event()

        def step() -> None:
            with self._lock:
                again = self._thread_slice(run)
            if again:
                self._steps.put(step)
                return
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(finished.set)

        self._steps.put(step)
        await finished.wait()

    # -- Lua functions as procedures (see global_functions.py) ----------------------------------

    def _user_globals(self) -> tuple[list[str], list[str], list[str]]:
        """The global names user code made, as functions, tables and the rest. The walk is Lua,
        on the main Lua state, so it runs with no hook."""
        self._hook.off()
        try:
            lists = self._user_functions()
        finally:
            self._hook.yielding()
        return tuple(  # type: ignore[return-value]
            [names[i].decode() for i in range(1, len(names) + 1)] for names in lists
        )
