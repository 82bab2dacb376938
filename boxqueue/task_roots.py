"""A Python coroutine at the root of every task whose work is compiled.

trio keeps each task's root coroutine and, whenever the task takes a ``trio.Lock``, asks it with
``inspect.getcoroutinestate`` whether it has already ended (the lock's "breaker" bookkeeping,
``trio._core._parking_lot``). trio wraps a coroutine that has no frame, but a Cython 3 coroutine
has one, so it becomes the root as it is; it has no ``cr_suspended``, and the question raises
AttributeError. A compiled coroutine started as a task could then take no lock at all: a
``box.queue.put_unique`` run as an iproto call (``tube.unique_lock``) failed that way once the
connection's loop was compiled. Compiled modules therefore start their tasks through
:func:`python_root`; this module is never compiled (``boxqueue/compiled.py``), and the cost is
the one interpreted frame a step that trio's own wrapper would cost.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


async def python_root(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Await ``fn(*args)``; started as ``nursery.start_soon(python_root, fn, *args)``."""
    return await fn(*args)
