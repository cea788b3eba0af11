"""Task handoff between the Python workers of one host (statecore.spark.handoff): a real second
process holds a partition's cached state and claims it; this process, as the worker Spark gave
the partition's next task to, relays the task to it. Checked: the output and the checkpoint the
holder writes, and every way the handoff must decline (another version, another attempt, a dead
holder) or fail the task (the processor raised in the holder)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("statecore._native")

from bench.spark_e2e import RunningCount  # noqa: E402
from statecore.checkpoint.store import CheckpointStore  # noqa: E402
from statecore.errors import InvalidInputError  # noqa: E402
from statecore.key_groups import key_group_range_for_operator, spark_key_group  # noqa: E402
from statecore.spark import handoff  # noqa: E402
from statecore.spark import task as O  # noqa: E402
from statecore.spark import worker_cache as W  # noqa: E402

N, MAXP = 2, 32
_R0 = key_group_range_for_operator(MAXP, N, 0)
KEYS = [k for k in range(400) if _R0.start <= spark_key_group(k, "int64", MAXP) <= _R0.end][:60]

# The holder: partition 0's state (each of KEYS counted once) committed as version 0 by writer
# p0-a0-t0, cached as that task leaves it and claimed; it serves until its stdin closes.
_HOLDER = textwrap.dedent("""
    import json, sys
    from concurrent.futures import Future
    import pyarrow as pa
    from statecore.checkpoint.store import CheckpointStore
    from statecore.descriptors import ReducingStateDescriptor
    from statecore.spark import handoff, worker_cache as W
    root, keys = sys.argv[1], json.loads(sys.argv[2])
    store = CheckpointStore(root, max_runs=None)
    b = W.partition_backend("native", "int64", 32, 2, 0)
    k = pa.array(keys, pa.int64())
    b.get_state(ReducingStateDescriptor("count", "count")).add_batch(k, k)
    snap = b.snapshot(incremental=False)
    d = store.write_snapshot(snap, 0, "p0-a0-t0")
    snap.release()
    store.commit(0, [d], {"attempt": "a0", "writers": ["p0-a0-t0"]})
    done = Future()
    done.set_result(d)
    key = (store.uri, "op", 0)
    W.put_cached(key, W.CachedState(0, "a0", 2, 32, "native", "int64", b, writer="p0-a0-t0",
                                      snapshot_id=d["snapshot_id"], write=done), 1)
    handoff.claim(key, 0)
    print("ready", flush=True)
    sys.stdin.read()
""")


class _Failing(RunningCount):
    def process_batch(self, batch, ctx):
        raise InvalidInputError("injected processor failure")


@pytest.fixture
def holder(tmp_path):
    root = str(tmp_path / "op")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(__file__)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, root, str(KEYS)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc, root
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def _spec(root, processor=None, prev_attempt="a0", prev_version=0):
    return O.TaskSpec(
        operator_name="op", store_uri=root, processor=processor or RunningCount(),
        backend_kind="native", key_type="int64", key_column="k", event_time_column=None,
        max_parallelism=MAXP, num_partitions=N, batch_id=1, prev_version=prev_version,
        prev_attempt=prev_attempt, attempt="a1", watermark_ms=None, is_flush=False,
        output_schema=RunningCount.output_schema, prev_writers=frozenset({"p0-a0-t0"}),
        freeze_worker_gc=False)  # not the test process: gc.freeze is process-wide


def _input(rows):
    """The routed input of partition 0: the rows, in 3 chunks."""
    ks = pa.array(rows, pa.int64())
    return [pa.record_batch([ks.slice(i, 25)], names=["k"]) for i in range(0, len(ks), 25)]


def _pending(root, writer, timeout_s=30.0):
    store = CheckpointStore(root)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for d in store.pending(1):
            if d["writer"] == writer:
                return d
        time.sleep(0.05)
    raise AssertionError(f"no pending descriptor of {writer}")


def test_a_task_is_run_by_the_worker_that_holds_its_partition(holder):
    proc, root = holder
    rows = [int(k) for k in np.random.default_rng(5).choice(KEYS, 70)]
    spec = _spec(root)
    assert handoff.held_elsewhere(spec._cache_key(0), 0)
    out = spec._hand_off(0, iter(_input(rows)))
    assert out is not None
    got = pa.Table.from_batches(list(out))
    seen = {}
    want = []
    for k in rows:  # each key counted once in version 0
        seen[k] = seen.get(k, 1) + 1
        want.append(seen[k])
    assert got.column("k").to_pylist() == rows
    assert got.column("count").to_pylist() == want
    # The holder wrote version 1's checkpoint as the task's writer, from its cached state.
    desc = _pending(root, "p0-a1-t0")
    rep = desc["spark_report"]
    assert rep["load"] == "handoff" and rep["pid"] == proc.pid and rep["rows"] == len(rows)
    assert rep["incremental"]
    store = CheckpointStore(root)
    store.commit(1, [desc], {"attempt": "a1", "writers": ["p0-a1-t0"]})
    # This process never held the partition and holds nothing now.
    assert not W._STATE_CACHE


def test_no_handoff_for_another_version_or_attempt(holder):
    _, root = holder
    assert _spec(root, prev_version=1)._hand_off(0, iter(_input(KEYS[:3]))) is None
    # The holder has version 0 of another attempt than the committed one: it declines.
    assert _spec(root, prev_attempt="other")._hand_off(0, iter(_input(KEYS[:3]))) is None


def test_no_handoff_to_a_dead_holder(holder):
    proc, root = holder
    spec = _spec(root)
    proc.kill()
    proc.wait(timeout=30)
    assert not handoff.held_elsewhere(spec._cache_key(0), 0)
    assert spec._hand_off(0, iter(_input(KEYS[:3]))) is None


def test_a_failure_in_the_holder_fails_the_relaying_task(holder):
    _, root = holder
    out = _spec(root, processor=_Failing())._hand_off(0, iter(_input(KEYS[:3])))
    assert out is not None
    with pytest.raises(InvalidInputError, match="injected processor failure"):
        list(out)
    # The holder closed the partition's backend and reports nothing for the failed task.
    time.sleep(0.5)
    assert CheckpointStore(root).pending(1) == []


def test_a_relayed_input_error_is_the_relaying_tasks_own(holder):
    _, root = holder
    bad = pa.record_batch([pa.array([None, None, KEYS[0]], pa.int64())], names=["k"])
    out = _spec(root)._hand_off(0, iter([bad]))
    assert out is not None
    with pytest.raises(InvalidInputError, match="rows with a null key"):
        list(out)


def test_claims_live_in_a_private_directory(tmp_path):
    base = handoff._base_dir()
    assert base is not None
    assert os.stat(base).st_mode & 0o077 == 0
    key = (str(tmp_path), "op", 3)
    handoff.claim(key, 7)
    # This process's own claim is not "elsewhere", and a relay never connects to itself.
    assert not handoff.held_elsewhere(key, 7)
    assert handoff._read_claim(key)[1:] == (os.getpid(), 7)


def test_a_starting_server_sweeps_files_of_dead_processes(tmp_path, monkeypatch):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = os.getppid()
    files = {
        f"w{dead.pid}.sock": "", f"claim-{'a' * 24}": f"{dead.pid} 3\n",
        f"claim-{'b' * 24}.{dead.pid}.tmp": f"{dead.pid} 4\n",
        f"w{live}.sock": "", f"claim-{'c' * 24}": f"{live} 5\n",
        f"w{os.getpid()}.sock": "", f"claim-{'d' * 24}": f"{os.getpid()} 6\n",
        f"claim-{'e' * 24}": "garbage\n", "unrelated.txt": "",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert handoff._sweep(str(tmp_path)) == 3
    left = sorted(os.listdir(tmp_path))
    assert left == sorted(n for n in files if str(dead.pid) not in n and
                          files[n] != f"{dead.pid} 3\n")
    # The server's start is what runs the sweep: a dead worker's files left since are removed.
    (tmp_path / f"w{dead.pid}.sock").write_text("")
    monkeypatch.setattr(handoff._Server, "_pid", None)
    assert handoff._Server.ensure(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == left


def test_a_holder_failing_while_input_still_flows_reports_its_failure(holder):
    """The holder fails on the first chunk and closes the socket while the relaying task is
    still sending input (a broken pipe on its side): the task fails with the holder's error,
    not with the socket's."""
    _, root = holder
    many = [b for _ in range(2000) for b in _input(KEYS)]
    out = _spec(root, processor=_Failing())._hand_off(0, iter(many))
    assert out is not None
    with pytest.raises(InvalidInputError, match="injected processor failure"):
        list(out)
