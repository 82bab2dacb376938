"""Procedures every Tarantool has: ``box.info``, ``box.session.id``, ``box.session.user``.

Connection pools call ``box.info`` and need ``ro`` and ``status == 'running'``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from boxqueue.iproto.greeting import VERSION_FULL
from boxqueue.spaces.catalog import Catalog
from boxqueue.spaces.procedures import CallContext, Procedures


def register_builtins(procedures: Procedures, catalog: Catalog, *, read_only: bool = False,
                      replication: Callable[[], dict[str, Any]] | None = None) -> None:
    """``replication``: the replica set's part of ``box.info`` (``boxqueue.replication.node``), if any."""
    started = time.monotonic()

    def info(ctx: CallContext) -> list[Any]:
        fields = {
            "version": VERSION_FULL,
            "id": 1,
            "ro": read_only or ctx.read_only or catalog.writes.read_only_reason is not None,
            "status": "running",
            "uuid": catalog.instance_uuid,
            "pid": os.getpid(),
            "uptime": int(time.monotonic() - started),
            "lsn": catalog.storage.lsn,
            "schema_version": catalog.schema_version,
        }
        if replication is not None:
            fields.update(replication())
            fields["ro"] = fields["ro"] or read_only or ctx.read_only
        return [fields]

    def session_id(ctx: CallContext) -> list[Any]:
        return [ctx.session_id]

    def session_user(ctx: CallContext) -> list[Any]:
        return [ctx.user.name]

    procedures.register("box.info", info)
    procedures.register("box.session.id", session_id)
    procedures.register("box.session.user", session_user)
