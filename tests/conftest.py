import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Before anything imports the hot path: with BOXQUEUE_PURE=1 this switches to the .py sources.
import boxqueue  # noqa: E402,F401
from boxqueue.compiled import stale_extensions  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    stale = stale_extensions()
    if stale:
        pytest.exit(
            "compiled modules are older than their sources (run `make build`, or set "
            f"BOXQUEUE_PURE=1): {', '.join(stale)}",
            returncode=4,
        )
