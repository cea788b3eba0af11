"""Shared pytest fixtures and markers.

Markers (pyproject.toml): ``spark`` for tests that run a real local PySpark (every test that takes
the ``spark`` fixture gets it here, so it cannot be forgotten), ``slow`` for tests that take more
than a few seconds. The fast loop is ``python -m pytest -m "not spark and not slow"``.
"""

import pytest

try:
    from hypothesis import settings
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    settings = None

if settings is not None:
    # No per-example deadline: these machines are shared, and a slow example is not a failure
    # (performance is measured in bench/, never asserted in tests).
    settings.register_profile("statecore", deadline=None)
    settings.load_profile("statecore")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession (local[2], UTC, UI off, 2 shuffle partitions) for every
    @pytest.mark.spark test; skipped when pyspark or Java is missing."""
    pytest.importorskip("pyspark")
    from statecore.spark.session import local_session

    try:
        session = local_session("statecore-tests", master="local[2]", shuffle_partitions=2)
    except Exception as exc:  # e.g. no Java runtime on this machine
        pytest.skip(f"cannot start a local SparkSession: {exc}")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def statecore_wheel(tmp_path_factory):
    """The release wheel of this checkout for the running Python (``wheels/build.py``:
    manylinux_2_17, ``tests/support/wheels.py``), built once per test run."""
    from support.wheels import build_wheel

    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory, statecore_wheel):
    """The python of a fresh venv with statecore installed from ``statecore_wheel`` (extras
    ``spark`` and ``test``) and nothing from this checkout on ``sys.path``."""
    from support.wheels import make_venv

    return make_venv(tmp_path_factory.mktemp("venv") / "env", statecore_wheel, "[spark,test]")
