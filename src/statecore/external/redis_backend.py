"""RedisBackend: keyed state whose committed copy lives in Redis, exactly once per epoch.

The design (docs/external-state.md) follows the external state of Carbone et al., "State
Management in Apache Flink" (VLDB 2017): the store has no MVCC, so each task keeps the changes
of the running epoch to itself and hands them over as a write-ahead log when the epoch's
snapshot is taken (:meth:`RedisBackend.pre_commit`); the coordinator applies every task's log
and advances the committed epoch in one atomic step once the global snapshot is complete
(:func:`statecore.external.store.commit_epoch`), a bulk two-phase commit needing no hooks in
the database. Recovery downloads nothing: a new backend on the namespace starts empty and
reads committed entries on first access.

An in-memory backend (``cache="python"`` or ``"native"``) in front serves every state call and
is the epoch's write buffer (:mod:`statecore.external.cached`); the first access to a key group
reads that key group's hash of every state with one pipelined ``HGETALL`` per hash, all
missing key groups of a batch in one round trip.
"""

from __future__ import annotations

import json

from statecore.errors import InvalidInputError
from statecore.external.cached import (
    DEFAULT_CACHE_ENTRIES,
    DEFAULT_TTL_SWEEP_KEY_GROUPS,
    OPERATOR_WRITERS_STATE,
    CachedExternalBackend,
)
from statecore.external.store import (
    DEFAULT_TIMEOUT_S,
    NamespaceKeys,
    check_config,
    committed_epoch,
    connect,
    load_state_metas,
    store_errors,
    text_of,
    wal_header,
)
from statecore.operator_state import is_operator_state_meta
from statecore.timers import TIMERS_STATE_NAME

__all__ = ["RedisBackend"]

#: List elements per RPUSH of a write-ahead log (bounded request sizes).
_PUSH_CHUNK = 4000


class RedisBackend(CachedExternalBackend):
    """Keyed state of one task whose committed copy is in Redis (module docstring).

    Args: ``url`` (``redis://[user:password@]host:port/db``; or ``client``, a ``redis.Redis``
    returning bytes; neither: the URL in the ``REDIS_URL`` environment variable),
    ``namespace`` (the state namespace, e.g. ``"job/operator"``: every key
    lives under ``statecore:{namespace}:``), ``key_type``, ``max_parallelism``,
    ``key_group_range``, ``assigner``, ``ttl_clock``, ``timer_namespace_type`` (as
    ``create_backend``), ``cache``
    (``"python"`` or ``"native"``: the in-memory backend in front), ``task`` (the name of this
    task's write-ahead logs, default ``kg<start>-<end>`` of the key-group range: unique per
    task of one parallelism), ``timeout_s`` (connect and socket timeouts, s), ``cache_entries``
    (the cache's bound in entries, default 2,000,000, None for no bound: past it, key groups
    whose entries equal the committed state are evicted, least recently used first, and read
    through again on their next access; :meth:`cache_statistics`), ``ttl_sweep_key_groups``
    (key groups per pre-commit whose expired TTL entries the commit script deletes, round
    robin over the range, default 16, 0 for none).

    The state API is the in-memory backends' (:mod:`statecore.backends.base`): ``get_state``,
    per-record and batch calls, ``keys``, ``apply_to_all_keys``, TTL. Timers are kept in
    Redis as the ``__timers__`` hash of each key group (firing reads every key group of the
    range through first). Checkpointing is the epoch protocol instead of
    snapshots: :meth:`pre_commit`, the coordinator's
    :func:`~statecore.external.store.commit_epoch`, :meth:`notify_committed`, :meth:`abort`.
    :meth:`snapshot` (full only) and :meth:`restore` exist to export and import state. The
    watermark and processing time are not stored (the operator's, as with checkpoints).

    Raises InvalidInputError for bad arguments, StateMigrationError when the namespace holds
    state of another key type, max parallelism or assigner, ExternalStoreUnavailableError /
    ExternalStoreAuthError when Redis cannot be used (statecore.errors).
    """

    def __init__(self, url: str | None = None, namespace: str | None = None, *,
                 key_type="int64", max_parallelism: int = 128, key_group_range=None,
                 assigner: str = "spark", ttl_clock=None, timer_namespace_type: str = "void",
                 cache: str = "python",
                 task: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, client=None,
                 cache_entries: int | None = DEFAULT_CACHE_ENTRIES,
                 ttl_sweep_key_groups: int = DEFAULT_TTL_SWEEP_KEY_GROUPS):
        if cache not in ("python", "native"):
            raise InvalidInputError(f"cache must be 'python' or 'native', got {cache!r}")
        if url is not None and client is not None:
            raise InvalidInputError("pass one of url= and client=, not both")
        self._keys = NamespaceKeys(namespace)
        super().__init__(self._keys.namespace, cache,
                         dict(key_type=key_type, max_parallelism=max_parallelism,
                              key_group_range=key_group_range, assigner=assigner,
                              ttl_clock=ttl_clock, timer_namespace_type=timer_namespace_type),
                         task, cache_entries, ttl_sweep_key_groups)
        self._owns_client = client is None
        try:
            self._client = client if client is not None else connect(url, timeout_s)
            self._committed = check_config(self._client, self._keys, self._cache.key_type,
                                           self._cache.max_parallelism, self._cache.assigner)
        except BaseException:
            self._cache.dispose()
            raise

    # ------------------------------------------------------------------ store hooks
    def _store_state_metas(self) -> dict:
        return load_state_metas(self._client, self._keys)

    def _store_read(self, key_groups: list[int]) -> tuple[dict, dict]:
        """The state metas in one round trip, then one pipelined ``HGETALL`` per (state, key
        group), run as one MULTI so that they see one committed epoch."""
        metas = load_state_metas(self._client, self._keys)
        data = {}
        if metas:
            slots = [(name, kg) for kg in key_groups for name in metas]
            with store_errors(self._client, f"reading key groups {key_groups[0]}.."
                                            f"{key_groups[-1]} of {self.namespace!r}"):
                pipe = self._client.pipeline(transaction=True)
                for name, kg in slots:
                    pipe.hgetall(self._keys.data(kg, name))
                data = {s: d for s, d in zip(slots, pipe.execute()) if d}
        return metas, data

    def _store_committed_epoch(self) -> int | None:
        return committed_epoch(self._client, self._keys)

    def _store_read_operator_state(self) -> tuple[dict, dict]:
        """The state metas, then in one MULTI the metas again and the hashes of every
        operator pseudo-state and of the writer records in every key group (one pipelined
        ``HGETALL`` each, absent hashes cost a lookup; read again when the metas changed in
        between: one committed epoch)."""
        metas = load_state_metas(self._client, self._keys)
        while True:
            names = sorted(n for n, m in metas.items() if is_operator_state_meta(m))
            slots = [(name, kg) for kg in range(self.max_parallelism)
                     for name in names + [OPERATOR_WRITERS_STATE]]
            with store_errors(self._client, f"reading the operator state of "
                                            f"{self.namespace!r}"):
                pipe = self._client.pipeline(transaction=True)
                pipe.hgetall(self._keys.states)
                for name, kg in slots:
                    pipe.hgetall(self._keys.data(kg, name))
                got = pipe.execute()
            metas = {text_of(k): json.loads(v) for k, v in got[0].items()}
            if sorted(n for n, m in metas.items() if is_operator_state_meta(m)) == names:
                return metas, {s: d for s, d in zip(slots, got[1:]) if d}

    def _store_write_log(self, epoch: int, metas: list[dict], changes: dict,
                         timers: dict, sweep: list) -> str:
        """The log (docs/formats.md "External state in Redis") is a list: the header, the
        state metas, then one ``S`` (set) or ``D`` (delete) record per changed entry, and a
        changed key group's timers replaced whole (``R``, then ``S``), then one ``X`` (sweep)
        record per hash to clear of expired TTL entries, or ``L`` per hash of a list state whose
        chunks to trim of their expired elements, with the cutoff as its high and low 32-bit
        halves (Lua numbers are doubles); written with one MULTI."""
        ops: list = [wal_header(epoch)]
        for meta in metas:
            ops += ("M", meta["name"], json.dumps(meta, sort_keys=True), b"")
        for (name, kg), d in sorted(changes.items()):
            suffix = NamespaceKeys.data_suffix(kg, name)
            for k, v in sorted(d.items()):
                ops += ("D", suffix, k, b"") if v is None else ("S", suffix, k, v)
        for kg, (_, now) in sorted(timers.items()):
            suffix = NamespaceKeys.data_suffix(kg, TIMERS_STATE_NAME)
            ops += ("R", suffix, b"", b"")
            for k, v in sorted(now.items()):
                ops += ("S", suffix, k, v)
        for state, cutoff, kgs, width in sweep:
            bound = f"{cutoff >> 32} {cutoff & 0xFFFFFFFF}"
            for kg in kgs:
                suffix = NamespaceKeys.data_suffix(kg, state)
                ops += (("X", suffix, bound, b"") if width is None
                        else ("L", suffix, bound, str(width)))
        name = self._keys.wal(epoch, self.task)
        with store_errors(self._client, f"pre-committing epoch {epoch} of {self.namespace!r}"):
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(name)
            for i in range(0, len(ops), _PUSH_CHUNK):
                pipe.rpush(name, *ops[i:i + _PUSH_CHUNK])
            pipe.sadd(self._keys.pending, name)
            pipe.execute()
        return name

    def _store_close(self) -> None:
        if self._owns_client:
            self._client.close()
