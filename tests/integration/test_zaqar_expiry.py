"""The Zaqar facade with the server in the test's own trio loop: expiry of messages and claims
on time, and storage failures answered with 503.

The API's ranges (claim and message ttl of at least 60 s) would make these tests minutes long, so
the claims and messages are made through the same ``ZaqarQueues`` the facade uses, with ttls of
a second or two, and observed over HTTP."""

from __future__ import annotations

import time

import httpx
import pytest
import trio

from boxqueue.config import load_config
from boxqueue.process import Server

HEADERS = {"Client-ID": "3381af92-2b9e-11e3-b191-71861300734c", "X-Project-ID": "p"}


@pytest.fixture
async def running(tmp_path, nursery):
    cfg = tmp_path / "c.toml"
    cfg.write_text('data_dir = "d"\n[iproto]\nlisten = "127.0.0.1:0"\n[zaqar]\nlisten = "127.0.0.1:0"\n')
    server = Server(load_config(cfg), handle_signals=False)
    ports = await nursery.start(server.run)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports.extra['zaqar']}", headers=HEADERS) as client:
        yield server, client
    server.stop()


async def test_claim_expires_on_time_and_grace_keeps_the_message(running):
    server, c = running
    queues = server.zaqar_queues
    ids = await queues.post("p", "q", "someone", [("short", 1), ("long", 600)])
    claim, msgs = await queues.claim("p", "q", ttl=1, grace=1, limit=5)
    assert [m.id for m in msgs] == ids
    r = await c.get(f"/v1.1/queues/q/claims/{claim.id}")
    assert r.status_code == 200 and r.json()["ttl"] == 1
    assert (await c.get("/v1.1/queues/q/messages")).json()["messages"] == []  # claimed: hidden
    started = time.monotonic()
    while (await c.get(f"/v1.1/queues/q/claims/{claim.id}")).status_code == 200:
        assert time.monotonic() - started < 5, "the claim did not expire"
        await trio.sleep(0.05)
    assert time.monotonic() - started > 0.5
    # Free again: listed, with the old claim id still in the href, deletable without a claim;
    # the short message lives on thanks to grace (claim expiry + 1 s).
    listed = (await c.get("/v1.1/queues/q/messages")).json()["messages"]
    assert [m["id"] for m in listed] == ids
    assert listed[0]["href"].endswith(f"?claim_id={claim.id}") and listed[0]["ttl"] == 2
    assert (await c.patch(f"/v1.1/queues/q/claims/{claim.id}", json={})).status_code == 404
    assert (await c.delete(f"/v1.1/queues/q/claims/{claim.id}")).status_code == 204
    r = await c.delete(f"/v1.1/queues/q/messages/{ids[1]}?claim_id={claim.id}")
    assert r.status_code == 400 and "not currently claimed" in r.json()["description"]
    while (await c.get(f"/v1.1/queues/q/messages/{ids[0]}")).status_code == 200:
        assert time.monotonic() - started < 6, "the message outlived its grace"
        await trio.sleep(0.05)
    # The monitor removed it from storage too, not just from view.
    await trio.sleep(0.3)
    assert server.engine.get(server.zaqar_space.id, "p/q", ids[0]) is None
    stats = (await c.get("/v1.1/queues/q/stats")).json()["messages"]
    assert (stats["total"], stats["claimed"]) == (1, 0)
    assert (await c.delete(f"/v1.1/queues/q/messages/{ids[1]}")).status_code == 204


async def test_message_expires_on_time(running):
    server, c = running
    (mid,) = await server.zaqar_queues.post("p", "q", "someone", [("brief", 1)])
    assert (await c.get(f"/v1.1/queues/q/messages/{mid}")).status_code == 200
    started = time.monotonic()
    while (await c.get(f"/v1.1/queues/q/messages/{mid}")).status_code == 200:
        assert time.monotonic() - started < 4
        await trio.sleep(0.05)
    assert (await c.get("/v1.1/queues/q/stats")).json() == {"messages": {"claimed": 0, "free": 0, "total": 0}}
    assert (await c.post("/v1.1/queues/q/claims")).status_code == 204


async def test_renew_extends_the_claim(running):
    server, c = running
    await server.zaqar_queues.post("p", "q", "someone", [("m", 600)])
    claim, _ = await server.zaqar_queues.claim("p", "q", ttl=1, grace=60, limit=1)
    assert await server.zaqar_queues.renew("p", "q", claim.id, ttl=3, grace=60)
    await trio.sleep(1.5)
    r = await c.get(f"/v1.1/queues/q/claims/{claim.id}")
    assert r.status_code == 200 and r.json()["ttl"] == 3 and r.json()["age"] <= 2


async def test_storage_failure_is_503_and_the_server_keeps_serving(running, monkeypatch):
    """A failing commit cannot be caused for real here, so the committer is made to fail."""
    from boxqueue.facades.zaqar.queues import StorageError

    server, c = running
    committer = server.engine.committer
    real_submit = committer.submit

    def failing(*args, **kwargs):
        raise StorageError("disk gone")

    monkeypatch.setattr(committer, "submit", failing)
    r = await c.post("/v1.1/queues/q/messages", json={"messages": [{"body": 1}]})
    assert r.status_code == 503
    assert r.json() == {"title": "Service temporarily unavailable",
                        "description": "Messages could not be enqueued. Please try again in a few seconds."}
    assert "q" not in [x["name"] for x in (await c.get("/v1.1/queues")).json()["queues"]]
    monkeypatch.setattr(committer, "submit", real_submit)
    assert (await c.post("/v1.1/queues/q/messages", json={"messages": [{"body": 1}]})).status_code == 201
    claim = await c.post("/v1.1/queues/q/claims")
    monkeypatch.setattr(committer, "submit", failing)
    r = await c.delete(claim.headers["location"])
    assert r.status_code == 503 and r.json()["description"].startswith("Claim could not be deleted.")
    monkeypatch.setattr(committer, "submit", real_submit)
    assert (await c.get("/v1.1/ping")).status_code == 204
