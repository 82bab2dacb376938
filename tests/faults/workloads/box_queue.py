"""box.queue put → take → ack on space 0's tube ``faults`` (tests/integration/queue_fixtures.py)."""

from __future__ import annotations

from typing import Any

from tests.faults.workloads.queue_cycle import QueueCycle, Request

TUBE = "faults"


class BoxQueueCycle(QueueCycle):
    name = "box_queue"
    prefix = "bq"

    def put(self, payload: str) -> Request:
        return lambda c: c.call("box.queue.put", [0, TUBE, 0, 0, 0, 0, payload])

    def take(self) -> Request:
        return lambda c: c.call("box.queue.take", [0, TUBE, self.take_timeout_s])

    def taken(self, data: list[Any]) -> tuple[Any, str] | None:
        if not data or not data[0]:
            return None
        task = data[0]  # [id, tube, status, data...]
        return task[0], task[3]

    def ack(self, task_id: Any) -> Request:
        return lambda c: c.call("box.queue.ack", [0, task_id])

    def spaces(self) -> tuple[str, ...]:
        return ("queue",)
