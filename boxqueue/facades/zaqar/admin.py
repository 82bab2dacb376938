"""Zaqar's admin side: health (Z6), pools (Z5) and flavors, as handlers the app inherits."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from starlette.responses import Response

from boxqueue.facades.zaqar import http_input as inp
from boxqueue.facades.zaqar.errors import (
    BAD_BODY,
    UNABLE_TO_DELETE,
    ZaqarError,
    bad_body,
    not_found,
)
from boxqueue.facades.zaqar.queues import ZaqarQueues
from boxqueue.facades.zaqar.responses import BASE, Call, Limits, document, next_link, no_content
from boxqueue.tubes.pools import URI_SCHEME, Flavor, Pool, PoolError


class AdminHandlers:
    """Health, pools and flavors; :class:`facades.zaqar.app.ZaqarApp` routes to them."""

    queues: ZaqarQueues
    limits: Limits

    async def read_body(self, call: Call, *, max_size: int | None = None, too_large: str = "",
                        empty_is_none: bool = False, required: bool = True) -> Any:
        raise NotImplementedError  # the app's body reader

    # -- health ----------------------------------------------------------------------------

    async def health(self, call: Call) -> Response:
        """Zaqar's health: flat without pools, per pool (with catalog_reachable) once pools exist."""
        queues = self.queues

        def figures(space: str) -> dict[str, Any]:
            operations = {
                op: {"succeeded": ok, "seconds": round(seconds, 6), "ref": None if ok else op}
                for op, (ok, seconds) in sorted(queues.operations.get(space, {}).items())
            }
            return {"storage_reachable": queues.space_reachable(space), "operation_status": operations,
                    "message_volume": queues.message_volume(space)}

        pools = queues.pools.pools
        if not pools:
            return document(call, figures(queues.default.space.name))
        doc: dict[str, Any] = {"catalog_reachable": True}
        for pool in pools.values():
            doc[pool.name] = figures(pool.uri[len(URI_SCHEME):])
        return document(call, doc)

    # -- pools and flavors -----------------------------------------------------------------

    async def admin_body(self, call: Call) -> dict[str, Any]:
        """Pools and flavors parse with Zaqar's other loader: anything unreadable is one text."""
        try:
            doc = await self.read_body(call)
        except ZaqarError as err:
            if err.status == 400 and err.title == BAD_BODY:
                raise bad_body("JSON could not be parsed.") from None
            raise
        if not isinstance(doc, dict):
            raise bad_body("JSON could not be parsed.")
        return doc

    @staticmethod
    def check_pool_fields(doc: dict[str, Any], required: bool) -> None:
        extra = set(doc) - {"uri", "weight", "options", "flavor"}
        if extra:
            raise bad_body(f"Additional properties are not allowed ({', '.join(sorted(map(repr, extra)))} "
                           "were unexpected)")
        if required:
            for key in ("uri", "weight"):
                if key not in doc:
                    raise bad_body(f"'{key}' is a required property")
        if "uri" in doc and (not isinstance(doc["uri"], str) or len(doc["uri"]) > 255):
            raise bad_body(f"{doc['uri']!r} is not valid under the schema of 'uri'")
        weight = doc.get("weight", 0)
        if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight <= 2**32 - 1:
            raise bad_body(f"{weight!r} is not valid under the schema of 'weight'")
        if "options" in doc and not isinstance(doc["options"], dict):
            raise bad_body(f"{doc['options']!r} is not of type 'object'")
        if "flavor" in doc and not isinstance(doc["flavor"], str):
            raise bad_body(f"{doc['flavor']!r} is not of type 'string'")

    async def _pool_call(self, change: Awaitable[Any]) -> Any:
        try:
            return await change
        except PoolError as err:
            if err.kind == "uri":
                raise bad_body(f"cannot connect to {err.detail}") from None
            if err.kind == "uri_in_use":
                raise ZaqarError(409, "Resource conflict", "The database URI is in use by another pool.") from None
            raise ZaqarError(403, UNABLE_TO_DELETE,
                             f"This pool is used by flavors {err.detail}; It cannot be deleted.") from None

    @staticmethod
    def pool_doc(pool: Pool, detailed: bool) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": pool.name, "uri": pool.uri, "weight": pool.weight, "flavor": pool.flavor,
                               "href": f"{BASE}/pools/{pool.name}"}
        if detailed:
            doc["options"] = pool.options
        return doc

    async def put_pool(self, call: Call) -> Response:
        doc = await self.admin_body(call)
        self.check_pool_fields(doc, True)
        name = call.match["pool"]
        await self._pool_call(self.queues.pools.put_pool(name, doc["uri"], doc["weight"], doc.get("options", {}), None))
        return Response(b"", 201, {"Location": f"{BASE}/pools/{name}"}, media_type="application/json")

    async def get_pool(self, call: Call) -> Response:
        pool = self.queues.pools.pools.get(call.match["pool"])
        if pool is None:
            raise not_found(f"Pool {call.match['pool']} does not exist")
        return document(call, self.pool_doc(pool, inp.query_bool(call.params, "detailed", False)))

    async def patch_pool(self, call: Call) -> Response:
        doc = await self.admin_body(call)
        if not {"uri", "weight", "options"} & set(doc):
            raise bad_body("One of `uri`, `weight`,or `options` needs to be specified")
        self.check_pool_fields(doc, False)
        if not await self._pool_call(self.queues.pools.patch_pool(call.match["pool"], doc)):
            raise not_found(f"Pool {call.match['pool']} does not exist")
        return Response(b"", 200, media_type="application/json")

    async def delete_pool(self, call: Call) -> Response:
        await self._pool_call(self.queues.pools.delete_pool(call.match["pool"]))
        return no_content()

    def _admin_page(self, call: Call) -> tuple[int, bool, str | None]:
        limit = inp.query_int(call.params, "limit")
        return (self.limits.default_page if limit is None else max(limit, 0),
                inp.query_bool(call.params, "detailed", False), inp.query_str(call.params, "marker"))

    async def list_pools(self, call: Call) -> Response:
        limit, detailed, marker = self._admin_page(call)
        found = self.queues.pools.list_pools(marker, limit)
        return self._admin_list(call, "pools", [self.pool_doc(p, detailed) for p in found],
                                found[-1].name if found else None)

    def _admin_list(self, call: Call, kind: str, items: list[dict[str, Any]], last: str | None) -> Response:
        links = []
        if last is not None:
            keep = {k: ",".join(v) for k, v in call.params.items() if k != "marker"}
            links = next_link(f"{BASE}/{kind}", call.params, keep, last)
        query = call.request.scope.get("query_string", b"").decode("latin-1")
        location = f"{BASE}/{kind}" + (f"?{query}" if query else "")
        return document(call, {"links": links, kind: items}, 200, {"Content-Location": location})

    @staticmethod
    def flavor_doc(flavor: Flavor, detailed: bool) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": flavor.name, "href": f"{BASE}/flavors/{flavor.name}"}
        if detailed:
            doc["capabilities"] = flavor.capabilities
        return doc

    async def put_flavor(self, call: Call) -> Response:
        doc = await self.admin_body(call)
        capabilities = doc.get("capabilities", {})
        if not isinstance(capabilities, dict):
            raise bad_body(f"{capabilities!r} is not of type 'object'")
        pool = doc.get("pool")
        name = call.match["flavor"]
        await self.queues.pools.put_flavor(call.project, name, capabilities, pool if isinstance(pool, str) else None)
        return Response(b"", 201, {"Location": f"{BASE}/flavors/{name}"}, media_type="application/json")

    async def get_flavor(self, call: Call) -> Response:
        flavor = self.queues.pools.flavors.get((call.project, call.match["flavor"]))
        if flavor is None:
            raise not_found(f"Flavor {call.match['flavor']} does not exist")
        return document(call, self.flavor_doc(flavor, inp.query_bool(call.params, "detailed", False)))

    async def patch_flavor(self, call: Call) -> Response:
        """Zaqar's own v1.1 PATCH is broken; this is the sane version the spec allows."""
        doc = await self.admin_body(call)
        if not isinstance(doc.get("capabilities"), dict):
            raise bad_body("`capabilities` needs to be specified")
        flavor = self.queues.pools.flavors.get((call.project, call.match["flavor"]))
        if flavor is None:
            raise not_found(f"Flavor {call.match['flavor']} does not exist")
        await self.queues.pools.put_flavor(call.project, flavor.name, doc["capabilities"], flavor.pool)
        return Response(b"", 200, media_type="application/json")

    async def delete_flavor(self, call: Call) -> Response:
        await self.queues.pools.delete_flavor(call.project, call.match["flavor"])
        return no_content()

    async def list_flavors(self, call: Call) -> Response:
        limit, detailed, marker = self._admin_page(call)
        found = self.queues.pools.list_flavors(call.project, marker, limit)
        return self._admin_list(call, "flavors", [self.flavor_doc(f, detailed) for f in found],
                                found[-1].name if found else None)

