"""Keyed state backends: ``create_backend("python" | "native", **options)``."""

from statecore.backends.base import (  # noqa: F401
    AggregatingState,
    KeyedStateBackend,
    ListState,
    MapState,
    ReducingState,
    StateSnapshot,
    ValueState,
)
from statecore.errors import InvalidInputError

__all__ = ["create_backend", "KeyedStateBackend", "StateSnapshot", "ValueState", "ListState",
           "MapState", "ReducingState", "AggregatingState"]


def create_backend(kind: str = "native", **options) -> KeyedStateBackend:
    """Create a keyed state backend.

    ``kind``: ``"python"`` (PythonBackend, the pure-Python reference) or ``"native"``
    (NativeBackend over the C++ engine; imported lazily so the Python backend works without the
    extension). ``options`` go to the backend: key_type, max_parallelism, key_group_range,
    assigner, timer_namespace_type, ttl_clock (see KeyedStateBackend). Raises InvalidInputError for
    an unknown kind.
    """
    if kind == "python":
        from statecore.backends.python import PythonBackend

        return PythonBackend(**options)
    if kind == "native":
        from statecore.backends.native import NativeBackend

        return NativeBackend(**options)
    raise InvalidInputError(f"unknown backend kind {kind!r}; expected 'python' or 'native'")
