"""K6: one mapping from failures to gRPC statuses."""

from __future__ import annotations

import grpc

from boxqueue.errcodes import ER, BoxError
from boxqueue.facades.deckard.errors import InvalidArgument, Undecodable, status_for, tolerant
from boxqueue.facades.deckard.generated import deckard_service_pb2 as pb
from boxqueue.facades.deckard.trio_bridge import BridgeClosed
from boxqueue.storage.environment import StorageError


def test_statuses():
    assert status_for(InvalidArgument("invalid id: empty"), "error on message ACK") == (
        grpc.StatusCode.INVALID_ARGUMENT, "invalid id: empty",
    )
    assert status_for(StorageError("map full"), "error adding messages") == (
        grpc.StatusCode.INTERNAL, "error adding messages: map full",
    )
    code, text = status_for(BoxError(ER.NO_SUCH_SPACE, "deckard_messages"), "error pulling messages")
    assert code == grpc.StatusCode.INTERNAL and text.startswith("error pulling messages: ")
    assert status_for(BridgeClosed("the server is shutting down"), "x")[0] == grpc.StatusCode.UNAVAILABLE


def test_tolerant_decoding():
    decode = tolerant(pb.AddRequest.FromString, "blipai.deckard.AddRequest")
    good = pb.AddRequest(messages=[pb.AddMessage(id="a", queue="q")])
    assert decode(good.SerializeToString()) == good
    bad = decode(b"\x0a\xff\xff\xff\xff\x0f")
    assert isinstance(bad, Undecodable) and bad.text.startswith("cannot decode the request as blipai.deckard.AddRequest: ")
