"""A loopback TCP proxy with a network's limits: a first-byte latency per request and a
bandwidth cap per connection, in front of a server on another loopback port (an S3 server, for
the object-store tests and the ``s3_checkpoint`` benchmark). Standard library only, so that it
also runs as a process of its own::

    python tests/support/tcp_proxy.py TARGET_PORT --latency-ms 20 --mb-per-s 80

prints ``port N`` (the port it listens on) once it accepts connections and runs until its stdin
closes or it is killed. One thread per connection forwards both directions.

The limits stand for an object store's network as AWS describes it ("Best Practices Design
Patterns: Optimizing Amazon S3 Performance", section "Horizontal Scaling and Request
Parallelization for High Throughput": byte ranges of 8-16 MB, one concurrent request per 85-90
MB/s of throughput wanted, since a connection's throughput is bounded): the proxy holds the
first bytes of the answer to every request ``first_byte_latency_s`` (added to the server's own
time; a request is whatever a client sends before the server answers), and paces each
connection, each direction, to at most ``bytes_per_s``.
"""

from __future__ import annotations

import argparse
import contextlib
import select
import socket
import struct
import sys
import threading
import time

__all__ = ["TcpProxy", "free_port", "CATCH_UP_S"]

_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection
#: Bytes read from a socket at once: at 80 MB/s the pacing spreads them over 3.3 ms, several
#: times a sleep's overrun on a busy machine.
_CHUNK = 1 << 18
#: Seconds a paced connection may fall behind its rate (a sleep that overran) and still make
#: them up by sending sooner; behind by more, it is taken as idle and starts afresh.
CATCH_UP_S = 0.05


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Pacer:
    """Paces one direction of one connection to ``rate`` bytes per second (None: unpaced):
    :meth:`wait` before sending ``n`` bytes sleeps until ``1 / rate`` seconds per byte passed
    for the bytes sent so far in this burst, these included. A sleep that overran is made up
    by sending the next chunks sooner (the rate holds on average), up to :data:`CATCH_UP_S`
    behind; a connection idle for longer starts a new burst and banks nothing."""

    def __init__(self, rate: float | None):
        self.rate = rate
        self._due = 0.0

    def wait(self, n: int) -> None:
        if self.rate is None:
            return
        now = time.monotonic()
        if now - self._due > CATCH_UP_S:
            self._due = now
        self._due += n / self.rate
        if self._due > now:
            time.sleep(self._due - now)


class TcpProxy:
    """A TCP proxy on ``127.0.0.1:port`` (a free port unless given) in front of
    ``127.0.0.1:target_port``, run by threads of this process. Every response (server to client
    bytes after client to server bytes on one connection) is held ``first_byte_latency_s``
    seconds (>= 0) before its first bytes go on, and each connection's bytes go at most
    ``bytes_per_s`` per second (> 0; None: unlimited) each way. :meth:`down` closes the
    listener and resets every connection, :meth:`up` listens again on the same port,
    :meth:`close` ends it. Raises ValueError for a negative latency or a rate that is not
    positive, OSError when the port cannot be bound.

    Subclasses see every chunk before it is forwarded (:meth:`_admit_upstream`,
    :meth:`_admit_downstream`) and may reset the connection or take the proxy down
    (``tests/support/s3_server.py`` ``DroppingProxy``)."""

    def __init__(self, target_port: int, *, first_byte_latency_s: float = 0.0,
                 bytes_per_s: float | None = None, port: int | None = None):
        if not first_byte_latency_s >= 0:
            raise ValueError(f"first_byte_latency_s must be >= 0, got {first_byte_latency_s}")
        if bytes_per_s is not None and not bytes_per_s > 0:
            raise ValueError(f"bytes_per_s must be > 0 or None, got {bytes_per_s}")
        self.target_port = target_port
        self.first_byte_latency_s = float(first_byte_latency_s)
        self.bytes_per_s = bytes_per_s
        self.port = free_port() if port is None else port
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._closed = False
        self._pending_down = False  # a down from a connection's thread in progress
        #: Connections accepted so far.
        self.accepted = 0
        self.up()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def up(self) -> None:
        deadline = time.monotonic() + 10
        while self._pending_down and time.monotonic() < deadline:
            time.sleep(0.01)
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(64)
        self._listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()

    def down(self) -> None:
        ls, self._listener = self._listener, None
        if ls is not None:
            with contextlib.suppress(OSError):
                ls.shutdown(socket.SHUT_RDWR)
            ls.close()
        self._cut_all()

    def close(self) -> None:
        self._closed = True
        self.down()

    def _admit_upstream(self, data: bytes) -> str:
        """What to do with ``data`` from a client: ``"forward"``, ``"reset"`` (reset this
        connection) or ``"down"`` (reset it and take the whole proxy down)."""
        return "forward"

    def _admit_downstream(self, data: bytes) -> str:
        """:meth:`_admit_upstream` for ``data`` from the server."""
        return "forward"

    def _cut_all(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            with contextlib.suppress(OSError):
                # RST instead of FIN: the client sees the connection reset mid-request.
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
                c.close()

    def _accept(self, ls: socket.socket) -> None:
        while not self._closed:
            try:
                client, _ = ls.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for s in (client, upstream):
                with contextlib.suppress(OSError):  # an end already gone: its pump sees it
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.update((client, upstream))
                self.accepted += 1
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        socks = [client, upstream]
        paced = {client: _Pacer(self.bytes_per_s), upstream: _Pacer(self.bytes_per_s)}
        reset = False  # a deliberate drop resets both ends; an end of stream closes gently
        go_down = False
        answered = True  # no request is waiting for the first bytes of its response
        try:
            while True:
                readable, _, _ = select.select(socks, [], [], 1.0)
                if self._closed:
                    reset = True
                    return
                for s in readable:
                    data = s.recv(_CHUNK)
                    if not data:
                        return
                    upward = s is client
                    verdict = (self._admit_upstream if upward else self._admit_downstream)(data)
                    if verdict != "forward":
                        reset, go_down = True, verdict == "down"
                        if go_down:
                            self._pending_down = True
                        return
                    if upward:
                        answered = False
                    elif not answered:
                        answered = True
                        if self.first_byte_latency_s:
                            time.sleep(self.first_byte_latency_s)
                    paced[s].wait(len(data))
                    (upstream if upward else client).sendall(data)
        except (OSError, ValueError):  # ValueError: select() on a socket down() closed
            reset = True
        finally:
            with self._lock:
                self._conns.discard(client)
                self._conns.discard(upstream)
            for s in socks:
                with contextlib.suppress(OSError):
                    if reset:
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
                    else:
                        s.shutdown(socket.SHUT_WR)
                    s.close()
            if go_down:  # not under the lock: down() takes it
                self.down()
                self._pending_down = False


def main(argv: list[str] | None = None) -> int:
    """Run one :class:`TcpProxy` until stdin closes (module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("target_port", type=int, help="the server's port on 127.0.0.1")
    p.add_argument("--latency-ms", type=float, default=0.0,
                   help="first-byte latency added to every response, ms (default 0)")
    p.add_argument("--mb-per-s", type=float, default=None,
                   help="bandwidth cap per connection and direction, 1e6 bytes/s (default none)")
    args = p.parse_args(argv)
    try:
        proxy = TcpProxy(args.target_port, first_byte_latency_s=args.latency_ms / 1000,
                         bytes_per_s=None if args.mb_per_s is None else args.mb_per_s * 1e6)
    except ValueError as exc:
        p.error(str(exc))
    print(f"port {proxy.port}", flush=True)
    try:
        sys.stdin.read()
    except KeyboardInterrupt:
        pass
    proxy.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
