"""``statecore demo`` with its operator state on S3 (moto in server mode on loopback), checked
against the Spark SQL oracle of tests/test_demo_job.py: three weeks of flights, then a rerun that
processes nothing, and ``statecore inspect`` of the S3 checkpoint."""

from __future__ import annotations

import os

import pyarrow.fs as pafs
import pytest

from statecore import CheckpointStore
from statecore.checkpoint.layout import join_uri
from statecore.demo.data import load_flights
from statecore.demo.job import DemoConfig, DemoPipeline, local_parts, run_demo
from statecore.demo.reference import (
    batch_plan,
    final_route_stats,
    read_sessions,
    reference_routes,
    reference_sessions,
)
from support.frames import assert_same_rows
from support.s3_server import ACCESS_KEY, SECRET_KEY, start_s3_server

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DAYS = 21
DAY_MS = 86_400_000
BUCKET = "statecore-demo"


@pytest.fixture
def s3(tmp_path):
    with start_s3_server(str(tmp_path)) as server:
        server.create_bucket(BUCKET)
        yield server


def test_demo_with_checkpoints_on_s3_matches_spark_sql(spark, s3, tmp_path, capsys):
    backend = "native"
    try:
        import statecore.backends.native  # noqa: F401
    except ImportError:
        backend = "python"
    # The shared Spark session's workers started without this server's environment: the
    # credentials travel in the URI (docs/deploy.md prefers the environment).
    uri = (f"s3://{ACCESS_KEY}:{SECRET_KEY}@{BUCKET}/flights?endpoint_override={s3.endpoint}"
           f"&scheme=http&region=us-east-1")
    cfg = DemoConfig(checkpoint=uri, output=str(tmp_path / "out"),
                     landing=str(tmp_path / "landing"),
                     spark_checkpoint=str(tmp_path / "spark"), backend=backend, days=DAYS,
                     files_per_trigger=7, parallelism=2, max_parallelism=128,
                     aircraft_idle_ttl_ms=6 * DAY_MS, route_idle_ttl_ms=6 * DAY_MS)
    s = run_demo(cfg, spark=spark, progress=None)
    assert (s.micro_batches, s.flushed, s.stopped_early) == (3, True, False)
    assert s.events == load_flights(DAYS).num_rows
    assert s.checkpoint_bytes > 0 and s.checkpoint_bytes_written > 0
    landing, spark_ckpt = local_parts(cfg)
    assert not os.path.exists(os.path.join(cfg.output, "operators"))
    plan = batch_plan(spark_ckpt)
    assert_same_rows(read_sessions(spark, cfg.output),
                     reference_sessions(spark, landing, cfg.session_gap_ms,
                                        cfg.aircraft_idle_ttl_ms, plan))
    assert_same_rows(final_route_stats(spark, cfg.output),
                     reference_routes(spark, landing, cfg.route_idle_ttl_ms, plan))
    pipe = DemoPipeline(cfg)
    for op in (pipe.sessions, pipe.routes):
        assert op.store_uri.startswith(f"s3://{ACCESS_KEY}:{SECRET_KEY}@{BUCKET}/flights/"
                                       "operators/")
        store = op.store
        assert store.fencing
        latest = store.latest_version()
        store.verify(latest)
        files = s3.filesystem().get_file_info(pafs.FileSelector(store.root, recursive=True))
        names = {f.path for f in files}
        for f in store.manifest(latest)["files"]:
            assert f"{store.root}/{f['path']}" in names
    again = run_demo(cfg, spark=spark, progress=None)
    assert again.micro_batches == 0 and again.flushed

    from statecore.cli import main

    assert main(["inspect", join_uri(uri, "operators"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "sessions" in out and "route_delays" in out
    assert CheckpointStore(join_uri(uri, "operators/sessions")).versions()
