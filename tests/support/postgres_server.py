"""A real PostgreSQL server on loopback for the external-state tests: Debian's binaries (the
newest ``/usr/lib/postgresql/<version>/bin``; ``.ci/run`` installs ``postgresql`` when missing)
``initdb``-ed into a temporary directory, listening on 127.0.0.1 on a free port with its unix
socket in that directory, in its own process group; bounded waits, killed at teardown.

initdb and postgres refuse to run as root: as root the server runs as the ``postgres`` user
(created by Debian's package), in a directory made with ``tempfile.mkdtemp`` and handed to that
user (pytest's own temporary directories are private to root). The server also gets
``PR_SET_PDEATHSIG``: a SIGKILLed test run takes its server down with it.

Host connections authenticate with scram-sha-256 as the superuser ``statecore`` with a
password, so that wrong credentials can be tested; ``fsync`` is off (a SIGKILLed server keeps
every write the kernel received, which is what the crash tests need; only a machine crash
would lose data).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from support.s3_server import free_port

__all__ = ["PostgresServer", "postgres_server", "shared_postgres_server", "pg_bin_dir",
           "START_TIMEOUT_S", "USER", "PASSWORD"]

START_TIMEOUT_S = 60.0
USER = "statecore"
PASSWORD = "pg-s3cret"
_PR_SET_PDEATHSIG = 1


def pg_bin_dir() -> str | None:
    """The newest ``/usr/lib/postgresql/<major>/bin`` holding ``initdb`` (None: not installed)."""
    found = [d for d in glob.glob("/usr/lib/postgresql/*/bin")
             if os.path.exists(os.path.join(d, "initdb"))]
    if not found:
        return None
    return max(found, key=lambda d: int(d.split("/")[-2]) if d.split("/")[-2].isdigit() else 0)


def _run_as() -> pwd.struct_passwd | None:
    """The user to run the server as: None (ourselves) unless we are root, then ``postgres``.
    pytest.skip when root and no ``postgres`` user exists."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root and there is no 'postgres' user to run initdb and the "
                    "server as (apt-get install postgresql creates it)")


def _die_with_parent() -> None:
    # Runs in the child after the uid change (a later change would clear the setting).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class PostgresServer:
    """One PostgreSQL server on ``127.0.0.1:port`` with its data in ``directory/data``.
    :meth:`kill` (SIGKILL to the process group) and :meth:`stop` end it, :meth:`start` starts
    it again on the same port and data (crash recovery after a kill); :meth:`remove` deletes
    the directory."""

    def __init__(self):
        self.bin = pg_bin_dir()
        self.user = _run_as()
        self.directory = tempfile.mkdtemp(prefix="statecore-pg-")
        self.data = os.path.join(self.directory, "data")
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self._log_path = os.path.join(self.directory, "postgres.log")
        try:
            self._initdb()
            self.start()
        except BaseException:
            self.remove()
            raise

    @property
    def url(self) -> str:
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/postgres"

    def url_with(self, user: str = USER, password: str = PASSWORD, port: int | None = None):
        return f"postgresql://{user}:{password}@127.0.0.1:{port or self.port}/postgres"

    def _popen_kwargs(self) -> dict:
        kw: dict = dict(start_new_session=True, preexec_fn=_die_with_parent)
        if self.user is not None:
            kw.update(user=self.user.pw_uid, group=self.user.pw_gid, extra_groups=[])
        return kw

    def _initdb(self) -> None:
        pwfile = os.path.join(self.directory, "pw")
        with open(pwfile, "w") as f:
            f.write(PASSWORD + "\n")
        if self.user is not None:
            for p in (self.directory, pwfile):
                os.chown(p, self.user.pw_uid, self.user.pw_gid)
        args = [os.path.join(self.bin, "initdb"), "-D", self.data, "-U", USER,
                f"--pwfile={pwfile}", "--auth-host=scram-sha-256", "--auth-local=trust",
                "-E", "UTF8", "--locale=C", "--no-sync"]
        done = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=START_TIMEOUT_S, **self._popen_kwargs())
        if done.returncode:
            raise RuntimeError(f"initdb failed ({done.returncode}): "
                               f"{done.stdout.decode(errors='replace')[-2000:]}")

    def start(self) -> None:
        args = [os.path.join(self.bin, "postgres"), "-D", self.data, "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1",
                "-c", f"unix_socket_directories={self.directory}",
                "-c", "fsync=off", "-c", "shared_buffers=32MB", "-c", "max_connections=200",
                "-c", "logging_collector=off"]
        with open(self._log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, **self._popen_kwargs())
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.proc.returncode}: "
                                   f"{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"postgres did not answer within {START_TIMEOUT_S} s: "
                                   f"{self.log_tail()}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        done = subprocess.run([os.path.join(self.bin, "pg_isready"), "-q", "-h", "127.0.0.1",
                               "-p", str(self.port), "-t", "2"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
        return done.returncode == 0

    def log_tail(self, n: int = 2000) -> str:
        try:
            with open(self._log_path, "rb") as f:
                return f.read().decode(errors="replace")[-n:]
        except OSError:
            return ""

    def _signal(self, sig) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        # The backends of a SIGKILLed postmaster are in its process group: wait until none is
        # left (a restart refuses to start while they hold the shared memory).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the server and its backends (no shutdown: crash recovery at the next
        start)."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """A fast shutdown (SIGINT to the postmaster)."""
        self._signal(signal.SIGINT)

    def remove(self) -> None:
        """Kill the server and delete its directory."""
        self.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


def _require_postgres() -> None:
    pytest.importorskip("psycopg", reason="the psycopg client (the 'postgres' extra) is not "
                                          "installed")
    if pg_bin_dir() is None:
        pytest.skip("PostgreSQL server binaries are not installed (apt-get install postgresql)")


@pytest.fixture
def postgres_server():
    """A running :class:`PostgresServer`, killed and removed at teardown."""
    _require_postgres()
    server = PostgresServer()
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture(scope="module")
def shared_postgres_server():
    """One :class:`PostgresServer` for a whole test module (tests that use their own
    namespaces), killed and removed at the module's end."""
    _require_postgres()
    server = PostgresServer()
    try:
        yield server
    finally:
        server.remove()
