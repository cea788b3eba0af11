"""Checkpoint store: versioned, key-group partitioned snapshots on any ``pyarrow.fs`` filesystem.

Layout under the root (``V`` = the version as 20 zero-padded decimal digits, so names sort by
version)::

    manifest-V.json              one per committed version, written last and atomically
    data/V/<writer>.sckp         one data file per writer (format: statecore.checkpoint.format)
    pending/V/<writer>.json      optional: a writer's descriptor, for a driver to commit from

A version exists for readers only once its manifest exists. Names are deterministic, so a replayed
(re-run) micro-batch rewrites its own files and re-commits its manifest. Every file is written
atomically: on filesystems with an atomic rename (local disk, HDFS) to a temporary name in the
same directory and then moved (``fs.move``); on object stores (S3, GCS, Azure) a single put of the
complete bytes, which is atomic there.

Manifest (UTF-8 JSON object, keys sorted)::

    {"format": "statecore-checkpoint", "format_version": 1, "version": int, "created_ms": int,
     "max_parallelism": int, "key_type": str, "assigner": str,
     "key_group_range": [start, end],     # inclusive union of the files' ranges; (0, -1) = empty
     "states": [state meta, ...],         # union over the files, by name
     "files": [{"path": "data/V/p0.sckp" (relative to the root), "size": bytes, "writer": str,
                "key_group_range": [start, end], "states": [names], "entries": {name: int},
                "blocks": int, "raw_bytes": int, "stored_bytes": int,
                "key_groups_nonempty": int, "footer_xxh64": "16 hex digits"}, ...],
     "metadata": {...user metadata...},
     "checksum_xxh64": "16 hex digits"}   # xxh64 of the canonical JSON of all other keys

Canonical JSON = ``json.dumps(obj, sort_keys=True, separators=(",", ":"))`` (ASCII).
"""

from __future__ import annotations

import json
import operator
import os
import re
import time
import uuid
from bisect import bisect_right
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.fs as pafs

from statecore.checkpoint.format import (
    FORMAT_VERSION,
    DataFileReader,
    make_key_group_range,
    range_bounds,
    write_data_file,
    xxh64,
)
from statecore.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    InvalidInputError,
)

MANIFEST_FORMAT = "statecore-checkpoint"
_MANIFEST_RE = re.compile(r"^manifest-(\d{20})\.json$")
_VERSION_DIR_RE = re.compile(r"^\d{20}$")
_WRITER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_OBJECT_STORES = {"s3", "gcs", "abfs"}
_MAX_VERSION = 10**20 - 1


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("ascii")


def _check_version(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= _MAX_VERSION:
        raise InvalidInputError(
            f"checkpoint version must be an int in [0, {_MAX_VERSION}], got {version!r}")
    return version


def _check_writer(writer: Any) -> str:
    if not isinstance(writer, str) or not _WRITER_RE.match(writer):
        raise InvalidInputError(
            f"writer must match {_WRITER_RE.pattern} (it becomes a file name), got {writer!r}")
    return writer


def _vdir(version: int) -> str:
    return f"{version:020d}"


def _has_atomic_rename(fs: pafs.FileSystem) -> bool:
    while isinstance(fs, pafs.SubTreeFileSystem):
        fs = fs.base_fs
    return fs.type_name not in _OBJECT_STORES


class CheckpointStore:
    """Versioned checkpoints of StateSnapshots under one root directory of a ``pyarrow.fs``
    filesystem (layout and manifest format: module docstring).

    ``uri_or_path``: a local path (str or ``os.PathLike``) or a URI understood by
    ``pyarrow.fs.FileSystem.from_uri`` (``file:///...``, ``s3://bucket/prefix``, ``hdfs://...``).
    ``filesystem``: a ``pyarrow.fs.FileSystem`` to use instead; ``uri_or_path`` is then a path
    inside it. Versions are ints in ``[0, 10**20)`` (a Spark micro-batch id). Nothing is created
    until the first write.
    """

    def __init__(self, uri_or_path: str | os.PathLike, filesystem: pafs.FileSystem | None = None):
        raw = os.fspath(uri_or_path)
        if not isinstance(raw, str) or not raw:
            raise InvalidInputError(f"checkpoint root must be a non-empty path or URI, got {raw!r}")
        if filesystem is None:
            if "://" in raw:
                try:
                    filesystem, path = pafs.FileSystem.from_uri(raw)
                except (pa.ArrowInvalid, OSError) as exc:
                    raise InvalidInputError(f"cannot open checkpoint URI {raw!r}: {exc}") from exc
            else:
                filesystem, path = pafs.LocalFileSystem(), os.path.abspath(raw)
        else:
            if not isinstance(filesystem, pafs.FileSystem):
                raise InvalidInputError(
                    f"filesystem must be a pyarrow.fs.FileSystem, got {type(filesystem).__name__}")
            path = pafs.FileSystem.from_uri(raw)[1] if "://" in raw else raw
        self.fs = filesystem
        self.root = path.rstrip("/") or "/"
        self.uri = raw
        self._atomic_rename = _has_atomic_rename(filesystem)

    def __repr__(self) -> str:
        return f"CheckpointStore({self.uri!r})"

    # ----------------------------------------------------------------------------------- paths

    def _abs(self, rel: str) -> str:
        return f"{self.root}/{rel}" if self.root != "/" else f"/{rel}"

    @staticmethod
    def manifest_name(version: int) -> str:
        """File name (relative to the root) of the manifest of ``version``."""
        return f"manifest-{_vdir(version)}.json"

    @staticmethod
    def data_path(version: int, writer: str) -> str:
        """Path relative to the root of the data file of ``writer`` at ``version``."""
        return f"data/{_vdir(version)}/{writer}.sckp"

    @staticmethod
    def pending_path(version: int, writer: str) -> str:
        """Path relative to the root of the pending descriptor of ``writer`` at ``version``."""
        return f"pending/{_vdir(version)}/{writer}.json"

    # ---------------------------------------------------------------------------------- writes

    def _write_atomic(self, rel: str, produce) -> Any:
        """Run ``produce(stream)`` and make its bytes appear at ``rel`` all at once."""
        final = self._abs(rel)
        parent = final.rsplit("/", 1)[0]
        if not self._atomic_rename:
            buf = pa.BufferOutputStream()
            result = produce(buf)
            data = buf.getvalue()
            with self.fs.open_output_stream(final) as out:
                out.write(data)
            return result
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{final}.tmp-{uuid.uuid4().hex}"
        try:
            with self.fs.open_output_stream(tmp) as out:
                result = produce(out)
            self.fs.move(tmp, final)
        except BaseException:
            try:
                self.fs.delete_file(tmp)
            except OSError:
                pass
            raise
        return result

    def write_snapshot(self, snap: Any, version: int, writer: str = "p0", *,
                       block_target_bytes: int | None = None) -> dict:
        """Write the data file of ``snap`` (StateSnapshot read interface) for ``version`` as
        ``writer`` and return its descriptor: a JSON-able dict to pass to :meth:`commit` (or to
        :meth:`write_pending`). Writes no manifest: the version stays invisible until committed.
        Re-running with the same (version, writer) atomically replaces the file.

        ``block_target_bytes``: uncompressed block size target (default 64 KiB).
        Raises InvalidInputError for a bad version/writer or a snapshot that breaks its contract
        (see ``format.write_data_file``); filesystem errors propagate as ``OSError``.
        Does not release ``snap``.
        """
        version = _check_version(version)
        writer = _check_writer(writer)
        rel = self.data_path(version, writer)
        kwargs = {} if block_target_bytes is None else {"block_target_bytes": block_target_bytes}
        summary = self._write_atomic(
            rel, lambda out: write_data_file(out, snap, version=version, writer=writer, **kwargs))
        meta = summary.meta
        return {
            "format_version": FORMAT_VERSION,
            "version": version,
            "writer": writer,
            "path": rel,
            "size": summary.size,
            "max_parallelism": meta["max_parallelism"],
            "key_type": meta["key_type"],
            "assigner": meta["assigner"],
            "key_group_range": list(meta["key_group_range"]),
            "states": meta["states"],
            "entries": summary.entries,
            "blocks": summary.blocks,
            "raw_bytes": summary.raw_bytes,
            "stored_bytes": summary.stored_bytes,
            "key_groups_nonempty": summary.key_groups_nonempty,
            "footer_xxh64": f"{summary.footer_xxh64:016x}",
        }

    def write_pending(self, version: int, writer: str, descriptor: dict) -> str:
        """Record ``descriptor`` (from :meth:`write_snapshot`) as ``pending/V/<writer>.json`` so a
        driver can :meth:`commit` without collecting descriptors through Spark. Replaces an
        earlier file of the same (version, writer). Returns the path relative to the root.
        Raises InvalidInputError when the descriptor is not JSON-able or names another
        version/writer."""
        version = _check_version(version)
        writer = _check_writer(writer)
        if not isinstance(descriptor, dict) or descriptor.get("version") != version \
                or descriptor.get("writer") != writer:
            raise InvalidInputError(
                f"descriptor must be a dict of version {version} and writer {writer!r}")
        try:
            data = _canonical(descriptor)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"descriptor is not JSON-serializable: {exc}") from exc
        rel = self.pending_path(version, writer)
        self._write_atomic(rel, lambda out: out.write(data))
        return rel

    def pending(self, version: int) -> list[dict]:
        """Descriptors recorded by :meth:`write_pending` for ``version``, sorted by writer
        (empty list when none). Raises CorruptCheckpointError naming a file that is not a JSON
        object."""
        version = _check_version(version)
        base = self._abs(f"pending/{_vdir(version)}")
        infos = self.fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        out = []
        for info in sorted(infos, key=lambda i: i.path):
            if info.type != pafs.FileType.File or not info.base_name.endswith(".json"):
                continue
            try:
                with self.fs.open_input_file(info.path) as f:
                    desc = json.loads(f.read().decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                raise CorruptCheckpointError(
                    f"pending descriptor {info.path} is not valid JSON: {exc}") from exc
            if not isinstance(desc, dict):
                raise CorruptCheckpointError(f"pending descriptor {info.path} is not a JSON object")
            out.append(desc)
        return out

    def clear_pending(self, version: int) -> None:
        """Delete the pending descriptors of ``version`` (a driver calls this before (re)running
        a micro-batch, so descriptors of an earlier attempt with other writers cannot leak into
        its commit)."""
        version = _check_version(version)
        base = self._abs(f"pending/{_vdir(version)}")
        if self.fs.get_file_info(base).type == pafs.FileType.Directory:
            self.fs.delete_dir(base)

    def commit(self, version: int, descriptors: Iterable[dict] | None = None,
               metadata: dict | None = None) -> dict:
        """Make ``version`` visible: check the descriptors and write its manifest, last and
        atomically (replacing the manifest of a replayed version). Returns the manifest (dict).

        ``descriptors``: from :meth:`write_snapshot`; ``None`` takes :meth:`pending` (version).
        ``metadata``: JSON-able dict stored with the version (e.g. the Spark batch id, watermark).
        Raises InvalidInputError when there are no descriptors, a descriptor is malformed or of
        another version, writers disagree on max parallelism / key type / assigner / a state's
        meta, two descriptors overlap in key groups, their ranges leave a gap, or metadata is
        not a JSON-able dict; CorruptCheckpointError (naming the file) when a data file is
        missing or its size differs from its descriptor.
        """
        version = _check_version(version)
        if descriptors is None:
            descriptors = self.pending(version)
        descriptors = list(descriptors)
        if not descriptors:
            raise InvalidInputError(f"commit of version {version} without any data file descriptor")
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, dict):
            raise InvalidInputError(f"metadata must be a dict, got {type(metadata).__name__}")
        try:
            metadata = json.loads(_canonical(metadata))
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"metadata is not JSON-serializable: {exc}") from exc

        files, states, common = [], {}, None
        for d in descriptors:
            try:
                if d["version"] != version:
                    raise InvalidInputError(
                        f"descriptor of writer {d.get('writer')!r} is of version {d['version']}, "
                        f"not {version}")
                path = d["path"]
                if not isinstance(path, str) or path.startswith("/") or ".." in path.split("/"):
                    raise InvalidInputError(f"descriptor path must be relative to the root: {path!r}")
                start, end = (int(x) for x in d["key_group_range"])
                this = (int(d["max_parallelism"]), str(d["key_type"]), str(d["assigner"]))
                metas = list(d["states"])
                entry = {
                    "path": path, "size": int(d["size"]), "writer": _check_writer(d["writer"]),
                    "key_group_range": [start, end] if end >= start else [0, -1],
                    "states": [m["name"] for m in metas],
                    "entries": {str(k): int(v) for k, v in d["entries"].items()},
                    "blocks": int(d["blocks"]), "raw_bytes": int(d["raw_bytes"]),
                    "stored_bytes": int(d["stored_bytes"]),
                    "key_groups_nonempty": int(d["key_groups_nonempty"]),
                    "footer_xxh64": f"{int(str(d['footer_xxh64']), 16):016x}",
                }
            except InvalidInputError:
                raise
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise InvalidInputError(f"malformed checkpoint descriptor {d!r}: {exc}") from exc
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
        union = _union_range(files, version, InvalidInputError, self.root)
        if union[1] >= common[0]:
            raise InvalidInputError(
                f"key-group range {union} is outside max parallelism {common[0]}")
        for f in files:
            info = self.fs.get_file_info(self._abs(f["path"]))
            if info.type != pafs.FileType.File:
                raise CorruptCheckpointError(
                    f"checkpoint data file {self._abs(f['path'])} of version {version} is missing")
            if info.size != f["size"]:
                raise CorruptCheckpointError(
                    f"checkpoint data file {self._abs(f['path'])} is {info.size} bytes, its "
                    f"descriptor says {f['size']}")
        body = {
            "format": MANIFEST_FORMAT, "format_version": FORMAT_VERSION, "version": version,
            "created_ms": int(time.time() * 1000), "max_parallelism": common[0],
            "key_type": common[1], "assigner": common[2], "key_group_range": list(union),
            "states": list(states.values()),
            "files": sorted(files, key=lambda f: (f["key_group_range"][0], f["writer"])),
            "metadata": metadata,
        }
        manifest = dict(body, checksum_xxh64=f"{xxh64(_canonical(body)):016x}")
        data = json.dumps(manifest, sort_keys=True, indent=1).encode("ascii")
        self._write_atomic(self.manifest_name(version), lambda out: out.write(data))
        return manifest

    # ----------------------------------------------------------------------------------- reads

    def versions(self) -> list[int]:
        """Committed versions (those with a manifest), ascending. Empty when the root does not
        exist."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        out = []
        for info in infos:
            m = _MANIFEST_RE.match(info.base_name)
            if m and info.type == pafs.FileType.File:
                out.append(int(m.group(1)))
        return sorted(out)

    def latest_version(self) -> int | None:
        """The highest committed version, or ``None`` when there is none."""
        vs = self.versions()
        return vs[-1] if vs else None

    def manifest(self, version: int) -> dict:
        """The validated manifest of ``version`` (dict, format: module docstring).
        Raises CheckpointNotFoundError when ``version`` has no manifest; CorruptCheckpointError
        (naming the manifest) when it is not valid JSON, fails its checksum or is malformed."""
        version = _check_version(version)
        path = self._abs(self.manifest_name(version))
        try:
            with self.fs.open_input_file(path) as f:
                raw = f.read()
        except FileNotFoundError:
            raise CheckpointNotFoundError(
                f"checkpoint version {version} not found under {self.uri} (committed versions: "
                f"{_short(self.versions())})") from None
        try:
            doc = json.loads(raw.decode("ascii"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptCheckpointError(f"manifest {path} is not valid JSON: {exc}") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("checksum_xxh64"), str):
            raise CorruptCheckpointError(f"manifest {path} is not a statecore manifest object")
        body = {k: v for k, v in doc.items() if k != "checksum_xxh64"}
        try:
            ok = int(doc["checksum_xxh64"], 16) == xxh64(_canonical(body))
        except ValueError:
            ok = False
        if not ok:
            raise CorruptCheckpointError(f"manifest {path}: checksum mismatch")
        try:
            if body["format"] != MANIFEST_FORMAT or body["format_version"] != FORMAT_VERSION:
                raise ValueError(f"format {body['format']!r} v{body['format_version']}")
            if body["version"] != version:
                raise ValueError(f"it describes version {body['version']}")
            for f in body["files"]:
                if f["path"].startswith("/") or ".." in f["path"].split("/"):
                    raise ValueError(f"file path {f['path']!r} leaves the root")
                int(f["size"]), int(f["footer_xxh64"], 16), range_bounds(f["key_group_range"])
            int(body["max_parallelism"]), range_bounds(body["key_group_range"])
            [m["name"] for m in body["states"]]
            if not isinstance(body["metadata"], dict):
                raise ValueError("metadata is not an object")
        except (KeyError, TypeError, ValueError, AttributeError, InvalidInputError) as exc:
            raise CorruptCheckpointError(f"manifest {path} is malformed: {exc}") from exc
        union = _union_range(body["files"], version, CorruptCheckpointError, path)
        if list(union) != list(body["key_group_range"]):
            raise CorruptCheckpointError(
                f"manifest {path}: key-group range {body['key_group_range']} is not the union "
                f"{list(union)} of its files")
        return body

    def metadata(self, version: int) -> dict:
        """User metadata committed with ``version`` (errors as :meth:`manifest`)."""
        return self.manifest(version)["metadata"]

    def open(self, version: int | None = None) -> "CheckpointReader":
        """A lazy StateSnapshot-like reader of ``version`` (default: the latest). Only the
        manifest is read here; data files are opened and their blocks read on demand.
        Raises CheckpointNotFoundError for an unknown version (or none committed)."""
        if version is None:
            version = self.latest_version()
            if version is None:
                raise CheckpointNotFoundError(f"no committed checkpoint under {self.uri}")
        return CheckpointReader(self, version, self.manifest(version))

    def restore(self, backend: Any, version: int | None = None) -> int:
        """``backend.restore(self.open(version))``, reading only the byte ranges of the key
        groups in ``backend.key_group_range`` (one ranged read per data file). Releases the
        reader afterwards. Returns the version restored. Errors as :meth:`open` and
        CorruptCheckpointError from the data read."""
        reader = self.open(version)
        try:
            kg_range = getattr(backend, "key_group_range", None)
            if kg_range is not None:
                reader.prefetch(*range_bounds(kg_range))
            backend.restore(reader)
        finally:
            reader.release()
        return reader.version

    def describe(self, version: int) -> dict:
        """Statistics of ``version`` from its manifest, for inspection: ``files``, ``bytes``
        (stored size of the data files), ``raw_bytes`` (uncompressed block payloads),
        ``blocks``, ``entries`` {state: count}, ``key_group_range``, ``key_groups`` (in range),
        ``key_groups_nonempty``, ``writers`` (per file: path, writer, key_group_range, size,
        entries), ``states`` (metas), ``metadata``, ``max_parallelism``, ``key_type``,
        ``assigner``, ``created_ms``. Errors as :meth:`manifest`."""
        m = self.manifest(version)
        entries: dict[str, int] = {s["name"]: 0 for s in m["states"]}
        for f in m["files"]:
            for name, n in f["entries"].items():
                entries[name] = entries.get(name, 0) + n
        start, end = m["key_group_range"]
        return {
            "version": m["version"], "root": self.uri, "created_ms": m["created_ms"],
            "max_parallelism": m["max_parallelism"], "key_type": m["key_type"],
            "assigner": m["assigner"], "key_group_range": [start, end],
            "key_groups": max(0, end - start + 1),
            "key_groups_nonempty": sum(f["key_groups_nonempty"] for f in m["files"]),
            "files": len(m["files"]), "bytes": sum(f["size"] for f in m["files"]),
            "raw_bytes": sum(f["raw_bytes"] for f in m["files"]),
            "blocks": sum(f["blocks"] for f in m["files"]), "entries": entries,
            "states": m["states"], "metadata": m["metadata"],
            "writers": [{k: f[k] for k in ("path", "writer", "key_group_range", "size", "entries")}
                        for f in m["files"]],
        }

    def verify(self, version: int) -> dict:
        """Read and check every block of every data file of ``version`` (checksums, structure,
        entry counts against the manifest). Returns :meth:`describe` (version). Raises
        CorruptCheckpointError on the first problem."""
        reader = self.open(version)
        try:
            for f in reader.manifest["files"]:
                start, end = f["key_group_range"]
                got = {name: 0 for name in f["states"]}
                for kg in range(start, end + 1):
                    for name in f["states"]:
                        got[name] += len(reader.entries(name, kg)[0])
                if got != f["entries"]:
                    raise CorruptCheckpointError(
                        f"checkpoint data file {self._abs(f['path'])}: entry counts {got} differ "
                        f"from the manifest's {f['entries']}")
        finally:
            reader.release()
        return self.describe(version)

    # ------------------------------------------------------------------------------- retention

    def retain(self, k: int) -> list[int]:
        """Keep the newest ``k`` (>= 1) committed versions: delete older manifests first, then
        every data file and pending descriptor of a version older than the newest retained one
        that no retained manifest references (files of versions newer than the latest commit,
        which may be in flight, are never touched; nor is any file a retained version needs).
        Returns the versions deleted. Raises InvalidInputError for ``k < 1`` and
        CorruptCheckpointError (deleting nothing) when a retained manifest cannot be read."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidInputError(f"retain needs k >= 1, got {k!r}")
        versions = self.versions()
        if not versions:
            return []
        keep, drop = versions[-k:], versions[:-k]
        referenced = {f["path"] for v in keep for f in self.manifest(v)["files"]}
        for v in drop:
            self.fs.delete_file(self._abs(self.manifest_name(v)))
        newest = keep[-1]
        for top in ("data", "pending"):
            base = self._abs(top)
            infos = self.fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
            for d in infos:
                if d.type != pafs.FileType.Directory or not _VERSION_DIR_RE.match(d.base_name):
                    continue
                if int(d.base_name) >= newest:
                    continue
                files = self.fs.get_file_info(pafs.FileSelector(d.path, recursive=True))
                kept_any = False
                for f in files:
                    if f.type != pafs.FileType.File:
                        continue
                    rel = f"{top}/{d.base_name}/{f.path[len(d.path) + 1:]}"
                    if rel in referenced:
                        kept_any = True
                    else:
                        self.fs.delete_file(f.path)
                if not kept_any:
                    self.fs.delete_dir(d.path)
        return drop


def _short(vs: list[int]) -> str:
    if not vs:
        return "none"
    return ", ".join(map(str, vs)) if len(vs) <= 6 else f"{vs[0]}..{vs[-1]} ({len(vs)} versions)"


def _union_range(files: list[dict], version: int, err, where: str) -> tuple[int, int]:
    """Inclusive union of the files' key-group ranges; raises ``err`` on overlap or gap."""
    spans = sorted((f["key_group_range"][0], f["key_group_range"][1], f["path"])
                   for f in files if f["key_group_range"][1] >= f["key_group_range"][0])
    if not spans:
        return (0, -1)
    for (s0, e0, p0), (s1, e1, p1) in zip(spans, spans[1:]):
        if s1 <= e0:
            raise err(f"{where}: version {version}: files {p0} [{s0}, {e0}] and {p1} [{s1}, {e1}] "
                      f"both claim key group {s1}")
        if s1 != e0 + 1:
            raise err(f"{where}: version {version}: no file holds key groups {e0 + 1}..{s1 - 1}")
    if spans[0][0] < 0:
        raise err(f"{where}: version {version}: negative key group in {spans[0][2]}")
    return (spans[0][0], spans[-1][1])


class CheckpointReader:
    """Lazy StateSnapshot (architecture.md) over one committed version of a CheckpointStore.

    Attributes: ``version``, ``max_parallelism``, ``key_type``, ``assigner``,
    ``key_group_range`` (inclusive union of the data files' ranges, ``.start``/``.end``),
    ``metadata`` (user dict), ``manifest``. Data files are opened on first use; ``entries``
    reads exactly the blocks of one (state, key group) unless :meth:`prefetch` fetched them.
    Usable as a context manager; :meth:`release` is idempotent.
    """

    def __init__(self, store: CheckpointStore, version: int, manifest: dict):
        self._store = store
        self.version = version
        self.manifest = manifest
        self.max_parallelism = int(manifest["max_parallelism"])
        self.key_type = manifest["key_type"]
        self.assigner = manifest["assigner"]
        self.key_group_range = make_key_group_range(*manifest["key_group_range"])
        self.metadata = manifest["metadata"]
        self._metas = [dict(m) for m in manifest["states"]]
        self._names = {m["name"] for m in self._metas}
        files = sorted((f for f in manifest["files"]
                        if f["key_group_range"][1] >= f["key_group_range"][0]),
                       key=lambda f: f["key_group_range"][0])
        self._files = files
        self._starts = [f["key_group_range"][0] for f in files]
        self._open_files: dict[str, DataFileReader] = {}
        self._released = False

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def state_metas(self) -> list[dict]:
        """State metas of the version (JSON-able dicts: name, kind, namespace_type, ...)."""
        return [dict(m) for m in self._metas]

    def _file_for(self, key_group: int) -> dict:
        i = bisect_right(self._starts, key_group) - 1
        if i < 0 or key_group > self._files[i]["key_group_range"][1]:
            raise InvalidInputError(
                f"key group {key_group} is outside the key-group range "
                f"{self.manifest['key_group_range']} of checkpoint version {self.version}")
        return self._files[i]

    def _data_file(self, f: dict) -> DataFileReader:
        if self._released:
            raise CheckpointError(f"reader of checkpoint version {self.version} was released")
        reader = self._open_files.get(f["path"])
        if reader is None:
            path = self._store._abs(f["path"])
            try:
                handle = self._store.fs.open_input_file(path)
            except FileNotFoundError:
                raise CorruptCheckpointError(
                    f"checkpoint data file {path} of version {self.version} is missing") from None
            except OSError as exc:
                raise CorruptCheckpointError(
                    f"checkpoint data file {path} of version {self.version} cannot be opened: "
                    f"{exc}") from exc
            reader = DataFileReader(handle, path, expected_size=f["size"],
                                    expected_footer_xxh64=int(f["footer_xxh64"], 16))
            mine = (self.max_parallelism, self.key_type, self.assigner, list(f["key_group_range"]))
            theirs = (reader.max_parallelism, reader.key_type, reader.assigner,
                      [reader.key_group_start, reader.key_group_end])
            if mine != theirs:
                reader.close()
                raise CorruptCheckpointError(
                    f"checkpoint data file {path}: footer says {theirs}, the manifest {mine}")
            self._open_files[f["path"]] = reader
        return reader

    def prefetch(self, start: int, end: int) -> int:
        """Fetch the blocks of key groups ``[start, end]`` ∩ this version's range with one ranged
        read per data file, for later :meth:`entries` calls. Returns the bytes read."""
        total = 0
        for f in self._files:
            s, e = f["key_group_range"]
            lo, hi = max(s, start), min(e, end)
            if lo <= hi:
                total += self._data_file(f).prefetch(lo, hi)
        return total

    def entries(self, state_name: str, key_group: int) -> tuple[pa.BinaryArray, pa.BinaryArray]:
        """``(keys, values)`` (``pa.binary()`` arrays, sorted ascending by key bytes) of
        ``state_name`` in ``key_group``. Raises InvalidInputError for a state not in
        :meth:`state_metas` or a key group outside ``key_group_range``; CorruptCheckpointError
        when the owning data file is missing, truncated or fails a checksum."""
        if state_name not in self._names:
            raise InvalidInputError(
                f"checkpoint version {self.version} has no state {state_name!r} "
                f"(states: {sorted(self._names)})")
        try:
            if isinstance(key_group, bool):
                raise TypeError
            key_group = operator.index(key_group)
        except TypeError:
            raise InvalidInputError(f"key group must be an int, got {key_group!r}") from None
        return self._data_file(self._file_for(key_group)).entries(state_name, key_group)

    def release(self) -> None:
        """Close the data files opened so far (idempotent); later reads raise CheckpointError."""
        self._released = True
        files, self._open_files = self._open_files, {}
        for r in files.values():
            r.close()
