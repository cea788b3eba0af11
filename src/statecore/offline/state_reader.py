"""One state of one checkpoint version as Arrow record batches, in bounded memory.

What Flink's State Processor API (``SavepointReader.readKeyedState``) and Spark's ``statestore``
data source give their users: the committed state as data, read from the checkpoint without a
running job. The runs of the version are merged newest-wins per key group, as a restore merges
them (:meth:`statecore.checkpoint.CheckpointReader.entries_chunks`), a few key groups at a time,
so memory stays bounded by the chunk size whatever the state's size. Each entry becomes one row:
a value state's value, a reducing or aggregating state's accumulator, one row per list element
(``user_key`` = its position in the list, rows in list order, the list's chunks expanded) and
one row per map entry
(``user_key`` = the user key). docs/formats.md defines the bytes decoded here.
"""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import pyarrow as pa

from statecore.checkpoint import CheckpointStore
from statecore.errors import CheckpointNotFoundError, CorruptCheckpointError, InvalidInputError
from statecore.offline.entries import EntryDecoder, rows_to_batch, state_schema

__all__ = ["read_state", "open_version", "clip_key_groups", "check_batch_rows", "state_meta"]

#: Rows per record batch :func:`read_state` yields by default.
DEFAULT_BATCH_ROWS = 65_536


def check_batch_rows(batch_rows) -> int:
    """``batch_rows`` when it is an int >= 1, else InvalidInputError."""
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise InvalidInputError(f"batch_rows must be an int >= 1, got {batch_rows!r}")
    return batch_rows


def open_version(store, version: Optional[int]):
    """A :class:`~statecore.checkpoint.CheckpointReader` of ``version`` (None: the latest) of
    ``store`` (a CheckpointStore or its URI). CheckpointNotFoundError when there is none."""
    if not isinstance(store, CheckpointStore):
        store = CheckpointStore(store)
    if version is None:
        version = store.latest_version()
        if version is None:
            raise CheckpointNotFoundError(f"no committed checkpoint under {store.uri}")
    return store.open(version)


def clip_key_groups(reader, key_group_range) -> Tuple[int, int]:
    """``(lo, hi)``: ``key_group_range`` (``(start, end)`` inclusive, or None for all) clipped
    to ``reader``'s version; ``lo > hi`` when they do not meet. InvalidInputError for a range
    that is not two ints or is empty."""
    lo, hi = reader.key_group_range.start, reader.key_group_range.end
    if key_group_range is None:
        return lo, hi
    try:
        start, end = (int(x) for x in key_group_range)
    except (TypeError, ValueError):
        raise InvalidInputError(
            f"key_group_range must be (start, end), got {key_group_range!r}") from None
    if start > end:
        raise InvalidInputError(f"key_group_range {key_group_range!r} is empty")
    return max(lo, start), min(hi, end)


def state_meta(reader, state_name: str) -> dict:
    """The meta of ``state_name`` in ``reader``'s version; InvalidInputError when absent."""
    metas = {m["name"]: m for m in reader.state_metas()}
    if state_name not in metas:
        raise InvalidInputError(f"checkpoint version {reader.version} has no state "
                                f"{state_name!r} (states: {sorted(metas)})")
    return metas[state_name]


def read_state(store, state_name: str, version: Optional[int] = None,
               key_group_range: Optional[Tuple[int, int]] = None,
               batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The entries of state ``state_name`` of checkpoint ``version`` (default: the latest) as
    record batches of :func:`state_schema`, at most ``batch_rows`` rows each, in key-group
        order and, within a key group, in encoded-key order (a list's elements in list order, its
    chunks expanded: ``user_key`` is the element's position).

    ``store``: a :class:`~statecore.checkpoint.CheckpointStore` or its URI.
    ``key_group_range``: ``(start, end)`` inclusive, to read a part of the key groups (e.g. one
    task's share), clipped to the version's range. Expired TTL entries not yet cleaned up are
    read as stored (their ``ttl_timestamp_ms`` says so). Memory: the decoded runs of a few key
    groups at a time (``CheckpointReader.entries_chunks``), plus one batch.

    Raises, at the call: CheckpointNotFoundError for a root without that version,
    InvalidInputError for an unknown state, a timer state, a bad ``key_group_range`` or
    ``batch_rows``; while iterating: CorruptCheckpointError for a run that cannot be read or an
    entry that does not decode."""
    check_batch_rows(batch_rows)
    reader = open_version(store, version)
    try:
        meta = state_meta(reader, state_name)
        schema = state_schema(meta, reader.key_type)
        lo, hi = clip_key_groups(reader, key_group_range)
    except BaseException:
        reader.release()
        raise
    return _batches(reader, meta, schema, lo, hi, batch_rows)


def _batches(reader, meta: dict, schema: pa.Schema, lo: int, hi: int,
             batch_rows: int) -> Iterator[pa.RecordBatch]:
    """:func:`read_state`'s batches; releases ``reader`` when done or closed."""
    name = meta["name"]
    decoder = EntryDecoder(meta, reader.key_type, reader.max_parallelism)
    rows: list = []
    try:
        for keys, values in (reader.entries_chunks(name, lo, hi) if lo <= hi else ()):
            try:
                for kg, key, ns, uk, vb in decoder.entries(keys.to_pylist(),
                                                           values.to_pylist()):
                    value, ts = decoder.value(vb)
                    rows.append((kg, key, ns, uk, value, ts))
                    if len(rows) == batch_rows:
                        yield rows_to_batch(rows, schema)
                        rows = []
            except InvalidInputError as exc:
                raise CorruptCheckpointError(
                    f"checkpoint version {reader.version}: state {name!r}: {exc}") from exc
        if rows:
            yield rows_to_batch(rows, schema)
    finally:
        reader.release()
