"""``spark.read.format("statecore")``: the state of a statecore checkpoint as a DataFrame.

A PySpark Python Data Source (``pyspark.sql.datasource``) over :mod:`statecore.offline`, the
counterpart of Spark's ``statestore`` source for statecore checkpoints. Register it once per
session (:func:`register`), then::

    spark.read.format("statecore")
        .option("path", checkpoint)           # StatefulOperator's checkpoint argument
        .option("operatorName", "sessions")   # its name (omit when path is the operator's root)
        .option("stateName", "session")
        .option("batchId", 41)                # default: the latest committed version
        .load()

Options (named after Spark's ``statestore`` source where they mean the same):

* ``path`` (required): a checkpoint root (the directory or URI holding ``manifest-*.json``),
  or, with ``operatorName``, the directory above the operators' roots.
* ``operatorName``: the operator's name (its root is ``path/operatorName``).
* ``stateName`` (required): the state to read (a descriptor's name).
* ``batchId``: the Spark batch id whose committed version to read (the newest retained version
  that micro-batch produced); ``version``: a checkpoint version instead; default the latest.
* ``readChangeFeed`` (``true``/``false``): the changes each version made instead of the state:
  one row per changed entry and version, ``change_type`` "update" or "delete", ``batch_id``
  (null for a flush) and ``version``; ``changeStartBatchId`` (required with it) and
  ``changeEndBatchId`` (default: the latest) bound the micro-batches, inclusive; every version
  in between must be retained.
* ``numPartitions``: Spark partitions to read with (default: the checkpoint's parallelism, at
  most the key groups); each reads a contiguous key-group range.

Columns: ``key_group`` (int), ``key``, ``namespace`` (only for states with a namespace),
``user_key`` (map user keys; a list element's position in its list as a long), ``value`` (the pickle
bytes for ``pickle`` values), ``ttl_timestamp_ms`` (long, null without TTL); see
:func:`statecore.offline.state_schema`. Rows come in key-group order within a partition.
Errors (a missing option, an unknown state or batch id, a version not retained) are raised on
the driver when the DataFrame is created, as InvalidInputError or CheckpointNotFoundError.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator, List, Optional

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from statecore.checkpoint import CheckpointStore
from statecore.checkpoint.layout import is_uri
from statecore.errors import CheckpointNotFoundError, InvalidInputError
from statecore.offline import change_schema, read_changes, read_state, state_schema
from statecore.spark.operator import operator_root

__all__ = ["StateDataSource", "register"]


def register(spark) -> None:
    """Register ``format("statecore")`` with the SparkSession ``spark`` (classic or Connect)."""
    spark.dataSource.register(StateDataSource)


def _flag(options, name: str) -> bool:
    v = str(options.get(name, "false")).strip().lower()
    if v not in ("true", "false"):
        raise InvalidInputError(f"option {name} must be true or false, got {v!r}")
    return v == "true"


def _int_option(options, name: str) -> Optional[int]:
    v = options.get(name)
    if v is None:
        return None
    try:
        return int(str(v).strip())
    except ValueError:
        raise InvalidInputError(f"option {name} must be an integer, got {v!r}") from None


def _version_of_batch(store: CheckpointStore, batch_id: int) -> int:
    """The newest retained version that micro-batch ``batch_id`` produced."""
    for v in reversed(store.versions()):
        if store.metadata(v).get("batch_id") == batch_id:
            return v
    raise CheckpointNotFoundError(
        f"no retained version of {store.uri} was produced by batch id {batch_id} "
        f"(retained versions {store.versions()[-5:]}...)")


@dataclass(frozen=True)
class _Plan:
    """What the driver resolved from the options; pickled to the tasks."""

    root: str
    state_name: str
    versions: tuple          # the version read, or the versions whose changes are read
    change_feed: bool
    batch_ids: tuple         # batch id per version of ``versions`` (change feed)
    key_groups: tuple        # (start, end) of the versions' key-group range
    partitions: int
    arrow_schema: pa.Schema


def _plan(options) -> _Plan:
    path = options.get("path")
    if not path:
        raise InvalidInputError("format('statecore') needs option path (the checkpoint)")
    state_name = options.get("stateName")
    if not state_name:
        raise InvalidInputError("format('statecore') needs option stateName")
    op = options.get("operatorName")
    if op:
        root = operator_root(path, op)  # where StatefulOperator(op, checkpoint=path) keeps it
    else:
        root = path if is_uri(path) else os.path.abspath(path)
    store = CheckpointStore(root)
    versions = store.versions()
    if not versions:
        raise CheckpointNotFoundError(f"no committed checkpoint under {root}")
    change_feed = _flag(options, "readChangeFeed")
    if change_feed:
        start = _int_option(options, "changeStartBatchId")
        if start is None:
            raise InvalidInputError("readChangeFeed needs option changeStartBatchId")
        end = _int_option(options, "changeEndBatchId")
        first = _version_of_batch(store, start)
        last = versions[-1] if end is None else _version_of_batch(store, end)
        if last < first:
            raise InvalidInputError(f"changeEndBatchId {end} is before changeStartBatchId {start}")
        chosen = tuple(range(first, last + 1))
        missing = [v for v in (first - 1,) + chosen if v >= 0 and v not in versions]
        if missing:
            raise CheckpointNotFoundError(
                f"the change feed of versions {first}..{last} needs versions {missing} of "
                f"{root}, which are not retained")
        batch_ids = tuple(store.metadata(v).get("batch_id") for v in chosen)
    else:
        version = _int_option(options, "version")
        batch_id = _int_option(options, "batchId")
        if version is not None and batch_id is not None:
            raise InvalidInputError("give option batchId or version, not both")
        if batch_id is not None:
            version = _version_of_batch(store, batch_id)
        chosen = (versions[-1] if version is None else version,)
        batch_ids = ()
    manifest = store.manifest(chosen[-1])
    metas = {m["name"]: m for m in manifest["states"]}
    if state_name not in metas:
        raise InvalidInputError(f"checkpoint version {chosen[-1]} of {root} has no state "
                                f"{state_name!r} (states: {sorted(metas)})")
    meta = metas[state_name]
    schema = (change_schema(meta, manifest["key_type"]) if change_feed
              else state_schema(meta, manifest["key_type"]))
    if change_feed:
        schema = schema.insert(1, pa.field("batch_id", pa.int64())).insert(
            2, pa.field("version", pa.int64()))
    schema = _spark_arrow_schema(schema)
    lo, hi = manifest["key_group_range"]
    n = _int_option(options, "numPartitions")
    if n is None:
        n = int(manifest["metadata"].get("num_partitions") or 1)
    if n < 1:
        raise InvalidInputError(f"option numPartitions must be >= 1, got {n}")
    return _Plan(root, state_name, chosen, change_feed, batch_ids, (lo, hi),
                 min(n, hi - lo + 1), schema)


def _spark_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """The readers' schema as Spark takes it: null-typed columns dropped (no namespace, no user
    key), a list element's position (uint64) as int64."""
    fields = []
    for f in schema:
        if pa.types.is_null(f.type):
            continue
        fields.append(f.with_type(pa.int64()) if f.type == pa.uint64() else f)
    return pa.schema(fields)


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [batch.column(f.name).cast(f.type) for f in schema], schema=schema)


class _KeyGroups(InputPartition):
    def __init__(self, start: int, end: int):
        super().__init__((start, end))
        self.start, self.end = start, end


class _Reader(DataSourceReader):
    def __init__(self, plan: _Plan):
        self.plan = plan

    def partitions(self) -> List[_KeyGroups]:
        lo, hi = self.plan.key_groups
        n = self.plan.partitions
        total = hi - lo + 1
        bounds = [lo + (total * i) // n for i in range(n + 1)]
        return [_KeyGroups(bounds[i], bounds[i + 1] - 1) for i in range(n)]

    def read(self, partition: _KeyGroups) -> Iterator[pa.RecordBatch]:
        p, kgs = self.plan, (partition.start, partition.end)
        if not p.change_feed:
            for b in read_state(p.root, p.state_name, p.versions[0], key_group_range=kgs):
                yield _conform(b, p.arrow_schema)
            return
        for v, batch_id in zip(p.versions, p.batch_ids):
            if v == 0:  # nothing before the first version: each of its entries is an update
                batches = (b.add_column(0, "change_type", pa.array(["update"] * b.num_rows))
                           for b in read_state(p.root, p.state_name, v, key_group_range=kgs))
            else:
                batches = read_changes(p.root, p.state_name, v - 1, v, key_group_range=kgs)
            for b in batches:
                n = b.num_rows
                b = b.append_column("batch_id", pa.array([batch_id] * n, pa.int64()))
                b = b.append_column("version", pa.array([v] * n, pa.int64()))
                yield _conform(b, p.arrow_schema)


class StateDataSource(DataSource):
    """The ``statecore`` data source (module docstring: options, columns, errors)."""

    def __init__(self, options):
        super().__init__(options)
        self._plan = _plan(options)

    @classmethod
    def name(cls) -> str:
        return "statecore"

    def schema(self):
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(self._plan.arrow_schema)

    def reader(self, schema) -> _Reader:
        return _Reader(self._plan)
