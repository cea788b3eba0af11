"""A real S3 protocol server on loopback for the object-store tests: moto in server mode, in its
own process group, plus a loopback TCP proxy that can drop connections (fault injection).

moto's ``mock_aws`` decorators patch boto only; pyarrow's S3 client is the C++ AWS SDK, so the
tests talk HTTP to ``moto.server`` bound to 127.0.0.1 (never the default 0.0.0.0). The server
keeps its objects in memory: killing it loses them, which is why the tests that need the
objects to survive a failure put :class:`DroppingProxy` (a
:class:`support.tcp_proxy.TcpProxy`) between the client and the server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pyarrow.fs as pafs

from support.fs_wrappers import LocalDelegatingHandler
from support.tcp_proxy import TcpProxy, free_port

__all__ = ["S3Server", "DroppingProxy", "start_s3_server", "free_port", "ACCESS_KEY",
           "SECRET_KEY", "REGION", "S3DelegatingHandler"]

ACCESS_KEY = "statecore-test"
SECRET_KEY = "statecore-test-secret"
REGION = "us-east-1"
START_TIMEOUT_S = 120.0


class S3Server:
    """One ``moto.server`` process on ``127.0.0.1:port`` (its own process group).
    :meth:`stop` / :meth:`kill` end the whole group; both are idempotent."""

    def __init__(self, log_path: str):
        self.port = free_port()
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode} "
                                   f"(log: {log_path})")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/moto-api/", timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(
                        f"moto server did not answer within {START_TIMEOUT_S} s") from None
                time.sleep(0.2)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self, endpoint: str | None = None) -> dict:
        """The AWS environment variables that point a client at this server (or ``endpoint``)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": REGION, "AWS_ENDPOINT_URL": f"http://{endpoint or self.endpoint}"}

    def filesystem(self, endpoint: str | None = None, **kw) -> pafs.S3FileSystem:
        """A pyarrow S3FileSystem on this server (or on ``endpoint``, e.g. a proxy's)."""
        return pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION,
                                 endpoint_override=endpoint or self.endpoint, scheme="http",
                                 allow_bucket_creation=True, **kw)

    def create_bucket(self, name: str) -> None:
        self.filesystem().create_dir(name)

    def uri(self, bucket: str, prefix: str, endpoint: str | None = None) -> str:
        """``s3://bucket/prefix`` with the endpoint, scheme and region as query parameters
        (credentials come from the environment, :meth:`env`)."""
        return (f"s3://{bucket}/{prefix}?endpoint_override={endpoint or self.endpoint}"
                f"&scheme=http&region={REGION}")

    def _signal(self, sig) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self._log.close()

    def kill(self) -> None:
        """SIGKILL the server's process group (its objects are lost)."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)


@contextlib.contextmanager
def start_s3_server(log_dir: str):
    """A running :class:`S3Server` (log in ``log_dir``), stopped on exit whatever happens."""
    server = S3Server(os.path.join(log_dir, "moto-server.log"))
    try:
        yield server
    finally:
        server.stop()


class DroppingProxy(TcpProxy):
    """A :class:`~support.tcp_proxy.TcpProxy` on ``127.0.0.1:port`` in front of
    ``target_port`` that fails on demand. :meth:`drop_after` makes it cut every connection once
    ``n`` more bytes went from clients to the server (a request failing mid-upload),
    :meth:`drop_downstream_after` once ``n`` more went from the server to clients (a read
    failing mid-download); :meth:`down` closes the listener and every connection at once (the
    server dying), :meth:`down_after` does so once ``n`` more bytes went upstream (the server
    dying mid-upload), :meth:`call_after` runs a function at such a point (e.g. kills the
    server behind it), :meth:`up` listens again on the same port; :meth:`heal` forwards
    everything again. :meth:`close` ends it."""

    def __init__(self, target_port: int):
        self._budget: int | None = None  # bytes still forwarded upstream; None = unlimited
        self._down_budget: int | None = None  # the same, from the server to clients
        self._down_when_spent = False
        self._on_spent = None  # call_after's hook
        self.dropped = 0
        super().__init__(target_port)

    def drop_after(self, n: int) -> None:
        with self._lock:
            self._budget = n

    def drop_downstream_after(self, n: int) -> None:
        """Cut every connection once ``n`` more bytes went from the server to clients (a read
        failing mid-download), and every later one, until :meth:`heal`."""
        with self._lock:
            self._down_budget = n

    def call_after(self, n: int, hook) -> None:
        """Call ``hook()`` once ``n`` more bytes went upstream, before forwarding the next ones
        (then forward everything)."""
        with self._lock:
            self._budget = n
            self._on_spent = hook

    def down_after(self, n: int) -> None:
        with self._lock:
            self._budget = n
            self._down_when_spent = True

    def heal(self) -> None:
        with self._lock:
            self._budget = None
            self._down_budget = None
            self._down_when_spent = False

    def _admit_upstream(self, data: bytes) -> str:
        hook = None
        with self._lock:
            if self._budget is not None and self._on_spent is not None \
                    and len(data) > self._budget:
                hook, self._on_spent, self._budget = self._on_spent, None, None
            elif self._budget is not None:
                if len(data) > self._budget:
                    self._budget = 0
                    self.dropped += 1
                    return "down" if self._down_when_spent else "reset"
                self._budget -= len(data)
        if hook is not None:
            hook()  # e.g. the server killed with part of a request sent
        return "forward"

    def _admit_downstream(self, data: bytes) -> str:
        with self._lock:
            if self._down_budget is not None:
                if len(data) > self._down_budget:
                    self._down_budget = 0
                    self.dropped += 1
                    return "reset"
                self._down_budget -= len(data)
        return "forward"


class S3DelegatingHandler(LocalDelegatingHandler):
    """A ``pyarrow.fs.PyFileSystem`` handler forwarding every call to the S3 filesystem ``fs``
    under the type name ``s3`` (so statecore treats it as the object store it is), recording
    ``(operation, path)`` in :attr:`calls`; ``on_output(path)`` (optional) runs before an
    output stream is opened (e.g. another driver acting right before a manifest put)."""

    type_name = "s3"

    def __init__(self, fs: pafs.FileSystem, on_output=None):
        self.fs = fs
        self.calls: list[tuple[str, str]] = []
        self.on_output = on_output

    def move(self, src, dest):
        self.calls.append(("move", src))
        self.fs.move(src, dest)

    def copy_file(self, src, dest):
        self.calls.append(("copy_file", src))
        self.fs.copy_file(src, dest)

    def delete_dir(self, path):
        self.calls.append(("delete_dir", path))
        self.fs.delete_dir(path)

    def delete_file(self, path):
        self.calls.append(("delete_file", path))
        self.fs.delete_file(path)

    def open_output_stream(self, path, metadata):
        self.calls.append(("open_output_stream", path))
        if self.on_output is not None:
            self.on_output(path)
        return self.fs.open_output_stream(path)
