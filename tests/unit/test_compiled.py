"""The hot path runs compiled in `make test`, and from its sources under BOXQUEUE_PURE=1."""

import importlib

import pytest

from boxqueue.compiled import COMPILED_MODULES, is_compiled, pure_requested, source_path


@pytest.mark.parametrize("name", COMPILED_MODULES)
def test_module_is_loaded_the_way_the_build_asks(name: str) -> None:
    module = importlib.import_module(name)
    if pure_requested():
        assert not is_compiled(module)
        assert module.__file__ == str(source_path(name))
    else:
        assert is_compiled(module), f"{name} was imported from {module.__file__}; run `make build`"


def test_stale_extensions_tell_a_build_in_place_from_an_installed_package(tmp_path, monkeypatch) -> None:
    """A module built here (its generated C beside it) whose source is newer than its extension
    is stale; ``built_here_only`` leaves out modules with no C beside them (an installed package,
    whose files' times say when they were unpacked)."""
    import os

    from boxqueue import compiled

    monkeypatch.delenv("BOXQUEUE_PURE", raising=False)
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for name, has_c in (("built", True), ("installed", False)):
        (pkg / f"{name}.py").write_text("x = 1\n")
        (pkg / f"{name}.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
        if has_c:
            (pkg / f"{name}.c").write_text("")
        os.utime(pkg / f"{name}.cpython-311-x86_64-linux-gnu.so", (1000, 1000))  # older than the source
    monkeypatch.setattr(compiled, "ROOT", tmp_path)
    monkeypatch.setattr(compiled, "COMPILED_MODULES", ("pkg.built", "pkg.installed"))
    assert compiled.stale_extensions() == ["pkg.built", "pkg.installed"]
    assert compiled.stale_extensions(built_here_only=True) == ["pkg.built"]
    os.utime(pkg / "built.cpython-311-x86_64-linux-gnu.so")  # rebuilt: now newer
    assert compiled.stale_extensions(built_here_only=True) == []


ALLOWED_ROOTS = ("python_root", "partial(trio.to_thread.run_sync")  # ours, or trio's own thread host


def _unrooted_spawns(source: str) -> list[tuple[int, str]]:
    """(line, first argument) of each ``start_soon`` or ``start`` call whose task would not have
    a Python coroutine at its root."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("start_soon", "start") and node.args):
            root = ast.unparse(node.args[0])
            if not root.startswith(ALLOWED_ROOTS):
                found.append((node.lineno, root))
    return found


@pytest.mark.parametrize("name", COMPILED_MODULES)
def test_compiled_code_starts_its_tasks_at_a_python_root(name: str) -> None:
    """trio asks a task that takes a lock for its root coroutine's state, which a compiled
    coroutine cannot answer (boxqueue/task_roots.py): a task started by compiled code has
    ``python_root`` first, or trio's own host of a thread."""
    assert _unrooted_spawns(source_path(name).read_text()) == []


def test_the_root_check_finds_a_task_started_without_its_root() -> None:
    source = "nursery.start_soon(python_root, self._run, t)\nnursery.start_soon(self._run, t)\n"
    assert _unrooted_spawns(source) == [(2, "self._run")]
