"""Map state in checkpoint files: format 3 stores one entry per user key (docs/formats.md "Map
state"); a format 2 (or 1) file holds one whole-map value per (key, namespace), which readers
convert to entries as they read a full run and refuse in an incremental run. Per-entry changes
through incremental checkpoints, compaction, verify and a rescaling restore."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from statecore import serializers as S
from statecore.backends.python import PythonBackend
from statecore.checkpoint import format as fmt
from statecore.descriptors import MapStateDescriptor
from statecore.errors import CorruptCheckpointError, InvalidInputError, StateMigrationError
from statecore.key_groups import spark_key_group
from support.data_files import (
    ReaderSnapshot,
    RowsSnapshot,
    data_file_of_format,
)

MAXP = 128
BACKENDS = ["python", "native"]
META = {"name": "m", "kind": "map", "namespace_type": "void", "value_type": "int64",
        "user_key_type": "string"}


def _prefix(key: int) -> tuple[int, bytes]:
    kg = PythonBackend(key_type="int64", max_parallelism=MAXP).key_group_of(key)
    return kg, S.encode_key(kg, MAXP, key, "int64", None, "void")


def _whole_maps(ttl: bool = False):
    uk = S.key_serializer("string").serialize
    v = S.value_serializer("int64").serialize
    suffix = (lambda t: t.to_bytes(8, "big", signed=True)) if ttl else (lambda t: b"")
    rows, want = {}, {}
    for key, pairs in {1: {"b": 2, "a": 1}, 2: {"x": 9}}.items():
        kg, prefix = _prefix(key)
        blob = S.encode_map_serialized({uk(u): v(x) + suffix(5) for u, x in pairs.items()})
        rows.setdefault(kg, {})[prefix] = blob
        want[key] = sorted(pairs.items(), key=lambda p: uk(p[0]))
    return rows, want


@pytest.mark.parametrize("kind", BACKENDS)
def test_format_2_whole_maps_are_read_as_entries_and_restore(kind):
    if kind == "native":
        pytest.importorskip("statecore._native")
    from statecore import create_backend

    rows, want = _whole_maps()
    r = fmt.DataFileReader(pa.BufferReader(data_file_of_format(
        RowsSnapshot(rows, META, MAXP), 2)), "old.sckp")
    assert r.format_version == 2
    kg, prefix = _prefix(1)
    keys, vals = r.entries("m", kg)
    uk = S.key_serializer("string").serialize
    v = S.value_serializer("int64").serialize
    by_key = dict(zip(keys.to_pylist(), vals.to_pylist()))
    assert by_key[prefix + uk("a")] == v(1) and by_key[prefix + uk("b")] == v(2)
    assert keys.to_pylist() == sorted(keys.to_pylist())
    assert len(r.stored_entries("m", kg)[0]) == len(rows[kg])  # as stored: whole maps
    b = create_backend(kind, key_type="int64", max_parallelism=MAXP)
    b.restore(ReaderSnapshot(r, MAXP))
    m = b.get_state(MapStateDescriptor("m", "string", "int64"))
    for key, pairs in want.items():
        b.set_current_key(key)
        assert m.items() == pairs and m.size() == len(pairs)
    assert b.num_entries() == 3


def test_format_2_ttl_whole_maps_keep_each_timestamp():
    rows, _ = _whole_maps(ttl=True)
    r = fmt.DataFileReader(pa.BufferReader(data_file_of_format(
        RowsSnapshot(rows, META, MAXP), 2)), "old.sckp")
    kg, _ = _prefix(1)
    _, vals = r.entries("m", kg)
    assert all(x[-8:] == (5).to_bytes(8, "big") for x in vals.to_pylist())


def test_format_2_incremental_whole_maps_are_refused():
    rows, _ = _whole_maps()
    r = fmt.DataFileReader(pa.BufferReader(data_file_of_format(
        RowsSnapshot(rows, META, MAXP, incremental=True), 2)), "old.sckp")
    kg, _ = _prefix(1)
    with pytest.raises(StateMigrationError, match="whole-map layout"):
        r.entries("m", kg)


def test_format_2_broken_whole_map_is_corrupt():
    kg, prefix = _prefix(1)
    r = fmt.DataFileReader(pa.BufferReader(data_file_of_format(
        RowsSnapshot({kg: {prefix: b"\x05ab"}}, META, MAXP), 2)), "old.sckp")
    with pytest.raises(CorruptCheckpointError, match="malformed whole-map value"):
        r.entries("m", kg)


def test_current_format_files_are_written_and_read_as_stored():
    kg, prefix = _prefix(1)
    entry = prefix + S.key_serializer("string").serialize("a")

    class Out:
        parts: list = []

        def write(self, b):
            self.parts.append(bytes(b))

    out = Out()
    out.parts = []
    fmt.write_data_file(out, RowsSnapshot({kg: {entry: b"\x01" * 8}}, META, MAXP),
                        version=1, writer="p0")
    r = fmt.DataFileReader(pa.BufferReader(b"".join(out.parts)), "new.sckp")
    assert r.format_version == fmt.FORMAT_VERSION == 6 and fmt.MAP_ENTRIES_FORMAT_VERSION == 3
    assert r.entries("m", kg)[0].to_pylist() == [entry]


def test_split_map_entry_key_and_prefix_size():
    kg, prefix = _prefix(7)
    ukb = S.key_serializer("int64").serialize(-3)
    assert S.encoded_prefix_size(prefix + ukb, MAXP, "int64", "void") == len(prefix)
    assert S.split_map_entry_key(prefix + ukb, MAXP, "int64", "void", "int64") == (
        kg, 7, None, ukb)
    ab = S.encode_key(3, MAXP, "k", "string", "ns", "string")
    assert S.encoded_prefix_size(ab + b"\x02z", MAXP, "string", "string") == len(ab)
    with pytest.raises(InvalidInputError, match="no user key"):
        S.split_map_entry_key(prefix, MAXP, "int64", "void", "int64")
    with pytest.raises(InvalidInputError):
        S.split_map_entry_key(prefix + b"\x01", MAXP, "int64", "void", "int64")


@pytest.mark.parametrize("kind", BACKENDS)
def test_map_entries_through_incremental_checkpoints_compaction_and_rescale(kind, tmp_path):
    """Per-entry changes of a big map go through the store: the incremental run holds the
    changed and removed user keys only, compaction merges newest-wins per entry (a removed user
    key's tombstone wins), verify passes, and a restore into two halves of the key groups
    (rescale) splits the maps by key group, every map whole in one of them."""
    if kind == "native":
        pytest.importorskip("statecore._native")
    from statecore import CheckpointStore, create_backend

    b = create_backend(kind, key_type="int64", max_parallelism=MAXP)
    d = MapStateDescriptor("m", "int64", "string")
    m = b.get_state(d)
    for key in range(20):
        b.set_current_key(key)
        m.put_all({u: f"{key}/{u}" for u in range(300)})
    store = CheckpointStore(str(tmp_path))
    store.checkpoint(b, 1)
    b.set_current_key(3)
    m.put(7, "changed")
    m.remove(8)
    man = store.checkpoint(b, 2)
    inc = [f for f in man["files"] if f["version"] == 2]
    assert [f["entries"]["m"] for f in inc] == [2]
    assert sum(f.get("tombstones", {}).get("m", 0) for f in inc) == 1
    store.compact(2, max_runs=1)
    store.verify(2)
    halves = []
    for lo, hi in ((0, 63), (64, MAXP - 1)):
        h = create_backend(kind, key_type="int64", max_parallelism=MAXP, key_group_range=(lo, hi))
        store.restore(h, 2)
        halves.append(h)
    got = {}
    for h in halves:
        assert h.num_entries() > 0  # both halves hold maps
        hm = h.get_state(d)
        for key in range(20):
            if spark_key_group(key, "int64", MAXP) in h.key_group_range:
                h.set_current_key(key)
                got[key] = dict(hm.items())
                assert hm.size() == len(got[key])
    assert sorted(got) == list(range(20))
    want3 = {u: f"3/{u}" for u in range(300) if u != 8}
    want3[7] = "changed"
    assert got[3] == want3
    assert all(got[k] == {u: f"{k}/{u}" for u in range(300)} for k in got if k != 3)


# User keys a writer could not have serialized: (user key type, bytes after the prefix, reason).
_UNDECODABLE_USER_KEYS = [
    ("int64", b"\x01\x02", "int64"),                  # 2 bytes of an 8-byte key
    ("int64", b"\x00" * 9, "int64"),                  # one byte too many
    ("string", b"\x03\xff\xfe", "UTF-8"),             # varlen ok, bytes not UTF-8
    ("string", b"\x05ab", "string"),                  # shorter than its varlen says
    ("string", b"\x80", "string|varlen"),             # varlen cut off
    ("string", b"\x00", "string"),                    # length 0: a null string
    ("bool", b"\x02", "bool"),                        # neither 00 nor 01
]


def _forged_run_store(tmp_path, user_key_type: str, bad: bytes):
    """A committed checkpoint whose run holds two good entries and one whose user key is
    ``bad``, written as a writer would (checksums and all)."""
    from statecore.checkpoint import CheckpointStore

    good = S.key_serializer(user_key_type).serialize(
        {"int64": 5, "string": "ok", "bool": True}[user_key_type])
    kg, prefix = _prefix(1)
    kg2, prefix2 = _prefix(2)
    rows = {kg: {prefix + good: b"\x01" * 8, prefix + bad: b"\x02" * 8}}
    rows.setdefault(kg2, {})[prefix2 + good] = b"\x03" * 8
    snap = RowsSnapshot(rows, META, MAXP)
    snap.state_metas = lambda: [dict(META, user_key_type=user_key_type)]
    store = CheckpointStore(str(tmp_path))
    store.commit(1, [store.write_snapshot(snap, 1, "p0")])
    return store, kg


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("uk_type,bad,reason", _UNDECODABLE_USER_KEYS)
def test_restore_refuses_an_undecodable_user_key(kind, uk_type, bad, reason, tmp_path):
    """Both backends decode every restored map entry's user key: one the user key type cannot
    hold is refused naming the state, the key group and why, before anything is loaded; the
    backend stays usable and empty (the python restore decodes it, the native one checks the
    bytes, key_codec.h serialized_key_problem)."""
    if kind == "native":
        pytest.importorskip("statecore._native")
    from statecore import create_backend

    store, kg = _forged_run_store(tmp_path, uk_type, bad)
    b = create_backend(kind, key_type="int64", max_parallelism=MAXP)
    with pytest.raises(InvalidInputError) as ei:
        store.restore(b)
    msg = str(ei.value)
    assert "state 'm'" in msg and f"key group {kg}" in msg and re.search(reason, msg), msg
    assert b.num_entries() == 0
    # The same entries one key group at a time (a reader without entries_chunks).
    b2 = create_backend(kind, key_type="int64", max_parallelism=MAXP)
    with store.open(1) as r, pytest.raises(InvalidInputError) as ei:
        b2.restore(ReaderSnapshot(r, MAXP))
    msg = str(ei.value)
    assert "state 'm'" in msg and f"key group {kg}" in msg and re.search(reason, msg), msg
    assert b2.num_entries() == 0
