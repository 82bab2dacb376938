"""Spaces whose data belongs to the engine: read like any space, changed only through it.

The tube engine keeps its tasks, tubes and claims in memory over what LMDB holds (box.queue's
1.5 queue spaces, Deckard's and Zaqar's spaces, its record spaces), Sonya's broadcast tubes keep
their counters and versions in ``sonya_*`` spaces, and Zaqar's pools and flavors live in spaces
too. A client writing one of those directly would silently desynchronise memory from storage,
so the rooms that own them register a rule here (``spaces`` imports none of them), the catalogue
marks every space with its owner whenever its definition changes, and the client entry points
(iproto DML in ``boxqueue.iproto.dispatch``, ``box.space.*`` methods over CALL and from Lua in
``boxqueue.spaces.space_procedures``, DDL from Lua) refuse to change an owned space with Tarantool's
access-denied error. Reads need only the ``read`` privilege, as for any space. The engine's own
writes never pass through those entry points.

The mark is an attribute of the :class:`spaces.space.Space` itself (``owned_by``), so the check on
the request path is one attribute test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from boxqueue.errcodes import BoxError, access_denied
from boxqueue.spaces.space import Space


@dataclass(frozen=True)
class Owner:
    """Who owns a space. ``schema_open``: DDL from clients stays allowed (box.queue's 1.5 queue
    spaces are the user's own declarations: adding the put_unique index is part of using them);
    otherwise the owner also keeps the space's definition (its name, indexes and existence)."""

    name: str
    schema_open: bool = False
    # Its non-unique secondary indexes in memory, not in LMDB (spaces/index_views.py): the tube
    # engine's spaces, whose tasks it holds in memory anyway.
    indexes_in_memory: bool = False


OwnerRule = Callable[[Space], Owner | None]


class Ownership:
    """The owners' rules; marks spaces with the first owner whose rule claims them."""

    def __init__(self) -> None:
        self._rules: list[OwnerRule] = []

    def add_rule(self, rule: OwnerRule, spaces: Iterable[Space] = ()) -> None:
        self._rules.append(rule)
        for space in spaces:
            self.mark(space)

    def mark(self, space: Space) -> None:
        owner = None
        for rule in self._rules:
            owner = rule(space)
            if owner is not None:
                break
        space.owned_by = owner
        space.keep_indexes_in_memory(owner is not None and owner.indexes_in_memory)


def write_refused(space: Space, user_name: str) -> BoxError:
    """What a client's direct write of an owned space gets: ER_ACCESS_DENIED, as a user without
    the ``write`` privilege on it would."""
    return access_denied("Write", "space", space.name, user_name)


def check_writable(space: object, user_name: str) -> None:
    """Raise :func:`write_refused` when ``space`` is owned (system views are not)."""
    if isinstance(space, Space) and space.owned_by is not None:
        raise write_refused(space, user_name)


def check_schema_change(space: object, user_name: str) -> None:
    """DDL on an owned space (drop, rename, format, indexes): refused unless its owner leaves
    the schema to the user."""
    if isinstance(space, Space) and space.owned_by is not None and not space.owned_by.schema_open:
        raise access_denied("Alter", "space", space.name, user_name)
