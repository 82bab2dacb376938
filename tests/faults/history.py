"""The history of a run: every operation a client invoked and how it ended, as Jepsen records it.

An operation is invoked, then completes ``ok``, ``fail`` or ``info`` (see
:mod:`tests.faults.outcomes`), with the wall-clock and monotonic time of each. Client threads
append concurrently; checkers read the finished list. The nemesis's actions are recorded too
(process ``nemesis``), so a report can say what was going on.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.faults.outcomes import Outcome

NEMESIS = "nemesis"


@dataclass(eq=False)  # an operation is itself: hashed and compared by identity
class Op:
    index: int
    process: str  # the client (a thread's name), or "nemesis"
    workload: str  # kv, box_queue, tarantool_queue, zaqar, register, nemesis
    f: str  # replace, put, take, ack, read, write, cas, start, stop...
    value: Any  # the arguments: a key, a payload, (key, old, new)...
    invoked: float = field(default_factory=time.monotonic)
    invoked_wall: float = field(default_factory=time.time)
    type: Outcome | None = None  # None while it runs
    completed: float | None = None
    completed_wall: float | None = None
    result: Any = None  # what the answer held: a read's value, a taken task's payload...
    error: str | None = None
    node: str | None = None  # who answered, where known

    @property
    def is_write(self) -> bool:
        return self.f not in ("read", "take", "claim") and self.workload != NEMESIS

    @property
    def acknowledged_write(self) -> bool:
        """A write answered done (a compare-and-set that did not apply wrote nothing)."""
        return self.is_write and self.type == "ok" and not (self.f == "cas" and not self.result)

    def describe(self) -> str:
        when = f"{self.invoked:.3f}" + (f"-{self.completed:.3f}" if self.completed is not None else "-")
        answer = self.type or "pending"
        if self.result is not None:
            answer += f" {self.result!r}"
        if self.error:
            answer += f" ({self.error})"
        at = f" @{self.node}" if self.node else ""
        return f"#{self.index} {self.process} {self.f}({self.value!r}) [{when}] -> {answer}{at}"


class History:
    """Thread-safe: ``invoke`` returns the op that its caller then ``complete``s."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ops: list[Op] = []

    def invoke(self, process: str, workload: str, f: str, value: Any) -> Op:
        with self._lock:
            op = Op(len(self.ops), process, workload, f, value)
            self.ops.append(op)
            return op

    def complete(self, op: Op, outcome: Outcome, result: Any = None, error: str | None = None,
                 node: str | None = None) -> Op:
        op.completed, op.completed_wall = time.monotonic(), time.time()
        op.result, op.error, op.node = result, error, node
        op.type = outcome  # last: a reader that sees the type sees the rest
        return op

    def nemesis(self, f: str, value: Any) -> Op:
        op = self.invoke(NEMESIS, NEMESIS, f, value)
        return self.complete(op, "ok")

    def of(self, workload: str) -> list[Op]:
        with self._lock:
            return [op for op in self.ops if op.workload == workload]

    def close_pending(self) -> None:
        """Operations still running when the run ends are unknown."""
        with self._lock:
            for op in self.ops:
                if op.type is None:
                    self.complete(op, "info", error="still running when the run ended")

    def dump(self, path: Path) -> None:
        """One JSON object a line, for reading a failed run afterwards."""
        with self._lock, open(path, "w") as out:
            for op in self.ops:
                out.write(json.dumps(asdict(op), default=repr) + "\n")
