"""Functions made with ``box.schema.func.create``: kept in LMDB, defined again at every start.

One named database, ``_lua_functions``: name -> msgpack ``{"body": <Lua source or nil>}``. With a
body (``{body = 'function(x) return x end'}``) the function is defined as a global when created
and at each start, so CALL reaches it after a restart; without one, only the name is kept (as
Tarantool's ``_func`` row, for ``exists``), and the global is whatever Lua code defines.
Writes go through the group committer like every other durable write.
"""

from __future__ import annotations

from typing import Any

import lmdb
import msgpack

from boxqueue.errcodes import ER, BoxError

DB_NAME = b"_lua_functions"


class PersistedFunctions:
    def __init__(self, storage: Any, committer: Any) -> None:
        self.storage = storage
        self.committer = committer
        self._db = storage.db(DB_NAME)  # at start, before the committer runs
        self.bodies: dict[str, str | None] = {}

    def load(self) -> dict[str, str | None]:
        with self.storage.env.begin() as txn, txn.cursor(db=self._db) as cursor:
            for key, value in cursor:
                self.bodies[key.decode()] = msgpack.unpackb(value).get("body")
        return dict(self.bodies)

    def exists(self, name: str) -> bool:
        return name in self.bodies

    async def create(self, name: str, body: str | None, if_not_exists: bool) -> bool:
        """Whether it was created (``False`` when it existed and ``if_not_exists`` was given)."""
        if name in self.bodies:
            if if_not_exists:
                return False
            raise BoxError(ER.FUNCTION_EXISTS, name)
        record = msgpack.packb({"body": body})
        db = self._db

        def write(txn: lmdb.Transaction) -> None:
            txn.put(name.encode(), record, db=db)

        await self.committer.write(write)
        self.bodies[name] = body
        return True

    async def drop(self, name: str, if_exists: bool) -> bool:
        if name not in self.bodies:
            if if_exists:
                return False
            raise BoxError(ER.NO_SUCH_FUNCTION, name)
        db = self._db

        def write(txn: lmdb.Transaction) -> None:
            txn.delete(name.encode(), db=db)

        await self.committer.write(write)
        self.bodies.pop(name, None)
        return True
