"""The entry checks of ``verify``: what a restore would reject, found without restoring.

A restore rejects a run's entries of one (state, key group) when a key is null, not longer than
the key-group prefix, carries another key group's prefix, does not decode as the state's key and
namespace (docs/formats.md "Encoded key"), or when a fixed-width value has another width; a
merge rejects keys that are not strictly ascending. :func:`check_entries` applies all of these,
so ``CheckpointReader.verify`` is at least as strict as a restore. Map-state keys (which carry
a user key) and timer keys (a timestamp first) get the prefix, length and order checks only.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from statecore import serializers as S
from statecore.errors import CorruptCheckpointError, InvalidInputError

__all__ = ["check_entries"]

#: State kinds whose encoded keys are exactly prefix | ser(key) | ser(namespace) (a list
#: state's followed by an element's sequence number).
_PLAIN_KINDS = ("value", "list", "reducing", "aggregating")


def check_entries(where: str, meta: dict, kg: int, keys: pa.Array, vals: pa.Array,
                  max_parallelism: int, key_type: str, incremental: bool,
                  list_entries: bool = True) -> None:
    """Check the entries ``(keys, vals)`` (binary arrays) that one run holds for the state of
    meta ``meta`` in key group ``kg`` (module docstring); ``incremental``: NULL values are
    tombstones there, else not allowed; ``list_entries``: a list state's keys end in an
    element's sequence number (docs/formats.md "List state"; False for a file of a format
    before that, whose list states hold whole lists). Raises CorruptCheckpointError starting
    with ``where`` and naming the state and key group."""
    name = meta.get("name")
    here = f"{where}: state {name!r}, key group {kg}"
    n = len(keys)
    if n == 0:
        return
    if keys.null_count:
        raise CorruptCheckpointError(f"{here}: a key is null")
    if vals.null_count and not incremental:
        raise CorruptCheckpointError(f"{here}: a value is null in a full run")
    kind = meta.get("kind")
    seq = S.LIST_SEQ_BYTES if kind == "list" and list_entries else 0
    width = S.encoded_key_width(kind, key_type, meta.get("namespace_type", "void"),
                                max_parallelism) if kind in _PLAIN_KINDS else None
    if width is not None and kind == "list" and not seq:
        width -= S.LIST_SEQ_BYTES  # a whole list's key: no sequence number
    problem = S.encoded_key_problem(keys, max_parallelism, key_group=kg, width=width)
    if problem is not None:
        raise CorruptCheckpointError(f"{here}: {problem}")
    raw = keys.to_pylist()
    for i in range(1, n):
        if not raw[i - 1] < raw[i]:
            raise CorruptCheckpointError(
                f"{here}: keys are not strictly ascending at entry {i} "
                f"({raw[i - 1].hex()} then {raw[i].hex()})")
    if kind in _PLAIN_KINDS and width is None:  # variable-length parts: decode every key
        for kb in raw:
            try:
                if seq and len(kb) <= seq:
                    raise InvalidInputError(
                        f"list element key {kb.hex()} lacks its {seq}-byte sequence number")
                S.decode_key(kb[:len(kb) - seq], max_parallelism, key_type,
                             meta.get("namespace_type"))
            except InvalidInputError as exc:
                raise CorruptCheckpointError(f"{here}: {exc}") from None
    if kind in ("value", "reducing"):
        vw = S.value_serializer(meta.get("value_type")).fixed_width
        if vw is not None:
            vw += 8 if meta.get("ttl") else 0
            voffs = np.frombuffer(vals.buffers()[1], np.int32)[vals.offset:vals.offset + n + 1]
            sizes = np.diff(voffs)
            live = ~np.asarray(vals.is_null()) if vals.null_count else np.ones(n, bool)
            if np.any(sizes[live] != vw):
                raise CorruptCheckpointError(f"{here}: a value is not {vw} bytes")
