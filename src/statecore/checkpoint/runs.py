"""Runs and their chains: which data files a version needs for each key group.

A version's manifest lists *runs*: data files, each with a key-group range, a kind (``full``: the
complete state of its key groups; ``incremental``: the changes since the writer's base, removals
as tombstones) and a sequence number ``seq``. A commit gives all of a version's new runs (which
tile its key-group range) ``seq = 1 + max seq of the previous version``, so seqs increase along
the chain of versions (docs/formats.md "Checkpoint store and manifests").

For a key group ``kg`` the *chain* of a version is its runs covering ``kg`` from the newest
(highest seq) down to and including the newest full one; a run in no chain of the version's
range is not needed (a full run makes all older runs of its key groups unnecessary). A chain
without a full run is an error: at commit an incremental snapshot without a committed base, in a
stored manifest corruption. A reader merges a chain newest-wins per (state, key group). An
incremental run records the version its changes are relative to (``base_version``; runs committed
before it was recorded have none): the next run down its chain must be of that version, or the
chain is broken (its base is gone).

Runs are JSON-able dicts (manifest ``files`` entries: ``path``, ``seq``, ``kind``,
``key_group_range`` ``[start, end]`` inclusive, ...); the functions here never modify them.
"""

from __future__ import annotations

from statecore.checkpoint.format import KIND_FULL
from statecore.errors import CorruptCheckpointError

__all__ = ["plan_chains", "union_range", "check_disjoint", "chain_run_ids", "longest_chain",
           "sort_runs"]


def plan_chains(runs: list[dict], kg_range, err, where: str) -> list[tuple[int, int, list[dict]]]:
    """Split the inclusive ``kg_range`` (``(start, end)``) into segments ``(start, end, chain)``
    over which the same runs apply; ``chain`` = the runs covering the segment, newest (highest
    seq) first, down to and including the newest full run. Raises ``err`` (an exception class;
    the message starts with ``where``) when a segment has no run or no full run (an incremental
    run without base). An empty range gives ``[]``."""
    start, end = (int(x) for x in kg_range)
    if end < start:
        return []
    live = [r for r in runs if r["key_group_range"][1] >= r["key_group_range"][0]
            and r["key_group_range"][0] <= end and r["key_group_range"][1] >= start]
    cuts = {start, end + 1}
    for r in live:
        cuts.add(max(r["key_group_range"][0], start))
        cuts.add(min(r["key_group_range"][1], end) + 1)
    cuts = sorted(cuts)
    newest_first = sorted(live, key=lambda r: -r["seq"])
    segments = []
    for a, b1 in zip(cuts, cuts[1:]):
        b = b1 - 1
        chain = []
        for r in newest_first:
            s, e = r["key_group_range"]
            if s <= a and b <= e:
                chain.append(r)
                if r["kind"] == KIND_FULL:
                    break
        if not chain:
            raise err(f"{where}: no run holds key groups {a}..{b}")
        for newer, older in zip(chain, chain[1:]):
            base = newer.get("base_version")
            if base is not None and older["version"] != base:
                raise err(
                    f"{where}: incremental run {newer['path']!r} holds the changes since version "
                    f"{base}, but the run below it for key groups {a}..{b} is "
                    f"{older['path']!r} of version {older['version']}: the runs of version "
                    f"{base} are missing")
        if chain[-1]["kind"] != KIND_FULL:
            raise err(
                f"{where}: incremental run(s) {[r['path'] for r in chain]} have no full base run "
                f"for key groups {a}..{b} (an incremental snapshot needs a committed full one "
                "below it)")
        if segments and segments[-1][2] == chain:
            segments[-1] = (segments[-1][0], b, chain)
        else:
            segments.append((a, b, chain))
    return segments


def union_range(files: list[dict], version: int, err, where: str) -> tuple[int, int]:
    """Inclusive union of the files' key-group ranges (``(0, -1)`` when all are empty); raises
    ``err`` when two overlap, when they leave a gap or for a negative key group."""
    spans = sorted((f["key_group_range"][0], f["key_group_range"][1], f["path"])
                   for f in files if f["key_group_range"][1] >= f["key_group_range"][0])
    if not spans:
        return (0, -1)
    for (s0, e0, p0), (s1, e1, p1) in zip(spans, spans[1:]):
        if s1 <= e0:
            raise err(f"{where}: version {version}: files {p0} [{s0}, {e0}] and {p1} [{s1}, {e1}] "
                      f"both claim key group {s1}")
        if s1 != e0 + 1:
            raise err(f"{where}: version {version}: no file holds key groups {e0 + 1}..{s1 - 1}")
    if spans[0][0] < 0:
        raise err(f"{where}: version {version}: negative key group in {spans[0][2]}")
    return (spans[0][0], spans[-1][1])


def check_disjoint(files: list[dict], version: int, where: str) -> None:
    """Raise CorruptCheckpointError when two runs of one seq overlap (gaps are fine)."""
    spans = sorted((f["key_group_range"][0], f["key_group_range"][1], f["path"])
                   for f in files if f["key_group_range"][1] >= f["key_group_range"][0])
    for (s0, e0, p0), (s1, e1, p1) in zip(spans, spans[1:]):
        if s1 <= e0:
            raise CorruptCheckpointError(
                f"{where}: version {version}: runs {p0} [{s0}, {e0}] and {p1} [{s1}, {e1}] of "
                f"one seq both claim key group {s1}")


def chain_run_ids(segments) -> set[int]:
    """``id()`` of every run some chain of ``segments`` (:func:`plan_chains`) holds."""
    return {id(r) for _, _, chain in segments for r in chain}


def longest_chain(segments) -> int:
    """The most runs any key group of ``segments`` needs (0 for none)."""
    return max((len(c) for _, _, c in segments), default=0)


def sort_runs(runs: list[dict]) -> list[dict]:
    """``runs`` in manifest order: newest seq first, then by key-group start, writer, path."""
    return sorted(runs, key=lambda f: (-f["seq"], f["key_group_range"][0], f["writer"], f["path"]))
