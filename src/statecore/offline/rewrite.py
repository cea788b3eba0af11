"""Rewrite a checkpoint version for another max parallelism (the number of key groups).

A checkpoint's max parallelism is fixed for its life: every entry's key starts with its key
group, and the operator refuses a checkpoint of another max parallelism, as Flink refuses to
restore keyed state under a changed ``maxParallelism``. Flink's State Processor API is how a
Flink user changes it (read the savepoint, write a new one); :func:`rewrite_max_parallelism` is
statecore's: it reads every state and timer of one version, assigns each key its key group
under the new max parallelism (the checkpoint's assigner: Spark's or Flink's rule), re-prefixes
the entry keys (docs/formats.md "Keys": the key-group prefix is 1 byte up to 128 key groups, 2
above) and writes the entries as full runs of a new checkpoint root, at the same version number
with the same committed metadata (its ``max_parallelism`` replaced), so a job continues from it
with the new max parallelism. Values, TTL timestamps, namespaces and user keys are copied as
they are.

Memory: the new key groups are written in passes, each holding the entries of a contiguous range
of them; the number of passes follows from ``memory_bytes`` and the version's uncompressed size
(each pass reads the whole version again).
"""

from __future__ import annotations

import math
from typing import Optional

from statecore import serializers as S
from statecore.checkpoint import CheckpointStore
from statecore.errors import CorruptCheckpointError, InvalidInputError
from statecore.key_groups import assign_key_group, check_max_parallelism
from statecore.offline.entry_snapshot import EntrySnapshot
from statecore.offline.state_reader import open_version
from statecore.operator_state import is_operator_state_meta

__all__ = ["rewrite_max_parallelism"]

#: Default bound of the entries one pass holds (bytes of keys and values, before Python's own
#: object overhead).
DEFAULT_MEMORY_BYTES = 256 * 1024 * 1024


def _rekey(reader, meta: dict, new_mp: int, start: int, end: int, out: dict) -> None:
    """Add the entries of state ``meta`` whose key falls into new key groups ``[start, end]`` to
    ``out[kg]`` as (new key bytes, value bytes)."""
    name = meta["name"]
    old_mp = reader.max_parallelism
    key_type, assigner = reader.key_type, reader.assigner
    ks = S.key_serializer(key_type)
    # A timer's key puts its 8-byte timestamp between the prefix and the key (formats.md).
    skip = 8 if meta.get("kind") == "timers" else 0
    lo, hi = reader.key_group_range.start, reader.key_group_range.end
    for keys, values in reader.entries_chunks(name, lo, hi):
        for kb, vb in zip(keys.to_pylist(), values.to_pylist()):
            try:
                _, pos = S.read_key_group_prefix(kb, old_mp)
                key, _ = ks.read(kb, pos + skip)
            except InvalidInputError as exc:
                raise CorruptCheckpointError(
                    f"checkpoint version {reader.version}: state {name!r}: entry key "
                    f"{bytes(kb).hex()} does not decode: {exc}") from exc
            kg = assign_key_group(key, key_type, new_mp, assigner)
            if start <= kg <= end:
                out.setdefault(kg, []).append((S.key_group_prefix(kg, new_mp) + kb[pos:], vb))


def rewrite_max_parallelism(source, output, max_parallelism: int,
                            version: Optional[int] = None,
                            memory_bytes: int = DEFAULT_MEMORY_BYTES) -> dict:
    """Write ``version`` (default: the latest) of the checkpoint root ``source`` (a
    CheckpointStore or URI) re-partitioned into ``max_parallelism`` key groups as the same
    version of the new, empty root ``output``; returns the committed manifest (dict).

    Raises InvalidInputError for a ``max_parallelism`` outside [1, 32768], a ``memory_bytes``
    below 1, a ``source`` version that does not cover every key group (a part of a
    checkpoint: rewrite the whole), or an ``output`` that already holds versions;
    CheckpointNotFoundError when ``source`` has no such version; CorruptCheckpointError for a
    run of ``source`` that cannot be read or an entry whose key does not decode;
    InvalidInputError for a version holding operator state (its writers are not kept). A failure
    leaves ``output`` without a committed version."""
    new_mp = check_max_parallelism(max_parallelism)
    if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes < 1:
        raise InvalidInputError(f"memory_bytes must be a positive int, got {memory_bytes!r}")
    out_store = output if isinstance(output, CheckpointStore) else CheckpointStore(output)
    if out_store.versions():
        raise InvalidInputError(f"output {out_store.uri} already holds versions "
                                f"{out_store.versions()[-5:]}; rewrite into an empty root")
    with open_version(source, version) as reader:
        manifest = reader.manifest
        lo, hi = reader.key_group_range.start, reader.key_group_range.end
        if (lo, hi) != (0, reader.max_parallelism - 1):
            raise InvalidInputError(
                f"version {reader.version} covers key groups {lo}..{hi} of "
                f"{reader.max_parallelism}, not all of them; rewrite a complete version")
        metas = reader.state_metas()
        ops = [m["name"] for m in metas if is_operator_state_meta(m)]
        if ops:
            # Operator state belongs to the version's writers (docs/formats.md "Operator
            # state"); the rewritten version's runs are passes, not those writers.
            raise InvalidInputError(
                f"version {reader.version} holds operator state {ops}, which a rewrite for "
                "another max parallelism does not carry")
        raw = sum(int(f.get("raw_bytes", 0)) for f in manifest["files"])
        passes = max(1, min(new_mp, math.ceil(raw / memory_bytes)))
        descriptors = []
        for p in range(passes):
            start, end = new_mp * p // passes, new_mp * (p + 1) // passes - 1
            data = {}
            for meta in metas:
                _rekey(reader, meta, new_mp, start, end, data.setdefault(meta["name"], {}))
            snap = EntrySnapshot(new_mp, start, end, reader.key_type, reader.assigner, metas, data)
            descriptors.append(out_store.write_snapshot(snap, reader.version,
                                                        f"rewrite-{p}"))
            snap.release()
        metadata = dict(manifest.get("metadata") or {})
        if "max_parallelism" in metadata:
            metadata["max_parallelism"] = new_mp
        if "writers" in metadata:
            metadata["writers"] = [d["writer"] for d in descriptors]
        return out_store.commit(reader.version, descriptors, metadata=metadata)
