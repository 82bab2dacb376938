"""Procedures every Tarantool has: ``box.info``, ``box.session.id``, ``box.session.user``.

Connection pools call ``box.info`` and need ``ro`` and ``status == 'running'``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from iproto_server.greeting import VERSION_FULL
from spaces.catalog import Catalog
from spaces.procedures import CallContext, Procedures


def register_builtins(procedures: Procedures, catalog: Catalog, *, read_only: bool = False) -> None:
    started = time.monotonic()

    def info(ctx: CallContext) -> list[Any]:
        return [
            {
                "version": VERSION_FULL,
                "id": 1,
                "ro": read_only or ctx.read_only,
                "status": "running",
                "uuid": catalog.instance_uuid,
                "pid": os.getpid(),
                "uptime": int(time.monotonic() - started),
                "lsn": 0,
                "schema_version": catalog.schema_version,
            }
        ]

    def session_id(ctx: CallContext) -> list[Any]:
        return [ctx.session_id]

    def session_user(ctx: CallContext) -> list[Any]:
        return [ctx.user.name]

    procedures.register("box.info", info)
    procedures.register("box.session.id", session_id)
    procedures.register("box.session.user", session_user)
