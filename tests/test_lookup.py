"""Point lookups into checkpoint runs (statecore.checkpoint.lookup): differential against the
merged entries a full restore reads (CheckpointReader.entries), for value, map and TTL'd states
of both backends through chains of incremental checkpoints (tombstones shadow older runs), for
files of format 5 (no filters: every block of the (state, key group)) and the in-test snapshots
of both writers; corruption of a block, a filter or the footer (a corrupt block never cached);
the cache budgets; the native lookup steps against the pure-Python path; and absent keys, which
read no block except for the filter's false positives."""

from __future__ import annotations

import os
import random
import struct

import hypothesis
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import strategies as st

from statecore import (
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
    create_backend,
)
from statecore.checkpoint import CheckpointStore
from statecore.checkpoint import format as fmt
from statecore.checkpoint import lookup as lookup_module
from statecore.checkpoint.lookup import BlockCache, RunLookup
from statecore.errors import CorruptCheckpointError, InvalidInputError
from support.data_files import without_lookup_tables

KINDS = ["python", "native"]


def _states(b):
    v = b.get_state(ValueStateDescriptor("v", "int64"))
    m = b.get_state(MapStateDescriptor("m", "int64", "string"))
    t = ValueStateDescriptor("t", "int64")
    t.enable_time_to_live(StateTtlConfig(10**12))
    return v, m, b.get_state(t)


def _history(b, store, rng, versions=4, keys=3000):
    v, m, t = _states(b)
    for version in range(1, versions + 1):
        ks = pa.array(rng.sample(range(keys), keys // 3), pa.int64())
        v.put_batch(ks, pa.array([version * 10**6 + k for k in ks.to_pylist()], pa.int64()))
        t.put_batch(ks, ks)
        mk = pa.array(rng.sample(range(keys), 200), pa.int64())
        m.put_batch(mk, pa.array([k % 7 for k in mk.to_pylist()], pa.int64()),
                    pa.array([f"v{version}" for _ in range(len(mk))], pa.string()))
        if version > 1:
            gone = pa.array(rng.sample(range(keys), keys // 10), pa.int64())
            v.clear_batch(gone)
            t.clear_batch(gone)
            m.remove_batch(gone, pa.array([k % 7 for k in gone.to_pylist()], pa.int64()))
        store.checkpoint(b, version)


def _all_entries(reader, state):
    out = {}
    r = reader.key_group_range
    for kg in range(r.start, r.end + 1):
        k, val = reader.entries(state, kg)
        out.update(zip(k.to_pylist(), val.to_pylist()))
    return out


def _absent_keys(present, mp, n, rng):
    prefix = fmt.key_group_prefix_bytes(mp)
    sample = rng.sample(sorted(present), min(n, len(present)))
    out = []
    for k in sample:  # same key group and layout, a key never written
        cand = k[:prefix] + bytes([0xEE]) + k[prefix + 1:]
        if cand not in present:
            out.append(cand)
    return out


def _shuffled_asks(present, inc, n_absent, rng, extra=()):
    """Every key of ``present``, ``n_absent`` keys never written (``_absent_keys``), the keys
    the incremental run ``inc`` wrote to state "a" and ``extra``, shuffled by ``rng``."""
    ask = list(present) + _absent_keys(present, MAXP, n_absent, rng)
    ask += [k for kv in inc["a"].values() for k in kv]
    ask += list(extra)
    rng.shuffle(ask)
    return ask


@pytest.mark.parametrize("kind", KINDS)
def test_lookups_equal_the_merged_runs_of_incremental_chains(tmp_path, kind):
    rng = random.Random(3)
    store = CheckpointStore(str(tmp_path / "ckpt"), max_runs=None)
    b = create_backend(kind, key_type="int64", max_parallelism=128)
    _history(b, store, rng)
    for version in (2, 4):
        with store.open(version) as reader, RunLookup(reader, cache_bytes=1 << 20) as lk:
            for state in ("v", "m", "t"):
                present = _all_entries(reader, state)
                assert present
                # Keys removed in some version are in the newer runs as tombstones.
                absent = _absent_keys(present, 128, 300, rng)
                ask = list(present) + absent
                rng.shuffle(ask)
                got = lk.lookup_batch(state, pa.array(ask, pa.binary())).to_pylist()
                assert got == [present.get(k) for k in ask], (version, state)
            st = lk.statistics()
            assert st["blocks_read"] > 0 and st["cache_bytes"] <= 1 << 20


def test_lookups_in_runs_of_the_native_serializer(tmp_path):
    """Runs written by the native background serializer (its filters and block keys, small
    blocks), a full one and an incremental one on top, against the merged runs."""
    rng = random.Random(8)
    store = CheckpointStore(str(tmp_path / "ckpt"), max_runs=None)
    b = create_backend("native", key_type="int64", max_parallelism=256)
    v, m, t = _states(b)
    keys = pa.array(range(4000), pa.int64())
    v.put_batch(keys, keys)
    t.put_batch(keys, keys)
    m.put_batch(keys, pa.array([k % 5 for k in range(4000)], pa.int64()),
                pa.array([str(k) for k in range(4000)], pa.string()))
    for version, incremental in ((1, False), (2, True)):
        if incremental:
            gone = pa.array(rng.sample(range(4000), 500), pa.int64())
            v.clear_batch(gone)
            m.remove_batch(gone, pa.array([k % 5 for k in gone.to_pylist()], pa.int64()))
            v.put_batch(pa.array([9000, 9001], pa.int64()), pa.array([1, 2], pa.int64()))
        snap = b.snapshot(incremental=incremental)
        d = store.write_snapshot_async(snap, version, block_target_bytes=700,
                                       release_snapshot=True).result(timeout=60)
        store.commit(version, [d])
        b.notify_checkpoint_complete(snap.snapshot_id, version)
    assert [r["kind"] for r in store.describe(2)["run_list"]] == ["incremental", "full"]
    with store.open(1) as r1, store.open(2) as reader, RunLookup(reader) as lk:
        for state in ("v", "m", "t"):
            present = _all_entries(reader, state)
            ask = sorted(set(present) | set(_all_entries(r1, state)))
            ask += _absent_keys(present, 256, 200, rng)
            got = lk.lookup_batch(state, pa.array(ask, pa.binary())).to_pylist()
            assert got == [present.get(k) for k in ask], state


def test_tombstones_shadow_older_runs(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"), max_runs=None)
    b = create_backend("native", key_type="int64", max_parallelism=128)
    v = b.get_state(ValueStateDescriptor("v", "int64"))
    keys = pa.array(range(1000), pa.int64())
    v.put_batch(keys, keys)
    store.checkpoint(b, 1)
    v.clear_batch(pa.array(range(0, 1000, 2), pa.int64()))
    store.checkpoint(b, 2)
    assert [r["kind"] for r in store.describe(2)["run_list"]] != ["full"]
    with store.open(1) as r1, store.open(2) as r2:
        old = _all_entries(r1, "v")
        assert len(old) == 1000
        with RunLookup(r2) as lk:
            got = lk.lookup_batch("v", pa.array(sorted(old), pa.binary())).to_pylist()
        now = _all_entries(r2, "v")
        assert len(now) == 500
        assert got == [now.get(k) for k in sorted(old)]


MAXP = 128
METAS = [{"name": "a", "kind": "value", "namespace_type": "void", "value_type": "binary"},
         {"name": "b", "kind": "value", "namespace_type": "void", "value_type": "binary"}]


def ekey(kg: int, key: int) -> bytes:
    return bytes([kg]) + struct.pack(">q", key) + b"\x00"


class Snap:
    """Full or incremental StateSnapshot over ``data[name][kg] = {key: value or None}``."""

    def __init__(self, data, incremental=False, kg_range=(0, MAXP - 1), base_version=None):
        self.max_parallelism = MAXP
        self.base_version = base_version
        self.key_group_range = fmt.make_key_group_range(*kg_range)
        self.key_type = "int64"
        self.assigner = "spark"
        self.incremental = incremental
        self.data = data

    def state_metas(self):
        return [dict(m) for m in METAS]

    def entries(self, name, kg):
        items = sorted(self.data.get(name, {}).get(kg, {}).items())
        return (pa.array([k for k, _ in items], pa.binary()),
                pa.array([v for _, v in items], pa.binary()))

    def release(self):
        pass


def _random_data(rng, n_keys, kgs=range(0, MAXP, 3), tomb=0.0):
    data = {"a": {}, "b": {}}
    for _ in range(n_keys):
        kg = rng.choice(list(kgs))
        key = rng.randrange(10**6)
        name = rng.choice("ab")
        val = None if rng.random() < tomb else bytes(rng.randrange(256) for _ in range(9))
        data[name].setdefault(kg, {})[ekey(kg, key)] = val
    return data


def _write(store, version, snap, block_target=256, strip=False):
    """Write and commit ``snap``; ``strip``: as a format-5 file (no filters, no block keys)."""
    d = store.write_snapshot(snap, version, block_target_bytes=block_target)
    if strip:
        path = os.path.join(store.root, d["path"])
        with open(path, "rb") as f:
            raw = f.read()
        raw = without_lookup_tables(raw)
        from support.data_files import rewrite_footer_meta

        def edit(meta):
            meta.update(format_version=5)
            meta.pop("bloom_bits_per_key", None)

        raw, fsum = rewrite_footer_meta(raw, edit, trailer_version=5)
        with open(path, "wb") as f:
            f.write(raw)
        d = dict(d, size=len(raw), footer_xxh64=f"{fsum:016x}")
    store.commit(version, [d])


@pytest.mark.parametrize("strip", [False, True], ids=["format6", "format5"])
def test_chains_of_fake_snapshots_old_and_new_formats(tmp_path, strip):
    rng = random.Random(11)
    store = CheckpointStore(str(tmp_path / "ckpt"), max_runs=None)
    full = _random_data(rng, 3000)
    _write(store, 1, Snap(full), strip=strip)
    inc = _random_data(rng, 800, tomb=0.3)
    for name in "ab":  # tombstones of keys of the full run
        for kg, kv in full[name].items():
            for k in list(kv)[:3]:
                inc[name].setdefault(kg, {})[k] = None
    _write(store, 2, Snap(inc, incremental=True, base_version=1))
    with store.open(2) as reader, RunLookup(reader, cache_bytes=64 << 10) as lk:
        for name in "ab":
            present = _all_entries(reader, name)
            ask = sorted(set(list(present) + [k for kv in full[name].values() for k in kv]
                             + [k for kv in inc[name].values() for k in kv]))
            ask += _absent_keys(present, MAXP, 200, rng)
            got = lk.lookup_batch(name, pa.array(ask, pa.binary())).to_pylist()
            assert got == [present.get(k) for k in ask]
        assert lk.statistics()["cache_bytes"] <= 64 << 10


def _without_native_prefix_path(monkeypatch):
    """RunLookup's pure-Python path: blocks decoded into Arrow arrays, the runs merged with a
    dict."""
    for name in ("native_decode_blocks", "_RunBlocks", "_native_merge_newest_wins"):
        monkeypatch.setattr(lookup_module, name, None)


@pytest.mark.parametrize("strip,decode", [(False, True), (False, False), (True, True)],
                         ids=["format6", "format6-python-decode", "format5"])
def test_prefix_entries_equal_the_merged_runs_under_each_prefix(tmp_path, monkeypatch, strip,
                                                                 decode):
    """RunLookup.prefix_entries (the tiered mode's loads of whole lists and maps): every entry
    under a prefix, newest-wins over a full and an incremental run with tombstones, prefixes
    spanning many blocks (256-byte blocks), falling between blocks, or holding nothing; blocks
    opened natively or decoded in Python."""
    if not decode:
        _without_native_prefix_path(monkeypatch)
    rng = random.Random(5)
    store = CheckpointStore(str(tmp_path / "ckpt"), max_runs=None)
    full = _random_data(rng, 3000)
    _write(store, 1, Snap(full), strip=strip)
    inc = _random_data(rng, 800, tomb=0.3)
    for name in "ab":
        for kg, kv in full[name].items():
            for k in list(kv)[:3]:
                inc[name].setdefault(kg, {})[k] = None
    _write(store, 2, Snap(inc, incremental=True, base_version=1))
    with store.open(2) as reader, RunLookup(reader) as lk:
        for name in "ab":
            present = _all_entries(reader, name)
            # kg | the key's first 5, 6 or 7 bytes (keys < 2^20: a whole key group, or up to
            # 65536 or 256 keys), and prefixes no key has.
            every = list(present)
            prefixes = sorted({k[:6] for k in every[::97]} | {k[:7] for k in every[::3]}
                              | {k[:8] for k in every[::50]}
                              | {bytes([kg]) + b"\x7f" for kg in range(0, MAXP, 7)})
            keys, values = lk.prefix_entries(name, prefixes + prefixes[:3])
            ps = set(prefixes)
            want = sorted((k, v) for k, v in present.items()
                          if {k[:6], k[:7], k[:8]} & ps)
            assert list(zip(keys.to_pylist(), values.to_pylist())) == want
            keys, _ = lk.prefix_entries(name, prefixes[:1])
            assert keys.to_pylist() == sorted(k for k in present if k.startswith(prefixes[0]))
        with pytest.raises(InvalidInputError, match="no state"):
            lk.prefix_entries("nope", [b"\x00"])


def _chain_of_runs(store, rng, versions, n_keys, kgs, block_target=256):
    """Versions 1..``versions`` of ``store``: a full run of ``n_keys`` random entries of states
    "a" and "b" (in the key groups ``kgs``) and incremental runs over it, each writing,
    rewriting and removing (tombstones) entries of the ones before. Returns the merged state
    of the last version, ``{name: {key: value}}``."""
    merged = {"a": {}, "b": {}}
    for version in range(1, versions + 1):
        data = _random_data(rng, n_keys if version == 1 else n_keys // 4, kgs=kgs,
                            tomb=0.0 if version == 1 else 0.2)
        if version > 1:
            for name in "ab":
                for k in rng.sample(sorted(merged[name]), len(merged[name]) // 8):
                    data[name].setdefault(k[0], {})[k] = None
        for name in "ab":
            for kv in data[name].values():
                for k, v in kv.items():
                    if v is None:
                        merged[name].pop(k, None)
                    else:
                        merged[name][k] = v
        _write(store, version, Snap(data, incremental=version > 1,
                                    base_version=version - 1 if version > 1 else None),
               block_target=block_target)
    return merged


def _under(merged: dict, prefixes) -> list:
    return sorted((k, v) for k, v in merged.items() if any(k.startswith(p) for p in prefixes))


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_prefix_entries_of_a_batch_in_rounds_equal_the_model(tmp_path, monkeypatch, native):
    """A batch of prefixes over a chain of four runs with tombstones: its candidate blocks
    opened in rounds of at most ``open_bytes`` (one block each here, and all at once by
    default) give the model's entries, and each prefix alone (the per-record load) its part;
    the blocks land in the block cache the point lookups use, so looking the loaded keys up
    afterwards reads no block."""
    if not native:
        _without_native_prefix_path(monkeypatch)
    rng = random.Random(21)
    store = CheckpointStore(str(tmp_path / "ckpt"), max_runs=None)
    merged = _chain_of_runs(store, rng, 4, 1600, kgs=range(0, MAXP, 5))
    assert len(store.describe(4)["run_list"]) == 4
    with store.open(4) as reader:
        for name in "ab":
            keys = sorted(merged[name])
            prefixes = sorted({k[:7] for k in keys[::5]} | {k[:6] for k in keys[::301]}
                              | {bytes([kg]) + b"\x7f" for kg in range(0, MAXP, 9)})
            want = _under(merged[name], prefixes)
            for open_bytes in (1, lookup_module.OPEN_BYTES):
                with RunLookup(reader, open_bytes=open_bytes) as lk:
                    k, v = lk.prefix_entries(name, prefixes)
                    assert list(zip(k.to_pylist(), v.to_pylist())) == want
                    st = lk.statistics()
                    assert st["blocks_read"] > 0 and 0 < st["peak_open_bytes"]
                    if open_bytes == 1:  # one block a round: none of 256 bytes is larger
                        assert st["peak_open_bytes"] < 4096
                    got = lk.lookup_batch(name, k)
                    assert got.equals(v)
                    assert lk.statistics()["blocks_read"] == st["blocks_read"]
            with RunLookup(reader) as lk:
                for p in prefixes[::23]:
                    k, v = lk.prefix_entries(name, [p])
                    assert list(zip(k.to_pylist(), v.to_pylist())) == _under(merged[name], [p])


@hypothesis.settings(max_examples=8, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(seed=st.integers(0, 2**32 - 1), versions=st.integers(1, 4),
                  block_target=st.sampled_from([64, 256, 4096]))
def test_prefix_entries_differential_over_random_chains(tmp_path_factory, seed, versions,
                                                        block_target):
    """prefix_entries against the model (the merged runs) over random chains, block sizes and
    prefixes of every length from the key-group byte to whole keys."""
    rng = random.Random(seed)
    store = CheckpointStore(str(tmp_path_factory.mktemp("ckpt")), max_runs=None)
    merged = _chain_of_runs(store, rng, versions, 300, kgs=range(0, MAXP, 11),
                            block_target=block_target)
    keys = sorted(merged["a"]) or [ekey(0, 1)]
    prefixes = [rng.choice(keys)[:rng.randrange(1, 11)] for _ in range(rng.randrange(1, 40))]
    with store.open(versions) as reader, RunLookup(reader, open_bytes=rng.choice([1, 1 << 20])
                                                  ) as lk:
        k, v = lk.prefix_entries("a", prefixes)
    assert list(zip(k.to_pylist(), v.to_pylist())) == _under(merged["a"], set(prefixes))


@pytest.mark.parametrize("count", [1, 40], ids=["one-prefix", "batch"])
def test_prefix_entries_of_a_corrupt_block_raise_naming_it(tmp_path, count):
    store, keys = _corrupt_store(tmp_path, "block")
    with store.open(1) as reader, RunLookup(reader) as lk:
        with pytest.raises(CorruptCheckpointError) as err:
            lk.prefix_entries("a", sorted({k[:3] for k in keys})[:count])
    msg = str(err.value)
    assert ".sckp" in msg and "state 'a'" in msg and "key group 7" in msg and "block 0" in msg


def test_absent_keys_read_blocks_only_for_filter_false_positives(tmp_path):
    rng = random.Random(5)
    store = CheckpointStore(str(tmp_path / "ckpt"))
    data = {"a": {}, "b": {}}
    for kg in range(0, MAXP, 2):
        for key in rng.sample(range(10**9), 400):
            data["a"].setdefault(kg, {})[ekey(kg, key)] = b"x" * 8
    _write(store, 1, Snap(data), block_target=4096)
    present = {k for kv in data["a"].values() for k in kv}
    absent = []
    while len(absent) < 20000:
        kg = rng.randrange(0, MAXP, 2)
        k = ekey(kg, rng.randrange(10**9, 2 * 10**9))
        if k not in present:
            absent.append(k)
    with store.open(1) as reader, RunLookup(reader) as lk:
        got = lk.lookup_batch("a", pa.array(absent, pa.binary()))
        assert got.null_count == len(absent)
        st = lk.statistics()
    fp = st["filter_false_positives"] + st["range_negatives"]
    assert st["filter_negatives"] + fp == len(absent)
    # 10 bits per key and 7 probes: 0.82% expected; allow 4 standard deviations.
    p = 0.0082
    sd = (p * (1 - p) * len(absent)) ** 0.5
    assert abs(fp - p * len(absent)) < 4 * sd + 5, fp
    assert st["blocks_read"] <= st["filter_false_positives"]


def test_cache_stays_within_budget_and_counts_hits():
    cache = BlockCache(1000)
    arr = pa.array([b"k" * 10] * 10, pa.binary())
    for i in range(50):
        cache.put(i, arr, arr)
        assert cache.used <= 1000
        assert cache.get(i) is not None
    assert cache.get(0) is None and cache.misses == 1 and cache.hits == 50
    big = pa.array([b"x" * 2000], pa.binary())
    cache.put("big", big, big)
    assert cache.get("big") is None and cache.used <= 1000
    with pytest.raises(InvalidInputError):
        BlockCache(-1)


def _corrupt_store(tmp_path, where):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    rng = random.Random(2)
    data = _random_data(rng, 500, kgs=[7])
    _write(store, 1, Snap(data))
    d = store.manifest(1)["files"][0]
    path = os.path.join(store.root, d["path"])
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    r = fmt.DataFileReader(pa.BufferReader(bytes(raw)), "x")
    ftab, _, _ = r.lookup_tables()
    if where == "block":
        raw[int(r.block_rows(0, 1)["offset"][0]) + 3] ^= 0xFF
    elif where == "filter":
        raw[int(ftab["offset"][0]) + 2] ^= 0xFF
    else:
        foot = len(raw) - fmt.TRAILER_SIZE - 5
        raw[foot] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(raw))
    keys = [k for kv in data["a"].values() for k in kv]
    return store, keys


@pytest.mark.parametrize("where", ["block", "filter", "footer"])
def test_corruption_raises_naming_file_state_and_key_group(tmp_path, where):
    store, keys = _corrupt_store(tmp_path, where)
    with store.open(1) as reader, RunLookup(reader) as lk:
        with pytest.raises(CorruptCheckpointError) as err:
            lk.lookup_batch("a", pa.array(keys, pa.binary()))
    msg = str(err.value)
    assert ".sckp" in msg
    if where != "footer":
        assert "state 'a'" in msg and "key group 7" in msg, msg


def test_bad_arguments(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    _write(store, 1, Snap(_random_data(random.Random(1), 50)))
    with store.open(1) as reader:
        with pytest.raises(InvalidInputError):
            RunLookup(reader, key_groups=(0, 500))
        with RunLookup(reader, key_groups=(0, 9)) as lk:
            with pytest.raises(InvalidInputError, match="no state"):
                lk.lookup_batch("zz", pa.array([ekey(1, 1)], pa.binary()))
            with pytest.raises(InvalidInputError, match="outside"):
                lk.lookup_batch("a", pa.array([ekey(20, 1)], pa.binary()))
            with pytest.raises(InvalidInputError, match="prefix"):
                lk.lookup_batch("a", pa.array([b""], pa.binary()))
            with pytest.raises(InvalidInputError):
                lk.lookup_batch("a", pa.array([1], pa.int64()))
            assert lk.lookup_batch("a", pa.array([], pa.binary())).to_pylist() == []


def test_bloom_filter_python_and_native_agree():
    from statecore.checkpoint import blocks

    rng = np.random.default_rng(0)
    keys = pa.array([bytes(rng.integers(0, 256, rng.integers(0, 30)).astype(np.uint8))
                     for _ in range(2000)], pa.binary())
    h = blocks.key_hashes(keys)
    assert h.tolist() == [blocks.xxh64(k) for k in keys.to_pylist()]
    for bpk in (1, 10, 64):
        f = blocks.bloom_filter(h, bpk)
        assert len(f) == blocks.bloom_filter_bytes(len(keys), bpk)
        assert blocks.bloom_probe(f, blocks.bloom_hashes(bpk), h).all()


def _reference_bloom(hashes, bits_per_key):
    """The filter of docs/formats.md "Filters and block keys" straight from its formula, with
    Python ints: probe i of hash h at bit (h1 + i * h2) mod bits."""
    from statecore.checkpoint import blocks

    nbytes = blocks.bloom_filter_bytes(len(hashes), bits_per_key)
    out = bytearray(nbytes)
    for h in hashes:
        h1, h2 = h & 0xFFFFFFFF, h >> 32
        for i in range(blocks.bloom_hashes(bits_per_key)):
            p = (h1 + i * h2) % (nbytes * 8)
            out[p // 8] |= 1 << (p % 8)
    return bytes(out)


@pytest.mark.parametrize("n", [0, 1, 9, 700])
def test_bloom_filters_of_every_path_match_the_formula(n):
    # The numpy writer, the native one-pass writer (bloom_filter_of_keys) and both probes agree
    # with the formula bit for bit, sliced arrays included; probes answer False only for keys
    # whose bits are not all set.
    from statecore.checkpoint import blocks

    rng = np.random.default_rng(n)
    keys = pa.array([rng.bytes(int(rng.integers(0, 24))) for _ in range(n + 5)], pa.binary())
    keys = keys.slice(3, n)
    h = blocks.key_hashes(keys)
    others = rng.integers(0, 2**63, 3000, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    for bpk in (1, 3, 10, 64):
        want = _reference_bloom([int(x) for x in h], bpk)
        assert blocks.bloom_filter(h, bpk) == want
        assert blocks.bloom_filter_of_keys(keys, bpk) == want
        k = blocks.bloom_hashes(bpk)
        raw = np.frombuffer(want, np.uint8)
        i = np.arange(k, dtype=np.uint64)
        pos = (((others & np.uint64(0xFFFFFFFF))[:, None] + i * (others >> np.uint64(32))[:, None])
               % np.uint64(len(raw) * 8)).astype(np.int64)
        expect = ((raw[pos >> 3] >> (pos & 7).astype(np.uint8)) & 1).all(axis=1)
        assert np.array_equal(blocks.bloom_probe(want, k, others), expect)
        assert blocks.bloom_probe(want, k, h).all()
    native = pytest.importorskip("statecore._native")
    f = native.bloom_filter_of_keys(keys, 10)
    assert np.array_equal(native.bloom_probe_hashes(f, 7, others),
                          blocks.bloom_probe(f, 7, others))
    with pytest.raises(InvalidInputError):
        native.bloom_filter_of_keys(keys, 0)
    with pytest.raises(InvalidInputError):
        native.bloom_probe_hashes(b"", 7, others)


def test_native_lookup_in_blocks_finds_gathers_and_skips_tombstones():
    native = pytest.importorskip("statecore._native")
    rng = random.Random(4)
    blocks, oracle = [], []
    for _ in range(6):
        keys = sorted({bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
                       for _ in range(rng.randrange(0, 40))})
        vals = [None if rng.random() < 0.2 else bytes(rng.randrange(256)
                                                       for _ in range(rng.randrange(0, 5)))
                for _ in keys]
        k, v = pa.array(keys, pa.binary()), pa.array(vals, pa.binary())
        if len(keys) > 4:  # sliced arrays too
            k, v, keys, vals = k.slice(2), v.slice(2), keys[2:], vals[2:]
        blocks.append((k, v))
        oracle.append(dict(zip(keys, vals)))
    needles, which = [], []
    for _ in range(500):
        b = rng.randrange(len(blocks))
        pool = list(oracle[b])
        if pool and rng.random() < 0.6:
            needles.append(rng.choice(pool))
        else:
            needles.append(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 6))))
        which.append(b)
    rows, values = native.lookup_in_blocks(blocks, np.array(which, np.int64),
                                           pa.array(needles, pa.binary()))
    for i, (q, b) in enumerate(zip(needles, which)):
        if q in oracle[b]:
            assert blocks[b][0][int(rows[i])].as_py() == q
            assert values[i].as_py() == oracle[b][q]
        else:
            assert rows[i] == -1 and values[i].as_py() is None
    with pytest.raises(InvalidInputError):
        native.lookup_in_blocks(blocks, np.array([len(blocks)], np.int64),
                                pa.array([b"x"], pa.binary()))


def _stored_blocks(rng, n_blocks, incremental):
    """Random blocks as a data file stores them: ``(stored bytes, block-table rows, last keys,
    per block {key: value or None})``, the keys of each block ascending and unique."""
    from statecore.checkpoint import blocks as blk

    parts, rows, last, oracle, at = [], [], [], [], 0
    for _ in range(n_blocks):
        keys = sorted({bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
                       for _ in range(rng.randrange(1, 40))})
        vals = [None if incremental and rng.random() < 0.2
                else bytes(rng.randrange(256) for _ in range(rng.randrange(0, 5))) for _ in keys]
        ko = np.cumsum([0] + [len(k) for k in keys]).astype(np.int32)
        vo = np.cumsum([0] + [len(v or b"") for v in vals]).astype(np.int32)
        payload = blk.encode_block(ko, b"".join(keys), vo, b"".join(v or b"" for v in vals),
                                   [v is not None for v in vals] if incremental else None)
        stored = blk.compress_block(payload)
        rows.append((at, len(stored), len(payload), len(keys), 0, blk.xxh64(stored)))
        parts.append(stored)
        last.append(keys[-1])
        oracle.append(dict(zip(keys, vals)))
        at += len(stored)
    return b"".join(parts), np.array(rows, dtype=fmt.BLOCK_DTYPE), last, oracle


@pytest.mark.parametrize("incremental", [False, True])
def test_native_payload_lookups_find_gather_and_check_blocks(incremental):
    """open_blocks + lookup_in_payloads (the lookup's native path) against a dict per block:
    found keys and their values, tombstones and absent keys NULL; a block whose bytes, or whose
    last key against the footer's, are wrong is named by its index."""
    native = pytest.importorskip("statecore._native")
    rng = random.Random(5 + incremental)
    data, rows, last, oracle = _stored_blocks(rng, 7, incremental)
    payloads, bad, why = native.open_blocks(data, rows, 0, incremental, last)
    assert bad is None and [len(p) for p in payloads] == rows["raw_length"].tolist()
    needles, which = [], []
    for _ in range(600):
        b = rng.randrange(len(oracle))
        pool = list(oracle[b])
        needles.append(rng.choice(pool) if rng.random() < 0.6
                       else bytes(rng.randrange(256) for _ in range(rng.randrange(0, 6))))
        which.append(b)
    rows_out, values = native.lookup_in_payloads(payloads, incremental,
                                                 np.array(which, np.int64),
                                                 pa.array(needles, pa.binary()))
    for i, (q, b) in enumerate(zip(needles, which)):
        if q in oracle[b]:
            assert rows_out[i] == sorted(oracle[b]).index(q)
            assert values[i].as_py() == oracle[b][q]
        else:
            assert rows_out[i] == -1 and values[i].as_py() is None
    wrong = list(last)
    wrong[3] = wrong[3] + b"\x00"
    assert native.open_blocks(data, rows, 0, incremental, wrong)[1:] == (
        3, "last key differs from the footer's")
    flipped = bytearray(data)
    flipped[int(rows["offset"][5])] ^= 0xFF
    assert native.open_blocks(bytes(flipped), rows, 0, incremental, last)[1:] == (
        5, "block checksum mismatch")
    with pytest.raises(InvalidInputError):
        native.open_blocks(data, rows, 0, incremental, last[:-1])
    with pytest.raises(InvalidInputError):
        native.lookup_in_payloads(payloads, incremental, np.array([len(payloads)], np.int64),
                                  pa.array([b"x"], pa.binary()))


def test_reads_through_a_pyarrow_filesystem_are_what_the_statistics_say(tmp_path):
    """Through a non-local pyarrow filesystem: opening the lookup reads nothing, the first batch
    reads the filters of the state's key groups once and a block per key the filter passes
    (absent keys: only false positives), and the file's byte count agrees with the
    statistics."""
    import pyarrow.fs as pafs

    from support.fs_wrappers import LocalDelegatingHandler

    fs = pafs.PyFileSystem(LocalDelegatingHandler())
    store = CheckpointStore(str(tmp_path / "ckpt"), filesystem=fs)
    rng = random.Random(9)
    data = _random_data(rng, 4000)
    _write(store, 1, Snap(data), block_target=1024)
    present = {k: v for kv in data["a"].values() for k, v in kv.items()}
    absent = _absent_keys(present, MAXP, 1000, rng)
    with store.open(1) as reader:
        run = reader.manifest["files"][0]
        f = reader.data_file(run)
        opened = f.bytes_read
        with RunLookup(reader) as lk:
            assert f.bytes_read == opened
            got = lk.lookup_batch("a", pa.array(absent, pa.binary()))
            assert got.null_count == len(absent)
            st = lk.statistics()
            assert f.bytes_read - opened == st["bytes_read"] > 0
            assert st["blocks_read"] <= st["filter_false_positives"]
            before = f.bytes_read
            ask = sorted(present)
            got = lk.lookup_batch("a", pa.array(ask, pa.binary())).to_pylist()
            assert got == [present[k] for k in ask]
            st2 = lk.statistics()
            assert f.bytes_read - before == st2["bytes_read"] - st["bytes_read"]
            assert st2["filter_bytes"] == st["filter_bytes"]  # filters read once


def test_a_lookup_reads_the_filters_of_the_key_groups_it_reaches_only(tmp_path):
    """Attaching costs no read proportional to the state: the first lookup of one key reads its
    key group's filter alone; a later batch reads the filters it has not read, once."""
    store = CheckpointStore(str(tmp_path / "ckpt"))
    rng = random.Random(4)
    data = _random_data(rng, 6000, kgs=range(0, MAXP, 2))
    _write(store, 1, Snap(data), block_target=1024)
    present = {k: v for kv in data["a"].values() for k, v in kv.items()}
    with store.open(1) as reader:
        r = reader.data_file(reader.manifest["files"][0])
        rows, pos = r.index_rows("a")
        every = r.lookup_tables()[0]
        flen = {int(kg): int(n) for kg, n in zip(rows["key_group"], every[pos]["length"])}
        first = min(present)
        with RunLookup(reader) as lk:
            assert lk.lookup_batch("a", pa.array([first], pa.binary())).to_pylist() == \
                [present[first]]
            assert lk.statistics()["filter_bytes"] == flen[first[0]]
            ask = sorted(present)
            assert lk.lookup_batch("a", pa.array(ask, pa.binary())).to_pylist() == \
                [present[k] for k in ask]
            total = lk.statistics()["filter_bytes"]
            # One ranged read over the span: the other state's filters lie between (the
            # filters are stored in key-group order, states within a key group).
            assert sum(flen.values()) <= total <= int(every["length"].sum())
            lk.lookup_batch("a", pa.array(ask, pa.binary()))
            assert lk.statistics()["filter_bytes"] == total


def _full_and_incremental(tmp_path, monkeypatch, strip, payloads, rng, n_full, n_inc):
    """A store holding version 1 (a full run of ``n_full`` random entries, ``strip``: format 5)
    and version 2 (an incremental run of ``n_inc``, 30% tombstones), 1 KiB blocks; without
    ``payloads`` the lookups run without the extension (Arrow blocks decoded in Python).
    Returns the store, version 1's data and version 2's."""
    if not payloads:
        for name in ("_RunBlocks", "_RunRouter", "_native_lookup_in_blocks",
                     "native_decode_blocks"):
            monkeypatch.setattr(lookup_module, name, None)
    store = CheckpointStore(str(tmp_path / "ckpt"), max_runs=None)
    full = _random_data(rng, n_full)
    _write(store, 1, Snap(full), block_target=1024, strip=strip)
    inc = _random_data(rng, n_inc, tomb=0.3)
    _write(store, 2, Snap(inc, incremental=True, base_version=1), block_target=1024)
    return store, full, inc


@pytest.mark.parametrize("strip,payloads", [(False, True), (False, False), (True, True)],
                         ids=["format6", "format6-python", "format5"])
def test_a_batch_opens_its_blocks_in_rounds_within_open_bytes(tmp_path, monkeypatch, strip,
                                                             payloads):
    """A batch whose candidate blocks far exceed ``open_bytes`` (nothing cached) gives the
    answers of an unbounded lookup, and no round holds more than ``open_bytes`` decoded bytes
    of blocks open (or one block, when a block alone is larger)."""
    rng = random.Random(17)
    store, _, inc = _full_and_incremental(tmp_path, monkeypatch, strip, payloads, rng, 4000,
                                          1000)
    bound = 4 << 10
    with store.open(2) as reader:
        present = _all_entries(reader, "a")
        ask = pa.array(_shuffled_asks(present, inc, 300, rng), pa.binary())
        largest = max(int(reader.data_file(r).block_rows(0, 1 << 30)["raw_length"].max())
                      for r in reader.manifest["files"])
        with RunLookup(reader, cache_bytes=1, open_bytes=bound) as lk:
            got = lk.lookup_batch("a", ask).to_pylist()
            peak = lk.statistics()["peak_open_bytes"]
        with RunLookup(reader, cache_bytes=1, open_bytes=1 << 40) as lk:
            assert lk.lookup_batch("a", ask).to_pylist() == got
            unbounded = lk.statistics()["peak_open_bytes"]
    assert got == [present.get(k) for k in ask.to_pylist()]
    # Local files: at most open_bytes, or one block a chunk on each fetch thread and this one.
    assert 0 < peak <= max(bound, (lookup_module.FETCH_THREADS + 1) * largest)
    assert unbounded > 4 * bound  # the batch's blocks do exceed the bound
    with store.open(2) as reader, pytest.raises(InvalidInputError, match="open_bytes"):
        RunLookup(reader, open_bytes=0)


@pytest.mark.parametrize("strip,payloads", [(False, True), (False, False), (True, True)],
                         ids=["format6", "format6-python", "format5"])
def test_lookup_one_answers_and_counts_as_lookup_batch(tmp_path, monkeypatch, strip, payloads):
    """The per-record path (RunLookup.lookup_one) against lookup_batch over a full run and an
    incremental one with tombstones: the same values, and the same filter and block
    statistics with a cache holding every block (each block read once by either; the filters
    are read one key group at a time by lookup_one, so their bytes differ)."""
    rng = random.Random(23)
    store, full, inc = _full_and_incremental(tmp_path, monkeypatch, strip, payloads, rng,
                                             2000, 600)
    with store.open(2) as reader:
        other = [k for kv in full["b"].values() for k in kv][:200]  # other state's keys
        present = _all_entries(reader, "a")
        ask = _shuffled_asks(present, inc, 200, rng, other)
        with RunLookup(reader) as one, RunLookup(reader) as batch:
            got = [one.lookup_one("a", k) for k in ask]
            assert got == batch.lookup_batch("a", pa.array(ask, pa.binary())).to_pylist()
            assert got == [present.get(k) for k in ask]
            a, b = one.statistics(), batch.statistics()
            for name in ("lookups", "blocks_read", "filter_negatives", "range_negatives",
                         "filter_false_positives"):
                assert a[name] == b[name], name
            with pytest.raises(InvalidInputError, match="no state"):
                one.lookup_one("zz", ask[0])
            with pytest.raises(InvalidInputError, match="prefix"):
                one.lookup_one("a", b"")
            with pytest.raises(InvalidInputError, match="bytes"):
                one.lookup_one("a", 5)
        with RunLookup(reader, key_groups=(0, 9)) as lk, \
                pytest.raises(InvalidInputError, match="outside"):
            lk.lookup_one("a", ekey(20, 1))


def _reference_probe(filt: bytes, k: int, h: int) -> bool:
    """Whether every probe bit of hash ``h`` is set in ``filt`` (the formula of
    :func:`_reference_bloom`)."""
    bits = len(filt) * 8
    h1, h2 = h & 0xFFFFFFFF, h >> 32
    return all(filt[p // 8] >> (p % 8) & 1 for p in ((h1 + i * h2) % bits for i in range(k)))


@hypothesis.settings(derandomize=True, max_examples=20, deadline=None)
@hypothesis.given(
    groups=st.lists(st.lists(st.binary(min_size=0, max_size=4), max_size=30), min_size=1,
                    max_size=5),
    block=st.integers(1, 6), extra=st.lists(st.binary(max_size=4), max_size=40),
    filtered=st.lists(st.booleans(), min_size=5, max_size=5))
def test_native_router_routes_as_the_formula_and_a_search_over_bytes(groups, block, extra,
                                                                     filtered):
    """RunRouter.route (each key's candidate block in one run: its key group's Bloom filter,
    then the first block whose footer last key is >= the key) against the filter formula and
    bisect over the block keys as bytes, for stored keys, other keys, key groups the run lacks
    (empty lists) and key groups without a filter given."""
    native = pytest.importorskip("statecore._native")
    from bisect import bisect_left

    from statecore.checkpoint import blocks as blk

    base, bpk = 3, 10
    k = blk.bloom_hashes(bpk)
    kgs, firsts, counts, last_keys, filters = [], [], [], [], {}
    for g, keys in enumerate(groups):
        keys = sorted(set(keys))
        if not keys:
            continue  # the run lacks this key group
        kgs.append(base + g)
        firsts.append(len(last_keys))
        lasts = [keys[min(i + block - 1, len(keys) - 1)] for i in range(0, len(keys), block)]
        counts.append(len(lasts))
        last_keys += lasts
        filters[base + g] = blk.bloom_filter(
            np.array([blk.xxh64(x) for x in keys], np.uint64), bpk)
    koff = np.cumsum([0] + [len(x) for x in last_keys]).astype(np.int64)
    router = native.RunRouter(base, base + 5, kgs, firsts, counts, koff,
                              b"".join(last_keys))
    for kg in kgs:
        if filtered[kg - base]:
            router.set_filter(kg, filters[kg], k)
    asked = [(x, base + g) for g, keys in enumerate(groups) for x in keys]
    asked += [(x, base + i % 6) for i, x in enumerate(extra)]
    keys = pa.array([b"pad"] + [x for x, _ in asked], pa.binary()).slice(1)
    key_groups = np.array([kg for _, kg in asked], np.int64)
    hashes = np.array([blk.xxh64(x) for x, _ in asked], np.uint64)
    rows = np.arange(len(asked), dtype=np.int64)[::-1].copy()
    got, negatives, past = router.route(keys, rows, key_groups, hashes)
    want, want_neg, want_past = [], 0, 0
    for r in rows.tolist():
        x, kg = asked[r]
        b = -1
        if kg in kgs:
            i = kgs.index(kg)
            lasts = last_keys[firsts[i]:firsts[i] + counts[i]]
            if filtered[kg - base] and not _reference_probe(filters[kg], k, int(hashes[r])):
                want_neg += 1
            elif bisect_left(lasts, x) == len(lasts):
                want_past += 1
            else:
                b = firsts[i] + bisect_left(lasts, x)
        want.append(b)
    assert got.tolist() == want
    assert (negatives, past) == (want_neg, want_past)


def test_native_router_rejects_bad_arguments():
    native = pytest.importorskip("statecore._native")
    koff = np.array([0, 1, 2], np.int64)
    with pytest.raises(InvalidInputError, match="outside the footer"):
        native.RunRouter(0, 3, [1], [1], [2], koff, b"ab")
    with pytest.raises(InvalidInputError, match="outside the key groups"):
        native.RunRouter(0, 3, [4], [0], [1], koff, b"ab")
    with pytest.raises(InvalidInputError, match="do not fit"):
        native.RunRouter(0, 3, [1], [0], [1], np.array([0, 2, 1], np.int64), b"ab")
    router = native.RunRouter(0, 3, [1], [0], [2], koff, b"ab")
    with pytest.raises(InvalidInputError, match="no key group 2"):
        router.set_filter(2, b"\xff" * 8, 3)
    with pytest.raises(InvalidInputError, match="0 bytes"):
        router.set_filter(1, b"", 3)
    keys = pa.array([b"a", b"b"], pa.binary())
    kg = np.array([1, 1], np.int64)
    h = np.zeros(2, np.uint64)
    with pytest.raises(InvalidInputError, match="outside the keys"):
        router.route(keys, np.array([2], np.int64), kg, h)
    with pytest.raises(InvalidInputError, match="hashes"):
        router.route(keys, np.array([0], np.int64), kg[:1], h)
    with pytest.raises(InvalidInputError, match="nulls"):
        router.route(pa.array([b"a", None], pa.binary()), np.array([0], np.int64), kg, h)
    got, _, _ = router.route(keys, np.array([1, 0], np.int64), kg, h)
    assert got.tolist() == [1, 0]


@pytest.mark.parametrize("strip", [False, True], ids=["format6", "format5"])
def test_native_routing_answers_and_counts_as_the_python_path(tmp_path, monkeypatch, strip):
    """lookup_batch with the native routing (RunRouter) and with the Python one (a filter
    probe and a block search per run and key group, no extension) over a full run and an
    incremental one with tombstones: the same values and statistics."""
    rng = random.Random(29)
    store, full, inc = _full_and_incremental(tmp_path, monkeypatch, strip, True, rng, 1500, 500)
    with store.open(2) as reader:
        present = _all_entries(reader, "a")
        ask = pa.array(_shuffled_asks(present, inc, 200, rng), pa.binary())
        with RunLookup(reader) as lk:
            native = lk.lookup_batch("a", ask).to_pylist()
            native_stats = lk.statistics()
        monkeypatch.setattr(lookup_module, "_RunRouter", None)
        with RunLookup(reader) as lk:
            assert lk.lookup_batch("a", ask).to_pylist() == native
            assert lk.statistics() == native_stats
    assert native == [present.get(k) for k in ask.to_pylist()]
    if not strip:
        assert native_stats["filter_negatives"] > 0


def _without_extension(monkeypatch):
    """RunLookup as it runs without the extension: Python routing, blocks decoded into Arrow
    arrays and kept in a BlockCache, searched with Arrow kernels."""
    for name in ("_RunBlocks", "_RunRouter", "_native_lookup_in_blocks", "native_decode_blocks",
                 "NativeBlockCache", "_native_merge_newest_wins"):
        monkeypatch.setattr(lookup_module, name, None)


@pytest.mark.parametrize("open_bytes", [1, lookup_module.OPEN_BYTES], ids=["open1", "default"])
def test_native_steps_answer_and_count_as_the_python_path(tmp_path, monkeypatch, open_bytes):
    """lookup_batch and lookup_one through the native block cache and lookup steps against the
    pure-Python path over a chain of a full run and three incremental runs with tombstones:
    the same values (the merged chain's), and the same block, filter and false-positive
    counts; a second batch is served from the cache."""
    pytest.importorskip("statecore._native")
    rng = random.Random(41)
    store = CheckpointStore(str(tmp_path / "ckpt"), max_runs=None)
    merged = _chain_of_runs(store, rng, 4, 1200, range(0, MAXP, 5))["a"]
    ask = list(merged) + _absent_keys(set(merged), MAXP, 300, rng)
    ask += [k for k in _all_entries_of_every_run(store, 4) if k not in merged][:300]
    rng.shuffle(ask)
    arr = pa.array(ask, pa.binary())
    names = ("lookups", "blocks_read", "filter_negatives", "range_negatives",
             "filter_false_positives")
    with store.open(4) as reader:
        with RunLookup(reader, open_bytes=open_bytes) as lk:
            assert isinstance(lk.cache, lookup_module.NativeBlockCache)
            got = lk.lookup_batch("a", arr).to_pylist()
            native = lk.statistics()
            assert lk.lookup_batch("a", arr).to_pylist() == got
            again = lk.statistics()
            assert again["blocks_read"] == native["blocks_read"]
            assert again["cache_hits"] > native["cache_hits"]
        assert native["peak_open_bytes"] > 0
        with RunLookup(reader, open_bytes=open_bytes) as lk:
            assert [lk.lookup_one("a", k) for k in ask[:400]] == got[:400]
        with monkeypatch.context() as m:
            _without_extension(m)
            with RunLookup(reader, open_bytes=open_bytes) as lk:
                assert isinstance(lk.cache, BlockCache)
                assert lk.lookup_batch("a", arr).to_pylist() == got
                python = lk.statistics()
    assert got == [merged.get(k) for k in ask]
    for name in names:
        assert native[name] == python[name], name


def _all_entries_of_every_run(store, version) -> list:
    """Every key any run of ``version``'s chain holds in state "a" (tombstones included)."""
    out = []
    with store.open(version) as reader:
        for run in reader.manifest["files"]:
            data = reader.data_file(run)
            rows, _ = data.index_rows("a")
            for kg in rows["key_group"].tolist():
                keys, _ = data.entries("a", int(kg))
                out += keys.to_pylist()
    return out


@pytest.mark.parametrize("how", ["batch", "one", "prefix"])
def test_a_corrupt_block_is_never_cached(tmp_path, how):
    """A block failing its checks raises CorruptCheckpointError naming file, state, key group
    and block -- and again on the next lookup: it never enters the cache."""
    store, keys = _corrupt_store(tmp_path, "block")
    with store.open(1) as reader, RunLookup(reader) as lk:
        for _ in range(2):
            with pytest.raises(CorruptCheckpointError) as err:
                if how == "batch":
                    lk.lookup_batch("a", pa.array(keys, pa.binary()))
                elif how == "one":
                    for k in sorted(keys):
                        lk.lookup_one("a", k)
                else:
                    lk.prefix_entries("a", [sorted(keys)[0][:3]])
            msg = str(err.value)
            assert "state 'a'" in msg and "key group 7" in msg and "block 0" in msg, msg
            assert ".sckp" in msg


def test_native_block_cache_budget_and_counts(tmp_path):
    """NativeBlockCache through a lookup: within its budget, blocks shared between point and
    prefix lookups (a prefix lookup after point lookups of the same keys reads nothing), and
    a bad budget rejected."""
    native = pytest.importorskip("statecore._native")
    with pytest.raises(InvalidInputError, match="budget"):
        native.NativeBlockCache(-1)
    rng = random.Random(43)
    store = CheckpointStore(str(tmp_path / "ckpt"))
    data = _random_data(rng, 800, kgs=[3])
    _write(store, 1, Snap(data), block_target=512)
    keys = sorted(data["a"][3])
    with store.open(1) as reader:
        with RunLookup(reader, cache_bytes=2048) as lk:
            lk.lookup_batch("a", pa.array(keys, pa.binary()))
            st = lk.statistics()
            assert 0 < st["cache_bytes"] <= 2048 and len(lk.cache) >= 1
        with RunLookup(reader, cache_bytes=64 << 20) as lk:
            for k in keys:
                lk.lookup_one("a", k)
            read = lk.statistics()["blocks_read"]
            got = lk.prefix_entries("a", [keys[0][:2]])
            assert lk.statistics()["blocks_read"] == read
            assert len(got[0]) == len(keys)


def test_local_files_are_read_natively_as_a_remote_store_reads_them(tmp_path):
    """The same files through the local filesystem (read by the extension: pread on the fetch
    threads, reads coalesced across gaps of at most 8 KiB) and through a non-local pyarrow
    filesystem (one positional read per range, gaps up to 128 KiB): equal answers, the same
    blocks opened, and no more bytes read locally."""
    import pyarrow.fs as pafs

    from support.fs_wrappers import LocalDelegatingHandler

    if lookup_module.NativeBlockCache is None:
        pytest.skip("needs the native extension")
    root = str(tmp_path / "ckpt")
    store = CheckpointStore(root)
    rng = random.Random(17)
    data = _random_data(rng, 20000)
    _write(store, 1, Snap(data), block_target=256)
    present = {k: v for kv in data["a"].values() for k, v in kv.items()}
    # Few keys over many blocks: the gaps between their blocks exceed 8 KiB.
    ask = rng.sample(sorted(present), 40) + _absent_keys(present, MAXP, 20, rng)
    got, stats = [], []
    for s in (CheckpointStore(root), CheckpointStore(root, filesystem=pafs.PyFileSystem(
            LocalDelegatingHandler()))):
        with s.open(1) as reader, RunLookup(reader, threads=3, open_bytes=4096) as lk:
            got.append(lk.lookup_batch("a", pa.array(ask, pa.binary())).to_pylist())
            got.append([lk.lookup_one("a", k) for k in ask[:20]])
            stats.append(lk.statistics())
    assert got[0] == got[2] == [present.get(k) for k in ask]
    assert got[1] == got[3] == [present.get(k) for k in ask[:20]]
    local, remote = stats
    assert local["blocks_read"] == remote["blocks_read"] > 10
    assert local["bytes_read"] < remote["bytes_read"]


def test_lookup_chain_one_checks_where_it_starts():
    """The chain walk of lookup_one (answers and counts: the tests above) refuses a negative
    start and decides nothing past the chain's end."""
    native = pytest.importorskip("statecore._native")
    cache = native.NativeBlockCache(1 << 10)
    with pytest.raises(InvalidInputError, match="start"):
        native.lookup_chain_one([], cache, b"\x00k", 0, -1)
    assert native.lookup_chain_one([], cache, b"\x00k", 0, 3) == (
        3, native.ONE_NOT_HELD, None, 0, 0, 0)


def test_lookup_one_of_a_local_file_cut_short_raises_naming_it(tmp_path):
    """A local data file cut short while a lookup holds it open: lookup_one's positional read
    of a block past the new end raises CorruptCheckpointError naming the file, state and key
    group; the blocks read before still answer."""
    if lookup_module.NativeBlockCache is None:
        pytest.skip("needs the native extension")
    store = CheckpointStore(str(tmp_path / "ckpt"))
    data = _random_data(random.Random(3), 500, kgs=[7])
    _write(store, 1, Snap(data), block_target=256)
    present = data["a"][7]
    first, last = min(present), max(present)
    path = os.path.join(store.root, store.manifest(1)["files"][0]["path"])
    with open(path, "rb") as f:
        r = fmt.DataFileReader(pa.BufferReader(f.read()), "x")
    blocks = r.block_rows(0, len(r.lookup_tables()[1]) - 1)
    assert len(blocks) > 4
    with store.open(1) as reader, RunLookup(reader) as lk:
        assert lk.lookup_one("a", first) == present[first]
        os.truncate(path, int(blocks["offset"][1]) + 1)  # every block but the first cut
        with pytest.raises(CorruptCheckpointError) as err:
            lk.lookup_one("a", last)
        assert lk.lookup_one("a", first) == present[first]
    msg = str(err.value)
    assert os.path.basename(path) in msg, msg
    assert "state 'a'" in msg and "key group 7" in msg and "past the file's end" in msg, msg



def _one_run_file(tmp_path):
    """``(native module, blocks, block count, path, keys)``: a format-6 full run's
    :class:`RunBlocks` (file id 0), its OS path, and the encoded keys of its state ``v``
    (``pa.binary()``) with as many absent ones after them."""
    native = pytest.importorskip("statecore._native")
    store = CheckpointStore(str(tmp_path / "ckpt"))
    b = create_backend("native", key_type="int64", max_parallelism=64)
    v, _, _ = _states(b)
    keys = pa.array(range(0, 3000, 2), pa.int64())
    v.put_batch(keys, keys)
    snap = b.snapshot()
    d = store.write_snapshot_async(snap, 1, block_target_bytes=600,
                                   release_snapshot=True).result(timeout=60)
    store.commit(1, [d])
    with store.open(1) as reader:
        run = reader.manifest["files"][0]
        data = reader.data_file(run)
        _, koff, kdata = data.lookup_tables()
        blocks = native.RunBlocks(0, data.block_rows(0, len(koff) - 1), koff, kdata, False)
        present = sorted(_all_entries(reader, "v"))
        path = reader.local_path(run)
    absent = _absent_keys(set(present), 64, len(present), random.Random(3))
    return native, blocks, len(koff) - 1, path, pa.array(present + absent, pa.binary())


def _step_answers(native, blocks, count, path, keys, on_open):
    """Every key of ``keys`` routed to every one of the file's ``count`` blocks, through a
    LookupStep whose reads are opened from the file's bytes: ``(sorted (key index, value)
    found, blocks searched on open, blocks read)``."""
    step = native.LookupStep(native.NativeBlockCache(1 << 22), 4096, 0, 1 << 20)
    step.add(blocks, np.repeat(np.arange(len(keys), dtype=np.int64), count),
             np.tile(np.arange(count, dtype=np.int64), len(keys)))
    if on_open:
        step.set_keys(keys)
    with open(path, "rb") as f:
        data = f.read()
    found, searched, read = [], 0, 0
    while step.next_round():
        for r, (_, off, length, _, nblocks) in enumerate(step.ranges()):
            assert step.open_range(r, data[off:off + length]) == (None, None)
            read += nblocks
        searched += step.round_searched_on_open()
        ki, rows, vals = step.search(keys)
        found += [(int(k), v) for k, r, v in zip(ki, rows, vals.to_pylist()) if r >= 0]
    return sorted(found), searched, read


def test_a_step_searching_blocks_on_open_answers_as_one_searching_after(tmp_path):
    """LookupStep.set_keys: the blocks are searched where they are opened, and the answers
    equal those of a step whose search() searches every block (each present key found once,
    with its value; the absent ones never)."""
    native, blocks, count, path, keys = _one_run_file(tmp_path)
    after, searched_after, read = _step_answers(native, blocks, count, path, keys, False)
    on_open, searched_on_open, read_on_open = _step_answers(native, blocks, count, path, keys,
                                                            True)
    assert on_open == after
    assert [k for k, _ in after] == list(range(len(keys) // 2))
    assert searched_after == 0
    assert searched_on_open == read_on_open == read == count


def test_lookup_step_misuse_raises_and_leaves_the_step_usable(tmp_path):
    native, blocks, count, path, keys = _one_run_file(tmp_path)
    step = native.LookupStep(native.NativeBlockCache(1 << 22), 4096, 0, 1 << 20)
    step.add(blocks, np.arange(len(keys), dtype=np.int64), np.zeros(len(keys), np.int64))
    with pytest.raises(InvalidInputError, match="binary array"):
        step.set_keys(keys.to_pylist())
    with pytest.raises(InvalidInputError, match="binary array"):
        step.set_keys(pa.array([1, 2], pa.int64()))
    with pytest.raises(InvalidInputError, match="nulls"):
        step.set_keys(pa.array(keys.to_pylist()[:-1] + [None], pa.binary()))
    with pytest.raises(InvalidInputError, match="outside the keys"):
        step.set_keys(keys.slice(0, len(keys) - 1))
    step.set_keys(keys)
    with pytest.raises(InvalidInputError, match="before set_keys"):
        step.add(blocks, np.array([0], np.int64), np.array([0], np.int64))
    assert step.next_round()
    with pytest.raises(InvalidInputError, match="before the first round"):
        step.set_keys(keys)
    with open(path, "rb") as f:
        data = f.read()
    for r, (_, off, length, _, _) in enumerate(step.ranges()):
        assert step.open_range(r, data[off:off + length]) == (None, None)
    with pytest.raises(InvalidInputError, match="keys set_keys got"):
        step.search(pa.array(keys.to_pylist(), pa.binary()))
    ki, rows, _ = step.search(keys)
    assert sorted(ki.tolist()) == list(range(len(keys)))
    assert step.round_searched_on_open() == 1


@pytest.mark.parametrize("threads", [0, 3], ids=["calling-thread", "pool"])
@pytest.mark.parametrize("open_bytes", [1, 4096, 1 << 30])
def test_a_run_step_answers_as_rounds_do(tmp_path, threads, open_bytes):
    """LookupStep.run (local files: chunks read, opened and searched on the native fetch
    threads and the calling thread) answers every key as rounds do, reads each block once,
    and a second run over the same cache reads nothing."""
    native, blocks, count, path, keys = _one_run_file(tmp_path)
    rounds, _, read = _step_answers(native, blocks, count, path, keys, True)
    pool = native.NativeFetchPool(threads) if threads else None
    fd = os.open(path, os.O_RDONLY)
    cache = native.NativeBlockCache(1 << 22)
    try:
        for attempt in range(2):
            step = native.LookupStep(cache, open_bytes, 0, 1 << 20)
            step.add(blocks, np.repeat(np.arange(len(keys), dtype=np.int64), count),
                     np.tile(np.arange(count, dtype=np.int64), len(keys)))
            step.set_keys(keys)
            assert step.run(pool, [fd], max(threads, 1)) is None
            ki, rows, vals = step.results()
            assert len(ki) == len(keys) * count
            found = sorted((int(k), v) for k, r, v in zip(ki, rows, vals.to_pylist()) if r >= 0)
            assert found == rounds
            counts = step.counts()
            assert counts["blocks_read"] == (read if attempt == 0 else 0)
            assert counts["peak_open_bytes"] > 0
    finally:
        os.close(fd)
        if pool is not None:
            pool.close()


def test_a_run_step_reports_a_short_file_and_misuse(tmp_path):
    native, blocks, count, path, keys = _one_run_file(tmp_path)
    pool = native.NativeFetchPool(2)

    step = native.LookupStep(native.NativeBlockCache(1 << 22), 1, 0, 1 << 20)
    step.add(blocks, np.arange(len(keys), dtype=np.int64),
             np.arange(len(keys), dtype=np.int64) % count)
    with pytest.raises(InvalidInputError, match="after set_keys"):
        step.run(pool, [0], 2)
    with pytest.raises(InvalidInputError, match="after a successful run"):
        step.results()
    step.set_keys(keys)
    with pytest.raises(InvalidInputError, match="0 file descriptors for 1 files"):
        step.run(pool, [], 2)
    with pytest.raises(InvalidInputError, match="workers"):
        step.run(pool, [0], 0)
    short = tmp_path / "short"
    with open(path, "rb") as f:
        short.write_bytes(f.read()[:64])
    fd = os.open(str(short), os.O_RDONLY)
    try:
        read, what, why = step.run(pool, [fd], 2)
        assert what == "short" and read[0] == 0 and read[2] > 0 and "ends" in why
        with pytest.raises(InvalidInputError, match="after a successful run"):
            step.results()
        with pytest.raises(InvalidInputError, match="runs once"):
            step.run(pool, [fd], 2)
    finally:
        os.close(fd)
    rounds = native.LookupStep(native.NativeBlockCache(1 << 22), 1, 0, 1 << 20)
    rounds.add(blocks, np.array([0], np.int64), np.array([0], np.int64))
    rounds.set_keys(keys)
    assert rounds.next_round()
    with pytest.raises(InvalidInputError, match="not after rounds"):
        rounds.run(pool, [0], 2)
    pool.close()
    fresh = native.LookupStep(native.NativeBlockCache(1 << 22), 1, 0, 1 << 20)
    fresh.add(blocks, np.array([0], np.int64), np.array([0], np.int64))
    fresh.set_keys(keys)
    with pytest.raises(InvalidInputError, match="closed"):
        fresh.run(pool, [0], 2)
