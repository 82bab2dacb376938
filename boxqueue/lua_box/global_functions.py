"""Global Lua functions as procedures: what CALL and CALL_16 reach by name.

User code defines them with ``function f() ... end`` (console or EVAL) or keeps them in global
tables (``app.handler``, ``app:method``). The engine lists the global names user code made when
they may have changed; this registers the functions in the procedure registry (so they show in
``_vfunc``) and resolves the rest by name. Every name maps to the same call: a job that looks the
function up when it runs, so a global whose value changed since the last listing is still found,
and one that is gone answers ER_NO_SUCH_PROC.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from boxqueue.spaces.procedures import CallContext, ProcedureEntry, Procedures, make_entry

Values = list[Any] | Coroutine[Any, Any, list[Any]]
Caller = Callable[[CallContext, str, tuple[Any, ...]], Values]


class GlobalFunctions:
    """The procedure registry's view of the Lua globals (used on the event loop only)."""

    def __init__(self, procedures: Procedures, call: Caller) -> None:
        self._procedures = procedures
        self._call = call  # call(ctx, name, args): the job that calls the global
        self._registered: set[str] = set()
        self._tables: frozenset[str] = frozenset()
        self._names: frozenset[str] = frozenset()
        procedures.add_resolver(self._resolve)

    def sync(self, functions: list[str], tables: list[str], others: list[str]) -> None:
        """The global names user code made, as those holding functions, tables and the rest."""
        self._tables = self._names = frozenset()  # our resolver stays out of the checks below
        current = set(functions)
        for name in self._registered - current:
            self._procedures.unregister(name)
        registered = set()
        for name in current:
            if name in self._registered:
                registered.add(name)
            elif self._procedures.resolve(name) is None:  # never shadow a built-in procedure
                # Not a "writes" procedure: the box operations it makes check the port themselves.
                self._procedures.register(name, self._procedure(name))
                registered.add(name)
        self._registered = registered
        self._tables = frozenset(tables)
        self._names = frozenset((*functions, *tables, *others))

    def _resolve(self, name: str) -> ProcedureEntry | None:
        """``app.handler`` and ``app:method`` where ``app`` is a global table user code made;
        also a global that held no function when the globals were last listed (a global's
        value can change without a new name appearing): the job itself finds out."""
        head = name.split(".", 1)[0].split(":", 1)[0]
        if head == name and name not in self._names:
            return None
        if head != name and head not in self._tables:
            return None
        return make_entry(name, self._procedure(name))

    def _procedure(self, name: str) -> Callable[..., Values]:
        def call(ctx: CallContext, *args: Any) -> Values:
            return self._call(ctx, name, args)

        return call
