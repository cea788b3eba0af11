"""The conformance suite on the pure-Python reference backend (compared with a second instance of
itself in the differential tests), plus create_backend checks."""

import pytest

from statecore.backends import create_backend
from statecore.backends.python import PythonBackend
from statecore.errors import InvalidInputError
from statecore.testing.conformance import BackendConformance


class TestPythonBackend(BackendConformance):
    def make_backend(self, **options):
        return create_backend("python", **options)


def test_create_backend_validation():
    assert isinstance(create_backend("python"), PythonBackend)
    for kw in [dict(key_type="float32"), dict(max_parallelism=0), dict(max_parallelism=40000),
               dict(assigner="hive"), dict(key_group_range=(0, 128)), dict(key_group_range=(5, 3)),
               dict(timer_namespace_type="pickle")]:
        with pytest.raises(InvalidInputError):
            create_backend("python", **kw)
    with pytest.raises(InvalidInputError):
        create_backend("rocksdb")
