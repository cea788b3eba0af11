"""TTL batch kernels of the native backend against the Python TTL states (the specification,
statecore/backends/ttl_states.py): random sequences of clock moves, batch calls (get_batch,
put_batch, add_batch with sum/min/max/count, int64/float64/string values, repeated keys, null
rows, int64 sum overflows), per-record calls, snapshot+restore and incremental snapshots, run on
the python and the native backend for every update type x visibility; outputs, errors,
``ttl_statistics()``, the stored bytes (snapshot entries, timestamps included) and the changes an
incremental snapshot lists must be identical after every step.
Fixed seeds (``derandomize``), so a failure reproduces. A second group of tests makes sure the
native runs really go through the kernels."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from statecore import create_backend
from statecore.descriptors import ReducingStateDescriptor, ValueStateDescriptor
from statecore.errors import InvalidInputError
from statecore.ttl import ManualClock, StateTtlConfig
from support.listed_changes import ListedChanges

native_states = pytest.importorskip("statecore.backends.native_states")

TTL_MS = 100
KEYS = range(4)

# name -> (descriptor factory, Arrow value type)
STATES = {
    "v": (lambda: ValueStateDescriptor("v", "int64"), pa.int64()),
    "vs": (lambda: ValueStateDescriptor("vs", "string"), pa.string()),
    "sum": (lambda: ReducingStateDescriptor("sum", "sum", "int64"), pa.int64()),
    "min": (lambda: ReducingStateDescriptor("min", "min", "int64"), pa.int64()),
    "fmax": (lambda: ReducingStateDescriptor("fmax", "max", "float64"), pa.float64()),
    "fsum": (lambda: ReducingStateDescriptor("fsum", "sum", "float64"), pa.float64()),
    "cnt": (lambda: ReducingStateDescriptor("cnt", "count"), pa.int64()),
    "first": (lambda: ReducingStateDescriptor("first", "first", "int64"), pa.int64()),
    "flast": (lambda: ReducingStateDescriptor("flast", "last", "float64"), pa.float64()),
}
VALUE_STATES = ["v", "vs"]
REDUCING_STATES = ["sum", "min", "fmax", "fsum", "cnt", "first", "flast"]

# int64 values include huge ones so that sums overflow now and then.
_INTS = st.one_of(st.integers(-50, 50), st.sampled_from([2**62, -(2**62), 2**63 - 1, -(2**63)]))
_VALUES = {
    pa.int64(): _INTS,
    pa.float64(): st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
    pa.string(): st.text(alphabet="ab\u00e9", max_size=3),
}


def _rows(name):
    vt = STATES[name][1]
    return st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), _VALUES[vt])),
                    max_size=8)


def _one(name):
    return st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), _VALUES[STATES[name][1]]))


def _ops(value_state, reducing_state):
    """Ops over one value and one reducing state (all seven are registered and compared; a
    sequence focused on two meets more expired entries). Clock moves, get_batch and add_batch
    are listed twice: more expiries met by batch calls."""
    v, r = value_state, reducing_state
    advance = st.tuples(st.just("advance"), st.integers(0, 160))
    get = st.tuples(st.just("get"), st.sampled_from([v, r]),
                    st.lists(st.sampled_from(KEYS), min_size=1, max_size=8))
    add = st.tuples(st.just("add"), st.just(r), _rows(r))
    return st.one_of(
        advance, get, add, advance, get, add,
        st.tuples(st.just("put"), st.just(v), _rows(v)),
        st.tuples(st.just("update"), st.just(v), _one(v)),
        st.tuples(st.just("radd"), st.just(r), _one(r)),
        st.tuples(st.just("read"), st.sampled_from([v, r]), st.sampled_from(KEYS)),
        st.just(("snapshot_restore",)),
        st.just(("incremental",)),
    )


_SEQUENCES = st.tuples(st.sampled_from(VALUE_STATES), st.sampled_from(REDUCING_STATES)).flatmap(
    lambda vr: st.lists(_ops(*vr), min_size=8, max_size=40))

COMBOS = [(u, v) for u in ("OnCreateAndWrite", "OnReadAndWrite")
          for v in ("NeverReturnExpired", "ReturnExpiredIfNotCleanedUp")]


class Run:
    """One backend kind driven by the ops; ``removed`` carries ttl_statistics() over restores."""

    def __init__(self, kind, cfg):
        self.kind = kind
        self.cfg = cfg
        self.clock = ManualClock(1_000)
        self.removed = {}
        self.b = create_backend(kind, key_type="int64", ttl_clock=self.clock)
        self._register()

    def _register(self):
        self.states = {n: self.b.get_state(f().enable_time_to_live(self.cfg))
                       for n, (f, _) in STATES.items()}

    def stats(self):
        cur = self.b.ttl_statistics()
        return {k: cur[k] + self.removed.get(k, 0) for k in cur}

    def contents(self):
        """Stored bytes of every state at the key groups of KEYS (keys and values, timestamps
        included), through a full snapshot."""
        snap = self.b.snapshot()
        try:
            kgs = sorted({self.b.key_group_of(k) for k in KEYS})
            return {n: [tuple(a.to_pylist() for a in snap.entries(n, kg)) for kg in kgs]
                    for n in STATES}
        finally:
            snap.release()

    def apply(self, op):
        try:
            return ("ok", self._apply(op))
        except InvalidInputError:
            return ("error",)

    def _apply(self, op):
        what = op[0]
        if what == "advance":
            self.clock.advance(op[1])
            return None
        if what == "incremental":
            # The entries changed since the last completed checkpoint (renewals and removals on
            # read are changes too), then this one completes.
            snap = self.b.snapshot(incremental=True)
            kgs = sorted({self.b.key_group_of(k) for k in KEYS})
            got = {(n, k): v for n in STATES for kg in kgs
                   for k, v in zip(*(a.to_pylist() for a in snap.entries(n, kg)))}
            self.b.notify_checkpoint_complete(snap.snapshot_id)
            snap.release()
            current = {(n, k): v for n, groups in self.contents().items()
                       for keys, vals in groups for k, v in zip(keys, vals)}
            return ListedChanges(got, current, self.kind == "python")
        if what == "snapshot_restore":
            snap = self.b.snapshot()
            nb = create_backend(self.kind, key_type="int64", ttl_clock=self.clock)
            nb.restore(snap)
            snap.release()
            self.removed = self.stats()
            self.b = nb
            self._register()
            return None
        name = op[1]
        st_ = self.states[name]
        vt = STATES[name][1]
        if what == "get":
            out = st_.get_batch(pa.array(op[2], pa.int64()))
            return str(out.type), out.to_pylist()
        if what in ("put", "add"):
            keys = pa.array([k for k, _ in op[2]], pa.int64())
            vals = pa.array([v for _, v in op[2]], vt)
            if what == "put":
                return st_.put_batch(keys, vals)
            out = st_.add_batch(keys, vals)
            return str(out.type), out.to_pylist()
        if what in ("update", "radd"):
            key, v = op[2]
            self.b.set_current_key(key)
            return st_.update(v) if what == "update" else st_.add(v)
        if what == "read":
            self.b.set_current_key(op[2])
            return st_.value() if name in VALUE_STATES else st_.get()
        raise AssertionError(op)


def _check_same(ops, update_type, visibility):
    cfg = StateTtlConfig(TTL_MS, update_type=update_type, state_visibility=visibility)
    py, nat = Run("python", cfg), Run("native", cfg)
    assert type(nat.states["v"]) is native_states.NativeTtlValueState
    assert type(nat.states["sum"]) is native_states.NativeTtlReducingState
    for i, op in enumerate(ops):
        got_py, got_nat = py.apply(op), nat.apply(op)
        where = f"step {i}: {op!r}"
        assert got_nat == got_py, where
        assert nat.stats() == py.stats(), where
        assert nat.contents() == py.contents(), where
    assert nat.b.num_entries() == py.b.num_entries()


# Hand-picked sequences the random ones might reach only rarely.
_EXPIRED_THEN_REPEATS = [
    ("add", "sum", [(1, 5), (2, 7)]),
    ("advance", 100),  # exactly ts + ttl: expired
    # null rows before and after adds on the same expired key, repeated keys
    ("add", "sum", [(1, None), (1, 3), (1, None), (2, 4), (2, None), (1, 2), (2, None)]),
    ("get", "sum", [1, 2, 1]),
    ("advance", 99),
    ("get", "sum", [1, 2]),
    ("advance", 1),
    ("add", "sum", [(2, None), (2, None), (2, 1)]),
]
_OVERFLOW_AFTER_CLEANUP = [
    ("add", "sum", [(0, 1), (1, 2**62), (3, 9)]),
    ("advance", 60),
    ("add", "sum", [(4, 1)]),
    ("advance", 60),  # 0, 1, 3 expired; 4 fresh
    # null row removes 0 (counted), 3 is restarted, then 4 and 1 ... 4 overflows: aggregates
    # stay, 0 stays removed
    ("add", "sum", [(0, None), (3, 1), (4, 2**62), (4, None), (4, 2**62), (1, 5)]),
    ("get", "sum", [0, 1, 3, 4]),
]


@pytest.mark.slow
@pytest.mark.parametrize("update_type,visibility", COMBOS)
@settings(derandomize=True, max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=_SEQUENCES)
@example(ops=_EXPIRED_THEN_REPEATS)
@example(ops=_OVERFLOW_AFTER_CLEANUP)
def test_native_ttl_batches_equal_python(update_type, visibility, ops):
    _check_same(ops, update_type, visibility)


@pytest.mark.parametrize("update_type,visibility", COMBOS)
def test_handpicked_sequences_change_something(update_type, visibility):
    """The hand-picked examples do reach expiry and the overflow (so the comparison above is not
    about empty tables)."""
    cfg = StateTtlConfig(TTL_MS, update_type=update_type, state_visibility=visibility)
    r = Run("native", cfg)
    results = [r.apply(op) for op in _OVERFLOW_AFTER_CLEANUP]
    assert ("error",) in results
    assert r.stats()["read"] >= 3
    r = Run("native", cfg)
    for op in _EXPIRED_THEN_REPEATS:
        r.apply(op)
    assert r.stats()["read"] >= 2


# ------------------------------------------------------------------ the kernel path is taken

def test_native_ttl_batch_calls_do_not_use_the_python_batch_code(monkeypatch):
    """With the Python TTL batch methods made to fail, the native TTL states still serve every
    kernel-eligible batch call (and report expiries): the comparison above is not vacuous."""
    from statecore.backends import ttl_states

    def boom(*a, **k):
        raise AssertionError("python TTL batch path used")

    for cls, meth in ((ttl_states.TtlValueLike, "get_batch"),
                      (ttl_states.TtlValueState, "put_batch"),
                      (ttl_states.TtlReducingState, "add_batch"), (ttl_states.TtlState, "_fresh"),
                      (ttl_states.TtlState, "_unexpired")):
        monkeypatch.setattr(cls, meth, boom)
    kernel_calls = []
    real_args = native_states._ttl_kernel_args

    def spy(state):
        kernel_calls.append(state.descriptor.name)
        return real_args(state)

    monkeypatch.setattr(native_states, "_ttl_kernel_args", spy)
    clock = ManualClock(0)
    b = create_backend("native", key_type="int64", ttl_clock=clock)
    cfg = StateTtlConfig(10, update_type="OnReadAndWrite")
    v = b.get_state(ValueStateDescriptor("v", "string").enable_time_to_live(cfg))
    s = b.get_state(ReducingStateDescriptor("s", "sum", "int64").enable_time_to_live(cfg))
    c = b.get_state(ReducingStateDescriptor("c", "count").enable_time_to_live(cfg))
    keys = pa.array([1, 2, 1], pa.int64())
    v.put_batch(keys, pa.array(["a", None, "b"]))
    assert v.get_batch(keys).to_pylist() == ["b", None, "b"]
    assert s.add_batch(keys, pa.array([1, 2, None], pa.int64())).to_pylist() == [1, 2, 1]
    assert c.add_batch(keys, pa.array(["x", "y", "z"])).to_pylist() == [1, 1, 2]
    clock.advance(10)
    assert s.get_batch(keys).to_pylist() == [None, None, None]
    assert c.add_batch(keys, pa.array([None, 1, 1], pa.int64())).to_pylist() == [None, 1, 1]
    assert b.ttl_statistics()["read"] == 4  # s: 1, 2; c: 1 (null row), 2 (add)
    assert kernel_calls == ["v", "v", "s", "c", "s", "c"]


def test_ineligible_batches_keep_the_python_path():
    """Namespaced rows and custom reducers are not kernel cases: they run ttl_states.py's code
    on the native backend too, with the same results as the python backend."""
    outs = {}
    for kind in ("python", "native"):
        clock = ManualClock(0)
        b = create_backend(kind, key_type="int64", ttl_clock=clock)
        cfg = StateTtlConfig(10)
        r = b.get_state(ReducingStateDescriptor("r", lambda a, x: a * x, "int64")
                        .enable_time_to_live(cfg), namespace_type="int64")
        r.add_batch(pa.array([1, 1], pa.int64()), pa.array([3, 4], pa.int64()),
                    namespaces=pa.array([5, 5], pa.int64()))
        clock.advance(10)
        outs[kind] = (r.get_batch(pa.array([1], pa.int64()), namespaces=pa.array([5], pa.int64()))
                      .to_pylist(), b.ttl_statistics()["read"])
    assert outs["native"] == outs["python"] == ([None], 1)


@pytest.mark.parametrize("kind", ["python", "native"])
@pytest.mark.parametrize("visibility", ["NeverReturnExpired", "ReturnExpiredIfNotCleanedUp"])
def test_vectorized_reducer_with_ttl_equals_the_scalar_one(kind, visibility):
    """TTL rules (expired = absent for adds, a null row reads as get(), stale values once under
    ReturnExpiredIfNotCleanedUp) hold for a vectorized reducer exactly as for the same function
    row by row, through random batches with the clock moving."""
    import random

    import pyarrow.compute as pc

    from statecore.descriptors import Reducer

    if kind == "native":
        pytest.importorskip("statecore._native")
    rng = random.Random(3)
    cfg = StateTtlConfig(TTL_MS, state_visibility=visibility)
    clock = ManualClock(0)
    vb = create_backend(kind, key_type="int64", ttl_clock=clock)
    sb = create_backend(kind, key_type="int64", ttl_clock=clock)
    vec = Reducer.vectorized(lambda a, v: pc.add(pc.subtract(a, pc.multiply(v, 2)), 1))
    vs = vb.get_state(ReducingStateDescriptor("r", vec, "int64").enable_time_to_live(cfg))
    ss = sb.get_state(ReducingStateDescriptor("r", lambda a, v: a - 2 * v + 1, "int64")
                      .enable_time_to_live(cfg))
    for _ in range(40):
        clock.advance(rng.choice([0, 10, 60, 150]))
        keys = pa.array([rng.randrange(6) for _ in range(12)], pa.int64())
        vals = pa.array([None if rng.random() < 0.3 else rng.randrange(9) for _ in range(12)],
                        pa.int64())
        assert vs.add_batch(keys, vals).to_pylist() == ss.add_batch(keys, vals).to_pylist()
    assert vb.ttl_statistics() == sb.ttl_statistics()
    assert vs.get_batch(pa.array(range(6), pa.int64())).to_pylist() == \
        ss.get_batch(pa.array(range(6), pa.int64())).to_pylist()
