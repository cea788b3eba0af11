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

Operator state (docs/formats.md "Operator state") belongs to the version's writers, the old
tasks, not to key groups; each pass writes one run, a writer of the new version. There are at
least as many passes as old writers (up to the new max parallelism), and old writer ``j``'s
operator state goes, unchanged, to pass ``j`` (stored in the pass's first key group), so a job
restored at its old parallelism gets every task's even-split list back, as it would from the
source version. When the new max parallelism is below the number of old writers (such a job
runs at a lower parallelism anyway), the writers from the last pass on are merged into it: list
elements concatenated in writer order, one broadcast copy kept -- what a restore at a changed
parallelism concatenates and copies in any case (Flink ``RoundRobinOperatorStateRepartitioner``).
When memory needs more passes than there were writers, the extra writers hold no operator state
and a restore redistributes even-split lists as for a changed parallelism.
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
from statecore.operator_state import BROADCAST, is_operator_state_meta

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


def _operator_entries(writers: list, new_mp: int, first_key_group: int) -> tuple:
    """The operator states of the old ``writers`` (merged in order) as one new writer's, stored
    in ``first_key_group`` of ``new_mp``: ``(metas, {pseudo-state: {kg: [(key, value)]}})``.
    List keys are renumbered (``prefix | seq``, seq 0..n-1), a broadcast state's entries are
    the first writer's that holds it."""
    prefix = S.key_group_prefix(first_key_group, new_mp)
    metas, data = {}, {}
    for w in writers:
        old_len = len(S.key_group_prefix(w.first_key_group, w.max_parallelism))
        for name, meta in w.metas.items():
            if name in metas and meta["kind"] == BROADCAST:
                continue
            metas.setdefault(name, meta)
            out = data.setdefault(name, {}).setdefault(first_key_group, [])
            keys, values = w.entries(name)
            if meta["kind"] == BROADCAST:
                out.extend((prefix + k[old_len:], v)
                           for k, v in zip(keys.to_pylist(), values.to_pylist()))
            else:
                base = len(out)
                out.extend((prefix + (base + i).to_bytes(8, "big"), v)
                           for i, v in enumerate(values.to_pylist()))
    return list(metas.values()), data


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
    run of ``source`` that cannot be read or an entry whose key does not decode. Operator
    state is carried per old writer (module docstring). A failure leaves ``output`` without a
    committed version."""
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
        keyed = [m for m in reader.state_metas() if not is_operator_state_meta(m)]
        old_writers = reader.operator_state_writers()
        raw = sum(int(f.get("raw_bytes", 0)) for f in manifest["files"])
        passes = math.ceil(raw / memory_bytes)
        if any(w.metas for w in old_writers):
            passes = max(passes, len(old_writers))
        passes = max(1, min(new_mp, passes))
        descriptors = []
        for p in range(passes):
            start, end = new_mp * p // passes, new_mp * (p + 1) // passes - 1
            mine = old_writers[p:] if p == passes - 1 else old_writers[p:p + 1]
            op_metas, data = _operator_entries(mine, new_mp, start)
            for meta in keyed:
                _rekey(reader, meta, new_mp, start, end, data.setdefault(meta["name"], {}))
            snap = EntrySnapshot(new_mp, start, end, reader.key_type, reader.assigner,
                                 keyed + op_metas, data)
            descriptors.append(out_store.write_snapshot(snap, reader.version,
                                                        f"rewrite-{p}"))
            snap.release()
        metadata = dict(manifest.get("metadata") or {})
        if "max_parallelism" in metadata:
            metadata["max_parallelism"] = new_mp
        if "writers" in metadata:
            metadata["writers"] = [d["writer"] for d in descriptors]
        return out_store.commit(reader.version, descriptors, metadata=metadata)
