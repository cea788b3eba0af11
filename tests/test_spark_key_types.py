"""Every key type against a real local Spark: Spark SQL ``xxhash64`` / ``pmod(xxhash64, 128)``
of values of each type (-0.0, NaN, +-inf, int extremes, empty binary, pre-1970 timestamps,
multi-column keys) equal both backends' key groups, per record and through the batch kernels;
the stored vectors (tests/data/spark_key_types.json) are what Spark computes; the routing
columns of statecore.spark.routing compute the same key groups for every key column type the
operator accepts."""

import json
import pathlib

import pyarrow as pa
import pytest

from statecore import ValueStateDescriptor, create_backend
from statecore import key_types as KT
from statecore.errors import InvalidInputError
from statecore.key_groups import normalize_key_type, spark_key_group
from support import spark_key_type_vectors as V

pytestmark = pytest.mark.spark

STORED = json.loads((pathlib.Path(__file__).parent / "data" / "spark_key_types.json").read_text())


@pytest.fixture(scope="module")
def computed(spark):
    return V.compute(spark)


def _value(t, v):
    if t == "float64":
        return float(v)
    if "binary" in t:
        return bytes.fromhex(v)
    return v


def _cases(vectors):
    for t, recs in vectors.items():
        if t in ("meta", "multi_column"):
            continue
        for r in recs:
            yield normalize_key_type(t), _value(t, r["value"]), r["pmod_xxhash64_128"]
    for r in vectors["multi_column"]:
        yield (normalize_key_type(tuple(r["types"])),
               tuple(_value(t, v) for t, v in zip(r["types"], r["values"])), r["pmod_xxhash64_128"])


def _key_array(key_type, key):
    kt = KT.key_type(key_type)
    if kt.is_struct:
        return [pa.array([x], f.arrow_type) for f, x in zip(kt.fields, key)]
    return pa.array([key], kt.arrow_type)


def test_stored_vectors_are_what_spark_computes(computed):
    for name, recs in STORED.items():
        if name != "meta":
            assert computed[name] == recs, name
    for r in computed["float64"]:  # the values reached Spark intact
        assert r["spark_text"] == {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(
            r["value"], r["spark_text"])
    assert next(r for r in computed["float64"] if r["value"] == "-0.0")["spark_text"] == "-0.0"


@pytest.mark.parametrize("kind", ["python", "native"])
def test_backends_assign_sparks_key_groups(computed, kind):
    if kind == "native":
        pytest.importorskip("statecore._native")
    n = 0
    for key_type, key, kg in _cases(computed):
        b = create_backend(kind, key_type=key_type, max_parallelism=128)
        assert b.key_group_of(key) == kg, (key_type, key)
        # The batch path (the native kernel hashes the Arrow buffers) must agree: a backend owning
        # only key group kg takes the row, one owning every other key group rejects it.
        own = create_backend(kind, key_type=key_type, max_parallelism=128, key_group_range=(kg, kg))
        st = own.get_state(ValueStateDescriptor("v", "int64"))
        st.put_batch(_key_array(key_type, key), pa.array([n], pa.int64()))
        own.set_current_key(key)
        assert st.value() == n
        other = create_backend(kind, key_type=key_type, max_parallelism=128,
                               key_group_range=(0, kg - 1) if kg else (1, 127))
        with pytest.raises(InvalidInputError, match="key group"):
            other.get_state(ValueStateDescriptor("v", "int64")).put_batch(
                _key_array(key_type, key), pa.array([n], pa.int64()))
        n += 1
    assert n == sum(len(v) for k, v in computed.items() if k != "meta")


def test_routing_columns_for_every_key_column_type(spark):
    from pyspark.sql import functions as F

    from statecore.spark.routing import backend_key_type, key_group_column, uint64_as_bigint_column

    df = spark.sql("""
        SELECT x AS d, j > 0 AS b, timestamp_micros(j * 1000003) AS ts,
               CAST(timestamp_micros(j * 7) AS TIMESTAMP_NTZ) AS ntz,
               unhex(hex(j)) AS bin, CAST(j AS INT) AS i, CAST(x AS STRING) AS s
        FROM VALUES (0.0D, 0L), (-0.0D, -1L), (1.5D, 1L), (-7.0D, -7000000L),
                    (CAST('NaN' AS DOUBLE), 2147483647L),
                    (CAST('Infinity' AS DOUBLE), -2147483648L),
                    (-1e300D, 123L), (123456789.0D, 99999L) AS t(x, j)""")
    df = df.select("*", F.struct("s", "d", "b").alias("st"))
    key_types = {c: backend_key_type(df.schema[c].dataType) for c in df.columns}
    assert key_types == {"d": "float64", "b": "bool", "ts": "timestamp[us]", "ntz": "timestamp[us]",
                         "bin": "binary", "i": "int32", "s": "string",
                         "st": "struct<string,float64,bool>"}
    cols = [key_group_column(c, 128).alias(f"kg_{c}") for c in df.columns]
    cols.append(key_group_column(["i", "ts", "bin"], 128).alias("kg_multi"))
    rows = df.select("*", *cols).collect()
    for row in rows:
        for c, t in key_types.items():
            key = row[c]
            if t == "timestamp[us]":
                key = KT.key_type(t).check(key)  # datetime -> micros (naive = UTC; session UTC)
            elif t.startswith("struct"):
                key = tuple(key)
            assert row[f"kg_{c}"] == spark_key_group(key, t, 128), (c, row[c])
        multi = (row["i"], KT.key_type("timestamp").check(row["ts"]), row["bin"])
        assert row["kg_multi"] == spark_key_group(multi, ("int32", "timestamp", "binary"), 128)
    # uint64 keys of a decimal(20,0) column (Parquet UINT_64) route as the same-bits bigint.
    values = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, 12345678901234567890]
    dec = spark.createDataFrame([(str(v),) for v in values], "v string").select(
        F.col("v").cast("decimal(20,0)").alias("u"))
    got = dec.select(key_group_column(uint64_as_bigint_column("u"), 128).alias("kg"), "u").collect()
    assert [r.kg for r in got] == [spark_key_group(v, "uint64", 128) for v in values]
    with pytest.raises(InvalidInputError, match="unsupported key column type"):
        backend_key_type(dec.schema["u"].dataType)


# ------------------------------------------------------------------ the operator, end to end

from statecore import ReducingStateDescriptor  # noqa: E402
from statecore.spark import KeyedProcessor, StatefulOperator  # noqa: E402

COUNT_SCHEMA = pa.schema([("s", pa.string()), ("d", pa.float64()), ("ts", pa.int64()),
                          ("n", pa.int64())])


class CountPerStructKey(KeyedProcessor):
    """Running row count per multi-column key (a struct column: string, double, timestamp),
    through the batch API (the native add_batch kernel reads the struct array)."""

    output_schema = COUNT_SCHEMA

    def open(self, ctx):
        self.n = ctx.backend.get_state(ReducingStateDescriptor("n", "sum", "int64"))

    def process_batch(self, batch, ctx):
        keys = batch.column(ctx.key_column)
        counts = self.n.add_batch(keys, pa.array([1] * len(keys), pa.int64()))
        ts = keys.field(2).cast(pa.int64())
        yield pa.RecordBatch.from_arrays([keys.field(0), keys.field(1), ts, counts],
                                         schema=COUNT_SCHEMA)


@pytest.mark.parametrize("kind", ["python", "native"])
def test_operator_with_a_struct_key_column(spark, tmp_path, kind):
    """A struct key column (string, double with -0.0 and NaN, timestamp) through routing,
    rescaling (2 -> 3 partitions) and restore: every count comes out as a plain model says."""
    import sys

    import pyarrow.parquet as pq
    from pyspark import cloudpickle
    from pyspark.sql import functions as F

    if kind == "native":
        pytest.importorskip("statecore._native")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    op = StatefulOperator("structkeys", CountPerStructKey(), "k", str(tmp_path / "ckpt"),
                          output=str(tmp_path / "out"), parallelism=2, max_parallelism=128,
                          backend=kind)
    ds = [0.0, -0.0, 1.5, float("nan"), -2.25]
    rows = [[(f"s{i % 3}", ds[i % 5], i % 4) for i in range(40)],
            [(f"s{i % 2}", ds[(i + 1) % 5], i % 3) for i in range(30)]]
    model = {}
    for batch_id, (part, parallelism) in enumerate(zip(rows, (2, 3))):
        op.parallelism = parallelism
        df = spark.createDataFrame(part, "s string, d double, u bigint").select(
            F.struct("s", "d", F.timestamp_micros("u").alias("ts")).alias("k"))
        op(df, batch_id)
        for s, d, u in part:
            key = KT.key_type("struct<string,float64,timestamp[us]>").check((s, d, u))
            model[key] = model.get(key, 0) + 1
        out = pq.read_table(str(tmp_path / "out" / f"batch_id={batch_id}")).to_pylist()
        got = {}
        for r in out:
            key = KT.key_type("struct<string,float64,timestamp[us]>").check(
                (r["s"], r["d"], r["ts"]))
            got[key] = max(got.get(key, 0), r["n"])
        touched = {KT.key_type("struct<string,float64,timestamp[us]>").check(t) for t in part}
        assert _canon(got) == _canon({k: model[k] for k in touched}), batch_id


def _canon(d: dict) -> dict:
    return {tuple("NaN" if isinstance(x, float) and x != x else x for x in k): v
            for k, v in d.items()}


TOTALS_SCHEMA = pa.schema([("Country", pa.string()), ("StockCode", pa.int64()),
                           ("n", pa.int64()), ("q", pa.int64())])


class TotalsPerCountryAndStock(KeyedProcessor):
    """Running row count and quantity per (Country, StockCode), the key given as two ordinary
    columns: the batch holds them as plain columns and ``ctx.keys`` gives the key array."""

    output_schema = TOTALS_SCHEMA

    def open(self, ctx):
        self.n = ctx.backend.get_state(ReducingStateDescriptor("n", "sum", "int64"))
        self.q = ctx.backend.get_state(ReducingStateDescriptor("q", "sum", "int64"))

    def process_batch(self, batch, ctx):
        assert ctx.key_columns == ("Country", "StockCode")
        assert batch.schema.field("Country").type == pa.string()  # no struct column
        keys = ctx.keys(batch)
        n = self.n.add_batch(keys, pa.array([1] * len(keys), pa.int64()))
        q = self.q.add_batch(keys, batch.column("Quantity").cast(pa.int64()))
        # Per-row state through the single-key API too: the key is the tuple of the columns.
        c, s = batch.column("Country")[0].as_py(), batch.column("StockCode")[0].as_py()
        ctx.backend.set_current_key((c, s))
        assert self.n.get() >= 1
        yield pa.RecordBatch.from_arrays([batch.column("Country"), batch.column("StockCode"),
                                          n, q], schema=TOTALS_SCHEMA)


@pytest.mark.parametrize("kind", ["python", "native"])
def test_operator_with_a_list_of_key_columns(spark, tmp_path, kind):
    """``key_column=["Country", "StockCode"]`` as groupBy takes it: after each micro-batch
    (rescaling 2 -> 3 partitions between them) the totals of every key touched equal Spark
    SQL's ``groupBy("Country", "StockCode")`` over all rows so far; the end-of-input flush
    (control rows with two null key columns) runs; null keys are refused."""
    import sys

    import pyarrow.parquet as pq
    from pyspark import cloudpickle
    from pyspark.sql import functions as F

    if kind == "native":
        pytest.importorskip("statecore._native")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    op = StatefulOperator("totals", TotalsPerCountryAndStock(), ["Country", "StockCode"],
                          str(tmp_path / "ckpt"), output=str(tmp_path / "out"), parallelism=2,
                          max_parallelism=128, backend=kind)
    assert op.key_columns == ("Country", "StockCode")
    countries = ["France", "Germany", "United Kingdom", "EIRE"]
    batches = [[(countries[i % 4], 20000 + i % 7, i % 5 - 1) for i in range(60)],
               [(countries[i % 3], 20000 + i % 5, 2 * i) for i in range(45)]]
    schema = "Country string, StockCode bigint, Quantity int"
    seen = []
    for batch_id, (rows, parallelism) in enumerate(zip(batches, (2, 3))):
        op.parallelism = parallelism
        op(spark.createDataFrame(rows, schema), batch_id)
        seen += rows
        oracle = (spark.createDataFrame(seen, schema).groupBy("Country", "StockCode")
                  .agg(F.count("*").alias("n"), F.sum("Quantity").alias("q")).collect())
        touched = {(c, s) for c, s, _ in rows}
        expected = {(r.Country, r.StockCode): (r.n, r.q) for r in oracle
                    if (r.Country, r.StockCode) in touched}
        got = {}
        for r in pq.read_table(str(tmp_path / "out" / f"batch_id={batch_id}")).to_pylist():
            key = (r["Country"], r["StockCode"])
            if r["n"] > got.get(key, (0, 0))[0]:
                got[key] = (r["n"], r["q"])
        assert got == expected, batch_id
    assert op.store.metadata(1)["key_type"] == "struct<string,int64>"
    assert op.flush(spark).final
    null_key = StatefulOperator("nulls", TotalsPerCountryAndStock(), ["Country", "StockCode"],
                                str(tmp_path / "ckpt"), output=str(tmp_path / "out2"),
                                backend=kind)
    with pytest.raises(Exception, match="null key"):
        null_key(spark.createDataFrame([("France", None, 1)], schema), 0)
    with pytest.raises(InvalidInputError, match="twice"):
        StatefulOperator("x", TotalsPerCountryAndStock(), ["Country", "Country"],
                         str(tmp_path / "ckpt"), output=str(tmp_path / "out3"), backend=kind)
