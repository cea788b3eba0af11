"""A StateSnapshot (docs/architecture.md "Contract: StateSnapshot") over entries encoded
offline: what :func:`statecore.offline.rewrite_max_parallelism` and
:func:`statecore.offline.bootstrap_checkpoint` hand to ``CheckpointStore.write_snapshot``."""

from __future__ import annotations

import pyarrow as pa

from statecore.checkpoint.format import make_key_group_range

__all__ = ["EntrySnapshot"]


class EntrySnapshot:
    """A full snapshot of the key groups ``[start, end]`` of ``max_parallelism``, keys of
    ``key_type`` assigned by ``assigner``, states ``metas`` (state metas, the ``__timers__``
    one included), entries ``data[state name][key group] = [(key bytes, value bytes), ...]``
    in any order (:meth:`entries` sorts them by key bytes, as the contract asks)."""

    incremental = False
    snapshot_id = None

    def __init__(self, max_parallelism: int, start: int, end: int, key_type: str,
                 assigner: str, metas: list, data: dict):
        self.max_parallelism = max_parallelism
        self.key_group_range = make_key_group_range(start, end)
        self.key_type = key_type
        self.assigner = assigner
        self._metas = metas
        self._data = data

    def state_metas(self) -> list:
        """Copies of the state metas."""
        return [dict(m) for m in self._metas]

    def entries(self, state_name: str, key_group: int):
        """``(keys, values)`` pa.binary arrays of one state and key group, ascending by key
        bytes (empty when there are none)."""
        pairs = self._data.get(state_name, {}).get(key_group)
        if not pairs:
            return pa.array([], pa.binary()), pa.array([], pa.binary())
        pairs.sort(key=lambda p: p[0])
        return (pa.array([p[0] for p in pairs], pa.binary()),
                pa.array([p[1] for p in pairs], pa.binary()))

    def release(self) -> None:
        """Drop the entries (idempotent)."""
        self._data = {}
