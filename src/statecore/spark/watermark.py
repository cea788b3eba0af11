"""The event-time watermark of :class:`statecore.spark.StatefulOperator`: its delay (allowed
lateness) and how each micro-batch moves it.

The watermark handed to a micro-batch's processor is ``max(event time of the EARLIER
micro-batches) - delay``, and it never moves back: Spark's ``withWatermark(col, delayThreshold)``
rule, and Flink's ``WatermarkStrategy.forBoundedOutOfOrderness(maxOutOfOrderness)``. A delay
``d`` says rows may arrive up to ``d`` behind the largest event time seen so far, so an
event-time timer at ``t`` fires only once some row with event time ``>= t + d`` was seen.

Runs on the driver only (pure Python, no Spark needed).
"""

from __future__ import annotations

import datetime
import numbers
import re
from decimal import Decimal, InvalidOperation
from typing import Optional, Union

from statecore.errors import InvalidInputError

__all__ = ["parse_watermark_delay", "next_watermark"]

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

#: Microseconds per unit. Spark's interval units (``IntervalUtils.stringToInterval``), singular
#: or plural, and the usual abbreviations; years and months are refused (their length varies).
_UNIT_US = {}
for _names, _us in (
        (("week", "weeks", "w"), 7 * 86_400_000_000),
        (("day", "days", "d"), 86_400_000_000),
        (("hour", "hours", "h", "hr", "hrs"), 3_600_000_000),
        (("minute", "minutes", "min", "mins", "m"), 60_000_000),
        (("second", "seconds", "s", "sec", "secs"), 1_000_000),
        (("millisecond", "milliseconds", "ms", "milli", "millis"), 1_000),
        (("microsecond", "microseconds", "us", "micro", "micros"), 1)):
    for _n in _names:
        _UNIT_US[_n] = _us

_PART = re.compile(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*([a-z]+)\s*")


def _parse_text(text: str) -> int:
    """Microseconds of an interval string such as ``"1 hour 30 minutes"``."""
    s = text.strip().lower()
    if s.startswith("interval"):
        s = s[len("interval"):]
    if not s.strip():
        raise InvalidInputError(f"watermark_delay {text!r} names no duration")
    total = Decimal(0)
    pos = 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise InvalidInputError(
                f"watermark_delay {text!r} is not a duration like '10 minutes', '1 hour', "
                "'30 seconds' or '500 milliseconds'")
        number, unit = m.groups()
        if unit in ("year", "years", "month", "months", "y", "mo"):
            raise InvalidInputError(
                f"watermark_delay {text!r}: years and months have no fixed length; "
                "give the delay in weeks, days, hours, minutes, seconds or milliseconds")
        if unit not in _UNIT_US:
            raise InvalidInputError(
                f"watermark_delay {text!r}: unknown unit {unit!r} (use weeks, days, hours, "
                "minutes, seconds, milliseconds or microseconds)")
        try:
            total += Decimal(number) * _UNIT_US[unit]
        except InvalidOperation as exc:  # the regex admits only decimals; kept for safety
            raise InvalidInputError(f"watermark_delay {text!r}: bad number {number!r}") from exc
        pos = m.end()
    return int(total)  # truncates below a microsecond, as Spark does


def parse_watermark_delay(value: Union[int, str, datetime.timedelta, None]) -> int:
    """The watermark delay (allowed lateness) in milliseconds, from what
    ``StatefulOperator(watermark_delay=...)`` takes:

    * an int: milliseconds (``bool`` is refused);
    * a ``datetime.timedelta`` (sub-millisecond parts truncated);
    * a string as Spark's ``withWatermark`` delay threshold takes it: one or more
      ``<number> <unit>`` parts, optionally after ``interval`` (``"10 minutes"``, ``"1 hour"``,
      ``"30 seconds"``, ``"500 milliseconds"``, ``"1 minute 30 seconds"``, ``"1.5 hours"``),
      units week, day, hour, minute, second, millisecond, microsecond (singular or plural, or
      the abbreviations w, d, h/hr, min/m, s/sec, ms, us); the total is truncated to whole
      milliseconds, as Spark's ``EventTimeWatermark.getDelayMs`` does;
    * None: 0.

    Returns an int in ``[0, 2**63 - 1]``. Raises InvalidInputError for a negative or
    unparseable value, a year or month unit, a total past int64 milliseconds, or another type.
    """
    if value is None:
        return 0
    if isinstance(value, bool):
        raise InvalidInputError(f"watermark_delay must be a duration, got {value!r}")
    if isinstance(value, numbers.Integral):
        ms = int(value)
        what = f"{ms} ms"
    elif isinstance(value, datetime.timedelta):
        ms = value // datetime.timedelta(milliseconds=1)
        what = repr(value)
    elif isinstance(value, str):
        us = _parse_text(value)
        ms = us // 1000 if us >= 0 else -1  # a negative total is refused below
        what = repr(value)
    else:
        raise InvalidInputError(
            f"watermark_delay must be an int (ms), a datetime.timedelta or a string such as "
            f"'10 minutes', got {type(value).__name__} {value!r}")
    if ms < 0:
        raise InvalidInputError(f"watermark_delay must not be negative, got {what}")
    if ms > _INT64_MAX:
        raise InvalidInputError(f"watermark_delay {what} does not fit in int64 milliseconds")
    return ms


def next_watermark(previous: Optional[int], batch_max_event_ms: Optional[int],
                   delay_ms: int) -> Optional[int]:
    """The watermark after a micro-batch whose largest event time is ``batch_max_event_ms``
    (ms, None when it had none): ``max(previous, batch_max_event_ms - delay_ms)``, never lower
    than ``previous`` (a longer delay after a restart does not move it back), clamped to int64.
    None while no event time was ever seen."""
    if batch_max_event_ms is None:
        return previous
    candidate = max(int(batch_max_event_ms) - int(delay_ms), _INT64_MIN)
    return candidate if previous is None else max(int(previous), candidate)
