"""statecore for Spark Structured Streaming: a keyed, checkpointed, rescalable Python operator.

Usage (inside ``foreachBatch``)::

    from statecore.spark import KeyedProcessor, StatefulOperator

    op = StatefulOperator("sessions", MyProcessor(), key_column="user", checkpoint=ckpt,
                          output=out_dir, parallelism=4, max_parallelism=128,
                          backend="native", event_time_column="ts")
    stream.writeStream.foreachBatch(op).option("checkpointLocation", ckpt + "/spark").start()
    ...
    op.flush(spark)   # end of input: emit what is still open, exactly once

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
from statecore.spark.session import local_session

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
]
