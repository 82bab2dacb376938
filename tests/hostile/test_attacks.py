"""The attack suite: each attack on a listener of the real server while a well-behaved client
calls the same listener. Each must leave the server's RSS within 100 MB of its start and the
client's p99 under 100 ms, with no error; and the defence that bounds it must be seen to act (the
slow connection cut off at its deadline, the flood ended with GOAWAY ENHANCE_YOUR_CALM, ...).

The probe runs in a process of its own (``probe.py``); the attacks run in this one. On the
2-core machine the server, the attack and the probe share the CPUs."""

from __future__ import annotations

import functools

import pytest

from tests.hostile import attacks
from tests.hostile.conftest import HEADER_TIMEOUT_S, KEEP_ALIVE_S
from tests.hostile.siege import besieged
from tests.raw_http2 import settings

ENHANCE_YOUR_CALM = 11
SLACK_S = 2.0  # the sweep's tick, the attacker's own trickle step and a busy machine


async def besiege(target, listener: str, attack, *args, connections: int = 1, seconds: float = 6.0):
    tally = attacks.Tally()
    run = functools.partial(attacks.workers, connections, attack, target.ports[listener], tally, *args)
    await besieged(target.pid, target.rss_start_kib, listener, target.ports[listener], run, seconds)
    target.check_alive()
    return tally


@pytest.mark.parametrize("listener", ["zaqar", "sonya", "metrics"])
async def test_slowloris_on_an_http_listener(target, listener):
    """200 connections feeding a head a byte every 0.5 s: half on a new connection (the first
    head's deadline), half after a request answered on it (the keep-alive one)."""
    first = {"zaqar": b"GET /v1.1/ping HTTP/1.1\r\nHost: x\r\n\r\n",
             "sonya": b"GET /queue/listen/longpoll/no-such-queue HTTP/1.1\r\nHost: x\r\n\r\n",
             "metrics": b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"}[listener]
    tally = attacks.Tally()
    port = target.ports[listener]

    async def both() -> None:
        async with attacks.trio.open_nursery() as nursery:
            nursery.start_soon(attacks.workers, 100, attacks.http_slowloris, port, tally, None, 0.5)
            nursery.start_soon(attacks.workers, 100, attacks.http_slowloris, port, tally, first, 0.5)

    await besieged(target.pid, target.rss_start_kib, listener, port, both)
    target.check_alive()
    assert tally.lasted, "no slow connection was cut off"
    assert max(tally.lasted) < max(HEADER_TIMEOUT_S, KEEP_ALIVE_S) + SLACK_S, max(tally.lasted)


async def test_slowloris_on_the_grpc_listener(target):
    """The preface, a frame, a head's CONTINUATION: each a byte every 0.3 s, on 200 connections."""
    tally = await besiege(target, "deckard", attacks.grpc_slowloris, 0.3, connections=200)
    assert tally.lasted and max(tally.lasted) < HEADER_TIMEOUT_S + SLACK_S, max(tally.lasted or [0])
    assert tally.goaways[ENHANCE_YOUR_CALM] > 0


async def test_rapid_reset(target):
    tally = await besiege(target, "deckard", attacks.rapid_reset, connections=4)
    assert tally.goaways[ENHANCE_YOUR_CALM] > 0


async def test_hpack_bomb(target):
    tally = await besiege(target, "deckard", attacks.one_shot, attacks.hpack_bomb_block, connections=8)
    assert tally.goaways[ENHANCE_YOUR_CALM] > 10


async def test_continuation_flood(target):
    tally = await besiege(target, "deckard", attacks.one_shot, attacks.continuation_flood, connections=8)
    assert tally.goaways[ENHANCE_YOUR_CALM] > 10


async def test_gzip_bombs_on_every_stream(target):
    """127 streams a connection, each a 4 KiB gzip message of 4 MiB (every other one never ending
    its stream): held as they came, decompressed within the connection's budget, refused past it."""
    bombs = functools.lru_cache(attacks.gzip_bombs)
    tally = await besiege(target, "deckard", attacks.one_shot, bombs, 0.2, connections=4)
    assert tally.ended > 100  # every bomb answered (INTERNAL, RESOURCE_EXHAUSTED, or at its deadline)


async def test_settings_and_ping_floods(target):
    tally = await besiege(target, "deckard", attacks.control_flood, connections=4)
    assert tally.goaways[ENHANCE_YOUR_CALM] > 0


async def test_windows_held_at_zero(target):
    """4 connections x 128 calls whose answers the client's windows never let out (two of the
    connections read nothing at all)."""
    await besiege(target, "deckard", attacks.window_shut, connections=4)


@pytest.mark.parametrize("listener", ["deckard", "zaqar", "sonya", "metrics"])
async def test_thousands_of_idle_connections(patient, listener):
    """2,000 connections that say nothing (a gRPC one its preface and settings, an HTTP one a
    request, then nothing), on a server with the default deadlines: they stay open throughout."""
    greeting = {"deckard": attacks.PREFACE + settings(),
                "zaqar": b"GET /v1.1/ping HTTP/1.1\r\nHost: x\r\nClient-ID: 3f1b0c2e-8a4e-4b7a-9a53-7f0c3c1d2e4f\r\n\r\n",
                "sonya": b"GET /queue/listen/longpoll/no-such-queue HTTP/1.1\r\nHost: x\r\n\r\n",
                "metrics": b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"}[listener]
    tally = await besiege(patient, listener, attacks.idle, greeting, connections=2000, seconds=8.0)
    assert tally.connections >= 2000 and tally.closed == 0
