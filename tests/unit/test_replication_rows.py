"""The replication stream's framing (boxqueue/replication/rows.py): rows split anywhere across
reads, many rows in one read, and bytes that are not rows."""

from __future__ import annotations

import random

import msgpack
import pytest

from boxqueue.replication import rows


def _stream(count: int) -> tuple[bytes, list[tuple[int, int, bytes]]]:
    made = [(lsn, 1 + lsn // 7, bytes([lsn % 251]) * (lsn % 40)) for lsn in range(1, count + 1)]
    wire = b"".join(rows.record(1, 1, lsn, term, payload, 0.0) for lsn, term, payload in made)
    return wire + rows.ack({1: count}, count, 3), made


def _drain(decoder: rows.RowDecoder) -> list[rows.Row]:
    found = []
    while (row := decoder.next_row()) is not None:
        found.append(row)
    return found


def _check(found: list[rows.Row], made: list[tuple[int, int, bytes]]) -> None:
    assert [(r.lsn, r.term, r.body[rows.DATA]) for r in found[:-1]] == made
    assert found[-1].type == rows.OK and found[-1].body[rows.VCLOCK] == {1: len(made)}


@pytest.mark.parametrize("seed", range(20))
def test_rows_split_anywhere_across_reads_come_out_whole_and_in_order(seed: int) -> None:
    wire, made = _stream(300)
    rng = random.Random(seed)
    decoder = rows.RowDecoder()
    found: list[rows.Row] = []
    at = 0
    while at < len(wire):
        step = rng.choice([1, 2, 5, 17, 300, 4096])
        decoder.feed(wire[at : at + step])
        at += step
        found += _drain(decoder)
    _check(found, made)
    assert decoder.next_row() is None


def test_many_rows_in_one_read() -> None:
    wire, made = _stream(5000)
    decoder = rows.RowDecoder()
    decoder.feed(wire)
    _check(_drain(decoder), made)


def test_bytes_that_are_not_rows_are_refused() -> None:
    decoder = rows.RowDecoder()
    decoder.feed(b"\xcd\x00\x05" + b"\x00" * 8)
    with pytest.raises(ValueError, match="32-bit length"):
        decoder.next_row()
    decoder = rows.RowDecoder(max_row=100)
    decoder.feed(b"\xce\x00\x00\x10\x00")
    with pytest.raises(ValueError, match="too long"):
        decoder.next_row()
    truncated = msgpack.packb({0: 0})[:-1]  # a header map cut short inside its row
    decoder = rows.RowDecoder()
    decoder.feed(b"\xce" + len(truncated).to_bytes(4, "big") + truncated)
    with pytest.raises(ValueError, match="two msgpack maps"):
        decoder.next_row()
    not_maps = msgpack.packb([1]) + msgpack.packb({})
    decoder = rows.RowDecoder()
    decoder.feed(b"\xce" + len(not_maps).to_bytes(4, "big") + not_maps)
    with pytest.raises(ValueError, match="header map and a body map"):
        decoder.next_row()


def test_bytes_after_a_rows_body_do_not_spill_into_the_next_row() -> None:
    header, body = msgpack.packb({0: rows.OK}), msgpack.packb({rows.LSN: 9})
    padded = header + body + b"\xc0\xc0"
    wire, made = _stream(3)
    decoder = rows.RowDecoder()
    decoder.feed(b"\xce" + len(padded).to_bytes(4, "big") + padded + wire)
    first = decoder.next_row()
    assert first is not None and first.lsn == 9
    _check(_drain(decoder), made)
