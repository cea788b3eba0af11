"""Differential part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): a hypothesis rule-based state machine
and long seeded random programs drive the backend under test and the reference backend with the
same operations (per record, batches, timers, watermarks, full and incremental snapshots,
restores, also crossed between the two backends); every result, every raised error class and
every snapshot, byte for byte, must agree.
"""

from __future__ import annotations

import random

import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from statecore.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError, StateError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import AverageAggregate, merge_incremental, snapshot_dump

__all__ = ["DifferentialConformance"]


class DifferentialConformance(ConformanceBase):
    """Random operation sequences, compared with the reference backend step by step."""

    def test_differential_state_machine(self):
        suite = self

        class Machine(_DifferentialMachine):
            def make_pair(self, **kw):
                return suite.make_backend(**kw), suite.make_reference_backend(**kw)

            def recover(self, backend):
                return suite.recover(backend, self.opts)

        run_state_machine_as_test(Machine, settings=settings(
            max_examples=60, stateful_step_count=40, derandomize=True, deadline=None,
            suppress_health_check=list(HealthCheck)))

    def test_differential_random_programs(self):
        """Long seeded random operation sequences on the backend and the reference."""
        suite = self

        class Machine(_DifferentialMachine):
            def make_pair(self, **kw):
                return suite.make_backend(**kw), suite.make_reference_backend(**kw)

            def recover(self, backend):
                return suite.recover(backend, self.opts)

        rng = random.Random(0x5EED)
        for mp, assigner in [(128, "spark"), (200, "flink"), (128, "flink")]:
            machine = Machine()
            machine.setup(mp=mp, assigner=assigner)
            _random_program(machine, rng, 400)


KEYS = st.integers(-2, 4)


def _random_program(machine: "_DifferentialMachine", rng, steps: int) -> None:
    """Run ``steps`` random rules of ``machine`` (already set up), checking the invariant after
    each one. Complements the hypothesis run with long, focused operation sequences."""
    key = lambda: rng.randint(-2, 6)  # noqa: E731
    small = lambda: rng.choice([None, rng.randint(-5, 5), rng.randint(-5, 5)])  # noqa: E731
    for _ in range(steps):
        r = rng.random()
        if r < 0.12:
            machine.set_key(key())
        elif r < 0.2:
            machine.value_update(rng.choice([None, rng.randint(-5, 5), 1 << 63]))
        elif r < 0.3:
            # Now and then a list longer than a chunk (docs/formats.md "List state").
            n = rng.randint(0, 3) if rng.random() < 0.9 else rng.randint(30, 70)
            machine.list_op(rng.choice(["add", "add_all", "update", "clear"]),
                            [rng.choice([1, "a", (2,)]) for _ in range(n)])
            if rng.random() < 0.2:
                machine.list_namespace(rng.randint(0, 2))
        elif r < 0.5:
            machine.map_op(rng.choice(["put", "put", "remove", "remove", "clear", "size"]),
                           rng.choice(["", "a", "ü", "bb"]), rng.randint(-5, 5))
        elif r < 0.62:
            machine.reduce_add(rng.choice(["s", "c", "a"]), small())
            if rng.random() < 0.2:
                machine.sum_namespace(rng.choice(["x", "y"]))
        elif r < 0.7:
            n = rng.randint(0, 6)
            ks = [rng.choice([key(), key(), None]) if rng.random() < 0.1 else key()
                  for _ in range(n)]
            machine._batch_value(ks, [small() for _ in range(n)])
        elif r < 0.8:
            n = rng.randint(0, 6)
            ns = [rng.choice(["x", "y"]) for _ in range(n)] if rng.random() < 0.5 else None
            machine._batch_reduce([key() for _ in range(n)], [small() for _ in range(n)],
                                  rng.choice(["s", "c"]), ns)
        elif r < 0.85:
            n = rng.randint(0, 6)
            rows = [rng.choice([None, [], [small() or 0], [rng.randint(-5, 5)] * 2])
                    for _ in range(n)]
            machine._batch_list([key() for _ in range(n)], rows,
                                [rng.randint(0, 1) for _ in range(n)],
                                rng.choice(["append", "append_lists", "clear"]))
        elif r < 0.9:
            machine.timer(rng.randint(0, 30), rng.randint(0, 1), rng.random() < 0.3)
        elif r < 0.95:
            machine.watermark(rng.randint(0, 30))
        elif r < 0.985:
            machine.incremental_snapshot(rng.choice(["none", "latest", "latest", "oldest"]))
        else:
            machine.snapshot_restore(rng.random() < 0.5)
        machine.same_accounting_and_reads()
SMALL = st.integers(-5, 5)


class _DifferentialMachine(RuleBasedStateMachine):
    """Drives a backend under test and the reference with identical operations; every result,
    every raised error class and every snapshot (byte for byte) must agree."""

    def make_pair(self, **kw):  # overridden
        raise NotImplementedError

    @initialize(mp=st.sampled_from([128, 200]), assigner=st.sampled_from(["spark", "flink"]))
    def setup(self, mp, assigner):
        self.opts = dict(key_type="int64", max_parallelism=mp, assigner=assigner,
                         timer_namespace_type="int64")
        self._install(*self.make_pair(**self.opts))
        self._base_dump = None  # contents at the base of incremental snapshots (None: empty)
        self._pending_dumps = {}  # snapshot id -> contents, for ids newer than the base

    def _install(self, a, b):
        self.backends = (a, b)
        self.states = []
        for be in self.backends:
            self.states.append(dict(
                v=be.get_state(ValueStateDescriptor("v", "int64")),
                l=be.get_state(ListStateDescriptor("l", "pickle"), namespace_type="int64"),
                li=be.get_state(ListStateDescriptor("li", "int64"), namespace_type="int64"),
                m=be.get_state(MapStateDescriptor("m", "string", "int64")),
                s=be.get_state(ReducingStateDescriptor("s", "sum", "int64"),
                               namespace_type="string"),
                c=be.get_state(ReducingStateDescriptor("c", "count")),
                a=be.get_state(AggregatingStateDescriptor("a", AverageAggregate())),
            ))
        for sts in self.states:
            sts["l"].set_current_namespace(0)
            sts["li"].set_current_namespace(0)
            sts["s"].set_current_namespace("x")

    def _both(self, fn):
        results = []
        for be, sts in zip(self.backends, self.states):
            try:
                r = fn(be, sts)
                if isinstance(r, (pa.Array, pa.ChunkedArray)):
                    r = (str(r.type), r.to_pylist())
                results.append(("ok", r))
            except (InvalidInputError, StateError) as e:
                results.append(("error", type(e).__name__))
        assert results[0] == results[1], results
        return results[0]

    @rule(k=KEYS)
    def set_key(self, k):
        self._both(lambda be, s: be.set_current_key(k))

    @rule(v=st.one_of(st.none(), SMALL, st.just(1 << 63)))
    def value_update(self, v):
        self._both(lambda be, s: s["v"].update(v))

    @rule()
    def value_read(self):
        self._both(lambda be, s: s["v"].value())

    @rule(ns=st.integers(0, 2))
    def list_namespace(self, ns):
        self._both(lambda be, s: s["l"].set_current_namespace(ns))

    @rule(op=st.sampled_from(["add", "add_all", "add_many", "update", "get", "clear"]),
          xs=st.lists(st.one_of(SMALL, st.text(max_size=2)), max_size=3))
    def list_op(self, op, xs):
        def f(be, s):
            ls = s["l"]
            if op == "add":
                return ls.add(xs[0] if xs else None)
            if op == "add_many":  # over a chunk's bound (docs/formats.md "List state")
                return ls.add_all(xs * 15)
            if op in ("add_all", "update"):
                return getattr(ls, op)(xs)
            return getattr(ls, op)()
        self._both(f)

    @rule(op=st.sampled_from(["put", "put", "remove", "remove", "get", "contains", "clear",
                              "size", "keys"]),
          uk=st.sampled_from(["", "a", "ü"]), uv=SMALL)
    def map_op(self, op, uk, uv):
        def f(be, s):
            m = s["m"]
            if op == "put":
                return m.put(uk, uv)
            if op in ("get", "remove", "contains"):
                return getattr(m, op)(uk)
            return getattr(m, op)()
        self._both(f)

    @rule(name=st.sampled_from(["s", "c", "a"]), v=st.one_of(st.none(), SMALL))
    def reduce_add(self, name, v):
        self._both(lambda be, s: s[name].add(v))

    @rule(name=st.sampled_from(["s", "c", "a"]))
    def reduce_get(self, name):
        self._both(lambda be, s: s[name].get())

    @rule(ns=st.sampled_from(["x", "y"]))
    def sum_namespace(self, ns):
        self._both(lambda be, s: s["s"].set_current_namespace(ns))

    @rule(keys=st.lists(st.one_of(KEYS, st.none()), max_size=6), data=st.data())
    def batch_value(self, keys, data):
        vals = data.draw(st.lists(st.one_of(st.none(), SMALL), min_size=len(keys),
                                  max_size=len(keys)))
        self._batch_value(keys, vals)

    def _batch_value(self, keys, vals):
        ka, va = pa.array(keys, pa.int64()), pa.array(vals, pa.int64())
        self._both(lambda be, s: s["v"].put_batch(ka, va))
        self._both(lambda be, s: s["v"].get_batch(ka))

    @rule(keys=st.lists(KEYS, max_size=6), data=st.data(), name=st.sampled_from(["s", "c"]),
          per_row_ns=st.booleans())
    def batch_reduce(self, keys, data, name, per_row_ns):
        vals = data.draw(st.lists(st.one_of(st.none(), SMALL), min_size=len(keys),
                                  max_size=len(keys)))
        ns = None
        if per_row_ns:
            ns = data.draw(st.lists(st.sampled_from(["x", "y"]), min_size=len(keys),
                                    max_size=len(keys)))
        self._batch_reduce(keys, vals, name, ns)

    def _batch_reduce(self, keys, vals, name, ns_list):
        ka, va = pa.array(keys, pa.int64()), pa.array(vals, pa.int64())
        ns = None if ns_list is None or name != "s" else pa.array(ns_list, pa.string())
        self._both(lambda be, s: s[name].add_batch(ka, va, namespaces=ns))
        self._both(lambda be, s: s[name].get_batch(ka, namespaces=ns))

    @rule(keys=st.lists(KEYS, max_size=6), data=st.data(), op=st.sampled_from(
        ["append", "append", "append_lists", "clear"]))
    def batch_list(self, keys, data, op):
        rows = data.draw(st.lists(st.one_of(st.none(), st.lists(SMALL, max_size=3)),
                                  min_size=len(keys), max_size=len(keys)))
        ns = data.draw(st.lists(st.integers(0, 1), min_size=len(keys), max_size=len(keys)))
        self._batch_list(keys, rows, ns, op)

    def _batch_list(self, keys, rows, ns_list, op):
        """The list kernels (append_batch of elements or of list<int64> rows, get_batch,
        clear_batch) against the reference's per-row path, one entry per element."""
        ka, ns = pa.array(keys, pa.int64()), pa.array(ns_list, pa.int64())
        if op == "append":
            va = pa.array([(r or [None])[0] for r in rows], pa.int64())
            self._both(lambda be, s: s["li"].append_batch(ka, va, namespaces=ns))
        elif op == "append_lists":
            va = pa.array(rows, pa.list_(pa.int64()))
            self._both(lambda be, s: s["li"].append_batch(ka, va, namespaces=ns))
        else:
            self._both(lambda be, s: s["li"].clear_batch(ka, namespaces=ns))
        self._both(lambda be, s: s["li"].get_batch(ka, namespaces=ns))

    @rule(ts=st.integers(0, 30), ns=st.integers(0, 1), delete=st.booleans())
    def timer(self, ts, ns, delete):
        if delete:
            self._both(lambda be, s: be.timers.delete_event_time_timer(ts, ns))
        else:
            self._both(lambda be, s: be.timers.register_event_time_timer(ts, ns))

    @rule(wm=st.integers(0, 30))
    def watermark(self, wm):
        self._both(lambda be, s: be.timers.advance_watermark(wm))

    @rule(cross=st.booleans())
    def snapshot_restore(self, cross):
        snaps = [be.snapshot() for be in self.backends]
        assert snapshot_dump(snaps[0]) == snapshot_dump(snaps[1])
        key = self.backends[1].current_key
        fresh = self.make_pair(**self.opts)
        # cross: restore each fresh backend from the OTHER backend's snapshot
        for be, snap in zip(fresh, snaps[::-1] if cross else snaps):
            be.restore(snap)
        self._base_dump = snapshot_dump(snaps[0])  # the restored state is the base
        self._pending_dumps = {}
        self._install(*fresh)
        if key is not None:
            self._both(lambda be, s: be.set_current_key(key))
        for s in snaps:
            s.release()

    def recover(self, backend):  # overridden: ConformanceBase.recover
        return None

    def _check_recovery(self, recovered) -> None:
        """The backend under test was recovered through its own protocol (ConformanceBase.recover)
        as ``recovered``: it must hold the reference's state; the reference is restored from
        its snapshot into a fresh one (neither keeps the watermark), and both carry on."""
        ref = self.backends[1]
        snap = ref.snapshot()
        got = recovered.snapshot()
        try:
            assert snapshot_dump(got) == snapshot_dump(snap)
            fresh_ref = self.make_pair(**self.opts)[1]
            fresh_ref.restore(snap)
        finally:
            snap.release()
            got.release()
        key = ref.current_key
        self._install(recovered, fresh_ref)
        self._base_dump = None
        self._pending_dumps = {}
        if key is not None:
            self._both(lambda be, s: be.set_current_key(key))

    @rule(complete=st.sampled_from(["none", "latest", "oldest"]))
    def incremental_snapshot(self, complete):
        """Incremental snapshots: byte-identical on both backends, and base + incremental merged
        equals a full snapshot taken at the same moment; then maybe complete a pending one. A
        backend with its own recovery protocol (ConformanceBase.recover) is recovered instead."""
        recovered = self.recover(self.backends[0])
        if recovered is not None:
            self._check_recovery(recovered)
            return
        incs = [be.snapshot(incremental=True) for be in self.backends]
        fulls = [be.snapshot() for be in self.backends]
        assert [s.incremental for s in incs + fulls] == [True, True, False, False]
        assert (incs[0].snapshot_id == incs[1].snapshot_id
                < fulls[0].snapshot_id == fulls[1].snapshot_id)
        inc_dump = snapshot_dump(incs[0])
        assert inc_dump == snapshot_dump(incs[1])
        full_dump = snapshot_dump(fulls[0])
        assert full_dump == snapshot_dump(fulls[1])
        assert merge_incremental(self._base_dump, inc_dump) == full_dump
        self._pending_dumps[incs[0].snapshot_id] = full_dump
        self._pending_dumps[fulls[0].snapshot_id] = full_dump
        if complete != "none":
            sid = (max if complete == "latest" else min)(self._pending_dumps)
            for be in self.backends:
                be.notify_checkpoint_complete(sid)
            self._base_dump = self._pending_dumps[sid]
            self._pending_dumps = {i: d for i, d in self._pending_dumps.items() if i > sid}
        for snap in incs + fulls:
            snap.release()

    @invariant()
    def same_accounting_and_reads(self):
        if not hasattr(self, "backends"):
            return
        self._both(lambda be, s: (be.num_entries(), be.state_bytes(), be.timers.num_timers()))
        if self.backends[1].current_key is None:
            return
        self._both(lambda be, s: (be.current_key, be.current_key_group, s["v"].value(),
                                  s["l"].get(), s["li"].get(), s["m"].items(), s["m"].size(),
                                  s["s"].get(), s["c"].get(),
                                  s["a"].get(), be.timers.list_event_time_timers()))
