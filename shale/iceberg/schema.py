"""The columns of a topic's Iceberg table, and Arrow batches of the view turned into them.

One row per live key of the compacted view (:mod:`shale.reader.latest`: the latest record
of every key through the horizon, tombstones and expired keys absent):

======================  ===============================  =====================================
column                  Iceberg type                     from
======================  ===============================  =====================================
``key``                 binary, or string                the record's key (required)
``value``               binary, or string                its value (text or JSON: a string)
``properties``          map<string, string>              its properties
``publish_time``        timestamptz (microseconds, UTC)  its entry's publish time (required)
``event_time``          timestamptz                      its event time (null without one)
``ledger``, ``entry``,  long (each)                      its message id ``LEDGER:ENTRY:BATCH``
``batch``                                                (required; never changes, compaction
                                                         included)
======================  ===============================  =====================================

The value format (:data:`VALUE_FORMATS`) is chosen once, when the table is made: ``binary``
keeps keys and values as bytes, ``text`` and ``json`` as strings (each refused, naming the
record, where one is not valid UTF-8); ``json`` also marks the value column as JSON text,
for engines to parse (``json_extract`` and the like).  The field ids are fixed, so every
data file Shale writes carries the same ids and a table made by another version reads the
same.  ``key`` is the table's identifier field: the one column a row is known by.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from shale.ledger.errors import InvalidInputError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.schema import Schema

__all__ = ["ID_COLUMNS", "VALUE_FORMATS", "arrow_schema", "check_schema", "rows_of", "table_schema"]

#: How a table keeps keys and values.
VALUE_FORMATS: Final = ("binary", "text", "json")
#: The columns of the message id.
ID_COLUMNS: Final = ("ledger", "entry", "batch")
#: The most a long holds: ids above it cannot be stored (ledger ids lie below 2**62).
_MAX_LONG: Final = (1 << 63) - 1


def table_schema(value_format: str) -> Schema:
    """The Iceberg schema of a topic's table whose keys and values are ``value_format``."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BinaryType,
        LongType,
        MapType,
        NestedField,
        StringType,
        TimestamptzType,
    )

    if value_format not in VALUE_FORMATS:
        raise InvalidInputError(f"unknown Iceberg value format {value_format!r}; one of {', '.join(VALUE_FORMATS)}")
    data = BinaryType() if value_format == "binary" else StringType()
    value_doc = "the value, JSON text" if value_format == "json" else "the value"
    return Schema(
        NestedField(1, "key", data, required=True, doc="the record's key"),
        NestedField(2, "value", data, required=False, doc=value_doc),
        NestedField(3, "properties", MapType(9, StringType(), 10, StringType(), value_required=False), required=False),
        NestedField(4, "publish_time", TimestamptzType(), required=True, doc="when its entry was published"),
        NestedField(5, "event_time", TimestamptzType(), required=False, doc="its event time, if it has one"),
        NestedField(6, "ledger", LongType(), required=True, doc="message id: the ledger"),
        NestedField(7, "entry", LongType(), required=True, doc="message id: the entry"),
        NestedField(8, "batch", LongType(), required=True, doc="message id: the index in the entry"),
        identifier_field_ids=[1],
    )


def _shape(schema: Schema) -> list[tuple[str, str, bool]]:
    return [(f.name, str(f.field_type), f.required) for f in schema.fields]


def check_schema(found: Schema, value_format: str | None, where: str) -> bool:
    """Whether an existing table whose schema is Shale's keeps strings (``where`` names it
    in the error); a table of any other shape is refused, never written into, and so is
    a ``value_format`` it does not keep."""
    for fmt in ("binary", "text"):
        expected = table_schema(fmt)
        if _shape(found) == _shape(expected) and [f.field_id for f in found.fields] == \
                [f.field_id for f in expected.fields]:
            if value_format is not None and (fmt == "binary") != (value_format == "binary"):
                raise InvalidInputError(
                    f"{where} keeps keys and values as {'bytes' if fmt == 'binary' else 'strings'}, not as "
                    f"{value_format}: leave the value format out, or give another table")
            return fmt != "binary"
    names = ", ".join(f.name for f in found.fields)
    raise InvalidInputError(f"{where} is not a Shale table (its columns: {names}; a topic's table has key, value, "
                            "properties, publish_time, event_time, ledger, entry, batch): give another table")


def arrow_schema(value_format: str) -> pa.Schema:
    """The Arrow schema of the table's data files (with their Iceberg field ids)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(table_schema(value_format))


def rows_of(batch: pa.RecordBatch, target: pa.Schema) -> pa.Table:
    """A batch of the view (:func:`shale.reader.arrow.schema`'s columns) as the table's rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns: list[Any] = []
    for field in target:
        name = field.name
        if name in ID_COLUMNS:
            col = batch.column(name)
            if len(col) and pc.max(col).as_py() > _MAX_LONG:
                raise InvalidInputError(f"a message id's {name} above 2^63 cannot be stored in an Iceberg long")
            columns.append(col.cast(pa.int64()))
        elif name in ("publish_time", "event_time"):
            columns.append(batch.column(name).cast(pa.timestamp("us", tz="UTC")))
        else:
            columns.append(batch.column(name).cast(field.type))
    return pa.Table.from_arrays(columns, schema=target)
