"""Data written by the three-engine layout (before one engine served every API), moved into the
engine's spaces at start, once.

Deckard's messages were tuples of ``deckard_messages`` and its limits of ``deckard_queues``;
Zaqar's queues, messages and claims were tuples of ``zaqar_queues``, ``zaqar_messages`` (or of a
pool's space, with the same message layout) and ``zaqar_claims``. Each is rewritten as tasks of
the tube layout (:mod:`boxqueue.tubes.task`) with the same state, order, times and content, and tube and
claim records; the old spaces are dropped in the end (a pool's old space gives way to a new one
of the same name). Every step is a durable write, and the old spaces are dropped only after
everything they held is written, so a crash during the migration leaves the old data to migrate
again at the next start (rewriting what was already written, by the same keys).

A space is taken as the old layout only if its fields are exactly the old ones; anything else
with those names is left alone.
"""

from __future__ import annotations

import logging
from typing import Any

from boxqueue.spaces.catalog import Catalog
from boxqueue.spaces.msgpack_values import pack
from boxqueue.spaces.space import REPLACE, Space, decode_tuple
from boxqueue.tubes.engine import CLAIM_RECORDS, TUBE_RECORDS, QueueEngine, QueueSpace
from boxqueue.tubes.kinds import DEFAULT_PRI, MED_PRI, TubeKind
from boxqueue.tubes.task import (
    DELAYED,
    READY,
    TAKEN,
    TUBE_FORMAT,
    TUBE_KEY,
    TUBE_LAYOUT,
    Task,
    encode_task,
)

log = logging.getLogger(__name__)

OLD_DECKARD_MESSAGES = "deckard_messages"
OLD_DECKARD_LIMITS = "deckard_queues"
OLD_ZAQAR_QUEUES = "zaqar_queues"
OLD_ZAQAR_MESSAGES = "zaqar_messages"
OLD_ZAQAR_CLAIMS = "zaqar_claims"
OLD_ZAQAR_POOLS = "zaqar_pools"  # kept as it is (tubes.pools): only its spaces change layout
POOL_URI = "boxqueue://"

# The old Deckard message: 0 queue 1 id 2 state 3 score 4 event(ms) 5 restore 6 expires(ms)
# 7 seq(us) 8 acks 9 nacks 10 consecutive acks 11 consecutive nacks 12 breakpoint, then
# description, string payload, metadata, payload.
_OLD_DECKARD_FIELDS = (
    "queue", "id", "state", "score", "event", "restore", "expires", "seq", "acks", "nacks",
    "consecutive_acks", "consecutive_nacks", "breakpoint",
)
_DECKARD_TTR_US = 300_000_000
BATCH = 1000


def _field_names(space: Space) -> tuple[str, ...]:
    return tuple(f.name for f in space.defn.format)


async def migrate(catalog: Catalog, engine: QueueEngine, *, deckard: QueueSpace | None, zaqar: QueueSpace | None,
                  zaqar_kind: TubeKind | None) -> None:
    """Move what the old layout left into the engine's spaces (before the engine recovers)."""
    messages = catalog.by_name.get(OLD_DECKARD_MESSAGES)
    if messages is not None and _field_names(messages) == _OLD_DECKARD_FIELDS and deckard is not None:
        await _migrate_deckard(catalog, engine, deckard, messages)
    queues = catalog.by_name.get(OLD_ZAQAR_QUEUES)
    if queues is not None and zaqar is not None and zaqar_kind is not None and queues.primary is not None:
        await _migrate_zaqar(catalog, engine, zaqar, zaqar_kind, queues)


async def _write(catalog: Catalog, writes: list[Any]) -> None:
    def write(txn: Any) -> None:
        for fn in writes:
            fn(txn)

    if writes:
        await catalog.committer.write(write)


def _put(space: Space, fields: list[Any]) -> Any:
    return space.prepare_put(pack(fields), fields, REPLACE)


async def _migrate_deckard(catalog: Catalog, engine: QueueEngine, target: QueueSpace, messages: Space) -> None:
    count = 0
    writes: list[Any] = []
    for raw in messages.pairs(0, 2, []):
        f = decode_tuple(raw)
        queue, mid, state, score, event_ms, restore, expires_ms, seq = f[:8]
        acks, nacks, cacks, cnacks, breakpoint = f[8:13]
        description, string_payload, metadata, payload = ([*f[13:], "", "", {}, {}])[:4]
        attrs: dict[str, Any] = {"acks": acks, "nacks": nacks, "cacks": cacks, "cnacks": cnacks, "bp": breakpoint}
        expires = expires_ms * 1000
        ttl = max(expires - seq, 0)
        if state == "a":
            status, event = READY, seq + ttl
        elif state == "p":
            status, event = TAKEN, min(event_ms * 1000, seq + ttl)
        else:
            status, event = DELAYED, min(event_ms * 1000, seq + ttl)
            attrs["unlock"] = float(restore) if restore != -1 else (0.0 if state == "ln" else None)
        task = Task(mid, queue, status, event, MED_PRI, float(score), 0, seq, ttl, _DECKARD_TTR_US, 0,
                    acks + nacks + (status == TAKEN), attrs)
        attachments = {"description": description or "", "metadata": metadata or {}, "payload": payload or {}}
        tuple_raw = encode_task(task.header(), 2, pack(attachments) + pack(string_payload or ""))
        writes.append(target.space.prepare_put(tuple_raw, decode_tuple(tuple_raw), REPLACE))
        count += 1
        if len(writes) >= BATCH:
            await _write(catalog, writes)
            writes = []
    limits = catalog.by_name.get(OLD_DECKARD_LIMITS)
    records = engine_records(engine, TUBE_RECORDS)
    if limits is not None and limits.primary is not None:
        for raw in limits.pairs(0, 2, []):
            queue, limit = decode_tuple(raw)[:2]
            writes.append(_put(records, [target.id, queue, {"limit": limit}]))
    await _write(catalog, writes)
    await catalog.drop_space(messages)
    if limits is not None:
        await catalog.drop_space(limits)
    log.info("moved %d Deckard messages from %s into space %s", count, OLD_DECKARD_MESSAGES, target.space.name)


def engine_records(engine: QueueEngine, name: str) -> Space:
    return engine.record_space(name)


async def _migrate_zaqar(catalog: Catalog, engine: QueueEngine, default: QueueSpace, kind: TubeKind,
                         queues: Space) -> None:
    """Queues to tube records, messages to tasks (each queue in the space it was placed in),
    claims to claim records. A pool's space of the old layout is copied into a new space, which
    then takes its name; every step can be run again after a crash."""
    placed: dict[tuple[str, str], str] = {}
    metadata: dict[tuple[str, str], Any] = {}
    for raw in queues.pairs(0, 2, []):
        f = decode_tuple(raw)
        placed[(f[1], f[2])] = f[4] if len(f) > 4 else OLD_ZAQAR_MESSAGES
        metadata[(f[1], f[2])] = f[3]
    claims: dict[tuple[str, str], list[list[Any]]] = {}
    claim_space = catalog.by_name.get(OLD_ZAQAR_CLAIMS)
    if claim_space is not None and claim_space.primary is not None:
        for raw in claim_space.pairs(0, 2, []):
            f = decode_tuple(raw)
            claims.setdefault((f[1], f[2]), []).append(f)
    pool_spaces = set()
    pools = catalog.by_name.get(OLD_ZAQAR_POOLS)
    if pools is not None and pools.primary is not None:
        for raw in pools.pairs(0, 2, []):
            uri = decode_tuple(raw)[1]
            if isinstance(uri, str) and uri.startswith(POOL_URI):
                pool_spaces.add(uri[len(POOL_URI):])
    targets: dict[str, QueueSpace] = {OLD_ZAQAR_MESSAGES: default}
    moved = 0
    for name in sorted((set(placed.values()) | pool_spaces) - {OLD_ZAQAR_MESSAGES}):
        targets[name], count = await _migrate_pool_space(catalog, engine, kind, name, placed, claims)
        moved += count
    old = catalog.by_name.get(OLD_ZAQAR_MESSAGES)
    if old is not None and old.primary is not None:
        moved += await _copy_messages(catalog, old, default, kind, placed, claims, OLD_ZAQAR_MESSAGES)
    records = engine_records(engine, TUBE_RECORDS)
    claim_records = engine_records(engine, CLAIM_RECORDS)
    writes: list[Any] = []
    for key, space_name in placed.items():
        target = targets[space_name]
        writes.append(_put(records, [target.id, f"{key[0]}/{key[1]}", {"metadata": metadata[key]}]))
        for f in claims.get(key, []):
            cid, ttl, grace, expires, updated = f[0], f[3], f[4], f[5], f[6]
            writes.append(_put(claim_records, [target.id, f"{key[0]}/{key[1]}", cid, ttl * 1_000_000,
                                               grace * 1_000_000, int(expires * 1_000_000), int(updated * 1_000_000)]))
    await _write(catalog, writes)
    for name in (OLD_ZAQAR_MESSAGES, OLD_ZAQAR_CLAIMS, OLD_ZAQAR_QUEUES):  # the queues last
        space = catalog.by_name.get(name)
        if space is not None:
            await catalog.drop_space(space)
    log.info("moved %d Zaqar queues and %d messages into the engine's spaces", len(placed), moved)


async def _migrate_pool_space(catalog: Catalog, engine: QueueEngine, kind: TubeKind, name: str,
                              placed: dict[tuple[str, str], str],
                              claims: dict[tuple[str, str], list[list[Any]]]) -> tuple[QueueSpace, int]:
    old = catalog.by_name.get(name)
    staging_name = name + "__tubes"
    moved = 0
    if old is not None and _old_message_layout(old):
        staging = catalog.by_name.get(staging_name)
        if staging is None:
            staging, _ = await catalog.create_space(staging_name, format=TUBE_FORMAT)
        if staging.primary is None:
            await catalog.create_index(staging, "primary", index_type="TREE", unique=True, parts=TUBE_KEY)
        target = QueueSpace(staging, TUBE_LAYOUT, kind, owned=True)
        moved = await _copy_messages(catalog, old, target, kind, placed, claims, name)
        await catalog.drop_space(old)
    staging = catalog.by_name.get(staging_name)
    if staging is not None and catalog.by_name.get(name) is None:
        await catalog.alter_space(staging, name=name)
    return await engine.own_space(name, kind), moved


async def _copy_messages(catalog: Catalog, old: Space, target: QueueSpace, kind: TubeKind,
                         placed: dict[tuple[str, str], str], claims: dict[tuple[str, str], list[list[Any]]],
                         old_name: str) -> int:
    """The old messages of ``old`` as tasks of ``target`` (their post order kept)."""
    rows = sorted((decode_tuple(raw) for raw in old.pairs(0, 2, [])), key=lambda r: r[0])
    last_created = 0
    moved = 0
    writes: list[Any] = []
    for f in rows:
        _seq, project, queue, mid, created, ttl_s, expires, client, body, claim_id, claim_expires = f[:11]
        if placed.get((project, queue)) != old_name:
            continue  # a message of a deleted queue
        created_us = max(int(created * 1_000_000), last_created + 1)
        last_created = created_us
        ttl = max(int(expires * 1_000_000) - created_us, 0)
        attrs: dict[str, Any] = {"client": client}
        if abs(ttl - ttl_s * 1_000_000) > 1_000_000:
            attrs["lifetime"] = ttl_s * 1_000_000  # extended by a claim's grace
        live = any(c[0] == claim_id for c in claims.get((project, queue), []))
        if claim_id and live:
            status, cid, event = TAKEN, claim_id, min(int(claim_expires * 1_000_000), created_us + ttl)
        else:
            status, cid, event = READY, claim_id or 0, created_us + ttl
        task = Task(mid, f"{project}/{queue}", status, event, MED_PRI, DEFAULT_PRI, cid, created_us, ttl,
                    kind.default_ttr, 0, int(status == TAKEN), attrs)
        tuple_raw = encode_task(task.header(), 2, pack({}) + pack(body))
        writes.append(target.space.prepare_put(tuple_raw, decode_tuple(tuple_raw), REPLACE))
        moved += 1
        if len(writes) >= BATCH:
            await _write(catalog, writes)
            writes = []
    await _write(catalog, writes)
    return moved


def _old_message_layout(space: Space) -> bool:
    """A pool's space of the old layout: primary key on field 0 (the seq), no format."""
    return not space.defn.format and space.primary is not None and space.primary.fieldnos == (0,)

