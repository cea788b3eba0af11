"""Manifests: the one file per committed version that says which runs make it.

A version exists for readers only once its manifest exists (``manifest-V.json``,
statecore.checkpoint.layout); a manifest is written last, after every run it lists, and
atomically, so a reader sees either no version or a complete one. :class:`ManifestLog` lists,
reads (checking everything the format requires) and writes them; the commit protocol
(statecore.checkpoint.commit) and compaction (statecore.checkpoint.compaction) decide what they
hold.

Manifest fields, canonical JSON, checksum and validity rules: docs/formats.md "Checkpoint store
and manifests". A read checks all of them and raises CorruptCheckpointError for a manifest that
breaks one.

A *metadata-only* manifest (``format_version`` 3, field ``external``) commits a version whose
keyed state lives in an external store (statecore.external): it lists no runs and no states
and names the store's namespace, epoch and write-ahead logs instead, so that writing it is the
commit decision of that epoch. Readers built before it refuse it by its format version rather
than take it for an empty checkpoint.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from typing import Any

import pyarrow.fs as pafs

from statecore.checkpoint.format import (
    KIND_FULL,
    KIND_INCREMENTAL,
    check_state_meta,
    range_bounds,
    xxh64,
)
from statecore.checkpoint.layout import (
    CheckpointRoot,
    check_version,
    manifest_name,
    manifest_version,
)
from statecore.checkpoint.runs import (
    check_disjoint,
    longest_chain,
    plan_chains,
    union_range,
)
from statecore.errors import CheckpointNotFoundError, CorruptCheckpointError, InvalidInputError

__all__ = ["ManifestLog", "MANIFEST_FORMAT", "MANIFEST_FORMAT_VERSION",
           "EXTERNAL_MANIFEST_FORMAT_VERSION",
           "READABLE_MANIFEST_VERSIONS", "canonical_json", "new_commit_id", "new_manifest_body",
           "new_external_manifest_body", "check_external", "describe_manifest",
           "check_manifest_schema", "parse_manifest", "signed_manifest"]

MANIFEST_FORMAT = "statecore-checkpoint"
MANIFEST_FORMAT_VERSION = 2
#: The format version of metadata-only manifests (module docstring).
EXTERNAL_MANIFEST_FORMAT_VERSION = 3
READABLE_MANIFEST_VERSIONS = (1, 2, 3)


def canonical_json(obj: Any) -> bytes:
    """The canonical JSON bytes of ``obj`` (keys sorted, no spaces, ASCII), which manifest
    checksums cover. Raises TypeError/ValueError for an object JSON cannot hold."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("ascii")


def _upgraded(body: dict, version: int) -> dict:
    """``body`` (a manifest without its checksum) in the current format: a version-1 manifest's
    runs get ``seq`` 0, kind ``full``, their version and no tombstones (a metadata-only
    manifest keeps its format version). Returns ``body``."""
    if body.get("format_version") == 1:
        for f in body["files"]:
            f.update(seq=0, kind=KIND_FULL, version=version,
                     tombstones={n: 0 for n in f["entries"]})
    if body.get("format_version") != EXTERNAL_MANIFEST_FORMAT_VERSION:
        body["format_version"] = MANIFEST_FORMAT_VERSION
    return body


def check_external(ext) -> dict:
    """``ext``, the ``external`` field of a metadata-only manifest, checked: ``{"store": str,
    "namespace": str, "epoch": int >= 0, "logs": [str, ...] (non-empty, distinct),
    "base_epoch": int >= 0 below epoch, or None}`` and nothing else. Raises ValueError naming
    the first field that breaks it."""
    if not isinstance(ext, dict):
        raise ValueError(f"external is not an object: {ext!r}")
    want = {"store", "namespace", "epoch", "logs", "base_epoch"}
    if set(ext) != want:
        raise ValueError(f"external has fields {sorted(ext)}, not {sorted(want)}")
    for f in ("store", "namespace"):
        if not isinstance(ext[f], str) or not ext[f]:
            raise ValueError(f"external.{f} is not a non-empty string: {ext[f]!r}")
    if not _is_int(ext["epoch"]):
        raise ValueError(f"external.epoch is not an int >= 0: {ext['epoch']!r}")
    logs = ext["logs"]
    if (not isinstance(logs, list) or not logs
            or not all(isinstance(n, str) and n for n in logs) or len(set(logs)) != len(logs)):
        raise ValueError(f"external.logs is not a non-empty list of distinct names: {logs!r}")
    b = ext["base_epoch"]
    if b is not None and (not _is_int(b) or b >= ext["epoch"]):
        raise ValueError(f"external.base_epoch is not null or an int in [0, epoch): {b!r}")
    return ext


def _is_int(x, lo: int = 0) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= lo


def _is_hex(x, digits: int) -> bool:
    return isinstance(x, str) and len(x) == digits and not x.strip("0123456789abcdef")


def _counts(x, what: str, names=None) -> None:
    """``x`` must be ``{str: int >= 0}`` (keys among ``names`` when given)."""
    if not isinstance(x, dict) or not all(isinstance(k, str) and _is_int(v) for k, v in x.items()):
        raise ValueError(f"{what} is not an object of counts: {x!r}")
    if names is not None and not set(x) <= set(names):
        raise ValueError(f"{what} names states the run does not hold: "
                         f"{sorted(set(x) - set(names))}")


def check_manifest_schema(body: dict) -> None:
    """Raise ValueError naming the first field of the (upgraded) manifest ``body`` whose type or
    value breaks docs/formats.md "Checkpoint store and manifests" (the structural rules: ranges,
    chains, the checksum, are checked by the reader)."""
    if not isinstance(body, dict):
        raise ValueError("the manifest is not an object")
    for f in ("version", "created_ms", "format_version"):
        if not _is_int(body.get(f)):
            raise ValueError(f"{f} is not an int >= 0: {body.get(f)!r}")
    if not _is_int(body.get("max_parallelism"), 1) or body["max_parallelism"] > 32768:
        raise ValueError(f"max_parallelism is not in [1, 32768]: {body.get('max_parallelism')!r}")
    for f in ("key_type", "assigner"):
        if not isinstance(body.get(f), str):
            raise ValueError(f"{f} is not a string: {body.get(f)!r}")
    states = body.get("states")
    if not isinstance(states, list):
        raise ValueError(f"states is not a list: {states!r}")
    names = []
    for m in states:
        check_state_meta(m)
        names.append(m["name"])
    if len(set(names)) != len(names):
        twice = sorted(n for n in set(names) if names.count(n) > 1)
        raise ValueError(f"states are listed twice: {twice}")
    files = body.get("files")
    if not isinstance(files, list):
        raise ValueError(f"files is not a list: {files!r}")
    paths = set()
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("path"), str) or not f["path"]:
            raise ValueError(f"a run is not an object with a path: {f!r}")
        where = f"run {f['path']!r}"
        if f["path"] in paths:
            raise ValueError(f"{where} is listed twice")
        paths.add(f["path"])
        if f["path"].startswith("/") or ".." in f["path"].split("/"):
            raise ValueError(f"file path {f['path']!r} leaves the root")
        if f.get("kind") not in (KIND_FULL, KIND_INCREMENTAL):
            raise ValueError(f"run {f['path']!r} has unknown kind {f.get('kind')!r}")
        if not _is_int(f.get("seq")):
            raise ValueError(f"run {f['path']!r} has a bad seq {f.get('seq')!r}")
        b = f.get("base_version")
        if b is not None and (not _is_int(b) or f["kind"] != KIND_INCREMENTAL):
            raise ValueError(f"run {f['path']!r} has a bad base_version {b!r}")
        if "base_commit_id" in f and (b is None or not _is_hex(f["base_commit_id"], 32)):
            raise ValueError(f"run {f['path']!r} has a bad base_commit_id "
                             f"{f['base_commit_id']!r}")
        try:
            range_bounds(f.get("key_group_range"))
        except InvalidInputError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if not isinstance(f.get("writer"), str):
            raise ValueError(f"{where}: writer is not a string")
        for k in ("size", "version", "blocks", "raw_bytes", "stored_bytes", "key_groups_nonempty"):
            if not _is_int(f.get(k)):
                raise ValueError(f"{where}: {k} is not an int >= 0: {f.get(k)!r}")
        if f["version"] > body["version"]:
            raise ValueError(f"{where} is of version {f['version']}, newer than the manifest")
        fx = f.get("footer_xxh64")
        if not _is_hex(fx, 16):
            raise ValueError(f"{where}: footer_xxh64 is not 16 lowercase hex digits: {fx!r}")
        run_states = f.get("states")
        if not isinstance(run_states, list) or not all(isinstance(n, str) for n in run_states):
            raise ValueError(f"{where}: states is not a list of names")
        if len(set(run_states)) != len(run_states) or not set(run_states) <= set(names):
            raise ValueError(f"{where}: states {run_states} repeat a name or name a state the "
                             "manifest does not describe")
        _counts(f.get("entries"), f"{where}: entries", run_states)
        _counts(f.get("tombstones"), f"{where}: tombstones", run_states)
    if not isinstance(body.get("metadata"), dict):
        raise ValueError("metadata is not an object")
    for f in ("ttl_expired", "ttl_compaction_expired"):
        if f in body:
            _counts(body[f], f)
    if "commit_id" in body and not _is_hex(body["commit_id"], 32):
        raise ValueError(f"commit_id is not 32 lowercase hex digits: {body['commit_id']!r}")
    if "compacted_ms" in body and not _is_int(body["compacted_ms"]):
        raise ValueError(f"compacted_ms is not an int >= 0: {body['compacted_ms']!r}")
    external = body["format_version"] == EXTERNAL_MANIFEST_FORMAT_VERSION
    if external != ("external" in body):
        raise ValueError("external is present exactly in manifests of format_version "
                         f"{EXTERNAL_MANIFEST_FORMAT_VERSION}")
    if external:
        check_external(body["external"])
        if files or names or list(body.get("key_group_range", [])) != [0, -1]:
            raise ValueError("a metadata-only manifest (external) lists no runs and no states "
                             "and has key_group_range [0, -1]")


def _short(vs: list[int]) -> str:
    if not vs:
        return "none"
    return ", ".join(map(str, vs)) if len(vs) <= 6 else f"{vs[0]}..{vs[-1]} ({len(vs)} versions)"


class _ValidatedManifests:
    """The bytes of the last manifests that passed :meth:`ManifestLog.read`'s checks, by path
    (process-wide: a Spark worker makes a store per task). A manifest read again with the same
    bytes at the same path -- which names its version -- is only parsed: the checksum (a
    canonical re-serialization) and the structure checks are most of the cost of a read, and
    the driver reads a few manifests per micro-batch. Different bytes (a compaction replaced the
    manifest, a damaged file) take the full checks. Thread-safe."""

    MAX_ENTRIES = 256

    def __init__(self):
        self._lock = threading.Lock()
        self._raw: dict[str, bytes] = {}

    def seen(self, path: str, raw: bytes) -> bool:
        with self._lock:
            return self._raw.get(path) == raw

    def add(self, path: str, raw: bytes) -> None:
        with self._lock:
            self._raw.pop(path, None)
            self._raw[path] = bytes(raw)
            while len(self._raw) > self.MAX_ENTRIES:
                del self._raw[next(iter(self._raw))]


_VALIDATED_MANIFESTS = _ValidatedManifests()


def signed_manifest(body: dict) -> dict:
    """``body`` (a manifest without ``checksum_xxh64``) with its ``checksum_xxh64`` added: the
    XXH64 of its canonical JSON as 16 hex digits (docs/formats.md "Checkpoint store and
    manifests"). TypeError / ValueError when ``body`` is not JSON data."""
    return dict(body, checksum_xxh64=f"{xxh64(canonical_json(body)):016x}")


def parse_manifest(raw: bytes, version: int, path: str) -> dict:
    """The validated manifest of ``version`` from its file's bytes ``raw`` (a fresh dict, a
    version-1 manifest upgraded); ``path`` names it in errors. Raises CorruptCheckpointError
    (naming ``path``) when the bytes are not valid JSON, fail the checksum or break a rule of
    docs/formats.md (:func:`check_manifest_schema`, overlapping runs of one seq, top runs that
    do not tile the range, a chain without a full run or whose base is missing)."""
    try:
        doc = json.loads(raw.decode("ascii"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptCheckpointError(f"manifest {path} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("checksum_xxh64"), str):
        raise CorruptCheckpointError(f"manifest {path} is not a statecore manifest object")
    body = {k: v for k, v in doc.items() if k != "checksum_xxh64"}
    try:
        ok = int(doc["checksum_xxh64"], 16) == xxh64(canonical_json(body))
    except ValueError:
        ok = False
    if not ok:
        raise CorruptCheckpointError(f"manifest {path}: checksum mismatch")
    try:
        if (body["format"] != MANIFEST_FORMAT
                or body["format_version"] not in READABLE_MANIFEST_VERSIONS):
            raise ValueError(f"format {body['format']!r} v{body['format_version']}")
        if body["version"] != version:
            raise ValueError(f"it describes version {body['version']}")
        if not isinstance(body.get("files"), list) or not all(
                isinstance(f, dict) for f in body["files"]):
            raise ValueError("files is not a list of objects")
        _upgraded(body, version)
        check_manifest_schema(body)
        range_bounds(body["key_group_range"])
    except (KeyError, TypeError, ValueError, AttributeError, InvalidInputError) as exc:
        raise CorruptCheckpointError(f"manifest {path} is malformed: {exc}") from exc
    top_seq = max((f["seq"] for f in body["files"]), default=0)
    by_seq: dict[int, list] = {}
    for f in body["files"]:
        by_seq.setdefault(f["seq"], []).append(f)
    union = None
    for sq, group in by_seq.items():
        # runs of one seq come from one commit: they must not overlap; the top ones tile
        if sq == top_seq:
            union = union_range(group, version, CorruptCheckpointError, path)
        else:
            check_disjoint(group, version, path)
    if union is None:
        union = (0, -1)
    if list(union) != list(body["key_group_range"]):
        raise CorruptCheckpointError(
            f"manifest {path}: key-group range {body['key_group_range']} is not the union "
            f"{list(union)} of its files")
    plan_chains(body["files"], union, CorruptCheckpointError, f"manifest {path}")
    body["checksum_xxh64"] = doc["checksum_xxh64"]
    return body


class ManifestLog:
    """The manifests under one :class:`~statecore.checkpoint.layout.CheckpointRoot`: the list of
    committed versions, validated reads and atomic writes. Holds no state besides the root (the
    process-wide cache of validated bytes aside), so any number of logs over one root agree.
    ``lease``: the root's :class:`~statecore.checkpoint.lease.Lease` as the writing store holds
    it (None: no fencing); writes and deletes are then checked against it."""

    def __init__(self, root: CheckpointRoot, lease=None):
        self.root = root
        self.lease = lease

    def versions(self) -> list[int]:
        """Committed versions (those with a manifest), ascending. Empty when the root does not
        exist."""
        out = []
        for info in self.root.list(self.root.root):
            v = manifest_version(info.base_name)
            if v is not None and info.type == pafs.FileType.File:
                out.append(v)
        return sorted(out)

    def latest_version(self) -> int | None:
        """The highest committed version, or ``None`` when there is none."""
        vs = self.versions()
        return vs[-1] if vs else None

    def is_committed(self, version: int) -> bool:
        """True when ``version`` has a manifest (one stat, no listing). InvalidInputError for a
        version that is not an int in the range every version takes."""
        version = check_version(version)
        info = self.root.fs.get_file_info(self.root.path(manifest_name(version)))
        return info.type == pafs.FileType.File

    def read(self, version: int) -> dict:
        """The validated manifest of ``version`` (a fresh dict, docs/formats.md; a
        version-1 manifest comes back upgraded: runs with ``seq`` 0, kind ``full``).
        Raises CheckpointNotFoundError when ``version`` has no manifest; CorruptCheckpointError
        (naming the manifest) when it is not valid JSON, fails its checksum or is malformed
        (incl. overlapping runs of one seq, top runs that do not tile the range, a key group
        without a full run)."""
        version = check_version(version)
        path = self.root.path(manifest_name(version))
        try:
            with self.root.fs.open_input_file(path) as f:
                raw = f.read()
        except FileNotFoundError:
            raise CheckpointNotFoundError(
                f"checkpoint version {version} not found under {self.root.uri} (committed "
                f"versions: {_short(self.versions())})") from None
        if _VALIDATED_MANIFESTS.seen(path, raw):
            # These exact bytes passed every check of parse_manifest at this path (so for this
            # version).
            doc = json.loads(raw)
            body = _upgraded({k: v for k, v in doc.items() if k != "checksum_xxh64"}, version)
            body["checksum_xxh64"] = doc["checksum_xxh64"]
            return body
        body = parse_manifest(raw, version, path)
        _VALIDATED_MANIFESTS.add(path, raw)
        return body

    def write(self, body: dict) -> dict:
        """Sign ``body`` (a manifest without ``checksum_xxh64``) and publish it atomically as the
        manifest of ``body["version"]``, replacing an earlier one. Returns the signed manifest.
        Filesystem errors propagate (the previous manifest, if any, stays). With a lease: checked
        before the put and verified after it; FencedError when another driver holds it (before:
        nothing written; after: the manifest just written is deleted again if it is still the
        one this call wrote)."""
        manifest = signed_manifest(body)
        data = json.dumps(manifest, sort_keys=True, indent=1).encode("ascii")
        what = f"publishing the manifest of version {body['version']}"
        if self.lease is not None:
            self.lease.check(what)
        self.root.write_bytes(manifest_name(body["version"]), data)
        if self.lease is not None and not self.lease.verify(what):
            self._retract(body["version"], data)
            self.lease.check(what)  # raises FencedError naming the new owner
        return manifest

    def fence(self, what: str) -> None:
        """Check the lease (if any) before the step ``what``, taking it on the first call;
        FencedError when another driver holds it. A no-op without a lease."""
        if self.lease is not None:
            self.lease.check(what)

    def _retract(self, version: int, data: bytes) -> None:
        """Delete the manifest of ``version`` when its bytes are still ``data`` (what a fenced
        write published; a newer driver's manifest of the same version stays)."""
        path = self.root.path(manifest_name(version))
        try:
            with self.root.fs.open_input_file(path) as f:
                if f.read() != data:
                    return
            self.root.fs.delete_file(path)
        except FileNotFoundError:
            pass

    def delete(self, version: int) -> None:
        """Delete the manifest of ``version``: the version is no longer committed. With a lease,
        checked first (FencedError when another driver holds it; nothing deleted)."""
        if self.lease is not None:
            self.lease.check(f"deleting the manifest of version {version}")
        self.root.fs.delete_file(self.root.path(manifest_name(version)))


def new_commit_id() -> str:
    """A new commit id: 128 random bits as 32 lowercase hex digits (``secrets``), unique to
    one commit of one version (compaction keeps it: the contents do not change)."""
    return secrets.token_hex(16)


def new_manifest_body(version: int, common: tuple, key_group_range, states: list, runs: list,
                      metadata: dict, commit_id: str) -> dict:
    """The body (no checksum) of a new manifest of ``version``: ``common`` = (max_parallelism,
    key_type, assigner), ``runs`` in manifest order (statecore.checkpoint.runs.sort_runs),
    ``created_ms`` now, ``commit_id`` from :func:`new_commit_id`."""
    return {
        "format": MANIFEST_FORMAT, "format_version": MANIFEST_FORMAT_VERSION,
        "version": version, "commit_id": commit_id, "created_ms": int(time.time() * 1000),
        "max_parallelism": common[0], "key_type": common[1], "assigner": common[2],
        "key_group_range": list(key_group_range), "states": states,
        "files": runs, "metadata": metadata,
    }


def new_external_manifest_body(version: int, common: tuple, external: dict, metadata: dict,
                               commit_id: str) -> dict:
    """The body (no checksum) of a new metadata-only manifest of ``version`` (module
    docstring): ``common`` = (max_parallelism, key_type, assigner), ``external`` checked by
    :func:`check_external`; no runs, no states, key-group range ``[0, -1]``."""
    return {
        "format": MANIFEST_FORMAT, "format_version": EXTERNAL_MANIFEST_FORMAT_VERSION,
        "version": version, "commit_id": commit_id, "created_ms": int(time.time() * 1000),
        "max_parallelism": common[0], "key_type": common[1], "assigner": common[2],
        "key_group_range": [0, -1], "states": [], "files": [], "metadata": metadata,
        "external": external,
    }


def describe_manifest(m: dict, uri: str) -> dict:
    """Statistics of the validated manifest ``m`` of the root ``uri`` (what
    ``CheckpointStore.describe`` returns; keys documented there)."""
    entries: dict[str, int] = {s["name"]: 0 for s in m["states"]}
    tombs: dict[str, int] = {s["name"]: 0 for s in m["states"]}
    for f in m["files"]:
        for name, n in f["entries"].items():
            entries[name] = entries.get(name, 0) + n
        for name, n in f.get("tombstones", {}).items():
            tombs[name] = tombs.get(name, 0) + n
    start, end = m["key_group_range"]
    segments = plan_chains(m["files"], (start, end), CorruptCheckpointError, "describe")
    return {
        "version": m["version"], "root": uri, "created_ms": m["created_ms"],
        "compacted_ms": m.get("compacted_ms"),
        "max_parallelism": m["max_parallelism"], "key_type": m["key_type"],
        "assigner": m["assigner"], "key_group_range": [start, end],
        "key_groups": max(0, end - start + 1),
        "key_groups_nonempty": sum(f["key_groups_nonempty"] for f in m["files"]),
        "files": len(m["files"]), "runs": len(m["files"]),
        "bytes": sum(f["size"] for f in m["files"]),
        "bytes_added": sum(f["size"] for f in m["files"] if f["version"] == m["version"]),
        "raw_bytes": sum(f["raw_bytes"] for f in m["files"]),
        "blocks": sum(f["blocks"] for f in m["files"]), "entries": entries,
        "tombstones": tombs, "max_runs_per_key_group": longest_chain(segments),
        "states": m["states"], "metadata": m["metadata"],
        "external": m.get("external"),
        "ttl_expired": dict(m.get("ttl_expired", {})),
        "ttl_compaction_expired": dict(m.get("ttl_compaction_expired", {})),
        "writers": [{k: f[k] for k in ("path", "writer", "key_group_range", "size", "entries")}
                    for f in m["files"]],
        "run_list": [{k: f[k] for k in ("path", "writer", "version", "seq", "kind",
                                        "key_group_range", "size", "entries", "tombstones")}
                     for f in m["files"]],
    }
