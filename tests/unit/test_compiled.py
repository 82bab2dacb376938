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
