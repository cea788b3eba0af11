# statecore type names (statecore.key_types, statecore.value_types, reducers, TTL arguments) as
# the native core's specs: Assigner, KeySchema, ValueSpec, TtlBatchSpec, ttl::FilterSpec.

_KEY_KINDS = {"int32": c.KeyType.Int32, "int64": c.KeyType.Int64, "string": c.KeyType.String,
              "binary": c.KeyType.Binary, "uint64": c.KeyType.UInt64,
              "float64": c.KeyType.Float64, "bool": c.KeyType.Bool,
              "timestamp": c.KeyType.Timestamp, "fixed_size_binary": c.KeyType.FixedSizeBinary}
_TIME_UNITS = {"s": c.TimeUnit.Second, "ms": c.TimeUnit.Milli, "us": c.TimeUnit.Micro,
               "ns": c.TimeUnit.Nano}
# Value type kinds (statecore.value_types) the batch kernels serve, and their ValueType.
_VALUE_KINDS = {"int64": c.ValueType.Int64, "float64": c.ValueType.Float64,
                "int32": c.ValueType.Int32, "bool": c.ValueType.Bool,
                "string": c.ValueType.String, "binary": c.ValueType.Binary,
                "uint64": c.ValueType.UInt64, "timestamp": c.ValueType.Timestamp,
                "fixed_size_binary": c.ValueType.FixedSizeBinary}
_UNIT_LETTERS = {"s": b"s", "ms": b"m", "us": b"u", "ns": b"n"}  # ArrowKind time units
_REDUCERS = {"sum": c.Reducer.Sum, "min": c.Reducer.Min, "max": c.Reducer.Max,
             "count": c.Reducer.Count, "first": c.Reducer.First, "last": c.Reducer.Last}

#: Value type kinds the batch kernels serve natively (others go through the per-row path).
BATCH_VALUE_KINDS = frozenset(_VALUE_KINDS)
#: Built-in reducers the add_batch kernel serves natively.
BATCH_REDUCERS = frozenset(_REDUCERS)


cdef c.Assigner _assigner(str name) except *:
    if name == "spark":
        return c.Assigner.Spark
    if name == "flink":
        return c.Assigner.Flink
    raise InvalidInputError(f"unknown assigner {name!r}; expected 'spark' or 'flink'")


cdef c.ValueSpec _value_spec(str value_type) except *:
    """The kernels' ValueSpec of a value type name; InvalidInputError for one they do not
    serve (pickle)."""
    cdef c.ValueSpec v
    ser = VT.value_serializer(value_type)
    if ser.kind not in _VALUE_KINDS:
        raise InvalidInputError(f"value type {value_type!r} has no batch kernel")
    v.type = _VALUE_KINDS[ser.kind]
    v.unit = 0
    v.width = 0
    if ser.kind == "timestamp":
        v.unit = _UNIT_LETTERS[ser.unit][0]
    elif ser.kind == "fixed_size_binary":
        v.width = ser.width
    return v


cdef c.NamespaceType _namespace_type(str namespace_type) except *:
    """key_codec.h NamespaceType of a state's namespace type (statecore.serializers)."""
    if namespace_type is None or namespace_type == "void":
        return c.NamespaceType.Void
    if namespace_type == "int64":
        return c.NamespaceType.Int64
    if namespace_type == "int32":
        return c.NamespaceType.Int32
    if namespace_type == "string":
        return c.NamespaceType.String
    if namespace_type == "binary":
        return c.NamespaceType.Binary
    raise InvalidInputError(f"namespace type {namespace_type!r} is not supported")


cdef c.KeySchema _key_schema(str key_type) except *:
    """The native KeySchema of a statecore key type name (statecore.key_types)."""
    cdef c.KeySchema schema
    cdef c.KeyColumn col
    kt = KT.key_type(key_type)
    schema.columns.clear()
    for f in (kt.fields if kt.is_struct else (kt,)):
        col.type = _KEY_KINDS[f.kind]
        col.width = f.width or 0
        col.unit = _TIME_UNITS[f.unit or "us"]
        schema.columns.push_back(col)
    schema.is_struct = kt.is_struct
    return schema


cdef c.TtlBatchSpec _ttl_spec(ttl) except *:
    """TtlBatchSpec from ``None`` (no TTL) or ``(ttl_ms, now_ms, update_on_read,
    return_expired)``; InvalidInputError for a malformed tuple or values outside int64."""
    cdef c.TtlBatchSpec t
    if ttl is None:
        return t
    try:
        ttl_ms, now, update_on_read, return_expired = ttl
        t.ttl_ms = ttl_ms
        t.now = now
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidInputError(f"ttl must be (ttl_ms, now_ms, update_on_read, return_expired) "
                                f"with int64 times, got {ttl!r}: {e}") from None
    t.enabled = True
    t.update_on_read = bool(update_on_read)
    t.return_expired = bool(return_expired)
    return t


cdef c.FilterSpec _ttl_filter_spec(str kind, fixed_width, int64_t ttl_ms) except *:
    """ttl.h FilterSpec of a state kind (statecore.ttl.filter_expired's arguments)."""
    cdef c.FilterSpec spec
    if ttl_ms <= 0:
        raise InvalidInputError(f"TTL must be > 0 ms, got {ttl_ms}")
    if kind in ("value", "reducing", "aggregating", "map"):
        # A map state's entry is one user value with its own timestamp (docs/formats.md
        # "Map state"): filtered as a value.
        spec.layout = c.Layout.Value
    elif kind == "list":
        spec.layout = c.Layout.List
        spec.fixed_width = fixed_width or 0
    else:
        raise InvalidInputError(f"no TTL filter for state kind {kind!r}")
    spec.ttl_ms = ttl_ms
    return spec
