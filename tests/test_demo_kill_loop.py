"""The bundled job's driver, its whole process group SIGKILLed at random moments of its
micro-batches and started again on the same checkpoints: after every kill each operator's
latest committed version verifies and restores, and the job's final output equals the Spark SQL
reference (what an uninterrupted run produces). STATECORE_DEMO_KILLS sets the number of kills."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from statecore.demo.job import DemoConfig, DemoPipeline
from support.spark_cluster import scratch
from test_demo_job import DAY_MS, DAYS, _assert_matches_spark_sql

KILLS = int(os.environ.get("STATECORE_DEMO_KILLS", "2"))


def _scratch(cfg: DemoConfig) -> str:
    """Where the drivers keep their Spark scratch files (a SIGKILLed JVM leaves them behind):
    beside the checkpoint, deleted after each run."""
    return os.path.join(os.path.dirname(cfg.checkpoint), "spark-scratch")


def _start(cfg: DemoConfig) -> subprocess.Popen:
    scratch_env, scratch_conf = scratch(_scratch(cfg))
    return subprocess.Popen(
        [sys.executable, "-m", "statecore.cli", "demo", "--checkpoint", cfg.checkpoint,
         "--output", cfg.output, "--days", str(cfg.days), "--backend", cfg.backend,
         "--files-per-trigger", str(cfg.files_per_trigger), "--parallelism",
         str(cfg.parallelism), "--aircraft-idle-ttl", "6d", "--route-idle-ttl", "6d",
         "--master", "local[2]",
         *[a for k, v in scratch_conf.items() for a in ("--conf", f"{k}={v}")]],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env=dict(os.environ, **scratch_env))


def _check_latest_versions(cfg: DemoConfig) -> None:
    for op in (DemoPipeline(cfg).sessions, DemoPipeline(cfg).routes):
        v = op.store.latest_version()
        if v is None:
            continue
        op.store.verify(v)
        with op.store.open(v) as reader:
            for meta in reader.state_metas():
                for kg in reader.key_group_range:
                    reader.entries(meta["name"], kg)


@pytest.mark.spark
@pytest.mark.slow
def test_driver_killed_mid_batch_then_restarted_matches_spark_sql(spark, tmp_path):
    cfg = DemoConfig(checkpoint=str(tmp_path / "ckpt"), output=str(tmp_path / "out"),
                     backend="native", days=DAYS, files_per_trigger=3, parallelism=2,
                     aircraft_idle_ttl_ms=6 * DAY_MS, route_idle_ttl_ms=6 * DAY_MS)
    rng = random.Random(7)
    killed = 0
    for _ in range(KILLS):
        proc = _start(cfg)
        lines = []
        deadline = time.monotonic() + 300
        # Kill once the job is inside its micro-batches: after the first batch line, at a
        # random moment of a later one.
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("batch") or time.monotonic() > deadline:
                break
        time.sleep(rng.uniform(0.0, 4.0))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            killed += 1
        proc.communicate(timeout=120)
        shutil.rmtree(_scratch(cfg), ignore_errors=True)
        _check_latest_versions(cfg)
    proc = _start(cfg)
    out, _ = proc.communicate(timeout=900)
    shutil.rmtree(_scratch(cfg), ignore_errors=True)
    assert proc.returncode == 0, out[-3000:]
    assert killed >= 1
    _assert_matches_spark_sql(spark, cfg)
