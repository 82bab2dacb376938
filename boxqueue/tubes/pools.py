"""Pools and flavors of the claim queues (Zaqar's admin catalogue), stored in LMDB spaces.

A pool is a named storage target with a weight: its URI ``boxqueue://<space name>`` names a
space of this server, which ``connect`` makes one of the engine's Zaqar spaces (created when it
does not exist yet, decision Z5). Flavors are per-project named capability sets that may name a pool. Both are
kept in memory as a cache of their spaces and every change is one durable write.
"""

from __future__ import annotations

import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from boxqueue.errcodes import BoxError
from boxqueue.spaces import iterators
from boxqueue.spaces.catalog import Catalog
from boxqueue.spaces.ownership import Owner
from boxqueue.spaces.space import REPLACE, Space, decode_tuple

POOLS_SPACE = "zaqar_pools"
FLAVORS_SPACE = "zaqar_flavors"
POOLS_OWNER = Owner("Zaqar's pools and flavors")


def space_owner(space: Space) -> Owner | None:
    """The rule for :mod:`boxqueue.spaces.ownership`: pools and flavors change only through Zaqar."""
    return POOLS_OWNER if space.name in (POOLS_SPACE, FLAVORS_SPACE) else None
URI_SCHEME = "boxqueue://"
_SPACE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class PoolError(Exception):
    """A pool change refused: ``kind`` is "uri" (cannot connect), "uri_in_use" or "in_use"."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(kind, detail)
        self.kind = kind
        self.detail = detail


@dataclass
class Pool:
    name: str
    uri: str
    weight: int
    options: dict[str, Any] = field(default_factory=dict)
    flavor: str | None = None


@dataclass
class Flavor:
    project: str
    name: str
    capabilities: dict[str, Any] = field(default_factory=dict)
    pool: str | None = None


class PoolCatalog:
    """Pools (global) and flavors (per project)."""

    def __init__(self, catalog: Catalog, connect: Callable[[str], Awaitable[None]]) -> None:
        self.catalog = catalog
        self.connect = connect  # makes the named space a Zaqar space of the engine
        self.pools: dict[str, Pool] = {}
        self.flavors: dict[tuple[str, str], Flavor] = {}
        self.spaces: dict[str, Space] = {}

    async def open(self) -> None:
        """Create the spaces if needed and load them."""
        for name, parts in ((POOLS_SPACE, [[0, "string"]]), (FLAVORS_SPACE, [[0, "string"], [1, "string"]])):
            space, _ = await self.catalog.create_space(name, if_not_exists=True)
            if "primary" not in space.index_by_name:
                await self.catalog.create_index(space, "primary", index_type="TREE", unique=True, parts=parts)
            self.spaces[name] = space
        for raw in self.spaces[POOLS_SPACE].pairs(0, iterators.ALL, []):
            f = decode_tuple(raw)
            self.pools[f[0]] = Pool(f[0], f[1], f[2], f[3], f[4])
        for raw in self.spaces[FLAVORS_SPACE].pairs(0, iterators.ALL, []):
            f = decode_tuple(raw)
            self.flavors[(f[0], f[1])] = Flavor(f[0], f[1], f[2], f[3])

    async def _replace(self, space: str, fields: list[Any]) -> None:
        await self.catalog.committer.write(self.spaces[space].prepare_put(msgpack.packb(fields), fields, REPLACE))

    async def _delete(self, space: str, key: list[Any]) -> None:
        await self.catalog.committer.write(self.spaces[space].prepare_delete(0, key))

    async def _connect(self, uri: str) -> None:
        """The storage a URI names must be reachable: a space of this server, created if new."""
        name = uri[len(URI_SCHEME):] if uri.startswith(URI_SCHEME) else ""
        if not _SPACE_NAME.match(name):
            raise PoolError("uri", uri)
        try:
            await self.connect(name)
        except BoxError as exc:  # a space of another kind has that name
            raise PoolError("uri", uri) from exc

    async def put_pool(self, name: str, uri: str, weight: int, options: dict[str, Any], flavor: str | None) -> None:
        for other in self.pools.values():
            if other.uri == uri and other.name != name:
                raise PoolError("uri_in_use")
        await self._connect(uri)
        pool = Pool(name, uri, weight, options, flavor)
        await self._replace(POOLS_SPACE, [name, uri, weight, options, flavor])
        self.pools[name] = pool

    async def patch_pool(self, name: str, changes: dict[str, Any]) -> bool:
        pool = self.pools.get(name)
        if pool is None:
            return False
        uri = changes.get("uri", pool.uri)
        if uri != pool.uri:
            for other in self.pools.values():
                if other.uri == uri and other.name != name:
                    raise PoolError("uri_in_use")
            await self._connect(uri)
        await self.put_pool(name, uri, changes.get("weight", pool.weight), changes.get("options", pool.options),
                            pool.flavor)
        return True

    async def delete_pool(self, name: str) -> None:
        users = sorted(f.name for f in self.flavors.values() if f.pool == name)
        if users:
            raise PoolError("in_use", ", ".join(users))
        if self.pools.pop(name, None) is not None:
            await self._delete(POOLS_SPACE, [name])

    def list_pools(self, marker: str | None, limit: int) -> list[Pool]:
        names = sorted(n for n in self.pools if marker is None or n > marker)
        return [self.pools[n] for n in names[:limit]]

    def place(self, project: str, flavor: str | None) -> str | None:
        """The space for a new queue: a pool chosen by weight (among the flavor's pool, if the
        flavor names one), as Zaqar places queues; None when no pool is registered."""
        candidates = list(self.pools.values())
        chosen_flavor = self.flavors.get((project, flavor)) if flavor is not None else None
        if chosen_flavor is not None and chosen_flavor.pool in self.pools:
            candidates = [self.pools[chosen_flavor.pool]]
        candidates = [p for p in candidates if p.weight > 0]
        if not candidates:
            return None
        pool = random.choices(candidates, weights=[p.weight for p in candidates])[0]
        return pool.uri[len(URI_SCHEME):]

    async def put_flavor(self, project: str, name: str, capabilities: dict[str, Any], pool: str | None) -> None:
        await self._replace(FLAVORS_SPACE, [project, name, capabilities, pool])
        self.flavors[(project, name)] = Flavor(project, name, capabilities, pool)

    async def delete_flavor(self, project: str, name: str) -> None:
        if self.flavors.pop((project, name), None) is not None:
            await self._delete(FLAVORS_SPACE, [project, name])

    def list_flavors(self, project: str, marker: str | None, limit: int) -> list[Flavor]:
        names = sorted(n for p, n in self.flavors if p == project and (marker is None or n > marker))
        return [self.flavors[(project, n)] for n in names[:limit]]
