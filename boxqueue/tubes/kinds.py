"""What makes a tube box.queue's, Deckard's or Zaqar's: its defaults and its ordering rules.

Every tube of a space has the kind of its space: the queue spaces a user declares are box.queue's,
the space named by ``[deckard] space`` is Deckard's, the space of ``[zaqar] space`` and the spaces
of Zaqar's pools are Zaqar's. The engine asks the kind, whatever API makes the call:

* the defaults of a task put without a ttl or ttr;
* where a task goes when a call names no position of the tube's own kind (a ``box.queue.put``
  into a Deckard queue gets Deckard's default score, "now"; into a Zaqar queue, the post order);
* where a taken task goes when its deadline passes (Deckard: the front, K7);
* whether a tube exists on its own (a Zaqar queue exists until deleted, empty or not, so the
  engine stores a record of it; other tubes exist while they hold something).

Priorities: the sort key of every task is (ipri, pri, created). box.queue uses ipri as its
lanes and pri as the stored (inverted) priority; Deckard keeps ipri at 127 and its score in pri;
Zaqar keeps both at box.queue's defaults, so its tubes are FIFO by post order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

MED_PRI = 127
DEFAULT_PRI = 128  # box.queue's pri 0 stored inverted (D2)
MAX_PRI = 255

BOX_QUEUE = "box.queue"
DECKARD = "deckard"
ZAQAR = "zaqar"
QUEUE_MODULE = "queue"  # tarantool/queue's tubes (queue.create_tube)


@dataclass(frozen=True)
class TubeKind:
    """The rules of one API's tubes. Times in microseconds."""

    name: str
    default_ttl: int
    default_ttr: int
    stored_tubes: bool = False  # a tube exists on its own (a record in LMDB), until dropped
    numbered: bool = False  # task ids are 0, 1, 2... per tube (tarantool/queue's), not random

    def put_order(self, pri: int, urgent_ipri: int | None) -> tuple[float, float]:
        """(ipri, pri) of a task put by box.queue (``urgent_ipri``: box.queue's urgent lane)."""
        if self.name == DECKARD:
            return MED_PRI, 0.0 if urgent_ipri is not None else back_score()
        if self.name == ZAQAR:
            return MED_PRI, DEFAULT_PRI
        if self.name == QUEUE_MODULE:
            return MED_PRI, pri  # smaller first, as given
        return (MED_PRI if urgent_ipri is None else urgent_ipri), pri

    def requeue_order(self, last_ready_ipri: int | None, ipri: float, pri: float) -> tuple[float, float]:
        """(ipri, pri) of a requeued task: behind every ready task of the tube."""
        if self.name == DECKARD:
            return MED_PRI, back_score()
        if self.name == ZAQAR:
            return ipri, pri  # post order is the only order
        return (MED_PRI if last_ready_ipri is None else min(last_ready_ipri + 1, MAX_PRI)), pri

    @property
    def order_of_pri(self) -> bool:
        """Whether :meth:`put_order` depends on ``pri`` alone (a Deckard score reads the clock),
        so that a batch of puts asks once for each priority it holds."""
        return self.name != DECKARD

    @property
    def timeout_pri(self) -> float | None:
        """The priority a taken task gets when its deadline passes; None: it keeps its own."""
        return 0.0 if self.name == DECKARD else None

    @property
    def urgent_lanes(self) -> bool:
        """Whether box.queue's urgent looks at the head of the tube (its ipri lanes)."""
        return self.name == BOX_QUEUE


# tarantool/queue: a tube's ttl and ttr default to 100 years (its MAX_TIMEOUT); each tube's own
# defaults (create_tube's options) are applied by boxqueue/tubes/queue_module.py.
QUEUE_MODULE_KIND = TubeKind(QUEUE_MODULE, default_ttl=365 * 86400 * 100 * 1_000_000,
                             default_ttr=365 * 86400 * 100 * 1_000_000, stored_tubes=True, numbered=True)


def back_score() -> float:
    """Deckard's default score: now, in milliseconds (the back of a queue of default scores)."""
    return float(time.time_ns() // 1_000_000)


BOX_QUEUE_KIND = TubeKind(BOX_QUEUE, default_ttl=2_160_000 * 1_000_000, default_ttr=60 * 1_000_000)


def deckard_kind(default_ttl_minutes: int) -> TubeKind:
    """Deckard's queues: the configured default ttl (K2), the default ack deadline as ttr."""
    return TubeKind(DECKARD, default_ttl=default_ttl_minutes * 60_000_000, default_ttr=300 * 1_000_000)


def zaqar_kind(default_message_ttl_s: int, default_claim_ttl_s: int) -> TubeKind:
    """Zaqar's queues: its default message ttl, its default claim ttl as ttr; queues are stored."""
    return TubeKind(
        ZAQAR,
        default_ttl=default_message_ttl_s * 1_000_000,
        default_ttr=default_claim_ttl_s * 1_000_000,
        stored_tubes=True,
    )
