"""State as data, outside a running job: the state of a checkpoint version as Arrow record
batches (:func:`read_state`, Flink's State Processor API reader, Spark's ``statestore`` source)
and the changes between two versions (:func:`read_changes`, the ``statestore`` change feed); the
operator state each old task held (:func:`read_operator_state`); a
version rewritten for another max parallelism (:func:`rewrite_max_parallelism`); version 0 of a
new checkpoint written from Arrow data, initial state for a job (:func:`bootstrap_checkpoint`)."""

from statecore.offline.bootstrap import StateInput, bootstrap_checkpoint
from statecore.offline.change_feed import change_schema, read_changes
from statecore.offline.entries import state_schema
from statecore.offline.operator_reader import operator_state_schema, read_operator_state
from statecore.offline.rewrite import rewrite_max_parallelism
from statecore.offline.state_reader import read_state

__all__ = ["read_state", "read_changes", "read_operator_state", "state_schema", "change_schema",
           "operator_state_schema",
           "rewrite_max_parallelism", "bootstrap_checkpoint", "StateInput"]
