"""Spark SQL ``xxhash64`` and ``pmod(xxhash64, 128)`` of key values of every statecore key type,
computed by a real Spark, written to ``tests/data/spark_key_types.json``.

    PYTHONPATH=src python tests/support/spark_key_type_vectors.py [out.json]

Each value is built inside Spark SQL from an exact text form (``CAST('<repr>' AS DOUBLE)``,
``timestamp_micros(...)``, ``unhex(...)``), so nothing is lost between Python and the JVM; the
column has the type the Spark operator would see for that key type (float64 -> DoubleType, bool
-> BooleanType, timestamp[us] -> TimestampType, fixed_size_binary -> BinaryType, uint64 -> the
bigint holding the same 64 bits). Multi-column keys: ``xxhash64(c1, c2, ...)`` and
``xxhash64(struct(c1, c2, ...))``. ``tests/test_spark_key_types.py`` (``-m spark``) recomputes
everything in Spark and compares it with this file and with both backends;
``tests/test_key_types.py`` checks the file without Spark.

JSON value forms: ints as ints, float64 as Python ``repr`` text (``"nan"``, ``"-0.0"``), binary
as hex, strings as text, timestamps as int64 microseconds; ``spark_text`` is how Spark shows the
value it hashed (``CAST(col AS STRING)``, ``hex(col)`` for binary), proof that the value
arrived intact (e.g. ``-0.0`` kept its sign).
"""

from __future__ import annotations

import json
import pathlib
import sys

OUT = pathlib.Path(__file__).parents[1] / "data" / "spark_key_types.json"

CASES = {
    "int32": [0, 1, -1, 2**31 - 1, -(2**31)],
    "int64": [0, 1, -1, 2**63 - 1, -(2**63)],
    "uint64": [0, 1, 2**63 - 1, 2**63, 2**64 - 1, 12345678901234567890],
    "float64": ["0.0", "-0.0", "nan", "inf", "-inf", "1.5", "-2.25", "1e-310", "5e-324",
                "1.7976931348623157e+308", "0.1"],
    "bool": [True, False],
    "timestamp[us]": [0, 1, -1, 1_600_000_000_123_456, -1_000_000, -62_135_596_800_000_000,
                      253_402_300_799_999_999],
    "string": ["", "a", "日本語", "😀emoji"],
    "binary": ["", "00", "ff00", "6b65792d31323334"],
    "fixed_size_binary[4]": ["00000000", "deadbeef", "ffffffff"],
    "fixed_size_binary[16]": ["0123456789abcdef0123456789abcdef", "00" * 16],
}

MULTI = [
    (["int32", "string"], [7, "a"]),  # spark_hashes.json "multi_column"
    (["float64", "bool"], ["-0.0", True]),
    (["float64", "bool"], ["0.0", True]),
    (["timestamp[us]", "binary", "int64"], [-1, "00ff", 2**63 - 1]),
    (["uint64", "fixed_size_binary[4]"], [2**64 - 1, "deadbeef"]),
    (["string", "float64", "timestamp[us]"], ["k", "nan", 0]),
    (["bool", "bool", "int32"], [False, True, -5]),
    (["string", "string"], ["ab", "c"]),
    (["string", "string"], ["a", "bc"]),
]


def _signed64(u: int) -> int:
    return u - (1 << 64) if u >= (1 << 63) else u


def spark_expr(key_type: str, v) -> str:
    """A Spark SQL expression producing value ``v`` (JSON form) with the key type's Spark type."""
    if key_type == "int32":
        return f"CAST({v} AS INT)"
    if key_type in ("int64", "uint64"):
        return f"CAST('{_signed64(v) if key_type == 'uint64' else v}' AS BIGINT)"
    if key_type == "float64":
        text = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(v, v)
        return f"CAST('{text}' AS DOUBLE)"
    if key_type == "bool":
        return "true" if v else "false"
    if key_type == "timestamp[us]":
        return f"timestamp_micros(CAST('{v}' AS BIGINT))"
    if key_type == "string":
        return f"CAST(unhex('{v.encode('utf-8').hex()}') AS STRING)"
    return f"unhex('{v}')"  # binary, fixed_size_binary


def compute(spark) -> dict:
    """Every vector computed by ``spark`` (one Spark job)."""
    cols, where = [], []
    for t, values in CASES.items():
        for i, v in enumerate(values):
            e = spark_expr(t, v)
            text = f"hex({e})" if "binary" in t else f"CAST({e} AS STRING)"
            cols += [f"xxhash64({e}) AS `{t}|{i}|x`", f"pmod(xxhash64({e}), 128) AS `{t}|{i}|p`",
                     f"{text} AS `{t}|{i}|s`"]
            if t == "uint64":
                d = f"CAST('{v}' AS DECIMAL(20,0))"
                cols.append(f"xxhash64({d}) AS `{t}|{i}|d`")
            where.append((t, i, v))
    for j, (types, values) in enumerate(MULTI):
        es = ", ".join(spark_expr(t, v) for t, v in zip(types, values))
        cols += [f"xxhash64({es}) AS `multi|{j}|x`", f"pmod(xxhash64({es}), 128) AS `multi|{j}|p`",
                 f"xxhash64(struct({es})) AS `multi|{j}|st`"]
    row = spark.range(1).selectExpr(*cols).collect()[0].asDict()
    out: dict = {"meta": {
        "spark_version": spark.version,
        "generator": "tests/support/spark_key_type_vectors.py",
        "what": "xxhash64 = Spark SQL xxhash64(col) (seed 42); pmod_xxhash64_128 = "
                "pmod(xxhash64(col), 128); spark_text = CAST(col AS STRING), hex(col) for binary",
        "spark_types": {"int32": "int", "int64": "bigint", "uint64": "bigint (same 64 bits)",
                        "float64": "double", "bool": "boolean", "timestamp[us]": "timestamp",
                        "string": "string", "binary": "binary",
                        "fixed_size_binary[N]": "binary"},
        "uint64_decimal20": "xxhash64 of the value as decimal(20,0) (how Spark reads Parquet "
                            "UINT_64): NOT statecore's uint64 hash, recorded to show the "
                            "difference",
    }}
    for t, i, v in where:
        rec = {"value": v, "xxhash64": row[f"{t}|{i}|x"], "pmod_xxhash64_128": row[f"{t}|{i}|p"],
               "spark_text": row[f"{t}|{i}|s"]}
        if t == "uint64":
            rec["xxhash64_decimal20"] = row[f"{t}|{i}|d"]
        out.setdefault(t, []).append(rec)
    out["multi_column"] = [
        {"types": types, "values": values, "xxhash64": row[f"multi|{j}|x"],
         "pmod_xxhash64_128": row[f"multi|{j}|p"], "struct_xxhash64": row[f"multi|{j}|st"]}
        for j, (types, values) in enumerate(MULTI)]
    return out


def main(argv) -> None:
    from statecore.spark.session import local_session

    out = pathlib.Path(argv[1]) if len(argv) > 1 else OUT
    spark = local_session("statecore-key-type-vectors", master="local[1]", shuffle_partitions=1)
    try:
        data = compute(spark)
    finally:
        spark.stop()
    out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv)
