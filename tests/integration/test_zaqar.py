"""The Zaqar v1.1 facade against the real server over HTTP (httpx): every endpoint with its
statuses, headers and error bodies (Zaqar v1.1, see docs/references.md), msgpack, concurrency, restarts."""

from __future__ import annotations

import concurrent.futures
import time
import uuid

import httpx
import msgpack
import pytest

from tests.serverproc import ServerProcess, free_port

CLIENT = "3381af92-2b9e-11e3-b191-71861300734c"
OTHER_CLIENT = str(uuid.uuid4())


class Zaqar:
    """A server with the facade on, and a client for it."""

    def __init__(self, workdir) -> None:
        self.http_port = free_port()
        self.proc = ServerProcess(workdir, extra_config=f'[zaqar]\nlisten = "127.0.0.1:{self.http_port}"\n',
                                  read_only=False)
        self.proc.start()
        self.base = f"http://127.0.0.1:{self.http_port}"

    def client(self, client_id: str = CLIENT, project: str = "proj", **headers: str) -> httpx.Client:
        h = {"Client-ID": client_id, "X-Project-ID": project, **headers}
        return httpx.Client(base_url=self.base, headers=h, timeout=30)

    def stop(self) -> None:
        self.proc.stop()


@pytest.fixture(scope="module")
def zaqar(tmp_path_factory):
    server = Zaqar(tmp_path_factory.mktemp("zaqar"))
    yield server
    server.stop()


@pytest.fixture
def c(zaqar):
    with zaqar.client() as client:
        yield client


@pytest.fixture
def q(c):
    """A fresh queue name, deleted afterwards."""
    name = "q" + uuid.uuid4().hex[:12]
    yield name
    c.delete(f"/v1.1/queues/{name}")


def post(c: httpx.Client, queue: str, *bodies, ttl: int | None = None) -> list[str]:
    msgs = [{"body": b} if ttl is None else {"body": b, "ttl": ttl} for b in bodies]
    r = c.post(f"/v1.1/queues/{queue}/messages", json={"messages": msgs})
    assert r.status_code == 201, r.text
    return [href.rsplit("/", 1)[1] for href in r.json()["resources"]]


def error(r: httpx.Response, status: int, title: str, description: str | None = None) -> None:
    assert r.status_code == status, r.text
    doc = r.json()
    assert doc["title"] == title
    if description is not None:
        assert doc["description"] == description


# -- request pipeline ---------------------------------------------------------------------------


def test_versions_home_ping_and_request_id(zaqar):
    with httpx.Client(base_url=zaqar.base) as bare:
        r = bare.get("/")
        assert r.status_code == 300
        assert r.json()["versions"][0]["id"] == "1.1"
        assert r.headers["x-openstack-request-id"].startswith("req-")
        error(bare.get("/v1.1/ping"), 400, "Missing header value", 'The "Client-ID" header is required.')
    with zaqar.client() as c:
        home = c.get("/v1.1/")
        assert home.status_code == 200
        assert home.headers["content-type"].startswith("application/json-home")
        assert home.headers["cache-control"] == "max-age=86400"
        assert "rel/post_claim" in home.json()["resources"]
        r = c.get("/v1.1/ping")
        assert r.status_code == 204 and r.content == b"" and "content-type" not in r.headers
        assert c.head("/v1.1/ping").status_code == 204


def test_unknown_paths_methods_and_options(c, q):
    for path in ("/v1.1", "/v1", "/v1.1/nothing", f"/v1.1/queues/{q}/"):
        error(c.get(path), 404, "404 Not Found")
    r = c.head(f"/v1.1/queues/{q}")
    assert r.status_code == 405 and r.headers["allow"] == "PUT, GET, DELETE, OPTIONS"
    r = c.get(f"/v1.1/queues/{q}/claims")
    assert r.status_code == 405 and r.headers["allow"] == "POST, OPTIONS"
    assert r.json() == {"title": "405 Method Not Allowed"}
    r = c.options(f"/v1.1/queues/{q}/messages")
    assert r.status_code == 200 and r.headers["allow"] == "POST, GET, DELETE, OPTIONS" and r.content == b""
    # a method no route takes at all: the HTTP layer's plain 405, before any of Zaqar's checks
    r = c.request("TRACE", f"/v1.1/queues/{q}")
    assert r.status_code == 405 and r.text == "Method Not Allowed"
    assert set(r.headers["allow"].split(", ")) == {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}


@pytest.mark.parametrize("value", ["", "1234", "aa2-bb3", "0xdeadbeef", "z" * 32, "1" * 31, "1" * 33])
def test_bad_client_ids(zaqar, value):
    with zaqar.client(client_id=value) as c:
        error(c.get("/v1.1/queues"), 400, "Wrong UUID value", "Malformed hexadecimal UUID.")


@pytest.mark.parametrize("value", [uuid.uuid4().hex, str(uuid.uuid4()).upper(), "{" + str(uuid.uuid4()) + "}",
                                   f"urn:uuid:{uuid.uuid4()}", "00000000-0000-0000-0000-000000000000"])
def test_accepted_client_id_forms(zaqar, value):
    with zaqar.client(client_id=value) as c:
        assert c.get("/v1.1/queues").status_code == 200


def test_project_header(zaqar):
    with httpx.Client(base_url=zaqar.base, headers={"Client-ID": CLIENT}) as c:
        error(c.get("/v1.1/queues"), 400, "Project-Id Missing", "The header X-PROJECT-ID was missing")
        error(c.get("/v1.1/queues", headers={"X-Project-Id": ""}), 400, "Empty project header not allowed")
        error(c.get("/v1.1/queues/ok", headers={"X-Project-Id": "p" * 257}), 400, "Invalid queue identification")
        assert c.get("/v1.1/queues", headers={"x-project-id": "p" * 257}).status_code == 200


def test_accept_and_content_type(c, q):
    for accept in ("application/xml", "plain/text", "application/json-home",
                   "application/vnd.openstack.messaging-v1_1+json"):
        r = c.get("/v1.1/queues", headers={"Accept": accept})
        assert r.status_code == 406, accept
    r = c.get("/v1.1/queues", headers={"Accept": "application/json-home, */*;q=0"})
    assert r.status_code == 406
    r = c.get("/v1.1/queues", headers={"Accept": "application/vnd.openstack.messaging-v1_1+json, text/*"})
    assert r.status_code == 406
    r = c.get("/v1.1/queues", headers={"Accept": "plain/text"})
    assert r.content == b""  # accepts neither JSON nor XML: no body
    r = c.get("/v1.1/queues", headers={"Accept": "application/xml"})
    assert r.headers["content-type"].startswith("application/xml")
    assert b"<title>406 Not Acceptable</title>" in r.content
    r = c.get("/v1.1/queues", headers={"Accept": "application/x-msgpack"})  # Z2: msgpack is served
    assert r.status_code == 200 and "queues" in msgpack.unpackb(r.content)
    r = c.get("/v1.1/queues")
    doc = c.get("/v1.1/queues", headers={"Accept": "application/json"}).json()
    assert r.status_code == 200 and r.json() == doc
    for accept in ("*/*", "application/*", "application/xml, application/json;q=0.1"):
        assert c.get("/v1.1/queues", headers={"Accept": accept}).status_code == 200
    r = c.put(f"/v1.1/queues/{q}", content=b"a=b", headers={"Content-Type": "application/x-www-form-urlencoded"})
    error(r, 400, "Invalid Content-Type")
    r = c.put(f"/v1.1/queues/{q}", content=b'{"x": 1}', headers={"Content-Type": "text/plain"})
    assert r.status_code == 201


@pytest.mark.parametrize("name,ok", [("a" * 64, True), ("a" * 65, False), ("a.b-c_D9", True), ("a%20b", False),
                                     ("caf%C3%A9", False), ("", False)])
def test_queue_names(c, name, ok):
    r = c.put(f"/v1.1/queues/{name}")
    if ok:
        assert r.status_code in (201, 204)
        c.delete(f"/v1.1/queues/{name}")
    else:
        error(r, 400, "Invalid queue identification",
              "The format of the submitted queue name or project id is not valid.")


# -- queues -------------------------------------------------------------------------------------


def test_queue_create_get_delete(c, q):
    r = c.put(f"/v1.1/queues/{q}", json={"purpose": "tests", "n": 1})
    assert r.status_code == 201 and r.content == b""
    assert r.headers["location"] == f"/v1.1/queues/{q}"
    assert r.headers["content-type"].startswith("application/json")
    r = c.put(f"/v1.1/queues/{q}", json={"changed": True})
    assert r.status_code == 204 and r.headers["location"] == f"/v1.1/queues/{q}"
    assert c.get(f"/v1.1/queues/{q}").json() == {"purpose": "tests", "n": 1}  # only set at creation
    assert c.delete(f"/v1.1/queues/{q}").status_code == 204
    assert c.get(f"/v1.1/queues/{q}").json() == {}
    assert c.delete(f"/v1.1/queues/{q}").status_code == 204


def test_queue_metadata_checks(c, q):
    error(c.put(f"/v1.1/queues/{q}", json=[1]), 400, "Invalid request body", "Document type not supported.")
    error(c.put(f"/v1.1/queues/{q}", content=b"{bad", headers={"Content-Type": "application/json"}),
          400, "Invalid request body", "Request body could not be parsed.")
    big = {"k": "x" * 65_536}
    error(c.put(f"/v1.1/queues/{q}", json=big), 400, "Invalid API request", "Queue metadata is too large. Max size: 65536")
    error(c.put(f"/v1.1/queues/{q}", json={"_default_message_ttl": "x"}), 400, "Invalid API request",
          "_default_message_ttl must be integer.")
    error(c.put(f"/v1.1/queues/{q}", json={"_default_message_ttl": 10}), 400, "Invalid API request")
    error(c.put(f"/v1.1/queues/{q}", json={"_max_messages_post_size": 0}), 400, "Invalid API request",
          "_max_messages_post_size can not exceed 262144,  and must be at least greater than 0.")
    error(c.put(f"/v1.1/queues/{q}", json={"n": 2**64}), 400, "Invalid request body",
          "JSON contains integer that is too large.")


def test_queue_listing_pages_by_project(zaqar):
    project = "list" + uuid.uuid4().hex[:8]
    with zaqar.client(project=project) as c, zaqar.client(project=project + "x") as other:
        assert c.get("/v1.1/queues").json() == {"queues": [], "links": []}
        for name in ("b", "a", "c", "withmeta"):
            c.put(f"/v1.1/queues/{name}", json={"n": name} if name == "withmeta" else None)
        other.put("/v1.1/queues/z")
        page = c.get("/v1.1/queues", params={"limit": 2}).json()
        assert [x["name"] for x in page["queues"]] == ["a", "b"]
        assert page["queues"][0] == {"name": "a", "href": "/v1.1/queues/a"}
        assert page["links"] == [{"rel": "next", "href": "/v1.1/queues?limit=2&marker=b"}]
        page = c.get(page["links"][0]["href"]).json()
        assert [x["name"] for x in page["queues"]] == ["c", "withmeta"]
        page = c.get("/v1.1/queues?detailed=true&marker=c").json()
        assert page["queues"] == [{"name": "withmeta", "href": "/v1.1/queues/withmeta", "metadata": {"n": "withmeta"}}]
        assert page["links"][0]["href"] == "/v1.1/queues?detailed=true&marker=withmeta"
        assert c.get("/v1.1/queues?marker=withmeta").json() == {"queues": [], "links": []}
        for bad in ("0", "21"):
            error(c.get(f"/v1.1/queues?limit={bad}"), 400, "Invalid API request",
                  "Limit must be at least 1 and no greater than 20.")
        error(c.get("/v1.1/queues?limit=x"), 400, "Invalid parameter",
              'The "limit" parameter is invalid. The value must be an integer.')
        error(c.get("/v1.1/queues?detailed=maybe"), 400, "Invalid parameter",
              'The "detailed" parameter is invalid. The value of the parameter must be "true" or "false".')
        assert len(c.get("/v1.1/queues?limit=").json()["queues"]) == 4  # blank = absent


# -- messages -----------------------------------------------------------------------------------


def test_post_and_get_messages(c, q):
    r = c.post(f"/v1.1/queues/{q}/messages",
               json={"messages": [{"body": {"event": "one"}, "ttl": 300, "delay": 5}, {"body": None}]})
    assert r.status_code == 201
    ids = [h.rsplit("/", 1)[1] for h in r.json()["resources"]]
    assert r.headers["location"] == f"/v1.1/queues/{q}/messages?ids={ids[0]},{ids[1]}"
    one = c.get(f"/v1.1/queues/{q}/messages/{ids[0]}").json()
    assert one == {"id": ids[0], "href": f"/v1.1/queues/{q}/messages/{ids[0]}", "ttl": 300, "age": 0,
                   "body": {"event": "one"}}
    assert c.get(f"/v1.1/queues/{q}/messages/{ids[1]}").json()["ttl"] == 3600
    got = c.get(f"/v1.1/queues/{q}/messages?ids={ids[1]},nosuch&ids={ids[0]}").json()
    assert list(got) == ["messages"] and [m["id"] for m in got["messages"]] == [ids[1], ids[0]]
    error(c.get(f"/v1.1/queues/{q}/messages?ids=x,y"), 404, "Not found",
          f"No messages with IDs: ['x', 'y'] found in the queue {q} for project proj.")
    error(c.get(f"/v1.1/queues/{q}/messages/nosuch"), 404, "Not found",
          f"Message nosuch does not exist in queue {q} for project proj")
    error(c.get(f"/v1.1/queues/{q}/messages?ids=" + ",".join("x" * 21)), 400, "Invalid API request",
          "Limit must be at least 1 and may not be greater than 20.")


def test_post_validation(c, q):
    url = f"/v1.1/queues/{q}/messages"
    error(c.post(url, json=[{"body": 1}]), 400, "Invalid API request", "No messages were found in the request body.")
    error(c.post(url, json={"messages": {}}), 400, "Invalid request body", "Document type not supported.")
    error(c.post(url, json={"messages": [{"ttl": 60}]}), 400, "Invalid request body", 'Missing "body" field.')
    error(c.post(url, json={"messages": [{"body": 1, "ttl": "60"}]}), 400, "Invalid request body",
          'The value of the "ttl" field must be a int.')
    error(c.post(url, json={"messages": [1]}), 400, "Invalid request body")
    error(c.post(url, json={"messages": []}), 400, "Invalid API request", "No messages to enqueu.")
    for ttl in (59, 1_209_601, True):
        error(c.post(url, json={"messages": [{"body": 1, "ttl": ttl}]}), 400, "Invalid API request",
              "The TTL for a message may not exceed 1209600 seconds, and must be at least 60 seconds long.")
    for bad in (b"null", b'"fail"', b"[", b"12"):
        error(c.post(url, content=bad, headers={"Content-Type": "application/json"}), 400, "Invalid request body",
              "Request body could not be parsed.")
    def chunked():
        yield b'{"messages": [{"body": 1}]}'

    error(c.post(url, content=chunked(), headers={"Content-Type": "application/json"}), 400,
          "Invalid request body", "Request body can not be empty")
    envelope = b'{"messages": [{"body": "%s"}]}'
    exact = envelope % (b"x" * (262_144 - len(envelope % b"")))
    assert len(exact) == 262_144
    assert c.post(url, content=exact, headers={"Content-Type": "application/json"}).status_code == 201
    error(c.post(url, content=exact + b" ", headers={"Content-Type": "application/json"}), 400,
          "Invalid API request", "Message collection size is too large. Max size 262144")
    assert c.get(f"/v1.1/queues/{q}/stats").json()["messages"]["total"] == 1  # failures stored nothing


def test_listing_echo_markers_and_include_claimed(zaqar, c, q):
    mine = post(c, q, "m1", "m2", "m3")
    with zaqar.client(client_id=OTHER_CLIENT) as other:
        theirs = post(other, q, "t1")
        assert [m["id"] for m in c.get(f"/v1.1/queues/{q}/messages").json()["messages"]] == theirs
        # The same client in another spelling is still the same client.
        with zaqar.client(client_id=CLIENT.replace("-", "").upper()) as same:
            assert [m["id"] for m in same.get(f"/v1.1/queues/{q}/messages").json()["messages"]] == theirs
        page = c.get(f"/v1.1/queues/{q}/messages?echo=yes&limit=2").json()
        assert [m["id"] for m in page["messages"]] == mine[:2]
        href = page["links"][0]["href"]
        assert href.startswith(f"/v1.1/queues/{q}/messages?limit=2&echo=true&marker=")
        page = c.get(href).json()
        assert [m["id"] for m in page["messages"]] == [mine[2], theirs[0]]
        assert c.get(page["links"][0]["href"]).json() == {"messages": [], "links": []}
        claimed = other.post(f"/v1.1/queues/{q}/claims?limit=1", json={}).json()["messages"]
        assert claimed[0]["id"] == mine[0]  # claims ignore echo and take the oldest
        listed = [m["id"] for m in c.get(f"/v1.1/queues/{q}/messages?echo=true").json()["messages"]]
        assert listed == mine[1:] + theirs
        listed = c.get(f"/v1.1/queues/{q}/messages?echo=true&include_claimed=true").json()["messages"]
        assert [m["id"] for m in listed] == mine + theirs
        assert "?claim_id=" in listed[0]["href"]
    assert c.get("/v1.1/queues/nosuchq/messages").json() == {"messages": [], "links": []}
    assert c.get(f"/v1.1/queues/{q}/messages?marker=garbage").json() == {"messages": [], "links": []}
    error(c.get(f"/v1.1/queues/{q}/messages?limit=21"), 400, "Invalid API request",
          "Limit must be at least 1 and may not be greater than 20.")
    error(c.get(f"/v1.1/queues/{q}/messages?echo=perhaps"), 400, "Invalid parameter")


def test_delete_message_rules(c, q):
    free, claimed_id, other = post(c, q, "free", "claimed", "other")
    assert c.delete(f"/v1.1/queues/{q}/messages/{free}?claim_id=invalid").status_code == 400
    assert c.get(f"/v1.1/queues/{q}/messages/{free}").status_code == 200  # not deleted
    error(c.delete(f"/v1.1/queues/{q}/messages/{free}?claim_id=invalid"), 400, "Unable to delete",
          "A claim was specified, but the message is not currently claimed.")
    assert c.delete(f"/v1.1/queues/{q}/messages/{free}").status_code == 204
    assert c.get(f"/v1.1/queues/{q}/messages/{free}").status_code == 404
    r = c.post(f"/v1.1/queues/{q}/claims?limit=1")
    cid = r.headers["location"].rsplit("/", 1)[1]
    assert r.json()["messages"][0]["id"] == claimed_id
    error(c.delete(f"/v1.1/queues/{q}/messages/{claimed_id}"), 403, "Unable to delete",
          "This message is claimed; it cannot be deleted without a valid claim ID.")
    error(c.delete(f"/v1.1/queues/{q}/messages/{claimed_id}?claim_id=nosuch"), 400, "Unable to delete",
          "The specified claim does not exist or has expired.")
    cid2 = c.post(f"/v1.1/queues/{q}/claims?limit=1").headers["location"].rsplit("/", 1)[1]
    error(c.delete(f"/v1.1/queues/{q}/messages/{claimed_id}?claim_id={cid2}"), 403, "Unable to delete")
    assert c.delete(f"/v1.1/queues/{q}/messages/{claimed_id}?claim_id={cid}").status_code == 204
    assert c.get(f"/v1.1/queues/{q}/claims/{cid}").json()["messages"] == []
    assert c.delete(f"/v1.1/queues/{q}/claims/{cid2}").status_code == 204
    error(c.delete(f"/v1.1/queues/{q}/messages/{other}?claim_id={cid2}"), 400, "Unable to delete",
          "A claim was specified, but the message is not currently claimed.")
    assert c.delete(f"/v1.1/queues/{q}/messages/nosuch").status_code == 204
    assert c.delete("/v1.1/queues/nosuchq/messages/x").status_code == 204


def test_bulk_delete_and_pop(c, q):
    ids = post(c, q, 1, 2, 3, 4, 5, ttl=120)
    url = f"/v1.1/queues/{q}/messages"
    error(c.delete(f"{url}?ids=a&pop=1"), 400, "Invalid API request",
          "pop and id params cannot be present together in the delete request.")
    for query in ("", "?ids=", "?pop="):
        error(c.delete(url + query), 400, "Invalid API request",
              'The request should have either "ids" or "pop" parameter in the request, to be able to delete.')
    error(c.delete(f"{url}?pop=0"), 400, "Invalid API request", "Pop value must be at least 1 and may not be greater than 20.")
    error(c.delete(f"{url}?pop=x"), 400, "Invalid parameter")
    error(c.delete(f"{url}?ids=" + ",".join("x" * 21)), 400, "Invalid API request",
          "ids parameter should have at least 1 and not greater than 20 values.")
    c.post(f"/v1.1/queues/{q}/claims?limit=1")  # claims ids[0]; bulk delete ignores claims
    assert c.delete(f"{url}?ids={ids[0]},{ids[1]},nosuch").status_code == 204
    assert c.get(f"{url}?ids={ids[0]},{ids[1]}").status_code == 404
    c.post(f"/v1.1/queues/{q}/claims?limit=1")  # claims ids[2]: pop skips it
    r = c.delete(f"{url}?pop=5")
    assert r.status_code == 200
    popped = r.json()["messages"]
    assert [m["id"] for m in popped] == ids[3:]
    assert popped[0] == {"id": ids[3], "age": 0, "ttl": 120, "body": 4, "claim_id": None, "claim_count": 0}
    assert c.delete(f"{url}?pop=5").json() == {"messages": []}
    assert c.delete("/v1.1/queues/nosuchq/messages?pop=1").json() == {"messages": []}
    assert c.get(f"/v1.1/queues/{q}/stats").json()["messages"]["total"] == 1


def test_stats(c, q):
    assert c.get(f"/v1.1/queues/{q}/stats").json() == {"messages": {"claimed": 0, "free": 0, "total": 0}}
    first, _, last = post(c, q, "a", "b", "c")
    c.post(f"/v1.1/queues/{q}/claims?limit=1")
    stats = c.get(f"/v1.1/queues/{q}/stats").json()["messages"]
    assert (stats["claimed"], stats["free"], stats["total"]) == (1, 2, 3)
    assert sorted(stats["oldest"]) == ["age", "created", "href"]
    assert stats["oldest"]["href"] == f"/v1.1/queues/{q}/messages/{first}"
    assert stats["newest"]["href"] == f"/v1.1/queues/{q}/messages/{last}"
    assert c.get(stats["oldest"]["href"]).status_code == 200


# -- claims -------------------------------------------------------------------------------------


def test_claim_lifecycle(c, q):
    short, long_ = post(c, q, "short", ttl=60)[0], post(c, q, "long", ttl=600)[0]
    assert c.post("/v1.1/queues/nosuchq/claims").status_code == 204
    r = c.post(f"/v1.1/queues/{q}/claims", json={"ttl": 60, "grace": 60})
    assert r.status_code == 201
    cid = r.headers["location"].rsplit("/", 1)[1]
    assert r.headers["location"] == f"/v1.1/queues/{q}/claims/{cid}"
    msgs = {m["id"]: m for m in r.json()["messages"]}
    assert msgs[short]["ttl"] == 120 and msgs[long_]["ttl"] == 600  # grace extends only the short one
    assert msgs[short]["href"] == f"/v1.1/queues/{q}/messages/{short}?claim_id={cid}"
    assert c.post(f"/v1.1/queues/{q}/claims").status_code == 204  # nothing left to claim
    got = c.get(f"/v1.1/queues/{q}/claims/{cid}").json()
    assert set(got) == {"age", "ttl", "messages", "href"} and got["ttl"] == 60
    assert got["href"] == f"/v1.1/queues/{q}/claims/{cid}"
    assert {m["id"] for m in got["messages"]} == {short, long_}
    r = c.patch(f"/v1.1/queues/{q}/claims/{cid}", json={})
    assert r.status_code == 204
    assert c.get(f"/v1.1/queues/{q}/claims/{cid}").json()["ttl"] == 300
    assert c.get(f"/v1.1/queues/{q}/messages/{short}").json()["ttl"] == 360
    assert c.patch(f"/v1.1/queues/{q}/claims/{cid}", json={"ttl": 60, "grace": 0}).status_code == 204
    assert c.get(f"/v1.1/queues/{q}/messages/{short}").json()["ttl"] == 360  # never shortened
    assert c.delete(f"/v1.1/queues/{q}/claims/{cid}").status_code == 204
    error(c.get(f"/v1.1/queues/{q}/claims/{cid}"), 404, "Not found",
          f"Claim {cid} does not exist in queue {q} for project proj")
    error(c.patch(f"/v1.1/queues/{q}/claims/{cid}", json={}), 404, "Not found")
    assert c.delete(f"/v1.1/queues/{q}/claims/{cid}").status_code == 204
    listed = c.get(f"/v1.1/queues/{q}/messages?echo=true").json()["messages"]
    assert {m["id"] for m in listed} == {short, long_}
    assert all("claim_id" not in m["href"] for m in listed)


def test_claim_validation(c, q):
    url = f"/v1.1/queues/{q}/claims"
    error(c.post(url, json={"ttl": 59}), 400, "Invalid API request",
          "The TTL for a claim may not exceed 43200 seconds, and must be at least 60 seconds long.")
    error(c.post(url + "?limit=21", json={"grace": 10}), 400, "Invalid API request",
          "Limit must be at least 1 and may not be greater than 20.")
    error(c.post(url, json={"grace": 43_201}), 400, "Invalid API request",
          "The grace for a claim may not exceed 43200 seconds, and must be at least 60 seconds long.")
    error(c.post(url, json={"ttl": "60"}), 400, "Invalid request body", 'The value of the "ttl" field must be a int.')
    error(c.post(url, json=[]), 400, "Invalid request body", "Document type not supported.")
    error(c.post(url, content=b'"fail"', headers={"Content-Type": "application/json"}), 400,
          "Invalid request body", "Request body could not be parsed.")
    assert c.post(url, content=b"", headers={"Content-Type": "application/json"}).status_code == 204
    post(c, q, "x")
    cid = c.post(url, json={"grace": 100}).headers["location"].rsplit("/", 1)[1]
    error(c.patch(f"{url}/{cid}", json={"ttl": 43_201}), 400, "Invalid API request")
    error(c.patch(f"{url}/{cid}", content=b"", headers={"Content-Type": "application/json"}), 400,
          "Invalid request body", "Request body could not be parsed.")


def test_concurrent_claimers_never_share(zaqar, q):
    with zaqar.client() as c:
        for i in range(10):
            post(c, q, *range(i * 20, i * 20 + 20))

    def claimer(_n: int) -> list[int]:
        got = []
        with zaqar.client(client_id=str(uuid.uuid4())) as cl:
            while True:
                r = cl.post(f"/v1.1/queues/{q}/claims?limit=3", json={"ttl": 300})
                if r.status_code == 204:
                    return got
                got += [m["body"] for m in r.json()["messages"]]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(claimer, range(16)))
    every = [b for got in results for b in got]
    assert sorted(every) == list(range(200))  # each message claimed exactly once
    assert sum(1 for got in results if got) > 1


# -- msgpack and restart ------------------------------------------------------------------------


def test_msgpack_round_trip(zaqar, q):
    with zaqar.client(**{"Content-Type": "application/x-msgpack", "Accept": "application/x-msgpack"}) as m:
        body = {"n": 1, "list": [1.5, "é", None, True]}
        r = m.post(f"/v1.1/queues/{q}/messages", content=msgpack.packb({"messages": [{"body": body, "ttl": 90}]}))
        assert r.status_code == 201 and r.headers["content-type"] == "application/x-msgpack"
        mid = msgpack.unpackb(r.content)["resources"][0].rsplit("/", 1)[1]
        one = msgpack.unpackb(m.get(f"/v1.1/queues/{q}/messages/{mid}").content)
        assert one["body"] == body and one["ttl"] == 90
        r = m.post(f"/v1.1/queues/{q}/messages", content=b"\xc1")
        assert r.status_code == 400
        assert msgpack.unpackb(r.content) == {"title": "Invalid request body",
                                              "description": "Request body could not be parsed."}
        r = m.post(f"/v1.1/queues/{q}/messages", content=msgpack.packb({"messages": [{"body": b"bin"}]}))
        assert r.status_code == 400
    with zaqar.client() as j:  # what msgpack posted, JSON reads, and the other way round
        assert j.get(f"/v1.1/queues/{q}/messages/{mid}").json()["body"] == body
        r = j.get(f"/v1.1/queues/{q}/stats", headers={"Accept": "application/json, application/msgpack;q=0.5"})
        assert r.json()["messages"]["total"] == 1
        r = j.get(f"/v1.1/queues/{q}/stats", headers={"Accept": "application/msgpack"})
        assert msgpack.unpackb(r.content)["messages"]["total"] == 1


def test_everything_survives_kill_9(tmp_path):
    server = Zaqar(tmp_path)
    try:
        with server.client() as c:
            c.put("/v1.1/queues/kept", json={"meta": [1, 2]})
            ids = post(c, "kept", "a", "b", "c", ttl=3000)
            cid = c.post("/v1.1/queues/kept/claims?limit=1", json={"ttl": 600}).headers["location"].rsplit("/", 1)[1]
            c.delete(f"/v1.1/queues/kept/messages/{ids[2]}")
            c.put("/v1.1/pools/p1", json={"uri": "boxqueue://zq_kept", "weight": 3})
            c.put("/v1.1/flavors/f1", json={"capabilities": {"k": "v"}})
        server.proc.kill()
        server.proc.start()
        with server.client() as c:
            assert c.get("/v1.1/queues/kept").json() == {"meta": [1, 2]}
            assert [m["id"] for m in c.get(f"/v1.1/queues/kept/claims/{cid}").json()["messages"]] == [ids[0]]
            listed = c.get("/v1.1/queues/kept/messages?echo=true&include_claimed=true").json()["messages"]
            assert [m["id"] for m in listed] == ids[:2]
            assert listed[0]["href"].endswith(f"?claim_id={cid}") and listed[1]["ttl"] == 3000
            new = post(c, "kept", "d")
            listed = c.get("/v1.1/queues/kept/messages?echo=true").json()["messages"]
            assert [m["id"] for m in listed] == [ids[1], *new]  # FIFO continues after the restart
            assert c.get("/v1.1/pools/p1").json()["weight"] == 3
            assert c.get("/v1.1/flavors/f1?detailed=true").json()["capabilities"] == {"k": "v"}
    finally:
        server.stop()


# -- health, pools, flavors ---------------------------------------------------------------------


def test_health_reports_volume_and_operations(c, q):
    post(c, q, "a", "b")
    c.post(f"/v1.1/queues/{q}/claims?limit=1")
    doc = c.get("/v1.1/health").json()
    assert doc["storage_reachable"] is True
    assert doc["message_volume"]["claimed"] >= 1 and doc["message_volume"]["total"] >= 2
    for op in ("post_messages", "claim_messages", "create_queue"):
        status = doc["operation_status"][op]
        assert status["succeeded"] is True and status["ref"] is None and 0 <= status["seconds"] < 30


def test_pools(c):
    name = "pool" + uuid.uuid4().hex[:6]
    space = "zq_" + uuid.uuid4().hex[:8]
    assert c.get(f"/v1.1/pools/{name}").json()["description"] == f"Pool {name} does not exist"
    r = c.put(f"/v1.1/pools/{name}", json={"uri": f"boxqueue://{space}", "weight": 10, "options": {"a": 1}})
    assert r.status_code == 201 and r.headers["location"] == f"/v1.1/pools/{name}"
    assert c.get(f"/v1.1/pools/{name}").json() == {"name": name, "uri": f"boxqueue://{space}", "weight": 10,
                                                  "flavor": None, "href": f"/v1.1/pools/{name}"}
    assert c.get(f"/v1.1/pools/{name}?detailed=true").json()["options"] == {"a": 1}
    assert c.put(f"/v1.1/pools/{name}", json={"uri": f"boxqueue://{space}", "weight": 5}).status_code == 201
    error(c.put("/v1.1/pools/other", json={"uri": f"boxqueue://{space}", "weight": 1}), 409, "Resource conflict",
          "The database URI is in use by another pool.")
    error(c.put("/v1.1/pools/other", json={"uri": "redis://localhost", "weight": 1}), 400, "Invalid request body",
          "cannot connect to redis://localhost")
    for bad in ({"uri": "boxqueue://x"}, {"uri": "boxqueue://x", "weight": 1, "extra": 1},
                {"uri": "boxqueue://x", "weight": "1"}, {"uri": "boxqueue://x", "weight": -1}):
        error(c.put("/v1.1/pools/other", json=bad), 400, "Invalid request body")
    error(c.put("/v1.1/pools/other", content=b"", headers={"Content-Type": "application/json"}), 400,
          "Invalid request body", "JSON could not be parsed.")
    error(c.patch(f"/v1.1/pools/{name}", json={"flavor": "x"}), 400, "Invalid request body",
          "One of `uri`, `weight`,or `options` needs to be specified")
    r = c.patch(f"/v1.1/pools/{name}", json={"weight": 7})
    assert r.status_code == 200 and r.content == b""
    assert c.get(f"/v1.1/pools/{name}").json()["weight"] == 7
    error(c.patch("/v1.1/pools/nosuch", json={"weight": 7}), 404, "Not found", "Pool nosuch does not exist")
    listed = c.get("/v1.1/pools?limit=1000")
    assert listed.headers["content-location"] == "/v1.1/pools?limit=1000"
    assert name in [p["name"] for p in listed.json()["pools"]]
    assert listed.json()["links"][0]["href"].startswith("/v1.1/pools?limit=1000&marker=")
    assert c.delete(f"/v1.1/pools/{name}").status_code == 204
    assert c.delete(f"/v1.1/pools/{name}").status_code == 204
    assert c.get(f"/v1.1/pools/{name}").status_code == 404


def test_flavors(zaqar, c, q):
    pool = "fp" + uuid.uuid4().hex[:6]
    c.put(f"/v1.1/pools/{pool}", json={"uri": f"boxqueue://zq_{pool}", "weight": 1})
    r = c.put("/v1.1/flavors/gold", json={"capabilities": {"durable": True}, "pool": pool})
    assert r.status_code == 201 and r.headers["location"] == "/v1.1/flavors/gold"
    assert c.get("/v1.1/flavors/gold").json() == {"name": "gold", "href": "/v1.1/flavors/gold"}
    assert c.get("/v1.1/flavors/gold?detailed=true").json()["capabilities"] == {"durable": True}
    error(c.put("/v1.1/flavors/bad", json={"capabilities": 1}), 400, "Invalid request body")
    assert c.put("/v1.1/flavors/plain", json={}).status_code == 201
    error(c.patch("/v1.1/flavors/gold", json={}), 400, "Invalid request body")
    assert c.patch("/v1.1/flavors/gold", json={"capabilities": {"fast": 1}}).status_code == 200
    assert c.get("/v1.1/flavors/gold?detailed=true").json()["capabilities"] == {"fast": 1}
    error(c.patch("/v1.1/flavors/nosuch", json={"capabilities": {}}), 404, "Not found", "Flavor nosuch does not exist")
    error(c.delete(f"/v1.1/pools/{pool}"), 403, "Unable to delete",
          "This pool is used by flavors gold; It cannot be deleted.")
    assert c.put(f"/v1.1/queues/{q}", json={"_flavor": "gold"}).status_code == 201
    error(c.put("/v1.1/queues/another", json={"_flavor": "nosuch"}), 400, "Invalid API request",
          "Flavor nosuch does not exist")
    page = c.get("/v1.1/flavors?limit=1").json()
    assert page["flavors"] == [{"name": "gold", "href": "/v1.1/flavors/gold"}]
    assert page["links"] == [{"rel": "next", "href": "/v1.1/flavors?limit=1&marker=gold"}]
    with zaqar.client(project="elsewhere") as other:
        assert other.get("/v1.1/flavors").json() == {"links": [], "flavors": []}  # flavors are per project
    for name in ("gold", "plain", "gold"):
        assert c.delete(f"/v1.1/flavors/{name}").status_code == 204
    assert c.delete(f"/v1.1/pools/{pool}").status_code == 204


def test_queues_are_placed_on_pools(zaqar, c):
    import tarantool

    space = "zq_place" + uuid.uuid4().hex[:6]
    assert c.put("/v1.1/pools/placing", json={"uri": f"boxqueue://{space}", "weight": 100}).status_code == 201
    try:
        name = "placed" + uuid.uuid4().hex[:6]
        (mid,) = post(c, name, {"where": "pool"})
        conn = tarantool.connect("127.0.0.1", zaqar.proc.port)
        try:
            rows = conn.select(space).data
        finally:
            conn.close()
        # a task of the pool's space: id, tube "project/queue", ..., the body as its data (field 14)
        assert [(r[1], r[0], r[14]) for r in rows] == [(f"proj/{name}", mid, {"where": "pool"})]
        health = c.get("/v1.1/health").json()  # with pools, the figures are per pool
        assert health["catalog_reachable"] is True
        assert health["placing"]["storage_reachable"] is True
        assert health["placing"]["message_volume"] == {"free": 1, "claimed": 0, "total": 1}
        assert health["placing"]["operation_status"]["post_messages"]["succeeded"] is True
        c.delete(f"/v1.1/queues/{name}")
    finally:
        c.delete("/v1.1/pools/placing")


def test_sigterm_under_load_answers_cleanly_and_keeps_acknowledged_posts(tmp_path):
    import threading

    server = Zaqar(tmp_path)
    acknowledged: list[str] = []
    statuses: set[int] = set()
    stop = threading.Event()

    def poster() -> None:
        with server.client(client_id=str(uuid.uuid4())) as c:
            while not stop.is_set():
                try:
                    r = c.post("/v1.1/queues/load/messages", json={"messages": [{"body": 1}]})
                except httpx.TransportError:
                    return  # the server closed the connection between requests
                statuses.add(r.status_code)
                if r.status_code == 201:
                    acknowledged.append(r.json()["resources"][0].rsplit("/", 1)[1])

    threads = [threading.Thread(target=poster) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 10
        while len(acknowledged) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.proc.stop() == 0
        stop.set()
        for t in threads:
            t.join(10)
        assert statuses == {201}  # nothing cut off with an error status
        server.proc.start()
        with server.client() as c:
            stats = c.get("/v1.1/queues/load/stats").json()["messages"]
            assert stats["total"] >= len(acknowledged) >= 20  # a post may commit as its reply is cut
            some = acknowledged[:: max(1, len(acknowledged) // 15)][:20]
            assert len(c.get(f"/v1.1/queues/load/messages?ids={','.join(some)}").json()["messages"]) == len(some)
    finally:
        stop.set()
        server.stop()


def test_configured_default_project_and_limits(tmp_path):
    """Z3: Zaqar's limits under its option names; Z4: a default project for requests without
    X-Project-Id (there is no auth here)."""
    http_port = free_port()
    proc = ServerProcess(
        tmp_path / "srv",
        extra_config=(
            f'[zaqar]\nlisten = "127.0.0.1:{http_port}"\ndefault_project = "dflt"\n'
            "max_message_ttl = 120\nmax_messages_post_size = 300\n"
        ),
        read_only=False,
    )
    proc.start()
    try:
        base = f"http://127.0.0.1:{http_port}"
        with httpx.Client(base_url=base, headers={"Client-ID": CLIENT}, timeout=30) as bare, \
                httpx.Client(base_url=base, headers={"Client-ID": CLIENT, "X-Project-Id": "dflt"}, timeout=30) as dflt:
            assert bare.put("/v1.1/queues/jobs").status_code == 201
            assert [q["name"] for q in dflt.get("/v1.1/queues").json()["queues"]] == ["jobs"]
            ok = bare.post("/v1.1/queues/jobs/messages", json={"messages": [{"body": 1, "ttl": 120}]})
            assert ok.status_code == 201, ok.text
            too_long = bare.post("/v1.1/queues/jobs/messages", json={"messages": [{"body": 1, "ttl": 121}]})
            assert too_long.status_code == 400
            assert "120" in too_long.json()["description"]
            big = bare.post("/v1.1/queues/jobs/messages", json={"messages": [{"body": "x" * 400}]})
            assert big.status_code == 400, big.text
            assert "300" in big.json()["description"]
            error(bare.get("/v1.1/queues", headers={"X-Project-Id": ""}), 400, "Empty project header not allowed")
    finally:
        proc.stop()
