"""The PostgreSQL side of external keyed state: the tables, the connection, error mapping and
the coordinator's steps (layout: docs/formats.md "External state in PostgreSQL"; protocol:
docs/external-state.md "PostgreSQL").

Every row is tagged with the epoch that wrote it; the committed epoch is one column of one row
(``statecore.namespaces.epoch``), so committing an epoch is one transaction that advances it
and drops the versions the epoch superseded, and readers see the rows of epochs up to the
committed one: the database's MVCC makes the switch atomic for every reader. All namespaces
share the tables of schema ``statecore``; a namespace is a row of ``statecore.namespaces``
and its ``id`` tags every other row.

The ``psycopg`` client (PyPI ``psycopg``, version 3; the ``postgres`` extra) is imported on
first use.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select

from statecore.errors import (
    EpochCommitError,
    ExternalStateError,
    ExternalStoreAuthError,
    ExternalStoreUnavailableError,
    InvalidInputError,
    StateMigrationError,
)
from statecore.external.cached import check_epoch
from statecore.external.store import DEFAULT_TIMEOUT_S, FORMAT, NamespaceKeys
from statecore.external.urls import is_postgres_url

__all__ = ["SCHEMA", "PgConnection", "connect", "store_errors", "open_namespace",
           "namespace_row", "commit_epoch", "abort_epoch", "wal_keys", "read_committed_epoch",
           "is_postgres",
           "parse_log_name", "ensure_schema"]

#: The schema holding statecore's tables.
SCHEMA = "statecore"
#: Key of the advisory lock taken while creating the tables (concurrent tasks may open the
#: first namespace together; CREATE ... IF NOT EXISTS alone races on the catalogs).
_DDL_LOCK = 0x5374_6174_6543_6F72 & 0x7FFF_FFFF_FFFF_FFFF

#: The function trimming a TTL list chunk (_DDL) and its signature.
_TRIM_LIST = f"{SCHEMA}.ttl_trim_list_chunk"
_TRIM_LIST_SIGNATURE = f"{_TRIM_LIST}(bytea,integer,bigint)"

_DDL = [
    f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.namespaces (
        id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name text NOT NULL UNIQUE,
        format text NOT NULL,
        key_type text NOT NULL,
        max_parallelism integer NOT NULL,
        assigner text NOT NULL,
        epoch bigint)""",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.states (
        ns integer NOT NULL REFERENCES {SCHEMA}.namespaces (id) ON DELETE CASCADE,
        name text NOT NULL,
        epoch bigint NOT NULL,
        meta text NOT NULL,
        PRIMARY KEY (ns, name, epoch))""",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.entries (
        ns integer NOT NULL,
        kg integer NOT NULL,
        state text NOT NULL,
        key bytea NOT NULL,
        epoch bigint NOT NULL,
        value bytea,
        PRIMARY KEY (ns, kg, state, key, epoch))""",
    f"CREATE INDEX IF NOT EXISTS entries_by_epoch ON {SCHEMA}.entries (ns, epoch, kg)",
    f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.logs (
        ns integer NOT NULL,
        epoch bigint NOT NULL,
        task text NOT NULL,
        kg_start integer NOT NULL,
        kg_end integer NOT NULL,
        entries bigint NOT NULL,
        PRIMARY KEY (ns, epoch, task))""",
    # The TTL sweep a log asks its commit for (JSON [[state, cutoff, [kg, ...]], ...]); added
    # to tables created before it existed.
    f"ALTER TABLE {SCHEMA}.logs ADD COLUMN IF NOT EXISTS sweep text",
    # The TTL sweep of one list chunk (docs/formats.md "List state", "TTL suffix"): the chunk
    # from its first element not expired at ``cutoff`` on (``v`` itself when that is the
    # first), NULL when every element expired -- statecore.ttl.filter_expired of a list, with
    # an element stamped INT64_MIN (event time, not stamped yet) never expired. ``width``:
    # the element width without the suffix, 0 for varlen-prefixed elements. A broken layout
    # returns ``v`` unchanged: the sweep never corrupts what it cannot read.
    f"""CREATE OR REPLACE FUNCTION {_TRIM_LIST}(v bytea, width integer, cutoff bigint)
    RETURNS bytea LANGUAGE plpgsql IMMUTABLE STRICT AS $$
    DECLARE
      len integer := octet_length(v);
      pos bigint := 0;
      start bigint;
      n bigint;
      shift integer;
      b integer;
      ts bigint;
    BEGIN
      WHILE pos < len LOOP
        start := pos;
        IF width > 0 THEN
          n := width;
        ELSE
          n := 0;
          shift := 0;
          LOOP
            IF pos >= len OR shift > 56 THEN RETURN v; END IF;
            b := get_byte(v, pos::integer);
            pos := pos + 1;
            n := n | ((b & 127)::bigint << shift);
            EXIT WHEN b < 128;
            shift := shift + 7;
          END LOOP;
        END IF;
        IF pos + n + 8 > len THEN RETURN v; END IF;
        pos := pos + n + 8;
        ts := ('x' || encode(substring(v FROM (pos - 7)::integer FOR 8), 'hex'))::bit(64)::bigint;
        IF ts > cutoff OR ts = -9223372036854775808 THEN
          IF start = 0 THEN RETURN v; END IF;
          RETURN substring(v FROM (start + 1)::integer);
        END IF;
      END LOOP;
      RETURN NULL;
    END $$""",
]


_INT64_MIN = -(2**63)
# The TTL sweep of one state over some key groups (a log's ``sweep``): delete the committed
# entries whose 8-byte big-endian timestamp suffix (docs/formats.md "TTL suffix") lies in
# [INT64_MIN + 1, cutoff] -- INT64_MIN is an event-time write not stamped yet. Deletion markers
# (NULL values) are gone once a commit finished, and none is below the new committed epoch.
_SWEEP = (f"DELETE FROM {SCHEMA}.entries WHERE ns = %s AND state = %s AND kg = ANY(%s) AND "
          "epoch <= %s AND octet_length(value) >= 8 AND ('x' || encode(substring(value FROM "
          "octet_length(value) - 7), 'hex'))::bit(64)::bigint BETWEEN %s AND %s")
# The TTL sweep of one list state over some key groups: each committed chunk trimmed of its
# leading expired elements (_TRIM_LIST), removed when none is left.
_SWEEP_LIST = (
    f"WITH swept AS (SELECT kg, key, epoch, value, {_TRIM_LIST}(value, %(width)s, %(cutoff)s) "
    f"AS kept FROM {SCHEMA}.entries WHERE ns = %(ns)s AND state = %(state)s AND "
    "kg = ANY(%(kgs)s) AND epoch <= %(epoch)s AND value IS NOT NULL), "
    f"gone AS (DELETE FROM {SCHEMA}.entries e USING swept s WHERE s.kept IS NULL AND "
    "e.ns = %(ns)s AND e.state = %(state)s AND e.kg = s.kg AND e.key = s.key AND "
    "e.epoch = s.epoch) "
    f"UPDATE {SCHEMA}.entries e SET value = s.kept FROM swept s WHERE s.kept IS NOT NULL AND "
    "s.kept <> s.value AND e.ns = %(ns)s AND e.state = %(state)s AND e.kg = s.kg AND "
    "e.key = s.key AND e.epoch = s.epoch")


def _psycopg():
    try:
        import psycopg
    except ImportError as e:  # pragma: no cover - the extra is installed wherever tests run
        raise InvalidInputError(
            "external state in PostgreSQL needs psycopg 3: pip install 'statecore[postgres]'"
        ) from e
    return psycopg


#: Rows in an epoch's named logs from which its commit refreshes the planner statistics of
#: the entries table first (commit_epoch).
_ANALYZE_ROWS = 10_000


def is_postgres(url_or_conn) -> bool:
    """True for a ``postgresql://`` / ``postgres://`` URL, a psycopg connection or a
    :class:`PgConnection`."""
    if isinstance(url_or_conn, str):
        return is_postgres_url(url_or_conn)
    return isinstance(url_or_conn, PgConnection) or type(url_or_conn).__module__.startswith(
        "psycopg")


def _describe(conninfo: str) -> str:
    """``host:port`` of a conninfo (libpq's environment defaults for what it leaves out),
    never its password."""
    try:
        d = _psycopg().conninfo.conninfo_to_dict(conninfo)
    except Exception:  # noqa: BLE001 - only used in messages
        d = {}
    host = d.get("host") or os.environ.get("PGHOST") or "localhost"
    port = d.get("port") or os.environ.get("PGPORT") or "5432"
    return f"{host}:{port}"


_AUTH_WORDS = ("password authentication failed", "authentication failed",
               "no password supplied")


def _is_auth(e) -> bool:
    state = getattr(e, "sqlstate", None) or ""
    if state.startswith("28") or state == "42501":
        return True
    msg = str(e)
    return any(w in msg for w in _AUTH_WORDS) or (
        "role " in msg and "does not exist" in msg)


@contextlib.contextmanager
def store_errors(where: str, what: str):
    """Map psycopg's exceptions raised inside the block to statecore errors naming ``what``
    was being done and the server ``where`` (never a password): credentials or privileges
    refused -> ExternalStoreAuthError; unreachable, connection lost, server shutting down or
    a statement or lock timeout -> ExternalStoreUnavailableError; anything else ->
    ExternalStateError."""
    psycopg = _psycopg()
    errors = psycopg.errors
    try:
        yield
    except psycopg.Error as e:
        msg = str(e).strip().replace("\n", " ")
        if _is_auth(e):
            raise ExternalStoreAuthError(f"{what}: PostgreSQL at {where} refused the "
                                         f"credentials: {msg}") from e
        if isinstance(e, (psycopg.OperationalError, errors.QueryCanceled,
                          errors.LockNotAvailable)):
            raise ExternalStoreUnavailableError(f"{what}: PostgreSQL at {where} unreachable "
                                                f"or not answering in time: {msg}") from e
        raise ExternalStateError(f"{what}: PostgreSQL at {where} answered: {msg}") from e


class PgConnection:
    """One psycopg connection from ``url`` (libpq's conninfo or ``postgresql://`` URL; what it
    leaves out comes from libpq's environment variables PGHOST, PGPORT, PGUSER, PGPASSWORD,
    PGDATABASE, PGSSLMODE, ...), opened on first use and again after it broke. ``timeout_s``
    bounds the connect (``connect_timeout``), every statement and lock wait (server-side
    ``statement_timeout``, ``lock_timeout``) and unacknowledged sends (``tcp_user_timeout``).
    Or ``conn``: a psycopg connection of the caller's (never closed here)."""

    def __init__(self, url: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, conn=None):
        if conn is None and url is not None and not isinstance(url, str):
            raise InvalidInputError(f"url must be a postgresql:// URL string, got {url!r}")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise InvalidInputError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.url = url or ""
        self.timeout_s = float(timeout_s)
        self._conn = conn
        self._owns = conn is None
        self.where = _describe(self.url) if conn is None else (
            f"{conn.info.host}:{conn.info.port}")

    def get(self, what: str | None = None):
        """The open connection (autocommit mode: transactions are explicit blocks); a failed
        connect's error names ``what`` it was for."""
        c = self._conn
        if c is not None and not c.closed and not c.broken:
            if not self._owns or not _ended_by_server(c):
                return c
            # A restarted server ended this idle connection: its first statement would fail
            # with "terminating connection" although a new one works (a task's backend kept
            # from the previous micro-batch).
            with contextlib.suppress(Exception):
                c.close()
        if not self._owns:
            raise ExternalStoreUnavailableError(f"PostgreSQL at {self.where}: the connection "
                                                "passed in is closed")
        psycopg = _psycopg()
        ms = int(self.timeout_s * 1000)
        try:
            given = psycopg.conninfo.conninfo_to_dict(self.url).get("options")
        except psycopg.ProgrammingError as e:
            raise InvalidInputError(f"bad PostgreSQL URL: {e}") from e
        # Keyword arguments replace the URL's (and PGOPTIONS'): append ours to theirs.
        given = given if given is not None else os.environ.get("PGOPTIONS", "")
        options = f"{given} -c statement_timeout={ms} -c lock_timeout={ms}".strip()
        with store_errors(self.where, "connecting" if what is None else f"{what}: connecting"):
            self._conn = psycopg.connect(
                self.url, autocommit=True, connect_timeout=max(1, math.ceil(self.timeout_s)),
                tcp_user_timeout=ms, application_name="statecore", options=options)
        return self._conn

    def errors(self, what: str):
        """:func:`store_errors` for this server."""
        return store_errors(self.where, what)

    @contextlib.contextmanager
    def transaction(self, what: str, read_only: bool = False):
        """A transaction (REPEATABLE READ and READ ONLY when ``read_only``: every statement
        sees one snapshot, i.e. one committed epoch; READ COMMITTED otherwise, with explicit
        row locks) yielding the connection; errors mapped by :func:`store_errors`. A broken
        connection is reopened at the next call."""
        psycopg = _psycopg()
        with self.errors(what):
            conn = self.get(what)
            conn.isolation_level = (psycopg.IsolationLevel.REPEATABLE_READ if read_only
                                    else psycopg.IsolationLevel.READ_COMMITTED)
            conn.read_only = read_only
            with conn.transaction():
                yield conn

    def close(self) -> None:
        if self._owns and self._conn is not None:
            self._conn.close()

    def __del__(self):
        # A backend dropped without dispose() must not hold a server connection (a server
        # has a fixed number of them).
        with contextlib.suppress(Exception):
            self.close()


def _ended_by_server(conn) -> bool:
    """True when the idle connection ``conn`` has input waiting (no statement is in flight, so
    that is the server's goodbye: a termination notice or end of file), without a round
    trip."""
    try:
        return bool(select.select([conn.fileno()], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def connect(url_or_conn, timeout_s: float = DEFAULT_TIMEOUT_S) -> PgConnection:
    """A :class:`PgConnection` for a URL or a psycopg connection."""
    if isinstance(url_or_conn, PgConnection):
        return url_or_conn
    if url_or_conn is None or isinstance(url_or_conn, str):
        return PgConnection(url_or_conn, timeout_s)
    return PgConnection(timeout_s=timeout_s, conn=url_or_conn)


def ensure_schema(pg: PgConnection) -> None:
    """Create schema ``statecore`` and its tables unless they exist (under an advisory lock:
    tasks opening their first namespace together)."""
    with pg.transaction("creating the statecore tables") as conn:
        exists = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND "
            "attname = 'sweep' AND NOT attisdropped) AND to_regprocedure(%s) IS NOT NULL",
            (f"{SCHEMA}.logs", _TRIM_LIST_SIGNATURE)).fetchone()[0]
        if exists:
            return
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
        for stmt in _DDL:
            conn.execute(stmt)


def namespace_row(conn, namespace: str, lock: str = "") -> tuple | None:
    """``(id, key_type, max_parallelism, assigner, epoch)`` of ``namespace`` (None when it
    does not exist), ``lock`` ``"FOR SHARE"`` / ``"FOR UPDATE"`` or empty."""
    return conn.execute(
        f"SELECT id, key_type, max_parallelism, assigner, epoch FROM {SCHEMA}.namespaces "
        f"WHERE name = %s {lock}", (namespace,)).fetchone()


def open_namespace(pg: PgConnection, namespace: str, key_type: str, max_parallelism: int,
                   assigner: str) -> tuple[int, int | None]:
    """Create ``namespace`` with this key type, max parallelism and assigner if it does not
    exist, else check them (StateMigrationError when they differ: the encoded keys and key
    groups would not match); returns ``(namespace id, committed epoch or None)``."""
    ensure_schema(pg)
    with pg.transaction(f"opening namespace {namespace!r}") as conn:
        conn.execute(
            f"INSERT INTO {SCHEMA}.namespaces (name, format, key_type, max_parallelism, "
            "assigner) VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING",
            (namespace, FORMAT, key_type, max_parallelism, assigner))
        ns, kt, maxp, asg, epoch = namespace_row(conn, namespace)
    for f, have, want in (("key_type", kt, key_type), ("max_parallelism", maxp, max_parallelism),
                          ("assigner", asg, assigner)):
        if have != want:
            raise StateMigrationError(f"namespace {namespace!r} holds state with {f}={have!r}, "
                                      f"this backend has {f}={want!r}")
    return ns, epoch


def parse_log_name(namespace: str, epoch: int, name) -> str:
    """The task of write-ahead log ``name`` (``statecore:{NS}:wal:<epoch>:<task>``, as the
    backends' ``pre_commit`` return it); InvalidInputError for another namespace or epoch."""
    prefix = NamespaceKeys(namespace).wal(epoch, "")
    if not isinstance(name, str) or not name.startswith(prefix) or len(name) == len(prefix):
        raise InvalidInputError(f"{name!r} is not a write-ahead log of epoch {epoch} of "
                                f"namespace {namespace!r}")
    return name[len(prefix):]


def commit_epoch(url_or_conn, namespace: str, epoch: int, wal_key_names,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Commit ``epoch`` of ``namespace`` in PostgreSQL: in one transaction, check that every
    log named (each task's ``pre_commit`` return value, all of them) is present, discard rows
    of epochs never committed (older than ``epoch``) and of logs not named, record ``epoch``
    as the committed epoch, and drop the versions it superseded and its deletion markers.
    Readers filter rows by the committed epoch, so they see the epoch whole or not at all.

    Returns True when this call committed the epoch, False when ``epoch`` (or a newer one) was
    committed already (nothing changes then: a coordinator may repeat a commit whose answer it
    lost). Raises EpochCommitError when a named log is missing (nothing changed),
    InvalidInputError for bad arguments, ExternalStoreUnavailableError /
    ExternalStoreAuthError / ExternalStateError when the store fails (the transaction then
    committed whole or not at all; call again to find out and finish)."""
    check_epoch(epoch)
    tasks = sorted({parse_log_name(namespace, epoch, n) for n in wal_key_names})
    pg = connect(url_or_conn, timeout_s)
    try:
        with pg.transaction(f"committing epoch {epoch} of {namespace!r}") as conn:
            row = namespace_row(conn, namespace, "FOR UPDATE")
            if row is None:
                raise EpochCommitError(f"epoch {epoch}: no statecore state namespace "
                                       f"{namespace!r} here")
            ns, committed = row[0], row[4]
            if committed is not None and epoch <= committed:
                return False
            logs, rows = {}, 0
            for t, s, e, n, sweep in conn.execute(
                    f"SELECT task, kg_start, kg_end, entries, sweep FROM {SCHEMA}.logs "
                    "WHERE ns = %s AND epoch = %s", (ns, epoch)):
                logs[t] = (s, e, sweep)
                rows += n if t in tasks else 0
            missing = [t for t in tasks if t not in logs]
            if missing:
                raise EpochCommitError(
                    f"epoch {epoch}: write-ahead log "
                    f"{NamespaceKeys(namespace).wal(epoch, missing[0])} is missing (never "
                    "pre-committed, aborted, or lost)")
            low = -1 if committed is None else committed
            # Rows of epochs that were pre-committed but never committed nor aborted.
            for table in ("entries", "states"):
                conn.execute(f"DELETE FROM {SCHEMA}.{table} WHERE ns = %s AND epoch > %s "
                             "AND epoch < %s", (ns, low, epoch))
            conn.execute(f"DELETE FROM {SCHEMA}.logs WHERE ns = %s AND epoch < %s", (ns, epoch))
            covered = sorted({kg for t in tasks for kg in range(logs[t][0], logs[t][1] + 1)})
            conn.execute(f"DELETE FROM {SCHEMA}.entries WHERE ns = %s AND epoch = %s AND "
                         "NOT (kg = ANY(%s))", (ns, epoch, covered))
            conn.execute(f"UPDATE {SCHEMA}.namespaces SET epoch = %s WHERE id = %s",
                         (epoch, ns))
            if rows >= _ANALYZE_ROWS:
                # Planner statistics older than the epoch's COPY (autovacuum lags behind bulk
                # loads) can make the superseded-versions join below a nested loop that scans
                # the namespace once per new row: quadratic, minutes for 10^5 rows. ANALYZE
                # samples a bounded number of rows, small next to an epoch this large.
                conn.execute(f"ANALYZE {SCHEMA}.entries")
            conn.execute(
                f"DELETE FROM {SCHEMA}.entries o USING {SCHEMA}.entries n WHERE n.ns = %s "
                "AND n.epoch = %s AND o.ns = n.ns AND o.kg = n.kg AND o.state = n.state "
                "AND o.key = n.key AND o.epoch < n.epoch", (ns, epoch))
            conn.execute(f"DELETE FROM {SCHEMA}.entries WHERE ns = %s AND epoch = %s AND "
                         "value IS NULL", (ns, epoch))
            conn.execute(
                f"DELETE FROM {SCHEMA}.states o USING {SCHEMA}.states n WHERE n.ns = %s "
                "AND n.epoch = %s AND o.ns = n.ns AND o.name = n.name AND o.epoch < n.epoch",
                (ns, epoch))
            for t in tasks:
                for state, cutoff, kgs, *width in json.loads(logs[t][2] or "[]"):
                    if width:
                        conn.execute(_SWEEP_LIST, dict(ns=ns, state=state, kgs=kgs, epoch=epoch,
                                                       cutoff=cutoff, width=width[0]))
                    else:
                        conn.execute(_SWEEP, (ns, state, kgs, epoch, _INT64_MIN + 1, cutoff))
            conn.execute(f"DELETE FROM {SCHEMA}.logs WHERE ns = %s AND epoch = %s", (ns, epoch))
        return True
    finally:
        if pg is not url_or_conn:
            pg.close()


def read_committed_epoch(url_or_conn, namespace: str,
                         timeout_s: float = DEFAULT_TIMEOUT_S) -> int | None:
    """The committed epoch of ``namespace`` (None before the first commit, or when the
    namespace or the statecore tables do not exist). Store errors as :func:`commit_epoch`."""
    pg = connect(url_or_conn, timeout_s)
    try:
        with pg.transaction(f"reading the committed epoch of {namespace!r}",
                            read_only=True) as conn:
            if conn.execute("SELECT to_regclass(%s) IS NULL",
                            (f"{SCHEMA}.namespaces",)).fetchone()[0]:
                return None
            row = namespace_row(conn, namespace)
        return None if row is None else row[4]
    finally:
        if pg is not url_or_conn:
            pg.close()


def wal_keys(url_or_conn, namespace: str, epoch: int,
             timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """The names of the write-ahead logs of ``epoch`` present in ``namespace`` (pre-committed,
    neither committed nor aborted), sorted."""
    check_epoch(epoch)
    keys = NamespaceKeys(namespace)
    pg = connect(url_or_conn, timeout_s)
    try:
        with pg.transaction(f"listing the write-ahead logs of epoch {epoch}",
                            read_only=True) as conn:
            if conn.execute("SELECT to_regclass(%s) IS NULL", (f"{SCHEMA}.logs",)).fetchone()[0]:
                return []
            rows = conn.execute(
                f"SELECT l.task FROM {SCHEMA}.logs l JOIN {SCHEMA}.namespaces n ON n.id = l.ns "
                "WHERE n.name = %s AND l.epoch = %s", (namespace, epoch)).fetchall()
        return sorted(keys.wal(epoch, t) for (t,) in rows)
    finally:
        if pg is not url_or_conn:
            pg.close()


def abort_epoch(url_or_conn, namespace: str, epoch: int, wal_key_names=None,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Discard the write-ahead logs of uncommitted ``epoch`` (``wal_key_names``, default every
    log of the epoch) and their rows: they are never committed. Returns the number of logs
    deleted, -1 when ``epoch`` is committed already (nothing is deleted then). The tasks
    discard their caches (``abort()``) and replay from the committed epoch. 0 on a database
    without the statecore tables (nothing was ever pre-committed there)."""
    check_epoch(epoch)
    names = None if wal_key_names is None else sorted(
        {parse_log_name(namespace, epoch, n) for n in wal_key_names})
    pg = connect(url_or_conn, timeout_s)
    try:
        with pg.transaction(f"aborting epoch {epoch} of {namespace!r}") as conn:
            if conn.execute("SELECT to_regclass(%s) IS NULL",
                            (f"{SCHEMA}.namespaces",)).fetchone()[0]:
                return 0
            row = namespace_row(conn, namespace, "FOR UPDATE")
            if row is None:
                return 0
            ns, committed = row[0], row[4]
            if committed is not None and epoch <= committed:
                return -1
            logs = conn.execute(f"SELECT task, kg_start, kg_end FROM {SCHEMA}.logs "
                                "WHERE ns = %s AND epoch = %s", (ns, epoch)).fetchall()
            if names is not None:
                logs = [r for r in logs if r[0] in names]
            if names is None:
                conn.execute(f"DELETE FROM {SCHEMA}.entries WHERE ns = %s AND epoch = %s",
                             (ns, epoch))
                conn.execute(f"DELETE FROM {SCHEMA}.states WHERE ns = %s AND epoch = %s",
                             (ns, epoch))
            for _, start, end in logs:
                conn.execute(f"DELETE FROM {SCHEMA}.entries WHERE ns = %s AND epoch = %s AND "
                             "kg BETWEEN %s AND %s", (ns, epoch, start, end))
            conn.execute(f"DELETE FROM {SCHEMA}.logs WHERE ns = %s AND epoch = %s AND "
                         "task = ANY(%s)", (ns, epoch, [r[0] for r in logs]))
            return len(logs)
    finally:
        if pg is not url_or_conn:
            pg.close()


def load_state_metas(conn, ns: int, epoch: int | None) -> dict:
    """``{state name: meta dict}`` committed as of ``epoch`` (one version per state after a
    commit: the newest at or below it)."""
    if epoch is None:
        return {}
    rows = conn.execute(
        f"SELECT DISTINCT ON (name) name, meta FROM {SCHEMA}.states WHERE ns = %s AND "
        "epoch <= %s ORDER BY name, epoch DESC", (ns, epoch)).fetchall()
    return {name: json.loads(meta) for name, meta in rows}
