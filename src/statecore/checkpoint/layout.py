"""The files of a checkpoint root: their names, how a root is listed, how a file is published.

The names of manifests (statecore.checkpoint.manifests), data files (statecore.checkpoint.format)
and pending descriptors under a root: docs/formats.md "Checkpoint store and manifests".

Invariants this module keeps:

* Every file appears at its final path all at once (:meth:`CheckpointRoot.write_atomic`): on
  filesystems with an atomic rename (local disk, HDFS) it is written to a temporary name in the
  same directory and then moved (``fs.move``); on object stores (S3, GCS, Azure) nothing is ever
  renamed (a "move" there is a copy and a delete): a file is a single put of the complete bytes,
  or one multipart upload, each atomic there (an object appears only when its upload completes).
  A write that fails or is abandoned leaves nothing at the final path -- except a data file
  streamed to an object store (``streamed=True``), whose partial upload pyarrow completes when
  the stream is closed: such a file has a name of its own that no manifest references, is
  deleted at once and otherwise by retention, and a reader never opens it.
* Every data file gets a new name (the writer's name or the compaction's key-group range plus a
  random suffix), so no write ever replaces a file: a replayed micro-batch writes new files
  beside the ones a committed manifest may reference, and retention deletes whichever end up
  unreferenced.
* Durability (:meth:`CheckpointRoot.write_atomic`): on the local filesystem a file's bytes are
  fsynced before it is renamed into place, and after it its directory and the parent of each
  directory the write created, so a file that has appeared survives a power loss; on object
  stores a completed put is durable; on HDFS a closed file is replicated (pyarrow exposes no
  ``hsync``).
"""

from __future__ import annotations

import atexit
import gc
import os
import re
import time
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from statecore.errors import InvalidInputError

__all__ = [
    "CheckpointRoot", "MAX_VERSION", "check_version", "check_writer", "check_commit_id",
    "version_dir",
    "manifest_name", "data_path", "pending_path", "heartbeat_path", "compacted_data_path",
    "is_compacted_name", "manifest_version", "is_version_dir", "join_uri", "is_uri", "redact_uri",
]

#: Highest checkpoint version (versions are ints in ``[0, 10**20)``, 20 decimal digits).
MAX_VERSION = 10**20 - 1
_WRITER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_COMPACTED_RE = re.compile(r"^compacted-s\d+-\d+-\d+-[0-9a-f]{12}\.sckp$")
_MANIFEST_RE = re.compile(r"^manifest-(\d{20})\.json$")
_VERSION_DIR_RE = re.compile(r"^\d{20}$")
_OBJECT_STORES = {"s3", "gcs", "abfs"}


def check_version(version: Any) -> int:
    """``version`` when it is an int in ``[0, MAX_VERSION]``; else InvalidInputError."""
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_VERSION:
        raise InvalidInputError(
            f"checkpoint version must be an int in [0, {MAX_VERSION}], got {version!r}")
    return version


def check_writer(writer: Any) -> str:
    """``writer`` when it can be a file name (letters, digits, ``_.-``, at most 128 characters,
    not starting with ``.`` or ``-``); else InvalidInputError."""
    if not isinstance(writer, str) or not _WRITER_RE.match(writer):
        raise InvalidInputError(
            f"writer must match {_WRITER_RE.pattern} (it becomes a file name), got {writer!r}")
    return writer


def check_commit_id(commit_id: Any) -> str:
    """``commit_id`` when it is 32 lowercase hex digits (a manifest's ``commit_id``, what
    ``statecore.checkpoint.manifests.new_commit_id`` makes); else InvalidInputError."""
    if (not isinstance(commit_id, str) or len(commit_id) != 32
            or commit_id.strip("0123456789abcdef")):
        raise InvalidInputError(
            f"commit id must be 32 lowercase hex digits, got {commit_id!r}")
    return commit_id


def version_dir(version: int) -> str:
    """The 20-digit directory name of ``version`` under ``data/`` and ``pending/``."""
    return f"{version:020d}"


def manifest_name(version: int) -> str:
    """File name (relative to the root) of the manifest of ``version``."""
    return f"manifest-{version_dir(version)}.json"


def data_path(version: int, writer: str) -> str:
    """A new, unique path relative to the root for a data file of ``writer`` at ``version``
    (``data/V/<writer>-<12 hex digits>.sckp``): every write gets its own file."""
    return f"data/{version_dir(version)}/{writer}-{uuid.uuid4().hex[:12]}.sckp"


def pending_path(version: int, writer: str) -> str:
    """Path relative to the root of the pending descriptor of ``writer`` at ``version``."""
    return f"pending/{version_dir(version)}/{writer}.json"


def heartbeat_path(version: int, writer: str) -> str:
    """Path relative to the root of the heartbeat of ``writer``'s write in flight at
    ``version`` (``pending/V/<writer>.alive``; docs/formats.md "Checkpoint store and
    manifests")."""
    return f"pending/{version_dir(version)}/{writer}.alive"


def compacted_data_path(version: int, seq: int, start: int, end: int) -> str:
    """A new, unique path relative to the root for the compacted run of key groups
    ``[start, end]`` with sequence number ``seq`` in ``version``."""
    return (f"data/{version_dir(version)}/compacted-s{seq}-{start}-{end}-"
            f"{uuid.uuid4().hex[:12]}.sckp")


def is_compacted_name(base_name: str) -> bool:
    """True when ``base_name`` is the file name of a compaction output."""
    return bool(_COMPACTED_RE.match(base_name))


def manifest_version(base_name: str) -> int | None:
    """The version a manifest file name ``base_name`` names, None when it names no manifest."""
    m = _MANIFEST_RE.match(base_name)
    return int(m.group(1)) if m else None


def is_version_dir(base_name: str) -> bool:
    """True when ``base_name`` is the directory name of a version (:func:`version_dir`)."""
    return bool(_VERSION_DIR_RE.match(base_name))


def join_uri(base: str, name: str) -> str:
    """``base`` (a local path or a URI, possibly with a ``?query`` such as
    ``s3://bucket/prefix?endpoint_override=host:port``) with the path component ``name``
    appended: ``s3://bucket/prefix/name?endpoint_override=host:port``."""
    path, sep, query = base.partition("?")
    return path.rstrip("/") + "/" + name + sep + query


#: Query parameters of a filesystem URI whose values are secrets (``pyarrow.fs`` S3 URIs may
#: carry ``access_key``/``secret_key``/``session_token``).
_SECRET_PARAM_RE = re.compile(
    r"(?i)([?&][^=&\s]*(?:secret|token|password|access_key)[^=&\s]*=)[^&\s'\"]*")
_USERINFO_RE = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/@?#\s'\"]*@")


def redact_uri(text: str) -> str:
    """``text`` (a URI, or a message that may contain URIs) fit for messages and logs: the
    user info of every URI (``s3://KEY:SECRET@bucket/prefix``) and the values of query
    parameters that carry secrets (names containing ``secret``, ``token``, ``password`` or
    ``access_key``) replaced by ``***``. A local path comes back unchanged."""
    if "://" not in text:
        return text
    return _SECRET_PARAM_RE.sub(r"\1***", _USERINFO_RE.sub(r"\1***@", text))


def is_uri(path: str) -> bool:
    """True when ``path`` is a URI (``scheme://...``) rather than a local path."""
    return "://" in path


def _base_type_name(fs: pafs.FileSystem) -> str:
    """The type name of the filesystem under ``SubTreeFileSystem`` layers (a PyFileSystem's
    handler's: it reports ``py::<name>``)."""
    while isinstance(fs, pafs.SubTreeFileSystem):
        fs = fs.base_fs
    return fs.type_name.split("::")[-1]


def _has_atomic_rename(fs: pafs.FileSystem) -> bool:
    return _base_type_name(fs) not in _OBJECT_STORES


_S3_EXIT_HOOK = []


def _finalize_s3_at_exit() -> None:
    """Register (once) an exit hook that collects garbage and then finalizes pyarrow's S3
    support. pyarrow's own hook can deadlock at interpreter exit while S3 filesystem objects are
    still alive (apache/arrow#50188); exit hooks run last-registered first, so this one runs
    before pyarrow's, when the objects the program dropped are gone, and pyarrow's then finds
    S3 finalized."""
    if _S3_EXIT_HOOK:
        return
    _S3_EXIT_HOOK.append(True)

    def finalize() -> None:
        gc.collect()
        pafs.finalize_s3()

    atexit.register(finalize)


def _local_os_path(fs: pafs.FileSystem, path: str) -> str | None:
    """The operating-system path of ``path`` in ``fs`` when ``fs`` is the local filesystem
    (possibly under ``SubTreeFileSystem`` layers), else None."""
    while isinstance(fs, pafs.SubTreeFileSystem):
        path = fs.base_path.rstrip("/") + "/" + path.lstrip("/")
        fs = fs.base_fs
    return path if fs.type_name == "local" else None


class CheckpointRoot:
    """One root directory of a ``pyarrow.fs`` filesystem holding a checkpoint.

    ``uri_or_path``: a local path (str or ``os.PathLike``) or a URI understood by
    ``pyarrow.fs.FileSystem.from_uri``; ``filesystem``: a filesystem to use instead (the path is
    then inside it). Attributes: ``fs``, ``root`` (absolute path in ``fs``, no trailing ``/``),
    ``uri`` (as given, credentials redacted: :func:`redact_uri`), ``atomic_rename``,
    ``is_local`` (the files are local OS files: reads are cheap system calls, not round trips
    to a server). Raises InvalidInputError for a bad root or filesystem. Nothing is created
    until the first write.
    """

    #: Listings retried when a file vanished between the directory read and its stat.
    LIST_ATTEMPTS = 8

    def __init__(self, uri_or_path: str | os.PathLike, filesystem: pafs.FileSystem | None = None):
        raw = os.fspath(uri_or_path)
        if not isinstance(raw, str) or not raw:
            raise InvalidInputError(f"checkpoint root must be a non-empty path or URI, got {raw!r}")
        if filesystem is None:
            if "://" in raw:
                try:
                    filesystem, path = pafs.FileSystem.from_uri(raw)
                except (pa.ArrowInvalid, OSError) as exc:
                    raise InvalidInputError(
                        f"cannot open checkpoint URI {redact_uri(raw)!r}: {redact_uri(str(exc))}"
                    ) from exc
            else:
                filesystem, path = pafs.LocalFileSystem(), os.path.abspath(raw)
        else:
            if not isinstance(filesystem, pafs.FileSystem):
                raise InvalidInputError(
                    f"filesystem must be a pyarrow.fs.FileSystem, got {type(filesystem).__name__}")
            path = pafs.FileSystem.from_uri(raw)[1] if "://" in raw else raw
        if _base_type_name(filesystem) == "s3":
            _finalize_s3_at_exit()
        self.fs = filesystem
        self.root = path.rstrip("/") or "/"
        # Messages name the root through ``uri``: never with the credentials it may carry.
        self.uri = redact_uri(raw)
        self.atomic_rename = _has_atomic_rename(filesystem)
        self._local = _local_os_path(filesystem, self.root) is not None  # fsync applies
        self.is_local = self._local

    def path(self, rel: str) -> str:
        """The absolute path in :attr:`fs` of ``rel`` (relative to the root)."""
        return f"{self.root}/{rel}" if self.root != "/" else f"/{rel}"

    def os_path(self, rel: str) -> str | None:
        """The operating-system path of ``rel`` (relative to the root) when the root's files
        are local OS files (:attr:`is_local`), else None."""
        return _local_os_path(self.fs, self.path(rel)) if self.is_local else None

    def list(self, base: str, recursive: bool = False) -> list:
        """FileInfos under the absolute path ``base`` (empty when it does not exist).

        Writers publish files by renaming a temporary file, and LocalFileSystem (like others)
        lists a directory by reading its entries and then stat-ing each: a temporary file
        renamed in between makes the whole listing fail with FileNotFoundError. Such a race is
        momentary, so the listing is retried; a persistent error is raised."""
        for attempt in range(self.LIST_ATTEMPTS):
            try:
                return self.fs.get_file_info(
                    pafs.FileSelector(base, allow_not_found=True, recursive=recursive))
            except FileNotFoundError:
                if attempt == self.LIST_ATTEMPTS - 1:
                    raise
                time.sleep(0.001 * (attempt + 1))
        raise AssertionError("unreachable")

    def write_atomic(self, rel: str, produce, before_publish=None, streamed: bool = False) -> Any:
        """Run ``produce(stream)`` and make its bytes appear at ``rel`` all at once; returns what
        ``produce`` returned. ``before_publish()`` (optional) runs after ``produce`` and before
        the bytes become visible; it raises to abandon the write (nothing appears at ``rel``).
        ``streamed`` (data files, whose names are unique): on an object store, write straight
        into the object's (multipart) upload instead of gathering the bytes in memory first, so
        serializing and uploading overlap; a failed or abandoned write then deletes the object
        its closed stream completed (module docstring). Elsewhere it changes nothing.
        On the local filesystem the bytes are fsynced before the rename, and after it the
        file's directory and the parent of every directory the write created (module docstring
        "Durability"), so once this returns the file survives a power loss. Filesystem errors
        propagate as ``OSError`` (the temporary file removed)."""
        final = self.path(rel)
        parent = final.rsplit("/", 1)[0]
        if not self.atomic_rename and streamed:
            out = self.fs.open_output_stream(final)
            try:
                result = produce(out)
                if before_publish is not None:
                    before_publish()
            except BaseException:
                # pyarrow has no abort: closing completes the upload, so remove what it made.
                try:
                    out.close()
                except OSError:
                    pass
                try:
                    self.fs.delete_file(final)
                except OSError:
                    pass
                raise
            out.close()
            return result
        if not self.atomic_rename:
            buf = pa.BufferOutputStream()
            result = produce(buf)
            data = buf.getvalue()
            if before_publish is not None:
                before_publish()
            with self.fs.open_output_stream(final) as out:
                out.write(data)
            return result
        # Directories whose new entries must reach the disk: the parent (the file's name) and,
        # for each directory create_dir makes, the one holding it.
        synced = [parent]
        if self._local:
            d = parent
            while len(d) > len(self.root) and "/" in d and \
                    self.fs.get_file_info(d).type == pafs.FileType.NotFound:
                d = d.rsplit("/", 1)[0]
                synced.append(d)
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{final}.tmp-{uuid.uuid4().hex}"
        try:
            with self.fs.open_output_stream(tmp) as out:
                result = produce(out)
            self._sync(tmp)
            if before_publish is not None:
                before_publish()
            self.fs.move(tmp, final)
        except BaseException:
            try:
                self.fs.delete_file(tmp)
            except OSError:
                pass
            raise
        for d in synced:
            self._sync(d)
        return result

    def _sync(self, path: str) -> None:
        """fsync the file or directory ``path`` of :attr:`fs` when it is on the local
        filesystem (directly or through ``SubTreeFileSystem``); a no-op elsewhere."""
        local = _local_os_path(self.fs, path)
        if local is None:
            return
        fd = os.open(local, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Publish ``data`` at ``rel`` atomically (:meth:`write_atomic`)."""
        self.write_atomic(rel, lambda out: out.write(data))
