"""What the demo's ``foreachBatch`` function reports to the process that started the run.

With a classic SparkSession the function runs in the driver process itself; under Spark Connect
it is pickled to a Python process on the server, so nothing it changes in memory reaches the
client. :class:`RunLog` is one interface over both: in memory (``directory=None``) or as one JSON
file per micro-batch in a directory that both sides see (the demo keeps its checkpoint, output
and landing files there already).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, List, Optional

__all__ = ["RunLog"]

_STOP = "stop.json"


class RunLog:
    """Records of the micro-batches of one run: JSON-able dicts with an int ``batch_id``.

    ``directory``: None keeps the records in memory (the function runs in this process); a
    path writes ``batch-<id>.json`` files there (created on first use), each by a write to a
    temporary name and a rename, so a reader never sees half a record. A replayed batch id
    replaces its record. Not for concurrent writers of one batch id (Spark runs one
    ``foreachBatch`` call of a query at a time).
    """

    def __init__(self, directory: Optional[str] = None):
        self.directory = None if directory is None else os.path.abspath(directory)
        self._records: Dict[int, Dict[str, Any]] = {}
        self._stopped = False

    def _write(self, name: str, data: Dict[str, Any]) -> None:
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, name)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, sort_keys=True)
        os.replace(tmp, path)

    def record(self, rec: Dict[str, Any]) -> None:
        """Add (or replace) the record of micro-batch ``rec["batch_id"]``."""
        batch_id = int(rec["batch_id"])
        if self.directory is None:
            self._records[batch_id] = dict(rec)
        else:
            self._write(f"batch-{batch_id}.json", rec)

    def records(self) -> List[Dict[str, Any]]:
        """Every record so far, by batch id."""
        if self.directory is None:
            return [self._records[b] for b in sorted(self._records)]
        found = {}
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        for name in names:
            if name.startswith("batch-") and name.endswith(".json"):
                with open(os.path.join(self.directory, name), encoding="utf-8") as f:
                    rec = json.load(f)
                found[int(rec["batch_id"])] = rec
        return [found[b] for b in sorted(found)]

    def count(self) -> int:
        """Number of micro-batches recorded."""
        return len(self.records())

    def mark_stopped(self) -> None:
        """Record that the function ended the run on purpose (``--max-batches``)."""
        if self.directory is None:
            self._stopped = True
        else:
            self._write(_STOP, {"stopped": True})

    def stopped(self) -> bool:
        """True after :meth:`mark_stopped`."""
        if self.directory is None:
            return self._stopped
        return os.path.exists(os.path.join(self.directory, _STOP))

    def remove(self) -> None:
        """Delete the directory (nothing for an in-memory log)."""
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
