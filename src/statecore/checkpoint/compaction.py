"""Compaction: replacing a version's long chains of runs by one or two runs each.

``compact(V, max_runs=N)`` looks at V's *top runs* (those of V's own commit: ``seq`` = the
highest in the manifest; they tile V's range). For each top run whose range has a chain longer
than N it writes one run over the same range, same ``seq``, as a new file with a unique name:

* a *minor* compaction when the chains of the range share one full run, the incremental runs
  above it lie within the range and hold under 1/``size_ratio`` of its bytes (default
  :data:`DEFAULT_SIZE_RATIO`), and N >= 2: one incremental run of those runs' merged changes
  (newest wins, tombstones kept, ``base_version`` of the oldest), the full run left as it is;
* else a *full* compaction: one full run of the merged chain (tombstones dropped).

So the bytes a compaction writes follow the bytes changed since the last full compaction, until
those reach 1/``size_ratio`` of the state -- RocksDB's leveled compaction bounds its write
amplification by the same ratio between levels; rewriting the whole state on every compaction would
make its cost grow with the state, not the change rate. Then it atomically replaces
``manifest-V.json`` with a manifest listing the compacted runs instead (same version, same metadata,
the runs merged and those no chain needs any more dropped), and does the same to the manifest of
every later committed version whose chains still hold, from the top run down, exactly the runs it
merged (the versions committed on top of V while it ran: their new runs stay above the compacted
one). A compaction taking longer than the interval between commits thus still shortens the newest
version's chains, as a RocksDB compaction's output enters the current version, not the one it
started from.

Why rewrite V's manifest rather than record compaction results for the next commit:

1. every step is one atomic file operation and the manifest replace is the only publishing step:
   a crash before it leaves an unreferenced file (deleted by a later retention), a crash after
   it leaves a complete manifest;
2. a compacted manifest restores exactly what the old one did (same merged content: a later
   version's is replaced only where its chains below its own runs are V's, run for run), so no
   version ever changes what it restores to;
3. the next commit simply starts from V's (compacted) manifest, no side state to keep consistent.

The runs are read one window of key groups at a time (about :data:`PREFETCH_WINDOW_BYTES` of
stored bytes, the previous window dropped), so a compaction's memory does not grow with the state.

The replace happens only when V's manifest is still the one compaction read (checksum compared
under the root's lock); otherwise (V re-committed meanwhile) the new file is abandoned.
Each later manifest is replaced the same way, read and written under the lock; a crash between
two replaces leaves each manifest complete, some compacted and some not. Compaction inputs stay
on disk while any retained manifest (e.g. of a version below V) references them; outputs not
yet published are reported by :meth:`Compactor.in_flight_paths` so that retention leaves them
alone.

TTL compaction filter
---------------------
A state whose TTL config has ``cleanup_in_compaction`` (``query_time_after_num_entries`` N) loses
its expired entries whenever a full compaction merges its runs (frocksdb's
FlinkCompactionFilter on statecore's suffix layout, ``statecore.ttl.compaction_filter``; what it
drops and keeps: docs/formats.md "TTL suffix"); a minor one keeps them (an expired value dropped
from an incremental run would uncover the value under it). The time is read from the
``ttl_clock`` once per compaction and again after every N entries (cached in between, as
frocksdb does); event-time TTL uses the version's ``metadata["watermark_ms"]`` (none: nothing
expires). Each run of entries sharing one clock reading is filtered in C++ when the extension is
built (ttl.h ``filter_values``), in Python otherwise, with the same result. The compacted version
restores without those entries -- which is what a read would have done with them -- and the
manifest counts them per state (``ttl_compaction_expired``).
"""

from __future__ import annotations

import bisect
import time
from concurrent.futures import Future, ThreadPoolExecutor

from statecore import serializers as S
from statecore.checkpoint.format import (
    COMPRESSION,
    DEFAULT_BLOCK_TARGET_BYTES,
    KIND_FULL,
    KIND_INCREMENTAL,
    make_key_group_range,
    write_data_file,
    write_data_file_serialized,
)
from statecore.checkpoint.layout import CheckpointRoot, check_version, compacted_data_path
from statecore.checkpoint.manifests import MANIFEST_FORMAT_VERSION, ManifestLog
from statecore.checkpoint.readers import CheckpointReader, open_changes
from statecore.checkpoint.runs import chain_run_ids, plan_chains, sort_runs
from statecore.errors import CheckpointNotFoundError, CorruptCheckpointError, InvalidInputError
from statecore.ttl import CompactionTimeProvider, StateTtlConfig, compaction_filter, entry_layout

__all__ = ["Compactor", "RangeView", "ttl_filters", "check_max_runs", "check_size_ratio",
           "PREFETCH_WINDOW_BYTES", "DEFAULT_SIZE_RATIO"]

#: Stored bytes of the runs a compaction fetches at once: it reads them one window of key groups
#: at a time (estimated from the runs' sizes), so its memory does not grow with the state (a
#: tiered backend's state is larger than memory).
PREFETCH_WINDOW_BYTES = 64 << 20


#: A chain's incremental runs are merged among themselves (a minor compaction) while their bytes
#: are below 1/ratio of the full run's under them: a compaction's cost then follows the bytes
#: changed, not the state's size (RocksDB's level size multiplier plays this part).
DEFAULT_SIZE_RATIO = 4


def _write_file():
    """The data file writer of compaction outputs: with the extension the native serializer's
    (the blocks encoded, compressed and checksummed without the GIL, so that a compaction in
    the background leaves the GIL to the threads processing records), else the Python one;
    the same bytes either way."""
    try:
        from statecore import _native  # noqa: F401
    except ImportError:
        return write_data_file
    return write_data_file_serialized


def check_size_ratio(size_ratio) -> int | None:
    """``size_ratio`` (the option ``compaction_size_ratio`` of the store and the operator) when
    it is None or an int >= 1; else InvalidInputError naming that option."""
    if size_ratio is not None and (isinstance(size_ratio, bool) or not isinstance(size_ratio, int)
                                   or size_ratio < 1):
        raise InvalidInputError(
            f"compaction_size_ratio must be an int >= 1 or None, got {size_ratio!r}")
    return size_ratio


def check_max_runs(max_runs) -> int:
    """``max_runs`` when it is an int >= 1; else InvalidInputError."""
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
        raise InvalidInputError(f"max_runs must be an int >= 1, got {max_runs!r}")
    return max_runs


def ttl_filters(manifest: dict, ttl_clock) -> dict:
    """``{state name: (kind, fixed_width, ttl_ms, CompactionTimeProvider)}`` for the states of
    ``manifest`` whose TTL config has ``cleanup_in_compaction``. Processing-time TTL reads
    ``ttl_clock`` (callable returning ms); event-time TTL uses the version's recorded watermark
    (``metadata["watermark_ms"]``, which the Spark operator writes) and is skipped when there is
    none."""
    out = {}
    for m in manifest["states"]:
        if not m.get("ttl"):
            continue
        cfg = StateTtlConfig.from_meta(m["ttl"])
        if not cfg.query_time_after_num_entries:
            continue
        if cfg.event_time:
            wm = (manifest.get("metadata") or {}).get("watermark_ms")
            if not isinstance(wm, int) or isinstance(wm, bool):
                continue
            clock = lambda wm=wm: wm  # noqa: E731 - the watermark does not move here
        else:
            clock = ttl_clock
        # A map entry is filtered as a value, a list chunk in the list layout (its elements'
        # width needed to walk it).
        width = S.value_serializer(m["value_type"]).fixed_width if m["kind"] == "list" else None
        out[m["name"]] = (entry_layout(m["kind"]), width, cfg.ttl_ms,
                          CompactionTimeProvider(clock, cfg.query_time_after_num_entries))
    return out


def _chains_below(manifest: dict, seq: int, start: int, end: int) -> list:
    """``[(first key group, (path, footer) of each run))]``: for each segment of ``[start, end]``
    the runs of ``manifest``'s chain (:func:`plan_chains`) with ``seq`` at most ``seq``, newest
    first."""
    segs = plan_chains(manifest["files"], (start, end), CorruptCheckpointError,
                       f"manifest of version {manifest['version']}")
    return [(a, tuple((r["path"], r.get("footer_xxh64")) for r in chain if r["seq"] <= seq))
            for a, _, chain in segs]


def _shares_chain(later: dict, manifest: dict, top: dict) -> bool:
    """True when a compaction output of ``manifest``'s top run ``top`` may replace ``top`` in
    ``later`` (a manifest of a later version) too: ``later`` lists ``top``, and for each key
    group of ``top``'s range ``later``'s chain either ends above ``top``'s seq (a newer full run)
    or holds, from ``top`` down, exactly the runs of ``manifest``'s chain -- the runs the
    output merged -- so that the replaced ``later`` restores what it did."""
    path = top["path"]
    if not any(r["path"] == path for r in later["files"]):
        return False
    s, e = top["key_group_range"]
    ours = _chains_below(manifest, top["seq"], s, e)
    theirs = _chains_below(later, top["seq"], s, e)
    cuts = sorted({a for a, _ in ours} | {a for a, _ in theirs})

    def at(segs, kg):
        return segs[bisect.bisect_right([a for a, _ in segs], kg) - 1][1]

    return all(not at(theirs, kg) or at(theirs, kg) == at(ours, kg) for kg in cuts)


class RangeView:
    """Full StateSnapshot of a reader restricted to key groups ``[start, end]``: what compaction
    writes. ``ttl_filters`` (:func:`ttl_filters`) drop expired entries as they are read;
    ``ttl_expired`` counts them per state. A filter that finds a value layout it cannot read
    raises CorruptCheckpointError naming the state and key group. ``window`` (key groups):
    the reader's blocks are prefetched that many key groups at a time, the previous window's
    dropped, as the entries are asked for in key-group order (None: nothing is prefetched
    here)."""

    incremental = False

    def __init__(self, reader: CheckpointReader, start: int, end: int, ttl_filters=None,
                 window: int | None = None):
        self._reader = reader
        self._window = window
        self._fetched_to = start - 1
        self.max_parallelism = reader.max_parallelism
        self.key_type = reader.key_type
        self.assigner = reader.assigner
        self.key_group_range = make_key_group_range(start, end)
        self._ttl = ttl_filters or {}
        self.ttl_expired: dict[str, int] = {}

    def state_metas(self) -> list[dict]:
        """The reader's state metas."""
        return self._reader.state_metas()

    def entries(self, name: str, key_group: int):
        """The reader's ``(keys, values)`` (``pa.binary()`` arrays, ascending by key bytes) of
        ``name`` in ``key_group``, without the entries (or list elements, map entries) the
        state's TTL filter finds expired; those are counted in ``ttl_expired``. Errors as the
        reader's; CorruptCheckpointError for a broken TTL value layout."""
        if self._window is not None and key_group > self._fetched_to:
            self._reader.drop_prefetched()
            self._fetched_to = min(self.key_group_range.end, key_group + self._window - 1)
            self._reader.prefetch(key_group, self._fetched_to)
        keys, values = self._reader.entries(name, key_group)
        f = self._ttl.get(name)
        if f is None or not len(keys):
            return keys, values
        kind, width, ttl_ms, time_provider = f
        try:
            keys, values, n = compaction_filter(kind, width, ttl_ms, time_provider, keys, values)
        except InvalidInputError as exc:
            raise CorruptCheckpointError(
                f"state {name!r}, key group {key_group}: TTL value layout broken: {exc}") from exc
        if n:
            self.ttl_expired[name] = self.ttl_expired.get(name, 0) + n
        return keys, values

    def release(self) -> None:
        """No-op: the reader belongs to the caller."""


class ChangesView(RangeView):
    """Incremental StateSnapshot of a :class:`~statecore.checkpoint.readers.ChangesReader`
    restricted to key groups ``[start, end]``: what a minor compaction writes (NULL values are
    tombstones; ``base_version`` and ``base_commit_id`` those of the oldest run merged). No TTL
    filter: dropping an expired value from an incremental run would uncover the value under
    it."""

    incremental = True

    def __init__(self, reader, start: int, end: int, base_version, base_commit_id,
                 window: int | None = None):
        super().__init__(reader, start, end, None, window)
        self.base_version = base_version
        self.base_commit_id = base_commit_id


def _data_bytes(run: dict) -> int:
    """The stored bytes of ``run``'s blocks (its file's size when the manifest does not say):
    what a compaction reads and writes of it, without the footer, filters and index."""
    return run.get("stored_bytes", run["size"])


def _minor_inputs(manifest: dict, top: dict, max_runs: int, size_ratio: int | None):
    """``(base run, [runs to merge])`` when the chains of ``top``'s key groups in ``manifest``
    may be compacted minor: they share one full run, the incremental runs above it (two or
    more) lie within ``top``'s range (so that dropping them leaves no other key group without
    them) and hold under ``1 / size_ratio`` of its stored bytes (spread evenly over its key
    groups), and two runs per chain are within ``max_runs``. Else None: a full compaction."""
    if size_ratio is None or max_runs < 2:
        return None
    s, e = top["key_group_range"]
    segs = plan_chains(manifest["files"], (s, e), CorruptCheckpointError,
                       f"manifest of version {manifest['version']}")
    bases = {chain[-1]["path"]: chain[-1] for _, _, chain in segs}
    above = {r["path"]: r for _, _, chain in segs for r in chain[:-1]}
    if len(bases) != 1 or len(above) < 2:
        return None
    (base,) = bases.values()
    if any(not (s <= r["key_group_range"][0] and r["key_group_range"][1] <= e)
           for r in above.values()):
        return None
    bs, be = base["key_group_range"]
    base_bytes = _data_bytes(base) * (e - s + 1) / (be - bs + 1)
    if sum(_data_bytes(r) for r in above.values()) * size_ratio >= base_bytes:
        return None
    return base, sorted(above.values(), key=lambda r: r["seq"])


def _window(segments: list, start: int, end: int) -> int:
    """Key groups of about :data:`PREFETCH_WINDOW_BYTES` stored bytes in ``[start, end]``,
    each run's size spread evenly over its key groups (>= 1)."""
    total = 0.0
    for a, b, chain in segments:
        lo, hi = max(a, start), min(b, end)
        if lo > hi:
            continue
        for r in chain:
            rs, re_ = r["key_group_range"]
            total += r["size"] * (hi - lo + 1) / (re_ - rs + 1)
    per_kg = total / (end - start + 1)
    return max(1, int(PREFETCH_WINDOW_BYTES // max(per_kg, 1.0)))


class Compactor:
    """Compacts versions under one root (module docstring). ``manifests``: the root's
    :class:`~statecore.checkpoint.manifests.ManifestLog` (or an object with its interface);
    ``lock``: the lock that serializes manifest publishing and retention of the root in this
    process; the compactor holds it only to read and to publish manifests, not while it writes
    runs. ``block_target_bytes`` and ``compression``: the block size and codec of the runs it
    writes (``format``).
    ``size_ratio`` (int >= 1, or None: every compaction full): minor compactions merge a
    chain's incremental runs alone while they hold under 1/``size_ratio`` of the bytes of the
    full run under them (module docstring)."""

    def __init__(self, root: CheckpointRoot, manifests: ManifestLog, lock,
                 block_target_bytes: int = DEFAULT_BLOCK_TARGET_BYTES,
                 size_ratio: int | None = DEFAULT_SIZE_RATIO,
                 compression: str = COMPRESSION):
        self.root = root
        self.compression = compression
        self.size_ratio = check_size_ratio(size_ratio)
        self.block_target_bytes = block_target_bytes
        self.manifests = manifests
        self.lock = lock
        self._inflight: set[str] = set()  # outputs written but not yet published
        self._executor: ThreadPoolExecutor | None = None

    def in_flight_paths(self) -> set[str]:
        """Paths (relative to the root) of compaction outputs being written or not yet
        published in this process (a copy; call it holding :attr:`lock`)."""
        return set(self._inflight)

    def compact(self, version: int | None, max_runs: int, ttl_clock,
                key_groups: tuple[int, int] | None = None) -> dict:
        """Compact ``version`` (None: the latest) where a key group needs more than ``max_runs``
        runs, and the later versions whose chains still hold the runs it merged (module
        docstring); returns ``version``'s (possibly unchanged) manifest. ``ttl_clock``: the
        processing-time clock of the TTL filter. ``key_groups`` (inclusive ``(start, end)``;
        None: all): only top runs overlapping these key groups are compacted, whole. Errors as
        ``CheckpointStore.compact``."""
        max_runs = check_max_runs(max_runs)
        if key_groups is not None:
            ks, ke = (int(x) for x in key_groups)
        with self.lock:
            self.manifests.fence("compaction")
            if version is None:
                version = self.manifests.latest_version()
                if version is None:
                    raise CheckpointNotFoundError(f"no committed checkpoint under {self.root.uri}")
            version = check_version(version)
            manifest = self.manifests.read(version)
        segments = plan_chains(manifest["files"], manifest["key_group_range"],
                               CorruptCheckpointError, f"manifest of version {version}")
        top_seq = max((r["seq"] for r in manifest["files"]), default=0)
        tops = [r for r in manifest["files"] if r["seq"] == top_seq
                and r["key_group_range"][1] >= r["key_group_range"][0]]
        targets = []
        for t in tops:
            s, e = t["key_group_range"]
            if key_groups is not None and (e < ks or s > ke):
                continue
            depth = max((len(c) for a, b, c in segments if a <= e and b >= s), default=0)
            if depth > max_runs:
                targets.append(t)
        if not targets:
            return manifest
        written: list[dict] = []
        inflight: list[str] = []
        reader = CheckpointReader(self.root, version, manifest)
        try:
            for t in targets:
                s, e = t["key_group_range"]
                writer = f"compacted-{s}-{e}"
                rel = compacted_data_path(version, t["seq"], s, e)
                with self.lock:
                    self._inflight.add(rel)
                    inflight.append(rel)
                minor = _minor_inputs(manifest, t, max_runs, self.size_ratio)
                extra = {}
                if minor is None:
                    source, replaced = None, {t["path"]}
                    view = RangeView(reader, s, e, ttl_filters(manifest, ttl_clock),
                                     window=_window(segments, s, e))
                else:
                    base, merged = minor
                    source = open_changes(self.root, version, manifest, base["path"], s, e)
                    if source is None:
                        raise CorruptCheckpointError(
                            f"compaction of version {version}: the runs above {base['path']!r} "
                            f"for key groups {s}..{e} are not a plain incremental chain")
                    replaced = {r["path"] for r in merged}
                    extra = {k: merged[0][k] for k in ("base_version", "base_commit_id")
                             if merged[0].get(k) is not None}
                    view = ChangesView(source, s, e, extra.get("base_version"),
                                       extra.get("base_commit_id"),
                                       window=_window(segments, s, e))
                try:
                    summary = self.root.write_atomic(
                        rel, lambda out: _write_file()(
                            out, view, version=version, writer=writer,
                            incremental=view.incremental,
                            block_target_bytes=self.block_target_bytes,
                            compression=self.compression),
                        streamed=True)
                finally:
                    if source is not None:
                        source.release()
                written.append({
                    "path": rel, "size": summary.size, "writer": writer, "version": version,
                    "seq": t["seq"], "kind": KIND_INCREMENTAL if minor else KIND_FULL,
                    "key_group_range": [s, e], **extra,
                    "states": [m["name"] for m in summary.meta["states"]],
                    "entries": summary.entries, "tombstones": summary.tombstones,
                    "blocks": summary.blocks, "raw_bytes": summary.raw_bytes,
                    "stored_bytes": summary.stored_bytes,
                    "key_groups_nonempty": summary.key_groups_nonempty,
                    "footer_xxh64": f"{summary.footer_xxh64:016x}",
                    "ttl_expired": dict(view.ttl_expired),
                    "replaces": replaced,
                })
                reader.drop_prefetched()
            with self.lock:
                self.manifests.fence(f"compaction of version {version}")
                try:
                    current = self.manifests.read(version)
                except CheckpointNotFoundError:
                    return manifest  # retained away meanwhile: the outputs are orphans
                if current["checksum_xxh64"] != manifest["checksum_xxh64"]:
                    return current  # re-committed meanwhile: publish nothing
                pairs = list(zip(targets, written))
                published = self._publish(manifest, pairs)
                for later in self.manifests.versions():
                    if later <= version:
                        continue
                    m = self.manifests.read(later)
                    fits = [(t, w) for t, w in pairs if _shares_chain(m, manifest, t)]
                    if fits:
                        self._publish(m, fits)
                return published
        finally:
            reader.release()
            with self.lock:
                self._inflight.difference_update(inflight)

    def _publish(self, manifest: dict, pairs: list) -> dict:
        """Publish ``manifest`` (a version's) with the runs each output of ``pairs`` (``(top
        run, output)``: a compacted run's manifest entry, with its ``ttl_expired`` counts and
        the paths it ``replaces``) replaces dropped, the output added and the runs no chain
        needs any more dropped; returns the new manifest. Call it holding :attr:`lock`."""
        version = manifest["version"]
        replaced = set().union(*(w["replaces"] for _, w in pairs))
        written = [{k: v for k, v in w.items() if k not in ("ttl_expired", "replaces")}
                   for _, w in pairs]
        runs = [r for r in manifest["files"] if r["path"] not in replaced] + written
        segs = plan_chains(runs, manifest["key_group_range"], CorruptCheckpointError,
                           f"compaction of version {version}")
        ids = chain_run_ids(segs)
        runs = [r for r in runs if id(r) in ids]
        body = {k: v for k, v in manifest.items() if k != "checksum_xxh64"}
        expired = dict(body.get("ttl_compaction_expired", {}))
        for _, w in pairs:
            for name, n in w["ttl_expired"].items():
                expired[name] = expired.get(name, 0) + n
        body.update(files=sort_runs(runs), compacted_ms=int(time.time() * 1000),
                    format_version=MANIFEST_FORMAT_VERSION)
        if expired:
            body["ttl_compaction_expired"] = expired
        return self.manifests.write(body)

    def submit(self, fn, *args) -> Future:
        """Run ``fn(*args)`` in the compactor's single background thread (started on first use);
        returns its Future."""
        with self.lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1,
                                                    thread_name_prefix="statecore-compaction")
            return self._executor.submit(fn, *args)

    def close(self) -> None:
        """Wait for background compactions and stop their thread (idempotent)."""
        with self.lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
