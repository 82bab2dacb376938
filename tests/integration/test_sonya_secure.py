"""Sonya's secure mode against the real server (spec section 4, S6, S10): which endpoint takes
which token, both ways of passing it, HS256 JWTs with the service token as secret, 401/403."""

from __future__ import annotations

import time
import uuid

import jwt
import pytest
from websockets.exceptions import InvalidStatus

from tests.integration.conftest import ours_only
from tests.integration.sonya_fixtures import SonyaServer, ws_messages

pytestmark = [ours_only(), pytest.mark.filterwarnings("ignore::jwt.InsecureKeyLengthWarning")]  # short tokens on purpose

TOKEN = "s3cret-service-token"
SERVICE = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    srv = SonyaServer(
        tmp_path_factory.mktemp("sonya_secure"), f'service_token = "{TOKEN}"\njwt_ttl_s = 120\nlongpoll_max_wait_s = 2'
    ).start()
    yield srv
    srv.proc.stop()
    srv.http.close()


def make_queue(srv: SonyaServer) -> str:
    q = "s" + uuid.uuid4().hex[:10]
    assert srv.create(q, headers=SERVICE).status_code == 201
    return q


def mint(queue: str, key: str, exp_offset: int = 60, secret: str = TOKEN) -> str:
    return jwt.encode({"sub": key, "iss": queue, "exp": int(time.time()) + exp_offset}, secret, algorithm="HS256")


def assert_denied(r, status: int) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert "error" in r.json()


def test_management_needs_the_service_token_and_refusals_change_nothing(secure):
    q = "s" + uuid.uuid4().hex[:10]
    assert_denied(secure.create(q), 401)
    assert_denied(secure.create(q, headers={"Authorization": "Bearer wrong"}), 401)
    assert_denied(secure.create(q, headers={"Authorization": f"bearer {TOKEN}"}), 401)  # prefix is exact
    assert_denied(secure.create(q, headers={"Authorization": f"Bearer {mint(q, 'a')}"}), 401)  # wrong kind
    assert secure.poll(q, headers=SERVICE, timeout=5).status_code == 404  # nothing was created
    assert secure.create(q, headers=SERVICE).status_code == 201
    assert secure.create(q + "x", params={"access_token": TOKEN}).status_code == 201  # query form
    # A Bearer header is used even when wrong; the query is then not consulted.
    assert_denied(secure.create(q + "y", headers={"Authorization": "Bearer nope"}, params={"access_token": TOKEN}), 401)
    # Without the Bearer prefix the header is ignored and the query is used.
    assert secure.create(q + "z", headers={"Authorization": "Basic x"}, params={"access_token": TOKEN}).status_code == 201

    assert_denied(secure.send(q, {"id": "a", "payload": 1}), 401)
    assert secure.send(q, {"id": "a", "payload": 1}, headers=SERVICE).json() == {"success": True, "sequence_id": 1}
    assert_denied(secure.delete(q, "a"), 401)
    assert_denied(secure.delete(q, "a", headers={"Authorization": f"Bearer {mint(q, 'a')}"}), 401)
    assert_denied(secure.close_queue(q), 401)
    r = secure.poll(q, "a", "first", headers={"Authorization": f"Bearer {mint(q, 'a')}"}, timeout=5)
    assert [m["sequence"] for m in r.json()] == [1]  # nothing was deleted or closed
    assert secure.delete(q, "a", headers=SERVICE).json() == {"success": True}
    assert secure.close_queue(q, headers=SERVICE).json() == {"success": True}


def test_whole_queue_listen_takes_the_service_token_only(secure):
    q = make_queue(secure)
    secure.send(q, {"id": "a", "payload": 1}, headers=SERVICE)
    assert_denied(secure.poll(q, None, "first"), 401)
    assert_denied(secure.poll(q, None, "first", headers={"Authorization": f"Bearer {mint(q, 'a')}"}), 401)
    assert secure.poll(q, None, "first", headers=SERVICE).json()[0]["payload"] == 1
    assert secure.poll(q, None, "first", params={"access_token": TOKEN}).json()[0]["payload"] == 1


def test_by_id_listen_takes_a_jwt_for_exactly_that_queue_and_id(secure):
    q = make_queue(secure)
    secure.send(q, {"id": "a", "payload": "v"}, headers=SERVICE)
    r = secure.http.post(f"/queue/generate_jwt/{q}/a", headers=SERVICE)
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"token", "expiration"}
    assert abs(body["expiration"] - (time.time() + 120)) < 10  # jwt_ttl_s = 120
    claims = jwt.decode(body["token"], TOKEN, algorithms=["HS256"])
    assert (claims["sub"], claims["iss"], claims["exp"]) == ("a", q, body["expiration"])
    good = {"Authorization": f"Bearer {body['token']}"}
    assert secure.poll(q, "a", "first", headers=good).json() == [{"id": "a", "sequence": 1, "payload": "v"}]
    assert secure.poll(q, "a", "first", params={"access_token": body["token"]}).status_code == 200
    # The service token itself is not accepted by id; another id or queue is 403.
    assert_denied(secure.poll(q, "a", "first", headers=SERVICE), 401)
    assert_denied(secure.poll(q, "b", "first", headers=good), 403)
    other = make_queue(secure)
    assert_denied(secure.poll(other, "a", "first", headers=good), 403)
    # Signed elsewhere with the same secret: accepted; another secret: 401.
    assert secure.poll(q, "a", "last", headers={"Authorization": f"Bearer {mint(q, 'a')}"}).status_code == 200
    assert_denied(secure.poll(q, "a", "last", headers={"Authorization": f"Bearer {mint(q, 'a', secret='x')}"}), 401)
    assert_denied(secure.poll(q, "a", "last", headers={"Authorization": "Bearer not.a.jwt"}), 401)


def test_jwt_expiry_has_60_seconds_leeway(secure):
    q = make_queue(secure)
    secure.send(q, {"id": "a", "payload": 1}, headers=SERVICE)
    within = {"Authorization": f"Bearer {mint(q, 'a', exp_offset=-30)}"}
    assert secure.poll(q, "a", "first", headers=within).status_code == 200
    expired = {"Authorization": f"Bearer {mint(q, 'a', exp_offset=-120)}"}
    assert_denied(secure.poll(q, "a", "first", headers=expired), 401)
    no_exp = jwt.encode({"sub": "a", "iss": q}, TOKEN, algorithm="HS256")
    assert_denied(secure.poll(q, "a", "first", headers={"Authorization": f"Bearer {no_exp}"}), 401)


def test_generate_jwt_needs_the_service_token_and_post(secure):
    q = make_queue(secure)
    assert_denied(secure.http.post(f"/queue/generate_jwt/{q}/a"), 401)
    assert_denied(secure.http.post(f"/queue/generate_jwt/{q}/a", headers={"Authorization": f"Bearer {mint(q, 'a')}"}), 401)
    assert secure.http.get(f"/queue/generate_jwt/{q}/a", headers=SERVICE).status_code == 405
    # The queue's existence is not checked (as in Sonya).
    assert secure.http.post("/queue/generate_jwt/no-such-queue/a", headers=SERVICE).status_code == 200


def test_websocket_tokens_by_query_and_refusals(secure):
    q = make_queue(secure)
    secure.send(q, {"id": "a", "payload": "hello"}, headers=SERVICE)
    token = secure.http.post(f"/queue/generate_jwt/{q}/a", headers=SERVICE).json()["token"]
    with secure.ws(q, "a", f"?sequence=first&access_token={token}") as ws:
        assert ws_messages(ws, 1)[0]["payload"] == "hello"
    with secure.ws(q, None, f"?sequence=first&access_token={TOKEN}") as ws:
        assert ws_messages(ws, 1)[0]["payload"] == "hello"
    with secure.ws(q, None, "?sequence=last", additional_headers=SERVICE) as ws:
        assert ws_messages(ws, 1)[0]["payload"] == "hello"
    for key, query, status in [
        ("a", f"?access_token={TOKEN}", 401),  # service token by id
        (None, f"?access_token={token}", 401),  # JWT on the whole queue
        ("b", f"?access_token={token}", 403),  # JWT for another id
        ("a", "", 401),
    ]:
        with pytest.raises(InvalidStatus) as refused:
            secure.ws(q, key, query)
        assert refused.value.response.status_code == status
