"""Tarantool field types and Spark column types: the schema a space reads as, and value conversion.

| space field type | Spark column | note |
|---|---|---|
| unsigned, integer | long | an unsigned value above 2^63-1 fails the read with the field named |
| number, double | double | `number` values that are integers or decimals are read as doubles |
| string | string | |
| boolean | boolean | |
| varbinary | binary | |
| uuid | string | the canonical 36-character text; written back from that text |
| decimal | decimal(38,18) | a value with more digits fails the read with the field named |
| datetime | timestamp | UTC instant, microseconds (nanoseconds and the time zone name are dropped) |
| any, scalar, array, map, interval, others | string | strings as they are, anything else as JSON text |

Fields beyond the format (a queue task's data, for instance) are read as one more string column,
``_tail``, holding a JSON array (null when a tuple has none) and appended again on write.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)
from tarantool import Datetime

from boxqueue.pipeline.connect import SpaceInfo
from boxqueue.pipeline.errors import BoxqueueSourceError

TAIL_COLUMN = "_tail"
DECIMAL_TYPE = DecimalType(38, 18)

_NATIVE: dict[str, DataType] = {
    "unsigned": LongType(),
    "integer": LongType(),
    "number": DoubleType(),
    "double": DoubleType(),
    "string": StringType(),
    "boolean": BooleanType(),
    "varbinary": BinaryType(),
    "uuid": StringType(),
    "decimal": DECIMAL_TYPE,
    "datetime": TimestampType(),
}
SUPPORTED_TYPES = tuple(_NATIVE)
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
_TIMESTAMPS = (TimestampType, TimestampNTZType, DateType)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def spark_type(field_type: str) -> DataType:
    """The Spark column type a space field of ``field_type`` reads as."""
    return _NATIVE.get(field_type, StringType())


def read_schema(space: SpaceInfo) -> StructType:
    """The DataFrame schema of a space: one column per format field, then ``_tail``."""
    if not space.fields:
        raise BoxqueueSourceError(
            f"space '{space.name}' has no format: give the columns with .schema(...) "
            "(they are then taken by position)"
        )
    columns = [StructField(f.name, spark_type(f.type), True) for f in space.fields]
    if any(f.name == TAIL_COLUMN for f in space.fields):
        raise BoxqueueSourceError(f"space '{space.name}' has a field named {TAIL_COLUMN}, which the source reserves")
    columns.append(StructField(TAIL_COLUMN, StringType(), True))
    return StructType(columns)


def _json_default(value: Any) -> Any:
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    if isinstance(value, Datetime):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    return str(value)


# One encoder for every value: json.dumps with these options makes an encoder a call, which was
# half of what reading a streamed task cost an executor (about 3 us of 3.3).
_TO_JSON = json.JSONEncoder(default=_json_default, ensure_ascii=False, separators=(",", ":")).encode


def to_text(value: Any) -> str:
    """Strings as they are; other values as JSON (uuid, decimal, datetime as their text)."""
    if isinstance(value, str):
        return value
    if isinstance(value, uuid.UUID):
        return str(value)
    return _TO_JSON(value)


def _datetime_micros(value: Any) -> Any:
    if isinstance(value, Datetime):
        return value.value // 1000
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return (value - _EPOCH) // dt.timedelta(microseconds=1)
    return value  # integers are taken as microseconds since the epoch


def _float(value: Any) -> Any:
    return value if isinstance(value, float) else float(value)


def _decimal(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return value
    if isinstance(value, float):
        return decimal.Decimal(repr(value))
    return decimal.Decimal(value)


def _bytes(value: Any) -> Any:
    return value.encode() if isinstance(value, str) else bytes(value)


def read_converter(column: DataType) -> Callable[[Any], Any] | None:
    """How a stored (non-null) value becomes an Arrow-ready value of ``column``; None: as it is."""
    if isinstance(column, (_INTEGRAL, BooleanType)):
        return None
    if isinstance(column, (DoubleType, FloatType)):
        return _float
    if isinstance(column, StringType):
        return to_text
    if isinstance(column, BinaryType):
        return _bytes
    if isinstance(column, DecimalType):
        return _decimal
    if isinstance(column, (TimestampType, TimestampNTZType)):
        return _datetime_micros
    if isinstance(column, (ArrayType, MapType, StructType, NullType)):
        return None
    raise BoxqueueSourceError(f"the source cannot produce Spark columns of type {column.simpleString()}")


# -- writing -----------------------------------------------------------------------------------

_ANYTHING = ("any", "scalar")


def _category(column: DataType) -> str:
    if isinstance(column, _INTEGRAL):
        return "integral"
    if isinstance(column, (FloatType, DoubleType)):
        return "float"
    if isinstance(column, DecimalType):
        return "decimal"
    if isinstance(column, StringType):
        return "string"
    if isinstance(column, BooleanType):
        return "boolean"
    if isinstance(column, BinaryType):
        return "binary"
    if isinstance(column, _TIMESTAMPS):
        return "timestamp"
    if isinstance(column, ArrayType):
        return "array"
    if isinstance(column, (MapType, StructType)):
        return "map"
    if isinstance(column, NullType):
        return "null"
    return "other"


_FITS: dict[str, tuple[str, ...]] = {
    "integral": ("unsigned", "integer", "number", "double", "decimal", *_ANYTHING),
    "float": ("number", "double", *_ANYTHING),
    "decimal": ("decimal", "number", "double", *_ANYTHING),
    "string": ("string", "uuid", "array", "map", *_ANYTHING),
    "boolean": ("boolean", *_ANYTHING),
    "binary": ("varbinary", *_ANYTHING),
    "timestamp": ("datetime", *_ANYTHING),
    "array": ("array", "any"),
    "map": ("map", "any"),
}


_KNOWN = frozenset(_NATIVE) | {"any", "scalar", "array", "map"}


def check_fits(column: StructField, field_type: str, where: str) -> None:
    """Refuse, before any row is sent, a column whose values the field's type cannot take."""
    category = _category(column.dataType)
    if category == "null":
        return
    if field_type not in _KNOWN:
        return  # a field type this source does not know: let the server judge each value
    if field_type not in _FITS.get(category, ()):
        raise BoxqueueSourceError(
            f"column '{column.name}' ({column.dataType.simpleString()}) cannot be written to "
            f"{where} of type {field_type}"
        )


def _to_datetime_from_micros(micros: int) -> Datetime:
    seconds, rest = divmod(micros, 1_000_000)
    return Datetime(timestamp=seconds, nsec=rest * 1000)


def _to_uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise BoxqueueSourceError(f"{value!r} is not a uuid") from None


def _from_json(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as exc:
        raise BoxqueueSourceError(f"{value!r} is not JSON text: {exc}") from None


def _map(value: Any) -> Any:
    return dict(value) if isinstance(value, list) else value


def column_values(array: pa.Array | pa.ChunkedArray, column: DataType, field_type: str) -> list[Any]:
    """One Arrow column of a batch as the Python values to store in a field of ``field_type``."""
    if isinstance(column, (TimestampType, TimestampNTZType)):
        micros = array.cast(pa.int64()).to_pylist()
        if field_type == "datetime" or field_type in _ANYTHING:
            return [None if m is None else _to_datetime_from_micros(m) for m in micros]
        return micros
    values = array.to_pylist()
    convert: Callable[[Any], Any] | None = None
    if isinstance(column, DateType):
        def convert(d: dt.date) -> Datetime:
            return Datetime(year=d.year, month=d.month, day=d.day)
    elif isinstance(column, StringType) and field_type == "uuid":
        convert = _to_uuid
    elif isinstance(column, StringType) and field_type in ("array", "map"):
        convert = _from_json
    elif field_type == "double" and not isinstance(column, (FloatType, DoubleType)):
        convert = float
    elif isinstance(column, MapType):
        convert = _map
    if convert is None:
        return values
    return [None if v is None else convert(v) for v in values]
