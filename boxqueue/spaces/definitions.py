"""Space and index definitions, and their rows in the system spaces ``_space`` and ``_index``.

The rows are what connectors read (``_vspace``/``_vindex``) and also what is persisted: the
catalogue in LMDB stores each space as its ``_space`` row plus its ``_index`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from boxqueue.errcodes import ER, BoxError
from boxqueue.spaces import fieldtypes

ADMIN_ID = 1


@dataclass(frozen=True)
class FieldDef:
    name: str
    type: str = fieldtypes.ANY
    is_nullable: bool = False

    def to_map(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type}
        if self.is_nullable:
            out["is_nullable"] = True
        return out


@dataclass(frozen=True)
class PartDef:
    field: int
    type: str
    is_nullable: bool = False
    collation: str | None = None

    def to_row(self) -> Any:
        if not self.is_nullable and self.collation is None:
            return [self.field, self.type]
        out: dict[str, Any] = {"field": self.field, "type": self.type}
        if self.is_nullable:
            out["is_nullable"] = True
        if self.collation is not None:
            out["collation"] = self.collation
        return out


@dataclass(frozen=True)
class IndexDef:
    space_id: int
    iid: int
    name: str
    type: str  # "TREE" or "HASH"
    unique: bool
    parts: tuple[PartDef, ...]
    db_name: str = ""  # the LMDB named database holding the index

    def to_row(self) -> list[Any]:
        return [
            self.space_id,
            self.iid,
            self.name,
            self.type.lower(),
            {"unique": self.unique},
            [p.to_row() for p in self.parts],
        ]


@dataclass(frozen=True)
class SpaceDef:
    id: int
    name: str
    engine: str = "memtx"
    owner: int = ADMIN_ID
    field_count: int = 0
    format: tuple[FieldDef, ...] = ()
    flags: dict[str, Any] = field(default_factory=dict)

    def to_row(self) -> list[Any]:
        return [
            self.id,
            self.owner,
            self.name,
            self.engine,
            self.field_count,
            dict(self.flags),
            [f.to_map() for f in self.format],
        ]

    def with_format(self, fmt: tuple[FieldDef, ...]) -> SpaceDef:
        return replace(self, format=fmt)


# -- parsing definitions given by users (config, Lua options) ---------------------------------


def parse_part(raw: Any, position: int, space_format: tuple[FieldDef, ...]) -> PartDef:
    """A key part from ``[field, type]``, ``{field=, type=, is_nullable=}`` or a field name."""
    nullable = False
    collation = None
    if isinstance(raw, list | tuple) and len(raw) >= 1:
        fieldno = raw[0]
        ftype = raw[1] if len(raw) > 1 else None
    elif isinstance(raw, dict):
        fieldno = raw.get("field", raw.get("fieldno"))
        ftype = raw.get("type")
        nullable = bool(raw.get("is_nullable", False))
        collation = raw.get("collation")
    else:
        fieldno, ftype = raw, None
    if isinstance(fieldno, str):
        names = [f.name for f in space_format]
        if fieldno not in names:
            raise BoxError(ER.WRONG_INDEX_PARTS, position + 1, f"field '{fieldno}' was not found by name")
        fieldno = names.index(fieldno)
    if type(fieldno) is not int or fieldno < 0:
        raise BoxError(ER.WRONG_INDEX_PARTS, position + 1, "field id must be a non-negative integer")
    if ftype is None:
        ftype = space_format[fieldno].type if fieldno < len(space_format) else fieldtypes.UNSIGNED
        if fieldno < len(space_format) and space_format[fieldno].is_nullable:
            nullable = True
    canonical = fieldtypes.normalize(ftype)
    if canonical is None:
        raise BoxError(ER.WRONG_INDEX_PARTS, position + 1, f"unknown field type '{ftype}'")
    if not fieldtypes.indexable(canonical):
        raise BoxError(ER.WRONG_INDEX_PARTS, position + 1, f"field type '{canonical}' is not supported")
    return PartDef(fieldno, canonical, nullable, collation)


def check_index(space: SpaceDef, index: IndexDef, others: list[IndexDef]) -> None:
    """Reject index definitions Tarantool rejects (duplicate names, type conflicts, bad HASH)."""
    if index.type not in ("TREE", "HASH"):
        raise BoxError(ER.INDEX_TYPE, index.name, space.name)
    if not index.parts:
        raise BoxError(ER.MODIFY_INDEX, index.name, space.name, "part count must be positive")
    if index.iid == 0 and not index.unique:
        raise BoxError(ER.MODIFY_INDEX, index.name, space.name, "primary key must be unique")
    if index.type == "HASH" and not index.unique:
        raise BoxError(ER.MODIFY_INDEX, index.name, space.name, "HASH index must be unique")
    if index.iid == 0 and any(p.is_nullable for p in index.parts):
        raise BoxError(ER.MODIFY_INDEX, index.name, space.name, "primary key cannot contain nullable parts")
    seen = set()
    for part in index.parts:
        if part.field in seen:
            raise BoxError(ER.MODIFY_INDEX, index.name, space.name, "same key part is indexed twice")
        seen.add(part.field)
    field_types: dict[int, str] = {}
    for other in others:
        for part in other.parts:
            field_types.setdefault(part.field, part.type)
    for part in index.parts:
        if part.field < len(space.format):
            declared = space.format[part.field].type
            if declared != part.type and declared not in (fieldtypes.ANY, fieldtypes.SCALAR) and not _compatible(declared, part.type):
                raise BoxError(ER.FORMAT_MISMATCH_INDEX_PART, part.field + 1, declared, part.type)
        other_type = field_types.get(part.field)
        if other_type is not None and other_type != part.type and not _compatible(other_type, part.type):
            raise BoxError(ER.INDEX_PART_TYPE_MISMATCH, part.field + 1, other_type, part.type)


_NUMERIC_WIDENING = {
    (fieldtypes.UNSIGNED, fieldtypes.INTEGER),
    (fieldtypes.UNSIGNED, fieldtypes.NUMBER),
    (fieldtypes.INTEGER, fieldtypes.NUMBER),
    (fieldtypes.DOUBLE, fieldtypes.NUMBER),
}


def _compatible(a: str, b: str) -> bool:
    """Whether one field may be declared ``a`` in one place and ``b`` in another."""
    return (a, b) in _NUMERIC_WIDENING or (b, a) in _NUMERIC_WIDENING or fieldtypes.SCALAR in (a, b)


def parse_format(raw: Any) -> tuple[FieldDef, ...]:
    """A space format from a list of ``{name=, type=, is_nullable=}`` maps (or ``[name, type]``)."""
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise BoxError(ER.ILLEGAL_PARAMS, "format should be a table")
    out = []
    names = set()
    for i, item in enumerate(raw):
        if isinstance(item, dict):
            name, ftype = item.get("name"), item.get("type", fieldtypes.ANY)
            nullable = bool(item.get("is_nullable", False))
        elif isinstance(item, list | tuple) and item:
            name = item[0]
            ftype = item[1] if len(item) > 1 else fieldtypes.ANY
            nullable = False
        else:
            raise BoxError(ER.ILLEGAL_PARAMS, f"format[{i + 1}]: name (string) is expected")
        if not isinstance(name, str) or not name:
            raise BoxError(ER.ILLEGAL_PARAMS, f"format[{i + 1}]: name (string) is expected")
        canonical = fieldtypes.normalize(ftype)
        if canonical is None:
            raise BoxError(ER.ILLEGAL_PARAMS, f"format[{i + 1}]: unknown field type '{ftype}'")
        if name in names:
            raise BoxError(ER.ILLEGAL_PARAMS, f"format[{i + 1}]: duplicate field name '{name}'")
        names.add(name)
        out.append(FieldDef(name, canonical, nullable))
    return tuple(out)


def space_from_row(row: list[Any]) -> SpaceDef:
    fmt = tuple(
        FieldDef(m["name"], m.get("type", fieldtypes.ANY), bool(m.get("is_nullable", False)))
        for m in (row[6] if len(row) > 6 else [])
    )
    return SpaceDef(
        id=row[0],
        owner=row[1],
        name=row[2],
        engine=row[3],
        field_count=row[4],
        flags=dict(row[5]) if isinstance(row[5], dict) else {},
        format=fmt,
    )


def index_from_row(row: list[Any], db_name: str) -> IndexDef:
    parts = []
    for p in row[5]:
        if isinstance(p, dict):
            parts.append(PartDef(p["field"], p["type"], bool(p.get("is_nullable", False)), p.get("collation")))
        else:
            parts.append(PartDef(p[0], p[1]))
    return IndexDef(
        space_id=row[0],
        iid=row[1],
        name=row[2],
        type=row[3].upper(),
        unique=bool(row[4].get("unique", True)),
        parts=tuple(parts),
        db_name=db_name,
    )
