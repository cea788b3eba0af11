"""The base every topic mixin of the conformance suite derives from: the backend factories a test
module implements and the ways the tests obtain backends from them."""

from __future__ import annotations

from statecore.testing.helpers import snapshot_dump

__all__ = ["ConformanceBase"]


class ConformanceBase:
    """Backend factories and reference comparison shared by the topic mixins.

    A test module implements :meth:`make_backend`; :meth:`make_reference_backend` defaults to
    the pure-Python backend, the oracle the differential tests compare against byte for byte on
    snapshots. Options are those of ``statecore.create_backend``.
    """

    def make_backend(self, **options):
        """A fresh backend under test for ``options``. Subclasses implement this."""
        raise NotImplementedError("subclasses return a fresh backend for these options")

    def make_reference_backend(self, **options):
        """A fresh reference backend (PythonBackend) for ``options``."""
        from statecore.backends.python import PythonBackend

        return PythonBackend(**options)

    def recover(self, backend, options: dict):
        """A new backend holding ``backend``'s state, recovered through the backend's own
        durability protocol instead of snapshots, or None (the default): the backend has none
        but snapshots. An external-state backend pre-commits and commits its state as an epoch
        and opens a new backend on its namespace; the differential tests then check that
        recovery where the others take incremental snapshots. ``options``: those ``backend``
        was made with."""
        return None

    def new_backend(self, **options):
        """:meth:`make_backend` with key type int64 and max parallelism 128 unless given."""
        options.setdefault("key_type", "int64")
        options.setdefault("max_parallelism", 128)
        return self.make_backend(**options)

    def backend_pair(self, **options):
        """``(backend under test, reference backend)`` for the same options (defaults as
        :meth:`new_backend`)."""
        options.setdefault("key_type", "int64")
        options.setdefault("max_parallelism", 128)
        return self.new_backend(**options), self.make_reference_backend(**options)

    def same_as_reference(self, program, **options):
        """Run ``program(backend)`` on a backend under test and on a reference backend built
        with the same options (defaults as :meth:`new_backend`); asserts that both return the
        same observations and hold the same snapshot bytes afterwards, and returns the
        observations."""
        options.setdefault("key_type", "int64")
        options.setdefault("max_parallelism", 128)
        runs = []
        for b in (self.make_backend(**options), self.make_reference_backend(**options)):
            seen = program(b)
            runs.append((seen, snapshot_dump(b.snapshot())))
        assert runs[0][0] == runs[1][0]
        assert runs[0][1] == runs[1][1]
        return runs[0][0]
