"""Variable-length integers of the byte formats.

Two encodings, both after Flink (byte layout: docs/formats.md "Encoded key"):

* :func:`write_varlen` / :func:`read_varlen`: ``varlen``, Flink's ``StringValue`` length encoding
  (lengths inside keys and stored values).
* :func:`len_bytes`: ``lenbytes``, Flink ``CompositeKeySerializationUtils.writeVariableIntBytes``
  (the length bytes an encoded key carries after a variable-width key and namespace).

Both raise :class:`statecore.errors.InvalidInputError` on bad input or malformed bytes.
"""

from __future__ import annotations

from statecore.errors import InvalidInputError

__all__ = ["write_varlen", "read_varlen", "len_bytes"]


def write_varlen(n: int) -> bytes:
    """``varlen(n)`` of ``n`` (>= 0). InvalidInputError for ``n < 0``."""
    if n < 0:
        raise InvalidInputError(f"varlen of a negative number {n}")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varlen(buf: bytes, pos: int) -> tuple[int, int]:
    """Read a :func:`write_varlen` number at ``pos``; returns ``(value, next_pos)``.
    InvalidInputError when ``buf`` ends inside the number or it has more than 64 bits."""
    n = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise InvalidInputError("truncated varlen")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7
        if shift > 63:
            raise InvalidInputError("varlen longer than 64 bits")


def len_bytes(n: int) -> bytes:
    """``lenbytes(n)`` of ``n`` (>= 0), Flink
    ``CompositeKeySerializationUtils.writeVariableIntBytes``. InvalidInputError for ``n < 0``."""
    if n < 0:
        raise InvalidInputError(f"lenbytes of a negative number {n}")
    out = bytearray()
    while True:
        out.append(n & 0xFF)
        n >>= 8
        if n == 0:
            return bytes(out)
