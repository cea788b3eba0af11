"""The driver side of :class:`statecore.spark.StatefulOperator` on external keyed state
(``state_store=``; docs/spark.md "Keyed state in an external store"): a micro-batch (or flush)
is an epoch of the store, numbered by its state version.

The driver is the epochs' coordinator, through the external-state contract only
(:mod:`statecore.external`: ``commit_epoch``, ``abort_epoch``, ``read_committed_epoch``):

* before running version ``v`` (:func:`begin_epoch`) it finishes an epoch whose commit was
  decided but not applied (below), then either finds ``v`` committed in the store already --
  the micro-batch is a replay of a committed one and has no state effects left to make -- or
  discards the write-ahead logs of ``v`` that an earlier attempt left (``abort_epoch``);
* after the sink's action and every partition's report it writes the version's manifest in
  the checkpoint directory first -- a metadata-only manifest
  (``CheckpointStore.commit_external``: no data files; the store's namespace, the epoch, its
  logs and the epoch it builds on in the manifest's ``external`` field, the operator's
  metadata with ``state_store``) -- and then commits the epoch in the store
  (:func:`commit_version_epoch`). The manifest is the commit decision, as a two-phase
  commit's coordinator log: a driver killed after it and before the store's commit finishes
  that commit at its restart (:func:`begin_epoch`: the logs are still in the store), so the
  store's committed epoch is always the latest manifest's version or the one before it.
  Manifests written before metadata-only manifests existed (marker runs, the logs in the
  metadata's ``state_store``) are read the same way.

The driver talks to the store through one connection per operator object
(:func:`driver_store`: a :class:`~statecore.external.postgres_store.PgConnection` or a
``redis.Redis`` client), opened at the first micro-batch, reopened when the server closed it
(both clients check an idle connection before using it) and closed by
:func:`close_driver_store` (``StatefulOperator.close``), rather than one connection per call.
"""

from __future__ import annotations

import os
import signal
import threading
import weakref
from typing import Any, Dict, Optional

from statecore.errors import InvalidInputError, StateError

__all__ = ["check_state_store", "check_store_cache", "driver_store", "close_driver_store",
           "begin_epoch", "decided_epoch", "commit_version_epoch", "KILL_BEFORE_COMMIT_ENV",
           "KILL_BEFORE_EPOCH_COMMIT_ENV"]

#: Test hook: ``OPERATOR:VERSION`` SIGKILLs the driver's process group after every partition
#: of that version pre-committed and reported, before the manifest is written.
KILL_BEFORE_COMMIT_ENV = "STATECORE_TEST_KILL_BEFORE_COMMIT"
#: Test hook: ``OPERATOR:VERSION`` SIGKILLs the driver's process group after the version's
#: manifest is written, before the store commits the epoch.
KILL_BEFORE_EPOCH_COMMIT_ENV = "STATECORE_TEST_KILL_BEFORE_EPOCH_COMMIT"


def check_state_store(url: Optional[str], namespace: Optional[str],
                      default_namespace: str) -> tuple:
    """``(url, namespace)`` of an operator's external state, checked (InvalidInputError);
    ``(None, None)`` without ``url``. ``namespace`` defaults to ``default_namespace``."""
    from statecore.external.store import check_namespace
    from statecore.external.urls import store_kind

    if url is None:
        if namespace is not None:
            raise InvalidInputError("state_namespace needs state_store")
        return None, None
    store_kind(url)
    return url, check_namespace(default_namespace if namespace is None else namespace)


def check_store_cache(url: Optional[str], cache_entries, ttl_sweep_key_groups) -> tuple:
    """``(cache_entries, ttl_sweep_key_groups)`` of an operator's external state, checked as
    the backends check them (``state_store_cache_entries``: an int >= 1 or None for no bound;
    ``state_store_ttl_sweep_key_groups``: an int >= 0) and passed to every task's backend.
    InvalidInputError naming the operator's argument for a bad value, or for a value other
    than the default without ``url`` (in-memory state has no cache in front of a store)."""
    from statecore.external.cached import (
        DEFAULT_CACHE_ENTRIES,
        DEFAULT_TTL_SWEEP_KEY_GROUPS,
        check_cache_entries,
        check_ttl_sweep_key_groups,
    )

    entries = check_cache_entries(cache_entries, "state_store_cache_entries")
    sweep = check_ttl_sweep_key_groups(ttl_sweep_key_groups, "state_store_ttl_sweep_key_groups")
    if url is None:
        for name, value, default in (
                ("state_store_cache_entries", entries, DEFAULT_CACHE_ENTRIES),
                ("state_store_ttl_sweep_key_groups", sweep, DEFAULT_TTL_SWEEP_KEY_GROUPS)):
            if value != default:
                raise InvalidInputError(f"{name} needs state_store (it configures the cache "
                                        "in front of the external store)")
    return entries, sweep


class _DriverStore:
    """The driver's client of one operator's store: ``client`` (opened lazily) for ``url``
    with ``timeout_s``; ``lock`` serializes its use (one transaction at a time)."""

    def __init__(self, url: str, timeout_s: float):
        self.url = url
        self.timeout_s = timeout_s
        self.lock = threading.Lock()
        self._client = None

    @property
    def client(self):
        if self._client is None:
            from statecore.external.coordinator import connect

            self._client = connect(self.url, self.timeout_s)
        return self._client

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()


# Operator object -> its driver client; weak, so that an operator dropped without close()
# does not keep a connection (PgConnection and redis.Redis close theirs when collected).
_DRIVER_STORES: "weakref.WeakKeyDictionary[Any, _DriverStore]" = weakref.WeakKeyDictionary()
_DRIVER_LOCK = threading.Lock()


def driver_store(op) -> _DriverStore:
    """The driver's connection holder of operator ``op``'s store (module docstring): the same
    object for every call while ``op.state_store`` and ``op.state_store_timeout_s`` stay the
    same, a new one (the old closed) when they changed."""
    with _DRIVER_LOCK:
        held = _DRIVER_STORES.get(op)
        if held is not None and (held.url, held.timeout_s) == (op.state_store,
                                                              op.state_store_timeout_s):
            return held
        _DRIVER_STORES[op] = fresh = _DriverStore(op.state_store, op.state_store_timeout_s)
    if held is not None:
        with held.lock:
            held.close()
    return fresh


def close_driver_store(op) -> None:
    """Close the driver's connection to ``op``'s store, if one is open (the next micro-batch
    opens a new one). Idempotent."""
    with _DRIVER_LOCK:
        held = _DRIVER_STORES.pop(op, None)
    if held is not None:
        with held.lock:
            held.close()


def _kill_hook(env: str, operator: str, version: int) -> None:
    if os.environ.get(env) == f"{operator}:{version}":
        os.killpg(os.getpgrp(), signal.SIGKILL)


def decided_epoch(manifest: dict) -> Optional[tuple]:
    """``(logs, base epoch)`` of the store epoch a committed version's ``manifest`` decided:
    from its ``external`` field (a metadata-only manifest), else from the metadata's
    ``state_store`` (``wals``, ``prev_epoch``) of a manifest with marker runs; None for a
    version of in-memory state."""
    ext = manifest.get("external")
    if isinstance(ext, dict):
        return list(ext["logs"]), ext["base_epoch"]
    meta = manifest.get("metadata", {}).get("state_store")
    if isinstance(meta, dict) and "wals" in meta:
        return list(meta["wals"]), meta.get("prev_epoch")
    return None


def begin_epoch(op, version: int) -> bool:
    """Prepare the store for version ``version`` of operator ``op`` (module docstring): finish
    the latest manifest's epoch when its commit was not applied, then return True when the
    store has committed ``version`` already (a replay: nothing to run), else discard the
    epoch's leftover logs and return False. StateError when the store and the checkpoint
    disagree (the store behind the checkpoint by more than the one epoch the manifest can
    finish, or ahead of it: another checkpoint's namespace, or one of them lost or rolled
    back); the store's own errors (ExternalStoreUnavailableError, ...) as they are."""
    held = driver_store(op)
    with held.lock:
        return _begin_epoch(op, version, held.client)


def _begin_epoch(op, version: int, client) -> bool:
    from statecore.external import abort_epoch, commit_epoch, read_committed_epoch

    ns, timeout = op.state_namespace, op.state_store_timeout_s
    committed = read_committed_epoch(client, ns, timeout)
    store = op.store
    latest = store.latest_version()
    decided = decided_epoch(store.manifest(latest)) if latest is not None else None
    if decided is not None and committed != latest:
        logs, base = decided
        if committed != base:
            raise StateError(
                f"operator {op.name}: the state store's namespace {ns!r} has committed epoch "
                f"{committed}, the checkpoint {store.uri} version {latest} (built on epoch "
                f"{base}); they do not belong together (the store's data was "
                "lost or belongs to another checkpoint): use a new namespace and checkpoint")
        commit_epoch(client, ns, latest, logs, timeout)
        committed = latest
    if committed is not None and (latest is None or committed > latest):
        raise StateError(
            f"operator {op.name}: the state store's namespace {ns!r} has committed epoch "
            f"{committed}, beyond the checkpoint's latest version {latest} in {store.uri}: "
            "the namespace belongs to another checkpoint (pass state_namespace=)")
    if committed is not None and version <= committed:
        return True
    abort_epoch(client, ns, version, timeout_s=timeout)
    return False


def commit_version_epoch(op, version: int, parts, prev_epoch: Optional[int], key_type: str,
                         metadata: Dict[str, Any]) -> dict:
    """Commit version ``version`` of ``op`` whose partitions reported ``parts`` (their reports,
    each with its write-ahead log ``wal``): write the version's metadata-only manifest
    (``metadata`` plus ``state_store``: the namespace; the epoch's logs and ``prev_epoch``, the
    epoch the tasks built on or None, in its ``external`` field), then commit the epoch in the
    store. Returns the manifest. A replayed version replaces its manifest. Errors: StateError
    when a partition reported no log; the checkpoint's and the store's errors."""
    from statecore.external import commit_epoch
    from statecore.external.urls import store_kind

    wals = [r["wal"] for r in parts]
    if any(not isinstance(w, str) for w in wals):
        raise StateError(f"operator {op.name}: version {version}: a partition reported no "
                         "write-ahead log; the micro-batch is not committed")
    _kill_hook(KILL_BEFORE_COMMIT_ENV, op.name, version)
    manifest = op.store.commit_external(
        version, store=store_kind(op.state_store), namespace=op.state_namespace, epoch=version,
        logs=wals, base_epoch=prev_epoch, max_parallelism=op.max_parallelism,
        key_type=key_type, assigner="spark",
        metadata=dict(metadata, state_store={"namespace": op.state_namespace}), replace=True)
    _kill_hook(KILL_BEFORE_EPOCH_COMMIT_ENV, op.name, version)
    held = driver_store(op)
    with held.lock:
        commit_epoch(held.client, op.state_namespace, version, wals, op.state_store_timeout_s)
    return manifest
