"""The streaming sink's chunks and digests, the source's claim ids and the stream options: pure code."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("pyspark")

from boxqueue.pipeline import stream_sink
from boxqueue.pipeline.errors import BoxqueueSourceError
from boxqueue.pipeline.options import parse_options, parse_stream_options
from boxqueue.pipeline.stream_sink import chunked
from boxqueue.pipeline.stream_source import claim_ids

ROWS = [[0, 0, 0, 0, f"task-{i}", i] for i in range(1000)]


def test_a_small_partition_is_one_chunk_in_arrival_order():
    _digest, chunks = chunked(ROWS[:50], 100)
    assert chunks == [ROWS[:50]]


def test_the_same_rows_in_another_order_make_the_same_digest_and_chunks():
    digest, chunks = chunked(ROWS, 100)
    shuffled = ROWS[:]
    random.Random(7).shuffle(shuffled)
    again, chunks_again = chunked(shuffled, 100)
    assert again == digest
    assert len(chunks) == len(chunks_again) == 10
    assert [sorted(map(tuple, c)) for c in chunks] == [sorted(map(tuple, c)) for c in chunks_again]
    assert sorted(map(tuple, (row for c in chunks for row in c))) == sorted(map(tuple, ROWS))
    for chunk in chunks:  # arrival order kept within a chunk
        assert chunk == sorted(chunk, key=lambda row: row[5])


def test_other_rows_make_another_digest():
    digest, _ = chunked(ROWS, 100)
    assert chunked(ROWS[:-1], 100)[0] != digest
    assert chunked([*ROWS[:-1], [0, 0, 0, 0, "other", 999]], 100)[0] != digest
    assert chunked([*ROWS, ROWS[0]], 100)[0] != digest  # a row twice


def test_big_rows_are_split_by_size(monkeypatch):
    monkeypatch.setattr(stream_sink, "CHUNK_BYTES", 2000)
    _digest, chunks = chunked(ROWS, 10_000)
    assert len(chunks) > 1
    assert sum(len(c) for c in chunks) == len(ROWS)


def test_claim_ids_of_an_offset():
    assert claim_ids({"stream": "s", "seq": 3, "claims": 2, "tasks": 9, "after": 0}) == ["s.3.0", "s.3.1"]
    assert claim_ids({"stream": "", "seq": 0, "claims": 0, "tasks": 0, "after": 0}) == []


def test_stream_options_and_several_members():
    opts = parse_options({"uri": "10.0.0.1:3301, 10.0.0.2:3302", "failover_timeout": "30"})
    assert (opts.host, opts.port) == ("10.0.0.1", 3301)
    assert opts.members == (("10.0.0.1", 3301), ("10.0.0.2", 3302)) and opts.failover_timeout == 30
    stream = parse_stream_options({"maxTasksPerTrigger": "500", "claimTtl": "2.5", "startingOffsets": "latest"})
    assert (stream.max_tasks_per_trigger, stream.claim_ttl, stream.latest) == (500, 2.5, True)
    assert parse_stream_options({}).tasks_per_partition == 10_000
    with pytest.raises(BoxqueueSourceError, match="'tasksPerPartition' and 'chunkRows' must be at most 100000"):
        parse_stream_options({"tasksPerPartition": "100001"})
    with pytest.raises(BoxqueueSourceError, match="'claimTtl' must be more than 0 seconds"):
        parse_stream_options({"claimTtl": "0"})
