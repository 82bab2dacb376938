"""What the Zaqar facade answers with: the request after its checks, limits, encodings and the
v1.1 documents (messages, stats, next links) shared by every handler."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgpack
from starlette.requests import Request
from starlette.responses import Response

from boxqueue.facades.zaqar import http_input as inp
from boxqueue.facades.zaqar.errors import LIMIT_TEXT, ZaqarError, bad_api
from boxqueue.facades.zaqar.queues import Message

BASE = "/v1.1"


@dataclass(frozen=True)
class Limits:
    """Zaqar's defaults (decision Z3)."""

    message_ttl: tuple[int, int] = (60, 1_209_600)
    default_message_ttl: int = 3600
    claim_ttl: tuple[int, int] = (60, 43_200)
    claim_grace: tuple[int, int] = (60, 43_200)
    default_claim_ttl: int = 300
    default_claim_grace: int = 60
    max_messages_post_size: int = 262_144
    max_queue_metadata: int = 65_536
    max_page: int = 20
    default_page: int = 10

    @classmethod
    def configured(cls, options: dict[str, int]) -> Limits:
        """Zaqar's defaults with the options of the configuration (Zaqar's names) applied."""
        base = cls()
        changes: dict[str, object] = {}
        for name, value in options.items():
            if name == "max_message_ttl":
                changes["message_ttl"] = (base.message_ttl[0], value)
            elif name == "max_claim_ttl":
                changes["claim_ttl"] = (base.claim_ttl[0], value)
            elif name == "max_claim_grace":
                changes["claim_grace"] = (base.claim_grace[0], value)
            else:
                changes[name] = value
        return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@dataclass
class Call:
    """One request after the common checks."""

    request: Request
    params: dict[str, list[str]]
    client: str | None
    project: str
    reply_type: str
    match: dict[str, str]



# -- responses ---------------------------------------------------------------------------------


def encode(doc: Any, reply_type: str) -> bytes:
    if reply_type == inp.MSGPACK:
        return msgpack.packb(doc, use_bin_type=True)
    return json.dumps(doc, ensure_ascii=False, separators=(", ", ": ")).encode("utf-8")


def document(call: Call, doc: Any, status: int = 200, headers: dict[str, str] | None = None,
             media: str | None = None) -> Response:
    return Response(encode(doc, call.reply_type), status, headers, media_type=media or call.reply_type)


def no_content(headers: dict[str, str] | None = None) -> Response:
    return Response(None, 204, headers)


def error_response(err: ZaqarError, reply_type: str | None) -> Response:
    """The one mapping of refusals to Zaqar's error bodies."""
    headers = dict(err.headers)
    if reply_type == inp.XML:
        return Response(xml_error(err), err.status, headers, media_type="application/xml")
    if reply_type is None:
        return Response(b"", err.status, headers)
    return Response(encode(err.body(), reply_type), err.status, headers, media_type=reply_type)


def xml_error(err: ZaqarError) -> bytes:
    """Falcon's XML error document, for clients that prefer XML (they get only errors)."""
    from xml.sax.saxutils import escape

    parts = [f"<title>{escape(err.title)}</title>"]
    if err.description is not None:
        parts.append(f"<description>{escape(err.description)}</description>")
    return ('<?xml version="1.0" encoding="UTF-8"?><error>' + "".join(parts) + "</error>").encode("utf-8")


# -- representations ---------------------------------------------------------------------------


def age(since: float, now: float) -> int:
    return max(0, int(now - since))


def message_doc(queue: str, msg: Message, now: float) -> dict[str, Any]:
    href = f"{BASE}/queues/{queue}/messages/{msg.id}"
    if msg.claim_id:
        href += f"?claim_id={msg.claim_id}"
    return {"id": msg.id, "href": href, "ttl": msg.ttl, "age": age(msg.created, now), "body": msg.body}


def stat_doc(queue: str, msg: Message, now: float) -> dict[str, Any]:
    created = datetime.fromtimestamp(msg.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"age": age(msg.created, now), "created": created, "href": f"{BASE}/queues/{queue}/messages/{msg.id}"}


def next_link(path: str, params: dict[str, list[str]], keep: dict[str, str], marker: str) -> list[dict[str, str]]:
    query = "&".join(f"{k}={v}" for k, v in keep.items() if k in params)
    query = f"{query}&marker={marker}" if query else f"marker={marker}"
    return [{"rel": "next", "href": f"{path}?{query}"}]


def page_limit(call: Call, limits: Limits, text: str = LIMIT_TEXT) -> int:
    limit = inp.query_int(call.params, "limit")
    if limit is None:
        return limits.default_page
    if not 1 <= limit <= limits.max_page:
        raise bad_api(text)
    return limit

