"""Inspection of checkpoints: what ``statecore inspect`` prints and exports.

A checkpoint root is a directory (or URI) holding ``manifest-*.json`` files (one
:class:`statecore.checkpoint.CheckpointStore`). The Spark operator keeps one root per operator
(``<checkpoint>/operators/<name>``); :func:`find_stores` finds them under a local directory.
Entries are decoded by restoring the version into the pure-Python reference backend, so what is
shown is exactly what a restore would load (timers included). Entry counts distinguish the live
entries of a version (its runs merged newest-wins, as a restore sees them) from the entries
stored in its runs (an incremental chain stores a key once per run that changed it, and
tombstones for removals).
"""

from __future__ import annotations

import json
import os
from typing import Iterator, List, Optional

import pyarrow as pa
import pyarrow.fs as pafs

from statecore import key_types
from statecore.backends.python import PythonBackend
from statecore.backends.states import from_stored
from statecore.checkpoint import CheckpointStore
from statecore.checkpoint.layout import CheckpointRoot, join_uri, manifest_version
from statecore.checkpoint.manifests import describe_manifest
from statecore.errors import CheckpointNotFoundError, InvalidInputError

__all__ = ["find_stores", "summary_lines", "version_stats", "entries_table"]


def _has_manifest(path: str) -> bool:
    try:
        return any(n.startswith("manifest-") and n.endswith(".json") for n in os.listdir(path))
    except OSError:
        return False


def find_stores(path: str, max_depth: int = 3) -> List[str]:
    """Checkpoint roots at or below ``path``: ``[path]`` for a root itself, else the
    sub-directories (at most ``max_depth`` levels down) that hold manifests, sorted; local
    directories or URIs (``s3://bucket/prefix?query``: the roots keep the query). Raises
    CheckpointNotFoundError when there is none, InvalidInputError for a URI pyarrow cannot
    open."""
    if "://" in path and not path.startswith("file://"):
        return _find_uri_stores(path, max_depth)
    local = path[len("file://"):] if path.startswith("file://") else path
    if not os.path.isdir(local):
        raise CheckpointNotFoundError(f"no checkpoint directory at {path!r}")
    if _has_manifest(local):
        return [local]
    found = []
    base_depth = local.rstrip(os.sep).count(os.sep)
    for root, dirs, _ in os.walk(local):
        if root.count(os.sep) - base_depth >= max_depth:
            dirs[:] = []
        if _has_manifest(root):
            found.append(root)
            dirs[:] = []
    if not found:
        raise CheckpointNotFoundError(f"no checkpoint (manifest-*.json) at or below {path!r}")
    return sorted(found)


def _find_uri_stores(uri: str, max_depth: int) -> List[str]:
    """:func:`find_stores` under a URI: one recursive listing (on an object store, paged
    listings of the prefix) for the directories holding manifests. A URI without any is
    returned as it is (the store then says that nothing is committed)."""
    root = CheckpointRoot(uri)
    base = root.root.rstrip("/")
    found = set()
    for info in root.list(root.root, recursive=True):
        if info.type != pafs.FileType.File or manifest_version(info.base_name) is None:
            continue
        # The manifest's directory relative to the URI's path ("" for the path itself).
        parts = info.path[len(base) + 1:].split("/")[:-1]
        if len(parts) <= max_depth:
            found.add("/".join(parts))
    if "" in found or not found:
        return [uri]
    # A root's own sub-directories (data/, pending/) hold no manifests, so no root is inside
    # another.
    return [join_uri(uri, rel) for rel in sorted(found)]


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def version_stats(root: str, version: Optional[int] = None) -> dict:
    """Statistics of one checkpoint root at ``version`` (default: latest), JSON-able: what
    ``statecore inspect --json`` prints per root.

    Keys: ``root``, ``version``, ``versions`` (every retained version: ``version``,
    ``created_ms`` and ``compacted_ms`` (ms since the epoch, None unless compacted),
    ``commit_id``, ``runs``, ``bytes``), ``max_parallelism``, ``key_type``, ``assigner``,
    ``key_group_range``, ``runs``, ``bytes`` (stored bytes of the version's runs),
    ``bytes_added`` (of the runs written for it), ``raw_bytes``, ``max_runs_per_key_group``,
    ``states`` (one dict per state: its meta (``name``, ``kind``, ...) plus ``live_entries``
    (after the newest-wins merge of its runs: what a restore loads; list elements and map
    entries one each), ``stored_entries`` (in the runs, tombstones included, each run's own
    layout), ``tombstones``, ``bytes`` (stored, compressed) and ``key_groups``: the same five
    counts (plus ``runs``, the runs holding the key group) per non-empty key group, ascending,
    and ``filter_bytes``: the Bloom filters of its (state, key group)s in the runs of format 6,
    docs/formats.md "Filters and block keys"), ``filters`` (``runs`` of format 6 with filters,
    their ``bytes`` and ``bits_per_key`` values),
    ``timers`` (live timers, event and processing time), ``ttl_expired`` {cleanup strategy:
    n} and ``ttl_compaction_expired`` {state: n} (removed by TTL since the writers' previous
    versions), ``metadata`` (the committed user metadata), ``external`` (a metadata-only
    version's ``{"store", "namespace", "epoch", "logs", "base_epoch"}``: its keyed state is in
    that external store and it has no runs; else None).

    Reads and decodes every run of the version (nothing is loaded into a backend). Raises
    CheckpointNotFoundError for a root without versions or an unknown version,
    CorruptCheckpointError for an unreadable run."""
    store = CheckpointStore(root)
    versions = store.versions()
    if not versions:
        raise CheckpointNotFoundError(f"no committed version in {root!r}")
    v = versions[-1] if version is None else version
    states = []
    with store.open(v) as reader:
        d = describe_manifest(reader.manifest, store.uri)
        lo, hi = d["key_group_range"]
        for meta in reader.state_metas():
            groups = _key_group_stats(reader, meta["name"], lo, hi)
            totals = {k: sum(g[k] for g in groups)
                      for k in ("live_entries", "stored_entries", "tombstones", "bytes")}
            totals["filter_bytes"] = _filter_bytes(reader, meta["name"], lo, hi)
            states.append({**meta, **totals, "key_groups": groups})
        filters = {"runs": 0, "bytes": 0, "bits_per_key": []}
        for f in reader.manifest["files"]:
            data = reader.data_file(f)
            if data.lookup_tables() is not None:
                filters["runs"] += 1
                filters["bytes"] += data.filter_bytes
                if data.bloom_bits_per_key not in filters["bits_per_key"]:
                    filters["bits_per_key"].append(data.bloom_bits_per_key)
        manifests = {w: (reader.manifest if w == v else store.manifest(w)) for w in versions}
    retained = [{"version": w, "created_ms": m["created_ms"], "compacted_ms": m.get("compacted_ms"),
                 "commit_id": m.get("commit_id"), "runs": len(m["files"]),
                 "bytes": sum(f["size"] for f in m["files"])} for w, m in manifests.items()]
    return {
        "root": root, "version": v, "versions": retained,
        "max_parallelism": d["max_parallelism"], "key_type": d["key_type"],
        "assigner": d["assigner"], "key_group_range": [lo, hi], "runs": d["runs"],
        "bytes": d["bytes"], "bytes_added": d["bytes_added"], "raw_bytes": d["raw_bytes"],
        "max_runs_per_key_group": d["max_runs_per_key_group"], "states": states,
        "timers": sum(s["live_entries"] for s in states if s.get("kind") == "timers"),
        "ttl_expired": d["ttl_expired"], "ttl_compaction_expired": d["ttl_compaction_expired"],
        "metadata": d["metadata"], "filters": filters, "external": d["external"],
    }


def _filter_bytes(reader, name: str, lo: int, hi: int) -> int:
    """Bytes of the Bloom filters of state ``name`` in key groups ``[lo, hi]`` over the runs of
    the version (format 6 runs; older ones have none)."""
    total = 0
    for f in reader.manifest["files"]:
        if name not in f["states"]:
            continue
        data = reader.data_file(f)
        tables = data.lookup_tables()
        if tables is None:
            continue
        rows, pos = data.index_rows(name)
        keep = (rows["key_group"] >= lo) & (rows["key_group"] <= hi)
        total += int(tables[0]["length"][pos[keep]].astype("int64").sum())
    return total


def _key_group_stats(reader, name: str, lo: int, hi: int) -> list:
    """Per non-empty key group of state ``name`` in ``[lo, hi]`` (ascending): ``key_group``,
    ``stored_entries``, ``bytes`` and ``runs`` from the runs' key-group indexes, ``tombstones``
    from the blocks of the runs that hold any, ``live_entries`` after the newest-wins merge."""
    per_kg: dict = {}
    for f in reader.manifest["files"]:
        a, b = max(f["key_group_range"][0], lo), min(f["key_group_range"][1], hi)
        if name not in f["states"] or a > b:
            continue
        data = reader.data_file(f)
        has_tombstones = f.get("tombstones", {}).get(name, 0) > 0
        kgs, nbytes, nentries = data.stored_sizes(name, a, b)
        for kg, nb, ne in zip(kgs.tolist(), nbytes.tolist(), nentries.tolist()):
            g = per_kg.setdefault(kg, {"key_group": kg, "live_entries": 0, "stored_entries": 0,
                                       "tombstones": 0, "bytes": 0, "runs": 0})
            g["stored_entries"] += ne
            g["bytes"] += nb
            g["runs"] += 1
            if has_tombstones:
                g["tombstones"] += data.stored_entries(name, kg)[1].null_count
    for kg, g in per_kg.items():
        g["live_entries"] = len(reader.entries(name, kg)[0])
    return [per_kg[kg] for kg in sorted(per_kg)]


def summary_lines(root: str, version: Optional[int] = None, verify: bool = False) -> Iterator[str]:
    """Human-readable description of one checkpoint root at ``version`` (default: latest):
    versions retained, runs, bytes, live and stored entries and tombstones per state
    (:func:`version_stats`), key groups, the committed metadata. ``verify`` first reads and
    checks every block and entry (``CheckpointStore.verify``) of ``version``, or of every
    retained version when ``version`` is None, and says which it checked
    (CorruptCheckpointError on the first problem)."""
    store = CheckpointStore(root)
    versions = store.versions()
    if not versions:
        raise CheckpointNotFoundError(f"no committed version in {root!r}")
    v = versions[-1] if version is None else version
    checked = []
    if verify:
        for w in (versions if version is None else [v]):
            store.verify(w)
            checked.append(w)
    d = version_stats(root, v)
    yield f"checkpoint {root}"
    yield (f"  retained           version{'s' if len(versions) > 1 else ''} "
           f"{', '.join(map(str, versions))}")
    if checked:
        yield (f"  verified           version{'s' if len(checked) > 1 else ''} "
               f"{', '.join(map(str, checked))}: every block and entry")
    ext = d["external"]
    if ext is not None:
        yield (f"  version {v}: metadata only, the keyed state is in an external store: "
               f"{ext['store']} namespace {ext['namespace']!r}, epoch {ext['epoch']} (on "
               f"{'no earlier epoch' if ext['base_epoch'] is None else ext['base_epoch']}) "
               f"from {len(ext['logs'])} write-ahead log(s)")
        yield (f"  key type           {d['key_type']} of max parallelism "
               f"{d['max_parallelism']} (assigner {d['assigner']})")
        if d["metadata"]:
            yield (f"  metadata           "
                   f"{json.dumps(d['metadata'], sort_keys=True, default=str)[:400]}")
        return
    yield (f"  version {v}: {d['runs']} run(s), {_fmt_bytes(d['bytes'])} stored "
           f"({_fmt_bytes(d['bytes_added'])} written for this version), "
           f"{_fmt_bytes(d['raw_bytes'])} uncompressed")
    yield (f"  key groups         {d['key_group_range'][0]}..{d['key_group_range'][1]} "
           f"of max parallelism {d['max_parallelism']} (key type {d['key_type']}, "
           f"assigner {d['assigner']})")
    yield f"  longest run chain  {d['max_runs_per_key_group']}"
    fl = d["filters"]
    yield (f"  Bloom filters      {_fmt_bytes(fl['bytes'])} in {fl['runs']} of {d['runs']} run(s)"
           + (f" ({'/'.join(map(str, fl['bits_per_key']))} bits per key)"
              if fl["bits_per_key"] else "")
           + ("; older runs have none (lookups read their whole key groups)"
              if fl["runs"] < d["runs"] else ""))
    for st in d["states"]:
        what = ", ".join(f"{k}={st[k]}"
                         for k in ("kind", "value_type", "user_key_type", "reducer",
                                   "namespace_type") if st.get(k) is not None)
        yield (f"  state {st['name']:18s} {st['live_entries']:>10,} live entries "
               f"({st['stored_entries']:,} stored, {st['tombstones']:,} tombstones, "
               f"{len(st['key_groups']):,} key groups, {_fmt_bytes(st['filter_bytes'])} of "
               f"filters)  ({what})")
        if st.get("ttl"):
            yield f"    ttl {_ttl_text(st['ttl'])}"
    expired = dict(d.get("ttl_expired") or {})
    if d.get("ttl_compaction_expired"):
        expired["compaction"] = sum(d["ttl_compaction_expired"].values())
    if expired:
        yield ("  ttl expired        " + ", ".join(f"{k} {n:,}" for k, n in sorted(expired.items()))
               + "  (removed by TTL cleanup since the writers' previous versions)")
    reads = d["metadata"].get("restore_bytes") if isinstance(d["metadata"], dict) else None
    if reads and any(reads):
        yield (f"  restore reads      {_fmt_bytes(sum(reads))} by {len(reads)} task(s) loading "
               f"the previous version from the checkpoint: "
               + ", ".join(f"p{i} {_fmt_bytes(n)}" for i, n in enumerate(reads))[:300])
    if d["metadata"]:
        yield f"  metadata           {json.dumps(d['metadata'], sort_keys=True, default=str)[:400]}"


def _ttl_text(ttl: dict) -> str:
    """One line for a state's TTL config (statecore.ttl.StateTtlConfig.meta())."""
    cleanup = ["on read"]
    if ttl.get("cleanup_full_snapshot"):
        cleanup.append("full snapshot")
    if ttl.get("cleanup_incrementally"):
        cleanup.append(f"incremental {ttl['cleanup_incrementally']}"
                       + (" every record" if ttl.get("run_cleanup_for_every_record") else ""))
    if ttl.get("cleanup_in_compaction"):
        cleanup.append(f"compaction (clock every {ttl['cleanup_in_compaction']} entries)")
    if ttl.get("cleanup_in_background"):
        cleanup.append("background")
    return (f"{ttl['ttl_ms']:,} ms {ttl.get('time_characteristic', 'processing_time')}, "
            f"{ttl.get('update_type')}, {ttl.get('state_visibility')}; "
            f"cleanup: {', '.join(cleanup)}")


def _jsonish(v) -> str:
    return json.dumps(v, sort_keys=True, default=repr)


def entries_table(root: str, version: Optional[int] = None,
                  limit: Optional[int] = None) -> pa.Table:
    """The entries of ``version`` (default: latest) as an Arrow table with columns ``state``
    (string), ``key_group`` (int32), ``key`` (the checkpoint's key type), ``namespace``,
    ``user_key`` and ``value`` (JSON text; lists and pickled objects rendered as JSON, ``repr``
    where JSON has no form); a map state has one row per user key (its entries,
    docs/formats.md "Map state"), a list state one row per element in list order with the
    element's position in its list (0 first) as ``user_key`` (its chunks expanded,
    docs/formats.md "List state"), every other row a null ``user_key``; timers appear as state
    ``__timers__`` with the timestamp (ms) as value for an
    event-time timer, ``{"processing_time": ts}`` for a processing-time timer.
    ``limit`` caps the rows. Errors as CheckpointStore.restore."""
    store = CheckpointStore(root)
    v = store.latest_version() if version is None else version
    m = store.describe(v)
    ext = m["external"]
    if ext is not None:
        raise InvalidInputError(
            f"version {v} of {root} is metadata only: its keyed state is in an external store "
            f"({ext['store']} namespace {ext['namespace']!r}, epoch {ext['epoch']}); read it "
            "with statecore.external.read_committed")
    backend = PythonBackend(key_type=m["key_type"], max_parallelism=m["max_parallelism"],
                            key_group_range=tuple(m["key_group_range"]), assigner=m["assigner"],
                            timer_namespace_type=_timer_ns(m["states"]))
    store.restore(backend, v)
    rows = {"state": [], "key_group": [], "key": [], "namespace": [], "user_key": [],
            "value": []}

    def add(state, kg, key, ns, value, user_key=None, is_map=False) -> bool:
        uk = _jsonish(user_key) if is_map else None
        for col, x in zip(rows, (state, kg, key, _jsonish(ns), uk, _jsonish(value))):
            rows[col].append(x)
        return limit is not None and len(rows["state"]) >= limit

    done = False
    cur_list, pos = None, 0
    for name, table in sorted(backend.state_tables().items()):
        for kg in sorted(table.data):
            cur_list = None
            for k, stored in table.data[kg].items():  # restored: in encoded-key order
                key, ns = k[0], k[1]
                uk = None
                if table.kind == "list":
                    # A chunk: one row per element, its position counted over the list's
                    # chunks (they follow one another in encoded-key order).
                    if k[:2] != cur_list:
                        cur_list, pos = k[:2], 0
                    for e in stored:
                        if add(name, kg, key, ns, from_stored(table.value_ser, e), pos, True):
                            done = True
                            break
                        pos += 1
                    if done:
                        break
                    continue
                elif table.kind == "map":
                    uk = table.user_key_ser.deserialize(k[2])
                    value = from_stored(table.value_ser, stored)
                else:
                    value = from_stored(table.value_ser, stored)
                if add(name, kg, key, ns, value, uk, table.kind in ("map", "list")):
                    done = True
                    break
            if done:
                break
        if done:
            break
    if not done:
        for kg, ts, key, ns in backend.timers.all_timers():
            if add("__timers__", kg, key, ns, ts):
                done = True
                break
    if not done:
        for kg, ts, key, ns in backend.timers.all_processing_time_timers():
            if add("__timers__", kg, key, ns, {"processing_time": ts}):
                break
    key_type = key_types.key_type(m["key_type"]).arrow_type
    return pa.table({"state": pa.array(rows["state"], pa.string()),
                     "key_group": pa.array(rows["key_group"], pa.int32()),
                     "key": pa.array(rows["key"], key_type),
                     "namespace": pa.array(rows["namespace"], pa.string()),
                     "user_key": pa.array(rows["user_key"], pa.string()),
                     "value": pa.array(rows["value"], pa.string())})



def _timer_ns(metas) -> str:
    for s in metas:
        if s.get("kind") == "timers":
            return s.get("namespace_type", "void")
    return "void"
