"""Run by test_tiered_compaction in a fresh interpreter, to be SIGKILLed at its ``kill_at``-th
filesystem mutation (a file opened for writing, a write into it -- half of it written first, a torn
file --, a move, a delete): a tiered backend attached to the newest version of a history
:func:`build` wrote checkpoints the next version and runs retention (``commit``); in ``compact``
that version's chain is compacted in the background in between and the backend re-attaches to it; in
``forward`` the next version is committed first and the compaction replaces both manifests. With
``kill_at`` 0 nothing is killed and it prints ``mutations N`` (:func:`main` run in process, as the
test does to count them). Every version's state is a function of the version alone
(:func:`expected`)."""

import os
import random
import signal
import sys

import pyarrow as pa
import pyarrow.fs as pafs

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from statecore import create_backend  # noqa: E402
from statecore.checkpoint import CheckpointStore  # noqa: E402
from statecore.descriptors import ValueStateDescriptor  # noqa: E402
from support.fs_wrappers import LocalDelegatingHandler  # noqa: E402

KEYS = 300
#: Versions build() commits (1 full, then incremental runs: one chain of LAST runs).
LAST = 4
DESC = ValueStateDescriptor("v", "int64")


def changes(version: int) -> list:
    """``(key, value or None for a removal)`` of ``version``."""
    rng = random.Random(version)
    if version == 1:
        return [(k, k) for k in range(KEYS)]
    return [(rng.randrange(KEYS), None if rng.random() < 0.25 else version * 1000 + i)
            for i in range(60)]


def expected(version: int) -> dict:
    """``{key: value}`` of ``version``."""
    state: dict = {}
    for v in range(1, version + 1):
        for k, val in changes(v):
            if val is None:
                state.pop(k, None)
            else:
                state[k] = val
    return state


def apply(backend, version: int) -> None:
    """Apply ``changes(version)`` to ``backend``'s state, one batch a change (order matters)."""
    state = backend.get_state(DESC)
    for k, val in changes(version):
        state.put_batch(pa.array([k], pa.int64()), pa.array([val], pa.int64()))


def tiered(store, compact_max_runs=None):
    return create_backend("native", key_type="int64", memory_budget=16 * 18, checkpoint=store,
                          compact_max_runs=compact_max_runs)


def build(root: str) -> None:
    """Versions 1..LAST of one tiered backend, never compacted."""
    store = CheckpointStore(root, max_runs=None)
    b = tiered(store)
    for v in range(1, LAST + 1):
        apply(b, v)
        store.checkpoint(b, v)
    b.dispose()
    store.close()


class KillingHandler(LocalDelegatingHandler):
    """Local disk; SIGKILLs the process at its ``kill_at``-th mutation (0: never)."""

    type_name = "killing"

    def __init__(self, kill_at: int):
        super().__init__()
        self.kill_at = kill_at
        self.mutations = 0
        #: each mutation: (what: "open", "write", "move" or "delete", the file's base name)
        self.steps: list[tuple[str, str]] = []

    def _step(self, kind: str, path: str) -> bool:
        self.mutations += 1
        self.steps.append((kind, os.path.basename(path)))
        return self.mutations == self.kill_at

    def _die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def before_write(self, stream, data) -> None:
        if self._step("write", stream.path):
            stream.inner.write(bytes(data)[:len(data) // 2])
            stream.inner.flush()
            self._die()

    def open_output_stream(self, path, metadata):
        if self._step("open", path):
            self._die()
        return super().open_output_stream(path, metadata)

    def move(self, src, dest):
        if self._step("move", src):
            self._die()
        super().move(src, dest)

    def delete_file(self, path):
        if self._step("delete", path):
            self._die()
        super().delete_file(path)

    def delete_dir(self, path):
        if self._step("delete", path):
            self._die()
        super().delete_dir(path)


def main(root: str, phase: str, kill_at: int) -> KillingHandler:
    """The phase on ``root``, killed at mutation ``kill_at`` (0: never); returns the handler
    (its ``steps`` list the mutations)."""
    handler = KillingHandler(kill_at)
    store = CheckpointStore(root, filesystem=pafs.PyFileSystem(handler), max_runs=None)
    b = tiered(store, compact_max_runs=LAST if phase == "compact" else None)
    store.restore(b)
    apply(b, LAST + 1)
    store.checkpoint(b, LAST + 1)
    if phase == "compact":
        # The chain of LAST + 1 runs is compacted in the background; the backend re-attaches.
        if not b.poll_compaction(wait=True):
            raise SystemExit(f"no re-attach: {b.last_compaction_error}")
    elif phase == "forward":
        # LAST + 1 is compacted only once LAST + 2 was committed on top of it: the compaction
        # replaces both manifests, one after the other.
        apply(b, LAST + 2)
        store.checkpoint(b, LAST + 2)
        store.compact(LAST + 1, max_runs=1)
        if LAST + 1 != store.manifest(LAST + 2)["files"][-1]["seq"]:
            raise SystemExit("the compaction did not reach version LAST + 2")
    store.retain(2)
    b.dispose()
    store.close()
    print(f"mutations {handler.mutations}", flush=True)
    return handler


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
