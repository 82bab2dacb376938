import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.serverproc import ServerProcess, free_port, wait_for_greeting

# BOXQUEUE_TEST_TARGET=tarantool runs the shared-server tests against a real Tarantool (Debian's
# package) set up by tarantool_reference.lua: a check that the expectations are Tarantool's.
TARGET = os.environ.get("BOXQUEUE_TEST_TARGET", "ours")

TEST_SPACES = """
[guest]
grants = [{ privileges = ["read", "write", "execute"], object_type = "universe" }]

[[users]]
name = "alice"
password = "secret"
grants = [{ privileges = ["read", "write", "execute"], object_type = "universe" }]

[[users]]
name = "reader"
password = "r"
grants = [{ privileges = ["read"], object_type = "space", object_name = "test" }]
[[space]]
id = 512
name = "test"
format = [{name = "id", type = "unsigned"}, {name = "name", type = "string"}, {name = "val", type = "any", is_nullable = true}]
indexes = [
  {name = "primary", type = "TREE", unique = true, parts = [{field = 0, type = "unsigned"}]},
  {name = "name", type = "TREE", unique = false, parts = [{field = 1, type = "string"}]},
]

[[space]]
id = 513
name = "hsh"
indexes = [{name = "pk", type = "HASH", unique = true, parts = [{field = 0, type = "string"}]}]

[[space]]
id = 514
name = "multi"
indexes = [
  {name = "primary", type = "TREE", unique = true, parts = [{field = 0, type = "unsigned"}]},
  {name = "pair", type = "TREE", unique = false, parts = [{field = 1, type = "unsigned"}, {field = 2, type = "string"}]},
]

[[space]]
id = 515
name = "scalars"
indexes = [{name = "primary", type = "TREE", unique = true, parts = [{field = 0, type = "scalar"}]}]

[[space]]
id = 516
name = "typed"
format = [
  {name = "id", type = "unsigned"}, {name = "i", type = "integer"}, {name = "n", type = "number"},
  {name = "d", type = "double"}, {name = "s", type = "string"}, {name = "b", type = "boolean"},
  {name = "v", type = "varbinary"}, {name = "sc", type = "scalar"}, {name = "u", type = "uuid"},
  {name = "dec", type = "decimal"}, {name = "dt", type = "datetime"}, {name = "a", type = "any"},
  {name = "opt", type = "string", is_nullable = true},
]
indexes = [
  {name = "primary", type = "TREE", unique = true, parts = [{field = 0, type = "unsigned"}]},
  {name = "by_uuid", type = "TREE", unique = true, parts = [{field = 8, type = "uuid"}]},
  {name = "by_opt", type = "TREE", unique = true, parts = [{field = 12, type = "string", is_nullable = true}]},
]

[[space]]
id = 517
name = "longkeys"
indexes = [
  {name = "primary", type = "TREE", unique = true, parts = [{field = 0, type = "string"}]},
  {name = "tag", type = "TREE", unique = false, parts = [{field = 1, type = "string"}]},
]
"""


class ReferenceTarantool:
    """A real Tarantool with the same spaces and users, when BOXQUEUE_TEST_TARGET=tarantool (or
    another setup: ``script`` in this folder, ``env`` added to its environment)."""

    def __init__(self, workdir: Path, script: str = "tarantool_reference.lua", env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.workdir = workdir
        environment = dict(os.environ, TT_PORT=str(self.port), TT_DIR=str(workdir), **(env or {}))
        path = Path(__file__).with_name(script)
        self.proc = subprocess.Popen([shutil.which("tarantool") or "tarantool", str(path)], env=environment)
        wait_for_greeting(self.port, 30, self.proc)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """One server shared by the tests that do not restart it; each test cleans what it uses."""
    if TARGET == "tarantool":
        ref = ReferenceTarantool(tmp_path_factory.mktemp("tarantool"))
        yield ref
        ref.stop()
        return
    proc = ServerProcess(tmp_path_factory.mktemp("shared"), extra_config=TEST_SPACES)
    proc.start()
    yield proc
    proc.stop()


def ours_only():
    return pytest.mark.skipif(TARGET != "ours", reason="checks boxqueue itself, not Tarantool")


@pytest.fixture
def fresh_server(tmp_path):
    """A server of the test's own, for restarts, kills and configuration."""
    proc = ServerProcess(tmp_path / "srv", extra_config=TEST_SPACES)
    yield proc
    proc.kill()


@pytest.fixture
def conn(server):
    import tarantool

    c = tarantool.connect("127.0.0.1", server.port)
    for name in ("test", "hsh", "multi", "scalars", "typed", "longkeys"):
        c.call(f"box.space.{name}:truncate")
    yield c
    c.close()


def pytest_terminal_summary(terminalreporter, config):
    """What tests/integration/test_doc_examples.py did with each example of the README and docs/."""
    from tests.integration.doc_blocks import REPORT

    done = config.stash.get(REPORT, [])
    if not done:
        return
    kinds: dict[str, int] = {}
    for _name, what, _reason in done:
        kinds[what] = kinds.get(what, 0) + 1
    terminalreporter.write_sep("-", f"README and docs/ examples: {len(done)} blocks")
    terminalreporter.write_line(", ".join(f"{what}: {n}" for what, n in sorted(kinds.items())))
    for name, what, reason in done:
        terminalreporter.write_line(f"  {name}: {what}{': ' + reason if reason else ''}")
