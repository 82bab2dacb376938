"""The ten Deckard methods: requests to engine calls on the Deckard space, answers back (spec
section 2, K1-K13). A queue is a tube of that space; the facade only translates.

Handlers run on trio, in the task the gRPC server (:mod:`boxqueue.frontdoor.grpc_connections`)
gives each call. An engine call's answer is waited for whatever happens to the call: its
:class:`spaces.later.Later` cannot be cancelled, and a coroutine (Add's upsert, Flush) runs
shielded, so a call its client gives up on (a deadline, a reset, the server stopping) still
leaves each write whole; only its answer is dropped.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Coroutine
from typing import Any

import trio

from boxqueue.facades.deckard import translate
from boxqueue.facades.deckard.errors import answers_errors, grpc_error
from boxqueue.facades.deckard.generated import deckard_service_pb2 as pb
from boxqueue.frontdoor.grpc_connections import Call, Method
from boxqueue.frontdoor.grpc_services import parse
from boxqueue.spaces.later import Later
from boxqueue.tubes.engine import QueueEngine
from boxqueue.tubes.kinds import DECKARD
from boxqueue.tubes.task import TAKEN

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # Deckard's receive and send limits


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def settled(result: Any) -> Any:
    """An engine call's answer: a Later waited for, a coroutine run to its end (shielded),
    anything else as it is."""
    if hasattr(result, "then"):
        return await result
    if inspect.isawaitable(result):
        with trio.CancelScope(shield=True):
            return await result
    return result


class DeckardService:
    """``blipai.deckard.Deckard`` over the tubes of one space.

    Add, Flush and EditQueue are coroutines (the gRPC server runs each call in a task). The
    others are quick (:class:`boxqueue.frontdoor.grpc_connections.Method`): one engine operation,
    so they answer at once or return the operation's :class:`Later` mapped to the answer, and the
    server writes the answer from its callback, without a task per call."""

    def __init__(self, engine: QueueEngine, space_id: int, *, default_ttl_minutes: int, allow_flush: bool) -> None:
        self.engine = engine
        self.space_id = space_id
        self.default_ttl_minutes = default_ttl_minutes
        self.allow_flush = allow_flush

    async def _engine(self, fn: Any, *args: Any) -> Any:
        return await settled(fn(*args))

    @answers_errors("error adding messages")
    def Add(self, request: pb.AddRequest) -> pb.AddResponse | Later[pb.AddResponse] | Coroutine[Any, Any, pb.AddResponse]:
        items = translate.new_messages(request, now_ms(), self.default_ttl_minutes)
        if not items:
            return pb.AddResponse()
        now = float(now_ms())
        tasks = [(m.queue, m.id, translate.clamp_score(now if m.score is None else m.score), m.expires * 1000,
                  m.attachments, m.data) for m in items]
        kind = self.engine.kind_named(DECKARD)
        added = self.engine.upsert_now(self.space_id, tasks, kind)
        if added is not None:  # the usual Add: one commit, no task needed
            return added.map(_add_response)
        return self._add(tasks, kind)  # several queues, a limit, or the same ids being added

    async def _add(self, tasks: list[Any], kind: Any) -> pb.AddResponse:
        with trio.CancelScope(shield=True):  # once begun, an Add is written whole or not at all
            counts = await self.engine.upsert(self.space_id, tasks, kind=kind)
        return _add_response(counts)

    @answers_errors("error pulling messages")
    def Pull(self, request: pb.PullRequest) -> Later[pb.PullResponse]:
        amount, low, high, deadline = translate.pull_bounds(request, now_ms())
        pulled = self.engine.take_many(self.space_id, request.queue, amount, deadline * 1000, low, high)
        answer: Later[pb.PullResponse] = Later()

        def answered(found: Any, error: BaseException | None) -> None:
            if error is not None:
                answer.settle(None, error)
                return
            response = pb.PullResponse()
            messages = response.messages
            try:
                for task, raw in found:
                    translate.to_message(task, raw, into=messages)
                fits = translate.fitting(messages, MAX_MESSAGE_BYTES)
            except Exception as exc:
                answer.settle(None, exc)
                return
            if fits == len(messages):
                answer.settle(response)
                return
            # The answer would pass the 4 MiB send limit: the messages beyond it were never
            # handed out, so they go back to the queue at once rather than wait for a deadline.
            beyond = [m.id for m in messages[fits:]]
            del messages[fits:]
            back = self.engine.untake(self.space_id, request.queue, beyond)
            back.then(lambda _value, failed: answer.settle(None if failed else response, failed))

        pulled.then(answered)
        return answer

    def _settle(self, request: pb.AckRequest, *, nack: bool) -> Later[pb.AckResponse]:
        translate.require(request.id, "id")
        translate.require(request.queue, "queue")
        score = translate.given_score(request.score)
        if nack:
            subtract = 0.0
        else:
            subtract = translate.given_score(request.score_subtract, "score_subtract") or 0.0
        breakpoint = request.breakpoint

        def diagnostics(attrs: dict[str, Any]) -> None:
            translate.count_settle(attrs, nack=nack, breakpoint=breakpoint)

        if request.removeMessage:
            # Deckard acks, then removes, and answers success whatever the ack said: what the
            # ack changed goes with the message, so removing is all there is to do.
            return self.engine.remove(self.space_id, request.queue, [request.id]).map(
                lambda removed: pb.AckResponse(success=True, removal_response=pb.RemoveResponse(
                    cacheRemoved=len(removed), storageRemoved=len(removed))))
        task = self.engine.get(self.space_id, request.queue, request.id)
        if task is None or task.status != TAKEN:
            return Later.done(pb.AckResponse(success=False))
        if request.lock_ms > 0:
            # Locked, then back with the score given, else the front (nack) or the back (ack).
            unlock = translate.clamp_score(score) if score is not None else (0.0 if nack else None)
            settling = self.engine.settle(self.space_id, request.queue, request.id, pri=None,
                                          delay=request.lock_ms * 1000, unlock_pri=unlock, attrs=diagnostics)
        else:
            if score is not None:
                pri = translate.clamp_score(score)
            else:
                pri = 0.0 if nack else translate.clamp_score(now_ms() - subtract)
            settling = self.engine.settle(self.space_id, request.queue, request.id, pri=pri, attrs=diagnostics)
        return settling.map(lambda success: pb.AckResponse(success=success))

    @answers_errors("error on message ACK")
    def Ack(self, request: pb.AckRequest) -> Later[pb.AckResponse]:
        return self._settle(request, nack=False)

    @answers_errors("error on message NACK")
    def Nack(self, request: pb.AckRequest) -> Later[pb.AckResponse]:
        return self._settle(request, nack=True)

    @answers_errors("error count messages")
    def Count(self, request: pb.CountRequest) -> pb.CountResponse:
        if not request.queue:  # K12: "" counts every queue
            return pb.CountResponse(count=sum(len(t.tasks) for t in self.engine.tubes_of(self.space_id)))
        tube = self.engine.existing_tube(self.space_id, request.queue)
        return pb.CountResponse(count=0 if tube is None else len(tube.tasks))

    @answers_errors("error removing messages from pool")
    def Remove(self, request: pb.RemoveRequest) -> pb.RemoveResponse | Later[pb.RemoveResponse]:
        if not request.ids:
            return pb.RemoveResponse()
        return self.engine.remove(self.space_id, request.queue, list(request.ids)).map(
            lambda removed: pb.RemoveResponse(cacheRemoved=len(removed), storageRemoved=len(removed)))

    @answers_errors("error to flush deckard")
    async def Flush(self, request: pb.FlushRequest) -> pb.FlushResponse:
        if not self.allow_flush:  # K9
            return pb.FlushResponse(success=False)

        async def flush() -> None:  # every queue of the Deckard space, nothing else
            for tube in self.engine.tubes_of(self.space_id):
                await self.engine.drop_tube(self.space_id, tube.name)

        await self._engine(flush)
        return pb.FlushResponse(success=True)

    @answers_errors("error getting message")
    def GetById(self, request: pb.GetByIdRequest) -> pb.GetByIdResponse:
        translate.require(request.id, "id")
        translate.require(request.queue, "queue")
        task = self.engine.get(self.space_id, request.queue, request.id)
        if task is None or task.expires <= time.time_ns() // 1000:
            return pb.GetByIdResponse(found=False)
        raw = self.engine.stored(self.engine.queue_space(self.space_id), task)
        if raw is None:
            return pb.GetByIdResponse(found=False)
        message = translate.to_message(task.copy(), raw)
        return pb.GetByIdResponse(
            message=message, found=True, human_readable_payload=translate.human_readable(message.payload)
        )

    @answers_errors("error editing queue")
    async def EditQueue(self, request: pb.EditQueueRequest) -> pb.EditQueueResponse:
        if not request.HasField("configuration"):
            return pb.EditQueueResponse(queue=request.queue, success=False)
        max_elements = request.configuration.max_elements
        if max_elements != 0:  # > 0 sets the limit, < 0 removes it, 0 changes nothing

            def edit() -> Any:
                return self.engine.set_limit(self.space_id, request.queue, max(max_elements, 0))

            await self._engine(edit)
        return pb.EditQueueResponse(queue=request.queue, success=True)

    @answers_errors("error getting queue configuration")
    def GetQueue(self, request: pb.GetQueueRequest) -> pb.GetQueueResponse:
        tube = self.engine.existing_tube(self.space_id, request.queue)
        max_elements = 0 if tube is None else tube.limit
        return pb.GetQueueResponse(
            queue=request.queue, configuration=pb.QueueConfiguration(max_elements=max_elements)
        )


def deckard_methods(service: DeckardService) -> dict[str, Method]:
    """The ten methods as the gRPC server's handlers (by path), from the proto's service
    descriptor: each parses its request, runs the service's method, serializes the answer."""
    descriptor = pb.DESCRIPTOR.services_by_name["Deckard"]
    methods = {}
    for method in descriptor.methods:
        serve = getattr(service, method.name)
        request_type = getattr(pb, method.input_type.name)
        path = f"/{descriptor.full_name}/{method.name}"
        if inspect.iscoroutinefunction(serve):
            methods[path] = Method(unary=_unary(serve, request_type))
        else:
            methods[path] = Method(quick=_quick(serve, request_type), failed=functools.partial(
                grpc_error, failure=serve.failure, name=method.name))
    return methods


def _add_response(counts: tuple[int, int]) -> pb.AddResponse:
    return pb.AddResponse(created_count=counts[0], updated_count=counts[1])


def _unary(serve: Any, request_type: Any) -> Any:
    async def handle(data: bytes, call: Call) -> bytes:
        answer = await serve(parse(request_type, data))
        return answer.SerializeToString()

    return handle


def _quick(serve: Any, request_type: Any) -> Any:
    def handle(data: bytes, call: Call) -> Any:
        answer = serve(parse(request_type, data))
        if isinstance(answer, Later):
            return answer.map(_serialized)
        if isinstance(answer, Coroutine):  # the rare call that needs a task (compiled: not inspect.iscoroutine)
            return _serialized_when_done(answer)
        return answer.SerializeToString()

    return handle


async def _serialized_when_done(coroutine: Coroutine[Any, Any, Any]) -> bytes:
    return (await coroutine).SerializeToString()


def _serialized(answer: Any) -> bytes:
    return answer.SerializeToString()
