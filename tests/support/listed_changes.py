"""What an incremental snapshot listed, as differential tests compare it between the Python and
the native backend."""

from __future__ import annotations


class ListedChanges:
    """The changes an incremental snapshot listed (``{(state, encoded key): value or None = a
    tombstone}``) with the full contents at that time (``{(state, encoded key): value}``). Equal
    when both list the same changes, except that the native side may list more as long as they
    are no-ops on the current state: the int64-sum undo of the native kernel (with or without
    TTL) rewrites or removes entries the Python path never touched (it applies its staged writes
    only on success), which leaves a tombstone for a key that was never there or an entry
    "changed" to its own value."""

    def __init__(self, listed: dict, current: dict, python: bool):
        self.listed = listed
        self.current = current
        self.python = python

    def __eq__(self, other):
        if not isinstance(other, ListedChanges):
            return NotImplemented
        py, nat = (self, other) if self.python else (other, self)
        extra = {k: v for k, v in nat.listed.items() if k not in py.listed}
        return (py.current == nat.current
                and all(nat.listed.get(k, "missing") == v for k, v in py.listed.items())
                and all(py.current.get(k) == v for k, v in extra.items()))

    def __repr__(self):
        return f"ListedChanges({self.listed!r})"
