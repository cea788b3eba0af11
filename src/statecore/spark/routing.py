"""Key-group routing expressed as Spark SQL columns (no Python pass over the rows).

For a key column ``k``, ``max_parallelism`` maxP and ``n`` partitions:

* key group ``kg = pmod(xxhash64(k), maxP)`` — Spark's XXH64 (seed 42), bit-identical to
  :func:`statecore.key_groups.spark_key_group`, so a backend created with ``assigner="spark"``
  puts every routed key into a key group of its own range. That holds for every Spark column
  type :func:`backend_key_type` maps (int, bigint, double, boolean, timestamp, timestamp_ntz,
  string, binary, and structs of those = multi-column keys: Spark hashes ``struct(a, b)`` as
  ``xxhash64(a, b)``, which is how statecore hashes a multi-column key); several key columns
  can also be given directly (``xxhash64(a, b)``, the backend's key type is then the struct of
  their types). Checked against real Spark by tests/test_spark_key_types.py;
* operator index ``op = (kg * n) div maxP`` — Flink ``computeOperatorIndexForKeyGroup``;
* ``DataFrame.repartitionById(n, op)`` sends each row to partition ``op`` (Spark >= 4.1), and
  partition ``i`` owns ``key_group_range_for_operator(maxP, n, i)`` (Flink's contiguous ranges).
"""

from __future__ import annotations

from typing import Optional

from statecore.errors import InvalidInputError
from statecore.key_groups import check_max_parallelism

__all__ = [
    "KEY_GROUP_COLUMN",
    "OPERATOR_INDEX_COLUMN",
    "key_group_column",
    "operator_index_column",
    "operator_index_of",
    "backend_key_type",
    "uint64_as_bigint_column",
]

#: Internal columns added by the operator; dropped before the processor sees a batch.
KEY_GROUP_COLUMN = "__statecore_kg"
OPERATOR_INDEX_COLUMN = "__statecore_op"


def key_group_column(key_column, max_parallelism: int):
    """Spark Column ``pmod(xxhash64(key_column...), maxP)`` (bigint in ``[0, maxP)``).

    ``key_column``: a column name or Column, or a list/tuple of them for a multi-column key
    (hashed as Spark's chained ``xxhash64(c1, c2, ...)``, which equals statecore's hash of the
    struct key). Raises InvalidInputError for a bad max parallelism or an empty list.
    """
    from pyspark.sql import functions as F

    mp = check_max_parallelism(max_parallelism)
    cols = list(key_column) if isinstance(key_column, (list, tuple)) else [key_column]
    if not cols:
        raise InvalidInputError("key_group_column needs at least one key column")
    cols = [F.col(c) if isinstance(c, str) else c for c in cols]
    return F.pmod(F.xxhash64(*cols), F.lit(mp).cast("bigint"))


def uint64_as_bigint_column(column):
    """Spark Column: the bigint with the same 64 bits as the unsigned value of a decimal(20,0)
    column in ``[0, 2**64)`` (how Spark reads Parquet UINT_64). Spark has no unsigned type;
    statecore's ``uint64`` key type hashes as that bigint, so
    ``key_group_column(uint64_as_bigint_column(c), maxP)`` routes a ``uint64``-keyed backend's
    keys (the Python side then casts the decimal128(20,0) key array to uint64). Values outside
    the range give null (then rejected as null keys)."""
    from pyspark.sql import functions as F

    c = F.col(column) if isinstance(column, str) else column
    d = c.cast("decimal(20,0)")
    two63, two64 = (F.lit(str(2**k)).cast("decimal(21,0)") for k in (63, 64))  # > Java long
    ok = (d >= F.lit(0)) & (d < two64)
    return F.when(ok, F.when(d >= two63, d - two64).otherwise(d).cast("bigint"))


def operator_index_column(key_group_column_name: str, parallelism: int, max_parallelism: int):
    """Spark Column ``CAST((kg * n) div maxP AS INT)`` — the partition owning key group ``kg``.

    ``key_group_column_name`` names a bigint column holding the key group. Integer ``div`` (not
    ``/``) keeps the arithmetic exact; ``repartitionById`` needs an int (not bigint) column, hence
    the cast. Raises InvalidInputError unless ``0 < parallelism <= max_parallelism``.
    """
    from pyspark.sql import functions as F

    mp = check_max_parallelism(max_parallelism)
    if (isinstance(parallelism, bool) or not isinstance(parallelism, int)
            or not 0 < parallelism <= mp):
        raise InvalidInputError(
            f"parallelism must be an int in [1, max_parallelism={mp}], got {parallelism!r}"
        )
    name = key_group_column_name.replace("`", "``")
    return F.expr(f"CAST((`{name}` * {int(parallelism)}) div {mp} AS INT)")


def operator_index_of(key_column, parallelism: int, max_parallelism: int,
                      given: Optional[str] = None):
    """Spark Column ``CAST((pmod(xxhash64(key_column), maxP) * n) div maxP AS INT)``: the
    partition owning the row's key, in one expression over the (top-level) column
    ``key_column``, so routing needs no key-group column (one projection, and nothing more to
    shuffle or to ship to Python). ``key_column`` may also be a list/tuple of column names, a
    multi-column key hashed as ``xxhash64(c1, c2, ...)`` (equal to the hash of the struct of
    those columns, i.e. of the backend's ``struct<...>`` key). Same values as
    :func:`operator_index_column` over :func:`key_group_column`. With ``given`` (the name of an
    int column), the expression is
    ``coalesce(given, ...)``: rows that carry their index keep it (the operator's control rows),
    so a union of them with the data is routed by one ``repartitionById`` without a projection
    first. Raises InvalidInputError for a bad parallelism or column name."""
    mp = check_max_parallelism(max_parallelism)
    if (isinstance(parallelism, bool) or not isinstance(parallelism, int)
            or not 0 < parallelism <= mp):
        raise InvalidInputError(
            f"parallelism must be an int in [1, max_parallelism={mp}], got {parallelism!r}"
        )
    names = list(key_column) if isinstance(key_column, (list, tuple)) else [key_column]
    if not names or not all(isinstance(c, str) and c for c in names):
        raise InvalidInputError(
            f"key_column must be a column name or a non-empty list of them, got {key_column!r}")
    if given is not None and (not isinstance(given, str) or not given):
        raise InvalidInputError(f"given must be a column name, got {given!r}")
    from pyspark.sql import functions as F

    def quoted(name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    hashed = ", ".join(quoted(c) for c in names)
    sql = (f"CAST((pmod(xxhash64({hashed}), CAST({mp} AS BIGINT)) * "
           f"{int(parallelism)}) div {mp} AS INT)")
    return F.expr(sql if given is None else f"coalesce({quoted(given)}, {sql})")


_SPARK_TO_KEY_TYPE = {
    "StringType": "string",
    "LongType": "int64",
    "IntegerType": "int32",
    "BinaryType": "binary",
    "DoubleType": "float64",
    "BooleanType": "bool",
    "TimestampType": "timestamp[us]",
    "TimestampNTZType": "timestamp[us]",
}


def backend_key_type(spark_type) -> str:
    """Map a Spark SQL key column type to a statecore key type.

    string -> ``"string"``, bigint -> ``"int64"``, int -> ``"int32"``, binary -> ``"binary"``,
    double -> ``"float64"``, boolean -> ``"bool"``, timestamp and timestamp_ntz ->
    ``"timestamp[us]"`` (both hold microseconds), a struct of those -> ``"struct<...>"`` (a
    multi-column key); these are exactly the types whose ``xxhash64`` the ``spark`` assigner
    reproduces. Raises InvalidInputError for any other type (e.g. smallint, float, date,
    decimal, nested structs, arrays). Spark has no unsigned type, so it never yields ``uint64``
    (a Parquet UINT_64 column is decimal(20,0): see :func:`uint64_as_bigint_column`).
    """
    name = type(spark_type).__name__
    if name == "StructType":
        fields = [f.dataType for f in spark_type.fields]
        if fields and all(type(t).__name__ in _SPARK_TO_KEY_TYPE for t in fields):
            return "struct<" + ",".join(_SPARK_TO_KEY_TYPE[type(t).__name__] for t in fields) + ">"
    elif name in _SPARK_TO_KEY_TYPE:
        return _SPARK_TO_KEY_TYPE[name]
    raise InvalidInputError(
        f"unsupported key column type {spark_type.simpleString()}; statecore keys must be "
        "string, bigint, int, binary, double, boolean, timestamp, timestamp_ntz or a struct of "
        "those (cast the key or derive a key column)"
    )
