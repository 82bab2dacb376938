"""A result promised now and delivered later, without a task to wait for it.

Most writes finish when their group commit returns, a few hundred microseconds after the call that
made them. Spawning a trio task per call only to wait for that costs more than the write itself on
a busy server, so a write path may instead return a :class:`Later`: the iproto dispatcher registers
a callback with :meth:`Later.then` and replies from it, the way it already replies to DML writes;
any other caller simply ``await``s it.

A Later is settled exactly once, always on the event loop thread, and has at most one consumer.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import cython
import trio

T = TypeVar("T")
U = TypeVar("U")

Settled = Callable[[Any, BaseException | None], None]


def _refuse_cancel(_raise_cancel: Any) -> trio.lowlevel.Abort:
    # The operation happens anyway; its caller must hear how it went.
    return trio.lowlevel.Abort.FAILED


@cython.cclass
class _Later:
    """One value or one error, later. ``await`` it, or pass a callback to :meth:`then`.

    (An extension type, so it cannot be ``Generic``: :class:`Later` is its name, and its generic
    face for the type checker.)"""

    __slots__ = ("_settled", "_value", "_error", "_callback", "_maps", "_consumed")

    def __init__(self) -> None:
        self._settled = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._callback: Settled | None = None
        self._maps: list[Callable[[Any], Any]] | None = None
        self._consumed = False

    @classmethod
    def done(cls, value: Any) -> Any:
        """An already settled Later (an operation that needed no write)."""
        later = cls()
        later.settle(value)
        return later

    def settle(self, value: Any = None, error: BaseException | None = None) -> None:
        if self._settled:
            raise RuntimeError("a Later is settled once")
        maps = self._maps
        # Forget the functions as they are used: a map or callback is often a closure that
        # refers back to this Later, and a settled Later that kept it would be a reference
        # cycle, left for the cyclic collector (tens of thousands a second on a busy queue).
        self._maps = None
        if error is None and maps is not None:
            for fn in maps:
                try:
                    value = fn(value)
                except Exception as exc:
                    value, error = None, exc
                    break
        self._settled = True
        self._value = value
        self._error = error
        callback = self._callback
        if callback is not None:
            self._callback = None
            callback(value, error)

    def then(self, callback: Settled) -> None:
        """Run ``callback(value, error)`` once settled: now if it already is."""
        if self._consumed:
            raise RuntimeError("a Later has one consumer")
        self._consumed = True
        if self._settled:
            callback(self._value, self._error)
        else:
            self._callback = callback

    def map(self, fn: Callable[[Any], Any]) -> Any:
        """This Later, turned into one of ``fn(value)``: an error passes through, and so does one
        raised by ``fn``. It changes this object (one consumer, so nobody else holds it) rather
        than making another, which matters on a path taken for every request."""
        if self._consumed:
            raise RuntimeError("map a Later before consuming it")
        if self._settled:
            if self._error is None:
                try:
                    self._value = fn(self._value)
                except Exception as exc:
                    self._value, self._error = None, exc
        elif self._maps is None:
            self._maps = [fn]
        else:
            self._maps.append(fn)
        return self

    def __await__(self) -> Generator[Any, None, Any]:
        if self._consumed:
            raise RuntimeError("a Later has one consumer")
        self._consumed = True
        if not self._settled:
            task = trio.lowlevel.current_task()
            self._callback = lambda _value, _error: trio.lowlevel.reschedule(task)
            yield from trio.lowlevel.wait_task_rescheduled(_refuse_cancel).__await__()  # noqa: ASYNC105 (this is __await__)
        if self._error is not None:
            raise self._error
        return self._value


if TYPE_CHECKING:

    class Later(_Later, Generic[T]):
        @classmethod
        def done(cls, value: U) -> Later[U]: ...
        def map(self, fn: Callable[[T], U]) -> Later[U]: ...
        def __await__(self) -> Generator[Any, None, T]: ...

else:
    Later = _Later
