"""Checkpoints of keyed state: key-group partitioned data files (:mod:`.format`) and a versioned
store with atomic manifests on any ``pyarrow.fs`` filesystem (:mod:`.store`)."""

from statecore.checkpoint.format import FORMAT_VERSION
from statecore.checkpoint.store import CheckpointReader, CheckpointStore

__all__ = ["CheckpointStore", "CheckpointReader", "FORMAT_VERSION"]
