"""The coordinator's steps and the outside reader for either store, chosen by the URL or the
client passed: ``postgresql://`` / ``postgres://`` URLs and psycopg connections go to
PostgreSQL (:mod:`statecore.external.postgres_store`), everything else to Redis
(:mod:`statecore.external.store`). Arguments, results and errors are the same for both."""

from __future__ import annotations

from statecore.external import store as _redis
from statecore.external.reader import CommittedState
from statecore.external.reader import read_committed as _redis_read
from statecore.external.store import DEFAULT_TIMEOUT_S

__all__ = ["connect", "commit_epoch", "abort_epoch", "wal_keys", "read_committed_epoch",
           "read_committed"]


def _is_pg(url_or_client) -> bool:
    from statecore.external.postgres_store import is_postgres

    return is_postgres(url_or_client)


def connect(url: str, timeout_s: float = DEFAULT_TIMEOUT_S):
    """A client of the store ``url`` names, for the other functions here to share: a
    :class:`~statecore.external.postgres_store.PgConnection` for a PostgreSQL URL, else a
    ``redis.Redis`` (:func:`statecore.external.store.connect`); both connect at their first
    use. InvalidInputError for a malformed URL."""
    if _is_pg(url):
        from statecore.external import postgres_store

        return postgres_store.connect(url, timeout_s)
    return _redis.connect(url, timeout_s)


def commit_epoch(url_or_client, namespace: str, epoch: int, wal_key_names,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Commit ``epoch`` of ``namespace`` from the write-ahead logs ``wal_key_names`` (every
    task's ``pre_commit`` result): Redis :func:`statecore.external.store.commit_epoch`,
    PostgreSQL :func:`statecore.external.postgres_store.commit_epoch`. True when this call
    committed it, False when it was committed already."""
    if _is_pg(url_or_client):
        from statecore.external import postgres_store

        return postgres_store.commit_epoch(url_or_client, namespace, epoch, wal_key_names,
                                           timeout_s)
    return _redis.commit_epoch(url_or_client, namespace, epoch, wal_key_names, timeout_s)


def abort_epoch(url_or_client, namespace: str, epoch: int, wal_key_names=None,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Discard the logs of uncommitted ``epoch`` (default all of them); the number deleted,
    -1 when ``epoch`` is committed (either store's ``abort_epoch``)."""
    if _is_pg(url_or_client):
        from statecore.external import postgres_store

        return postgres_store.abort_epoch(url_or_client, namespace, epoch, wal_key_names,
                                          timeout_s)
    return _redis.abort_epoch(url_or_client, namespace, epoch, wal_key_names, timeout_s)


def wal_keys(url_or_client, namespace: str, epoch: int,
             timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """The names of the write-ahead logs of ``epoch`` present (either store's ``wal_keys``)."""
    if _is_pg(url_or_client):
        from statecore.external import postgres_store

        return postgres_store.wal_keys(url_or_client, namespace, epoch, timeout_s)
    return _redis.wal_keys(url_or_client, namespace, epoch, timeout_s)


def read_committed_epoch(url_or_client, namespace: str,
                         timeout_s: float = DEFAULT_TIMEOUT_S) -> int | None:
    """The committed epoch of ``namespace`` (None before the first commit, or for a namespace
    never opened), what a coordinator compares with its own record when it restarts (either
    store's ``read_committed_epoch``)."""
    if _is_pg(url_or_client):
        from statecore.external import postgres_store

        return postgres_store.read_committed_epoch(url_or_client, namespace, timeout_s)
    return _redis.read_committed_epoch(url_or_client, namespace, timeout_s)


def read_committed(url_or_client, namespace: str, state: str, key_group_range=None,
                   timeout_s: float = DEFAULT_TIMEOUT_S, now_ms: int | None = None
                   ) -> CommittedState:
    """The committed entries of ``state`` as of one committed epoch, without TTL values
    expired at ``now_ms`` (default the wall clock; required for event-time TTL)
    (:func:`statecore.external.reader.read_committed` for Redis,
    :func:`statecore.external.postgres_reader.read_committed_pg` for PostgreSQL)."""
    if _is_pg(url_or_client):
        from statecore.external.postgres_reader import read_committed_pg

        return read_committed_pg(url_or_client, namespace, state, key_group_range, timeout_s,
                                 now_ms)
    return _redis_read(url_or_client, namespace, state, key_group_range, timeout_s, now_ms)
