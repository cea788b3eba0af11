"""External keyed state: state whose committed copy lives in a key-value store, committed
exactly once per epoch through per-task write-ahead logs (docs/external-state.md).

* :class:`RedisBackend` -- a task's keyed state over Redis (``create_backend("redis", ...)``);
* :func:`commit_epoch`, :func:`abort_epoch`, :func:`wal_keys`, :func:`read_committed_epoch`
  -- the coordinator's steps;
* :func:`read_committed` -- committed state for services outside the job.

Needs the ``redis`` client (``pip install 'statecore[redis]'``), imported on first use.
"""

from statecore.external.reader import CommittedState, read_committed
from statecore.external.redis_backend import RedisBackend
from statecore.external.store import abort_epoch, commit_epoch, read_committed_epoch, wal_keys

__all__ = ["RedisBackend", "commit_epoch", "abort_epoch", "wal_keys", "read_committed_epoch",
           "read_committed",
           "CommittedState"]
