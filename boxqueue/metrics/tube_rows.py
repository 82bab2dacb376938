"""One row per tube of every API, read from the engine's memory: depth by state, the tallies of
what happened to its tasks, waiting takes and the age of its oldest ready task."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import trio
import trio.lowlevel

from boxqueue.tubes.task import HUMAN, READY, STATUS_ORDER
from boxqueue.tubes.tube import TALLIES, Tube

STATES = tuple(HUMAN[s] for s in STATUS_ORDER)  # ready, delayed, taken, buried, done


@dataclass(slots=True)
class TubeRow:
    space: str
    tube: str
    kind: str  # the API whose put created it: box.queue, deckard or zaqar
    counts: tuple[int, ...]  # by STATES
    tally: tuple[int, ...]  # by tubes.tube.TALLIES
    waiting: int  # takes waiting for a task
    oldest_ready_s: float  # age of the oldest ready task; 0 when none is ready

    @property
    def total(self) -> int:
        return sum(self.counts)

    def as_json(self) -> dict[str, Any]:
        return {
            "space": self.space, "tube": self.tube, "kind": self.kind,
            "states": dict(zip(STATES, self.counts, strict=True)),
            "tally": dict(zip(TALLIES, self.tally, strict=True)),
            "waiting": self.waiting, "oldest_ready_s": round(self.oldest_ready_s, 3),
        }


def oldest_ready_created(tube: Tube) -> int | None:
    """When the oldest ready task was created. ``tube.tasks`` is in creation order, so the first
    ready one found is it; the walk gives up after as many tasks as are ready and takes the
    minimum over the ready list instead, so it costs at most about twice the ready count."""
    ready = tube.counts[READY]
    if not ready:
        return None
    for steps, task in enumerate(tube.tasks.values(), 1):
        if task.status == READY:
            return task.created
        if steps >= ready:
            break
    return min(task.created for task in tube.ready)


Entry = tuple[str, str, Tube]  # (space name, tube name, the tube)


def tube_entries(engine: Any, catalog: Any) -> list[Entry]:
    """Every tube the engine knows with its space's name (cheap: no figures read yet)."""
    names: dict[int, str] = {}
    out = []
    for (sid, name), tube in list(engine.tubes.items()):
        space = names.get(sid)
        if space is None:
            found = catalog.spaces.get(sid)
            space = names[sid] = found.name if found is not None else str(sid)
        out.append((space, name, tube))
    return out


def row_of(entry: Entry, now_us: int) -> TubeRow:
    space, name, tube = entry
    counts = tube.counts
    created = oldest_ready_created(tube)
    return TubeRow(
        space, name, tube.kind.name, tuple(counts[s] for s in STATUS_ORDER), tuple(tube.tally),
        len(tube.waiters), 0.0 if created is None else max(now_us - created, 0) / 1_000_000,
    )


def tube_rows(engine: Any, catalog: Any) -> list[TubeRow]:
    """Every tube's row, in no particular order."""
    now_us = time.time_ns() // 1000
    return [row_of(entry, now_us) for entry in tube_entries(engine, catalog)]


async def tube_rows_paced(engine: Any, catalog: Any, chunk: int = 1000) -> list[TubeRow]:
    """The same, yielding to the event loop after every ``chunk`` tubes so that reading 10,000 of
    them never holds requests up for long (a tube that changes meanwhile is read as it is then)."""
    now_us = time.time_ns() // 1000
    entries = tube_entries(engine, catalog)
    rows: list[TubeRow] = []
    for first in range(0, len(entries), chunk):
        rows.extend(row_of(entry, now_us) for entry in entries[first:first + chunk])
        await trio.lowlevel.checkpoint()
    return rows
