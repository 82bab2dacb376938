"""Tarantool 2.6's own connector, ``net.box``, against the server: the client every Tarantool
application uses to reach another instance. The ``tarantool`` binary (Debian's package, which
`make install` installs where it can) runs ``netbox/client.lua`` as a plain client; without it
the test is skipped.

The DML part also runs against a real Tarantool (BOXQUEUE_TEST_TARGET=tarantool), which checks
that its expectations are Tarantool's; box.queue, tarantool/queue and a schema change made by
another session are boxqueue's alone.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import TEST_SPACES, ours_only
from tests.integration.queue_fixtures import QUEUE_SPACE_0
from tests.serverproc import ServerProcess

CLIENT = Path(__file__).with_name("netbox") / "client.lua"
TARANTOOL = shutil.which("tarantool")

pytestmark = pytest.mark.skipif(
    TARANTOOL is None, reason="the tarantool binary (Debian's tarantool 2.6 package) is not installed"
)

ADMIN = """
[[users]]
name = "admin"
password = "adminpw"
"""


def netbox(port: int, part: str) -> dict:
    proc = subprocess.run([TARANTOOL, str(CLIENT), str(port), part], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_netbox_loads_the_schema_and_runs_dml_call_and_eval(server):
    out = netbox(server.port, "dml")
    assert out.pop("connected") == {"ok": [True]}
    # space 512 'test' with its format; index ids and uniqueness; a two-part index's parts; by id
    assert out.pop("schema") == {"ok": [512, 0, 1, False, ["id", "name", "val"], 2, "string", "hsh"]}
    assert out.pop("ping") == {"ok": [True]}
    assert out.pop("insert") == {"ok": [[900, "netbox"]]}
    assert out.pop("insert_by_id") == {"ok": [[902, "by id"]]}
    assert out.pop("select") == {"ok": [[[900, "netbox"]]]}
    assert out.pop("select_by_name_index") == {"ok": [[[900, "netbox"]]]}
    assert out.pop("select_ge_limit") == {"ok": [[[900, "netbox"], [902, "by id"]]]}
    assert out.pop("get") == {"ok": [[900, "netbox"]]}
    assert out.pop("get_missing") == {"ok": []}
    assert out.pop("update") == {"ok": [[900, "netbox2", 7]]}
    assert out.pop("upsert") == {"ok": []}  # net.box's upsert answers nothing
    assert out.pop("upsert_again") == {"ok": []}
    assert out.pop("replace") == {"ok": [[902, "replaced"]]}
    assert out.pop("count") == {"ok": [3]}
    assert out.pop("duplicate") == {"error": "Duplicate key exists in unique index 'primary' in space 'test'", "code": 3}
    assert out.pop("delete") == {"ok": [[900, "netbox2", 7]]}
    assert out.pop("after_delete") == {"ok": [[[901, "x"], [902, "replaced"]]]}
    assert out.pop("call") == {"ok": ["guest"]}
    assert out.pop("call_args") == {"ok": [[901, "x"]]}
    assert out.pop("call_missing") == {"error": "Procedure 'no_such_function' is not defined", "code": 33}
    assert out.pop("eval") == {"ok": [42, "two"]}
    assert out.pop("no_space") == {"ok": []}
    assert out.pop("cleanup") == {"ok": []}
    assert out.pop("auth_user") == {"ok": ["alice"]}
    assert out.pop("auth_refused") == {"ok": [False, "Incorrect password supplied for user 'alice'"]}
    assert out == {}, "steps the test does not check"


@ours_only()
def test_netbox_calls_box_queue_and_tarantool_queue_and_follows_schema_changes(tmp_path):
    proc = ServerProcess(tmp_path / "srv", extra_config=TEST_SPACES + QUEUE_SPACE_0 + ADMIN)
    proc.start()
    try:
        out = netbox(proc.port, "boxqueue")
    finally:
        proc.stop()
    assert out.pop("connected") == {"ok": [True]}
    # another session's DDL reaches this connection's schema (the schema version in the answers)
    assert out.pop("ddl") == {"ok": [True]}
    assert out.pop("new_space_insert") == {"ok": [[1, "fresh"]]}
    assert out.pop("drop") == {"ok": []}
    assert out.pop("dropped") == {"ok": [True]}
    # box.queue over CALL
    [[task_id, *put]] = out.pop("put")["ok"]
    assert len(task_id) == 32 and put == ["netbox", "ready", "hello", "world"]
    [[stored]] = out.pop("queue_space_select")["ok"]
    assert stored[:3] == [task_id, "netbox", "r"] and stored[12:] == ["hello", "world"]
    assert out.pop("take") == {"ok": [[task_id, "netbox", "taken", "hello", "world"]]}
    assert out.pop("take_nothing") == {"ok": []}
    assert out.pop("ack") == {"ok": [[task_id, "netbox", "taken", "hello", "world"]]}
    [statistics] = out.pop("statistics")["ok"]
    counters = dict(zip(statistics[::2], statistics[1::2], strict=True))
    assert counters["space0.netbox.put"] == 1 and counters["space0.netbox.ack"] == 1
    assert counters["space0.netbox.tasks.total"] == 0
    [[late_id, *late]] = out.pop("waiting_take")["ok"]  # the take waited for the other session's put
    assert late_id != task_id and late == ["netbox", "taken", "late"]
    assert out.pop("no_queue_space") == {"error": "Space '77' does not exist", "code": 36}
    # tarantool/queue
    assert out.pop("create_tube") == {"ok": []}
    assert out.pop("tube_put") == {"ok": [[0, "r", "job"]]}
    assert out.pop("tube_take") == {"ok": [[0, "t", "job"]]}
    assert out.pop("tube_ack") == {"ok": [[0, "-", "job"]]}
    [tube_statistics] = out.pop("tube_statistics")["ok"]
    assert tube_statistics["tasks"] == {"taken": 0, "total": 0, "ready": 0, "buried": 0, "delayed": 0, "done": 1}
    assert {k: v for k, v in tube_statistics["calls"].items() if v} == {"put": 1, "take": 1, "ack": 1}
    assert out.pop("tube_from_eval") == {"ok": ["via eval"]}
    assert out.pop("tube_drop") == {"ok": [True]}
    assert out.pop("tube_missing") == {"error": "Procedure 'queue.tube.netbox_jobs:put' is not defined", "code": 33}
    assert out == {}, "steps the test does not check"
