"""Value types of keyed state (pure-Python reference): names, stored bytes, per-record Python
values and Arrow arrays of the batch API. :mod:`statecore.serializers` re-exports
:class:`ValueSerializer`, :func:`value_serializer` and :func:`normalize_value_type`.

========================  ===================================  ==================================
value type (canonical)    per-record value                     batch (Arrow type)
========================  ===================================  ==================================
``int32``                 int                                  int32
``int64``                 int                                  int64
``uint64``                int in [0, 2**64)                    uint64
``float64``               float (int accepted)                 float64
``bool``                  bool                                 bool
``timestamp[u]``          int (see below)                      timestamp(u), any time zone
``string``                str                                  string, large_string
``binary``                bytes (bytes-like accepted)          binary, large_binary
``fixed_size_binary[N]``  bytes of N bytes                     fixed_size_binary(N)
``pickle``                any object                           (no batch API)
========================  ===================================  ==================================

Stored bytes (``ser(value)``, and list and map state built from them): docs/formats.md "Values".

Names: as :mod:`statecore.key_types` writes them (aliases ``long``, ``double``, ``str``, ...;
``large_string``/``large_binary`` are ``string``/``binary``) or a pyarrow DataType
(``pa.uint64()``, ``pa.timestamp("ms")``, ``pa.binary(16)``). ``timestamp`` alone is
``timestamp[us]`` (Spark's unit); a time zone in the name or DataType is dropped: the unit is the
type, so it is what descriptors, state metas and checkpoints record (``"timestamp[ms]"``), and a
restore under another unit is a StateMigrationError. ``fixed_size_binary[N]`` needs N >= 1 (a
list of zero-width elements would have no length).

Timestamps, per record: the value is the int64 count of units since 1970-01-01 UTC, as for
timestamp keys. ``update``/``add`` also accept a ``datetime.datetime`` (naive = UTC; a
``pandas.Timestamp`` with its nanoseconds) and a ``numpy.datetime64`` of any fixed unit; either
must be a whole number of units (else InvalidInputError, no rounding); NaT is rejected -- the
rule timestamp keys follow too (:func:`statecore.key_types.timestamp_count`). Reads
return the int: a Python datetime cannot hold most of the int64 range (years past 9999, before
1), nor nanoseconds, and pyarrow's ``as_py`` fails there. Batch reads return
``pa.timestamp(u)`` arrays (no time zone); their ``cast(pa.int64())`` gives the per-record
ints. Batch writes accept timestamp arrays of the state's unit in any time zone (the stored
count is UTC-based either way) and reject another unit.

Strings: a ``str`` subclass (``numpy.str_``) is stored as the plain ``str`` it equals, so
reads return ``str`` in every backend (a pickle value keeps its type: pickle stores the object).

Fixed-width types (int32, int64, uint64, float64, bool, timestamp, fixed_size_binary; their
``fixed_width`` is not None) store no length. Nulls never reach the stored form (a null is an
absent value or a no-op row).
"""

from __future__ import annotations

import datetime
import functools
import pickle
import re
import struct
from typing import Any

import numpy as np
import pyarrow as pa

from statecore.errors import InvalidInputError
from statecore.key_types import timestamp_count

__all__ = ["VALUE_TYPES", "ValueSerializer", "normalize_value_type", "value_serializer"]

PICKLE_PROTOCOL = 5
#: Value type kinds; ``timestamp`` and ``fixed_size_binary`` take a parameter
#: (``timestamp[ms]``, ``fixed_size_binary[16]``).
VALUE_TYPES = ("int32", "int64", "uint64", "float64", "bool", "timestamp", "string", "binary",
               "fixed_size_binary", "pickle")

_RANGES = {"int32": (-(1 << 31), (1 << 31) - 1), "int64": (-(1 << 63), (1 << 63) - 1),
           "uint64": (0, (1 << 64) - 1), "timestamp": (-(1 << 63), (1 << 63) - 1)}
_STRUCT = {"int32": "<i", "int64": "<q", "uint64": "<Q", "timestamp": "<q", "float64": "<d"}
_WIDTHS = {"int32": 4, "int64": 8, "uint64": 8, "float64": 8, "bool": 1, "timestamp": 8}
_ARROW = {"int32": pa.int32(), "int64": pa.int64(), "uint64": pa.uint64(),
          "float64": pa.float64(), "bool": pa.bool_(), "string": pa.string(),
          "binary": pa.binary()}

_ALIASES = {
    "int32": "int32", "int": "int32", "integer": "int32",
    "int64": "int64", "long": "int64", "bigint": "int64",
    "uint64": "uint64",
    "float64": "float64", "double": "float64", "float": "float64",
    "bool": "bool", "boolean": "bool",
    "timestamp": "timestamp[us]",
    "string": "string", "str": "string", "utf8": "string", "large_string": "string",
    "binary": "binary", "bytes": "binary", "large_binary": "binary",
    "pickle": "pickle", "object": "pickle",
}
_TS_RE = re.compile(r"^timestamp\[(s|ms|us|ns)(,\s*tz=[^\]]*)?\]$")
_FSB_RE = re.compile(r"^fixed_size_binary\[(\d+)\]$")



def _unsupported(type_) -> InvalidInputError:
    return InvalidInputError(
        f"unsupported value type {type_!r}; expected one of int32, int64, uint64, float64, bool, "
        "timestamp[s|ms|us|ns], string, binary, fixed_size_binary[N], pickle (or the matching "
        "pyarrow DataType)")


@functools.lru_cache(maxsize=256)
def _canonical(type_) -> str:
    if isinstance(type_, pa.DataType):
        if pa.types.is_timestamp(type_):
            return f"timestamp[{type_.unit}]"
        if pa.types.is_fixed_size_binary(type_):
            text = f"fixed_size_binary[{type_.byte_width}]"
        else:
            text = str(type_)
    elif isinstance(type_, str):
        text = type_.strip().lower()
    else:
        raise _unsupported(type_)
    name = _ALIASES.get(text)
    if name is not None:
        return name
    m = _TS_RE.match(text)
    if m:
        return f"timestamp[{m.group(1)}]"
    m = _FSB_RE.match(text)
    if m:
        w = int(m.group(1))
        if not 1 <= w <= (1 << 31) - 1:
            raise InvalidInputError(f"fixed_size_binary value width must be in [1, 2**31), got {w}")
        return f"fixed_size_binary[{w}]"
    raise _unsupported(type_)


def normalize_value_type(type_) -> str:
    """Canonical value type name (module docstring) of a name/alias or pyarrow DataType, e.g.
    ``pa.timestamp("ms", tz="UTC")`` -> ``"timestamp[ms]"``. InvalidInputError otherwise."""
    try:
        return _canonical(type_)
    except TypeError:  # unhashable
        raise _unsupported(type_) from None


class ValueSerializer:
    """Serializer of one value type (module docstring). Build it with :func:`value_serializer`.

    Attributes: ``name`` (canonical), ``kind`` (one of :data:`VALUE_TYPES`), ``unit``
    (timestamp: s, ms, us or ns), ``width`` (fixed_size_binary: N), ``fixed_width`` (stored
    bytes, None when variable), ``arrow_type`` (pa.DataType of batch outputs, None for pickle).
    """

    def __init__(self, name: str):
        self.name = name
        self.kind = name.split("[", 1)[0]
        self.unit = name[len("timestamp["):-1] if self.kind == "timestamp" else None
        self.width = int(name[len("fixed_size_binary["):-1]) \
            if self.kind == "fixed_size_binary" else None
        self.fixed_width = _WIDTHS.get(self.kind, self.width)
        if self.kind == "timestamp":
            self.arrow_type = pa.timestamp(self.unit)
        elif self.kind == "fixed_size_binary":
            self.arrow_type = pa.binary(self.width)
        else:
            self.arrow_type = _ARROW.get(self.kind)

    def __repr__(self):
        return f"ValueSerializer({self.name!r})"

    # ---------------------------------------------------------------- Arrow
    def accepts(self, t: pa.DataType) -> bool:
        """Whether batch values of Arrow type ``t`` are values of this type (module docstring)."""
        k = self.kind
        if k == "timestamp":
            return pa.types.is_timestamp(t) and t.unit == self.unit
        if k == "string":
            return t in (pa.string(), pa.large_string())
        if k == "binary":
            return t in (pa.binary(), pa.large_binary())
        return self.arrow_type is not None and t == self.arrow_type

    def describe_arrow(self) -> str:
        """The accepted Arrow types in words, for error messages."""
        if self.kind == "timestamp":
            return f"timestamp[{self.unit}] (any time zone)"
        if self.kind in ("string", "binary"):
            return f"{self.kind} or large_{self.kind}"
        return str(self.arrow_type)

    def to_pylist(self, arr) -> list:
        """Per-record values (None for nulls) of an array this type :meth:`accepts`, or of a
        list/large_list array of it (a list per row): timestamps as ints, not datetimes."""
        if self.kind == "timestamp":
            t = arr.type
            if pa.types.is_list(t):
                arr = arr.cast(pa.list_(pa.int64()))
            elif pa.types.is_large_list(t):
                arr = arr.cast(pa.large_list(pa.int64()))
            else:
                arr = arr.cast(pa.int64())
        return arr.to_pylist()

    # ---------------------------------------------------------------- per-record values
    def check(self, v: Any) -> Any:
        """Validate ``v`` and return its canonical Python form (module docstring table): int
        for int32/int64/uint64/timestamp, float, bool, str, bytes; pickle values (None
        included) are returned as is. InvalidInputError for None (other types), a wrong
        Python type, a number out of range, a str that is not valid Unicode, a datetime not
        exact in the timestamp's unit, NaT, or a fixed_size_binary of another length."""
        k = self.kind
        if v is None and k != "pickle":
            raise InvalidInputError(f"None is not a valid {self.name} value")
        if k == "timestamp" and isinstance(v, (datetime.datetime, np.datetime64)):
            return timestamp_count(v, self.unit, self.name)
        if k in _RANGES:
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise self._mismatch(v)
            x = int(v)
            lo, hi = _RANGES[k]
            if not lo <= x <= hi:
                raise InvalidInputError(f"value {x} overflows {self.name}")
            return x
        if k == "float64":
            if (isinstance(v, (bool, np.bool_))
                    or not isinstance(v, (int, float, np.integer, np.floating))):
                raise self._mismatch(v)
            try:
                return float(v)
            except OverflowError:
                raise InvalidInputError(f"value {v!r} does not fit in float64") from None
        if k == "bool":
            if not isinstance(v, (bool, np.bool_)):
                raise self._mismatch(v)
            return bool(v)
        if k == "string":
            if not isinstance(v, str):
                raise self._mismatch(v)
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise InvalidInputError(f"string value is not valid Unicode: {e}") from None
            return v if type(v) is str else str.__str__(v)  # numpy.str_ and other subclasses
        if k in ("binary", "fixed_size_binary"):
            if not isinstance(v, (bytes, bytearray, memoryview)):
                raise self._mismatch(v)
            b = bytes(v)
            if k == "fixed_size_binary" and len(b) != self.width:
                raise InvalidInputError(f"a {self.name} value must be {self.width} bytes, "
                                        f"got {len(b)}")
            return b
        return v

    def _mismatch(self, v) -> InvalidInputError:
        return InvalidInputError(
            f"value {v!r} of type {type(v).__name__} is not a {self.name} value")

    def serialize(self, v: Any) -> bytes:
        """Stored bytes of ``v`` (docs/formats.md "Values"; validated with :meth:`check`, whose
        InvalidInputError it raises, and for pickle one for an object that cannot be
        pickled)."""
        v = self.check(v)
        k = self.kind
        fmt = _STRUCT.get(k)
        if fmt is not None:
            return struct.pack(fmt, v)
        if k == "bool":
            return b"\x01" if v else b"\x00"
        if k == "string":
            return v.encode("utf-8")
        if k in ("binary", "fixed_size_binary"):
            return v
        try:
            return pickle.dumps(v, protocol=PICKLE_PROTOCOL)
        except Exception as e:  # pickling errors have many types
            raise InvalidInputError(
                f"value of type {type(v).__name__} cannot be pickled: {e}") from e

    def deserialize(self, b) -> Any:
        """Inverse of :meth:`serialize`. InvalidInputError on a wrong length for a fixed-width
        type, malformed UTF-8 or a malformed pickle."""
        b = bytes(b)
        k = self.kind
        if self.fixed_width is not None and len(b) != self.fixed_width:
            raise InvalidInputError(
                f"{self.name} value must be {self.fixed_width} bytes, got {len(b)}")
        fmt = _STRUCT.get(k)
        if fmt is not None:
            return struct.unpack(fmt, b)[0]
        if k == "bool":
            return b != b"\x00"
        if k == "string":
            try:
                return b.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InvalidInputError(f"malformed UTF-8 string value: {e}") from None
        if k in ("binary", "fixed_size_binary"):
            return b
        try:
            return pickle.loads(b)
        except Exception as e:
            raise InvalidInputError(f"malformed pickled value: {e}") from e


_SERS: dict = {}


def value_serializer(type_) -> ValueSerializer:
    """The (shared, stateless) value serializer of a value type name or pyarrow DataType
    (InvalidInputError for anything else)."""
    if isinstance(type_, ValueSerializer):
        return type_
    name = normalize_value_type(type_)
    ser = _SERS.get(name)
    if ser is None:
        ser = _SERS[name] = ValueSerializer(name)
    return ser
