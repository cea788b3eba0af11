"""statecore's benchmark harness, run from a checkout's root with statecore installed::

    python -m bench [--quick] [--case NAME ...] [--json FILE] [--plot FILE] [--list]

Not part of the statecore wheel. Modules:

* :mod:`bench.harness` -- the case registry (:func:`~bench.harness.case`),
  :class:`~bench.harness.Size`, records and timing: what a case module imports.
* :mod:`bench.runner` -- loading and running cases, writing records as JSON.
* :mod:`bench.plots` -- the PNG bar chart of a run.
* :mod:`bench.cli` -- the ``python -m bench`` command.
* :mod:`bench.common`, :mod:`bench.workloads`, :mod:`bench.compare` -- helpers the cases share
  (native detection and memory probes; generated keys and batches; timing peers against each
  other and their ratio and goal records).
* :mod:`bench.cpp_reference` -- the C++ hash map reference (``cpp/hashmap_ref.cpp``).
* Case modules: :mod:`bench.state_ops`, :mod:`bench.snapshots`, :mod:`bench.ttl`,
  :mod:`bench.ttl_cleanup`, :mod:`bench.peers`, :mod:`bench.collection_states`,
  :mod:`bench.windows`, :mod:`bench.spark_e2e`, :mod:`bench.spark_external`.

This package imports none of its modules: importing a case module registers its cases
(:func:`bench.runner.load_cases` imports them all).
"""
