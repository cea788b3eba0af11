"""Backend conformance suite: every keyed state backend must pass it.

Subclass :class:`BackendConformance` in a test module and implement ``make_backend(**options)``
(options as ``statecore.create_backend``); ``make_reference_backend`` defaults to the
PythonBackend, the oracle the differential tests (``test_differential_*``) compare against, byte
for byte on snapshots. Example::

    class TestPythonBackend(BackendConformance):
        def make_backend(self, **kw):
            return PythonBackend(**kw)

The tests live in one mixin per topic (modules of :mod:`statecore.testing`, each a subclass of
:class:`statecore.testing.base.ConformanceBase`); the helpers they share are public in
:mod:`statecore.testing.helpers` and re-exported here for existing imports.
"""

from __future__ import annotations

from statecore.testing.arrow_inputs import ArrowInputConformance
from statecore.testing.batches import BatchConformance
from statecore.testing.checkpointing import CheckpointingConformance
from statecore.testing.collection_batches import CollectionBatchConformance
from statecore.testing.collection_reads import CollectionReadConformance
from statecore.testing.collection_state import CollectionStateConformance
from statecore.testing.current_key import CurrentKeyConformance
from statecore.testing.differential import DifferentialConformance
from statecore.testing.enumeration import KeyEnumerationConformance
from statecore.testing.helpers import (
    AverageAggregate,
    TamperedSnapshot,
    merge_incremental,
    snapshot_dump,
)
from statecore.testing.incremental import IncrementalSnapshotConformance
from statecore.testing.key_types import KeyTypeConformance
from statecore.testing.lifecycle import LifecycleConformance
from statecore.testing.merging import MergingConformance
from statecore.testing.namespace_batches import NamespaceBatchConformance
from statecore.testing.namespaces import NamespaceConformance
from statecore.testing.operator_state import OperatorStateConformance
from statecore.testing.reducing import ReducingConformance
from statecore.testing.snapshots import SnapshotConformance
from statecore.testing.timers import TimerConformance
from statecore.testing.ttl_state import TtlConformance
from statecore.testing.value_state import ValueStateConformance
from statecore.testing.value_types import ValueTypeConformance

__all__ = ["BackendConformance", "snapshot_dump", "merge_incremental", "AverageAggregate",
           "TamperedSnapshot"]


# pytest collects inherited tests base by base in reverse MRO order, so the bases are listed
# last topic first: the tests run in the order of the list read from the bottom up.
class BackendConformance(
    DifferentialConformance,
    OperatorStateConformance,
    CheckpointingConformance,
    KeyEnumerationConformance,
    IncrementalSnapshotConformance,
    CurrentKeyConformance,
    LifecycleConformance,
    SnapshotConformance,
    TimerConformance,
    ArrowInputConformance,
    BatchConformance,
    MergingConformance,
    NamespaceConformance,
    ReducingConformance,
    CollectionStateConformance,
    ValueStateConformance,
    KeyTypeConformance,
    ValueTypeConformance,
    CollectionBatchConformance,
    NamespaceBatchConformance,
    CollectionReadConformance,
    TtlConformance,
):
    """Pytest base class of a backend's conformance tests; see the module docstring.

    Topics, each a mixin in its own module of :mod:`statecore.testing`: collection batch reads
    (``collection_reads``), namespaced batches (``namespace_batches``), collection batch writes
    (``collection_batches``), value types (``value_types``), key types and current-key
    validation (``key_types``), value state (``value_state``), list and map state
    (``collection_state``), reducing and aggregating state (``reducing``), namespaces and state
    registration (``namespaces``), namespace merging for merging windows (``merging``:
    ``merge_namespaces``), the batch API (``batches``), Arrow input forms
    (``arrow_inputs``), timers (``timers``), snapshots and restores (``snapshots``), closing
    (``lifecycle``), current key and namespace caching (``current_key``), incremental snapshots
    (``incremental``), TTL rules (``ttl_state``), one-call checkpoints (``checkpointing``),
    key enumeration (``enumeration``: ``keys``, ``apply_to_all_keys``), operator state
    (``operator_state``: list, union list and broadcast state, their snapshots and
    redistribution) and random differential runs (``differential``).
    """
