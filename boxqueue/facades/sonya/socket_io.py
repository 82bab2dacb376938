"""Writing HTTP answers on a raw non-blocking socket, for the connections the Sonya facade serves
itself (``socket_listeners``, ``longpolls``): the same Starlette ``Response`` objects the ASGI
endpoints return, framed by h11 for the request they answer."""

from __future__ import annotations

import re
from urllib.parse import unquote

import h11
from starlette.responses import Response

from boxqueue.frontdoor.http1_connections import SEND_TIMEOUT_S, http_date, receive_some, send_all

__all__ = ["SEND_TIMEOUT_S", "Route", "fast_response", "http_response", "keep_alive", "match_get",
           "receive_some", "send_all"]

Route = tuple[str, str | None, str]  # queue, id (None: the whole queue), query string


def match_get(request: h11.Request, path: re.Pattern[str]) -> Route | None:
    """(queue, id, query) of a GET whose percent-decoded path matches ``path`` (two groups, the
    second optional, as Starlette routes the same paths); None for anything else."""
    if request.method != b"GET":
        return None
    raw_path, _, query = request.target.partition(b"?")
    try:
        match = path.fullmatch(unquote(raw_path.decode("ascii")))
    except UnicodeDecodeError:
        return None
    if match is None:
        return None
    return match.group(1), match.group(2), query.decode("latin-1")


def http_response(conn: h11.Connection, answer: Response, close: bool = False) -> bytes:
    """``answer`` as bytes for the request ``conn`` has read (with a Date header, as hypercorn
    sends; ``close`` adds ``Connection: close``)."""
    headers = [*answer.raw_headers, (b"date", http_date())]
    if close:
        headers.append((b"connection", b"close"))
    data = conn.send(h11.Response(status_code=answer.status_code, headers=headers)) or b""
    data += conn.send(h11.Data(data=bytes(answer.body))) or b""  # bytes already: no copy
    return data + (conn.send(h11.EndOfMessage()) or b"")


def keep_alive(request: h11.Request) -> bool:
    """Whether the connection stays open after answering ``request`` (h11's rule: HTTP/1.1 and
    no ``close`` in ``Connection``)."""
    if request.http_version < b"1.1":
        return False
    return not any(name == b"connection" and b"close" in value.lower() for name, value in request.headers)


def fast_response(answer: Response, keep: bool) -> bytes:
    """``answer`` as bytes, as :func:`http_response` frames it for a GET without a body, without
    an h11 state machine (a long-poll answer's cost is mostly this otherwise)."""
    lines = [b"HTTP/1.1 %d \r\n" % answer.status_code]
    lines += [name + b": " + value + b"\r\n" for name, value in answer.raw_headers]
    lines.append(b"date: " + http_date() + b"\r\n")
    if not keep:
        lines.append(b"Connection: close\r\n")  # as h11 writes it
    lines.append(b"\r\n")
    lines.append(bytes(answer.body))  # bytes already: no copy
    return b"".join(lines)
