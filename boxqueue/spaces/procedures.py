"""The procedure registry: what CALL and CALL_16 can run, by name.

Upper layers register Python callables under Lua-style names (``box.queue.put``,
``queue.put``); the iproto dispatcher looks names up here. A procedure receives a
:class:`CallContext` and the call's arguments and returns the list of its return values (a Lua
function's multiple returns): at once, as a coroutine, or as a :class:`spaces.later.Later` (a
write that settles when its commit returns, with no task of its own). Callers that just want the
values await anything that is not a list.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import cython

from boxqueue.spaces.access import User

Procedure = Callable[..., "list[Any] | Awaitable[list[Any]]"]


@dataclass
class CallContext:
    """Who is calling: the transport-neutral identity a procedure may bind state to."""

    session_id: int
    user: User
    read_only: bool = False
    # Register a callback to run when the caller's session ends (its connection closes).
    on_disconnect: Callable[[Callable[[], Any]], None] = lambda _cb: None
    extra: dict[str, Any] = field(default_factory=dict)


@cython.cclass
class ProcedureEntry:
    """A registered procedure (a compiled class, ``procedures.pxd``: read on every CALL)."""

    def __init__(self, name: str, fn: Procedure, is_async: bool, writes: bool, id: int) -> None:
        self.name = name
        self.fn = fn
        self.is_async = is_async
        self.writes = writes
        self.id = id
        self.max_args = max_args(fn)

    def invoke(self, ctx: CallContext, args: Any) -> Any:
        """Run the procedure with the call's arguments; those past the ones it names are dropped,
        as a Lua function ignores them (``box.info`` called with arguments answers as without)."""
        if self.max_args >= 0 and len(args) > self.max_args:
            args = args[: self.max_args]
        return self.fn(ctx, *args)

    def __repr__(self) -> str:
        return f"ProcedureEntry({self.name!r}, writes={self.writes})"


@cython.cclass
class Procedures:
    """Name -> procedure; names also appear in ``_func``/``_vfunc`` through the catalogue."""

    def __init__(self, function_ids: dict[str, int] | None = None) -> None:
        self._entries: dict[str, ProcedureEntry] = {}
        self._resolvers: list[Callable[[str], ProcedureEntry | None]] = []
        self._function_ids = function_ids if function_ids is not None else {}

    def register(self, name: str, fn: Procedure, *, writes: bool = False) -> None:
        """Make ``fn`` callable as ``name``. ``writes`` procedures fail on read-only ports."""
        fid = self._function_ids.get(name) or (max(self._function_ids.values(), default=0) + 1)
        self._function_ids[name] = fid
        self._entries[name] = ProcedureEntry(name, fn, inspect.iscoroutinefunction(fn), writes, fid)

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)
        self._function_ids.pop(name, None)

    def add_resolver(self, resolver: Callable[[str], ProcedureEntry | None], *, first: bool = False) -> None:
        """A fallback for names not registered one by one (``box.space.<name>:select``);
        ``first``: asked before those added earlier (a resolver whose names are called on every
        request, and that answers for its own names only)."""
        if first:
            self._resolvers.insert(0, resolver)
        else:
            self._resolvers.append(resolver)

    def resolve(self, name: str) -> ProcedureEntry | None:
        entry = self._entries.get(name)
        if entry is not None:
            return entry
        for resolver in self._resolvers:
            entry = resolver(name)
            if entry is not None:
                return entry
        return None

    def names(self) -> list[str]:
        return sorted(self._entries)


def max_args(fn: Procedure) -> int:
    """How many arguments ``fn`` takes after the call context; -1: any number."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read: pass everything
        return -1
    positional = 0
    for parameter in parameters:
        if parameter.kind is parameter.VAR_POSITIONAL:
            return -1
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            positional += 1
    return max(positional - 1, 0)


def make_entry(name: str, fn: Procedure, *, writes: bool = False) -> ProcedureEntry:
    return ProcedureEntry(name, fn, inspect.iscoroutinefunction(fn), writes, 0)
