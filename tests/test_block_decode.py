"""The reader's native block decoder (``_native.decode_blocks``, native/src/block_codec.cpp)
against the Python one it replaces (``format.decode_block`` over ``lz4.block`` and ``xxhash``):
the same entries from good blocks, and the same verdict on bad ones -- structural payload
errors with the same words, corrupt compressed bytes as "cannot decompress", changed bytes as a
checksum mismatch; blocks of both codecs (LZ4, stored uncompressed). Fixed seeds."""

from __future__ import annotations

import random

import numpy as np
import pytest

from statecore.checkpoint import format as fmt
from statecore.errors import CorruptCheckpointError

_native = pytest.importorskip("statecore._native")


def _table(stored: list[bytes], raws: list[int], entries: list[int], base: int = 100,
           codec: int = fmt.CODEC_LZ4):
    """Block-table rows (format.BLOCK_DTYPE) for blocks stored back to back from file offset
    ``base`` with ``codec``, and their concatenated bytes."""
    rows = np.zeros(len(stored), fmt.BLOCK_DTYPE)
    pos = base
    for i, s in enumerate(stored):
        rows[i] = (pos, len(s), raws[i], entries[i], codec, fmt.xxh64(s))
        pos += len(s)
    return rows, b"".join(stored)


def _python(data: bytes, rows, base: int, has_validity: bool):
    """What DataFileReader.entries' Python loop gives: (keys, values) or the error's reason."""
    keys, values = [], []
    try:
        for r in rows:
            s = data[int(r["offset"]) - base:int(r["offset"]) - base + int(r["stored_length"])]
            if len(s) != int(r["stored_length"]) or fmt.xxh64(s) != int(r["xxh64"]):
                raise CorruptCheckpointError("t: block checksum mismatch")
            p = fmt.inflate_stored(s, int(r["raw_length"]), int(r["codec"]), "t")
            k, v = fmt.decode_block(p, int(r["entries"]), "t", has_validity)
            keys += k.to_pylist()
            values += v.to_pylist()
    except CorruptCheckpointError as exc:
        return str(exc)[len("t: "):]
    return keys, values


def _native_result(data: bytes, rows, base: int, has_validity: bool):
    k, v, bad, why = _native.decode_blocks(data, rows, base, has_validity)
    if bad is not None:
        return why
    k.validate(full=True)
    v.validate(full=True)
    return k.to_pylist(), v.to_pylist()


def _same(data, rows, base, has_validity):
    py = _python(data, rows, base, has_validity)
    nat = _native_result(data, rows, base, has_validity)
    if any(isinstance(x, str) and x.startswith("cannot decompress") for x in (py, nat)):
        # LZ4's own words differ; a short output is "cannot decompress: decompressed size
        # mismatch" in Python.
        assert isinstance(py, str) and isinstance(nat, str), (py, nat)
    else:
        assert nat == py
    return nat


def _payloads(rnd: random.Random, count: int, has_validity: bool):
    out = []
    for _ in range(count):
        n = rnd.randrange(0, 40)
        keys = [bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 12))) for _ in range(n)]
        valid = [not has_validity or rnd.random() < 0.8 for _ in range(n)]
        vals = [bytes(rnd.randrange(3) for _ in range(rnd.randrange(0, 30))) if ok else b""
                for ok in valid]
        ko = np.concatenate(([0], np.cumsum([len(k) for k in keys]))).astype(np.int32)
        vo = np.concatenate(([0], np.cumsum([len(v) for v in vals]))).astype(np.int32)
        out.append((fmt.encode_block(ko, b"".join(keys), vo, b"".join(vals),
                                     np.array(valid, bool) if has_validity else None), n))
    return out


@pytest.mark.parametrize("codec", [fmt.CODEC_LZ4, fmt.CODEC_NONE])
@pytest.mark.parametrize("has_validity", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_good_blocks_decode_like_python(seed, has_validity, codec):
    rnd = random.Random(seed)
    blocks = _payloads(rnd, rnd.randrange(1, 8), has_validity)
    stored = [fmt.encode_stored(p, codec) for p, _ in blocks]
    rows, data = _table(stored, [len(p) for p, _ in blocks], [n for _, n in blocks],
                        codec=codec)
    keys, values = _same(data, rows, 100, has_validity)
    assert len(keys) == sum(n for _, n in blocks)
    # The bytes may be a slice of something larger (a prefetched range) and a pa.Buffer.
    import pyarrow as pa

    buf = pa.py_buffer(b"xx" + data + b"yy").slice(2, len(data))
    assert _native_result(buf, rows, 100, has_validity) == (keys, values)


def test_structural_errors_have_pythons_words():
    ko = np.array([0, 3, 5], np.int32)
    vo = np.array([0, 1, 4], np.int32)
    good = fmt.encode_block(ko, b"abcde", vo, b"wxyz")
    cases = [
        (good, 3, False),  # entry count disagrees with the table
        (b"\x01", 1, False),  # too short
        (good[:10], 2, False),  # truncated offsets
        (good + b"!", 2, False),  # longer than its offsets say
        (good[:-1], 2, False),
        (fmt.encode_block(np.array([0, 4, 3], np.int32), b"abc", vo, b"wxyz"), 2, False),
        (fmt.encode_block(np.array([1, 3, 5], np.int32), b"abcde", vo, b"wxyz"), 2, False),
        (good, 2, True),  # no room for a validity bitmap
    ]
    vo2 = np.array([0, 1, 1], np.int32)
    with_bits = fmt.encode_block(ko, b"abcde", vo2, b"v", np.array([True, False]))
    cases += [
        (with_bits[:-1] + bytes([with_bits[-1] | 0x80]), 2, True),  # a bit past the entries
        (fmt.encode_block(ko, b"abcde", vo2, b"v", np.array([False, True])), 2, True),
    ]
    for payload, n, hv in cases:
        rows, data = _table([fmt.compress_block(payload)], [len(payload)], [n])
        verdict = _same(data, rows, 100, hv)
        assert isinstance(verdict, str), (payload, n, hv)
    # After a good block, the bad one is named by its index.
    bad = cases[0][0]
    rows, data = _table([fmt.compress_block(good), fmt.compress_block(bad)],
                        [len(good), len(bad)], [2, 3])
    assert _native.decode_blocks(data, rows, 100, False)[2] == 1


@pytest.mark.parametrize("has_validity", [False, True])
def test_corrupt_stored_bytes(has_validity):
    """Any flipped byte: a checksum mismatch. With the checksum recomputed over the flipped bytes
    (a writer that was wrong, not a disk): whatever LZ4 and the payload checks make of them,
    never a crash, and the same verdict as Python's."""
    rnd = random.Random(9)
    blocks = _payloads(rnd, 3, has_validity)
    stored = [fmt.compress_block(p) for p, _ in blocks]
    raws, ns = [len(p) for p, _ in blocks], [n for _, n in blocks]
    rows, data = _table(stored, raws, ns)
    for _ in range(300):
        pos = rnd.randrange(len(data))
        flipped = data[:pos] + bytes([data[pos] ^ (1 << rnd.randrange(8))]) + data[pos + 1:]
        assert _same(flipped, rows, 100, has_validity) == "block checksum mismatch"
        rows2, _ = _table([flipped[int(r["offset"]) - 100:int(r["offset"]) - 100 +
                                   int(r["stored_length"])] for r in rows], raws, ns)
        _same(flipped, rows2, 100, has_validity)
    # Bytes missing at the end (a prefetched range too short), or a table pointing before them.
    assert _python(data[:-1], rows, 100, has_validity) == "block checksum mismatch"
    assert _native_result(data[:-1], rows, 100, has_validity).startswith("block lies outside")
    assert _native.decode_blocks(data, rows, 101, has_validity)[3].startswith("block lies outside")
    # A raw length the block does not decompress to.
    rows3 = rows.copy()
    rows3["raw_length"][0] += 1
    assert _same(data, rows3, 100, has_validity).startswith("cannot decompress")


@pytest.mark.parametrize("has_validity", [False, True])
def test_uncompressed_and_unknown_codec_blocks(has_validity):
    """An uncompressed block whose table record gives another raw length, and a record naming a
    codec that does not exist: the same words natively and in Python, never a crash; flipped
    bytes of uncompressed blocks are checksum mismatches, and with the checksum recomputed
    (a wrong writer) the payload checks judge them as they judge decompressed ones."""
    rnd = random.Random(13)
    blocks = _payloads(rnd, 3, has_validity)
    stored = [p for p, _ in blocks]
    raws, ns = [len(p) for p, _ in blocks], [n for _, n in blocks]
    rows, data = _table(stored, raws, ns, codec=fmt.CODEC_NONE)
    for delta in (1, -1):
        rows2 = rows.copy()
        rows2["raw_length"][1] = raws[1] + delta
        want = f"uncompressed block of {raws[1]} bytes, the block table says {raws[1] + delta}"
        assert _same(data, rows2, 100, has_validity) == want
        assert _verify(data, rows2, 100) == want
    for codec in (2, 7, 2**32 - 1):
        rows2 = rows.copy()
        rows2["codec"][2] = codec
        assert _same(data, rows2, 100, has_validity) == f"unknown block codec {codec}"
        assert _verify(data, rows2, 100) == f"unknown block codec {codec}"
        assert _native.decode_blocks(data, rows2, 100, has_validity)[2] == 2
    # Raw bytes read as LZ4 (a table naming the wrong codec): whatever LZ4 makes of them.
    rows2 = rows.copy()
    rows2["codec"] = fmt.CODEC_LZ4
    assert isinstance(_same(data, rows2, 100, has_validity), str)
    for _ in range(200):
        pos = rnd.randrange(len(data))
        flipped = data[:pos] + bytes([data[pos] ^ (1 << rnd.randrange(8))]) + data[pos + 1:]
        assert _same(flipped, rows, 100, has_validity) == "block checksum mismatch"
        rows2, _ = _table([flipped[int(r["offset"]) - 100:int(r["offset"]) - 100 +
                                   int(r["stored_length"])] for r in rows], raws, ns,
                          codec=fmt.CODEC_NONE)
        _same(flipped, rows2, 100, has_validity)


def _small_block_checkpoint(tmp_path):
    """A CheckpointStore at ``tmp_path`` whose version 1 holds 2,000 string values of a native
    int64-keyed value state ``v`` (max parallelism 8) in blocks of about 256 bytes."""
    import statecore
    from statecore import ValueStateDescriptor
    from statecore.checkpoint.store import CheckpointStore

    b = statecore.create_backend("native", key_type="int64", max_parallelism=8)
    st = b.get_state(ValueStateDescriptor("v", "string"))
    for k in range(2000):
        b.set_current_key(k)
        st.update(f"value-{k}" * 3)
    store = CheckpointStore(str(tmp_path))
    d = store.write_snapshot(b.snapshot(), 1, "p0", block_target_bytes=256)
    store.commit(1, [d])
    return store


def test_reader_uses_native_decoder_with_file_and_block_in_errors(tmp_path):
    """DataFileReader.entries goes through the native decoder and names the file, the state, the
    key group and the block of a bad one."""
    import statecore
    from statecore import ValueStateDescriptor

    assert fmt.native_decode_blocks is _native.decode_blocks
    store = _small_block_checkpoint(tmp_path)
    b2 = statecore.create_backend("native", key_type="int64", max_parallelism=8)
    b2.get_state(ValueStateDescriptor("v", "string"))
    store.restore(b2, 1)
    b2.set_current_key(1234)
    assert b2.get_state(ValueStateDescriptor("v", "string")).value() == "value-1234" * 3
    path = tmp_path / store.manifest(1)["files"][0]["path"]
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 3] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpointError, match=r"p0.*state 'v' key group \d+ block \d+: "
                                                     r"block checksum mismatch"):
        store.restore(statecore.create_backend("native", key_type="int64", max_parallelism=8), 1)


def _verify(data, rows, base):
    """``_native.verify_blocks``' verdict: the decompressed bytes or the reason."""
    raw, bad, why = _native.verify_blocks(data, rows, base)
    return raw if bad is None else why


@pytest.mark.parametrize("has_validity", [False, True])
def test_verify_blocks_checks_what_decode_checks_before_parsing(has_validity):
    """verify_blocks (the restore floor) gives decode_blocks' verdict on the stored bytes --
    bounds, checksum, LZ4 -- and parses nothing: good blocks give their raw bytes, also when
    their payloads would not parse."""
    rnd = random.Random(11)
    blocks = _payloads(rnd, 4, has_validity)
    stored = [fmt.compress_block(p) for p, _ in blocks]
    raws, ns = [len(p) for p, _ in blocks], [n for _, n in blocks]
    rows, data = _table(stored, raws, ns)
    assert _verify(data, rows, 100) == sum(raws)
    assert _verify(data, rows[:0], 100) == 0
    for _ in range(300):
        pos = rnd.randrange(len(data))
        flipped = data[:pos] + bytes([data[pos] ^ (1 << rnd.randrange(8))]) + data[pos + 1:]
        assert _verify(flipped, rows, 100) == "block checksum mismatch"
        rows2, _ = _table([flipped[int(r["offset"]) - 100:int(r["offset"]) - 100 +
                                   int(r["stored_length"])] for r in rows], raws, ns)
        decoded = _native_result(flipped, rows2, 100, has_validity)
        verified = _verify(flipped, rows2, 100)
        stored_bad = ("cannot decompress", "block checksum", "block lies")
        if isinstance(decoded, str) and decoded.startswith(stored_bad):
            assert verified == decoded
        else:  # decoded, or a payload that does not parse: the stored bytes are sound
            assert verified == sum(raws)
    # Truncated bytes, a table pointing before them, a raw length LZ4 does not produce.
    assert _verify(data[:-1], rows, 100).startswith("block lies outside")
    assert _verify(data, rows, 101).startswith("block lies outside")
    rows3 = rows.copy()
    rows3["raw_length"][2] += 1
    assert _verify(data, rows3, 100).startswith("cannot decompress")
    assert _native.verify_blocks(data, rows3, 100)[1] == 2
    # A payload that does not parse (wrong entry count) decompresses fine.
    rows4 = rows.copy()
    rows4["entries"][0] += 1
    assert _verify(data, rows4, 100) == sum(raws)
    assert isinstance(_native_result(data, rows4, 100, has_validity), str)


@pytest.mark.parametrize("native", [True, False])
def test_reader_verify_blocks_reads_a_key_group_range(tmp_path, monkeypatch, native):
    """DataFileReader.verify_blocks: the raw bytes of a key-group range's blocks (all states),
    read with one ranged read; a damaged block raises CorruptCheckpointError naming the file and
    the block, natively and without the native module."""

    if not native:
        monkeypatch.setattr(fmt, "native_verify_blocks", None)
    store = _small_block_checkpoint(tmp_path)
    with store.open(1) as reader:
        data = reader.data_file(reader.manifest["files"][0])
        _, per_kg = data.raw_bytes("v", 0, 7)
        assert data.verify_blocks(0, 7) == int(per_kg.sum())
        _, some = data.raw_bytes("v", 2, 4)
        before = data.bytes_read
        assert data.verify_blocks(2, 4) == int(some.sum())
        assert data.bytes_read - before == int(data.stored_sizes("v", 2, 4)[1].sum())
        assert data.verify_blocks(9, 12) == 0
    path = tmp_path / store.manifest(1)["files"][0]["path"]
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 3] ^= 0x10
    path.write_bytes(bytes(raw))
    with store.open(1) as reader:
        with pytest.raises(CorruptCheckpointError,
                           match=r"p0.*key groups 0\.\.7 block \d+: block checksum mismatch"):
            reader.data_file(reader.manifest["files"][0]).verify_blocks(0, 7)
