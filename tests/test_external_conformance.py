"""The conformance suite on the Redis backend (statecore.external), against a real
redis-server: every state call is served by the cache in front, so the suite checks that
reading through from Redis and the epoch protocol change nothing of the semantics. Each
comparison with the reference backend (``same_as_reference``) also pre-commits and commits
the backend's state as an epoch and compares a new backend on the same namespace (which reads
everything back from Redis) with the reference, for both cache kinds."""

from __future__ import annotations

import itertools

import pytest

from statecore.backends import create_backend
from statecore.external import commit_epoch
from statecore.testing.conformance import BackendConformance
from statecore.testing.helpers import snapshot_dump
from support.redis_server import redis_server  # noqa: F401  (fixture)

_namespaces = itertools.count()


class _RedisConformance(BackendConformance):
    cache = "python"

    @pytest.fixture(autouse=True)
    def _server(self, redis_server):  # noqa: F811
        self.url = redis_server.url
        self.opened = []
        yield
        for b in self.opened:
            b.dispose()

    def make_backend(self, namespace=None, **options):
        b = create_backend("redis", url=self.url, cache=self.cache,
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
        # Timers are not kept in Redis; every state (registered, restored) is.
        got.pop("__timers__", None)
        want.pop("__timers__", None)
        assert got == want
        return seen


class TestRedisPythonCache(_RedisConformance):
    cache = "python"


class TestRedisNativeCache(_RedisConformance):
    cache = "native"
