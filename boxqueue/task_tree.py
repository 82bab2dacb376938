"""What every task of the process is waiting on, for an operator or a test chasing a hang:
``kill -USR1 <pid>`` writes the tree of trio tasks to the log, each with the places it awaits at
(innermost last), as ``py-spy dump`` does for threads. Reads trio's own introspection; changes
nothing."""

from __future__ import annotations

import logging
import signal

import trio

log = logging.getLogger(__name__)


def describe(task: trio.lowlevel.Task, depth: int = 0) -> list[str]:
    """``task`` and its children, one line each, with where each awaits."""
    places = [f"{frame.f_code.co_name} ({frame.f_code.co_filename.rsplit('/', 2)[-1]}:{lineno})"
              for frame, lineno in task.iter_await_frames()]
    lines = [f"{'  ' * depth}{task.name}: {' > '.join(places) or '(running)'}"]
    for nursery in task.child_nurseries:
        for child in sorted(nursery.child_tasks, key=lambda t: t.name):
            lines += describe(child, depth + 1)
    return lines


async def dump_on_signal() -> None:
    """Until cancelled: at each SIGUSR1, log the task tree."""
    with trio.open_signal_receiver(signal.SIGUSR1) as signals:
        async for _ in signals:
            root = trio.lowlevel.current_root_task()
            if root is not None:
                log.warning("tasks at SIGUSR1:\n%s", "\n".join(describe(root)))
