"""TLS and authentication on the facades, with their real clients: Zaqar (httpx; token auth as
Zaqar behind Keystone), Sonya (httpx and websockets over wss, client certificates), Deckard
(grpcio with TLS and a bearer token as call credentials). Certificates are made at run time."""

from __future__ import annotations

import json
import os
import ssl
import subprocess

import grpc
import httpx
import pytest
import websockets.sync.client as ws_client
from grpc_health.v1 import health_pb2, health_pb2_grpc

from boxqueue.facades.deckard.generated import deckard_service_pb2 as pb
from boxqueue.facades.deckard.generated import deckard_service_pb2_grpc as pb_grpc
from tests.integration.security_fixtures import Certs
from tests.serverproc import ROOT, ServerProcess, free_port

CLIENT = "3381af92-2b9e-11e3-b191-71861300734c"
DECKARD_TOKEN = "deckard-secret-0123"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return Certs.make(tmp_path_factory.mktemp("certs"))


class Secured:
    """Zaqar with token auth over TLS (server certificate only), Sonya over TLS with client
    certificates, Deckard over TLS with client certificates and a token."""

    def __init__(self, workdir, certs: Certs) -> None:
        self.certs = certs
        self.zaqar_port, self.sonya_port, self.grpc_port = free_port(), free_port(), free_port()
        config = (
            f'[zaqar]\nlisten = "127.0.0.1:{self.zaqar_port}"\nauth = "token"\n'
            'tokens = [{ token = "tok-p1", project = "p1" }, { token = "tok-p2", project = "p2" },\n'
            '  { token = "tok-ops", project = "ops", admin = true }]\n'
            + certs.tls_section("zaqar", client_certs=False)
            + f'[sonya]\nlisten = "127.0.0.1:{self.sonya_port}"\n'
            + certs.tls_section("sonya")
            + f'[deckard]\nlisten = "127.0.0.1:{self.grpc_port}"\ntoken = "{DECKARD_TOKEN}"\n'
            + certs.tls_section("deckard")
        )
        self.proc = ServerProcess(workdir, extra_config=config, read_only=False)

    def zaqar(self, token: str | None = "tok-p1", **headers: str) -> httpx.Client:
        h = {"Client-ID": CLIENT, **headers}
        if token is not None:
            h["X-Auth-Token"] = token
        verify = ssl.create_default_context(cafile=str(self.certs.ca_file))
        return httpx.Client(base_url=f"https://127.0.0.1:{self.zaqar_port}", headers=h, verify=verify, timeout=30)

    def sonya(self, cert: bool = True) -> httpx.Client:
        return httpx.Client(base_url=f"https://127.0.0.1:{self.sonya_port}",
                            verify=self.certs.client_context(cert=cert), timeout=30)

    def grpc_channel(self, *, token: str | None = DECKARD_TOKEN, client_cert: bool = True) -> grpc.Channel:
        ca = self.certs.ca_file.read_bytes()
        if client_cert:
            creds = grpc.ssl_channel_credentials(ca, self.certs.client_key.read_bytes(), self.certs.client_cert.read_bytes())
        else:
            creds = grpc.ssl_channel_credentials(ca)
        if token is not None:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
        return grpc.secure_channel(f"127.0.0.1:{self.grpc_port}", creds)


@pytest.fixture(scope="module")
def secured(tmp_path_factory, certs):
    s = Secured(tmp_path_factory.mktemp("secured"), certs)
    s.proc.start()
    yield s
    s.proc.stop()


# -- Zaqar ------------------------------------------------------------------------------------


def test_zaqar_without_a_token_is_401_as_keystone_says(secured):
    for token in (None, "", "tok-p3", "tok-p1x", "TOK-P1", "tok-p"):
        with secured.zaqar(token=token, **{"X-Project-Id": "p1"}) as z:
            r = z.get("/v1.1/queues")
            assert r.status_code == 401, (token, r.text)
            assert r.json() == {"error": {"code": 401, "title": "Unauthorized",
                                          "message": "The request you have made requires authentication."}}
            assert r.headers["www-authenticate"].startswith("Keystone uri=")
            assert z.get("/").status_code == 401  # the middleware is in front of everything
            assert z.put("/v1.1/queues/nope").status_code == 401


def test_zaqar_token_fixes_the_project(secured):
    with secured.zaqar("tok-p1") as p1, secured.zaqar("tok-p2") as p2:
        assert p1.put("/v1.1/queues/shared_name").status_code in (201, 204)
        assert p1.post("/v1.1/queues/shared_name/messages", json={"messages": [{"ttl": 60, "body": "for p1"}]}).status_code == 201
        # no X-Project-Id: the token's project; p2 sees its own (empty) namespace
        assert [m["body"] for m in p1.get("/v1.1/queues/shared_name/messages?echo=true").json()["messages"]] == ["for p1"]
        theirs = p2.get("/v1.1/queues/shared_name/messages?echo=true")
        assert theirs.status_code in (200, 204) and not (theirs.content and theirs.json()["messages"])
        assert "shared_name" not in [q["name"] for q in p2.get("/v1.1/queues").json().get("queues", [])]
        # naming the token's project explicitly is fine; another project is 403
        assert p1.get("/v1.1/queues", headers={"X-Project-Id": "p1"}).status_code == 200
        denied = p1.get("/v1.1/queues/shared_name/messages", headers={"X-Project-Id": "p2"})
        assert denied.status_code == 403
        assert denied.json()["title"] == "Forbidden"


def test_zaqar_pools_and_flavors_are_managed_by_admin_tokens_only(secured):
    """Zaqar's default policy: every pools call and a flavor's create, update and delete need the
    admin role; listing and reading flavors do not."""
    forbidden = {"title": "Not authorized", "description": "You are not authorized to complete this action."}
    with secured.zaqar("tok-ops") as admin, secured.zaqar("tok-p1") as user:
        for method, path, body in (("GET", "/v1.1/pools", None), ("GET", "/v1.1/pools/px", None),
                                   ("PUT", "/v1.1/pools/px", {"uri": "boxqueue://zq_sec", "weight": 1}),
                                   ("PATCH", "/v1.1/pools/px", {"weight": 2}), ("DELETE", "/v1.1/pools/px", None),
                                   ("PUT", "/v1.1/flavors/fx", {"capabilities": {}}),
                                   ("PATCH", "/v1.1/flavors/fx", {"capabilities": {"a": 1}}),
                                   ("DELETE", "/v1.1/flavors/fx", None)):
            r = user.request(method, path, json=body)
            assert r.status_code == 403 and r.json() == forbidden, (method, path, r.status_code, r.text)
        r = admin.put("/v1.1/pools/px", json={"uri": "boxqueue://zq_sec", "weight": 1})
        assert r.status_code == 201, r.text
        assert admin.get("/v1.1/pools/px").json()["weight"] == 1
        assert admin.put("/v1.1/flavors/fx", json={"capabilities": {"k": "v"}}).status_code == 201
        # anyone may list and read flavors (of their own project)
        assert user.get("/v1.1/flavors").status_code in (200, 204)
        assert user.get("/v1.1/flavors/fx").status_code == 404  # the admin's flavor is in project "ops"
        assert admin.get("/v1.1/flavors/fx").json()["name"] == "fx"
        assert user.get("/v1.1/pools").status_code == 403  # still
        assert admin.delete("/v1.1/flavors/fx").status_code == 204
        assert admin.delete("/v1.1/pools/px").status_code == 204


def test_zaqar_needs_tls(secured):
    with (httpx.Client(base_url=f"http://127.0.0.1:{secured.zaqar_port}", timeout=10) as plain,
          pytest.raises(httpx.HTTPError)):
        plain.get("/", headers={"X-Auth-Token": "tok-p1"})


# -- Sonya ------------------------------------------------------------------------------------


def test_sonya_over_tls_with_client_certificates(secured):
    with secured.sonya() as s:
        assert s.post("/queue/create/tlsnews").status_code == 201
        sent = s.post("/queue/send/tlsnews", json={"id": "1", "payload": {"m": "hello"}})
        assert sent.json()["success"] is True
        polled = s.get("/queue/listen/longpoll/tlsnews/1", params={"sequence": "first"})
        assert [m["payload"] for m in polled.json()] == [{"m": "hello"}]
    with pytest.raises(httpx.HTTPError), secured.sonya(cert=False) as s:  # no client certificate
        s.post("/queue/create/other")


def test_sonya_websocket_over_wss(secured):
    with secured.sonya() as s:
        s.post("/queue/create/wssnews")
        s.post("/queue/send/wssnews", json={"id": "a", "payload": 1})
    url = f"wss://127.0.0.1:{secured.sonya_port}/queue/listen/ws/wssnews?sequence=first"
    with ws_client.connect(url, ssl=secured.certs.client_context(), open_timeout=30) as ws:
        first = json.loads(ws.recv(timeout=30))
        assert first["payload"] == 1
        with secured.sonya() as s:
            s.post("/queue/send/wssnews", json={"id": "a", "payload": 2})
        assert json.loads(ws.recv(timeout=30))["payload"] == 2


# -- Deckard ----------------------------------------------------------------------------------


def test_deckard_with_tls_and_a_token(secured):
    channel = secured.grpc_channel()
    try:
        stub = pb_grpc.DeckardStub(channel)
        added = stub.Add(pb.AddRequest(messages=[pb.AddMessage(id="x1", queue="tlsq", string_payload="s")]), timeout=30)
        assert added.created_count == 1
        pulled = stub.Pull(pb.PullRequest(queue="tlsq", amount=1), timeout=30)
        assert [m.id for m in pulled.messages] == ["x1"]
    finally:
        channel.close()


@pytest.mark.parametrize("token", [None, "wrong", DECKARD_TOKEN + "x"])
def test_deckard_without_the_token_is_unauthenticated(secured, token):
    channel = secured.grpc_channel(token=token)
    try:
        stub = pb_grpc.DeckardStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Count(pb.CountRequest(queue="tlsq"), timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # plain metadata works the same way as call credentials
        with pytest.raises(grpc.RpcError) as err:
            stub.Count(pb.CountRequest(queue="tlsq"), timeout=30, metadata=[("authorization", f"Bearer {token}")])
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # health checks stay open
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        channel.close()
    channel = secured.grpc_channel(token=None)
    try:
        count = pb_grpc.DeckardStub(channel).Count(pb.CountRequest(queue="tlsq"), timeout=30,
                                                   metadata=[("authorization", f"Bearer {DECKARD_TOKEN}")])
        assert count.count >= 0
    finally:
        channel.close()


def test_deckard_requires_a_client_certificate(secured):
    channel = secured.grpc_channel(client_cert=False)
    try:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.DeckardStub(channel).Count(pb.CountRequest(queue="tlsq"), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        channel.close()


ZAQARCLIENT = ROOT / ".venv" / "zaqarclient" / "bin" / "python"


@pytest.mark.skipif(not ZAQARCLIENT.exists(), reason="make install puts python-zaqarclient in .venv/zaqarclient")
def test_python_zaqarclient_with_a_token_over_tls(secured):
    env = dict(os.environ, REQUESTS_CA_BUNDLE=str(secured.certs.ca_file))
    check = ROOT / "compat" / "zaqar_functional" / "zaqarclient_check.py"
    url = f"https://127.0.0.1:{secured.zaqar_port}"
    done = subprocess.run([str(ZAQARCLIENT), str(check), url, "tok-p2"], env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all as expected" in done.stdout
    refused = subprocess.run([str(ZAQARCLIENT), str(check), url, "not-a-token"], env=env, capture_output=True,
                             text=True, timeout=180)
    assert refused.returncode != 0 and "401" in refused.stderr + refused.stdout
