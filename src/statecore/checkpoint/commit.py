"""The commit protocol: how the runs of writers become a version.

1. Each writer writes its run (statecore.checkpoint.snapshot_writes) and hands its descriptor to
   the committer: returned through the job, or recorded as ``pending/V/<writer>.json``
   (:class:`PendingDescriptors`).
2. :meth:`Committer.commit` checks the descriptors against each other and against the files
   (each must exist with the size its descriptor gives), gives the new runs
   ``seq = 1 + the previous version's highest`` (the previous version = the highest committed
   below V), keeps the previous version's runs that V's chains still need
   (statecore.checkpoint.runs), and writes V's manifest (statecore.checkpoint.manifests).

Invariants:

* Data files are immutable and never overwritten: every write gets a new name
  (statecore.checkpoint.layout), so a replay cannot damage a committed version; runs are
  shared between versions by path.
* An incremental run records the version it is relative to (``base_version``) and is only
  committed directly on top of that version; a chain's runs must agree on it
  (statecore.checkpoint.runs), so a missing base is an error, never a silent loss.
* A version at or below the latest committed one is committed only with ``replace=True`` (a
  replayed micro-batch re-commits its version); newer versions keep the runs they reference.
* The manifest is written last and atomically: a version exists for readers only once its
  manifest does, and a crash at any point leaves either the previous manifest or the new one.
  A replayed version (a re-run micro-batch) writes new files and re-commits its manifest.
* A chain without a full run cannot be committed (InvalidInputError: an incremental snapshot
  needs a committed base).
* Commit, compaction publishing and retention of one root run in one process (the Spark driver);
  within it they are serialized by one lock, which the caller passes in.

A version whose keyed state lives in an external store is committed by
:meth:`Committer.commit_external`: a metadata-only manifest (no runs; the store's namespace,
epoch and write-ahead log names instead), published under the same lock, fence and
``replace`` rule, written atomically as every manifest: it is the commit decision of the
store's epoch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable

import pyarrow.fs as pafs

from statecore.checkpoint.format import KIND_FULL, KIND_INCREMENTAL
from statecore.checkpoint.layout import (
    CheckpointRoot,
    check_commit_id,
    check_version,
    check_writer,
    heartbeat_path,
    pending_path,
    version_dir,
)
from statecore.checkpoint.manifests import (
    ManifestLog,
    canonical_json,
    check_external,
    new_commit_id,
    new_external_manifest_body,
    new_manifest_body,
)
from statecore.checkpoint.runs import (
    chain_run_ids,
    longest_chain,
    plan_chains,
    sort_runs,
    union_range,
)
from statecore.descriptors import stored_format
from statecore.errors import CorruptCheckpointError, InvalidInputError

__all__ = ["Committer", "CommitResult", "PendingDescriptors"]


class PendingDescriptors:
    """Descriptors recorded under ``pending/V/`` so a driver can commit without collecting them
    through Spark (``CheckpointStore.write_pending`` / ``pending`` / ``clear_pending``)."""

    def __init__(self, root: CheckpointRoot):
        self.root = root

    def write(self, version: int, writer: str, descriptor: dict) -> str:
        """Record ``descriptor`` as ``pending/V/<writer>.json``, replacing an earlier one; returns
        the path relative to the root. Raises InvalidInputError when the descriptor is not
        JSON-able or names another version/writer."""
        version = check_version(version)
        writer = check_writer(writer)
        if not isinstance(descriptor, dict) or descriptor.get("version") != version \
                or descriptor.get("writer") != writer:
            raise InvalidInputError(
                f"descriptor must be a dict of version {version} and writer {writer!r}")
        return self._put_json(pending_path(version, writer), descriptor, "descriptor")

    def read(self, version: int) -> list[dict]:
        """The descriptors recorded for ``version``, sorted by writer ([] when none). Raises
        CorruptCheckpointError naming a file that is not a JSON object."""
        out = []
        for path, raw in self._files(version, ".json"):
            try:
                desc = json.loads(raw.decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                raise CorruptCheckpointError(
                    f"pending descriptor {path} is not valid JSON: {exc}") from exc
            if not isinstance(desc, dict):
                raise CorruptCheckpointError(f"pending descriptor {path} is not a JSON object")
            out.append(desc)
        return out

    def _files(self, version: int, suffix: str):
        """``(path, bytes)`` of the files ``pending/V/*<suffix>``, sorted by path; a file
        cleared (by :meth:`clear`) between the listing and its read is left out."""
        version = check_version(version)
        base = self.root.path(f"pending/{version_dir(version)}")
        for info in sorted(self.root.list(base), key=lambda i: i.path):
            if info.type != pafs.FileType.File or not info.base_name.endswith(suffix):
                continue
            try:
                with self.root.fs.open_input_file(info.path) as f:
                    raw = f.read()
            except FileNotFoundError:
                continue
            yield info.path, raw

    def write_heartbeat(self, version: int, writer: str, body: dict) -> str:
        """Record ``body`` (a JSON object) as ``pending/V/<writer>.alive``, the heartbeat of a
        write in flight, replacing the earlier one; returns the path relative to the root.
        InvalidInputError when ``body`` is not JSON-able."""
        version = check_version(version)
        writer = check_writer(writer)
        return self._put_json(heartbeat_path(version, writer),
                              dict(body, version=version, writer=writer), "heartbeat")

    def _put_json(self, rel: str, obj: dict, what: str) -> str:
        """Write ``obj`` as canonical JSON to ``rel`` (relative to the root) and return ``rel``;
        InvalidInputError naming ``what`` when it is not JSON-able."""
        try:
            data = canonical_json(obj)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"{what} is not JSON-serializable: {exc}") from exc
        self.root.write_bytes(rel, data)
        return rel

    def heartbeats(self, version: int) -> list[dict]:
        """The heartbeats recorded for ``version``, sorted by writer ([] when none). A file
        that is gone meanwhile or not a JSON object is left out: a heartbeat is a hint of
        liveness, and a missing one only makes its write look lost sooner."""
        out = []
        for _path, raw in self._files(version, ".alive"):
            try:
                body = json.loads(raw.decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(body, dict):
                out.append(body)
        return out

    def clear(self, version: int) -> None:
        """Delete the descriptors (and heartbeats) recorded for ``version``."""
        version = check_version(version)
        base = self.root.path(f"pending/{version_dir(version)}")
        if self.root.fs.get_file_info(base).type == pafs.FileType.Directory:
            self.root.fs.delete_dir(base)


@dataclass
class CommitResult:
    """What :meth:`Committer.commit` published: the signed ``manifest`` and the most runs any
    key group of it needs (``longest_chain``, what decides an automatic compaction)."""

    manifest: dict
    longest_chain: int


def _run_from_descriptor(d: dict, version: int) -> tuple[dict, tuple, list, dict]:
    """``(run, (max_parallelism, key_type, assigner), state metas, ttl_expired)`` of one
    descriptor; the run's ``seq`` is 0 until the commit sets it. Raises InvalidInputError for a
    malformed descriptor or one of another version."""
    try:
        if d["version"] != version:
            raise InvalidInputError(
                f"descriptor of writer {d.get('writer')!r} is of version {d['version']}, "
                f"not {version}")
        path = d["path"]
        if not isinstance(path, str) or path.startswith("/") or ".." in path.split("/"):
            raise InvalidInputError(f"descriptor path must be relative to the root: {path!r}")
        start, end = (int(x) for x in d["key_group_range"])
        common = (int(d["max_parallelism"]), str(d["key_type"]), str(d["assigner"]))
        metas = list(d["states"])
        ttl_expired: dict[str, int] = {}
        for strategy, n in (d.get("ttl_expired") or {}).items():
            ttl_expired[str(strategy)] = ttl_expired.get(str(strategy), 0) + int(n)
        kind = d.get("kind", KIND_FULL)
        if kind not in (KIND_FULL, KIND_INCREMENTAL):
            raise InvalidInputError(f"descriptor of {path!r} has unknown kind {kind!r}")
        base_version = d.get("base_version")
        if kind == KIND_INCREMENTAL and base_version is None:
            raise InvalidInputError(
                f"incremental run {path!r} of writer {d.get('writer')!r} does not record the "
                "checkpoint version its changes are relative to (its backend's base came from "
                "notify_checkpoint_complete without a version, or from an in-memory snapshot): "
                "pass version= to notify_checkpoint_complete, restore from the store, or write a "
                "full snapshot")
        if base_version is not None:
            base_version = check_version(base_version)
            if base_version >= version:
                raise InvalidInputError(
                    f"incremental run {path!r} is relative to version {base_version}, not below "
                    f"the version {version} it is committed as")
        run = {
            "path": path, "size": int(d["size"]), "writer": check_writer(d["writer"]),
            "version": version, "seq": 0, "kind": kind,
            "key_group_range": [start, end] if end >= start else [0, -1],
            "states": [m["name"] for m in metas],
            "entries": {str(k): int(v) for k, v in d["entries"].items()},
            "tombstones": {str(k): int(v) for k, v in (d.get("tombstones") or {}).items()},
            "blocks": int(d["blocks"]), "raw_bytes": int(d["raw_bytes"]),
            "stored_bytes": int(d["stored_bytes"]),
            "key_groups_nonempty": int(d["key_groups_nonempty"]),
            "footer_xxh64": f"{int(str(d['footer_xxh64']), 16):016x}",
        }
        if kind == KIND_INCREMENTAL:
            run["base_version"] = base_version
            base_commit_id = d.get("base_commit_id")
            if base_commit_id is not None:
                if base_version is None:
                    raise InvalidInputError(
                        f"incremental run {path!r} names a base commit id without a base version")
                run["base_commit_id"] = check_commit_id(base_commit_id)
    except InvalidInputError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidInputError(f"malformed checkpoint descriptor {d!r}: {exc}") from exc
    return run, common, metas, ttl_expired


class Committer:
    """Commits versions under one root (module docstring). ``manifests``: the root's
    :class:`~statecore.checkpoint.manifests.ManifestLog` (or an object with its interface);
    ``lock``: the lock that serializes manifest publishing and retention of the root in this
    process."""

    def __init__(self, root: CheckpointRoot, manifests: ManifestLog, lock):
        self.root = root
        self.manifests = manifests
        self.lock = lock

    def commit(self, version: int, descriptors: Iterable[dict],
               metadata: dict | None = None, replace: bool = False) -> CommitResult:
        """Check ``descriptors`` and publish the manifest of ``version``; arguments and errors as
        ``CheckpointStore.commit`` (which also takes the pending descriptors and compacts)."""
        version = check_version(version)
        if not isinstance(replace, bool):
            raise InvalidInputError(f"replace must be a bool, got {replace!r}")
        descriptors = list(descriptors)
        if not descriptors:
            raise InvalidInputError(f"commit of version {version} without any data file descriptor")
        metadata = _checked_metadata(metadata)

        files, states, common = [], {}, None
        ttl_expired: dict[str, int] = {}
        for d in descriptors:
            entry, this, metas, expired = _run_from_descriptor(d, version)
            for strategy, n in expired.items():
                ttl_expired[strategy] = ttl_expired.get(strategy, 0) + n
            if common is None:
                common = this
            elif this != common:
                raise InvalidInputError(
                    f"writers disagree on (max_parallelism, key_type, assigner): {common} vs "
                    f"{this} (writer {entry['writer']!r})")
            for m in metas:
                prev = states.setdefault(m["name"], m)
                if prev != m:
                    raise InvalidInputError(
                        f"writers disagree on the meta of state {m['name']!r}: {prev} vs {m}")
            files.append(entry)
        writers = [f["writer"] for f in files]
        if len(set(writers)) != len(writers):
            raise InvalidInputError(f"duplicate writers in commit of version {version}: {writers}")
        union = union_range(files, version, InvalidInputError, self.root.root)
        if union[1] >= common[0]:
            raise InvalidInputError(
                f"key-group range {union} is outside max parallelism {common[0]}")
        for f in files:
            info = self.root.fs.get_file_info(self.root.path(f["path"]))
            if info.type != pafs.FileType.File:
                raise CorruptCheckpointError(
                    f"checkpoint data file {self.root.path(f['path'])} of version {version} is "
                    "missing")
            if info.size != f["size"]:
                raise CorruptCheckpointError(
                    f"checkpoint data file {self.root.path(f['path'])} is {info.size} bytes, its "
                    f"descriptor says {f['size']}")

        with self.lock:
            # Before the reads the new manifest builds on: a store taking the lease over waits
            # out the old owner first (statecore.checkpoint.lease).
            self.manifests.fence(f"commit of version {version}")
            committed = self._committed_for(version, replace)
            prev_version = max((v for v in committed if v < version), default=None)
            prev = self.manifests.read(prev_version) if prev_version is not None else None
            prev_runs = prev["files"] if prev is not None else []
            seq = 1 + max((r["seq"] for r in prev_runs), default=0)
            for f in files:
                f["seq"] = seq
            where = (f"commit of version {version} on top of version {prev_version}"
                     if prev is not None else f"commit of version {version} (no earlier version)")
            for f in files:
                base = f.get("base_version")
                if base is not None and base != prev_version:
                    missing = "" if base in committed else f" (version {base} is not committed)"
                    raise InvalidInputError(
                        f"{where}: incremental run {f['path']!r} of writer {f['writer']!r} holds "
                        f"the changes since version {base}{missing}, but it would be chained "
                        f"onto version {prev_version}; write a full snapshot, or restore version "
                        f"{prev_version} and checkpoint again")
                cid = f.get("base_commit_id")
                if cid is not None and prev.get("commit_id") not in (None, cid):
                    raise InvalidInputError(
                        f"{where}: incremental run {f['path']!r} of writer {f['writer']!r} holds "
                        f"the changes since a version {base} committed as {cid}, but version "
                        f"{base} of this store was committed as {prev['commit_id']} (another "
                        "store's version, or this version committed again since): write a full "
                        f"snapshot, or restore version {base} and checkpoint again")
            segments = plan_chains(prev_runs + files, union, InvalidInputError, where)
            used = chain_run_ids(segments)
            kept = [r for r in prev_runs if id(r) in used]
            if kept:
                prev_common = (prev["max_parallelism"], prev["key_type"], prev["assigner"])
                if prev_common != common:
                    raise InvalidInputError(
                        f"{where}: (max_parallelism, key_type, assigner) {common} differs from "
                        f"the previous version's {prev_common}, whose runs are still needed")
                prev_metas = {m["name"]: m for m in prev["states"]}
                for r in kept:
                    for name in r["states"]:
                        # The new meta wins (e.g. a new TTL duration, which the compaction
                        # filter then applies) as long as the older runs stay readable with it.
                        m = states.setdefault(name, prev_metas[name])
                        if stored_format(m) != stored_format(prev_metas[name]):
                            raise InvalidInputError(
                                f"{where}: the stored format of state {name!r} changed from "
                                f"{prev_metas[name]} to {m} while runs of the previous version "
                                "are still needed (write full snapshots to change a state)")
            paths = [r["path"] for r in kept + files]
            if len(set(paths)) != len(paths):
                raise InvalidInputError(
                    f"{where}: a descriptor names a data file the previous version still uses "
                    f"as an older run: {sorted(p for p in paths if paths.count(p) > 1)}")
            body = new_manifest_body(version, common, union, list(states.values()),
                                     sort_runs(kept + files), metadata, new_commit_id())
            if ttl_expired:
                body["ttl_expired"] = ttl_expired
            manifest = self.manifests.write(body)
        return CommitResult(manifest, longest_chain(segments))

    def _committed_for(self, version: int, replace: bool) -> list[int]:
        """The committed versions, checked for a commit of ``version`` (under the lock):
        InvalidInputError when ``version`` is not above the latest one and not ``replace``."""
        committed = self.manifests.versions()
        if committed and version <= committed[-1] and not replace:
            raise InvalidInputError(
                f"version {version} is not above the latest committed version "
                f"{committed[-1]}: committing it would "
                + ("replace it" if version in committed else "insert it below newer ones")
                + "; pass replace=True to do so on purpose (a replayed micro-batch); newer "
                "versions keep the runs they were committed with")
        return committed

    def commit_external(self, version: int, common: tuple, external: dict,
                        metadata: dict | None = None, replace: bool = False) -> dict:
        """Publish the metadata-only manifest of ``version`` (module docstring; docs/formats.md
        "Checkpoint store and manifests"): ``common`` = (max_parallelism, key_type, assigner),
        ``external`` = ``{"store", "namespace", "epoch", "logs", "base_epoch"}``. Returns the
        signed manifest. InvalidInputError for a malformed ``external`` or ``common``,
        ``metadata`` that is not a JSON-able dict, or ``version`` not above the latest committed
        one without ``replace``; FencedError and filesystem errors as :meth:`commit`."""
        version = check_version(version)
        if not isinstance(replace, bool):
            raise InvalidInputError(f"replace must be a bool, got {replace!r}")
        metadata = _checked_metadata(metadata)
        try:
            external = json.loads(canonical_json(check_external(external)))
            mp, key_type, assigner = common
            if isinstance(mp, bool) or not isinstance(mp, int) or not 1 <= mp <= 32768:
                raise ValueError(f"max_parallelism is not in [1, 32768]: {mp!r}")
            if not isinstance(key_type, str) or not isinstance(assigner, str):
                raise ValueError(f"key_type and assigner must be strings: {common!r}")
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(
                f"metadata-only commit of version {version}: {exc}") from exc
        with self.lock:
            self.manifests.fence(f"commit of version {version}")
            self._committed_for(version, replace)
            body = new_external_manifest_body(version, (mp, key_type, assigner), external,
                                              metadata, new_commit_id())
            return self.manifests.write(body)


def _checked_metadata(metadata) -> dict:
    """``metadata`` (None: ``{}``) as JSON round-trips it; InvalidInputError when it is not a
    JSON-able dict."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise InvalidInputError(f"metadata must be a dict, got {type(metadata).__name__}")
    try:
        return json.loads(canonical_json(metadata))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"metadata is not JSON-serializable: {exc}") from exc
