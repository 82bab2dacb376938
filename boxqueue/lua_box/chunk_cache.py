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


class ChunkCache(OrderedDict[str, Any]):
    """Source -> compiled Lua function. Look up with ``get`` and ``used`` (both C calls: this is
    on the path of every EVAL); ``compiled`` counts what had to be compiled."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_source_chars: int = MAX_SOURCE_CHARS) -> None:
        super().__init__()
        self._max_entries = max_entries
        self._max_source_chars = max_source_chars
        self.compiled = 0
        self.used = self.move_to_end  # after a hit: most recently used

    def put(self, source: str, fn: Any) -> None:
        self.compiled += 1
        if len(source) > self._max_source_chars:
            return
        self[source] = fn
        if len(self) > self._max_entries:
            self.popitem(last=False)
