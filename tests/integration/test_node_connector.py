"""The Node connector (tarantool-driver 3.1.0, from the npm registry) against the server.

`make install` fetches it into .venv/node when npm is present; without Node the test is skipped.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import TARGET

ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = ROOT / ".venv" / "node" / "node_modules"
CLIENT = Path(__file__).with_name("node") / "client.js"

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_MODULES / "tarantool-driver").exists(),
    reason="Node.js or the tarantool-driver package is not installed",
)


def test_node_connector(server):
    proc = subprocess.run(
        ["node", str(CLIENT), str(server.port)],
        capture_output=True, text=True, timeout=60, env={"NODE_PATH": str(NODE_MODULES), "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ping"] == {"ok": True}
    assert out["insert"] == {"ok": [[900, "node"]]}
    assert out["select"] == {"ok": [[900, "node"]]}
    assert out["select_by_name_index"] == {"ok": [[900, "node"]]}
    assert out["update"] == {"ok": [[900, "nodejs"]]}
    assert out["upsert"] == {"ok": []}
    assert out["call16_select"] == {"ok": [[900, "nodejs"]]}
    assert out["call16_scalar"] == {"ok": [["guest"]]}
    assert out["duplicate"] == {"error": "Duplicate key exists in unique index 'primary' in space 'test'"}
    assert out["delete"] == {"ok": [[900, "nodejs"]]}
    assert out["delete_upserted"] == {"ok": [[901, "up"]]}
    assert "error" in out["unknown_space"]
    assert out["auth_user"] == {"ok": [["alice"]]}
    if TARGET == "ours":
        assert out["unknown_space"]["error"] == "Cannot read a space name or space is not defined"
        # tarantool/queue's API (the reference Tarantool of this suite runs without the module)
        assert out["queue_create"] == {"ok": []}
        assert out["queue_put"] == {"ok": [[0, "r", "from node"]]}
        assert out["queue_take"] == {"ok": [[0, "t", "from node"]]}
        assert out["queue_ack"] == {"ok": [[0, "-", "from node"]]}
        assert out["queue_drop"] == {"ok": [[True]]}
