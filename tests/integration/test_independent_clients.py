"""The gRPC front door spoken to by clients we did not write: Node's ``@grpc/grpc-js``, Debian's
``nghttp2-client`` (``nghttp`` for frame-level checks, ``h2load`` for load) and ``curl``.

`make install` fetches grpc-js from npm and nghttp2-client with apt-get where it can; each test
says what it skips when its client is missing. The server is the real one (Deckard's listener),
plain, and with TLS and a token."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from tests.integration.deckard_fixtures import DeckardServer
from tests.integration.security_fixtures import Certs
from tests.serverproc import ROOT

NODE_MODULES = ROOT / ".venv" / "node" / "node_modules"
GRPC_JS_CLIENT = Path(__file__).with_name("node") / "grpc_js_client.js"
DECKARD_PROTO = ROOT / "proto" / "deckard_service.proto"
TOKEN = "front-door-token"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
GRPC_HEADERS = ["-H", "content-type: application/grpc", "-H", "te: trailers"]

needs_grpc_js = pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_MODULES / "@grpc" / "grpc-js").exists(),
    reason="Node.js or @grpc/grpc-js is not installed (make install fetches it from npm)")
needs_nghttp = pytest.mark.skipif(
    shutil.which("nghttp") is None or shutil.which("h2load") is None,
    reason="nghttp2-client is not installed (make install runs apt-get install nghttp2-client as root)")
needs_curl = pytest.mark.skipif(
    shutil.which("curl") is None or "HTTP2" not in subprocess.run(["curl", "--version"], capture_output=True,
                                                                 text=True).stdout,
    reason="curl with HTTP/2 is not installed")


def grpc_frame(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    server = DeckardServer.create(tmp_path_factory.mktemp("deckard-plain"))
    server.start().close()
    yield server
    assert server.proc.stop() == 0, server.proc.log()[-3000:]


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deckard-tls")
    certs = Certs.make(folder / "certs")
    server = DeckardServer.create(folder, f'token = "{TOKEN}"\n' + certs.tls_section("deckard", client_certs=False))
    server.proc.start()
    yield server, certs
    assert server.proc.stop() == 0, server.proc.log()[-3000:]


@pytest.fixture(scope="module")
def bodies(tmp_path_factory) -> dict[str, Path]:
    """Request bodies as files (for nghttp, h2load and curl), and the descriptors of health and
    reflection for grpc-js."""
    folder = tmp_path_factory.mktemp("bodies")
    files = {
        "health": grpc_frame(health_pb2.HealthCheckRequest(service="").SerializeToString()),
        "reflection": grpc_frame(reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="blipai.deckard.Deckard").SerializeToString()),
    }
    paths = {}
    for name, data in files.items():
        paths[name] = folder / f"{name}.bin"
        paths[name].write_bytes(data)
    descriptors = descriptor_pb2.FileDescriptorSet()
    for module in (health_pb2, reflection_pb2):
        module.DESCRIPTOR.CopyToProto(descriptors.file.add())
    paths["descriptors"] = folder / "standard.desc"
    paths["descriptors"].write_bytes(descriptors.SerializeToString())
    return paths


def run_grpc_js(port: int, descriptors: Path, ca_file: Path | None = None, token: str = "") -> dict:
    args = ["node", str(GRPC_JS_CLIENT), str(port), str(descriptors), str(DECKARD_PROTO), str(ca_file or ""), token]
    env = {"NODE_PATH": str(NODE_MODULES), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def check_deckard_scenario(out: dict) -> None:
    """What grpcio sees in tests/integration/test_deckard.py, seen by grpc-js."""
    assert out["add"] == {"ok": {"created_count": "2", "updated_count": "0"}}
    assert out["count"] == {"ok": {"count": "2"}}
    found = out["get_by_id"]["ok"]
    assert found["found"] and found["message"]["id"] == "b" and found["message"]["metadata"] == {"k": "v"}
    payload = found["message"]["payload"]["p"]
    assert payload["type_url"] == "type.googleapis.com/google.protobuf.StringValue"
    assert bytes(payload["value"]["data"]) == b"\x0a\x02hi"
    assert [m["id"] for m in out["pull_first"]["ok"]["messages"]] == ["a"]
    assert out["pull_first"]["ok"]["messages"][0]["string_payload"] == "one"
    assert out["ack"] == {"ok": {"success": True, "removal_response": None}}
    assert [m["id"] for m in out["pull_second"]["ok"]["messages"]] == ["b"]
    assert out["nack"]["ok"]["success"] is True
    assert out["remove"]["ok"]["storageRemoved"] == "2"
    assert out["edit_queue"]["ok"]["success"] is True
    assert out["get_queue"]["ok"]["configuration"] == {"max_elements": "5"}
    assert out["invalid"]["code"] == 3 and out["invalid"]["details"].startswith("invalid ")  # INVALID_ARGUMENT
    assert out["big_add"]["ok"]["created_count"] == "1"
    assert out["big_pull"] == {"ok": [1 << 20]}
    assert out["gzip_count"] == {"ok": {"count": "1"}}  # the request compressed by grpc-js
    assert out["flush"] == {"ok": {"success": True}}
    assert out["unknown"] == {"code": 12}  # UNIMPLEMENTED
    assert out["health"] == {"ok": {"status": "SERVING"}}
    assert out["health_unknown"]["code"] == 5  # NOT_FOUND
    assert out["watch"] == {"ok": {"status": "SERVING"}}
    services = ["blipai.deckard.Deckard", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection"]
    assert out["reflection_v1alpha"] == {"ok": services}
    assert out["reflection_v1"] == {"ok": services}


@needs_grpc_js
def test_grpc_js_calls_every_deckard_method_health_and_reflection(plain, bodies):
    check_deckard_scenario(run_grpc_js(plain.grpc_port, bodies["descriptors"]))


@needs_grpc_js
def test_grpc_js_over_tls_with_a_token(secured, bodies):
    server, certs = secured
    out = run_grpc_js(server.grpc_port, bodies["descriptors"], certs.ca_file, TOKEN)
    check_deckard_scenario(out)
    assert out["no_token"]["code"] == 16  # UNAUTHENTICATED; health needed none


def nghttp(port: int, path: str, body: Path, *options: str) -> tuple[int, str, bytes]:
    """One POST by nghttp: its exit code, its frame log (-v) and the answer's body."""
    url = f"http://127.0.0.1:{port}{path}"
    verbose = subprocess.run(["nghttp", "-v", *options, "-d", str(body), *GRPC_HEADERS, url],
                             capture_output=True, timeout=60)
    quiet = subprocess.run(["nghttp", *options, "-d", str(body), *GRPC_HEADERS, url], capture_output=True, timeout=60)
    return verbose.returncode, verbose.stdout.decode("latin-1") + verbose.stderr.decode("latin-1"), quiet.stdout


SERVING = grpc_frame(health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING).SerializeToString())


@needs_nghttp
def test_nghttp_with_no_dynamic_table(plain, bodies):
    """``-c 0``: nghttp's decoder shrinks its table to nothing and needs a table size update at
    the start of our first head (it failed the call with COMPRESSION_ERROR without one)."""
    code, log, body = nghttp(plain.grpc_port, HEALTH_CHECK, bodies["health"], "-c", "0")
    assert code == 0, log
    assert "grpc-status: 0" in log and "COMPRESSION_ERROR" not in log and "PROTOCOL_ERROR" not in log
    assert body == SERVING


@needs_nghttp
def test_nghttp_with_a_head_over_continuation_frames(plain, bodies):
    """``--continuation``: a head too large for one frame, in CONTINUATION frames; it is decoded
    and the call refused for its metadata (over Deckard's 8 KiB), as grpcio answers it."""
    code, log, _ = nghttp(plain.grpc_port, HEALTH_CHECK, bodies["health"], "--continuation")
    assert code == 0, log
    heads = [int(n) for n in re.findall(r"send HEADERS frame <length=(\d+)", log)]
    assert heads and max(heads) > 16384  # our SETTINGS_MAX_FRAME_SIZE: nghttp2 sends the rest in CONTINUATION
    assert "grpc-status: 8" in log and "metadata" in log  # RESOURCE_EXHAUSTED


@needs_nghttp
def test_nghttp_with_windows_of_seven_bytes(plain, bodies):
    """``-w 3``: a stream window of 7 bytes; reflection's 3 KiB answer comes in frames of at most
    7 bytes, as nghttp's window updates allow."""
    code, log, body = nghttp(plain.grpc_port, REFLECTION, bodies["reflection"], "-w", "3")
    assert code == 0, log
    data = [int(n) for n in re.findall(r"recv DATA frame <length=(\d+)", log)]
    assert len(data) > 100 and max(data) <= 7
    assert "grpc-status: 0" in log
    answer = reflection_pb2.ServerReflectionResponse.FromString(body[5:])
    assert len(body) == 5 + int.from_bytes(body[1:5], "big")
    assert answer.file_descriptor_response.file_descriptor_proto  # Deckard's descriptor


@needs_nghttp
def test_h2load_runs_health_checks_without_errors(plain, bodies):
    """A load run (10 connections x 10 streams): every request answered, none failed; the
    figures go to docs/performance.md (the run there is longer)."""
    proc = subprocess.run(["h2load", "-n", "5000", "-c", "10", "-m", "10", "-d", str(bodies["health"]), *GRPC_HEADERS,
                           f"http://127.0.0.1:{plain.grpc_port}{HEALTH_CHECK}"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5000 succeeded, 0 failed, 0 errored, 0 timeout" in proc.stdout, proc.stdout
    assert "status codes: 5000 2xx" in proc.stdout, proc.stdout


@needs_curl
def test_curl_with_prior_knowledge(plain, bodies, tmp_path):
    answer = tmp_path / "answer.bin"
    proc = subprocess.run(["curl", "-sS", "-v", "--http2-prior-knowledge", "-X", "POST", *GRPC_HEADERS,
                           "--data-binary", f"@{bodies['health']}", "-o", str(answer),
                           f"http://127.0.0.1:{plain.grpc_port}{HEALTH_CHECK}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "< HTTP/2 200" in proc.stderr and "< grpc-status: 0" in proc.stderr
    assert answer.read_bytes() == SERVING
