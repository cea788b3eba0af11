"""The lease of a checkpoint root: which driver may publish manifests and delete files there.

Object stores have no atomic rename and pyarrow offers no conditional put, so two drivers on one
root (a restarted driver whose predecessor still runs, two jobs given one path) could interleave
commits, compactions and retention: one driver's retention deleting a file the other just
referenced from a manifest. The lease makes the newest driver the only writer and fences the
older one (Kafka's producer epochs, Chubby's lock-delay):

* ``_lease.json`` at the root holds the owner (128 random bits per store object), an epoch (+1
  at every takeover) and the time it was taken (format: docs/formats.md "Lease"). A store takes
  it at its first mutating step (commit, compaction publishing, retention) by writing its own
  owner with the next epoch, waiting :attr:`Lease.takeover_delay_s` -- so that every request
  an old owner had checked and already sent has ended -- and reading it back (S3 is strongly
  read-after-write consistent): of two stores taking it at once, the one whose write landed
  last holds it, the other raises FencedError without having acted.
* Before every request that publishes or deletes (a manifest put or delete, each retention
  delete) the store reads the lease (:meth:`Lease.check`): a different owner raises
  :class:`~statecore.errors.FencedError` and nothing is sent.
* After a manifest put the lease is read again (:meth:`Lease.verify`): when a takeover happened
  while the put was in flight, the store deletes the manifest it wrote (if its bytes are still
  the ones written) and raises FencedError.

So the old driver's steps stop at the first check after the takeover, and the new driver's
steps start only after the old driver's last checked request has ended: no retained manifest
references a file the other driver deleted. What is left: a request of the old driver that takes
longer than the takeover delay (a process paused for seconds between its check and its request).
The lease is not a lock with expiry: a driver that stops keeps it until the next takes it over,
which needs no wait for the old one to time out.
"""

from __future__ import annotations

import json
import secrets
import time

from statecore.checkpoint.layout import CheckpointRoot
from statecore.errors import CorruptCheckpointError, FencedError

__all__ = ["Lease", "LEASE_NAME", "LEASE_FORMAT", "DEFAULT_TAKEOVER_DELAY_S"]

LEASE_NAME = "_lease.json"
LEASE_FORMAT = "statecore-lease"
#: Seconds a store waits after taking the lease over from another owner (module docstring).
DEFAULT_TAKEOVER_DELAY_S = 2.0


class Lease:
    """The lease of one root as one store holds it. ``takeover_delay_s`` (float >= 0): the wait
    after taking it over from another owner. Attributes: ``owner`` (32 hex digits), ``epoch``
    (None until taken). Filesystem errors propagate as ``OSError``."""

    def __init__(self, root: CheckpointRoot, takeover_delay_s: float = DEFAULT_TAKEOVER_DELAY_S):
        self.root = root
        self.owner = secrets.token_hex(16)
        self.epoch: int | None = None
        self.takeover_delay_s = float(takeover_delay_s)

    def read(self) -> dict | None:
        """The lease as stored (``{"format", "owner", "epoch", "acquired_ms"}``), None when the
        root has none. Raises CorruptCheckpointError for a file that is not a lease."""
        path = self.root.path(LEASE_NAME)
        try:
            with self.root.fs.open_input_file(path) as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        try:
            doc = json.loads(raw.decode("ascii"))
            if doc["format"] != LEASE_FORMAT or not isinstance(doc["owner"], str) \
                    or isinstance(doc["epoch"], bool) or not isinstance(doc["epoch"], int):
                raise ValueError("not a statecore lease")
        except (ValueError, UnicodeDecodeError, KeyError, TypeError) as exc:
            raise CorruptCheckpointError(f"lease {path} is malformed: {exc}") from exc
        return doc

    def acquire(self) -> None:
        """Take the lease (module docstring): write this owner with the next epoch, wait the
        takeover delay, read it back. Raises FencedError when another store took it at the same
        moment (its write landed last)."""
        cur = self.read()
        epoch = (cur["epoch"] if cur is not None else 0) + 1
        doc = {"format": LEASE_FORMAT, "owner": self.owner, "epoch": epoch,
               "acquired_ms": int(time.time() * 1000)}
        self.root.write_bytes(LEASE_NAME, json.dumps(doc, sort_keys=True).encode("ascii"))
        # Wait before reading it back: a driver that held it finishes what it had checked, and
        # of two stores taking it at once the one whose write landed last wins, the other sees
        # that here and acts on nothing.
        if self.takeover_delay_s > 0:
            time.sleep(self.takeover_delay_s)
        back = self.read()
        if back is None or back["owner"] != self.owner:
            raise self._fenced(back, "taking the lease")
        self.epoch = epoch

    def check(self, what: str) -> None:
        """Make sure this store holds the lease before the request ``what`` (taking it first
        when it never did). Raises FencedError when another owner holds it."""
        if self.epoch is None:
            self.acquire()
            return
        cur = self.read()
        if cur is None or cur["owner"] != self.owner:
            raise self._fenced(cur, what)

    def verify(self, what: str) -> bool:
        """True when this store still holds the lease after ``what`` (a request sent after a
        :meth:`check`), False when another owner took it meanwhile."""
        cur = self.read()
        return cur is not None and cur["owner"] == self.owner

    def _fenced(self, cur: dict | None, what: str) -> FencedError:
        if cur is None:
            held = "no lease at all (deleted)"
        else:
            taken = time.gmtime(cur.get("acquired_ms", 0) / 1000)
            held = (f"lease epoch {cur['epoch']} of another driver, taken at "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S', taken)} UTC")
        mine = f"epoch {self.epoch}" if self.epoch is not None else "no epoch yet"
        return FencedError(
            f"{what} refused: the checkpoint root {self.root.uri} now has {held}; this store "
            f"held {mine}. Another driver took over this root: stop this one (or restart it to "
            "take the root back)")
