"""The bundled job: aircraft sessions and route delays over the real 2013 New York flights.

Pipeline::

    landing/ (one Parquet file per day, event-time order)
      -> readStream.parquet (maxFilesPerTrigger = files_per_trigger; Spark checkpoint = offsets)
      -> foreachBatch(df, batch_id):
           sessions     StatefulOperator(AircraftSessions, key tailnum)
                          -> OUTPUT/sessions/batch_id=N/
           route_delays StatefulOperator(RouteDelays, key origin|dest)
                          -> OUTPUT/route_delays/batch_id=N/
      -> trigger(availableNow=True): the query stops by itself once every landed file is processed
      -> sessions.flush(): open sessions emitted once, as version last_batch + 1 (final)

Exactly-once: each operator commits version N only after its sink overwrote its own
``batch_id=N`` directory and its tasks' background checkpoint writes reported; both operators'
actions run first and both commit at the end of ``foreachBatch`` (so the checkpoint writes of the
sessions operator overlap the route operator's job); Spark commits batch N only after
``foreachBatch`` returned. A run killed at any point replays the uncommitted batch, whose
operators restore N - 1 and overwrite their output. Checkpoints are incremental after the first
version (``statecore.spark.operator`` docstring). ``max_batches`` stops a run after that many
micro-batches of this run (the next one is refused before any side effect, so Spark re-plans it on
restart). Through Spark Connect (``remote``) the same ``foreachBatch`` function runs on the
server and reports back through files (:func:`run_demo`).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Union

from statecore.checkpoint.layout import is_uri, join_uri
from statecore.demo.run_log import RunLog
from statecore.errors import InvalidInputError, StateError

__all__ = ["DemoConfig", "DemoSummary", "DemoPipeline", "run_demo", "parse_duration_ms",
           "native_backend_available", "local_parts"]

#: The interpreter of a packed environment (``DemoConfig.python_env``) on the executors.
_ENV_PYTHON = "./environment/bin/python"

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


#: Longest duration :func:`parse_duration_ms` accepts (100,000 days): event times (ms since the
#: epoch) plus it stay far inside the int64 microseconds of Spark timestamps.
MAX_DURATION_MS = 100_000 * 86_400_000


def parse_duration_ms(text: str) -> int:
    """Parse ``"6h"``, ``"90m"``, ``"30s"``, ``"1d"``, ``"1h30m"``, ``"250ms"`` into milliseconds.

    Raises InvalidInputError for anything else, for a zero duration or for one longer than
    :data:`MAX_DURATION_MS` (event times plus such a gap would overflow Spark's timestamps).
    """
    if not isinstance(text, str):
        raise InvalidInputError(f"duration must be a string like '6h', got {text!r}")
    s = text.strip().lower()
    parts = re.findall(r"(\d+)\s*(ms|s|m|h|d)", s)
    if (not s or not parts
            or re.sub(r"\s+", "", "".join(n + u for n, u in parts)) != re.sub(r"\s+", "", s)):
        raise InvalidInputError(
            f"cannot parse duration {text!r}; use e.g. 6h, 90m, 30s, 1d, 1h30m, 500ms")
    total = sum(int(n) * _UNITS_MS[u] for n, u in parts)
    if total <= 0:
        raise InvalidInputError(f"duration must be positive, got {text!r}")
    if total > MAX_DURATION_MS:
        raise InvalidInputError(
            f"duration {text!r} is longer than {MAX_DURATION_MS // _UNITS_MS['d']:,} days")
    return total


def native_backend_available() -> bool:
    """True when ``statecore.backends.native`` (and the compiled extension) imports."""
    try:
        import statecore.backends.native  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class DemoConfig:
    """Options of ``statecore demo`` (see ``statecore demo --help``).

    ``days``: only the first ``days`` New York days of 2013 (None = the whole year).
    ``checkpoint``: a local directory, or a URI of a ``pyarrow.fs`` filesystem such as
    ``s3://bucket/prefix`` (docs/deploy.md "Checkpoints on object storage"): the operators'
    state goes to ``<checkpoint>/operators/<name>``. Spark's own checkpoint (the offsets log)
    and the landed files need a local or HDFS path.
    ``landing``: where the daily files are landed (default ``<checkpoint>/landing``, or
    ``./statecore-landing`` when ``checkpoint`` is a URI).
    ``spark_checkpoint``: Spark's checkpoint location (default ``<checkpoint>/spark``, or
    ``./statecore-spark-checkpoint`` when ``checkpoint`` is a URI).
    ``session_gap_ms``: session gap in ms (default 6 h).
    ``aircraft_idle_ttl_ms``, ``route_idle_ttl_ms``: event-time TTL in ms of the per-aircraft
    activity and the per-route statistics (default 30 days; None = kept forever), see
    :mod:`statecore.demo.processors`. The durations may change between runs of one checkpoint;
    switching a TTL on or off is a state migration and is refused (StateMigrationError).
    ``ttl_background_key_groups``: key groups per partition that TTL background cleanup expires
    after each micro-batch's snapshot (0 = off). ``retain_versions``, ``max_runs``,
    ``commit_timeout_s``: passed to both operators (:class:`statecore.spark.StatefulOperator`:
    committed versions kept, incremental runs per key group before a compaction (None = never
    compact), seconds the driver waits for the partitions' background checkpoint writes
    that still beat; a lost write is re-run sooner).
    ``remote``: a Spark Connect URL (``sc://HOST:PORT``) to run the job through instead of a
    session on ``master`` (see :func:`run_demo`).
    ``spark_conf``: Spark configuration entries for the session the job builds (they override
    :func:`statecore.spark.local_session`'s settings; ignored when ``run_demo`` is handed a
    session). ``python_env``: a packed Python environment (a ``venv-pack`` tarball of a venv
    with statecore installed) for the executors of a cluster master: shipped as
    ``spark.archives = <python_env>#environment`` and run there as
    ``./environment/bin/python`` (``PYSPARK_PYTHON``); the driver keeps its own interpreter.
    Refused with a local master (its workers run the driver's interpreter).
    ``state_store``: the URL of an external store (``redis://HOST:PORT/DB``,
    ``postgresql://USER@HOST:PORT/DB``; a password is better given to PostgreSQL as
    ``PGPASSWORD`` in the environment) that keeps both operators' keyed state
    (``StatefulOperator(state_store=)``: a micro-batch is an epoch of the store; each
    operator's namespace is its checkpoint root; the checkpoint keeps the operators'
    metadata-only manifests); None: in memory, checkpointed. ``state_store_cache_entries``
    and ``state_store_ttl_sweep_key_groups``: the operators' options of the same names (each
    task's cache bound in entries, None: unbounded; key groups whose expired TTL entries each
    commit removes from the store), only with ``state_store``.
    ``memory_budget``: the operators' tiered mode (``StatefulOperator(memory_budget=)``, bytes
    as an int or a string such as ``"64MiB"``): each task's native backend keeps at most that
    many bytes of key and value in memory and reads the rest from the committed checkpoint;
    None: the whole state in memory.
    """

    checkpoint: str = "./statecore-checkpoint"
    output: str = "./statecore-output"
    landing: Optional[str] = None
    spark_checkpoint: Optional[str] = None
    files_per_trigger: int = 7
    parallelism: int = 2
    max_parallelism: int = 128
    backend: str = "native"
    session_gap_ms: int = 6 * 3_600_000
    aircraft_idle_ttl_ms: Optional[int] = 30 * 86_400_000
    route_idle_ttl_ms: Optional[int] = 30 * 86_400_000
    ttl_background_key_groups: int = 8
    max_batches: Optional[int] = None
    days: Optional[int] = None
    master: str = "local[2]"
    retain_versions: int = 3
    max_runs: Optional[int] = 8
    commit_timeout_s: float = 300.0
    remote: Optional[str] = None
    spark_conf: Dict[str, str] = field(default_factory=dict)
    python_env: Optional[str] = None
    state_store: Optional[str] = None
    state_store_cache_entries: Optional[int] = 2_000_000
    state_store_ttl_sweep_key_groups: int = 16
    memory_budget: Optional[Union[int, str]] = None

    def validate(self) -> None:
        """Raise InvalidInputError for out-of-range options."""
        for name in ("files_per_trigger", "parallelism", "max_parallelism", "session_gap_ms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidInputError(f"{name} must be a positive int, got {v!r}")
        if self.max_parallelism > 32768:
            raise InvalidInputError(
                f"max_parallelism must be at most 32768 (Flink's upper bound), got "
                f"{self.max_parallelism}")
        for name in ("checkpoint", "output", "landing", "spark_checkpoint"):
            path = getattr(self, name)
            if path is not None and not is_uri(path) and os.path.exists(path) \
                    and not os.path.isdir(path):
                raise InvalidInputError(f"{name} {path!r} exists and is not a directory")
        if self.parallelism > self.max_parallelism:
            raise InvalidInputError(
                f"parallelism {self.parallelism} exceeds max_parallelism {self.max_parallelism}")
        if self.max_batches is not None and (isinstance(self.max_batches, bool)
                                             or not isinstance(self.max_batches, int)
                                             or self.max_batches < 1):
            raise InvalidInputError(f"max_batches must be a positive int, got {self.max_batches!r}")
        for name in ("aircraft_idle_ttl_ms", "route_idle_ttl_ms"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InvalidInputError(f"{name} must be a positive int (ms) or None, got {v!r}")
        for name in ("session_gap_ms", "aircraft_idle_ttl_ms", "route_idle_ttl_ms"):
            v = getattr(self, name)
            if v is not None and v > MAX_DURATION_MS:
                raise InvalidInputError(f"{name} must be at most {MAX_DURATION_MS} ms, got {v}")
        g = self.ttl_background_key_groups
        if isinstance(g, bool) or not isinstance(g, int) or g < 0:
            raise InvalidInputError(f"ttl_background_key_groups must be an int >= 0, got {g!r}")
        if self.backend not in ("python", "native"):
            raise InvalidInputError(f"backend must be 'native' or 'python', got {self.backend!r}")
        if self.memory_budget is not None:
            from statecore.backends.tiered import parse_bytes

            parse_bytes(self.memory_budget)
            if self.backend != "native" or self.state_store is not None:
                raise InvalidInputError("memory_budget (the tiered mode) needs backend 'native' "
                                        "and no state_store")
        r = self.retain_versions
        if isinstance(r, bool) or not isinstance(r, int) or r < 2:
            raise InvalidInputError(f"retain_versions must be an int >= 2, got {r!r}")
        m = self.max_runs
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise InvalidInputError(f"max_runs must be a positive int or None, got {m!r}")
        t = self.commit_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf"):
            raise InvalidInputError(f"commit_timeout_s must be a positive number, got {t!r}")
        if self.remote is not None and (not isinstance(self.remote, str)
                                        or not self.remote.startswith("sc://")
                                        or len(self.remote) <= len("sc://")):
            raise InvalidInputError(
                f"remote must be a Spark Connect URL like sc://HOST:PORT, got {self.remote!r}")
        if not isinstance(self.spark_conf, dict) or not all(
                isinstance(k, str) and k and isinstance(v, str)
                for k, v in self.spark_conf.items()):
            raise InvalidInputError(
                f"spark_conf must map non-empty str keys to str values, got {self.spark_conf!r}")
        if self.python_env is not None:
            from statecore.spark.session import is_local_master

            if is_local_master(self.master):
                raise InvalidInputError(
                    f"python_env ships an environment to cluster executors; the local master "
                    f"{self.master!r} runs its workers with the driver's interpreter")
            if not os.path.isfile(self.python_env):
                raise InvalidInputError(f"python_env {self.python_env!r} is not a file")
        if self.state_store is not None:
            from statecore.external.urls import store_kind

            store_kind(self.state_store)
        from statecore.spark.external_commit import check_store_cache

        check_store_cache(self.state_store, self.state_store_cache_entries,
                          self.state_store_ttl_sweep_key_groups)


@dataclass
class DemoSummary:
    """Result of one run. ``events`` counts rows processed by this run (replays included);
    ``sessions`` is the number of session rows in the output (all runs); state and checkpoint
    figures describe the latest committed versions; ``checkpoint_bytes_written`` sums the data
    files this run wrote (both operators, every micro-batch and the flush) and
    ``commit_wait_seconds`` the time the driver waited for background checkpoint writes;
    ``ttl_expired`` counts the state entries TTL cleanup removed during this run, by strategy
    (read, incremental, background, full_snapshot; as the checkpoint manifests report them).
    ``batches``: one dict per micro-batch of this run: ``batch_id``, ``events``, ``sessions``,
    ``routes`` (output rows), ``seconds`` and ``partitions`` (both operators' per-partition task
    figures, :attr:`statecore.spark.BatchReport.partitions`, each with its ``operator``)."""

    events: int = 0
    seconds: float = 0.0
    micro_batches: int = 0
    last_batch_id: Optional[int] = None
    stopped_early: bool = False
    flushed: bool = False
    sessions: int = 0
    route_rows: int = 0
    state_entries: int = 0
    state_bytes: int = 0
    checkpoint_bytes: int = 0
    checkpoint_bytes_written: int = 0
    commit_wait_seconds: float = 0.0
    late_rows: int = 0
    cache_loads: int = 0
    checkpoint_loads: int = 0
    ttl_expired: Dict[str, int] = field(default_factory=dict)
    batches: List[Dict] = field(default_factory=list)

    @property
    def events_per_second(self) -> float:
        """``events / seconds`` (0.0 before any time was measured)."""
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def lines(self) -> List[str]:
        """Human-readable summary lines."""
        return [
            f"events processed   {self.events:,} in {self.seconds:.1f} s "
            f"({self.events_per_second:,.0f} events/s)",
            f"micro-batches      {self.micro_batches} this run (last batch id {self.last_batch_id})"
            + ("; stopped at --max-batches" if self.stopped_early else ""),
            f"sessions emitted   {self.sessions:,} "
            f"(final flush {'done' if self.flushed else 'not yet'})",
            f"route updates      {self.route_rows:,} rows",
            f"state              {self.state_entries:,} entries, {self.state_bytes:,} bytes",
            f"checkpoint         {self.checkpoint_bytes:,} bytes on disk, "
            f"{self.checkpoint_bytes_written:,} bytes written by this run "
            f"(driver waited {self.commit_wait_seconds:.2f} s for background writes)",
            f"state loads        {self.cache_loads} from the worker cache, "
            f"{self.checkpoint_loads} from the checkpoint",
            f"late rows dropped  {self.late_rows}",
            "ttl expired        "
            + (", ".join(f"{n:,} {s}" for s, n in sorted(self.ttl_expired.items())) or "none")
            + " (state entries, by cleanup strategy)",
        ]


class DemoPipeline:
    """The job's ``foreachBatch`` body: both operators on one micro-batch.

    ``pipeline(df, batch_id)`` runs the sessions operator on the rows with a ``tailnum`` and the
    route operator on all rows (key ``origin|dest``), then commits version ``batch_id`` of both
    (:func:`statecore.spark.commit_batches`: both actions first, commits at the end), and
    returns their :class:`statecore.spark.BatchReport` pair. Calling it again with the same
    ``batch_id`` and rows (a replay) reproduces the same state and output. ``query_id``: the
    Spark query the micro-batch belongs to (:meth:`statecore.spark.StatefulOperator.start`;
    needed under Spark Connect, where the operators cannot read it).
    """

    def __init__(self, cfg: DemoConfig):
        from statecore.demo.processors import AircraftSessions, RouteDelays
        from statecore.spark import StatefulOperator

        output = os.path.abspath(cfg.output)
        self.ops_dir = join_uri(_local_or_uri(cfg.checkpoint), "operators")
        common = dict(parallelism=cfg.parallelism, max_parallelism=cfg.max_parallelism,
                      backend=cfg.backend, retain_versions=cfg.retain_versions,
                      max_runs=cfg.max_runs, commit_timeout_s=cfg.commit_timeout_s,
                      ttl_background_key_groups=cfg.ttl_background_key_groups,
                      state_store=cfg.state_store,
                      state_store_cache_entries=cfg.state_store_cache_entries,
                      state_store_ttl_sweep_key_groups=cfg.state_store_ttl_sweep_key_groups,
                      memory_budget=cfg.memory_budget)
        self.sessions = StatefulOperator(
            "sessions", AircraftSessions(cfg.session_gap_ms, cfg.aircraft_idle_ttl_ms), "tailnum",
            self.ops_dir,
            output=os.path.join(output, "sessions"), event_time_column="event_time", **common)
        self.routes = StatefulOperator(
            "route_delays", RouteDelays(cfg.route_idle_ttl_ms), "route", self.ops_dir,
            output=os.path.join(output, "route_delays"), event_time_column="event_time", **common)

    def __call__(self, df, batch_id: int, query_id: Optional[str] = None):
        from pyspark.sql import functions as F

        from statecore.demo.processors import ROUTE_KEY_SEPARATOR
        from statecore.spark import commit_batches

        # Both operators read the micro-batch: keep it instead of reading the files twice.
        df = df.persist()
        try:
            s = self.sessions.start(df.where(F.col("tailnum").isNotNull()), batch_id,
                                    query_id=query_id)
            r = self.routes.start(
                df.select("*", F.concat_ws(ROUTE_KEY_SEPARATOR, "origin", "dest").alias("route")),
                batch_id, query_id=query_id)
        finally:
            df.unpersist()
        s, r = commit_batches([s, r])
        return s, r


class _StopAfterMaxBatches(Exception):
    """Raised inside foreachBatch to end a run after --max-batches micro-batches."""



def _local_or_uri(path: str) -> str:
    """``path`` made absolute when it is local; a URI as it is."""
    return path if is_uri(path) else os.path.abspath(path)


def local_parts(cfg: DemoConfig) -> tuple[str, str]:
    """``(landing, spark_checkpoint)``: the absolute local directories of the landed files and
    of Spark's checkpoint for ``cfg`` (defaults: :class:`DemoConfig`)."""
    if is_uri(cfg.checkpoint):
        landing = cfg.landing or "./statecore-landing"
        spark_ckpt = cfg.spark_checkpoint or "./statecore-spark-checkpoint"
    else:
        landing = cfg.landing or os.path.join(cfg.checkpoint, "landing")
        spark_ckpt = cfg.spark_checkpoint or os.path.join(cfg.checkpoint, "spark")
    return os.path.abspath(landing), os.path.abspath(spark_ckpt)


def _dir_bytes(path: str, exclude: Optional[str] = None) -> int:
    if is_uri(path):
        import pyarrow.fs as pafs

        from statecore.checkpoint.layout import CheckpointRoot

        root = CheckpointRoot(path)
        return sum(i.size or 0 for i in root.list(root.root, recursive=True)
                   if i.type == pafs.FileType.File)
    total = 0
    ex = os.path.abspath(exclude) if exclude else None
    for root, _dirs, files in os.walk(path):
        if ex and os.path.abspath(root).startswith(ex):
            continue
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def _batch_record(batch_id: int, s, r, seconds: float) -> Dict:
    """The run log's record of one micro-batch from its two BatchReports (JSON data)."""
    ttl: Dict[str, int] = {}
    for rep in (s, r):
        for strategy, n in rep.ttl_expired.items():
            ttl[strategy] = ttl.get(strategy, 0) + int(n)
    return {
        "batch_id": int(batch_id), "events": r.rows, "sessions": s.output_rows,
        "routes": r.output_rows, "seconds": seconds, "late_rows": s.metrics.get("late_rows", 0),
        "checkpoint_bytes": s.checkpoint_bytes + r.checkpoint_bytes,
        "wait_seconds": s.wait_seconds + r.wait_seconds,
        "cache_loads": s.loads.get("cache", 0) + r.loads.get("cache", 0),
        "checkpoint_loads": s.loads.get("checkpoint", 0) + r.loads.get("checkpoint", 0),
        "ttl_expired": ttl, "watermark_ms": s.watermark_ms,
        "state_entries": s.state_entries + r.state_entries,
        "state_bytes": s.state_bytes + r.state_bytes,
        "partitions": [dict(p, operator=rep.operator_name) for rep in (s, r)
                       for p in rep.partitions],
    }


def _batch_line(rec: Dict) -> str:
    wm = ("-" if rec["watermark_ms"] is None
          else time.strftime("%Y-%m-%d %H:%M", time.gmtime(rec["watermark_ms"] / 1000)))
    return (f"batch {rec['batch_id']:>4}: {rec['events']:>6,} events  {rec['sessions']:>5,} "
            f"sessions closed  {rec['routes']:>4} routes updated  watermark {wm}  state "
            f"{rec['state_entries']:,} entries / {rec['state_bytes']:,} B  "
            f"{rec['seconds']:.2f} s")


def _add_batch(summary: DemoSummary, rec: Dict) -> None:
    summary.micro_batches += 1
    summary.last_batch_id = rec["batch_id"]
    summary.events += rec["events"]
    summary.late_rows += rec["late_rows"]
    summary.checkpoint_bytes_written += rec["checkpoint_bytes"]
    summary.commit_wait_seconds += rec["wait_seconds"]
    summary.cache_loads += rec["cache_loads"]
    summary.checkpoint_loads += rec["checkpoint_loads"]
    for strategy, n in rec["ttl_expired"].items():
        summary.ttl_expired[strategy] = summary.ttl_expired.get(strategy, 0) + n
    summary.batches.append({k: rec[k] for k in ("batch_id", "events", "sessions", "routes",
                                                "seconds", "partitions")})


def _make_each_batch(cfg: DemoConfig, pipeline: DemoPipeline, log: RunLog,
                     spark_checkpoint: Optional[str]):
    """The query's ``foreachBatch`` function. It reports only through ``log``: under Spark
    Connect (``spark_checkpoint`` given) it runs in a Python process on the server, reads the
    query id from the Spark checkpoint location (no SparkContext there) and counts
    ``max_batches`` from the log's files, since nothing it keeps in memory reaches the
    client."""

    def each_batch(df, batch_id: int) -> None:
        if cfg.max_batches is not None and log.count() >= cfg.max_batches:
            log.mark_stopped()
            raise _StopAfterMaxBatches(f"statecore demo: --max-batches {cfg.max_batches} reached")
        query_id = None
        if spark_checkpoint is not None:
            from statecore.spark import streaming_query_id

            query_id = streaming_query_id(spark_checkpoint)
        t0 = time.perf_counter()
        s, r = pipeline(df, batch_id, query_id=query_id)
        log.record(_batch_record(batch_id, s, r, time.perf_counter() - t0))

    return each_batch


def run_demo(cfg: DemoConfig, spark=None,
             progress: Optional[Callable[[str], None]] = print) -> DemoSummary:
    """Run the flights job (module docstring) and return its summary.

    ``spark``: an existing SparkSession, classic or Spark Connect (default: a Spark Connect
    session on ``cfg.remote`` when set, :func:`statecore.spark.remote_session`, else
    :func:`statecore.spark.local_session` on ``cfg.master``). Under Spark Connect the
    ``foreachBatch`` function runs on the server: the checkpoint, output and landing paths must
    be the same files for the client and the server (one host or a shared filesystem), and the
    per-batch figures come back through files under ``<checkpoint>/runs/`` (for a URI
    checkpoint ``<spark checkpoint>-runs/``; :class:`statecore.demo.run_log.RunLog`).
    ``progress``: called with one line per micro-batch (None = silent). Raises
    InvalidInputError for bad options, StateError when the native backend is requested but not
    importable, and whatever the streaming query raised.
    """
    cfg.validate()
    if cfg.backend == "native" and not native_backend_available():
        raise StateError(
            "the native backend (statecore.backends.native / statecore._native) is not available "
            "in this installation; build it (pip install .) or run with --backend python")
    from statecore.demo.data import land_flights
    from statecore.spark import is_connect_session, local_session, quiet_query_end, remote_session

    say = progress or (lambda _line: None)
    output = os.path.abspath(cfg.output)
    landing_dir, spark_checkpoint = local_parts(cfg)
    if not is_uri(cfg.checkpoint):
        os.makedirs(cfg.checkpoint, exist_ok=True)
    landing = land_flights(landing_dir, cfg.days)
    say(f"{'reusing' if landing.reused else 'landed'} {landing.rows:,} flights in "
        f"{len(landing.files)} daily files under {landing_dir}")

    if spark is None:
        if cfg.remote is not None:
            spark = remote_session(cfg.remote, shuffle_partitions=cfg.parallelism,
                                   conf=cfg.spark_conf)
        else:
            conf = {}
            if cfg.python_env is not None:
                # The PySpark documentation's recipe for a packed virtualenv: executors unpack
                # the archive into ./environment of their working directory; the driver's
                # SparkContext hands PYSPARK_PYTHON to them as the interpreter of their Python
                # workers.
                os.environ["PYSPARK_PYTHON"] = _ENV_PYTHON
                conf["spark.archives"] = f"{os.path.abspath(cfg.python_env)}#environment"
            conf.update(cfg.spark_conf)
            spark = local_session("statecore-demo", master=cfg.master,
                                  shuffle_partitions=cfg.parallelism, conf=conf)
    connect = is_connect_session(spark)
    pipeline = DemoPipeline(cfg)
    ops_dir = pipeline.ops_dir
    sessions_op, routes_op = pipeline.sessions, pipeline.routes
    run_id = f"{os.getpid()}_{int(time.time() * 1000)}"
    # Run logs are local files (Spark Connect's client and server share them); a URI
    # checkpoint keeps them beside Spark's local checkpoint.
    runs_dir = (spark_checkpoint + "-runs" if is_uri(cfg.checkpoint)
                else os.path.join(os.path.abspath(cfg.checkpoint), "runs"))
    log = RunLog(os.path.join(runs_dir, run_id) if connect else None)

    summary = DemoSummary()
    schema = spark.read.parquet(landing.files[0]).schema
    source = (spark.readStream.schema(schema)
              .option("maxFilesPerTrigger", cfg.files_per_trigger)
              .option("maxFileAge", "36500d")
              .option("pathGlobFilter", "*.parquet")
              .parquet(landing_dir))
    each_batch = _make_each_batch(cfg, pipeline, log, spark_checkpoint if connect else None)
    said = set()

    def report_new() -> None:
        for rec in log.records():
            if rec["batch_id"] not in said:
                said.add(rec["batch_id"])
                say(_batch_line(rec))

    t_start = time.perf_counter()
    quiet = (quiet_query_end(spark) if cfg.max_batches is not None and not connect
             else contextlib.nullcontext())
    with quiet:
        query = (source.writeStream.foreachBatch(each_batch)
                 .option("checkpointLocation", spark_checkpoint)
                 .trigger(availableNow=True)
                 .queryName(f"statecore_demo_{run_id}")
                 .start())
        try:
            while not query.awaitTermination(0.5):
                report_new()
        except Exception:
            if not log.stopped():
                raise
        finally:
            if query.isActive:
                query.stop()
            report_new()
            for rec in log.records():
                _add_batch(summary, rec)
            summary.stopped_early = log.stopped()
            log.remove()
    summary.seconds = time.perf_counter() - t_start
    if not summary.stopped_early:
        rep = sessions_op.flush(spark)
        if rep is not None:
            summary.checkpoint_bytes_written += rep.checkpoint_bytes
            summary.commit_wait_seconds += rep.wait_seconds
            say(f"end of input: flushed {rep.output_rows:,} open sessions as version {rep.version}")
    summary.flushed = sessions_op.is_finalized()
    for op in (sessions_op, routes_op):
        op.close()  # the driver's connections to the state store

    # Figures of the latest committed versions (this run or an earlier one).
    for op in (sessions_op, routes_op):
        v = op.latest_version()
        if v is not None:
            meta = op.store.metadata(v)
            summary.state_entries += int(meta["state_entries"])
            summary.state_bytes += int(meta["state_bytes"])
    summary.checkpoint_bytes = _dir_bytes(ops_dir)
    for name, attr in (("sessions", "sessions"), ("route_delays", "route_rows")):
        path = os.path.join(output, name)
        if os.path.isdir(path):
            import pyarrow.dataset as ds

            setattr(summary, attr,
                    ds.dataset(path, format="parquet", partitioning="hive").count_rows())
    for line in summary.lines():
        say(line)
    return summary
