"""Test support shipped with statecore: the backend conformance suite.

:mod:`.conformance` holds :class:`~statecore.testing.conformance.BackendConformance`, the class a
backend's test module subclasses; it is composed of one mixin per topic (``value_state``,
``collection_state``, ``reducing``, ``namespaces``, ``key_types``, ``value_types``, ``batches``,
``collection_batches``, ``collection_reads``, ``namespace_batches``, ``arrow_inputs``,
``timers``, ``snapshots``, ``incremental``, ``current_key``, ``lifecycle``, ``differential``),
each deriving from :class:`~statecore.testing.base.ConformanceBase` (the backend factories).
Helpers the topics share are public in :mod:`.helpers`.
"""
