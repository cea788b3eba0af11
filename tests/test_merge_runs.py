"""The native newest-wins merge of sorted runs (``_native.merge_newest_wins``, used by checkpoint
restores and compaction over incremental chains) against the sorting merge in Python
(``readers.merge_newest_wins(native=False)``), and the errors it raises for runs a corrupt file
could hold."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from statecore.checkpoint import readers
from statecore.errors import CorruptCheckpointError, InvalidInputError

native = pytest.importorskip("statecore._native")


def _run(rng: random.Random, tombstones: bool, pad: int):
    """A sorted run of short byte keys (prefixes of one another are common) as binary arrays,
    sliced by ``pad`` entries at both ends so Arrow offsets and bitmap offsets are nonzero."""
    entries = {}
    for _ in range(rng.randrange(0, 60)):
        n = rng.randrange(14, 20) if rng.random() < 0.25 else rng.randrange(0, 4)
        key = bytes(rng.choice(b"\x00\x01\x7f\xff") for _ in range(n))
        entries[key] = None if tombstones and rng.random() < 0.3 else str(rng.random()).encode()
    keys = [b"\x00" * 8] * pad + sorted(entries) + [b"\xff" * 8] * pad
    values = [b"pad"] * pad + [entries[k] for k in sorted(entries)] + [None] * pad
    k = pa.array(keys, pa.binary()).slice(pad, len(entries))
    v = pa.array(values, pa.binary()).slice(pad, len(entries))
    return k, v


@pytest.mark.parametrize("keep_tombstones", [False, True])
@pytest.mark.parametrize("seed", range(20))
def test_native_merge_equals_the_sorting_merge(seed, keep_tombstones):
    """Also with ``keep_tombstones`` (a change set: a key's newest tombstone stays, NULL)."""
    rng = random.Random(seed)
    parts = [_run(rng, tombstones=rng.random() < 0.7, pad=rng.randrange(0, 9))
             for _ in range(rng.randrange(2, 8))]
    got_k, got_v = native.merge_newest_wins(parts, keep_tombstones)
    want_k, want_v = readers.merge_newest_wins(parts, native=False,
                                               keep_tombstones=keep_tombstones)
    assert got_k.type == got_v.type == pa.binary()
    assert got_k.null_count == 0
    assert got_v.null_count == (want_v.null_count if keep_tombstones else 0)
    assert got_k.to_pylist() == want_k.to_pylist()
    assert got_v.to_pylist() == want_v.to_pylist()
    got_k.validate(full=True)
    got_v.validate(full=True)


def test_newest_wins_and_tombstones_delete():
    older = (pa.array([b"a", b"ab", b"b"]), pa.array([b"1", b"2", b"3"]))
    newer = (pa.array([b"a", b"ab", b"c"]), pa.array([None, b"9", b"4"], pa.binary()))
    k, v = native.merge_newest_wins([newer, older])
    assert k.to_pylist() == [b"ab", b"b", b"c"]
    assert v.to_pylist() == [b"9", b"3", b"4"]
    # A change set keeps the newest tombstone of "a"; an older one under a newer value goes.
    oldest = (pa.array([b"ab", b"c"]), pa.array([None, None], pa.binary()))
    k, v = native.merge_newest_wins([newer, older, oldest], keep_tombstones=True)
    assert k.to_pylist() == [b"a", b"ab", b"b", b"c"]
    assert v.to_pylist() == [None, b"9", b"3", b"4"] and v.null_count == 1
    v.validate(full=True)
    # Empty runs and runs of only tombstones.
    empty = (pa.array([], pa.binary()), pa.array([], pa.binary()))
    k, v = native.merge_newest_wins([empty, (pa.array([b"a"]), pa.array([None], pa.binary())),
                                     empty, older])
    assert k.to_pylist() == [b"ab", b"b"] and v.to_pylist() == [b"2", b"3"]
    k, v = native.merge_newest_wins([])
    assert len(k) == len(v) == 0


def test_bad_runs_raise():
    ok = (pa.array([b"a", b"b"]), pa.array([b"1", b"2"]))
    with pytest.raises(InvalidInputError, match="strictly ascending"):
        native.merge_newest_wins([ok, (pa.array([b"b", b"a"]), pa.array([b"1", b"2"]))])
    with pytest.raises(InvalidInputError, match="strictly ascending"):
        native.merge_newest_wins([ok, (pa.array([b"a", b"a"]), pa.array([b"1", b"2"]))])
    with pytest.raises(InvalidInputError, match="null key"):
        native.merge_newest_wins([ok, (pa.array([b"a", None]), pa.array([b"1", b"2"]))])
    with pytest.raises(InvalidInputError, match="values"):
        native.merge_newest_wins([ok, (pa.array([b"a"]), pa.array([b"1", b"2"]))])
    with pytest.raises(InvalidInputError, match="binary"):
        native.merge_newest_wins([ok, (pa.array(["a"]), pa.array([b"1"]))])


def test_a_run_that_breaks_the_merge_is_a_corrupt_checkpoint(tmp_path, monkeypatch):
    """The reader names the version, state, key group and runs when the merge rejects them."""
    from statecore import ValueStateDescriptor, create_backend
    from statecore.checkpoint import CheckpointStore

    store = CheckpointStore(str(tmp_path))
    b = create_backend("python", key_type="int64", max_parallelism=128)
    st = b.get_state(ValueStateDescriptor("v", "int64"))
    for version in (0, 1):
        st.put_batch(pa.array([1, 2, 3], pa.int64()), pa.array([version] * 3, pa.int64()))
        snap = b.snapshot(incremental=version > 0)
        store.commit(version, [store.write_snapshot(snap, version, "p0")])
        b.notify_checkpoint_complete(snap.snapshot_id, version)
        snap.release()

    def broken(parts, keep_tombstones=False):
        raise InvalidInputError("run 1: keys not strictly ascending at entry 1")

    monkeypatch.setattr(readers, "_native_merge", lambda: broken)
    reader = store.open(1)
    with pytest.raises(CorruptCheckpointError, match="state 'v' key group"):
        for kg in range(128):
            reader.entries("v", kg)
    reader.release()
