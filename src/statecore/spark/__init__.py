"""statecore for Spark Structured Streaming: a keyed, checkpointed, rescalable Python operator.

Usage (inside ``foreachBatch``)::

    from statecore.spark import KeyedProcessor, StatefulOperator

    op = StatefulOperator("sessions", MyProcessor(), key_column="user", checkpoint=ckpt,
                          output=out_dir, parallelism=4, max_parallelism=128,
                          backend="native", event_time_column="ts")
    stream.writeStream.foreachBatch(op).option("checkpointLocation", ckpt + "/spark").start()
    ...
    op.flush(spark)   # end of input: emit what is still open, exactly once
    # (a scheduled run that more input follows: op.flush(spark, final=False))

Two operators on one micro-batch: ``start`` each (runs its sink's action, no commit), then
:func:`commit_batches` waits for all their checkpoint writes and commits them, so one operator's
writes overlap the other's job::

    def both(df, batch_id):
        commit_batches([sessions.start(df, batch_id), routes.start(df, batch_id)])

:func:`epoch_ms` turns a timestamp column of any unit (what a processor receives for a Spark
timestamp: ``timestamp[us]``) into int64 milliseconds, the unit of watermarks and timers.

:func:`register_state_source` adds ``spark.read.format("statecore")``: a checkpoint's state, or
its change feed, as a DataFrame.

Under Spark Connect (:func:`remote_session`) the ``foreachBatch`` function runs in a Python
process on the server and cannot read the running query's id: pass it to ``start``/``process``
as ``query_id=streaming_query_id(checkpoint_location)``.

pyspark is imported lazily; importing this package needs only pyarrow.
"""

from statecore.spark.operator import (
    BatchReport,
    PendingBatch,
    StatefulOperator,
    clear_state_cache,
    commit_batches,
    parquet_batch_sink,
)
from statecore.spark.processor import KeyedProcessor, ProcessorContext
from statecore.spark.session import (
    is_connect_session,
    local_session,
    quiet_query_end,
    remote_session,
)
from statecore.spark.versions import streaming_query_id
from statecore.timers import epoch_ms

__all__ = [
    "StatefulOperator",
    "KeyedProcessor",
    "ProcessorContext",
    "BatchReport",
    "PendingBatch",
    "commit_batches",
    "parquet_batch_sink",
    "clear_state_cache",
    "local_session",
    "remote_session",
    "is_connect_session",
    "quiet_query_end",
    "streaming_query_id",
    "epoch_ms",
    "register_state_source",
]


def register_state_source(spark) -> None:
    """Register ``spark.read.format("statecore")`` with ``spark`` (classic or Connect): the
    state of a statecore checkpoint as a DataFrame (:mod:`statecore.spark.state_source` has
    the options and columns)."""
    from statecore.spark.state_source import register

    register(spark)
