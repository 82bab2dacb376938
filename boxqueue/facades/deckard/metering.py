"""Counts Deckard's calls for the metrics.

Every unary call (Deckard's ten methods and the health checks) that reaches the server's checks
is recorded once it returns or fails: its method name, its status (anything but OK is an error,
counted by the status name) and its time; a call refused for its token is counted too. Streaming
calls (server reflection, health watches) pass uncounted, and so do calls the server refuses
before any method is chosen (an unknown method, an oversized message).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from boxqueue.frontdoor.grpc_connections import Call, GrpcError, Status
from boxqueue.measures import RequestMeter


class CallMeter:
    """The gRPC server's ``guard`` and ``finished`` for the metered methods (paths)."""

    def __init__(self, meter: RequestMeter | None, metered: Collection[str],
                 check: Callable[[Call], None] | None = None) -> None:
        self.meter = meter
        self.metered = frozenset(metered)
        self.names = {path: path.rsplit("/", 1)[-1] for path in self.metered}  # the method's name, by path
        self.check = check

    def begin(self, call: Call) -> object:
        """Runs before the call's handler: starts its clock, checks it may run."""
        started = self.meter.begin() if self.meter is not None and call.method in self.metered else None
        if self.check is not None:
            try:
                self.check(call)
            except GrpcError as exc:
                if started is not None:
                    self.finished(call, started, exc.status, exc.message)
                raise
        return started

    def finished(self, call: Call, started: object, status: Status, text: str) -> None:
        if not isinstance(started, float) or self.meter is None:
            return
        method = self.names[call.method]
        if status == Status.OK:
            self.meter.record(method, started)
        else:
            self.meter.record(method, started, status.name, text)
