"""The seed inputs of the fuzz targets, made from real checkpoints of both backends
(``python -m fuzz --make-corpus`` writes them to ``fuzz/corpus/<target>/``)."""

from __future__ import annotations

import os
import struct
import tempfile

import numpy as np
import pyarrow as pa

import statecore
from statecore import CheckpointStore
from statecore.checkpoint.blocks import encode_block
from statecore.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
)

__all__ = ["make_corpus", "operator_state_seeds"]


def operator_state_seeds() -> list[bytes]:
    """Inputs of the ``operator_state`` target from real snapshots of each state of
    ``fuzz.targets.OPERATOR_STATES`` (python backend; the native one snapshots the same
    bytes)."""
    from fuzz.targets import OPERATOR_STATES

    samples = {"int64": [3, -1, 7], "string": ["a", "", "xyz"], "float64": [1.5, -0.0],
               "binary": [b"\x00", b"ab"], "fixed_size_binary[2]": [b"ab", b"\xff\x00"]}
    ukeys = {"string": ["k", "longer key"], "int64": [5, -9]}
    out = []
    for i, (kind, value_type, user_key_type) in enumerate(OPERATOR_STATES):
        b = statecore.create_backend("python", key_type="string", max_parallelism=8)
        ops = b.operator_state
        if kind == "operator_broadcast":
            ops.get_broadcast_state(MapStateDescriptor("o", user_key_type, value_type)).put_all(
                dict(zip(ukeys[user_key_type], samples[value_type])))
        elif kind == "operator_list":
            ops.get_list_state("o", value_type).add_all(samples[value_type])
        else:
            ops.get_union_list_state("o", value_type).add_all(samples[value_type])
        keys, values = b.snapshot().entries("__operator__.o", 0)
        out.append(bytes([i]) + b"".join(
            struct.pack("<H", len(k)) + k + struct.pack("<H", len(v)) + v
            for k, v in zip(keys.to_pylist(), values.to_pylist())))
        b.dispose()
    return out


def _backend(kind: str):
    from fuzz.targets import STATES

    b = statecore.create_backend(kind, key_type="string", max_parallelism=8)
    states = []
    for i, make in enumerate(STATES):
        d = make(f"s{i}")
        states.append((i, b.get_state(d), d))
    b.get_state(ReducingStateDescriptor("sum", "sum", "int64"))
    for k in ("a", "bb", "ccc"):
        b.set_current_key(k)
        for _, st, d in states:
            if isinstance(d, MapStateDescriptor):
                uk = ["x", "y"] if d.user_key_type == "string" else [1, -2]
                for u in uk:
                    st.put(u, 7 if d.value_type == "int64" else "v")
            elif isinstance(d, ListStateDescriptor):
                st.add_all(["p", "q"] if d.value_type == "string" else [1, 2])
            else:
                st.update({"string": "val", "int64": 42, "float64": 1.5}[d.value_type])
        b.timers.register_event_time_timer(1000)
    return b, states


def make_corpus(root: str) -> dict:
    """Write the seeds under ``root``; returns ``{target: number of seeds}``."""
    seeds: dict[str, list[bytes]] = {t: [] for t in ("data_file", "block", "manifest", "stored",
                                                     "encoded_key", "arrow_batch")}
    seeds["operator_state"] = operator_state_seeds()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("python", "native"):
            b, states = _backend(kind)
            store = CheckpointStore(os.path.join(tmp, kind))
            store.checkpoint(b, 1)
            man = os.path.join(store.root, store.manifest_name(1))
            with open(man, "rb") as f:
                seeds["manifest"].append(f.read())
            for run in store.manifest(1)["files"]:
                with open(os.path.join(store.root, run["path"]), "rb") as f:
                    raw = f.read()
                seeds["data_file"] += [b"\x00" + raw, b"\x01" + raw]
            snap = b.snapshot()
            for kg in range(8):
                keys, vals = snap.entries("s0", kg)
                if len(keys):
                    ko = np.frombuffer(keys.buffers()[1], np.int32)[:len(keys) + 1]
                    vo = np.frombuffer(vals.buffers()[1], np.int32)[:len(vals) + 1]
                    payload = encode_block(ko - ko[0], keys.buffers()[2].to_pybytes()[ko[0]:ko[-1]],
                                           vo - vo[0], vals.buffers()[2].to_pybytes()[vo[0]:vo[-1]])
                    seeds["block"].append(b"\x00" + payload)
            for i, _, d in states:
                for kg in range(8):
                    keys, vals = snap.entries(d.name, kg)
                    for k, v in zip(keys.to_pylist()[:1], vals.to_pylist()[:1]):
                        seeds["stored"].append(bytes([i]) + struct.pack("<H", len(k)) + k + v)
                        seeds["encoded_key"].append(k)
            for kg in range(8):
                keys, _ = snap.entries("__timers__", kg)
                seeds["encoded_key"].extend(keys.to_pylist()[:1])
            snap.release()
            b.dispose()
    for cols in ([pa.array(["a", "b", None]), pa.array([1, 2, 3], pa.int64())],
                 [pa.array([1.5, 2.5]), pa.array(["x", "é"])],
                 [pa.array([1, 2], pa.int64()), pa.array([3, 4], pa.int64())]):
        t = pa.table({f"c{i}": c for i, c in enumerate(cols)})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        seeds["arrow_batch"].append(sink.getvalue().to_pybytes())
    counts = {}
    for target, items in seeds.items():
        d = os.path.join(root, target)
        os.makedirs(d, exist_ok=True)
        unique = sorted(set(items))
        for i, data in enumerate(unique):
            with open(os.path.join(d, f"seed-{i:03d}"), "wb") as f:
                f.write(data)
        counts[target] = len(unique)
    return counts
