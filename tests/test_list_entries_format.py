"""List state in checkpoint files: format 5 stores a list as chunks of up to
``LIST_CHUNK_ELEMENTS`` elements (docs/formats.md "List state"); a format 4 file holds one entry
per element, a format 3 (or older) file one whole-list value per (key, namespace): readers
convert both to chunks as they read a full run and refuse them in an incremental run. Chunks of
any size are read. Per-chunk changes through incremental checkpoints, compaction, verify,
inspect and a rescaling restore."""

from __future__ import annotations

import pyarrow as pa
import pytest

from statecore import serializers as S
from statecore.backends.python import PythonBackend
from statecore.checkpoint import format as fmt
from statecore.checkpoint.verify import check_entries
from statecore.descriptors import ListStateDescriptor
from statecore.errors import CorruptCheckpointError, InvalidInputError, StateMigrationError
from statecore.key_groups import spark_key_group
from support.data_files import (
    ReaderSnapshot,
    RowsSnapshot,
    data_file_of_format,
)

MAXP = 128
BACKENDS = ["python", "native"]


def _meta(value_type: str, ttl: bool) -> dict:
    m = {"name": "l", "kind": "list", "namespace_type": "void", "value_type": value_type}
    if ttl:
        m["ttl"] = {"ttl_ms": 1000}
    return m


def _prefix(key: int) -> tuple[int, bytes]:
    kg = PythonBackend(key_type="int64", max_parallelism=MAXP).key_group_of(key)
    return kg, S.encode_key(kg, MAXP, key, "int64", None, "void")


_LISTS = {"string": {1: ["b", "", "a" * 200], 2: ["x"]}, "int64": {1: [3, -1, 7], 2: [9]}}


def _whole_lists(value_type: str, ttl: bool = False):
    ser = S.value_serializer(value_type)
    rows = {}
    for key, elements in _LISTS[value_type].items():
        kg, prefix = _prefix(key)
        parts = []
        for i, e in enumerate(elements):
            b = ser.serialize(e)
            parts.append((b"" if ser.fixed_width else S.write_varlen(len(b))) + b
                         + ((100 + i).to_bytes(8, "big") if ttl else b""))
        rows.setdefault(kg, {})[prefix] = b"".join(parts)
    return rows


def _chunk(value_type: str, elements: list) -> bytes:
    return S.encode_list(elements, S.value_serializer(value_type))


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("value_type", ["string", "int64"])
def test_format_3_whole_lists_are_read_as_chunks_and_restore(kind, value_type):
    if kind == "native":
        pytest.importorskip("statecore._native")
    from statecore import create_backend

    rows = _whole_lists(value_type)
    r = fmt.DataFileReader(pa.BufferReader(data_file_of_format(
        RowsSnapshot(rows, _meta(value_type, False), MAXP), 3)), "old.sckp")
    assert r.format_version == 3
    kg, prefix = _prefix(1)
    keys, vals = r.entries("l", kg)
    assert keys.to_pylist() == [prefix + (0).to_bytes(8, "big")]
    assert vals.to_pylist() == [_chunk(value_type, _LISTS[value_type][1])]
    assert len(r.stored_entries("l", kg)[0]) == len(rows[kg])  # as stored: whole lists
    b = create_backend(kind, key_type="int64", max_parallelism=MAXP)
    b.restore(ReaderSnapshot(r, MAXP))
    ls = b.get_state(ListStateDescriptor("l", value_type))
    for key, elements in _LISTS[value_type].items():
        b.set_current_key(key)
        assert ls.get() == elements
    b.set_current_key(1)
    ls.add(_LISTS[value_type][2][0])
    assert ls.get() == _LISTS[value_type][1] + _LISTS[value_type][2]
    assert b.num_entries() == 2


def test_format_3_whole_list_longer_than_a_chunk_is_split():
    k = S.LIST_CHUNK_ELEMENTS
    kg, prefix = _prefix(1)
    elements = list(range(k + 5))
    rows = {kg: {prefix: _chunk("int64", elements)}}
    r = fmt.DataFileReader(pa.BufferReader(data_file_of_format(
        RowsSnapshot(rows, _meta("int64", False), MAXP), 3)), "old.sckp")
    keys, vals = r.entries("l", kg)
    assert keys.to_pylist() == [prefix + i.to_bytes(8, "big") for i in range(2)]
    assert vals.to_pylist() == [_chunk("int64", elements[:k]), _chunk("int64", elements[k:])]


@pytest.mark.parametrize("value_type", ["string", "int64"])
def test_format_3_ttl_whole_lists_keep_each_timestamp(value_type):
    rows = _whole_lists(value_type, ttl=True)
    r = fmt.DataFileReader(pa.BufferReader(data_file_of_format(
        RowsSnapshot(rows, _meta(value_type, True), MAXP), 3)), "old.sckp")
    kg, prefix = _prefix(1)
    _, vals = r.entries("l", kg)
    # Shorter than a chunk: the whole list's bytes are its one chunk, timestamps included.
    assert vals.to_pylist() == [rows[kg][prefix]]


def _element_rows(value_type: str, lists: dict, ttl: bool = False) -> dict:
    """Format 4 rows: one entry ``prefix | seq`` -> ``ser(e) [| ts]`` per element."""
    ser = S.value_serializer(value_type)
    rows = {}
    for key, elements in lists.items():
        kg, prefix = _prefix(key)
        for i, e in enumerate(elements):
            rows.setdefault(kg, {})[prefix + (2 * i).to_bytes(8, "big")] = (
                ser.serialize(e) + ((100 + i).to_bytes(8, "big") if ttl else b""))
    return rows


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("value_type", ["string", "int64"])
def test_format_4_per_element_lists_are_read_as_chunks_and_restore(kind, value_type):
    if kind == "native":
        pytest.importorskip("statecore._native")
    from statecore import create_backend

    k = S.LIST_CHUNK_ELEMENTS
    ser = S.value_serializer(value_type)
    long = [ser.deserialize(ser.serialize(_LISTS[value_type][1][i % 3])) for i in range(k + 4)]
    lists = {1: long, 2: _LISTS[value_type][2]}
    r = fmt.DataFileReader(pa.BufferReader(data_file_of_format(
        RowsSnapshot(_element_rows(value_type, lists), _meta(value_type, False), MAXP), 4)),
        "old.sckp")
    assert r.format_version == 4
    kg, prefix = _prefix(1)
    keys, vals = r.entries("l", kg)
    assert keys.to_pylist() == [prefix + i.to_bytes(8, "big") for i in range(2)]
    assert vals.to_pylist() == [_chunk(value_type, long[:k]), _chunk(value_type, long[k:])]
    assert len(r.stored_entries("l", kg)[0]) == k + 4  # as stored: elements
    b = create_backend(kind, key_type="int64", max_parallelism=MAXP)
    b.restore(ReaderSnapshot(r, MAXP))
    ls = b.get_state(ListStateDescriptor("l", value_type))
    for key, elements in lists.items():
        b.set_current_key(key)
        assert ls.get() == elements
    b.set_current_key(1)
    ls.add(long[0])  # into the restored last chunk
    assert ls.get() == long + [long[0]] and b.num_entries() == 3


def test_format_4_ttl_elements_keep_each_timestamp():
    rows = _element_rows("string", {1: ["a", "bc"]}, ttl=True)
    r = fmt.DataFileReader(pa.BufferReader(data_file_of_format(
        RowsSnapshot(rows, _meta("string", True), MAXP), 4)), "old.sckp")
    kg, _ = _prefix(1)
    _, vals = r.entries("l", kg)
    assert vals.to_pylist() == [b"\x01a" + (100).to_bytes(8, "big") + b"\x02bc"
                                + (101).to_bytes(8, "big")]


def test_format_4_incremental_elements_are_refused():
    rows = _element_rows("string", {1: ["a", "b"]})
    r = fmt.DataFileReader(pa.BufferReader(data_file_of_format(
        RowsSnapshot(rows, _meta("string", False), MAXP, incremental=True), 4)), "old.sckp")
    kg, _ = _prefix(1)
    with pytest.raises(StateMigrationError, match="per-element layout of format version 4"):
        r.entries("l", kg)


@pytest.mark.parametrize("kind", BACKENDS)
def test_chunks_of_any_size_are_read_and_appended_to(kind):
    """A reader takes chunks of any number of elements (another bound than this writer's): an
    append fills a last chunk below the bound and starts a new one after a longer one."""
    if kind == "native":
        pytest.importorskip("statecore._native")
    from statecore import create_backend

    k = S.LIST_CHUNK_ELEMENTS
    kg1, p1 = _prefix(1)
    kg2, p2 = _prefix(2)
    rows = {}
    rows.setdefault(kg1, {}).update({p1 + (0).to_bytes(8, "big"): _chunk("int64", range(k + 8)),
                                     p1 + (1).to_bytes(8, "big"): _chunk("int64", [-1, -2])})
    rows.setdefault(kg2, {})[p2 + (0).to_bytes(8, "big")] = _chunk("int64", range(2 * k))
    snap = RowsSnapshot(rows, _meta("int64", False), MAXP)
    r = fmt.DataFileReader(pa.BufferReader(data_file_of_format(snap, fmt.FORMAT_VERSION)),
                           "f.sckp")
    b = create_backend(kind, key_type="int64", max_parallelism=MAXP)
    b.restore(ReaderSnapshot(r, MAXP))
    ls = b.get_state(ListStateDescriptor("l", "int64"))
    b.set_current_key(1)
    ls.add(5)
    assert ls.get() == list(range(k + 8)) + [-1, -2, 5]
    b.set_current_key(2)
    ls.add(5)
    assert ls.get() == list(range(2 * k)) + [5]
    out = b.snapshot()
    try:
        got = dict(zip(*(a.to_pylist() for a in out.entries("l", kg1))))
        got.update(zip(*(a.to_pylist() for a in out.entries("l", kg2))))
    finally:
        out.release()
    assert got[p1 + (1).to_bytes(8, "big")] == _chunk("int64", [-1, -2, 5])
    assert got[p2 + (1).to_bytes(8, "big")] == _chunk("int64", [5])
    assert len(got) == 4


def test_format_3_incremental_whole_lists_are_refused():
    rows = _whole_lists("string")
    r = fmt.DataFileReader(pa.BufferReader(data_file_of_format(
        RowsSnapshot(rows, _meta("string", False), MAXP, incremental=True), 3)), "old.sckp")
    kg, _ = _prefix(1)
    with pytest.raises(StateMigrationError, match="whole-list layout"):
        r.entries("l", kg)


def test_format_3_broken_whole_list_is_corrupt():
    kg, prefix = _prefix(1)
    r = fmt.DataFileReader(pa.BufferReader(data_file_of_format(
        RowsSnapshot({kg: {prefix: b"\x05ab"}}, _meta("string", False), MAXP), 3)), "old.sckp")
    with pytest.raises(CorruptCheckpointError, match="malformed whole-list value"):
        r.entries("l", kg)


def test_split_list_entry_key_and_verify_checks():
    kg, prefix = _prefix(7)
    seq = (5).to_bytes(8, "big")
    assert S.split_list_entry_key(prefix + seq, MAXP, "int64", "void") == (kg, 7, None, seq)
    with pytest.raises(InvalidInputError, match="sequence number"):
        S.split_list_entry_key(prefix + b"\x00", MAXP, "int64", "void")
    meta = _meta("int64", False)
    keys = pa.array([prefix + seq], pa.binary())
    vals = pa.array([b"\x00" * 8], pa.binary())
    check_entries("f", meta, kg, keys, vals, MAXP, "int64", False)
    with pytest.raises(CorruptCheckpointError):  # a whole list's key where elements belong
        check_entries("f", meta, kg, pa.array([prefix], pa.binary()), vals, MAXP, "int64",
                      False)
    check_entries("f", meta, kg, pa.array([prefix], pa.binary()), vals, MAXP, "int64", False,
                  list_entries=False)
    smeta = {"name": "s", "kind": "list", "namespace_type": "string", "value_type": "string"}
    sk = S.encode_key(kg, MAXP, 7, "int64", "ns", "string")
    check_entries("f", smeta, kg, pa.array([sk + seq], pa.binary()), vals, MAXP, "int64", False)
    with pytest.raises(CorruptCheckpointError):
        check_entries("f", smeta, kg, pa.array([sk + b"\x00\x01"], pa.binary()), vals, MAXP,
                      "int64", False)


@pytest.mark.parametrize("kind", BACKENDS)
def test_list_chunks_through_incremental_checkpoints_compaction_and_rescale(kind, tmp_path):
    """Per-chunk changes of big lists go through the store: the incremental run after one
    append holds the list's last chunk only, and after an ``update`` the rewritten chunk and
    one tombstone per chunk it dropped; compaction merges newest-wins per chunk, verify passes,
    inspect lists one row per element (its position as user key), and a restore into two
    halves of the key groups (rescale) splits the lists by key group, every list whole in one
    of them."""
    if kind == "native":
        pytest.importorskip("statecore._native")
    from statecore import CheckpointStore, create_backend
    from statecore.inspect import entries_table

    b = create_backend(kind, key_type="int64", max_parallelism=MAXP)
    d = ListStateDescriptor("l", "string")
    ls = b.get_state(d)
    for key in range(20):
        b.set_current_key(key)
        ls.add_all([f"{key}/{i}" for i in range(300)])
    store = CheckpointStore(str(tmp_path))
    store.checkpoint(b, 1)
    b.set_current_key(3)
    ls.add("appended")
    man = store.checkpoint(b, 2)
    inc = [f for f in man["files"] if f["version"] == 2]
    assert [f["entries"]["l"] for f in inc] == [1]
    b.set_current_key(4)
    ls.update(["u0", "u1"])
    man = store.checkpoint(b, 3)
    inc = [f for f in man["files"] if f["version"] == 3]
    chunks = -(-300 // S.LIST_CHUNK_ELEMENTS)
    assert [f["entries"]["l"] for f in inc] == [chunks]
    assert sum(f.get("tombstones", {}).get("l", 0) for f in inc) == chunks - 1
    store.compact(3, max_runs=1)
    store.verify(3)
    t = entries_table(str(tmp_path), 3)
    rows = [r for r in t.to_pylist() if r["state"] == "l" and r["key"] == 4]
    assert [(r["user_key"], r["value"]) for r in rows] == [("0", '"u0"'), ("1", '"u1"')]
    halves = []
    for lo, hi in ((0, 63), (64, MAXP - 1)):
        h = create_backend(kind, key_type="int64", max_parallelism=MAXP, key_group_range=(lo, hi))
        store.restore(h, 3)
        halves.append(h)
    got = {}
    for h in halves:
        assert h.num_entries() > 0  # both halves hold lists
        hl = h.get_state(d)
        for key in range(20):
            if spark_key_group(key, "int64", MAXP) in h.key_group_range:
                h.set_current_key(key)
                got[key] = hl.get()
    assert sorted(got) == list(range(20))
    assert got[3] == [f"3/{i}" for i in range(300)] + ["appended"]
    assert got[4] == ["u0", "u1"]
    assert all(got[k] == [f"{k}/{i}" for i in range(300)] for k in got if k not in (3, 4))
