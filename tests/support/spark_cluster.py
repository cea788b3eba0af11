"""A Spark standalone cluster on 127.0.0.1 (one master, N workers) from the pip-installed pyspark,
and a packed Python environment for its executors.

The pyspark wheel ships ``bin/spark-class`` but no ``sbin/start-master.sh``: the master and the
workers are started here as ``spark-class org.apache.spark.deploy.master.Master`` /
``...worker.Worker`` with ``SPARK_HOME`` = the pyspark package folder, each in a process group of
its own, on free loopback ports, with work and log files under a temporary directory. Starting
waits (bounded) until the master's JSON page lists every worker ALIVE. :meth:`Cluster.stop`
SIGKILLs every process the cluster started and every descendant of them (the workers' executor
JVMs, their PySpark daemons, which put themselves into process groups of their own, and the
Python workers), also when a start failed half way, then deletes their scratch files.

Scratch files: a Spark process keeps its ``spark-*`` and ``blockmgr-*`` directories (with the
files and archives an application ships, e.g. an unpacked Python environment) under its local
directories, by default in ``/tmp``, and deletes them from a JVM shutdown hook -- which a SIGKILL
never runs. :func:`scratch` points a driver at a directory of the caller's; the cluster's
master, workers and executors use one under ``workdir``.

The module imports nothing from this project (the benchmarks use it too).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["Cluster", "spark_home", "free_port", "descendants", "executor_pids",
           "pack_venv", "scratch", "EXECUTOR_CLASS"]

#: The main class of an executor JVM (what a kill of "an executor" targets).
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def spark_home() -> str:
    """The installed pyspark package folder (it has ``bin/spark-class`` and ``jars/``)."""
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scratch(root: Path) -> Tuple[Dict[str, str], Dict[str, str]]:
    """``(environment, spark conf)`` that keep the scratch files of a Spark application's
    processes under ``root`` (created): Spark's local directories (``SPARK_LOCAL_DIRS``, which
    takes precedence over ``spark.local.dir``: ``spark-*``, ``blockmgr-*``, the driver's copy
    of shipped files and archives), Python's ``TMPDIR`` and the JVMs' ``java.io.tmpdir``
    (native libraries unpacked from jars, Hadoop's temporary files). Deleting ``root`` after the
    processes are gone removes all of it, also after a SIGKILL (which skips Spark's own
    clean-up). Environment entries go to the driver's process (and are inherited by a local
    master's executors); conf entries to its session (``--conf``)."""
    local, tmp = Path(root) / "local", Path(root) / "tmp"
    local.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    java_tmp = f"-Djava.io.tmpdir={tmp}"
    env = {"SPARK_LOCAL_DIRS": str(local), "TMPDIR": str(tmp)}
    conf = {"spark.local.dir": str(local), "spark.driver.extraJavaOptions": java_tmp,
            "spark.executor.extraJavaOptions": java_tmp}
    return env, conf


def _children_map() -> Dict[int, List[int]]:
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        # comm (field 2) may contain spaces and parentheses: ppid follows the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int) -> List[int]:
    """Every living descendant of ``pid`` (children first), from ``/proc``."""
    children = _children_map()
    out: List[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def executor_pids(worker_pid: int) -> List[int]:
    """Pids of the executor JVMs (``CoarseGrainedExecutorBackend``) that the worker JVM
    ``worker_pid`` launched and that are still alive."""
    return [p for p in descendants(worker_pid) if EXECUTOR_CLASS in _cmdline(p)]


def _kill_tree(pid: int) -> None:
    for p in [pid] + descendants(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class Cluster:
    """A running standalone cluster: ``master_url`` (``spark://127.0.0.1:PORT``),
    ``master_ui`` (``http://127.0.0.1:PORT``), the master's and workers' ``Popen`` objects and
    their log files, ``workdir`` (work and log files). Start one with :meth:`start`; always
    :meth:`stop` it (it is also a context manager)."""

    workdir: Path
    master_url: str = ""
    master_ui: str = ""
    master: Optional[subprocess.Popen] = None
    workers: List[subprocess.Popen] = field(default_factory=list)
    worker_dirs: List[Path] = field(default_factory=list)
    logs: List[Path] = field(default_factory=list)

    @classmethod
    def start(cls, workers: int = 2, cores: int = 1, memory: str = "1g",
              workdir: Optional[Path] = None, timeout_s: float = 180.0) -> "Cluster":
        """Start a master and ``workers`` workers (``cores`` cores and ``memory`` each) on
        127.0.0.1 and wait until the master lists them all ALIVE. ``workdir``: where work dirs
        and logs go (default: a new temporary directory). Raises RuntimeError (with the log
        tails) when a process exits or the workers are not registered within ``timeout_s``;
        everything already started is stopped first."""
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix="statecore-cluster-"))
        c = cls(workdir=Path(workdir))
        try:
            c._start(workers, cores, memory, timeout_s)
        except BaseException:
            c.stop()
            raise
        return c

    def _env(self) -> Dict[str, str]:
        env = dict(os.environ)
        # The executors' Python workers must find statecore only in the shipped environment.
        for name in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV"):
            env.pop(name, None)
        env.update(SPARK_HOME=spark_home(), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_LOG_DIR=str(self.workdir / "logs"))
        # The workers hand their local directories on to the executors they launch
        # (SPARK_EXECUTOR_DIRS); the executors' Python workers inherit TMPDIR.
        scratch_env, scratch_conf = scratch(self.scratch_dir)
        env.update(scratch_env)
        env["SPARK_DAEMON_JAVA_OPTS"] = scratch_conf["spark.driver.extraJavaOptions"]
        return env

    @property
    def scratch_dir(self) -> Path:
        """Where the cluster's processes keep their scratch files (:func:`scratch`); deleted
        by :meth:`stop`."""
        return self.workdir / "scratch"

    def _spawn(self, name: str, args: List[str]) -> subprocess.Popen:
        log = self.workdir / f"{name}.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            return subprocess.Popen(
                [os.path.join(spark_home(), "bin", "spark-class"), *args],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self._env(), cwd=self.workdir, start_new_session=True)

    def _start(self, workers: int, cores: int, memory: str, timeout_s: float) -> None:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        port, ui = free_port(), free_port()
        self.master_url = f"spark://127.0.0.1:{port}"
        self.master_ui = f"http://127.0.0.1:{ui}"
        self.master = self._spawn("master", [
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
            "--webui-port", str(ui)])
        for i in range(workers):
            wdir = self.workdir / f"worker{i}"
            wdir.mkdir()
            self.worker_dirs.append(wdir)
            self.workers.append(self._spawn(f"worker{i}", [
                "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", "127.0.0.1",
                "--cores", str(cores), "--memory", memory, "--webui-port", str(free_port()),
                "--work-dir", str(wdir)]))
        deadline = time.monotonic() + timeout_s
        while True:
            for p in [self.master, *self.workers]:
                if p.poll() is not None:
                    raise RuntimeError(f"a cluster process exited with {p.returncode}\n"
                                       + self.log_tails())
            if self.registered(workers):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{workers} workers not registered within {timeout_s:.0f} s\n"
                                   + self.log_tails())
            time.sleep(0.5)

    def status(self) -> dict:
        """The master's JSON status page (``/json/``). Raises OSError when it does not answer,
        ValueError when the answer is not JSON."""
        with urllib.request.urlopen(self.master_ui + "/json/", timeout=10) as r:
            return json.loads(r.read())

    def registered(self, workers: int) -> bool:
        """Whether the master lists ``workers`` workers ALIVE; False while its UI does not
        answer or, starting, answers ``/json/`` with an HTML page (its JSON page is attached
        after the server is up)."""
        try:
            return self.alive_workers() == workers
        except (OSError, ValueError):
            return False

    def alive_workers(self) -> int:
        """Workers the master lists as ALIVE."""
        return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")

    def executors(self) -> Dict[int, List[int]]:
        """{worker index: pids of its living executor JVMs}."""
        return {i: executor_pids(w.pid) for i, w in enumerate(self.workers)}

    def wait_for_executors(self, count: int, timeout_s: float = 180.0,
                           exclude: tuple = ()) -> List[int]:
        """Wait until ``count`` executor JVMs whose pids are not in ``exclude`` are alive;
        return their pids. Raises RuntimeError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            pids = [p for ps in self.executors().values() for p in ps if p not in exclude]
            if len(pids) >= count:
                return pids
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} executors not running within {timeout_s:.0f} s "
                                   f"(have {pids})\n" + self.log_tails())
            time.sleep(0.2)

    def log_tails(self, chars: int = 2000) -> str:
        """The last ``chars`` characters of each process log."""
        out = []
        for log in self.logs:
            try:
                text = log.read_text(errors="replace")[-chars:]
            except OSError:
                text = "(no log)"
            out.append(f"--- {log.name}\n{text}")
        return "\n".join(out)

    def stop(self) -> None:
        """SIGKILL every process this cluster started and all their descendants; wait for the
        started ones. Idempotent."""
        started = [p for p in [*self.workers, self.master] if p is not None]
        for p in started:
            if p.poll() is None:
                _kill_tree(p.pid)
            else:
                # Its descendants may outlive it (reparented): they are gone from the tree, but
                # an executor still in the worker's process group goes with it.
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for p in started:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        shutil.rmtree(self.scratch_dir, ignore_errors=True)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def pack_venv(python: Path, output: Path, exclude: Sequence[str] = ()) -> Path:
    """Pack the venv of the interpreter ``python`` (``<venv>/bin/python``) into the tarball
    ``output`` with ``venv-pack`` (the way the PySpark documentation ships a virtualenv to
    executors: ``spark.archives=<output>#environment``). pyspark's ``jars/`` folder is left out
    (the executors are JVMs of a Spark installation already, and the jars are most of the
    archive's bytes), and so is whatever matches one of the ``exclude`` glob patterns, relative
    to the venv's ``site-packages`` (e.g. ``"pytest*"``: a pattern matches a folder's files
    too). Raises ImportError without venv-pack."""
    import venv_pack

    prefix = Path(python).parent.parent
    site = "lib/python*/site-packages/"
    filters = [("exclude", site + "pyspark/jars/*")]
    filters += [("exclude", site + p) for pattern in exclude for p in (pattern, pattern + "/*")]
    venv_pack.pack(prefix=str(prefix), output=str(output), force=True, compress_level=1,
                   filters=filters)
    return output
