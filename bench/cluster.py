"""The flights job (``statecore demo``) on a Spark standalone cluster vs ``local[2]``.

Run from the repository root (a script, not a ``--case``: it builds a wheel, a venv and a
cluster, minutes before the first figure, so a run of all cases leaves it out)::

    python -m bench.cluster [--days N] [--python-env ENV.tar.gz] [--json FILE]

The cluster is the one of the tests (``tests/support/spark_cluster.py``): a master and two
workers on 127.0.0.1, 1 core and 1g each; the executors run statecore from a wheel of this
checkout, installed into a fresh venv and shipped as a ``venv-pack`` archive
(``spark.archives``; ``--python-env`` reuses an archive made earlier). Both runs process the same
landed days (default 91, micro-batches of 14 days) at parallelism 4 with the native backend, in
this process as the driver. Records (case ``cluster``):

* ``events_per_s`` of each master (``local[2]``, ``standalone``): events / seconds of the
  streaming query (micro-batches, commits and the final flush; the session start excluded);
* per master, the partitions' state loads of all micro-batches by kind (``loads_cache``,
  ``loads_standby``, ``loads_catch-up``, ``loads_checkpoint``, ...; the operators'
  ``BatchReport.partitions``; the first micro-batch's ``empty`` loads are counted too);
* ``restore_ms_median`` / ``restore_ms_max``: on the cluster, the ``load_s`` of the partitions
  that moved to the other executor (their previous task ran in another process) and were
  restored from the checkpoint; ``moved_partitions``: how many tasks those were.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from bench.harness import Record, record
from bench.runner import write_json

REPO = Path(__file__).resolve().parents[1]
CASE = "cluster"


def _summary_records(impl: str, summary) -> List[Record]:
    out = [record(CASE, impl, "events_per_s", summary.events_per_second, "events/s"),
           record(CASE, impl, "events", summary.events, "events"),
           record(CASE, impl, "query_s", summary.seconds, "s")]
    loads: Dict[str, int] = {}
    for b in summary.batches:
        for p in b["partitions"]:
            loads[p["load"]] = loads.get(p["load"], 0) + 1
    out += [record(CASE, impl, f"loads_{k}", v, "partitions") for k, v in sorted(loads.items())]
    return out


def moved_restores(batches: List[dict]) -> List[float]:
    """``load_s`` of the tasks whose partition ran in another worker process in the previous
    micro-batch and whose state came from the checkpoint (a restore after a move)."""
    last_pid: Dict[tuple, int] = {}
    out: List[float] = []
    for b in sorted(batches, key=lambda b: b["batch_id"]):
        for p in b["partitions"]:
            key = (p["operator"], p["partition"])
            prev = last_pid.get(key)
            if prev is not None and prev != p["pid"] and p["load"] == "checkpoint":
                out.append(p["load_s"])
            last_pid[key] = p["pid"]
    return out


def _build_env(workdir: Path) -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    from support.spark_cluster import pack_venv
    from support.wheels import build_wheel, make_venv

    wheel = build_wheel(workdir / "wheel")
    python = make_venv(workdir / "venv", wheel, "[spark]")
    return pack_venv(python, workdir / "env.tar.gz")


def run(days: int, python_env: Optional[Path], workdir: Path) -> List[Record]:
    """Both runs; returns their records (module docstring)."""
    sys.path.insert(0, str(REPO / "tests"))
    from statecore.demo.job import DemoConfig, run_demo
    from statecore.spark import local_session
    from support.spark_cluster import Cluster

    if python_env is None:
        python_env = _build_env(workdir)
    landing = str(workdir / "landing")
    common = dict(backend="native", days=days, files_per_trigger=14, parallelism=4,
                  landing=landing)
    records: List[Record] = []

    spark = local_session("statecore-bench-local", master="local[2]", shuffle_partitions=4)
    try:
        s = run_demo(DemoConfig(checkpoint=str(workdir / "local" / "ckpt"),
                                output=str(workdir / "local" / "out"), **common),
                     spark=spark, progress=None)
    finally:
        spark.stop()
    records += _summary_records("local[2]", s)

    cluster = Cluster.start(workers=2, cores=1, memory="1g", workdir=workdir / "cluster")
    try:
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        cfg = DemoConfig(checkpoint=str(workdir / "standalone" / "ckpt"),
                         output=str(workdir / "standalone" / "out"), master=cluster.master_url,
                         python_env=str(python_env),
                         spark_conf={"spark.driver.host": "127.0.0.1",
                                     "spark.driver.bindAddress": "127.0.0.1",
                                     "spark.executor.cores": "1", "spark.cores.max": "2",
                                     "spark.executor.memory": "1g"}, **common)
        s = run_demo(cfg, progress=None)
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
    finally:
        cluster.stop()
    records += _summary_records("standalone", s)
    moved = moved_restores(s.batches)
    records.append(record(CASE, "standalone", "moved_partitions", len(moved), "partitions"))
    if moved:
        records.append(record(CASE, "standalone", "restore_ms_median",
                              1000 * statistics.median(moved), "ms"))
        records.append(record(CASE, "standalone", "restore_ms_max", 1000 * max(moved), "ms"))
    return records


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n")[0])
    p.add_argument("--days", type=int, default=91, help="days of 2013 (default: %(default)s)")
    p.add_argument("--python-env", type=Path, default=None,
                   help="a venv-pack archive of a venv with statecore installed (default: build "
                        "a wheel and a venv)")
    p.add_argument("--json", default=None, help="write the records to this file")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="statecore-bench-cluster-") as tmp:
        records = run(args.days, args.python_env, Path(tmp))
    for r in records:
        print(f"{r['impl']:12s} {r['metric']:22s} {r['value']:>14,.2f} {r['unit']}")
    if args.json:
        write_json(records, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
