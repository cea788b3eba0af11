"""Operator state of one checkpoint version as an Arrow table.

What Flink's State Processor API gives for non-keyed state (``SavepointReader.readListState``,
``readUnionState``, ``readBroadcastState``), per old task: a version's operator state is stored
once per writer -- the old tasks, in operator index order -- in the first key group of each
writer's range (docs/formats.md "Operator state"); :func:`read_operator_state` decodes every
writer's copy, so the table shows what each task held when the version was written, before any
redistribution a restore with another parallelism would do.
"""

from __future__ import annotations

from typing import Optional

import pyarrow as pa

from statecore import serializers as S
from statecore.errors import CorruptCheckpointError, InvalidInputError
from statecore.offline.entries import key_arrow_type, value_arrow_type
from statecore.offline.state_reader import open_version
from statecore.operator_state import (
    BROADCAST,
    OPERATOR_STATE_PREFIX,
    broadcast_entry_items,
    list_entry_values,
)

__all__ = ["read_operator_state", "operator_state_schema"]


def operator_state_schema(meta: dict) -> pa.Schema:
    """The schema of :func:`read_operator_state`'s table for the operator state of ``meta``
    (its pseudo-state meta): ``operator_index`` int32 (the old task, 0 first); for a list or
    union list state ``position`` uint64 (the element's position in that task's list, 0
    first), for broadcast state ``user_key`` (the user key type's Arrow type); ``value`` the
    value type's Arrow type (binary holding the pickle bytes for ``pickle`` values, never
    unpickled)."""
    if meta["kind"] == BROADCAST:
        second = ("user_key", key_arrow_type(meta["user_key_type"]))
    else:
        second = ("position", pa.uint64())
    return pa.schema([("operator_index", pa.int32()), second,
                      ("value", value_arrow_type(meta["value_type"]))])


def _decode(meta: dict, writer, index: int, rows: list) -> None:
    """Append ``writer``'s entries of ``meta``'s state to ``rows`` as (index, position or user
    key, value); InvalidInputError for an entry that does not decode."""
    prefix = S.key_group_prefix(writer.first_key_group, writer.max_parallelism)
    vser = S.value_serializer(meta["value_type"])
    value = bytes if vser.name == "pickle" else vser.deserialize
    keys, values = writer.entries(meta["name"])
    if meta["kind"] == BROADCAST:
        kser = S.key_serializer(meta["user_key_type"])
        rows.extend((index, kser.deserialize(kb), value(v))
                    for kb, v in broadcast_entry_items(prefix, keys, values))
    else:
        rows.extend((index, i, value(v))
                    for i, v in enumerate(list_entry_values(prefix, keys, values)))


def read_operator_state(store, name: str, version: Optional[int] = None) -> pa.Table:
    """Operator state ``name`` (as registered, e.g. ``"offsets"``; the pseudo-state name
    ``"__operator__.offsets"`` also works) of checkpoint ``version`` (default: the latest) of
    ``store`` (a CheckpointStore or its URI) as a table of :func:`operator_state_schema`: one
    row per list element or broadcast entry of each old task that holds the state, by
    ``operator_index``, lists in list order, broadcast entries by user key bytes.

    Raises CheckpointNotFoundError for a root without that version; InvalidInputError when the
    version has no such operator state; CorruptCheckpointError for a run that cannot be read
    or an entry that does not decode."""
    if not isinstance(name, str) or not name:
        raise InvalidInputError(f"name must be a non-empty str, got {name!r}")
    pname = name if name.startswith(OPERATOR_STATE_PREFIX) else OPERATOR_STATE_PREFIX + name
    with open_version(store, version) as reader:
        writers = reader.operator_state_writers()
        holding = [(i, w) for i, w in enumerate(writers) if pname in w.metas]
        if not holding:
            names = sorted({n[len(OPERATOR_STATE_PREFIX):] for w in writers for n in w.metas})
            raise InvalidInputError(f"checkpoint version {reader.version} has no operator "
                                    f"state {name!r} (operator states: {names})")
        meta = holding[0][1].metas[pname]
        rows: list = []
        for index, w in holding:
            try:
                _decode(meta, w, index, rows)
            except InvalidInputError as exc:
                raise CorruptCheckpointError(
                    f"{w.where}: operator state {name!r}: {exc}") from exc
    schema = operator_state_schema(meta)
    cols = list(zip(*rows)) if rows else [[] for _ in schema]
    return pa.table([pa.array(list(c), f.type) for c, f in zip(cols, schema)], schema=schema)
