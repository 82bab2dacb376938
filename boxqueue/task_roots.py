"""A Python coroutine at the root of every task whose work is compiled.

trio keeps each task's root coroutine and, whenever the task takes a ``trio.Lock``, asks it with
``inspect.getcoroutinestate`` whether it has already ended (the lock's "breaker" bookkeeping,
``trio._core._parking_lot``). trio wraps a coroutine that has no frame, but a Cython 3 coroutine
has one, so it becomes the root as it is; it has no ``cr_suspended``, and the question raises
AttributeError. A compiled coroutine started as a task could then take no lock at all: a
``box.queue.put_unique`` run as an iproto call (``tube.unique_lock``) failed that way once the
connection's loop was compiled. Every task whose root would be a compiled coroutine therefore
starts through :func:`python_root`, whoever starts it (``tests/unit/test_compiled.py`` checks the
compiled modules' own sites; ``tests/integration/test_inprocess.py`` asks every task of a running
server); this module is never compiled (``boxqueue/compiled.py``), and the cost is
the one interpreted frame a step that trio's own wrapper would cost.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio


async def python_root(
    fn: Callable[..., Awaitable[Any]], *args: Any, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
) -> Any:
    """Await ``fn(*args)``; started as ``nursery.start_soon(python_root, fn, *args)``, or as
    ``await nursery.start(python_root, fn, *args)``, which hands ``fn`` the task status."""
    if task_status is trio.TASK_STATUS_IGNORED:
        return await fn(*args)
    return await fn(*args, task_status=task_status)
