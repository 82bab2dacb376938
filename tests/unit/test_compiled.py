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
