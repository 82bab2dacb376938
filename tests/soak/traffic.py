"""Traffic of every API for the soak tests: each class drives one API with its real clients.

A traffic's :meth:`block` sends one block of requests of every kind its API has (good ones,
refused ones and malformed ones) and returns how many requests it made; the soak runs blocks of
every API in turn and reads the server's memory between them. Names that a client chooses
(queues, tubes, projects) are rotated and their data removed at the end of each block, so the
server's stored data stays the same size and any growth is memory the server kept.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import socket
import struct
import uuid
from typing import Any, ClassVar

import grpc
import httpx
import msgpack
import pytest
import tarantool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from websockets.exceptions import ConnectionClosedOK
from websockets.sync.client import connect as ws_connect

from boxqueue.facades.deckard.generated import deckard_service_pb2 as pb
from boxqueue.facades.deckard.generated import deckard_service_pb2_grpc as pb_grpc

SOAK_SPACE = 512
USER, PASSWORD = "soaker", "soak-secret"
CLIENT_ID = "3381af92-2b9e-11e3-b191-71861300734c"

# The server the soak runs against: a test space, box.queue's space 0, a user with a password,
# and every listener (iproto, read-only, console, Deckard, Zaqar, Sonya, metrics).
SOAK_CONFIG = """
[guest]
grants = [{ privileges = ["read", "write", "execute"], object_type = "universe" }]

[[users]]
name = "soaker"
password = "soak-secret"
grants = [{ privileges = ["read", "write", "execute"], object_type = "universe" }]

[[space]]
id = 512
name = "soak"
format = [{ name = "id", type = "unsigned" }, { name = "v", type = "any", is_nullable = true }]
indexes = [
  { name = "pk", type = "TREE", unique = true, parts = [{ field = 0, type = "unsigned" }] },
  { name = "by_v", type = "TREE", unique = false, parts = [{ field = 1, type = "scalar", is_nullable = true }] },
]
"""

# -- iproto frames ----------------------------------------------------------------------------------

SELECT, INSERT, REPLACE, UPDATE, DELETE, AUTH, EVAL, UPSERT, CALL, PING, ID = 1, 2, 3, 4, 5, 7, 8, 9, 10, 64, 73


def frame(request_type: int, body: dict[int, Any] | None = None, sync: int = 1) -> bytes:
    payload = msgpack.packb({0: request_type, 1: sync})
    if body is not None:
        payload += msgpack.packb(body)
    return msgpack.packb(len(payload)) + payload


def raw_frame(payload: bytes) -> bytes:
    return msgpack.packb(len(payload)) + payload


def scramble(salt: bytes, password: str) -> bytes:
    """chap-sha1, as the connectors compute it."""
    hash1 = hashlib.sha1(password.encode()).digest()
    hash2 = hashlib.sha1(hash1).digest()
    step = hashlib.sha1(salt[:20] + hash2).digest()
    return bytes(a ^ b for a, b in zip(hash1, step, strict=True))


def auth_frame(salt: bytes, user: str, password: str, sync: int = 1) -> bytes:
    return frame(AUTH, {0x23: user, 0x21: ["chap-sha1", scramble(salt, password)]}, sync)


class RawIproto:
    """A blocking iproto connection that sends prepared frames and counts the answers."""

    def __init__(self, port: int, timeout: float = 30.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        greeting = self._exactly(128)
        self.salt = base64.b64decode(greeting[64:128].strip())
        self._buf = b""

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            data += chunk
        return data

    def exchange(self, data: bytes, answers: int) -> list[int]:
        """Send ``data`` and read ``answers`` answers; returns their codes (0 = ok)."""
        self.sock.sendall(data)
        codes = []
        buf = self._buf
        while len(codes) < answers:
            while len(buf) >= 5:
                if buf[0] != 0xCE:
                    raise AssertionError(f"bad answer prefix {buf[:5]!r}")
                (length,) = struct.unpack_from(">I", buf, 1)
                if len(buf) < 5 + length:
                    break
                # The server's header map is fixed-width (see the codec): its code is the uint32
                # after 0x83 0x00 0xCE, at offset 8.
                (code,) = struct.unpack_from(">I", buf, 8)
                codes.append(code)
                buf = buf[5 + length:]
                if len(codes) == answers:
                    break
            if len(codes) == answers:
                break
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError(f"closed after {len(codes)} of {answers} answers")
            buf += chunk
        self._buf = buf
        return codes

    def finish(self) -> bytes:
        """Half-close and read whatever is left until the server closes."""
        self.sock.shutdown(socket.SHUT_WR)
        rest = b""
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:
                break
            if not chunk:
                break
            rest += chunk
        self.sock.close()
        return rest

    def close(self) -> None:
        self.sock.close()


class Traffic:
    name = "?"

    def setup(self) -> None:
        """Make what the blocks need (once, before the warm-up)."""

    def block(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        """Drop the clients (the server must give back what they held)."""


class IprotoIdChurn(Traffic):
    """The issue's load: connections that each send many ID requests, then close."""

    name = "iproto-id"

    def __init__(self, port: int, connections: int = 20, requests: int = 1000) -> None:
        self.port = port
        self.connections = connections
        self.requests = requests
        self.batch = b"".join(frame(ID, {0x54: 3, 0x55: [0, 1, 2, 3]}, sync) for sync in range(requests))

    def block(self) -> int:
        for _ in range(self.connections):
            conn = RawIproto(self.port)
            codes = conn.exchange(self.batch, self.requests)
            assert not any(codes), "an ID request failed"
            conn.close()
        return self.connections * self.requests


class IprotoChurn(Traffic):
    """Connection churn with every request type, good and bad, pipelined on raw sockets, and the
    ``tarantool`` connector connecting (greeting, ID, AUTH) and leaving."""

    name = "iproto"

    def __init__(self, port: int, ro_port: int, connections: int = 12, repeat: int = 20) -> None:
        self.port = port
        self.ro_port = ro_port
        self.connections = connections
        self.repeat = repeat
        self.keys = itertools.count()
        self.blocks = itertools.count()
        self.tubes: list[str] = []

    def _mix(self, salt: bytes, base: int) -> tuple[bytes, int, int]:
        """One connection's pipelined mix: (frames, how many, how many must succeed)."""
        frames: list[bytes] = [
            frame(ID, {0x54: 3, 0x55: [0, 1, 2, 3]}),
            auth_frame(salt, USER, "wrong password"),  # ER_CREDS_MISMATCH
            auth_frame(salt, "nobody", PASSWORD),  # unknown user
            auth_frame(salt, USER, PASSWORD),
        ]
        good = 2
        for i in range(self.repeat):
            key = base + i
            tube = self.tubes[i % len(self.tubes)]
            frames += [
                frame(PING),
                frame(REPLACE, {0x10: SOAK_SPACE, 0x21: [key, f"value {key}"]}),
                frame(SELECT, {0x10: SOAK_SPACE, 0x11: 0, 0x12: 10, 0x13: 0, 0x14: 0, 0x20: [key]}),
                frame(SELECT, {0x10: SOAK_SPACE, 0x11: 1, 0x12: 5, 0x13: 0, 0x14: 0, 0x20: []}),
                frame(UPDATE, {0x10: SOAK_SPACE, 0x11: 0, 0x20: [key], 0x21: [["=", 1, i]]}),
                frame(UPSERT, {0x10: SOAK_SPACE, 0x21: [key, 0], 0x28: [["+", 1, 1]]}),
                frame(INSERT, {0x10: SOAK_SPACE, 0x21: [key, "dup"]}),  # duplicate key
                frame(CALL, {0x22: "box.info", 0x21: []}),
                frame(CALL, {0x22: "box.queue.put", 0x21: [0, tube, 0, 60, 60, 0, "t"]}),
                frame(CALL, {0x22: "box.queue.take", 0x21: [0, tube, 0]}),  # released at disconnect
                frame(CALL, {0x22: "box.queue.statistics", 0x21: [0, tube]}),
                frame(CALL, {0x22: "no.such.function", 0x21: []}),
                frame(CALL, {0x22: "box.queue.put", 0x21: ["not a space"]}),  # bad arguments
                frame(EVAL, {0x27: "return ...", 0x21: [key, "x"]}),
                frame(EVAL, {0x27: "error('soak')", 0x21: []}),
                frame(EVAL, {0x27: "return box.space.soak:get{...}", 0x21: [key]}),
                frame(EVAL, {0x27: "syntax error here", 0x21: []}),
                frame(DELETE, {0x10: SOAK_SPACE, 0x11: 0, 0x20: [key]}),
                frame(SELECT, {0x10: 9999, 0x20: []}),  # no such space
                frame(0x77, {}),  # unknown request type
                raw_frame(msgpack.packb({0: SELECT, 1: 5}) + msgpack.packb([1, 2])),  # body not a map
                raw_frame(b"\x91\x01"),  # header not a map
                raw_frame(msgpack.packb({0: PING, 1: 6}) + b"\xc1"),  # invalid msgpack
                frame(REPLACE, {0x10: SOAK_SPACE, 0x21: "not an array"}),
            ]
            good += 12  # ping, replace, 2 selects, update, upsert, box.info, put, take, statistics, 2 evals, delete
        # the takes left on this session are released when it closes
        return b"".join(frames), len(frames), good

    def block(self) -> int:
        done = 0
        block = next(self.blocks)
        self.tubes = [f"soak-{block}-{k}" for k in range(3)]  # new tubes each block, emptied after
        for n in range(self.connections):
            conn = RawIproto(self.port)
            data, count, good = self._mix(conn.salt, next(self.keys) * 1000)
            codes = conn.exchange(data, count)
            ok = sum(1 for c in codes if c == 0)
            assert ok >= good, f"only {ok} of {count} requests succeeded, {good} should have"
            done += count
            if n % 3 == 0:
                # End with a fatal frame (a bad length prefix): answered, then closed by the server.
                conn.sock.sendall(b"\xc1")
                conn.finish()
                done += 1
            else:
                conn.close()
        # The read-only port: reads served, writes refused.
        conn = RawIproto(self.ro_port)
        codes = conn.exchange(frame(SELECT, {0x10: SOAK_SPACE, 0x12: 5, 0x20: []}) +
                              frame(REPLACE, {0x10: SOAK_SPACE, 0x21: [1, "x"]}), 2)
        assert codes[0] == 0 and codes[1] != 0
        conn.close()
        done += 2
        # The connector: greeting, ID, AUTH, a few requests, gone.
        for n in range(4):
            c = tarantool.Connection("127.0.0.1", self.port, user=USER, password=PASSWORD)
            c.ping()
            c.select(SOAK_SPACE, [], limit=3)
            c.call("box.session.id")
            if n == 3:  # the tasks the raw sessions took are ready again once those sessions end
                for tube in self.tubes:
                    c.call("box.queue.truncate", 0, tube)
                    done += 1
            c.close()
            done += 5
        return done


class IprotoPipelined(Traffic):
    """Long-lived connections with deep pipelines of the common requests (the bulk of requests)."""

    name = "iproto-pipelined"

    def __init__(self, port: int, connections: int = 4, requests: int = 5000) -> None:
        self.port = port
        self.n = connections
        self.requests = requests
        self.conns: list[RawIproto] = []
        shapes = [
            lambda i: frame(PING, sync=i),
            lambda i: frame(SELECT, {0x10: SOAK_SPACE, 0x11: 0, 0x12: 1, 0x14: 0, 0x20: [i % 500]}, i),
            lambda i: frame(REPLACE, {0x10: SOAK_SPACE, 0x21: [i % 500, i]}, i),
            lambda i: frame(CALL, {0x22: "box.session.id", 0x21: []}, i),
            lambda i: frame(EVAL, {0x27: "return ...", 0x21: [i]}, i),
            lambda i: frame(SELECT, {0x10: 424242, 0x20: []}, i),  # error answers
        ]
        self.batch = b"".join(shapes[i % len(shapes)](i) for i in range(requests))

    def setup(self) -> None:
        self.conns = [RawIproto(self.port) for _ in range(self.n)]

    def block(self) -> int:
        for conn in self.conns:
            conn.sock.sendall(self.batch)
        for conn in self.conns:
            codes = conn.exchange(b"", self.requests)
            assert sum(1 for c in codes if c) == self.requests // 6
        return self.n * self.requests

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


class Console(Traffic):
    """Admin console sessions: statements, errors and garbage lines, then gone."""

    name = "console"
    LINES: ClassVar[list[str]] = [
        "return 1",
        "box.space.soak:select({}, {limit = 2})",
        "box.space.soak:replace{900001, 'from the console'}",
        "box.space.soak:delete{900001}",
        "error('console soak')",
        "local t = {} for i = 1, 200 do t[i] = string.rep('x', i) end return #t",
        "box.info.status",
        "box.stat()",
        "this is not lua",
        "box.queue.statistics(0)",
        "\\set language lua",
    ]

    def __init__(self, port: int, sessions: int = 6) -> None:
        self.port = port
        self.sessions = sessions

    def block(self) -> int:
        done = 0
        for _ in range(self.sessions):
            with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
                buf = b""
                while len(buf) < 128:
                    buf += s.recv(128 - len(buf))
                for line in self.LINES:
                    s.sendall(line.encode() + b"\n")
                    answer = b""
                    while not answer.endswith(b"\n...\n"):
                        chunk = s.recv(65536)
                        assert chunk, "the console closed"
                        answer += chunk
                    assert answer.startswith(b"---"), answer
                    done += 1
        return done


class HttpTraffic(Traffic):
    """An HTTP API's traffic: a new client (so a new connection) each block, kept alive through it."""

    headers: ClassVar[dict[str, str]] = {}

    def __init__(self, port: int, cycles: int) -> None:
        self.port = port
        self.cycles = cycles
        self.names = itertools.count()  # queue names, new in every cycle
        self.client: httpx.Client | None = None

    def new_client(self) -> httpx.Client:
        self.close()
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30, headers=self.headers)
        return self.client

    @staticmethod
    def answered(responses: list[httpx.Response]) -> int:
        """Every response is an answer (no 5xx); how many there were."""
        for r in responses:
            assert r.status_code < 500, (r.request.method, r.request.url, r.status_code, r.text[:300])
        return len(responses)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


class Zaqar(HttpTraffic):
    """Zaqar v1.1: a queue's whole life (metadata, messages, claims, stats, deletes), errors,
    msgpack bodies, pools and flavors."""

    name = "zaqar"
    headers: ClassVar[dict[str, str]] = {"Client-ID": CLIENT_ID, "X-Project-Id": "soak"}

    def block(self) -> int:
        done = 0
        z = self.new_client()
        for _ in range(self.cycles):
            q = f"/v1.1/queues/soak-{next(self.names)}"
            responses = [
                z.get("/v1.1/ping"), z.get("/v1.1/health"), z.get("/v1.1/"),
                z.put(q, json={"purpose": "soak"}),
                z.get(f"{q}/metadata"),
                z.put(f"{q}/metadata", json={"purpose": "soak again"}),
                z.post(f"{q}/messages", json={"messages": [{"ttl": 300, "body": {"n": i}} for i in range(5)]}),
                z.post(f"{q}/messages", content=msgpack.packb({"messages": [{"ttl": 300, "body": "packed"}]}),
                       headers={"Content-Type": "application/x-msgpack", "Accept": "application/x-msgpack"}),
                z.get(f"{q}/messages", params={"echo": "true", "include_claimed": "true"}),
                z.get(f"{q}/stats"),
                z.get("/v1.1/queues", params={"detailed": "true"}),
            ]
            posted = responses[6].json()["resources"]
            first = posted[0].rsplit("/", 1)[-1]
            claim = z.post(f"{q}/claims", params={"limit": 3}, json={"ttl": 60, "grace": 60})
            responses.append(claim)
            claim_href = claim.headers["location"]
            claimed = claim.json()["messages"] if claim.status_code == 201 else []
            responses += [
                z.get(claim_href), z.patch(claim_href, json={"ttl": 120}),
                z.get(f"{q}/messages/{first}"),
                z.get(f"{q}/messages", params={"ids": first}),
            ]
            for message in claimed[:2]:
                responses.append(z.delete(message["href"]))
            responses += [
                z.delete(claim_href),
                z.delete(f"{q}/messages", params={"pop": 2}),
                z.delete(f"{q}/messages", params={"ids": first}),
                # refused: bad bodies, unknown messages and claims, bad headers, unknown paths
                z.post(f"{q}/messages", content=b"{not json", headers={"Content-Type": "application/json"}),
                z.post(f"{q}/messages", json={"messages": [{"ttl": 1, "body": 1}]}),
                z.get(f"{q}/messages/{uuid.uuid4().hex}"),
                z.get(f"{q}/claims/{uuid.uuid4().hex}"),
                z.get(f"{q}/messages", headers={"Client-ID": "not-a-uuid"}),
                z.get(f"/v1.1/queues/{'x' * 80}/messages"),
                z.get("/v1.1/no/such/path"),
                z.request("PATCH", "/v1.1/queues"),
                z.delete(q),
                # pools and flavors, by fixed names
                z.put("/v1.1/pools/soakpool", json={"weight": 10, "uri": "boxqueue://soak_pool"}),
                z.put("/v1.1/flavors/soakflavor", json={"pool": "soakpool", "capabilities": {}}),
                z.get("/v1.1/flavors/soakflavor"), z.get("/v1.1/pools", params={"detailed": "true"}),
                z.delete("/v1.1/flavors/soakflavor"), z.delete("/v1.1/pools/soakpool"),
            ]
            done += self.answered(responses)
        return done


class Sonya(HttpTraffic):
    """Sonya: queues created, sent to, listened to by long-poll and WebSocket (subscribed and
    unsubscribed), deleted and closed; refused inputs."""

    name = "sonya"

    def block(self) -> int:
        done = 0
        s = self.new_client()
        for _ in range(self.cycles):
            q = f"soak-{next(self.names)}"
            responses = [s.post(f"/queue/create/{q}")]
            for i in range(4):
                responses.append(s.post(f"/queue/send/{q}", json={"id": f"k{i % 2}", "payload": {"n": i}}))
            responses += [
                s.get(f"/queue/listen/longpoll/{q}/k0", params={"sequence": "first"}),
                s.get(f"/queue/listen/longpoll/{q}", params={"sequence": "last"}),
                s.post(f"/queue/send/{q}", content=b"{bad", headers={"Content-Type": "application/json"}),
                s.post(f"/queue/send/{q}", content=b"x", headers={"Content-Type": "text/plain"}),
                s.get("/queue/listen/longpoll/no-such-queue-soak"),
                s.get(f"/queue/send/{q}"),  # wrong method
            ]
            for path in (f"/queue/listen/ws/{q}/k1?sequence=first", f"/queue/listen/ws/{q}?sequence=1"):
                with ws_connect(f"ws://127.0.0.1:{self.port}{path}", open_timeout=30) as ws:
                    first = json.loads(ws.recv(timeout=30))
                    assert "sequence" in first
                    ws.ping()
                done += 1
            # a listener left waiting when the queue goes away: closed by the server with 1000
            with ws_connect(f"ws://127.0.0.1:{self.port}/queue/listen/ws/{q}", open_timeout=30) as ws:
                responses += [s.post(f"/queue/delete/{q}/k0"), s.post(f"/queue/close/{q}")]
                with pytest.raises(ConnectionClosedOK):
                    while True:
                        ws.recv(timeout=30)
            done += 1 + self.answered(responses)
        return done


class Deckard(Traffic):
    """Deckard: every method on rotating queues (left empty), limits on fixed queues, refused
    requests, health and reflection; a new channel (connection) each block."""

    name = "deckard"

    def __init__(self, port: int, cycles: int = 6) -> None:
        self.target = f"127.0.0.1:{port}"
        self.cycles = cycles
        self.names = itertools.count()

    def block(self) -> int:
        done = 0
        with grpc.insecure_channel(self.target) as channel:
            stub = pb_grpc.DeckardStub(channel)
            for c in range(self.cycles):
                q = f"soak-{next(self.names)}"
                stub.Add(pb.AddRequest(messages=[
                    pb.AddMessage(id=f"m{i}", queue=q, string_payload="payload", ttl_minutes=5,
                                  metadata={"k": "v"}, description="soak") for i in range(4)]), timeout=30)
                pulled = stub.Pull(pb.PullRequest(queue=q, amount=3, ack_deadline_ms=60_000), timeout=30)
                assert len(pulled.messages) == 3
                m0, m1, m2 = pulled.messages
                stub.Ack(pb.AckRequest(queue=q, id=m0.id, removeMessage=True), timeout=30)
                stub.Ack(pb.AckRequest(queue=q, id=m1.id, breakpoint="b", lock_ms=10), timeout=30)
                stub.Nack(pb.AckRequest(queue=q, id=m2.id), timeout=30)
                stub.Count(pb.CountRequest(queue=q), timeout=30)
                stub.GetById(pb.GetByIdRequest(queue=q, id="m3"), timeout=30)
                stub.GetById(pb.GetByIdRequest(queue=q, id="absent"), timeout=30)
                limited = f"soak-limited-{c % 3}"
                stub.EditQueue(pb.EditQueueRequest(queue=limited, configuration=pb.QueueConfiguration(
                    max_elements=10)), timeout=30)
                stub.GetQueue(pb.GetQueueRequest(queue=limited), timeout=30)
                stub.Remove(pb.RemoveRequest(queue=q, ids=["m0", "m1", "m2", "m3"]), timeout=30)
                stub.Count(pb.CountRequest(queue=q), timeout=30)
                done += 12
                for bad in (pb.AddRequest(messages=[pb.AddMessage(id="", queue=q)]),):
                    try:
                        stub.Add(bad, timeout=30)
                    except grpc.RpcError as err:
                        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                    done += 1
                try:
                    stub.Ack(pb.AckRequest(queue="", id="x"), timeout=30)
                except grpc.RpcError as err:
                    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                done += 1
            assert stub.Flush(pb.FlushRequest(), timeout=30).success  # every Deckard queue emptied
            done += 1
            unknown = channel.unary_unary("/blipai.deckard.Deckard/NoSuchMethod")
            try:
                unknown(b"", timeout=30)
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.UNIMPLEMENTED
            undecodable = channel.unary_unary("/blipai.deckard.Deckard/Add")
            try:
                undecodable(b"\xff\xff\xff", timeout=30)
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.INTERNAL
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=30).status == 1
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            answers = list(reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30))
            assert answers
            done += 4
        return done


class QueueModule(Traffic):
    """tarantool/queue's API: a tube of each type made and dropped every block, the verbs on it,
    its errors, a session's takes kept across a reconnect by ``queue.identify``, an
    ``on_task_change`` callback from Lua."""

    name = "queue-module"
    KINDS = ("fifo", "fifottl", "limfifottl", "utubettl")

    def __init__(self, port: int, cycles: int = 10) -> None:
        self.port = port
        self.cycles = cycles
        self.blocks = itertools.count()

    @staticmethod
    def _refused(conn: tarantool.Connection, name: str, *args: Any) -> int:
        try:
            conn.call(name, *args)
        except tarantool.DatabaseError:
            return 1
        raise AssertionError(f"{name}{args} was not refused")

    def block(self) -> int:
        block = next(self.blocks)
        done = 0
        c = tarantool.Connection("127.0.0.1", self.port)
        c.call("queue.cfg", {"ttr": 30})  # a session without connections keeps its takes 30 s
        tubes = []
        for kind in self.KINDS:
            name = f"qm_{block}_{kind}"
            done += self._refused(c, "queue.create_tube", name, kind, {"capacity": 100})  # created; not encodable
            tubes.append(name)
        c.eval("seen_changes = 0; queue.tube[...]:on_task_change(function() seen_changes = seen_changes + 1 end)",
               tubes[0])
        done += 2
        for name in tubes:
            q = f"queue.tube.{name}:"
            for i in range(self.cycles):
                c.call(q + "put", f"task {i}", {"utube": str(i % 3), "pri": i % 2})
                [task] = c.call(q + "take", 0).data
                c.call(q + "ack", task[0])
                done += 3
            c.call(q + "put", "b")
            [task] = c.call(q + "take", 0).data
            c.call(q + "release", task[0])
            c.call(q + "bury", task[0])
            assert c.call(q + "kick", 5).data == [1]
            c.call(q + "peek", task[0])
            c.call(q + "delete", task[0])
            c.call("queue.statistics", name)
            done += 9
            done += self._refused(c, q + "peek", 10**6)
            done += self._refused(c, q + "ack", 10**6)
            done += self._refused(c, q + "put")
        # a session's take, kept across a reconnect and acked by the identified connection
        raw = tarantool.Connection("127.0.0.1", self.port, encoding=None)
        session = raw.call("queue.identify").data[0]
        raw.call(f"queue.tube.{tubes[1]}:put", "kept")
        [task] = raw.call(f"queue.tube.{tubes[1]}:take", 0).data
        raw.close()
        again = tarantool.Connection("127.0.0.1", self.port, encoding=None)
        assert again.call("queue.identify", session).data == [session]
        again.call(f"queue.tube.{tubes[1]}:ack", task[0])
        again.close()
        done += 6
        for name in tubes:
            assert c.call(f"queue.tube.{name}:drop").data == [True]
            done += 1
        c.call("queue.cfg", {"ttr": 0})
        done += self._refused(c, "queue.tube.no_such_tube:put", 1)
        c.close()
        return done + 2


class Metrics(Traffic):
    """Scrapes of /metrics, the dashboard's page, snapshot and one event of its stream."""

    name = "metrics"

    def __init__(self, port: int, scrapes: int = 3) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.scrapes = scrapes

    def block(self) -> int:
        done = 0
        with httpx.Client(base_url=self.base, timeout=30) as m:
            for _ in range(self.scrapes):
                for path in ("/metrics", "/api/snapshot", "/", "/no/such/page"):
                    r = m.get(path)
                    assert r.status_code < 500, (path, r.status_code)
                    done += 1
                with m.stream("GET", "/api/events") as events:
                    for line in events.iter_lines():
                        if line.startswith("data:"):
                            break
                done += 1
        return done
