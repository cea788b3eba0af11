"""Operator state part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): the list, union list and broadcast
state operations and their errors, the snapshot format (byte-identical to the reference
backend), restores with the same parallelism, the redistribution matrix from in-memory
snapshots and from checkpoint versions written by several writers (full and incremental runs,
after compaction), and that a restoring task reads only the runs it needs
(:mod:`statecore.operator_state`).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from statecore import key_groups as K
from statecore.descriptors import ListStateDescriptor, MapStateDescriptor
from statecore.errors import InvalidInputError, StateError, StateMigrationError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import TamperedSnapshot, snapshot_dump
from statecore.ttl import StateTtlConfig

__all__ = ["OperatorStateConformance"]

_RULES = MapStateDescriptor("rules", "string", "int64")
#: (old parallelism, new parallelism) pairs of the redistribution matrix.
RESCALES = [(1, 3), (3, 1), (2, 5), (4, 2), (3, 3)]


def _old_lists(p: int) -> list[list[int]]:
    """Even-split lists of old task ``t`` of ``p``: lengths 3 + 2t (not divisible by the new
    parallelisms of :data:`RESCALES`), elements ``t * 100 + j``."""
    return [[t * 100 + j for j in range(3 + 2 * t)] for t in range(p)]


def _expected_split(lists: list[list], p_new: int, i: int) -> list:
    """Task ``i`` of ``p_new``'s part: contiguous, the first ``total % p_new`` parts one
    longer (Flink ``RoundRobinOperatorStateRepartitioner``); own list at the same parallelism."""
    if len(lists) == p_new:
        return lists[i]
    flat = [e for lst in lists for e in lst]
    sizes = [len(flat) // p_new + (1 if t < len(flat) % p_new else 0) for t in range(p_new)]
    lo = sum(sizes[:i])
    return flat[lo:lo + sizes[i]]


class OperatorStateConformance(ConformanceBase):
    """Operator state (``backend.operator_state``): operations, snapshots, redistribution."""

    def _old_backends(self, p: int, max_parallelism: int = 128):
        """``p`` backends (operator ranges of ``p``) holding :func:`_old_lists` as even-split
        list "offsets", their task index as union list "seen", the broadcast map
        {"a": 1, "t<task>": task} and one keyed value each."""
        from statecore.descriptors import ValueStateDescriptor

        out = []
        for t in range(p):
            kgr = K.key_group_range_for_operator(max_parallelism, p, t)
            b = self.new_backend(max_parallelism=max_parallelism,
                                 key_group_range=(kgr.start, kgr.end))
            ops = b.operator_state
            ops.get_list_state("offsets", "int64").update(_old_lists(p)[t])
            ops.get_union_list_state("seen", "string").add(f"task{t}")
            rules = ops.get_broadcast_state(_RULES)
            rules.put_all({"a": 1, f"t{t}": t})
            v = b.get_state(ValueStateDescriptor("v", "int64"))
            key = next(k for k in range(10_000) if b.key_group_range.contains(
                K.assign_key_group(k, "int64", max_parallelism)))
            b.set_current_key(key)
            v.update(t)
            out.append(b)
        return out

    def _check_restored(self, b, p_old: int, p_new: int, i: int) -> None:
        ops = b.operator_state
        assert ops.get_list_state("offsets", "int64").get() == _expected_split(
            _old_lists(p_old), p_new, i)
        assert ops.get_union_list_state("seen", "string").get() == [
            f"task{t}" for t in range(p_old)]
        src = i % p_old
        assert dict(ops.get_broadcast_state(_RULES).items()) == {"a": 1, f"t{src}": src}

    # ------------------------------------------------------------------ operations
    def test_operator_list_state_operations(self):
        b = self.new_backend()
        for get in (b.operator_state.get_list_state, b.operator_state.get_union_list_state):
            name = "l" + get.__name__
            ls = get(name, "int64")
            assert ls.get() == []
            ls.add(1)
            ls.add_all([2, 3])
            ls.add_all([])
            assert ls.get() == [1, 2, 3]
            got = ls.get()
            got.append(99)  # a copy
            assert ls.get() == [1, 2, 3]
            for bad in (None, "x", 1 << 63):
                with pytest.raises(InvalidInputError):
                    ls.add(bad)
            with pytest.raises(InvalidInputError):
                ls.add_all([4, None])  # nothing added
            with pytest.raises(InvalidInputError):
                ls.update(None)
            with pytest.raises(InvalidInputError):
                ls.add_all("45")
            assert ls.get() == [1, 2, 3]
            ls.update([7])
            assert ls.get() == [7]
            ls.update([])
            assert ls.get() == []
            ls.add(5)
            ls.clear()
            assert ls.get() == []
            assert get(name, "int64") is ls
        pk = b.operator_state.get_list_state("p")
        pk.add({"any": ("object",)})
        assert pk.get() == [{"any": ("object",)}]

    def test_broadcast_state_operations(self):
        b = self.new_backend()
        bs = b.operator_state.get_broadcast_state(_RULES)
        assert bs.is_empty() and bs.get("x") is None and not bs.contains("x")
        bs.put("b", 2)
        bs.put("a", 1)
        bs.put_all({"c": 3, "b": 20})
        assert bs.items() == [("b", 20), ("a", 1), ("c", 3)]  # insertion order
        assert bs.keys() == ["b", "a", "c"] and bs.values() == [20, 1, 3]
        assert bs.get("b") == 20 and bs.contains("c") and not bs.is_empty()
        bs.remove("a")
        bs.remove("absent")
        assert bs.keys() == ["b", "c"]
        for k, v in ((None, 1), ("x", None), (1, 1), ("x", "1")):
            with pytest.raises(InvalidInputError):
                bs.put(k, v)
        with pytest.raises(InvalidInputError):
            bs.put_all({"d": 4, "e": None})  # all or nothing
        with pytest.raises(InvalidInputError):
            bs.put_all([("d", 4), "e"])
        assert bs.keys() == ["b", "c"]
        bs.clear()
        assert bs.is_empty() and bs.items() == []
        assert b.operator_state.get_broadcast_state(_RULES) is bs

    def test_operator_state_registration_errors(self):
        b = self.new_backend()
        ops = b.operator_state
        ops.get_list_state("x", "int64")
        ops.get_broadcast_state(MapStateDescriptor("m", "int64", "string"))
        with pytest.raises(InvalidInputError, match="even-split"):
            ops.get_union_list_state("x", "int64")
        with pytest.raises(InvalidInputError, match="even-split"):
            ops.get_broadcast_state(MapStateDescriptor("x", "int64", "int64"))
        with pytest.raises(InvalidInputError, match="value type"):
            ops.get_list_state("x", "string")
        with pytest.raises(InvalidInputError, match="broadcast"):
            ops.get_list_state("m", "string")
        with pytest.raises(InvalidInputError):
            ops.get_broadcast_state(MapStateDescriptor("m", "string", "string"))
        for bad in ("", "__x", None, 3):
            with pytest.raises(InvalidInputError):
                ops.get_list_state(bad, "int64")
        with pytest.raises(InvalidInputError):
            ops.get_list_state("y", "no-such-type")
        with pytest.raises(InvalidInputError):
            ops.get_broadcast_state("m")
        with pytest.raises(InvalidInputError, match="TTL"):
            ops.get_list_state(ListStateDescriptor("t", "int64").enable_time_to_live(
                StateTtlConfig(10)))
        with pytest.raises(InvalidInputError, match="TTL"):
            ops.get_broadcast_state(MapStateDescriptor("t", "int64", "int64")
                                    .enable_time_to_live(StateTtlConfig(10)))
        assert ops.get_list_state(ListStateDescriptor("d", "string")).value_type == "string"
        assert ops.registered_state_names() == ["d", "x"]
        assert ops.registered_broadcast_state_names() == ["m"]
        assert ops.has_kind("operator_list") and ops.has_kind("operator_broadcast")
        assert not ops.has_kind("operator_union_list")

    def test_operator_state_after_dispose(self):
        b = self.new_backend()
        ls = b.operator_state.get_list_state("x", "int64")
        bs = b.operator_state.get_broadcast_state(_RULES)
        b.dispose()
        for call in (ls.get, lambda: ls.add(1), bs.keys, lambda: bs.put("a", 1),
                     lambda: b.operator_state.get_list_state("y", "int64")):
            with pytest.raises(StateError):
                call()

    # ------------------------------------------------------------------ snapshots
    def test_operator_state_snapshot_format(self):
        def program(b):
            ops = b.operator_state
            ops.get_list_state("l", "int64").add_all([5, -1])
            ops.get_union_list_state("u", "string").add("s")
            ops.get_list_state("empty", "int64")
            ops.get_broadcast_state(MapStateDescriptor("m", "string", "binary")).put_all(
                {"bb": b"2", "a": b"1"})
            return None

        self.same_as_reference(program, key_group_range=(64, 127))
        b = self.new_backend(key_group_range=(64, 127))
        program(b)
        snap = b.snapshot()
        metas = {m["name"]: m for m in snap.state_metas()}
        assert metas["__operator__.l"] == {"name": "__operator__.l", "kind": "operator_list",
                                           "namespace_type": "void", "value_type": "int64"}
        assert metas["__operator__.u"]["kind"] == "operator_union_list"
        assert metas["__operator__.m"] == {
            "name": "__operator__.m", "kind": "operator_broadcast", "namespace_type": "void",
            "value_type": "binary", "user_key_type": "string"}
        assert "__operator__.empty" in metas
        keys, vals = snap.entries("__operator__.l", 64)
        assert keys.to_pylist() == [b"\x40" + bytes(8), b"\x40" + (1).to_bytes(8, "big")]
        assert vals.to_pylist() == [(5).to_bytes(8, "little"), (-1).to_bytes(8, "little",
                                                                             signed=True)]
        keys, vals = snap.entries("__operator__.m", 64)
        assert keys.to_pylist() == [b"\x40\x02a", b"\x40\x03bb"]  # by ser(user key)
        assert vals.to_pylist() == [b"1", b"2"]
        assert len(snap.entries("__operator__.l", 65)[0]) == 0
        assert b.num_entries() == 0  # operator state is not keyed state

    def test_operator_state_snapshot_is_isolated(self):
        b = self.new_backend()
        ls = b.operator_state.get_list_state("l", "int64")
        ls.add(1)
        snap = b.snapshot(incremental=True)
        ls.add(2)
        b.operator_state.get_broadcast_state(_RULES).put("late", 1)
        assert snapshot_dump(snap)["__operator__.l"] == {
            0: [(b"\x00" + bytes(8), (1).to_bytes(8, "little"))]}
        r = self.new_backend()
        r.operator_state.restore(snap)
        assert r.operator_state.get_list_state("l", "int64").get() == [1]
        assert r.operator_state.registered_broadcast_state_names() == []

    def test_operator_state_needs_a_key_group_to_snapshot(self):
        b = self.new_backend(key_group_range=(0, -1))
        ls = b.operator_state.get_list_state("l", "int64")
        b.snapshot()  # registered but empty: nothing to store
        ls.add(1)
        with pytest.raises(InvalidInputError, match="non-empty key-group range"):
            b.snapshot()

    def test_keyed_restore_leaves_operator_state(self):
        src = self.new_backend()
        src.operator_state.get_list_state("l", "int64").add(1)
        b = self.new_backend()
        b.operator_state.get_list_state("l", "int64").add(2)
        b.restore(src.snapshot())
        assert b.operator_state.get_list_state("l", "int64").get() == [2]
        assert b.num_entries() == 0

    # ------------------------------------------------------------------ restores
    def test_operator_state_restore_same_parallelism(self):
        olds = self._old_backends(3)
        snaps = [o.snapshot() for o in olds]
        for i in range(3):
            b = self.new_backend()
            b.operator_state.restore(snaps, i, 3)
            self._check_restored(b, 3, 3, i)
            assert b.operator_state.get_list_state("offsets", "int64").get() == _old_lists(3)[i]

    @pytest.mark.parametrize("p_old,p_new", RESCALES)
    def test_operator_state_redistribution_from_snapshots(self, p_old, p_new):
        snaps = [o.snapshot() for o in self._old_backends(p_old)]
        got = []
        for i in range(p_new):
            b = self.new_backend()
            b.operator_state.restore(snaps, i, p_new)
            self._check_restored(b, p_old, p_new, i)
            got.extend(b.operator_state.get_list_state("offsets", "int64").get())
        # Nothing lost, nothing twice, old task order kept.
        assert got == [e for lst in _old_lists(p_old) for e in lst]

    @pytest.mark.parametrize("p_old,p_new", RESCALES)
    def test_operator_state_redistribution_from_checkpoints(self, tmp_path, p_old, p_new):
        from statecore.checkpoint.store import CheckpointStore

        store = CheckpointStore(str(tmp_path / "ckpt"), max_runs=None)
        olds = self._old_backends(p_old)
        store.commit(1, [store.write_snapshot(o.snapshot(), 1, writer=f"p{t}")
                         for t, o in enumerate(olds)])
        # An incremental version on top: operator state is complete in every run.
        for t, o in enumerate(olds):
            o.notify_checkpoint_complete(1, 1, store.manifest(1)["commit_id"])
            o.operator_state.get_list_state("offsets", "int64").add(t * 100 + 99)
        store.commit(2, [store.write_snapshot(o.snapshot(incremental=True), 2, writer=f"p{t}")
                         for t, o in enumerate(olds)])
        assert {f["kind"] for f in store.manifest(2)["files"] if f["version"] == 2} == {
            "incremental"}
        lists = [lst + [t * 100 + 99] for t, lst in enumerate(_old_lists(p_old))]
        for version, want in ((1, _old_lists(p_old)), (2, lists)):
            got = []
            for i in range(p_new):
                kgr = K.key_group_range_for_operator(128, p_new, i)
                b = self.new_backend(key_group_range=(kgr.start, kgr.end))
                store.restore(b, version, operator_index=i, parallelism=p_new)
                ops = b.operator_state
                mine = ops.get_list_state("offsets", "int64").get()
                assert mine == _expected_split(want, p_new, i)
                got.extend(mine)
                assert ops.get_union_list_state("seen", "string").get() == [
                    f"task{t}" for t in range(p_old)]
                assert dict(ops.get_broadcast_state(_RULES).items()) == {
                    "a": 1, f"t{i % p_old}": i % p_old}
            assert got == [e for lst in want for e in lst]
        # Compaction rewrites the runs; the operator state stays with each writer's range.
        compacted = store.compact(2, max_runs=1)
        assert any(f["writer"].startswith("compacted") for f in compacted["files"])
        b = self.new_backend()
        store.restore(b, 2, operator_index=0, parallelism=1)
        assert b.operator_state.get_list_state("offsets", "int64").get() == [
            e for lst in lists for e in lst]
        store.open(2).verify()

    def test_operator_state_restore_reads_only_needed_runs(self, tmp_path):
        from statecore.checkpoint.store import CheckpointStore

        store = CheckpointStore(str(tmp_path / "ckpt"), max_runs=None)
        olds = [self.new_backend(key_group_range=(t * 32, t * 32 + 31)) for t in range(4)]
        for t, o in enumerate(olds):
            o.operator_state.get_list_state("l", "int64").update(range(t * 10, t * 10 + 4))
            o.operator_state.get_broadcast_state(_RULES).put("k", t)
        # The asynchronous writer (the native one's C++ serializer) writes it too.
        store.commit(1, [store.write_snapshot_async(o.snapshot(), 1, writer=f"p{t}").result()
                         for t, o in enumerate(olds)])
        # Delete the data files of old tasks 2 and 3: new task 0 of 2 needs tasks 0 and 1
        # only (8 of 16 elements), so its restore must not touch them.
        root = tmp_path / "ckpt"
        for f in store.manifest(1)["files"]:
            if f["writer"] in ("p2", "p3"):
                (root / f["path"]).unlink()
        b = self.new_backend(key_group_range=(0, 63))
        b.operator_state.restore(store.open(1), 0, 2)
        assert b.operator_state.get_list_state("l", "int64").get() == [0, 1, 2, 3, 10, 11, 12,
                                                                      13]
        assert b.operator_state.get_broadcast_state(_RULES).items() == [("k", 0)]
        b5 = self.new_backend()
        b5.operator_state.restore(store.open(1), 1, 5)  # broadcast from old task 1 only
        assert b5.operator_state.get_broadcast_state(_RULES).items() == [("k", 1)]
        with pytest.raises(Exception, match="missing"):
            self.new_backend().operator_state.restore(store.open(1), 1, 2)

    def test_operator_state_restore_errors_change_nothing(self):
        src = self.new_backend()
        src.operator_state.get_list_state("l", "int64").add_all([1, 2])
        src.operator_state.get_broadcast_state(_RULES).put("a", 1)
        snap = src.snapshot()
        b = self.new_backend()
        mine = b.operator_state.get_list_state("l", "string")
        mine.add("kept")
        with pytest.raises(StateMigrationError):
            b.operator_state.restore(snap)
        assert mine.get() == ["kept"]
        b2 = self.new_backend()
        b2.operator_state.get_list_state("l", "int64").add(7)
        for i, p in ((1, 1), (-1, 2), (0, 0), ("0", 1), (True, 2)):
            with pytest.raises(InvalidInputError):
                b2.operator_state.restore(snap, i, p)
        bad_key = TamperedSnapshot(snap, "__operator__.l",
                                   lambda k, v: (pa.array([x[:-1] + b"\x07" for x in
                                                           k.to_pylist()], pa.binary()), v))
        bad_val = TamperedSnapshot(snap, "__operator__.l",
                                   lambda k, v: (k, pa.array([b"\x01"] * len(v), pa.binary())))
        for bad in (bad_key, bad_val):
            with pytest.raises(InvalidInputError):
                b2.operator_state.restore(bad)
        assert b2.operator_state.get_list_state("l", "int64").get() == [7]
        other = self.new_backend()
        other.operator_state.get_union_list_state("l", "int64").add(3)
        with pytest.raises(InvalidInputError, match="disagree"):
            b2.operator_state.restore([snap, other.snapshot()], 0, 1)
        assert b2.operator_state.get_list_state("l", "int64").get() == [7]

    def test_restored_operator_state_types_are_checked(self):
        src = self.new_backend()
        src.operator_state.get_union_list_state("u", "int64").add(1)
        b = self.new_backend()
        b.operator_state.get_list_state("gone", "int64").add(5)
        b.operator_state.restore(src.snapshot())
        # Not in the snapshot: emptied; restored but not asked for yet: listed, typed.
        assert b.operator_state.get_list_state("gone", "int64").get() == []
        assert b.operator_state.registered_state_names() == ["gone", "u"]
        with pytest.raises(StateMigrationError):
            b.operator_state.get_union_list_state("u", "string")
        with pytest.raises(InvalidInputError):
            b.operator_state.get_list_state("u", "int64")
        assert b.operator_state.get_union_list_state("u", "int64").get() == [1]

    def test_change_set_brings_the_writers_operator_state(self, tmp_path):
        from statecore.checkpoint.store import CheckpointStore

        store = CheckpointStore(str(tmp_path / "ckpt"), max_runs=None)
        olds = [self.new_backend(key_group_range=(0, 63)),
                self.new_backend(key_group_range=(64, 127))]
        for t, o in enumerate(olds):
            o.operator_state.get_list_state("l", "int64").add(t)
            o.operator_state.get_union_list_state("u", "int64").add(t)
        store.commit(1, [store.write_snapshot(o.snapshot(), 1, writer=f"p{t}")
                         for t, o in enumerate(olds)])
        cached = self.new_backend(key_group_range=(64, 127))
        store.restore(cached, 1, operator_index=1, parallelism=2)
        narrow = self.new_backend(key_group_range=(64, 95))
        store.restore(narrow, 1, operator_index=2, parallelism=4)
        # 2 elements over 4 tasks: tasks 0 and 1 get one each, task 2 none.
        assert narrow.operator_state.get_list_state("l", "int64").get() == []
        narrow.operator_state.get_list_state("l", "int64").add(5)
        for t, o in enumerate(olds):
            o.notify_checkpoint_complete(1, 1, store.manifest(1)["commit_id"])
            o.operator_state.get_list_state("l", "int64").add(10 + t)
        store.commit(2, [store.write_snapshot(o.snapshot(incremental=True), 2, writer=f"p{t}")
                         for t, o in enumerate(olds)])
        base = next(f["path"] for f in store.manifest(1)["files"] if f["writer"] == "p1")
        changes = store.open_changes(2, base, 64, 127)
        try:
            cached.apply_changes(changes)
        finally:
            changes.release()
        assert cached.operator_state.get_list_state("l", "int64").get() == [1, 11]
        # Union lists come whole, as from a restore.
        assert cached.operator_state.get_union_list_state("u", "int64").get() == [0, 1]
        # No writer of version 2 has the narrow backend's range: only a restore can split it.
        changes = store.open_changes(2, base, 64, 95)
        try:
            with pytest.raises(StateMigrationError, match="operator index"):
                narrow.apply_changes(changes)
        finally:
            changes.release()
        assert narrow.operator_state.get_list_state("l", "int64").get() == [5]

    def test_operator_state_differential(self):
        """A seeded random sequence of operator state calls (valid and invalid) gives the same
        results, errors and snapshot bytes as the reference backend, also after restoring
        those snapshots."""
        import random

        def program(b):
            rng = random.Random(20240607)
            ops = b.operator_state
            seen = []
            for step in range(400):
                split = ops.get_list_state("a", "int64")
                union = ops.get_union_list_state("u", "string")
                m = ops.get_broadcast_state(MapStateDescriptor("m", "int64", "float64"))
                ls = rng.choice([split, union])
                elem = (lambda: rng.randrange(-5, 5)) if ls is split else (
                    lambda: rng.choice(["x", "yy", ""]))
                calls = [
                    lambda: ls.add(elem()),
                    lambda: ls.add_all([elem() for _ in range(rng.randrange(4))]),
                    lambda: ls.update([elem() for _ in range(rng.randrange(3))]),
                    lambda: ls.add(None),
                    lambda: ls.clear() if rng.random() < 0.2 else None,
                    lambda: m.put(rng.randrange(-3, 8), rng.random()),
                    lambda: m.put_all({rng.randrange(8): 1.5, rng.randrange(8): -0.5}),
                    lambda: m.remove(rng.randrange(8)),
                    lambda: m.put("bad", 1.0),
                    lambda: (m.get(rng.randrange(8)), m.contains(3), m.items()),
                ]
                try:
                    seen.append(rng.choice(calls)())
                except InvalidInputError as exc:
                    seen.append(type(exc).__name__)
                seen.append((split.get(), union.get(), m.items(), m.is_empty()))
                if step % 97 == 0:
                    snap = b.snapshot(incremental=step % 2 == 1)
                    seen.append(sorted((n, rows) for n, rows in snapshot_dump(snap).items()
                                       if n.startswith("__operator__.")))
                    fresh = self.make_reference_backend(key_type="int64",
                                                        max_parallelism=128)
                    fresh.operator_state.restore(snap)
                    seen.append(fresh.operator_state.get_broadcast_state(
                        MapStateDescriptor("m", "int64", "float64")).items())
            return seen

        self.same_as_reference(program)
