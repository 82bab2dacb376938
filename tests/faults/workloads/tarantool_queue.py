"""tarantool/queue put → take → ack on a ``fifo`` tube (tests/integration/test_queue_module.py)."""

from __future__ import annotations

from typing import Any

from tests.faults.cluster import FaultCluster
from tests.faults.workloads.queue_cycle import QueueCycle, Request

TUBE = "faults_tq"


class TarantoolQueueCycle(QueueCycle):
    name = "tarantool_queue"
    prefix = "tq"

    def setup(self, cluster: FaultCluster) -> None:
        # Over CALL the module cannot encode the tube object it returns; EVAL returns nothing.
        cluster.on_leader(lambda c: c.eval(f"queue.create_tube('{TUBE}', 'fifo', {{if_not_exists = true}})"))

    def put(self, payload: str) -> Request:
        return lambda c: c.call(f"queue.tube.{TUBE}:put", [payload])

    def take(self) -> Request:
        return lambda c: c.call(f"queue.tube.{TUBE}:take", [self.take_timeout_s])

    def taken(self, data: list[Any]) -> tuple[Any, str] | None:
        if not data or not data[0]:
            return None
        task = data[0]  # [id, status letter, data]
        return task[0], task[2]

    def ack(self, task_id: Any) -> Request:
        return lambda c: c.call(f"queue.tube.{TUBE}:ack", [task_id])

    def spaces(self) -> tuple[str, ...]:
        return (TUBE,)
