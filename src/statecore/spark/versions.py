"""Which checkpoint version a Spark micro-batch or a flush of the operator produces.

The operator's state versions are consecutive ints; each is either a micro-batch (one Spark
``foreachBatch`` call) or a flush (:meth:`statecore.spark.StatefulOperator.flush`). Spark batch
ids identify micro-batches only within one Spark checkpoint location, and a flush consumes a
version without a batch id, so the mapping is recorded in every version's metadata:

* ``batch_id``: the Spark batch id of a micro-batch (None for a flush);
* ``query_id``: the Spark query id the micro-batch ran under: the local property
  ``sql.streaming.queryId`` that Spark sets while it runs a query's batches, which persists
  across restarts from the same Spark checkpoint location (``StreamingQuery.id``); None when the
  operator is called outside a streaming query. A flush carries the one of the micro-batch
  before it (none when that version predates the field: the flush then closes a stream of
  any query);
* ``batch_offset``: ``version - batch_id`` for the micro-batches of the current *stream* (the
  versions fed by one query id since the last flush); a flush carries the offset of the stream
  it closed;
* ``flush`` (the version is a flush) and ``final`` (the end-of-input flush).

Rules (:func:`place_micro_batch`), for micro-batch ``b`` of query ``q`` when the latest committed
version is ``L``:

* ``L`` is a micro-batch of query ``q`` (or its metadata predates these fields: a version without
  ``batch_offset`` has ``version == batch_id`` and any query): version ``b + offset``. Above
  ``L`` it is new; at or below ``L`` it is a replay of a committed micro-batch, which runs again
  from its predecessor (the version must hold batch ``b`` of query ``q``). Another query id is
  refused (StateError): the checkpoint's stream is still open, and a batch of that query may
  still be replayed.
* ``L`` is a flush closing a stream of query ``q`` whose last batch id is ``L - 1 - offset``:
  a batch id up to that one was committed before the flush, which already built on it (a replay
  of it, after the query failed once its statecore commit was done): nothing is run again,
  exactly once. A later batch id, or a batch of another query (a new Spark checkpoint, whose
  batch ids restart at 0), opens a new stream at version ``L + 1`` with ``offset = L + 1 - b``,
  unless the flush was final (StateError: the input ended for good).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from statecore.errors import InvalidInputError, StateError

__all__ = ["QUERY_ID_PROPERTY", "Placement", "place_micro_batch", "place_flush",
           "is_flush_version", "streaming_query_id"]

#: Spark's local property holding the running streaming query's id (``StreamExecution``).
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def streaming_query_id(checkpoint_location: str) -> str:
    """The id of the streaming query that runs from Spark checkpoint location
    ``checkpoint_location`` (a path or a ``pyarrow.fs`` URI): the ``id`` of the JSON file
    ``<location>/metadata`` that Spark writes when the query first starts there and reuses on
    every restart (Spark's ``StreamMetadata``; the same id Spark puts in the local property
    :data:`QUERY_ID_PROPERTY` while it runs the query's batches).

    For a ``foreachBatch`` function that cannot read that property: under Spark Connect it runs
    in a Python process on the server, without a SparkContext. Raises StateError when the file
    is missing (the query never started there) and InvalidInputError when it holds no id.
    """
    import json

    import pyarrow.fs as pafs

    loc = str(checkpoint_location).rstrip("/")
    if "://" in loc:
        fs, base = pafs.FileSystem.from_uri(loc)
    else:
        import os

        fs, base = pafs.LocalFileSystem(), os.path.abspath(loc)
    path = base + "/metadata"
    try:
        with fs.open_input_stream(path) as f:
            text = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise StateError(
            f"no Spark checkpoint metadata at {loc}/metadata: no streaming query has started "
            "from this checkpoint location") from None
    first = text.splitlines()[0] if text else ""
    try:
        qid = json.loads(first).get("id")
    except (ValueError, AttributeError):
        qid = None
    if not isinstance(qid, str) or not qid:
        raise InvalidInputError(f"{loc}/metadata holds no query id: {first[:200]!r}")
    return qid


@dataclass(frozen=True)
class Placement:
    """Where a micro-batch or flush goes: the ``version`` it produces, the ``batch_offset`` and
    ``query_id`` recorded with it, and ``committed``: True when the micro-batch is a replay of
    one committed before the latest flush (nothing to run; ``version`` is its version)."""

    version: int
    batch_offset: int
    query_id: Optional[str]
    committed: bool = False


def is_flush_version(meta: Dict[str, Any]) -> bool:
    """True when the version with metadata ``meta`` is a flush (final or not; a version written
    before non-final flushes existed is a flush when it is final)."""
    return bool(meta.get("flush", meta.get("final", False)))


def place_micro_batch(operator_name: str, batch_id: int, query_id: Optional[str],
                      latest: Optional[int],
                      metadata: Callable[[int], Optional[Dict[str, Any]]]) -> Placement:
    """The placement of Spark micro-batch ``batch_id`` (int >= 0) of query ``query_id`` (None:
    called outside a streaming query), given the latest committed version ``latest`` (None: an
    empty checkpoint) and ``metadata(version)``, the metadata of a committed version or None
    when it is not (any longer) committed. Rules: module docstring.

    Raises StateError when the checkpoint was finalized, when another query's stream is still
    open, or when the batch id maps to a version that another micro-batch or a flush holds."""
    if latest is None:
        return Placement(batch_id, 0, query_id)
    meta = metadata(latest) or {}
    offset = int(meta.get("batch_offset", 0))
    same_query = "query_id" not in meta or meta["query_id"] == query_id
    if is_flush_version(meta):
        last = latest - 1 - offset
        if same_query and batch_id <= last:
            return Placement(batch_id + offset, offset, query_id, committed=True)
        if meta.get("final"):
            raise StateError(
                f"operator {operator_name}: the checkpoint was finalized by the end-of-input "
                f"flush at version {latest}; it cannot take micro-batch {batch_id}. A final "
                "flush ends the input for good: a job that runs again on new input (a scheduled "
                "availableNow or Trigger.Once run) must not flush at the end of each run with "
                "final=True (flush(spark, final=False) keeps the checkpoint open); to go on "
                "from here, use a new operator name or checkpoint")
        return Placement(latest + 1, latest + 1 - batch_id, query_id)
    if not same_query:
        raise StateError(
            f"operator {operator_name}: micro-batch {batch_id} comes from Spark query "
            f"{query_id}, but the checkpoint's latest version {latest} is micro-batch "
            f"{meta.get('batch_id')} of query {meta['query_id']} and no flush came in between: "
            "that query may still replay it. Feed the operator from one Spark checkpoint "
            "location, or end a run with flush(spark, final=False) before a query with another "
            "Spark checkpoint continues it")
    version = batch_id + offset
    if version < 0:
        raise StateError(
            f"operator {operator_name}: micro-batch {batch_id} of query {query_id} precedes "
            f"the current run of that query (batch offset {offset}); a batch from before the "
            "current run cannot be replayed")
    if version <= latest:
        held = metadata(version)
        if held is not None and (is_flush_version(held) or (
                "batch_offset" in held and (held.get("batch_id"), held.get("query_id"))
                != (batch_id, query_id))):
            what = ("a flush" if is_flush_version(held)
                    else f"micro-batch {held.get('batch_id')} of query {held.get('query_id')}")
            raise StateError(
                f"operator {operator_name}: micro-batch {batch_id} of query {query_id} maps to "
                f"version {version}, which holds {what}; a batch from before the current run "
                "cannot be replayed")
    return Placement(version, offset, query_id)


def place_flush(latest: Optional[int], meta: Dict[str, Any], final: bool) -> Optional[Placement]:
    """The placement of a flush (``final``: the end-of-input flush) after the latest committed
    version ``latest`` with metadata ``meta``: version ``latest + 1``, carrying the closed
    stream's ``batch_offset`` and ``query_id``; None when there is nothing to do: an empty
    checkpoint, a finalized one, or a non-final flush right after a flush (a rerun)."""
    if latest is None or meta.get("final"):
        return None
    if is_flush_version(meta) and not final:
        return None
    return Placement(latest + 1, int(meta.get("batch_offset", 0)), meta.get("query_id"))
