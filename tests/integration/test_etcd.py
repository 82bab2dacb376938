"""The etcd client against a real etcd: leases, the create-if-absent election, watches, failover."""

from contextlib import aclosing

import httpx
import pytest
import trio

from boxqueue.replication.etcd import EtcdClient, EtcdError
from tests.etcdproc import EtcdProcess, free_ports

TIMEOUT = 5.0


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    proc = EtcdProcess(tmp_path_factory.mktemp("etcd"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
async def client(etcd):
    async with EtcdClient([etcd.endpoint], timeout=TIMEOUT) as c:
        yield c


@pytest.fixture
def key(request) -> bytes:
    return f"/boxqueue-test/{request.node.name}".encode()


def closed_endpoints(count: int) -> list[str]:
    return [f"127.0.0.1:{port}" for port in free_ports(count)]


async def watchers(etcd: EtcdProcess) -> int:
    """How many watchers etcd itself is serving, from its /metrics."""
    async with httpx.AsyncClient(trust_env=False) as http:
        text = (await http.get(f"http://{etcd.endpoint}/metrics")).text
    for line in text.splitlines():
        if line.startswith("etcd_debugging_mvcc_watcher_total "):
            return int(float(line.split()[1]))
    raise AssertionError("etcd's /metrics has no etcd_debugging_mvcc_watcher_total")


async def wait_watchers(etcd: EtcdProcess, count: int) -> None:
    with trio.fail_after(5):
        while await watchers(etcd) != count:
            await trio.sleep(0.05)


async def test_lease_grant_keepalive_revoke(etcd, client, key):
    lease = await client.grant(10)
    assert lease > 0
    assert await client.keepalive(lease) == 10
    await client.put(key, b"v", lease)
    assert (await client.get(key)).lease == lease
    await client.revoke(lease)
    assert await client.get(key) is None  # revoking deletes the lease's keys
    assert await client.keepalive(lease) == 0  # the documented answer for a lease that is gone
    with pytest.raises(EtcdError) as err:
        await client.revoke(lease)
    assert err.value.code == 5 and etcd.endpoint in str(err.value) and "lease" in str(err.value)


async def test_a_lease_not_kept_alive_lapses_with_its_key(client, key):
    ttl = 2
    lease = await client.grant(ttl)
    granted = trio.current_time()
    await client.put(key, b"v", lease)
    assert (await client.get(key)).lease == lease
    while await client.get(key) is not None:
        assert trio.current_time() - granted < ttl + 2, "the key outlived its lease"
        await trio.sleep(0.05)
    assert trio.current_time() - granted > ttl - 0.5, "the lease lapsed before its TTL"
    assert await client.keepalive(lease) == 0


async def test_create_if_absent_has_one_winner_and_the_next_term_is_higher(etcd, key):
    async with (EtcdClient([etcd.endpoint], TIMEOUT) as a,
                EtcdClient([etcd.endpoint], TIMEOUT) as b):
        clients = {"a": a, "b": b}
        leases = {name: await c.grant(10) for name, c in clients.items()}
        results = {}

        async def contend(name: str) -> None:
            results[name] = await clients[name].create_if_absent(key, name.encode(), leases[name])

        async with trio.open_nursery() as nursery:
            for name in clients:
                nursery.start_soon(contend, name)
        winners = [name for name, (won, _) in results.items() if won]
        assert len(winners) == 1, results
        winner, loser = winners[0], "b" if winners[0] == "a" else "a"
        term = results[winner][1]
        assert results[loser] == (False, term)  # the loser learns the winner's term
        held = await a.get(key)
        assert (held.value, held.create_revision, held.lease) == (
            winner.encode(), term, leases[winner])
        assert await clients[loser].create_if_absent(key, b"x", leases[loser]) == (False, term)

        await clients[winner].revoke(leases[winner])
        won, next_term = await clients[loser].create_if_absent(key, loser.encode(), leases[loser])
        assert won and next_term > term
        held = await a.get(key)
        assert (held.value, held.create_revision, held.lease) == (
            loser.encode(), next_term, leases[loser])
        await clients[loser].revoke(leases[loser])


async def test_delete_if_spares_a_successors_key(client, key):
    old = await client.grant(10)
    won, old_term = await client.create_if_absent(key, b"old", old)
    assert won
    await client.revoke(old)  # the old leader's lease ends and a successor is elected ...
    new = await client.grant(10)
    won, new_term = await client.create_if_absent(key, b"new", new)
    assert won and new_term > old_term
    assert await client.delete_if(key, old_term) is False  # ... so the old one's step-down misses
    assert (await client.get(key)).value == b"new"
    assert await client.delete_if(key, new_term) is True
    assert await client.get(key) is None
    assert await client.delete_if(key, new_term) is False
    await client.revoke(new)


async def test_watch_sees_puts_and_deletes_including_a_lapsed_lease(etcd, client, key):
    baseline = await watchers(etcd)
    first = await client.put(key, b"1")
    send, receive = trio.open_memory_channel(100)
    ended = trio.Event()

    async def consume(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            async for event in client.watch(key, start_revision=first):
                await send.send((trio.current_time(), event))
        ended.set()  # cancelling the consumer ends the iteration without an error

    async with trio.open_nursery() as nursery:
        scope = await nursery.start(consume)
        await client.delete(key)
        lease = await client.grant(2)
        granted = trio.current_time()
        await client.put(key, b"2", lease)
        with trio.fail_after(2 + 2):
            events = [await receive.receive() for _ in range(4)]
        await wait_watchers(etcd, baseline + 1)
        scope.cancel()
        with trio.fail_after(2):
            await ended.wait()
    await wait_watchers(etcd, baseline)  # the stream is closed at etcd's end too

    kinds = [(e.type, e.kv.key, e.kv.value) for _, e in events]
    assert kinds == [("PUT", key, b"1"), ("DELETE", key, b""), ("PUT", key, b"2"),
                     ("DELETE", key, b"")]
    put1, delete1, put2, lapse = (e for _, e in events)
    assert put1.kv.mod_revision == put1.kv.create_revision == first
    assert first < delete1.kv.mod_revision < put2.kv.create_revision < lapse.kv.mod_revision
    assert put2.kv.lease == lease and delete1.kv.create_revision == 0
    assert events[3][0] - granted < 2 + 2  # the lapse is seen within ttl + 2 s
    assert await client.get(key) is None  # the client still serves after its watch ended


async def test_a_watch_from_now_skips_history(client, key):
    await client.put(key, b"old")
    async with trio.open_nursery() as nursery:
        async def write_until_seen() -> None:
            for i in range(100):  # the watch is set up concurrently: write until it sees one
                await client.put(key, f"new{i}".encode())
                await trio.sleep(0.05)

        nursery.start_soon(write_until_seen)
        with trio.fail_after(5):
            async with aclosing(client.watch(key)) as events:
                async for event in events:
                    assert event.kv.value.startswith(b"new")
                    break
        nursery.cancel_scope.cancel()


async def test_a_watch_left_by_break_closes_its_stream(etcd, client, key):
    baseline = await watchers(etcd)
    first = await client.put(key, b"1")
    await client.put(key, b"2")
    async with aclosing(client.watch(key, start_revision=first)) as events:
        async for event in events:
            assert event.kv.value == b"1"
            await wait_watchers(etcd, baseline + 1)
            break
    await wait_watchers(etcd, baseline)


async def test_a_watch_on_compacted_history_raises(etcd, client, key):
    first = await client.put(key, b"1")
    now = await client.put(key, b"2")
    async with httpx.AsyncClient(trust_env=False) as http:
        answer = await http.post(f"http://{etcd.endpoint}/v3/kv/compaction",
                                 json={"revision": str(now)})
        answer.raise_for_status()
    with trio.fail_after(5), pytest.raises(EtcdError, match="compacted"):
        async for _ in client.watch(key, start_revision=first):
            pass


async def test_fails_over_past_a_closed_port(etcd, key):
    async with EtcdClient([*closed_endpoints(1), etcd.endpoint], TIMEOUT) as c:
        revision = await c.put(key, b"v")
        assert (await c.get(key)).mod_revision == revision
    async with EtcdClient([*closed_endpoints(1), etcd.endpoint], TIMEOUT) as c:
        with trio.fail_after(5):
            async with aclosing(c.watch(key, start_revision=revision)) as events:
                async for event in events:
                    assert (event.type, event.kv.value) == ("PUT", b"v")
                    break


async def test_wrong_endpoints_raise_etcd_error_naming_them(etcd):
    closed = closed_endpoints(2)
    async with EtcdClient(closed, TIMEOUT) as c:
        with trio.fail_after(2 * TIMEOUT), pytest.raises(EtcdError) as err:
            await c.get(b"k")
        assert "no etcd endpoint reachable" in str(err.value)
        assert all(endpoint in str(err.value) for endpoint in closed)
        with trio.fail_after(2 * TIMEOUT), pytest.raises(EtcdError, match="no etcd endpoint"):
            async for _ in c.watch(b"k"):
                pass
    async with EtcdClient([etcd.peer_endpoint], TIMEOUT) as c:  # HTTP, but not etcd's client API
        with pytest.raises(EtcdError, match="HTTP 404") as err:
            await c.get(b"k")
        assert etcd.peer_endpoint in str(err.value)
    with pytest.raises(ValueError):
        EtcdClient([], TIMEOUT)


async def test_an_etcd_that_dies_ends_the_watch_with_an_error(tmp_path, key):
    etcd = EtcdProcess(tmp_path / "etcd")
    etcd.start()
    try:
        async with EtcdClient([etcd.endpoint], TIMEOUT) as c:
            revision = await c.put(key, b"v")
            with pytest.raises(EtcdError) as err:
                with trio.fail_after(5):
                    async for event in c.watch(key, start_revision=revision):
                        assert event.kv.value == b"v"
                        etcd.kill()
            assert etcd.endpoint in str(err.value)
            with pytest.raises(EtcdError):
                await c.get(key)
            etcd.start()  # the same ports and data: the client finds it again
            assert (await c.get(key)).mod_revision == revision
    finally:
        etcd.kill()


async def unserving_member(*, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """An etcd member that cannot serve, as a minority member behind a partition answers through
    the gateway: 503 with gRPC's UNAVAILABLE (14). A stand-in for the one fault a loopback etcd
    cannot show (the fault suite, tests/faults, cuts a real member of a three-member etcd)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])

    async def answer(stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += await stream.receive_some(65536)
            payload = b'{"error":"etcdserver: no leader","code":14,"message":"etcdserver: no leader"}'
            await stream.send_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(payload), payload))

    await trio.serve_listeners(answer, listeners)


async def test_a_member_that_cannot_serve_is_left_for_the_next(etcd, key):
    """Reads and keepalives go on to the next endpoint at once; a write that member may have
    applied is not sent again, but fails, and the next call starts at the next endpoint."""
    async with trio.open_nursery() as nursery:
        port = await nursery.start(unserving_member)
        sick = f"127.0.0.1:{port}"
        async with EtcdClient([sick, etcd.endpoint], TIMEOUT) as c:
            assert await c.get(key) is None  # the read is answered by the second endpoint
            revision = await c.put(key, b"v")  # ... which later calls start at
            assert (await c.get(key)).mod_revision == revision
        async with EtcdClient([sick, etcd.endpoint], TIMEOUT) as c:
            with pytest.raises(EtcdError, match="no leader") as err:
                await c.put(key, b"w")
            assert err.value.code == 14
            await c.put(key, b"w")  # the next call: the next endpoint
            lease = await c.grant(10)
            assert await c.keepalive(lease) == 10
        nursery.cancel_scope.cancel()
