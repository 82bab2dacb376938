"""An async client for etcd v3's JSON gateway: the leases, keys and watches a leader election needs.

The replica set keeps no consensus protocol of its own: etcd holds the leader's lease and the term.
We speak to it through the grpc-gateway etcd 3.5 serves on its client URL (``POST /v3/...`` with
JSON bodies) over ``httpx``, so the replication room needs no gRPC stubs and runs on trio like the
rest of the process. The gateway's JSON is protobuf's: bytes are base64, int64 values are strings,
and fields holding their zero value are left out (a PUT event has no ``type``, a lost txn no
``succeeded``, a lapsed lease's keepalive no ``TTL``), so every read below supplies the default.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Literal

import httpx


class _Unserved(Exception):
    """A member failed a request it may have applied (it timed out, or cannot serve now)."""

    def __init__(self, error: EtcdError) -> None:
        super().__init__(str(error))
        self.error = error


class _Unreachable(Exception):
    """No endpoint could be connected to."""

    def __init__(self, error: EtcdError) -> None:
        super().__init__(str(error))
        self.error = error


class EtcdError(Exception):
    """etcd refused a request, answered something that is not the gateway's JSON, or no endpoint
    could be reached. ``code`` is the gRPC status code of a refusal (5: not found), else None."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class KeyValue:
    """A key as etcd holds it, with ``revision``: the store's revision when it was read."""

    key: bytes
    value: bytes
    create_revision: int  # 0 on a DELETE event: the key no longer exists
    mod_revision: int
    version: int
    lease: int  # 0: not attached to a lease
    revision: int


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change of a watched key; ``kv.revision`` is the revision etcd had sent it at."""

    type: Literal["PUT", "DELETE"]
    kv: KeyValue  # for a DELETE only the key and mod_revision (the deletion's revision) are set


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _kv(raw: dict[str, Any], revision: int) -> KeyValue:
    return KeyValue(
        key=base64.b64decode(raw.get("key", "")),
        value=base64.b64decode(raw.get("value", "")),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
        version=int(raw.get("version", 0)),
        lease=int(raw.get("lease", 0)),
        revision=revision,
    )


def _revision(answer: dict[str, Any]) -> int:
    return int(answer.get("header", {}).get("revision", 0))


def _refusal(what: str, error: Any, code: Any) -> EtcdError:
    """The gateway's error: ``{"error": "...", "code": N}`` for a call, ``{"error": {"message":
    ..., "grpc_code": N}}`` inside a stream."""
    if isinstance(error, dict):
        code, error = error.get("grpc_code", code), error.get("message", error)
    return EtcdError(f"{what}: {error} (code {code})", code if isinstance(code, int) else None)


# gRPC codes with which an etcd member says it cannot serve now (no raft leader, a minority
# side of a partition, overloaded): the next call goes to another endpoint.
UNAVAILABLE_CODES = frozenset({4, 8, 14})  # DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNAVAILABLE


def _prefix_end(prefix: bytes) -> bytes:
    """etcd's range_end for every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end and end[-1] == 0xFF:
        end.pop()
    if not end:
        return b"\0"
    end[-1] += 1
    return bytes(end)


class EtcdClient:
    """One connection pool over a list of endpoints ("host:port"), used in order.

    A call moves on to the next endpoint when it could not connect to one. A member that answers
    but cannot serve (it timed out, or said it has no leader: a minority member behind a
    partition) is left for the next endpoint too: a read (``idempotent``) is sent there at once;
    a request that may have been applied (a grant, a txn) is not sent again, it fails with
    :class:`EtcdError`, and the next call starts at the next endpoint.
    """

    def __init__(self, endpoints: list[str], timeout: float) -> None:
        if not endpoints:
            raise ValueError("EtcdClient needs at least one endpoint")
        self._urls = [e if "://" in e else f"http://{e}" for e in endpoints]
        self._current = 0
        self._timeout = timeout
        # trust_env=False: an HTTP(S)_PROXY in the environment must not carry loopback traffic
        self._http = httpx.AsyncClient(timeout=timeout, trust_env=False)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _send(self, path: str, body: dict[str, Any], stream: bool = False,
                    ) -> tuple[str, httpx.Response]:
        unreachable = []
        # a watch may rightly be silent for hours: only connecting and sending are bounded
        timeout = httpx.Timeout(self._timeout, read=None) if stream else self._timeout
        for _ in self._urls:
            url = self._urls[self._current]
            request = self._http.build_request("POST", url + path, json=body, timeout=timeout)
            try:
                return url, await self._http.send(request, stream=stream)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                unreachable.append(f"{url}: {type(exc).__name__} {exc}")
                self._current = (self._current + 1) % len(self._urls)
            except httpx.HTTPError as exc:
                self._current = (self._current + 1) % len(self._urls)
                raise EtcdError(f"{path} on {url}: {type(exc).__name__} {exc}") from exc
        raise _Unreachable(EtcdError(f"{path}: no etcd endpoint reachable ({'; '.join(unreachable)})"))

    async def _call(self, path: str, body: dict[str, Any], idempotent: bool = False) -> dict[str, Any]:
        """One request; an ``idempotent`` one (a read, a keepalive) is sent to the next endpoint
        when one fails it, until each has been tried."""
        tries = len(self._urls) if idempotent else 1
        while True:
            tries -= 1
            try:
                return await self._call_once(path, body)
            except _Unserved as exc:
                if tries <= 0:
                    raise exc.error from None

    async def _call_once(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            url, response = await self._send(path, body)
        except _Unreachable as exc:
            raise exc.error from None  # every endpoint was tried
        except EtcdError as exc:  # it reached a member that did not answer in time
            raise _Unserved(exc) from None
        what = f"{path} on {url}"
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if isinstance(answer, dict) and "error" in answer:
            error = _refusal(what, answer["error"], answer.get("code"))
            if error.code in UNAVAILABLE_CODES or response.status_code >= 500:
                self._move_on(url)
                raise _Unserved(error)
            raise error
        if response.status_code != 200 or not isinstance(answer, dict):
            error = EtcdError(f"{what}: HTTP {response.status_code} {response.text[:200]!r}")
            if response.status_code >= 500:
                self._move_on(url)
                raise _Unserved(error)
            raise error
        return answer

    def _move_on(self, url: str) -> None:
        """``url`` answered but cannot serve: the next call starts at the next endpoint."""
        if self._urls[self._current] == url:
            self._current = (self._current + 1) % len(self._urls)

    # leases

    async def grant(self, ttl_s: int) -> int:
        """A new lease's id. etcd raises a TTL below its minimum (2 s by default) to the minimum."""
        answer = await self._call("/v3/lease/grant", {"TTL": str(ttl_s)})
        return int(answer["ID"])

    async def keepalive(self, lease_id: int) -> int:
        """Renews the lease; returns its TTL in seconds, 0 once it has lapsed or been revoked
        (the gateway answers a missing lease with TTL 0, not an error)."""
        # a stream RPC: the gateway wraps its one answer in {"result": ...}
        answer = await self._call("/v3/lease/keepalive", {"ID": str(lease_id)}, idempotent=True)
        return int(answer.get("result", {}).get("TTL", 0))

    async def revoke(self, lease_id: int) -> None:
        """Ends the lease and deletes its keys; EtcdError with code 5 if it no longer exists."""
        await self._call("/v3/lease/revoke", {"ID": str(lease_id)})

    # keys

    async def get(self, key: bytes) -> KeyValue | None:
        return (await self.read(key))[0]

    async def read(self, key: bytes) -> tuple[KeyValue | None, int]:
        """The key (None if absent) and the store's revision when it was read."""
        answer = await self._call("/v3/kv/range", {"key": _b64(key)}, idempotent=True)
        kvs = answer.get("kvs", [])
        revision = _revision(answer)
        return (_kv(kvs[0], revision) if kvs else None), revision

    async def read_prefix(self, prefix: bytes) -> tuple[list[KeyValue], int]:
        """Every key starting with ``prefix``, and the store's revision when they were read."""
        answer = await self._call("/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix))},
                                  idempotent=True)
        revision = _revision(answer)
        return [_kv(raw, revision) for raw in answer.get("kvs", [])], revision

    async def put(self, key: bytes, value: bytes, lease_id: int | None = None) -> int:
        """Returns the revision of the write."""
        body = {"key": _b64(key), "value": _b64(value), "lease": str(lease_id or 0)}
        return _revision(await self._call("/v3/kv/put", body))

    async def delete(self, key: bytes) -> bool:
        """Whether there was a key to delete."""
        answer = await self._call("/v3/kv/deleterange", {"key": _b64(key)})
        return int(answer.get("deleted", 0)) > 0

    async def create_if_absent(self, key: bytes, value: bytes, lease_id: int | None = None,
                               unchanged: dict[bytes, int] | None = None) -> tuple[bool, int]:
        """Puts the key only if it does not exist (and every key of ``unchanged`` still has the
        mod_revision given), in one txn. Returns whether this call created it and the key's
        create_revision: ours when we won, the holder's when we lost, 0 when the key is absent
        but one of ``unchanged`` changed. The create_revision only grows from one holder to the
        next, which makes it a term."""
        k = _b64(key)
        compare = [{"key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}]
        compare += [{"key": _b64(other), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod)}
                    for other, mod in (unchanged or {}).items()]
        answer = await self._call("/v3/kv/txn", {
            "compare": compare,
            "success": [{"request_put": {"key": k, "value": _b64(value),
                                         "lease": str(lease_id or 0)}}],
            "failure": [{"request_range": {"key": k}}],
        })
        if answer.get("succeeded", False):
            return True, _revision(answer)  # a txn's writes all happen at its revision
        kvs = answer["responses"][0]["response_range"].get("kvs", [])
        return False, int(kvs[0]["create_revision"]) if kvs else 0

    async def delete_if(self, key: bytes, create_revision: int) -> bool:
        """Deletes the key only while it is still the incarnation created at ``create_revision``:
        a leader stepping down must not remove the key of a successor elected meanwhile."""
        k = _b64(key)
        answer = await self._call("/v3/kv/txn", {
            "compare": [{"key": k, "target": "CREATE", "result": "EQUAL",
                         "create_revision": str(create_revision)}],
            "success": [{"request_delete_range": {"key": k}}],
        })
        return bool(answer.get("succeeded", False))

    # watch

    async def watch(self, key: bytes, start_revision: int | None = None, prefix: bool = False,
                    ) -> AsyncGenerator[WatchEvent, None]:
        """The key's changes (every key's under it, with ``prefix``) from ``start_revision`` (else
        from now), as long as the consumer
        iterates. Cancelling the consumer closes the stream; a consumer that stops early by
        ``break`` should hold the iterator in ``contextlib.aclosing`` so it closes at once.
        No task is started: the stream is read in the consumer's own task. A watch that etcd
        ends (a compacted start_revision, the server going away) raises EtcdError."""
        create: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            create["range_end"] = _b64(_prefix_end(key))
        if start_revision is not None:
            create["start_revision"] = str(start_revision)
        try:
            url, response = await self._send("/v3/watch", {"create_request": create}, stream=True)
        except _Unreachable as exc:
            raise exc.error from None
        what = f"/v3/watch on {url}"
        try:
            if response.status_code != 200:
                await response.aread()
                raise EtcdError(f"{what}: HTTP {response.status_code} {response.text[:200]!r}")
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                try:
                    message = json.loads(line)
                except ValueError:
                    raise EtcdError(f"{what}: not the gateway's JSON: {line[:200]!r}") from None
                if "error" in message:
                    raise _refusal(what, message["error"], message.get("code"))
                result = message.get("result", {})
                if result.get("canceled"):
                    reason = result.get("cancel_reason") or (
                        f"history compacted up to revision {result.get('compact_revision')}")
                    raise EtcdError(f"{what}: watch canceled by etcd: {reason}")
                revision = _revision(result)
                for event in result.get("events", []):
                    kind: Literal["PUT", "DELETE"] = "DELETE" if event.get("type") == "DELETE" else "PUT"
                    yield WatchEvent(kind, _kv(event.get("kv", {}), revision))
        except httpx.HTTPError as exc:
            raise EtcdError(f"{what}: {type(exc).__name__} {exc}") from exc
        finally:
            await response.aclose()
        raise EtcdError(f"{what}: the stream ended")
