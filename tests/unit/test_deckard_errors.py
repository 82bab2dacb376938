"""K6: one mapping from failures to gRPC statuses."""

from __future__ import annotations

import pytest

from boxqueue.errcodes import ER, BoxError
from boxqueue.facades.deckard.errors import InvalidArgument, answers_errors, grpc_error, status_for
from boxqueue.facades.deckard.generated import deckard_service_pb2 as pb
from boxqueue.frontdoor.grpc_connections import GrpcError, Status
from boxqueue.frontdoor.grpc_services import parse
from boxqueue.storage.environment import StorageError


def test_statuses():
    assert status_for(InvalidArgument("invalid id: empty"), "error on message ACK") == (
        Status.INVALID_ARGUMENT, "invalid id: empty",
    )
    assert status_for(StorageError("map full"), "error adding messages") == (
        Status.INTERNAL, "error adding messages: map full",
    )
    code, text = status_for(BoxError(ER.NO_SUCH_SPACE, "deckard_messages"), "error pulling messages")
    assert code == Status.INTERNAL and text.startswith("error pulling messages: ")
    assert status_for(GrpcError(Status.UNAVAILABLE, "later"), "x") == (Status.UNAVAILABLE, "later")


async def test_a_failing_method_ends_with_its_status():
    class Service:
        @answers_errors("error adding messages")
        async def Add(self, request):
            raise StorageError(f"map full for {request}")

        @answers_errors("error on message ACK")
        async def Ack(self, request):
            raise InvalidArgument("invalid id: empty")

    with pytest.raises(GrpcError) as err:
        await Service().Add("r")
    assert (err.value.status, err.value.message) == (Status.INTERNAL, "error adding messages: map full for r")
    with pytest.raises(GrpcError) as err:
        await Service().Ack("r")
    assert (err.value.status, err.value.message) == (Status.INVALID_ARGUMENT, "invalid id: empty")


def test_undecodable_bytes_are_internal_with_the_cause():
    good = pb.AddRequest(messages=[pb.AddMessage(id="a", queue="q")])
    assert parse(pb.AddRequest, good.SerializeToString()) == good
    with pytest.raises(GrpcError) as err:
        parse(pb.AddRequest, b"\x0a\xff\xff\xff\xff\x0f")
    assert err.value.status == Status.INTERNAL
    assert err.value.message.startswith("cannot decode the request as blipai.deckard.AddRequest: ")


def test_a_quick_method_raises_its_status_and_keeps_its_failure_text():
    """A method that answers at once (or returns a Later) has what it raises turned into a status
    there, and its failure text kept for the errors its Later settles with."""

    class Service:
        @answers_errors("error getting message")
        def GetById(self, request):
            raise InvalidArgument("invalid queue: empty")

    with pytest.raises(GrpcError) as err:
        Service().GetById("r")
    assert (err.value.status, err.value.message) == (Status.INVALID_ARGUMENT, "invalid queue: empty")
    assert Service().GetById.failure == "error getting message"
    assert grpc_error(StorageError("map full"), "error getting message", "GetById").message == (
        "error getting message: map full")
