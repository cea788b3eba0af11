"""SIGKILL at random moments of checkpoint, commit, compaction, retention and restore
(tests/support/kill_loop_worker.py): after every kill, every retained version verifies and
restores exactly its state, the newest version the worker reported committed is still there,
and the next worker continues from the latest version. Seeded; STATECORE_KILLS sets the number
of kills (tens by default, hundreds for a long run)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from statecore import CheckpointStore

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "support"))

import kill_loop_worker as w  # noqa: E402

KILLS = int(os.environ.get("STATECORE_KILLS", "24"))


def _check(root: str, kind: str, reported: int | None) -> list:
    store = CheckpointStore(root)
    versions = store.versions()
    if reported is not None:
        assert versions and versions[-1] >= reported, (versions, reported)
    for v in versions:
        store.verify(v)
        b, vs, ls = w.backend(kind)
        store.restore(b, v)
        assert w.contents(b, vs, ls) == w.expected(v), f"version {v}"
        b.dispose()
    return versions


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["native", "python"])
def test_sigkill_loop_loses_no_committed_version(tmp_path, kind):
    rng = random.Random(20261128)
    root = str(tmp_path / "ckpt")
    env = dict(os.environ)
    kills = max(1, KILLS // 2)
    progressed = 0
    for i in range(kills):
        proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "support", "kill_loop_worker.py"), root, kind,
             str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        time.sleep(rng.uniform(0.6, 2.5))  # the interpreter takes ~0.5 s to start
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, f"worker ended by itself: {err[-2000:]}"
        done = [int(line.split()[1]) for line in out.splitlines() if line.startswith("committed")]
        progressed += len(done)
        _check(root, kind, done[-1] if done else None)
    assert progressed > kills, f"only {progressed} versions in {kills} runs"
