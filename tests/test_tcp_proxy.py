"""The loopback proxy that gives the S3 benchmark and tests a network's limits
(``tests/support/tcp_proxy.py``): every answer waits its first-byte latency, each connection
goes no faster than its cap, the bytes arrive intact, and it runs as a process of its own. Only
lower bounds of times are checked: a loaded machine can make the proxy slower, never faster."""

import contextlib
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from support.tcp_proxy import CATCH_UP_S, TcpProxy


def _answering_server():
    """``(port, close)``: a server on 127.0.0.1 that answers each line ``N`` with ``N`` bytes
    (``i % 251`` for byte ``i``), one thread per connection."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(8)

    def serve(conn):
        # A proxy that ends resets its connections: the end of a client, not an error here.
        with conn, conn.makefile("rb") as f, contextlib.suppress(OSError):
            for line in f:
                n = int(line)
                conn.sendall(bytes(i % 251 for i in range(n)))

    def accept():
        while True:
            try:
                conn, _ = ls.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return ls.getsockname()[1], ls.close


def _ask(sock, n: int) -> bytes:
    sock.sendall(b"%d\n" % n)
    got = bytearray()
    while len(got) < n:
        chunk = sock.recv(1 << 16)
        assert chunk, "connection closed early"
        got += chunk
    return bytes(got)


@pytest.fixture
def server_port():
    port, close = _answering_server()
    yield port
    close()


def test_every_answer_waits_the_first_byte_latency(server_port):
    proxy = TcpProxy(server_port, first_byte_latency_s=0.1)
    try:
        with socket.create_connection(("127.0.0.1", proxy.port)) as s:
            t = time.monotonic()
            assert _ask(s, 10) == bytes(range(10))
            first = time.monotonic() - t
            assert _ask(s, 1000) == bytes(i % 251 for i in range(1000))
            both = time.monotonic() - t
        assert first >= 0.1 and both >= 0.2  # once per request, on the same connection
    finally:
        proxy.close()


def test_each_connection_is_paced_to_its_cap(server_port):
    n = 1_000_000
    proxy = TcpProxy(server_port, bytes_per_s=5e6)
    try:
        with socket.create_connection(("127.0.0.1", proxy.port)) as s:
            t = time.monotonic()
            assert _ask(s, n) == bytes(i % 251 for i in range(n))
            # Less the time an overrun sleep may be made up by.
            assert time.monotonic() - t >= n / 5e6 - CATCH_UP_S
        assert proxy.accepted == 1
    finally:
        proxy.close()


def test_bad_limits_are_refused(server_port):
    with pytest.raises(ValueError, match="first_byte_latency_s"):
        TcpProxy(server_port, first_byte_latency_s=-1)
    with pytest.raises(ValueError, match="bytes_per_s"):
        TcpProxy(server_port, bytes_per_s=0)


def test_runs_as_a_process_until_stdin_closes(server_port):
    script = Path(__file__).parent / "support" / "tcp_proxy.py"
    proc = subprocess.Popen([sys.executable, str(script), str(server_port), "--latency-ms", "1",
                             "--mb-per-s", "100"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("port ")
        with socket.create_connection(("127.0.0.1", int(line.split()[1]))) as s:
            assert _ask(s, 5) == bytes(range(5))
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
