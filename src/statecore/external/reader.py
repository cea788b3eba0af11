"""Reading the committed state of a namespace from outside the job (online features,
counters): :func:`read_committed`. It never sees an uncommitted epoch: write-ahead logs are
not read, and the entries are read in one optimistic transaction that a concurrent commit
restarts."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

from statecore.errors import ExternalStateError, InvalidInputError
from statecore.external.store import (
    DEFAULT_TIMEOUT_S,
    NamespaceKeys,
    connect,
    store_errors,
)
from statecore.key_groups import KeyGroupRange
from statecore.offline.entries import EntryDecoder, rows_to_batch, state_schema
from statecore.ttl import StateTtlConfig, is_expired, wall_clock_ms

__all__ = ["CommittedState", "read_committed", "committed_table", "ttl_reader_now"]

#: Transactions restarted by concurrent commits before read_committed gives up.
MAX_ATTEMPTS = 20


@dataclass(frozen=True)
class CommittedState:
    """One state's committed entries: ``epoch`` (the committed epoch they are; None before the
    first commit), ``meta`` (the state meta) and ``table`` (a pa.Table of the offline readers'
    schema, :func:`statecore.offline.entries.state_schema`: key_group, key, namespace,
    user_key, value, ttl_timestamp_ms; rows by key group, then encoded key)."""

    epoch: int | None
    meta: dict
    table: pa.Table


def read_committed(url_or_client, namespace: str, state: str, key_group_range=None,
                   timeout_s: float = DEFAULT_TIMEOUT_S, now_ms: int | None = None
                   ) -> CommittedState:
    """The committed entries of ``state`` in ``namespace`` (key groups of ``key_group_range``,
    default all), decoded, as of one committed epoch.

    ``url_or_client``: a ``redis://`` URL or a ``redis.Redis`` client returning bytes. The
    read WATCHes the namespace's meta hash (every commit writes it) and reads the state's
    hashes in one MULTI: a commit in between restarts it (up to ``MAX_ATTEMPTS`` times). A TTL
    state's values expired at ``now_ms`` are left out (:func:`ttl_reader_now`: the expired
    values a commit has not swept from the store yet are never returned); the others are
    reported with their timestamp. Raises InvalidInputError for an unknown state or
    namespace, for an event-time TTL state without ``now_ms``, ExternalStateError and its
    subclasses for store failures or too many restarts, InvalidInputError naming the entry
    for bytes that do not decode."""
    from redis.exceptions import WatchError

    keys = NamespaceKeys(namespace)
    client = (connect(url_or_client, timeout_s) if isinstance(url_or_client, str)
              else url_or_client)
    with store_errors(client, f"reading state {state!r} of {namespace!r}"):
        for _ in range(MAX_ATTEMPTS):
            with client.pipeline(transaction=True) as pipe:
                pipe.watch(keys.meta)
                meta_hash = pipe.hgetall(keys.meta)
                if not meta_hash:
                    raise InvalidInputError(f"no statecore state namespace {namespace!r} here")
                raw_meta = pipe.hget(keys.states, state)
                if raw_meta is None:
                    raise InvalidInputError(f"namespace {namespace!r} has no committed state "
                                            f"{state!r}")
                maxp = int(meta_hash[b"max_parallelism"])
                r = (KeyGroupRange.all(maxp) if key_group_range is None
                     else KeyGroupRange.of(key_group_range))
                names = []
                for m in pipe.smembers(keys.groups):
                    parsed = keys.parse_data(m.decode())
                    if parsed is not None and parsed[1] == state and parsed[0] in r:
                        names.append((parsed[0], m))
                names.sort()
                pipe.multi()
                for _, m in names:
                    pipe.hgetall(m)
                try:
                    hashes = pipe.execute()
                except WatchError:
                    continue
            break
        else:
            raise ExternalStateError(f"reading state {state!r} of {namespace!r}: restarted by "
                                     f"{MAX_ATTEMPTS} concurrent commits; try again")
    meta = json.loads(raw_meta)
    now = ttl_reader_now(meta, state, now_ms)
    key_type = meta_hash[b"key_type"].decode()
    epoch = int(meta_hash[b"epoch"]) if b"epoch" in meta_hash else None
    pairs = [item for d in hashes for item in sorted(d.items())]
    return CommittedState(epoch, meta, committed_table(meta, key_type, maxp, pairs, now))


def ttl_reader_now(meta: dict, state: str, now_ms) -> int | None:
    """The time (ms) a reader filters state ``state`` of ``meta`` by: None without TTL, else
    ``now_ms``, by default the wall clock for processing-time TTL (the default ``ttl_clock``
    of a job; a job with another clock passes its time). Event-time TTL expires by the job's
    watermark, which a reader cannot know: InvalidInputError without ``now_ms``."""
    if not meta.get("ttl"):
        return None
    if now_ms is not None:
        if isinstance(now_ms, bool) or not isinstance(now_ms, int):
            raise InvalidInputError(f"now_ms must be an int of milliseconds, got {now_ms!r}")
        return now_ms
    if StateTtlConfig.from_meta(meta["ttl"]).event_time:
        raise InvalidInputError(f"state {state!r} has event-time TTL: pass now_ms (the "
                                "watermark to expire its values by)")
    return wall_clock_ms()


def committed_table(meta: dict, key_type: str, max_parallelism: int, pairs,
                    now_ms: int | None = None) -> pa.Table:
    """The committed entries ``pairs`` (``(encoded key, stored value)`` ordered by key group,
    then encoded key) of the state of ``meta``, decoded into the offline readers' schema
    (:class:`CommittedState`); with ``now_ms`` (a TTL state) the values expired then are left
    out (a list's positions count the elements kept). InvalidInputError naming the entry for
    bytes that do not decode."""
    schema = state_schema(meta, key_type)
    decoder = EntryDecoder(meta, key_type, max_parallelism)
    ttl_ms = StateTtlConfig.from_meta(meta["ttl"]).ttl_ms if meta.get("ttl") else None
    keys = [k for k, _ in pairs]
    rows = []
    listed, pos = None, 0
    for kg, key, ns, uk, vb in decoder.entries(keys, [v for _, v in pairs]):
        value, ts = decoder.value(vb)
        if now_ms is not None and ts is not None and is_expired(ts, ttl_ms, now_ms):
            continue
        if meta["kind"] == "list":
            if (kg, key, ns) != listed:
                listed, pos = (kg, key, ns), 0
            uk, pos = pos, pos + 1
        rows.append((kg, key, ns, uk, value, ts))
    return (pa.Table.from_batches([rows_to_batch(rows, schema)]) if rows
            else schema.empty_table())
