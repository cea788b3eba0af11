"""Spark SQL batch queries that define what the streaming flights job must produce.

They read the landed Parquet files as one batch and aggregate with Spark's own operators, so
they are an independent oracle for the statecore operators: the sessions must equal
``groupBy(tailnum, session_window(event_time, gap))`` row for row, and the last statistics
emitted per route must equal ``groupBy(origin, dest)``.
"""

from __future__ import annotations

__all__ = ["reference_sessions", "reference_routes", "final_route_stats", "read_sessions"]


def reference_sessions(spark, landing_path: str, gap_ms: int):
    """DataFrame(tailnum, session_start, session_end, flights, cancelled, dep_delay_minutes)
    from ``session_window(event_time, '<gap_ms/1000> seconds')`` over rows with a tailnum.
    ``dep_delay_minutes`` is 0 for a session without any known delay (as the operator)."""
    from pyspark.sql import functions as F

    if gap_ms % 1000:
        raise ValueError("the reference query needs a gap of whole seconds")
    df = spark.read.parquet(landing_path).where(F.col("tailnum").isNotNull())
    w = F.session_window("event_time", f"{gap_ms // 1000} seconds")
    return df.groupBy("tailnum", w.alias("w")).agg(
        F.count(F.lit(1)).alias("flights"),
        F.sum(F.when(F.col("dep_time").isNull(), 1).otherwise(0)).cast("bigint").alias("cancelled"),
        F.coalesce(F.sum(F.col("dep_delay").cast("bigint")), F.lit(0)).cast("bigint").alias("dep_delay_minutes"),
    ).select("tailnum", F.col("w.start").alias("session_start"), F.col("w.end").alias("session_end"),
             "flights", "cancelled", "dep_delay_minutes")


def reference_routes(spark, landing_path: str):
    """DataFrame(origin, dest, flights, arr_delay_count, arr_delay_sum, arr_delay_max) over all
    rows; ``arr_delay_sum`` is 0 and ``arr_delay_max`` null for a route without arrival delays."""
    from pyspark.sql import functions as F

    d = F.col("arr_delay").cast("bigint")
    return spark.read.parquet(landing_path).groupBy("origin", "dest").agg(
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
