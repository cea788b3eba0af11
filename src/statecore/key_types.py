"""Key types of a keyed backend (pure-Python reference): names, per-record values, Arrow arrays,
the key serializer inside encoded keys, and the per-column inputs of both key-group assigners.

==========================  =========================================  ==========================
key type (canonical name)   per-record value (``set_current_key``)      batch keys (Arrow type)
==========================  =========================================  ==========================
``int32``                   int in int32 range                         int32
``int64``                   int in int64 range                         int64
``uint64``                  int in ``[0, 2**64)``                      uint64
``float64``                 float (int accepted); -0.0 becomes 0.0,    float64
                            every NaN one canonical NaN
``bool``                    bool                                       bool (bit-packed)
``timestamp[u]``            int: units ``u`` (s, ms, us, ns) since     timestamp of unit ``u``,
                            1970-01-01 UTC (datetime accepted: naive   any time zone
                            = UTC; numpy.datetime64 of a fixed
                            unit too; must be exact in the unit)
``string``                  str (a subclass, e.g. numpy.str_, becomes  string, large_string
                            a plain str)
``binary``                  bytes-like                                 binary, large_binary
``fixed_size_binary[N]``    bytes-like of exactly N bytes (N >= 1)     fixed_size_binary(N)
``struct<t1,...,tn>``       tuple (or list) of n field values          struct of n fields of those
                            (a multi-column key; fields are any of     types (any names), or a
                            the scalar types above)                    list/tuple of n arrays
==========================  =========================================  ==========================

``timestamp`` alone means ``timestamp[us]`` (Spark's TimestampType and TimestampNTZType hold
microseconds). The key of a timestamp key type is the int64 count of its unit: the same instant
in another unit is another key type (restoring across them is a StateMigrationError). Keys never
hold nulls: a null key, or a null field of a multi-column key, is an InvalidInputError.

Byte formats: docs/formats.md "Encoded key" (the key serializer ``ser``, after Flink's
``IntSerializer``, ``LongSerializer``, ``DoubleSerializer``, ``BooleanSerializer``,
``StringSerializer`` and ``TupleSerializer``) and "Key groups" (the per-column inputs of the Spark
assigner, after Spark SQL's ``XxHash64Function``, and the Java ``hashCode()`` of the Flink one).
"""

from __future__ import annotations

import datetime
import functools
import re
import struct as _struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from statecore.errors import InvalidInputError
from statecore.varint import read_varlen, write_varlen

__all__ = ["SCALAR_KINDS", "KeyType", "key_type", "canonical_float", "timestamp_count", "NAN"]

SCALAR_KINDS = ("int32", "int64", "uint64", "float64", "bool", "timestamp", "string", "binary",
                "fixed_size_binary")
TIME_UNITS = ("s", "ms", "us", "ns")

#: The one NaN object canonical float64 keys use: dicts of the reference backend find a NaN key
#: again only through object identity (NaN != NaN).
NAN = float("nan")
_CANONICAL_NAN_BITS = 0x7FF8000000000000
_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
_RANGES = {"int32": (-(1 << 31), (1 << 31) - 1), "int64": (-(1 << 63), (1 << 63) - 1),
           "uint64": (0, _M64), "timestamp": (-(1 << 63), (1 << 63) - 1)}
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
# Exact unit conversions of datetimes, in attoseconds (numpy's finest unit) per unit.
_AS_PER = {"as": 1, "fs": 10**3, "ps": 10**6, "ns": 10**9, "us": 10**12, "ms": 10**15,
           "s": 10**18, "m": 60 * 10**18, "h": 3600 * 10**18, "D": 86400 * 10**18,
           "W": 7 * 86400 * 10**18}


def timestamp_count(v, unit: str, what: str) -> int:
    """The int64 count of ``unit`` (s, ms, us, ns) since 1970-01-01 UTC of a
    ``datetime.datetime`` (naive = UTC; a ``pandas.Timestamp`` with its nanoseconds) or a
    ``numpy.datetime64`` of any fixed unit, exactly -- the one rule of timestamp keys and
    timestamp values. InvalidInputError naming ``what`` (e.g. ``"key type timestamp[ms]"``) for
    NaT, a datetime64 of a calendar unit (months, years), a time that is not a whole number of
    ``unit`` (no rounding) or a count outside int64."""
    if v != v:  # NaT (pandas' and numpy's) is unequal to itself
        raise InvalidInputError(f"NaT is not a valid {what} value")
    if isinstance(v, np.datetime64):
        u, count = np.datetime_data(v.dtype)
        if u not in _AS_PER:
            raise InvalidInputError(f"numpy.datetime64 in unit {u!r} is not a fixed number of "
                                    f"{unit} ({what})")
        atto = int(v.astype(np.int64)) * count * _AS_PER[u]
    else:
        if v.tzinfo is None:
            v = v.replace(tzinfo=datetime.timezone.utc)  # Arrow's reading of a naive time
        d = v - _EPOCH
        us = (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds
        atto = (us * 1000 + int(getattr(v, "nanosecond", 0))) * _AS_PER["ns"]
    per = _AS_PER[unit]
    if atto % per:
        raise InvalidInputError(f"{v!r} is not a whole number of {unit} ({what})")
    x = atto // per
    lo, hi = _RANGES["timestamp"]
    if not lo <= x <= hi:
        raise InvalidInputError(f"{v!r} is out of range for {what}")
    return x

_SCALAR_ALIASES = {
    "int32": "int32", "int": "int32", "integer": "int32",
    "int64": "int64", "long": "int64", "bigint": "int64",
    "uint64": "uint64",
    "float64": "float64", "double": "float64", "float": "float64",
    "bool": "bool", "boolean": "bool",
    "timestamp": "timestamp[us]",
    "string": "string", "str": "string", "utf8": "string", "large_string": "string",
    "large_utf8": "string",
    "binary": "binary", "bytes": "binary", "large_binary": "binary",
}


def _signed(v: int, bits: int) -> int:
    return v - (1 << bits) if v >= (1 << (bits - 1)) else v


def canonical_float(v: float) -> float:
    """The canonical float64 key of ``v``: 0.0 for -0.0, :data:`NAN` for every NaN."""
    if v != v:
        return NAN
    return 0.0 if v == 0.0 else v


def _double_bits(v: float) -> int:
    """Java ``Double.doubleToLongBits`` of a canonical float (unsigned 64-bit)."""
    if v != v:
        return _CANONICAL_NAN_BITS
    return _struct.unpack("<Q", _struct.pack("<d", v))[0]


def _java_bytes_hash(b: bytes) -> int:
    h = 1
    for x in b:
        h = (31 * h + (x - 256 if x >= 128 else x)) & _M32
    return _signed(h, 32)


def _java_long_hash(u: int) -> int:
    u &= _M64
    return _signed((u ^ (u >> 32)) & _M32, 32)


@dataclass(frozen=True, eq=False)
class KeyType:
    """One key type (see the module docstring). Build it with :func:`key_type`.

    Attributes: ``name`` (canonical, what snapshots and checkpoints record), ``kind`` (one of
    :data:`SCALAR_KINDS` or ``"struct"``), ``unit`` (timestamp), ``width`` (fixed_size_binary),
    ``fields`` (struct: the field KeyTypes), ``fixed_width`` (bytes of ``ser``, None when
    variable-length).
    """

    name: str
    kind: str
    unit: str | None = None
    width: int | None = None
    fields: tuple = ()

    def __repr__(self):
        return f"KeyType({self.name!r})"

    @property
    def fixed_width(self):
        """Bytes of every ``ser(key)`` of this type (docs/formats.md "Encoded key"), None when
        variable-length (string, binary, a struct with such a field)."""
        k = self.kind
        if k == "struct":
            ws = [f.fixed_width for f in self.fields]
            return None if None in ws else sum(ws)
        return {"int32": 4, "int64": 8, "uint64": 8, "float64": 8, "bool": 1, "timestamp": 8,
                "fixed_size_binary": self.width}.get(k)

    @property
    def is_struct(self) -> bool:
        """True for a multi-column key type (``struct<...>``)."""
        return self.kind == "struct"

    # ---------------------------------------------------------------- Arrow types
    @property
    def arrow_type(self) -> pa.DataType:
        """The Arrow type of this key type's arrays in outputs (fields named f0, f1, ...)."""
        k = self.kind
        if k == "struct":
            return pa.struct([(f"f{i}", f.arrow_type) for i, f in enumerate(self.fields)])
        if k == "timestamp":
            return pa.timestamp(self.unit)
        if k == "fixed_size_binary":
            return pa.binary(self.width)
        return {"int32": pa.int32(), "int64": pa.int64(), "uint64": pa.uint64(),
                "float64": pa.float64(), "bool": pa.bool_(), "string": pa.string(),
                "binary": pa.binary()}[k]

    def accepts(self, t: pa.DataType) -> bool:
        """Whether batch keys of Arrow type ``t`` are keys of this type (module docstring)."""
        k = self.kind
        if k == "struct":
            return (pa.types.is_struct(t) and t.num_fields == len(self.fields)
                    and all(f.accepts(t.field(i).type) for i, f in enumerate(self.fields)))
        if k == "timestamp":
            return pa.types.is_timestamp(t) and t.unit == self.unit
        if k == "string":
            return t in (pa.string(), pa.large_string())
        if k == "binary":
            return t in (pa.binary(), pa.large_binary())
        return t == self.arrow_type

    def describe_arrow(self) -> str:
        """The accepted Arrow types in words, for error messages."""
        k = self.kind
        if k == "struct":
            return "a struct of " + ", ".join(f.describe_arrow() for f in self.fields) + \
                " (or a list of those arrays)"
        if k == "timestamp":
            return f"timestamp[{self.unit}] (any time zone)"
        if k in ("string", "binary"):
            return f"{k} or large_{k}"
        return str(self.arrow_type)

    def to_pylist(self, arr: pa.Array) -> list:
        """Canonical per-record values of a validated array of this type (no nulls)."""
        k = self.kind
        if k == "struct":
            cols = [f.to_pylist(arr.field(i)) for i, f in enumerate(self.fields)]
            return list(zip(*cols)) if cols else []
        if k == "timestamp":
            return arr.cast(pa.int64()).to_pylist()
        if k == "float64":
            return [canonical_float(x) for x in arr.to_pylist()]
        return arr.to_pylist()

    # ---------------------------------------------------------------- per-record values
    def check(self, v):
        """Validate one key and return its canonical Python value (module docstring table).
        InvalidInputError for None, a wrong type, an out-of-range number, a str that is not
        valid Unicode, a fixed_size_binary of another length or a datetime not exact in the
        timestamp's unit."""
        k = self.kind
        if v is None:
            raise InvalidInputError(f"a key of type {self.name} must not be None")
        if k == "struct":
            if not isinstance(v, (tuple, list)) or len(v) != len(self.fields):
                raise InvalidInputError(
                    f"key {v!r} of type {type(v).__name__} does not match key type {self.name}: "
                    f"expected a tuple of {len(self.fields)} values")
            out = []
            for i, (f, x) in enumerate(zip(self.fields, v)):
                try:
                    out.append(f.check(x))
                except InvalidInputError as e:
                    raise InvalidInputError(f"field {i} of key {v!r}: {e}") from None
            return tuple(out)
        if k == "timestamp" and isinstance(v, (datetime.datetime, np.datetime64)):
            return timestamp_count(v, self.unit, f"key type {self.name}")
        if k in _RANGES:
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise self._mismatch(v)
            x = int(v)
            lo, hi = _RANGES[k]
            if not lo <= x <= hi:
                raise InvalidInputError(f"key {x} is out of range for key type {self.name}")
            return x
        if k == "float64":
            if (isinstance(v, (bool, np.bool_))
                    or not isinstance(v, (int, float, np.integer, np.floating))):
                raise self._mismatch(v)
            try:
                return canonical_float(float(v))
            except OverflowError:
                raise InvalidInputError(f"key {v!r} does not fit in float64") from None
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
                raise InvalidInputError(
                    f"string key is not valid Unicode (lone surrogate?): {e}") from None
            return v if type(v) is str else str.__str__(v)  # numpy.str_ and other subclasses
        if not isinstance(v, (bytes, bytearray, memoryview)):
            raise self._mismatch(v)
        b = bytes(v)
        if k == "fixed_size_binary" and len(b) != self.width:
            raise InvalidInputError(f"key of {len(b)} bytes does not match key type {self.name}")
        return b

    def _mismatch(self, v) -> InvalidInputError:
        return InvalidInputError(
            f"key {v!r} of type {type(v).__name__} does not match key type {self.name}")

    # ---------------------------------------------------------------- key serializer
    def serialize(self, v) -> bytes:
        """``ser(key)`` inside encoded keys (docs/formats.md "Encoded key"); ``v`` is validated
        first (InvalidInputError as :meth:`check`)."""
        return self._ser(self.check(v))

    def serialize_checked(self, v) -> bytes:
        """``ser(key)`` of a value :meth:`check` returned (not validated again: the per-record
        paths validate a key once)."""
        return self._ser(v)

    def _ser(self, v) -> bytes:
        k = self.kind
        if k == "struct":
            return b"".join(f._ser(x) for f, x in zip(self.fields, v))
        if k == "int32":
            return _struct.pack(">i", v)
        if k in ("int64", "timestamp"):
            return _struct.pack(">q", v)
        if k == "uint64":
            return _struct.pack(">Q", v)
        if k == "float64":
            return _double_bits(v).to_bytes(8, "big")
        if k == "bool":
            return b"\x01" if v else b"\x00"
        if k == "fixed_size_binary":
            return v
        raw = v.encode("utf-8") if k == "string" else v
        return write_varlen(len(raw) + 1) + raw

    def read(self, buf: bytes, pos: int):
        """Decode one ``ser(key)`` at ``pos``: ``(value, next_pos)``. InvalidInputError for
        truncated or malformed bytes (including a non-canonical float64 or a bool byte other
        than 00/01, which no valid key serializes to)."""
        k = self.kind
        if k == "struct":
            out = []
            for f in self.fields:
                x, pos = f.read(buf, pos)
                out.append(x)
            return tuple(out), pos
        w = self.fixed_width
        if w is not None:
            if pos + w > len(buf):
                raise InvalidInputError(f"truncated {self.name} in encoded key")
            chunk = bytes(buf[pos:pos + w])
            if k == "int32":
                return _struct.unpack(">i", chunk)[0], pos + w
            if k in ("int64", "timestamp"):
                return _struct.unpack(">q", chunk)[0], pos + w
            if k == "uint64":
                return _struct.unpack(">Q", chunk)[0], pos + w
            if k == "float64":
                x = _struct.unpack(">d", chunk)[0]
                if self._ser(canonical_float(x)) != chunk:
                    raise InvalidInputError(f"non-canonical float64 key bytes {chunk.hex()}")
                return canonical_float(x), pos + w
            if k == "bool":
                if chunk not in (b"\x00", b"\x01"):
                    raise InvalidInputError(f"bool key byte must be 00 or 01, got {chunk.hex()}")
                return chunk == b"\x01", pos + w
            return chunk, pos + w
        ln, pos = read_varlen(buf, pos)
        if ln == 0:
            raise InvalidInputError(f"null {self.name} (length 0) in encoded key")
        end = pos + ln - 1
        if end > len(buf):
            raise InvalidInputError(f"truncated {self.name} in encoded key")
        raw = bytes(buf[pos:end])
        if k == "string":
            try:
                return raw.decode("utf-8"), end
            except UnicodeDecodeError as e:
                raise InvalidInputError(f"malformed UTF-8 in encoded key: {e}") from None
        return raw, end

    # ---------------------------------------------------------------- assigner inputs
    def spark_bytes(self, v) -> bytes:
        """Bytes Spark's xxhash64/hash feed to the hash for one (scalar) column value
        (docs/formats.md "Key groups"). InvalidInputError for a struct (one byte string per
        field)."""
        v = self.check(v)
        return self._spark_bytes(v)

    def _spark_bytes(self, v) -> bytes:
        k = self.kind
        if k == "struct":
            raise InvalidInputError("a struct key hashes field by field (spark_columns)")
        if k in ("int32", "bool"):
            return int(v).to_bytes(4, "little", signed=True)
        if k in ("int64", "timestamp"):
            return v.to_bytes(8, "little", signed=True)
        if k == "uint64":
            return v.to_bytes(8, "little")
        if k == "float64":
            return (0 if v == 0.0 else _double_bits(v)).to_bytes(8, "little")
        if k == "string":
            return v.encode("utf-8")
        return v

    def spark_columns(self, v) -> list[bytes]:
        """The hash input of every column of key ``v`` in order (one for a scalar type): Spark
        hashes them chained, each hash seeding the next."""
        v = self.check(v)
        if self.kind == "struct":
            return [f._spark_bytes(x) for f, x in zip(self.fields, v)]
        return [self._spark_bytes(v)]

    def java_hash(self, v) -> int:
        """Java ``hashCode()`` of the boxed key (docs/formats.md "Key groups"), a signed
        int32."""
        return self._java(self.check(v))

    def _java(self, v) -> int:
        k = self.kind
        if k == "struct":
            h = 0
            for f, x in zip(self.fields, v):
                h = (31 * h + f._java(x)) & _M32
            return _signed(h, 32)
        if k == "int32":
            return v
        if k in ("int64", "timestamp", "uint64"):
            return _java_long_hash(v)
        if k == "float64":
            return _java_long_hash(_double_bits(v))
        if k == "bool":
            return 1231 if v else 1237
        if k == "string":
            units = v.encode("utf-16-le", "surrogatepass")
            h = 0
            for i in range(0, len(units), 2):
                h = (31 * h + (units[i] | (units[i + 1] << 8))) & _M32
            return _signed(h, 32)
        return _java_bytes_hash(v)


# ------------------------------------------------------------------------------- construction

def _unsupported(spec) -> InvalidInputError:
    return InvalidInputError(
        f"unsupported key type {spec!r}; expected one of int32, int64, uint64, float64, bool, "
        "timestamp[s|ms|us|ns], string, binary, fixed_size_binary[N], a pyarrow type of those, "
        "or several of them (a tuple/list, pa.struct or 'struct<t1,t2,...>') for a multi-column "
        "key")


def _struct_of(fields) -> KeyType:
    fields = tuple(fields)
    if not fields:
        raise InvalidInputError("a multi-column key needs at least one column")
    for f in fields:
        if f.is_struct:
            raise InvalidInputError("multi-column keys are flat: a field cannot be a struct")
    return KeyType("struct<" + ",".join(f.name for f in fields) + ">", "struct", fields=fields)


def _split_fields(body: str) -> list[str]:
    """Split ``a, b: timestamp[us, tz=UTC]`` at the commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in body:
        depth += ch in "[<"
        depth -= ch in "]>"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts]


_TS_RE = re.compile(r"^timestamp\[(s|ms|us|ns)(,\s*tz=[^\]]*)?\]$")
_FSB_RE = re.compile(r"^fixed_size_binary\[(\d+)\]$")
_FIELD_NAME_RE = re.compile(r"^[^:<\[]+:\s*")


def _from_string(s: str) -> KeyType:
    t = s.strip()
    low = t.lower()
    alias = _SCALAR_ALIASES.get(low)
    if alias is not None:
        low = alias
    m = _TS_RE.match(low)
    if m:
        return KeyType(f"timestamp[{m.group(1)}]", "timestamp", unit=m.group(1))
    m = _FSB_RE.match(low)
    if m:
        w = int(m.group(1))
        if not 1 <= w <= (1 << 31) - 1:
            raise InvalidInputError(f"fixed_size_binary key width must be in [1, 2**31), got {w}")
        return KeyType(f"fixed_size_binary[{w}]", "fixed_size_binary", width=w)
    if low.startswith("struct<") and low.endswith(">"):
        body = t[t.index("<") + 1:-1]
        # str(pa.struct(...)) names its fields ("a: int32"); names do not matter for keys.
        return _struct_of(_from_string(_FIELD_NAME_RE.sub("", p)) for p in _split_fields(body))
    if low in SCALAR_KINDS:
        return KeyType(low, low)
    raise _unsupported(s)


def _from_arrow(t: pa.DataType) -> KeyType:
    if pa.types.is_struct(t):
        return _struct_of(_from_arrow(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_timestamp(t):
        return KeyType(f"timestamp[{t.unit}]", "timestamp", unit=t.unit)
    if pa.types.is_fixed_size_binary(t):
        return _from_string(f"fixed_size_binary[{t.byte_width}]")
    name = {pa.int32(): "int32", pa.int64(): "int64", pa.uint64(): "uint64",
            pa.float64(): "float64", pa.bool_(): "bool", pa.string(): "string",
            pa.large_string(): "string", pa.binary(): "binary",
            pa.large_binary(): "binary"}.get(t)
    if name is None:
        raise _unsupported(t)
    return KeyType(name, name)


@functools.lru_cache(maxsize=256)
def _cached(spec) -> KeyType:
    if isinstance(spec, str):
        return _from_string(spec)
    if isinstance(spec, pa.DataType):
        return _from_arrow(spec)
    if isinstance(spec, tuple):
        return _struct_of(key_type(s) for s in spec)
    raise _unsupported(spec)


def key_type(spec) -> KeyType:
    """The :class:`KeyType` of ``spec``: a name or alias (``"int64"``, ``"timestamp"``,
    ``"fixed_size_binary[16]"``, ``"struct<int32,string>"``), a pyarrow DataType (time zones
    and field names are ignored), a KeyType, or a tuple/list of those (a multi-column key).
    InvalidInputError for anything else."""
    if isinstance(spec, KeyType):
        return spec
    if isinstance(spec, list):
        spec = tuple(spec)
    try:
        return _cached(spec)
    except TypeError:  # unhashable
        raise _unsupported(spec) from None
