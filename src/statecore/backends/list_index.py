"""The in-memory index of one list of a list state (docs/formats.md "List state").

A list state stores each element as a table entry ``prefix | seq`` (``seq``: the element's
sequence number, 8 bytes big-endian, so encoded key order is list order). The table answers a
lookup of one element; :class:`ListIndex` answers what it cannot without a scan: which
sequence numbers the list holds, in order, and the next one an append uses. It is kept beside
the table in memory only (both backends' tables keep one per (key, namespace)); snapshots hold
the entries, and a restore or change set lists the loaded entries here.
"""

from __future__ import annotations

from statecore.serializers import LIST_SEQ_BYTES

__all__ = ["ListIndex", "seq_bytes"]


def seq_bytes(seq: int) -> bytes:
    """The entry-key bytes of sequence number ``seq`` (0 <= seq < 2**64)."""
    return seq.to_bytes(LIST_SEQ_BYTES, "big")


class ListIndex:
    """The elements of one list: ``seqs`` = ``{seq bytes: None}`` in list order (= ascending
    sequence numbers). The next append takes one past the greatest listed (:meth:`next_seq`),
    so the index is a function of the list's entries alone: a restore rebuilds exactly what
    the writer had. Insertion, removal and :meth:`next_seq` are O(1); iteration O(listed)."""

    __slots__ = ("seqs",)

    def __init__(self):
        self.seqs: dict[bytes, None] = {}

    def next_seq(self) -> int:
        """The sequence number the next append uses: one past the greatest listed, 0 when
        none is."""
        return int.from_bytes(next(reversed(self.seqs)), "big") + 1 if self.seqs else 0

    def insert(self, seqb: bytes) -> None:
        """List ``seqb`` (no-op when listed)."""
        if seqb in self.seqs:
            return
        below = bool(self.seqs) and seqb < next(reversed(self.seqs))
        self.seqs[seqb] = None
        if below:
            # Only entries restored or applied out of append order land here (a change set
            # writing a seq below ones kept from its base): keep list order = seq order.
            self.seqs = dict.fromkeys(sorted(self.seqs))

    def discard(self, seqb: bytes) -> None:
        """Unlist ``seqb`` (no-op when not listed)."""
        self.seqs.pop(seqb, None)

    def __len__(self) -> int:
        return len(self.seqs)
