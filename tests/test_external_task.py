"""The external-state task of the Spark operator (statecore.spark.external_task) run directly,
without Spark, against a real redis-server or PostgreSQL server and a real checkpoint
directory: which backend a task takes (its worker's, only at the committed epoch with the
committed writer; else a fresh one reading through), what it reports (a pending descriptor
without a data file), and that a failed task leaves nothing behind."""

import pyarrow as pa
import pytest

from statecore.checkpoint import CheckpointStore
from statecore.descriptors import ValueStateDescriptor
from statecore.external import commit_epoch, read_committed, wal_keys
from statecore.key_groups import key_group_range_for_operator, spark_key_group
from statecore.spark import KeyedProcessor
from statecore.spark.external_task import (
    cached_external_backends,
    clear_external_backends,
    run_external,
)
from statecore.spark.task import TaskSpec
from support.postgres_server import postgres_server  # noqa: F401  (fixture)
from support.redis_server import redis_server  # noqa: F401  (fixture)

MAXP = 32
N = 2
NS = "tests/task"
OUT = pa.schema([("k", pa.int64()), ("count", pa.int64())])


class Count(KeyedProcessor):
    output_schema = OUT

    def __init__(self, fail=False):
        self.fail = fail

    def open(self, ctx):
        self.count = ctx.backend.get_state(ValueStateDescriptor("count", "int64", default=0))

    def process_batch(self, batch, ctx):
        keys = batch.column("k")
        new = [(c or 0) + 1 for c in self.count.get_batch(keys).to_pylist()]
        self.count.put_batch(keys, pa.array(new, pa.int64()))
        if self.fail:
            raise RuntimeError("processor failed")
        yield pa.RecordBatch.from_arrays([keys, pa.array(new, pa.int64())], schema=OUT)


def _produce(proc):
    def produce(ctx, inputs, seen, chunked):
        for b in inputs:
            seen["rows"] += b.num_rows
            yield from proc.process_batch(b, ctx)
    return produce


def _keys(partition, count):
    r = key_group_range_for_operator(MAXP, N, partition)
    out, k = [], 0
    while len(out) < count:
        if spark_key_group(k, "int64", MAXP) in r:
            out.append(k)
        k += 1
    return out


def _run(tmp_path, server, version, prev_writers, keys, attempt=None, fail=False):
    proc = Count(fail)
    spec = TaskSpec(
        operator_name="counts", store_uri=str(tmp_path / "ckpt"), processor=proc,
        backend_kind="python", key_type="int64", key_column="k", event_time_column=None,
        max_parallelism=MAXP, num_partitions=N, batch_id=version,
        prev_version=version - 1 if version else None, prev_attempt=None,
        attempt=attempt or f"a{version}", watermark_ms=None, is_flush=False,
        output_schema=OUT, prev_writers=prev_writers, state_store=server.url,
        state_namespace=NS)
    batch = pa.RecordBatch.from_arrays([pa.array(keys, pa.int64())], names=["k"])
    out = list(run_external(spec, 0, iter([batch]), 0.0, 0, _produce(proc)))
    store = CheckpointStore(str(tmp_path / "ckpt"))
    (desc,) = [d for d in store.pending(version)
               if d["spark_report"]["attempt"] == spec.attempt]
    # The report alone: no data file, nothing else in the checkpoint.
    assert set(desc) == {"version", "writer", "spark_report"}
    assert not list((tmp_path / "ckpt").rglob("*.sckp"))
    return out, desc["spark_report"]


def _counts(server):
    c = read_committed(server.url, NS, "count")
    return dict(zip(c.table.column("key").to_pylist(), c.table.column("value").to_pylist()))


@pytest.fixture(params=["redis", "postgres"])
def server(request):
    return request.getfixturevalue(f"{request.param}_server")


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_external_backends()
    yield
    clear_external_backends()


def test_worker_backend_is_reused_only_at_the_committed_epoch(tmp_path, server):
    keys = _keys(0, 6)
    out, r0 = _run(tmp_path, server, 0, None, keys)
    assert r0["load"] == "external" and r0["wal"].endswith(":wal:0:p0of2")
    assert out[0].column("count").to_pylist() == [1] * 6
    assert commit_epoch(server.url, NS, 0, [r0["wal"]])
    assert _counts(server) == {k: 1 for k in keys}
    # The driver committed this writer's epoch 0: the next task takes the worker's backend.
    out, r1 = _run(tmp_path, server, 1, frozenset({r0["writer"]}), keys[:3])
    assert r1["load"] == "cache" and cached_external_backends() == 1
    assert out[0].column("count").to_pylist() == [2] * 3
    commit_epoch(server.url, NS, 1, [r1["wal"]])
    # Another writer's epoch was committed (a duplicate attempt elsewhere): a fresh backend
    # reads the committed state through.
    out, r2 = _run(tmp_path, server, 2, frozenset({"p0-other-t0"}), keys)
    assert r2["load"] == "external"
    assert out[0].column("count").to_pylist() == [3, 3, 3, 2, 2, 2]
    # Epoch 2 is never committed (the micro-batch failed); its replay must not build on it.
    out, r2b = _run(tmp_path, server, 2, frozenset({r1["writer"]}), keys, attempt="b2")
    assert r2b["load"] == "external"
    assert out[0].column("count").to_pylist() == [3, 3, 3, 2, 2, 2]
    assert wal_keys(server.url, NS, 2) == [r2b["wal"]]
    commit_epoch(server.url, NS, 2, [r2b["wal"]])
    assert _counts(server) == dict(zip(keys, [3, 3, 3, 2, 2, 2]))


def test_a_failed_task_drops_its_backend(tmp_path, server):
    keys = _keys(0, 4)
    _, r0 = _run(tmp_path, server, 0, None, keys)
    commit_epoch(server.url, NS, 0, [r0["wal"]])
    assert cached_external_backends() == 1
    with pytest.raises(RuntimeError, match="processor failed"):
        _run(tmp_path, server, 1, frozenset({r0["writer"]}), keys, fail=True)
    # Nothing pre-committed, the worker's backend (holding the failed writes) is gone.
    assert wal_keys(server.url, NS, 1) == [] and cached_external_backends() == 0
    _, r1 = _run(tmp_path, server, 1, frozenset({r0["writer"]}), keys)
    assert r1["load"] == "external"
