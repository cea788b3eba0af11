"""List and map state part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): ``ListState`` and ``MapState`` per
record -- adds, updates, removals, rejected elements and user keys, user keys ordered by their
serialized bytes.
"""

from __future__ import annotations

import pytest

from statecore import serializers as S
from statecore.descriptors import ListStateDescriptor, MapStateDescriptor
from statecore.errors import InvalidInputError
from statecore.testing.base import ConformanceBase

__all__ = ["CollectionStateConformance"]


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
