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


class EtcdClient:
    """One connection pool over a list of endpoints ("host:port"), used in order.

    A call moves on to the next endpoint only when it could not connect to one: a request that
    reached etcd may have been applied (a grant, a txn) even if its answer was lost, so it is not
    sent again; it fails with :class:`EtcdError`, and the next call starts at the next endpoint.
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
        raise EtcdError(f"{path}: no etcd endpoint reachable ({'; '.join(unreachable)})")

    async def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url, response = await self._send(path, body)
        what = f"{path} on {url}"
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if isinstance(answer, dict) and "error" in answer:
            raise _refusal(what, answer["error"], answer.get("code"))
        if response.status_code != 200 or not isinstance(answer, dict):
            raise EtcdError(f"{what}: HTTP {response.status_code} {response.text[:200]!r}")
        return answer

    # leases

    async def grant(self, ttl_s: int) -> int:
        """A new lease's id. etcd raises a TTL below its minimum (2 s by default) to the minimum."""
        answer = await self._call("/v3/lease/grant", {"TTL": str(ttl_s)})
        return int(answer["ID"])

    async def keepalive(self, lease_id: int) -> int:
        """Renews the lease; returns its TTL in seconds, 0 once it has lapsed or been revoked
        (the gateway answers a missing lease with TTL 0, not an error)."""
        # a stream RPC: the gateway wraps its one answer in {"result": ...}
        answer = await self._call("/v3/lease/keepalive", {"ID": str(lease_id)})
        return int(answer.get("result", {}).get("TTL", 0))

    async def revoke(self, lease_id: int) -> None:
        """Ends the lease and deletes its keys; EtcdError with code 5 if it no longer exists."""
        await self._call("/v3/lease/revoke", {"ID": str(lease_id)})

    # keys

    async def get(self, key: bytes) -> KeyValue | None:
        answer = await self._call("/v3/kv/range", {"key": _b64(key)})
        kvs = answer.get("kvs", [])
        return _kv(kvs[0], _revision(answer)) if kvs else None

    async def put(self, key: bytes, value: bytes, lease_id: int | None = None) -> int:
        """Returns the revision of the write."""
        body = {"key": _b64(key), "value": _b64(value), "lease": str(lease_id or 0)}
        return _revision(await self._call("/v3/kv/put", body))

    async def delete(self, key: bytes) -> bool:
        """Whether there was a key to delete."""
        answer = await self._call("/v3/kv/deleterange", {"key": _b64(key)})
        return int(answer.get("deleted", 0)) > 0

    async def create_if_absent(self, key: bytes, value: bytes, lease_id: int | None = None,
                               ) -> tuple[bool, int]:
        """Puts the key only if it does not exist, in one txn. Returns whether this call created
        it and the key's create_revision: ours when we won, the holder's when we lost. The
        create_revision only grows from one holder to the next, which makes it a term."""
        k = _b64(key)
        answer = await self._call("/v3/kv/txn", {
            "compare": [{"key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": {"key": k, "value": _b64(value),
                                         "lease": str(lease_id or 0)}}],
            "failure": [{"request_range": {"key": k}}],
        })
        if answer.get("succeeded", False):
            return True, _revision(answer)  # a txn's writes all happen at its revision
        kvs = answer["responses"][0]["response_range"].get("kvs", [])
        if not kvs:  # cannot happen: the compare and the range see the same revision
            raise EtcdError(f"/v3/kv/txn: {key!r} exists and does not: {answer}")
        return False, int(kvs[0]["create_revision"])

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

    async def watch(self, key: bytes, start_revision: int | None = None,
                    ) -> AsyncGenerator[WatchEvent, None]:
        """The key's changes from ``start_revision`` (else from now), as long as the consumer
        iterates. Cancelling the consumer closes the stream; a consumer that stops early by
        ``break`` should hold the iterator in ``contextlib.aclosing`` so it closes at once.
        No task is started: the stream is read in the consumer's own task. A watch that etcd
        ends (a compacted start_revision, the server going away) raises EtcdError."""
        create: dict[str, Any] = {"key": _b64(key)}
        if start_revision is not None:
            create["start_revision"] = str(start_revision)
        url, response = await self._send("/v3/watch", {"create_request": create}, stream=True)
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
