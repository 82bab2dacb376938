"""What a Zaqar request carries, read the way Zaqar (falcon) reads it.

Query strings (blank values absent, ``ids`` split on literal commas only), the checks every
``/v1.1/`` request passes (Content-Type, Accept, Client-ID, X-Project-Id) and bodies in JSON or
MessagePack (decision Z2), each failing with Zaqar's own status and text.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any
from urllib.parse import unquote_plus

import msgpack

from boxqueue.facades.zaqar.errors import ZaqarError, bad_body

JSON = "application/json"
MSGPACK = "application/x-msgpack"
XML = "application/xml"
MSGPACK_TYPES = ("application/x-msgpack", "application/msgpack", "application/vnd.msgpack")
TRUE_WORDS = frozenset({"true", "True", "t", "yes", "y", "1", "on"})
FALSE_WORDS = frozenset({"false", "False", "f", "no", "n", "0", "off"})
INT64 = (-(2**63), 2**63 - 1)
_INTEGER = re.compile(r"^[+-]?\d+$")
QUEUE_NAME = re.compile(r"^[a-zA-Z0-9_\-.]+$")


def parse_query(raw: bytes) -> dict[str, list[str]]:
    """Parameters in order; a value split on literal commas, blank values dropped."""
    params: dict[str, list[str]] = {}
    for pair in raw.decode("latin-1").split("&"):
        if not pair:
            continue
        name, _, value = pair.partition("=")
        values = [unquote_plus(v) for v in value.split(",")]
        values = [v for v in values if v != ""]
        if values:
            params.setdefault(unquote_plus(name), []).extend(values)
    return params


def query_int(params: dict[str, list[str]], name: str) -> int | None:
    values = params.get(name)
    if not values:
        return None
    if not _INTEGER.match(values[-1]):
        raise ZaqarError(400, "Invalid parameter",
                         f'The "{name}" parameter is invalid. The value must be an integer.')
    return int(values[-1])


def query_bool(params: dict[str, list[str]], name: str, default: bool) -> bool:
    values = params.get(name)
    if not values:
        return default
    if values[-1] in TRUE_WORDS:
        return True
    if values[-1] in FALSE_WORDS:
        return False
    raise ZaqarError(400, "Invalid parameter",
                     f'The "{name}" parameter is invalid. The value of the parameter must be "true" or "false".')


def query_str(params: dict[str, list[str]], name: str) -> str | None:
    values = params.get(name)
    return ",".join(values) if values else None


def _media_ranges(accept: str) -> list[tuple[str, float]]:
    ranges = []
    for part in accept.split(","):
        pieces = [p.strip() for p in part.split(";")]
        if not pieces[0]:
            continue
        q = 1.0
        for p in pieces[1:]:
            if p.startswith("q="):
                try:
                    q = float(p[2:])
                except ValueError:
                    q = 0.0
        ranges.append((pieces[0].lower(), q))
    return ranges


def _quality(ranges: list[tuple[str, float]], media: str) -> tuple[float, int]:
    """(q, specificity) of the most specific range matching ``media``."""
    kind = media.split("/")[0]
    best = (0.0, -1)
    for rng, q in ranges:
        spec = 2 if rng == media else 1 if rng == kind + "/*" else 0 if rng == "*/*" else -1
        if spec > best[1]:
            best = (q, spec)
    return best


def response_type(accept: str | None) -> str | None:
    """JSON or MessagePack as the client prefers (JSON on a tie); None if it takes neither."""
    if not accept or not accept.strip():
        return JSON
    ranges = _media_ranges(accept)
    json_q, _ = _quality(ranges, JSON)
    pack_q, pack_spec = max(_quality(ranges, m) for m in MSGPACK_TYPES)
    if pack_q > 0 and pack_spec == 2 and pack_q > json_q:
        return MSGPACK
    if json_q > 0:
        return JSON
    return MSGPACK if pack_q > 0 and pack_spec == 2 else None


def prefers_xml(accept: str | None) -> bool:
    """Whether a client that takes neither JSON nor msgpack takes XML (for its error bodies)."""
    ranges = _media_ranges(accept or "")
    return max(_quality(ranges, XML)[0], _quality(ranges, "text/xml")[0]) > 0


def check_client_id(value: str | None, required: bool) -> str | None:
    """The normalised Client-ID UUID (the same client however it is written)."""
    if value is None:
        if required:
            raise ZaqarError(400, "Missing header value", 'The "Client-ID" header is required.')
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise ZaqarError(400, "Wrong UUID value", "Malformed hexadecimal UUID.") from None


def check_project(value: str | None) -> str:
    if value is None:
        raise ZaqarError(400, "Project-Id Missing", "The header X-PROJECT-ID was missing")
    if value == "":
        raise ZaqarError(400, "Empty project header not allowed",
                         "X-PROJECT-ID cannot be an empty string. Specify the right header X-PROJECT-ID and retry.")
    return value


def check_queue_name(name: str, project: str) -> None:
    if len(name) > 64 or not QUEUE_NAME.match(name) or len(project) > 256:
        raise ZaqarError(400, "Invalid queue identification",
                         "The format of the submitted queue name or project id is not valid.")


def _checked_int(text: str) -> int:
    value = int(text)
    if not INT64[0] <= value <= INT64[1]:
        raise OverflowError
    return value


def _msgpack_ints_in_range(doc: Any) -> None:
    if isinstance(doc, bool):
        return
    if isinstance(doc, int) and not INT64[0] <= doc <= INT64[1]:
        raise OverflowError
    if isinstance(doc, list):
        for v in doc:
            _msgpack_ints_in_range(v)
    elif isinstance(doc, dict):
        for k, v in doc.items():
            if not isinstance(k, str):
                raise ValueError("map keys must be strings")
            _msgpack_ints_in_range(v)


def decode_body(raw: bytes, content_type: str | None) -> Any:
    """The document of a body: an object or an array, else Zaqar's 400."""
    media = (content_type or "").split(";")[0].strip().lower()
    try:
        if media in MSGPACK_TYPES:
            doc = msgpack.unpackb(raw, raw=False, strict_map_key=False)
            if isinstance(doc, (bytes, msgpack.ExtType)):
                raise ValueError("bin or ext at the top")
            _msgpack_ints_in_range(doc)
        else:
            doc = json.loads(raw.decode("utf-8"), parse_int=_checked_int)
    except OverflowError:
        raise bad_body("JSON contains integer that is too large.") from None
    except (ValueError, UnicodeDecodeError, msgpack.UnpackException, RecursionError):
        raise bad_body("Request body could not be parsed.") from None
    if not isinstance(doc, (dict, list)):
        raise bad_body("Request body could not be parsed.")
    return _plain(doc)


def _plain(doc: Any) -> Any:
    """Bin and ext values of msgpack never reach storage or JSON replies."""
    if isinstance(doc, (bytes, msgpack.ExtType)):
        raise bad_body("Request body could not be parsed.")
    if isinstance(doc, list):
        return [_plain(v) for v in doc]
    if isinstance(doc, dict):
        return {k: _plain(v) for k, v in doc.items()}
    return doc


def field_int(doc: dict[str, Any], name: str, default: int | None = None) -> int:
    """An integer field (``true`` counts as 1, as in Zaqar)."""
    if name not in doc:
        if default is None:
            raise bad_body(f'Missing "{name}" field.')
        return default
    value = doc[name]
    if not isinstance(value, int):
        raise bad_body(f'The value of the "{name}" field must be a int.')
    return int(value)
