"""PostgresBackend: keyed state whose committed copy lives in PostgreSQL, exactly once per epoch.

PostgreSQL has MVCC, so the design (docs/external-state.md "PostgreSQL") tags every row with
the epoch that wrote it instead of keeping write-ahead logs apart: a task's pre-commit copies
its changes of the epoch into the entries table in one transaction (``COPY``, binary), rows
that readers skip because their epoch is newer than the committed one; the coordinator's
commit advances the committed epoch (one row) and drops the superseded versions in one
transaction (:func:`statecore.external.postgres_store.commit_epoch`). The cache in front and
the epoch bookkeeping are :mod:`statecore.external.cached`'s, as for Redis.
"""

from __future__ import annotations

import json
import struct

from statecore.errors import EpochCommitError, InvalidInputError
from statecore.external.cached import (
    DEFAULT_CACHE_ENTRIES,
    DEFAULT_TTL_SWEEP_KEY_GROUPS,
    OPERATOR_WRITERS_STATE,
    CachedExternalBackend,
)
from statecore.external.postgres_store import (
    SCHEMA,
    PgConnection,
    load_state_metas,
    namespace_row,
    open_namespace,
)
from statecore.external.store import DEFAULT_TIMEOUT_S, NamespaceKeys
from statecore.operator_state import is_operator_state_meta
from statecore.timers import TIMERS_STATE_NAME

__all__ = ["PostgresBackend"]

_COPY_ENTRIES = (f"COPY {SCHEMA}.entries (ns, kg, state, key, epoch, value) "
                 "FROM STDIN (FORMAT BINARY)")
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
_NULL = struct.pack(">i", -1)
#: Rows per chunk handed to COPY (bounded memory beyond the changes themselves).
_COPY_CHUNK = 20_000


def _copy_payload(ns: int, epoch: int, groups) -> tuple[list[bytes], int]:
    """The rows ``(ns, kg, state, key, epoch, value)`` of ``groups`` (``(state, kg, {key:
    value or None})``) in PostgreSQL's binary COPY format (the ``COPY`` reference, "Binary
    Format": a header, per row an int16 field count and per field an int32 length, -1 for
    NULL, and the bytes; network byte order), as chunks; and the number of rows. Built here
    rather than with psycopg's ``write_row`` because the fields shared by a (state, key group)
    are encoded once."""
    pack = struct.Struct(">i").pack
    epoch_field = struct.pack(">iq", 8, epoch)
    chunks, part, n = [], [_COPY_HEADER], 0
    for state, kg, d in groups:
        s = state.encode()
        prefix = struct.pack(">hiiii", 6, 4, ns, 4, kg) + pack(len(s)) + s
        for k, v in d.items():
            part.append(b"".join((prefix, pack(len(k)), k, epoch_field,
                                  _NULL if v is None else pack(len(v)), b"" if v is None else v)))
            n += 1
            if len(part) >= _COPY_CHUNK:
                chunks.append(b"".join(part))
                part = []
    part.append(_COPY_TRAILER)
    chunks.append(b"".join(part))
    return chunks, n


def _sweep_json(sweep: list) -> str | None:
    """A log's ``sweep`` column (docs/formats.md "External state in PostgreSQL"): JSON
    ``[state, cutoff, [kg, ...]]`` per state whose entries expire whole, with the element
    width appended for a list state (0: variable width); None for no sweep."""
    if not sweep:
        return None
    return json.dumps([[name, cutoff, kgs] + ([] if width is None else [width])
                       for name, cutoff, kgs, width in sweep])


class PostgresBackend(CachedExternalBackend):
    """Keyed state of one task whose committed copy is in PostgreSQL (module docstring).

    Args: ``url`` (``postgresql://[user[:password]@][host][:port][/dbname][?param=value]``
    or a libpq conninfo string; what it leaves out comes from libpq's environment variables
    PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE, ...; None: the environment
    only), or ``conn``, a psycopg 3 connection in autocommit mode; ``namespace`` (the state
    namespace, e.g. ``"job/operator"``: a row of ``statecore.namespaces``), ``key_type``,
    ``max_parallelism``, ``key_group_range``, ``assigner``, ``ttl_clock``,
    ``timer_namespace_type`` (as ``create_backend``), ``cache`` (``"python"`` or
    ``"native"``: the in-memory backend in front), ``task`` (the name of this task's
    write-ahead logs, default ``kg<start>-<end>`` of the key-group range: unique per task of
    one parallelism), ``timeout_s`` (connect, statement and lock-wait timeouts, s),
    ``cache_entries`` (the cache's bound in entries) and ``ttl_sweep_key_groups`` (key groups
    per pre-commit whose expired TTL entries the commit deletes), as
    :class:`~statecore.external.redis_backend.RedisBackend`'s. The
    first backend on a database creates schema ``statecore`` and its tables (needs the
    CREATE privilege on the database once; afterwards SELECT, INSERT, UPDATE, DELETE).

    The state API, timers and the epoch protocol (:meth:`pre_commit`, the coordinator's
    :func:`~statecore.external.postgres_store.commit_epoch`, :meth:`notify_committed`,
    :meth:`abort`) are :class:`~statecore.external.redis_backend.RedisBackend`'s.

    Raises InvalidInputError for bad arguments, StateMigrationError when the namespace holds
    state of another key type, max parallelism or assigner, ExternalStoreUnavailableError /
    ExternalStoreAuthError / ExternalStateError when PostgreSQL cannot be used
    (statecore.errors).
    """

    def __init__(self, url: str | None = None, namespace: str | None = None, *,
                 key_type="int64", max_parallelism: int = 128, key_group_range=None,
                 assigner: str = "spark", ttl_clock=None, timer_namespace_type: str = "void",
                 cache: str = "python", task: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, conn=None,
                 cache_entries: int | None = DEFAULT_CACHE_ENTRIES,
                 ttl_sweep_key_groups: int = DEFAULT_TTL_SWEEP_KEY_GROUPS):
        if url is not None and conn is not None:
            raise InvalidInputError("pass at most one of url= and conn=")
        self._keys = NamespaceKeys(namespace)
        super().__init__(self._keys.namespace, cache,
                         dict(key_type=key_type, max_parallelism=max_parallelism,
                              key_group_range=key_group_range, assigner=assigner,
                              ttl_clock=ttl_clock, timer_namespace_type=timer_namespace_type),
                         task, cache_entries, ttl_sweep_key_groups)
        try:
            self._pg = PgConnection(url, timeout_s, conn=conn)
            self._ns, self._committed = open_namespace(
                self._pg, self.namespace, self._cache.key_type, self._cache.max_parallelism,
                self._cache.assigner)
        except BaseException:
            self._cache.dispose()
            if hasattr(self, "_pg"):
                self._pg.close()
            raise

    # ------------------------------------------------------------------ store hooks
    def _store_state_metas(self) -> dict:
        with self._pg.transaction(f"reading the states of {self.namespace!r}",
                                  read_only=True) as conn:
            return load_state_metas(conn, self._ns, namespace_row(conn, self.namespace)[4])

    def _store_read(self, key_groups: list[int]) -> tuple[dict, dict]:
        """One REPEATABLE READ transaction (one snapshot: one committed epoch): the state
        metas, then the committed rows of the key groups in one query."""
        data: dict = {}
        with self._pg.transaction(f"reading key groups {key_groups[0]}..{key_groups[-1]} of "
                                  f"{self.namespace!r}", read_only=True) as conn:
            epoch = namespace_row(conn, self.namespace)[4]
            metas = load_state_metas(conn, self._ns, epoch)
            if epoch is not None:
                cur = conn.cursor(binary=True)
                cur.execute(f"SELECT state, kg, key, value FROM {SCHEMA}.entries WHERE ns = %s "
                            "AND kg = ANY(%s) AND epoch <= %s", (self._ns, key_groups, epoch))
                for state, kg, key, value in cur:
                    d = data.get((state, kg))
                    if d is None:
                        d = data[(state, kg)] = {}
                    d[key] = value
        return metas, data

    def _store_read_operator_state(self) -> tuple[dict, dict]:
        """One REPEATABLE READ transaction: the state metas, then the committed rows of every
        operator pseudo-state and of the writer records in one query (by the primary key's
        index)."""
        data: dict = {}
        with self._pg.transaction(f"reading the operator state of {self.namespace!r}",
                                  read_only=True) as conn:
            epoch = namespace_row(conn, self.namespace)[4]
            metas = load_state_metas(conn, self._ns, epoch)
            names = sorted(n for n, m in metas.items() if is_operator_state_meta(m))
            if epoch is not None:
                # Every key group named: the primary key (ns, kg, state, ...) then finds the
                # rows by index, not by scanning the namespace.
                cur = conn.cursor(binary=True)
                cur.execute(f"SELECT state, kg, key, value FROM {SCHEMA}.entries WHERE ns = %s "
                            "AND kg = ANY(%s) AND state = ANY(%s) AND epoch <= %s",
                            (self._ns, list(range(self.max_parallelism)),
                             names + [OPERATOR_WRITERS_STATE], epoch))
                for state, kg, key, value in cur:
                    data.setdefault((state, kg), {})[bytes(key)] = bytes(value)
        return metas, data

    def _store_committed_epoch(self) -> int | None:
        with self._pg.transaction(f"reading the committed epoch of {self.namespace!r}",
                                  read_only=True) as conn:
            return namespace_row(conn, self.namespace)[4]

    def _store_write_log(self, epoch: int, metas: list[dict], changes: dict,
                         timers: dict, sweep: list) -> str:
        """Two transactions, each checking under a share lock of the namespace row that
        ``epoch`` is not committed: the state metas' upsert; then delete this task's earlier
        rows of ``epoch`` and later epochs (a replayed pre-commit) in its key-group range,
        ``COPY`` the changes (a NULL value marks a deletion; a changed key group's timers as
        the differences to the stored ones; :func:`_copy_payload`) and record the log (with
        the TTL sweep its commit runs, JSON in column ``sweep``). Only
        the second makes the log exist: a commit refuses the epoch until it committed."""
        ns, r = self._ns, self.key_group_range
        groups = [(name, kg, d) for (name, kg), d in changes.items()]
        for kg, (before, now) in timers.items():
            groups.append((TIMERS_STATE_NAME, kg,
                           {**dict.fromkeys((k for k in before if k not in now), None),
                            **{k: v for k, v in now.items() if before.get(k) != v}}))
        payload, n_rows = _copy_payload(ns, epoch, groups)
        what = f"pre-committing epoch {epoch} of {self.namespace!r}"
        # The state metas first, in a short transaction of their own: every task upserts the
        # same rows, and holding their locks through a long COPY would serialize the tasks'
        # pre-commits. Rows of an uncommitted epoch are invisible, and a commit or abort
        # removes those that never become part of one.
        with self._pg.transaction(what) as conn:
            self._check_not_committed(conn, epoch)
            conn.execute(f"DELETE FROM {SCHEMA}.states WHERE ns = %s AND epoch > %s",
                         (ns, epoch))
            with conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO {SCHEMA}.states (ns, name, epoch, meta) VALUES (%s, %s, %s, "
                    "%s) ON CONFLICT (ns, name, epoch) DO UPDATE SET meta = EXCLUDED.meta",
                    [(ns, m["name"], epoch, json.dumps(m, sort_keys=True))
                     for m in sorted(metas, key=lambda m: m["name"])])
        with self._pg.transaction(what) as conn:
            self._check_not_committed(conn, epoch)
            conn.execute(f"DELETE FROM {SCHEMA}.entries WHERE ns = %s AND epoch >= %s AND "
                         "kg BETWEEN %s AND %s", (ns, epoch, r.start, r.end))
            conn.execute(f"DELETE FROM {SCHEMA}.logs WHERE ns = %s AND epoch >= %s AND "
                         "task = %s", (ns, epoch, self.task))
            with conn.cursor() as cur, cur.copy(_COPY_ENTRIES) as copy:
                for chunk in payload:
                    copy.write(chunk)
            conn.execute(f"INSERT INTO {SCHEMA}.logs (ns, epoch, task, kg_start, kg_end, "
                         "entries, sweep) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                         (ns, epoch, self.task, r.start, r.end, n_rows,
                          _sweep_json(sweep)))
        return self._keys.wal(epoch, self.task)

    def _check_not_committed(self, conn, epoch: int) -> None:
        """EpochCommitError when ``epoch`` is committed, checked under a share lock of the
        namespace row (a commit, which locks it for update, waits for this transaction)."""
        committed = namespace_row(conn, self.namespace, "FOR SHARE")[4]
        if committed is not None and epoch <= committed:
            raise EpochCommitError(f"epoch {epoch} is not newer than the committed epoch "
                                   f"{committed} of {self.namespace!r}")

    def _store_close(self) -> None:
        self._pg.close()
