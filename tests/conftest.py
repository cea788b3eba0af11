"""Shared pytest fixtures and markers.

Markers (pyproject.toml): ``spark`` for tests that run a real local PySpark (every test that takes
the ``spark`` fixture gets it here, so it cannot be forgotten), ``slow`` for tests that take more
than a few seconds. The fast loop is ``python -m pytest -m "not spark and not slow"``.
"""

import os

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


@pytest.fixture(scope="session", autouse=True)
def spark_local_dirs(tmp_path_factory):
    """Spark's local directories (``SPARK_LOCAL_DIRS``: the ``spark-*`` and ``blockmgr-*``
    directories, the driver's copies of shipped files) for every Spark process of the run -- the
    session's JVM and the drivers tests start as processes of their own, which inherit the
    variable -- under the run's base temporary directory instead of ``/tmp``: a SIGKILLed
    driver (the kill tests do that on purpose) never runs Spark's clean-up of them."""
    path = tmp_path_factory.mktemp("spark-local")
    old = os.environ.get("SPARK_LOCAL_DIRS")
    os.environ["SPARK_LOCAL_DIRS"] = str(path)
    yield path
    if old is None:
        os.environ.pop("SPARK_LOCAL_DIRS", None)
    else:
        os.environ["SPARK_LOCAL_DIRS"] = old


@pytest.fixture(scope="session")
def spark(spark_local_dirs):
    """One local SparkSession (local[2], UTC, UI off, 2 shuffle partitions) for every
    @pytest.mark.spark test, its scratch files (``java.io.tmpdir`` too) under
    ``spark_local_dirs``; skipped when pyspark or Java is missing."""
    pytest.importorskip("pyspark")
    from statecore.spark.session import local_session

    conf = {"spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={spark_local_dirs}"}
    try:
        session = local_session("statecore-tests", master="local[2]", shuffle_partitions=2,
                                conf=conf)
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
