"""Secondary indexes kept in memory, as memtx keeps its indexes: for the spaces the tube engine owns.

The engine already holds every task's header and orderings in memory, so writing each task's
secondary index entries to LMDB as well (put, rewritten at every change of status, deleted with
the task, and each change logged and replicated) was paid on every verb for selects that
clients rarely make. A space marked ``indexes_in_memory`` (``spaces/ownership.py``) keeps its
non-unique secondary indexes here instead; LMDB holds each tuple once, under its primary key, and
its unique indexes as before (a write must check those against every write before it).

Writes do not maintain the views. A write notes only the primary key it changed and the id of
its write transaction (:meth:`IndexViews.changed`); a view is built at the first read of its
index (each index on its own: a view costs a few hundred bytes a tuple, and a client selecting by
one index should not pay for the others), from the reader's snapshot, and the views are brought
up to date at each read by refreshing, from that snapshot, the tuples changed since. So a read sees exactly the snapshot the primary index
shows (writes a group commit has not yet answered are not seen, as with the LMDB indexes), a
write that is rolled back needs no undo, and a server whose clients never select by those indexes
never builds them. LMDB gives a write transaction the id its commit will have and a read
transaction the id of the last commit it shows, so a change is in a snapshot when its id is at
most the snapshot's.

The keys are the stored keys the LMDB index held (``storage/keys.py``), so the iterators of
``spaces/iterators.py`` walk a view (with their ``ListCursor``) exactly as they walked the LMDB
index: same order, same results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedList

from boxqueue.spaces.iterators import ListCursor
from boxqueue.spaces.msgpack_scan import leading_items
from boxqueue.spaces.msgpack_values import unpack
from boxqueue.storage import keys

if TYPE_CHECKING:
    from boxqueue.spaces.space import Index, Space

# Changes noted before the noted set is pruned (or, with views built, folded into them) even if
# nobody reads: bounds what a space that is written and never read by these indexes holds.
PRUNE_AT = 4096


class SortedView:
    """One index in memory: its entries' stored keys in order, each with its tuple's stored
    primary key (every entry of a non-unique index ends with its primary key, so keys are unique)."""

    __slots__ = ("keys", "pk_by_key", "key_by_pk")

    def __init__(self, entries: list[tuple[bytes, bytes]]) -> None:
        self.keys = SortedList(key for key, _pk in entries)
        self.pk_by_key = dict(entries)
        self.key_by_pk = {pk: key for key, pk in entries}

    def move(self, pk: bytes, key: bytes | None) -> None:
        """The tuple ``pk`` now has the entry ``key`` (None: it is gone)."""
        old = self.key_by_pk.pop(pk, None)
        if old == key:
            if key is not None:
                self.key_by_pk[pk] = key
            return
        if old is not None:
            self.keys.remove(old)
            del self.pk_by_key[old]
        if key is not None:
            self.keys.add(key)
            self.pk_by_key[key] = pk
            self.key_by_pk[pk] = key

    def __len__(self) -> int:
        return len(self.keys)


class IndexViews:
    """The in-memory indexes of one space, and the changes not yet folded into them."""

    def __init__(self, space: Space, noted: dict[bytes, int] | None = None) -> None:
        self.space = space
        # Stored primary key -> id of the write transaction of its latest change, for every
        # change that a read may not yet have folded in (or, with no views, that the shared
        # reader may not show yet).
        self.noted: dict[bytes, int] = {} if noted is None else noted
        self.views: dict[int, SortedView] = {}  # by index id, those built so far
        self.built_at = 0  # the snapshot the oldest of the views was built from
        self.emptied_at = 0  # the last truncation's write transaction
        self._prune_at = PRUNE_AT
        self.builds = 0  # how many times the views were built (tests and metrics read it)

    # -- writes (in the write transaction, on the event loop) ----------------------------------

    def changed(self, txn: Any, pk_stored: bytes) -> None:
        """The tuple stored under ``pk_stored`` was written or deleted in ``txn``."""
        noted = self.noted
        noted[pk_stored] = txn.id()
        if len(noted) >= self._prune_at:
            self._catch_up(self.space.storage.reader())
            self._prune_at = max(PRUNE_AT, 2 * len(noted))

    def changed_many(self, txn: Any, pks: list[bytes]) -> None:
        """:meth:`changed` of each of ``pks``, in ``txn``."""
        noted = self.noted
        stamp = txn.id()
        for pk in pks:
            noted[pk] = stamp
        if len(noted) >= self._prune_at:
            self._catch_up(self.space.storage.reader())
            self._prune_at = max(PRUNE_AT, 2 * len(noted))

    def emptied(self, txn: Any) -> None:
        """Every tuple was deleted in ``txn`` (a truncation)."""
        self.emptied_at = txn.id()

    def replayed(self, txn: Any, pk_stored: bytes | None) -> None:
        """A record from the leader wrote the primary database (``pk_stored`` None: emptied it)."""
        if pk_stored is None:
            self.emptied(txn)
        else:
            self.changed(txn, pk_stored)

    # -- reads ---------------------------------------------------------------------------------

    def cursor(self, index: Index, reader: Any) -> ListCursor:
        """A cursor over ``index`` as the shared reader ``reader`` shows the space."""
        self._catch_up(reader)
        view = self.views.get(index.iid)
        if view is None:
            view = self._build(index, reader)
        return ListCursor(view.keys, view.pk_by_key)

    def cursor_in(self, index: Index, txn: Any) -> ListCursor:
        """A cursor over ``index`` as any other transaction shows it (a write transaction, a
        reader of its own): built for this scan alone, the shared views untouched."""
        return ListCursor.of(self._entries(txn, [index])[index.iid])

    def _catch_up(self, reader: Any) -> None:
        """Bring the views to ``reader``'s snapshot: every noted tuple is read again from it, and
        the notes it shows are forgotten (a later change of a tuple whose earlier change the
        snapshot shows keeps its note, and is refreshed again at each read until shown)."""
        noted = self.noted
        rid = reader.id()
        if self.views and self.built_at < self.emptied_at <= rid:
            self.views = {}
        if not noted:
            return
        if self.views:
            upto = _fields_read(self.space, [self.space.indexes[iid] for iid in self.views])
            for pk in noted:
                self._refresh(pk, reader, upto)
        shown = [pk for pk, stamp in noted.items() if stamp <= rid]
        for pk in shown:
            del noted[pk]

    def _refresh(self, pk: bytes, reader: Any, upto: int) -> None:
        """Move ``pk``'s entries in every view to what ``reader`` shows (``upto``: the leading
        fields the views' keys need)."""
        space = self.space
        views = self.views
        raw = reader.get(pk, None, space.primary.db)
        if raw is None:
            for view in views.values():
                view.move(pk, None)
            return
        fields = leading_items(raw, upto, unpack)
        pk_encoded = keys.encode(space.primary.key_of(fields))
        for iid, view in views.items():
            full, _unique_form = space.indexes[iid].entry_key(fields, pk_encoded)
            view.move(pk, keys.stored_form(full))

    def _build(self, index: Index, reader: Any) -> SortedView:
        if not self.views:
            self.built_at = reader.id()
        view = self.views[index.iid] = SortedView(self._entries(reader, [index])[index.iid])
        self.builds += 1
        return view

    def _entries(self, txn: Any, indexes: list[Index]) -> dict[int, list[tuple[bytes, bytes]]]:
        """Every tuple's entry in each of ``indexes``, as ``txn`` shows the space."""
        space = self.space
        primary = space.primary
        stored_form = keys.stored_form
        out: dict[int, list[tuple[bytes, bytes]]] = {index.iid: [] for index in indexes}
        pairs = [(index, out[index.iid]) for index in indexes]
        upto = _fields_read(space, indexes)
        with txn.cursor(db=primary.db) as cursor:
            for pk, raw in cursor:
                fields = leading_items(raw, upto, unpack)
                # A stored key that was not cut is the encoded key itself (storage/keys.py).
                pk_encoded = pk if not keys.is_truncated(pk) else keys.encode(primary.key_of(fields))
                for index, found in pairs:
                    full, _unique_form = index.entry_key(fields, pk_encoded)
                    found.append((stored_form(full), pk))
        return out


def _fields_read(space: Space, indexes: list[Index]) -> int:
    """How many leading fields of a tuple give its entries in ``indexes`` and its primary key:
    those after them (a task's data, mostly) are not decoded."""
    return 1 + max(max(index.fieldnos) for index in [space._primary(), *indexes])
