"""The Zaqar v1.1 REST API as a Starlette ASGI application over :class:`facades.zaqar.queues.ZaqarQueues`.

Requests pass Zaqar's checks in Zaqar's order (Content-Type, Accept, Client-ID, X-Project-Id,
then routing with 404/405, then the queue name), are answered by one handler per route and
method, and every refusal is a :class:`ZaqarError` turned into ``{"title", "description"}`` by
:func:`facades.zaqar.responses.error_response`, the one place that maps errors to responses.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from boxqueue.errcodes import ER, BoxError
from boxqueue.facades.zaqar import http_input as inp
from boxqueue.facades.zaqar import queues as store
from boxqueue.facades.zaqar.admin import AdminHandlers
from boxqueue.facades.zaqar.auth import (
    ADMIN_ONLY,
    TokenAuth,
    not_authorized,
    unauthorized,
    wrong_project,
)
from boxqueue.facades.zaqar.errors import (
    LIMIT_TEXT,
    UNABLE_TO_DELETE,
    ZaqarError,
    bad_api,
    bad_body,
    not_found,
    unavailable,
)
from boxqueue.facades.zaqar.queues import StorageError, ZaqarQueues
from boxqueue.facades.zaqar.responses import (
    BASE,
    Call,
    Limits,
    age,
    document,
    error_response,
    message_doc,
    next_link,
    no_content,
    page_limit,
    stat_doc,
)
from boxqueue.frontdoor.asgi_serving import answer_lifespan
from boxqueue.frontdoor.http_meter import OPERATION

log = logging.getLogger(__name__)

ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

Handler = Callable[["ZaqarApp", Call], Awaitable[Response]]

# Zaqar's 503 texts when storage fails, by handler.
UNAVAILABLE = {
    "put_queue": "Queue could not be created.", "get_queue": "Queue metadata could not be retrieved.",
    "delete_queue": "Queue could not be deleted.", "list_queues": "Queues could not be listed.",
    "queue_stats": "Queue stats could not be read.", "post_messages": "Messages could not be enqueued.",
    "get_messages": "Messages could not be listed.", "get_message": "Message could not be retrieved.",
    "delete_message": "Message could not be deleted.", "delete_messages": "Messages could not be deleted.",
    "post_claim": "Claim could not be created.", "get_claim": "Claim could not be queried.",
    "patch_claim": "Claim could not be updated.", "delete_claim": "Claim could not be deleted.",
    "health": "Health status could not be read.",
}



# -- the application ---------------------------------------------------------------------------


class ZaqarApp(AdminHandlers):
    """Routes and handlers; ``asgi`` is the ASGI application to serve (Starlette's requests and
    responses, our own routing)."""

    def __init__(self, queues: ZaqarQueues, limits: Limits | None = None, default_project: str | None = None,
                 auth: TokenAuth | None = None) -> None:
        self.queues = queues
        self.limits = limits or Limits()
        self.default_project = default_project if auth is None else None  # Z4: only without auth
        self.auth = auth
        self.routes: list[tuple[re.Pattern[str], dict[str, Handler], bool]] = []
        self._add(r"/", {"GET": ZaqarApp.versions}, False)
        self._add(r"/v1\.1/", {"GET": ZaqarApp.home}, False)
        self._add(r"/v1\.1/ping", {"GET": ZaqarApp.ping, "HEAD": ZaqarApp.ping}, False)
        self._add(r"/v1\.1/queues", {"GET": ZaqarApp.list_queues}, False)
        q = r"/v1\.1/queues/(?P<queue>[^/]*)"
        self._add(q, {"PUT": ZaqarApp.put_queue, "GET": ZaqarApp.get_queue, "DELETE": ZaqarApp.delete_queue}, True)
        self._add(q + "/stats", {"GET": ZaqarApp.queue_stats}, True)
        self._add(q + "/messages", {"POST": ZaqarApp.post_messages, "GET": ZaqarApp.get_messages,
                                    "DELETE": ZaqarApp.delete_messages}, True)
        self._add(q + r"/messages/(?P<message>[^/]+)", {"GET": ZaqarApp.get_message,
                                                         "DELETE": ZaqarApp.delete_message}, True)
        self._add(q + "/claims", {"POST": ZaqarApp.post_claim}, True)
        self._add(q + r"/claims/(?P<claim>[^/]+)", {"GET": ZaqarApp.get_claim, "PATCH": ZaqarApp.patch_claim,
                                                     "DELETE": ZaqarApp.delete_claim}, True)
        self._add(r"/v1\.1/health", {"GET": ZaqarApp.health}, False)
        self._add(r"/v1\.1/pools", {"GET": ZaqarApp.list_pools}, False)
        self._add(r"/v1\.1/pools/(?P<pool>[^/]+)", {"GET": ZaqarApp.get_pool, "PUT": ZaqarApp.put_pool,
                                                     "PATCH": ZaqarApp.patch_pool, "DELETE": ZaqarApp.delete_pool}, False)
        self._add(r"/v1\.1/flavors", {"GET": ZaqarApp.list_flavors}, False)
        self._add(r"/v1\.1/flavors/(?P<flavor>[^/]+)", {"GET": ZaqarApp.get_flavor, "PUT": ZaqarApp.put_flavor,
                                                         "PATCH": ZaqarApp.patch_flavor,
                                                         "DELETE": ZaqarApp.delete_flavor}, False)
        self.asgi = self._asgi

    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI application: every request goes to :meth:`endpoint`, which routes it. Starlette's
        own application and router would only wrap it in middleware and a catch-all route (about a
        tenth of a request's CPU); what they answered themselves is answered here the same way."""
        kind = scope["type"]
        if kind == "http":
            if scope["method"] in ALL_METHODS:
                response = await self.endpoint(Request(scope, receive, send))
            else:  # Starlette's route answer for a method it does not route
                response = PlainTextResponse("Method Not Allowed", 405, {"Allow": ", ".join(ALL_METHODS)})
            await response(scope, receive, send)
        elif kind == "websocket":  # no WebSocket route: closed, as Starlette's router closes it
            await send({"type": "websocket.close", "code": 1000, "reason": ""})
        elif kind == "lifespan":
            await answer_lifespan(receive, send)

    def _add(self, pattern: str, handlers: dict[str, Handler], queue_route: bool) -> None:
        self.routes.append((re.compile(pattern + "$"), handlers, queue_route))

    async def endpoint(self, request: Request) -> Response:
        reply_type: str | None = inp.JSON
        token_project = None
        if self.auth is not None:  # keystonemiddleware runs before any of Zaqar's checks
            identity = self.auth.identify(request.headers.get("x-auth-token"))
            if identity is None:
                return unauthorized(request.headers.get("host") or "localhost")
            token_project, request.state.admin = identity
        try:
            if token_project is not None:
                asked = request.headers.get("x-project-id")
                if asked is not None and asked != token_project:
                    raise wrong_project(token_project, asked)
                request.state.project = token_project
            reply_type = inp.response_type(request.headers.get("accept"))
            response = await self._serve(request, reply_type)
        except ZaqarError as err:
            if reply_type is None and inp.prefers_xml(request.headers.get("accept")):
                reply_type = inp.XML
            response = error_response(err, reply_type)
        except Exception as exc:  # Zaqar answers 500 with the exception text
            log.exception("Zaqar request %s %s failed", request.method, request.url.path)
            response = error_response(ZaqarError(500, "Internal server error", str(exc)), reply_type)
        response.headers["x-openstack-request-id"] = f"req-{uuid.uuid4()}"
        return response

    async def _serve(self, request: Request, reply_type: str | None) -> Response:
        path = request.scope["path"]  # (request.url would build a URL from the Host header)
        headers = request.headers
        content_type = (headers.get("content-type") or "").split(";")[0].strip().lower()
        if "content-length" in headers and content_type == "application/x-www-form-urlencoded":
            raise ZaqarError(400, "Invalid Content-Type",
                             "Endpoint does not accept `application/x-www-form-urlencoded` content; currently "
                             "supported media type is `application/json`; specify proper client-side media type "
                             'with the "Content-Type" header.')
        if reply_type is None:
            raise ZaqarError(406, "406 Not Acceptable",
                             'Endpoint only serves `application/json`; specify client-side media type support '
                             'with the "Accept" header.',
                             extra={"link": {"text": "14.1 Accept, Hypertext Transfer Protocol -- HTTP/1.1",
                                             "href": "http://www.w3.org/Protocols/rfc2616/rfc2616-sec14.html",
                                             "rel": "help"}})
        versioned = path.startswith(BASE + "/")
        client = inp.check_client_id(headers.get("client-id"), versioned)
        fixed = getattr(request.state, "project", None)  # the token's project (auth = "token")
        project = inp.check_project(fixed or headers.get("x-project-id", self.default_project)) if versioned else ""
        for pattern, handlers, queue_route in self.routes:
            m = pattern.match(path)
            if m is None:
                continue
            allow = ", ".join(handlers) + ", OPTIONS"
            if request.method == "OPTIONS":
                return Response(None, 200, {"Allow": allow})
            handler = handlers.get(request.method)
            if handler is None:
                raise ZaqarError(405, "405 Method Not Allowed", headers={"Allow": allow})
            request.scope[OPERATION] = handler.__name__
            if self.auth is not None and handler.__name__ in ADMIN_ONLY and not request.state.admin:
                raise not_authorized()  # the policy check, in the handler as Zaqar's acl.enforce
            if queue_route:
                inp.check_queue_name(m["queue"], project)
            call = Call(request, inp.parse_query(request.scope.get("query_string", b"")), client, project,
                        reply_type, m.groupdict())
            try:
                return await handler(self, call)
            except StorageError as exc:
                log.error("Zaqar %s failed on storage: %s", handler.__name__, exc)
                raise unavailable(UNAVAILABLE.get(handler.__name__, "Storage could not be reached.")) from None
            except BoxError as exc:
                # A replica set's answers keep their promise (docs/replication.md): refused before
                # the log, the write failed (503: retry); with no quorum, its outcome is unknown.
                if exc.code == ER.READONLY:
                    raise unavailable(f"This node no longer leads ({exc.message}).") from None
                if exc.code == ER.SYNC_QUORUM_TIMEOUT:
                    log.warning("Zaqar %s: %s", handler.__name__, exc.message)
                    raise ZaqarError(500, "Internal server error", exc.message) from None
                raise
        raise ZaqarError(404, "404 Not Found")

    async def read_body(self, call: Call, *, max_size: int | None = None, too_large: str = "",
                        empty_is_none: bool = False, required: bool = True) -> Any:
        """The decoded body, or None where an absent/empty body is allowed."""
        length = call.request.headers.get("content-length")
        if length is not None and max_size is not None and length.isdigit() and int(length) > max_size:
            await self.drain(call)
            raise bad_api(too_large)
        if length is None:  # no Content-Length at all (chunked): falcon sees no body
            await self.drain(call)
            if empty_is_none or not required:
                return None
            raise bad_body("Request body can not be empty")
        cap = (max_size or self.limits.max_messages_post_size) + 1
        chunks, size = [], 0
        async for chunk in call.request.stream():
            size += len(chunk)
            if size > cap:
                await self.drain(call)
                if max_size is not None:
                    raise bad_api(too_large)
                raise bad_body("Request body could not be parsed.")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw and (empty_is_none or not required):
            return None
        return inp.decode_body(raw, call.request.headers.get("content-type"))

    @staticmethod
    async def drain(call: Call, most: int = 16 << 20) -> None:
        """Read and drop what is left of a refused body (up to ``most`` bytes), so the client
        hears the refusal instead of a reset while it is still sending."""
        seen = 0
        try:
            async for chunk in call.request.stream():
                seen += len(chunk)
                if seen > most:
                    return
        except Exception:  # the stream was already consumed or the client went away
            return

    # -- versions, home, ping --------------------------------------------------------------

    async def versions(self, call: Call) -> Response:
        doc = {"versions": [
            {"id": "1.1", "status": "DEPRECATED", "updated": "2016-7-29T02:22:47Z",
             "media-types": [{"base": "application/json", "type": "application/vnd.openstack.messaging-v1_1+json"}],
             "links": [{"href": "/v1.1/", "rel": "self"}]},
        ]}
        return document(call, doc, 300)

    async def home(self, call: Call) -> Response:
        def res(template: str, allow: list[str], variables: dict[str, str], post: bool = False) -> dict[str, Any]:
            hints: dict[str, Any] = {"allow": allow, "formats": {"application/json": {}}}
            if post:
                hints["accept-post"] = ["application/json"]
            return {"href-template": template, "href-vars": variables, "hints": hints}

        qv = {"queue_name": "param/queue_name"}
        resources = {
            "rel/queues": res("/v1.1/queues{?marker,limit,detailed}", ["GET"],
                              {"marker": "param/marker", "limit": "param/queue_limit", "detailed": "param/detailed"}),
            "rel/queue": res("/v1.1/queues/{queue_name}", ["PUT", "DELETE"], qv),
            "rel/queue_stats": res("/v1.1/queues/{queue_name}/stats", ["GET"], qv),
            "rel/messages": res("/v1.1/queues/{queue_name}/messages{?marker,limit,echo,include_claimed}", ["GET"],
                                {**qv, "marker": "param/marker", "limit": "param/messages_limit",
                                 "echo": "param/echo", "include_claimed": "param/include_claimed"}),
            "rel/post_messages": res("/v1.1/queues/{queue_name}/messages", ["POST"], qv, True),
            "rel/messages_delete": res("/v1.1/queues/{queue_name}/messages{?ids,pop}", ["DELETE"],
                                       {**qv, "ids": "param/ids", "pop": "param/pop"}),
            "rel/message_delete": res("/v1.1/queues/{queue_name}/messages/{message_id}{?claim}", ["DELETE"],
                                      {**qv, "message_id": "param/message_id", "claim": "param/claim_id"}),
            "rel/claim": res("/v1.1/queues/{queue_name}/claims/{claim_id}", ["GET"],
                             {**qv, "claim_id": "param/claim_id"}),
            "rel/post_claim": res("/v1.1/queues/{queue_name}/claims{?limit}", ["POST"],
                                  {**qv, "limit": "param/claim_limit"}, True),
            "rel/patch_claim": res("/v1.1/queues/{queue_name}/claims/{claim_id}", ["PATCH"],
                                   {**qv, "claim_id": "param/claim_id"}, True),
            "rel/delete_claim": res("/v1.1/queues/{queue_name}/claims/{claim_id}", ["DELETE"],
                                    {**qv, "claim_id": "param/claim_id"}),
            "rel/ping": res("/v1.1/ping", ["GET"], {}),
        }
        media = "application/json-home" if call.reply_type == inp.JSON else call.reply_type
        return document(call, {"resources": resources}, 200, {"Cache-Control": "max-age=86400"}, media)

    async def ping(self, call: Call) -> Response:
        return no_content()

    # -- queues ----------------------------------------------------------------------------

    async def list_queues(self, call: Call) -> Response:
        limit = page_limit(call, self.limits, "Limit must be at least 1 and no greater than 20.")
        detailed = inp.query_bool(call.params, "detailed", False)
        marker = inp.query_str(call.params, "marker")
        found = self.queues.list_queues(call.project, marker, limit)
        items = []
        for q in found:
            item: dict[str, Any] = {"name": q.name, "href": f"{BASE}/queues/{q.name}"}
            if detailed:
                item["metadata"] = q.metadata
            items.append(item)
        links = []
        if found:
            keep = {"limit": str(limit), "detailed": "true" if detailed else "false"}
            links = next_link(f"{BASE}/queues", call.params, keep, found[-1].name)
        return document(call, {"queues": items, "links": links})

    async def put_queue(self, call: Call) -> Response:
        name = call.match["queue"]
        metadata = await self.read_body(call, max_size=self.limits.max_queue_metadata,
                                        too_large=f"Queue metadata is too large. Max size: {self.limits.max_queue_metadata}",
                                        empty_is_none=True)
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, dict):
            raise bad_body("Document type not supported.")
        self.check_metadata(metadata)
        flavor = metadata.get("_flavor")
        if flavor is not None and (call.project, flavor) not in self.queues.pools.flavors:
            raise bad_api(f"Flavor {flavor} does not exist")
        created = await self.queues.create_queue(call.project, name, metadata)
        location = {"Location": f"{BASE}/queues/{name}"}
        if created:
            return Response(b"", 201, location, media_type="application/json")
        return no_content(location)

    def check_metadata(self, metadata: dict[str, Any]) -> None:
        low, high = self.limits.message_ttl
        ttl = metadata.get("_default_message_ttl")
        if "_default_message_ttl" in metadata:
            if not isinstance(ttl, int):
                raise bad_api("_default_message_ttl must be integer.")
            if not low <= ttl <= high:
                raise bad_api(f"_default_message_ttl can not exceed {high} seconds, and must be at least "
                              f"{low} seconds long.")
        if "_max_messages_post_size" in metadata:
            size = metadata["_max_messages_post_size"]
            top = self.limits.max_messages_post_size
            if not isinstance(size, int) or not 0 < size <= top:
                raise bad_api(f"_max_messages_post_size can not exceed {top},  and must be at least greater than 0.")

    async def get_queue(self, call: Call) -> Response:
        queue = self.queues.queue(call.project, call.match["queue"])
        return document(call, queue.metadata if queue is not None else {})

    async def delete_queue(self, call: Call) -> Response:
        await self.queues.delete_queue(call.project, call.match["queue"])
        return no_content()

    async def queue_stats(self, call: Call) -> Response:
        name = call.match["queue"]
        total, claimed, oldest, newest = self.queues.stats(call.project, name)
        messages: dict[str, Any] = {"claimed": claimed, "free": total - claimed, "total": total}
        if oldest is not None and newest is not None:
            now = time.time()
            messages["oldest"] = stat_doc(name, oldest, now)
            messages["newest"] = stat_doc(name, newest, now)
        return document(call, {"messages": messages})

    # -- messages --------------------------------------------------------------------------

    async def post_messages(self, call: Call) -> Response:
        size = self.limits.max_messages_post_size
        doc = await self.read_body(call, max_size=size, too_large=f"Message collection size is too large. Max size {size}")
        if not isinstance(doc, dict) or "messages" not in doc:
            raise bad_api("No messages were found in the request body.")
        items = doc["messages"]
        if not isinstance(items, list):
            raise bad_body("Document type not supported.")
        parsed = []
        for item in items:
            if not isinstance(item, dict):
                raise bad_body("Document type not supported.")
            if "body" not in item:
                raise bad_body('Missing "body" field.')
            parsed.append((item["body"], inp.field_int(item, "ttl", self.limits.default_message_ttl)))
        if not parsed:
            raise bad_api("No messages to enqueu.")
        low, high = self.limits.message_ttl
        if any(not low <= ttl <= high for _body, ttl in parsed):
            raise bad_api(f"The TTL for a message may not exceed {high} seconds, and must be at least {low} seconds long.")
        name = call.match["queue"]
        ids = await self.queues.post(call.project, name, call.client or "", parsed)
        base = f"{BASE}/queues/{name}/messages"
        return document(call, {"resources": [f"{base}/{i}" for i in ids]}, 201,
                        {"Location": f"{base}?ids={','.join(ids)}"})

    async def get_messages(self, call: Call) -> Response:
        name = call.match["queue"]
        now = time.time()
        if "ids" in call.params:
            ids = call.params["ids"]
            if not 1 <= len(ids) <= self.limits.max_page:
                raise bad_api(LIMIT_TEXT)
            found = self.queues.get_messages(call.project, name, ids)
            if not found:
                raise not_found(f"No messages with IDs: {ids!r} found in the queue {name} for project {call.project}.")
            return document(call, {"messages": [message_doc(name, m, now) for m in found]})
        limit = page_limit(call, self.limits)
        echo = inp.query_bool(call.params, "echo", False)
        include_claimed = inp.query_bool(call.params, "include_claimed", False)
        marker_text = inp.query_str(call.params, "marker")
        if marker_text is not None and not marker_text.isdigit():
            return document(call, {"messages": [], "links": []})
        marker = int(marker_text) if marker_text is not None else None
        found = self.queues.list_messages(call.project, name, marker, limit, None if echo else call.client,
                                          include_claimed)
        links = []
        if found:
            keep = {"limit": str(limit), "echo": "true" if echo else "false",
                    "include_claimed": "true" if include_claimed else "false"}
            links = next_link(f"{BASE}/queues/{name}/messages", call.params, keep, str(found[-1].seq))
        return document(call, {"messages": [message_doc(name, m, now) for m in found], "links": links})

    async def get_message(self, call: Call) -> Response:
        name, mid = call.match["queue"], call.match["message"]
        found = self.queues.get_messages(call.project, name, [mid])
        if not found:
            raise not_found(f"Message {mid} does not exist in queue {name} for project {call.project}")
        return document(call, message_doc(name, found[0], time.time()))

    async def delete_message(self, call: Call) -> Response:
        name, mid = call.match["queue"], call.match["message"]
        outcome = await self.queues.delete_message(call.project, name, mid, inp.query_str(call.params, "claim_id"))
        if outcome == store.CLAIMED:
            raise ZaqarError(403, UNABLE_TO_DELETE,
                             "This message is claimed; it cannot be deleted without a valid claim ID.")
        if outcome == store.NOT_CLAIMED:
            raise ZaqarError(400, UNABLE_TO_DELETE, "A claim was specified, but the message is not currently claimed.")
        if outcome == store.NO_SUCH_CLAIM:
            raise ZaqarError(400, UNABLE_TO_DELETE, "The specified claim does not exist or has expired.")
        return no_content()

    async def delete_messages(self, call: Call) -> Response:
        name = call.match["queue"]
        has_ids, has_pop = "ids" in call.params, "pop" in call.params
        if has_ids and has_pop:
            raise bad_api("pop and id params cannot be present together in the delete request.")
        if not has_ids and not has_pop:
            raise bad_api('The request should have either "ids" or "pop" parameter in the request, to be able to delete.')
        if has_pop:
            pop = inp.query_int(call.params, "pop")
            if pop is None or not 1 <= pop <= self.limits.max_page:
                raise bad_api("Pop value must be at least 1 and may not be greater than 20.")
            popped = await self.queues.pop(call.project, name, pop)
            now = time.time()
            return document(call, {"messages": [
                {"id": m.id, "age": age(m.created, now), "ttl": m.ttl, "body": m.body, "claim_id": None,
                 "claim_count": 0} for m in popped]})
        ids = call.params["ids"]
        if not 1 <= len(ids) <= self.limits.max_page:
            raise bad_api("ids parameter should have at least 1 and not greater than 20 values.")
        await self.queues.delete_messages(call.project, name, ids)
        return no_content()

    # -- claims ----------------------------------------------------------------------------

    def claim_ttl_grace(self, doc: Any) -> tuple[int, int]:
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise bad_body("Document type not supported.")
        ttl = inp.field_int(doc, "ttl", self.limits.default_claim_ttl)
        grace = inp.field_int(doc, "grace", self.limits.default_claim_grace)
        low, high = self.limits.claim_ttl
        if not low <= ttl <= high:
            raise bad_api(f"The TTL for a claim may not exceed {high} seconds, and must be at least {low} seconds long.")
        return ttl, grace

    async def post_claim(self, call: Call) -> Response:
        doc = await self.read_body(call, empty_is_none=True)
        ttl, grace = self.claim_ttl_grace(doc)
        limit = page_limit(call, self.limits)
        low, high = self.limits.claim_grace
        if not low <= grace <= high:
            raise bad_api(f"The grace for a claim may not exceed {high} seconds, and must be at least {low} seconds long.")
        name = call.match["queue"]
        result = await self.queues.claim(call.project, name, ttl, grace, limit)
        if result is None:
            return no_content()
        claim, msgs = result
        now = time.time()
        return document(call, {"messages": [message_doc(name, m, now) for m in msgs]}, 201,
                        {"Location": f"{BASE}/queues/{name}/claims/{claim.id}"})

    def _no_claim(self, call: Call) -> ZaqarError:
        return not_found(f"Claim {call.match['claim']} does not exist in queue {call.match['queue']} "
                         f"for project {call.project}")

    async def get_claim(self, call: Call) -> Response:
        name, cid = call.match["queue"], call.match["claim"]
        found = self.queues.get_claim(call.project, name, cid)
        if found is None:
            raise self._no_claim(call)
        claim, msgs = found
        now = time.time()
        return document(call, {"age": age(claim.updated, now), "ttl": claim.ttl,
                               "messages": [message_doc(name, m, now) for m in msgs],
                               "href": f"{BASE}/queues/{name}/claims/{cid}"})

    async def patch_claim(self, call: Call) -> Response:
        doc = await self.read_body(call)
        ttl, grace = self.claim_ttl_grace(doc)
        if not await self.queues.renew(call.project, call.match["queue"], call.match["claim"], ttl, grace):
            raise self._no_claim(call)
        return no_content()

    async def delete_claim(self, call: Call) -> Response:
        await self.queues.release(call.project, call.match["queue"], call.match["claim"])
        return no_content()
