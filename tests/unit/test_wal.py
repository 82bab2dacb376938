"""The write-ahead log's format and reading rules: framing, torn tails, damage, LSN order, segments."""

from pathlib import Path

import pytest

from boxqueue.storage.wal import (
    FILE_MAGIC,
    HEADER_SIZE,
    LogReader,
    WalCorruption,
    WalError,
    WriteAheadLog,
    encode_record,
    list_segments,
    parse_records,
    segment_name,
)


def write_segment(directory: Path, first_lsn: int, payloads: list[bytes], tail: bytes = b"") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / segment_name(first_lsn)
    body = b"".join(encode_record(first_lsn + i, p) for i, p in enumerate(payloads))
    path.write_bytes(FILE_MAGIC + body + tail)
    return path


def read_all(directory: Path, after: int = 0) -> tuple[list[tuple[int, bytes]], LogReader]:
    reader = LogReader(directory, after)
    return [(lsn, bytes(p)) for lsn, _term, p in reader.records()], reader


def test_records_round_trip():
    data = encode_record(7, b"hello") + encode_record(8, b"") + encode_record(9, b"x" * 70000)
    records, end, problem = parse_records(data, 0)
    assert [(lsn, bytes(p)) for lsn, _term, p in records] == [(7, b"hello"), (8, b""), (9, b"x" * 70000)]
    assert end == len(data) and problem is None
    assert len(encode_record(1, b"abc")) == HEADER_SIZE + 3


def test_reader_yields_only_records_after_the_given_lsn(tmp_path):
    write_segment(tmp_path, 1, [b"a", b"b", b"c"])
    write_segment(tmp_path, 4, [b"d", b"e"])
    records, reader = read_all(tmp_path, after=2)
    assert records == [(3, b"c"), (4, b"d"), (5, b"e")]
    assert reader.last_lsn == 5 and reader.torn is None


def test_every_cut_of_the_last_record_is_a_torn_tail(tmp_path):
    last = encode_record(3, b"the last group" * 10)
    for cut in range(1, len(last)):
        write_segment(tmp_path, 1, [b"one", b"two"], tail=last[:cut])
        records, reader = read_all(tmp_path)
        assert records == [(1, b"one"), (2, b"two")], cut
        assert reader.torn is not None and reader.last_lsn == 2


def test_a_bad_checksum_in_the_last_record_is_a_torn_tail(tmp_path):
    last = bytearray(encode_record(3, b"payload"))
    last[-1] ^= 0xFF
    write_segment(tmp_path, 1, [b"one", b"two"], tail=bytes(last))
    records, reader = read_all(tmp_path)
    assert records == [(1, b"one"), (2, b"two")]
    assert "checksum" in reader.torn


def test_a_zero_filled_tail_is_room_made_ahead_not_damage(tmp_path):
    """Segments are zero-filled ahead of their records; a crash leaves the zeros, in the last
    segment or (before a rotated segment was cut to its records) in an earlier one."""
    write_segment(tmp_path, 1, [b"one"], tail=b"\0" * 5000)
    write_segment(tmp_path, 2, [b"two"], tail=b"\0" * 70)
    records, reader = read_all(tmp_path)
    assert records == [(1, b"one"), (2, b"two")] and reader.torn is None


def test_a_torn_record_followed_by_zeros_is_a_torn_tail(tmp_path):
    last = encode_record(2, b"the last group" * 10)
    for cut in (1, 10, len(last) - 1):
        write_segment(tmp_path, 1, [b"one"], tail=last[:cut] + b"\0" * (4096 - cut))
        records, reader = read_all(tmp_path)
        assert records == [(1, b"one")] and reader.torn is not None, cut


def test_a_damaged_record_in_the_middle_is_an_error(tmp_path):
    path = write_segment(tmp_path, 1, [b"one", b"two", b"three"])
    data = bytearray(path.read_bytes())
    second = len(FILE_MAGIC) + len(encode_record(1, b"one"))
    data[second + HEADER_SIZE] ^= 0x01  # a payload byte of record 2
    path.write_bytes(bytes(data))
    with pytest.raises(WalCorruption, match="valid records after it"):
        read_all(tmp_path)


def test_a_damaged_length_in_the_middle_is_an_error(tmp_path):
    path = write_segment(tmp_path, 1, [b"one", b"two", b"three"])
    data = bytearray(path.read_bytes())
    second = len(FILE_MAGIC) + len(encode_record(1, b"one"))
    data[second + 4 : second + 8] = (10**6).to_bytes(4, "little")  # points past the end of the file
    path.write_bytes(bytes(data))
    with pytest.raises(WalCorruption):
        read_all(tmp_path)


def test_damage_at_the_end_of_a_segment_followed_by_another_is_an_error(tmp_path):
    write_segment(tmp_path, 1, [b"one"], tail=encode_record(2, b"two")[:-1])
    write_segment(tmp_path, 2, [b"two", b"three"])
    with pytest.raises(WalCorruption):
        read_all(tmp_path)


def test_an_lsn_gap_is_an_error(tmp_path):
    write_segment(tmp_path, 1, [b"one", b"two"])
    write_segment(tmp_path, 4, [b"four"])  # 3 is missing
    with pytest.raises(WalCorruption, match="LSN 4 where 3"):
        read_all(tmp_path)


def test_a_log_that_starts_past_the_database_is_an_error(tmp_path):
    write_segment(tmp_path, 10, [b"ten"])
    with pytest.raises(WalCorruption, match="missing"):
        read_all(tmp_path, after=5)
    records, _ = read_all(tmp_path, after=9)
    assert records == [(10, b"ten")]


def test_a_foreign_file_is_refused_and_a_cut_header_is_a_torn_tail(tmp_path):
    (tmp_path / segment_name(1)).write_bytes(b"something else entirely")
    with pytest.raises(WalError, match="not a boxqueue log"):
        read_all(tmp_path)
    (tmp_path / segment_name(1)).write_bytes(FILE_MAGIC[:3])
    records, reader = read_all(tmp_path)
    assert records == [] and reader.torn is not None


def test_appends_rotation_and_deletion_of_segments(tmp_path):
    wal = WriteAheadLog(tmp_path, 1)
    assert not wal.rotate(1)  # nothing written: no new segment
    for lsn in (1, 2, 3):
        wal.append(encode_record(lsn, b"r%d" % lsn))
    wal.sync()
    assert wal.rotate(4)
    wal.append(encode_record(4, b"r4"))
    wal.sync()
    assert wal.rotate(5)
    wal.append(encode_record(5, b"r5"))
    assert [lsn for lsn, _ in list_segments(tmp_path)] == [1, 4, 5]
    assert wal.discard_through(2) == 0  # segment 1 still holds record 3
    assert wal.discard_through(3) == 1
    assert [lsn for lsn, _ in list_segments(tmp_path)] == [4, 5]
    assert wal.discard_through(100) == 1  # never the current segment
    assert [lsn for lsn, _ in list_segments(tmp_path)] == [5]
    records, _ = read_all(tmp_path, after=4)
    assert records == [(5, b"r5")]
    wal.retire()
    assert list_segments(tmp_path) == []


def test_a_cut_back_append_leaves_no_fragment(tmp_path):
    wal = WriteAheadLog(tmp_path, 1)
    wal.append(encode_record(1, b"kept"))
    start = wal.size
    wal.append(encode_record(2, b"taken back"))
    wal.cut_back(start)
    wal.append(encode_record(2, b"instead"))
    wal.close()
    records, reader = read_all(tmp_path)
    assert records == [(1, b"kept"), (2, b"instead")] and reader.torn is None


def test_records_overwrite_zeros_written_ahead_and_a_closed_segment_is_cut_to_its_records(tmp_path):
    from boxqueue.storage.wal import PREALLOCATE_BYTES

    wal = WriteAheadLog(tmp_path, 1)
    first = tmp_path / segment_name(1)
    wal.append(encode_record(1, b"r1"))
    assert first.stat().st_size == len(FILE_MAGIC) + PREALLOCATE_BYTES  # room for the next records
    big = b"x" * (PREALLOCATE_BYTES + 10)  # a record larger than one step gets room enough
    wal.append(encode_record(2, big))
    assert first.stat().st_size >= wal.size
    wal.sync()
    records, reader = read_all(tmp_path)
    assert records == [(1, b"r1"), (2, big)] and reader.torn is None
    size = wal.size
    assert wal.rotate(3)
    assert first.stat().st_size == size  # no zeros left in a segment no longer appended to
    wal.append(encode_record(3, b"r3"))
    wal.close()
    assert (tmp_path / segment_name(3)).stat().st_size == len(FILE_MAGIC) + len(encode_record(3, b"r3"))
    assert [lsn for lsn, _ in read_all(tmp_path)[0]] == [1, 2, 3]


def test_a_record_taken_back_leaves_zeros_not_a_readable_record(tmp_path):
    wal = WriteAheadLog(tmp_path, 1)
    wal.append(encode_record(1, b"kept"))
    start = wal.size
    wal.append(encode_record(2, b"taken back"))
    wal.cut_back(start)
    wal.sync()  # a crash now: the file still has its room, and record 2 is not in it
    data = (tmp_path / segment_name(1)).read_bytes()
    assert b"taken back" not in data and len(data) > start
    records, reader = read_all(tmp_path)
    assert records == [(1, b"kept")] and reader.torn is None


def test_records_carry_their_term_and_records_without_one_are_read_as_term_0(tmp_path):
    """The term was added to the record header; a log written before that is still read."""
    import struct
    import zlib

    def v1_record(lsn: int, payload: bytes) -> bytes:
        prefix = struct.pack("<4sIQ", b"BQr\x01", len(payload), lsn)
        return prefix + struct.pack("<I", zlib.crc32(payload, zlib.crc32(prefix))) + payload

    data = v1_record(1, b"old") + encode_record(2, b"new", term=7) + encode_record(3, b"newer", term=9)
    (tmp_path / "00000000000000000001.wal").write_bytes(FILE_MAGIC + data)
    reader = LogReader(tmp_path, 0)
    assert [(lsn, term, bytes(p)) for lsn, term, p in reader.records()] == [(1, 0, b"old"), (2, 7, b"new"), (3, 9, b"newer")]
    assert reader.torn is None
    torn = data + encode_record(4, b"cut", term=9)[:-1]
    (tmp_path / "00000000000000000001.wal").write_bytes(FILE_MAGIC + torn)
    reader = LogReader(tmp_path, 0)
    assert [lsn for lsn, _t, _p in reader.records()] == [1, 2, 3] and reader.torn is not None
