"""Shared pytest fixtures and markers.

Markers (pyproject.toml): ``spark`` for tests that run a real local PySpark (every test that takes
the ``spark`` fixture gets it here, so it cannot be forgotten), ``slow`` for tests that take more
than a few seconds. The fast loop is ``python -m pytest -m "not spark and not slow"``.
"""

import fcntl
import os
from pathlib import Path

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


#: Modules that take minutes (Spark clusters and drivers of their own, kill loops, the wheel
#: build), longest first. The suite runs on two pytest-xdist workers, a module per worker at a
#: time (``--dist loadfile``, pyproject.toml); a worker takes the next module in collection
#: order when it is nearly done, so starting these first keeps one of them from being the
#: single-worker tail of the run.
LONG_MODULES = (
    "test_spark_cluster.py",
    "test_demo_job.py",
    "test_demo_external_state.py",
    "test_bench.py",
    "test_demo_kill_loop.py",
    "test_spark_connect.py",
    "test_spark_incremental.py",
    "test_wheel.py",
    "test_tiered_compaction.py",
    "test_s3_demo.py",
    "test_spark_operator.py",
    "test_readme_example.py",
    "test_fuzz.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
    rank = {name: i for i, name in enumerate(LONG_MODULES)}
    # A stable sort: the order inside a module stays the one pytest collected.
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def _once_per_run(tmp_path_factory, name: str, make):
    """``make(directory)``'s result (a path), computed once per test run also when the run is
    split over pytest-xdist workers: the first worker to ask makes it in a directory shared by
    all workers, under a file lock; the others wait and reuse it. For what must not be done
    twice at once (the wheel build shares the checkout's ``build/``) or is too slow to repeat."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    done = shared / f"{name}.path"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return Path(done.read_text())
        directory = shared / name
        directory.mkdir(exist_ok=True)
        result = make(directory)
        done.write_text(str(result))
        return result


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
    manylinux_2_17, ``tests/support/wheels.py``), built once per test run (also across
    pytest-xdist workers)."""
    from support.wheels import build_wheel

    return _once_per_run(tmp_path_factory, "wheel", build_wheel)


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory, statecore_wheel):
    """The python of a fresh venv with statecore installed from ``statecore_wheel`` (extras
    ``spark`` and ``test``) and nothing from this checkout on ``sys.path``."""
    from support.wheels import make_venv

    return _once_per_run(tmp_path_factory, "venv",
                         lambda d: make_venv(d / "env", statecore_wheel, "[spark,test]"))
