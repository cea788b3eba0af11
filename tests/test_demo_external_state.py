"""The flights job (``statecore demo --state-store``) with its keyed state in a real
``redis-server`` or a real PostgreSQL server, checked against the Spark SQL reference of
tests/test_demo_job.py: a run that changes parallelism midway (both stores), and a driver
SIGKILLed (Redis) (its whole process group) between the
tasks' pre-commits and the commit, and between the manifest and the store's commit, while a
reader outside the job polls the committed state."""

import dataclasses
import glob
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from statecore.demo.job import DemoConfig, DemoPipeline, run_demo
from statecore.demo.reference import (
    batch_plan,
    final_route_stats,
    read_sessions,
    reference_routes,
    reference_sessions,
)
from statecore.errors import InvalidInputError
from statecore.external import read_committed, read_committed_epoch, wal_keys
from statecore.spark.external_commit import KILL_BEFORE_COMMIT_ENV, KILL_BEFORE_EPOCH_COMMIT_ENV
from statecore.ttl import INT64_MIN
from support.frames import assert_same_rows
from support.postgres_server import postgres_server  # noqa: F401  (fixture)
from support.redis_server import redis_server, redis_server_aof  # noqa: F401  (fixtures)
from support.spark_cluster import scratch

pytestmark = pytest.mark.spark

DAYS = 21
#: The kill test's job: 3 micro-batches (the kills hit micro-batches 1 and 2), then the flush.
KILL_DAYS = 15
DAY_MS = 86_400_000
SESSION_STATES = ("open_session", "aircraft")
ROUTE_STATES = ("active_since", "flights", "arr_delay_count", "arr_delay_sum", "arr_delay_max")


def _cfg(tmp_path, server, **kw):
    base = dict(checkpoint=str(tmp_path / "ckpt"), output=str(tmp_path / "out"),
                backend="native", days=DAYS, files_per_trigger=5, parallelism=2,
                aircraft_idle_ttl_ms=6 * DAY_MS, route_idle_ttl_ms=6 * DAY_MS,
                state_store=server.url)
    base.update(kw)
    return DemoConfig(**base)


def _assert_matches_spark_sql(spark, cfg):
    landing = os.path.join(cfg.checkpoint, "landing")
    plan = batch_plan(os.path.join(cfg.checkpoint, "spark"))
    assert_same_rows(read_sessions(spark, cfg.output),
                     reference_sessions(spark, landing, cfg.session_gap_ms,
                                        cfg.aircraft_idle_ttl_ms, plan))
    assert_same_rows(final_route_stats(spark, cfg.output),
                     reference_routes(spark, landing, cfg.route_idle_ttl_ms, plan))


def _committed(cfg, op, states):
    """{state: (epoch, sorted rows)} of ``op``'s live committed state in the store: entries
    whose event-time TTL ran out by the last micro-batch's watermark are left out (TTL
    background cleanup removes them at moments that depend on which backends visited which
    key groups)."""
    last = [m for m in map(op.store.metadata, op.store.versions()) if not m["flush"]][-1]
    wm = last["input_watermark_ms"]
    out = {}
    for s in states:
        c = read_committed(cfg.state_store, op.state_namespace, s, now_ms=wm)
        ttl = c.meta["ttl"]["ttl_ms"] if c.meta.get("ttl") else None
        out[s] = (c.epoch, sorted(
            tuple(r.values()) for r in c.table.to_pylist()
            if ttl is None or r["ttl_timestamp_ms"] + ttl > wm))
    return out


def test_config_checks_the_state_store_url(tmp_path):
    with pytest.raises(InvalidInputError, match="state_store"):
        DemoConfig(state_store="mysql://x").validate()


@pytest.mark.parametrize("store", ["redis", "postgres"])
def test_demo_matches_spark_sql_across_a_rescale(spark, tmp_path, request, store):
    server = request.getfixturevalue(f"{store}_server")
    cfg = _cfg(tmp_path, server, max_batches=2)
    first = run_demo(cfg, spark=spark, progress=None)
    assert first.stopped_early and first.micro_batches == 2
    pipe = DemoPipeline(cfg)
    assert [read_committed_epoch(cfg.state_store, op.state_namespace)
            for op in (pipe.sessions, pipe.routes)] == [1, 1]
    rest = run_demo(dataclasses.replace(cfg, parallelism=3, max_batches=None), spark=spark,
                    progress=None)
    assert rest.flushed and rest.micro_batches == 3 and rest.last_batch_id == 4
    assert rest.checkpoint_loads == 0  # nothing restored from the checkpoint: read-through
    for op in (pipe.sessions, pipe.routes):
        latest = op.store.latest_version()
        assert op.store.metadata(latest)["num_partitions"] == 3
        assert op.store.manifest(latest)["external"]["store"] == store
        assert read_committed_epoch(cfg.state_store, op.state_namespace) == latest
        assert wal_keys(cfg.state_store, op.state_namespace, latest) == []
    _assert_matches_spark_sql(spark, cfg)


def _cli(cfg, parallelism, env=None):
    """``statecore demo`` in a process group of its own; its Spark scratch files (left behind
    when it is SIGKILLed) are kept beside the checkpoint and deleted when it ended."""
    root = Path(cfg.checkpoint).parent / "spark-scratch"
    scratch_env, scratch_conf = scratch(root)
    try:
        return _run_cli(cfg, parallelism, dict(scratch_env, **(env or {})), scratch_conf)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run_cli(cfg, parallelism, env, conf):
    return subprocess.run(
        [sys.executable, "-m", "statecore.cli", "demo", "--checkpoint", cfg.checkpoint,
         "--output", cfg.output, "--days", str(cfg.days), "--backend", cfg.backend,
         "--files-per-trigger", str(cfg.files_per_trigger), "--parallelism", str(parallelism),
         "--aircraft-idle-ttl", "6d", "--route-idle-ttl", "6d", "--master", "local[2]",
         "--state-store", cfg.state_store, "--quiet",
         *[a for k, v in conf.items() for a in ("--conf", f"{k}={v}")]],
        env=dict(os.environ, **env), capture_output=True, text=True, timeout=900,
        start_new_session=True)


def _route_flights_by_batch(cfg):
    """{batch id: {route: flights}} of the route operator's output."""
    out = {}
    for d in glob.glob(os.path.join(cfg.output, "route_delays", "batch_id=*")):
        rows = pq.read_table(d, columns=["origin", "dest", "flights"]).to_pylist()
        out[int(d.rsplit("=", 1)[1])] = {f"{r['origin']}|{r['dest']}": r["flights"]
                                         for r in rows}
    return out


@pytest.mark.slow
def test_driver_killed_around_the_commit_then_restarted(spark, tmp_path,
                                                        redis_server_aof):  # noqa: F811
    server = redis_server_aof
    cfg = _cfg(tmp_path / "k", server, days=KILL_DAYS)
    pipe = DemoPipeline(cfg)
    samples, errors, stop = [], [], threading.Event()

    def reader():
        # Outside the job: the route counts of one committed epoch per read.
        while not stop.is_set():
            try:
                # Event-time TTL expires by the job's watermark; INT64_MIN: every committed
                # entry, as of before any watermark.
                c = read_committed(cfg.state_store, pipe.routes.state_namespace, "flights",
                                   now_ms=INT64_MIN)
            except InvalidInputError:
                continue  # nothing committed yet
            except Exception as exc:  # the assertion below reports it
                errors.append(exc)
                return
            samples.append((c.epoch, dict(zip(c.table.column("key").to_pylist(),
                                              c.table.column("value").to_pylist()))))
            stop.wait(0.05)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        # 1. Killed after every partition of micro-batch 1 pre-committed and reported, before
        #    anything is committed: the store holds its logs, readers see epoch 0.
        r = _cli(cfg, 2, {KILL_BEFORE_COMMIT_ENV: "sessions:1"})
        assert r.returncode == -9, r.stdout[-2000:] + r.stderr[-2000:]
        ns_s, ns_r = pipe.sessions.state_namespace, pipe.routes.state_namespace
        assert read_committed_epoch(cfg.state_store, ns_s) == 0
        assert len(wal_keys(cfg.state_store, ns_s, 1)) == 2
        # 2. Killed after the route operator's manifest of micro-batch 2, before the store
        #    committed its epoch (the sessions operator committed both).
        r = _cli(cfg, 2, {KILL_BEFORE_EPOCH_COMMIT_ENV: "route_delays:2"})
        assert r.returncode == -9, r.stdout[-2000:] + r.stderr[-2000:]
        assert read_committed_epoch(cfg.state_store, ns_s) == 2
        assert read_committed_epoch(cfg.state_store, ns_r) == 1
        assert pipe.routes.store.latest_version() == 2
        # 3. The restart (with another parallelism) finishes the decided commit and the job.
        r = _cli(cfg, 3)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors[:3]
    _assert_matches_spark_sql(spark, cfg)
    # Readers only ever saw committed epochs: each sample's counts are those the route
    # operator emitted up to that epoch (a route expired by TTL cleanup may be missing).
    emitted = _route_flights_by_batch(cfg)
    assert samples
    for epoch, counts in samples:
        last = {}
        for b in sorted(x for x in emitted if x <= epoch):
            last.update(emitted[b])
        assert all(last.get(route) == n for route, n in counts.items()), epoch
    # The committed state equals that of an uninterrupted run.
    ref_cfg = _cfg(tmp_path / "ref", server, days=KILL_DAYS)
    run_demo(ref_cfg, spark=spark, progress=None)
    ref = DemoPipeline(ref_cfg)
    assert _committed(cfg, pipe.sessions, SESSION_STATES) == \
        _committed(ref_cfg, ref.sessions, SESSION_STATES)
    assert _committed(cfg, pipe.routes, ROUTE_STATES) == \
        _committed(ref_cfg, ref.routes, ROUTE_STATES)
