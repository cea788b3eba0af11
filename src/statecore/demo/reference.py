"""Spark SQL batch queries that define what the streaming flights job must produce.

They read the landed Parquet files as one batch and aggregate with Spark's own operators, so
they are an independent oracle for the statecore operators: the sessions must equal
``groupBy(tailnum, session_window(event_time, gap))`` row for row, and the last statistics
emitted per route must equal ``groupBy(origin, dest)`` over the route's last activity period.

Activity periods (the idle TTL of :mod:`statecore.demo.processors`) depend on which micro-batch
each row arrived in, because event-time TTL runs on the watermark. The queries take that from
Spark's own record: the file source's log and the offset log in the streaming checkpoint
(:func:`batch_plan`), or an explicit ``{file name: batch id}`` mapping. For one operator and
key they model:

* the watermark of micro-batch ``b`` = the largest event time of the operator's rows in
  micro-batches before ``b`` (none for the first);
* a key's state written in micro-batch ``b`` is stamped with ``b``'s watermark; writes before
  the first watermark are stamped with the first watermark (the backend's re-stamp);
* the key's next micro-batch ``c`` starts a new period when ``stamp + ttl <= watermark(c)``;
  the period's ``active_since`` is the key's smallest event time in the micro-batch that
  started it.

Without a TTL a key has one period, from its first event.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Mapping, Optional

__all__ = ["batch_plan", "reference_sessions", "reference_routes", "final_route_stats",
           "read_sessions"]


def _source_log(spark_checkpoint: str) -> Dict[str, int]:
    """``{file name: file-source log id}`` from ``<spark_checkpoint>/sources/0/`` (files ``N``
    and ``N.compact``: a ``v1`` line then one JSON object per file with ``path`` and
    ``batchId``, the id of the source's own log entry)."""
    log_dir = os.path.join(spark_checkpoint, "sources", "0")
    names = [n for n in os.listdir(log_dir) if not n.startswith(".")]
    if not names:
        raise FileNotFoundError(f"no file-source log entries in {log_dir}")
    ids: Dict[str, int] = {}
    for name in names:
        with open(os.path.join(log_dir, name), encoding="utf-8") as f:
            lines = f.read().splitlines()
        for line in lines[1:]:  # the first line is the log format version
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                ids[entry["path"].rstrip("/").rsplit("/", 1)[-1]] = int(entry["batchId"])
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ValueError(f"{os.path.join(log_dir, name)}: bad entry {line!r}") from exc
    return ids


def _source_end_offsets(spark_checkpoint: str) -> Dict[int, int]:
    """``{micro-batch id: end offset of source 0}`` from the offset log
    ``<spark_checkpoint>/offsets/`` (one file per batch id: a ``v1`` line, the batch's metadata
    line, then one line per source; the file source's is ``{"logOffset": N}``)."""
    off_dir = os.path.join(spark_checkpoint, "offsets")
    ends: Dict[int, int] = {}
    for name in os.listdir(off_dir):
        if not name.isdigit():
            continue
        path = os.path.join(off_dir, name)
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        try:
            ends[int(name)] = int(json.loads(lines[2])["logOffset"])
        except (IndexError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: no file-source offset on its third line") from exc
    if not ends:
        raise FileNotFoundError(f"no offset log entries in {off_dir}")
    return ends


def batch_plan(spark_checkpoint: str) -> Dict[str, int]:
    """``{file name: micro-batch id}`` of the first file source of a Structured Streaming query,
    from its checkpoint: the source's log (``sources/0/``) gives each file's source log id, the
    offset log (``offsets/N``) each micro-batch's end offset, and micro-batch ``N`` reads the
    source log ids in ``(end(N-1), end(N)]`` (Spark's ``FileStreamSource.getBatch``).

    The two ids usually agree, but not always: a driver that dies after the source logged its
    next files and before the offset log recorded the batch leaves a source log entry that the
    restarted query reads together with the next one, in one micro-batch. Files logged by the
    source but in no micro-batch yet are left out.

    Raises FileNotFoundError when either log is missing or empty and ValueError for an entry
    that does not parse or a source log id before the oldest offset the log still holds."""
    ids = _source_log(spark_checkpoint)
    ends = _source_end_offsets(spark_checkpoint)
    batches = sorted(ends)
    first = batches[0]
    floor = -1 if first == 0 else None  # the start of the oldest batch still in the log
    plan: Dict[str, int] = {}
    for name, sid in ids.items():
        batch = next((b for b in batches if sid <= ends[b]), None)
        if batch is None:
            continue  # logged by the source, not yet in a micro-batch
        if batch == first and (floor is None or sid <= floor):
            raise ValueError(
                f"{spark_checkpoint}: file {name} (source log id {sid}) belongs to a "
                f"micro-batch before {first}, which the offset log no longer holds")
        plan[name] = batch
    return plan


def _with_batches(spark, df, plan: Mapping[str, int]):
    """``df`` (read from Parquet files) with ``_batch``: the micro-batch of its row's file.
    Raises ValueError when a file is not in ``plan``."""
    from pyspark.sql import functions as F

    plan_df = spark.createDataFrame(sorted(plan.items()), "_file string, _batch long")
    out = df.withColumn("_file", F.col("_metadata.file_name")).join(
        F.broadcast(plan_df), "_file", "left")
    missing = out.where(F.col("_batch").isNull()).select("_file").distinct().limit(5).collect()
    if missing:
        raise ValueError(f"files not in the batch plan: {[r[0] for r in missing]}")
    return out.drop("_file")


def _periods(spark, rows, keys: List[str], idle_ttl_ms: Optional[int],
             plan: Optional[Mapping[str, int]]):
    """``rows`` with ``_period`` (1, 2, ... per key) and ``_since`` (ms): the activity period
    each row's micro-batch belongs to (module docstring). Needs ``plan`` with a TTL."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    t = F.unix_millis("event_time")
    if idle_ttl_ms is None:
        first = rows.groupBy(*keys).agg(F.min(t).alias("_since"))
        return rows.join(first, keys).withColumn("_period", F.lit(1))
    if plan is None:
        raise ValueError("an idle TTL needs the micro-batch plan (batch_plan)")
    rows = _with_batches(spark, rows, plan)
    upto = Window.orderBy("_batch").rowsBetween(Window.unboundedPreceding, -1)
    wm = (rows.groupBy("_batch").agg(F.max(t).alias("_max"))
          .withColumn("_wm", F.max("_max").over(upto)).drop("_max"))
    first_wm = wm.agg(F.min("_wm")).first()[0]
    per_key = Window.partitionBy(*keys).orderBy("_batch")
    stamp = F.coalesce(F.col("_wm"), F.lit(first_wm).cast("long"))
    prev = F.lag("_stamp").over(per_key)
    kb = (rows.groupBy(*keys, "_batch").agg(F.min(t).alias("_first"))
          .join(wm, "_batch").withColumn("_stamp", stamp))
    new = prev.isNull() | (F.col("_wm").isNotNull() & (prev + F.lit(idle_ttl_ms) <= F.col("_wm")))
    kb = kb.withColumn("_new", new.cast("int")).withColumn(
        "_period", F.sum("_new").over(per_key.rowsBetween(Window.unboundedPreceding, 0)))
    starts = kb.where("_new = 1").select(*keys, "_period", F.col("_first").alias("_since"))
    kb = kb.select(*keys, "_batch", "_period").join(starts, keys + ["_period"])
    return rows.join(kb, keys + ["_batch"]).drop("_batch")


def reference_sessions(spark, landing_path: str, gap_ms: int, idle_ttl_ms: Optional[int] = None,
                       plan: Optional[Mapping[str, int]] = None):
    """DataFrame(tailnum, session_start, session_end, flights, cancelled, dep_delay_minutes,
    active_since, session_number) from ``session_window(event_time, '<gap_ms/1000> seconds')``
    over rows with a tailnum. ``dep_delay_minutes`` is 0 for a session without any known delay
    (as the operator). A session belongs to the activity period of its first row; sessions are
    numbered by start within their period. ``idle_ttl_ms``: the aircraft state's TTL (None =
    none); ``plan``: ``{file name: batch id}`` (:func:`batch_plan`), needed with a TTL.
    Raises ValueError for a gap that is not whole seconds or a TTL without a plan."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if gap_ms % 1000:
        raise ValueError("the reference query needs a gap of whole seconds")
    df = spark.read.parquet(landing_path).where(F.col("tailnum").isNotNull())
    df = _periods(spark, df, ["tailnum"], idle_ttl_ms, plan)
    w = F.session_window("event_time", f"{gap_ms // 1000} seconds")
    sessions = df.groupBy("tailnum", w.alias("w")).agg(
        F.count(F.lit(1)).alias("flights"),
        F.sum(F.when(F.col("dep_time").isNull(), 1).otherwise(0)).cast("bigint").alias("cancelled"),
        F.coalesce(F.sum(F.col("dep_delay").cast("bigint")), F.lit(0)).cast("bigint")
            .alias("dep_delay_minutes"),
        F.min_by("_period", "event_time").alias("_period"),
        F.min_by("_since", "event_time").alias("_since"),
    )
    number = F.row_number().over(Window.partitionBy("tailnum", "_period").orderBy("w.start"))
    return sessions.select(
        "tailnum", F.col("w.start").alias("session_start"), F.col("w.end").alias("session_end"),
        "flights", "cancelled", "dep_delay_minutes",
        F.timestamp_millis("_since").alias("active_since"),
        number.cast("bigint").alias("session_number"))


def reference_routes(spark, landing_path: str, idle_ttl_ms: Optional[int] = None,
                     plan: Optional[Mapping[str, int]] = None):
    """DataFrame(origin, dest, active_since, flights, arr_delay_count, arr_delay_sum,
    arr_delay_max) over the rows of each route's last activity period; ``arr_delay_sum`` is 0
    and ``arr_delay_max`` null for a period without arrival delays. ``idle_ttl_ms`` / ``plan``
    as in :func:`reference_sessions`."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    d = F.col("arr_delay").cast("bigint")
    df = _periods(spark, spark.read.parquet(landing_path), ["origin", "dest"], idle_ttl_ms, plan)
    last = F.max("_period").over(Window.partitionBy("origin", "dest"))
    df = df.withColumn("_last", last).where(F.col("_period") == F.col("_last"))
    return df.groupBy("origin", "dest").agg(
        F.timestamp_millis(F.min("_since")).alias("active_since"),
        F.count(F.lit(1)).alias("flights"),
        F.count(d).alias("arr_delay_count"),
        F.coalesce(F.sum(d), F.lit(0)).cast("bigint").alias("arr_delay_sum"),
        F.max(d).alias("arr_delay_max"),
    )


def read_sessions(spark, output_path: str):
    """The job's emitted sessions (all micro-batches and the final flush), without ``batch_id``."""
    return spark.read.parquet(f"{output_path.rstrip('/')}/sessions").drop("batch_id")


def final_route_stats(spark, output_path: str):
    """The last row emitted per route (highest ``batch_id``) by the job, without ``batch_id``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = spark.read.parquet(f"{output_path.rstrip('/')}/route_delays")
    w = Window.partitionBy("origin", "dest").orderBy(F.col("batch_id").desc())
    return df.withColumn("_rn", F.row_number().over(w)).where("_rn = 1").drop("_rn", "batch_id")
