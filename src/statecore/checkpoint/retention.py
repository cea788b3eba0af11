"""Retention: keeping the newest versions of a root and deleting what nothing needs any more.

:meth:`Retention.retain` deletes manifests of dropped versions first (oldest first, so the
committed versions stay a suffix), the temporary files of manifest writes killed before their
rename, then every file under ``data/`` and ``pending/`` that no retained manifest references,
except files of versions at or above the newest retained one (writes of a version in flight) --
compaction outputs and their temporary files excepted --, files of a compaction in progress in
this process and the runs that open readers of this process pin (statecore.checkpoint.pins: a
tiered backend reading the version it is attached to). The retained manifests are all read and
checked before anything is deleted.

Invariants: a crash at any point leaves every retained version restorable (its manifest and
every run it references stay); calling :meth:`Retention.retain` again finishes the job. Retention
runs under the lock that serializes commit and compaction publishing of the root.
"""

from __future__ import annotations

from typing import Callable

import pyarrow.fs as pafs

from statecore.checkpoint.layout import CheckpointRoot, is_compacted_name, is_version_dir
from statecore.checkpoint.manifests import ManifestLog
from statecore.errors import InvalidInputError

__all__ = ["Retention"]


class Retention:
    """Keeps the newest versions under one root. ``manifests``: the root's
    :class:`~statecore.checkpoint.manifests.ManifestLog` (or an object with its interface);
    ``lock``: the lock serializing manifest publishing and retention of the root in this process;
    ``in_flight_paths()``: paths (relative to the root) of files no retained manifest may
    reference that must stay (compaction outputs not yet published, runs pinned by open
    readers), called holding ``lock``."""

    def __init__(self, root: CheckpointRoot, manifests: ManifestLog, lock,
                 in_flight_paths: Callable[[], set[str]]):
        self.root = root
        self.manifests = manifests
        self.lock = lock
        self.in_flight_paths = in_flight_paths

    def retain(self, k: int) -> list[int]:
        """Keep the newest ``k`` (>= 1) committed versions and delete the rest (module
        docstring); returns the versions deleted. Raises InvalidInputError for ``k < 1`` and
        CorruptCheckpointError (deleting nothing) when a retained manifest cannot be read."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidInputError(f"retain needs k >= 1, got {k!r}")
        fs = self.root.fs
        with self.lock:
            self.manifests.fence("retention")
            versions = self.manifests.versions()
            if not versions:
                return []
            keep, drop = versions[-k:], versions[:-k]
            referenced = {f["path"] for v in keep for f in self.manifests.read(v)["files"]}
            referenced |= self.in_flight_paths()
            for v in drop:
                self.manifests.delete(v)
            newest = keep[-1]
            for f in self.root.list(self.root.root):
                # A manifest write killed before its rename; manifests are only written under
                # the lock held here, so none is in flight.
                if (f.type == pafs.FileType.File and f.base_name.startswith("manifest-")
                        and ".json.tmp-" in f.base_name):
                    self.manifests.fence(f"deleting {f.path}")
                    fs.delete_file(f.path)
            for top in ("data", "pending"):
                for d in self.root.list(self.root.path(top)):
                    if d.type != pafs.FileType.Directory or not is_version_dir(d.base_name):
                        continue
                    in_flight_dir = int(d.base_name) >= newest
                    kept_any = False
                    for f in self.root.list(d.path, recursive=True):
                        if f.type != pafs.FileType.File:
                            continue
                        rel = f"{top}/{d.base_name}/{f.path[len(d.path) + 1:]}"
                        # A temporary file of an atomic write is named after its final path:
                        # one of a compaction killed before its rename is a compaction output.
                        final = rel.split(".tmp-", 1)[0]
                        if rel in referenced or final in referenced or (
                                in_flight_dir and not (top == "data" and is_compacted_name(
                                    final.rsplit("/", 1)[-1]))):
                            kept_any = True
                        else:
                            self.manifests.fence(f"deleting {f.path}")
                            fs.delete_file(f.path)
                    if not kept_any and not in_flight_dir:
                        self.manifests.fence(f"deleting {d.path}")
                        fs.delete_dir(d.path)
            return drop
