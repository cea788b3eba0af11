"""Value / key serializers and the key codec (pure-Python reference of docs/formats.md).

Two families of serializers, both selected by a type name (or a pyarrow DataType):

* Value serializers (:func:`value_serializer`, defined in :mod:`statecore.value_types`, which
  also gives the per-record Python values and Arrow types): how a state value is stored.
* Key serializers (:func:`key_serializer`): how a key, namespace or map user key is written in an
  encoded key, after Flink's ``IntSerializer``/``LongSerializer``/``StringSerializer``; every key
  type of :mod:`statecore.key_types`, plus ``void`` (namespaces, Flink ``VoidNamespace``) and
  ``pickle`` (map user keys only).

The codec: encoded keys (Flink's ``SerializedCompositeKeyBuilder``), list and map blobs and timer
keys. ``varlen`` and ``lenbytes`` are the varints of :mod:`statecore.varint` (re-exported here).
Byte layouts: docs/formats.md "Encoded key" and "Values".

Every function raises :class:`statecore.errors.InvalidInputError` on bad input or malformed bytes.
"""

from __future__ import annotations

import pickle
from typing import Any, Iterable

import numpy as np

from statecore import key_types as KT
from statecore.errors import InvalidInputError
from statecore.value_types import (  # noqa: F401 (re-exported)
    PICKLE_PROTOCOL,
    VALUE_TYPES,
    ValueSerializer,
    normalize_value_type,
    value_serializer,
)
from statecore.varint import len_bytes, read_varlen, write_varlen  # noqa: F401 (re-exported)

__all__ = [
    "VALUE_TYPES",
    "KEY_SERIALIZER_TYPES",
    "NAMESPACE_TYPES",
    "ValueSerializer",
    "KeySerializer",
    "normalize_value_type",
    "value_serializer",
    "key_serializer",
    "is_fixed_width",
    "write_varlen",
    "read_varlen",
    "len_bytes",
    "key_group_prefix",
    "encoded_key_width",
    "encoded_key_problem",
    "read_key_group_prefix",
    "encode_key",
    "decode_key",
    "encode_list",
    "decode_list",
    "chunk_list_entries",
    "encode_map",
    "encode_map_serialized",
    "decode_map",
    "encode_timer_key",
    "decode_timer_key",
    "PROCESSING_TIME_MARKER",
]

#: Key serializers: every key type (statecore.key_types; timestamp[u], fixed_size_binary[N] and
#: struct<...> take parameters) plus void (namespaces) and pickle (map user keys).
KEY_SERIALIZER_TYPES = ("int32", "int64", "uint64", "float64", "bool", "timestamp", "string",
                        "binary", "fixed_size_binary", "struct", "void", "pickle")
NAMESPACE_TYPES = ("void", "int32", "int64", "string", "binary")

_INT64 = (-(1 << 63), (1 << 63) - 1)


# --------------------------------------------------------------------------- key serializers

class KeySerializer:
    """Serializer of keys, namespaces and map user keys inside encoded keys (docs/formats.md
    "Encoded key").

    ``fixed_width`` is the byte width of every serialized value, or None for variable-length
    serializers (string, binary, pickle, multi-column keys with such a field), which carry their
    own lengths. Key types delegate to their :class:`statecore.key_types.KeyType`.
    """

    def __init__(self, name: str, key_type=None):
        self.name = name
        self.key_type = key_type
        if key_type is not None:
            self.fixed_width = key_type.fixed_width
        else:
            self.fixed_width = 1 if name == "void" else None

    def __repr__(self):
        return f"KeySerializer({self.name!r})"

    def check(self, v: Any) -> Any:
        """Validate and canonicalize; ``void`` accepts only None, the others reject None."""
        n = self.name
        if n == "void":
            if v is not None:
                raise InvalidInputError(f"the void namespace accepts only None, got {v!r}")
            return None
        if n == "pickle":
            return v
        return self.key_type.check(v)

    def serialize(self, v: Any) -> bytes:
        """The bytes of ``v`` inside an encoded key (docs/formats.md "Encoded key"). Raises
        InvalidInputError when ``v`` does not fit the type (or, for pickle, cannot be
        pickled)."""
        n = self.name
        if n == "void":
            self.check(v)
            return b"\x00"
        if n == "pickle":
            try:
                raw = pickle.dumps(v, protocol=PICKLE_PROTOCOL)
            except Exception as e:
                raise InvalidInputError(
                    f"user key of type {type(v).__name__} cannot be pickled: {e}") from e
            return write_varlen(len(raw) + 1) + raw
        return self.key_type.serialize(v)

    def read(self, buf: bytes, pos: int) -> tuple[Any, int]:
        """Decode one value at ``pos``; returns ``(value, next_pos)``."""
        n = self.name
        if n == "void":
            if pos + 1 > len(buf):
                raise InvalidInputError("truncated void in encoded key")
            if buf[pos:pos + 1] != b"\x00":
                raise InvalidInputError("void namespace byte must be 00")
            return None, pos + 1
        if n == "pickle":
            raw, end = _BINARY_KEY.read(buf, pos)
            try:
                return pickle.loads(raw), end
            except Exception as e:
                raise InvalidInputError(f"malformed pickled user key: {e}") from e
        return self.key_type.read(buf, pos)

    def deserialize(self, b) -> Any:
        """Decode a whole buffer holding exactly one value."""
        b = bytes(b)
        v, pos = self.read(b, 0)
        if pos != len(b):
            raise InvalidInputError(f"{len(b) - pos} trailing bytes after {self.name}")
        return v


_BINARY_KEY = KT.key_type("binary")
_KEY_SERS = {"void": KeySerializer("void"), "pickle": KeySerializer("pickle"),
             "object": KeySerializer("pickle")}
_KEY_TYPE_SERS: dict = {}


def key_serializer(type_) -> KeySerializer:
    """The (shared, stateless) key serializer of a key type (name, pyarrow type, KeyType or a
    tuple of them for a multi-column key; :mod:`statecore.key_types`), ``void`` or ``pickle``.
    InvalidInputError for anything else."""
    if isinstance(type_, KeySerializer):
        return type_
    if isinstance(type_, str) and type_.lower() in _KEY_SERS:
        return _KEY_SERS[type_.lower()]
    try:
        kt = KT.key_type(type_)
    except InvalidInputError:
        raise InvalidInputError(
            f"unsupported key/namespace type {type_!r}; expected a key type "
            f"({', '.join(KT.SCALAR_KINDS)} or several of them), void or pickle") from None
    ser = _KEY_TYPE_SERS.get(kt.name)
    if ser is None:
        ser = _KEY_TYPE_SERS[kt.name] = KeySerializer(kt.name, kt)
    return ser


def is_fixed_width(ser) -> bool:
    """True when every serialized value of ``ser`` (a serializer or type name) has one width."""
    if isinstance(ser, (ValueSerializer, KeySerializer)):
        return ser.fixed_width is not None
    try:
        return key_serializer(ser).fixed_width is not None
    except InvalidInputError:
        return value_serializer(ser).fixed_width is not None


# --------------------------------------------------------------------------- encoded keys

def key_group_prefix(key_group: int, max_parallelism: int) -> bytes:
    """The key-group prefix of an encoded key (docs/formats.md "Encoded key"; Flink
    ``CompositeKeySerializationUtils.computeRequiredBytesInKeyGroupPrefix``). InvalidInputError
    for ``max_parallelism`` outside [1, 32768] or a key group outside [0, max_parallelism)."""
    if not 0 < max_parallelism <= 32768:
        raise InvalidInputError(f"max_parallelism must be in [1, 32768], got {max_parallelism}")
    if not 0 <= key_group < max_parallelism:
        raise InvalidInputError(f"key group {key_group} outside [0, {max_parallelism - 1}]")
    return key_group.to_bytes(1 if max_parallelism <= 128 else 2, "big")


def encoded_key_width(kind: str, key_ser, ns_ser, max_parallelism: int) -> int | None:
    """The byte width every encoded key of a state of ``kind`` has when its key and namespace
    serializers are fixed-width (prefix | ser(key) | ser(namespace): value, reducing and
    aggregating state; the same and an 8-byte sequence number: list state), else None
    (variable-length parts; map state, whose keys carry a user key; timers)."""
    if kind not in ("value", "list", "reducing", "aggregating"):
        return None
    kw, nw = key_serializer(key_ser).fixed_width, key_serializer(ns_ser).fixed_width
    if kw is None or nw is None:
        return None
    return ((1 if max_parallelism <= 128 else 2) + kw + nw
            + (LIST_SEQ_BYTES if kind == "list" else 0))


def encoded_key_problem(keys, max_parallelism: int, key_group: int | None = None,
                        width: int | None = None) -> str | None:
    """What is wrong with the encoded keys ``keys`` (a ``pa.binary()`` array without nulls, as
    a bulk load takes them undecoded), or None: a key not longer than the key-group prefix,
    with ``key_group`` one carrying another key group's prefix, with ``width`` one of another
    length (:func:`encoded_key_width`). Vectorized over the array's offsets."""
    n = len(keys)
    if n == 0:
        return None
    w = 1 if max_parallelism <= 128 else 2
    offs = np.frombuffer(keys.buffers()[1], np.int32)[keys.offset:keys.offset + n + 1]
    lengths = np.diff(offs)
    if np.any(lengths <= w):
        return f"an encoded key is too short: not longer than its key-group prefix ({w} bytes)"
    if key_group is not None:
        data = np.frombuffer(keys.buffers()[2], np.uint8)
        starts = offs[:-1]
        got = data[starts].astype(np.int32) if w == 1 else \
            (data[starts].astype(np.int32) << 8) | data[starts + 1].astype(np.int32)
        if np.any(got != key_group):
            return f"a key listed under key group {key_group} carries another key group's prefix"
    if width is not None:
        bad = np.nonzero(lengths != width)[0]
        if len(bad):
            i = int(bad[0])
            return (f"encoded key {keys[i].as_py().hex()} is {int(lengths[i])} bytes, not "
                    f"{width}")
    return None


def read_key_group_prefix(data: bytes, max_parallelism: int) -> tuple[int, int]:
    """Key group of an encoded key and the offset after its prefix."""
    w = 1 if max_parallelism <= 128 else 2
    if len(data) < w:
        raise InvalidInputError("encoded key shorter than its key-group prefix")
    kg = int.from_bytes(data[:w], "big")
    if kg >= max_parallelism:
        raise InvalidInputError(f"encoded key group {kg} >= max_parallelism {max_parallelism}")
    return kg, w


def encode_key(key_group: int, max_parallelism: int, key, key_ser, namespace, ns_ser,
               user_key=None, user_key_ser=None) -> bytes:
    """The encoded key of (key group, key, namespace[, user key]) (docs/formats.md "Encoded
    key").

    ``key_ser``/``ns_ser``/``user_key_ser`` are KeySerializers or type names. The user key is
    appended only when ``user_key_ser`` is given. Raises InvalidInputError on bad input.
    """
    ks = key_serializer(key_ser)
    ns = key_serializer(ns_ser)
    kb = ks.serialize(key)
    nb = ns.serialize(namespace)
    parts = [key_group_prefix(key_group, max_parallelism), kb]
    ambiguous = ks.fixed_width is None and ns.fixed_width is None
    if ambiguous:
        parts.append(len_bytes(len(kb)))
    parts.append(nb)
    if ambiguous:
        parts.append(len_bytes(len(nb)))
    if user_key_ser is not None:
        parts.append(key_serializer(user_key_ser).serialize(user_key))
    return b"".join(parts)


def decode_key(data, max_parallelism: int, key_ser, ns_ser, user_key_ser=None):
    """Inverse of :func:`encode_key`: ``(key_group, key, namespace, user_key)`` (user_key is None
    when ``user_key_ser`` is None). Raises InvalidInputError on malformed or trailing bytes."""
    data = bytes(data)
    ks = key_serializer(key_ser)
    ns = key_serializer(ns_ser)
    kg, pos = read_key_group_prefix(data, max_parallelism)
    ambiguous = ks.fixed_width is None and ns.fixed_width is None
    start = pos
    key, pos = ks.read(data, pos)
    if ambiguous:
        pos = _expect(data, pos, len_bytes(pos - start))
    start = pos
    namespace, pos = ns.read(data, pos)
    if ambiguous:
        pos = _expect(data, pos, len_bytes(pos - start))
    user_key = None
    if user_key_ser is not None:
        user_key, pos = key_serializer(user_key_ser).read(data, pos)
    if pos != len(data):
        raise InvalidInputError(f"{len(data) - pos} trailing bytes in encoded key {data.hex()}")
    return kg, key, namespace, user_key


def encoded_prefix_size(data, max_parallelism: int, key_ser, ns_ser) -> int:
    """The length of the ``prefix | ser(key) | ser(namespace)`` part (length bytes included) at
    the start of encoded key ``data``: what precedes a map entry's serialized user key
    (docs/formats.md "Map state"). InvalidInputError when ``data`` does not start with one."""
    ks = key_serializer(key_ser)
    ns = key_serializer(ns_ser)
    _, pos = read_key_group_prefix(data, max_parallelism)
    ambiguous = ks.fixed_width is None and ns.fixed_width is None
    for ser in (ks, ns):
        start = pos
        _, pos = ser.read(data, pos)
        if ambiguous:
            pos = _expect(data, pos, len_bytes(pos - start))
    return pos


def split_map_entry_key(data, max_parallelism: int, key_ser, ns_ser, user_key_ser):
    """``(key_group, key, namespace, user key bytes)`` of the encoded key of a map entry
    (``prefix | ser(key) | ser(namespace) | ser(user key)``, docs/formats.md "Map state"); the
    user key bytes are checked to hold exactly one user key. InvalidInputError otherwise."""
    data = bytes(data)
    pos = encoded_prefix_size(data, max_parallelism, key_ser, ns_ser)
    kg, key, namespace, _ = decode_key(data[:pos], max_parallelism, key_ser, ns_ser)
    ukb = data[pos:]
    if not ukb:
        raise InvalidInputError(f"encoded map entry key {data.hex()} has no user key")
    key_serializer(user_key_ser).deserialize(ukb)
    return kg, key, namespace, ukb


#: Bytes of a list chunk's sequence number, the end of its entry key (docs/formats.md "List
#: state"): unsigned big-endian, so encoded key order is list order.
LIST_SEQ_BYTES = 8

#: Elements an append puts into one list chunk (docs/formats.md "List state"; native
#: ``list_chunks.h`` ``kListChunkElements``, the same). A reader takes chunks of any size.
LIST_CHUNK_ELEMENTS = 32

#: The sequence number 2**64 - 1 as it ends a key: never written (a list's next sequence number
#: after it would not fit), refused on restore.
MAX_LIST_SEQ_BYTES = b"\xff" * LIST_SEQ_BYTES


def split_list_entry_key(data, max_parallelism: int, key_ser, ns_ser):
    """``(key_group, key, namespace, seq bytes)`` of the encoded key of a list chunk (or, in a
    format 4 file, of a list element)
    (``prefix | ser(key) | ser(namespace) | seq``, seq :data:`LIST_SEQ_BYTES` bytes,
    docs/formats.md "List state"). InvalidInputError when the key does not end in exactly one
    sequence number, or in 2**64 - 1 (no list reaches it: the one after it would not fit)."""
    data = bytes(data)
    pos = encoded_prefix_size(data, max_parallelism, key_ser, ns_ser)
    if len(data) - pos != LIST_SEQ_BYTES:
        raise InvalidInputError(
            f"encoded list key {data.hex()} does not end in a {LIST_SEQ_BYTES}-byte "
            "sequence number")
    if data[pos:] == MAX_LIST_SEQ_BYTES:
        raise InvalidInputError(f"encoded list key {data.hex()} ends in sequence number "
                                "2**64 - 1, which no list reaches")
    kg, key, namespace, _ = decode_key(data[:pos], max_parallelism, key_ser, ns_ser)
    return kg, key, namespace, data[pos:]


def _expect(data: bytes, pos: int, expected: bytes) -> int:
    if data[pos:pos + len(expected)] != expected:
        raise InvalidInputError(f"bad length bytes in encoded key {data.hex()} at offset {pos}")
    return pos + len(expected)


# --------------------------------------------------------------------------- blobs

def encode_list(elements: Iterable, element_ser) -> bytes:
    """List-state blob of ``elements`` (docs/formats.md "Values"); ``element_ser`` is a value
    type."""
    s = value_serializer(element_ser)
    if s.fixed_width is not None:
        return b"".join(s.serialize(e) for e in elements)
    out = []
    for e in elements:
        b = s.serialize(e)
        out.append(write_varlen(len(b)))
        out.append(b)
    return b"".join(out)


def decode_list(blob, element_ser) -> list:
    """Inverse of :func:`encode_list`."""
    s = value_serializer(element_ser)
    blob = bytes(blob)
    w = s.fixed_width
    if w is not None:
        if len(blob) % w:
            raise InvalidInputError(f"list blob of {len(blob)} bytes is not a multiple of {w}")
        return [s.deserialize(blob[i:i + w]) for i in range(0, len(blob), w)]
    out = []
    pos = 0
    while pos < len(blob):
        n, pos = read_varlen(blob, pos)
        if pos + n > len(blob):
            raise InvalidInputError("truncated list element")
        out.append(s.deserialize(blob[pos:pos + n]))
        pos += n
    return out


def encode_map_serialized(pairs: dict) -> bytes:
    """Map-state blob (docs/formats.md "Values") from already serialized ``{ser_uk: ser_uv}``."""
    out = []
    for kb in sorted(pairs):
        vb = pairs[kb]
        out += [write_varlen(len(kb)), kb, write_varlen(len(vb)), vb]
    return b"".join(out)


def encode_map(items: Iterable, user_key_ser, user_value_ser) -> bytes:
    """Map-state blob of ``(user_key, user_value)`` pairs (or a dict). A user key given twice keeps
    the last value. ``user_key_ser`` is a key-serializer type, ``user_value_ser`` a value type."""
    ks = key_serializer(user_key_ser)
    vs = value_serializer(user_value_ser)
    if isinstance(items, dict):
        items = items.items()
    return encode_map_serialized({ks.serialize(k): vs.serialize(v) for k, v in items})


def decode_map(blob, user_key_ser, user_value_ser, raw: bool = False) -> list:
    """Inverse of :func:`encode_map`: list of ``(user_key, user_value)`` in blob order; with
    ``raw=True`` the serialized ``(ser_uk, ser_uv)`` byte pairs instead."""
    ks = key_serializer(user_key_ser)
    vs = value_serializer(user_value_ser)
    blob = bytes(blob)
    out = []
    pos = 0
    while pos < len(blob):
        n, pos = read_varlen(blob, pos)
        kb = blob[pos:pos + n]
        pos += n
        if pos > len(blob):
            raise InvalidInputError("truncated map blob")
        m, pos = read_varlen(blob, pos)
        vb = blob[pos:pos + m]
        pos += m
        if pos > len(blob):
            raise InvalidInputError("truncated map blob")
        out.append((kb, vb) if raw else (ks.deserialize(kb), vs.deserialize(vb)))
    return out


def expand_whole_map_entries(keys: list, values: list) -> tuple[list, list]:
    """The per-entry form (docs/formats.md "Map state") of map-state entries written in the
    whole-map layout of checkpoint format 3 and older (one entry per (key, namespace) whose
    value is a map blob, :func:`encode_map_serialized`): each pair of a blob becomes the entry
    ``encoded key | ser(user key)`` -> ``ser(user value)`` (its TTL suffix kept, per entry).
    ``keys`` are sorted encoded keys (bytes), ``values`` bytes or None (a tombstone, refused:
    a whole-map tombstone names no entries). Returns ``(keys, values)`` sorted by key.
    InvalidInputError for a tombstone or a blob that does not parse."""
    out = []
    for kb, vb in zip(keys, values):
        if vb is None:
            raise InvalidInputError(
                "a map-state tombstone of the whole-map layout cannot be converted to entries")
        blob = bytes(vb)
        pos = 0
        while pos < len(blob):
            n, pos = read_varlen(blob, pos)
            ukb = blob[pos:pos + n]
            pos += n
            m, pos = read_varlen(blob, pos) if pos <= len(blob) else (0, pos)
            uvb = blob[pos:pos + m]
            pos += m
            if pos > len(blob) or not ukb:
                raise InvalidInputError(f"malformed whole-map value of key {bytes(kb).hex()}")
            out.append((bytes(kb) + ukb, uvb))
    out.sort(key=lambda p: p[0])
    return [p[0] for p in out], [p[1] for p in out]


def expand_whole_list_entries(keys: list, values: list, fixed_width, ttl: bool
                              ) -> tuple[list, list]:
    """The per-element form (docs/formats.md "List state") of list-state entries written in the
    whole-list layout of checkpoint format 3 and older (one entry per (key, namespace) whose
    value is a list blob: its elements in order, each ``varlen(n) | n bytes`` or, for a type of
    fixed width ``fixed_width``, that many bytes; with ``ttl`` each followed by its 8-byte
    timestamp): element i becomes the entry ``encoded key | i`` (8 bytes big-endian) -> its
    bytes (TTL suffix kept). ``keys`` are sorted encoded keys (bytes), ``values`` bytes or
    None (a tombstone, refused: a whole-list tombstone names no elements). Returns ``(keys,
    values)`` sorted by key. InvalidInputError for a tombstone or a blob that does not
    parse."""
    suffix = 8 if ttl else 0
    out = []
    for kb, vb in zip(keys, values):
        if vb is None:
            raise InvalidInputError(
                "a list-state tombstone of the whole-list layout cannot be converted to entries")
        blob, kb = bytes(vb), bytes(kb)
        pos = i = 0
        while pos < len(blob):
            if fixed_width:
                n = fixed_width
            else:
                n, pos = read_varlen(blob, pos)
            end = pos + n + suffix
            if end > len(blob):
                raise InvalidInputError(f"malformed whole-list value of key {kb.hex()}")
            out.append((kb + i.to_bytes(LIST_SEQ_BYTES, "big"), blob[pos:end]))
            pos, i = end, i + 1
    out.sort(key=lambda p: p[0])
    return [p[0] for p in out], [p[1] for p in out]


def chunk_list_entries(keys: list, values: list, fixed_width, ttl: bool) -> tuple[list, list]:
    """The chunked form (docs/formats.md "List state") of list-state entries written one per
    element (checkpoint format 4, or :func:`expand_whole_list_entries`' output): ``keys`` sorted
    encoded keys ``prefix | seq`` (bytes), ``values`` each element's bytes ``ser(e) [| ts]``
    (None, a tombstone, refused: it names an element, not a chunk). A list's elements, in key
    order, go :data:`LIST_CHUNK_ELEMENTS` to a chunk: chunk i is the entry ``prefix | i`` -> its
    elements in the list-blob layout (``varlen(len(ser(e)))`` before each variable-width
    element, the TTL suffix kept), as an append would have written them. Returns ``(keys,
    values)`` sorted by key. InvalidInputError for a tombstone, a key without a sequence
    number or an element too short for its TTL suffix."""
    suffix = 8 if ttl else 0
    out_k, out_v = [], []
    prefix, parts, count = None, [], 0

    def flush():
        if parts:
            chunk = (count - 1) // LIST_CHUNK_ELEMENTS
            out_k.append(prefix + chunk.to_bytes(LIST_SEQ_BYTES, "big"))
            out_v.append(b"".join(parts))
            parts.clear()

    for kb, vb in zip(keys, values):
        kb = bytes(kb)
        if vb is None:
            raise InvalidInputError(
                "a list-state tombstone of the per-element layout cannot be converted to chunks")
        if len(kb) <= LIST_SEQ_BYTES:
            raise InvalidInputError(f"list element key {kb.hex()} lacks its sequence number")
        vb = bytes(vb)
        if len(vb) < suffix:
            raise InvalidInputError(f"list element of key {kb.hex()} lacks its TTL timestamp")
        p = kb[:-LIST_SEQ_BYTES]
        if p != prefix:
            flush()
            prefix, count = p, 0
        elif count % LIST_CHUNK_ELEMENTS == 0:
            flush()
        if not fixed_width:
            parts.append(write_varlen(len(vb) - suffix))
        parts.append(vb)
        count += 1
    flush()
    return out_k, out_v


# --------------------------------------------------------------------------- timers

#: Last byte of the key of a processing-time timer; an event-time timer key has no marker, so
#: keys written before processing-time timers existed read as event time.
PROCESSING_TIME_MARKER = b"\x01"


def encode_timer_key(key_group: int, max_parallelism: int, timestamp: int, key, key_ser,
                     namespace, ns_ser, processing_time: bool = False) -> bytes:
    """Timer key of a timer at ``timestamp`` (ms) (docs/formats.md "Values", timers): sorting
    encoded timer keys orders them by timestamp within a key group. ``processing_time``: a
    processing-time timer (key ends with :data:`PROCESSING_TIME_MARKER`), else event time.
    InvalidInputError for a timestamp that is not an int64, or as :func:`encode_key`."""
    if isinstance(timestamp, (bool, np.bool_)) or not isinstance(timestamp, (int, np.integer)):
        raise InvalidInputError(f"timer timestamp must be an int (ms), got {timestamp!r}")
    ts = int(timestamp)
    if not _INT64[0] <= ts <= _INT64[1]:
        raise InvalidInputError(f"timer timestamp {ts} does not fit in int64")
    return b"".join((
        key_group_prefix(key_group, max_parallelism),
        ((ts + (1 << 63)) & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big"),
        key_serializer(key_ser).serialize(key),
        key_serializer(ns_ser).serialize(namespace),
        PROCESSING_TIME_MARKER if processing_time else b"",
    ))


def decode_timer_key(data, max_parallelism: int, key_ser, ns_ser, with_domain: bool = False):
    """Inverse of :func:`encode_timer_key`: ``(key_group, timestamp, key, namespace)``, with
    ``with_domain`` ``(key_group, timestamp, key, namespace, processing_time)``.
    InvalidInputError for a malformed key, and without ``with_domain`` for the key of a
    processing-time timer."""
    data = bytes(data)
    kg, pos = read_key_group_prefix(data, max_parallelism)
    if len(data) < pos + 8:
        raise InvalidInputError("truncated timer timestamp")
    ts = int.from_bytes(data[pos:pos + 8], "big") - (1 << 63)
    key, pos = key_serializer(key_ser).read(data, pos + 8)
    ns, pos = key_serializer(ns_ser).read(data, pos)
    processing = data[pos:] == PROCESSING_TIME_MARKER
    if processing and not with_domain:
        raise InvalidInputError(f"timer key {data.hex()} is a processing-time timer's")
    if processing:
        pos += 1
    if pos != len(data):
        raise InvalidInputError(f"{len(data) - pos} trailing bytes in timer key {data.hex()}")
    return (kg, ts, key, ns, processing) if with_domain else (kg, ts, key, ns)
