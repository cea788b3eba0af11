"""The changes of one state between two checkpoint versions, as Arrow record batches.

Spark's ``statestore`` source reads a state store's change feed (``readChangeFeed``); this is its
counterpart over statecore checkpoints: every row (:func:`statecore.offline.read_state`) whose
bytes differ between version ``start`` and version ``end`` becomes one row, ``change_type``
"update" (new or changed at ``end``, with its value there) or "delete" (present at ``start``,
absent at ``end``; null value). Both versions' runs are merged per key group as a restore
merges them. A key group whose entries lie in the
same runs in both versions (an incremental run holds only the key groups it changed, and a
chain shares its older runs across versions) is skipped after a look at the runs' key-group
indexes; the others are compared entry by entry, so the cost is that of reading the key groups
that changed.
"""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import pyarrow as pa

from statecore.errors import CorruptCheckpointError, InvalidInputError
from statecore.offline.entries import EntryDecoder, rows_to_batch, state_schema
from statecore.offline.state_reader import (
    DEFAULT_BATCH_ROWS,
    check_batch_rows,
    clip_key_groups,
    open_version,
    state_meta,
)

__all__ = ["change_schema", "read_changes"]

UPDATE = "update"
DELETE = "delete"


def change_schema(meta: dict, key_type: str) -> pa.Schema:
    """:func:`statecore.offline.entries.state_schema` with a first column ``change_type``
    (string: "update" or "delete")."""
    return state_schema(meta, key_type).insert(0, pa.field("change_type", pa.string()))


def _runs_holding(reader, state_name: str, lo: int, hi: int) -> dict:
    """``{key group: paths of the runs holding entries of state_name there}`` for the key groups
    of ``[lo, hi]`` that any run of ``reader``'s version holds entries of (from the runs'
    key-group indexes: nothing decoded)."""
    out: dict = {}
    for f in reader.manifest["files"]:
        a, b = max(f["key_group_range"][0], lo), min(f["key_group_range"][1], hi)
        if state_name not in f["states"] or a > b:
            continue
        for kg in reader.data_file(f).stored_sizes(state_name, a, b)[0].tolist():
            out.setdefault(kg, set()).add(f["path"])
    return out


def read_changes(store, state_name: str, start_version: int, end_version: Optional[int] = None,
                 key_group_range: Optional[Tuple[int, int]] = None,
                 batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The changes of state ``state_name`` from checkpoint version ``start_version`` to
    ``end_version`` (default: the latest) as record batches of :func:`change_schema`, at most
    ``batch_rows`` rows each, in key-group order; within a key group the updates in
    encoded-key order, then the deletes in encoded-key order. A list's rows are its elements
    by position (:func:`statecore.offline.read_state`): an element that changed or moved is an
    update of its position, positions past the list's new end are deletes. Memory: the entries
    of one key group of both versions, plus one batch.

    ``store``: a CheckpointStore or its URI. Both versions must be retained, with the same max
    parallelism and key type; ``key_group_range`` (``(start, end)`` inclusive) limits the key
    groups read (clipped to what both versions cover). A state absent from ``start_version``
    has only updates (every entry of ``end_version``).

    Raises, at the call: CheckpointNotFoundError for a version not retained,
    InvalidInputError for a state absent from ``end_version``, ``start_version`` after
    ``end_version``, versions of different key types or max parallelism, a timer state, a bad
    ``key_group_range`` or ``batch_rows``; while iterating: CorruptCheckpointError for a run that
    cannot be read or an entry that does not decode."""
    check_batch_rows(batch_rows)
    new = open_version(store, end_version)
    old = None
    try:
        if (isinstance(start_version, bool) or not isinstance(start_version, int)
                or start_version > new.version):
            raise InvalidInputError(f"start_version must be an int <= the end version "
                                    f"{new.version}, got {start_version!r}")
        old = open_version(store, start_version)
        if (old.key_type, old.max_parallelism) != (new.key_type, new.max_parallelism):
            raise InvalidInputError(
                f"versions {old.version} and {new.version} differ in key type or max "
                f"parallelism ({old.key_type}/{old.max_parallelism} vs "
                f"{new.key_type}/{new.max_parallelism})")
        meta = state_meta(new, state_name)
        old_has = any(m["name"] == state_name for m in old.state_metas())
        schema = change_schema(meta, new.key_type)
        lo, hi = clip_key_groups(new, key_group_range)
        if old_has:
            o_lo, o_hi = clip_key_groups(old, key_group_range)
            lo, hi = max(lo, o_lo), min(hi, o_hi)
    except BaseException:
        new.release()
        if old is not None:
            old.release()
        raise
    return _changes(old, new, meta, old_has, schema, lo, hi, batch_rows)


def _changes(old, new, meta: dict, old_has: bool, schema: pa.Schema, lo: int, hi: int,
             batch_rows: int) -> Iterator[pa.RecordBatch]:
    name = meta["name"]
    decoder = EntryDecoder(meta, new.key_type, new.max_parallelism)
    rows: list = []

    def logical(reader, kg: int) -> dict:
        """``{(kg, key, namespace, user_key): value bytes}`` of ``reader``'s version, in
        encoded-key order (list chunks expanded into positioned elements)."""
        keys, values = reader.entries(name, kg)
        try:
            return {r[:4]: r[4] for r in decoder.entries(keys.to_pylist(), values.to_pylist())}
        except InvalidInputError as exc:
            raise CorruptCheckpointError(
                f"checkpoint version {reader.version}: state {name!r}: {exc}") from exc

    def emit(change: str, row: tuple, vb: Optional[bytes], version: int):
        try:
            value, ts = (None, None) if vb is None else decoder.value(vb)
        except InvalidInputError as exc:
            raise CorruptCheckpointError(
                f"checkpoint version {version}: state {name!r}: the value of {row[1:4]!r} does "
                f"not decode: {exc}") from exc
        rows.append((change, *row, value, ts))

    try:
        if lo > hi:
            return
        new_runs = _runs_holding(new, name, lo, hi)
        old_runs = _runs_holding(old, name, lo, hi) if old_has else {}
        for kg in sorted(new_runs.keys() | old_runs.keys()):
            if old_has and old_runs.get(kg) == new_runs.get(kg):
                continue
            before = logical(old, kg) if old_has else {}
            for row, vb in logical(new, kg).items():
                if before.pop(row, None) != vb:
                    emit(UPDATE, row, vb, new.version)
            for row in before:
                emit(DELETE, row, None, old.version)
            while len(rows) >= batch_rows:
                yield rows_to_batch(rows[:batch_rows], schema)
                del rows[:batch_rows]
        if rows:
            yield rows_to_batch(rows, schema)
    finally:
        new.release()
        if old is not None:
            old.release()
