"""Shared pytest fixtures."""

import pytest


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
