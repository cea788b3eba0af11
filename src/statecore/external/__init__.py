"""External keyed state: state whose committed copy lives in a store, committed exactly once
per epoch (docs/external-state.md).

* :class:`RedisBackend` -- a task's keyed state over Redis (``create_backend("redis", ...)``);
* :class:`PostgresBackend` -- over PostgreSQL (``create_backend("postgres", ...)``);
* :func:`commit_epoch`, :func:`abort_epoch`, :func:`wal_keys`, :func:`read_committed_epoch`
  -- the coordinator's steps;
* :func:`read_committed` -- committed state for services outside the job.

The functions take a URL or client of either store (:mod:`statecore.external.coordinator`).
Needs the ``redis`` client (``pip install 'statecore[redis]'``) or psycopg 3
(``pip install 'statecore[postgres]'``), imported on first use.
"""

from statecore.external.coordinator import (
    abort_epoch,
    commit_epoch,
    read_committed,
    read_committed_epoch,
    wal_keys,
)
from statecore.external.postgres_backend import PostgresBackend
from statecore.external.reader import CommittedState
from statecore.external.redis_backend import RedisBackend

__all__ = ["RedisBackend", "PostgresBackend", "commit_epoch", "abort_epoch", "wal_keys",
           "read_committed_epoch", "read_committed", "CommittedState"]
