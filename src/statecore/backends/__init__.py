"""Keyed state backends: ``create_backend("python" | "native" | "redis" | "postgres",
**options)``."""

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
    assigner, timer_namespace_type, ttl_clock (see KeyedStateBackend); ``"native"`` with
    ``memory_budget`` (and ``checkpoint``, ``cache_bytes``) is the tiered mode, state larger
    than memory over a checkpoint store's runs (statecore.backends.tiered.TieredBackend,
    docs/tiered.md). ``"redis"``: external
    state in Redis (statecore.external.RedisBackend; ``url`` and ``namespace`` options, needs
    the ``redis`` extra). ``"postgres"``: external state in PostgreSQL
    (statecore.external.PostgresBackend; ``url`` and ``namespace`` options, needs the
    ``postgres`` extra). Raises InvalidInputError for an unknown kind.
    """
    if kind == "python":
        from statecore.backends.python import PythonBackend

        return PythonBackend(**options)
    if kind == "native" and "memory_budget" in options:
        from statecore.backends.tiered import TieredBackend

        return TieredBackend(**options)
    if kind == "native":
        from statecore.backends.native import NativeBackend

        return NativeBackend(**options)
    if kind == "redis":
        from statecore.external.redis_backend import RedisBackend

        return RedisBackend(**options)
    if kind == "postgres":
        from statecore.external.postgres_backend import PostgresBackend

        return PostgresBackend(**options)
    raise InvalidInputError(
        f"unknown backend kind {kind!r}; expected 'python', 'native', 'redis' or 'postgres'")
