"""The in-memory index of one list of a list state (docs/formats.md "List state").

A list state stores a list as a sequence of chunks, each a table entry ``prefix | seq``
(``seq``: the chunk's sequence number, 8 bytes big-endian, so encoded key order is list order)
holding up to ``LIST_CHUNK_ELEMENTS`` elements. The table answers a lookup of one chunk;
:class:`ListIndex` answers what it cannot without a scan: which chunks the list holds, in
order, and the last one (where an append goes). It is kept beside
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
    """The chunks of one list: ``seqs`` = ``{seq bytes: None}`` in list order (= ascending
    sequence numbers). An append fills the greatest listed (:meth:`last`) and then takes the
    numbers after it, so the index is a function of the list's entries alone: a restore
    rebuilds exactly what the writer had. Insertion, removal and :meth:`last` are O(1);
    iteration O(listed)."""

    __slots__ = ("seqs",)

    def __init__(self):
        self.seqs: dict[bytes, None] = {}

    def last(self) -> int:
        """The greatest listed sequence number (the list's last chunk; the index of a list
        without chunks is dropped, so one is listed)."""
        return int.from_bytes(next(reversed(self.seqs)), "big")

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
