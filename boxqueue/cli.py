"""``boxqueue serve --config FILE [--data-dir DIR]``, ``boxqueue check-config FILE``,
``boxqueue init [DIR]``, ``boxqueue --version``."""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.resources
import logging
import sys
from pathlib import Path

import trio

from boxqueue import tls
from boxqueue.compiled import stale_extensions
from boxqueue.config import ConfigError, load_config
from boxqueue.errcodes import BoxError
from boxqueue.process import Server
from boxqueue.storage.environment import StorageError


def version() -> str:
    """The installed distribution's version (the project's ``pyproject.toml``)."""
    try:
        return importlib.metadata.version("boxqueue")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="boxqueue", description="A Tarantool-compatible queue server")
    parser.add_argument("--version", action="version", version=f"boxqueue {version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the server")
    serve.add_argument("--config", required=True, help="TOML config, or a Tarantool 1.5 .cfg")
    serve.add_argument("--data-dir", help="LMDB directory (overrides data_dir)")
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    check = commands.add_parser("check-config", help="validate a configuration file without starting anything")
    check.add_argument("file", help="TOML config, or a Tarantool 1.5 .cfg")
    init = commands.add_parser("init", help="write a starter configuration, boxqueue.toml, into DIR")
    init.add_argument("dir", nargs="?", default=".", help="where to write it (default: here)")
    return parser


STARTER = "boxqueue.toml"  # package data: the repository's conf/boxqueue.toml


def init(folder: str) -> int:
    """Write the shipped configuration as ``DIR/boxqueue.toml``, its data directory beside it,
    for people who install the wheel rather than clone the repository; an existing file stays."""
    target = Path(folder) / STARTER
    if target.exists():
        print(f"boxqueue: {target} exists already; nothing written", file=sys.stderr)
        return 2
    text = importlib.resources.files("boxqueue").joinpath(STARTER).read_text()
    for old, new in (
        ("boxqueue serve --config conf/boxqueue.toml", f"boxqueue serve --config {target}"),
        ("`data/` at the top of the repository.", "`data/` beside this file."),
        ('data_dir = "../data"', 'data_dir = "data"'),
    ):
        if old not in text:
            raise RuntimeError(f"the starter configuration no longer holds {old!r}")
        text = text.replace(old, new, 1)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    print(f"wrote {target}; start with: boxqueue serve --config {target}")
    return 0


def tune_interpreter() -> None:
    """Process-wide settings for serving (also used by the benchmarks that run the server)."""
    # Commits in fsync mode run in a worker thread; with the default 5 ms switch interval the
    # event loop and that thread wait milliseconds for each other's GIL.
    sys.setswitchinterval(0.00002)
    # Each request allocates a few short-lived containers; with the default threshold (700) the
    # young generation is collected every few requests, and the older ones, which hold every
    # task of every tube, far more often than the garbage they catch is worth.
    gc.set_threshold(20_000, 20, 20)


def check_config(path: str) -> int:
    """Read and check a configuration as ``serve`` would (keys, types, files it names such as TLS
    certificates), and say so: 0 when it would start, 2 with the reason otherwise."""
    try:
        config = load_config(path)
        tls.check_all(config)
    except ConfigError as exc:
        print(f"boxqueue: {exc}", file=sys.stderr)
        return 2
    print(f"{path}: ok")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check-config":
        return check_config(args.file)
    if args.command == "init":
        return init(args.dir)
    stale = stale_extensions(built_here_only=True)
    if stale:  # what would run is not what the sources say
        print("boxqueue: compiled modules are older than their sources (run `make build`, or set "
              f"BOXQUEUE_PURE=1): {', '.join(stale)}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # The etcd client's every request (a replica set's leases, several a second) is not news.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = load_config(args.config, args.data_dir)
        tls.check_all(config)
    except ConfigError as exc:
        print(f"boxqueue: {exc}", file=sys.stderr)
        return 2
    tune_interpreter()
    try:
        server = Server(config)
        trio.run(server.run)
    except KeyboardInterrupt:
        return 0
    except BaseException as exc:
        leaves = _leaves(exc)
        if leaves and all(isinstance(e, StorageError | OSError | BoxError) for e in leaves):
            for leaf in leaves:
                if isinstance(leaf, BoxError) and server.served:  # no task caught it: where from, for the fix
                    logging.getLogger("boxqueue").error("the server ends on an error no task caught", exc_info=leaf)
                prefix = "cannot listen: " if isinstance(leaf, OSError) else ""
                print(f"boxqueue: {prefix}{leaf}", file=sys.stderr)
            return 1
        raise
    return 0


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        out: list[BaseException] = []
        for inner in exc.exceptions:
            out.extend(_leaves(inner))
        return out
    return [exc]


if __name__ == "__main__":
    sys.exit(main())
