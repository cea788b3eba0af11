"""State as data, outside a running job: read the state of a checkpoint version as Arrow
record batches (:func:`read_state`, Flink's State Processor API reader, Spark's ``statestore``
source)."""

from statecore.offline.state_reader import read_state, state_schema

__all__ = ["read_state", "state_schema"]
