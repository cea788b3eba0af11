"""Partition affinity among the Python workers of one host: a task hands its partition to the
worker process that holds the partition's state.

Why: PySpark gives a partition's next task to whichever idle Python worker of the executor comes
first (reused workers, ``spark.python.worker.reuse``), so with two workers it lands on the one
that ran it last only about half the time. The worker cache
(:mod:`statecore.spark.worker_cache`) answers that with copies: stale ones caught up on demand,
or standby copies caught up after every micro-batch. Either way every worker applies every other
partition's changes, which can cost as much CPU as the tasks' own state work. Here the copy
stays where it is and the task goes to it instead: the worker that ran a partition (its
*holder*) serves the partition's next task from its cache when PySpark gives that task to
another worker on the same host. The receiving worker only relays: its input batches to the
holder, the holder's output batches back to Spark, both as Arrow IPC messages over a Unix domain
socket, a copy of the rows each way instead of applying the other partition's changes to a
second state map.

Protocol (one connection per task; frames are ``kind`` (1 byte) + length (8 bytes, little
endian) + payload):

1. relay -> holder ``REQUEST``: the pickled ``(task spec, partition, Spark task attempt)``.
2. holder -> relay ``MISS`` (it does not hold exactly the version the task needs: the relay
   loads the state itself, as without handoff) or ``ACCEPT`` (it took its cached state).
3. relay -> holder: ``SCHEMA`` / ``BATCH`` frames of the input's data chunks, then
   ``INPUT_END``; meanwhile holder -> relay: ``SCHEMA`` / ``BATCH`` frames of the output.
4. holder -> relay ``OUTPUT_END`` after its last output batch; relay -> holder ``TAKEN`` once
   Spark took that batch (the holder's checkpoint write reports only then, as a task's own
   does: ``TaskSpec.run``'s ``output_done``).
5. holder -> relay ``DONE``, or ``ERROR`` with the pickled exception at any point after
   ``ACCEPT``: the relay raises it, and the task fails as if it had run locally (the holder
   closed the partition's backend; a retry restores the committed version).

Discovery: a worker that cached a partition's state after its task writes the partition's
*claim* file ``(pid, version)`` (:func:`claim`) in a per-user directory of the host's temporary
directory (mode 0700: the socket accepts pickles, so only the same user may connect), where its
socket ``w<pid>.sock`` lives too. A relay connects only when the claim names another live
process at exactly the version its task restores; any failure before ``ACCEPT`` (no claim, a
dead or busy holder, no socket) falls back to loading locally, so handoff never makes a task
fail that would not fail without it. Standby copies skip partitions a live worker of this host
claims (:func:`held_elsewhere`): their next task here is handed to the holder anyway. A worker
that starts its server first removes the claims and sockets of processes that no longer run
(:func:`_sweep`).

What it does not do: move tasks between hosts (each executor host has its own directory and
workers; a partition that lands on another executor restores or catches up there as before)
or rebalance: a worker that holds several partitions serves all their tasks, in threads that
share its GIL (the native backend releases it in its batch calls).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import socket
import struct
import tempfile
import threading
from typing import Any, Callable, Iterator, Optional, Tuple

import pyarrow as pa

__all__ = ["claim", "held_elsewhere", "relay"]

REQUEST, ACCEPT, MISS, SCHEMA, BATCH, INPUT_END, OUTPUT_END, TAKEN, DONE, ERROR = range(1, 11)
_HEADER = struct.Struct("<BQ")
#: Seconds a relay waits to connect to a holder and for its ACCEPT or MISS.
CONNECT_TIMEOUT_S = 5.0


# ------------------------------------------------------------------------------- registry
def _base_dir() -> Optional[str]:
    """The per-user directory of claims and sockets (created 0700), or None when it cannot be
    made private (another user owns it, or its mode lets others in): handoff is then off."""
    d = os.path.join(tempfile.gettempdir(), f"statecore-{os.getuid()}")
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.stat(d)
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return d


def _claim_path(base: str, cache_key: tuple) -> str:
    digest = hashlib.sha1(repr(cache_key).encode()).hexdigest()[:24]
    return os.path.join(base, f"claim-{digest}")


def _socket_path(base: str, pid: int) -> str:
    return os.path.join(base, f"w{pid}.sock")


def _sweep(base: str) -> int:
    """Remove the claims and sockets of processes that no longer run (a PySpark worker ends
    with ``os._exit``, so none removes its own): called once per process, when its server
    starts, so the directory holds about one socket per live worker and the claims of live
    holders instead of one file per worker and partition that ever ran on the host. A claim
    replaced by a live process between the read and the unlink can be lost; its holder then
    only misses handoffs until its next task claims again. Returns the files removed."""
    removed = 0
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    for name in names:
        path = os.path.join(base, name)
        pid = None
        if name.startswith("w") and name.endswith(".sock"):
            pid = name[1:-len(".sock")]
        elif name.startswith("claim-") and "." not in name:
            c = _claim_file(path)
            if c is None:
                continue
            pid = str(c[0])
        elif name.startswith("claim-") and name.endswith(".tmp"):
            pid = name.rsplit(".", 2)[-2]  # claim-<digest>.<pid>.tmp left by a crash
        if pid is None or not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        try:
            os.unlink(path)
            removed += 1
        except OSError:
            pass
    return removed


def claim(cache_key: tuple, version: int) -> None:
    """Record that this process holds ``cache_key``'s partition at ``version`` and serve its
    next task (starts this process's handoff server on first use). Best effort: an OS error
    leaves the claim out (other workers then load the partition themselves)."""
    base = _base_dir()
    if base is None or not _Server.ensure(base):
        return
    path = _claim_path(base, cache_key)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()} {int(version)}\n")
        os.replace(tmp, path)
    except OSError:
        pass


def _claim_file(path: str) -> Optional[Tuple[int, int]]:
    """``(pid, version)`` written in the claim file ``path`` (:func:`claim`), or None when it
    is missing or unreadable."""
    try:
        with open(path) as f:
            pid, version = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return None
    return pid, version


def _read_claim(cache_key: tuple) -> Optional[Tuple[str, int, int]]:
    """``(directory, pid, version)`` of ``cache_key``'s claim, or None."""
    base = _base_dir()
    if base is None:
        return None
    c = _claim_file(_claim_path(base, cache_key))
    return None if c is None else (base, *c)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def held_elsewhere(cache_key: tuple, version: int) -> bool:
    """True when another live process of this host claims ``cache_key``'s partition at
    ``version`` or later (its next task here would be handed to it)."""
    c = _read_claim(cache_key)
    return c is not None and c[1] != os.getpid() and c[2] >= version and _alive(c[1])


# --------------------------------------------------------------------------------- frames
def _send(sock: socket.socket, kind: int, payload=b"") -> None:
    sock.sendall(_HEADER.pack(kind, len(payload)))
    if len(payload):
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        r = sock.recv_into(view[got:], n - got)
        if r == 0:
            raise ConnectionError("handoff peer closed the connection")
        got += r
    return buf


def _recv(sock: socket.socket) -> Tuple[int, bytearray]:
    kind, n = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    return kind, _recv_exact(sock, n) if n else bytearray()


class _BatchSender:
    """Sends record batches as SCHEMA (when it changes) + BATCH frames."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.schema = None

    def send(self, batch: pa.RecordBatch) -> None:
        if self.schema is None or not batch.schema.equals(self.schema, check_metadata=True):
            self.schema = batch.schema
            _send(self.sock, SCHEMA, self.schema.serialize())
        _send(self.sock, BATCH, batch.serialize())


def _read_batch(kind: int, payload: bytearray, state: dict) -> Optional[pa.RecordBatch]:
    """The batch of a BATCH frame (None for a SCHEMA frame, which sets ``state["schema"]``)."""
    if kind == SCHEMA:
        state["schema"] = pa.ipc.read_schema(pa.py_buffer(payload))
        return None
    return pa.ipc.read_record_batch(pa.py_buffer(payload), state["schema"])


def _exception_payload(exc: BaseException) -> bytes:
    try:
        return pickle.dumps(exc)
    except Exception:  # noqa: BLE001 -- an exception that does not pickle travels as text
        from statecore.errors import StateError

        return pickle.dumps(StateError(f"{type(exc).__name__}: {exc}"))


def _raise_remote(payload: bytearray) -> None:
    try:
        exc = pickle.loads(bytes(payload))
    except Exception as e:  # noqa: BLE001
        from statecore.errors import StateError

        raise StateError(
            f"the worker holding the partition failed (unreadable error: {e})") from e
    if isinstance(exc, BaseException):
        raise exc
    from statecore.errors import StateError

    raise StateError(f"the worker holding the partition failed: {exc!r}")


# --------------------------------------------------------------------------------- holder
class _Server:
    """This process's handoff server: a daemon thread accepting on ``w<pid>.sock`` and a
    daemon thread per connection (:func:`_serve`)."""

    _lock = threading.Lock()
    _pid: Optional[int] = None  # the process that started it (a forked child starts anew)

    @classmethod
    def ensure(cls, base: str) -> bool:
        with cls._lock:
            if cls._pid == os.getpid():
                return True
            path = _socket_path(base, os.getpid())
            _sweep(base)
            try:
                if os.path.exists(path):
                    os.unlink(path)
                srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                srv.bind(path)
                srv.listen(16)
            except OSError:
                return False
            threading.Thread(target=cls._accept, args=(srv,), name="statecore-handoff",
                             daemon=True).start()
            cls._pid = os.getpid()
            return True

    @staticmethod
    def _accept(srv: socket.socket) -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=_serve_quietly, args=(conn,), name="statecore-handoff-task",
                             daemon=True).start()


def _serve_quietly(conn: socket.socket) -> None:
    try:
        _serve(conn)
    except Exception:  # noqa: BLE001 -- the relay sees the closed connection and fails its task
        pass
    finally:
        conn.close()


def _serve(conn: socket.socket) -> None:
    """Run one handed-off task (protocol: module docstring)."""
    from pyspark import cloudpickle

    kind, payload = _recv(conn)
    if kind != REQUEST:
        return
    spec, partition, task_attempt = cloudpickle.loads(bytes(payload))
    hit = spec.take_for_handoff(partition)
    if hit is None:
        _send(conn, MISS)
        return
    _send(conn, ACCEPT)
    state: dict = {}

    def inputs() -> Iterator[pa.RecordBatch]:
        while True:
            k, p = _recv(conn)
            if k == INPUT_END:
                return
            if k == ERROR:
                raise ConnectionError("the relaying task failed while sending its input")
            b = _read_batch(k, p, state)
            if b is not None:
                yield b

    def output_taken() -> bool:
        try:
            _send(conn, OUTPUT_END)
            k, p = _recv(conn)
        except (OSError, ConnectionError):
            return False
        return k == TAKEN and bytes(p) == b"1"

    out = _BatchSender(conn)
    gen = spec.run(partition, inputs(), hit=hit, task_attempt=task_attempt,
                   output_taken=output_taken)
    try:
        for batch in gen:
            out.send(batch)
    except BaseException as exc:  # noqa: BLE001 -- reported to the relay, which raises it
        gen.close()  # a send that failed leaves the task suspended at its yield: end it there
        try:
            _send(conn, ERROR, _exception_payload(exc))
        except OSError:
            pass
        return
    _send(conn, DONE)


# ---------------------------------------------------------------------------------- relay
def relay(spec: Any, cache_key: tuple, partition: int, task_attempt: int,
          chunks: Callable[[], Iterator[pa.RecordBatch]]) -> Optional[Iterator[pa.RecordBatch]]:
    """Hand the task of ``partition`` to the live process of this host that claims
    ``cache_key`` at ``spec.prev_version``: returns the iterator of its output batches (which
    streams ``chunks()``, the task's data chunks, to it meanwhile), or None when there is no such
    process or it does not take the task (the caller loads the partition itself). Raises what
    the holder's run of the task raised, and ConnectionError when the holder dies after it took
    the task."""
    from pyspark import cloudpickle

    c = _read_claim(cache_key)
    if c is None or c[1] == os.getpid() or c[2] != spec.prev_version:
        return None
    base, pid, _ = c
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(_socket_path(base, pid))
        _send(sock, REQUEST, cloudpickle.dumps((spec, partition, task_attempt)))
        kind, _ = _recv(sock)
    except (OSError, ConnectionError):
        sock.close()
        return None
    if kind != ACCEPT:
        sock.close()
        return None
    sock.settimeout(None)
    return _relayed(sock, chunks)


def _relayed(sock: socket.socket, chunks: Callable[[], Iterator[pa.RecordBatch]]
             ) -> Iterator[pa.RecordBatch]:
    failure: list = []

    def send_input() -> None:
        sending = False
        try:
            out = _BatchSender(sock)
            for b in chunks():
                sending = True
                out.send(b)
                sending = False
            sending = True
            _send(sock, INPUT_END)
        except BaseException as exc:  # noqa: BLE001 -- raised by the relay's task below
            if sending and isinstance(exc, OSError):
                # The holder closed the socket (it failed): the ERROR it sent first, or the
                # socket error the receiving side sees, says why.
                return
            failure.append(exc)
            try:
                _send(sock, ERROR)
            except OSError:
                pass

    sender = threading.Thread(target=send_input, name="statecore-handoff-input", daemon=True)
    sender.start()
    state: dict = {}
    try:
        while True:
            try:
                kind, payload = _recv(sock)
            except (OSError, ConnectionError):
                sender.join()
                if failure:
                    # The input side's error closed the socket: it is the cause, not the
                    # socket error it led to.
                    raise failure[0] from None
                raise
            if kind == DONE:
                break
            if kind == ERROR:
                sender.join()
                if failure:
                    raise failure[0]
                _raise_remote(payload)
            if kind == OUTPUT_END:
                _send(sock, TAKEN, b"1")
                continue
            b = _read_batch(kind, payload, state)
            if b is not None:
                yield b
        sender.join()
        if failure:
            raise failure[0]
    finally:
        sock.close()
        sender.join()
