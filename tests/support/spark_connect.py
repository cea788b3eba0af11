"""A Spark Connect server on 127.0.0.1, started from the pip-installed pyspark for the tests.

:func:`start_connect_server` runs ``bin/spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer`` of the installed ``pyspark`` package
(its own ``SPARK_HOME``) in a new process group, on a free loopback port
(``spark.connect.grpc.binding.address``/``.port``), master ``local[2]``. The server's Python
workers and its ``foreachBatch`` runner use the running interpreter (``PYSPARK_PYTHON`` and
``spark.pyspark.python`` = ``sys.executable``), with this checkout's ``statecore`` on
``PYTHONPATH``, so they import the statecore under test. The wait (until the server logs that
it started on that port and the port accepts connections) is bounded and fails early when the
server exits; :meth:`ConnectServer.stop` kills the whole process group
(the JVM, its Python daemon and workers, the ``foreachBatch`` runner), also when starting failed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

__all__ = ["ConnectServer", "start_connect_server", "free_port", "SERVER_CLASS"]

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the server may still lose a race for
    it; :func:`start_connect_server` then tries another)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _kill_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the process group of ``proc`` (its own session), SIGKILL what is left after
    ``grace_s``; the group is killed again at the end because the JVM's children (the Python
    daemon and workers) may outlive it."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if proc.poll() is None:
        proc.wait(timeout=10.0)


@dataclass
class ConnectServer:
    """A running server: ``url`` (``sc://127.0.0.1:PORT``), ``port``, the ``process`` (leader
    of its own process group) and ``log`` (its stdout and stderr)."""

    url: str
    port: int
    process: subprocess.Popen
    log: Path

    def log_tail(self, chars: Optional[int] = 4000) -> str:
        """The last ``chars`` characters of the server's log (None: all of it)."""
        try:
            text = self.log.read_text(errors="replace")
            return text if chars is None else text[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Kill the server's whole process group (bounded; idempotent)."""
        _kill_group(self.process)


def _spark_home() -> str:
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def _statecore_root() -> str:
    import statecore

    return os.path.dirname(os.path.dirname(os.path.abspath(statecore.__file__)))


def start_connect_server(work_dir: Path, *, timeout_s: float = 180.0, attempts: int = 3,
                         conf: Optional[Dict[str, str]] = None) -> ConnectServer:
    """Start a Spark Connect server (module docstring) with its files under ``work_dir`` and
    wait, at most ``timeout_s`` seconds, until it accepts connections. ``conf``: more
    ``--conf`` entries. Raises RuntimeError (with the log's tail) when the server exits or does
    not listen in time; a server that lost the race for its port is retried on another one, at
    most ``attempts`` times."""
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    spark_home = _spark_home()
    env = dict(os.environ)
    for k in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_CONF_DIR"):
        env.pop(k, None)
    conf_dir = work_dir / "conf"
    conf_dir.mkdir(exist_ok=True)  # empty: no spark-defaults.conf from elsewhere
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update({
        "SPARK_HOME": spark_home,
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_CONNECT_MODE": "0",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([_statecore_root()] + paths),
    })
    last_error = ""
    for attempt in range(attempts):
        port = free_port()
        settings = {
            "spark.master": "local[2]",
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            "spark.connect.grpc.port.maxRetries": "0",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.memory": "1g",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.local.dir": str(work_dir / "local"),
            "spark.sql.warehouse.dir": str(work_dir / "warehouse"),
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.adaptive.enabled": "false",
        }
        settings.update(conf or {})
        cmd = [os.path.join(spark_home, "bin", "spark-submit"), "--class", SERVER_CLASS,
               "--name", "statecore-connect-tests"]
        for k, v in settings.items():
            cmd += ["--conf", f"{k}={v}"]
        log = work_dir / f"server-{attempt}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=str(work_dir),
                                    start_new_session=True)
        server = ConnectServer(f"sc://127.0.0.1:{port}", port, proc, log)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                # The log line tells that this server, not another process that took the
                # port in the meantime, is the one listening.
                if f"Spark Connect server started at: 127.0.0.1:{port}" in server.log_tail(None) \
                        and _accepts(port):
                    return server
                time.sleep(0.5)
        except BaseException:
            server.stop()
            raise
        exited = proc.poll() is not None
        last_error = server.log_tail()
        server.stop()
        if not exited:
            raise RuntimeError(f"the Spark Connect server did not listen on 127.0.0.1:{port} "
                               f"within {timeout_s:g} s; log tail:\n{last_error}")
        if "BindException" not in last_error and "already in use" not in last_error:
            break
    raise RuntimeError(f"the Spark Connect server exited while starting; log tail:\n{last_error}")
