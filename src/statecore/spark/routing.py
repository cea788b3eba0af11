"""Key-group routing expressed as Spark SQL columns (no Python pass over the rows).

For a key column ``k``, ``max_parallelism`` maxP and ``n`` partitions:

* key group ``kg = pmod(xxhash64(k), maxP)`` — Spark's XXH64 (seed 42), bit-identical to
  :func:`statecore.key_groups.spark_key_group`, so a backend created with ``assigner="spark"``
  puts every routed key into a key group of its own range;
* operator index ``op = (kg * n) div maxP`` — Flink ``computeOperatorIndexForKeyGroup``;
* ``DataFrame.repartitionById(n, op)`` sends each row to partition ``op`` (Spark >= 4.1), and
  partition ``i`` owns ``key_group_range_for_operator(maxP, n, i)`` (Flink's contiguous ranges).
"""

from __future__ import annotations

from statecore.errors import InvalidInputError
from statecore.key_groups import check_max_parallelism

__all__ = [
    "KEY_GROUP_COLUMN",
    "OPERATOR_INDEX_COLUMN",
    "CONTROL_COLUMN",
    "key_group_column",
    "operator_index_column",
    "backend_key_type",
]

#: Internal columns added by the operator; dropped before the processor sees a batch.
KEY_GROUP_COLUMN = "__statecore_kg"
OPERATOR_INDEX_COLUMN = "__statecore_op"
CONTROL_COLUMN = "__statecore_ctl"


def key_group_column(key_column, max_parallelism: int):
    """Spark Column ``pmod(xxhash64(key_column), maxP)`` (bigint in ``[0, maxP)``).

    ``key_column``: a column name or Column. Raises InvalidInputError for a bad max parallelism.
    """
    from pyspark.sql import functions as F

    mp = check_max_parallelism(max_parallelism)
    col = F.col(key_column) if isinstance(key_column, str) else key_column
    return F.pmod(F.xxhash64(col), F.lit(mp).cast("bigint"))


def operator_index_column(key_group_column_name: str, parallelism: int, max_parallelism: int):
    """Spark Column ``CAST((kg * n) div maxP AS INT)`` — the partition owning key group ``kg``.

    ``key_group_column_name`` names a bigint column holding the key group. Integer ``div`` (not
    ``/``) keeps the arithmetic exact; ``repartitionById`` needs an int (not bigint) column, hence
    the cast. Raises InvalidInputError unless ``0 < parallelism <= max_parallelism``.
    """
    from pyspark.sql import functions as F

    mp = check_max_parallelism(max_parallelism)
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or not 0 < parallelism <= mp:
        raise InvalidInputError(
            f"parallelism must be an int in [1, max_parallelism={mp}], got {parallelism!r}"
        )
    name = key_group_column_name.replace("`", "``")
    return F.expr(f"CAST((`{name}` * {int(parallelism)}) div {mp} AS INT)")


_SPARK_TO_KEY_TYPE = {
    "StringType": "string",
    "LongType": "int64",
    "IntegerType": "int32",
    "BinaryType": "binary",
}


def backend_key_type(spark_type) -> str:
    """Map a Spark SQL key column type to a statecore key type.

    string -> ``"string"``, bigint -> ``"int64"``, int -> ``"int32"``, binary -> ``"binary"``;
    these are exactly the types whose ``xxhash64`` encoding the ``spark`` assigner reproduces.
    Raises InvalidInputError for any other type (e.g. smallint, double, timestamp, struct).
    """
    name = type(spark_type).__name__
    try:
        return _SPARK_TO_KEY_TYPE[name]
    except KeyError:
        raise InvalidInputError(
            f"unsupported key column type {spark_type.simpleString()}; statecore keys must be "
            "string, bigint, int or binary (cast the key or derive a string key column)"
        ) from None
