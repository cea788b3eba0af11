"""The conformance suite on the external backends (statecore.external), against a real
redis-server and a real PostgreSQL server: every state call is served by the cache in front,
so the suite checks that reading through from the store and the epoch protocol change nothing
of the semantics. Each comparison with the reference backend (``same_as_reference``) also
pre-commits and commits the backend's state as an epoch and compares a new backend on the same
namespace (which reads everything back from the store) with the reference: Redis with the
python cache, PostgreSQL with the native one."""

from __future__ import annotations

import itertools
import weakref

import pytest

from statecore.backends import create_backend
from statecore.external import commit_epoch
from statecore.external.cached import DEFAULT_CACHE_ENTRIES
from statecore.testing.conformance import BackendConformance
from statecore.testing.helpers import snapshot_dump
from statecore.testing.operator_state import OperatorStateConformance
from support.postgres_server import shared_postgres_server  # noqa: F401  (fixture)
from support.redis_server import shared_redis_server  # noqa: F401  (fixture)

_namespaces = itertools.count()


class _ExternalConformance(BackendConformance):
    kind = "redis"
    cache = "python"
    #: The cache's bound (``cache_entries``): the default, or 1 to evict every clean key group
    #: not in use at each read-through.
    cache_entries = DEFAULT_CACHE_ENTRIES

    def make_backend(self, namespace=None, **options):
        options.setdefault("cache_entries", self.cache_entries)
        b = create_backend(self.kind, url=self.url, cache=self.cache,
                           namespace=namespace or f"t/{next(_namespaces)}", **options)
        self.opened.append(b)
        return b

    def same_as_reference(self, program, **options):
        seen = super().same_as_reference(program, **options)
        options.setdefault("key_type", "int64")
        options.setdefault("max_parallelism", 128)
        ns = f"t/{next(_namespaces)}"
        b = self.make_backend(namespace=ns, **options)
        ref = self.make_reference_backend(**options)
        program(b)
        program(ref)
        commit_epoch(self.url, ns, 1, [b.pre_commit(1)])
        fresh = self.make_backend(namespace=ns, **options)
        got, want = snapshot_dump(fresh.snapshot()), snapshot_dump(ref.snapshot())
        # Timers through the store have their own tests (test_external_redis.py,
        # test_external_postgres.py); every keyed state (registered, restored) is compared.
        got.pop("__timers__", None)
        want.pop("__timers__", None)
        assert got == want
        return seen

    def recover(self, backend, options):
        epoch = (backend.committed_epoch or 0) + 1
        commit_epoch(self.url, backend.namespace, epoch, [backend.pre_commit(epoch)])
        backend.dispose()
        return self.make_backend(namespace=backend.namespace, **options)


# The epoch protocol replaces incremental snapshots, notify_checkpoint_complete and
# CheckpointStore.checkpoint (which takes incremental snapshots) for this backend: the tests
# resting on them do not apply. The differential tests recover through epochs instead
# (ConformanceBase.recover) and tests/test_external_redis.py tests the protocol itself.
_EPOCHS = ("external state is checkpointed by epochs (pre_commit, commit_epoch), not by "
           "incremental snapshots and notify_checkpoint_complete")
_NOT_APPLICABLE = [
    "test_collection_batches_between_held_and_incremental_snapshots",
    "test_big_list_append_order_and_one_chunk_per_append",
    "test_list_update_after_clear_restores_exactly_through_a_chain",
    "test_big_map_incremental_change_is_one_entry",
    "test_ttl_migration_matches_reference",
    "test_incremental_random_histories",
    "test_incremental_snapshot_lists_changes_and_tombstones",
    "test_incremental_snapshot_isolation",
    "test_notify_checkpoint_complete_validation",
    "test_incremental_after_restore_holds_only_later_changes",
    "test_keys_after_restore_and_incremental_snapshots_unaffected",
    "test_checkpoint_loop_restores_every_version",
    "test_checkpoint_incremental_runs_are_small",
    "test_failed_checkpoint_leaves_the_base",
    "test_checkpoint_is_full_when_the_base_is_no_version_of_the_store",
]


def _not_applicable(self):
    pytest.skip(_EPOCHS)


for _name in _NOT_APPLICABLE:
    assert hasattr(BackendConformance, _name), _name
    setattr(_ExternalConformance, _name, _not_applicable)

# Operator state (non-keyed, per task: list, union list, broadcast) is committed with the epochs
# and redistributed from the store (open_operator_state), not restored from snapshots as the
# suite's tests do: tests/test_external_operator_state.py tests it against the in-memory
# redistribution.
_NO_OPERATOR_STATE = ("external backends restore operator state from the store by epoch "
                      "(open_operator_state), not from snapshots: "
                      "tests/test_external_operator_state.py")


def _no_operator_state(self):
    pytest.skip(_NO_OPERATOR_STATE)


for _name in vars(OperatorStateConformance):
    if _name.startswith("test_"):
        setattr(_ExternalConformance, _name, _no_operator_state)


class _RedisConformance(_ExternalConformance):
    kind = "redis"

    @pytest.fixture(autouse=True)
    def _server(self, shared_redis_server):  # noqa: F811
        # Every backend opens its own namespace: the tests share one server.
        self.url = shared_redis_server.url
        self.opened = []
        yield
        for b in self.opened:
            b.dispose()


class _PostgresConformance(_ExternalConformance):
    kind = "postgres"

    @pytest.fixture(autouse=True)
    def _server(self, shared_postgres_server):  # noqa: F811
        self.url = shared_postgres_server.url
        self.opened = _WeakList()
        yield
        for b in list(self.opened):
            b.dispose()


class _WeakList(weakref.WeakSet):
    """The backends a test opened, not kept alive: one made per example of a stateful test
    releases its server connection when dropped (a server has a fixed number of them)."""

    def append(self, item) -> None:
        self.add(item)


# Each store once, each cache kind once: the cache kinds differ only in the in-memory backend in
# front (the python and the native backend, which the conformance suite itself holds to the same
# semantics), with the same read-through and epoch code (statecore.external.cached) for both; a
# class per store and cache kind would repeat the same store calls.
class TestRedisPythonCache(_RedisConformance):
    cache = "python"


# The native-cache class runs with a cache bound of one entry: every read-through evicts every
# clean key group not in use, so the suite checks on a real store that eviction and reading
# through again change nothing (tests/test_external_cache.py compares a bounded with an
# unbounded cache on Redis with both cache kinds and on PostgreSQL; the python-cache class keeps
# the default bound).
class TestPostgresNativeCache(_PostgresConformance):
    cache = "native"
    cache_entries = 1
