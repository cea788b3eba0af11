"""statecore: native-accelerated keyed state for stateful stream processing in Python on Spark.

Flink's heap-state ideas (key groups, a copy-on-write incrementally rehashing state map,
key-group partitioned checkpoints) in C++, behind two interchangeable backends:
``create_backend("native")`` (the C++ engine) and ``create_backend("python")`` (plain dicts, the
reference). See docs/architecture.md.
"""

from statecore.backends import create_backend
from statecore.backends.base import (
    AggregatingState,
    KeyedStateBackend,
    ListState,
    MapState,
    ReducingState,
    StateSnapshot,
    ValueState,
)
from statecore.checkpoint import CheckpointStore
from statecore.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import (
    CheckpointError,
    CheckpointIOError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    InvalidInputError,
    StateError,
    StateMigrationError,
)
from statecore.key_groups import (
    KeyGroupRange,
    compute_default_max_parallelism,
    key_group_range_for_operator,
    operator_index_for_key_group,
)
from statecore.ttl import StateTtlConfig, StateVisibility, UpdateType

__version__ = "0.1.0"

__all__ = [
    "create_backend", "KeyedStateBackend", "StateSnapshot", "ValueState", "ListState", "MapState",
    "ReducingState", "AggregatingState", "CheckpointStore", "AggregateFunction",
    "AggregatingStateDescriptor", "ListStateDescriptor", "MapStateDescriptor",
    "ReducingStateDescriptor", "ValueStateDescriptor", "CheckpointError", "CheckpointIOError",
    "CheckpointNotFoundError",
    "CorruptCheckpointError", "InvalidInputError", "StateError", "StateMigrationError",
    "KeyGroupRange", "compute_default_max_parallelism", "key_group_range_for_operator",
    "operator_index_for_key_group", "StateTtlConfig", "StateVisibility", "UpdateType",
]
