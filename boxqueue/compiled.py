"""Which modules are compiled with Cython, and how to run without them.

The hot path (framing, dispatch, keys, tuples, group commit) is compiled from the same ``.py``
files the interpreter runs: Cython's pure-Python mode, as ``msgpack`` and ``aiohttp`` ship their
speed. Where a module's classes are used by other compiled modules, a ``.pxd`` beside the ``.py``
declares their C attributes and methods (Cython's "augmenting .pxd"), so those modules reach them
directly. ``make install`` builds one extension module beside each source listed here; Python then
imports the extension (it is found before the ``.py``).

``BOXQUEUE_PURE=1`` in the environment makes every boxqueue process (and the test suite) import
the ``.py`` sources instead, for debugging and to prove the sources still run uncompiled.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

COMPILED_MODULES: tuple[str, ...] = (
    "boxqueue.iproto.codec",
    "boxqueue.iproto.dispatch",
    "boxqueue.iproto.session",
    "boxqueue.iproto.outbox",
    "boxqueue.iproto.connection",
    "boxqueue.iproto.socket_io",
    "boxqueue.iproto.group_sends",
    "boxqueue.iproto.request_stats",
    "boxqueue.iproto.builtins",
    "boxqueue.spaces.space",
    "boxqueue.spaces.iterators",
    "boxqueue.spaces.index_views",
    "boxqueue.spaces.later",
    "boxqueue.spaces.msgpack_values",
    "boxqueue.spaces.msgpack_scan",
    "boxqueue.spaces.access",
    "boxqueue.spaces.update",
    "boxqueue.spaces.fieldtypes",
    "boxqueue.spaces.procedures",
    "boxqueue.spaces.space_procedures",
    "boxqueue.spaces.write_gate",
    "boxqueue.storage.keys",
    "boxqueue.storage.redo",
    "boxqueue.storage.write_queue",
    "boxqueue.tubes.box_queue",
    "boxqueue.tubes.engine_base",
    "boxqueue.tubes.producers",
    "boxqueue.tubes.consumers",
    "boxqueue.tubes.task_verbs",
    "boxqueue.tubes.task",
    "boxqueue.tubes.tube",
    "boxqueue.tubes.ordering",
    "boxqueue.tubes.transitions",
    "boxqueue.tubes.kinds",
    "boxqueue.tubes.tube_records",
    "boxqueue.tubes.numbers",
    "boxqueue.tubes.queue_module",
    "boxqueue.tubes.stream_procedures",
    "boxqueue.tubes.streams",
    "boxqueue.lua_box.values",
    "boxqueue.lua_box.engine",
    "boxqueue.frontdoor.http2_codec",
    "boxqueue.frontdoor.grpc_connections",
    "boxqueue.facades.deckard.service",
    "boxqueue.facades.deckard.translate",
    "boxqueue.facades.deckard.errors",
    "boxqueue.facades.deckard.metering",
)

ROOT = Path(__file__).resolve().parent.parent


def source_path(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def pure_requested() -> bool:
    return os.environ.get("BOXQUEUE_PURE", "") not in ("", "0")


class _SourcesOnly(importlib.abc.MetaPathFinder):
    """Finds the listed modules' ``.py`` files, never their extension modules."""

    def __init__(self, modules: Sequence[str]) -> None:
        self._modules = frozenset(modules)

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: object = None):
        if fullname not in self._modules:
            return None
        leaf = fullname.rpartition(".")[2] + ".py"
        for entry in path or sys.path:
            candidate = os.path.join(entry or ".", leaf)
            if os.path.isfile(candidate):
                return importlib.util.spec_from_file_location(fullname, candidate)
        return None


def use_pure_python() -> None:
    """Import the listed modules from their sources from now on (before they are imported)."""
    loaded = [m for m in COMPILED_MODULES if m in sys.modules]
    if loaded:
        raise RuntimeError(f"already imported, cannot switch to pure Python: {', '.join(loaded)}")
    if not any(isinstance(f, _SourcesOnly) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourcesOnly(COMPILED_MODULES))


def is_compiled(module: object) -> bool:
    """Whether an imported module is the extension rather than its source."""
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)


def stale_extensions(built_here_only: bool = False) -> list[str]:
    """Compiled modules whose extension is missing or older than the source they came from; empty
    in pure mode. Running stale extensions would test yesterday's code. ``built_here_only``: look
    only at modules built in place (their generated C beside the source, as ``make build`` leaves
    it), not at an installed package, whose files' times say when they were unpacked."""
    if pure_requested():
        return []
    stale = []
    for module in COMPILED_MODULES:
        source = source_path(module)
        if built_here_only and not source.with_suffix(".c").exists():
            continue
        declarations = source.with_suffix(".pxd")
        newest = max(p.stat().st_mtime for p in (source, declarations) if p.exists())
        built = sorted(source.parent.glob(source.stem + ".*.so"))
        if not built or built[-1].stat().st_mtime < newest:
            stale.append(module)
    return stale
