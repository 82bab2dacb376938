"""Counts Deckard's calls for the metrics: a grpcio server interceptor.

Every unary call (Deckard's ten methods and the health checks) is recorded once it returns or
fails: its method name, its status (anything but OK is an error, counted by the status name) and
its time. Streaming calls (server reflection) pass through uncounted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from boxqueue.measures import RequestMeter


class MeteringInterceptor(grpc.ServerInterceptor):
    def __init__(self, meter: RequestMeter) -> None:
        self.meter = meter

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        inner = handler.unary_unary
        meter = self.meter

        def metered(request: Any, context: grpc.ServicerContext) -> Any:
            started = meter.begin()
            failed: BaseException | None = None
            try:
                return inner(request, context)
            except BaseException as exc:
                failed = exc
                raise
            finally:
                code = _status(context)
                if code is None and failed is not None:
                    code = grpc.StatusCode.UNKNOWN
                if code is None or code == grpc.StatusCode.OK:
                    meter.record(method, started)
                else:
                    details = _details(context) or (str(failed) if failed is not None else "")
                    meter.record(method, started, code.name, details)

        return handler._replace(unary_unary=metered)


def _status(context: Any) -> grpc.StatusCode | None:
    try:
        code = context.code()
    except Exception:  # older grpcio: no code() on the servicer context
        return None
    return code


def _details(context: Any) -> str:
    try:
        details = context.details()
    except Exception:
        return ""
    if isinstance(details, bytes):
        return details.decode("utf-8", "replace")
    return details or ""
