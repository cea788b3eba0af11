"""Operator state (non-keyed list, union list and broadcast state) in the external stores,
against a real redis-server and a real PostgreSQL server: committed with the epoch, invisible
before the commit, redistributed on rescale exactly as the in-memory backends redistribute
snapshots (statecore.operator_state, Flink's round-robin repartitioner), the store holding
only the last epoch's writers afterwards, and discarded with an abort."""

from __future__ import annotations

import itertools

import pytest

from statecore.backends import create_backend
from statecore.descriptors import MapStateDescriptor
from statecore.errors import StateError
from statecore.external import abort_epoch, commit_epoch
from statecore.external.cached import OPERATOR_WRITERS_STATE
from statecore.key_groups import key_group_range_for_operator
from support.postgres_server import shared_postgres_server  # noqa: F401  (fixture)
from support.redis_server import shared_redis_server  # noqa: F401  (fixture)

MAXP = 16
_namespaces = itertools.count()
_RULES = MapStateDescriptor("rules", "string", "int64")


@pytest.fixture(params=["redis", "postgres"])
def store(request):
    """(backend kind, URL) of a running server of each store."""
    server = "shared_redis_server" if request.param == "redis" else "shared_postgres_server"
    return request.param, request.getfixturevalue(server).url


def _range(i, p):
    r = key_group_range_for_operator(MAXP, p, i)
    return r.start, r.end


def _task(store, ns, i, p, kind=None):
    """Task ``i`` of ``p`` on the store (or an in-memory backend of ``kind``)."""
    if kind is not None:
        return create_backend(kind, key_type="int64", max_parallelism=MAXP,
                              key_group_range=_range(i, p))
    b = create_backend(store[0], url=store[1], namespace=ns, key_type="int64",
                       max_parallelism=MAXP, key_group_range=_range(i, p), cache="native",
                       task=f"p{i}of{p}")
    b.open_operator_state(i, p)
    return b


def _fill(b, i):
    """Task ``i``'s operator state: an even-split list, a union list, a broadcast map."""
    ops = b.operator_state
    ops.get_list_state("offsets", "int64").update([100 * i + j for j in range(i + 2)])
    ops.get_union_list_state("seen", "string").update([f"t{i}-{j}" for j in range(2)])
    ops.get_broadcast_state(_RULES).put_all({"a": 1, "b": 2, f"own{i}": i})


def _contents(b) -> dict:
    ops = b.operator_state
    return {"offsets": ops.get_list_state("offsets", "int64").get(),
            "seen": ops.get_union_list_state("seen", "string").get(),
            "rules": dict(ops.get_broadcast_state(_RULES).items())}


def _commit_all(store, ns, tasks, epoch):
    commit_epoch(store[1], ns, epoch, [t.pre_commit(epoch) for t in tasks])
    for t in tasks:
        t.notify_committed(epoch)


def _writer_records(store, ns) -> list:
    """``[(kg0, end)]`` of the writer records the store holds."""
    probe = create_backend(store[0], url=store[1], namespace=ns, key_type="int64",
                           max_parallelism=MAXP, cache="python")
    try:
        _, data = probe._store_read_operator_state()  # noqa: SLF001 - the layout under test
    finally:
        probe.dispose()
    return sorted((kg, int(d[b""])) for (name, kg), d in data.items()
                  if name == OPERATOR_WRITERS_STATE)


def test_operator_state_needs_open_operator_state(store):
    b = create_backend(store[0], url=store[1], namespace=f"ops/{next(_namespaces)}",
                       key_type="int64", max_parallelism=MAXP)
    with pytest.raises(StateError, match=r"open_operator_state\(operator_index, parallelism\)"):
        b.operator_state  # noqa: B018
    b.dispose()


@pytest.mark.parametrize("p_old,p_new", [(2, 2), (2, 3), (3, 2), (3, 1), (1, 4)])
def test_rescaled_operator_state_is_the_in_memory_redistribution(store, p_old, p_new):
    ns = f"ops/{next(_namespaces)}"
    olds = [_task(store, ns, i, p_old) for i in range(p_old)]
    refs = [_task(store, ns, i, p_old, kind="python") for i in range(p_old)]
    for i in range(p_old):
        _fill(olds[i], i)
        _fill(refs[i], i)
    # Before the commit nothing of it is visible.
    wals = [t.pre_commit(1) for t in olds]
    assert _contents(_task(store, ns, 0, 1)) == {"offsets": [], "seen": [], "rules": {}}
    commit_epoch(store[1], ns, 1, wals)
    for t in olds:
        t.notify_committed(1)
        t.dispose()
    assert _writer_records(store, ns) == [_range(i, p_old) for i in range(p_old)]
    news = [_task(store, ns, i, p_new) for i in range(p_new)]
    wants = _restored(refs, p_new)
    for i, (t, want) in enumerate(zip(news, wants)):
        assert _contents(t) == _contents(want), (i, p_new)
    # The new tasks' first epoch replaces the old tasks' operator state in the store: the
    # next restore is the in-memory one of the new tasks' snapshots (union lists, which every
    # task writes whole, gain every task's copy, as in Flink).
    for b in (news[0], wants[0]):
        b.operator_state.get_list_state("offsets", "int64").add(7)
    _commit_all(store, ns, news, 2)
    assert _writer_records(store, ns) == [_range(i, p_new) for i in range(p_new)]
    again = [_task(store, ns, i, p_new) for i in range(p_new)]
    for t, want in zip(again, _restored(wants, p_new)):
        assert _contents(t) == _contents(want)
    for t in news + again + refs + wants:
        t.dispose()


def _restored(olds, p_new) -> list:
    """In-memory backends of tasks ``0 .. p_new - 1`` restored from ``olds``' snapshots."""
    snaps = [o.snapshot() for o in olds]
    out = []
    for i in range(p_new):
        b = create_backend("python", key_type="int64", max_parallelism=MAXP,
                           key_group_range=_range(i, p_new))
        b.operator_state.restore(snaps, i, p_new)
        out.append(b)
    return out


def test_an_aborted_epoch_leaves_the_committed_operator_state(store):
    ns = f"ops/{next(_namespaces)}"
    t = _task(store, ns, 0, 1)
    _fill(t, 0)
    _commit_all(store, ns, [t], 1)
    committed = _contents(t)
    t.operator_state.get_list_state("offsets", "int64").add(99)
    t.operator_state.get_broadcast_state(_RULES).remove("a")
    t.pre_commit(2)
    assert abort_epoch(store[1], ns, 2) == 1
    t.abort()
    assert _contents(t) == committed
    assert _contents(_task(store, ns, 0, 1)) == committed
    # Changes after the abort commit as usual; an emptied state leaves the store.
    t.operator_state.get_list_state("offsets", "int64").clear()
    _commit_all(store, ns, [t], 2)
    assert _contents(_task(store, ns, 0, 1)) == dict(committed, offsets=[])
    t.dispose()


def test_a_kept_backend_refreshes_its_union_lists(store):
    ns = f"ops/{next(_namespaces)}"
    tasks = [_task(store, ns, i, 2) for i in range(2)]
    for i, t in enumerate(tasks):
        _fill(t, i)
    _commit_all(store, ns, tasks, 1)
    assert _contents(tasks[0])["seen"] == ["t0-0", "t0-1"]  # its own, until it refreshes
    assert tasks[0].refresh_operator_state()
    assert _contents(tasks[0])["seen"] == ["t0-0", "t0-1", "t1-0", "t1-1"]
    assert _contents(tasks[0])["offsets"] == [0, 1]
    # A store without union lists needs no refresh.
    other = _task(store, f"ops/{next(_namespaces)}", 0, 1)
    other.operator_state.get_list_state("offsets", "int64").add(1)
    assert not other.refresh_operator_state()
    for t in tasks + [other]:
        t.dispose()


def test_a_task_without_operator_state_still_counts_as_an_old_task(store):
    ns = f"ops/{next(_namespaces)}"
    first = [_task(store, ns, i, 2) for i in range(2)]
    first[0].operator_state.get_list_state("offsets", "int64").update([1, 2, 3])
    _commit_all(store, ns, first, 1)
    # Task 1 registers nothing, yet its record keeps the parallelism at 2 for the restore:
    # at an unchanged parallelism each task gets its own list back.
    assert _writer_records(store, ns) == [_range(0, 2), _range(1, 2)]
    again = [_task(store, ns, i, 2) for i in range(2)]
    assert [t.operator_state.get_list_state("offsets", "int64").get() for t in again] == [
        [1, 2, 3], []]
    for t in first + again:
        t.dispose()
