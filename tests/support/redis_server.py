"""A real Redis server on loopback for the external-state tests: Debian's ``redis-server``
(``.ci/run`` installs it when missing) on 127.0.0.1, a free port and a temporary directory, in
its own process group; bounded waits, killed at teardown. Without persistence unless asked
(``appendonly=True``: an AOF with ``appendfsync always``, so that a SIGKILLed server restarts
with every acknowledged write)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from support.s3_server import free_port

__all__ = ["RedisServer", "redis_server", "redis_server_aof", "shared_redis_server",
           "REDIS_SERVER", "START_TIMEOUT_S"]

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
START_TIMEOUT_S = 30.0


def _ping(port: int, password: str | None, timeout: float = 1.0) -> bool:
    """True when a server on ``port`` answers PING (RESP, no client library)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            req = b""
            if password:
                req += b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(password), password.encode())
            req += b"*1\r\n$4\r\nPING\r\n"
            s.sendall(req)
            buf = b""
            deadline = time.monotonic() + timeout
            while b"PONG" not in buf and time.monotonic() < deadline:
                chunk = s.recv(256)
                if not chunk:
                    break
                buf += chunk
            return b"PONG" in buf
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` on ``127.0.0.1:port`` with its files in ``directory``.
    :meth:`kill` (SIGKILL) and :meth:`stop` end it, :meth:`start` starts it again on the same
    port and directory (with an AOF the data survives)."""

    def __init__(self, directory: str, appendonly: bool = False, password: str | None = None):
        self.directory = directory
        self.appendonly = appendonly
        self.password = password
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self._log_path = os.path.join(directory, "redis-server.log")
        self.start()

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [REDIS_SERVER, "--bind", "127.0.0.1", "--port", str(self.port),
                "--dir", self.directory, "--save", "", "--daemonize", "no",
                "--logfile", self._log_path, "--protected-mode", "yes"]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _ping(self.port, self.password):
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode} "
                                   f"(log: {self._log_path})")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server did not answer within {START_TIMEOUT_S} s")
            time.sleep(0.05)

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

    def kill(self) -> None:
        """SIGKILL the server (no shutdown: only what its AOF holds survives)."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)


def _require_redis() -> None:
    pytest.importorskip("redis", reason="the redis client (the 'redis' extra) is not installed")
    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server is not installed (apt-get install redis-server)")


@pytest.fixture
def redis_server(tmp_path):
    """A running :class:`RedisServer` without persistence, killed at teardown."""
    _require_redis()
    server = RedisServer(str(tmp_path))
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def redis_server_aof(tmp_path):
    """A running :class:`RedisServer` with an AOF (``appendfsync always``), killed at teardown."""
    _require_redis()
    server = RedisServer(str(tmp_path), appendonly=True)
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def shared_redis_server(tmp_path_factory):
    """One :class:`RedisServer` without persistence for a whole test module (tests that use
    their own namespaces), killed at the module's end."""
    _require_redis()
    server = RedisServer(str(tmp_path_factory.mktemp("redis")))
    try:
        yield server
    finally:
        server.kill()
