"""Deckard under fuzz: every method with random values in every field of its request (strings,
numbers, bytes, repeated and map fields, nested messages), random bytes as a serialized request,
and unknown methods. Every call ends with a status Deckard gives (never UNKNOWN, which is what
grpcio answers for an exception a handler let escape), and the server goes on serving."""

from __future__ import annotations

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st

from boxqueue.facades.deckard.generated import deckard_service_pb2 as pb
from tests.fuzz.conftest import SENTINEL_NAME, fuzz_settings

SERVICE = pb.DESCRIPTOR.services_by_name["Deckard"]
METHODS = {m.name: m for m in SERVICE.methods}
ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL,
           grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND,
           grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED}

text = (st.sampled_from(["", "fuzzq", "a::b", "x" * 300]) | st.text(max_size=30)).filter(lambda s: s != SENTINEL_NAME)
SCALARS = {
    FieldDescriptor.TYPE_STRING: text,
    FieldDescriptor.TYPE_BYTES: st.binary(max_size=100),
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: st.integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_DOUBLE: st.floats(),
    FieldDescriptor.TYPE_FLOAT: st.floats(width=32),
}


def message_of(descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor`` with random values in random subsets of their fields."""
    cls = pb.__dict__.get(descriptor.name) or _message_class(descriptor)

    @st.composite
    def build(draw) -> Message:
        msg = cls()
        for field in descriptor.fields:
            if not draw(st.booleans()):
                continue
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                key_type = field.message_type.fields_by_name["key"]
                value_type = field.message_type.fields_by_name["value"]
                for _ in range(draw(st.integers(0, 3))):
                    key = draw(SCALARS[key_type.type])
                    if value_type.message_type is not None:
                        getattr(msg, field.name)[key].CopyFrom(draw(any_message(value_type.message_type, depth)))
                    else:
                        getattr(msg, field.name)[key] = draw(SCALARS[value_type.type])
            elif field.message_type is not None:
                if depth > 2:
                    continue
                values = [draw(any_message(field.message_type, depth + 1))
                          for _ in range(draw(st.integers(1, 3)) if _repeated(field) else 1)]
                if _repeated(field):
                    getattr(msg, field.name).extend(values)
                else:
                    getattr(msg, field.name).CopyFrom(values[0])
            elif field.enum_type is not None:
                setattr(msg, field.name, draw(st.integers(-5, 10)))
            elif _repeated(field):
                getattr(msg, field.name).extend(draw(st.lists(SCALARS[field.type], max_size=3)))
            else:
                setattr(msg, field.name, draw(SCALARS[field.type]))
        return msg

    return build()


def _repeated(field) -> bool:
    return bool(field.is_repeated)


def any_message(descriptor, depth: int) -> st.SearchStrategy[Message]:
    if descriptor.full_name == "google.protobuf.Any":
        from google.protobuf import any_pb2

        return st.builds(lambda url, value: any_pb2.Any(type_url=url, value=value),
                         st.sampled_from(["type.googleapis.com/google.protobuf.StringValue", "x/y", ""])
                         | st.text(max_size=20), st.binary(max_size=60))
    return message_of(descriptor, depth)


def _message_class(descriptor):
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)


def call(channel: grpc.Channel, method: str, request: bytes) -> grpc.StatusCode:
    unary = channel.unary_unary(f"/{SERVICE.full_name}/{method}", request_serializer=None,
                                response_deserializer=None)
    try:
        unary(request, timeout=30)
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        return err.code()


def call_again(channel: grpc.Channel, method: str, request: bytes) -> int:
    """An example's call made again, for the memory check: one request."""
    call(channel, method, request)
    return 1


@st.composite
def method_calls(draw) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(METHODS)))
    if name == "Flush":  # disabled on the fuzz server; it would answer its refusal
        name = "Count"
    request = draw(message_of(METHODS[name].input_type))
    return name, request.SerializeToString()


@fuzz_settings(150)
@given(method_call=method_calls())
def test_random_field_values(target, memory_bounded, method_call):
    name, request = method_call
    target.replayable(lambda: call_again(target.deckard, name, request))
    status = call(target.deckard, name, request)
    assert status in ALLOWED, (name, status)
    target.check_alive()


@fuzz_settings(60)
@given(name=st.sampled_from(sorted(METHODS)) | st.text(max_size=10), data=st.binary(max_size=200))
def test_random_bytes_as_requests(target, memory_bounded, name, data):
    method = name if name != "Flush" else "Count"
    target.replayable(lambda: call_again(target.deckard, method, data))
    status = call(target.deckard, method, data)
    assert status in ALLOWED, (name, status)
    target.check_alive()


def test_the_sentinels_survive_grpc_fuzzing(target):
    target.check_sentinels()
