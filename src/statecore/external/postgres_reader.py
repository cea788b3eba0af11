"""Reading the committed state of a namespace in PostgreSQL from outside the job:
:func:`read_committed_pg`. One REPEATABLE READ transaction reads the committed epoch and the
rows at or below it, so it sees exactly one committed epoch and never a pre-committed row; a
concurrent commit neither blocks nor restarts it (MVCC)."""

from __future__ import annotations

import json

from statecore.errors import InvalidInputError
from statecore.external.postgres_store import SCHEMA, connect, namespace_row
from statecore.external.reader import CommittedState, committed_table, ttl_reader_now
from statecore.external.store import DEFAULT_TIMEOUT_S, check_namespace
from statecore.key_groups import KeyGroupRange

__all__ = ["read_committed_pg"]


def read_committed_pg(url_or_conn, namespace: str, state: str, key_group_range=None,
                      timeout_s: float = DEFAULT_TIMEOUT_S, now_ms: int | None = None
                      ) -> CommittedState:
    """The committed entries of ``state`` in ``namespace`` (key groups of ``key_group_range``,
    default all) in PostgreSQL, decoded, as of one committed epoch (a
    :class:`~statecore.external.reader.CommittedState`).

    ``url_or_conn``: a ``postgresql://`` URL (libpq's environment variables fill in what it
    leaves out) or a psycopg connection. A TTL state's values expired at ``now_ms`` are left
    out (:func:`~statecore.external.reader.ttl_reader_now`). Raises InvalidInputError for an
    unknown state or namespace, for an event-time TTL state without ``now_ms``,
    ExternalStateError and its subclasses for store failures, InvalidInputError naming the
    entry for bytes that do not decode."""
    check_namespace(namespace)
    pg = connect(url_or_conn, timeout_s)
    try:
        with pg.transaction(f"reading state {state!r} of {namespace!r}", read_only=True) as conn:
            exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                  (f"{SCHEMA}.namespaces",)).fetchone()[0]
            row = namespace_row(conn, namespace) if exists else None
            if row is None:
                raise InvalidInputError(f"no statecore state namespace {namespace!r} here")
            ns, key_type, maxp, _, epoch = row
            raw = None
            if epoch is not None:
                raw = conn.execute(
                    f"SELECT meta FROM {SCHEMA}.states WHERE ns = %s AND name = %s AND "
                    "epoch <= %s ORDER BY epoch DESC LIMIT 1", (ns, state, epoch)).fetchone()
            if raw is None:
                raise InvalidInputError(f"namespace {namespace!r} has no committed state "
                                        f"{state!r}")
            r = (KeyGroupRange.all(maxp) if key_group_range is None
                 else KeyGroupRange.of(key_group_range))
            cur = conn.cursor(binary=True)
            cur.execute(f"SELECT key, value FROM {SCHEMA}.entries WHERE ns = %s AND state = %s "
                        "AND kg BETWEEN %s AND %s AND epoch <= %s ORDER BY kg, key",
                        (ns, state, r.start, r.end, epoch))
            pairs = cur.fetchall()
    finally:
        if pg is not url_or_conn:
            pg.close()
    meta = json.loads(raw[0])
    now = ttl_reader_now(meta, state, now_ms)
    return CommittedState(epoch, meta, committed_table(meta, key_type, maxp, pairs, now))
