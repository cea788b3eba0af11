"""The native UTF-8 validator (native/include/statecore/detail/utf8.h, through
``_native.utf8_errors``) against Python's own decoder, ``bytes.decode("utf-8")``: every sequence
of one and two bytes, every three-byte sequence starting with a three-byte lead, four-byte
sequences over every lead and second byte, random strings (fixed seed), and Markus Kuhn's UTF-8
decoder stress test cases. Validity, the position of the first ill-formed sequence and whether
the string ended inside one ("unexpected end of data") must agree."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from statecore import _native

TRUNCATED = "truncated sequence"


def _python(s: bytes):
    """(valid, start of the first ill-formed sequence, truncated) by Python's decoder."""
    try:
        s.decode("utf-8")
        return True, 0, False
    except UnicodeDecodeError as e:
        return False, e.start, e.reason == "unexpected end of data"


def _check_all(strings: list[bytes]) -> None:
    offsets = np.zeros(len(strings) + 1, np.int64)
    offsets[1:] = np.cumsum([len(s) for s in strings])
    data = np.frombuffer(b"".join(strings), np.uint8)
    codes, at = _native.utf8_errors(offsets, data)
    truncated = next(c for c in range(1, 16) if _native.utf8_error_name(c) == TRUNCATED)
    mismatches = []
    for i, s in enumerate(strings):
        valid, start, trunc = _python(s)
        got = (codes[i] == 0, int(at[i]) if codes[i] else 0, bool(codes[i] == truncated))
        if got != (valid, start, trunc):
            mismatches.append((s, got, (valid, start, trunc)))
            if len(mismatches) > 10:
                break
    assert not mismatches


def test_every_one_and_two_byte_sequence():
    _check_all([bytes([a]) for a in range(256)])
    _check_all([bytes([a, b]) for a in range(256) for b in range(256)])


def test_every_three_byte_sequence_with_a_three_byte_lead():
    _check_all([bytes([a, b, c]) for a in range(0xE0, 0xF0) for b in range(256)
                for c in range(256)])


def test_four_byte_sequences_over_every_lead_and_second_byte():
    tails = [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0xBF, 0xC0, 0xFF]
    _check_all([bytes([a, b, c, d]) for a in range(0xF0, 0x100) for b in range(256)
                for c, d in itertools.product(tails, tails)])


def test_random_strings():
    rng = random.Random(1)
    chars = ["a", " ", "é", "€", "\uffff", "😀", "\U0010ffff"]
    strings = []
    for _ in range(50_000):
        s = bytearray("".join(rng.choice(chars) for _ in range(rng.randrange(12))).encode())
        if s and rng.random() < 0.5:
            s[rng.randrange(len(s))] = rng.randrange(256)
        strings.append(bytes(s))
    strings += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
                for _ in range(20_000)]
    _check_all(strings)


# Markus Kuhn, "UTF-8 decoder capability and stress test", sections 2-5.
KUHN = [
    b"\x00", b"\xc2\x80", b"\xe0\xa0\x80", b"\xf0\x90\x80\x80", b"\xf8\x88\x80\x80\x80",
    b"\xfc\x84\x80\x80\x80\x80", b"\x7f", b"\xdf\xbf", b"\xef\xbf\xbf", b"\xf7\xbf\xbf\xbf",
    b"\xed\x9f\xbf", b"\xee\x80\x80", b"\xef\xbf\xbd", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80",
    b"\x80", b"\xbf", b"\x80\xbf", b"\x80\xbf\x80", bytes(range(0x80, 0xc0)),
    b" ".join(bytes([c]) for c in range(0xc0, 0x100)),
    b"\xc0", b"\xe0\x80", b"\xf0\x80\x80", b"\xdf", b"\xef\xbf", b"\xf7\xbf\xbf",
    b"\xc0\xe0\x80\xf0\x80\x80\xdf\xef\xbf\xf7\xbf\xbf", b"\xfe", b"\xff", b"\xfe\xfe\xff\xff",
    b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf", b"\xc1\xbf", b"\xe0\x9f\xbf",
    b"\xf0\x8f\xbf\xbf", b"\xc0\x80", b"\xe0\x80\x80", b"\xf0\x80\x80\x80",
    b"\xed\xa0\x80", b"\xed\xad\xbf", b"\xed\xae\x80", b"\xed\xaf\xbf", b"\xed\xb0\x80",
    b"\xed\xbe\x80", b"\xed\xbf\xbf", b"\xed\xa0\x80\xed\xb0\x80", b"\xed\xaf\xbf\xed\xbf\xbf",
    b"\xef\xbf\xbe", b"\xef\xb7\x90", b"\xf4\x8f\xbf\xbe", "κόσμε".encode(),
]


@pytest.mark.parametrize("pad", [0, 1, 7, 8, 15, 16, 17, 33])
def test_markus_kuhn_stress_cases_at_each_alignment(pad):
    """The cases after ``pad`` ASCII bytes and before a few more: the 8- and 16-byte ASCII
    steps of the validator meet each at a different point."""
    _check_all([b"a" * pad + k + b"bc" for k in KUHN] + [b"a" * pad + k for k in KUHN])
