"""Servers and store helpers the external-state benchmarks share: a throw-away
``redis-server`` on loopback, Redis's command and byte counters, and removal of a namespace
from a PostgreSQL database (docs/formats.md "External state in PostgreSQL")."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np


@contextlib.contextmanager
def redis_server(case: str):
    """``(client, url)``: a ``redis.Redis`` client of a fresh ``redis-server`` on a free
    loopback port (no persistence, its own process group, killed on exit) and its URL; None
    (with a note on stderr naming ``case``) when redis-server or redis-py is missing. Raises
    RuntimeError when the server does not answer within 30 s."""
    exe = shutil.which("redis-server")
    try:
        import redis
    except ImportError:
        redis = None
    if exe is None or redis is None:
        print(f"{case}: redis-server or the redis client is not installed; Redis left out",
              file=sys.stderr)
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    work = tempfile.mkdtemp(prefix="statecore-bench-redis-")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", work,
                             "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.1)
        yield client, f"redis://127.0.0.1:{port}/0"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


def redis_stats(client) -> np.ndarray:
    """int64 ``[commands processed, bytes received, bytes sent, read events]`` of the server so
    far (``INFO stats``). A read event is one read of a client's socket: one per request, and
    about one per 16 kB of a pipeline (the server's reads)."""
    s = client.info("stats")
    return np.array([s["total_commands_processed"], s["total_net_input_bytes"],
                     s["total_net_output_bytes"], s["total_reads_processed"]], dtype=np.int64)


def drop_postgres_namespace(url: str, ns: str) -> None:
    """Delete namespace ``ns`` and its rows from the statecore tables of the database at
    ``url`` (docs/formats.md "External state in PostgreSQL"); nothing when it is absent."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        row = conn.execute("SELECT id FROM statecore.namespaces WHERE name = %s",
                           (ns,)).fetchone()
        if row:
            for table in ("entries", "logs", "states"):
                conn.execute(f"DELETE FROM statecore.{table} WHERE ns = %s", row)
            conn.execute("DELETE FROM statecore.namespaces WHERE id = %s", row)
