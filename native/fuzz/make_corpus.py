"""Seed corpora of the libFuzzer targets in native/fuzz/, cut from real checkpoints.

    PYTHONPATH=src python native/fuzz/make_corpus.py    # rewrites native/fuzz/corpus/*/seed-*
    PYTHONPATH=src python native/fuzz/make_corpus.py load_blocks    # that target's only

Both backends write a full and an incremental checkpoint (tombstones) of value, TTL value, list
and map states under a string, an int64 (two-byte key-group prefix) and a struct key; the
stored blocks of their data files (docs/formats.md "Data file") become the seeds, each in the
input layout its target's header comment describes. ``finding-*`` files are left alone.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import tempfile

import lz4.block
import numpy as np

import statecore
from statecore import CheckpointStore, StateTtlConfig
from statecore.checkpoint.format import BLOCK_DTYPE, INDEX_DTYPE, TRAILER, TRAILER_SIZE
from statecore.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
MAX_SEED_BYTES = 2048  # keeps the repository lean and inside libFuzzer's default -max_len
MAX_SEEDS = 24  # per target
TTL_MS = 1000
# key_type -> (max_parallelism, the key_codec target's schema byte and column bytes)
KEYS = {
    "string": (8, [0 | 0 << 3], [2]),
    "int64": (129, [0 | 2 << 3], [1]),
    "struct<int64,string>": (8, [1 | 4 | 0 << 3], [1, 2]),
}


def _states():
    return [
        ValueStateDescriptor("v", "int64"),
        ValueStateDescriptor("s", "string"),
        ValueStateDescriptor("ttl", "int64").enable_time_to_live(StateTtlConfig(TTL_MS)),
        ListStateDescriptor("l", "int64"),
        MapStateDescriptor("m", "string", "int64"),
    ]


def _keys(key_type: str) -> list:
    if key_type == "string":
        return ["a", "bb", "ccc", "dddd", "é"]
    if key_type == "int64":
        return [1, -2, 300, 2**40, 7]
    return [(1, "x"), (2, "yy"), (-3, ""), (4, "zz"), (5, "w")]


def _checkpoints(kind: str, key_type: str, root: str) -> list[str]:
    """Data files of a full and an incremental checkpoint."""
    mp = KEYS[key_type][0]
    b = statecore.create_backend(kind, key_type=key_type, max_parallelism=mp)
    states = [b.get_state(d) for d in _states()]
    v, s, ttl, lst, m = states
    for i, k in enumerate(_keys(key_type)):
        b.set_current_key(k)
        v.update(i * 1000)
        s.update("val" * i)
        ttl.update(-i)
        lst.add_all([i, i + 1])
        m.put("x", i)
        m.put("yy", -i)
    store = CheckpointStore(os.path.join(root, f"{kind}-{key_type}"))
    store.checkpoint(b, 1)
    for k in _keys(key_type)[:3]:
        b.set_current_key(k)
        v.clear()
        m.remove("x")
        s.update("changed")
    store.checkpoint(b, 2)
    files = [os.path.join(store.root, run["path"])
             for version in (1, 2) for run in store.manifest(version)["files"]]
    b.dispose()
    return files


def _blocks(path: str):
    """(state name, stored bytes, raw payload, entries, has_validity, key group) of every
    block, in file order."""
    with open(path, "rb") as f:
        raw = f.read()
    f_off, f_len = TRAILER.unpack(raw[-TRAILER_SIZE:])[:2]
    footer = raw[f_off:f_off + f_len]
    (mlen,) = struct.unpack_from("<I", footer, 0)
    meta = json.loads(footer[4:4 + mlen])
    n_blocks, n_index = struct.unpack_from("<QQ", footer, 4 + mlen)
    tables = 4 + mlen + 16
    blocks = np.frombuffer(footer, BLOCK_DTYPE, n_blocks, tables)
    index = np.frombuffer(footer, INDEX_DTYPE, n_index, tables + n_blocks * BLOCK_DTYPE.itemsize)
    names = [st["name"] for st in meta["states"]]
    incremental = meta.get("kind") == "incremental"
    for row in index:
        for bi in range(int(row["first_block"]), int(row["first_block"] + row["block_count"])):
            blk = blocks[bi]
            stored = raw[int(blk["offset"]):int(blk["offset"] + blk["stored_length"])]
            payload = lz4.block.decompress(stored, uncompressed_size=int(blk["raw_length"]))
            yield (names[int(row["state"])], stored, payload, int(blk["entries"]), incremental,
                   int(row["key_group"]))


def _entries(payload: bytes, has_validity: bool) -> list[tuple[bytes, bytes | None]]:
    (n,) = struct.unpack_from("<I", payload, 0)
    ko = struct.unpack_from(f"<{n + 1}i", payload, 4)
    vo = struct.unpack_from(f"<{n + 1}i", payload, 4 + 4 * (n + 1))
    kd = 4 + 8 * (n + 1)
    vd = kd + ko[-1]
    bits = payload[vd + vo[-1]:]
    out = []
    for i in range(n):
        live = not has_validity or (bits[i // 8] >> (i % 8)) & 1
        out.append((payload[kd + ko[i]:kd + ko[i + 1]],
                    payload[vd + vo[i]:vd + vo[i + 1]] if live else None))
    return out


def _bulk_load_seed(entries, prefix_bytes: int, has_validity: bool) -> bytes:
    kgs = [int.from_bytes(k[:prefix_bytes], "big") for k, _ in entries]
    lo = min(kgs)
    entries = [e for e, kg in zip(entries, kgs) if kg <= lo + 7]
    widths = {len(v) for _, v in entries if v is not None}
    width = widths.pop() + 1 if len(widths) == 1 and max(widths | {0}) < 15 else 0
    flags = (prefix_bytes == 2) | has_validity << 1 | has_validity << 3 | width << 4
    body = b"".join(bytes([len(k)]) + k + (b"\xff" if v is None else bytes([len(v)]) + v)
                    for k, v in entries)
    span = min(max(kgs) - lo, 7)
    return bytes([flags]) + struct.pack("<H", lo) + bytes([span, 0, 0]) + body


def _load_blocks_seed(blocks, prefix_bytes: int, has_validity: bool) -> bytes | None:
    """The load_blocks input of one state's blocks of one data file, ``[(key group, entries)]``
    in file order: the first up to 8 blocks within 12 key groups, keys without their prefix (the
    harness prepends it), widths fixed when the entries' are; None when an entry does not fit
    the layout (a key suffix or value over 31 bytes, over 63 entries a block)."""
    lo = blocks[0][0]
    blocks = [(kg, e) for kg, e in blocks if kg - lo < 12][:8]
    if any(len(e) > 63 or any(len(k) - prefix_bytes > 31 or (v is not None and len(v) > 31)
                              for k, v in e) for _, e in blocks):
        return None
    key_sizes = {len(k) for _, e in blocks for k, _ in e}
    value_sizes = {len(v) for _, e in blocks for _, v in e if v is not None}
    flags = ((prefix_bytes == 2) | has_validity << 1 | (not has_validity) << 2
             | (len(key_sizes) == 1) << 3 | (len(value_sizes) == 1) << 4)
    body = b"".join(
        bytes([kg - lo + 4, len(e)])
        + b"".join(bytes([len(k) - prefix_bytes]) + k[prefix_bytes:]
                   + (b"\xff" if v is None else bytes([len(v)]) + v) for k, v in e)
        for kg, e in blocks)
    return bytes([flags]) + struct.pack("<H", lo) + bytes([min(blocks[-1][0] - lo, 7)]) + body


def _ttl_seeds(values: list[bytes]) -> list[bytes]:
    ts = [int.from_bytes(v[-8:], "big", signed=True) for v in values if len(v) >= 8]
    now = struct.pack("<q", (max(ts) if ts else 0) + TTL_MS // 2)
    ttl = struct.pack("<q", TTL_MS)
    framed = b"".join(bytes([len(v)]) + v for v in values)
    offsets = np.concatenate(([0], np.cumsum([len(v) for v in values]))).astype("<i4")
    raw = bytes([len(values)]) + offsets.tobytes() + b"".join(values)
    return [b"\x00" + now + ttl + framed, b"\x01" + now + ttl + framed, b"\x02" + now + ttl + raw]


def make_seeds(tmp: str) -> dict[str, list[bytes]]:
    seeds: dict[str, list[bytes]] = {"block_decode": [], "bulk_load": [], "key_codec": [],
                                     "load_blocks": [], "ttl_value": []}
    for key_type, (mp, head, cols) in KEYS.items():
        prefix_bytes = 2 if mp > 128 else 1
        for kind in ("python", "native"):
            for path in _checkpoints(kind, key_type, tmp):
                per_state: dict[str, list] = {}
                for name, stored, payload, n, hv, kg in _blocks(path):
                    # LZ4 (flags 0 / 2) and uncompressed (32 / 34: the payload stored as is).
                    seeds["block_decode"] += [bytes([hv]) + payload,
                                              bytes([hv | 2]) + struct.pack("<II", len(payload), n)
                                              + stored,
                                              bytes([hv | 32]) + payload,
                                              bytes([hv | 34]) + struct.pack("<II", len(payload),
                                                                             n) + payload]
                    entries = _entries(payload, hv)
                    per_state.setdefault(name, []).append((kg, entries, hv))
                    if entries:
                        seeds["bulk_load"].append(_bulk_load_seed(entries, prefix_bytes, hv))
                        seeds["key_codec"].append(bytes(head + cols) + entries[0][0])
                    if name == "ttl":
                        live = [v for _, v in entries if v is not None]
                        seeds["ttl_value"] += _ttl_seeds(live)
                for blocks in per_state.values():
                    seed = _load_blocks_seed([(kg, e) for kg, e, _ in blocks], prefix_bytes,
                                             blocks[0][2])
                    if seed is not None:
                        seeds["load_blocks"].append(seed)
    return seeds


def main(targets: list[str]) -> int:
    """Rewrites the seeds of ``targets`` (every target when empty)."""
    with tempfile.TemporaryDirectory() as tmp:
        seeds = make_seeds(tmp)
    for target, items in seeds.items():
        if targets and target not in targets:
            continue
        d = os.path.join(CORPUS, target)
        os.makedirs(d, exist_ok=True)
        for name in os.listdir(d):
            if name.startswith("seed-"):
                os.remove(os.path.join(d, name))
        # Distinct seeds, small ones first, at most MAX_SEEDS: the fuzzer grows the rest.
        kept = sorted({s for s in items if len(s) <= MAX_SEED_BYTES}, key=lambda s: (len(s), s))
        kept = kept[:: max(1, len(kept) // MAX_SEEDS)][:MAX_SEEDS]
        for i, data in enumerate(kept):
            with open(os.path.join(d, f"seed-{i:03d}"), "wb") as f:
                f.write(data)
        print(f"{target}: {len(kept)} seeds, {sum(map(len, kept))} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
