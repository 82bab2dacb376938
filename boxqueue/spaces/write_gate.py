# cython: annotation_typing=True
"""Whether a client's write may happen: the one place that decides, below every caller.

Tarantool's box layer checks a write the same way whichever way it came (iproto, a Lua
function, the console): the instance must be writable (``box_check_writable``: ER_READONLY), and
the user must hold the privilege. Here that is :class:`WriteGate`, owned by the catalogue; the
iproto dispatcher, the ``box.space.*`` procedures, the Lua bindings and the tube engine's write
path all ask it, and none keeps a copy of the rules. What it decides, in this order:

1. the instance is writable: not a follower of a replica set (:attr:`WriteGate.read_only_reason`,
   set by replication) and the caller did not come through a read-only port;
2. the space's data is the client's to change: not owned by an engine (:mod:`boxqueue.spaces.ownership`);
3. the user holds the privilege.

A refusal raises the error Tarantool gives (ER_READONLY, ER_ACCESS_DENIED). Compiled
(``write_gate.pxd``), since every write asks.
"""

from __future__ import annotations

import cython

from boxqueue.errcodes import ER, BoxError
from boxqueue.spaces import access as acl
from boxqueue.spaces.access import AccessControl, User
from boxqueue.spaces.ownership import check_schema_change, write_refused
from boxqueue.spaces.space import Space
from boxqueue.storage.commit import GroupCommitter

_WRITE = cython.declare(cython.uint, acl.WRITE)


def _read_only_error() -> BoxError:
    return BoxError(ER.READONLY)


@cython.cclass
class WriteGate:
    """The checks every client write passes (see the module docstring)."""

    def __init__(self, access: AccessControl, committer: GroupCommitter | None = None) -> None:
        self.access = access
        self.committer = committer
        self.read_only_reason = None  # why the whole instance refuses writes (None: it does not)

    def set_read_only(self, reason: str | None) -> None:
        """The instance refuses every client write from now on (``reason``), or takes them again
        (None): replication makes a follower read-only and its promotion writable. The group
        committer refuses them too, so a write that no check above saw (an engine's verb, a
        facade's) fails there, before anything is queued."""
        self.read_only_reason = reason
        if self.committer is not None:
            self.committer.refuse_writes(None if reason is None else _read_only_error)

    @cython.ccall
    def check_writable(self, session_read_only: cython.bint) -> cython.void:
        """A write of any kind (DML, DDL, a state-changing procedure or queue verb) may happen."""
        if session_read_only or self.read_only_reason is not None:
            raise BoxError(ER.READONLY)

    @cython.ccall
    def check_space_write(self, user: object, space: Space, session_read_only: cython.bint) -> cython.void:
        """A DML write of ``space``'s data by ``user``."""
        if session_read_only or self.read_only_reason is not None:
            raise BoxError(ER.READONLY)
        if space.owned_by is not None:  # the engine's: spaces.ownership
            raise write_refused(space, user.name)
        universe: cython.uint = user.universe
        if universe & _WRITE == 0:
            self.access.check(user, acl.WRITE, acl.SPACE, space.name)

    def check_schema_write(self, user: User, session_read_only: bool = False) -> None:
        """DDL (spaces, indexes, users, functions) by ``user``."""
        if session_read_only or self.read_only_reason is not None:
            raise BoxError(ER.READONLY)
        self.access.check(user, acl.WRITE, acl.UNIVERSE, "")

    def check_schema_owner(self, user: User, space: object) -> None:
        """DDL of ``space`` once :meth:`check_schema_write` passed: not a space whose definition
        an engine keeps."""
        check_schema_change(space, user.name)
