"""Arrow inputs of the batch API: importing, type checks and validation of batch columns.

The batch calls of every state (and of the timer service) take their keys, values, namespaces,
map user keys and timer timestamps through these functions, so both backends accept exactly the
same inputs and raise the same errors (the rules: :mod:`statecore.backends.base`, "Batch API").

An Arrow input is a pa.Array, a pa.ChunkedArray, or any object implementing the Arrow PyCapsule
interface (``__arrow_c_stream__``: pyarrow Table/RecordBatchReader/ChunkedArray, polars Series
and DataFrames, nanoarrow streams, ...; ``__arrow_c_array__``: pa.RecordBatch, nanoarrow arrays,
...). :func:`import_arrow` reads one without copying a buffer; the ``coerce_*`` functions check
it against a key or value type. Every function raises
:class:`statecore.errors.InvalidInputError` for input it does not take, before any state
changes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statecore import key_types as KT
from statecore import serializers as S
from statecore.errors import InvalidInputError

__all__ = [
    "is_arrow_input",
    "import_arrow",
    "check_in_full",
    "combined",
    "as_arrow_array",
    "arrow_type_ok",
    "check_arrow_type",
    "coerce_key_array",
    "key_pylist",
    "coerce_value_array",
    "batch_namespace_array",
]


def is_arrow_input(obj) -> bool:
    """Whether the batch API reads ``obj`` as an Arrow column (:func:`import_arrow`): a pa.Array,
    a pa.ChunkedArray, or any object with ``__arrow_c_stream__`` or ``__arrow_c_array__``."""
    return (isinstance(obj, (pa.Array, pa.ChunkedArray)) or hasattr(obj, "__arrow_c_stream__")
            or hasattr(obj, "__arrow_c_array__"))


def _natively_checked(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t))


def import_arrow(obj, what: str, accepts=None, native_checks: bool = False):
    """One batch column as a pa.Array or pa.ChunkedArray, without copying any buffer.

    Accepted: a pa.Array or pa.ChunkedArray (as is); an object with ``__arrow_c_stream__`` (the
    Arrow C stream interface: pyarrow ChunkedArray/Table/RecordBatchReader, polars Series and
    DataFrames, nanoarrow streams, ...), read to its end here -- before the caller touches any
    state -- and held as a ChunkedArray of the producer's own buffers; an object with only
    ``__arrow_c_array__`` (pa.RecordBatch, nanoarrow arrays, ...). A stream is preferred when an
    object has both, since it keeps the producer's chunks instead of having it concatenate them.

    A record batch (a struct without nulls at the top level) with exactly one column is read as
    that column when ``accepts(type)`` (a predicate on Arrow types, the caller's expected
    types) rejects the struct but takes the column's type: a one-column RecordBatchReader or
    DataFrame is a column. ``accepts=None`` never unwraps.

    Every column is validated in full (:meth:`pyarrow.Array.validate`): buffers large enough
    for its length and offset, offsets in bounds and ascending, strings valid UTF-8, null
    counts matching the validity bitmaps. With ``native_checks=True`` (the caller hands the
    column to a native batch kernel and nothing reads its rows before) a string, large_string,
    binary or large_binary column gets pyarrow's structural validation only (buffer sizes
    against length and offset; the first and last offsets within the data buffer) plus the null
    count check, and the kernel checks the rest in its pass over the column -- every offset,
    UTF-8 of the non-null strings (native/include/statecore/key_columns.h
    ``check_column_data``) -- before it changes anything (InvalidInputError "<what>: invalid
    Arrow data: row R: ..."); any other type is validated in full as without it. What a
    producer of the C data interface must guarantee beyond that (the interface carries no
    buffer sizes, so an importer cannot check them): every buffer holds at least what the
    array's type, length and offset say (e.g. ``8 * (offset + length)`` bytes of int64 values,
    ``offset + length + 1`` offsets of a string array); the offsets' last value is read to size
    the data buffer.

    Raises InvalidInputError for anything else, for data that fails validation (naming
    ``what``), or when the producer fails (an export error, a stream that errors mid-way:
    nothing has changed then)."""
    if isinstance(obj, (pa.Array, pa.ChunkedArray)):
        arr = obj
    elif hasattr(obj, "__arrow_c_stream__"):
        try:
            arr = pa.chunked_array(obj)
        except Exception as e:
            raise InvalidInputError(f"{what}: reading the Arrow C stream failed: "
                                    f"{type(e).__name__}: {e}") from e
    elif hasattr(obj, "__arrow_c_array__"):
        try:
            arr = pa.array(obj)
        except Exception as e:
            raise InvalidInputError(
                f"{what}: cannot import through the Arrow C data interface: {e}") from e
    else:
        raise InvalidInputError(
            f"{what} must be a pyarrow Array/ChunkedArray or implement __arrow_c_stream__ or "
            f"__arrow_c_array__, got {type(obj).__name__}"
        )
    try:
        chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    except KeyError as e:  # pyarrow has no Python class for the chunks' type (id in e)
        raise InvalidInputError(f"{what}: unsupported Arrow type id {e} in a chunked "
                                "array") from e
    if any(c.offset < 0 for c in chunks):  # pyarrow's validation takes a negative one
        raise InvalidInputError(f"{what}: invalid Arrow data: a negative array offset")
    if native_checks and _natively_checked(arr.type):
        try:
            # Buffer sizes against lengths and offsets, a string array's first and last offsets
            # within its data buffer: O(1) a chunk. The kernel walks the offsets in between.
            arr.validate()
        except (pa.ArrowException, ValueError) as e:
            raise InvalidInputError(f"{what}: invalid Arrow data: {e}") from e
        for c in chunks:
            _check_null_count(c, what)
    else:
        check_in_full(arr, what)
    t = arr.type
    if (accepts is not None and pa.types.is_struct(t) and t.num_fields == 1
            and not accepts(t) and accepts(t.field(0).type) and not arr.null_count):
        if isinstance(arr, pa.ChunkedArray):
            arr = pa.chunked_array([c.field(0) for c in arr.chunks], t.field(0).type)
        else:
            arr = arr.field(0)
    return arr


def check_in_full(arr, what: str):
    """``arr`` (pa.Array or pa.ChunkedArray) after pyarrow's full validation (buffer sizes,
    every offset, UTF-8 of strings, null counts; O(rows), about 13 ns a row of 8-32 byte
    strings): the kernels and pyarrow's compute functions read the buffers directly and must
    never run past them. InvalidInputError "<what>: invalid Arrow data: ..." otherwise."""
    try:
        arr.validate(full=True)
    except (pa.ArrowException, ValueError) as e:
        raise InvalidInputError(f"{what}: invalid Arrow data: {e}") from e
    return arr


def _check_null_count(chunk: pa.Array, what: str) -> None:
    # The part of pyarrow's full validation left for a natively checked chunk: its null count
    # against its validity bitmap (a popcount), since the kernels skip a bitmap whose
    # array reports no nulls and otherwise read it.
    validity = chunk.buffers()[0]
    nulls = 0
    if validity is not None and len(chunk):
        bits = pa.BooleanArray.from_buffers(pa.bool_(), len(chunk), [None, validity], 0,
                                            chunk.offset)
        nulls = len(chunk) - pc.sum(bits).as_py()
    if nulls != chunk.null_count:
        raise InvalidInputError(f"{what}: invalid Arrow data: null_count value "
                                f"({chunk.null_count}) doesn't match actual number of nulls "
                                f"in array ({nulls})")


def combined(arr):
    """``arr`` (pa.Array or pa.ChunkedArray) as one pa.Array: a ChunkedArray of several chunks
    is concatenated (a copy), of one chunk unwrapped (no copy)."""
    if isinstance(arr, pa.ChunkedArray):
        if arr.num_chunks == 1:
            return arr.chunk(0)
        return arr.combine_chunks() if arr.num_chunks else pa.array([], arr.type)
    return arr


def as_arrow_array(obj, what: str, accepts=None, native_checks: bool = False) -> pa.Array:
    """:func:`import_arrow` as one pa.Array (several chunks are concatenated: a copy; the
    reference backend converts rows to Python objects anyway)."""
    return combined(import_arrow(obj, what, accepts, native_checks))


def arrow_type_ok(type_name: str, t: pa.DataType) -> bool:
    """Whether the batch API takes Arrow type ``t`` for statecore type ``type_name`` (a value,
    namespace or user-key type: :meth:`statecore.value_types.ValueSerializer.accepts`; False
    for a type without any, e.g. pickle or void)."""
    try:
        return S.value_serializer(type_name).accepts(t)
    except InvalidInputError:
        return False


def check_arrow_type(arr: pa.Array, type_name: str, what: str) -> None:
    """InvalidInputError naming the expected and the given type unless ``arr`` has an Arrow
    type that :func:`arrow_type_ok` takes for ``type_name``."""
    if not arrow_type_ok(type_name, arr.type):
        raise InvalidInputError(
            f"{what} must have Arrow type {S.value_serializer(type_name).describe_arrow()} "
            f"({type_name}), got {arr.type}")


def coerce_key_array(keys, key_type, combine: bool = True, native_checks: bool = False):
    """Validate a batch of keys (the ``keys`` rules of :mod:`statecore.backends.base`) and return it
    as one pa.Array, or with ``combine=False`` as imported (a pa.ChunkedArray stays chunked: no
    copy): the key type's Arrow type (:meth:`statecore.key_types.KeyType.accepts`), no null key and,
    for a multi-column key, no null field. A multi-column key type also takes a list/tuple of arrays
    (one per column, equal lengths), combined into a struct array. InvalidInputError names what
    is wrong (and the first null row). ``native_checks``: as in :func:`import_arrow` (for each
    column given in a list)."""
    kt = KT.key_type(key_type)
    if kt.is_struct and isinstance(keys, (list, tuple)):
        arr = _struct_from_columns(keys, kt, native_checks)
    else:
        arr = import_arrow(keys, "keys", kt.accepts, native_checks)
    if not kt.accepts(arr.type):
        raise InvalidInputError(
            f"keys must have Arrow type {kt.describe_arrow()} (key type {kt.name}), got {arr.type}")
    if arr.null_count:
        raise InvalidInputError(f"keys contain {arr.null_count} null(s) (first at row "
                                f"{_first_null(arr)}); keys must not be null")
    if kt.is_struct:
        chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
        for i in range(len(kt.fields)):
            fields = [c.field(i) for c in chunks]
            nulls = sum(f.null_count for f in fields)
            if nulls:
                raise InvalidInputError(
                    f"keys: field {i} ({arr.type.field(i).name!r}) has {nulls} null(s) "
                    f"(first at row "
                    f"{_first_null(pa.chunked_array(fields, arr.type.field(i).type))})"
                    "; a multi-column key must not have null fields")
    return combined(arr) if combine else arr


def _first_null(arr) -> int:
    return int(np.flatnonzero(combined(arr).is_null().to_numpy(zero_copy_only=False))[0])


def _struct_from_columns(columns, kt, native_checks: bool) -> pa.Array:
    if len(columns) != len(kt.fields):
        raise InvalidInputError(f"keys: {len(columns)} arrays for key type {kt.name}, which has "
                                f"{len(kt.fields)} columns")
    # Chunked columns are combined here (a copy): the struct array needs one child per column.
    arrays = [as_arrow_array(c, f"keys[{i}]", f.accepts, native_checks)
              for i, (c, f) in enumerate(zip(columns, kt.fields))]
    if len({len(a) for a in arrays}) > 1:
        raise InvalidInputError(f"keys: the column arrays differ in length "
                                f"({', '.join(str(len(a)) for a in arrays)})")
    try:
        return pa.StructArray.from_arrays(arrays, names=[f"f{i}" for i in range(len(arrays))])
    except (pa.ArrowException, TypeError, ValueError) as e:
        raise InvalidInputError(f"keys: cannot combine the column arrays: {e}") from e


def key_pylist(arr: pa.Array, key_type) -> list:
    """The canonical per-record keys of a validated key array (:func:`coerce_key_array`):
    ints for timestamps, canonical floats, tuples for multi-column keys."""
    return KT.key_type(key_type).to_pylist(arr)


def coerce_value_array(values, value_type: str, length: int, any_type: bool = False,
                       combine: bool = True, native_checks: bool = False):
    """Validate a batch of values: length ``length`` and the value type's Arrow type (any type
    when ``any_type``, taken as is). Nulls are allowed (their meaning depends on the
    operation). One pa.Array, or with ``combine=False`` as imported (see
    :func:`coerce_key_array`; ``native_checks`` as in :func:`import_arrow`)."""
    if value_type == "pickle":
        raise InvalidInputError("the batch API needs a typed value (not pickle) state")
    accepts = None if any_type else (lambda t: arrow_type_ok(value_type, t))
    arr = import_arrow(values, "values", accepts, native_checks)
    if len(arr) != length:
        raise InvalidInputError(f"values have {len(arr)} rows but keys have {length}")
    if not any_type:
        check_arrow_type(arr, value_type, "values")
    return combined(arr) if combine else arr


def batch_namespace_array(namespaces, ns_type: str, length: int, native_checks: bool = False):
    """An Arrow input of per-row namespaces (:func:`is_arrow_input`) checked against the
    namespace type ``ns_type`` (its Arrow type, ``length`` rows, no nulls), as imported: a
    pa.Array or pa.ChunkedArray, not copied. InvalidInputError otherwise. ``native_checks``: as
    in :func:`import_arrow`."""
    arr = import_arrow(namespaces, "namespaces", lambda t: arrow_type_ok(ns_type, t),
                       native_checks)
    if len(arr) != length:
        raise InvalidInputError(f"namespaces have {len(arr)} rows but keys have {length}")
    check_arrow_type(arr, ns_type, "namespaces")
    if arr.null_count:
        raise InvalidInputError("namespaces must not contain nulls")
    return arr
