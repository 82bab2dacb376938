"""Users and grants made with ``box.schema.user.create/grant``: kept in LMDB, applied at start.

One named database, ``_lua_users``: name -> msgpack ``{"hash": <chap-sha1 hash or nil>,
"created": <bool>, "grants": [[object type, object name, privilege bits], ...]}``. ``created``
marks a user made from Lua (its password hash is kept); a user of the configuration only gets
the grants made from Lua added to the ones the configuration gives it. Writes go through the
group committer, and memory changes only once the write is durable.
"""

from __future__ import annotations

from typing import Any

import lmdb
import msgpack

from boxqueue.spaces.access import AccessControl, User, chap_sha1_hash

DB_NAME = b"_lua_users"


class PersistedUsers:
    def __init__(self, storage: Any, committer: Any) -> None:
        self.storage = storage
        self.committer = committer
        self._db = storage.db(DB_NAME)  # at start, before the committer runs
        self._records: dict[str, dict[str, Any]] = {}

    def load_into(self, access: AccessControl) -> int:
        """Add the stored users and grants to ``access``; how many records there were."""
        with self.storage.env.begin() as txn, txn.cursor(db=self._db) as cursor:
            for key, value in cursor:
                name, record = key.decode(), msgpack.unpackb(value)
                self._records[name] = record
                user = access.users.get(name)
                if user is None:
                    if not record["created"]:
                        continue  # a configuration user that is gone: its grants go with it
                    user = access.add_user(name, None)
                    user.password_hash = record["hash"]
                for object_type, object_name, bits in record["grants"]:
                    user.grant(bits, object_type, object_name)
        return len(self._records)

    async def create(self, access: AccessControl, name: str, password: str | None) -> User:
        password_hash = chap_sha1_hash(password) if password is not None else None
        await self._write(name, {"hash": password_hash, "created": True, "grants": []})
        user = access.add_user(name, None)
        user.password_hash = password_hash
        return user

    async def grant(self, user: User, bits: int, object_type: str, object_name: str) -> None:
        record = dict(self._records.get(user.name) or {"hash": None, "created": False, "grants": []})
        record["grants"] = [*record["grants"], [object_type, object_name, bits]]
        await self._write(user.name, record)
        user.grant(bits, object_type, object_name)

    async def _write(self, name: str, record: dict[str, Any]) -> None:
        packed = msgpack.packb(record, use_bin_type=True)
        db = self._db

        def write(txn: lmdb.Transaction) -> None:
            txn.put(name.encode(), packed, db=db)

        await self.committer.write(write)
        self._records[name] = record
