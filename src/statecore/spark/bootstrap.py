"""Start an operator from state a batch query computed: version 0 of its checkpoint written
from Spark DataFrames (:meth:`statecore.spark.StatefulOperator.bootstrap`).

Spark's ``transformWithState`` and ``flatMapGroupsWithState`` take an ``initialState`` dataset,
Flink's State Processor API writes a savepoint from a batch job; this writes the operator's
checkpoint directly, in parallel. The rows of every state (and the timers) become one DataFrame
(``unionByName``, each state's columns under its own names, a ``__statecore_state`` index
column), routed exactly as micro-batches are: ``repartitionById(n, op)`` with ``op`` computed
from Spark's ``xxhash64`` of the key columns (:mod:`statecore.spark.routing`). Task ``i`` of
``mapInArrow`` gets the rows of the key groups of operator index ``i``, encodes them
(:class:`statecore.offline.bootstrap.BootstrapPlan`, the rules of
:mod:`statecore.offline.bootstrap`) and writes its full runs of version 0; it returns their
descriptors to the driver, which commits them with the operator's metadata. A task holds its
partition's input rows in memory (Arrow), as a micro-batch's task holds its input, plus the
encoded entries of one pass (``memory_bytes``).

The version is committed as a non-final flush without a query id (``flush`` True, ``final``
False, ``batch_id`` None, ``batch_offset`` 0). By the rules of :mod:`statecore.spark.versions`
the next micro-batch ``b`` of any query, a new Spark checkpoint's batch 0 as well as a later
batch of a query that ran before, then opens a new stream at version 1 (``batch_offset = 1 -
b``), and ``flush(final=False)`` right after the bootstrap is a no-op. Its watermark (the
``watermark`` argument) is the one the first micro-batch gets.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Dict, Iterator, List, Optional, Sequence

import pyarrow as pa

from statecore.errors import InvalidInputError, StateError
from statecore.key_groups import key_group_range_for_operator
from statecore.offline.bootstrap import (
    DEFAULT_MEMORY_BYTES,
    BootstrapPlan,
    StateInput,
    check_empty,
    state_input,
)

__all__ = ["bootstrap_operator", "STATE_INDEX_COLUMN"]

#: The union's column naming each row's state (its index; the timers' is the number of states).
STATE_INDEX_COLUMN = "__statecore_state"

_STATE_FIELDS = ("namespace", "user_key", "value", "ttl_timestamp_ms")
_TIMER_FIELDS = ("namespace", "timestamp_ms", "processing_time")
_RESULT_SCHEMA = pa.schema([("partition", pa.int32()), ("descriptors", pa.string())])


def _column_name(index: int, field: str) -> str:
    return f"__statecore_s{index}_{field}"


def _as_dataframe(spark, data, what: str):
    """A Spark DataFrame of ``data`` (a DataFrame, or a pyarrow Table made one)."""
    if isinstance(data, pa.Table):
        return spark.createDataFrame(data)
    if hasattr(data, "sparkSession") and hasattr(data, "schema"):
        return data
    raise InvalidInputError(f"{what}: data must be a Spark DataFrame or a pyarrow Table, got "
                            f"{type(data).__name__}")


class BootstrapTask:
    """The ``mapInArrow`` function of a bootstrap (module docstring): partition ``i`` splits its
    rows by state, writes its key groups' runs of version 0 to ``store_uri`` and yields one row
    (``partition``, ``descriptors`` as JSON)."""

    def __init__(self, plan: BootstrapPlan, has_timers: bool, store_uri: str,
                 key_columns: Sequence[str], num_partitions: int, attempt: str,
                 memory_bytes: int):
        self.plan = plan
        self.has_timers = has_timers
        self.store_uri = store_uri
        self.key_columns = tuple(key_columns)
        self.num_partitions = num_partitions
        self.attempt = attempt
        self.memory_bytes = memory_bytes

    def _key(self, t: pa.Table) -> pa.Array:
        if len(self.key_columns) == 1:
            return t.column(self.key_columns[0]).combine_chunks()
        cols = [t.column(c).combine_chunks() for c in self.key_columns]
        return pa.StructArray.from_arrays(cols, names=[f"f{i}" for i in range(len(cols))])

    def _part(self, t: pa.Table, index: int, fields: Sequence[str]) -> pa.Table:
        """The rows of state ``index`` with its columns under their own names."""
        import pyarrow.compute as pc

        rows = t.filter(pc.equal(t.column(STATE_INDEX_COLUMN), index))
        cols = {"key": self._key(rows)}
        for f in fields:
            name = _column_name(index, f)
            if name in t.column_names:
                cols[f] = rows.column(name)
        return pa.table(cols)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        from statecore.checkpoint import CheckpointStore

        tc = TaskContext.get()
        if tc is None:
            raise StateError("the bootstrap's task runs only inside a Spark task")
        i = int(tc.partitionId())
        batches = list(batches)
        t = pa.Table.from_batches(batches) if batches else None
        base = self.plan

        def rows(index: int, fields: Sequence[str]):
            # An empty partition (Spark runs every partition of the shuffle) has no batches.
            return (lambda: []) if t is None else self._part(t, index, fields)

        states = [StateInput(inp.descriptor, rows(j, _STATE_FIELDS), inp.namespace_type)
                  for j, inp in enumerate(base.inputs)]
        plan = BootstrapPlan(states, key_type=base.key_type,
                             max_parallelism=base.max_parallelism,
                             timers=rows(len(states), _TIMER_FIELDS) if self.has_timers else None,
                             timer_namespace_type=base.timer_ns_type, assigner=base.assigner,
                             now_ms=base.wall_ms if base.now_ms is None else base.now_ms,
                             watermark_ms=base.watermark_ms)
        kgr = key_group_range_for_operator(plan.max_parallelism, self.num_partitions, i)
        writer = f"bootstrap-p{i}-{self.attempt}-t{tc.attemptNumber()}-{uuid.uuid4().hex[:8]}"
        descriptors = plan.write_runs(CheckpointStore(self.store_uri), kgr.start, kgr.end,
                                      writer, memory_bytes=self.memory_bytes, strict=True)
        yield pa.RecordBatch.from_arrays(
            [pa.array([i], pa.int32()), pa.array([json.dumps(descriptors)], pa.string())],
            schema=_RESULT_SCHEMA)


def bootstrap_operator(op, spark, states: Sequence, *, metadata: Dict[str, Any], timers=None,
                       timer_namespace_type: str = "void", watermark_ms: Optional[int] = None,
                       now_ms: Optional[int] = None,
                       memory_bytes: int = DEFAULT_MEMORY_BYTES) -> dict:
    """Write version 0 of operator ``op``'s empty checkpoint from ``states`` (and ``timers``)
    and commit it with ``metadata`` (the operator's fields) added to the bootstrap's
    (:meth:`statecore.offline.bootstrap.BootstrapPlan.metadata`); returns the committed
    manifest. Arguments and errors: :meth:`statecore.spark.StatefulOperator.bootstrap`."""
    from pyspark.sql import functions as F

    from statecore.spark.routing import backend_key_type, operator_index_of

    store = op.store
    check_empty(store, f"operator {op.name}")
    inputs = [state_input(s) for s in states]
    frames = []
    key_type = None
    for j, inp in enumerate(inputs + ([StateInput(None, timers)] if timers is not None else [])):
        what = "timers" if inp.descriptor is None else f"state {inp.descriptor.name!r}"
        df = _as_dataframe(spark, inp.data, what)
        names = df.schema.fieldNames()
        if all(c in names for c in op.key_columns):
            keys = [F.col(c).alias(c) for c in op.key_columns]
        elif "key" in names and len(op.key_columns) == 1:
            keys = [F.col("key").alias(op.key_columns[0])]
        elif "key" in names:
            fields = df.schema["key"].dataType.fieldNames() \
                if type(df.schema["key"].dataType).__name__ == "StructType" else []
            if len(fields) != len(op.key_columns):
                raise InvalidInputError(f"{what}: column 'key' must be a struct of the "
                                        f"{len(op.key_columns)} key columns {op.key_columns}")
            keys = [F.col("key").getField(f).alias(c) for f, c in zip(fields, op.key_columns)]
        else:
            raise InvalidInputError(f"{what}: needs the key column(s) {list(op.key_columns)} "
                                    f"or a 'key' column (columns: {names})")
        df = df.select(*keys, *[c for c in names if c not in op.key_columns and c != "key"])
        types = [backend_key_type(df.schema[c].dataType) for c in op.key_columns]
        kt = types[0] if len(types) == 1 else "struct<" + ",".join(types) + ">"
        if key_type not in (None, kt):
            raise InvalidInputError(f"{what}: key type {kt} differs from the other inputs' "
                                    f"{key_type}")
        key_type = kt
        allowed = _TIMER_FIELDS if inp.descriptor is None else _STATE_FIELDS
        extra = [c for c in df.schema.fieldNames()
                 if c not in op.key_columns and c not in allowed and c != "key_group"]
        if extra:
            raise InvalidInputError(f"{what}: unknown column(s) {extra}; expected the key "
                                    f"column(s) and some of {list(allowed)}")
        frames.append(df.select(
            *[F.col(c) for c in op.key_columns], F.lit(j).alias(STATE_INDEX_COLUMN),
            *[F.col(c).alias(_column_name(j, c)) for c in allowed if c in df.schema.fieldNames()]))
    if not frames:
        raise InvalidInputError(f"operator {op.name}: nothing to bootstrap (no states, no timers)")
    # The driver's plan checks the descriptors and arguments; the tasks' plans get the rows.
    plan = BootstrapPlan([StateInput(i.descriptor, None, i.namespace_type) for i in inputs],
                         key_type=key_type, max_parallelism=op.max_parallelism,
                         timer_namespace_type=timer_namespace_type, assigner="spark",
                         now_ms=now_ms, watermark_ms=watermark_ms)
    union = frames[0]
    for f in frames[1:]:
        union = union.unionByName(f, allowMissingColumns=True)
    n, mp = op.parallelism, op.max_parallelism
    attempt = uuid.uuid4().hex[:12]
    task = BootstrapTask(plan, timers is not None, op.store_uri, op.key_columns, n, attempt,
                         memory_bytes)
    routed = union.repartitionById(n, operator_index_of(op.key_columns, n, mp))
    rows = routed.mapInArrow(task, "partition int, descriptors string").collect()
    got = sorted(r["partition"] for r in rows)
    if got != list(range(n)):
        raise StateError(f"operator {op.name}: the bootstrap's tasks reported partitions {got}, "
                         f"not 0..{n - 1}; nothing is committed")
    descriptors: List[dict] = []
    for r in sorted(rows, key=lambda r: r["partition"]):
        descriptors.extend(json.loads(r["descriptors"]))
    extra = dict(metadata, key_type=key_type, attempt=attempt, num_partitions=n,
                 checkpoint_bytes=sum(int(d["size"]) for d in descriptors))
    check_empty(store, f"operator {op.name}")
    return store.commit(0, descriptors, plan.metadata(descriptors, extra))
