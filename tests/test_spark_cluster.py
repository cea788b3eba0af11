"""The flights job on a real Spark standalone cluster: a master and two workers (1 core, 1g each)
on 127.0.0.1, executors whose Python workers run statecore from the wheel, shipped as a
``venv-pack`` archive (``statecore demo --python-env``), the driver in a process of its own with
its own interpreter. The output of an undisturbed run must equal the Spark SQL oracle of the
end-to-end tests (``tests/test_demo_job.py``), and every other run's output must equal that one
(same micro-batches, from Spark's source log), also when the whole driver process group is
SIGKILLed and the job is started again on its checkpoint and that run loses an executor JVM
between micro-batches and another while a micro-batch's tasks run (SIGKILLs; Spark's master
launches replacements and the job goes on), and when an executor is SIGKILLed after its tasks
of a micro-batch ended while their background checkpoint writes run (the driver re-runs the
micro-batch; the query does not fail). Each run is one Spark application: the kill points share
applications rather than each starting its own.

Every driver and the cluster keep their Spark scratch files (``spark-*``, ``blockmgr-*``, the
driver's unpacked copy of the shipped environment) under the test's directory, deleted after
the test: a SIGKILLed JVM never runs Spark's own clean-up.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from statecore.checkpoint import CheckpointStore
from statecore.demo.job import DemoConfig
from statecore.demo.reference import batch_plan
from test_demo_job import _assert_matches_spark_sql, _output_rows

# The first test's setup builds the wheel, its venv, the archive and the cluster, and runs the
# job once: well past the default per-test timeout on a loaded machine.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[1]
#: Three months of 2013 (~81k flights) in 4 micro-batches, then the final flush.
DAYS = 90
FILES_PER_TRIGGER = 23
PARALLELISM = 4
#: Generous: the machine is shared (a write lost with its executor is re-run after its
#: heartbeats stop, not after this; Failure model, docs/deploy.md).
COMMIT_TIMEOUT_S = 60
#: For the kill "after_tasks": seconds every background write waits before it reports (the
#: test hook statecore.spark.checkpoint_write.DELAY_REPORT_ENV, set on the executors only by
#: that test), so the executor can be killed between its tasks' end and their reports.
DELAY_REPORT_S = 8


#: The test tooling of the ``test`` extra (a third of the venv's bytes), the installers and the
#: libraries' own tests, headers and examples (a third of its files): nothing an executor
#: imports; leaving them out makes each executor's unpacked copy smaller.
NOT_ON_EXECUTORS = ("atheris*", "*_with_fuzzer.so", "libclang_rt.*", "hypothesis*",
                    "_hypothesis*", "_pytest*", "pytest*", "pip", "pip-*", "setuptools*",
                    "pandas/tests", "pyarrow/tests", "pyarrow/include", "pyspark/examples")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("pyspark")
    from support.spark_cluster import Cluster

    c = Cluster.start(workers=2, cores=1, memory="1g",
                      workdir=tmp_path_factory.mktemp("cluster"), timeout_s=180)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def python_env(tmp_path_factory, wheel_venv):
    """The ``wheel_venv`` packed with venv-pack: what executors unpack as ``./environment``."""
    pytest.importorskip("venv_pack")
    from support.spark_cluster import pack_venv

    return pack_venv(wheel_venv, tmp_path_factory.mktemp("env") / "env.tar.gz",
                     exclude=NOT_ON_EXECUTORS)


@pytest.fixture(autouse=True)
def _drop_unpacked_envs(cluster, tmp_path):
    """After each test, delete the environments the executors unpacked (~0.5 GB each; the
    workers keep their applications' directories, which count the executors launched) and the
    drivers' scratch files (``_scratch``)."""
    yield
    for env in [e for d in cluster.worker_dirs for e in d.glob("app-*/*/environment")]:
        shutil.rmtree(env, ignore_errors=True)
    shutil.rmtree(_scratch(tmp_path), ignore_errors=True)


def _scratch(tmp_path: Path) -> Path:
    """Where the drivers of a test keep their Spark scratch files."""
    return tmp_path / "spark-scratch"


def _cfg(tmp_path, landing=None) -> DemoConfig:
    return DemoConfig(checkpoint=str(tmp_path / "ckpt"), output=str(tmp_path / "out"),
                      landing=landing, backend="native", days=DAYS,
                      files_per_trigger=FILES_PER_TRIGGER, parallelism=PARALLELISM)


class Driver:
    """``statecore demo`` against the cluster in a process group of its own (the test's own
    interpreter: the driver needs the demo extra, the executors do not). Its output lines are
    collected by a thread, so the test can wait for one without blocking on the pipe."""

    def __init__(self, cfg: DemoConfig, cluster, python_env: Path, scratch_root: Path,
                 conf: tuple = ()):
        from support.spark_cluster import scratch

        scratch_env, scratch_conf = scratch(scratch_root)
        env = dict(os.environ, **scratch_env)
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        conf = tuple(f"{k}={v}" for k, v in scratch_conf.items()) + tuple(conf)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "statecore.cli", "demo", "--checkpoint", cfg.checkpoint,
             "--output", cfg.output, "--days", str(cfg.days), "--backend", cfg.backend,
             *(["--landing", cfg.landing] if cfg.landing else []),
             "--files-per-trigger", str(cfg.files_per_trigger),
             "--parallelism", str(cfg.parallelism), "--master", cluster.master_url,
             "--python-env", str(python_env), "--commit-timeout", str(COMMIT_TIMEOUT_S),
             "--conf", "spark.driver.host=127.0.0.1",
             "--conf", "spark.driver.bindAddress=127.0.0.1",
             "--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=2",
             "--conf", "spark.executor.memory=1g",
             # Both executors take part from the first micro-batch on (the test checks both).
             "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0",
             "--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=120s",
             *[a for kv in conf for a in ("--conf", kv)]],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            start_new_session=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self.lines.append(None)  # end of output
            self._cond.notify_all()

    def wait_for_line(self, prefix: str, count: int = 1, timeout_s: float = 300) -> bool:
        """Wait until ``count`` output lines start with ``prefix``; False when the output ended
        first. Raises TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if sum(1 for ln in self.lines if ln and ln.startswith(prefix)) >= count:
                    return True
                if self.lines and self.lines[-1] is None:
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {count} lines {prefix!r}:\n{self.output()[-3000:]}")
                self._cond.wait(left)

    def output(self) -> str:
        return "".join(ln for ln in list(self.lines) if ln)

    def finish(self, timeout_s: float = 600) -> int:
        """Wait for the driver to exit (its process group is SIGKILLed after ``timeout_s``)."""
        try:
            self.proc.wait(timeout=timeout_s)
        finally:
            self.kill()
        self._reader.join(timeout=30)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the driver's whole process group (its Python and its JVM)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)


def _python_worker_maps(cluster) -> dict[int, tuple[str, list[str]]]:
    """{pid: (command line, mapped statecore extension paths)} of the executors' Python
    processes (the PySpark daemons and their workers)."""
    from support.spark_cluster import descendants

    out = {}
    for pids in cluster.executors().values():
        for ex in pids:
            for p in descendants(ex):
                try:
                    cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                    maps = Path(f"/proc/{p}/maps").read_text()
                except OSError:
                    continue
                if "python" not in cmd:
                    continue
                native = sorted({ln.split(None, 5)[-1] for ln in maps.splitlines()
                                 if "statecore/_native" in ln})
                out[p] = (cmd, native)
    return out


def _run_to_end(driver: Driver) -> None:
    rc = driver.finish()
    assert rc == 0, driver.output()[-4000:]


def _outputs(cfg: DemoConfig):
    return {name: _output_rows(os.path.join(cfg.output, name))
            for name in ("sessions", "route_delays")}


@pytest.fixture(scope="module")
def undisturbed(spark, cluster, python_env, tmp_path_factory):
    """One run of the job on the cluster, checked against the Spark SQL oracle; returns its
    config, its micro-batch plan, its output rows, its driver output and, per executor Python
    process seen while it ran, (command line, paths of the statecore extension it mapped)."""
    root = tmp_path_factory.mktemp("undisturbed")
    cfg = _cfg(root)
    driver = Driver(cfg, cluster, python_env, _scratch(root))
    seen: dict[int, tuple[str, list[str]]] = {}
    try:
        # While the job runs, record where its executors' Python workers loaded statecore from.
        deadline = time.monotonic() + 900
        while driver.proc.poll() is None and time.monotonic() < deadline:
            seen.update({p: v for p, v in _python_worker_maps(cluster).items() if v[1]})
            time.sleep(0.5)
    except BaseException:
        driver.kill()
        raise
    _run_to_end(driver)
    shutil.rmtree(_scratch(root), ignore_errors=True)
    _assert_matches_spark_sql(spark, cfg)
    return dict(cfg=cfg, plan=batch_plan(os.path.join(cfg.checkpoint, "spark")),
                landing=os.path.join(cfg.checkpoint, "landing"),
                outputs=_outputs(cfg), log=driver.output(), seen=seen)


def _assert_same_as_undisturbed(spark, cfg: DemoConfig, undisturbed) -> None:
    """The run's output equals the undisturbed run's, row for row, when its micro-batches read
    the same files; else (a driver killed between the file source's log and the offset log
    makes one micro-batch read two triggers' files) it equals the Spark SQL reference."""
    if batch_plan(os.path.join(cfg.checkpoint, "spark")) != undisturbed["plan"]:
        _assert_matches_spark_sql(spark, cfg)
        return
    got = _outputs(cfg)
    for name, rows in undisturbed["outputs"].items():
        assert got[name] == rows, name


def _executors_launched(cluster) -> int:
    """Executors the workers launched for the applications so far (``work-dir/app-*/<id>/``)."""
    return sum(1 for d in cluster.worker_dirs for app in d.glob("app-*") for e in app.iterdir()
               if e.is_dir())


def test_flights_job_on_the_cluster_matches_spark_sql(undisturbed, cluster):
    log = undisturbed["log"]
    assert "end of input: flushed" in log and "micro-batches      4 this run" in log
    # Both executors ran statecore, from the unpacked archive, never from this checkout.
    seen = undisturbed["seen"]
    assert len({native[0] for _cmd, native in seen.values()}) >= 2, (seen, log[-3000:])
    for cmd, native in seen.values():
        assert "./environment/bin/python" in cmd, cmd
        for path in native:
            assert "/environment/lib/" in path and str(cluster.workdir) in path, path
            assert not path.startswith(str(REPO)), path


def _first_task_output(cfg: DemoConfig, batch_id: int) -> bool:
    """True once a task of micro-batch ``batch_id`` opened its output file: the sessions
    operator's tasks are running (their output streams to the sink while they process)."""
    tmp = Path(cfg.output) / "sessions" / f"batch_id={batch_id}" / "_temporary"
    return tmp.is_dir() and any(tmp.rglob("part-*"))


def _sessions_root(cfg: DemoConfig) -> Path:
    return Path(cfg.checkpoint) / "operators" / "sessions"


def _beating_writer_pids(cfg: DemoConfig, version: int) -> set:
    """Pids of the Python workers whose background writes of the sessions operator at
    ``version`` put a heartbeat (``pending/V/<writer>.alive``) without having reported."""
    pending = _sessions_root(cfg) / "pending" / f"{version:020d}"
    pids = set()
    for hb in pending.glob("*.alive") if pending.is_dir() else ():
        if (pending / (hb.name[:-len(".alive")] + ".json")).exists():
            continue
        try:
            pids.add(int(json.loads(hb.read_text())["pid"]))
        except (OSError, ValueError, KeyError):
            continue
    return pids


def _kill_an_executor(cluster, driver: Driver, cfg: DemoConfig, when: str, batch: int = 2,
                      spared: tuple = ()) -> int:
    """SIGKILL one executor JVM and return its pid: ``between_batches``, right after the driver
    printed its first micro-batch line (that micro-batch committed, the next one not started);
    ``during_tasks``, once micro-batch ``batch`` - 1 committed and micro-batch ``batch``'s
    sessions tasks are streaming output; ``after_tasks``, once micro-batch 2's sessions job
    committed its output (every task of it ended) while a background write of one of its
    Python workers beats without having reported (the run's writes report late,
    DELAY_REPORT_S): that executor with its Python processes, as a lost node takes them.
    ``spared``: pids of executors killed before (the victim is another; one living executor
    is enough then, its replacement may not be up yet). On a failure here the driver is killed
    before the error propagates."""
    from support.spark_cluster import descendants

    try:
        first = "batch " if when == "between_batches" else f"batch {batch - 1:4d}:"
        assert driver.wait_for_line(first), driver.output()[-3000:]
        deadline = time.monotonic() + 300
        if when == "during_tasks":
            while not _first_task_output(cfg, batch):
                assert driver.proc.poll() is None and time.monotonic() < deadline, \
                    driver.output()[-3000:]
                time.sleep(0.02)
        executors = cluster.wait_for_executors(1 if spared else 2, timeout_s=120,
                                               exclude=spared)
        victim, doomed = executors[0], []
        if when == "after_tasks":
            done = Path(cfg.output) / "sessions" / "batch_id=2" / "_SUCCESS"
            while not _victim_found(cluster, cfg, executors, done, descendants, doomed):
                assert driver.proc.poll() is None and time.monotonic() < deadline, \
                    driver.output()[-3000:]
                time.sleep(0.05)
            victim = doomed.pop(0)
        os.kill(victim, signal.SIGKILL)
        for p in doomed:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    except BaseException:
        driver.kill()
        raise
    return victim


def _victim_found(cluster, cfg: DemoConfig, executors: list, done: Path, descendants,
                 out: list) -> bool:
    """For ``after_tasks``: once ``done`` exists, an executor JVM of ``executors`` whose Python
    worker beats for an unreported write of micro-batch 2; ``out`` gets [JVM, its Python
    processes]. False while there is none yet."""
    if not done.exists():
        return False
    beating = _beating_writer_pids(cfg, 2)
    for jvm in executors:
        kids = descendants(jvm)
        if beating & set(kids):
            out[:] = [jvm, *kids]
            return True
    return False


def _finish_after_executor_loss(cluster, driver: Driver, cfg: DemoConfig, python_env,
                                launched: int, scratch_root: Path, lost: int = 1) -> None:
    """Wait for the driver of a run that lost ``lost`` executors; check that the master launched
    replacements and that the job finished (or failed the one documented way, then finished
    after a restart)."""
    rc = driver.finish()
    out = driver.output()
    if rc != 0:
        # The one way an executor loss fails a micro-batch (docs/deploy.md, "Failure model"):
        # executors died after tasks ended and before their background checkpoint writes
        # reported more often than the driver re-runs a micro-batch (relaunch_attempts).
        # Nothing was committed; a restart replays the micro-batch.
        assert "did not report their checkpoint" in out, out[-4000:]
        _run_to_end(Driver(cfg, cluster, python_env, scratch_root))
    else:
        assert "end of input: flushed" in out
    # 2 executors at the start and one more per loss: the master replaced the lost ones.
    assert _executors_launched(cluster) - launched >= 2 + lost, cluster.log_tails()


def test_driver_sigkilled_then_executors_lost_between_batches_and_during_tasks(
        spark, undisturbed, cluster, python_env, tmp_path):
    """The driver's process group SIGKILLed while micro-batch 1's tasks run; the restarted
    driver replays what was not committed, and in that one application one executor is
    SIGKILLed right after its first micro-batch (between micro-batches) and another while the
    sessions tasks of the micro-batch after next stream output."""
    cfg = _cfg(tmp_path, landing=undisturbed["landing"])
    driver = Driver(cfg, cluster, python_env, _scratch(tmp_path))
    try:
        assert driver.wait_for_line("batch    0:"), driver.output()[-3000:]
        deadline = time.monotonic() + 300
        while not _first_task_output(cfg, 1):  # inside micro-batch 1
            assert driver.proc.poll() is None and time.monotonic() < deadline, \
                driver.output()[-3000:]
            time.sleep(0.02)
    finally:
        driver.kill()
    assert "end of input" not in driver.output()
    launched = _executors_launched(cluster)
    driver = Driver(cfg, cluster, python_env, _scratch(tmp_path))
    first = _kill_an_executor(cluster, driver, cfg, "between_batches")
    replayed = next(int(ln.split()[1].rstrip(":")) for ln in driver.lines
                    if ln and ln.startswith("batch "))
    if replayed != 1:
        driver.kill()
        pytest.fail(f"the restarted run began with micro-batch {replayed}, not 1:\n"
                    + driver.output()[-3000:])
    _kill_an_executor(cluster, driver, cfg, "during_tasks", batch=replayed + 2, spared=(first,))
    _finish_after_executor_loss(cluster, driver, cfg, python_env, launched, _scratch(tmp_path),
                                lost=2)
    _assert_same_as_undisturbed(spark, cfg, undisturbed)


def test_executor_sigkilled_after_its_tasks_relaunches_the_micro_batch(spark, undisturbed,
                                                                      cluster, python_env,
                                                                      tmp_path):
    """An executor lost after its tasks of micro-batch 2 ended, before their background writes
    reported: Spark sees a successful job; the driver finds the writes lost (their heartbeats
    stopped) and re-runs the micro-batch, so the query does not fail and its output equals the
    undisturbed run's."""
    cfg = _cfg(tmp_path, landing=undisturbed["landing"])
    launched = _executors_launched(cluster)
    driver = Driver(cfg, cluster, python_env, _scratch(tmp_path),
                    conf=(f"spark.executorEnv.STATECORE_TEST_DELAY_REPORT_S={DELAY_REPORT_S}",))
    _kill_an_executor(cluster, driver, cfg, "after_tasks")
    rc = driver.finish()
    out = driver.output()
    assert rc == 0 and "end of input: flushed" in out, out[-4000:]
    assert "did not report their checkpoint" not in out, out[-4000:]
    meta = CheckpointStore(str(_sessions_root(cfg))).metadata(2)
    assert meta["relaunches"] >= 1, meta
    assert _executors_launched(cluster) - launched >= 3, cluster.log_tails()
    _assert_same_as_undisturbed(spark, cfg, undisturbed)
