"""Block codecs of checkpoint data files (docs/formats.md "Block"): a store's ``compression``
("lz4.block", the default, or "none") decides how the runs it writes store their blocks; every
reader (native and Python decoders, restores, lookups, compaction inputs) reads either, runs of
both mix in one chain, and a file whose blocks disagree with its meta is refused."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

import statecore
from statecore import MapStateDescriptor, ValueStateDescriptor
from statecore.checkpoint import CheckpointStore
from statecore.checkpoint import format as fmt
from statecore.errors import CorruptCheckpointError, InvalidInputError

_native = pytest.importorskip("statecore._native")

_KEYS = 400


def _states(b):
    return (b.get_state(ValueStateDescriptor("v", "string")),
            b.get_state(MapStateDescriptor("m", "string", "int64")))


def _apply(b, rnd: random.Random, ops: int) -> None:
    """``ops`` random puts and removals on the value and map states of ``b``."""
    v, m = _states(b)
    for _ in range(ops):
        b.set_current_key(rnd.randrange(_KEYS))
        r = rnd.random()
        if r < 0.5:
            v.update(f"value-{rnd.randrange(10**6)}" * rnd.randrange(1, 4))
        elif r < 0.6:
            v.clear()
        elif r < 0.9:
            m.put(f"u{rnd.randrange(20)}", rnd.randrange(100))
        else:
            m.remove(f"u{rnd.randrange(20)}")


def _dump(b) -> dict:
    v, m = _states(b)
    out = {}
    for k in range(_KEYS):
        b.set_current_key(k)
        out[k] = (v.value(), sorted(m.items()))
    return out


def _metas(store, version):
    with store.open(version) as reader:
        files = reader.manifest["files"]
        return [reader.data_file(f) for f in files], files


@pytest.mark.parametrize("asynchronous", [False, True])
def test_uncompressed_runs_restore_like_lz4_ones(tmp_path, asynchronous):
    """The same snapshots written by an LZ4 store and an uncompressed one: the blocks of the
    latter hold their payloads (stored = raw bytes, codec 1 in every block table record, meta
    compression "none"), the synchronous and asynchronous writers give identical bytes, and
    native and Python backends restore the same state from both, a full run and incremental
    ones."""
    rnd = random.Random(5)
    b = statecore.create_backend("native", key_type="int64", max_parallelism=16)
    stores = {c: CheckpointStore(tmp_path / c.replace(".", "_"), compression=c)
              for c in fmt.CODECS}
    for version in (1, 2, 3):
        _apply(b, rnd, 600)
        for store in stores.values():
            snap = b.snapshot(incremental=version > 1)
            if asynchronous:
                d = store.write_snapshot_async(snap, version, "p0", block_target_bytes=512,
                                               release_snapshot=False).result(timeout=60)
            else:
                d = store.write_snapshot(snap, version, "p0", block_target_bytes=512)
            snap.release()
            store.commit(version, [d])
        b.notify_checkpoint_complete(version, version)
    want = _dump(b)
    for c, store in stores.items():
        assert store.compression == c
        datas, files = _metas(store, 3)
        assert len(files) == 3  # the full run and two incremental ones
        for data, f in zip(datas, files):
            assert data.meta["compression"] == c
            rows = data.block_rows(0, f["blocks"])
            assert set(rows["codec"].tolist()) == {fmt.CODECS[c]}
            if c == "none":
                assert rows["stored_length"].tolist() == rows["raw_length"].tolist()
        for kind in ("native", "python"):
            r = statecore.create_backend(kind, key_type="int64", max_parallelism=16)
            store.restore(r, 3)
            assert _dump(r) == want, (c, kind)
            r.dispose()
    # Stored bytes: the uncompressed files hold their payloads, the LZ4 ones less.
    sizes = {c: sum(f["stored_bytes"] for v in (1, 2, 3) for f in store.manifest(v)["files"])
             for c, store in stores.items()}
    raws = {c: sum(f["raw_bytes"] for v in (1, 2, 3) for f in store.manifest(v)["files"])
            for c, store in stores.items()}
    assert raws["none"] == raws["lz4.block"] == sizes["none"] > sizes["lz4.block"]
    # The synchronous writer gives the asynchronous one's bytes (the same version and writer,
    # another root).
    snap = b.snapshot(incremental=False)
    sync_store = CheckpointStore(tmp_path / "sync", compression="none")
    async_store = CheckpointStore(tmp_path / "async", compression="none")
    d1 = sync_store.write_snapshot(snap, 9, "p0", block_target_bytes=512)
    d2 = async_store.write_snapshot_async(snap, 9, "p0", block_target_bytes=512,
                                          release_snapshot=False).result(timeout=60)
    snap.release()
    assert ((tmp_path / "sync" / d1["path"]).read_bytes()
            == (tmp_path / "async" / d2["path"]).read_bytes())
    for s in (*stores.values(), sync_store, async_store):
        s.close()
    b.dispose()


def test_block_table_holds_the_codec_and_python_decodes_it(tmp_path, monkeypatch):
    """Every block table record of an uncompressed file holds codec 1 and stored = raw length;
    the Python decoder (no native one) reads the file as the native one does."""
    rnd = random.Random(7)
    b = statecore.create_backend("native", key_type="int64", max_parallelism=8)
    _apply(b, rnd, 800)
    store = CheckpointStore(tmp_path, compression="none")
    store.commit(1, [store.write_snapshot(b.snapshot(), 1, "p0", block_target_bytes=256)])
    path = tmp_path / store.manifest(1)["files"][0]["path"]
    reader = fmt.DataFileReader(pa.BufferReader(path.read_bytes()), "f")
    rows = reader.block_rows(0, store.manifest(1)["files"][0]["blocks"])
    assert len(rows) > 4 and bool(np.all(rows["codec"] == fmt.CODEC_NONE))
    assert bool(np.all(rows["stored_length"] == rows["raw_length"]))
    native = {(name, kg): [x.to_pylist() for x in reader.entries(name, kg)]
              for name in reader.state_names for kg in range(8)}
    monkeypatch.setattr(fmt, "native_decode_blocks", None)
    python = {(name, kg): [x.to_pylist() for x in reader.entries(name, kg)]
              for name in reader.state_names for kg in range(8)}
    assert native == python and sum(len(k) for k, _ in native.values()) > 0
    _, per_kg = reader.raw_bytes("v", 0, 7)
    assert reader.verify_blocks(0, 7) == int(per_kg.sum()) + int(
        reader.raw_bytes("m", 0, 7)[1].sum())
    monkeypatch.setattr(fmt, "native_verify_blocks", None)
    assert reader.verify_blocks(0, 7) == int(per_kg.sum()) + int(
        reader.raw_bytes("m", 0, 7)[1].sum())
    b.dispose()


def test_a_chain_of_both_codecs_compacts_and_restores(tmp_path):
    """An LZ4 full run under uncompressed incremental runs (two store objects on one root, as
    after changing a job's setting): restores read the mixed chain, and a compaction by the
    uncompressed store writes an uncompressed run of the same state."""
    rnd = random.Random(3)
    b = statecore.create_backend("native", key_type="int64", max_parallelism=8)
    lz4_store = CheckpointStore(tmp_path, max_runs=None)
    plain = CheckpointStore(tmp_path, max_runs=None, compression="none")
    _apply(b, rnd, 800)
    lz4_store.checkpoint(b, 1, incremental=False)
    for version in (2, 3, 4):
        _apply(b, rnd, 300)
        plain.checkpoint(b, version)
    want = _dump(b)
    got = statecore.create_backend("native", key_type="int64", max_parallelism=8)
    lz4_store.restore(got, 4)
    assert _dump(got) == want
    plain.compact(4, max_runs=1)
    datas, files = _metas(plain, 4)
    assert len(files) == 1 and datas[0].meta["compression"] == "none"
    again = statecore.create_backend("python", key_type="int64", max_parallelism=8)
    lz4_store.restore(again, 4)
    assert _dump(again) == want
    for x in (b, got, again):
        x.dispose()


def test_blocks_disagreeing_with_the_meta_are_refused(tmp_path, monkeypatch):
    """A file whose meta says "none" but whose block table records say LZ4 (a writer that was
    wrong; the footer's checksum matches) is refused when opened, naming the block."""
    b = statecore.create_backend("native", key_type="int64", max_parallelism=8)
    _apply(b, random.Random(1), 200)
    store = CheckpointStore(tmp_path, compression="none")
    monkeypatch.setitem(fmt.CODECS, "none", fmt.CODEC_LZ4)
    d = store.write_snapshot(b.snapshot(), 1, "p0")
    monkeypatch.undo()
    store.commit(1, [d])
    with pytest.raises(CorruptCheckpointError,
                       match=r"block 0 has codec 0, the file's compression 'none' is codec 1"):
        store.restore(statecore.create_backend("native", key_type="int64", max_parallelism=8), 1)
    b.dispose()


@pytest.mark.parametrize("bad", ["zstd", "LZ4.block", "", None, 1, b"none"])
def test_unknown_compression_is_invalid_input(tmp_path, bad):
    with pytest.raises(InvalidInputError, match="compression must be one of"):
        CheckpointStore(tmp_path, compression=bad)
    b = statecore.create_backend("native", key_type="int64")
    with pytest.raises(InvalidInputError, match="compression must be one of"):
        fmt.write_data_file(pa.BufferOutputStream(), b.snapshot(), version=1, writer="p0",
                            compression=bad)
    b.dispose()


def test_a_tiered_backend_over_an_uncompressed_store_spills_and_reads_it(tmp_path):
    """A tiered backend over an uncompressed store: its checkpoints and its spill runs are
    uncompressed, and a new tiered backend attached to them reads every value back."""
    store = CheckpointStore(tmp_path / "s", compression="none")
    b = statecore.create_backend("native", key_type="int64", memory_budget=4096,
                                 checkpoint=store, spill_dir=str(tmp_path / "spill"))
    v = b.get_state(ValueStateDescriptor("v", "int64"))
    keys = pa.array(range(5000), pa.int64())
    for i in range(0, 5000, 500):  # dirty entries beyond the budget: spills
        v.put_batch(keys.slice(i, 500), keys.slice(i, 500))
    assert b.tiered_statistics()["spills"] > 0
    spilled = list((tmp_path / "spill").rglob("spill-*.data"))
    assert spilled and all(
        fmt.DataFileReader(pa.BufferReader(p.read_bytes()), p.name).meta["compression"] == "none"
        for p in spilled)
    store.checkpoint(b, 1)
    datas, _ = _metas(store, 1)
    assert {d.meta["compression"] for d in datas} == {"none"}
    b.dispose()
    c = statecore.create_backend("native", key_type="int64", memory_budget=4096,
                                 checkpoint=store)
    store.restore(c, 1)
    got = c.get_state(ValueStateDescriptor("v", "int64")).get_batch(keys)
    assert got.to_pylist() == list(range(5000))
    c.dispose()
