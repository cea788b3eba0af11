"""Manifests edited after their commit, for tests: a checkpoint store's manifest rewritten and
signed again, as a buggy or hostile writer could leave it (the checksum then holds, so only
the schema and chain checks stand in the way)."""

from __future__ import annotations

import json
import os

from statecore.checkpoint.manifests import signed_manifest

__all__ = ["forge_manifest", "forge_manifest_file"]


def forge_manifest_file(path, edit) -> None:
    """Rewrite the manifest file at ``path`` (local): ``edit(doc)`` changes the parsed manifest
    (without its checksum) in place, then it is signed again
    (:func:`~statecore.checkpoint.manifests.signed_manifest`) and written back."""
    with open(path) as f:
        doc = json.load(f)
    doc.pop("checksum_xxh64")
    edit(doc)
    with open(path, "w") as f:
        json.dump(signed_manifest(doc), f)


def forge_manifest(store, version: int, edit) -> None:
    """:func:`forge_manifest_file` on the manifest of ``version`` in ``store`` (a
    CheckpointStore on local disk)."""
    forge_manifest_file(os.path.join(store.root, store.manifest_name(version)), edit)
