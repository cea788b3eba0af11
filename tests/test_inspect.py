"""`statecore inspect` on a real checkpoint written by the backends: the summary names every
state with its entry count, decoded entries equal what was written, Parquet export round-trips,
corruption is reported by --verify, and a missing checkpoint is a clear error."""

import os

import pyarrow.parquet as pq
import pytest

from statecore import (
    CheckpointStore,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
    create_backend,
)
from statecore.cli import main
from statecore.inspect import version_stats


def _write(root, kind="python"):
    b = create_backend(kind, key_type="string")
    v = b.get_state(ValueStateDescriptor("count", "int64"))
    lst = b.get_state(ListStateDescriptor("seen", "string"))
    m = b.get_state(MapStateDescriptor("attrs", "string", "pickle"))
    for i, k in enumerate(["N1", "N2", "N3"]):
        b.set_current_key(k)
        v.update(i + 10)
        lst.add_all([k.lower(), "x"])
        m.put("k", {"i": i})
        b.timers.register_event_time_timer(1000 + i)
    b.set_current_key("N1")
    b.timers.register_processing_time_timer(7)
    store = CheckpointStore(root)
    store.commit(1, [store.write_snapshot(b.snapshot(), 1)])
    return store


@pytest.mark.parametrize("kind", ["python", "native"])
def test_inspect_summary_entries_and_parquet(tmp_path, capsys, kind):
    if kind == "native":
        pytest.importorskip("statecore._native")
    root = str(tmp_path / "ops" / "op1")
    _write(root, kind)
    assert main(["inspect", str(tmp_path), "--entries", "20"]) == 0
    out = capsys.readouterr().out
    assert "retained           version 1\n" in out
    # Entries as stored: one per list chunk (three lists of two elements), one per map entry.
    for name, n in [("count", 3), ("seen", 3), ("attrs", 3), ("__timers__", 4)]:
        assert any(line.split()[:3] == ["state", name, str(n)]
                   for line in out.splitlines()), (name, out)
    assert "key='N2'" in out and "value=11" in out and 'value="n2"' in out
    # Format 6 runs carry Bloom filters (docs/formats.md "Filters and block keys").
    assert "Bloom filters" in out and "in 1 of 1 run(s) (10 bits per key)" in out, out
    stats = version_stats(root)
    assert stats["filters"]["runs"] == 1 and stats["filters"]["bytes"] == sum(
        st["filter_bytes"] for st in stats["states"]) > 0

    pq_path = str(tmp_path / "e.parquet")
    assert main(["inspect", root, "--parquet", pq_path]) == 0
    t = pq.read_table(pq_path).to_pylist()
    counts = {(r["state"], r["key"]): r["value"] for r in t}
    assert counts[("count", "N3")] == "12"
    assert counts[("attrs", "N1")] == '{"i": 0}'
    attrs = [r for r in t if r["state"] == "attrs" and r["key"] == "N1"]
    assert [r["user_key"] for r in attrs] == ['"k"']  # one row per map entry
    seen = [r for r in t if r["state"] == "seen" and r["key"] == "N2"]
    # One row per list element, its position in the list as user_key, in list order.
    assert [(r["user_key"], r["value"]) for r in seen] == [("0", '"n2"'), ("1", '"x"')]
    assert all(r["user_key"] is None for r in t if r["state"] not in ("attrs", "seen"))
    assert sorted(r["value"] for r in t if r["state"] == "__timers__") == [
        "1000", "1001", "1002", '{"processing_time": 7}']


def test_inspect_verify_reports_corruption(tmp_path, capsys):
    root = str(tmp_path / "c")
    _write(root)
    data = [os.path.join(r, f) for r, _, fs in os.walk(root) for f in fs if f.endswith(".sckp")][0]
    raw = bytearray(open(data, "rb").read())
    raw[20] ^= 0xFF
    open(data, "wb").write(bytes(raw))
    assert main(["inspect", root, "--verify"]) == 1
    assert data.split(os.sep)[-1] in capsys.readouterr().err


def test_inspect_missing_checkpoint(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nope")]) == 1
    assert "no checkpoint" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path)]) == 1


@pytest.mark.parametrize("kind", ["python", "native"])
def test_inspect_and_restore_of_the_fixed_width_value_types(tmp_path, capsys, kind):
    """uint64, timestamp[unit] and fixed_size_binary[N] states: the checkpoint records the
    type names, `statecore inspect` shows them and the values (timestamps as their ints, bytes
    as repr), a restore through the store gives the values back to either backend, and a
    descriptor of another unit or width is a StateMigrationError."""
    import pyarrow as pa

    from statecore import ReducingStateDescriptor
    from statecore.errors import StateMigrationError

    if kind == "native":
        pytest.importorskip("statecore._native")
    descs = [ValueStateDescriptor("u", "uint64"), ValueStateDescriptor("t", pa.timestamp("ns")),
             ListStateDescriptor("f", pa.binary(3)),
             ReducingStateDescriptor("mx", "max", "timestamp[s]")]
    b = create_backend(kind, key_type="string")
    u, t, f, mx = (b.get_state(d) for d in descs)
    b.set_current_key("N1")
    u.update(2**64 - 1)
    t.update(-(2**63))
    f.add_all([b"abc", b"\xff\x00\x01"])
    mx.add(2**63 - 1)
    root = str(tmp_path / "vt")
    store = CheckpointStore(root)
    store.commit(1, [store.write_snapshot(b.snapshot(), 1)])
    assert main(["inspect", root, "--entries", "10"]) == 0
    out = capsys.readouterr().out
    for name, vt, n in [("u", "uint64", 1), ("t", "timestamp[ns]", 1),
                        ("f", "fixed_size_binary[3]", 1), ("mx", "timestamp[s]", 1)]:  # a chunk
        assert any(line.split()[:3] == ["state", name, str(n)] and f"value_type={vt}" in line
                   for line in out.splitlines()), (name, out)
    assert "value=18446744073709551615" in out and "value=-9223372036854775808" in out
    assert "value=\"b'abc'\"" in out and "value=\"b'\\\\xff\\\\x00\\\\x01'\"" in out
    for other in ("python", "native"):
        dst = create_backend(other, key_type="string")
        store.restore(dst, 1)
        du, dt, df, dmx = (dst.get_state(d) for d in descs)
        dst.set_current_key("N1")
        assert (du.value(), dt.value(), df.get(), dmx.get()) == \
            (2**64 - 1, -(2**63), [b"abc", b"\xff\x00\x01"], 2**63 - 1)
        wrong = create_backend(other, key_type="string")
        store.restore(wrong, 1)
        for d in (ValueStateDescriptor("t", "timestamp[us]"),
                  ListStateDescriptor("f", pa.binary(4)),
                  ValueStateDescriptor("u", "int64"),
                  ReducingStateDescriptor("mx", "max", "timestamp[ms]")):
            with pytest.raises(StateMigrationError):
                wrong.get_state(d)


@pytest.mark.parametrize("kind", ["python", "native"])
def test_inspect_counts_live_entries_of_an_incremental_chain(tmp_path, capsys, kind):
    """1,000 keys, each updated in 6 runs (a full one and 5 incremental), 10 removed in the
    last: the version holds 990 live entries; its runs store 6,000 entries, 10 tombstones."""
    if kind == "native":
        pytest.importorskip("statecore._native")
    import json

    root = str(tmp_path / "chain")
    b = create_backend(kind, key_type="int64")
    v = b.get_state(ValueStateDescriptor("count", "int64"))
    store = CheckpointStore(root)
    for version in range(6):
        for k in range(1000):
            b.set_current_key(k)
            v.update(version)
        if version == 5:
            for k in range(10):
                b.set_current_key(k)
                v.clear()
        desc = store.write_snapshot(b.snapshot(incremental=version > 0), version)
        store.commit(version, [desc])
        b.notify_checkpoint_complete(desc["snapshot_id"], version)
    assert main(["inspect", root]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.split()[:2] == ["state", "count"])
    assert line.split()[2:5] == ["990", "live", "entries"], line
    assert "(6,000 stored, 10 tombstones" in line, line

    assert main(["inspect", root, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (stats,) = doc["roots"]
    assert [w["version"] for w in stats["versions"]] == store.versions()
    assert all(w["created_ms"] > 0 and w["commit_id"] for w in stats["versions"])
    (count,) = [s for s in stats["states"] if s["name"] == "count"]
    assert (count["live_entries"], count["stored_entries"], count["tombstones"]) == (990, 6000, 10)
    groups = count["key_groups"]
    assert [g["key_group"] for g in groups] == sorted(g["key_group"] for g in groups)
    assert sum(g["live_entries"] for g in groups) == 990
    assert sum(g["bytes"] for g in groups) == count["bytes"] > 0
    assert all(g["runs"] == 6 and g["stored_entries"] >= g["live_entries"] for g in groups)
    # The per-key-group live counts are what a restore of that key group loads.
    with store.open() as reader:
        for g in groups[:5]:
            assert len(reader.entries("count", g["key_group"])[0]) == g["live_entries"]


def test_inspect_json_refuses_entries_and_parquet(tmp_path, capsys):
    root = str(tmp_path / "j")
    _write(root)
    assert main(["inspect", root, "--json", "--entries", "3"]) == 2
    assert "--json cannot be combined" in capsys.readouterr().err


def test_inspect_shows_the_bytes_each_task_restored(tmp_path, capsys):
    """The Spark operator records the bytes each task's restore read (metadata
    ``restore_bytes``, one per partition); the summary shows them."""
    root = str(tmp_path / "r")
    b = create_backend("python", key_type="string")
    b.get_state(ValueStateDescriptor("count", "int64"))
    store = CheckpointStore(root)
    store.commit(4, [store.write_snapshot(b.snapshot(), 4)],
                 metadata={"restore_bytes": [2048, 0, 3 * 1024 * 1024]})
    assert main(["inspect", root]) == 0
    out = capsys.readouterr().out
    assert "restore reads      3.0 MiB by 3 task(s)" in out
    assert "p0 2.0 KiB, p1 0 B, p2 3.0 MiB" in out
