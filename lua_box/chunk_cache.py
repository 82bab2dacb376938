"""Compiled Lua chunks by their source, so a repeated EVAL or console statement is not parsed again.

Reusing a compiled chunk is invisible to it: every run is a new call of the same function, in
the same sandbox environment, and a chunk keeps no state of its own between calls. The cache is
bounded (least recently used dropped first), and long sources are not kept at all.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

MAX_ENTRIES = 1024
MAX_SOURCE_CHARS = 16 * 1024


class ChunkCache:
    """(chunk name, source) -> compiled Lua function."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_source_chars: int = MAX_SOURCE_CHARS) -> None:
        self._chunks: OrderedDict[tuple[bytes, str], Any] = OrderedDict()
        self._max_entries = max_entries
        self._max_source_chars = max_source_chars
        self.hits = 0
        self.misses = 0

    def get(self, chunkname: bytes, source: str) -> Any:
        key = (chunkname, source)
        fn = self._chunks.get(key)
        if fn is None:
            self.misses += 1
            return None
        self.hits += 1
        self._chunks.move_to_end(key)
        return fn

    def put(self, chunkname: bytes, source: str, fn: Any) -> None:
        if len(source) > self._max_source_chars:
            return
        self._chunks[(chunkname, source)] = fn
        if len(self._chunks) > self._max_entries:
            self._chunks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._chunks)
