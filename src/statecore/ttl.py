"""State time-to-live: :class:`StateTtlConfig` and the expiry rule (after Flink's
``StateTtlConfig`` and ``TtlUtils``).

A state whose descriptor carries a TTL config stores every value, list element and map entry with
the time of its last access (milliseconds, int64): in memory next to the value, in snapshots and
checkpoint files as a suffix after the value's bytes (byte layout: docs/formats.md "TTL
suffix"). An entry with timestamp ``ts`` is expired at time ``now`` when ``ts + ttl_ms <= now``
-- exactly at ``ts + ttl_ms`` it is expired -- unless ``ts + ttl_ms`` overflows int64, in which case
it never expires (Flink ``TtlUtils.expired``).

Time: ``processing_time`` (Flink's only option) reads the backend's processing-time clock, an
injectable callable returning milliseconds (``KeyedStateBackend(ttl_clock=...)``; default the
wall clock; tests use :class:`ManualClock`). ``event_time`` (new, not in Flink) uses the
backend's event time: the highest watermark seen through ``backend.observe_watermark(ms)`` (the
Spark operator calls it with each micro-batch's watermark before the processor runs) or
``backend.timers.advance_watermark(ms)``. Before any watermark the time is the lowest int64:
nothing expires and writes are stamped with it; the first watermark then re-stamps those writes
with itself (once per backend), so they count as written at the first watermark -- never
earlier than they happened, since a watermark is at least the event time of what came before.

Cleanup (each per state, Flink's strategies): on read (always); ``cleanup_full_snapshot``
(expired entries left out of full snapshots); ``cleanup_incrementally`` (a lazy global iterator
per state over its key groups, a step of ``cleanup_size`` entries before each state access --
before each row of a batch call, so a batch equals its rows one at a time -- optionally also
per record: ``set_current_key`` and each batch row); ``cleanup_in_compaction`` (checkpoint
store compaction, the clock re-read every N entries: :class:`CompactionTimeProvider`);
``cleanup_in_background`` (``backend.run_background_ttl_cleanup()``, a key group at a time).
The native backend runs the filter in C++ (``native/include/statecore/ttl.h``), byte-identical
to :func:`filter_expired`; so does store compaction (:func:`compaction_filter`) whenever the
extension is built, whichever backend wrote the checkpoint.

Migration: restoring state written with TTL off under a descriptor with TTL on, or the reverse,
raises StateMigrationError (as Flink does) unless the descriptor asks for the conversion with
``descriptor.enable_ttl_migration()`` (not persisted; a no-op when nothing differs). Off -> on:
every value, list element and map entry is stamped with the TTL clock's time at migration
(processing time: the clock; event time: the current watermark, or the lowest int64 before the
first one, which the first watermark then re-stamps like any write) -- migrated entries count as
written then. On -> off: what is expired under the checkpoint's TTL config at the clock's current
time is dropped (list elements and map entries one by one; counted as ``migration`` in
``backend.ttl_statistics()``), the rest loses its timestamp. The state is converted when it is
matched to the descriptor -- ``get_state`` after a restore, or ``restore`` of a state registered
before -- and never once its state objects are in use (StateMigrationError). All or nothing: a
value whose bytes do not have the expected layout fails the migration with StateMigrationError
(native backend; the Python backend rejects such a snapshot on restore, InvalidInputError) and
the state stays as restored. Cost: one pass over the state's entries (native: in C++, each value
converted twice -- a checking pass, then the writing pass -- and one key group's entries copied
at a time; restoring into a registered state stages the converted copy first). Until a snapshot
taken after the migration completes, ``snapshot(incremental=True)`` takes a full snapshot: the
base holds the old format, which a checkpoint chain cannot mix with the new one.
"""

from __future__ import annotations

import enum
import time
from typing import Callable, Optional

import pyarrow as pa

from statecore.errors import InvalidInputError
from statecore.varint import read_varlen

__all__ = [
    "entry_layout",
    "StateTtlConfig",
    "UpdateType",
    "StateVisibility",
    "TtlTimeCharacteristic",
    "ManualClock",
    "is_expired",
    "expiration_time",
    "filter_expired",
    "filter_expired_counted",
    "filter_entries",
    "CompactionTimeProvider",
    "compaction_filter",
    "INT64_MIN",
    "INT64_MAX",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class UpdateType(str, enum.Enum):
    """When the last-access timestamp is renewed (Flink ``StateTtlConfig.UpdateType``)."""

    #: Flink: TTL switched off. StateTtlConfig rejects it (leave TTL off instead).
    Disabled = "Disabled"
    #: On creation and on every write (default).
    OnCreateAndWrite = "OnCreateAndWrite"
    #: Also on every successful read.
    OnReadAndWrite = "OnReadAndWrite"


class StateVisibility(str, enum.Enum):
    """Whether a read may see an expired entry not yet cleaned up (Flink
    ``StateTtlConfig.StateVisibility``)."""

    #: An expired entry is never returned (default); the read removes it.
    NeverReturnExpired = "NeverReturnExpired"
    #: An expired entry that is still stored is returned once; the read removes it.
    ReturnExpiredIfNotCleanedUp = "ReturnExpiredIfNotCleanedUp"


class TtlTimeCharacteristic(str, enum.Enum):
    """Which clock ages entries: the processing-time clock (Flink) or the watermark (new)."""

    ProcessingTime = "processing_time"
    EventTime = "event_time"


def _positive_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise InvalidInputError(f"{name} must be an int > 0, got {v!r}")
    if v > INT64_MAX:
        raise InvalidInputError(f"{name} must fit in int64, got {v!r}")
    return v


def _enum(cls, v, name: str):
    try:
        return cls(v.value if isinstance(v, enum.Enum) else v)
    except ValueError:
        raise InvalidInputError(
            f"{name} must be one of {', '.join(m.value for m in cls)}, got {v!r}") from None


class StateTtlConfig:
    """Time-to-live of a state (attach with ``descriptor.enable_time_to_live(config)``).

    Args:
        ttl_ms: time to live in milliseconds (int, > 0; ``2**63 - 1`` is allowed and never
            expires thanks to the overflow guard).
        update_type: :class:`UpdateType` (or its name); ``Disabled`` is rejected -- leave TTL
            off instead (Flink treats it the same way).
        state_visibility: :class:`StateVisibility` (or its name).
        time_characteristic: ``"processing_time"`` (default) or ``"event_time"``.
        cleanup_full_snapshot: leave expired entries out of full snapshots and savepoints.
        cleanup_incrementally: ``cleanup_size`` > 0 to visit that many entries per state access
            (Flink default 5) and remove expired ones, resuming where the last step stopped.
        run_cleanup_for_every_record: with incremental cleanup, also step on every record
            (``set_current_key``, and each row of any batch call: a batch row is a record),
            not only on state accesses.
        cleanup_in_compaction: when checkpoint runs are merged, drop expired entries; the clock
            is re-read every ``query_time_after_num_entries`` entries (Flink default 1000).
        cleanup_in_background: expire a key group at a time when the backend is idle
            (``backend.run_background_ttl_cleanup()``).

    Raises InvalidInputError for a bad value. ``meta()`` is the JSON-able form written into
    snapshots and compared on restore (TTL on vs off is a state migration).

    Counts of what each strategy removed: ``backend.ttl_statistics()``, per checkpoint version in
    the manifest (``ttl_expired``, ``ttl_compaction_expired``) and ``statecore inspect``.
"""

    def __init__(self, ttl_ms: int, *,
                 update_type=UpdateType.OnCreateAndWrite,
                 state_visibility=StateVisibility.NeverReturnExpired,
                 time_characteristic=TtlTimeCharacteristic.ProcessingTime,
                 cleanup_full_snapshot: bool = False,
                 cleanup_incrementally: Optional[int] = None,
                 run_cleanup_for_every_record: bool = False,
                 cleanup_in_compaction: Optional[int] = None,
                 cleanup_in_background: bool = False):
        self.ttl_ms = _positive_int("ttl_ms", ttl_ms)
        self.update_type = _enum(UpdateType, update_type, "update_type")
        if self.update_type is UpdateType.Disabled:
            raise InvalidInputError("update_type Disabled means no TTL: do not enable TTL instead")
        self.state_visibility = _enum(StateVisibility, state_visibility, "state_visibility")
        self.time_characteristic = _enum(TtlTimeCharacteristic, time_characteristic,
                                         "time_characteristic")
        self.cleanup_full_snapshot = bool(cleanup_full_snapshot)
        self.cleanup_size = None if cleanup_incrementally is None else \
            _positive_int("cleanup_incrementally", cleanup_incrementally)
        self.run_cleanup_for_every_record = bool(run_cleanup_for_every_record)
        if self.run_cleanup_for_every_record and self.cleanup_size is None:
            raise InvalidInputError("run_cleanup_for_every_record needs cleanup_incrementally")
        self.query_time_after_num_entries = None if cleanup_in_compaction is None else \
            _positive_int("cleanup_in_compaction", cleanup_in_compaction)
        self.cleanup_in_background = bool(cleanup_in_background)

    @property
    def update_on_read(self) -> bool:
        """True for ``UpdateType.OnReadAndWrite``: a successful read renews the timestamp."""
        return self.update_type is UpdateType.OnReadAndWrite

    @property
    def return_expired(self) -> bool:
        """True for ``StateVisibility.ReturnExpiredIfNotCleanedUp``: a read returns an expired
        value once, removing it."""
        return self.state_visibility is StateVisibility.ReturnExpiredIfNotCleanedUp

    @property
    def event_time(self) -> bool:
        """True for event-time TTL: the clock is the timers' watermark (ms), not
        ``ttl_clock``."""
        return self.time_characteristic is TtlTimeCharacteristic.EventTime

    def meta(self) -> dict:
        """JSON-able description (snapshot metadata)."""
        return {
            "ttl_ms": self.ttl_ms,
            "update_type": self.update_type.value,
            "state_visibility": self.state_visibility.value,
            "time_characteristic": self.time_characteristic.value,
            "cleanup_full_snapshot": self.cleanup_full_snapshot,
            "cleanup_incrementally": self.cleanup_size,
            "run_cleanup_for_every_record": self.run_cleanup_for_every_record,
            "cleanup_in_compaction": self.query_time_after_num_entries,
            "cleanup_in_background": self.cleanup_in_background,
        }

    @classmethod
    def from_meta(cls, meta: dict) -> "StateTtlConfig":
        """Inverse of :meth:`meta`; InvalidInputError for a malformed dict."""
        if not isinstance(meta, dict) or "ttl_ms" not in meta:
            raise InvalidInputError(f"not a TTL config: {meta!r}")
        return cls(meta["ttl_ms"], update_type=meta.get("update_type", "OnCreateAndWrite"),
                   state_visibility=meta.get("state_visibility", "NeverReturnExpired"),
                   time_characteristic=meta.get("time_characteristic", "processing_time"),
                   cleanup_full_snapshot=meta.get("cleanup_full_snapshot", False),
                   cleanup_incrementally=meta.get("cleanup_incrementally"),
                   run_cleanup_for_every_record=meta.get("run_cleanup_for_every_record", False),
                   cleanup_in_compaction=meta.get("cleanup_in_compaction"),
                   cleanup_in_background=meta.get("cleanup_in_background", False))

    def __eq__(self, other):
        return isinstance(other, StateTtlConfig) and self.meta() == other.meta()

    def __repr__(self):
        return f"StateTtlConfig({self.meta()!r})"


def expiration_time(ts: int, ttl_ms: int) -> int:
    """``ts + ttl_ms``, or INT64_MAX when that overflows int64 (never expires)."""
    t = ts + ttl_ms
    return INT64_MAX if t > INT64_MAX else t


def is_expired(ts: int, ttl_ms: int, now: int) -> bool:
    """Flink ``TtlUtils.expired``: ``ts + ttl <= now``; never when ``ts + ttl`` overflows int64."""
    t = ts + ttl_ms
    return t <= INT64_MAX and t <= now


def filter_expired(kind: str, fixed_width: Optional[int], ttl_ms: int, now: int,
                   value: bytes) -> Optional[bytes]:
    """The compaction filter over one serialized TTL value (after frocksdb's
    ``FlinkCompactionFilter``; layouts and what is kept: docs/formats.md "TTL suffix"):
    returns ``value`` unchanged when nothing in it expired, the trimmed bytes when part of it did,
    or None when all of it expired (drop the entry).

    ``kind``: value, reducing, aggregating, list or map (a map entry is filtered as a value);
    ``fixed_width``: a list's element width in bytes without the suffix, None for
    variable-width elements. Raises InvalidInputError for a list value whose layout is broken,
    or another kind."""
    return filter_expired_counted(kind, fixed_width, ttl_ms, now, value)[0]


def filter_expired_counted(kind: str, fixed_width: Optional[int], ttl_ms: int, now: int,
                           value: bytes) -> tuple[Optional[bytes], int]:
    """:func:`filter_expired` and the number of expired things it removed: 1 for a dropped
    value or map entry, the leading expired list elements (native ``ttl.h`` ``filter_value``
    counts the same)."""
    if kind in ("value", "reducing", "aggregating", "map"):
        # A map state's entry is one user value with its own timestamp (docs/formats.md
        # "Map state"), filtered as a value.
        if len(value) < 8 or not is_expired(_ts_at(value, len(value) - 8), ttl_ms, now):
            return value, 0
        return None, 1
    if kind == "list":
        pos = 0
        dropped = 0
        while pos < len(value):
            start = pos
            if fixed_width:
                n = fixed_width
            else:
                n, pos = read_varlen(value, pos)
            end = pos + n + 8
            if end > len(value):
                raise InvalidInputError("truncated TTL list element")
            if not is_expired(_ts_at(value, end - 8), ttl_ms, now):
                return (value if not dropped else value[start:]), dropped
            dropped += 1
            pos = end
        return None, dropped
    raise InvalidInputError(f"no TTL filter for state kind {kind!r}")


def entry_layout(kind: str) -> str:
    """The state kind whose value layout an entry of a ``kind`` state has, as the TTL filters
    and passes take it: ``"value"`` for a map state (one entry per user key, docs/formats.md
    "Map state"), else ``kind`` (a list state's entry is a chunk of elements in the list
    layout, "List state")."""
    return "value" if kind == "map" else kind


def filter_entries(kind: str, fixed_width: Optional[int], ttl_ms: int, now: int, keys, values):
    """:func:`filter_expired` over one key group's sorted ``(keys, values)`` ``pa.binary()``
    arrays (no tombstones): returns ``(keys, values, expired)`` with the dropped entries left
    out and trimmed values replaced; ``expired`` counts what was removed as
    :func:`filter_expired_counted` does (an empty list or map value, which holds nothing alive,
    is dropped without being counted). The arrays come back unchanged (same objects) when
    nothing changed. InvalidInputError for a NULL value
    and as :func:`filter_expired`."""
    if values.null_count:
        raise InvalidInputError("a NULL value (tombstone) among the values to filter")
    vals = values.to_pylist()
    out_k, out_v, expired = [], [], 0
    ks = None
    for i, v in enumerate(vals):
        f, n = filter_expired_counted(kind, fixed_width, ttl_ms, now, v)
        expired += n
        # Dropped or trimmed; an empty list/map value is dropped with nothing expired in it.
        if f is not v and ks is None:
            ks = keys.to_pylist()
            out_k, out_v = ks[:i], vals[:i]
        if ks is not None and f is not None:
            out_k.append(ks[i])
            out_v.append(f)
    if ks is None:
        return keys, values, 0
    return pa.array(out_k, pa.binary()), pa.array(out_v, pa.binary()), expired


class CompactionTimeProvider:
    """The compaction filter's time (frocksdb ``FlinkCompactionFilter``: the time provider is
    queried once, then again only after every ``query_time_after_num_entries`` processed
    entries, because reading the clock per entry costs more than the filter itself).

    ``clock``: callable returning ms. ``now()`` is the cached time; ``processed(n)`` reports n
    more entries and re-reads the clock each time the count passes a multiple of the period
    (the ``queries`` attribute counts the clock reads)."""

    def __init__(self, clock: Callable[[], int], query_time_after_num_entries: int):
        self._clock = clock
        self.period = _positive_int("query_time_after_num_entries", query_time_after_num_entries)
        self._since = 0
        self.queries = 0
        self._now = self._read()

    def _read(self) -> int:
        now = self._clock()
        if isinstance(now, bool) or not isinstance(now, int):
            raise InvalidInputError(f"the TTL clock returned {now!r}, not an int (ms)")
        self.queries += 1
        return now

    def now(self) -> int:
        """The cached time (ms) the filter compares against."""
        return self._now

    def budget(self) -> int:
        """Entries that may still be filtered with the cached time."""
        return self.period - self._since

    def processed(self, n: int) -> None:
        """Report ``n`` more filtered entries; re-reads the clock once the count reaches the
        period (InvalidInputError when the clock returns no int)."""
        self._since += n
        if self._since >= self.period:
            self._since = 0
            self._now = self._read()


_native_filter_entries = None  # statecore._native.ttl_filter_entries once looked up
_native_looked_up = False


def _chunk_filter(native: Optional[bool]):
    """The per-chunk filter: the C++ one when ``native`` is True, or None and the extension
    imports; :func:`filter_entries` when False, or None and it does not. ImportError when
    ``native`` is True and the extension is not built."""
    global _native_filter_entries, _native_looked_up
    if native is False:
        return filter_entries
    if not _native_looked_up:
        # Looked up on first use, so that importing statecore.ttl never loads the extension.
        try:
            from statecore._native import ttl_filter_entries
            _native_filter_entries = ttl_filter_entries
        except ImportError:
            _native_filter_entries = None
        _native_looked_up = True
    if _native_filter_entries is None:
        if native:
            raise ImportError("statecore._native (the C++ extension) is not built")
        return filter_entries
    return _native_filter_entries


def compaction_filter(kind: str, fixed_width: Optional[int], ttl_ms: int,
                      time: CompactionTimeProvider, keys, values, *,
                      native: Optional[bool] = None):
    """:func:`filter_entries` with the time re-read every ``time.period`` entries: the checkpoint
    store's TTL compaction filter, after frocksdb's ``FlinkCompactionFilter`` (the entries of one
    chunk share one cached time; the count of entries since the last clock read carries over
    between calls, i.e. key groups and states). ``ttl_ms`` and the clock's times are
    milliseconds; ``keys``/``values`` are one key group's sorted ``pa.binary()`` arrays without
    tombstones. Returns ``(keys, values, expired)`` as :func:`filter_entries` does (the same
    objects when nothing expired).

    Each chunk runs in C++ (``statecore._native.ttl_filter_entries``, ttl.h ``filter_values``,
    byte-identical to :func:`filter_entries`, which stays the reference) when the extension
    imports; ``native=False`` forces the Python filter, ``native=True`` requires the C++ one
    (ImportError without it). Raises InvalidInputError for a list or map value whose layout is
    broken, or a NULL value."""
    n = len(keys)
    if n == 0:
        return keys, values, 0
    chunk_filter = _chunk_filter(native)
    parts, expired, pos, changed = [], 0, 0, False
    while pos < n:
        take = min(time.budget(), n - pos)
        vs = values.slice(pos, take)
        k, v, e = chunk_filter(entry_layout(kind), fixed_width, ttl_ms, time.now(),
                               keys.slice(pos, take), vs)
        time.processed(take)
        parts.append((k, v))
        expired += e
        changed = changed or v is not vs  # an empty list/map value is dropped uncounted
        pos += take
    if not changed:
        return keys, values, 0
    return (pa.concat_arrays([k for k, _ in parts]), pa.concat_arrays([v for _, v in parts]),
            expired)


def _ts_at(b: bytes, pos: int) -> int:
    return int.from_bytes(b[pos:pos + 8], "big", signed=True)


class ManualClock:
    """A processing-time clock for tests: ``clock()`` returns ``now`` (ms); ``advance(ms)`` and
    ``set(ms)`` move it (backwards too, as Flink's tests do)."""

    def __init__(self, now: int = 0):
        self.now = int(now)

    def __call__(self) -> int:
        return self.now

    def set(self, now: int) -> None:
        """Set the time to ``now`` (ms)."""
        self.now = int(now)

    def advance(self, ms: int) -> None:
        """Move the time by ``ms`` (milliseconds; negative moves it back)."""
        self.now += int(ms)


def wall_clock_ms() -> int:
    """Milliseconds since the epoch (the default processing-time clock)."""
    return time.time_ns() // 1_000_000


TtlClock = Callable[[], int]
