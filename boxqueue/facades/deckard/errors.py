"""Engine errors and bad requests to gRPC statuses, in one place (K6).

* A request Deckard validates (Add, Ack, Nack, GetById: K12) with an empty queue or id, or a
  score that is not a number, is ``INVALID_ARGUMENT`` with a text saying what is wrong.
* A fault below the facade (storage, engine) is ``INTERNAL`` with Deckard's text for the method
  ("error adding messages", ...) followed by the cause.
* A call arriving while the server shuts down is ``UNAVAILABLE``, so clients retry elsewhere.
* "Not found" is never an error: the handlers answer ``found=false`` / ``success=false``.

Oversized messages (``RESOURCE_EXHAUSTED``) and unknown methods (``UNIMPLEMENTED``) are answered
by grpcio itself before a handler runs.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from boxqueue.facades.deckard.trio_bridge import BridgeClosed

log = logging.getLogger(__name__)

R = TypeVar("R")


class InvalidArgument(ValueError):
    """A request field Deckard's clients must set correctly; ``str()`` is the status text."""


class Undecodable:
    """What the request deserializer hands over for bytes that are not the method's message:
    the handler answers INTERNAL with the cause, as Deckard's Go server does, instead of grpcio's
    bare UNKNOWN."""

    def __init__(self, type_name: str, error: Exception) -> None:
        self.text = f"cannot decode the request as {type_name}: {error}"


def tolerant(parse: Callable[[bytes], Any], type_name: str) -> Callable[[bytes], Any]:
    """A request deserializer that returns :class:`Undecodable` instead of raising."""

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # DecodeError, and whatever else a parser may raise
            return Undecodable(type_name, exc)

    return deserialize


def status_for(exc: Exception, failure: str) -> tuple[grpc.StatusCode, str]:
    """The status code and text a handler failing with ``exc`` answers."""
    if isinstance(exc, InvalidArgument):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, BridgeClosed):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    return grpc.StatusCode.INTERNAL, f"{failure}: {exc}"


def answers_errors(failure: str) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Wrap a servicer method so every exception becomes its gRPC status."""

    def wrap(method: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(method)
        def handler(self: Any, request: Any, context: grpc.ServicerContext) -> R:
            if isinstance(request, Undecodable):
                context.abort(grpc.StatusCode.INTERNAL, request.text)  # raises
            try:
                return method(self, request, context)
            except Exception as exc:
                code, text = status_for(exc, failure)
                if code == grpc.StatusCode.INTERNAL:
                    log.error("Deckard %s failed", method.__name__, exc_info=exc)
                context.abort(code, text)
                raise  # abort raises; this line is never reached

        return handler

    return wrap
