"""Blocks of checkpoint data files: payload encoding and decoding, the cut into blocks, LZ4
compression and XXH64 checksums (byte layout: docs/formats.md "Data file", "Block" and "Block
payload").

A payload holds the entries of one (state, key group) as Arrow ``binary`` offsets and data, so
a reader builds ``pa.BinaryArray`` over the decompressed bytes without copying. The compressor is
the native one when the extension is built (the one the asynchronous writer uses), so files
written with or without a background thread are byte-identical; :data:`native_decode_blocks`
decodes many blocks in one call with the same checks as :func:`decode_stored_block`.
"""

from __future__ import annotations

import struct

import lz4.block
import numpy as np
import pyarrow as pa
import xxhash

from statecore.errors import CorruptCheckpointError

__all__ = ["LZ4_ACCELERATION", "CODEC_LZ4", "CODEC_NONE", "CODECS", "compress_block",
           "encode_stored", "inflate_stored", "native_decode_blocks",
           "native_verify_blocks", "xxh64", "encode_block",
           "decode_block", "decode_stored_block", "cut_points", "DEFAULT_BLOOM_BITS_PER_KEY",
           "MAX_BLOOM_BITS_PER_KEY", "bloom_hashes", "bloom_filter_bytes", "key_hashes",
           "bloom_filter", "bloom_filter_of_keys", "bloom_probe"]

_U32 = struct.Struct("<I")

#: LZ4 acceleration of the blocks (native block_codec.h kLz4Acceleration, which says why 2).
LZ4_ACCELERATION = 2

#: Block codecs, the block table record's ``codec`` (native block_codec.h kCodecLz4 /
#: kCodecNone, which says when a block is better stored uncompressed).
CODEC_LZ4 = 0
CODEC_NONE = 1
#: A data file's meta ``compression`` -> the codec of every one of its blocks.
CODECS = {"lz4.block": CODEC_LZ4, "none": CODEC_NONE}


def _block_compressor():
    """The LZ4 block compressor of this install: the native one (vendored LZ4, the one the
    asynchronous writer uses, so synchronous and asynchronous files are byte-identical) when the
    extension is built, else the ``lz4`` binding; both give LZ4 block format bytes without a
    stored size, which ``lz4.block.decompress`` reads."""
    try:
        from statecore._native import lz4_block_compress
        return lz4_block_compress
    except ImportError:
        return lambda payload: lz4.block.compress(payload, mode="fast",
                                                  acceleration=LZ4_ACCELERATION,
                                                  store_size=False)


#: ``compress_block(payload) -> bytes``: LZ4 block format without a stored size.
compress_block = _block_compressor()

#: ``statecore._native.decode_blocks`` (checksums, decompresses and decodes the blocks of a byte
#: range into one ``(keys, values)`` pair), or None without the native extension: readers then
#: decode block by block in Python (:func:`decode_stored_block`).
try:
    from statecore._native import decode_blocks as native_decode_blocks
except ImportError:
    native_decode_blocks = None

#: ``statecore._native.verify_blocks`` (checksums and decompresses the blocks of a byte range,
#: decoding nothing: the floor under :data:`native_decode_blocks`), or None without the native
#: extension.
try:
    from statecore._native import verify_blocks as native_verify_blocks
except ImportError:
    native_verify_blocks = None


def encode_stored(payload, codec: int):
    """The stored bytes of the block ``payload`` (bytes-like) under ``codec`` (:data:`CODECS`):
    :data:`compress_block`'s for CODEC_LZ4, the payload itself for CODEC_NONE. ValueError for
    another codec."""
    if codec == CODEC_LZ4:
        return compress_block(payload)
    if codec == CODEC_NONE:
        return payload
    raise ValueError(f"unknown block codec {codec}")


def inflate_stored(stored, raw_length: int, codec: int, where: str) -> bytes:
    """The payload of one stored block (``stored``: bytes, its checksum already checked) under
    ``codec``, exactly ``raw_length`` bytes. CorruptCheckpointError (message starting with
    ``where``) for an unknown codec, an LZ4 error or another length."""
    if codec == CODEC_NONE:
        if len(stored) != raw_length:
            raise CorruptCheckpointError(
                f"{where}: uncompressed block of {len(stored)} bytes, the block table says "
                f"{raw_length}")
        return stored
    if codec != CODEC_LZ4:
        raise CorruptCheckpointError(f"{where}: unknown block codec {codec}")
    try:
        payload = lz4.block.decompress(stored, uncompressed_size=raw_length)
    except Exception as exc:  # lz4.block.LZ4BlockError
        raise CorruptCheckpointError(f"{where}: cannot decompress: {exc}") from exc
    if len(payload) != raw_length:
        raise CorruptCheckpointError(f"{where}: cannot decompress: decompressed size mismatch")
    return payload


def xxh64(data) -> int:
    """XXH64 (seed 0) of ``data`` (bytes-like) as an unsigned 64-bit int."""
    return xxhash.xxh64_intdigest(data)



#: Bloom filter bits per key of format-6 files (about 1% false positives with 7 hashes).
DEFAULT_BLOOM_BITS_PER_KEY = 10
MAX_BLOOM_BITS_PER_KEY = 64


def bloom_hashes(bits_per_key: int) -> int:
    """Probes per key of a Bloom filter of ``bits_per_key`` bits per key: round(bits * ln 2)
    in integers, ``(bits * 69 + 50) // 100``, clamped to [1, 30] (docs/formats.md "Data file",
    "Filters"; the optimum for a Bloom filter, Kirsch-Mitzenmacher double hashing)."""
    return max(1, min(30, (int(bits_per_key) * 69 + 50) // 100))


def bloom_filter_bytes(n: int, bits_per_key: int) -> int:
    """Bytes of the Bloom filter of ``n`` keys: ``n * bits_per_key`` bits rounded up to whole
    64-bit words, at least one word."""
    return max(1, (int(n) * int(bits_per_key) + 63) // 64) * 8


try:
    from statecore._native import key_hashes as _native_key_hashes
except ImportError:
    _native_key_hashes = None


def key_hashes(keys: pa.BinaryArray) -> np.ndarray:
    """XXH64 (seed 0) of every value of the binary array ``keys`` (no nulls) as a uint64
    array: natively with the GIL released when the extension is built, else ``xxhash`` per
    key."""
    if _native_key_hashes is not None:
        return _native_key_hashes(keys)
    return np.fromiter((xxhash.xxh64_intdigest(k) for k in keys.to_pylist()), dtype=np.uint64,
                       count=len(keys))


try:
    from statecore._native import bloom_filter_of_keys as _native_bloom_filter_of_keys
    from statecore._native import bloom_probe_hashes as _native_bloom_probe
except ImportError:
    _native_bloom_filter_of_keys = _native_bloom_probe = None


def _bloom_positions(hashes: np.ndarray, bits: int, k: int) -> np.ndarray:
    """(len(hashes), k) bit positions: ``(h1 + i * h2) mod bits`` for ``i < k``, ``h1`` the low
    and ``h2`` the high 32 bits of each hash, as ``p_0 = h1 mod bits`` and ``p_{i+1} = (p_i +
    (h2 mod bits)) mod bits`` (the same positions, two remainders per key instead of ``k``)."""
    b = np.uint64(bits)
    p = (hashes & np.uint64(0xFFFFFFFF)) % b
    d = (hashes >> np.uint64(32)) % b
    out = np.empty((len(hashes), k), dtype=np.uint64)
    out[:, 0] = p
    for i in range(1, k):
        p = p + d
        p -= b * (p >= b)
        out[:, i] = p
    return out


def bloom_filter(hashes: np.ndarray, bits_per_key: int) -> bytes:
    """The Bloom filter (docs/formats.md "Data file", "Filters") of the keys whose XXH64 hashes
    are ``hashes`` (uint64 array, :func:`key_hashes`): :func:`bloom_filter_bytes` bytes, bit
    ``p`` is bit ``p % 8`` of byte ``p // 8``, set for the :func:`bloom_hashes` positions of
    every key (Kirsch-Mitzenmacher double hashing)."""
    nbytes = bloom_filter_bytes(len(hashes), bits_per_key)
    bits = np.zeros(nbytes * 8, dtype=bool)
    if len(hashes):
        bits[_bloom_positions(np.asarray(hashes, np.uint64), nbytes * 8,
                              bloom_hashes(bits_per_key)).ravel().astype(np.int64)] = True
    return np.packbits(bits, bitorder="little").tobytes()


def bloom_filter_of_keys(keys: pa.BinaryArray, bits_per_key: int) -> bytes:
    """:func:`bloom_filter` of the keys of the binary array ``keys`` (no nulls): the same bytes
    as ``bloom_filter(key_hashes(keys), bits_per_key)``, with the native extension in one pass
    (each key hashed and its probes set while it is in cache) with the GIL released."""
    if _native_bloom_filter_of_keys is not None:
        return _native_bloom_filter_of_keys(keys, bits_per_key)
    return bloom_filter(key_hashes(keys), bits_per_key)


def bloom_probe(filt, k: int, hashes: np.ndarray) -> np.ndarray:
    """Bool array: for each of ``hashes`` (uint64), whether the filter ``filt`` (bytes-like,
    :func:`bloom_filter`) with ``k`` probes may hold its key (False: certainly not); natively
    with the GIL released when the extension is built."""
    if not len(hashes):
        return np.zeros(0, dtype=bool)
    if _native_bloom_probe is not None and len(filt):
        return _native_bloom_probe(filt, k, hashes)
    raw = np.frombuffer(filt, dtype=np.uint8)
    pos = _bloom_positions(np.asarray(hashes, np.uint64), len(raw) * 8, k).astype(np.int64)
    hit = (raw[pos >> 3] >> (pos & 7).astype(np.uint8)) & 1
    return hit.all(axis=1)


def encode_block(key_offsets: np.ndarray, key_data, value_offsets: np.ndarray, value_data,
                 validity: np.ndarray | None = None) -> bytes:
    """Uncompressed block payload (docs/formats.md "Data file") from zero-based int32 offsets
    (n + 1 each) and the matching data bytes. ``validity`` (n bools, False = tombstone) appends
    the bitmap of incremental files; ``None`` writes a full-file payload."""
    n = len(key_offsets) - 1
    parts = [_U32.pack(n), key_offsets.astype("<i4", copy=False).tobytes(),
             value_offsets.astype("<i4", copy=False).tobytes(), bytes(key_data), bytes(value_data)]
    if validity is not None:
        parts.append(np.packbits(np.asarray(validity, dtype=bool), bitorder="little").tobytes())
    return b"".join(parts)


def decode_block(payload, expected_entries: int, where: str, has_validity: bool = False
                 ) -> tuple[pa.BinaryArray, pa.BinaryArray]:
    """Parse an uncompressed block payload into ``(keys, values)`` binary arrays (zero-copy over
    ``payload``). With ``has_validity`` (incremental files) the payload ends with the validity
    bitmap and tombstones come back as NULL values. Raises CorruptCheckpointError (message
    starts with ``where``) when the structure is inconsistent."""
    buf = pa.py_buffer(payload)
    size = buf.size
    if size < 4:
        raise CorruptCheckpointError(f"{where}: block payload of {size} bytes is too short")
    (n,) = _U32.unpack_from(buf, 0)
    if n != expected_entries:
        raise CorruptCheckpointError(
            f"{where}: block holds {n} entries, block table says {expected_entries}")
    head = 4 + 8 * (n + 1)
    if size < head:
        raise CorruptCheckpointError(f"{where}: block payload truncated in its offsets")
    koff = np.frombuffer(buf, dtype="<i4", count=n + 1, offset=4)
    voff = np.frombuffer(buf, dtype="<i4", count=n + 1, offset=4 + 4 * (n + 1))
    for name, off in (("key", koff), ("value", voff)):
        if off[0] != 0 or (n and bool(np.any(np.diff(off) < 0))):
            raise CorruptCheckpointError(f"{where}: {name} offsets are not non-decreasing from 0")
    klen, vlen = int(koff[-1]), int(voff[-1])
    blen = (n + 7) // 8 if has_validity else 0
    if size != head + klen + vlen + blen:
        raise CorruptCheckpointError(
            f"{where}: block payload is {size} bytes, its offsets describe "
            f"{head + klen + vlen + blen}")
    validity = None
    if has_validity:
        bits = np.frombuffer(buf, dtype=np.uint8, count=blen, offset=head + klen + vlen)
        valid = np.unpackbits(bits, bitorder="little")
        if bool(np.any(valid[n:])):
            raise CorruptCheckpointError(f"{where}: validity bitmap has bits set past the entries")
        valid = valid[:n].astype(bool)
        if bool(np.any(np.diff(voff)[~valid] != 0)):
            raise CorruptCheckpointError(f"{where}: a tombstone carries value bytes")
        if not bool(valid.all()):
            validity = buf.slice(head + klen + vlen, blen)
    keys = pa.BinaryArray.from_buffers(
        pa.binary(), n, [None, buf.slice(4, 4 * (n + 1)), buf.slice(head, klen)])
    values = pa.BinaryArray.from_buffers(
        pa.binary(), n, [validity, buf.slice(4 + 4 * (n + 1), 4 * (n + 1)),
                         buf.slice(head + klen, vlen)])
    return keys, values


def cut_points(key_offsets: np.ndarray, value_offsets: np.ndarray, target: int) -> list[int]:
    """Entry indices ``[0, c1, ..., n]`` cutting ``n`` entries into blocks of at most ``target``
    payload bytes (the cutting rule of docs/formats.md "Data file"), from the offsets (n + 1
    each, integer arrays) of their keys and values."""
    n = len(key_offsets) - 1
    sizes = np.diff(key_offsets).astype(np.int64) + np.diff(value_offsets) + 8
    cum = np.cumsum(sizes)
    cuts = [0]
    i = 0
    while i < n:
        base = int(cum[i - 1]) if i else 0
        j = int(np.searchsorted(cum, base + target - 12, side="right"))
        j = max(j, i + 1)
        cuts.append(j)
        i = j
    return cuts



def decode_stored_block(stored, raw_length: int, entries: int, expected_xxh64: int, where: str,
                        has_validity: bool = False, codec: int = CODEC_LZ4
                        ) -> tuple[pa.BinaryArray, pa.BinaryArray]:
    """Check and decode one stored block (``stored``: its bytes as written, ``codec`` its block
    table record's): the checksum (``expected_xxh64``) before decoding, the payload's size
    (``raw_length``, :func:`inflate_stored`), then the payload (:func:`decode_block`). Raises
    CorruptCheckpointError (message starting with ``where``) on any mismatch."""
    if xxh64(stored) != expected_xxh64:
        raise CorruptCheckpointError(f"{where}: block checksum mismatch")
    payload = inflate_stored(stored, raw_length, codec, where)
    return decode_block(payload, entries, where, has_validity=has_validity)
