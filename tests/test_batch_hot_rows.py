"""The add_batch kernel's hot rows (native/src/batch.cpp FoldHotRows: int64 keys, void namespace,
no TTL, full groups of rows) against the Python backend: random sequences of add_batch calls
(batches of 8 to 200 rows, keys repeated within and across batches, new keys, null values, int64
sums that overflow part way through a batch), snapshots (incremental, then completed), restores
and reads, for both key-group prefix sizes (max parallelism 128 and 1024) and a non power of
two. Outputs, errors, stored bytes and the changes an incremental snapshot lists must be the
same after every step. The hot rows take updates of keys already written in the map version and
inserts in an epoch that logs nothing (a fresh map's first one, or one that gave up its write
log); everything else falls back to the row lambda, so the sequences mix both: snapshots start
logged epochs, and a batch of more than 1,024 new keys makes an epoch give up its log.
Fixed seeds (``derandomize``), so a failure reproduces."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statecore import create_backend
from statecore.descriptors import ReducingStateDescriptor
from statecore.errors import InvalidInputError
from support.listed_changes import ListedChanges

pytest.importorskip("statecore.backends.native")

# name -> (descriptor factory, Arrow value type)
STATES = {
    "sum": (lambda: ReducingStateDescriptor("sum", "sum", "int64"), pa.int64()),
    "min": (lambda: ReducingStateDescriptor("min", "min", "int64"), pa.int64()),
    "fsum": (lambda: ReducingStateDescriptor("fsum", "sum", "float64"), pa.float64()),
    "cnt": (lambda: ReducingStateDescriptor("cnt", "count"), pa.int64()),
    "last": (lambda: ReducingStateDescriptor("last", "last", "int64"), pa.int64()),
}
OLD_KEYS = list(range(-40, 40))
_INTS = st.one_of(st.integers(-50, 50), st.sampled_from([2**62, -(2**62), 2**63 - 1, -(2**63)]))
_VALUES = {pa.int64(): _INTS,
           pa.float64(): st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)}


def _add(name):
    vt = STATES[name][1]
    # A key: an old one (repeated across batches), or None for "a new one" (numbered when run).
    key = st.one_of(st.sampled_from(OLD_KEYS), st.sampled_from(OLD_KEYS), st.none())
    value = st.one_of(_VALUES[vt], _VALUES[vt], _VALUES[vt], st.none())
    return st.tuples(st.just("add"), st.just(name),
                     st.lists(st.tuples(key, value), min_size=8, max_size=200))


_OPS = st.one_of(
    *(_add(n) for n in STATES), *(_add(n) for n in ("sum", "cnt")),
    st.tuples(st.just("many_new"), st.sampled_from(sorted(STATES))),
    st.just(("incremental",)),
    st.just(("restore",)),
    st.tuples(st.just("get"), st.sampled_from(sorted(STATES))),
)


class Run:
    def __init__(self, kind, max_parallelism):
        self.kind, self.maxp = kind, max_parallelism
        self.b = create_backend(kind, key_type="int64", max_parallelism=max_parallelism)
        self.states = {n: self.b.get_state(f()) for n, (f, _) in STATES.items()}
        self.keys = set(OLD_KEYS)
        self.fresh = itertools.count(10_000, 7)

    def _kgs(self):
        return sorted({self.b.key_group_of(k) for k in self.keys})

    def contents(self):
        snap = self.b.snapshot()
        try:
            return {(n, k): v for n in STATES for kg in self._kgs()
                    for k, v in zip(*(a.to_pylist() for a in snap.entries(n, kg)))}
        finally:
            snap.release()

    def apply(self, op, fresh_keys):
        try:
            return ("ok", self._apply(op, fresh_keys))
        except InvalidInputError:
            return ("error",)

    def _apply(self, op, fresh_keys):
        what = op[0]
        if what == "incremental":
            snap = self.b.snapshot(incremental=True)
            got = {(n, k): v for n in STATES for kg in self._kgs()
                   for k, v in zip(*(a.to_pylist() for a in snap.entries(n, kg)))}
            self.b.notify_checkpoint_complete(snap.snapshot_id)
            snap.release()
            return ListedChanges(got, self.contents(), self.kind == "python")
        if what == "restore":
            snap = self.b.snapshot()
            nb = create_backend(self.kind, key_type="int64", max_parallelism=self.maxp)
            nb.restore(snap)
            snap.release()
            self.b.close()
            self.b = nb
            self.states = {n: self.b.get_state(f()) for n, (f, _) in STATES.items()}
            return None
        st_ = self.states[op[1]]
        vt = STATES[op[1]][1]
        if what == "get":
            return st_.get_batch(pa.array(sorted(self.keys), pa.int64())).to_pylist()
        if what == "many_new":
            # More new keys than the write log may hold (1,024 records): the epoch gives it up.
            keys = fresh_keys(1_500)
            vals = [1.5 if vt == pa.float64() else 1] * len(keys)
        else:
            keys = [k if k is not None else fresh_keys(1)[0] for k, _ in op[2]]
            vals = [v for _, v in op[2]]
        self.keys.update(keys)
        return st_.add_batch(pa.array(keys, pa.int64()), pa.array(vals, vt)).to_pylist()


def _check_same(ops, max_parallelism):
    py, nat = Run("python", max_parallelism), Run("native", max_parallelism)
    counter = itertools.count(1_000_000, 13)

    for i, op in enumerate(ops):
        made = []

        def fresh_keys(n):
            out = [next(counter) for _ in range(n)]
            made.extend(out)
            return out

        got_py = py.apply(op, fresh_keys)
        replay = iter(made)
        got_nat = nat.apply(op, lambda n: [next(replay) for _ in range(n)])
        where = f"step {i}: {op!r}"
        assert got_nat == got_py, where
        assert nat.contents() == py.contents(), where
    assert nat.b.num_entries() == py.b.num_entries()


@settings(derandomize=True, max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=st.lists(_OPS, min_size=4, max_size=16))
@pytest.mark.slow
@pytest.mark.parametrize("max_parallelism", [128, 200, 1024])
def test_hot_rows_match_the_python_backend(ops, max_parallelism):
    _check_same(ops, max_parallelism)


def test_an_overflow_after_hot_inserts_and_updates_leaves_the_batch_unapplied():
    """One batch: 100 new keys (inserted by the hot rows in the fresh map's first epoch), then
    updates of them (hot), then an overflow: every entry is as before the batch, and no new key
    remains."""
    for kind in ("python", "native"):
        b = create_backend(kind, key_type="int64", max_parallelism=128)
        s = b.get_state(STATES["sum"][0]())
        s.add_batch(pa.array([1, 2, 3] * 8, pa.int64()), pa.array([1] * 24, pa.int64()))
        keys = list(range(100, 200)) + list(range(100, 200)) + [1, 2, 3] * 8 + [2]
        vals = [5] * 200 + [1] * 24 + [2**63 - 1]
        with pytest.raises(InvalidInputError, match="overflow"):
            s.add_batch(pa.array(keys, pa.int64()), pa.array(vals, pa.int64()))
        out = s.get_batch(pa.array([1, 2, 3, 100, 199], pa.int64())).to_pylist()
        assert out == [8, 8, 8, None, None], kind
        assert b.num_entries() == 3, kind


@pytest.mark.parametrize("entries, updated", [(64, 48), (4_000, 48), (4_000, 2_000)])
def test_first_writes_after_a_checkpoint_are_listed_by_the_next_incremental_snapshot(entries,
                                                                                       updated):
    """Keys of one key group (so that the hot rows take all but the first row of a batch):
    ``entries`` of them written, a completed checkpoint, then ``updated`` of them updated in one
    batch and 4 new ones inserted among them. The next incremental snapshot lists exactly those,
    with their new values: at 64 entries from a walk of the table (most of them changed), at
    4,000 with 48 updated from the write log, with 2,000 updated again from a walk (the epoch
    gave its log up after 1,024 records, and the hot rows take the rest). A hot update or insert
    that skipped the first-write bookkeeping (log record, version stamp) would leave some out."""
    b = create_backend("native", key_type="int64", max_parallelism=128)
    s = b.get_state(STATES["sum"][0]())
    mine = list(itertools.islice((k for k in itertools.count() if b.key_group_of(k) == 5),
                                 entries + 4))
    old, new = mine[:entries], mine[entries:]
    s.add_batch(pa.array(old, pa.int64()), pa.array([1] * entries, pa.int64()))
    snap = b.snapshot(incremental=True)
    b.notify_checkpoint_complete(snap.snapshot_id)
    snap.release()
    picked = old[::max(1, entries // updated)][:updated]
    # The new keys mid-batch, in a full group of 8 rows: the hot rows see them (a batch's last,
    # partial group goes to the row lambda).
    changed = picked[:24] + new + picked[24:]
    s.add_batch(pa.array(changed, pa.int64()), pa.array([10] * len(changed), pa.int64()))
    snap = b.snapshot(incremental=True)
    try:
        keys, values = (a.to_pylist() for a in snap.entries("sum", 5))
    finally:
        snap.release()
    assert len(keys) == len(changed) == updated + 4
    kb = create_backend("python", key_type="int64", max_parallelism=128)
    ks = kb.get_state(STATES["sum"][0]())
    ks.add_batch(pa.array(old, pa.int64()), pa.array([1] * entries, pa.int64()))
    ks.add_batch(pa.array(changed, pa.int64()), pa.array([10] * len(changed), pa.int64()))
    ksnap = kb.snapshot()
    want = dict(zip(*(a.to_pylist() for a in ksnap.entries("sum", 5))))
    ksnap.release()
    assert {k: want[k] for k in keys} == dict(zip(keys, values))
    assert (sorted(int.from_bytes(v, "little", signed=True) for v in values)
            == [10] * 4 + [11] * updated)


def _with_garbage_under_nulls(values, valid):
    """An int64 array whose null slots hold 7 (not 0, as pa.array writes): a kernel that read a
    null row's slot as its value would add 7."""
    data = pa.py_buffer(pa.array([7 if v is None else v for v in values], pa.int64())
                        .buffers()[1].to_pybytes())
    bitmap = pa.array(valid, pa.bool_()).buffers()[1]
    return pa.Array.from_buffers(pa.int64(), len(values), [bitmap, data],
                                 null_count=valid.count(False))


@pytest.mark.parametrize("name", ["sum", "min", "last"])
def test_null_values_in_hot_groups_emit_the_current_value_and_change_nothing(name):
    """Keys of one key group (so that the hot rows take all but a batch's first row), null
    values for present and absent keys at every position of a group of 8: a null row outputs
    the key's current value (null when absent), writes nothing, inserts nothing; the rows around
    it apply as usual. The hot rows test values' validity unless the batch has no nulls."""
    results = {}
    for kind in ("python", "native"):
        b = create_backend(kind, key_type="int64", max_parallelism=128)
        s = b.get_state(STATES[name][0]())
        mine = list(itertools.islice((k for k in itertools.count() if b.key_group_of(k) == 9),
                                     120))
        old, new = mine[:100], mine[100:]
        s.add_batch(pa.array(old, pa.int64()), pa.array(range(100), pa.int64()))
        keys = old[:40] + new + old[40:80]
        values = [None if i % 9 == 3 else i for i in range(len(keys))]
        valid = [v is not None for v in values]
        out = s.add_batch(pa.array(keys, pa.int64()), _with_garbage_under_nulls(values, valid))
        got = s.get_batch(pa.array(mine, pa.int64())).to_pylist()
        results[kind] = (out.to_pylist(), got, b.num_entries())
    assert results["native"] == results["python"]
    out, got, entries = results["python"]
    assert None in out and entries < 120  # absent keys with null values stayed absent


@pytest.mark.parametrize("max_parallelism", [4, 128, 1024])
def test_maps_that_grow_part_way_through_a_batch_keep_every_count(max_parallelism):
    """The key hasher hands the hot rows their home slots a group of rows ahead
    (RowKeys::Group::slots). A map that grows in between (its rehash closes its lane) must not
    have the rows already hashed write into its old table: every running count and the stored
    sums stay those of a dict."""
    rng = np.random.default_rng(7)
    b = create_backend("native", key_type="int64", max_parallelism=max_parallelism)
    st_ = b.get_state(ReducingStateDescriptor("sum", "sum", "int64"))
    expected: dict = {}
    for rows in (20_000, 20_000, 3_000):  # from empty; every map doubles several times
        keys = rng.integers(0, 6_000, rows)
        want = []
        for k in keys.tolist():
            expected[k] = expected.get(k, 0) + 1
            want.append(expected[k])
        got = st_.add_batch(pa.array(keys, pa.int64()), pa.array(np.ones(rows, np.int64)))
        assert got.to_pylist() == want
    probe = sorted(expected)
    assert st_.get_batch(pa.array(probe, pa.int64())).to_pylist() == [expected[k] for k in probe]
    b.close()
