"""Equality of Spark DataFrames as multisets of rows, for the tests that compare a job's output
with its Spark SQL reference.

Each side is computed by one Spark job (``collect``) and the rows are compared in this process:
``a.count() == b.count()`` and two ``exceptAll(...).count() == 0`` would be four jobs that
compute each side (a reference query over the landed files) twice.
"""

from __future__ import annotations

import math


def _key(value):
    # None sorts after any value of its column; NaN equals NaN, as in Spark's exceptAll.
    if isinstance(value, float) and math.isnan(value):
        return (1, 0)
    return (2, 0) if value is None else (0, value)


def sorted_rows(df) -> list[tuple]:
    """The rows of ``df`` (one ``collect``) as tuples in a deterministic order (column order,
    nulls last): equal lists for DataFrames that hold the same rows the same number of times."""
    return sorted((tuple(r) for r in df.collect()), key=lambda row: tuple(map(_key, row)))


def assert_same_rows(a, b) -> list[tuple]:
    """Assert that DataFrames ``a`` and ``b`` have the same columns and the same rows with the
    same multiplicities (what ``a.exceptAll(b)`` and ``b.exceptAll(a)`` both empty and equal
    counts say); returns ``b``'s rows (``sorted_rows``). On a difference, the message names the
    row counts and the first rows only one side has."""
    assert a.columns == b.columns, (a.columns, b.columns)
    got, want = sorted_rows(a), sorted_rows(b)
    if [tuple(map(_key, r)) for r in got] != [tuple(map(_key, r)) for r in want]:
        key_got = {tuple(map(_key, r)) for r in got}
        key_want = {tuple(map(_key, r)) for r in want}
        only_a = [r for r in got if tuple(map(_key, r)) not in key_want][:5]
        only_b = [r for r in want if tuple(map(_key, r)) not in key_got][:5]
        raise AssertionError(f"{len(got)} rows vs {len(want)} rows; only in the first: "
                             f"{only_a}; only in the second: {only_b}")
    return want
