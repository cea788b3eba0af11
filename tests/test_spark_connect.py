"""statecore under Spark Connect: a real Connect server on 127.0.0.1 (``support.spark_connect``),
the flights job through it, its output checked against the Spark SQL oracle of
``statecore.demo.reference`` (the one the end-to-end tests of ``test_demo_job.py`` use).

The Connect clients run in subprocesses: a Connect session switches its whole process to
Connect mode (``pyspark.sql.functions`` included), which must not leak into the classic local
SparkSession that the other tests share and that computes the oracle here.
"""

import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest

from statecore.demo.job import DemoConfig
from statecore.demo.reference import (
    batch_plan,
    final_route_stats,
    read_sessions,
    reference_routes,
    reference_sessions,
)
from statecore.demo.run_log import RunLog
from statecore.errors import InvalidInputError, StateError
from statecore.spark import StatefulOperator, remote_session, streaming_query_id
from support.frames import assert_same_rows

DAY_MS = 86_400_000
SRC = os.path.dirname(os.path.dirname(os.path.abspath(__import__("statecore").__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))


# ------------------------------------------------------------------------- no Spark needed

def test_streaming_query_id_reads_the_spark_checkpoint_metadata(tmp_path):
    with pytest.raises(StateError, match="no streaming query has started"):
        streaming_query_id(str(tmp_path))
    (tmp_path / "metadata").write_text('{"id":"6a44b0e6-83fd-4671-af0b-2d6da5a14911"}\n')
    assert streaming_query_id(str(tmp_path)) == "6a44b0e6-83fd-4671-af0b-2d6da5a14911"
    assert streaming_query_id(f"file://{tmp_path}/") == "6a44b0e6-83fd-4671-af0b-2d6da5a14911"
    for bad in ('{"name": "x"}', "not json", "", '{"id": 7}'):
        (tmp_path / "metadata").write_text(bad)
        with pytest.raises(InvalidInputError, match="no query id"):
            streaming_query_id(str(tmp_path))


@pytest.mark.parametrize("on_disk", [False, True])
def test_run_log_in_memory_and_in_files(tmp_path, on_disk):
    log = RunLog(str(tmp_path / "runs" / "r1") if on_disk else None)
    assert (log.records(), log.count(), log.stopped()) == ([], 0, False)
    log.record({"batch_id": 3, "events": 1})
    log.record({"batch_id": 1, "events": 2})
    log.record({"batch_id": 3, "events": 5})  # a replay replaces its record
    if on_disk:
        # Another process (the server's foreachBatch runner) sees the same records.
        log = pickle.loads(pickle.dumps(log))
    assert log.records() == [{"batch_id": 1, "events": 2}, {"batch_id": 3, "events": 5}]
    assert log.count() == 2
    log.mark_stopped()
    assert log.stopped()
    log.remove()
    if on_disk:
        assert not (tmp_path / "runs" / "r1").exists()


def test_remote_options_are_checked():
    from statecore.cli import main

    for bad in ("localhost:15002", "sc://", "http://x:1", 15002):
        with pytest.raises(InvalidInputError, match="Spark Connect URL"):
            DemoConfig(remote=bad).validate()
    with pytest.raises(InvalidInputError, match="sc://HOST:PORT"):
        remote_session("localhost:15002")
    with pytest.raises(SystemExit) as e:
        main(["demo", "--remote", "localhost:15002"])
    assert e.value.code == 2


def test_operator_pickles_without_its_open_store(tmp_path):
    """Under Connect the foreachBatch function, operators included, is pickled to the server:
    an operator whose store is open (a lock, a filesystem) pickles and reopens it there."""
    cloudpickle = pytest.importorskip("pyspark.cloudpickle")
    from statecore.demo.processors import AircraftSessions

    op = StatefulOperator("s", AircraftSessions(3_600_000), "tailnum", str(tmp_path),
                          output=str(tmp_path / "out"), backend="python")
    assert op.latest_version() is None and op._store is not None
    copy = pickle.loads(cloudpickle.dumps(op))
    assert copy._store is None and op._store is not None
    assert copy.latest_version() is None and copy.store.uri == op.store.uri


# ----------------------------------------------------------------- with a Connect server

@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """A Spark Connect server (local[2]) on a free loopback port for this module's tests;
    its whole process group is killed at the end."""
    pytest.importorskip("pyspark")
    for mod in ("grpc", "grpc_status", "google.rpc", "zstandard"):
        pytest.importorskip(mod, reason="the Spark Connect client needs pyspark[connect]")
    from support.spark_connect import start_connect_server

    server = start_connect_server(tmp_path_factory.mktemp("connect-server"))
    try:
        yield server
    finally:
        server.stop()


def _backend():
    try:
        import statecore.backends.native  # noqa: F401
    except ImportError:
        return "python"
    return "native"


def _client_env():
    env = dict(os.environ)
    for k in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):
        env.pop(k, None)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([SRC] + paths)
    return env


#: Spark gives the Python process it starts for a query's foreachBatch function a fixed 10 s
#: to connect back (PythonWorkerFactory); on a heavily loaded machine its imports can take
#: longer, and the query fails before any batch ran.
RUNNER_DID_NOT_START = "Python worker failed to connect back"


def _run_client(args, server, timeout=600, fresh=None):
    """Run a client subprocess; once more (after ``fresh()`` resets its directories) when the
    server could not start the foreachBatch runner, which fails the query before it did
    anything."""
    for attempt in range(2):
        proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              timeout=timeout, env=_client_env())
        if proc.returncode == 0 or attempt or RUNNER_DID_NOT_START not in proc.stderr \
                or fresh is None:
            break
        fresh()
    assert proc.returncode == 0, (proc.stdout[-3000:] + proc.stderr[-5000:]
                                  + "\n--- server log ---\n" + server.log_tail())
    return proc.stdout


def _clear(path):
    for child in path.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()


def _assert_matches_spark_sql(spark, checkpoint, output, gap_ms, ttl_ms):
    """The job's output under ``output`` equals the Spark SQL reference over the files it
    landed under ``checkpoint`` (micro-batches from the Spark checkpoint's source log)."""
    landing = os.path.join(checkpoint, "landing")
    plan = batch_plan(os.path.join(checkpoint, "spark"))
    sessions = assert_same_rows(read_sessions(spark, output),
                                reference_sessions(spark, landing, gap_ms, ttl_ms, plan))
    routes = assert_same_rows(final_route_stats(spark, output),
                              reference_routes(spark, landing, ttl_ms, plan))
    assert sessions and routes
    return len(sessions)


@pytest.mark.slow
def test_demo_cli_through_spark_connect_matches_spark_sql(spark, connect_server, tmp_path):
    """``statecore demo --remote``: two weeks of flights through the Connect server, the
    output equal to the Spark SQL oracle."""
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    args = ["-m", "statecore", "demo", "--remote", connect_server.url, "--days", "14",
            "--files-per-trigger", "4", "--backend", _backend(), "--checkpoint", ckpt,
            "--output", out, "--aircraft-idle-ttl", "6d", "--route-idle-ttl", "6d"]
    text = _run_client(args, connect_server, fresh=lambda: _clear(tmp_path))
    lines = text.splitlines()
    # 14 daily files, 4 per trigger: batches 0..3, each reported by the client, then the flush.
    assert [ln.split(":")[0] for ln in lines if ln.startswith("batch ")] == \
        [f"batch {b:>4}" for b in range(4)]
    assert any(ln.startswith("micro-batches      4 this run (last batch id 3)") for ln in lines)
    assert any("(final flush done)" in ln for ln in lines)
    assert any("end of input: flushed" in ln for ln in lines)
    sessions = _assert_matches_spark_sql(spark, ckpt, out, 6 * 3_600_000, 6 * DAY_MS)
    assert any(ln.startswith(f"sessions emitted   {sessions:,} ") for ln in lines)
    # Nothing of the run's log is left behind.
    assert os.listdir(os.path.join(ckpt, "runs")) == []


@pytest.mark.slow
def test_demo_api_through_spark_connect_stop_resume_and_unsupported(spark, connect_server,
                                                                     tmp_path):
    """The Python API through Connect: the job stopped by ``max_batches`` (counted on the
    server) and resumed with another parallelism, its summary built from what the server's
    foreachBatch runner reported, every version tagged with the query's id, and the output
    equal to the oracle; a setting only the server may set and an operator that cannot learn
    the query id raise errors that name the cause."""
    script = os.path.join(TESTS, "support", "connect_job.py")
    text = _run_client([script, connect_server.url, str(tmp_path), _backend()], connect_server,
                       fresh=lambda: _clear(tmp_path))
    r = json.loads([ln for ln in text.splitlines() if ln.startswith("{")][-1])
    assert r["connect"] and r["adaptive"] == "false"
    assert "spark.ui.enabled" in r["static_conf_error"]
    assert "when starting the server" in r["static_conf_error"]
    assert "Spark Connect" in r["query_id_error"] and "query_id=" in r["query_id_error"]
    assert r["pickled_latest"] is None
    first, rest = r["first"], r["rest"]
    assert (first["micro_batches"], first["last_batch_id"], first["stopped_early"],
            first["flushed"]) == (2, 1, True, False)
    assert (rest["micro_batches"], rest["last_batch_id"], rest["stopped_early"],
            rest["flushed"]) == (2, 3, False, True)
    from statecore.demo.data import load_flights

    assert first["events"] + rest["events"] == load_flights(14).num_rows
    assert [b["batch_id"] for b in first["batches"] + rest["batches"]] == [0, 1, 2, 3]
    assert rest["checkpoint_loads"] >= 2  # the new split cannot come from the worker caches
    assert first["checkpoint_bytes_written"] > 0 and rest["state_entries"] > 0
    assert r["query_ids"] == [r["query_id"]]
    sessions = _assert_matches_spark_sql(spark, str(tmp_path / "ckpt"), str(tmp_path / "out"),
                                         6 * 3_600_000, 6 * DAY_MS)
    assert rest["sessions"] == sessions


@pytest.mark.slow
def test_processor_from_a_client_only_module_runs_on_the_server(connect_server, tmp_path):
    """A processor class from a file module that only the client can import runs in the
    server's foreachBatch runner and its workers (shipped by value with the function)."""
    script = os.path.join(TESTS, "support", "connect_user_module.py")
    text = _run_client([script, connect_server.url, str(tmp_path), _backend()], connect_server,
                       fresh=lambda: _clear(tmp_path))
    r = json.loads([ln for ln in text.splitlines() if ln.startswith("{")][-1])
    assert r["shipped"] == ["connect_user_mod"]
    # Running counts per key across the two micro-batches (one file each).
    assert r["out"] == {"0": [[1, 1], [2, 1], [2, 2], [3, 1]], "1": [[2, 3], [3, 2], [3, 3]]}


@pytest.mark.slow
def test_broadcast_input_through_spark_connect(connect_server, tmp_path):
    """A broadcast table given in the server's foreachBatch (a Connect DataFrame) reaches
    every task, and the next micro-batch, without one, counts against the broadcast state."""
    script = os.path.join(TESTS, "support", "connect_broadcast.py")
    text = _run_client([script, connect_server.url, str(tmp_path), _backend()], connect_server,
                       fresh=lambda: _clear(tmp_path))
    r = json.loads([ln for ln in text.splitlines() if ln.startswith("{")][-1])

    def row(route, minutes, flights, delayed, total):
        return {"route": route, "threshold_minutes": minutes, "flights": flights,
                "delayed": delayed, "delayed_total": total}

    assert r["out"] == {"0": [row("A|B", 20, 3, 1, 1), row("C|D", 0, 2, 2, 2)],
                        "1": [row("A|B", 20, 2, 2, 3), row("C|D", 0, 1, 1, 3)]}
    assert r["broadcast"]["0"]["rows"] == 2 and r["broadcast"]["1"] is None
