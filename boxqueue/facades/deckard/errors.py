"""Engine errors and bad requests to gRPC statuses, in one place (K6).

* A request Deckard validates (Add, Ack, Nack, GetById: K12) with an empty queue or id, or a
  score that is not a number, is ``INVALID_ARGUMENT`` with a text saying what is wrong.
* A fault below the facade (storage, engine) is ``INTERNAL`` with Deckard's text for the method
  ("error adding messages", ...) followed by the cause.
* Request bytes that are not the method's message are ``INTERNAL`` with the cause, as Deckard's
  Go server answers (:func:`boxqueue.frontdoor.grpc_services.parse`).
* "Not found" is never an error: the handlers answer ``found=false`` / ``success=false``.

Oversized messages (``RESOURCE_EXHAUSTED``) and unknown methods (``UNIMPLEMENTED``) are answered
by the gRPC server (:mod:`boxqueue.frontdoor.grpc_connections`) before a handler runs.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

from boxqueue.errcodes import ER, BoxError
from boxqueue.frontdoor.grpc_connections import GrpcError, Status

log = logging.getLogger(__name__)

R = TypeVar("R")


class InvalidArgument(ValueError):
    """A request field Deckard's clients must set correctly; ``str()`` is the status text."""


def status_for(exc: Exception, failure: str) -> tuple[Status, str]:
    """The status code and text a handler failing with ``exc`` answers. A replica set's answers
    keep their promise (docs/replication.md): a write refused before it reached the log is
    ``UNAVAILABLE`` (it failed: retry, at the leader), one whose outcome is unknown ``UNKNOWN``."""
    if isinstance(exc, GrpcError):
        return exc.status, exc.message
    if isinstance(exc, InvalidArgument):
        return Status.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, BoxError) and exc.code == ER.READONLY:
        return Status.UNAVAILABLE, f"{failure}: {exc}"
    if isinstance(exc, BoxError) and exc.code == ER.SYNC_QUORUM_TIMEOUT:
        return Status.UNKNOWN, f"{failure}: {exc}"
    return Status.INTERNAL, f"{failure}: {exc}"


def grpc_error(exc: Exception, failure: str, name: str) -> GrpcError:
    """``exc`` as the status a method failing with it answers (engine faults are logged)."""
    if isinstance(exc, GrpcError):
        return exc
    code, text = status_for(exc, failure)
    if code == Status.INTERNAL:
        log.error("Deckard %s failed", name, exc_info=exc)
    return GrpcError(code, text)


def answers_errors(failure: str) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Wrap a servicer method so every exception it raises becomes its gRPC status (a
    :class:`GrpcError`). A coroutine method is wrapped as one; a quick method (it answers at
    once, or returns a Later) has its raised errors converted, and ``failure`` kept on the wrapper
    for the errors its Later settles with (:func:`grpc_error`)."""

    def wrap(method: Callable[..., R]) -> Callable[..., R]:
        if inspect.iscoroutinefunction(method):
            @functools.wraps(method)
            async def serve(self: Any, request: Any) -> Any:
                try:
                    return await method(self, request)
                except Exception as exc:
                    raise grpc_error(exc, failure, method.__name__) from exc

            handler: Any = serve
        else:
            @functools.wraps(method)
            def quick(self: Any, request: Any) -> Any:
                try:
                    return method(self, request)
                except Exception as exc:
                    raise grpc_error(exc, failure, method.__name__) from exc

            handler = quick
        handler.failure = failure
        return cast("Callable[..., R]", handler)

    return wrap
