"""List and map state part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): ``ListState`` and ``MapState`` per
record -- adds, updates, removals, rejected elements and user keys, user keys ordered by their
serialized bytes.
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from statecore import serializers as S
from statecore.descriptors import ListStateDescriptor, MapStateDescriptor
from statecore.errors import InvalidInputError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import dump_backend
from statecore.ttl import ManualClock, StateTtlConfig

__all__ = ["CollectionStateConformance"]


def _leb128(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


#: The order map iteration follows, spelled out from docs/formats.md's key serializations
#: (ascending bytes): the rule the MapState docstring documents, not the backends' code.
_ORDER_KEY = {
    "int32": lambda v: struct.pack(">i", v),
    "int64": lambda v: struct.pack(">q", v),
    "string": lambda v: _leb128(len(v.encode()) + 1) + v.encode(),
    "binary": lambda v: _leb128(len(v)) + v,
}
#: User keys whose byte order differs from their natural order: negative numbers after positive
#: ones, shorter strings first, lengths across the one-byte varlen boundary (127/128).
_ORDER_CASES = {
    "int32": [3, -1, 256, 0, -300, 2**31 - 1, -(2**31), 1],
    "int64": [3, -1, 256, 0, -300, 2**40, -(2**63), 2**63 - 1],
    "string": ["b", "aa", "", "ab", "\u00e9", "B", "a", "x" * 126, "x" * 127, "a" * 200, "z" * 129],
    "binary": [b"b", b"aa", b"", b"\x00", b"\xff", b"a", b"x" * 127, b"a" * 128, b"z" * 300],
}


class CollectionStateConformance(ConformanceBase):
    """``ListState`` and ``MapState`` per record."""

    def test_list_state(self):
        b = self.new_backend()
        ls = b.get_state(ListStateDescriptor("l", "string"))
        b.set_current_key(1)
        assert ls.get() == []
        ls.add("a")
        ls.add_all(["b", "c"])
        assert ls.get() == ["a", "b", "c"]
        ls.add_all([])
        assert ls.get() == ["a", "b", "c"]
        with pytest.raises(InvalidInputError):
            ls.add(None)
        with pytest.raises(InvalidInputError):
            ls.add_all(["d", None])
        with pytest.raises(InvalidInputError):
            ls.add(3)
        assert ls.get() == ["a", "b", "c"]
        ls.update(["z"])
        assert ls.get() == ["z"]
        ls.update([])
        assert ls.get() == [] and b.num_entries() == 0
        ls.add("q")
        ls.clear()
        assert ls.get() == []
        li = b.get_state(ListStateDescriptor("li", "int64"))
        li.add_all([3, 1, 2])
        assert li.get() == [3, 1, 2]
        lp = b.get_state(ListStateDescriptor("lp"))
        lp.add({"x": 1})
        lp.add((2,))
        assert lp.get() == [{"x": 1}, (2,)]

    def test_map_state(self):
        b = self.new_backend()
        m = b.get_state(MapStateDescriptor("m", "string", "int64"))
        b.set_current_key(1)
        assert m.is_empty() and m.items() == [] and m.get("a") is None
        m.put("b", 2)
        m.put("a", 1)
        m.put_all({"c": 3, "b": 20})
        assert m.items() == [("a", 1), ("b", 20), ("c", 3)]
        assert m.keys() == ["a", "b", "c"] and m.values() == [1, 20, 3]
        assert m.contains("a") and not m.contains("zz") and m.get("b") == 20
        m.remove("zz")
        m.remove("a")
        assert m.keys() == ["b", "c"]
        with pytest.raises(InvalidInputError):
            m.put(1, 1)
        with pytest.raises(InvalidInputError):
            m.put("d", "x")
        with pytest.raises(InvalidInputError):
            m.put_all({"e": 1, "f": "bad"})
        assert m.keys() == ["b", "c"]
        m.remove("b")
        m.remove("c")
        assert m.is_empty() and b.num_entries() == 0
        m.put("x", 1)
        m.clear()
        assert m.is_empty()
        b.set_current_key(2)
        assert m.is_empty()

    @pytest.mark.parametrize("ttl", [False, True])
    @pytest.mark.parametrize("user_key_type", sorted(_ORDER_CASES))
    def test_map_iteration_order(self, user_key_type, ttl):
        """items/keys/values list user keys by ascending serialized bytes (MapState docstring),
        whatever the insertion order, with TTL and after a restore too."""
        uks = _ORDER_CASES[user_key_type]
        want = sorted(uks, key=_ORDER_KEY[user_key_type])
        b = self.new_backend(ttl_clock=ManualClock(0))
        d = MapStateDescriptor("m", user_key_type, "int64")
        if ttl:
            d.enable_time_to_live(StateTtlConfig(10**9))
        m = b.get_state(d)
        b.set_current_key(1)
        for i, uk in enumerate(uks):
            m.put(uk, i)
        b.set_current_key(2)
        m.put_all({uk: i for i, uk in reversed(list(enumerate(uks)))})
        b2 = self.new_backend(ttl_clock=ManualClock(0))
        b2.restore(b.snapshot())
        m2 = b2.get_state(d)
        for be, st in ((b, m), (b2, m2)):
            for key in (1, 2):
                be.set_current_key(key)
                assert st.keys() == want
                assert st.values() == [uks.index(uk) for uk in want]
                assert st.items() == [(uk, uks.index(uk)) for uk in want]
        ukt = {"int32": pa.int32(), "int64": pa.int64(), "string": pa.string(),
               "binary": pa.binary()}[user_key_type]
        got = m.get_batch(pa.array([1] * len(want), pa.int64()), pa.array(want, ukt))
        assert got.to_pylist() == [uks.index(uk) for uk in want]
        assert dump_backend(b) == dump_backend(b2)

    def test_map_state_pickle_user_keys(self):
        b = self.new_backend()
        m = b.get_state(MapStateDescriptor("m"))
        b.set_current_key(1)
        m.put((1, "a"), [1])
        m.put(None, "none")
        m.put(frozenset(), {})
        assert m.get((1, "a")) == [1] and m.get(None) == "none" and m.contains(frozenset())
        assert len(m.items()) == 3
        enc = sorted(S.key_serializer("pickle").serialize(k) for k in [(1, "a"), None, frozenset()])
        assert [S.key_serializer("pickle").serialize(k) for k in m.keys()] == enc
