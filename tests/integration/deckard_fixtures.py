"""A real server with the Deckard facade on free loopback ports, and a grpcio client generated
from the project's proto (the stub Deckard's own users would generate)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf import any_pb2

from boxqueue.facades.deckard.generated import deckard_service_pb2 as pb
from boxqueue.facades.deckard.generated import deckard_service_pb2_grpc as pb_grpc
from tests.serverproc import ServerProcess, free_port

# A space of another kind, which Flush must leave alone (K9).
KEEP_SPACE = """
[[space]]
id = 600
name = "keep"
indexes = [{ name = "pk", type = "TREE", unique = true, parts = [{ field = 0, type = "unsigned" }] }]
"""

__all__ = ["Deckard", "DeckardServer", "pb", "queue_name", "raw_any"]


def queue_name(prefix: str = "app:jobs") -> str:
    """A queue no other test uses, with Deckard's prefix convention."""
    return f"{prefix}::{uuid.uuid4().hex[:10]}"


def raw_any(type_url: str, value: bytes) -> any_pb2.Any:
    return any_pb2.Any(type_url=type_url, value=value)


class Deckard:
    """A channel and the generated stub, with a few shorthands for the tests."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 16 * 1024 * 1024)]
        )
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.stub = pb_grpc.DeckardStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def add(self, queue: str, *ids: str, **fields) -> pb.AddResponse:
        return self.stub.Add(pb.AddRequest(messages=[pb.AddMessage(id=i, queue=queue, **fields) for i in ids]))

    def pull(self, queue: str, amount: int = 1, **fields) -> list[pb.Message]:
        return list(self.stub.Pull(pb.PullRequest(queue=queue, amount=amount, **fields)).messages)

    def pull_ids(self, queue: str, amount: int = 1, **fields) -> list[str]:
        return [m.id for m in self.pull(queue, amount, **fields)]

    def ack(self, queue: str, message_id: str, **fields) -> pb.AckResponse:
        return self.stub.Ack(pb.AckRequest(queue=queue, id=message_id, **fields))

    def nack(self, queue: str, message_id: str, **fields) -> pb.AckResponse:
        return self.stub.Nack(pb.AckRequest(queue=queue, id=message_id, **fields))

    def get(self, queue: str, message_id: str) -> pb.GetByIdResponse:
        return self.stub.GetById(pb.GetByIdRequest(queue=queue, id=message_id))

    def count(self, queue: str) -> int:
        return self.stub.Count(pb.CountRequest(queue=queue)).count


@dataclass
class DeckardServer:
    """A boxqueue process serving iproto and Deckard, in a directory of its own."""

    proc: ServerProcess
    grpc_port: int

    @classmethod
    def create(cls, workdir: Path, deckard_options: str = "") -> DeckardServer:
        grpc_port = free_port()
        config = f'[deckard]\nlisten = "127.0.0.1:{grpc_port}"\n{deckard_options}\n{KEEP_SPACE}'
        return cls(ServerProcess(workdir, extra_config=config, read_only=False), grpc_port)

    def start(self) -> Deckard:
        self.proc.start()
        return Deckard(self.grpc_port)
