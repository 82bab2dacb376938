"""The iproto connection's direct socket: reads that go through trio only when nothing is there,
and ``missed``, which tells the receive loop whether a read found the socket empty (a client
sending one request at a time: the loop then waits before its next reads instead of trying)."""

import trio

from boxqueue.iproto.socket_io import DirectSocket


async def test_a_read_says_whether_it_found_data_or_had_to_wait(nursery):
    ours, theirs = trio.socket.socketpair()
    io = DirectSocket(trio.SocketStream(ours))
    try:
        await theirs.send(b"ready")
        assert await io.receive(100) == b"ready"
        assert io.missed is False

        async def later() -> None:
            await trio.sleep(0.05)
            await theirs.send(b"late")

        nursery.start_soon(later)
        with trio.fail_after(5):
            assert await io.receive(100) == b"late"
        assert io.missed is True

        await theirs.send(b"again")
        assert await io.receive(100) == b"again"
        assert io.missed is False

        nursery.start_soon(later)
        with trio.fail_after(5):
            assert await io.receive_when_ready(100) == b"late"
        theirs.close()
        assert await io.receive(100) == b""  # the peer's end reads as empty, not as an error
    finally:
        io.detach()
        ours.close()
        theirs.close()
