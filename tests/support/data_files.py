"""Data files as older versions or buggy writers made them, for tests: the bytes a snapshot
writes, and those bytes with the footer's metadata rewritten and every checksum recomputed
(docs/formats.md "Data file": footer = u32 meta length | meta JSON | tables; the trailer's first
32 bytes are checksummed into it)."""

from __future__ import annotations

import json
import struct

from statecore.checkpoint import format as fmt

__all__ = ["data_file_bytes", "rewrite_footer_meta"]


def data_file_bytes(snap, version: int, writer: str = "p0"):
    """``(bytes, WriteSummary)`` of the data file ``fmt.write_data_file`` writes for ``snap``."""

    class Out:
        def __init__(self):
            self.parts = []

        def write(self, b):
            self.parts.append(bytes(b))

    out = Out()
    summary = fmt.write_data_file(out, snap, version=version, writer=writer)
    return b"".join(out.parts), summary


def rewrite_footer_meta(raw: bytes, edit, trailer_version: int = fmt.FORMAT_VERSION):
    """``(bytes, footer xxh64)``: data file ``raw`` with its footer metadata (a dict) passed
    through ``edit`` (which changes it in place) and the trailer saying ``trailer_version``,
    footer and trailer checksums recomputed: what a writer of that version, or a buggy one,
    would have written."""
    foff, flen = struct.unpack_from("<QQ", raw, len(raw) - fmt.TRAILER_SIZE)
    footer = raw[foff:foff + flen]
    (mlen,) = struct.unpack_from("<I", footer, 0)
    meta = json.loads(footer[4:4 + mlen])
    edit(meta)
    mb = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    footer = struct.pack("<I", len(mb)) + mb + footer[4 + mlen:]
    fsum = fmt.xxh64(footer)
    head = fmt.TRAILER.pack(foff, len(footer), fsum, trailer_version, 0, 0, fmt.MAGIC)[:32]
    trailer = fmt.TRAILER.pack(foff, len(footer), fsum, trailer_version, 0, fmt.xxh64(head),
                               fmt.MAGIC)
    return raw[:foff] + footer + trailer, fsum
