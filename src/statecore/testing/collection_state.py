"""List and map state part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): ``ListState`` and ``MapState`` per
record -- adds, updates, removals, rejected elements and user keys; list append order, big
lists, per-element TTL and the chunked layout of list state in snapshots and incremental
change sets; map iteration in insertion order (after a restore: by serialized user key),
``size``, ``clear``, big maps and the per-entry layout of map state in snapshots and
incremental change sets.
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

    def test_list_chunks_in_snapshots(self):
        """A list state's snapshot holds one entry per chunk: ``encoded key of (key, namespace)
        | seq`` (8 bytes big-endian, from 0) -> up to ``LIST_CHUNK_ELEMENTS`` elements in the
        list-blob layout (docs/formats.md "List state"); an append fills the last chunk, then
        starts the next; ``update`` and ``clear`` start the numbers at 0 again."""
        b = self.new_backend()
        ls = b.get_state(ListStateDescriptor("l", "string"))
        b.set_current_key(7)
        ls.add("x")
        ls.add_all(["y", "z"])
        kg = b.key_group_of(7)
        prefix = S.encode_key(kg, b.max_parallelism, 7, b.key_serializer, None, "void")
        k = S.LIST_CHUNK_ELEMENTS

        def entries():
            snap = b.snapshot()
            keys, vals = snap.entries("l", kg)
            snap.release()
            return list(zip(keys.to_pylist(), vals.to_pylist()))

        def chunk(seq, es):
            return prefix + seq.to_bytes(8, "big"), S.encode_list(es, S.value_serializer("string"))

        assert entries() == [chunk(0, ["x", "y", "z"])]
        ls.update(["u"])
        ls.add("v")
        assert entries() == [chunk(0, ["u", "v"])]
        assert b.num_entries() == 1
        more = [str(i) for i in range(k + 1)]
        ls.add_all(more)
        els = ["u", "v"] + more
        assert entries() == [chunk(0, els[:k]), chunk(1, els[k:])]
        assert ls.get() == els and b.num_entries() == 2

    def test_big_list_append_order_and_one_chunk_per_append(self):
        """A big list keeps append order (also after a restore), and the incremental change set
        after one append holds the list's last chunk only; ``clear`` of it is one tombstone per
        chunk."""
        n = 5000
        k = S.LIST_CHUNK_ELEMENTS
        b = self.new_backend()
        ls = b.get_state(ListStateDescriptor("l", "int64"))
        b.set_current_key(1)
        ls.add_all(range(n))
        for i in range(n, n + 100):
            ls.add(-i)
        want = list(range(n)) + [-i for i in range(n, n + 100)]
        chunks = -(-(n + 100) // k)
        assert ls.get() == want and b.num_entries() == chunks
        full = b.snapshot()
        b.notify_checkpoint_complete(full.snapshot_id)
        b2 = self.new_backend()
        b2.restore(full)
        full.release()
        ls2 = b2.get_state(ListStateDescriptor("l", "int64"))
        b2.set_current_key(1)
        assert ls2.get() == want
        ls2.add(42)  # continues in the restored last chunk
        assert ls2.get() == want + [42]
        ls.add(42)
        inc = b.snapshot(incremental=True)
        kg = b.key_group_of(1)
        keys, vals = inc.entries("l", kg)
        prefix = S.encode_key(kg, b.max_parallelism, 1, b.key_serializer, None, "void")
        last = (chunks - 1) * k
        assert keys.to_pylist() == [prefix + (chunks - 1).to_bytes(8, "big")]
        assert vals.to_pylist() == [S.encode_list((want + [42])[last:],
                                                  S.value_serializer("int64"))]
        b.notify_checkpoint_complete(inc.snapshot_id)
        inc.release()
        ls.clear()
        inc2 = b.snapshot(incremental=True)
        keys, vals = inc2.entries("l", kg)
        assert len(keys) == chunks and vals.null_count == chunks
        inc2.release()
        assert ls.get() == [] and b.num_entries() == 0

    def test_list_update_after_clear_restores_exactly_through_a_chain(self):
        """``update`` restarts the chunk numbers: an incremental change set then overwrites
        the low ones and tombstones the rest, and applying it to the base gives exactly the
        new list."""
        b = self.new_backend()
        ls = b.get_state(ListStateDescriptor("l", "string"), namespace_type="int64")
        b.set_current_key(3)
        ls.set_current_namespace(1)
        ls.add_all(["a", "b", "c", "d"] * S.LIST_CHUNK_ELEMENTS)  # four chunks
        ls.set_current_namespace(2)
        ls.add("keep")
        base = b.snapshot()
        b.notify_checkpoint_complete(base.snapshot_id)
        ls.set_current_namespace(1)
        ls.update(["x", "y"])
        ls.add("z")
        inc = b.snapshot(incremental=True)
        b2 = self.new_backend()
        b2.restore(base)
        b2.apply_changes(inc)
        base.release()
        inc.release()
        ls2 = b2.get_state(ListStateDescriptor("l", "string"), namespace_type="int64")
        b2.set_current_key(3)
        ls2.set_current_namespace(1)
        assert ls2.get() == ["x", "y", "z"]
        ls2.add("w")
        assert ls2.get() == ["x", "y", "z", "w"]
        ls2.set_current_namespace(2)
        assert ls2.get() == ["keep"]
        assert dump_backend(b2) != dump_backend(b)  # "w" only in b2
        ls.add("w")
        assert dump_backend(b2) == dump_backend(b)

    def test_list_ttl_elements_expire_in_the_middle(self):
        """Each element carries its own timestamp: elements expiring in the middle of a list
        are removed on read (counted) and the rest keeps its order; a chunk left empty is
        removed and appends continue in the last chunk left."""
        clock = ManualClock(0)
        b = self.new_backend(ttl_clock=clock)
        d = ListStateDescriptor("l", "int64")
        d.enable_time_to_live(StateTtlConfig(100))
        ls = b.get_state(d)
        b.set_current_key(1)
        ls.add_all([1, 2])
        clock.set(50)
        ls.add(3)
        clock.set(60)
        ls.update([9])  # a write: one list restarts
        ls.add_all([1, 2])
        clock.set(120)
        ls.add(3)
        clock.set(170)
        ls.add(4)
        # 9, 1, 2 (stamped 60) expire at 160; 3 (120) and 4 (170) live.
        assert ls.get() == [3, 4]
        assert b.ttl_statistics()["read"] == 3
        clock.set(100)  # a clock that moved back: an element older than its neighbours
        ls.add(-1)
        clock.set(170)
        ls.add(5)
        clock.set(205)  # -1 (100) expired in the middle; 3 (120) still live
        assert ls.get() == [3, 4, 5]
        assert b.ttl_statistics()["read"] == 4
        kg = b.key_group_of(1)

        def chunk_seqs():
            snap = b.snapshot()
            keys, _ = snap.entries("l", kg)
            snap.release()
            return [int.from_bytes(k[-8:], "big") for k in keys.to_pylist()]

        assert chunk_seqs() == [0]
        clock.set(1000)
        assert ls.get() == [] and b.num_entries() == 0
        ls.add(6)
        assert chunk_seqs() == [0]
        # Over chunks: the first chunk expires whole (removed), the second keeps its live part.
        k = S.LIST_CHUNK_ELEMENTS
        ls.update(range(k + 7))  # stamped 1000: chunk 0 full, chunk 1 seven elements
        clock.set(1050)
        ls.add_all(range(100, 110))  # chunk 1 seven + ten
        clock.set(1120)
        assert ls.get() == list(range(100, 110))
        assert b.ttl_statistics()["read"] == 7 + k + 7
        assert chunk_seqs() == [1]
        ls.add(7)  # into chunk 1, not full
        assert chunk_seqs() == [1] and ls.get() == list(range(100, 110)) + [7]

    def test_list_elements_removed_by_ttl_cleanup_passes(self):
        """Background cleanup trims a chunk's leading expired elements and removes a chunk that
        expired whole (the compaction filter of the list layout); the list reads and appends on
        as if they had been read away."""
        clock = ManualClock(0)
        b = self.new_backend(ttl_clock=clock)
        d = ListStateDescriptor("l", "string")
        d.enable_time_to_live(StateTtlConfig(100, cleanup_in_background=True))
        ls = b.get_state(d)
        b.set_current_key(1)
        ls.add_all(["a", "b"])
        clock.set(60)
        ls.add("c")
        clock.set(120)
        assert b.run_background_ttl_cleanup(b.max_parallelism) == 2
        assert b.num_entries() == 1
        ls.add("d")
        assert ls.get() == ["c", "d"]
        clock.set(1000)
        assert b.run_background_ttl_cleanup(b.max_parallelism) == 2
        ls.add("e")
        assert ls.get() == ["e"]
        kg = b.key_group_of(1)
        snap = b.snapshot()
        keys, _ = snap.entries("l", kg)
        snap.release()
        assert [int.from_bytes(k[-8:], "big") for k in keys.to_pylist()] == [0]

    def test_map_state(self):
        b = self.new_backend()
        m = b.get_state(MapStateDescriptor("m", "string", "int64"))
        b.set_current_key(1)
        assert m.is_empty() and m.items() == [] and m.get("a") is None
        m.put("b", 2)
        m.put("a", 1)
        m.put_all({"c": 3, "b": 20})
        assert m.items() == [("b", 20), ("a", 1), ("c", 3)]  # insertion order
        assert m.keys() == ["b", "a", "c"] and m.values() == [20, 1, 3]
        assert m.size() == 3
        assert m.contains("a") and not m.contains("zz") and m.get("b") == 20
        m.remove("zz")
        m.remove("a")
        assert m.keys() == ["b", "c"] and m.size() == 2
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
        m.put("y", 2)
        m.clear()
        assert m.is_empty() and m.size() == 0 and b.num_entries() == 0
        b.set_current_key(2)
        assert m.is_empty()

    @pytest.mark.parametrize("ttl", [False, True])
    @pytest.mark.parametrize("user_key_type", sorted(_ORDER_CASES))
    def test_map_iteration_order(self, user_key_type, ttl):
        """items/keys/values list user keys in insertion order (a put of a present user key
        keeps its place, a removed one put again goes last), with TTL too; after a restore by
        ascending serialized bytes (MapState docstring)."""
        uks = _ORDER_CASES[user_key_type]
        by_bytes = sorted(uks, key=_ORDER_KEY[user_key_type])
        b = self.new_backend(ttl_clock=ManualClock(0))
        d = MapStateDescriptor("m", user_key_type, "int64")
        if ttl:
            d.enable_time_to_live(StateTtlConfig(10**9))
        m = b.get_state(d)
        b.set_current_key(1)
        for i, uk in enumerate(uks):
            m.put(uk, i)
        m.put(uks[0], 0)  # present: keeps its place
        m.remove(uks[1])
        m.put(uks[1], 1)  # removed and put again: last
        want1 = [uks[0]] + uks[2:] + [uks[1]]
        b.set_current_key(2)
        m.put_all({uk: i for i, uk in reversed(list(enumerate(uks)))})
        want2 = list(reversed(uks))
        for key, want in ((1, want1), (2, want2)):
            b.set_current_key(key)
            assert m.keys() == want
            assert m.values() == [uks.index(uk) for uk in want]
            assert m.items() == [(uk, uks.index(uk)) for uk in want]
            assert m.size() == len(uks)
        b2 = self.new_backend(ttl_clock=ManualClock(0))
        b2.restore(b.snapshot())
        m2 = b2.get_state(d)
        for key in (1, 2):
            b2.set_current_key(key)
            assert m2.keys() == by_bytes
            assert m2.items() == [(uk, uks.index(uk)) for uk in by_bytes]
        b2.set_current_key(1)
        m2.remove(by_bytes[0])
        m2.put(by_bytes[0], uks.index(by_bytes[0]))
        assert m2.keys() == by_bytes[1:] + by_bytes[:1]
        ukt = {"int32": pa.int32(), "int64": pa.int64(), "string": pa.string(),
               "binary": pa.binary()}[user_key_type]
        got = m.get_batch(pa.array([1] * len(by_bytes), pa.int64()), pa.array(by_bytes, ukt))
        assert got.to_pylist() == [uks.index(uk) for uk in by_bytes]
        assert dump_backend(b) == dump_backend(b2)

    def test_map_entries_in_snapshots(self):
        """A map state's snapshot holds one entry per user key: ``encoded key of (key,
        namespace) | ser(user key)`` -> the user value's bytes (docs/formats.md "Map state")."""
        b = self.new_backend()
        m = b.get_state(MapStateDescriptor("m", "string", "int64"))
        b.set_current_key(7)
        m.put_all({"b": 2, "a": 1})
        snap = b.snapshot()
        kg = b.key_group_of(7)
        keys, vals = snap.entries("m", kg)
        prefix = S.encode_key(kg, b.max_parallelism, 7, b.key_serializer, None, "void")
        uk = S.key_serializer("string").serialize
        assert keys.to_pylist() == sorted([prefix + uk("a"), prefix + uk("b")])
        by_key = dict(zip(keys.to_pylist(), vals.to_pylist()))
        vs = S.value_serializer("int64").serialize
        assert by_key == {prefix + uk("a"): vs(1), prefix + uk("b"): vs(2)}
        snap.release()

    def test_big_map_incremental_change_is_one_entry(self):
        """After one entry of a big map changes, the incremental change set holds that entry
        only (and a removed entry is one tombstone)."""
        n = 5000
        b = self.new_backend()
        m = b.get_state(MapStateDescriptor("m", "int64", "int64"))
        b.set_current_key(1)
        m.put_all({i: i for i in range(n)})
        assert m.size() == n and b.num_entries() == n
        full = b.snapshot()
        b.notify_checkpoint_complete(full.snapshot_id)
        full.release()
        m.put(17, -17)
        m.remove(18)
        inc = b.snapshot(incremental=True)
        kg = b.key_group_of(1)
        keys, vals = inc.entries("m", kg)
        prefix = S.encode_key(kg, b.max_parallelism, 1, b.key_serializer, None, "void")
        uk = S.key_serializer("int64").serialize
        assert keys.to_pylist() == [prefix + uk(17), prefix + uk(18)]
        assert vals.to_pylist() == [S.value_serializer("int64").serialize(-17), None]
        inc.release()
        assert m.get(17) == -17 and not m.contains(18) and m.size() == n - 1
        assert m.keys()[:3] == [0, 1, 2] and m.keys()[17] == 17 and 18 not in m.keys()

    def test_map_clear_and_size_with_namespaces(self):
        """``clear`` removes every entry of the current key and namespace only; ``size`` and
        ``is_empty`` per (key, namespace); clear_batch per row."""
        b = self.new_backend()
        m = b.get_state(MapStateDescriptor("m", "int64", "string"), namespace_type="int64")
        for key in (1, 2):
            b.set_current_key(key)
            for ns in (10, 20):
                m.set_current_namespace(ns)
                m.put_all({i: f"{key}/{ns}/{i}" for i in range(5)})
        b.set_current_key(1)
        m.set_current_namespace(10)
        m.clear()
        assert m.is_empty() and m.size() == 0
        m.set_current_namespace(20)
        assert m.size() == 5 and m.get(3) == "1/20/3"
        b.set_current_key(2)
        assert m.size() == 5
        m.clear_batch(pa.array([2], pa.int64()), pa.array([20], pa.int64()))
        assert m.is_empty()
        m.set_current_namespace(10)
        assert m.size() == 5
        assert b.num_entries() == 10

    def test_map_size_and_is_empty_with_ttl(self):
        """With TTL ``size``/``is_empty`` count the unexpired entries (expired ones removed and
        counted as read cleanup, Flink ``TtlMapState``)."""
        clock = ManualClock(0)
        b = self.new_backend(ttl_clock=clock)
        d = MapStateDescriptor("m", "int64", "int64")
        d.enable_time_to_live(StateTtlConfig(100))
        m = b.get_state(d)
        b.set_current_key(1)
        m.put_all({1: 1, 2: 2})
        clock.advance(60)
        m.put(3, 3)
        assert m.size() == 3 and not m.is_empty()
        clock.advance(60)
        assert m.size() == 1 and m.items() == [(3, 3)]
        assert b.ttl_statistics()["read"] == 2
        m.put(1, 10)  # expired and removed: a new entry, last
        assert m.keys() == [3, 1]
        clock.advance(200)
        assert m.is_empty() and m.size() == 0 and b.num_entries() == 0

    def test_map_order_after_ttl_cleanup_passes(self):
        """Entries a TTL cleanup pass removed are gone from the map's order: a user key put
        again afterwards goes last (background cleanup here; incremental cleanup and TTL
        migration remove entries the same way)."""
        clock = ManualClock(0)
        b = self.new_backend(ttl_clock=clock)
        d = MapStateDescriptor("m", "string", "int64")
        d.enable_time_to_live(StateTtlConfig(100, cleanup_in_background=True))
        m = b.get_state(d)
        b.set_current_key(1)
        m.put_all({"a": 1, "b": 2, "c": 3})
        clock.set(60)
        m.put("d", 4)
        clock.set(120)
        assert b.run_background_ttl_cleanup(b.max_parallelism) == 3
        m.put("a", 10)
        assert m.keys() == ["d", "a"] and m.size() == 2
        m.put("b", 20)
        m.remove("d")
        m.put("d", 40)
        assert m.items() == [("a", 10), ("b", 20), ("d", 40)]

    def test_map_state_pickle_user_keys(self):
        b = self.new_backend()
        m = b.get_state(MapStateDescriptor("m"))
        b.set_current_key(1)
        m.put((1, "a"), [1])
        m.put(None, "none")
        m.put(frozenset(), {})
        assert m.get((1, "a")) == [1] and m.get(None) == "none" and m.contains(frozenset())
        assert len(m.items()) == 3
        assert m.keys() == [(1, "a"), None, frozenset()]  # insertion order
