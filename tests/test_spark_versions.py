"""statecore.spark.versions: which checkpoint version a Spark micro-batch or a flush produces,
across runs of one Spark query, new Spark queries, replays and flushes (no Spark needed)."""

import pytest

from statecore.errors import StateError
from statecore.spark.versions import Placement, is_flush_version, place_flush, place_micro_batch


class Checkpoint:
    """Committed versions' metadata as the operator records it, driven by the placements."""

    def __init__(self):
        self.meta = {}

    def latest(self):
        return max(self.meta) if self.meta else None

    def get(self, version):
        return self.meta.get(version)

    def batch(self, batch_id, query):
        place = place_micro_batch("op", batch_id, query, self.latest(), self.get)
        if not place.committed:
            self.meta[place.version] = {"batch_id": batch_id, "query_id": place.query_id,
                                        "batch_offset": place.batch_offset, "flush": False,
                                        "final": False}
        return place

    def flush(self, final):
        latest = self.latest()
        place = place_flush(latest, self.meta.get(latest, {}), final)
        if place is not None:
            self.meta[place.version] = {"batch_id": None, "query_id": place.query_id,
                                        "batch_offset": place.batch_offset, "flush": True,
                                        "final": final}
        return place


def test_runs_of_one_query_and_of_a_new_query_continue_after_non_final_flushes():
    c = Checkpoint()
    assert [c.batch(b, "A").version for b in range(3)] == [0, 1, 2]
    assert c.flush(final=False) == Placement(3, 0, "A")
    assert c.flush(final=False) is None  # a rerun of the run's flush: nothing new to flush
    # The next run of the same query (same Spark checkpoint): batch ids go on from 3.
    assert c.batch(3, "A") == Placement(4, 1, "A")
    assert c.batch(4, "A") == Placement(5, 1, "A")
    assert c.batch(4, "A") == Placement(5, 1, "A")  # a replay of the latest batch
    assert c.batch(3, "A").version == 4  # and of an older one of this run
    assert c.flush(final=False).version == 6
    # A new query (a new Spark checkpoint): batch ids restart at 0.
    assert c.batch(0, "B") == Placement(7, 7, "B")
    assert c.batch(1, "B") == Placement(8, 7, "B")
    # Query A may not feed the open stream of query B: A could still replay a batch.
    with pytest.raises(StateError, match="no flush came in between"):
        c.batch(5, "A")
    assert c.flush(final=True) == Placement(9, 7, "B")
    assert is_flush_version(c.meta[9]) and c.meta[9]["final"]
    assert c.flush(final=True) is None and c.flush(final=False) is None
    with pytest.raises(StateError, match="finalized(.|\n)*flush\\(spark, final=False\\)"):
        c.batch(2, "B")
    with pytest.raises(StateError, match="finalized"):
        c.batch(0, "C")


def test_a_replay_of_a_batch_committed_before_the_flush_runs_nothing():
    c = Checkpoint()
    for b in range(3):
        c.batch(b, "A")
    c.flush(final=False)
    # The query failed after batch 2 was committed here, before Spark's commit log: the next
    # run replays batch 2, which the flush built on already.
    assert c.batch(2, "A") == Placement(2, 0, "A", committed=True)
    assert c.batch(3, "A").version == 4
    # The same after a final flush: the replay is not an error, a new batch is.
    c.flush(final=True)
    assert c.batch(3, "A") == Placement(4, 1, "A", committed=True)
    with pytest.raises(StateError, match="finalized"):
        c.batch(4, "A")


def test_batches_outside_the_current_run_are_refused():
    c = Checkpoint()
    for b in range(3):
        c.batch(b, "A")
    c.flush(final=False)
    for b in range(2):
        c.batch(b, "B")  # versions 4, 5 with offset 4
    c.flush(final=False)
    for b in range(3, 5):
        c.batch(b, "A")  # query A again after the flush: versions 7, 8 with offset 4
    # Batch 0 of A maps to version 4, which holds batch 0 of query B.
    with pytest.raises(StateError, match="holds micro-batch 0 of query B"):
        c.batch(0, "A")
    # Batch 2 of A maps to version 6, the flush.
    with pytest.raises(StateError, match="holds a flush"):
        c.batch(2, "A")


def test_direct_calls_without_a_query_id_form_one_stream():
    c = Checkpoint()
    c.batch(0, None)
    c.batch(1, None)
    c.flush(final=False)
    assert c.batch(1, None).committed  # before the flush: a replay
    assert c.batch(2, None).version == 3
    # A streaming query after direct calls is another stream: allowed only after a flush.
    with pytest.raises(StateError, match="no flush came in between"):
        c.batch(0, "A")
    c.flush(final=False)
    assert c.batch(0, "A").version == 5


def test_versions_written_before_batch_offsets_map_to_their_batch_id():
    # Metadata without query_id / batch_offset: version == batch id, any query continues.
    old = {0: {"batch_id": 0}, 1: {"batch_id": 1}}
    assert place_micro_batch("op", 2, "A", 1, old.get) == Placement(2, 0, "A")
    assert place_micro_batch("op", 1, None, 1, old.get) == Placement(1, 0, None)
    final = {**old, 2: {"batch_id": 2, "final": True}}
    assert is_flush_version(final[2])
    assert place_micro_batch("op", 1, "A", 2, final.get).committed
    with pytest.raises(StateError, match="finalized"):
        place_micro_batch("op", 2, "A", 2, final.get)
    assert place_flush(2, final[2], True) is None
    assert place_flush(None, {}, False) is None
    assert place_flush(1, old[1], False) == Placement(2, 0, None)
    # A non-final flush right after such a version records no query id either: it closed a
    # stream of any query, so that query's replay of its last batch still runs nothing.
    flushed = {**old, 2: {"batch_id": None, "batch_offset": 0, "flush": True, "final": False}}
    assert place_micro_batch("op", 1, "A", 2, flushed.get).committed
    assert place_micro_batch("op", 2, "A", 2, flushed.get) == Placement(3, 1, "A")
