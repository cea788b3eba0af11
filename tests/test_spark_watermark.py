"""The operator's watermark delay (allowed lateness, ``StatefulOperator(watermark_delay=...)``):
the parsing of delays on the driver, the watermark rule, and a real local Spark run where a row
arriving out of order within the delay still joins its session."""

import datetime
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from statecore.descriptors import ValueStateDescriptor
from statecore.errors import InvalidInputError
from statecore.spark import KeyedProcessor, StatefulOperator
from statecore.spark.watermark import next_watermark, parse_watermark_delay

# ------------------------------------------------------------------ parsing (driver, no Spark)


@pytest.mark.parametrize("value, ms", [
    ("10 minutes", 600_000),
    ("1 minute", 60_000),
    ("1 hour", 3_600_000),
    ("2 hours", 7_200_000),
    ("30 seconds", 30_000),
    ("1 second", 1_000),
    ("500 milliseconds", 500),
    ("1 millisecond", 1),
    ("1 day", 86_400_000),
    ("1 week", 604_800_000),
    ("1 minute 30 seconds", 90_000),
    ("interval 10 minutes", 600_000),
    ("  10   Minutes ", 600_000),
    ("1.5 hours", 5_400_000),
    ("0.5 seconds", 500),
    ("10s", 10_000),
    ("250ms", 250),
    ("1500 microseconds", 1),  # truncated to whole ms, as Spark's getDelayMs
    ("0 seconds", 0),
    (0, 0),
    (1234, 1234),
    (datetime.timedelta(minutes=10), 600_000),
    (datetime.timedelta(microseconds=2500), 2),
    (None, 0),
])
def test_delays_parse_to_milliseconds(value, ms):
    assert parse_watermark_delay(value) == ms


@pytest.mark.parametrize("value, words", [
    (-1, "negative"),
    ("-10 minutes", "negative"),
    ("1 minute -2 minutes", "negative"),
    (datetime.timedelta(seconds=-1), "negative"),
    ("", "no duration"),
    ("interval", "no duration"),
    ("ten minutes", "not a duration"),
    ("10", "not a duration"),
    ("10 minutes and", "not a duration"),
    ("10 fortnights", "unknown unit"),
    ("1 month", "no fixed length"),
    ("2 years", "no fixed length"),
    (True, "must be a duration"),
    (1.5, "must be an int"),
    ([10], "must be an int"),
    (2**63, "int64"),
    ("30000000000 weeks", "int64"),
])
def test_bad_delays_are_refused(value, words):
    with pytest.raises(InvalidInputError, match=words):
        parse_watermark_delay(value)


def test_the_watermark_trails_the_max_event_time_and_never_moves_back():
    assert next_watermark(None, None, 10) is None
    assert next_watermark(None, 100, 0) == 100
    assert next_watermark(None, 100, 30) == 70
    assert next_watermark(70, None, 30) == 70
    assert next_watermark(70, 90, 30) == 70  # 60 would move it back
    assert next_watermark(70, 200, 30) == 170
    assert next_watermark(None, -(2**63) + 5, 10) == -(2**63)  # clamped to int64


def _processor():
    return SessionClicks()


def test_the_operator_checks_its_delay_on_the_driver(tmp_path):
    pytest.importorskip("pyspark")
    common = dict(key_column="user", checkpoint=str(tmp_path), output=str(tmp_path / "o"),
                  backend="python")
    op = StatefulOperator("s", _processor(), event_time_column="t", watermark_delay="1 minute",
                          **common)
    assert op.watermark_delay_ms == 60_000
    assert StatefulOperator("s", _processor(), event_time_column="t",
                            **common).watermark_delay_ms == 0
    with pytest.raises(InvalidInputError, match="negative"):
        StatefulOperator("s", _processor(), event_time_column="t", watermark_delay=-5, **common)
    with pytest.raises(InvalidInputError, match="not a duration"):
        StatefulOperator("s", _processor(), event_time_column="t", watermark_delay="soon",
                         **common)
    with pytest.raises(InvalidInputError, match="needs event_time_column"):
        StatefulOperator("s", _processor(), watermark_delay="1 minute", **common)


# ------------------------------------------------------------------ on Spark

GAP_MS = 60_000
OUT = pa.schema([("user", pa.string()), ("clicks", pa.int64()), ("last", pa.int64())])


class SessionClicks(KeyedProcessor):
    """Clicks per user in sessions that end ``GAP_MS`` of event time after the user's latest
    click; a session closes when the watermark passes that point (no bookkeeping for late
    rows: that is the watermark delay's job)."""

    output_schema = OUT

    def open(self, ctx):
        self.clicks = ctx.backend.get_state(ValueStateDescriptor("clicks", "int64", default=0))
        self.last = ctx.backend.get_state(ValueStateDescriptor("last", "int64"))

    def process_batch(self, batch, ctx):
        for user, t in sorted(zip(batch["user"].to_pylist(), batch["t"].to_pylist())):
            ctx.backend.set_current_key(user)
            self.clicks.update(self.clicks.value() + 1)
            last = self.last.value()
            if last is None or t > last:
                self.last.update(t)
                ctx.backend.timers.register_event_time_timer(t + GAP_MS)
        return ()

    def on_watermark(self, ctx, watermark_ms):
        closed = []
        for ts, user, _ in ctx.backend.timers.advance_watermark(watermark_ms):
            ctx.backend.set_current_key(user)
            if self.last.value() == ts - GAP_MS:  # no later click: the session is over
                closed.append({"user": user, "clicks": self.clicks.value(),
                               "last": self.last.value()})
                self.clicks.clear()
                self.last.clear()
        return [pa.RecordBatch.from_pylist(closed, schema=OUT)]

    def flush(self, ctx):
        return self.on_watermark(ctx, 2**63 - 1)


# alice clicks at 0; bob's click at 100 s moves the max event time past alice's session end
# (60 s); alice's click at 50 s arrives two micro-batches later, 50 s behind the max event time.
BATCHES = [[("alice", 0), ("bob", 100_000)], [("carol", 100_000)], [("alice", 50_000)]]


def _sessions(spark, tmp_path, name, delay):
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    backend = "native"
    try:
        import statecore.backends.native  # noqa: F401
    except ImportError:
        backend = "python"
    op = StatefulOperator(name, SessionClicks(), "user", str(tmp_path / "ckpt"),
                          output=str(tmp_path / name), parallelism=2, event_time_column="t",
                          watermark_delay=delay, backend=backend, retain_versions=5)
    for i, rows in enumerate(BATCHES):
        op(spark.createDataFrame(rows, "user string, t bigint"), i)
    op.flush(spark)
    out = []
    for i in range(len(BATCHES) + 1):
        path = str(tmp_path / name / f"batch_id={i}")
        if os.path.isdir(path):
            out += [(i, r["user"], r["clicks"]) for r in
                    pq.read_table(path, schema=OUT).to_pylist()]
    return op, sorted(out)


def test_a_row_out_of_order_within_the_delay_joins_its_session(spark, tmp_path):
    # Without a delay the watermark of micro-batch 1 is 100 s: alice's session closes with one
    # click, and her click at 50 s opens a second session.
    op, out = _sessions(spark, tmp_path, "no_delay", 0)
    assert out == [(1, "alice", 1), (3, "alice", 1), (3, "bob", 1), (3, "carol", 1)]
    assert op.store.metadata(0)["watermark_ms"] == 100_000

    # With a one-minute delay the watermark stays at 40 s: the late click joins the session.
    op, out = _sessions(spark, tmp_path, "delay", "1 minute")
    assert out == [(3, "alice", 2), (3, "bob", 1), (3, "carol", 1)]
    meta = [op.store.metadata(v) for v in range(3)]
    assert [m["input_watermark_ms"] for m in meta] == [None, 40_000, 40_000]
    assert [m["watermark_ms"] for m in meta] == [40_000, 40_000, 40_000]
    assert [m["max_event_ms"] for m in meta] == [100_000] * 3
    assert {m["watermark_delay_ms"] for m in meta} == {60_000}
    assert [r.watermark_ms for r in op.reports[:3]] == [40_000] * 3
